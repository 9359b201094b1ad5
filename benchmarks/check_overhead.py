"""What the always-on agreement check of large collectives costs (``MPITENSOR_CHECK_BYTES``).

Run::

    mpiexec -n 2 python benchmarks/check_overhead.py             # 16 KiB .. 16 MiB, 4 ops
    mpiexec -n 4 python benchmarks/check_overhead.py --reps 15 --max-bytes 4M --json /tmp/c.json

For each operation and size the same call runs three ways, interleaved repetition by repetition
(the order rotates) so that the load of this shared machine hits them alike:

* ``checked``: mpitensor as users get it (the check on from 64 KiB, the default threshold);
* ``unchecked``: the same group with the check off (``group.check_bytes`` set past any size);
* ``mpi4py``: the raw buffer call, the floor.

Sizes below the threshold show the checked and unchecked runs doing the same work (their ratio
is the noise floor), except for ``all_to_all_single_uneven`` (split sizes given), whose split
sizes are checked by any size: its unchecked run is the group with every check off
(``MPITENSOR_CHECK_BYTES=off``). The ratio reported is paired: the median over repetitions of
checked ÷ unchecked of the same repetition. Target: under 1.03 from 64 KiB up.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import mpitensor  # first: MPI starts with mpitensor's settings

# isort: split
import numpy as np
from mpi4py import MPI

import mpitensor.distributed as dist
from mpitensor._base.config import OFF_BYTES
from mpitensor.distributed import bench

OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
       "all_to_all_single_uneven")
# checked by any size (their split sizes: see docs/failures.md, "Split sizes of all-to-all")
ALWAYS = ("all_to_all_single_uneven",)


def _cases(op: str, nbytes: int, n: int) -> "tuple":
    """(mpitensor call, raw mpi4py call) on float32 buffers of ``nbytes`` per rank."""
    count = max(n, nbytes // 4 // n * n)
    comm = MPI.COMM_WORLD
    buf = np.zeros(count, np.float32)
    t = mpitensor.from_numpy(buf)
    if op == "all_reduce":
        return (lambda: dist.all_reduce(t),
                lambda: comm.Allreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], MPI.SUM))
    if op == "broadcast":
        return (lambda: dist.broadcast(t, 0), lambda: comm.Bcast([buf, MPI.FLOAT], 0))
    if op == "all_gather_into_tensor":
        out = np.zeros(count * n, np.float32)
        to = mpitensor.from_numpy(out)
        return (lambda: dist.all_gather_into_tensor(to, t),
                lambda: comm.Allgather([buf, MPI.FLOAT], [out, MPI.FLOAT]))
    if op == "reduce_scatter_tensor":
        out = np.zeros(count // n, np.float32)
        to = mpitensor.from_numpy(out)
        return (lambda: dist.reduce_scatter_tensor(to, t),
                lambda: comm.Reduce_scatter_block([buf, MPI.FLOAT], [out, MPI.FLOAT], MPI.SUM))
    if op == "all_to_all_single_uneven":  # split sizes given: MPI_Alltoallv, always checked
        out = np.zeros(count, np.float32)
        to = mpitensor.from_numpy(out)
        split = [count // n] * n
        counts, displs = split, [i * (count // n) for i in range(n)]
        return (lambda: dist.all_to_all_single(to, t, split, split),
                lambda: comm.Alltoallv([buf, (counts, displs), MPI.FLOAT],
                                       [out, (counts, displs), MPI.FLOAT]))
    raise ValueError(op)


def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--min-bytes", type=bench.parse_size, default=16 << 10)
    p.add_argument("--max-bytes", type=bench.parse_size, default=16 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--reps", type=int, default=11)
    p.add_argument("--rep-time", type=float, default=0.02)
    p.add_argument("--json", default=None)
    p.add_argument("--no-board", action="store_true",
                   help="split sizes checked by the exchange that groups across machines use, "
                        "not the shared board of a one-machine group")
    args = p.parse_args(argv)
    if args.no_board:
        from mpitensor.distributed.health import fingerprint as _fingerprint

        _fingerprint.BOARD_MAX = 0

    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    g = dist.group.WORLD
    threshold = g.check_bytes
    rows = []
    if rank == 0:
        print(f"# agreement-check overhead: {n} ranks, threshold {threshold} B "
              f"(MPITENSOR_CHECK_BYTES), paired medians of {args.reps} repetitions")
        print(f"{'op':<24}{'bytes':>10}{'checked µs':>12}{'unchecked µs':>14}{'mpi4py µs':>11}"
              f"{'checked/unchecked':>19}{'checked/mpi4py':>16}")
    for op in args.ops.split(","):
        for nbytes in bench.sweep_sizes(args.min_bytes, args.max_bytes, args.factor):
            call, raw = _cases(op, nbytes, n)

            def unchecked(call=call) -> None:
                g.check_bytes = OFF_BYTES
                try:
                    call()
                finally:
                    g.check_bytes = threshold

            fns = {"checked": call, "unchecked": unchecked, "mpi4py": raw}
            iters = {k: bench.calibrate(f, comm, nbytes, rep_time=args.rep_time)
                     for k, f in fns.items()}
            iters = comm.allreduce(min(iters.values()), op=MPI.MIN)
            samples: dict = {k: [] for k in fns}
            names = list(fns)
            for r in range(args.reps):
                for k in names[r % 3:] + names[:r % 3]:
                    samples[k].append(bench.time_rep(fns[k], comm, "back-to-back", iters))
            worst = {k: bench.slowest(comm, v) for k, v in samples.items()}
            med = {k: statistics.median(v) * 1e6 for k, v in worst.items()}
            ratio = statistics.median(a / b for a, b in zip(worst["checked"], worst["unchecked"]))
            vs_raw = statistics.median(a / b for a, b in zip(worst["checked"], worst["mpi4py"]))
            row = {"op": op, "bytes": nbytes, "checked_us": med["checked"],
                   "unchecked_us": med["unchecked"], "mpi4py_us": med["mpi4py"],
                   "checked_over_unchecked": ratio, "checked_over_mpi4py": vs_raw,
                   "checked_on": nbytes >= threshold or op in ALWAYS}
            rows.append(row)
            if rank == 0:
                print(f"{op:<24}{bench.format_size(nbytes):>10}{med['checked']:>12.1f}"
                      f"{med['unchecked']:>14.1f}{med['mpi4py']:>11.1f}{ratio:>19.3f}"
                      f"{vs_raw:>16.3f}", flush=True)
    if rank == 0:
        on = [r["checked_over_unchecked"] for r in rows
              if r["bytes"] >= threshold and r["op"] not in ALWAYS]
        if on:
            print(f"# checked calls: median overhead {(statistics.median(on) - 1) * 100:+.1f} %, "
                  f"worst {(max(on) - 1) * 100:+.1f} % (target: under +3 %)")
        for op in ALWAYS:
            split = [f"{bench.format_size(r['bytes'])} "
                     f"{(r['checked_over_unchecked'] - 1) * 100:+.1f} %"
                     for r in rows if r["op"] == op]
            if split:
                print(f"# {op} (split sizes checked by any size): " + ", ".join(split))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": n, "threshold": threshold, "rows": rows,
                           "machine": bench.machine_info()}, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
