"""Attention of ``torch.nn.functional``: ``scaled_dot_product_attention`` and
``multi_head_attention_forward`` (the computation behind ``nn.MultiheadAttention``).

Both are built from differentiable tensor ops (batched matrix products, a softmax, masks), so
autograd gives their gradients. The masks follow torch's two conventions, which differ:

- ``scaled_dot_product_attention``: a boolean ``attn_mask`` is True where a query MAY attend; a
  float mask is added to the scores. A query row that may attend to nothing gives zeros (and
  zero gradients), as torch's does.
- ``multi_head_attention_forward`` (``nn.MultiheadAttention``): a boolean ``attn_mask`` or
  ``key_padding_mask`` is True where a query may NOT attend; float masks are added.

Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> q = mt.ones(1, 2, 4)
    >>> scaled_dot_product_attention(q, q, mt.tensor([[[1.0], [3.0]]])).flatten()
    tensor([2., 2.])
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Any, FrozenSet, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._core import half as _half
from mpitensor._ops.combine import cat
from mpitensor._ops.random import _draw
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor, _new

from .checks import as_tensor, check_float, quiet, shape_str, xp_of

__all__ = ["scaled_dot_product_attention", "multi_head_attention_forward"]


class SDPBackend(IntEnum):
    """The kernels torch's scaled_dot_product_attention may choose from (mpitensor has the
    MATH one); see :mod:`mpitensor.nn.attention`."""

    ERROR = -1
    MATH = 0
    FLASH_ATTENTION = 1
    EFFICIENT_ATTENTION = 2
    CUDNN_ATTENTION = 3
    OVERRIDEABLE = 4


# the backends sdpa_kernel() allows (all, outside any sdpa_kernel block)
_ALLOWED = {"now": frozenset(SDPBackend)}


def _allowed_backends() -> FrozenSet[SDPBackend]:
    return _ALLOWED["now"]


def _set_allowed_backends(allowed: FrozenSet[SDPBackend]) -> None:
    _ALLOWED["now"] = allowed


@_half.computes_in_float32
class _SafeSoftmax(Function):
    """Softmax over the last axis; a row of only -inf gives zeros (not nan)."""

    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        xp = xp_of(x)
        m = x.max(axis=-1, keepdims=True)
        m = xp.where(xp.isfinite(m), m, xp.zeros((), x.dtype))
        e = xp.exp(x - m)
        s = e.sum(axis=-1, keepdims=True)
        with quiet(xp):
            y = xp.where(s > 0, e / s, xp.zeros((), x.dtype))
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (y,) = ctx.saved_tensors
        return (y * (g - (g * y).sum(axis=-1, keepdims=True)),)


def _dropout(t: Tensor, p: float) -> Tensor:
    """``t`` with elements zeroed with probability ``p`` and the rest scaled by 1 / (1 - p)."""
    if p <= 0.0:
        return t
    x = t._data
    if p >= 1.0:
        return t * 0.0
    dt = x.dtype if x.dtype in (_dt.float32, _dt.float64) else _dt.float32
    u = _draw("rand", tuple(x.shape), None, np.dtype(dt), _backend.device_of(x))
    keep = (u >= p).astype(x.dtype) * x.dtype.type(1.0 / (1.0 - p))
    return t * _new(keep)


def _float_mask(mask: Tensor, dtype: Any, allowed_when_true: bool) -> Tensor:
    """A boolean mask as an additive float mask (0 where attention is allowed, -inf where
    not); a float mask as it is, in ``dtype``."""
    m = mask._data
    xp = xp_of(m)
    if m.dtype == np.bool_:
        blocked = ~m if allowed_when_true else m
        return _new(xp.where(blocked, xp.asarray(-xp.inf, dtype=dtype),
                             xp.zeros((), dtype=dtype)))
    if not _dt.is_floating_dtype(m.dtype):
        raise RuntimeError(f"attention masks must be bool or floating point, got {m.dtype}")
    return mask if m.dtype == dtype else mask.to(dtype)


@_autocast.op("scaled_dot_product_attention")
def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value`` over the last two dimensions.

    Args:
        query: (..., L, E).
        key: (..., S, E).
        value: (..., S, Ev).
        attn_mask: broadcastable to (..., L, S): boolean (True: may attend) or float (added).
        dropout_p: dropout on the attention weights (applied whenever > 0, as in torch).
        is_causal: let query i attend to keys 0..i only (no ``attn_mask`` then).
        scale: the score scale (default ``1 / sqrt(E)``).
        enable_gqa: grouped-query attention: ``key``/``value`` have fewer heads (dimension
            -3), each shared by a group of query heads.

    Returns:
        (..., L, Ev).

    Raises:
        RuntimeError: both ``attn_mask`` and ``is_causal``, mismatched sizes.

    Example:
        >>> import mpitensor as mt
        >>> scaled_dot_product_attention(mt.ones(2, 3, 4), mt.ones(2, 5, 4), mt.ones(2, 5, 6),
        ...                              is_causal=True).shape
        mpitensor.Size([2, 3, 6])
    """
    fname = "scaled_dot_product_attention"
    if SDPBackend.MATH not in _ALLOWED["now"]:
        raise RuntimeError(f"{fname}(): no available kernel: sdpa_kernel() allows only "
                           f"{sorted(b.name for b in _ALLOWED['now'])}, and mpitensor has only "
                           f"the MATH kernel; include SDPBackend.MATH")
    if hasattr(attn_mask, "_materialize"):  # a CausalBias of mpitensor.nn.attention.bias
        attn_mask = attn_mask._materialize(getattr(query, "device", None))
    q = as_tensor(query, "query", fname)
    k = as_tensor(key, "key", fname)
    v = as_tensor(value, "value", fname)
    check_float(q, "query", fname)
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise RuntimeError(f"{fname}(): query, key and value need at least 2 dimensions")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise RuntimeError(f"{fname}(): query {shape_str(q.shape)}, key {shape_str(k.shape)} "
                           f"and value {shape_str(v.shape)} do not fit: query and key need one "
                           f"embedding size, key and value one sequence length")
    if attn_mask is not None and is_causal:
        raise RuntimeError(f"{fname}(): pass either attn_mask or is_causal=True, not both")
    dtypes = {t._data.dtype for t in (q, k, v)}
    if len(dtypes) > 1:
        raise RuntimeError(f"{fname}(): query, key and value must have one dtype, got "
                           f"{sorted(str(d) for d in dtypes)}")
    if enable_gqa and k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        hq, hk = q.shape[-3], k.shape[-3]
        if hq % hk or v.shape[-3] != hk:
            raise RuntimeError(f"{fname}(): {hq} query heads cannot be grouped over {hk} key "
                               f"heads")
        rep = hq // hk

        def expand_heads(t: Tensor) -> Tensor:
            shape = tuple(t.shape)
            wide = t.unsqueeze(-3).expand(*shape[:-2], rep, *shape[-2:])
            return wide.reshape(shape[:-3] + (hq,) + shape[-2:])

        k, v = expand_heads(k), expand_heads(v)
    L, S = q.shape[-2], k.shape[-2]
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = q.matmul(k.transpose(-2, -1)) * s
    dt = q._data.dtype
    if is_causal:
        xp = xp_of(q)
        allowed = xp.tril(xp.ones((L, S), dtype=bool))
        scores = scores + _float_mask(_new(allowed), dt, True)
    elif attn_mask is not None:
        scores = scores + _float_mask(as_tensor(attn_mask, "attn_mask", fname), dt, True)
    weights = _dropout(_SafeSoftmax.apply(scores), float(dropout_p))
    return weights.matmul(v)


