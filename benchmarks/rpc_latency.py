"""rpc_sync round trips: mpitensor RPC against raw mpi4py and torch RPC (TensorPipe).

Run on two ranks::

    mpiexec -n 2 python benchmarks/rpc_latency.py [--reps 9] [--json out.json]

Rank 0 calls ``rpc_sync(1, echo, args=(x,))`` (``echo`` returns its argument) for three
payloads: a Python int, a 1 MiB float32 tensor and a 64 MiB float32 tensor. Baselines, timed in
the same run with repetitions interleaved (this machine is shared, so drift hits all alike):

* **mpi4py buffer**: a ping-pong of the same bytes with ``Send``/``Recv`` into preallocated
  buffers (for the int: 8 bytes) -- the floor of any library on this MPI;
* **mpi4py pickle**: for the int, rank 0 ``send``s ``(echo, (5,), {})`` and rank 1
  ``recv``s, calls, and ``send``s the result back -- a hand-written RPC, without threads,
  deadlines or futures;
* **torch RPC**: ``torch.distributed.rpc.rpc_sync`` (TensorPipe, over 127.0.0.1), where torch
  is installed (a note says so where not). Ranks and size come from ``PMI_RANK``/``PMI_SIZE``,
  the rendezvous from ``MASTER_ADDR``/``MASTER_PORT`` (rank 0 picks a free port).

Each repetition times a batch of round trips (``--rep-time``, 50 ms worth by default, sized
on warm calls) and keeps the mean; the median repetition is reported. Before each batch both
ranks meet at a barrier, wait 5 ms more, so that the RPC agents' threads, which keep polling
for 2 ms after their last message, are quiet when a raw ping-pong batch starts, and meet at a
blocking barrier, so that they start together. While
rank 0 times, rank 1's main thread waits on a non-blocking barrier polled with sleeps, leaving
the cores to the servers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mpitensor  # noqa: E402 - first: MPI starts with mpitensor's settings

# isort: split
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mpitensor.distributed.rpc as rpc  # noqa: E402

MIB = 1 << 20
SETTLE_S = 0.005
CASES = [("int", 8), ("1 MiB tensor", MIB), ("64 MiB tensor", 64 * MIB)]


def echo(x: Any) -> Any:
    """The remote function: return the argument (so the reply carries the same bytes)."""
    return x


def quiet_barrier(comm: Any) -> None:
    """A barrier that sleeps while it waits (a spinning one would take a server's core).

    Rank 1 waits here while rank 0 times its RPC batch: each wake-up takes the GIL from the
    thread serving the calls (polls every 200 µs cost about 1 µs per int round trip), so it
    sleeps 1 ms between polls.
    """
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(1e-3)


def serve_raw(comm: Any, name: str, buf: np.ndarray, n: int) -> None:
    """Rank 1's side of ``n`` raw mpi4py ping-pongs."""
    for _ in range(n):
        if name == "mpi4py buffer":
            comm.Recv(buf, 0)
            comm.Send(buf, 0)
        else:
            f, a, k = comm.recv(None, 0)
            comm.send(f(*a, **k), 0)


def timed(fn: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def batch_size(fn: Callable[[], None], target_s: float) -> int:
    """Round trips per repetition: enough for ``target_s`` seconds (at least 2).

    Timed after a few warm-up calls: the first call after a pause is slower (the peer's
    progress thread is napping), and sizing the batch on it gave batches of a few hundred int
    round trips, each paying that first call (about 6 µs per call of a 13 µs round trip).
    """
    timed(fn, 3)
    one = min(timed(fn, 10), timed(fn, 10))
    return max(2, min(20000, int(target_s / max(one, 1e-7))))


def _torch_rpc(comm: Any) -> "tuple[Optional[Any], str]":
    """Start torch RPC on both ranks (agreeing), or say why not."""
    try:
        import torch
        import torch.distributed.rpc as trpc

        why = "" if trpc.is_available() else "this torch build has no RPC support"
    except Exception as exc:  # noqa: BLE001 - torch absent or broken: its rows are skipped
        why = f"torch is not importable ({type(exc).__name__}: {exc})"
    whys = comm.allgather(why)
    if any(whys):
        return None, next(w for w in whys if w)
    from _torch_baseline import free_port

    rank = int(os.environ.get("PMI_RANK", comm.Get_rank()))
    size = int(os.environ.get("PMI_SIZE", comm.Get_size()))
    port = comm.bcast(free_port() if comm.Get_rank() == 0 else None, 0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    opts = trpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=120)
    trpc.init_rpc(f"torch{rank}", rank=rank, world_size=size, rpc_backend_options=opts)
    return (torch, trpc), ""


def measure(comm: Any, libs: Dict[str, Callable[[], None]], raw_buf: np.ndarray, reps: int,
            rep_time: float) -> Dict[str, float]:
    """Median seconds per round trip of each library (on rank 0), repetitions interleaved."""
    rank = comm.Get_rank()
    times: Dict[str, List[float]] = {k: [] for k in libs}
    sizes: Dict[str, int] = {}
    for _rep in range(reps + 1):  # repetition 0 warms up and sizes the batches
        for name, fn in libs.items():
            quiet_barrier(comm)
            # the RPC agents poll for 2 ms after their last message: let them go quiet, so
            # that they do not compete with a raw ping-pong batch; then start together (the
            # quiet barrier lets the ranks leave up to a millisecond apart)
            time.sleep(SETTLE_S)
            comm.Barrier()
            if name.startswith("mpi4py"):
                first = name not in sizes
                n = 5 if first else sizes[name]
                if rank == 0:
                    t = timed(fn, n)
                else:
                    serve_raw(comm, name, raw_buf, n)
                if first:  # both ranks learn the batch size from rank 0's warm-up
                    sizes[name] = comm.bcast(
                        max(2, min(5000, int(rep_time / max(t, 1e-7)))) if rank == 0 else None,
                        0)
                if rank != 0 or first:
                    continue
            elif rank == 0:
                if name not in sizes:
                    sizes[name] = batch_size(fn, rep_time)
                    continue
                t = timed(fn, sizes[name])
            else:
                continue
            times[name].append(t)
    return {k: statistics.median(v) for k, v in times.items() if v}


def payloads(nbytes: int, zeros: Optional[Callable[[int], Any]]) -> Any:
    return 5 if nbytes == 8 else (zeros(nbytes // 4) if zeros is not None else None)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9, help="timed repetitions per case")
    ap.add_argument("--rep-time", type=float, default=0.05,
                    help="seconds each repetition lasts at least (default 0.05)")
    ap.add_argument("--json", help="write every row to this file (rank 0)")
    ap.add_argument("--no-torch", action="store_true", help="skip torch RPC")
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    if world.Get_size() != 2:
        if world.Get_rank() == 0:
            print("run on two ranks: mpiexec -n 2 python benchmarks/rpc_latency.py")
        return 2
    comm = world.Dup()
    rank = comm.Get_rank()
    results: Dict[str, Dict[str, float]] = {label: {"bytes": n} for label, n in CASES}

    # phase 1: mpitensor RPC and raw mpi4py, interleaved
    rpc.init_rpc(f"worker{rank}")
    for label, nbytes in CASES:
        x = payloads(nbytes, mpitensor.zeros)
        raw_buf = np.zeros(nbytes, np.uint8)

        def raw_buffer(buf: np.ndarray = raw_buf) -> None:
            comm.Send(buf, 1)
            comm.Recv(buf, 1)

        def raw_pickle(x: Any = x) -> None:
            comm.send((echo, (x,), {}), 1)
            comm.recv(None, 1)

        def ours(x: Any = x) -> None:
            rpc.rpc_sync(1, echo, args=(x,))

        libs: Dict[str, Callable[[], None]] = {"mpitensor rpc": ours,
                                               "mpi4py buffer": raw_buffer}
        if label == "int":
            libs["mpi4py pickle"] = raw_pickle
        results[label].update(measure(comm, libs, raw_buf, args.reps, args.rep_time))
    quiet_barrier(comm)
    rpc.shutdown()

    # phase 2: torch RPC on its own (TensorPipe's threads poll: they would slow the others)
    torch_pair, torch_why = (None, "--no-torch") if args.no_torch else _torch_rpc(comm)
    if torch_pair is not None:
        torch, trpc = torch_pair
        for label, nbytes in CASES:
            x = payloads(nbytes, torch.zeros)

            def theirs(x: Any = x) -> None:
                trpc.rpc_sync("torch1", echo, args=(x,))

            results[label].update(measure(comm, {"torch rpc": theirs}, np.zeros(1),
                                          max(3, args.reps // 2), args.rep_time))
        quiet_barrier(comm)
        trpc.shutdown()
    if rank == 0:
        report(results, torch_why, args.json)
    return 0


def report(results: Dict[str, Dict[str, float]], torch_why: str, path: Optional[str]) -> None:
    names = ["mpitensor rpc", "mpi4py buffer", "mpi4py pickle", "torch rpc"]
    print(f"rpc_sync round trip, 2 ranks, MPI: {MPI.Get_library_version().splitlines()[0]}")
    print(f"{'payload':<15}" + "".join(f"{n:>17}" for n in names) + f"{'GB/s (ours)':>13}")
    for label, row in results.items():
        cells = "".join(f"{row[n] * 1e6:>14.1f} us" if n in row else f"{'-':>17}"
                        for n in names)
        bw = 2 * row["bytes"] / row["mpitensor rpc"] / 1e9
        print(f"{label:<15}{cells}{bw:>13.2f}")
    if torch_why:
        print(f"torch rpc: skipped ({torch_why})")
    ours_int = results["int"]["mpitensor rpc"]
    checks = [
        ("int round trip <= 64 us", ours_int <= 64e-6, f"{ours_int * 1e6:.1f} us"),
        ("int within 3x of mpi4py pickle ping-pong",
         ours_int <= 3 * results["int"]["mpi4py pickle"],
         f"{ours_int / results['int']['mpi4py pickle']:.1f}x"),
        ("int within 3x of mpi4py buffer ping-pong",
         ours_int <= 3 * results["int"]["mpi4py buffer"],
         f"{ours_int / results['int']['mpi4py buffer']:.1f}x"),
    ]
    mib = results["1 MiB tensor"]
    if "torch rpc" in mib:
        checks.append(("1 MiB >= 3x faster than torch rpc",
                       mib["torch rpc"] >= 3 * mib["mpitensor rpc"],
                       f"{mib['torch rpc'] / mib['mpitensor rpc']:.1f}x"))
    big = results["64 MiB tensor"]
    frac = big["mpi4py buffer"] / big["mpitensor rpc"]
    checks.append(("64 MiB >= 80% of mpi4py bandwidth", frac >= 0.8, f"{frac * 100:.0f}%"))
    for what, ok, value in checks:
        print(f"  {'PASS' if ok else 'MISS'}  {what}: {value}")
    if path:
        with open(path, "w") as fh:
            json.dump({"results": results, "torch_skipped": torch_why,
                       "checks": [{"check": c, "pass": bool(ok), "value": v}
                                  for c, ok, v in checks]}, fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
