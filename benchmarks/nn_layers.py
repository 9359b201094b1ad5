"""Time the normalisation and adaptive-pooling layers, forward and backward, against PyTorch.

Each row runs one layer's forward and backward (a fresh graph every time) in mpitensor and in
PyTorch at the same thread count (``--threads``, default 1: OpenBLAS/OMP/MKL for NumPy,
``torch.set_num_threads`` for torch). Repetitions alternate between the two so that load from
other processes hits both alike; the median of each is reported with the ratio
mpitensor / torch (below 1.0 means mpitensor is faster). Sizes are those of a ResNet-18-style
network on 32x32 images at batch 32: its first stage's 64 channels at 32x32, and the last
stage's 512 channels at 4x4 before the global pool. The inputs of the layers that follow a
convolution are given to mpitensor in the layout its conv2d really produces (batch innermost in
memory) and to torch as its conv2d produces them (contiguous NCHW).

The last row times a 3x3 64->64 convolution at the same size, forward and backward: the work a
batch-norm layer sits next to in a ResNet block.

Without torch the torch columns are skipped with a note.

Usage:
    python benchmarks/nn_layers.py [--batch 32] [--reps 20] [--threads 1] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import sys


def _pin_threads(n: int) -> None:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    return ap.parse_args()


ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None:
    _pin_threads(ARGS.threads)  # before NumPy loads its BLAS

import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

import numpy as np  # noqa: E402

import mpitensor as mt  # noqa: E402
import mpitensor.nn as nn  # noqa: E402
import mpitensor.nn.functional as F  # noqa: E402, N812


def _torch_or_reason() -> tuple:
    """(torch, '') when it imports, else (None, why not)."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install
        return None, f"torch is not importable ({type(exc).__name__}: {exc})"
    return torch, ""


def _batch_inner(a: np.ndarray) -> np.ndarray:
    """``a`` (N, C, H, W) laid out (C, H, W, N) in memory: conv2d's output layout."""
    return np.ascontiguousarray(a.transpose(1, 2, 3, 0)).transpose(3, 0, 1, 2)


def _leaf(a: np.ndarray) -> mt.Tensor:
    t = mt.Tensor(a)  # keeps a's memory layout
    t.requires_grad_(True)
    return t


