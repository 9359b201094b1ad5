"""Lookup ops of ``torch.nn.functional``: ``one_hot``, ``embedding``, ``embedding_bag``.

The gradient of a lookup is a scatter-add of the output gradient into the rows of the table
(``numpy.add.at``, ``cupyx.scatter_add`` on a GPU): vectorised, and exact for repeated
indices. As in torch, the ``padding_idx`` row gets no gradient, ``scale_grad_by_freq``
divides each row's gradient by how often the row was looked up, and ``max_norm`` renormalises
the looked-up rows of the table in place (counted by its version counter). ``sparse=True``
gives the table a sparse COO gradient, as in torch (``optim.SparseAdam`` and ``optim.SGD`` take
it).

Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> one_hot(mt.tensor([0, 2]), 3)
    tensor([[1, 0, 0],
            [0, 0, 1]])
"""

from __future__ import annotations

import numbers
from typing import Any, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._base import determinism as _determinism
from mpitensor._core import half as _half
from mpitensor._ops.sparse import SparseGrad
from mpitensor.autograd import ArrayFunction as Function, bump_version
from mpitensor.tensor import Tensor, _new

from .checks import arr, as_tensor, check_float, dtype_name, shape_str, xp_of

__all__ = ["one_hot", "embedding", "embedding_bag"]


def _scatter_rows(xp: Any, out: Any, rows: Any, values: Any) -> None:
    """``out[rows[i]] += values[i]`` for every i, repeated rows included (``out`` holds
    zeros). On the CPU: sort the rows, sum each run with one ``add.reduceat`` and write each
    distinct row once (about twice as fast as ``numpy.add.at``)."""
    if rows.size == 0 or _backend.is_meta_array(out):
        return  # meta: no values to add
    if xp is not np:
        if not _determinism.add_at(out, rows, values):  # atomics unless deterministic
            import cupyx  # noqa: PLC0415 - only on GPUs

            cupyx.scatter_add(out, rows, values)
        return
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    starts = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]])
    out[sorted_rows[starts]] += np.add.reduceat(values[order], starts, axis=0)


def one_hot(tensor: Any, num_classes: int = -1) -> Tensor:
    """One-hot encode int64 class indices: ``out[..., c] = 1`` where ``tensor[...] == c``.

    Args:
        tensor: an int64 tensor of class indices, any shape.
        num_classes: the number of classes; -1 takes ``tensor.max() + 1``.

    Returns:
        An int64 tensor of shape ``(*tensor.shape, num_classes)``.

    Raises:
        RuntimeError: a dtype other than int64, negative indices, indices ``>= num_classes``,
            or ``num_classes=-1`` with an empty tensor.

    Example:
        >>> import mpitensor as mt
        >>> one_hot(mt.tensor([1]))
        tensor([[0, 1]])
    """
    t = as_tensor(tensor, "tensor", "one_hot")
    x = t._data
    if x.dtype != np.int64:
        raise RuntimeError(f"one_hot(): the index tensor must be int64 (Long), got "
                           f"{dtype_name(x.dtype)}; convert it with .long()")
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral):
        raise TypeError(f"one_hot(): num_classes must be an int, got {num_classes!r}")
    xp = xp_of(x)
    if num_classes == -1:
        if x.size == 0:
            raise RuntimeError("one_hot(): cannot infer the number of classes from an empty "
                               "tensor; pass num_classes")
        num_classes = int(x.max()) + 1
    if x.size and not _backend.is_meta_array(x):  # meta: no values to check, as in torch
        if int(x.min()) < 0:
            raise RuntimeError("one_hot(): class values must be non-negative")
        if int(x.max()) >= num_classes:
            raise RuntimeError(f"one_hot(): class values must be smaller than num_classes "
                               f"({num_classes}), got {int(x.max())}")
    out = (x[..., None] == xp.arange(int(num_classes))).astype(np.int64)
    return _new(out)


def _check_indices(fname: str, idx: Any) -> None:
    if idx.dtype not in (np.int64, np.int32):
        raise RuntimeError(f"{fname}(): indices must be int64 (Long) or int32 (Int), got "
                           f"{dtype_name(idx.dtype)}")


def _padding_index(padding_idx: Optional[int], n: int, fname: str) -> Optional[int]:
    if padding_idx is None:
        return None
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, numbers.Integral):
        raise TypeError(f"{fname}(): padding_idx must be an int or None, got {padding_idx!r}")
    if not -n <= padding_idx < n:
        raise ValueError(f"{fname}(): padding_idx ({padding_idx}) must be within "
                         f"num_embeddings ({n})")
    return int(padding_idx) % n


