"""What conv2d's band-by-band im2col buys: one process, and two processes on one machine.

conv2d on the CPU builds im2col matrices larger than ``MPITENSOR_CONV_BAND_BYTES`` (default
1 MiB) a band of the output at a time in a cache-sized buffer (see
``mpitensor/nn/_kernels/__init__.py``).
This benchmark trains LeNet (batch 64 per process, one thread each) with bands on and off, in
jobs of two ranks that alternate setting by setting so that machine load hits both alike. Each
job times rank 0 training alone (the other rank asleep), then both ranks training at once with
no communication: the *ceiling* is 2 × (time alone) ÷ (time together), the most a 2-rank
data-parallel job could scale on this machine.

Usage:
    python benchmarks/conv_bands.py [--rounds 3] [--reps 9] [--steps 40] [--batch 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"whole matrix": str(1 << 40), "bands of 1 MiB": str(1 << 20)}


def worker(batch: int, steps: int, reps: int) -> None:
    """One job of two ranks: print ``solo_s together_s`` per repetition (rank 0)."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    sys.path.insert(0, str(ROOT))
    import numpy as np
    from mpi4py import MPI

    import mpitensor as mt
    import mpitensor.nn.functional as F  # noqa: N812
    from mpitensor.models import LeNet
    from mpitensor.optim import SGD

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    rng = np.random.default_rng(rank)
    data = [(mt.from_numpy(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)),
             mt.from_numpy(rng.integers(0, 10, batch))) for _ in range(4)]
    mt.manual_seed(0)
    model = LeNet()
    opt = SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        opt.step()

    def idle_barrier() -> None:  # sleeps, so a waiting rank leaves its core free
        req = comm.Ibarrier()
        while not req.Test():
            time.sleep(0.0005)

    for i in range(10):
        step(i)
    for _ in range(reps):
        idle_barrier()
        solo = 0.0
        if rank == 0:
            t0 = time.perf_counter()
            for i in range(steps):
                step(i)
            solo = time.perf_counter() - t0
        idle_barrier()
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        together = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if rank == 0:
            print(f"{solo:.6f} {together:.6f}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="jobs per setting, alternated")
    p.add_argument("--reps", type=int, default=9, help="timed repetitions per job")
    p.add_argument("--steps", type=int, default=40, help="training steps per repetition")
    p.add_argument("--batch", type=int, default=64, help="batch per process")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.batch, args.steps, args.reps)
        return 0
    from mpitensor.distributed.launch import build_command

    solo: Dict[str, List[float]] = {k: [] for k in SETTINGS}
    together: Dict[str, List[float]] = {k: [] for k in SETTINGS}
    for r in range(args.rounds):
        for name, limit in SETTINGS.items():
            cmd = build_command([sys.executable, __file__, "--worker", "--batch",
                                 str(args.batch), "--steps", str(args.steps), "--reps",
                                 str(args.reps)], 2,
                                env=[("MPITENSOR_CONV_BAND_BYTES", limit)])
            out = subprocess.run(cmd.argv, check=True, stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, **cmd.env}, timeout=600).stdout
            for line in out.split("\n"):
                if line.strip():
                    a, b = map(float, line.split())
                    solo[name].append(a / args.steps * 1e3)
                    together[name].append(b / args.steps * 1e3)
            print(f"round {r + 1}/{args.rounds}: {name} done", file=sys.stderr)
    print(f"LeNet, batch {args.batch} per process, {args.rounds} jobs x {args.reps} repetitions "
          f"of {args.steps} steps per setting, medians\n")
    print("| conv2d im2col | 1 process ms/step | 2 processes at once ms/step | ceiling |")
    print("|---|---:|---:|---:|")
    for name in SETTINGS:
        s, t = statistics.median(solo[name]), statistics.median(together[name])
        print(f"| {name} | {s:.2f} | {t:.2f} | {2 * s / t:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
