"""DTensor redistribution against the one collective it maps to, in the same run.

    mpiexec -n 2 python benchmarks/dtensor_redistribute.py [--mib 64] [--width 1024] [--reps 5]
        [--rounds 3] [--only 'Shard(1)']

For each transition (Shard(0) -> Replicate, Partial -> Replicate, Shard(1) -> Replicate,
Partial -> Shard(0), Shard(0) -> Shard(1), Shard(1) -> Shard(0)) it times
``dt.redistribute`` and the bare collective (``all_gather_into_tensor``, ``all_reduce``,
``reduce_scatter_tensor``, ``all_to_all_single``) on buffers of the same size made once,
each call after a barrier. The candidates of a transition take turns: ``--rounds`` rounds,
each timing every candidate ``--reps`` times, so a change in the machine's load falls on all
of them alike; rank 0 prints the median over all rounds and the ratio to the bare collective
(the target: within 1.10x), with the load average before and after. A redistribution's
staging buffers and outputs are
recycled (``_base/workspace``), as the bare collective's are here. ``Partial -> Replicate``
(the group's all_reduce out of place, ``all_reduce_into``: the terms are read where they
lie) is also timed as ``bare into`` (that call alone, into a buffer made once), ``copy +
bare`` (what it cost before: the terms copied, then the in-place all_reduce) and ``rs + ag``
(reduce_scatter_tensor + all_gather_into_tensor, out of place, no copy).

The gathers and swaps are also timed as ``collective``: the same redistribution with its
direct path switched off (``tensor/_direct.py``: blocks moved straight into place), i.e.
through the packed all_to_all / all_gather; and as ``attach``: the direct path without the
peers' mapped results (``backends/mpi/mapped.py``), every block moved by cross-memory
attach, as before those. The bare collectives run on the mesh's own group, on contiguous
buffers of the same bytes.

The shard swaps are also timed against two references: ``padded``, the equal padded blocks
the CuPy path still takes (and the NumPy path took before the exact split sizes), and
``bare + pack``, the bare all_to_all plus one ``copyto`` that packs each destination's
columns into one block: the columns are not contiguous in the local piece and MPI's derived
datatypes were slower here than that copy (docs/sharding.md), so this is the floor of a
redistribution that moves column blocks through ``all_to_all_single``.
"""

from __future__ import annotations

import argparse
import os
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
    _direct,
    distribute_tensor,
    init_device_mesh,
)
from mpitensor.distributed.tensor._redistribute import padded_all_to_all


