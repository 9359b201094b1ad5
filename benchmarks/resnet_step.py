"""Time a ResNet-18-style training step (batch 32, 32x32 images) in mpitensor and in PyTorch.

The network is the CIFAR-style ResNet-18: a 3x3 stem convolution to 64 channels (BN, ReLU, no
max pool), four stages of two BasicBlocks (64, 128, 256, 512 channels; stride 2 and a 1x1
convolution + BN downsample at the start of stages 2-4), each block
``conv3x3-BN-ReLU-conv3x3-BN, += identity, ReLU``, then ``AdaptiveAvgPool2d(1)`` and
``Linear(512, 10)``. Both libraries get the same weights (torch's initialisation copied over)
and the same batch; the step is cross-entropy, backward, SGD with momentum.

Before timing, the first step's loss is checked to agree (1e-4 relative) and the second's
(after one update, so backward and the optimizer are in it) to 1e-3, so that both do the same
work. Then, at 1 thread and at the default thread count (every core), the two steps are timed
alternately (the order flipped every repetition, so that load from other processes hits both
alike); the table gives the medians as samples/s and the throughput ratio mpitensor / torch
(above 1 means mpitensor is faster), the median of the per-repetition ratios beside it.
Threads are set with ``mpitensor.set_num_threads`` (every BLAS/OpenMP pool, through
threadpoolctl) and ``torch.set_num_threads``.

With several threads a pause comes before each timed step (see :func:`time_pair`), and the
load average before and after each row is printed: on a shared machine the several-thread
rows measure how each library copes with cores other processes take, as much as its speed.

Last, a per-layer-type profile of mpitensor's step at one thread: the CPU time (of the one
thread that does all the work, so other processes' load hardly moves it) of each kind of
operation's forward and backward (conv2d's backward split into the input and weight
gradients), found by wrapping the kernels with timers for a few steps; and torch's profiler's
times for the same kinds, for comparison.

Usage:
    python benchmarks/resnet_step.py [--batch 32] [--reps 15] [--threads 1,2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mpitensor as mt  # noqa: E402
import mpitensor.nn.functional as MF  # noqa: E402
from mpitensor import optim as mt_optim  # noqa: E402

PAUSE_S = 0.3  # before each timed step with several threads (see time_pair)


# -------------------------------------------------------------------------------- the model
def build_resnet18(nn: Any, num_classes: int = 10) -> Any:
    """The CIFAR-style ResNet-18, written once against a torch-like ``nn`` module."""

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            out += identity
            return self.relu(out)

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            stages, cin = [], 64
            for i, cout in enumerate((64, 128, 256, 512)):
                stride = 1 if i == 0 else 2
                stages.append(nn.Sequential(BasicBlock(cin, cout, stride),
                                            BasicBlock(cout, cout, 1)))
                cin = cout
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x: Any) -> Any:
            x = self.relu(self.bn1(self.conv1(x)))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet18()


class Side:
    """One library's model, optimizer, batch and training step."""

    def __init__(self, lib: Any, nn: Any, optim: Any, F: Any, state: Dict[str, np.ndarray],
                 x: np.ndarray, y: np.ndarray, lr: float) -> None:
        self.model = build_resnet18(nn)
        self.model.load_state_dict({k: lib.tensor(v) for k, v in state.items()})
        self.model.train()
        self.opt = optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.x, self.y, self.F = lib.tensor(x), lib.tensor(y), F

    def step(self) -> float:
        self.opt.zero_grad()
        loss = self.F.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        return float(loss.item())


def make_sides(batch: int, seed: int, torch: Optional[Any]) -> tuple:
    """mpitensor's and (if there) torch's :class:`Side`, with the same weights and batch."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, batch).astype(np.int64)
    if torch is not None:
        torch.manual_seed(seed)
        tmodel = build_resnet18(torch.nn)
        state = {k: v.detach().numpy().copy() for k, v in tmodel.state_dict().items()}
    else:  # mpitensor's own initialisation
        mt.manual_seed(seed)
        state = {k: np.asarray(v.numpy()).copy()
                 for k, v in build_resnet18(mt.nn).state_dict().items()}
    ms = Side(mt, mt.nn, mt_optim, MF, state, x, y, 0.01)
    ts = None
    if torch is not None:
        ts = Side(torch, torch.nn, torch.optim, torch.nn.functional, state, x, y, 0.01)
    return ms, ts


def check_losses(ms: Side, ts: Side) -> tuple:
    """The first two steps' losses of both; raise if they differ (1e-4, then 1e-3 relative)."""
    out = []
    for step, tol in ((1, 1e-4), (2, 1e-3)):
        a, b = ms.step(), ts.step()
        if not abs(a - b) <= tol * abs(b):
            raise AssertionError(f"step {step}: mpitensor loss {a!r} != torch loss {b!r} "
                                 f"(relative tolerance {tol})")
        out.append((a, b))
    return tuple(out)


