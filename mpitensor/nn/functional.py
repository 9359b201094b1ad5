"""``mpitensor.nn.functional``: differentiable neural-network operations with torch's signatures.

Each operation is an autograd :class:`~mpitensor.autograd.Function` whose forward and backward
sit side by side and work on raw NumPy/CuPy arrays (kernels in ``mpitensor.nn._kernels``).
Inputs may be Tensors or raw arrays; results are Tensors.

Layout note: like torch's ``channels_last`` tensors, the outputs of :func:`conv2d` (and of
:func:`relu` applied to them) have the NCHW shape but a (C, H, W, N) memory layout, which is what
makes the convolution a single matrix product with no transposing copies. Values, indexing,
``reshape``, ``flatten`` and every op behave exactly as for a contiguous NCHW tensor; only
``Tensor.view`` to a shape that merges non-adjacent memory refuses (as torch's does on a
channels-last tensor): use ``reshape``/``flatten`` (or ``.contiguous()`` first).
:func:`max_pool2d` and :func:`avg_pool2d` return C-contiguous NCHW tensors, so the classic
``x.view(-1, 16 * 5 * 5)`` after the last pooling works.

Example:
    >>> import numpy as np
    >>> import mpitensor as mt
    >>> import mpitensor.nn.functional as F
    >>> x = mt.tensor(np.ones((2, 1, 6, 6), np.float32), requires_grad=True)
    >>> w = mt.tensor(np.ones((3, 1, 3, 3), np.float32), requires_grad=True)
    >>> y = F.max_pool2d(F.relu(F.conv2d(x, w, padding=1)), 2)
    >>> tuple(y.shape)
    (2, 3, 3, 3)
    >>> F.cross_entropy(y.flatten(1), mt.tensor([0, 1])).backward()
    >>> tuple(w.grad.shape)
    (3, 1, 3, 3)
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor._base.parallel import one_thread as one_blas_thread
from mpitensor._core import autocast as _autocast
from mpitensor._core import half as _half
from mpitensor._ops.random import _draw
from mpitensor.autograd import ArrayFunction as Function, grad_enabled_for
from mpitensor.tensor import Tensor, _new, leaf_in_place_error

from . import _kernels as K
from ._functional import linear_ce as LCE
from ._functional.checks import (
    _arr,
    _as_input,
    _check_float,
    _check_same_device,
    _check_same_dtype,
    _shape_str,
    _wrap_dim,
)
from ._functional.checks import as_tensor as _tensor_arg
from ._functional.classification import _reduction, cross_entropy
from ._functional.piecewise import _MulMask

__all__ = ["relu", "relu_", "linear", "log_softmax", "softmax", "linear_cross_entropy", "dropout",
           "dropout2d", "flatten"]


# --------------------------------------------------------------------------------------------
# relu


def relu(input: Any, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """Apply ``max(x, 0)`` elementwise.

    Args:
        input: a tensor (any shape, any memory layout, which the result keeps).
        inplace: write the result into ``input`` and return it (torch's ``relu_``).

    Returns:
        The rectified tensor.

    Raises:
        RuntimeError: ``inplace=True`` on a leaf that requires grad.

    Example:
        >>> import mpitensor as mt
        >>> relu(mt.tensor([-1.0, 2.0]))
        tensor([0., 2.])
    """
    _as_input(input, "input", "relu")
    if inplace:
        return relu_(input)
    return (input if isinstance(input, Tensor) else _new(input)).relu()


def relu_(input: Any) -> Tensor:  # noqa: A002 - torch's name
    """In-place :func:`relu`: overwrite ``input`` with ``max(input, 0)`` and return it.

    Raises:
        RuntimeError: ``input`` is a leaf that requires grad (as in torch).

    Example:
        >>> import mpitensor as mt
        >>> t = mt.tensor([-1.0, 2.0]); _ = relu_(t); t
        tensor([0., 2.])
    """
    _as_input(input, "input", "relu_")
    if not isinstance(input, Tensor):
        xp = K.xp_of(input)
        xp.maximum(input, 0, out=input)
        return _new(input)
    return input.relu_()  # recorded where needed, and counted by the version counter


# --------------------------------------------------------------------------------------------
# linear


@_half.computes_in_float32  # half inputs: float32 products, one rounding, as torch
class _Linear(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any) -> Any:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        with one_blas_thread(x2.shape[0] * w.size):  # small products: no thread hand-off
            out = x2 @ w.T
        if b is not None:
            out += b
        ctx.save_for_backward(x2, w)
        ctx.lead = lead
        return out.reshape(*lead, w.shape[0])

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x2, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        g2 = g.reshape(x2.shape[0], w.shape[0])  # -1 is ambiguous with no out_features
        with one_blas_thread(x2.shape[0] * w.size):
            dx = (g2 @ w).reshape(*ctx.lead, w.shape[1]) if need[0] else None
            dw = g2.T @ x2 if need[1] else None
        db = g2.sum(axis=0) if len(need) > 2 and need[2] else None
        return dx, dw, db


def linear(input: Any, weight: Any, bias: Any = None) -> Tensor:  # noqa: A002
    """Apply ``input @ weight.T + bias`` (one matrix product for any leading dimensions).

    Args:
        input: (*, in_features).
        weight: (out_features, in_features).
        bias: (out_features,) or None.

    Returns:
        A tensor of shape (*, out_features).

    Raises:
        RuntimeError: mismatched feature sizes, dtypes or devices.

    Example:
        >>> import mpitensor as mt
        >>> linear(mt.ones(2, 3), mt.ones(4, 3), mt.zeros(4)).shape
        mpitensor.Size([2, 4])
    """
    if _autocast.ON and _autocast.active():
        return _autocast.run("linear", linear, input, weight, bias)
    for n, a in (("input", input), ("weight", weight)):
        _as_input(a, n, "linear")
    if bias is not None:
        _as_input(bias, "bias", "linear")
    x, w = _arr(input), _arr(weight)
    if w.ndim != 2:
        raise RuntimeError(
            f"linear(): weight must be 2-D (out_features, in_features), got shape "
            f"{_shape_str(w.shape)}"
        )
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise RuntimeError(
            f"linear(): mat1 and mat2 shapes cannot be multiplied (input "
            f"{_shape_str(x.shape)} and weight.T {_shape_str(w.shape[::-1])}): the input's last "
            f"dimension must equal in_features={w.shape[1]}"
        )
    if bias is not None and tuple(_arr(bias).shape) not in ((w.shape[0],), ()):
        raise RuntimeError(
            f"linear(): bias must have shape [{w.shape[0]}], got {_shape_str(_arr(bias).shape)}"
        )
    _check_float(input, "input", "linear")
    _check_same_dtype("linear", input=input, weight=weight, bias=bias)
    _check_same_device("linear", input=input, weight=weight, bias=bias)
    return _Linear.apply(input, weight, bias)


# --------------------------------------------------------------------------------------------
# softmax family


def _softmax_dim(name: str, ndim: int, stacklevel: int = 3) -> int:
    """torch's legacy choice of dimension when none is given, with a warning to pass one."""
    dim = 0 if ndim in (0, 1, 3) else 1
    warnings.warn(f"{name} without dim: using dim={dim} for a {ndim}-d input, as torch's "
                  f"deprecated default does; pass dim= explicitly", UserWarning,
                  stacklevel=stacklevel)
    return dim


def _softmax_prep(fname: str, input: Any, dim: Any, dtype: Any) -> tuple:  # noqa: A002
    """(the input as a Tensor, cast to ``dtype`` if given; the dimension, checked)."""
    _as_input(input, "input", fname)
    t = input if isinstance(input, Tensor) else _new(input)
    if dtype is not None:
        t = t.to(dtype)
    _check_float(t, "input", fname)
    ndim = t._data.ndim
    if dim is None:
        dim = _softmax_dim(fname, ndim)
    return t, _wrap_dim(dim, ndim, fname)


def log_softmax(input: Any, dim: Optional[int] = None, _stacklevel: int = 3,  # noqa: A002
                dtype: Any = None) -> Tensor:
    """Apply ``log(softmax(x))`` along ``dim``, computed stably (max-shifted log-sum-exp).

    Args:
        input: a floating point tensor.
        dim: the dimension to normalise over (torch's implicit choice, with a warning, if None).
        dtype: cast the input to this dtype first.

    Returns:
        A tensor like ``input``.

    Raises:
        IndexError: ``dim`` out of range.
        RuntimeError: a non-float input.

    Example:
        >>> import mpitensor as mt
        >>> log_softmax(mt.tensor([0.0, 0.0]), dim=0).exp()
        tensor([0.5000, 0.5000])
    """
    if _autocast.ON and _autocast.active():
        return _autocast.run("log_softmax", log_softmax, input, dim, _stacklevel + 2, dtype=dtype)
    t, dim = _softmax_prep("log_softmax", input, dim, dtype)
    return t.log_softmax(dim)  # the one implementation, in mpitensor._ops.softmax


def softmax(input: Any, dim: Optional[int] = None, _stacklevel: int = 3,  # noqa: A002
            dtype: Any = None) -> Tensor:
    """Apply softmax along ``dim`` (arguments as in :func:`log_softmax`).

    Example:
        >>> import mpitensor as mt
        >>> softmax(mt.tensor([1.0, 1.0]), dim=0)
        tensor([0.5000, 0.5000])
    """
    if _autocast.ON and _autocast.active():
        return _autocast.run("softmax", softmax, input, dim, _stacklevel + 2, dtype=dtype)
    t, dim = _softmax_prep("softmax", input, dim, dtype)
    return t.softmax(dim)


# --------------------------------------------------------------------------------------------
# dropout, flatten


def _dropout_mask(x: Any, p: float, shape: tuple) -> Any:
    """A keep mask of ``shape`` (P(keep) = 1 - p), already scaled by ``1 / (1 - p)``."""
    dt = x.dtype
    u = _draw("rand", shape, None, np.dtype(dt), _backend.device_of(x))
    xp = K.xp_of(x)
    keep = u >= p  # P(keep) = 1 - p
    return keep.astype(dt) * xp.asarray(1.0 / (1.0 - p), dtype=dt)


def dropout(input: Any, p: float = 0.5, training: bool = True,  # noqa: A002 - torch's name
            inplace: bool = False) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    The mask comes from mpitensor's global generator (CuPy's state of it on a GPU), so
    ``mpitensor.manual_seed`` makes it reproducible.

    Args:
        input: a floating point tensor.
        p: drop probability in [0, 1].
        training: when False, return ``input`` unchanged.
        inplace: write the result into ``input``.

    Returns:
        The tensor with dropout applied.

    Raises:
        ValueError: ``p`` outside [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> dropout(mt.ones(3), p=0.0)
        tensor([1., 1., 1.])
    """
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    _as_input(input, "input", "dropout")
    if not training or p == 0.0 or _arr(input).size == 0:
        return input if isinstance(input, Tensor) else _new(input)
    _check_float(input, "input", "dropout")
    x = _arr(input)
    if p == 1.0:
        mask = K.xp_of(x).zeros(x.shape, dtype=x.dtype)
    else:
        mask = _dropout_mask(x, float(p), tuple(x.shape))
    return _apply_mask(input, mask, inplace, "dropout")


def _apply_mask(input: Any, mask: Any, inplace: bool, fname: str) -> Tensor:  # noqa: A002
    """``input * mask`` (mask broadcast), written into ``input`` for ``inplace``."""
    if inplace and isinstance(input, Tensor):
        if input._requires_grad and input.grad_fn is None and grad_enabled_for(input):
            raise leaf_in_place_error(f"{fname}(inplace=True)")
    out = _MulMask.apply(input, mask)
    if inplace and isinstance(input, Tensor):
        return input.copy_(out)  # recorded where needed, and counted by the version counter
    return out


def dropout2d(input: Any, p: float = 0.5, training: bool = True,  # noqa: A002 - torch's name
              inplace: bool = False) -> Tensor:
    """Zero whole channels with probability ``p`` and scale the others by ``1 / (1 - p)``.

    One draw per (sample, channel) from mpitensor's global generator (so
    ``mpitensor.manual_seed`` makes it reproducible) decides for every position of that
    channel's plane. As in torch, a 3-D input is taken as (N, C, L) (with a warning: torch
    plans to read it as an unbatched (C, H, W)), and inputs of other ranks as (N, C, *)
    with a deprecation warning.

    Args:
        input: (N, C, H, W) floating point (see above for other ranks).
        p: channel drop probability in [0, 1].
        training: when False, return ``input`` unchanged.
        inplace: write the result into ``input``.

    Returns:
        The tensor with channel dropout applied.

    Raises:
        ValueError: ``p`` outside [0, 1].
        RuntimeError: an input of fewer than 2 dimensions, a leaf that requires grad with
            ``inplace=True``.

    Example:
        >>> import mpitensor as mt
        >>> dropout2d(mt.ones(1, 2, 2, 2), p=0.0).shape
        mpitensor.Size([1, 2, 2, 2])
    """
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"dropout2d(): p is a probability and must be in [0, 1], got {p!r}")
    _as_input(input, "input", "dropout2d")
    x = _arr(input)
    if x.ndim < 2:
        raise RuntimeError(
            f"dropout2d(): channel dropout needs at least 2 dimensions (N, C, ...), got shape "
            f"{_shape_str(x.shape)}"
        )
    if x.ndim == 3:
        warnings.warn(
            "dropout2d(): a 3-D input is taken as (N, C, L) and whole length-L channels are "
            "dropped (torch's current behaviour, which it plans to change to reading it as an "
            "unbatched (C, H, W)); use dropout1d for channel dropout on (N, C, L)",
            UserWarning, stacklevel=2,
        )
    elif x.ndim != 4:
        warnings.warn(
            f"dropout2d(): a {x.ndim}-D input is deprecated (torch plans to reject it); "
            f"channels of (N, C, *) are dropped. dropout2d is meant for (N, C, H, W) inputs; "
            f"use dropout for elementwise dropout", UserWarning, stacklevel=2,
        )
    if not training or p == 0.0 or x.size == 0:
        return input if isinstance(input, Tensor) else _new(input)
    _check_float(input, "input", "dropout2d")
    shape = (*x.shape[:2], *(1,) * (x.ndim - 2))
    if p == 1.0:
        mask = K.xp_of(x).zeros(shape, dtype=x.dtype)
    else:
        mask = _dropout_mask(x, float(p), shape)
    return _apply_mask(input, mask, inplace, "dropout2d")


def flatten(input: Any, start_dim: int = 0, end_dim: int = -1) -> Tensor:  # noqa: A002
    """Merge dimensions ``start_dim..end_dim`` into one (differentiable; a view when possible).

    Args:
        input: a tensor.
        start_dim, end_dim: the first and last dimensions to merge (negative counts from the end).

    Returns:
        The flattened tensor (values in NCHW order whatever the memory layout).

    Raises:
        ValueError: ``start_dim`` after ``end_dim``.

    Example:
        >>> import mpitensor as mt
        >>> flatten(mt.zeros(2, 3, 4), 1).shape
        mpitensor.Size([2, 12])
    """
    _as_input(input, "input", "flatten")
    return (input if isinstance(input, Tensor) else _new(input)).flatten(start_dim, end_dim)


def linear_cross_entropy(input: Any, linear_weight: Any, target: Any, *,  # noqa: A002
                         linear_bias: Any = None, weight: Any = None, reduction: str = "mean",
                         ignore_index: Optional[int] = None, label_smoothing: float = 0.0,
                         options: Optional[LCE.LinearCrossEntropyOptions] = None) -> Tensor:
    """``cross_entropy(linear(input, linear_weight, linear_bias), target, ...)``.

    Args:
        input: (N, in) or (in,) samples.
        linear_weight: (C, in), or (C, d1, ..., dK, in) for a K-dimensional loss (the
            logits are then reshaped to (N, C, d1, ..., dK)).
        target: class indices or class probabilities, as :func:`cross_entropy` takes them.
        linear_bias: (C,) or (C, d1, ..., dK), optional.
        weight, reduction, label_smoothing: as :func:`cross_entropy`.
        ignore_index: the ignored class index (None means -100).
        options: chunk the batch (see :class:`LinearCrossEntropyOptions`); None computes the
            logits in full.

    Raises:
        RuntimeError: an input of another rank than 1 or 2, or mismatched feature sizes.

    Example:
        >>> import mpitensor as mt
        >>> linear_cross_entropy(mt.zeros(2, 3), mt.zeros(4, 3), mt.tensor([0, 1])).item()
        1.3862943649291992
    """
    fname = "linear_cross_entropy"
    x = _tensor_arg(input, "input", fname)
    w = _tensor_arg(linear_weight, "linear_weight", fname)
    if x.ndim not in (1, 2):
        raise RuntimeError(f"{fname}(): expected a 1-D or 2-D input, got shape "
                           f"{_shape_str(x.shape)}")
    if w.ndim < 2 or w.shape[-1] != x.shape[-1]:
        raise RuntimeError(f"{fname}(): linear_weight must be (C, ..., {x.shape[-1]}), got "
                           f"shape {_shape_str(w.shape)}")
    red = _reduction(reduction, None, None, fname)
    ignore = -100 if ignore_index is None else int(ignore_index)
    t = target if isinstance(target, Tensor) else _tensor_arg(target, "target", fname)
    if options is not None:
        out = LCE.chunked_linear_cross_entropy(fname, x, w, linear_bias, t, weight, red, ignore,
                                               label_smoothing, options)
        if out is not None:
            return out
    c, extra = w.shape[0], tuple(w.shape[1:-1])
    flat_w = w.reshape((c * math.prod(extra), w.shape[-1])) if extra else w
    b = linear_bias
    if b is not None and extra:
        b = _tensor_arg(b, "linear_bias", fname).reshape((c * math.prod(extra),))
    logits = linear(x, flat_w, b)
    if extra:
        logits = logits.reshape((*x.shape[:-1], c, *extra))
    return cross_entropy(logits, t, weight, ignore_index=ignore, reduction=red,
                         label_smoothing=label_smoothing)


# --------------------------------------------------------------------------------------------
# Re-exports: the ops that live beside this file, in modules of their own (which cannot import
# this one back: the package's import graph has no cycles)

from ._functional.activations import *  # noqa: E402, F403
from ._functional.activations import __all__ as _activation_names  # noqa: E402
from ._functional.attention import *  # noqa: E402, F403
from ._functional.attention import __all__ as _attention_names  # noqa: E402
from ._functional.bilinear import *  # noqa: E402, F403
from ._functional.bilinear import __all__ as _bilinear_names  # noqa: E402
from ._functional.classification import *  # noqa: E402, F403
from ._functional.classification import __all__ as _classification_names  # noqa: E402
from ._functional.conv import *  # noqa: E402, F403
from ._functional.conv import __all__ as _conv_names  # noqa: E402
from ._functional.ctc import *  # noqa: E402, F403
from ._functional.ctc import __all__ as _ctc_names  # noqa: E402
from ._functional.distance import *  # noqa: E402, F403
from ._functional.distance import __all__ as _distance_names  # noqa: E402
from ._functional.dropout import *  # noqa: E402, F403
from ._functional.dropout import __all__ as _dropout_names  # noqa: E402
from ._functional.embedding import *  # noqa: E402, F403
from ._functional.embedding import __all__ as _embedding_names  # noqa: E402
from ._functional.linear_ce import *  # noqa: E402, F403
from ._functional.linear_ce import __all__ as _linear_ce_names  # noqa: E402
from ._functional.losses import *  # noqa: E402, F403
from ._functional.losses import __all__ as _loss_names  # noqa: E402
from ._functional.norm import *  # noqa: E402, F403
from ._functional.norm import __all__ as _norm_names  # noqa: E402
from ._functional.piecewise import *  # noqa: E402, F403
from ._functional.piecewise import __all__ as _piecewise_names  # noqa: E402
from ._functional.pooling1d import *  # noqa: E402, F403
from ._functional.pooling1d import __all__ as _pooling1d_names  # noqa: E402
from ._functional.pooling2d import *  # noqa: E402, F403
from ._functional.pooling2d import __all__ as _pooling2d_names  # noqa: E402
from ._functional.poolingnd import *  # noqa: E402, F403
from ._functional.poolingnd import __all__ as _poolingnd_names  # noqa: E402
from ._functional.rms_norm import *  # noqa: E402, F403
from ._functional.rms_norm import __all__ as _rms_norm_names  # noqa: E402
from ._functional.sampling import *  # noqa: E402, F403
from ._functional.sampling import __all__ as _sampling_names  # noqa: E402
from ._functional.spatial import *  # noqa: E402, F403
from ._functional.spatial import __all__ as _spatial_names  # noqa: E402

__all__ += [*_piecewise_names, *_conv_names, *_pooling2d_names, *_norm_names,
            *_classification_names, *_activation_names, *_attention_names, *_bilinear_names,
            *_ctc_names, *_distance_names, *_dropout_names, *_embedding_names, *_linear_ce_names,
            *_loss_names, *_pooling1d_names, *_poolingnd_names, *_rms_norm_names, *_sampling_names,
            *_spatial_names]