def _renorm_(weight: Tensor, idx: Any, max_norm: float, norm_type: float) -> None:
    """Scale the rows of ``weight`` that ``idx`` looks up down to norm ``max_norm`` (in place,
    outside autograd, as torch's ``embedding_renorm_``)."""
    w = weight._data
    xp = xp_of(w)
    rows = xp.unique(idx.reshape(-1))
    sel = w[rows]
    a = abs(sel.astype(np.float64) if w.dtype != np.float64 else sel)
    if norm_type == np.inf:
        norms = a.max(axis=1)
    elif norm_type == 1:
        norms = a.sum(axis=1)
    else:
        norms = (a ** norm_type).sum(axis=1) ** (1.0 / norm_type)
    big = norms > max_norm
    if not bool(big.any()):
        return
    scale = (max_norm / (norms[big] + 1e-7)).astype(w.dtype)
    w[rows[big]] = sel[big] * scale[:, None]
    bump_version(weight)


class _Embedding(Function):
    @staticmethod
    def forward(ctx: Any, w: Any, idx: Any, padding_idx: Optional[int], by_freq: bool,
                sparse: bool = False) -> Any:
        ctx.save_for_backward(idx)
        ctx.meta = (w.shape, w.dtype, padding_idx, by_freq)
        ctx.sparse = sparse
        return w[idx]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (idx,) = ctx.saved_tensors
        wshape, wdt, padding_idx, by_freq = ctx.meta
        xp = xp_of(g)
        flat = idx.reshape(-1)
        rows = g.reshape(flat.size, wshape[1])  # -1 is ambiguous for an empty row
        if by_freq:
            counts = xp.bincount(flat, minlength=wshape[0])
            rows = rows / counts[flat][:, None].astype(rows.dtype)
        if ctx.sparse:  # torch's sparse gradient: one entry per lookup, padding ones left out
            keep = flat != padding_idx if padding_idx is not None else slice(None)
            return (SparseGrad(flat[keep][None, :], rows[keep].astype(wdt), wshape),
                    None, None, None, None)
        if padding_idx is not None:
            rows = rows * (flat != padding_idx)[:, None].astype(rows.dtype)
        gw = xp.zeros(wshape, dtype=wdt)
        _scatter_rows(xp, gw, flat, rows.astype(wdt, copy=False))
        return gw, None, None, None, None


