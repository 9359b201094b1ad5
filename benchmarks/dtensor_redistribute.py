"""DTensor redistribution against the one collective it maps to, in the same run.

    mpiexec -n 2 python benchmarks/dtensor_redistribute.py [--mib 64] [--reps 5]

For each transition (Shard(0) -> Replicate, Partial -> Replicate, Partial -> Shard(0),
Shard(0) -> Shard(1)) it times ``dt.redistribute`` and the bare collective
(``all_gather_into_tensor``, ``all_reduce``, ``reduce_scatter_tensor``,
``all_to_all_single``) on buffers of the same size made once, each after a barrier, and
prints the median times and their ratio on rank 0 (the target: within 1.10x). A
redistribution's staging buffers and outputs are recycled (``_base/workspace``), as the
bare collective's are here. ``Shard(0) -> Shard(1)`` is also timed against the bare
all_to_all plus the copy that packs each destination's columns into one block (they are
not contiguous in the local piece; the collectives take contiguous buffers): the floor of
any redistribution that moves column blocks through ``all_to_all_single``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)


def timed(fn, reps):
    out = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=64.0, help="global tensor size")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("mpi")
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,))
    rows = max(n, int(args.mib * 2**20 / 4 / 1024) // n * n)
    full = mt.ones(rows, 1024)  # float32: rows x 1024, divisible by n
    per = rows // n * 1024
    s0 = distribute_tensor(full, mesh, [Shard(0)])
    part = DTensor.from_local(mt.ones(rows, 1024), mesh, [Partial()])
    a, big = np.ones(per, np.float32), np.ones(per * n, np.float32)
    a2 = np.empty_like(a)
    local = s0.to_local().numpy()
    cols = 1024 // n
    blocks = a.reshape(n, rows // n, cols)

    def pack():  # each destination's columns of the local rows, one block per rank
        for r in range(n):
            blocks[r] = local[:, r * cols:(r + 1) * cols]
        dist.all_to_all_single(a2, a)

    raw = {  # the bare collective, into buffers made once
        "Shard(0) -> Replicate": lambda: dist.all_gather_into_tensor(big, a),
        "Partial -> Replicate": lambda: dist.all_reduce(big),
        "Partial -> Shard(0)": lambda: dist.reduce_scatter_tensor(a, big),
        "Shard(0) -> Shard(1)": lambda: dist.all_to_all_single(a2, a),
    }
    ours = {
        "Shard(0) -> Replicate": lambda: s0.redistribute(mesh, [Replicate()]),
        "Partial -> Replicate": lambda: part.redistribute(mesh, [Replicate()]),
        "Partial -> Shard(0)": lambda: part.redistribute(mesh, [Shard(0)]),
        "Shard(0) -> Shard(1)": lambda: s0.redistribute(mesh, [Shard(1)]),
    }
    if me == 0:
        print(f"{n} ranks, global tensor {rows * 1024 * 4 / 2**20:.0f} MiB float32, "
              f"median of {args.reps}")
        print(f"{'transition':24s} {'DTensor ms':>11s} {'bare ms':>8s} {'ratio':>6s} "
              f"{'bare + pack ms':>15s} {'ratio':>6s}")
    for name in raw:
        fns = [ours[name], raw[name]] + ([pack] if "Shard(1)" in name else [])
        for fn in fns:
            timed(fn, 1)  # warm-up
        t = [timed(fn, args.reps) for fn in fns]
        if me == 0:
            floor = f"{t[2] * 1e3:15.2f} {t[0] / t[2]:6.2f}" if len(t) > 2 else ""
            print(f"{name:24s} {t[0] * 1e3:11.2f} {t[1] * 1e3:8.2f} {t[0] / t[1]:6.2f} "
                  f"{floor}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
