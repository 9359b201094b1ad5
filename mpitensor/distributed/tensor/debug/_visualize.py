"""``visualize_sharding``: print which rank holds which block of a 1-D or 2-D DTensor.

The table is laid out as torch's (its ``tabulate`` layout: row ranges down the side, column
ranges across, each cell ``device:rank,rank``), written here without ``tabulate``.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from .._utils import _shape_offset_at

__all__ = ["visualize_sharding", "sharding_table"]

Block = Tuple[Tuple[int, int], Tuple[int, int], int]


def _blocks(dtensor: Any) -> List[Block]:
    """Every rank's block as ((first row, last row), (first col, last col), rank)."""
    mesh = dtensor.device_mesh
    shape = [int(s) for s in dtensor.shape]
    grid = np.asarray(mesh.mesh.tolist())
    out = []
    for coord, rank in np.ndenumerate(grid):
        size, off = _shape_offset_at(shape, mesh, dtensor.placements, coord)
        if len(size) == 1:
            size, off = (size[0], 1), (off[0], 0)
        out.append(((off[0], off[0] + size[0] - 1), (off[1], off[1] + size[1] - 1), int(rank)))
    return out


def sharding_table(blocks: Sequence[Block], device_kind: str = "") -> str:
    """The text table of ``blocks``: tabulate's "simple" format, as torch prints it."""
    rows = sorted({b[0] for b in blocks})
    cols = sorted({b[1] for b in blocks})
    cells = [["" for _ in cols] for _ in rows]
    for r, c, rank in blocks:
        i, j = rows.index(r), cols.index(c)
        cells[i][j] = f"{cells[i][j]},{rank}" if cells[i][j] else f"{device_kind}:{rank}"
    table = [[""] + [f"Col {c[0]}-{c[1]}" for c in cols]]
    table += [[f"Row {r[0]}-{r[1]}"] + line for r, line in zip(rows, cells)]
    # a column is as wide as its longest cell, and at least its header plus two
    widths = [max([len(table[0][j]) + 2] + [len(t[j]) for t in table[1:]])
              for j in range(len(table[0]))]

    def line(items: Sequence[str]) -> str:
        return "  ".join(s.ljust(w) for s, w in zip(items, widths)).rstrip()

    return "\n".join([line(table[0]), line(["-" * w for w in widths])]
                     + [line(t) for t in table[1:]])


def visualize_sharding(dtensor: Any, header: str = "", use_rich: bool = False) -> None:
    """Print the layout of a 1-D or 2-D DTensor once per mesh, on the rank at coordinate 0 of
    every mesh dimension (``header``, when given, on the line before; torch 2.13 accepts it
    and prints nothing for it). Empty tensors, and ranks outside the mesh, print nothing.

    Example (``mpiexec -n 2``, a (4, 6) tensor ``Shard(0)``)::

                 Col 0-5
        -------  ---------
        Row 0-1  cpu:0
        Row 2-3  cpu:1
    """
    if dtensor.numel() == 0:
        return
    if dtensor.ndim >= 3:
        raise RuntimeError(f"visualize_sharding shows 1-D and 2-D DTensors only, got "
                           f"{dtensor.ndim}-D {tuple(dtensor.shape)}")
    mesh = dtensor.device_mesh
    coord = mesh.get_coordinate()
    if coord is None or any(c != 0 for c in coord):
        return
    if header:
        print(header)
    print(sharding_table(_blocks(dtensor), mesh.device_type))
