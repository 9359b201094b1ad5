"""LeNet training on one GPU: mpitensor (CuPy) against torch (CUDA), same weights, same batches.

Run (``benchmarks/gpu_suite.sh`` does)::

    python benchmarks/gpu_train_compare.py                    # batch 64 and 256 on the GPU
    python benchmarks/gpu_train_compare.py --device cpu --steps 5 --reps 1   # try it anywhere

The model is the LeNet-5 that ``examples/train.py`` trains (``mpitensor.models.LeNet``); torch's
copy starts from its initial weights (``benchmarks/train_throughput.py``'s ``torch_lenet``) and
both train with momentum SGD on the same MNIST-sized random batches. Two things are measured:

* agreement: the losses of the first ``--check-steps`` steps, with torch's TF32 switched off so
  both compute in float32; they must agree to rtol 1e-3 (float32 sums of up to 400 products per
  layer, five layers, compounded over a few steps: ~1e-4 expected, 1e-3 allowed);
* speed: samples/s of ``--steps`` steps after ``--warmup`` untimed ones, median of ``--reps``
  repetitions, the libraries alternating, the GPU synchronised before each clock reading; torch
  keeps its defaults there (TF32 allowed, as a user runs it).

Importing train_throughput sets one host thread per BLAS (its rule); the work here is on the GPU.
Prints a table, one ``KEY:`` line, writes ``--md``; exits 1 when the losses disagree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

HERE = Path(__file__).resolve().parent
for _p in (str(HERE.parent), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)  # run from a checkout without installing

import numpy as np  # noqa: E402
from train_throughput import LR, MOMENTUM, _Lib, make_batches, torch_lenet  # noqa: E402

LOSS_RTOL = 1e-3


class Trainer(_Lib):
    """One library's LeNet + SGD on a device; ``step(i)`` (train_throughput's) trains on batch i."""

    def __init__(self, lib: str, device: str, batches: List[Any]) -> None:
        import mpitensor as mt
        from mpitensor.models import LeNet

        mt.manual_seed(0)
        base = LeNet()
        self.name = lib
        if lib == "mpitensor":
            import mpitensor.nn.functional as F  # noqa: N812
            from mpitensor.optim import SGD

            self.model = base.to(device)
            self.data = [(mt.from_numpy(x).to(device), mt.from_numpy(y).to(device))
                         for x, y in batches]
            self.sync: Callable[[], Any] = _cupy_sync if device == "cuda" else _nothing
        else:
            import torch
            import torch.nn.functional as F  # noqa: N812
            from torch.optim import SGD

            self.model = torch_lenet(base).to(device)
            self.data = [(torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
                         for x, y in batches]
            self.sync = torch.cuda.synchronize if device == "cuda" else _nothing
        self.F = F
        self.opt = SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)

    def loss_at(self, i: int) -> float:
        """The loss on batch i with the weights as they are (the graph is dropped)."""
        x, y = self.data[i % len(self.data)]
        return float(self.F.nll_loss(self.model(x), y).item())

    def rate(self, steps: int, start: int, batch: int) -> float:
        """Samples/s over ``steps`` steps (the device drained before both clock readings)."""
        self.sync()
        t0 = time.perf_counter()
        for i in range(start, start + steps):
            self.step(i)
        self.sync()
        return steps * batch / (time.perf_counter() - t0)


def _nothing() -> None:
    return None


def _cupy_sync() -> None:
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def torch_reason(device: str) -> str:
    """'' when torch can train on ``device`` here, else why not."""
    try:
        import torch
    except Exception as exc:
        return f"torch is not importable ({type(exc).__name__}: {exc})"
    if device == "cuda" and not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return ""


def check_losses(device: str, steps: int, batch: int) -> float:
    """The largest relative difference of the first ``steps`` losses (torch in plain float32)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        batches = make_batches(batch, steps, seed=1)
        ours, theirs = Trainer("mpitensor", device, batches), Trainer("torch", device, batches)
        a, b = np.zeros(steps), np.zeros(steps)
        for i in range(steps):  # each loss before its step, as training reports it
            a[i], b[i] = ours.loss_at(i), theirs.loss_at(i)
            ours.step(i)
            theirs.step(i)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = True  # torch's defaults, for the timing
        torch.backends.cudnn.allow_tf32 = True
    return float(np.max(np.abs(a - b) / np.abs(b)))


def measure(device: str, batch: int, args: argparse.Namespace,
            names: List[str]) -> Dict[str, float]:
    """Median samples/s per library at ``batch``, the libraries alternating repetition by rep."""
    batches = make_batches(batch, 8, seed=2)
    libs = [Trainer(nm, device, batches) for nm in names]
    for lib in libs:
        lib.rate(args.warmup, 0, batch)
    rates: Dict[str, List[float]] = {nm: [] for nm in names}
    for r in range(args.reps):
        for lib in (libs if r % 2 == 0 else libs[::-1]):
            rates[lib.name].append(lib.rate(args.steps, args.warmup + r * args.steps, batch))
    return {nm: statistics.median(v) for nm, v in rates.items()}


def main(argv: Optional[List[str]] = None) -> int:
    """Check the losses, time both libraries, print the table and the ``KEY:`` line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--batches", default="64,256", help="per-step batch sizes (default 64,256)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per repetition")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median)")
    p.add_argument("--check-steps", type=int, default=5, help="steps whose losses are compared")
    p.add_argument("--md", default=None, help="write the table (markdown) here")
    args = p.parse_args(argv)
    sizes = [int(b) for b in args.batches.split(",") if b.strip()]
    if not sizes or min(sizes) < 1 or min(args.steps, args.reps, args.check_steps) < 1:
        p.error(f"batches, --steps, --reps and --check-steps must be positive, got "
                f"{args.batches!r}, {args.steps}, {args.reps}, {args.check_steps}")
    if args.device == "cuda":
        from mpitensor.backend import cupy_unavailable_reason

        reason = cupy_unavailable_reason()
        if reason:
            print(f"gpu_train_compare: --device cuda is unavailable: {reason}", file=sys.stderr)
            return 2
    reason = torch_reason(args.device)
    names = ["mpitensor"] + ([] if reason else ["torch"])
    if reason:
        print(f"# torch rows skipped: {reason}")
    err = check_losses(args.device, args.check_steps, sizes[0]) if not reason else None
    lines = ["| batch | " + " | ".join(f"{nm} samples/s" for nm in names)
             + (" | mpitensor / torch |" if len(names) > 1 else " |"),
             "|---" * (len(names) + 1 + (len(names) > 1)) + "|"]
    for batch in sizes:
        got = measure(args.device, batch, args, names)
        cells = [str(batch)] + [f"{got[nm]:,.0f}" for nm in names]
        if len(names) > 1:
            cells.append(f"{got['mpitensor'] / got['torch']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    md = "\n".join(lines)
    print(f"# LeNet + momentum SGD on {args.device}, {args.steps} steps x {args.reps} reps")
    print(md)
    if args.md:
        Path(args.md).write_text(md + "\n")
    agree = "" if err is None else f"; first {args.check_steps} losses agree to {err:.1e}"
    figs = ", ".join(f"{nm} {got[nm]:,.0f}" for nm in names)
    ratio = f" (ratio {got['mpitensor'] / got['torch']:.2f})" if len(names) > 1 else ""
    print(f"KEY: LeNet batch {sizes[-1]} samples/s: {figs}{ratio}{agree}", flush=True)
    if err is not None and not err <= LOSS_RTOL:
        print(f"gpu_train_compare: the losses differ by {err:.2e} (allowed {LOSS_RTOL})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
