"""Time ``optimizer.step()`` of every mpitensor optimiser against torch.optim, in the same run.

The parameters are those of a 784-1000-200-10 MLP (987,210 values in six tensors), each with a
fixed gradient; both libraries update their own copies. Both run single-threaded
(OpenBLAS/OMP/MKL threads = 1 for NumPy, ``torch.set_num_threads(1)``; torch on CPU uses its
per-tensor loop, as it does by default there). For every configuration the two libraries
alternate repetitions, so load from elsewhere hits both alike; the median of each is reported
with the ratio mpitensor / torch (below 1.0: mpitensor is faster). Without torch the torch
columns are skipped with a note.

Usage:
    python benchmarks/optim_step.py [--reps 25] [--dtype float32] [--only Adam,RMSprop]
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, List, Optional, Tuple  # noqa: E402

import numpy as np  # noqa: E402

import mpitensor as mt  # noqa: E402
from mpitensor import optim  # noqa: E402
from mpitensor.nn import Parameter  # noqa: E402

SHAPES = [(1000, 784), (1000,), (200, 1000), (200,), (10, 200), (10,)]

CONFIGS: List[Tuple[str, str, dict]] = [
    ("SGD momentum", "SGD", dict(lr=1e-3, momentum=0.9)),
    ("Adam", "Adam", dict(lr=1e-3)),
    ("Adam wd amsgrad", "Adam", dict(lr=1e-3, weight_decay=1e-4, amsgrad=True)),
    ("AdamW", "AdamW", dict(lr=1e-3)),
    ("Adadelta", "Adadelta", dict()),
    ("Adagrad", "Adagrad", dict(lr=1e-2)),
    ("RMSprop", "RMSprop", dict(lr=1e-3)),
    ("RMSprop ctr mom", "RMSprop", dict(lr=1e-3, centered=True, momentum=0.9)),
    ("Adamax", "Adamax", dict()),
    ("NAdam", "NAdam", dict()),
    ("NAdam decoupled", "NAdam", dict(weight_decay=1e-2, decoupled_weight_decay=True)),
    ("RAdam", "RAdam", dict()),
    ("ASGD", "ASGD", dict(t0=1.0)),
    ("Rprop", "Rprop", dict()),
    ("SparseAdam", "SparseAdam", dict()),
    ("Adafactor", "Adafactor", dict()),
    ("LBFGS 5 it", "LBFGS", dict(max_iter=5, history_size=10)),
    ("Muon (matrices)", "Muon", dict()),
]


def _torch_or_reason() -> Tuple[Optional[Any], str]:
    try:
        import torch  # noqa: PLC0415 - the baseline, imported after the thread settings
    except Exception as exc:  # ImportError, or a broken install
        return None, f"torch is not importable ({type(exc).__name__}: {exc})"
    torch.set_num_threads(1)
    return torch, ""


def _median_ms(samples: List[float]) -> float:
    return statistics.median(samples) * 1e3


def _time_pair(fm: Callable[[], Any], ft: Optional[Callable[[], Any]], reps: int,
               warmup: int = 3) -> Tuple[float, float]:
    """Median milliseconds of ``fm`` and ``ft`` (NaN without ``ft``), alternating calls."""
    for _ in range(warmup):
        fm()
        if ft is not None:
            ft()
    a: List[float] = []
    b: List[float] = []
    for r in range(reps):
        order = [(fm, a), (ft, b)] if r % 2 == 0 else [(ft, b), (fm, a)]
        for f, out in order:
            if f is None:
                continue
            t0 = time.perf_counter()
            f()
            out.append(time.perf_counter() - t0)
    return _median_ms(a), (_median_ms(b) if b else float("nan"))


def _stepper(opt: Any, params: List[Any]) -> Callable[[], Any]:
    """LBFGS's step with a closure: the loss 0.5 * |p|^2, its gradient p, set by hand (the same
    few array operations in both libraries, no autograd), so the optimiser's own work is timed.
    """
    def closure() -> float:
        total = 0.0
        for p in params:
            d = p.detach()
            p.grad = d.clone()
            total += 0.5 * float((d * d).sum())
        return total

    return lambda: opt.step(closure)


def main() -> None:
    """Time every configuration and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=25, help="timed steps per library and config")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--only", default="", help="comma-separated optimiser names to run")
    args = ap.parse_args()
    dt = np.dtype(args.dtype)
    torch, why = _torch_or_reason()
    rng = np.random.default_rng(0)
    values = [(rng.standard_normal(s) * 0.05).astype(dt) for s in SHAPES]
    grads = [(rng.standard_normal(s) * 1e-3).astype(dt) for s in SHAPES]
    n = sum(v.size for v in values)
    only = {x.strip() for x in args.only.split(",") if x.strip()}

    print(f"optimizer.step() on {n:,} {dt.name} parameters in {len(SHAPES)} tensors, one "
          f"thread, median of {args.reps}; ratio = mpitensor / torch (lower is faster)")
    if torch is None:
        print(f"note: {why}; the torch columns are skipped")
    else:
        print(f"torch {torch.__version__}, numpy {np.__version__}")
    print(f"{'optimiser':<17} {'mpitensor ms':>12} {'torch ms':>9} {'ratio':>6}")
    ratios = []
    for label, name, kw in CONFIGS:
        if only and name not in only:
            continue
        # Muon takes only the weight matrices (the biases go to another optimiser)
        keep = [i for i, v in enumerate(values) if name != "Muon" or v.ndim == 2]
        mine = [Parameter(mt.tensor(values[i].copy())) for i in keep]
        for p, i in zip(mine, keep):
            p.grad = mt.tensor(grads[i].copy())
        opt = getattr(optim, name)(mine, **kw)
        fm = _stepper(opt, mine) if name == "LBFGS" else opt.step
        ft = None
        if torch is not None:
            ref = [torch.nn.Parameter(torch.from_numpy(values[i].copy())) for i in keep]
            for r, i in zip(ref, keep):
                # torch's SparseAdam takes sparse gradients only: the same (dense) values
                r.grad = torch.from_numpy(grads[i].copy())
                if name == "SparseAdam":
                    r.grad = r.grad.to_sparse()
            topt = getattr(torch.optim, name)(ref, **kw)
            ft = _stepper(topt, ref) if name == "LBFGS" else topt.step
        m, t = _time_pair(fm, ft, args.reps)
        if torch is None:
            print(f"{label:<17} {m:12.3f} {'-':>9} {'-':>6}")
            continue
        ratios.append(m / t)
        print(f"{label:<17} {m:12.3f} {t:9.3f} {m / t:6.2f}")
    if ratios:
        geo = float(np.exp(np.mean(np.log(ratios))))
        print(f"{'geometric mean':<17} {'':>12} {'':>9} {geo:6.2f}")


if __name__ == "__main__":
    main()