# -------------------------------------------------------------------------------- timing
def set_threads(n: int, torch: Optional[Any]) -> None:
    mt.set_num_threads(n)  # every BLAS/OpenMP pool in the process, torch's OpenMP included
    if torch is not None:
        torch.set_num_threads(n)


def time_pair(ms: Side, ts: Optional[Side], reps: int, warmup: int = 2,
              pause: float = 0.0) -> dict:
    """Medians (s) of both steps, timed alternately, and the per-repetition ratios.

    ``pause`` seconds pass before each timed step: idle thread pools spin a while after their
    last job (torch's OpenMP, OpenBLAS), and with several threads that would take the other
    library's cores.
    """
    for _ in range(warmup):
        ms.step()
        if ts is not None:
            ts.step()
    a: List[float] = []
    b: List[float] = []
    for r in range(reps):
        order = (ms, ts) if r % 2 == 0 else (ts, ms)
        for side in order:
            if side is None:
                continue
            if pause:
                time.sleep(pause)
            t0 = time.perf_counter()
            side.step()
            dt = time.perf_counter() - t0
            (a if side is ms else b).append(dt)
    res = {"mt_s": statistics.median(a), "mt_all": a}
    if b:
        res["torch_s"] = statistics.median(b)
        res["torch_all"] = b
        res["ratio"] = res["torch_s"] / res["mt_s"]
        res["paired_ratio"] = statistics.median(tb / ta for ta, tb in zip(a, b))
    return res


# -------------------------------------------------------------------------------- profile
class _Timers:
    def __init__(self) -> None:
        self.total: Dict[str, float] = {}
        self.depth = 0

    def wrap(self, key: str, f: Callable) -> Callable:
        def timed(*args: Any, **kw: Any) -> Any:
            if self.depth:  # nested in a timed call: counted there
                return f(*args, **kw)
            self.depth += 1
            t0 = time.thread_time()
            try:
                return f(*args, **kw)
            finally:
                self.total[key] = self.total.get(key, 0.0) + time.thread_time() - t0
                self.depth -= 1

        return timed


def _profile_targets() -> list:
    """(owner, attribute, key, kind) for every kernel the profile times."""
    from mpitensor._ops import elementwise as _elementwise
    from mpitensor._ops import operators as _operators
    from mpitensor.nn import _kernels as K

    fn = MF
    t = [
        (fn._Conv2d, "forward", "conv2d forward", "static"),
        (K, "conv2d_input_grad", "conv2d backward: input grad", "func"),
        (K, "conv2d_weight_grad", "conv2d backward: weight grad", "func"),
        (fn._BatchNorm, "forward", "batch_norm forward", "static"),
        (fn._BatchNorm, "backward", "batch_norm backward", "static"),
        (_elementwise.Relu, "forward", "relu forward", "static"),
        (_elementwise.Relu, "forward_", "relu forward", "static"),
        (_elementwise.Relu, "backward", "relu backward", "static"),
        (_operators.Add, "forward", "add (residual) forward", "class"),
        (_operators.Add, "backward", "add (residual) backward", "static"),
        (fn._AdaptiveAvgPool2d, "forward", "adaptive_avg_pool forward", "static"),
        (fn._AdaptiveAvgPool2d, "backward", "adaptive_avg_pool backward", "static"),
        (fn._Linear, "forward", "linear forward", "static"),
        (fn._Linear, "backward", "linear backward", "static"),
        (fn._CrossEntropy, "forward", "cross_entropy", "static"),
        (fn._CrossEntropy, "backward", "cross_entropy", "static"),
    ]
    return [x for x in t if x[1] in vars(x[0]) or (x[3] == "class" and hasattr(x[0], x[1]))]


def profile_mt(ms: Side, steps: int) -> tuple:
    """Seconds per step spent in each kind of kernel (mpitensor), and the whole step's."""
    timers = _Timers()
    saved = []
    for owner, attr, key, kind in _profile_targets():
        orig_raw = owner.__dict__.get(attr, None)
        f = getattr(owner, attr)
        w = timers.wrap(key, f)
        saved.append((owner, attr, orig_raw))
        setattr(owner, attr, w if kind == "func" else staticmethod(w))
    try:
        ms.step()
        timers.total.clear()
        t0 = time.thread_time()
        for _ in range(steps):
            ms.step()
        whole = (time.thread_time() - t0) / steps
    finally:
        for owner, attr, orig_raw in saved:
            if orig_raw is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, orig_raw)
    return {k: v / steps for k, v in timers.total.items()}, whole


