"""Time each LeNet layer's forward and backward in mpitensor and in PyTorch, in the same run.

Both run single-threaded (OpenBLAS/OMP/MKL threads = 1 for NumPy, ``torch.set_num_threads(1)``)
unless ``--threads default`` leaves both libraries at their own default thread counts;
repetitions alternate between the two so that load from other processes hits both alike, and the
median of each is reported with the ratio mpitensor/torch (below 1.0 means mpitensor is faster).
The last rows time a whole LeNet training step (forward, backward, SGD update) and give
samples/s.

Usage:
    python benchmarks/profile_kernels.py [--batch 64] [--reps 40] [--dtype float32]
                                         [--threads 1|default]
"""

from __future__ import annotations

import os
import sys

# Read before NumPy is imported: the thread variables only count then.
_DEFAULT_THREADS = "--threads=default" in sys.argv or any(
    a == "--threads" and sys.argv[i + 1:i + 2] == ["default"] for i, a in enumerate(sys.argv))
if not _DEFAULT_THREADS:
    for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_v] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

import mpitensor as mt  # noqa: E402
import mpitensor.nn.functional as F  # noqa: E402


def _leaf(arr: np.ndarray) -> mt.Tensor:
    """A leaf that requires grad and keeps ``arr``'s memory layout (no copy)."""
    t = mt.Tensor(arr)
    t.requires_grad_(True)
    return t


def _median_ms(samples: list) -> float:
    return statistics.median(samples) * 1e3


def _bench_pair(f_mt: Callable, f_th: Callable, reps: int) -> tuple:
    """Median seconds of ``f_mt`` and ``f_th``, alternating calls."""
    for _ in range(3):
        f_mt()
        f_th()
    a, b = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        f_mt()
        t1 = time.perf_counter()
        f_th()
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    return _median_ms(a), _median_ms(b)


def _memory_order(a: np.ndarray) -> tuple:
    return tuple(sorted(range(a.ndim), key=lambda i: -abs(a.strides[i])))


def _inverse_order(a: np.ndarray) -> tuple:
    return tuple(int(i) for i in np.argsort(_memory_order(a)))


def _time_layer(fm: Callable, ft: Callable, am: Any, at: Any, dt: np.dtype, torch: Any,
                reps: int) -> tuple:
    """Forward and backward medians (ms) of one layer in both frameworks.

    Backward is timed as forward+backward minus forward (a graph is used once).
    """
    out = fm(am)._data
    shape = tuple(out.shape)
    # The output gradient comes in the output's own memory layout, as it does inside a network
    # (each op's backward produces its input's layout); torch's outputs are contiguous.
    g = np.empty_like(out.transpose(_memory_order(out))).transpose(_inverse_order(out))
    g[...] = 1
    gm = mt.Tensor(g)
    gt = torch.ones(shape, dtype=getattr(torch, dt.name))
    f_m, f_t = _bench_pair(lambda: fm(am), lambda: ft(at), reps)
    fb_m, fb_t = _bench_pair(lambda: fm(am).backward(gm), lambda: ft(at).backward(gt), reps)
    return f_m, f_t, max(fb_m - f_m, 0.0), max(fb_t - f_t, 0.0)


def _lenet_params(rng: np.random.Generator, dt: Any) -> dict:
    def u(shape: tuple, fan_in: int) -> np.ndarray:
        bound = 1 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, shape).astype(dt)

    return {
        "conv1.weight": u((6, 1, 5, 5), 25), "conv1.bias": u((6,), 25),
        "conv2.weight": u((16, 6, 5, 5), 150), "conv2.bias": u((16,), 150),
        "fc1.weight": u((120, 400), 400), "fc1.bias": u((120,), 400),
        "fc2.weight": u((84, 120), 120), "fc2.bias": u((84,), 120),
        "fc3.weight": u((10, 84), 84), "fc3.bias": u((10,), 84),
    }