def embedding(input: Any, weight: Any, padding_idx: Optional[int] = None,  # noqa: A002
              max_norm: Optional[float] = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    """Look up rows of ``weight`` (V, D) at the integer indices ``input`` (any shape).

    Args:
        input: int64 or int32 indices in ``[0, V)``.
        weight: the (V, D) table.
        padding_idx: a row (negative counts from the end) whose gradient stays 0.
        max_norm: renormalise, in place, each looked-up row whose ``norm_type``-norm is
            larger than this, to this norm.
        norm_type: the norm for ``max_norm``.
        scale_grad_by_freq: divide each row's gradient by its number of lookups in ``input``.
        sparse: give a leaf ``weight`` a sparse COO gradient (one entry per lookup), as
            torch does; a weight made by other ops gets a dense one.

    Returns:
        A tensor of shape ``(*input.shape, D)``.

    Raises:
        RuntimeError: non-integer indices, a weight that is not 2-D.
        IndexError: an index out of range. ValueError: ``padding_idx`` out of range.

    Example:
        >>> import mpitensor as mt
        >>> embedding(mt.tensor([2, 0]), mt.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]))
        tensor([[4., 5.],
                [0., 1.]])
    """
    idx_t = as_tensor(input, "input", "embedding")
    w = as_tensor(weight, "weight", "embedding")
    idx = idx_t._data
    _check_indices("embedding", idx)
    if w.ndim != 2:
        raise RuntimeError(f"embedding(): weight must be 2-D (num_embeddings, embedding_dim), "
                           f"got shape {shape_str(w.shape)}")
    n = w.shape[0]
    if idx.size and not _backend.is_meta_array(idx) and (int(idx.min()) < 0
                                                          or int(idx.max()) >= n):
        bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
        raise IndexError(f"embedding(): index {bad} is out of range for a table of {n} rows")
    pad = _padding_index(padding_idx, n, "embedding")
    sparse = bool(sparse) and w.grad_fn is None
    if sparse and scale_grad_by_freq and w.requires_grad:
        raise RuntimeError("embedding(): scale_grad_by_freq is not supported with sparse "
                           "gradients (as in torch); drop one of them")
    if max_norm is not None:
        _renorm_(w, idx, float(max_norm), float(norm_type))
    return _Embedding.apply(w, idx.astype(np.int64, copy=False), pad, bool(scale_grad_by_freq),
                            sparse)


# --------------------------------------------------------------------------------------------
# embedding_bag


@_half.computes_in_float32
class _EmbeddingBag(Function):
    @staticmethod
    def forward(ctx: Any, w: Any, psw: Any, flat: Any, bag: Any, keep: Any, nbags: int,
                mode: str, by_freq: bool, sparse: bool = False) -> Any:
        ctx.sparse = sparse
        xp = xp_of(w)
        d = w.shape[1]
        fi, fb = flat[keep], bag[keep]
        rows = w[fi]
        if psw is not None:
            rows = rows * psw[keep][:, None]
        counts = xp.bincount(fb, minlength=nbags)
        if mode == "max":
            out = xp.full((nbags, d), -xp.inf, dtype=w.dtype)
            if xp is np:
                np.maximum.at(out, fb, rows)
            else:
                import cupyx  # noqa: PLC0415 - only on GPUs

                cupyx.scatter_max(out, fb, rows)
            out[counts == 0] = 0
            # the first row of each bag holding the maximum takes the gradient, per column
            hit = (rows == out[fb]).astype(np.int64)
            run = xp.cumsum(hit, axis=0)
            start = xp.concatenate([xp.zeros(1, np.int64), xp.cumsum(counts)[:-1]])
            before = xp.concatenate([xp.zeros((1, d), np.int64), run])[start[fb]]
            first = (hit == 1) & (run - before == 1)
        else:
            out = xp.zeros((nbags, d), dtype=w.dtype)
            _scatter_rows(xp, out, fb, rows)
            if mode == "mean":
                out = out / xp.maximum(counts, 1)[:, None].astype(w.dtype)
            first = None
        ctx.save_for_backward(w, psw, first)
        ctx.meta = (fi, fb, keep, counts, mode, by_freq, flat.shape[0])
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        w, psw, first = ctx.saved_tensors
        fi, fb, keep, counts, mode, by_freq, nflat = ctx.meta
        xp = xp_of(g)
        need = ctx.needs_input_grad
        rows_g = g[fb]
        if mode == "mean":
            rows_g = rows_g / xp.maximum(counts, 1)[fb][:, None].astype(g.dtype)
        elif mode == "max":
            rows_g = rows_g * first
        gpsw = None
        if psw is not None and need[1]:
            gpsw = xp.zeros(nflat, dtype=psw.dtype)
            gpsw[keep] = (rows_g * w[fi]).sum(axis=1)
        gw = None
        if need[0]:
            r = rows_g * psw[keep][:, None] if psw is not None else rows_g
            if by_freq:
                cnt = xp.bincount(fi, minlength=w.shape[0])
                r = r / cnt[fi][:, None].astype(r.dtype)
            if ctx.sparse:  # torch's sparse gradient: one entry per looked-up index
                return (SparseGrad(fi[None, :], r.astype(w.dtype), w.shape), gpsw,
                        None, None, None, None, None, None, None)
            gw = xp.zeros(w.shape, dtype=w.dtype)
            _scatter_rows(xp, gw, fi, r.astype(w.dtype, copy=False))
        return gw, gpsw, None, None, None, None, None, None, None



def _bag_starts(idx: Any, offsets: Any, include_last_offset: bool, xp: Any) -> tuple:
    """embedding_bag's bags: the flat position where each starts, and how many there are (the
    rows of a 2-D input, or the checked ``offsets`` of a 1-D one)."""
    fname = "embedding_bag"
    if idx.ndim == 2:
        if offsets is not None:
            raise ValueError(f"{fname}(): offsets must be None for a 2-D input (each row is a "
                             f"bag)")
        nbags, per = idx.shape
        starts = xp.arange(0, nbags * per, per, dtype=np.int64)
        if include_last_offset:
            pass  # a 2-D input's bags are its rows, whatever this says (as in torch)
    elif idx.ndim == 1:
        if offsets is None:
            raise ValueError(f"{fname}(): a 1-D input needs offsets (the start of each bag)")
        off = arr(as_tensor(offsets, "offsets", fname))
        if off.ndim != 1:
            raise ValueError(f"{fname}(): offsets must be 1-D, got shape {shape_str(off.shape)}")
        off = off.astype(np.int64)
        if off.size and int(off[0]) != 0:
            raise ValueError(f"{fname}(): offsets must start at 0, got {int(off[0])}")
        if off.size and (bool((xp.diff(off) < 0).any()) or int(off[-1]) > idx.shape[0]):
            raise ValueError(f"{fname}(): offsets must be increasing and within the input")
        starts = off[:-1] if include_last_offset else off
        nbags = int(starts.shape[0])
    else:
        raise ValueError(f"{fname}(): input must be 1-D or 2-D, got shape {shape_str(idx.shape)}")
    return starts, nbags


def _sample_weights(per_sample_weights: Any, mode: str, idx: Any) -> Optional[Tensor]:
    """embedding_bag's checked ``per_sample_weights``, flattened (None when not given)."""
    fname = "embedding_bag"
    if per_sample_weights is None:
        return None
    if mode != "sum":
        raise ValueError(f"{fname}(): per_sample_weights is only supported with mode='sum', "
                         f"got mode={mode!r}")
    pst = as_tensor(per_sample_weights, "per_sample_weights", fname)
    if tuple(pst.shape) != tuple(idx.shape):
        raise ValueError(f"{fname}(): per_sample_weights must have the input's shape "
                         f"{shape_str(idx.shape)}, got {shape_str(pst.shape)}")
    return pst.reshape(-1)


def embedding_bag(input: Any, weight: Any, offsets: Any = None,  # noqa: A002
                  max_norm: Optional[float] = None, norm_type: float = 2,
                  scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                  per_sample_weights: Any = None, include_last_offset: bool = False,
                  padding_idx: Optional[int] = None) -> Tensor:
    """Sum, mean or max of bags of embedding rows, without building the lookups.

    Args:
        input: a 2-D (B, N) index tensor (each row a bag; ``offsets`` must be None), or a
            1-D index tensor cut into bags at ``offsets``.
        weight: the (V, D) table.
        offsets: for a 1-D input, the start of each bag (1-D, increasing, from 0); with
            ``include_last_offset`` the last entry is the end of the last bag.
        max_norm, norm_type, scale_grad_by_freq, sparse: as in :func:`embedding`.
        mode: ``'sum'``, ``'mean'`` or ``'max'``.
        per_sample_weights: weights of each index (input's shape), ``mode='sum'`` only.
        padding_idx: a row left out of the bags (and of the mean's count).

    Returns:
        A (B, D) tensor; an empty bag gives zeros.

    Raises:
        ValueError: bad mode, offsets or per_sample_weights.

    Example:
        >>> import mpitensor as mt
        >>> w = mt.tensor([[1.0], [2.0], [4.0]])
        >>> embedding_bag(mt.tensor([0, 1, 2]), w, mt.tensor([0, 2]), mode="sum")
        tensor([[3.],
                [4.]])
    """
    fname = "embedding_bag"
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"{fname}(): mode must be 'sum', 'mean' or 'max', got {mode!r}")
    idx = arr(as_tensor(input, "input", fname))
    w = as_tensor(weight, "weight", fname)
    _check_indices(fname, idx)
    check_float(w, "weight", fname)
    if w.ndim != 2:
        raise RuntimeError(f"{fname}(): weight must be 2-D, got shape {shape_str(w.shape)}")
    xp = xp_of(idx)
    starts, nbags = _bag_starts(idx, offsets, include_last_offset, xp)
    flat = idx.reshape(-1).astype(np.int64)
    n = w.shape[0]
    if flat.size and (int(flat.min()) < 0 or int(flat.max()) >= n):
        raise IndexError(f"{fname}(): an index is out of range for a table of {n} rows")
    if include_last_offset and idx.ndim == 1:
        end = int(arr(offsets)[-1])
        positions = xp.arange(flat.shape[0])
        inside = positions < end
    else:
        inside = xp.ones(flat.shape[0], bool)
    bag = xp.searchsorted(starts, xp.arange(flat.shape[0]), side="right") - 1
    pad = _padding_index(padding_idx, n, fname)
    keep = inside & (bag >= 0)
    if pad is not None:
        keep &= flat != pad
    psw = _sample_weights(per_sample_weights, mode, idx)
    if max_norm is not None:
        _renorm_(w, flat[keep], float(max_norm), float(norm_type))
    if not _dt.is_floating_dtype(arr(w).dtype):
        raise RuntimeError(f"{fname}(): weight must be floating point")
    sparse = bool(sparse) and w.grad_fn is None
    if sparse and mode == "max":
        raise ValueError(f"{fname}(): max mode does not support sparse gradients (as in "
                         f"torch); use mode='sum' or 'mean', or sparse=False")
    if sparse and scale_grad_by_freq and w.requires_grad:
        raise RuntimeError(f"{fname}(): scale_grad_by_freq is not supported with sparse "
                           f"gradients (as in torch); drop one of them")
    return _EmbeddingBag.apply(w, psw, flat, bag, keep, nbags, mode, bool(scale_grad_by_freq),
                               sparse)