class _Sink(mt.autograd.ArrayFunction):
    """Identity whose backward drops the gradient: the layer's input gradient is computed
    (the input requires grad) but not accumulated into a leaf, as inside a network (an
    mpitensor leaf copies a gradient it receives; a torch leaf adopts it)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        return x

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return (None,)


def _torch_sink(torch: Any) -> Any:
    class Sink(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:
            return None

    return Sink


def _fwd_bwd(layer: Callable, sink: Any, x: Any, g: Any) -> Callable[[], None]:
    def run() -> None:
        layer(sink.apply(x)).backward(g)
    return run


def _like(out: np.ndarray, value: float) -> np.ndarray:
    """An array of ``value`` shaped and laid out in memory like ``out`` (a gradient arrives in
    its output's layout inside a network)."""
    order = sorted(range(out.ndim), key=lambda a: -abs(out.strides[a]))
    buf = np.full(tuple(out.shape[a] for a in order), value, out.dtype)
    return buf.transpose(np.argsort(order))


def _median_ms(samples: list) -> float:
    return statistics.median(samples) * 1e3


def _bench(fns: list, reps: int) -> list:
    """Median ms of each callable, calls alternating between them (None: skipped)."""
    live = [f for f in fns if f is not None]
    for _ in range(3):
        for f in live:
            f()
    times: list = [[] for _ in fns]
    for _ in range(reps):
        for i, f in enumerate(fns):
            if f is None:
                continue
            t0 = time.perf_counter()
            f()
            times[i].append(time.perf_counter() - t0)
    return [_median_ms(t) if t else None for t in times]


def _cases(N: int, dt: np.dtype, rng: np.random.Generator, torch: Optional[Any]) -> list:
    """(name, mpitensor callable, torch callable or None) per row."""
    cases = []
    conv_out = rng.standard_normal((N, 64, 32, 32)).astype(dt)
    top = rng.standard_normal((N, 512, 4, 4)).astype(dt)
    tokens = rng.standard_normal((N, 256, 64)).astype(dt)
    tdt = getattr(torch, dt.name) if torch is not None else None

    def row(name: str, mt_layer: Callable, th_layer: Optional[Callable], x: np.ndarray,
            batch_inner: bool) -> None:
        xm = _leaf(_batch_inner(x) if batch_inner else x.copy())
        out = mt_layer(xm)
        gm = mt.Tensor(_like(out._data, 1.0))
        fm = _fwd_bwd(mt_layer, _Sink, xm, gm)
        ft = None
        if torch is not None and th_layer is not None:
            xt = torch.tensor(x, requires_grad=True)
            gt = torch.ones(tuple(out.shape), dtype=tdt)
            ft = _fwd_bwd(th_layer, _torch_sink(torch), xt, gt)
        cases.append((name, fm, ft))

    def both(mt_mod: Any, th_factory: Callable) -> tuple:
        th_mod = th_factory().to(tdt) if torch is not None else None
        return mt_mod.to(dt), th_mod

    bn, tbn = both(nn.BatchNorm2d(64), lambda: torch.nn.BatchNorm2d(64))
    row(f"BatchNorm2d(64) train {N}x64x32x32", bn, tbn, conv_out, True)
    row("  same, NCHW-contiguous input", bn, tbn, conv_out, False)
    bne, tbne = both(nn.BatchNorm2d(64).eval(), lambda: torch.nn.BatchNorm2d(64).eval())
    row(f"BatchNorm2d(64) eval  {N}x64x32x32", bne, tbne, conv_out, True)
    bn5, tbn5 = both(nn.BatchNorm2d(512), lambda: torch.nn.BatchNorm2d(512))
    row(f"BatchNorm2d(512) train {N}x512x4x4", bn5, tbn5, top, True)
    gn, tgn = both(nn.GroupNorm(8, 64), lambda: torch.nn.GroupNorm(8, 64))
    row(f"GroupNorm(8, 64)      {N}x64x32x32", gn, tgn, conv_out, True)
    ln, tln = both(nn.LayerNorm(64), lambda: torch.nn.LayerNorm(64))
    row(f"LayerNorm(64)         {N}x256x64", ln, tln, tokens, False)
    ln2, tln2 = both(nn.LayerNorm([64, 32, 32]), lambda: torch.nn.LayerNorm([64, 32, 32]))
    row(f"LayerNorm([64,32,32]) {N}x64x32x32", ln2, tln2, conv_out, False)
    tpool = (lambda s: (lambda a: torch.nn.functional.adaptive_avg_pool2d(a, s))) \
        if torch is not None else (lambda s: None)
    row(f"AdaptiveAvgPool2d(1)  {N}x512x4x4", lambda a: F.adaptive_avg_pool2d(a, 1),
        tpool(1), top, True)
    row(f"AdaptiveAvgPool2d(1)  {N}x64x32x32", lambda a: F.adaptive_avg_pool2d(a, 1),
        tpool(1), conv_out, True)
    row(f"AdaptiveAvgPool2d(7)  {N}x64x32x32", lambda a: F.adaptive_avg_pool2d(a, 7),
        tpool(7), conv_out, True)
    w = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(dt)
    wm = _leaf(w.copy())
    wt = torch.tensor(w, requires_grad=True) if torch is not None else None
    row(f"(context) conv 3x3 64->64 {N}x64x32x32", lambda a: F.conv2d(a, wm, padding=1),
        (lambda a: torch.nn.functional.conv2d(a, wt, padding=1)) if torch is not None
        else None, conv_out, True)
    return cases


def main() -> None:
    """Run every row and print the table."""
    args = ARGS if ARGS is not None else _args()
    torch, reason = _torch_or_reason()
    if torch is not None:
        torch.set_num_threads(args.threads)
    mt.set_num_threads(args.threads)
    dt = np.dtype(args.dtype)
    rng = np.random.default_rng(0)
    print(f"forward+backward, {dt.name}, {args.threads} thread(s), median of {args.reps}; "
          f"ratio = mpitensor / torch time (below 1 is faster)")
    if torch is None:
        print(f"note: torch rows skipped: {reason}")
    print(f"{'layer':<40} {'mpitensor ms':>12} {'torch ms':>9} {'ratio':>6}")
    for name, fm, ft in _cases(args.batch, dt, rng, torch):
        tm_, tt_ = _bench([fm, ft], args.reps)
        if tt_ is None:
            print(f"{name:<40} {tm_:12.3f} {'-':>9} {'-':>6}")
        else:
            print(f"{name:<40} {tm_:12.3f} {tt_:9.3f} {tm_ / tt_:6.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