def _lenet_mt(p: dict, x: Any) -> Any:
    x = F.max_pool2d(F.relu(F.conv2d(x, p["conv1.weight"], p["conv1.bias"], padding=2)), 2)
    x = F.max_pool2d(F.relu(F.conv2d(x, p["conv2.weight"], p["conv2.bias"])), 2)
    x = F.flatten(x, 1)
    x = F.relu(F.linear(x, p["fc1.weight"], p["fc1.bias"]))
    x = F.relu(F.linear(x, p["fc2.weight"], p["fc2.bias"]))
    return F.log_softmax(F.linear(x, p["fc3.weight"], p["fc3.bias"]), dim=1)


def main() -> None:
    """Run the per-layer and whole-step comparison and print a table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--threads", default="1", choices=["1", "default"],
                    help="1: both libraries on one thread; default: each at its own default")
    args = ap.parse_args()
    import torch  # noqa: PLC0415 - the baseline, imported after the thread settings
    import torch.nn.functional as TF  # noqa: PLC0415, N812

    if not _DEFAULT_THREADS:
        torch.set_num_threads(1)
    print(f"threads: mpitensor {mt.get_num_threads()}, torch {torch.get_num_threads()}")
    dt = np.dtype(args.dtype)
    rng = np.random.default_rng(0)
    N = args.batch
    P = _lenet_params(rng, dt)
    pm = {k: _leaf(v.copy()) for k, v in P.items()}
    pt = {k: torch.tensor(v, requires_grad=True) for k, v in P.items()}
    x0 = rng.standard_normal((N, 1, 28, 28)).astype(dt)
    y0 = rng.integers(0, 10, N)
    xm0, xt0 = mt.Tensor(x0), torch.tensor(x0)
    ym0, yt0 = mt.tensor(y0), torch.tensor(y0)

    # Layer inputs in the layouts each framework really produces them in.
    with mt.no_grad():
        c1 = F.conv2d(xm0, pm["conv1.weight"], pm["conv1.bias"], padding=2)._data
        r1 = np.maximum(c1, 0)
        p1 = F.max_pool2d(mt.Tensor(r1), 2)._data
        c2 = F.conv2d(mt.Tensor(p1), pm["conv2.weight"], pm["conv2.bias"])._data
        r2 = np.maximum(c2, 0)
        p2 = F.max_pool2d(mt.Tensor(r2), 2)._data
        f1 = np.ascontiguousarray(p2.reshape(N, -1))
        h1 = np.maximum(f1 @ P["fc1.weight"].T + P["fc1.bias"], 0)
        h2 = np.maximum(h1 @ P["fc2.weight"].T + P["fc2.bias"], 0)
        lg = h2 @ P["fc3.weight"].T + P["fc3.bias"]

    def tt(a: np.ndarray) -> Any:
        return torch.tensor(np.ascontiguousarray(a), requires_grad=True)

    layers = [
        ("conv1 1->6 k5 p2", lambda a: F.conv2d(a, pm["conv1.weight"], pm["conv1.bias"], padding=2),
         lambda a: TF.conv2d(a, pt["conv1.weight"], pt["conv1.bias"], padding=2), x0, False),
        ("relu1", F.relu, TF.relu, c1, True),
        ("maxpool1 2x2", lambda a: F.max_pool2d(a, 2), lambda a: TF.max_pool2d(a, 2), r1, True),
        ("conv2 6->16 k5", lambda a: F.conv2d(a, pm["conv2.weight"], pm["conv2.bias"]),
         lambda a: TF.conv2d(a, pt["conv2.weight"], pt["conv2.bias"]), p1, True),
        ("relu2", F.relu, TF.relu, c2, True),
        ("maxpool2 2x2", lambda a: F.max_pool2d(a, 2), lambda a: TF.max_pool2d(a, 2), r2, True),
        ("fc1 400->120", lambda a: F.linear(a, pm["fc1.weight"], pm["fc1.bias"]),
         lambda a: TF.linear(a, pt["fc1.weight"], pt["fc1.bias"]), f1, True),
        ("fc2 120->84", lambda a: F.linear(a, pm["fc2.weight"], pm["fc2.bias"]),
         lambda a: TF.linear(a, pt["fc2.weight"], pt["fc2.bias"]), h1, True),
        ("fc3 84->10", lambda a: F.linear(a, pm["fc3.weight"], pm["fc3.bias"]),
         lambda a: TF.linear(a, pt["fc3.weight"], pt["fc3.bias"]), h2, True),
        ("log_softmax+nll", lambda a: F.nll_loss(F.log_softmax(a, 1), ym0),
         lambda a: TF.nll_loss(TF.log_softmax(a, 1), yt0), lg, True),
        ("cross_entropy", lambda a: F.cross_entropy(a, ym0),
         lambda a: TF.cross_entropy(a, yt0), lg, True),
    ]
    print(f"batch {N}, {dt.name}, median of {args.reps}; ratio = mpitensor / torch (lower is "
          f"better)")
    print(f"{'layer':<18} {'fwd mt ms':>9} {'fwd th ms':>9} {'ratio':>6}   "
          f"{'bwd mt ms':>9} {'bwd th ms':>9} {'ratio':>6}")
    tot = [0.0, 0.0, 0.0, 0.0]
    for name, fm, ft, arr, need_x in layers:
        am = _leaf(arr) if need_x else mt.Tensor(arr)
        at = tt(arr) if need_x else torch.tensor(np.ascontiguousarray(arr))
        fmt_, ftt, bm, bt = _time_layer(fm, ft, am, at, dt, torch, args.reps)
        if name != "cross_entropy":
            tot = [tot[0] + fmt_, tot[1] + ftt, tot[2] + bm, tot[3] + bt]
        print(f"{name:<18} {fmt_:9.3f} {ftt:9.3f} {fmt_ / ftt:6.2f}   {bm:9.3f} {bt:9.3f} "
              f"{bm / max(bt, 1e-9):6.2f}")
    print(f"{'sum of layers':<18} {tot[0]:9.3f} {tot[1]:9.3f} {tot[0] / tot[1]:6.2f}   "
          f"{tot[2]:9.3f} {tot[3]:9.3f} {tot[2] / tot[3]:6.2f}")

    # Whole training step: forward, backward, plain SGD update (lr 0.01, momentum 0.9).
    lr, mom = 0.01, 0.9
    bufm = {k: np.zeros_like(v) for k, v in P.items()}
    optt = torch.optim.SGD(list(pt.values()), lr=lr, momentum=mom)

    def step_m() -> None:
        for t in pm.values():
            t.grad = None
        loss = F.nll_loss(_lenet_mt(pm, xm0), ym0)
        loss.backward()
        for k, t in pm.items():
            b = bufm[k]
            b *= mom
            b += t.grad._data
            t._data -= lr * b

    def step_t() -> None:
        optt.zero_grad()
        x = TF.max_pool2d(TF.relu(TF.conv2d(xt0, pt["conv1.weight"], pt["conv1.bias"],
                                            padding=2)), 2)
        x = TF.max_pool2d(TF.relu(TF.conv2d(x, pt["conv2.weight"], pt["conv2.bias"])), 2)
        x = torch.flatten(x, 1)
        x = TF.relu(TF.linear(x, pt["fc1.weight"], pt["fc1.bias"]))
        x = TF.relu(TF.linear(x, pt["fc2.weight"], pt["fc2.bias"]))
        out = TF.log_softmax(TF.linear(x, pt["fc3.weight"], pt["fc3.bias"]), dim=1)
        TF.nll_loss(out, yt0).backward()
        optt.step()

    sm, st = _bench_pair(step_m, step_t, args.reps)
    print(f"\nLeNet train step  mpitensor {sm:.3f} ms ({N / sm * 1e3:,.0f} samples/s)   torch "
          f"{st:.3f} ms ({N / st * 1e3:,.0f} samples/s)   speed ratio mpitensor/torch = "
          f"{st / sm:.2f}x")


if __name__ == "__main__":
    main()