def profile_torch(ts: Side, steps: int, torch: Any) -> Dict[str, float]:
    """The same kinds for torch, from its profiler (self CPU time of the aten ops)."""
    from torch.profiler import ProfilerActivity, profile

    kinds = {
        "conv2d forward": ("aten::mkldnn_convolution", "aten::_convolution",
                           "aten::thnn_conv2d", "aten::_slow_conv2d_forward"),
        "conv2d backward (input + weight grad)": ("aten::convolution_backward",
                                                  "aten::mkldnn_convolution_backward"),
        "batch_norm forward": ("aten::native_batch_norm", "aten::_batch_norm_impl_index"),
        "batch_norm backward": ("aten::native_batch_norm_backward",),
        "relu forward": ("aten::relu_", "aten::relu", "aten::clamp_min_"),
        "relu backward": ("aten::threshold_backward",),
        "add (residual) forward": ("aten::add_",),
    }
    ts.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            ts.step()
    totals: Dict[str, float] = {}
    for ev in prof.key_averages():
        for kind, names in kinds.items():
            if ev.key in names:
                # cpu_time_total includes children (the convolution's own kernels)
                totals[kind] = max(totals.get(kind, 0.0), ev.cpu_time_total / 1e6 / steps)
    return totals


# -------------------------------------------------------------------------------- report
def _sps(batch: int, s: Optional[float]) -> str:
    return f"{batch / s:,.0f}" if s else "—"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=15, help="timed steps per library and thread count")
    p.add_argument("--threads", default="1,default",
                   help="comma-separated thread counts; 'default' = every usable core")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args()

    from _torch_baseline import torch_missing_reason

    reason = torch_missing_reason()
    torch = None
    if not reason:
        import torch  # noqa: F811
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    counts = [cores if t.strip() == "default" else int(t) for t in args.threads.split(",")]

    print(f"ResNet-18 (CIFAR-style) training step, batch {args.batch}, 32x32, float32; "
          f"{cores} usable cores; load average {os.getloadavg()[0]:.2f}")
    ms, ts = make_sides(args.batch, args.seed, torch)
    results: Dict[str, Any] = {"batch": args.batch, "cores": cores, "rows": []}
    if ts is not None:
        set_threads(1, torch)
        (l1m, l1t), (l2m, l2t) = check_losses(ms, ts)
        print(f"losses agree: step 1 mpitensor {l1m:.6f} torch {l1t:.6f}; "
              f"step 2 mpitensor {l2m:.6f} torch {l2t:.6f}")
        results["losses"] = [[l1m, l1t], [l2m, l2t]]
    else:
        print(f"torch rows skipped: {reason}")

    print("\n| threads | mpitensor samples/s | torch samples/s | ratio mpitensor/torch "
          "| paired ratio (median) | reps | load average before / after |")
    print("|---|---|---|---|---|---|---|")
    for n in counts:
        set_threads(n, torch)
        load0 = os.getloadavg()[0]
        r = time_pair(ms, ts, args.reps, pause=PAUSE_S if n > 1 else 0.0)
        row = {"threads": n, "mt_threads": mt.get_num_threads(),
               "torch_threads": torch.get_num_threads() if torch is not None else None,
               "load_before": load0, "load_after": os.getloadavg()[0],
               "mt_steps_s": r["mt_all"], "torch_steps_s": r.get("torch_all"),
               "mt_samples_s": args.batch / r["mt_s"],
               "torch_samples_s": args.batch / r["torch_s"] if "torch_s" in r else None,
               "ratio": r.get("ratio"), "paired_ratio": r.get("paired_ratio"),
               "mt_step_ms": r["mt_s"] * 1e3,
               "torch_step_ms": r["torch_s"] * 1e3 if "torch_s" in r else None}
        results["rows"].append(row)
        ratio = f"{row['ratio']:.2f}x" if row["ratio"] else "— (no torch)"
        paired = f"{row['paired_ratio']:.2f}x" if row["paired_ratio"] else "—"
        print(f"| {n} | {_sps(args.batch, r['mt_s'])} | {_sps(args.batch, r.get('torch_s'))} "
              f"| {ratio} | {paired} | {args.reps} | {load0:.2f} / {row['load_after']:.2f} |",
              flush=True)

    if not args.no_profile:
        set_threads(1, torch)
        prof, whole = profile_mt(ms, args.profile_steps)
        tprof = profile_torch(ts, args.profile_steps, torch) if ts is not None else {}
        print(f"\nmpitensor step profile, 1 thread ({args.profile_steps} steps, timers on; "
              f"step {whole * 1e3:.0f} ms):\n")
        print("| operation | mpitensor ms/step | share |")
        print("|---|---|---|")
        for k, v in sorted(prof.items(), key=lambda kv: -kv[1]):
            print(f"| {k} | {v * 1e3:.1f} | {v / whole:.0%} |")
        rest = whole - sum(prof.values())
        print(f"| everything else (autograd, optimizer, Python) | {rest * 1e3:.1f} | "
              f"{rest / whole:.0%} |")
        results["profile_ms"] = {k: v * 1e3 for k, v in prof.items()}
        results["profile_step_ms"] = whole * 1e3
        if tprof:
            print("\ntorch, same kinds (torch.profiler, cpu_time_total of the aten op):\n")
            print("| operation | torch ms/step |")
            print("|---|---|")
            for k, v in sorted(tprof.items(), key=lambda kv: -kv[1]):
                print(f"| {k} | {v * 1e3:.1f} |")
            results["torch_profile_ms"] = {k: v * 1e3 for k, v in tprof.items()}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
