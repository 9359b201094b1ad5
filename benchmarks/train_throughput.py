"""LeNet training throughput: mpitensor against PyTorch (CPU), one process and DDP on 2 ranks.

Run (from the repository root)::

    python benchmarks/train_throughput.py                       # full run, table on stdout
    python benchmarks/train_throughput.py --quick               # a smoke run (seconds)
    python benchmarks/train_throughput.py --json out.json --md out.md --png docs/img/t.png

The driver starts these measuring jobs; all but the last run one thread per process
(``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` = 1 before NumPy/torch are
imported, and ``torch.set_num_threads(1)``):

1. ``python train_throughput.py --phase single``: one process; mpitensor's LeNet + SGD against
   torch's at per-step batch 64 and 256, and a per-phase profile of one step; then the same
   comparison again at both libraries' *default* thread counts (``--default-threads``: nothing
   set, as a user runs them);
2. ``mpiexec -n 2 python train_throughput.py --phase ddp``: mpitensor
   ``DistributedDataParallel`` (MPI) against ``torch.nn.parallel.DistributedDataParallel``
   (gloo, TCP rendezvous on 127.0.0.1 with rank and size from MPI) in the same two processes,
   at 64 and 256 samples per rank; a bucket sweep (``bucket_cap_mb`` 0 = one bucket per
   parameter, 0.1, 1, 5, 25; overlap on and off); and a profile of one DDP step (forward,
   backward compute, all-reduce launches, wait, optimizer).
3. the README's command as a user types it (``benchmarks/_as_typed.py``):
   ``mpiexec -n N python examples/train.py --data-dir D --epochs E --batch-size 64`` at 1, 2
   and 4 ranks, with no thread variable set, beside the same command with every hand-set
   thread count; samples/s as train.py prints them, the ratio to the best hand-set
   configuration, and the scaling against one rank. ``--as-typed`` runs this part alone.

Both libraries train the same network (LeNet-5 as in ``mpitensor.models.LeNet``, torch's copy
starts from mpitensor's initial weights), with momentum SGD, on the same batches (MNIST-sized
random images with a fixed seed: speed does not depend on pixel values). A *repetition* times
``--steps`` training steps (zero_grad, forward, NLL loss, backward, optimizer step) after
``--warmup`` untimed ones; repetitions alternate between the libraries so machine noise hits
both alike, and the median of ``--reps`` is reported; ratios are paired (median over
repetitions of the ratio of two measurements taken back to back). DDP times are the slowest
rank's. Samples/s count all ranks' samples. DDP scaling is the 2-rank samples/s divided by the
one-process samples/s at the same batch per rank (target >= 1.8), both measured in the DDP job
(for a one-process repetition rank 0 trains alone while the other ranks sleep), next to the
machine's ceiling (the ranks training at once without gradient sync) and DDP's efficiency.
``--render FILE.json`` prints the tables of an earlier run.

Where torch is missing, its rows are skipped with a note.
"""

from __future__ import annotations

import os
import sys

# one thread per process, before NumPy or torch is imported anywhere (except where a phase
# measures the libraries' defaults: it starts from the user's environment, kept here)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
USER_ENV = dict(os.environ)
DEFAULT_THREADS = "--default-threads" in sys.argv[1:]
if not DEFAULT_THREADS:
    for _var in THREAD_VARS:
        os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import _as_typed  # noqa: E402 (this folder)
import numpy as np  # noqa: E402
from _torch_baseline import free_port, torch_missing_reason  # noqa: E402 (this folder)

BATCHES = (64, 256)
PAUSE_S = 0.3  # between repetitions of the default-threads phase (see _rep)
SHARED_MNIST = ROOT.parent / "shared" / "data" / "mnist"
SWEEP_MB = (0.0, 0.1, 1.0, 5.0, 25.0)
PROFILE_BATCH = 64
LR, MOMENTUM = 0.01, 0.9


