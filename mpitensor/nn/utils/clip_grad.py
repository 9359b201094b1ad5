"""Gradient clipping: by the norm of all gradients together, or element by element."""

from __future__ import annotations

import math
import sys
import warnings
from typing import Any, Iterable, List, Optional, Tuple, Union

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


def _term(a: Any, p: float) -> Any:
    """This array's term of a p-norm, before the root: the sum of ``|a|^p`` (the largest,
    smallest or non-zero count for ``inf``, ``-inf``, 0), a 0-d array; the terms of several
    pieces of one tensor combine by sum (max, min), so an empty piece gives the identity."""
    xp = array_module(a)
    a = xp.abs(a.reshape(-1))
    if p == math.inf:
        return a.max() if a.size else xp.zeros((), a.dtype)
    if p == -math.inf:
        return a.min() if a.size else xp.asarray(math.inf, a.dtype)
    if p == 0:
        return xp.asarray((a != 0).sum(), dtype=a.dtype)
    if p == 1:
        return a.sum() if a.size else xp.zeros((), a.dtype)
    if p == 2:
        return xp.asarray(xp.vdot(a, a).real, dtype=a.dtype)
    return (a ** p).sum() if a.size else xp.zeros((), a.dtype)


def _root(term: Any, p: float) -> Any:
    """The norm from its term (see :func:`_term`)."""
    if p in (math.inf, -math.inf, 0, 1):
        return term
    if p == 2:
        return array_module(term).sqrt(term)
    return term ** (1.0 / p)


def _sharded() -> Any:
    """The DTensor helpers, once DTensors can exist (their package imported), else None: a
    model without DTensors never loads them."""
    if "mpitensor.distributed.tensor" not in sys.modules:
        return None
    from ...distributed.tensor import _rules_norms

    return _rules_norms


def _norms(tensors: List[Tensor], p: float) -> Tuple[List[Any], Any]:
    """Each tensor's p-norm (the same on every rank: a DTensor's pieces combined over the
    mesh dims that shard it), and the first DTensor's mesh (None: none)."""
    support = _sharded()
    if support is None:
        return [_root(_term(t._data, p), p) for t in tensors], None
    arrays, where, mesh = support.norm_pieces(tensors)
    terms = [_term(a, p) for a in arrays]
    if mesh is not None:
        op = "max" if p == math.inf else "min" if p == -math.inf else "sum"
        terms = support.combine_terms(terms, where, op)
    return [_root(t, p) for t in terms], mesh


def get_total_norm(tensors: Params, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach: Optional[bool] = None) -> Tensor:
    """Return the norm of the norms of ``tensors``: their joint p-norm, as one vector.

    DTensors (the gradients of ``fully_shard`` or ``parallelize_module`` parameters) count
    as the whole tensors they stand for: each rank's pieces are combined over the mesh (one
    all_reduce per mesh dimension and kind of placement; a ``Partial`` reduced first; a
    ``Replicate`` counted once), and plain tensors beside them count once, as on one rank.
    Every rank must call it with the same tensors.

    Args:
        tensors: a tensor or an iterable of tensors (e.g. the gradients).
        norm_type: p of the p-norm; ``inf`` for the largest absolute value.
        error_if_nonfinite: raise if the total is NaN or infinite (on every rank alike).
        foreach: accepted for torch's signature; the computation is the same.

    Returns:
        A 0-d tensor (0.0 when ``tensors`` is empty); a 0-d DTensor replicated over the
        first DTensor's mesh when there are DTensors.

    Raises:
        RuntimeError: ``error_if_nonfinite`` and the total is NaN or infinite.
    """
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    p = _norm_type(norm_type)
    if not tensors:
        return Tensor(array_module(None).zeros((), "float32"))
    norms, mesh = _norms(tensors, p)
    xp = array_module(norms[0])
    dtype = norms[0].dtype
    total = _root(_term(xp.stack([xp.asarray(n, dtype=dtype) for n in norms]), p), p)
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RuntimeError(
            f"the total norm of order {p:g} of the gradients is {float(total)}, so clipping "
            "cannot scale them; pass error_if_nonfinite=False to scale them anyway")
    out = Tensor(xp.asarray(total, dtype=dtype))  # a NumPy scalar would become float32
    return out if mesh is None else _sharded().replicated(out, mesh)


def _grad_arrays(parameters: Params) -> List[Tuple[Any, float]]:
    """Per parameter with a gradient: the array that holds it on this rank, and the factor
    its values carry there (1 but for a ``Partial("avg")`` DTensor)."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    support = _sharded()
    if support is None:
        return [(g._data, 1.0) for g in _grads(params)]
    return support.local_grads(params)


def clip_grads_with_norm_(parameters: Params, max_norm: float, total_norm: Tensor,
                          foreach: Optional[bool] = None) -> None:
    """Scale the gradients of ``parameters`` by ``max_norm / (total_norm + 1e-6)`` when that is
    below 1 (a precomputed ``total_norm``, e.g. from :func:`get_total_norm`; a DTensor
    total is read whole). DTensor gradients are scaled piece by piece, without traffic."""
    grads = _grad_arrays(parameters)
    if not grads:
        return
    total = total_norm
    if isinstance(total, Tensor) and hasattr(total, "full_tensor"):
        total = total.full_tensor()
    total = total._data if isinstance(total, Tensor) else total
    xp = array_module(grads[0][0])
    # the 1e-6 keeps a zero norm from dividing by zero; the factor never grows a gradient
    coef = xp.minimum(float(max_norm) / (xp.asarray(total, dtype="float64") + 1e-6), 1.0)
    for g, _ in grads:
        g *= coef.astype(g.dtype)


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
        The joint norm before clipping, a 0-d tensor (a replicated DTensor where the
        gradients are DTensors, see :func:`get_total_norm`).

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
    for g, factor in _grad_arrays(parameters):
        array_module(g).clip(g, -c / factor, c / factor, out=g)
