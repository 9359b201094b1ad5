"""Gradient clipping: by the norm of all gradients together, or element by element."""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable, List, Optional, Union

from ...backend import array_module
from ...tensor import Tensor

__all__ = ["get_total_norm", "clip_grads_with_norm_", "clip_grad_norm_", "clip_grad_norm",
           "clip_grad_value_"]

Params = Union[Tensor, Iterable[Tensor]]


def _grads(parameters: Params) -> List[Tensor]:
    """The gradients that exist (parameters without one are left alone, as in torch)."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def _norm_type(norm_type: Any) -> float:
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        raise TypeError(f"norm_type must be a number or 'inf', got {norm_type!r}") from None
    if math.isnan(p):
        raise ValueError("norm_type must not be NaN")
    return p


def _vector_norm(a: Any, p: float) -> Any:
    """The p-norm of every element of ``a``, as a 0-d array of ``a``'s dtype."""
    xp = array_module(a)
    a = xp.abs(a.reshape(-1))
    if a.size == 0:
        return xp.zeros((), a.dtype)
    if p == math.inf:
        return a.max()
    if p == -math.inf:
        return a.min()
    if p == 0:
        return xp.asarray((a != 0).sum(), dtype=a.dtype)
    if p == 1:
        return a.sum()
    if p == 2:
        return xp.sqrt(xp.vdot(a, a).real.astype(a.dtype, copy=False))
    return (a ** p).sum() ** (1.0 / p)


def get_total_norm(tensors: Params, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach: Optional[bool] = None) -> Tensor:
    """Return the norm of the norms of ``tensors``: their joint p-norm, as one vector.

    Args:
        tensors: a tensor or an iterable of tensors (e.g. the gradients).
        norm_type: p of the p-norm; ``inf`` for the largest absolute value.
        error_if_nonfinite: raise if the total is NaN or infinite.
        foreach: accepted for torch's signature; the computation is the same.

    Returns:
        A 0-d tensor (0.0 when ``tensors`` is empty).

    Raises:
        RuntimeError: ``error_if_nonfinite`` and the total is NaN or infinite.
    """
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    arrays = [t._data for t in tensors]
    p = _norm_type(norm_type)
    if not arrays:
        return Tensor(array_module(None).zeros((), "float32"))
    xp = array_module(arrays[0])
    dtype = arrays[0].dtype
    each = xp.stack([_vector_norm(a, p).astype(dtype, copy=False) for a in arrays])
    total = _vector_norm(each, p)
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RuntimeError(
            f"the total norm of order {p:g} of the gradients is {float(total)}, so clipping "
            "cannot scale them; pass error_if_nonfinite=False to scale them anyway")
    return Tensor(xp.asarray(total, dtype=dtype))  # a NumPy scalar would become float32


def clip_grads_with_norm_(parameters: Params, max_norm: float, total_norm: Tensor,
                          foreach: Optional[bool] = None) -> None:
    """Scale the gradients of ``parameters`` by ``max_norm / (total_norm + 1e-6)`` when that is
    below 1 (a precomputed ``total_norm``, e.g. from :func:`get_total_norm`)."""
    grads = _grads(parameters)
    if not grads:
        return
    total = total_norm._data if isinstance(total_norm, Tensor) else total_norm
    xp = array_module(grads[0]._data)
    # the 1e-6 keeps a zero norm from dividing by zero; the factor never grows a gradient
    coef = xp.minimum(float(max_norm) / (xp.asarray(total, dtype="float64") + 1e-6), 1.0)
    for g in grads:
        g._data *= coef.astype(g._data.dtype)


def clip_grad_norm_(parameters: Params, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: Optional[bool] = None) -> Tensor:
    """Scale all gradients together so that their joint norm is at most ``max_norm``.

    Args:
        parameters: a tensor or an iterable of tensors whose ``.grad`` is clipped in place.
        max_norm: the largest joint norm allowed.
        norm_type: p of the p-norm (``inf`` for the largest absolute value).
        error_if_nonfinite: raise instead of scaling when the norm is NaN or infinite.
        foreach: accepted for torch's signature.

    Returns:
        The joint norm before clipping, a 0-d tensor.

    Raises:
        RuntimeError: ``error_if_nonfinite`` and the norm is NaN or infinite.

    Example:
        >>> import mpitensor as torch
        >>> w = torch.nn.Parameter(torch.ones(4))
        >>> (w * 3).sum().backward()
        >>> float(torch.nn.utils.clip_grad_norm_([w], 1.0))
        6.0
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    parameters = list(parameters)
    total = get_total_norm(_grads(parameters), norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total, foreach)
    return total


def clip_grad_norm(parameters: Params, max_norm: float, norm_type: float = 2.0,
                   error_if_nonfinite: bool = False, foreach: Any = None) -> Tensor:
    """The deprecated spelling of :func:`clip_grad_norm_` (it warns, then does the same)."""
    warnings.warn("nn.utils.clip_grad_norm is deprecated: call clip_grad_norm_, which it "
                  "calls (it clips in place either way)", FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters: Params, clip_value: float,
                     foreach: Optional[bool] = None) -> None:
    """Clamp every gradient element into ``[-clip_value, clip_value]``, in place."""
    c = float(clip_value)
    for g in _grads(parameters):
        xp = array_module(g._data)
        xp.clip(g._data, -c, c, out=g._data)
