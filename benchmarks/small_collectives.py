"""Small collectives: the shared board, persistent MPI requests and raw mpi4py (issue 29).

Run: ``timeout 600 mpiexec -n 2 python benchmarks/small_collectives.py [--sizes 16,256,1K,4K]``

For each operation and size, three variants in one job, on the same buffers: raw mpi4py's
blocking call (the baseline), ours on the world group (its shared board where the members
share a machine: ``backends/mpi/shm_tiny.py``) and ours on a group made with
``MPITENSOR_SHM_COLLECTIVES=off`` (persistent MPI requests, the path before the board). Each
repetition times ``--calls`` calls back to back after a barrier, the slowest rank's time per
call; the variants take turns, in an order reversed every repetition. Printed: the median per
variant in µs and the ratios raw / ours (above 1: ours faster), as a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import time

import mpitensor  # noqa: F401 - first: MPI starts with mpitensor's settings

# isort: split
import numpy as np
from mpi4py import MPI

import mpitensor.distributed as dist
from mpitensor.distributed import _world


def _bytes(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20}
    return int(float(text[:-1]) * mult[text[-1]]) if text[-1] in mult else int(text)


def _cases(comm, nbytes: int, off) -> dict:
    n = comm.Get_size()
    k = max(nbytes // 4, n)
    x = np.ones(k, np.float32)
    inp = np.ones(k // n, np.float32)
    out = np.zeros(k // n * n, np.float32)
    part = np.zeros(k // n, np.float32)
    return {
        "all_reduce": (lambda: comm.Allreduce(MPI.IN_PLACE, x),
                       lambda: dist.all_reduce(x),
                       lambda: dist.all_reduce(x, group=off)),
        "all_gather_into_tensor": (lambda: comm.Allgather(inp, out),
                                   lambda: dist.all_gather_into_tensor(out, inp),
                                   lambda: dist.all_gather_into_tensor(out, inp, group=off)),
        "reduce_scatter_tensor": (lambda: comm.Reduce_scatter_block(x, part),
                                  lambda: dist.reduce_scatter_tensor(part, x),
                                  lambda: dist.reduce_scatter_tensor(part, x, group=off)),
        "broadcast": (lambda: comm.Bcast(x, 0),
                      lambda: dist.broadcast(x, 0),
                      lambda: dist.broadcast(x, 0, group=off)),
    }


def _time(comm, fn, calls: int) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return comm.allreduce((time.perf_counter() - t0) / calls, MPI.MAX)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,256,1K,4K")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    os.environ["MPITENSOR_SHM_COLLECTIVES"] = "off"  # read when a group is made
    off = dist.new_group(list(range(n)))
    board = _world._pg(None).tiny is not None
    rows = []
    for nbytes in map(_bytes, args.sizes.split(",")):
        for name, fns in _cases(comm, nbytes, off).items():
            times: list = [[], [], []]
            for rep in range(args.reps):
                for i in ((0, 1, 2) if rep % 2 == 0 else (2, 1, 0)):
                    times[i].append(_time(comm, fns[i], args.calls))
            raw, ours, pers = (float(np.median(t)) * 1e6 for t in times)
            rows.append(f"| {name} | {nbytes} B | {raw:.2f} | {ours:.2f} | {pers:.2f} | "
                        f"{raw / ours:.2f}x | {raw / pers:.2f}x |")
    if comm.Get_rank() == 0:
        where = "the shared board" if board else "no board (see shm_tiny.make)"
        tiny = _world._pg(None).tiny
        bcast = tiny.bcast if board else False
        print(f"ranks {n}; world group: {where}; broadcasts on the board: {bcast}; "
              f"median of {args.reps} repetitions of {args.calls} calls, µs per call")
        if board:
            timed = ("not timed (ranks outnumber cores)" if tiny.copy_times is None else
                     "timed per 4 KiB call: plain {:.2f} µs, streamed {:.2f} µs".format(
                         *(t * 1e6 for t in tiny.copy_times)))
            copy = ("plain copies" if tiny.c.nt_min > 4096
                    else f"non-temporal stores from {tiny.c.nt_min} B")
            print(f"board posts: {copy} ({timed})")
        print("\n| op | size | raw mpi4py | ours | ours, switch off (persistent) | raw / ours | "
              "raw / persistent |\n|---|---|---|---|---|---|---|")
        print("\n".join(rows))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
