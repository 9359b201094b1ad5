"""Sharded training in one run: our DDP, ``fully_shard`` and ``ZeroRedundancyOptimizer`` against
torch's DDP, FSDP2 (``fully_shard``) and ZeRO over gloo, on the same model, in the same ranks.

Usage (from the repository root)::

    mpiexec -n 2 python benchmarks/sharded.py                  # ~20M-parameter MLP
    mpiexec -n 4 python benchmarks/sharded.py --json out.json  # and keep the figures
    mpiexec -n 2 python benchmarks/sharded.py --quick          # a small model, seconds

The model is a 4-layer MLP (``--width`` units, ReLU between; width 2240 gives 20.1M
parameters), trained with Adam on ``--batch`` random samples per rank and step. Every
configuration is built in turn (the previous one freed), takes ``--warmup`` untimed steps and
then ``--reps`` repetitions of ``--steps`` steps; the step time of a repetition is the slowest
rank's, the median over repetitions is reported, with its ratio to our DDP (and ours to
torch's counterpart). All ranks run one BLAS/OpenMP thread (and ``torch.set_num_threads(1)``).

Memory per rank is *counted*: the bytes of this rank's parameters, gradients and optimizer
state (local pieces of sharded tensors) after a step, for each library the same way, and
their ratio to DDP's (the issue's target: at most 1/N of DDP's + 5 % for fully_shard and
ZeRO). ZeRO (stage 1) shards only the optimizer state, so its figure is (2 + 2/N) / 4 of
DDP's with Adam, as torch's. ``peak`` adds the largest growth of the process's resident memory
during the timed steps above its level before them (``VmHWM`` reset through
``/proc/self/clear_refs``): the gathered units, buffers and activations.

Where torch (with gloo) is missing, its rows are skipped with a note.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Dict, List, Tuple  # noqa: E402

import mpitensor  # noqa: F401, E402 - first: MPI starts with mpitensor's settings

# isort: split
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mpitensor as mt  # noqa: E402
import mpitensor.distributed as dist  # noqa: E402
from mpitensor import nn  # noqa: E402
from mpitensor.distributed.fsdp import fully_shard  # noqa: E402
from mpitensor.distributed.optim import ZeroRedundancyOptimizer  # noqa: E402
from mpitensor.nn.parallel import DistributedDataParallel  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _torch_baseline import free_port, torch_missing_reason  # noqa: E402

COMM = MPI.COMM_WORLD


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=2240)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="width 512, 2 reps of 2 steps")
    p.add_argument("--json", help="write the figures to this file (rank 0)")
    a = p.parse_args()
    if a.quick:
        a.width, a.reps, a.steps = 512, 2, 2
    return a


# ---------------------------------------------------------------- memory

def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _nbytes(t: Any) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def _held(params: List[Any], state: Dict[Any, Any]) -> int:
    n = sum(_nbytes(p) for p in params)
    n += sum(_nbytes(p.grad) for p in params if p.grad is not None)
    for s in state.values():
        n += sum(_nbytes(v) for v in s.values() if hasattr(v, "element_size") and v.dim() > 0)
    return n


# ---------------------------------------------------------------- the configurations

def _api(torch: Any = None) -> Dict[str, Any]:
    """The names one library gives the pieces this benchmark builds."""
    if torch is None:
        return {"seed": mt.manual_seed, "nn": nn, "Adam": mt.optim.Adam,
                "fully_shard": fully_shard, "DDP": DistributedDataParallel,
                "ZeRO": ZeroRedundancyOptimizer}
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

    return {"seed": torch.manual_seed, "nn": torch.nn, "Adam": torch.optim.Adam,
            "fully_shard": torch_fully_shard, "DDP": torch.nn.parallel.DistributedDataParallel,
            "ZeRO": TorchZero}


def _build(api: Dict[str, Any], kind: str, width: int) -> Tuple[Any, Any, Callable[[], int]]:
    """The model and optimizer of one configuration, and a counter of the bytes they hold."""
    api["seed"](0)
    layers: List[Any] = []
    for _ in range(4):
        layers += [api["nn"].Linear(width, width), api["nn"].ReLU()]
    model = api["nn"].Sequential(*layers[:-1])
    if kind == "fully_shard":
        for m in model:
            if isinstance(m, api["nn"].Linear):
                api["fully_shard"](m)
        api["fully_shard"](model)
    else:
        model = api["DDP"](model)
    if kind == "ZeRO":
        opt = api["ZeRO"](model.parameters(), api["Adam"], lr=1e-4,
                          parameters_as_bucket_view=True)
        state = opt.optim.state
    else:
        opt = api["Adam"](model.parameters(), lr=1e-4)
        state = opt.state
    return model, opt, lambda: _held(list(model.parameters()), state)


def _measure(model: Any, opt: Any, held: Callable[[], int], x: Any, y: Any,
             a: argparse.Namespace) -> Dict[str, float]:
    def step() -> None:
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    times = []
    base = _rss("VmRSS")
    peak_ok = _reset_peak()
    for _ in range(a.reps):
        COMM.Barrier()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            step()
        times.append(COMM.allreduce((time.perf_counter() - t0) / a.steps, op=MPI.MAX))
    growth = max(0, _rss("VmHWM") - base) if peak_ok else 0
    return {"step_s": statistics.median(times), "held": COMM.allreduce(held(), op=MPI.MAX),
            "growth": COMM.allreduce(growth, op=MPI.MAX)}


def _run(a: argparse.Namespace) -> Dict[str, Any]:
    rank = COMM.Get_rank()
    rng = np.random.default_rng(rank)
    xn = rng.standard_normal((a.batch, a.width)).astype(np.float32)
    yn = rng.standard_normal((a.batch, a.width)).astype(np.float32)
    out: Dict[str, Any] = {"ranks": COMM.Get_size(), "width": a.width,
                           "params": 4 * (a.width * a.width + a.width), "rows": {}}
    for kind in ("DDP", "fully_shard", "ZeRO"):
        built = _build(_api(), kind, a.width)
        out["rows"][f"mpitensor {kind}"] = _measure(*built, mt.from_numpy(xn),
                                                    mt.from_numpy(yn), a)
        del built
        gc.collect()
    reason = COMM.bcast(torch_missing_reason() if rank == 0 else None, root=0)
    out["torch"] = reason or "torch " + __import__("torch").__version__ + " gloo"
    if reason:
        return out
    import torch
    import torch.distributed as tdist

    torch.set_num_threads(1)
    port = COMM.bcast(free_port() if rank == 0 else None, root=0)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                             world_size=COMM.Get_size())
    try:
        for kind in ("DDP", "fully_shard", "ZeRO"):
            built = _build(_api(torch), kind, a.width)
            out["rows"][f"torch {kind}"] = _measure(*built, torch.from_numpy(xn),
                                                    torch.from_numpy(yn), a)
            del built
            gc.collect()
    finally:
        COMM.Barrier()
        tdist.destroy_process_group()
    return out


def _table(out: Dict[str, Any]) -> str:
    rows = out["rows"]
    n = out["ranks"]
    ddp = rows["mpitensor DDP"]
    lines = [f"{out['params'] / 1e6:.1f}M-parameter 4-layer MLP (width {out['width']}), Adam, "
             f"{n} ranks; {out['torch']}",
             "| configuration | step (ms) | / our DDP | ours / torch's | held MiB/rank | "
             "held / DDP's | held / (DDP's/N) | peak growth MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        kind = name.split(" ", 1)[1]
        twin = rows.get(f"torch {kind}") if name.startswith("mpitensor") else None
        vs = f"{r['step_s'] / twin['step_s']:.2f}" if twin else ""
        held_ratio = r["held"] / ddp["held"]
        lines.append(f"| {name} | {r['step_s'] * 1e3:.1f} | {r['step_s'] / ddp['step_s']:.2f} | "
                     f"{vs} | {r['held'] / 2**20:.1f} | {held_ratio:.3f} | "
                     f"{held_ratio * n:.3f} | {r['growth'] / 2**20:.1f} |")
    return "\n".join(lines)


def main() -> None:
    a = _args()
    dist.init_process_group("mpi")
    out = _run(a)
    if COMM.Get_rank() == 0:
        print(_table(out))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
