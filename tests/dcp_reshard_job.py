"""A job for tests/test_dcp_reshard.py: save a sharded checkpoint, load it at another size.

    mpiexec -n 4 python tests/dcp_reshard_job.py save DIR [VERSION]
    mpiexec -n K python tests/dcp_reshard_job.py load DIR [VERSION]    (K = 1, 2, 3, 4)
    mpiexec -n 4 python tests/dcp_reshard_job.py mesh DIR [VERSION]    (a 2x2 mesh)
    mpiexec -n 4 python tests/dcp_reshard_job.py kill DIR VERSION      (rank 2 dies mid-write)

Every value is a function of its position and the version, so any rank of any job knows what
each element must be. Each rank prints ``rank R ok N`` (N: entries checked) when all of its
values are bit-exact, and exits non-zero otherwise.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Dict, Tuple

import numpy as np

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.distributed.checkpoint as dcp

try:
    from mpitensor.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh
except ImportError:  # the DTensor layer is built beside this one
    DTensor = None

SHAPES = {"w": (13, 5), "emb": (10, 4), "dt": (9, 6)}


def expected(name: str, version: int) -> np.ndarray:
    shape = SHAPES[name]
    base = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    return (base * 0.125 + version + len(name)).astype(np.float32)


def piece(n: int, k: int, i: int) -> Tuple[int, int]:
    """torch.chunk's piece i of n split k ways: (offset, length), maybe empty."""
    size = -(-n // k)
    start = min(i * size, n)
    return start, min(size, n - start)


def shard(name: str, dim: int, fill: bool, version: int) -> dcp.LocalShard:
    rank, size = dist.get_rank(), dist.get_world_size()
    shape = SHAPES[name]
    start, n = piece(shape[dim], size, rank)
    box = [slice(None)] * len(shape)
    box[dim] = slice(start, start + n)
    data = expected(name, version)[tuple(box)]
    local = mt.from_numpy(data.copy()) if fill else mt.zeros(*data.shape)
    offsets = [0] * len(shape)
    offsets[dim] = start
    return dcp.LocalShard(local, shape, offsets)


def state(fill: bool, version: int, dim: int, mesh: Any = None) -> Dict[str, Any]:
    """The state dict: rows (or columns) of w and emb, a DTensor, replicated and plain values."""
    sd: Dict[str, Any] = {
        "model": {"w": shard("w", dim, fill, version), "emb": shard("emb", 1 - dim, fill, version),
                  "scale": mt.full((3,), float(version)) if fill else mt.zeros(3)},
        "optim": {"step": version if fill else -1, "groups": [{"lr": 0.5 * version if fill
                                                              else 0.0}]},
    }
    if DTensor is not None:
        if mesh is None:
            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        placements = [Shard(dim)] + [Shard(1 - dim)] * (mesh.ndim - 1)
        full = expected("dt", version) if fill else np.zeros(SHAPES["dt"], np.float32)
        sd["dt"] = distribute_tensor(mt.from_numpy(full.copy()), mesh, placements)
    return sd


def check(sd: Dict[str, Any], version: int) -> int:
    """How many entries hold exactly what the version says; AssertionError otherwise."""
    m = sd["model"]
    for name in ("w", "emb"):
        ls = m[name]
        box = tuple(slice(o, o + n) for o, n in zip(ls.offsets, ls.tensor.shape))
        want = expected(name, version)[box]
        assert ls.tensor.numpy().tobytes() == want.tobytes(), name
    assert m["scale"].numpy().tobytes() == np.full(3, version, np.float32).tobytes()
    assert sd["optim"] == {"step": version, "groups": [{"lr": 0.5 * version}]}, sd["optim"]
    count = 4
    if "dt" in sd:
        got = sd["dt"].full_tensor().numpy()
        assert got.tobytes() == expected("dt", version).tobytes(), "dt"
        count += 1
    return count


class DieMidWrite(dcp.FileSystemWriter):
    """Rank 2 writes half of its first record, then is killed (as by the OOM killer)."""

    def write_item(self, fh: Any, fqn: str, obj: Any) -> Tuple[int, int]:
        if dist.get_rank() == 2:
            fh.write(b"PK\x03\x04 half a record")
            fh.flush()
            sys.stdout.write(f"rank 2 dies writing {fqn}\n")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().write_item(fh, fqn, obj)


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    version = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    dist.init_process_group("mpi")
    mesh = init_device_mesh("cpu", (2, 2)) if mode == "mesh" and DTensor is not None else None
    if mode in ("save", "kill"):
        writer = DieMidWrite(path) if mode == "kill" else None
        dcp.save(state(True, version, 0), checkpoint_id=path, storage_writer=writer)
        sys.stdout.write(f"rank {dist.get_rank()} saved\n")
    else:
        sd = state(False, version, 1, mesh)
        dcp.load(sd, checkpoint_id=path)
        sys.stdout.write(f"rank {dist.get_rank()} ok {check(sd, version)}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