def timed(fn, reps):
    out = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def candidates(mib: float, width: int) -> dict:
    """transition -> {name: call}; the first name is ours, the second the bare collective."""
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    rows = max(n, int(mib * 2**20 / 4 / width) // n * n)
    full = mt.ones(rows, width)  # float32: rows x width, rows divisible by n
    per = rows // n * width
    s0 = distribute_tensor(full, mesh, [Shard(0)])
    s1 = distribute_tensor(full, mesh, [Shard(1)])
    part = DTensor.from_local(mt.ones(rows, width), mesh, [Partial()])
    a, big = np.ones(per, np.float32), np.ones(per * n, np.float32)
    a2 = np.empty_like(a)
    local = s0.to_local().numpy()
    cols = width // n
    blocks = a.reshape(n, rows // n, cols)

    group = mesh.get_group(0)  # the bare collectives run on the mesh's own group

    def pack():  # each destination's columns of the local rows, one block per rank
        np.copyto(blocks, local.reshape(rows // n, n, cols).transpose(1, 0, 2))
        dist.all_to_all_single(a2, a, group=group)

    def bare_a2a():
        dist.all_to_all_single(a2, a, group=group)

    big2 = np.empty_like(big)

    def copy_all_reduce():  # in place, a Partial's terms would be copied first
        np.copyto(big2, big)
        dist.all_reduce(big2, group=group)

    def rs_ag():  # the same reduction with no copy, in two collectives
        dist.reduce_scatter_tensor(a2, big, group=group)
        dist.all_gather_into_tensor(big2, a2, group=group)

    def collective(dt, placements):  # the redistribution with the direct path switched off
        def run():
            old = _direct.set_enabled(False)
            try:
                dt.redistribute(mesh, placements)
            finally:
                _direct.set_enabled(old)
        return run

    def attach(dt, placements):  # the direct path through cross-memory attach alone
        def run():
            old, _direct.MAPPED = _direct.MAPPED, False
            try:
                dt.redistribute(mesh, placements)
            finally:
                _direct.MAPPED = old
        return run

    return {
        "Shard(0) -> Replicate": {
            "ours": lambda: s0.redistribute(mesh, [Replicate()]),
            "bare": lambda: dist.all_gather_into_tensor(big, a, group=group),
            "attach": attach(s0, [Replicate()]),
            "collective": collective(s0, [Replicate()])},
        "Partial -> Replicate": {
            "ours": lambda: part.redistribute(mesh, [Replicate()]),
            "bare": lambda: dist.all_reduce(big, group=group),
            "bare into": lambda: group.all_reduce_into(big2, big),
            "copy + bare": copy_all_reduce, "rs + ag": rs_ag},
        "Shard(1) -> Replicate": {  # the columns gathered: one reorder pass, then all_gather
            "ours": lambda: s1.redistribute(mesh, [Replicate()]),
            "bare": lambda: dist.all_gather_into_tensor(big, a, group=group),
            "attach": attach(s1, [Replicate()]),
            "collective": collective(s1, [Replicate()])},
        "Partial -> Shard(0)": {
            "ours": lambda: part.redistribute(mesh, [Shard(0)]),
            "bare": lambda: dist.reduce_scatter_tensor(a, big, group=group)},
        "Shard(0) -> Shard(1)": {
            "ours": lambda: s0.redistribute(mesh, [Shard(1)]),
            "bare": bare_a2a, "bare + pack": pack,
            "attach": attach(s0, [Shard(1)]),
            "collective": collective(s0, [Shard(1)]),
            "padded": lambda: padded_all_to_all(local, 0, 1, rows, mesh, 0)},
        "Shard(1) -> Shard(0)": {
            "ours": lambda: s1.redistribute(mesh, [Shard(0)]),
            "bare": bare_a2a,
            "attach": attach(s1, [Shard(0)]),
            "collective": collective(s1, [Shard(0)]),
            "padded": lambda: padded_all_to_all(s1.to_local().numpy(), 1, 0, width, mesh, 0)},
    }, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=64.0, help="global tensor size")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--width", type=int, default=1024,
                    help="columns of the global tensor (divisible by the ranks)")
    ap.add_argument("--only", default="", help="run the transitions whose name holds this")
    args = ap.parse_args()
    dist.init_process_group("mpi")
    n, me = dist.get_world_size(), dist.get_rank()
    table, rows = candidates(args.mib, args.width)
    load0 = os.getloadavg()[0]
    if me == 0:
        mib = rows * args.width * 4 / 2**20
        print(f"{n} ranks, global tensor {rows} x {args.width} float32 ({mib:.0f} MiB), median "
              f"of {args.rounds} rounds x {args.reps}, load average {load0:.2f} at the start")
        print(f"{'transition':22s} {'candidate':12s} {'ms':>8s} {'/ bare':>7s}")
    for name, fns in table.items():
        if args.only not in name:
            continue
        for fn in fns.values():
            timed(fn, 1)  # warm-up
        times = {c: [] for c in fns}
        for _ in range(args.rounds):
            for c, fn in fns.items():
                times[c] += timed(fn, args.reps)
        med = {c: statistics.median(t) for c, t in times.items()}
        if me == 0:
            for c, t in med.items():
                print(f"{name:22s} {c:12s} {t * 1e3:8.2f} {t / med['bare']:7.2f}")
    if me == 0:
        print(f"load average {os.getloadavg()[0]:.2f} at the end")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
