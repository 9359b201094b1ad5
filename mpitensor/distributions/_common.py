"""Small pieces the families share: drawing arrays from the generators and converting
between probabilities and logits."""

from __future__ import annotations

import math
from typing import Any, Callable

from mpitensor import dtypes as _dt
from mpitensor._ops import random as _random
from mpitensor.tensor import Tensor, logaddexp, rand, randn, zeros_like

__all__: list = []

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def uniform(shape: tuple, like: Tensor) -> Tensor:
    """Uniform numbers in [0, 1) of ``like``'s dtype and device (default generator)."""
    return rand(*shape, dtype=like.dtype, device=like.device)


def uniform_open(shape: tuple, like: Tensor) -> Tensor:
    """Uniform numbers in (0, 1): [0, 1) moved off 0 by the dtype's tiny."""
    return uniform(shape, like).clamp(min=_dt.finfo(like.dtype).tiny)


def normal(shape: tuple, like: Tensor) -> Tensor:
    """Standard normal numbers of ``like``'s dtype and device."""
    return randn(*shape, dtype=like.dtype, device=like.device)


def drawn(like: Tensor, draw: Callable[[Any], Any]) -> Tensor:
    """``draw(rng)`` from the default generator (NumPy's or, on a GPU, CuPy's RandomState),
    as a tensor of ``like``'s dtype and device."""
    dev = like.device

    def run(rng: Any) -> Any:
        return draw(getattr(rng, "rs", rng))  # CuPy's RandomState behind the GPU wrapper

    arr = _random._drawn(None, dev, run)
    return Tensor._wrap(arr.astype(like.dtype, copy=False))


def standard_gamma(concentration: Tensor, shape: tuple) -> Tensor:
    """Gamma(concentration, 1) numbers of ``shape`` (``concentration`` broadcast to it), with
    no gradient."""
    c = concentration.detach().expand(*shape)._data
    out = drawn(concentration, lambda rng: rng.standard_gamma(c, size=tuple(shape)))
    return out.clamp(min=_dt.finfo(concentration.dtype).tiny)


def softplus(x: Tensor) -> Tensor:
    """``log(1 + exp(x))``, stable, with the exact gradient at 0."""
    return logaddexp(zeros_like(x), x)


def clamp_probs(probs: Tensor) -> Tensor:
    """Probabilities moved into [eps, 1 - eps], so that their logs are finite."""
    eps = _dt.finfo(probs.dtype).eps
    return probs.clamp(min=eps, max=1 - eps)


def probs_to_logits(probs: Tensor, is_binary: bool = False) -> Tensor:
    """Logits of probabilities: ``log p - log(1 - p)`` (binary) or ``log p`` (categorical)."""
    ps = clamp_probs(probs)
    if is_binary:
        return ps.log() - (-ps).log1p()
    return ps.log()


def logits_to_probs(logits: Tensor, is_binary: bool = False) -> Tensor:
    """Probabilities of logits: sigmoid (binary) or softmax over the last dimension."""
    if is_binary:
        return logits.sigmoid()
    return logits.softmax(-1)