# ------------------------------------------------------------------------------ torch
def torch_lenet(mt_model: Any) -> Any:
    """torch's LeNet-5 with the same layers as mpitensor's, starting from its weights."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F  # noqa: N812

    class LeNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(400, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, 10)

        def forward(self, x: Any) -> Any:
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = torch.flatten(x, 1)
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            return F.log_softmax(self.fc3(x), dim=1)

    model = LeNet()
    model.load_state_dict({k: torch.from_numpy(np.array(v.numpy(), copy=True))
                           for k, v in mt_model.state_dict().items()})
    return model


# ------------------------------------------------------------------------------ data and steps
def make_batches(batch: int, count: int, seed: int) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``count`` batches of normalised-looking 1x28x28 float32 images and int64 labels."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 1, 28, 28), dtype=np.float32),
             rng.integers(0, 10, batch, dtype=np.int64)) for _ in range(count)]


class _Lib:
    """One training setup; the loop is the same code for both, as the APIs are the same.

    Subclasses set ``model``, ``opt``, ``F`` (the functional module) and ``data`` (batches).
    """

    model: Any
    opt: Any
    F: Any
    data: list

    def step(self, i: int) -> None:
        x, y = self.data[i % len(self.data)]
        self.opt.zero_grad()
        loss = self.F.nll_loss(self.model(x), y)
        loss.backward()
        self.opt.step()

    def phases(self, i: int) -> Tuple[float, float, float, float]:
        """One step, timed: (zero_grad, forward + loss, backward, optimizer) in seconds."""
        x, y = self.data[i % len(self.data)]
        t0 = time.perf_counter()
        self.opt.zero_grad()
        t1 = time.perf_counter()
        loss = self.F.nll_loss(self.model(x), y)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        self.opt.step()
        t4 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2, t4 - t3


class MtLib(_Lib):
    """mpitensor LeNet + SGD (optionally wrapped in DDP): ``step(i)`` trains on batch i."""

    name = "mpitensor"

    def __init__(self, batches: Sequence[Tuple[np.ndarray, np.ndarray]], ddp: bool = False,
                 bucket_cap_mb: float = 25.0, overlap: bool = True, name: str = "",
                 solo: bool = False) -> None:
        import mpitensor as mt
        import mpitensor.nn.functional as F  # noqa: N812
        from mpitensor.models import LeNet
        from mpitensor.optim import SGD

        self.name = name or self.name
        self.solo = solo
        mt.manual_seed(0)
        self.base = LeNet()
        self.model: Any = self.base
        if ddp:
            from mpitensor.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(self.base, bucket_cap_mb=bucket_cap_mb,
                                                 overlap=overlap)
        self.opt = SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)
        self.F = F
        self.data = [(mt.from_numpy(x), mt.from_numpy(y)) for x, y in batches]



class TorchLib(_Lib):
    """torch LeNet + SGD (optionally DDP on gloo), from mpitensor's initial weights."""

    name = "torch"

    def __init__(self, batches: Sequence[Tuple[np.ndarray, np.ndarray]], ddp: bool = False,
                 bucket_cap_mb: float = 25.0, name: str = "", solo: bool = False) -> None:
        import torch
        import torch.nn.functional as F  # noqa: N812

        import mpitensor as mt
        from mpitensor.models import LeNet

        self.name = name or self.name
        self.solo = solo
        mt.manual_seed(0)
        self.model: Any = torch_lenet(LeNet())
        if ddp:
            from torch.nn.parallel import DistributedDataParallel

            self.model = DistributedDataParallel(self.model, bucket_cap_mb=bucket_cap_mb)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)
        self.F = F
        self.data = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]



def _idle_barrier() -> None:
    """A barrier that sleeps instead of spinning, so a waiting rank leaves its core free."""
    from mpi4py import MPI

    req = MPI.COMM_WORLD.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


