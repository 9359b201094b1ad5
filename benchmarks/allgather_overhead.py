"""Where a large collective of ours loses time against the raw mpi4py call (issue 29).

Run: ``timeout 300 mpiexec -n 2 python benchmarks/allgather_overhead.py [--sizes 1M,16M,64M]``

For each operation and size, on the same buffers in one process, the variants are called
in turn (ours, raw blocking, raw non-blocking + Wait, ...) with the order rotated every
repetition, each preceded by a barrier, so that the load of the machine hits them alike.
Reported per variant: min and median seconds per call, the median of the paired ratio
(variant r / raw blocking r) and minor page faults per call; with ``--alloc``, also the peak
bytes allocated (tracemalloc), in a separate pass: tracing every Python allocation slows the
variants that make Python objects (ours) and not the raw calls, which made our calls read
1.3-1.9x raw at 128 KiB-2 MiB when the timings were taken with it on.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import mpitensor  # noqa: F401 - first: MPI starts with mpitensor's settings

# isort: split
import numpy as np
from mpi4py import MPI

import mpitensor.distributed as dist
from mpitensor.distributed import _world
from mpitensor.distributed.health import watchdog as _watchdog


def _bytes(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * mult[text[-1]]) if text[-1] in mult else int(text)


def _wait(req) -> None:
    """Wait for ``req`` as our blocking collectives do (the group's bounded wait)."""
    if not req.Test():
        _watchdog.wait(_world._pg(None).health, req, "probe", 0)


def _unchecked(fn, *args) -> None:
    """``fn(*args)`` with the group's agreement check of large calls off."""
    h = _world._pg(None).health
    keep, h.check_bytes = h.check_bytes, 1 << 62
    try:
        fn(*args)
    finally:
        h.check_bytes = keep


def _cases(comm, n: int, nbytes: int) -> dict:
    """op -> {variant: callable}, every variant on the same buffers."""
    me = comm.Get_rank()
    count = max(nbytes // 4 // n, 1)
    inp = np.full(count, me + 1, np.float32)
    out = np.zeros(count * n, np.float32)
    red = np.ones(count * n, np.float32)
    part = np.zeros(count, np.float32)
    outs = [np.zeros(count, np.float32) for _ in range(n)]
    chunks = list(out.reshape(n, count))  # list(out.chunk(n)): one buffer, end to end
    f = MPI.FLOAT
    return {
        "all_gather_into_tensor": {
            "ours": lambda: dist.all_gather_into_tensor(out, inp),
            "raw Allgather": lambda: comm.Allgather([inp, f], [out, f]),
            "raw Iallgather+Wait": lambda: comm.Iallgather([inp, f], [out, f]).Wait(),
            "raw Iallgather+our wait": lambda: _wait(comm.Iallgather([inp, f], [out, f])),
            "ours, no agreement check": lambda: _unchecked(dist.all_gather_into_tensor, out, inp),
        },
        "all_gather": {
            "ours": lambda: dist.all_gather(outs, inp),
            "raw Allgather": lambda: comm.Allgather([inp, f], [out, f]),
            "ours, entries end to end": lambda: dist.all_gather(chunks, inp),
        },
        "reduce_scatter_tensor": {
            "ours": lambda: dist.reduce_scatter_tensor(part, red),
            "raw Reduce_scatter_block": lambda: comm.Reduce_scatter_block(
                [red, f], [part, f], MPI.SUM),
            "raw Ireduce_scatter_block+Wait": lambda: comm.Ireduce_scatter_block(
                [red, f], [part, f], MPI.SUM).Wait(),
        },
        "all_reduce": {
            "ours": lambda: dist.all_reduce(red),
            "raw Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, [red, f], MPI.SUM),
            "raw Iallreduce+Wait": lambda: comm.Iallreduce(MPI.IN_PLACE, [red, f],
                                                           MPI.SUM).Wait(),
        },
    }


def _measure(comm, fn, batch: int) -> tuple:
    """Seconds per call (slowest rank) and minor faults of ``batch`` calls after one barrier
    (``batch`` 1: the barrier mode; more: back to back)."""
    comm.Barrier()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    for _ in range(batch):
        fn()
    dt = (time.perf_counter() - t0) / batch
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / batch
    return comm.allreduce(dt, MPI.MAX), faults


def _allocated(comm, fn, batch: int) -> int:
    """Peak bytes Python allocated during ``batch`` calls (tracemalloc; not timed)."""
    comm.Barrier()
    tracemalloc.start()
    try:
        for _ in range(batch):
            fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def run(comm, sizes: list, reps: int, ops: list, batch: int, with_alloc: bool = False) -> None:
    me = comm.Get_rank()
    n = comm.Get_size()
    for nbytes in sizes:
        cases = _cases(comm, n, nbytes)
        for op in ops:
            variants = cases[op]
            names = list(variants)
            for fn in variants.values():  # warm-up: first-touch of buffers, MPI's setup
                for _ in range(2):
                    fn()
            times = {k: [] for k in names}
            faults = {k: 0 for k in names}
            for r in range(reps):
                for k in names[r % len(names):] + names[:r % len(names)]:
                    dt, pf = _measure(comm, variants[k], batch)
                    times[k].append(dt)
                    faults[k] += pf
            alloc = {k: _allocated(comm, variants[k], batch) if with_alloc else None
                     for k in names}
            base = np.array(times[names[1]])
            if me == 0:
                print(f"\n{op}  {nbytes / 2**20:g} MiB  ranks={n}  reps={reps}  batch={batch}")
                for k in names:
                    t = np.array(times[k])
                    print(f"  {k:32s} min {t.min() * 1e3:8.3f} ms  med {np.median(t) * 1e3:8.3f}"
                          f" ms  paired ratio/raw {np.median(t / base):5.2f}  "
                          f"minflt/call {faults[k] / reps:7.1f}"
                          + ("" if alloc[k] is None else f"  peak alloc {alloc[k]} B"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--batch", type=int, default=4,
                    help="calls per repetition, back to back (1: a barrier before each)")
    ap.add_argument("--ops", default="all_gather_into_tensor,all_gather,reduce_scatter_tensor,"
                                     "all_reduce")
    ap.add_argument("--alloc", action="store_true",
                    help="also report the peak bytes allocated, from an untimed pass")
    args = ap.parse_args()
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    sizes = [_bytes(s) for s in args.sizes.split(",")]
    run(comm, sizes, args.reps, args.ops.split(","), args.batch, args.alloc)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