def _linear(x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    if _autocast.ON and _autocast.active():  # the bias is cast with them, as F.linear's
        return _autocast.run("linear", _linear, x, w, b)
    y = x.matmul(w.t())
    return y + b if b is not None else y



def _mha_inputs(query: Any, key: Any, value: Any, key_padding_mask: Any, attn_mask: Any,
                is_causal: bool, embed_dim_to_check: int, num_heads: int) -> tuple:
    """multi_head_attention_forward's inputs checked and made batched (L, N, E): query, key,
    value, the key padding mask and attention mask (None where not given), and whether the
    inputs came batched."""
    fname = "multi_head_attention_forward"
    q_in = as_tensor(query, "query", fname)
    k_in = as_tensor(key, "key", fname)
    v_in = as_tensor(value, "value", fname)
    batched = q_in.ndim == 3
    if q_in.ndim not in (2, 3) or k_in.ndim != q_in.ndim or v_in.ndim != q_in.ndim:
        raise RuntimeError(f"{fname}(): query, key and value must all be 3-D (batched) or all "
                           f"2-D (unbatched), got shapes {shape_str(q_in.shape)}, "
                           f"{shape_str(k_in.shape)} and {shape_str(v_in.shape)}")
    kpm = None if key_padding_mask is None else as_tensor(key_padding_mask, "key_padding_mask",
                                                          fname)
    am = None if attn_mask is None else as_tensor(attn_mask, "attn_mask", fname)
    if not batched:
        q_in, k_in, v_in = q_in.unsqueeze(1), k_in.unsqueeze(1), v_in.unsqueeze(1)
        if kpm is not None:
            if kpm.ndim != 1:
                raise RuntimeError(f"{fname}(): an unbatched key_padding_mask must be 1-D (S), "
                                   f"got shape {shape_str(kpm.shape)}")
            kpm = kpm.unsqueeze(0)
        if am is not None and am.ndim == 3:
            pass  # (num_heads, L, S) works as (N * num_heads, L, S) with N = 1
    if is_causal and am is None:
        raise RuntimeError(f"{fname}(): is_causal=True is only a hint here: pass the causal "
                           f"attn_mask too")
    L, N, E = q_in.shape
    assert E == embed_dim_to_check, (  # noqa: S101 - torch raises AssertionError here
        f"{fname}(): the query's embedding size {E} differs from embed_dim {embed_dim_to_check}")
    if E % num_heads:
        raise RuntimeError(f"{fname}(): embed_dim ({E}) must be divisible by num_heads "
                           f"({num_heads})")
    if k_in.shape[:2] != v_in.shape[:2] or k_in.shape[1] != N:
        raise RuntimeError(f"{fname}(): key {shape_str(k_in.shape)} and value "
                           f"{shape_str(v_in.shape)} must match each other in (S, N) and the "
                           f"query's batch {N}")
    return q_in, k_in, v_in, kpm, am, batched


def _mha_project(q_in: Tensor, k_in: Tensor, v_in: Tensor, in_proj_weight: Any,
                 in_proj_bias: Any, separate: Optional[tuple]) -> tuple:
    """The query, key and value projections: slices of one packed ``in_proj_weight``, or the
    ``separate`` (q, k, v) weights."""
    fname = "multi_head_attention_forward"
    E = q_in.shape[2]
    if separate is not None:
        wq, wk, wv = (as_tensor(w, n, fname) for w, n in zip(
            separate, ("q_proj_weight", "k_proj_weight", "v_proj_weight")))
    else:
        w = as_tensor(in_proj_weight, "in_proj_weight", fname)
        wq, wk, wv = w[:E], w[E:2 * E], w[2 * E:]
    if in_proj_bias is not None:
        b = as_tensor(in_proj_bias, "in_proj_bias", fname)
        bq, bk, bv = b[:E], b[E:2 * E], b[2 * E:]
    else:
        bq = bk = bv = None
    q = _linear(q_in, wq, bq)
    k = _linear(k_in, wk, bk)
    v = _linear(v_in, wv, bv)
    return q, k, v


def _mha_masks(am: Optional[Tensor], kpm: Optional[Tensor], dt: Any, L: int, S: int, N: int,
               num_heads: int) -> tuple:
    """The attention mask as (1 or N*heads, L, S) and the key padding mask as (N, S), both
    additive floats (-inf where a boolean mask said True)."""
    fname = "multi_head_attention_forward"
    if am is not None:
        am = _float_mask(am, dt, False)
        if am.ndim == 2:
            if tuple(am.shape) != (L, S):
                raise RuntimeError(f"{fname}(): a 2-D attn_mask must have shape ({L}, {S}), got "
                                   f"{shape_str(am.shape)}")
            am = am.unsqueeze(0)
        elif am.ndim != 3 or tuple(am.shape) != (N * num_heads, L, S):
            raise RuntimeError(f"{fname}(): attn_mask must have shape ({L}, {S}) or "
                               f"({N * num_heads}, {L}, {S}), got {shape_str(am.shape)}")
    if kpm is not None:
        kpm = _float_mask(kpm, dt, False)
        if tuple(kpm.shape) != (N, S):
            raise RuntimeError(f"{fname}(): key_padding_mask must have shape ({N}, {S}), got "
                               f"{shape_str(kpm.shape)}")
    return am, kpm


def _pad_last(m: Optional[Tensor]) -> Optional[Tensor]:
    """A mask with one more (unmasked) key position."""
    if m is None:
        return None
    return cat([m, m[..., :1] * 0.0], -1)


def _mha_heads(q: Tensor, k: Tensor, v: Tensor, am: Optional[Tensor], kpm: Optional[Tensor],
               num_heads: int, bias_k: Any, bias_v: Any, static_k: Any, static_v: Any,
               add_zero_attn: bool) -> tuple:
    """Keys and values split into heads (N*heads, S, head_dim), with the extra key/value
    positions of ``bias_k``/``bias_v`` and ``add_zero_attn`` (the masks grow with them) or the
    given ``static_k``/``static_v``; and the attention mask with the key padding mask folded in
    (None when neither is given)."""
    fname = "multi_head_attention_forward"
    N, E = q.shape[1], q.shape[2]
    hd = E // num_heads
    if bias_k is not None and bias_v is not None:
        if static_k is not None or static_v is not None:
            raise RuntimeError(f"{fname}(): bias_k/bias_v cannot be used with static_k/static_v")
        bk_t = as_tensor(bias_k, "bias_k", fname)
        bv_t = as_tensor(bias_v, "bias_v", fname)
        k = cat([k, bk_t.expand(1, N, E)], 0)
        v = cat([v, bv_t.expand(1, N, E)], 0)
        am, kpm = _pad_last(am), _pad_last(kpm)
    elif (bias_k is None) != (bias_v is None):
        raise RuntimeError(f"{fname}(): give both bias_k and bias_v, or neither")

    if static_k is None:
        k = k.reshape((k.shape[0], N * num_heads, hd)).transpose(0, 1)
    else:
        k = as_tensor(static_k, "static_k", fname)
    if static_v is None:
        v = v.reshape((v.shape[0], N * num_heads, hd)).transpose(0, 1)
    else:
        v = as_tensor(static_v, "static_v", fname)

    if add_zero_attn:
        k = cat([k, k[:, :1] * 0.0], 1)
        v = cat([v, v[:, :1] * 0.0], 1)
        am, kpm = _pad_last(am), _pad_last(kpm)
    S2 = k.shape[1]
    if kpm is not None:  # the key padding mask joins the attention mask, per head
        kp = kpm.reshape((N, 1, 1, S2)).expand(N, num_heads, 1, S2).reshape(
            (N * num_heads, 1, S2))
        am = kp if am is None else am + kp
    return k, v, am



def _attend(q: Tensor, k: Tensor, v: Tensor, am: Optional[Tensor], p: float,
            need_weights: bool) -> tuple:
    """Scaled dot-product attention over the heads, (N*heads, L, head_dim) each: the result
    and the attention weights (before dropout)."""
    scores = (q * math.sqrt(1.0 / q.shape[-1])).matmul(k.transpose(-2, -1))
    if am is not None:
        scores = scores + am
    # with no weights to return, a fully masked row gives zeros (_SafeSoftmax)
    weights = scores.softmax(-1) if need_weights else _SafeSoftmax.apply(scores)
    return _dropout(weights, p).matmul(v), weights


def multi_head_attention_forward(
    query: Any, key: Any, value: Any, embed_dim_to_check: int, num_heads: int,
    in_proj_weight: Any, in_proj_bias: Any, bias_k: Any, bias_v: Any, add_zero_attn: bool,
    dropout_p: float, out_proj_weight: Any, out_proj_bias: Any, training: bool = True,
    key_padding_mask: Any = None, need_weights: bool = True, attn_mask: Any = None,
    use_separate_proj_weight: bool = False, q_proj_weight: Any = None,
    k_proj_weight: Any = None, v_proj_weight: Any = None, static_k: Any = None,
    static_v: Any = None, average_attn_weights: bool = True, is_causal: bool = False,
) -> tuple:
    """Multi-head attention on sequence-first inputs, as ``nn.MultiheadAttention`` computes it.

    Args:
        query: (L, N, E), or (L, E) unbatched.
        key, value: (S, N, kdim) and (S, N, vdim) (unbatched: no N).
        embed_dim_to_check: E, checked against the query.
        num_heads: the number of heads (dividing E).
        in_proj_weight, in_proj_bias: the stacked (3E, E) projection and its (3E,) bias, or
            ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` with
            ``use_separate_proj_weight=True``.
        bias_k, bias_v: (1, 1, E) rows appended to the keys and values, or None.
        add_zero_attn: append a zero key and value.
        dropout_p: dropout on the attention weights (in training only).
        out_proj_weight, out_proj_bias: the output projection.
        key_padding_mask: (N, S) (unbatched: (S,)), True or -inf where a key is padding.
        need_weights: also return the attention weights.
        attn_mask: (L, S) or (N * num_heads, L, S), True or -inf where attention is not
            allowed (float masks are added).
        static_k, static_v: (N * num_heads, S, E / num_heads) keys and values to use as
            they are.
        average_attn_weights: average the returned weights over the heads.
        is_causal: a hint that ``attn_mask`` is the causal mask (which must be given).

    Returns:
        ``(output, weights)``: output (L, N, E) (unbatched (L, E)); weights (N, L, S) or
        (N, num_heads, L, S) (no N when unbatched), or None.

    Raises:
        RuntimeError: mismatched sizes or masks, ``is_causal`` without ``attn_mask``.
        AssertionError: ``embed_dim_to_check`` differs from the query's size, as in torch.

    Example:
        >>> import mpitensor as mt
        >>> x = mt.ones(3, 2, 4)
        >>> w = mt.ones(12, 4) * 0.1
        >>> out, attn = multi_head_attention_forward(x, x, x, 4, 2, w, None, None, None, False,
        ...                                          0.0, mt.ones(4, 4), None)
        >>> tuple(out.shape), tuple(attn.shape)
        ((3, 2, 4), (2, 3, 3))
    """
    fname = "multi_head_attention_forward"
    q_in, k_in, v_in, kpm, am, batched = _mha_inputs(query, key, value, key_padding_mask,
                                                     attn_mask, is_causal, embed_dim_to_check,
                                                     num_heads)
    L, N, E = q_in.shape
    hd = E // num_heads
    q, k, v = _mha_project(q_in, k_in, v_in, in_proj_weight, in_proj_bias,
                           (q_proj_weight, k_proj_weight, v_proj_weight)
                           if use_separate_proj_weight else None)
    am, kpm = _mha_masks(am, kpm, q_in._data.dtype, L, k_in.shape[0], N, num_heads)
    k, v, am = _mha_heads(q, k, v, am, kpm, num_heads, bias_k, bias_v, static_k, static_v,
                          add_zero_attn)
    q = q.reshape((L, N * num_heads, hd)).transpose(0, 1)
    attn, weights = _attend(q, k, v, am, float(dropout_p) if training else 0.0, need_weights)
    wo = as_tensor(out_proj_weight, "out_proj_weight", fname)
    bo = None if out_proj_bias is None else as_tensor(out_proj_bias, "out_proj_bias", fname)
    out = _linear(attn.transpose(0, 1).reshape((L * N, E)), wo, bo).reshape((L, N, E))
    if not batched:
        out = out.squeeze(1)
    if not need_weights:
        return out, None
    w4 = weights.reshape((N, num_heads, L, k.shape[1]))
    if average_attn_weights:
        w4 = w4.mean(1)
    if not batched:
        w4 = w4.squeeze(0)
    return out, w4