def _rep(lib: Any, steps: int, start: int, sync: Optional[Callable[[float], float]]) -> float:
    """Seconds for ``steps`` steps (the slowest rank's when ``sync`` reduces with MAX).

    A ``solo`` library trains on rank 0 alone while the other ranks sleep: the one-process
    baseline, measured inside the DDP job so that it sees the same machine load.
    """
    if sync is not None:
        sync(0.0)  # a barrier: every rank starts together
    if DEFAULT_THREADS:
        # idle thread pools spin a while after their last job (torch's OpenMP, OpenBLAS):
        # let the other library's go quiet, so each repetition starts on an idle machine
        time.sleep(PAUSE_S)
        # ... but a machine left idle runs its first tens of milliseconds of work slowly
        # (measured on the 2-core VM: LeNet's two-thread steps took 1.3-1.5x their steady
        # time for about 50 ms after the pause, which is a fifth of a batch-256 repetition):
        # untimed steps first (half as many as are timed: about 50 ms, the same count on
        # every rank), so that the timed ones are what a training loop runs at
        if not getattr(lib, "solo", False) or _rank() == 0:
            for i in range(start, start + max(2, steps // 2)):
                lib.step(i)
    elapsed = 0.0
    if not getattr(lib, "solo", False) or _rank() == 0:
        t0 = time.perf_counter()
        for i in range(start, start + steps):
            lib.step(i)
        elapsed = time.perf_counter() - t0
    if getattr(lib, "solo", False) and sync is not None:
        _idle_barrier()
    return sync(elapsed) if sync is not None else elapsed


def _rank() -> int:
    if "mpi4py.MPI" not in sys.modules:
        return 0
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() else 0


def measure(libs: Sequence[Any], batch: int, world: int, args: argparse.Namespace,
            sync: Optional[Callable[[float], float]] = None) -> Dict[str, Dict[str, Any]]:
    """Median samples/s of each library, repetitions interleaved (order rotating)."""
    steps = max(1, round(args.steps * 64 / batch))  # about the same time per repetition
    for lib in libs:
        for i in range(args.warmup):
            lib.step(i)
    times: Dict[str, List[float]] = {lib.name: [] for lib in libs}
    solo = {lib.name: getattr(lib, "solo", False) for lib in libs}
    for r in range(args.reps):
        order = libs[r % len(libs):] + libs[:r % len(libs)]
        for lib in order:
            times[lib.name].append(_rep(lib, steps, args.warmup + r * steps, sync))
    out = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        ranks = 1 if solo[name] else world
        out[name] = {"samples_per_s": ranks * batch * steps / med, "steps": steps,
                     "reps": len(ts), "median_s": med, "min_s": min(ts), "max_s": max(ts),
                     "times_s": ts}
    return out


def profile(libs: Sequence[Any], steps: int, warmup: int) -> Dict[str, Dict[str, float]]:
    """Median milliseconds per phase of one step, the libraries alternating step by step."""
    for lib in libs:
        for i in range(warmup):
            lib.step(i)
    rows: Dict[str, list] = {lib.name: [] for lib in libs}
    for i in range(steps):
        for lib in libs:
            rows[lib.name].append(lib.phases(warmup + i))
    names = ("zero_grad", "forward", "backward", "optimizer")
    out = {}
    for lib in libs:
        r = rows[lib.name]
        out[lib.name] = {n: 1e3 * statistics.median(x[k] for x in r)
                         for k, n in enumerate(names)}
        out[lib.name]["total"] = 1e3 * statistics.median(sum(x) for x in r)
    return out


# ------------------------------------------------------------------------------ phase: one process
def phase_single(args: argparse.Namespace) -> Dict[str, Any]:
    """mpitensor vs torch in one process, one thread, batch 64 and 256; per-phase profile."""
    reason = torch_missing_reason()
    if not reason and not DEFAULT_THREADS:
        import torch

        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
    result: Dict[str, Any] = {"torch_missing": reason, "throughput": {}, "profile": {},
                              "threads": _threads_in_use(reason)}
    for batch in BATCHES:
        batches = make_batches(batch, 8, seed=batch)
        libs: List[Any] = [MtLib(batches)]
        if not reason:
            libs.append(TorchLib(batches))
        result["throughput"][str(batch)] = measure(libs, batch, 1, args)
        if batch == PROFILE_BATCH:
            result["profile"] = profile(libs, args.profile_steps, args.warmup)
    return result


def _threads_in_use(torch_reason: str) -> Dict[str, Any]:
    """The thread counts the libraries run with in this process."""
    import mpitensor

    out: Dict[str, Any] = {"mpitensor": mpitensor.get_num_threads()}
    if not torch_reason:
        import torch

        out["torch"] = torch.get_num_threads()
    return out


# ------------------------------------------------------------------------------ phase: DDP
class _LaunchTimer:
    """Times every ``all_reduce(..., async_op=True)`` (DDP's bucket launches) while active."""

    def __init__(self) -> None:
        import mpitensor.distributed as dist

        self.dist = dist
        self.original = dist.all_reduce
        self.calls: List[Tuple[float, float]] = []  # (start, duration)

    def __enter__(self) -> _LaunchTimer:
        original, calls = self.original, self.calls

        def timed(*a: Any, **k: Any) -> Any:
            if not k.get("async_op"):
                return original(*a, **k)
            t0 = time.perf_counter()
            work = original(*a, **k)
            calls.append((t0, time.perf_counter() - t0))
            return work

        self.dist.all_reduce = timed
        return self

    def __exit__(self, *exc: Any) -> None:
        self.dist.all_reduce = self.original


def profile_ddp(lib: MtLib, steps: int, warmup: int) -> Dict[str, float]:
    """Median ms per phase of a DDP step, backward split into compute, launch and wait."""
    for i in range(warmup):
        lib.step(i)
    stats = lib.model.comm_stats
    rows = []
    seen_launches = 0
    with _LaunchTimer() as timer:
        for i in range(steps):
            seen_launches += len(timer.calls)
            timer.calls.clear()
            zero, fwd, bwd, opt = lib.phases(warmup + i)
            end = stats.last_backward_end_s
            launch_during = sum(d for t, d in timer.calls if t < end)
            launch_at_end = sum(d for t, d in timer.calls if t >= end)
            wait = max(stats.last_wait_s - launch_at_end, 0.0)
            launch = launch_during + launch_at_end
            rows.append({"zero_grad": zero, "forward": fwd,
                         "backward compute": bwd - launch - wait, "launch": launch,
                         "wait": wait, "optimizer": opt, "total": zero + fwd + bwd + opt,
                         "overlapped": stats.overlapped})
    seen_launches += len(timer.calls)
    if not seen_launches:
        # DDP no longer launches through mpitensor.distributed.all_reduce: say so instead of
        # reporting launches that cost nothing
        raise RuntimeError("profile_ddp: no all_reduce(async_op=True) call was seen during "
                           "backward; update _LaunchTimer to DDP's launch path")
    out = {k: 1e3 * statistics.median(r[k] for r in rows) for k in rows[0] if k != "overlapped"}
    out["buckets"] = stats.num_buckets
    out["overlapped_buckets"] = statistics.median(r["overlapped"] for r in rows)
    return out


def phase_ddp(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """DDP on the ranks of this mpiexec job: mpitensor (MPI) vs torch (gloo); sweep; profile."""
    import mpitensor.distributed as dist

    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()

    def sync(value: float) -> float:
        box = np.array([value])
        dist.all_reduce(box, op=dist.ReduceOp.MAX)
        return float(box[0])

    reason = torch_missing_reason()
    if not reason:
        import torch
        import torch.distributed as tdist

        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        port = [free_port() if rank == 0 else None]
        dist.broadcast_object_list(port, src=0)
        tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port[0]}", rank=rank,
                                 world_size=world)
    result: Dict[str, Any] = {"world_size": world, "torch_missing": reason, "throughput": {},
                              "sweep": [], "profile": {}}
    for batch in BATCHES:
        batches = make_batches(batch, 8, seed=1000 * (rank + 1) + batch)
        # "no sync": every rank trains its own replica at the same time, without DDP: the
        # throughput two processes reach on this machine when communication costs nothing
        libs: List[Any] = [MtLib(batches, ddp=True),
                           MtLib(batches, name="mpitensor no sync"),
                           MtLib(batches, name="mpitensor 1 process", solo=True)]
        if not reason:
            libs += [TorchLib(batches, ddp=True), TorchLib(batches, name="torch no sync"),
                     TorchLib(batches, name="torch 1 process", solo=True)]
        result["throughput"][str(batch)] = measure(libs, batch, world, args, sync)
    batches = make_batches(PROFILE_BATCH, 8, seed=1000 * (rank + 1))
    configs = [(cap, overlap) for cap in SWEEP_MB for overlap in (True, False)]
    sweep = [MtLib(batches, ddp=True, bucket_cap_mb=cap, overlap=overlap,
                   name=f"{cap:g} MB overlap={overlap}") for cap, overlap in configs]
    # all configurations interleaved repetition by repetition, so load drift hits them alike
    measured = measure(sweep, PROFILE_BATCH, world, args, sync)
    for (cap, overlap), lib in zip(configs, sweep):
        stats = lib.model.comm_stats
        steps = max(stats.steps, 1)
        result["sweep"].append({
            "bucket_cap_mb": cap, "overlap": overlap, "buckets": stats.num_buckets,
            "samples_per_s": measured[lib.name]["samples_per_s"],
            "wait_ms_per_step": 1e3 * sync(stats.total_wait_s / steps),
            "overlapped_buckets_last_step": stats.overlapped})
    lib = MtLib(batches, ddp=True)
    result["profile"]["mpitensor DDP"] = profile_ddp(lib, args.profile_steps, args.warmup)
    if not reason:
        tdist.destroy_process_group()
    dist.destroy_process_group()
    return result if rank == 0 else None


# ------------------------------------------------------------------------------ driver
def _ranks_list(text: str) -> List[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected rank counts such as 1,2,4, got {text!r}")
    return out


def _launch(cmd: List[str], timeout: float, env: Optional[Dict[str, str]] = None) -> None:
    proc = subprocess.Popen(cmd, start_new_session=True, env=env)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise SystemExit(
            f"train_throughput.py: {shlex.join(cmd)} ran past {timeout:.0f} s") from None
    if rc != 0:
        raise SystemExit(f"train_throughput.py: {shlex.join(cmd)} exited with code {rc}")


def _mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    import shutil

    found = shutil.which("mpiexec")
    if not found:
        raise SystemExit("train_throughput.py: mpiexec not found (pip install mpich)")
    return found


def _paired(row: Dict[str, Any], fast: str, slow: str) -> Optional[float]:
    """Median over repetitions of samples/s(fast) / samples/s(slow), taken back to back.

    Both ran the same number of steps per repetition, so the ratio of samples/s is the
    inverse ratio of the times; pairing repetitions cancels most load that comes and goes.
    """
    a, b = row.get(fast), row.get(slow)
    if not a or not b or len(a["times_s"]) != len(b["times_s"]):
        return None
    return statistics.median(tb / ta for ta, tb in zip(a["times_s"], b["times_s"]))


def _r(v: Optional[float]) -> str:
    return f"{v:.2f}" if v else "n/a"


def _fmt(v: Optional[float]) -> str:
    return f"{v:,.0f}" if v else "n/a"


def tables(single: Dict[str, Any], ddp: Dict[str, Any]) -> str:
    """The markdown tables of a run."""
    world = ddp["world_size"]
    out = ["| measurement | batch per rank | mpitensor samples/s | torch samples/s | "
           "mpitensor / torch (paired) |", "|---|---:|---:|---:|---:|"]
    one: Dict[int, Dict[str, float]] = {}
    for batch in BATCHES:
        row = single["throughput"][str(batch)]
        m, t = row["mpitensor"]["samples_per_s"], row.get("torch", {}).get("samples_per_s")
        one[batch] = {"mpitensor": m, "torch": t}
        out.append(f"| 1 process, 1 thread | {batch} | {_fmt(m)} | {_fmt(t)} | "
                   f"{_r(_paired(row, 'mpitensor', 'torch'))} |")
    default = single.get("default_threads")
    for batch in BATCHES if default else ():
        row = default["throughput"][str(batch)]
        m, t = row["mpitensor"]["samples_per_s"], row.get("torch", {}).get("samples_per_s")
        th = default.get("threads", {})
        label = (f"1 process, default threads (mpitensor {th.get('mpitensor', '?')}, torch "
                 f"{th.get('torch', '?')})")
        out.append(f"| {label} | {batch} | {_fmt(m)} | {_fmt(t)} | "
                   f"{_r(_paired(row, 'mpitensor', 'torch'))} |")
    for batch in BATCHES:
        row = ddp["throughput"][str(batch)]
        m, t = row["mpitensor"]["samples_per_s"], row.get("torch", {}).get("samples_per_s")
        out.append(f"| DDP {world} ranks (MPI vs gloo) | {batch} | {_fmt(m)} | {_fmt(t)} | "
                   f"{_r(_paired(row, 'mpitensor', 'torch'))} |")
    for batch in BATCHES:
        row = ddp["throughput"][str(batch)]
        m = row["mpitensor no sync"]["samples_per_s"]
        t = row.get("torch no sync", {}).get("samples_per_s")
        out.append(f"| {world} processes, no gradient sync (ideal) | {batch} | {_fmt(m)} | "
                   f"{_fmt(t)} | {_r(_paired(row, 'mpitensor no sync', 'torch no sync'))} |")
    # same steps per repetition: a samples/s ratio is world x time(1 process) / time(other)
    ratios = (
        (f"DDP scaling ({world} ranks ÷ 1 process, same job)", "", " 1 process", world),
        (f"ceiling: {world} processes without sync ÷ 1 process, same job", " no sync",
         " 1 process", world),
        ("DDP efficiency (DDP ÷ no sync, same run)", "", " no sync", 1),
    )
    for label, num, den, scale in ratios:
        for batch in BATCHES:
            row = ddp["throughput"][str(batch)]
            rm = _paired(row, "mpitensor" + num, "mpitensor" + den)
            rt = _paired(row, "torch" + num, "torch" + den)
            out.append(f"| {label} | {batch} | {_r(rm and scale * rm)} | "
                       f"{_r(rt and scale * rt)} | |")
    out += ["", f"Bucket sweep (mpitensor DDP, {world} ranks, batch {PROFILE_BATCH} per rank; "
            "cap 0 = one bucket per parameter):", "",
            "| bucket_cap_mb | buckets | overlap | samples/s | wait ms/step | "
            "buckets launched during backward |", "|---:|---:|---|---:|---:|---:|"]
    for r in ddp["sweep"]:
        out.append(f"| {r['bucket_cap_mb']:g} | {r['buckets']} | "
                   f"{'on' if r['overlap'] else 'off'} | {_fmt(r['samples_per_s'])} | "
                   f"{r['wait_ms_per_step']:.3f} | {r['overlapped_buckets_last_step']} |")
    prof = dict(single["profile"])
    prof.update(ddp["profile"])
    cols = [c for c in ("mpitensor", "torch", "mpitensor DDP") if c in prof]
    phases = ("zero_grad", "forward", "backward", "backward compute", "launch", "wait",
              "optimizer", "total")
    out += ["", f"Where one step's time goes (median ms, batch {PROFILE_BATCH} per process):",
            "", "| phase | " + " | ".join(f"{c} (1 process)" if c != "mpitensor DDP" else
                                           f"{c} ({world} ranks)" for c in cols) + " |",
            "|---|" + "---:|" * len(cols)]
    for ph in phases:
        vals = [prof[c].get(ph) for c in cols]
        if all(v is None for v in vals):
            continue
        out.append(f"| {ph} | " + " | ".join("" if v is None else f"{v:.3f}" for v in vals)
                   + " |")
    if "mpitensor DDP" in prof:
        p = prof["mpitensor DDP"]
        out.append(f"\nDDP: {p['buckets']} bucket(s), {p['overlapped_buckets']:g} launched "
                   "during backward (the rest when backward ended); `backward` of the "
                   "1-process columns includes everything; in the DDP column it is split into "
                   "compute, launch (time inside the non-blocking all_reduce calls) and wait "
                   "(blocking on the all-reduces after backward).")
    notes = {single.get("torch_missing"), ddp.get("torch_missing")} - {"", None}
    for n in notes:
        out.append(f"\ntorch rows skipped: {n}")
    return "\n".join(out)


def as_typed_text(res: Dict[str, Any]) -> str:
    """The as-typed table with its command and data line."""
    return (f"The README's command as typed: `{res['command']}` ({res['reps']} repetition(s), "
            f"median; {res['cores']} usable cores; mean of the epochs' samples/s as train.py "
            f"prints them)\n\n{res['header']}\n\n" + _as_typed.table(res))


def plot(single: Dict[str, Any], ddp: Dict[str, Any], path: Path) -> None:
    """Bar charts: samples/s per configuration, and the bucket sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels, mt_vals, t_vals = [], [], []
    for kind, res in (("1 proc", single), (f"DDP {ddp['world_size']}", ddp)):
        for batch in BATCHES:
            row = res["throughput"][str(batch)]
            labels.append(f"{kind}\nbatch {batch}")
            mt_vals.append(row["mpitensor"]["samples_per_s"])
            t_vals.append(row.get("torch", {}).get("samples_per_s", 0.0))
    x = np.arange(len(labels))
    ax1.bar(x - 0.2, mt_vals, 0.4, label="mpitensor")
    ax1.bar(x + 0.2, t_vals, 0.4, label="PyTorch (CPU, gloo)")
    ax1.set_xticks(x, labels)
    ax1.set_ylabel("samples/s")
    ax1.set_title("LeNet training throughput, 1 thread per process")
    ax1.legend()
    sw = ddp["sweep"]
    names = [f"{r['bucket_cap_mb']:g} MB\n{'overlap' if r['overlap'] else 'no overlap'}"
             for r in sw]
    ax2.bar(np.arange(len(sw)), [r["samples_per_s"] for r in sw],
            color=["tab:blue" if r["overlap"] else "tab:gray" for r in sw])
    ax2.set_xticks(np.arange(len(sw)), names, fontsize=7)
    ax2.set_ylabel("samples/s")
    ax2.set_title(f"mpitensor DDP bucket sweep, batch {PROFILE_BATCH}/rank")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _blas_kernel() -> str:
    """NumPy's BLAS and the kernel it runs, and any environment override of that choice.

    Some hosts set ``OPENBLAS_CORETYPE`` (an older kernel than the CPU supports); NumPy's
    matrix products then run 1.3-1.6x slower, which the reader of a ratio against torch (which
    brings its own kernels) must know.
    """
    try:
        from threadpoolctl import threadpool_info

        blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    except Exception:  # noqa: BLE001 - the header just says less
        blas = []
    text = ", ".join(f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture')} "
                     f"kernel)" for i in blas) or "BLAS unknown"
    forced = {k: v for k, v in USER_ENV.items() if k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    if forced:
        text += "; set in the environment: " + ", ".join(f"{k}={v}" for k, v in forced.items())
    return text


def driver(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run both phases as subprocesses, then print (and write) the tables."""
    me = str(Path(__file__).resolve())
    common = ["--reps", str(args.reps), "--steps", str(args.steps), "--warmup",
              str(args.warmup), "--profile-steps", str(args.profile_steps)]
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    single: Dict[str, Any] = {}
    ddp: Dict[str, Any] = {}
    if not args.as_typed:
        with tempfile.TemporaryDirectory() as tmp:
            outs = [Path(tmp, f"{n}.json") for n in ("single", "default", "ddp")]
            _launch([sys.executable, me, "--phase", "single", "--out", str(outs[0]), *common],
                    args.timeout)
            _launch([sys.executable, me, "--phase", "single", "--default-threads", "--out",
                     str(outs[1]), *common], args.timeout,
                    env={k: v for k, v in USER_ENV.items() if k not in THREAD_VARS})
            _launch([_mpiexec(), "-n", str(args.ranks), sys.executable, me, "--phase", "ddp",
                     "--out", str(outs[2]), *common], args.timeout)
            single, default, ddp = (json.loads(p.read_text()) for p in outs)
        single["default_threads"] = default
    typed = _as_typed.measure(_mpiexec(), args.as_typed_ranks, args.data_dir,
                              args.as_typed_epochs, 64, args.as_typed_reps, args.timeout,
                              ["--train-size", "1024"] if args.quick else [])
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": ", ".join(x for x in (platform.node(), f"{os.cpu_count()} cores",
                                         platform.processor()) if x),
        "python": platform.python_version(), "numpy": np.__version__,
        "command": "python benchmarks/train_throughput.py " + shlex.join(argv),
        "load_average_at_start": load0, "seconds": time.perf_counter() - t0,
        "blas": _blas_kernel(),
    }
    try:
        import torch

        meta["torch"] = torch.__version__
    except Exception:  # noqa: BLE001 - reported as missing in the tables
        meta["torch"] = None
    text = (tables(single, ddp) + "\n\n" if single else "") + as_typed_text(typed)
    head = (f"LeNet training throughput — {meta['date']}, {meta['machine']}, Python "
            f"{meta['python']}, NumPy {meta['numpy']} ({meta['blas']}), torch {meta['torch']}; "
            f"load average "
            f"{load0:.2f} at start; {args.reps} repetitions of ~{args.steps} steps (batch 64) "
            f"after {args.warmup} warm-up, median\nCommand: `{meta['command']}`\n")
    print(head)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "single": single, "ddp": ddp,
                                               "as_typed": typed}, indent=1))
    if args.md:
        Path(args.md).write_text(head + "\n" + text + "\n")
    if args.png and single:
        plot(single, ddp, Path(args.png))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point: the driver, or one measuring phase (``--phase``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 reps of few steps")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (median; default 5)")
    p.add_argument("--steps", type=int, default=30,
                   help="steps per repetition at batch 64 (scaled for 256; default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--profile-steps", type=int, default=40,
                   help="steps timed phase by phase (default 40)")
    p.add_argument("--ranks", type=int, default=2, help="ranks of the DDP phase (default 2)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per phase")
    p.add_argument("--json", help="write every number to this JSON file")
    p.add_argument("--md", help="write the tables (markdown) to this file")
    p.add_argument("--png", help="write a bar chart to this PNG")
    p.add_argument("--render", metavar="JSON",
                   help="print the tables of an earlier run's --json file and exit")
    p.add_argument("--as-typed", action="store_true",
                   help="run only the README's command as typed (and with hand-set threads)")
    p.add_argument("--as-typed-ranks", type=_ranks_list, default=[1, 2, 4],
                   help="rank counts of the as-typed runs (default 1,2,4)")
    p.add_argument("--as-typed-epochs", type=int, default=2,
                   help="epochs of each as-typed run (default 2)")
    p.add_argument("--as-typed-reps", type=int, default=3,
                   help="repetitions of each as-typed configuration (default 3)")
    p.add_argument("--data-dir", default=str(SHARED_MNIST) if SHARED_MNIST.is_dir() else None,
                   help="MNIST directory for the as-typed runs (default ../shared/data/mnist "
                        "where it exists, else train.py's own default)")
    p.add_argument("--phase", choices=("single", "ddp"), help=argparse.SUPPRESS)
    p.add_argument("--default-threads", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("reps", "steps", "warmup", "profile_steps", "ranks", "as_typed_epochs",
                 "as_typed_reps"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.render:
        saved = json.loads(Path(args.render).read_text())
        parts = [tables(saved["single"], saved["ddp"])] if saved.get("single") else []
        if saved.get("as_typed"):
            parts.append(as_typed_text(saved["as_typed"]))
        print("\n\n".join(parts))
        return 0
    if args.quick:
        args.reps, args.steps, args.warmup, args.profile_steps = 2, 3, 1, 3
        args.as_typed_ranks, args.as_typed_epochs, args.as_typed_reps = [1, 2], 1, 1
    if args.phase is None:
        return driver(args, argv)
    result = phase_single(args) if args.phase == "single" else phase_ddp(args)
    if result is not None:
        Path(args.out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
