"""Draw docs/img/sharding_mesh.png: what each rank of examples/sharded_training.py's 2x2 mesh
holds.

    python tools/sharding_mesh_figure.py [--out docs/img/sharding_mesh.png]

One panel per rank, placed as the mesh places it (rows: "dp", columns: "tp"). Each panel
draws, with this rank's piece filled:
- a ColwiseParallel weight (wq, wk, wv, w1): ``Shard(0)`` over tp, the output rows;
- a RowwiseParallel weight (wo, w2): ``Shard(1)`` over tp, the input columns;
- the activations (batch x sequence): the batch split over dp; along the sequence, a
  SequenceParallel region (layer norms, the residual stream) holds its tp half, attention and
  the MLP the whole sequence (``PrepareModuleInput`` all-gathers it).
Between the panels: the tp groups (all-gather / reduce-scatter of activations in forward and
backward) and the dp groups (DDP's all-reduce of the gradient pieces).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FILL, LIGHT, EDGE = "#4c72b0", "#c7d5ec", "#333333"
TP_COLOR, DP_COLOR = "#dd8452", "#55a868"


def box(ax, x, y, w, h, parts, which, axis, label, light_rest=False):
    """A tensor drawn at (x, y), cut in ``parts`` along ``axis`` (0: rows, 1: columns), with
    piece ``which`` filled (``which=None``: every piece filled)."""
    ax.add_patch(Rectangle((x, y), w, h, facecolor=LIGHT if light_rest else "white",
                           edgecolor=EDGE, lw=1))
    for k in range(parts):
        if which is not None and k != which:
            continue
        if axis == 0:  # row k from the top
            r = Rectangle((x, y + h - (k + 1) * h / parts), w, h / parts)
        else:
            r = Rectangle((x + k * w / parts, y), w / parts, h)
        r.set(facecolor=FILL, edgecolor=EDGE, lw=1)
        ax.add_patch(r)
    ax.text(x + w / 2, y - 0.12, label, ha="center", va="top", fontsize=7.5)


def activations(ax, x, y, dp, tp, seq_part):
    """Batch (rows, split over dp) x sequence (columns): this rank's rows, and of them the
    sequence half ``seq_part`` (None: the whole sequence)."""
    w, h = 1.1, 1.0
    ax.add_patch(Rectangle((x, y), w, h, facecolor="white", edgecolor=EDGE, lw=1))
    rows_y = y + h / 2 if dp == 0 else y
    ax.add_patch(Rectangle((x, rows_y), w, h / 2, facecolor=LIGHT, edgecolor=EDGE, lw=1))
    sx, sw = (x, w) if seq_part is None else (x + seq_part * w / 2, w / 2)
    ax.add_patch(Rectangle((sx, rows_y), sw, h / 2, facecolor=FILL, edgecolor=EDGE, lw=1))


def panel(ax, x0, y0, dp, tp):
    rank = 2 * dp + tp
    ax.add_patch(Rectangle((x0, y0), 6.8, 3.3, facecolor="#f7f7f7", edgecolor="#999999",
                           lw=1.2, zorder=0))
    ax.text(x0 + 0.15, y0 + 3.1, f"rank {rank}   (dp={dp}, tp={tp})", fontsize=10,
            fontweight="bold", va="top")
    box(ax, x0 + 0.3, y0 + 0.9, 1.0, 1.5, 2, tp, 0, "Colwise weight\nShard(0): rows")
    box(ax, x0 + 1.9, y0 + 0.9, 1.5, 1.0, 2, tp, 1, "Rowwise weight\nShard(1): columns")
    activations(ax, x0 + 3.6, y0 + 1.4, dp, tp, tp)
    ax.text(x0 + 4.15, y0 + 1.28, "norms, residual\n(batch/dp, seq/tp)", ha="center",
            va="top", fontsize=7.5)
    activations(ax, x0 + 5.3, y0 + 1.4, dp, tp, None)
    ax.text(x0 + 5.85, y0 + 1.28, "attention, MLP\n(batch/dp, seq)", ha="center", va="top",
            fontsize=7.5)
    ax.text(x0 + 4.9, y0 + 2.65, "activations", ha="center", fontsize=8)


def draw(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 7.2))
    ax.set_xlim(-1.0, 15.0)
    ax.set_ylim(-0.9, 8.6)
    ax.axis("off")
    origin = {(dp, tp): (tp * 8.0, (1 - dp) * 4.4) for dp in (0, 1) for tp in (0, 1)}
    for (dp, tp), (x, y) in origin.items():
        panel(ax, x, y, dp, tp)
    for dp in (0, 1):
        y = (1 - dp) * 4.4 + 1.65
        ax.add_patch(FancyArrowPatch((6.85, y), (7.95, y), arrowstyle="<->", mutation_scale=14,
                                     color=TP_COLOR, lw=2))
        ax.text(7.4, y + 0.15, "tp group", color=TP_COLOR, ha="center", fontsize=8.5,
                fontweight="bold")
        ax.text(-0.35, y, f"dp={dp}", rotation=90, ha="center", va="center", fontsize=11)
    for tp in (0, 1):
        x = tp * 8.0 + 3.4
        ax.add_patch(FancyArrowPatch((x, 3.35), (x, 4.35), arrowstyle="<->", mutation_scale=14,
                                     color=DP_COLOR, lw=2))
        ax.text(x + 0.15, 3.85, "dp group: DDP all-reduce of gradient pieces", color=DP_COLOR,
                va="center", fontsize=8.5, fontweight="bold")
        ax.text(x, 8.05, f"tp={tp}", ha="center", fontsize=11)
    ax.text(7.4, -0.45, 'init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")).  Filled: '
            "what the rank holds; light: the rest of its batch rows.\ntp group: all-gather / "
            "reduce-scatter of the activations (forward and backward); dp group: the "
            "gradients of its pieces averaged", ha="center", va="top", fontsize=8.5)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "sharding_mesh.png")
    args = parser.parse_args()
    draw(args.out)
    print(args.out)


if __name__ == "__main__":
    main()
