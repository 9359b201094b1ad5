"""Helpers for the nn family tests: run one expression in mpitensor and in torch (the oracle)
on the same values, and compare the results and the gradients.

Tolerances come from the arithmetic: float64 to ~1e-12 relative, float32 to a few ulps times
the length of the longest reduction involved (``terms``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

import mpitensor as mt

EPS = {np.float32: float(np.finfo(np.float32).eps), np.float64: float(np.finfo(np.float64).eps)}


def tol(dtype: Any, terms: int = 1) -> float:
    """A relative tolerance for a result summing ``terms`` rounded values."""
    return 8 * EPS[np.dtype(dtype).type] * max(terms, 1) * (1 if dtype == np.float32 else 16)


def close(a: Any, b: Any, rtol: float, what: str = "") -> None:
    a = np.asarray(a.detach().numpy() if hasattr(a, "detach") else a, dtype=np.float64)
    b = np.asarray(b.detach().numpy() if hasattr(b, "detach") else b, dtype=np.float64)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    fin = np.isfinite(b)
    assert np.array_equal(fin, np.isfinite(a)), f"{what}: inf/nan at other places"
    assert np.array_equal(a[~fin], b[~fin], equal_nan=True), f"{what}: other infinities"
    a, b = a[fin], b[fin]
    scale = max(float(np.abs(b).max()) if b.size else 0.0, 1.0)
    err = float(np.abs(a - b).max()) if a.size else 0.0
    assert err <= rtol * scale, f"{what}: max error {err} > {rtol} * {scale}"


def both(fm: Callable, ft: Callable, arrays: Sequence[np.ndarray], dtype: Any,
         rtol: float, grad: bool = True, seed: int = 0) -> tuple:
    """Run ``fm`` on mpitensor tensors and ``ft`` on torch tensors made from ``arrays``
    (float ones require grad), backpropagate one random cotangent through the first output
    of each, and check values (and indices, when a tuple comes back) and input gradients."""
    import torch

    dt = np.dtype(dtype)
    ours, theirs = [], []
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind == "f":
            a = a.astype(dt)
        ours.append(mt.tensor(a.copy(), requires_grad=grad and a.dtype.kind == "f"))
        theirs.append(torch.tensor(a.copy(), requires_grad=grad and a.dtype.kind == "f"))
    ya, yb = fm(*ours), ft(*theirs)
    if isinstance(yb, tuple):
        for i, (p, q) in enumerate(zip(ya[1:], yb[1:]), 1):
            assert np.array_equal(p.numpy(), q.numpy()), f"output {i} differs"
        ya, yb = ya[0], yb[0]
    close(ya, yb, rtol, "value")
    assert ya.dtype == getattr(mt, str(yb.dtype).split(".")[-1])
    if grad:
        g = np.random.default_rng(seed).standard_normal(tuple(yb.shape)).astype(dt)
        ya.backward(mt.tensor(g))
        yb.backward(torch.tensor(g))
        for i, (p, q) in enumerate(zip(ours, theirs)):
            if q.grad is not None:
                close(p.grad, q.grad, rtol, f"grad {i}")
    return ya, yb
