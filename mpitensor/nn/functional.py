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

import contextlib
import math
import numbers
import warnings
from typing import Any, Optional, Union

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._base.parallel import one_thread as one_blas_thread
from mpitensor._core import autocast as _autocast
from mpitensor._core import half as _half
from mpitensor._ops.random import _draw
from mpitensor.autograd import Function, _sum_to, grad_enabled_for
from mpitensor.tensor import Tensor, _new, leaf_in_place_error

from . import _kernels as K
from ._functional import linear_ce as LCE
from ._functional.checks import as_tensor as _tensor_arg
from ._kernels import convnd as CN
from ._kernels import norm as NK

__all__ = [
    "relu",
    "relu_",
    "linear",
    "conv1d",
    "conv_tbc",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "max_pool2d",
    "max_pool2d_with_indices",
    "avg_pool2d",
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "batch_norm",
    "instance_norm",
    "group_norm",
    "layer_norm",
    "log_softmax",
    "softmax",
    "nll_loss",
    "cross_entropy",
    "mse_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "kl_div",
    "linear_cross_entropy",
    "dropout",
    "dropout2d",
    "flatten",
]

_IntOrPair = Union[int, tuple, list]


# --------------------------------------------------------------------------------------------
# helpers


def _arr(x: Any) -> Any:
    """The array behind a Tensor, or the array itself."""
    return x._data if isinstance(x, Tensor) else x


def _as_input(x: Any, name: str, fname: str) -> Any:
    """Accept a Tensor or a NumPy/CuPy array; reject anything else with a clear message."""
    if isinstance(x, Tensor) or _backend.is_array(x):
        return x
    raise TypeError(
        f"{fname}(): argument '{name}' must be a Tensor or a NumPy/CuPy array, not "
        f"{type(x).__name__}; wrap it with mpitensor.tensor(...)"
    )


def _dtype_name(dt: Any) -> str:
    return np.dtype(dt).name


def _check_float(x: Any, name: str, fname: str) -> None:
    if not _dt.is_floating_dtype(_arr(x).dtype):
        raise RuntimeError(
            f"{fname}(): '{name}' must have a floating point dtype, got "
            f"{_dtype_name(_arr(x).dtype)}; convert it first, e.g. x.float()"
        )


def _half_with_float_params(input: Any, *params: Any) -> bool:  # noqa: A002
    """A half-precision input with float32 parameters: torch's CPU norms accept the mix (as
    autocast makes it: a bfloat16 activation, float32 weights), compute in float32 and
    return the input's dtype."""
    given = [p for p in params if p is not None]
    return (isinstance(input, Tensor) and input.dtype in _half.REDUCED and bool(given)
            and all(_arr(p).dtype == _dt.float32 for p in given))


def _check_same_dtype(fname: str, **arrays: Any) -> None:
    items = [(n, _arr(a).dtype) for n, a in arrays.items() if a is not None]
    first_name, first = items[0]
    for n, dt in items[1:]:
        if dt != first:
            raise RuntimeError(
                f"{fname}(): {first_name} type ({_dtype_name(first)}) and {n} type "
                f"({_dtype_name(dt)}) should be the same; cast one of them, e.g. with .float()"
            )


def _check_same_device(fname: str, **arrays: Any) -> None:
    if all(a is None or isinstance(_arr(a), np.ndarray) for a in arrays.values()):
        return  # all on the CPU: the common case, checked without building device objects
    devs = {n: _backend.device_of(_arr(a)) for n, a in arrays.items() if a is not None}
    if len({str(d) for d in devs.values()}) > 1:
        desc = ", ".join(f"{n} on {d}" for n, d in devs.items())
        raise RuntimeError(
            f"{fname}(): expected all tensors on the same device, got {desc}; move them with "
            f".to(device)"
        )


def _pair(v: Any, name: str, fname: str, minimum: int) -> tuple:
    if isinstance(v, (tuple, list)):
        if len(v) == 1:
            v = (v[0], v[0])
        if len(v) != 2:
            raise ValueError(f"{fname}(): {name} must be an int or a pair of ints, got {v!r}")
        out = tuple(v)
    else:
        out = (v, v)
    for e in out:
        if isinstance(e, bool) or not isinstance(e, numbers.Integral):
            raise TypeError(f"{fname}(): {name} must be an int or a pair of ints, got {v!r}")
        if e < minimum:
            raise ValueError(
                f"{fname}(): {name} must be >= {minimum} in every dimension, got {v!r}"
            )
    return (int(out[0]), int(out[1]))


def _wrap_dim(dim: Any, ndim: int, fname: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{fname}(): dim must be an int, got {dim!r}")
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(
            f"{fname}(): Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
            f"but got {dim})"
        )
    return int(dim) % n


def _shape_str(shape: tuple) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _reshape(x: Any, shape: tuple) -> Tensor:
    return (x if isinstance(x, Tensor) else _new(x)).reshape(tuple(shape))


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
        g2 = g.reshape(-1, w.shape[0])
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
# conv2d


class _ConvArgumentError(ValueError, RuntimeError):
    """A bad convolution argument that torch answers with RuntimeError and mpitensor's conv2d
    and Conv2d answered with ValueError first (a negative padding, a zero stride, a padding
    too big for its mode, ...): either handler catches it."""


def _conv_work(geom: K.ConvGeom) -> int:
    """Multiply-adds of conv2d's biggest single product (one band's; see _kernels)."""
    cols = min(geom.OH * geom.OW * geom.N, K.BAND_COLUMNS)
    return geom.O * (geom.C // geom.G) * geom.kh * geom.kw * cols


#: conv2d shares its bands out across threads only when one band's product is at least this
#: many multiply-adds ... (LeNet's conv1, 6 x 26 x 2 048 = 0.3 M a band, ran slower split: its
#: bands are mostly Python, which the threads take turns at)
SPLIT_BAND_WORK = 1 << 21
#: ... and the whole convolution at least this many (LeNet's conv2 gained from splitting at
#: batch 256, 62 M, and lost at batch 128, 31 M)
SPLIT_TOTAL_WORK = 40 << 20


#: ... but with the compiled band loops (mpitensor.nn._kernels.native), whose shares run without the
#: interpreter lock, from this many in all (LeNet's conv1 at batch 64, 7.5 M, ran its forward
#: 1.6x faster on two threads than on one)
SPLIT_NATIVE_WORK = 2 << 20


def _conv_threads(geom: K.ConvGeom, native: bool) -> Any:
    """The thread context of one conv2d call: small products on one BLAS thread, and the
    bands kept on this thread where splitting them would not pay (``native``: the call runs
    them in the compiled loops, ``K.native_applies``)."""
    work = _conv_work(geom)
    total = geom.O * (geom.C // geom.G) * geom.kh * geom.kw * geom.OH * geom.OW * geom.N
    if native:
        return one_blas_thread(work, split=total >= SPLIT_NATIVE_WORK)
    return one_blas_thread(work, split=work >= SPLIT_BAND_WORK and total >= SPLIT_TOTAL_WORK)


class _Conv2d(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, geom: K.ConvGeom) -> Any:
        native = K.native_applies(x, geom, b is not None)
        with _conv_threads(geom, native):  # small products: no thread hand-off
            out, cols, wmat = K.conv2d_forward(x, w, b, geom)
        ctx.save_for_backward(cols, wmat)
        ctx.geom = geom
        ctx.native = native
        ctx.has_bias = b is not None
        return out.transpose(3, 0, 1, 2)  # NCHW shape, (C, H, W, N) memory

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        cols, wmat = ctx.saved_tensors
        geom = ctx.geom
        need = ctx.needs_input_grad
        gc = g.transpose(1, 2, 3, 0)  # free for gradients in conv2d's own layout
        need_b = len(need) > 2 and need[2]
        with _conv_threads(geom, ctx.native):
            dx, dw, db = K.conv2d_backward(gc, cols, wmat, geom, (need[0], need[1], need_b),
                                           ctx.has_bias)
        if dx is not None:
            dx = dx.transpose(3, 0, 1, 2)
        return dx, dw, db, None


def _conv_padding(padding: Any, k: tuple, d: tuple, stride: tuple) -> tuple:
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding == "same":
            if stride != (1, 1):
                raise ValueError(
                    "conv2d(): padding='same' is not supported for strided convolutions; use "
                    "stride=1 or give the padding as ints"
                )
            th, tw = d[0] * (k[0] - 1), d[1] * (k[1] - 1)
            return (th // 2, th - th // 2, tw // 2, tw - tw // 2)  # extra on the bottom/right
        raise ValueError(
            f"conv2d(): invalid padding string {padding!r}, should be one of {{'valid', 'same'}}"
        )
    ph, pw = _pair(padding, "padding", "conv2d", 0)
    return (ph, ph, pw, pw)


def conv2d(
    input: Any,  # noqa: A002 - torch's name
    weight: Any,
    bias: Any = None,
    stride: _IntOrPair = 1,
    padding: Union[_IntOrPair, str] = 0,
    dilation: _IntOrPair = 1,
    groups: int = 1,
) -> Tensor:
    """2-D cross-correlation, as ``torch.nn.functional.conv2d``: im2col + one matrix product.

    Args:
        input: (N, C_in, H, W), or (C_in, H, W) unbatched.
        weight: (C_out, C_in / groups, kH, kW).
        bias: (C_out,) or None.
        stride: int or (sH, sW).
        padding: int, (pH, pW), ``'valid'`` (no padding) or ``'same'`` (stride 1 only).
        dilation: int or (dH, dW).
        groups: number of blocked connections from input to output channels.

    Returns:
        (N, C_out, OH, OW) (or (C_out, OH, OW) for unbatched input); (C, H, W, N) in memory
        (see the module docstring), NCHW in every observable way.

    Raises:
        RuntimeError: wrong ranks, channel counts that do not match ``weight``/``groups``, a
            kernel larger than the padded input, mixed dtypes or devices.
        ValueError: negative padding, non-positive stride/dilation/groups, bad padding string.

    Example:
        >>> import mpitensor as mt
        >>> conv2d(mt.ones(1, 1, 5, 5), mt.ones(2, 1, 3, 3), padding=1).shape
        mpitensor.Size([1, 2, 5, 5])
    """
    if _autocast.ON and _autocast.active():
        return _autocast.run("conv2d", conv2d, input, weight, bias, stride, padding, dilation,
                             groups)
    _as_input(input, "input", "conv2d")
    _as_input(weight, "weight", "conv2d")
    if bias is not None:
        _as_input(bias, "bias", "conv2d")
    x, w = _arr(input), _arr(weight)
    if x.ndim not in (3, 4):
        raise RuntimeError(
            f"conv2d(): Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input "
            f"of size: {_shape_str(x.shape)}"
        )
    if w.ndim != 4:
        raise RuntimeError(
            f"conv2d(): weight must be 4-D (out_channels, in_channels/groups, kH, kW), got "
            f"shape {_shape_str(w.shape)}"
        )
    try:
        if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups < 1:
            raise ValueError(f"conv2d(): groups must be a positive integer, got {groups!r}")
        stride_ = _pair(stride, "stride", "conv2d", 1)
        dil = _pair(dilation, "dilation", "conv2d", 1)
        pad = _conv_padding(padding, (w.shape[2], w.shape[3]), dil, stride_)
    except ValueError as e:  # torch's class too (RuntimeError), for programs that catch it
        raise _ConvArgumentError(str(e)) from None
    unbatched = x.ndim == 3
    xshape = (1, *x.shape) if unbatched else tuple(x.shape)
    if w.shape[0] % groups:
        raise RuntimeError(
            f"conv2d(): out_channels ({w.shape[0]}) must be divisible by groups ({groups})"
        )
    if xshape[1] != w.shape[1] * groups:
        raise RuntimeError(
            f"conv2d(): Given groups={groups}, weight of size {_shape_str(w.shape)}, expected "
            f"input{_shape_str(x.shape)} to have {w.shape[1] * groups} channels, but got "
            f"{xshape[1]} channels instead"
        )
    if bias is not None and tuple(_arr(bias).shape) != (w.shape[0],):
        raise RuntimeError(
            f"conv2d(): bias must have shape [{w.shape[0]}] (one per output channel), got "
            f"{_shape_str(_arr(bias).shape)}"
        )
    _check_float(input, "input", "conv2d")
    _check_same_dtype("conv2d", input=input, weight=weight, bias=bias)
    _check_same_device("conv2d", input=input, weight=weight, bias=bias)
    geom = K.ConvGeom(xshape, tuple(w.shape), stride_, pad, dil, int(groups))
    ekh, ekw = dil[0] * (w.shape[2] - 1) + 1, dil[1] * (w.shape[3] - 1) + 1
    if geom.Hp < ekh or geom.Wp < ekw:
        raise RuntimeError(
            f"conv2d(): Calculated padded input size per channel: ({geom.Hp} x {geom.Wp}). "
            f"Kernel size: ({ekh} x {ekw}). Kernel size can't be greater than actual input size; "
            f"pad the input or use a smaller kernel"
        )
    if xshape[0] == 0:
        return _EmptyBatchConv.apply(input, weight, bias, (0, w.shape[0], geom.OH, geom.OW))
    xin = _reshape(input, xshape) if unbatched else input
    out = _Conv2d.apply(xin, weight, bias, geom)
    return _reshape(out, tuple(out.shape[1:])) if unbatched else out


# --------------------------------------------------------------------------------------------
# the convolution family: conv1d, conv3d, conv_transpose1d/2d/3d (mpitensor.nn._kernels.convnd)


def _spatial_arg(v: Any, name: str, fname: str, nd: int, minimum: int, what: str) -> tuple:
    """An int or ``nd`` ints (>= minimum) for one of a convolution's per-dimension options."""
    items = list(v) if isinstance(v, (tuple, list)) else [v] * nd
    if any(isinstance(e, bool) or not isinstance(e, numbers.Integral) for e in items):
        raise TypeError(f"{fname}(): argument '{name}' must be an int or a tuple of {nd} ints, "
                        f"got {v!r}")
    if len(items) == 1:
        items = items * nd
    if len(items) != nd:
        raise RuntimeError(f"{fname}(): expected {name} to be a single integer value or a list "
                           f"of {nd} values to match the convolution dimensions, but got "
                           f"{name}={list(items)}")
    if any(e < minimum for e in items):
        raise RuntimeError(f"{fname}(): {what} {name} is not supported, got {v!r}")
    return tuple(int(e) for e in items)


def _conv_family_args(fname: str, nd: int, input: Any, weight: Any, bias: Any,  # noqa: A002
                      stride: Any, dilation: Any, groups: Any, transposed: bool) -> tuple:
    """The checks every member of the family makes before any work; returns
    ``(x, w, stride, dilation, unbatched, xshape)``."""
    _as_input(input, "input", fname)
    _as_input(weight, "weight", fname)
    if bias is not None:
        _as_input(bias, "bias", fname)
    x, w = _arr(input), _arr(weight)
    if x.ndim not in (nd + 1, nd + 2):
        raise RuntimeError(
            f"{fname}(): Expected {nd + 1}D (unbatched) or {nd + 2}D (batched) input to {fname}, "
            f"but got input of size: {_shape_str(x.shape)}"
        )
    if w.ndim != nd + 2:
        layout = "(in_channels, out_channels/groups" if transposed else \
            "(out_channels, in_channels/groups"
        raise RuntimeError(f"{fname}(): weight must be {nd + 2}-D {layout}, *kernel_size), got "
                           f"shape {_shape_str(w.shape)}")
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral):
        raise TypeError(f"{fname}(): argument 'groups' must be int, got {groups!r}")
    if groups < 1:
        raise RuntimeError(f"{fname}(): non-positive groups is not supported, got {groups}")
    stride_ = _spatial_arg(stride, "stride", fname, nd, 1, "non-positive")
    dil = _spatial_arg(dilation, "dilation", fname, nd, 1, "non-positive")
    unbatched = x.ndim == nd + 1
    xshape = (1, *x.shape) if unbatched else tuple(x.shape)
    cin = w.shape[0] if transposed else w.shape[1] * groups
    if xshape[1] != cin:
        raise RuntimeError(
            f"{fname}(): Given {'transposed=1, ' if transposed else ''}groups={groups}, weight "
            f"of size {_shape_str(w.shape)}, expected input{_shape_str(x.shape)} to have {cin} "
            f"channels, but got {xshape[1]} channels instead"
        )
    if w.shape[0] % groups:
        raise RuntimeError(f"{fname}(): the weight's first dimension ({w.shape[0]}) must be "
                           f"divisible by groups ({groups})")
    cout = w.shape[1] * groups if transposed else w.shape[0]
    if bias is not None and tuple(_arr(bias).shape) != (cout,):
        raise RuntimeError(f"{fname}(): bias must have shape [{cout}] (one per output channel), "
                           f"got {_shape_str(_arr(bias).shape)}")
    _check_float(input, "input", fname)
    _check_same_dtype(fname, input=input, weight=weight, bias=bias)
    _check_same_device(fname, input=input, weight=weight, bias=bias)
    return x, w, stride_, dil, unbatched, xshape


def _nc_view(a: Any, nd: int) -> Any:
    """A (C, *S, N) array as its NC... view."""
    return a.transpose(nd + 1, *range(nd + 1))


def _cs_n_view(a: Any, nd: int) -> Any:
    """An NC... array as its (C, *S, N) view."""
    return a.transpose(*range(1, nd + 2), 0)


class _EmptyBatchConv(Function):
    """A convolution of an empty batch, as torch gives it: an empty output of the right
    shape, and zero gradients for the weight and bias."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, shape: tuple) -> Any:
        ctx.shapes = (x.shape, w.shape, None if b is None else b.shape)
        return K.xp_of(x).zeros(shape, x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        xp = K.xp_of(g)
        return (*(None if s is None else xp.zeros(s, g.dtype) for s in ctx.shapes), None)


class _ConvNd(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, geom: CN.Geom) -> Any:
        out, saved = CN.conv_forward(x, w, b, geom, _conv_threads)
        ctx.save_for_backward(*saved)
        ctx.geom = geom
        ctx.has_bias = b is not None
        return _nc_view(out, geom.nd)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        saved = ctx.saved_tensors
        geom = ctx.geom
        need = ctx.needs_input_grad
        gc = _cs_n_view(g, geom.nd)
        dx = dw = db = None
        if need[1] or (ctx.has_bias and need[2]):
            dw, db = CN.conv_weight_grad(gc, saved, geom, ctx.has_bias, _conv_threads)
        if need[0]:
            dx = _nc_view(CN.conv_input_grad(gc, saved, geom, _conv_threads), geom.nd)
        return dx, dw, db, None


@_half.computes_in_float32  # half inputs: col2im adds in float32, one rounding, as torch
class _ConvTransposeNd(Function):
    """The adjoint of :class:`_ConvNd` with the same weight (see :mod:`._convnd`)."""

    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, geom: CN.Geom) -> Any:
        nd = geom.nd
        # one contiguous (C, *S, N) copy of the input, if it is not one already, serves the
        # forward product and the weight gradient (each would copy it otherwise)
        xc = CN.contiguous(CN.pad_to(_cs_n_view(x, nd), geom.out))
        wmat = CN.weight_matrix(w, geom)
        # the result is a crop of the padded col2im buffer: copied out whole (with the bias
        # added on the way), so that the next layer (batch norm, relu, a convolution) reads
        # one contiguous (C, *S, N) array and copies nothing itself
        out = CN.contiguous(CN.conv_input_grad(xc, (None, wmat), geom, _conv_threads),
                            None if b is None else b.reshape((-1,) + (1,) * (nd + 1)))
        ctx.save_for_backward(xc, w)
        ctx.geom = geom
        ctx.xsizes = tuple(x.shape[2:])
        return _nc_view(out, nd)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        xc, w = ctx.saved_tensors
        geom = ctx.geom
        need = ctx.needs_input_grad
        dx = dw = db = None
        if need[0] or need[1]:
            dxc, saved = CN.conv_forward(g, w, None, geom, _conv_threads)
            if need[0]:
                dx = _nc_view(CN.crop_to(dxc, ctx.xsizes), geom.nd)
            if need[1]:
                dw, _ = CN.conv_weight_grad(xc, saved, geom, False, _conv_threads)
        if len(need) > 2 and need[2]:
            db = g.sum(axis=(0, *range(2, g.ndim)))
        return dx, dw, db, None


class _PadNd(Function):
    """Reflect / replicate / circular padding of the last dimensions (the padding modes)."""

    @staticmethod
    def forward(ctx: Any, x: Any, pads: tuple, mode: str) -> Any:
        out, ctx.maps = CN.pad_forward(x, pads, mode)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return CN.pad_backward(g, ctx.maps), None, None


def _pad_mode(input: Any, pads: tuple, mode: str) -> Tensor:  # noqa: A002 - torch's name
    """``input`` padded by ``mode`` on its last ``len(pads)`` dimensions ((before, after) each),
    for the convolution modules' padding modes."""
    shape = _arr(input).shape[-len(pads):]
    for n, (lo, hi) in zip(shape, pads):
        if mode == "reflect" and (lo >= n or hi >= n):
            raise _ConvArgumentError(f"padding_mode='reflect' needs padding smaller than the input "
                                   f"size, got padding ({lo}, {hi}) for a dimension of size {n}")
        if mode == "circular" and (lo > n or hi > n):
            raise _ConvArgumentError(f"padding_mode='circular' needs padding at most the input "
                                   f"size, got padding ({lo}, {hi}) for a dimension of size {n}")
    return _PadNd.apply(input, tuple(pads), mode)


def _conv_nd(fname: str, nd: int, input: Any, weight: Any, bias: Any,  # noqa: A002
             stride: Any, padding: Any, dilation: Any, groups: Any) -> Tensor:
    if _autocast.ON and _autocast.active():
        return _autocast.run(fname, _conv_nd, fname, nd, input, weight, bias, stride, padding,
                             dilation, groups)
    x, w, stride_, dil, unbatched, xshape = _conv_family_args(
        fname, nd, input, weight, bias, stride, dilation, groups, False)
    k = tuple(w.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pads = ((0, 0),) * nd
        elif padding == "same":
            if any(s != 1 for s in stride_):
                raise RuntimeError(f"{fname}(): padding='same' is not supported for strided "
                                   f"convolutions; use stride=1 or give the padding as ints")
            # an odd total puts the extra position at the end, as torch does
            pads = tuple((d * (kk - 1) // 2, d * (kk - 1) - d * (kk - 1) // 2)
                         for d, kk in zip(dil, k))
        else:
            raise RuntimeError(f"{fname}(): invalid padding string {padding!r}, should be one "
                               f"of 'valid' or 'same'")
    else:
        pads = tuple((p, p) for p in _spatial_arg(padding, "padding", fname, nd, 0, "negative"))
    geom = CN.Geom(xshape, tuple(w.shape), stride_, pads, dil, int(groups))
    if any(n < d * (kk - 1) + 1 for n, d, kk in zip(geom.Sp, dil, k)):
        raise RuntimeError(
            f"{fname}(): Calculated padded input size per channel: {geom.Sp}. Kernel size: "
            f"{tuple(d * (kk - 1) + 1 for d, kk in zip(dil, k))}. Kernel size can't be greater "
            f"than actual input size; pad the input or use a smaller kernel"
        )
    if xshape[0] == 0:
        return _EmptyBatchConv.apply(input, weight, bias, (0, w.shape[0], *geom.out))
    xin = _reshape(input, xshape) if unbatched else input
    out = _ConvNd.apply(xin, weight, bias, geom)
    return _reshape(out, tuple(out.shape[1:])) if unbatched else out


def _conv_transpose_nd(fname: str, nd: int, input: Any, weight: Any, bias: Any,  # noqa: A002
                       stride: Any, padding: Any, output_padding: Any, groups: Any,
                       dilation: Any) -> Tensor:
    if _autocast.ON and _autocast.active():
        return _autocast.run(fname, _conv_transpose_nd, fname, nd, input, weight, bias, stride,
                             padding, output_padding, groups, dilation)
    x, w, stride_, dil, unbatched, xshape = _conv_family_args(
        fname, nd, input, weight, bias, stride, dilation, groups, True)
    pad = _spatial_arg(padding, "padding", fname, nd, 0, "negative")
    opad = _spatial_arg(output_padding, "output_padding", fname, nd, 0, "negative")
    for op, s, d in zip(opad, stride_, dil):
        if op >= max(s, d):
            raise RuntimeError(f"{fname}(): output padding must be smaller than either stride "
                               f"or dilation, got output_padding={opad}, stride={stride_}, "
                               f"dilation={dil}")
    geom = CN.adjoint_geometry(xshape, tuple(w.shape), stride_, pad, opad, dil, int(groups))
    if any(t < 1 for t in geom.S):
        raise RuntimeError(f"{fname}(): the output size {geom.S} is too small: the padding "
                           f"{pad} takes more than the input {xshape[2:]} gives; reduce it")
    if xshape[0] == 0:
        return _EmptyBatchConv.apply(input, weight, bias, (0, geom.C, *geom.S))
    xin = _reshape(input, xshape) if unbatched else input
    out = _ConvTransposeNd.apply(xin, weight, bias, geom)
    return _reshape(out, tuple(out.shape[1:])) if unbatched else out


def conv1d(
    input: Any,  # noqa: A002 - torch's name
    weight: Any,
    bias: Any = None,
    stride: Union[int, tuple] = 1,
    padding: Union[int, tuple, str] = 0,
    dilation: Union[int, tuple] = 1,
    groups: int = 1,
) -> Tensor:
    """1-D cross-correlation, as ``torch.nn.functional.conv1d`` (conv2d's kernels at height 1).

    Args:
        input: (N, C_in, L), or (C_in, L) unbatched.
        weight: (C_out, C_in / groups, k).
        bias: (C_out,) or None.
        stride, padding, dilation: an int or a 1-tuple; padding also ``'valid'`` (none) or
            ``'same'`` (stride 1 only; an odd total pads one more at the end).
        groups: blocked connections from input to output channels.

    Returns:
        (N, C_out, L_out), or (C_out, L_out) for unbatched input.

    Raises:
        RuntimeError: wrong ranks, channel counts that do not match ``weight``/``groups``, a
            kernel larger than the padded input, a bad padding string, negative padding,
            non-positive stride/dilation/groups, mixed dtypes or devices.
        TypeError: a non-integer size.

    Example:
        >>> import mpitensor as mt
        >>> conv1d(mt.ones(2, 3, 10), mt.ones(4, 3, 3), padding="same").shape
        mpitensor.Size([2, 4, 10])
    """
    return _conv_nd("conv1d", 1, input, weight, bias, stride, padding, dilation, groups)


def conv_tbc(input: Any, weight: Any, bias: Any, pad: int = 0) -> Tensor:  # noqa: A002
    """A 1-D convolution in (time, batch, channels) layout: ``input`` (T, B, C_in),
    ``weight`` (K, C_in, C_out), ``bias`` (C_out,), ``pad`` zeros at both ends of time;
    returns (T + 2 pad - K + 1, B, C_out).

    Raises:
        RuntimeError: ranks or sizes that do not fit.

    Example:
        >>> import mpitensor as mt
        >>> conv_tbc(mt.ones(5, 2, 3), mt.ones(2, 3, 4), mt.zeros(4)).shape
        mpitensor.Size([4, 2, 4])
    """
    fname = "conv_tbc"
    x, w, b = (_tensor_arg(v, n, fname) for v, n in ((input, "input"), (weight, "weight"),
                                                     (bias, "bias")))
    if x.ndim != 3 or w.ndim != 3 or b.ndim != 1:
        raise RuntimeError(f"{fname}(): expected a 3-D input (T, B, C_in), a 3-D weight "
                           f"(K, C_in, C_out) and a 1-D bias, got {_shape_str(x.shape)}, "
                           f"{_shape_str(w.shape)} and {_shape_str(b.shape)}")
    if x.shape[2] != w.shape[1] or b.shape[0] != w.shape[2]:
        raise RuntimeError(f"{fname}(): input channels {x.shape[2]} / weight "
                           f"{_shape_str(w.shape)} / bias {_shape_str(b.shape)} do not fit")
    y = conv1d(x.permute(1, 2, 0), w.permute(2, 1, 0), b, padding=int(pad))
    return y.permute(2, 0, 1)


def conv3d(
    input: Any,  # noqa: A002 - torch's name
    weight: Any,
    bias: Any = None,
    stride: Union[int, tuple] = 1,
    padding: Union[int, tuple, str] = 0,
    dilation: Union[int, tuple] = 1,
    groups: int = 1,
) -> Tensor:
    """3-D cross-correlation, as ``torch.nn.functional.conv3d``: im2col + one product a group.

    Args:
        input: (N, C_in, D, H, W), or (C_in, D, H, W) unbatched.
        weight: (C_out, C_in / groups, kD, kH, kW).
        bias: (C_out,) or None.
        stride, padding, dilation: an int or a 3-tuple; padding also ``'valid'`` or ``'same'``
            (stride 1 only).
        groups: blocked connections from input to output channels.

    Returns:
        (N, C_out, D_out, H_out, W_out), or without N for unbatched input.

    Raises:
        RuntimeError, TypeError: as :func:`conv1d`.

    Example:
        >>> import mpitensor as mt
        >>> conv3d(mt.ones(1, 2, 4, 4, 4), mt.ones(3, 2, 3, 3, 3)).shape
        mpitensor.Size([1, 3, 2, 2, 2])
    """
    return _conv_nd("conv3d", 3, input, weight, bias, stride, padding, dilation, groups)


def conv_transpose1d(
    input: Any,  # noqa: A002 - torch's name
    weight: Any,
    bias: Any = None,
    stride: Union[int, tuple] = 1,
    padding: Union[int, tuple] = 0,
    output_padding: Union[int, tuple] = 0,
    groups: int = 1,
    dilation: Union[int, tuple] = 1,
) -> Tensor:
    """1-D transposed convolution, as ``torch.nn.functional.conv_transpose1d``: the input
    gradient of :func:`conv1d` with the same weight and geometry.

    Args:
        input: (N, C_in, L), or (C_in, L) unbatched.
        weight: (C_in, C_out / groups, k).
        bias: (C_out,) or None.
        stride, padding, dilation: an int or a 1-tuple; ``padding`` positions are cut from
            each end of the output (the padding of the convolution this is the adjoint of).
        output_padding: extra size added to one side of the output (smaller than the stride
            or the dilation).
        groups: blocked connections from input to output channels.

    Returns:
        (N, C_out, L_out), L_out = (L - 1) * stride - 2 * padding + dilation * (k - 1)
        + output_padding + 1.

    Raises:
        RuntimeError: as :func:`conv1d`, and an output padding not smaller than the stride or
            the dilation.
        TypeError: a non-integer size, or a padding string.

    Example:
        >>> import mpitensor as mt
        >>> conv_transpose1d(mt.ones(2, 3, 5), mt.ones(3, 4, 4), stride=2, padding=1).shape
        mpitensor.Size([2, 4, 10])
    """
    return _conv_transpose_nd("conv_transpose1d", 1, input, weight, bias, stride, padding,
                              output_padding, groups, dilation)


def conv_transpose2d(
    input: Any,  # noqa: A002 - torch's name
    weight: Any,
    bias: Any = None,
    stride: Union[int, tuple] = 1,
    padding: Union[int, tuple] = 0,
    output_padding: Union[int, tuple] = 0,
    groups: int = 1,
    dilation: Union[int, tuple] = 1,
) -> Tensor:
    """2-D transposed convolution, as ``torch.nn.functional.conv_transpose2d`` (conv2d's
    input gradient: col2im of one product per group).

    Args:
        input: (N, C_in, H, W), or (C_in, H, W) unbatched.
        weight: (C_in, C_out / groups, kH, kW).
        bias, stride, padding, output_padding, groups, dilation: as :func:`conv_transpose1d`,
            with pairs.

    Returns:
        (N, C_out, H_out, W_out), sizes as :func:`conv_transpose1d`'s per dimension; laid out
        (C, H, W, N) in memory like :func:`conv2d`'s output.

    Raises:
        RuntimeError, TypeError: as :func:`conv_transpose1d`.

    Example:
        >>> import mpitensor as mt
        >>> conv_transpose2d(mt.ones(1, 8, 4, 4), mt.ones(8, 3, 4, 4), stride=2, padding=1).shape
        mpitensor.Size([1, 3, 8, 8])
    """
    return _conv_transpose_nd("conv_transpose2d", 2, input, weight, bias, stride, padding,
                              output_padding, groups, dilation)


def conv_transpose3d(
    input: Any,  # noqa: A002 - torch's name
    weight: Any,
    bias: Any = None,
    stride: Union[int, tuple] = 1,
    padding: Union[int, tuple] = 0,
    output_padding: Union[int, tuple] = 0,
    groups: int = 1,
    dilation: Union[int, tuple] = 1,
) -> Tensor:
    """3-D transposed convolution, as ``torch.nn.functional.conv_transpose3d``.

    Args:
        input: (N, C_in, D, H, W), or (C_in, D, H, W) unbatched.
        weight: (C_in, C_out / groups, kD, kH, kW).
        bias, stride, padding, output_padding, groups, dilation: as :func:`conv_transpose1d`,
            with triples.

    Returns:
        (N, C_out, D_out, H_out, W_out), sizes as :func:`conv_transpose1d`'s per dimension.

    Raises:
        RuntimeError, TypeError: as :func:`conv_transpose1d`.

    Example:
        >>> import mpitensor as mt
        >>> conv_transpose3d(mt.ones(1, 2, 2, 2, 2), mt.ones(2, 1, 3, 3, 3)).shape
        mpitensor.Size([1, 1, 4, 4, 4])
    """
    return _conv_transpose_nd("conv_transpose3d", 3, input, weight, bias, stride, padding,
                              output_padding, groups, dilation)


# --------------------------------------------------------------------------------------------
# pooling


class _MaxPool2x2(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, oh: int, ow: int, holder: Optional[list]) -> Any:
        out, code = K.maxpool2x2_forward(x, oh, ow)
        ctx.save_for_backward(code)
        ctx.xshape = x.shape
        if holder is not None:
            holder.append(code)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (code,) = ctx.saved_tensors
        return K.maxpool2x2_backward(g, code, ctx.xshape).transpose(3, 0, 1, 2), None, None, None


class _MaxPoolGeneric(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, k: tuple, s: tuple, p: tuple, d: tuple, out_hw: tuple,
                holder: Optional[list]) -> Any:
        out, idx, hpwp = K.maxpool_generic_forward(x, k, s, p, d, out_hw)
        ctx.save_for_backward(idx)
        ctx.xshape, ctx.p, ctx.hpwp = x.shape, p, hpwp
        if holder is not None:
            holder.append((idx, hpwp))
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (idx,) = ctx.saved_tensors
        gin = K.scatter_to_input(g.transpose(1, 0, 2, 3), idx, ctx.xshape, ctx.p, ctx.hpwp)
        return (gin.transpose(1, 0, 2, 3),) + (None,) * 6


def _pool_args(fname: str, input: Any, kernel_size: Any, stride: Any, padding: Any,  # noqa: A002
               dilation: Any) -> tuple:
    _as_input(input, "input", fname)
    x = _arr(input)
    if x.ndim not in (3, 4):
        raise RuntimeError(
            f"{fname}(): Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size "
            f"for input, but got: {_shape_str(x.shape)}"
        )
    k = _pair(kernel_size, "kernel_size", fname, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
        else _pair(stride, "stride", fname, 1)
    p = _pair(padding, "padding", fname, 0)
    d = _pair(dilation, "dilation", fname, 1)
    for i in range(2):
        if p[i] > (d[i] * (k[i] - 1) + 1) // 2:
            raise RuntimeError(
                f"{fname}(): pad should be at most half of effective kernel size, but got "
                f"pad={p[i]}, kernel_size={k[i]} and dilation={d[i]}"
            )
    return x, k, s, p, d


def max_pool2d(
    input: Any,  # noqa: A002 - torch's name
    kernel_size: _IntOrPair,
    stride: Optional[_IntOrPair] = None,
    padding: _IntOrPair = 0,
    dilation: _IntOrPair = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Any:
    """2-D max pooling, as ``torch.nn.functional.max_pool2d``.

    The gradient of a window goes to its first maximum (row-major order) on ties, as in torch.
    2x2/stride-2 pooling (any input size) takes a reshape-view fast path; every other geometry
    a strided-window path. No Python loop runs over the batch or the window.

    Args:
        input: (N, C, H, W) or (C, H, W).
        kernel_size: int or (kH, kW).
        stride: int or pair; default ``kernel_size``.
        padding: implicit -inf padding on both sides (at most half the kernel).
        dilation: spacing of window elements.
        ceil_mode: use ceil instead of floor for the output size.
        return_indices: also return the argmax indices (flat ``h * W + w`` per plane, int64).

    Returns:
        The pooled tensor (C-contiguous NCHW), and the indices when asked.

    Raises:
        RuntimeError: wrong input rank, padding larger than half the kernel, an empty output.

    Example:
        >>> import mpitensor as mt
        >>> max_pool2d(mt.arange(16.0).reshape(1, 1, 4, 4), 2)
        tensor([[[[ 5.,  7.],
                  [13., 15.]]]])
    """
    x, k, s, p, d = _pool_args("max_pool2d", input, kernel_size, stride, padding, dilation)
    unbatched = x.ndim == 3
    xshape = (1, *x.shape) if unbatched else tuple(x.shape)
    H, W = xshape[2], xshape[3]
    oh = K.pool_out_size(H, k[0], s[0], p[0], d[0], bool(ceil_mode))
    ow = K.pool_out_size(W, k[1], s[1], p[1], d[1], bool(ceil_mode))
    if oh < 1 or ow < 1:
        raise RuntimeError(
            f"max_pool2d(): Given input size: ({xshape[1]}x{H}x{W}). Calculated output size: "
            f"({xshape[1]}x{oh}x{ow}). Output size is too small"
        )
    xin = _reshape(input, xshape) if unbatched else input
    holder: Optional[list] = [] if return_indices else None
    fast = k == (2, 2) and s == (2, 2) and p == (0, 0) and d == (1, 1) \
        and 2 * oh <= H and 2 * ow <= W
    if fast:
        out = _MaxPool2x2.apply(xin, oh, ow, holder)
    else:
        out = _MaxPoolGeneric.apply(xin, k, s, p, d, (oh, ow), holder)
    if unbatched:
        out = _reshape(out, tuple(out.shape[1:]))
    if not return_indices:
        return out
    xp = K.xp_of(x)
    if fast:
        code = holder[0].astype(xp.int64)  # (C, oh, ow, N)
        hh = (xp.arange(oh, dtype=xp.int64) * 2).reshape(1, oh, 1, 1) + code // 2
        ww = (xp.arange(ow, dtype=xp.int64) * 2).reshape(1, 1, ow, 1) + code % 2
        ind = (hh * W + ww).transpose(3, 0, 1, 2)
    else:
        idx, hpwp = holder[0]
        ind = K.indices_from_flat(idx, hpwp, p, W)
    ind = xp.ascontiguousarray(ind)
    if unbatched:
        ind = ind[0]
    return out, _new(ind)


def max_pool2d_with_indices(input: Any, kernel_size: _IntOrPair,  # noqa: A002 - torch's name
                            stride: Optional[_IntOrPair] = None, padding: _IntOrPair = 0,
                            dilation: _IntOrPair = 1, ceil_mode: bool = False,
                            return_indices: bool = False) -> tuple:
    """:func:`max_pool2d` that returns ``(output, indices)``."""
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


class _AvgPool2d(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, k: tuple, s: tuple, p: tuple, out_hw: tuple,
                count_include_pad: bool, divisor_override: Optional[int]) -> Any:
        xp = K.xp_of(x)
        d = (1, 1)
        win, hpwp = K.pool_windows(x, k, s, p, d, out_hw, 0)
        total = win.sum(axis=-1)
        N, C, H, W = x.shape
        if divisor_override:
            div = xp.asarray(float(divisor_override), dtype=x.dtype)
        else:
            # torch: windows are clipped to the padded input; without count_include_pad, to
            # the input itself.
            oh, ow = out_hw
            hs = np.arange(oh) * s[0] - p[0]
            ws = np.arange(ow) * s[1] - p[1]
            if count_include_pad:
                he = np.minimum(hs + k[0], H + p[0])
                we = np.minimum(ws + k[1], W + p[1])
                cnt = np.outer(he - hs, we - ws)
            else:
                he = np.minimum(hs + k[0], H)
                we = np.minimum(ws + k[1], W)
                cnt = np.outer(he - np.maximum(hs, 0), we - np.maximum(ws, 0))
            div = xp.asarray(cnt.astype(x.dtype))
        ctx.div, ctx.k, ctx.s, ctx.p, ctx.hpwp, ctx.xshape = div, k, s, p, hpwp, x.shape
        return xp.ascontiguousarray((total / div).astype(x.dtype, copy=False)
                                    .transpose(1, 0, 2, 3))

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        xp = K.xp_of(g)
        gc = g.transpose(1, 0, 2, 3) / ctx.div  # (C, N, OH, OW)
        kk = ctx.k[0] * ctx.k[1]
        C, N, oh, ow = gc.shape
        taps = xp.arange(kk, dtype=xp.int64).reshape(1, 1, 1, 1, kk)
        base = K.window_flat_index((C, N, oh, ow), ctx.k, ctx.s, (1, 1), ctx.hpwp,
                                   xp.zeros((1, 1, 1, 1), dtype=xp.int64), xp)
        wp = ctx.hpwp[1]
        offs = (taps // ctx.k[1]) * wp + taps % ctx.k[1]
        idx = base[..., None] + offs
        vals = xp.broadcast_to(gc[..., None], idx.shape)
        gin = K.scatter_to_input(vals.astype(g.dtype), idx, ctx.xshape, ctx.p, ctx.hpwp)
        return (gin.transpose(1, 0, 2, 3),) + (None,) * 6


def avg_pool2d(
    input: Any,  # noqa: A002 - torch's name
    kernel_size: _IntOrPair,
    stride: Optional[_IntOrPair] = None,
    padding: _IntOrPair = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Optional[int] = None,
) -> Tensor:
    """2-D average pooling, as ``torch.nn.functional.avg_pool2d``.

    Args:
        input: (N, C, H, W) or (C, H, W).
        kernel_size, stride, padding, ceil_mode: as in :func:`max_pool2d` (zero padding).
        count_include_pad: count padded zeros in the divisor.
        divisor_override: use this divisor instead of the window size.

    Returns:
        The pooled tensor (C-contiguous NCHW).

    Raises:
        RuntimeError: wrong input rank, padding larger than half the kernel, empty output.

    Example:
        >>> import mpitensor as mt
        >>> avg_pool2d(mt.arange(16.0).reshape(1, 1, 4, 4), 2)
        tensor([[[[ 2.5000,  4.5000],
                  [10.5000, 12.5000]]]])
    """
    x, k, s, p, d = _pool_args("avg_pool2d", input, kernel_size, stride, padding, 1)
    _check_float(input, "input", "avg_pool2d")
    if divisor_override is not None and (isinstance(divisor_override, bool) or
                                         int(divisor_override) <= 0):
        raise ValueError(f"avg_pool2d(): divisor must be not zero, got {divisor_override!r}")
    unbatched = x.ndim == 3
    xshape = (1, *x.shape) if unbatched else tuple(x.shape)
    H, W = xshape[2], xshape[3]
    oh = K.pool_out_size(H, k[0], s[0], p[0], 1, bool(ceil_mode))
    ow = K.pool_out_size(W, k[1], s[1], p[1], 1, bool(ceil_mode))
    if oh < 1 or ow < 1:
        raise RuntimeError(
            f"avg_pool2d(): Given input size: ({xshape[1]}x{H}x{W}). Calculated output size: "
            f"({xshape[1]}x{oh}x{ow}). Output size is too small"
        )
    xin = _reshape(input, xshape) if unbatched else input
    out = _AvgPool2d.apply(xin, k, s, p, (oh, ow), bool(count_include_pad), divisor_override)
    return _reshape(out, tuple(out.shape[1:])) if unbatched else out


# --------------------------------------------------------------------------------------------
# adaptive average pooling


@_half.computes_in_float32  # half inputs: float32 averages, one rounding, as torch
class _AdaptiveAvgPool2d(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, oh: int, ow: int) -> Any:
        ctx.xshape = x.shape
        ctx.batch_innermost = NK._batch_innermost(x)
        return NK.adaptive_avg_pool2d_forward(x, oh, ow)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        return NK.adaptive_avg_pool2d_backward(g, ctx.xshape, ctx.batch_innermost), None, None


def _adaptive_size(output_size: Any, dims: int, fname: str) -> tuple:
    """``output_size`` as a tuple of ``dims`` entries, each a non-negative int or None."""
    sizes = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * dims
    if len(sizes) != dims:
        raise ValueError(
            f"{fname}(): output_size must be an int, None or a tuple of {dims}, got "
            f"{output_size!r}"
        )
    for s in sizes:
        if s is None:
            continue
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(
                f"{fname}(): output_size entries must be ints or None, got {output_size!r}"
            )
        if s < 0:
            raise ValueError(
                f"{fname}(): output_size entries must be >= 0, got {output_size!r}"
            )
    return tuple(None if s is None else int(s) for s in sizes)


def adaptive_avg_pool2d(input: Any, output_size: Any) -> Tensor:  # noqa: A002 - torch's name
    """2-D adaptive average pooling: average ``input`` over a grid of ``output_size`` bins.

    Output cell ``i`` along a dimension of size ``n`` pooled to ``m`` averages positions
    ``floor(i * n / m)`` to ``ceil((i + 1) * n / m) - 1``, as torch does: bins overlap when
    ``m`` does not divide ``n``.

    Args:
        input: (N, C, H, W) or (C, H, W).
        output_size: an int (square output), or a pair whose entries are ints or None
            (None keeps the input's size along that dimension).

    Returns:
        The pooled tensor, C-contiguous (N, C, oh, ow) (or (C, oh, ow)).

    Raises:
        RuntimeError: an input that is not 3-D or 4-D, or has an empty non-batch dimension.
        ValueError: a negative output size or a tuple of the wrong length.
        TypeError: an output size that is neither an int nor None.

    Example:
        >>> import mpitensor as mt
        >>> adaptive_avg_pool2d(mt.arange(16.0).reshape(1, 1, 4, 4), 1)
        tensor([[[[7.5000]]]])
    """
    _as_input(input, "input", "adaptive_avg_pool2d")
    x = _arr(input)
    sizes = _adaptive_size(output_size, 2, "adaptive_avg_pool2d")
    if x.ndim not in (3, 4):
        raise RuntimeError(
            f"adaptive_avg_pool2d(): expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got "
            f"shape {_shape_str(x.shape)}"
        )
    _check_float(input, "input", "adaptive_avg_pool2d")
    for d in range(x.ndim - 3, x.ndim):
        if x.shape[d] == 0:
            raise RuntimeError(
                f"adaptive_avg_pool2d(): input of shape {_shape_str(x.shape)} has an empty "
                f"dimension {d}; only the batch dimension may be empty"
            )
    H, W = x.shape[-2], x.shape[-1]
    oh = H if sizes[0] is None else sizes[0]
    ow = W if sizes[1] is None else sizes[1]
    unbatched = x.ndim == 3
    xin = _reshape(input, (1, *x.shape)) if unbatched else input
    out = _AdaptiveAvgPool2d.apply(xin, oh, ow)
    return _reshape(out, tuple(out.shape[1:])) if unbatched else out


def adaptive_avg_pool1d(input: Any, output_size: Any) -> Tensor:  # noqa: A002 - torch's name
    """1-D adaptive average pooling over the last dimension (bins as :func:`adaptive_avg_pool2d`).

    Args:
        input: (N, C, L) or (C, L).
        output_size: an int (or a 1-tuple holding one).

    Returns:
        The pooled tensor (N, C, output_size) (or (C, output_size)).

    Raises:
        RuntimeError: an input that is not 2-D or 3-D, or has an empty non-batch dimension.
        ValueError, TypeError: a bad output size.

    Example:
        >>> import mpitensor as mt
        >>> adaptive_avg_pool1d(mt.tensor([[[1.0, 2.0, 3.0, 4.0]]]), 2)
        tensor([[[1.5000, 3.5000]]])
    """
    _as_input(input, "input", "adaptive_avg_pool1d")
    x = _arr(input)
    (size,) = _adaptive_size(output_size, 1, "adaptive_avg_pool1d")
    if size is None:
        raise TypeError("adaptive_avg_pool1d(): output_size must be an int, got None")
    if x.ndim not in (2, 3):
        raise RuntimeError(
            f"adaptive_avg_pool1d(): expected a 2-D (C, L) or 3-D (N, C, L) input, got "
            f"shape {_shape_str(x.shape)}"
        )
    t = _reshape(input, (*x.shape[:-1], 1, x.shape[-1]))  # a height of 1: the 2-D pool
    out = adaptive_avg_pool2d(t, (1, size))
    return _reshape(out, (*x.shape[:-1], size))


# --------------------------------------------------------------------------------------------
# normalisation


def _check_per_channel(fname: str, what: str, v: Any, C: int, xshape: tuple) -> None:
    _as_input(v, what, fname)
    if tuple(_arr(v).shape) != (C,):
        raise RuntimeError(
            f"{fname}(): {what} must hold one value per channel, i.e. have shape [{C}] for an "
            f"input of shape {_shape_str(xshape)}; got shape {_shape_str(_arr(v).shape)}"
        )


class _BatchNorm(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, rm: Any, rv: Any, training: bool,
                momentum: float, eps: float) -> Any:
        xp = K.xp_of(x)
        lay = NK.channel_layout(x)
        x3 = lay.view(x)
        y, y3 = lay.empty(xp, x.dtype)
        if training:
            mean, invstd, var = NK.batch_norm_train(x3, y3, w, b, eps)
            NK.update_running_stats(rm, rv, mean, var, lay.A * lay.B, momentum)
        else:
            mean = rm.copy()  # the buffer may change in place before backward runs
            invstd = NK.batch_norm_eval(x3, y3, rm, rv, w, b, eps)
        ctx.save_for_backward(x3, mean, invstd, w)
        ctx.layout, ctx.training = lay, training
        return y

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x3, mean, invstd, w = ctx.saved_tensors
        lay = ctx.layout
        need = ctx.needs_input_grad
        dx = dx3 = None
        if need[0]:
            dx, dx3 = lay.empty(K.xp_of(g), g.dtype)
        _, dw, db = NK.batch_norm_backward(lay.view(g), x3, mean, invstd, w, ctx.training,
                                           (need[0], need[1], need[2]), dx3)
        return dx, dw, db, None, None, None, None, None


def batch_norm(
    input: Any,  # noqa: A002 - torch's name
    running_mean: Any,
    running_var: Any,
    weight: Any = None,
    bias: Any = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Batch normalisation over every dimension but the channels (dimension 1).

    With ``training=True`` the batch's own mean and biased variance normalise it, and the
    running statistics given (if any) are updated in place:
    ``running = (1 - momentum) * running + momentum * batch`` (the variance unbiased, as in
    torch). With ``training=False`` the running statistics normalise it. The output keeps the
    input's memory layout (conv2d's batch-innermost one included).

    Args:
        input: (N, C, *) floating point.
        running_mean, running_var: (C,) tensors (updated in training), or None.
        weight, bias: optional (C,) affine parameters.
        training: use (and track) the batch's statistics.
        momentum: the weight of the batch in the running update.
        eps: added to the variance for stability.

    Returns:
        The normalised tensor, shaped and laid out like ``input``.

    Raises:
        ValueError: an input of fewer than 2 dimensions, or one value per channel in
            training (no variance to take).
        RuntimeError: per-channel tensors of the wrong size, mixed dtypes or devices, or
            evaluation without running statistics.

    Example:
        >>> import mpitensor as mt
        >>> batch_norm(mt.tensor([[1.0], [3.0]]), None, None, training=True)
        tensor([[-1.0000],
                [ 1.0000]])
    """
    fname = "batch_norm"
    _as_input(input, "input", fname)
    x = _arr(input)
    if x.ndim < 2:
        raise ValueError(
            f"{fname}(): input must have at least 2 dimensions (N, C, ...), got shape "
            f"{_shape_str(x.shape)}"
        )
    _check_float(input, "input", fname)
    C = x.shape[1]
    extras = {"weight": weight, "bias": bias, "running_mean": running_mean,
              "running_var": running_var}
    for name, v in extras.items():
        if v is not None:
            _check_per_channel(fname, name, v, C, x.shape)
    if _half_with_float_params(input, *extras.values()):
        return batch_norm(input.float(), running_mean, running_var, weight, bias, training,
                          momentum, eps).to(input.dtype)
    _check_same_dtype(fname, input=input, **extras)
    _check_same_device(fname, input=input, **extras)
    if not training and (running_mean is None or running_var is None):
        raise RuntimeError(
            f"{fname}(): evaluation (training=False) normalises with running_mean and "
            f"running_var, but {'running_mean' if running_mean is None else 'running_var'} "
            f"is None; pass both, or use training=True for the batch's own statistics"
        )
    if training and x.size == C:
        raise ValueError(
            f"{fname}(): training needs more than 1 value per channel to take a variance, but "
            f"the input has shape {_shape_str(x.shape)}; use a bigger batch or eval mode"
        )
    if x.size == 0:  # nothing to normalise, no statistics to take (torch leaves them alone)
        return (input if isinstance(input, Tensor) else _new(input)) * 1
    rm = _arr(running_mean) if running_mean is not None else None
    rv = _arr(running_var) if running_var is not None else None
    return _BatchNorm.apply(input, weight, bias, rm, rv, bool(training), float(momentum),
                            float(eps))


def instance_norm(
    input: Any,  # noqa: A002 - torch's name
    running_mean: Any = None,
    running_var: Any = None,
    weight: Any = None,
    bias: Any = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalise each (sample, channel) plane of (N, C, ...) by its own mean and variance.

    It is :func:`batch_norm` over the input seen as one sample of N*C channels; the running
    statistics (when given and ``use_input_stats``) move toward the batch's average of the
    per-plane statistics, updated in place.

    Args:
        running_mean, running_var: optional (C,) running statistics.
        weight, bias: optional (C,) affine parameters.
        use_input_stats: normalise with the planes' own statistics (else the running ones).
        momentum: the weight of this batch in the running statistics.
        eps: added to the variance.

    Raises:
        ValueError: an input of fewer than 2 dimensions, or a single value per plane.

    Example:
        >>> import mpitensor as mt
        >>> instance_norm(mt.randn(2, 3, 5)).shape
        mpitensor.Size([2, 3, 5])
    """
    fname = "instance_norm"
    _as_input(input, "input", fname)
    t = input if isinstance(input, Tensor) else _new(input)
    if t.ndim < 2:
        raise ValueError(f"{fname}(): input must have at least 2 dimensions (N, C, ...), got "
                         f"shape {_shape_str(t.shape)}")
    if use_input_stats and math.prod(t.shape[2:]) == 1:
        raise ValueError(f"{fname}(): normalising with the input's statistics needs more than "
                         f"one spatial element per plane, got shape {_shape_str(t.shape)}")
    n, c = t.shape[0], t.shape[1]
    for name, v in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                    ("running_var", running_var)):
        if v is not None:
            _check_per_channel(fname, name, v, c, t.shape)
    xp = K.xp_of(t._data)

    def tiled(v: Any) -> Any:
        if v is None:
            return None
        return v.repeat(n) if isinstance(v, Tensor) else _new(xp.tile(_arr(v), n))

    rm, rv = tiled(running_mean), tiled(running_var)
    out = batch_norm(t.reshape((1, n * c, *t.shape[2:])), rm, rv, tiled(weight), tiled(bias),
                     bool(use_input_stats), momentum, eps)
    if use_input_stats:
        for buf, rep in ((running_mean, rm), (running_var, rv)):
            if buf is not None:
                _arr(buf)[...] = rep._data.reshape(n, c).mean(axis=0)
    return out.reshape(tuple(t.shape))


class _GroupNorm(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, groups: int, eps: float) -> Any:
        y, x2, lay, mean, invstd = NK.group_norm_forward(x, groups, w, b, eps)
        ctx.save_for_backward(x2, mean, invstd, w)
        ctx.groups, ctx.layout = groups, lay
        return y

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x2, mean, invstd, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = NK.group_norm_backward(g, x2, ctx.layout, ctx.groups, mean, invstd, w,
                                            (need[0], need[1], need[2]))
        return dx, dw, db, None, None


@_autocast.op("group_norm")
def group_norm(
    input: Any,  # noqa: A002 - torch's name
    num_groups: int,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
) -> Tensor:
    """Group normalisation: each sample's channels, in ``num_groups`` groups, normalised apart.

    Every (sample, group) pair is normalised by the mean and biased variance of its
    ``C / num_groups`` channels over all positions; then a per-channel affine map applies.

    Args:
        input: (N, C, *) floating point.
        num_groups: groups to split the C channels into (must divide C).
        weight, bias: optional (C,) affine parameters.
        eps: added to the variance for stability.

    Returns:
        The normalised tensor, shaped like ``input``.

    Raises:
        ValueError: an input of fewer than 2 dimensions, or num_groups not a positive int.
        RuntimeError: C not divisible by num_groups, parameters of the wrong size, mixed
            dtypes or devices.

    Example:
        >>> import mpitensor as mt
        >>> group_norm(mt.tensor([[1.0, 3.0]]), 1)
        tensor([[-1.0000,  1.0000]])
    """
    fname = "group_norm"
    _as_input(input, "input", fname)
    x = _arr(input)
    if isinstance(num_groups, bool) or not isinstance(num_groups, numbers.Integral) \
            or num_groups <= 0:
        raise ValueError(f"{fname}(): num_groups must be a positive int, got {num_groups!r}")
    if x.ndim < 2:
        raise ValueError(
            f"{fname}(): input must have at least 2 dimensions (N, C, ...), got shape "
            f"{_shape_str(x.shape)}"
        )
    _check_float(input, "input", fname)
    C = x.shape[1]
    if C % num_groups:
        raise RuntimeError(
            f"{fname}(): the {C} channels of input {_shape_str(x.shape)} cannot be split into "
            f"num_groups={num_groups} equal groups; use a divisor of {C}"
        )
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None:
            _check_per_channel(fname, name, v, C, x.shape)
    if _half_with_float_params(input, weight, bias):
        return group_norm(input.float(), num_groups, weight, bias, eps).to(input.dtype)
    _check_same_dtype(fname, input=input, weight=weight, bias=bias)
    _check_same_device(fname, input=input, weight=weight, bias=bias)
    if x.size == 0:
        return (input if isinstance(input, Tensor) else _new(input)) * 1
    return _GroupNorm.apply(input, weight, bias, int(num_groups), float(eps))


class _LayerNorm(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, b: Any, k: int, eps: float) -> Any:
        x2 = K.xp_of(x).ascontiguousarray(x).reshape(-1, math.prod(x.shape[x.ndim - k:]))
        wf = w.reshape(-1) if w is not None else None
        bf = b.reshape(-1) if b is not None else None
        y2, mean, invstd = NK.layer_norm_forward(x2, wf, bf, eps)
        ctx.save_for_backward(x2, mean, invstd, wf)
        ctx.xshape = x.shape
        ctx.pshape = None if w is None and b is None else (w if w is not None else b).shape
        return y2.reshape(x.shape)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x2, mean, invstd, wf = ctx.saved_tensors
        need = ctx.needs_input_grad
        g2 = K.xp_of(g).ascontiguousarray(g).reshape(x2.shape)
        dx, dw, db = NK.layer_norm_backward(g2, x2, mean, invstd, wf,
                                            (need[0], need[1], need[2]))
        dx = dx.reshape(ctx.xshape) if dx is not None else None
        dw = dw.reshape(ctx.pshape) if dw is not None else None
        db = db.reshape(ctx.pshape) if db is not None else None
        return dx, dw, db, None, None


def _normalized_shape(normalized_shape: Any, fname: str) -> tuple:
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) \
        else normalized_shape
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(
            f"{fname}(): normalized_shape must be an int or a sequence of ints, got "
            f"{normalized_shape!r}"
        ) from None
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in shape):
        raise TypeError(
            f"{fname}(): normalized_shape must be an int or a sequence of ints, got "
            f"{normalized_shape!r}"
        )
    if not shape or any(s <= 0 for s in shape):
        raise ValueError(
            f"{fname}(): normalized_shape must hold at least one dimension, each > 0, got "
            f"{normalized_shape!r}"
        )
    return tuple(int(s) for s in shape)


@_autocast.op("layer_norm")
def layer_norm(
    input: Any,  # noqa: A002 - torch's name
    normalized_shape: Any,
    weight: Any = None,
    bias: Any = None,
    eps: float = 1e-5,
) -> Tensor:
    """Layer normalisation over the last ``len(normalized_shape)`` dimensions.

    Each slice over those dimensions is normalised by its mean and biased variance; then an
    elementwise affine map (``weight``, ``bias`` shaped ``normalized_shape``) applies.

    Args:
        input: (*, *normalized_shape) floating point.
        normalized_shape: an int or a sequence of ints: the trailing shape to normalise.
        weight, bias: optional tensors of shape ``normalized_shape``.
        eps: added to the variance for stability.

    Returns:
        The normalised tensor, shaped like ``input``.

    Raises:
        TypeError, ValueError: a malformed normalized_shape.
        RuntimeError: an input whose trailing shape is not normalized_shape, parameters of
            the wrong shape, mixed dtypes or devices.

    Example:
        >>> import mpitensor as mt
        >>> layer_norm(mt.tensor([[1.0, 3.0]]), 2)
        tensor([[-1.0000,  1.0000]])
    """
    fname = "layer_norm"
    _as_input(input, "input", fname)
    shape = _normalized_shape(normalized_shape, fname)
    x = _arr(input)
    k = len(shape)
    if x.ndim < k or tuple(x.shape[x.ndim - k:]) != shape:
        raise RuntimeError(
            f"{fname}(): normalized_shape={list(shape)} must be the input's trailing shape, "
            f"i.e. the input must be [*, {', '.join(map(str, shape))}], but it is "
            f"{_shape_str(x.shape)}"
        )
    _check_float(input, "input", fname)
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None:
            _as_input(v, name, fname)
            if tuple(_arr(v).shape) != shape:
                raise RuntimeError(
                    f"{fname}(): {name} must have shape normalized_shape={list(shape)}, got "
                    f"{_shape_str(_arr(v).shape)}"
                )
    if _half_with_float_params(input, weight, bias):
        return layer_norm(input.float(), normalized_shape, weight, bias, eps).to(input.dtype)
    _check_same_dtype(fname, input=input, weight=weight, bias=bias)
    _check_same_device(fname, input=input, weight=weight, bias=bias)
    if x.size == 0:
        return (input if isinstance(input, Tensor) else _new(input)) * 1
    return _LayerNorm.apply(input, weight, bias, k, float(eps))


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
# losses


_REDUCTIONS = ("mean", "sum", "none")


def _reduction(reduction: str, size_average: Any, reduce: Any, fname: str) -> str:
    if size_average is not None or reduce is not None:
        warnings.warn(
            "size_average and reduce args will be deprecated, please use reduction='"
            f"{'sum' if size_average is False else 'mean'}' instead.", UserWarning, stacklevel=3,
        )
        sa = True if size_average is None else bool(size_average)
        rd = True if reduce is None else bool(reduce)
        reduction = "none" if not rd else ("mean" if sa else "sum")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{fname}(): {reduction} is not a valid value for reduction; use one of "
                         f"{_REDUCTIONS}")
    return reduction


def _to_rows(x: Any) -> Any:
    """(N, C, d1, ...) -> (N*d1*..., C) with the class axis last; (C,) -> (1, C)."""
    if x.ndim == 1:
        return x.reshape(1, -1)
    if x.ndim == 2:
        return x
    return K.xp_of(x).moveaxis(x, 1, -1).reshape(-1, x.shape[1])


def _from_rows(g: Any, shape: tuple) -> Any:
    """Inverse of :func:`_to_rows` for a gradient."""
    if len(shape) <= 2:
        return g.reshape(shape)
    xp = K.xp_of(g)
    moved = (shape[0], *shape[2:], shape[1])
    return xp.moveaxis(g.reshape(moved), -1, 1)


def _check_class_target(fname: str, x: Any, t: Any, weight: Any, ignore_index: int) -> None:
    if t.dtype.kind not in "iu":
        raise RuntimeError(
            f"{fname}(): expected target of an integer dtype (class indices), got "
            f"{_dtype_name(t.dtype)}; convert it with target.long()"
        )
    if x.ndim == 1:
        want = ()
    elif x.ndim == 2:
        want = (x.shape[0],)
    else:
        want = (x.shape[0], *x.shape[2:])
    if tuple(t.shape) != want:
        if x.ndim >= 2 and t.ndim >= 1 and t.shape[0] != x.shape[0]:
            raise ValueError(
                f"{fname}(): Expected input batch_size ({x.shape[0]}) to match target "
                f"batch_size ({t.shape[0]})."
            )
        raise RuntimeError(
            f"{fname}(): expected target of shape {_shape_str(want)} for input of shape "
            f"{_shape_str(x.shape)}, got {_shape_str(t.shape)}"
        )
    if x.ndim == 0:
        raise RuntimeError(f"{fname}(): input must have at least 1 dimension (the classes)")
    C = x.shape[0] if x.ndim == 1 else x.shape[1]
    if weight is not None and tuple(_arr(weight).shape) != (C,):
        raise RuntimeError(
            f"{fname}(): weight tensor should be defined either for all {C} classes or no "
            f"classes but got weight tensor of shape: {_shape_str(_arr(weight).shape)}"
        )
    if t.size and (int(t.min()) < 0 or int(t.max()) >= C):
        tt = t[t != ignore_index]
        if tt.size:
            lo, hi = int(tt.min()), int(tt.max())
            if lo < 0 or hi >= C:
                bad = lo if lo < 0 else hi
                raise IndexError(
                    f"{fname}(): Target {bad} is out of bounds: class indices must lie in "
                    f"[0, {C - 1}] (or equal ignore_index={ignore_index})"
                )


def _class_coeffs(x: Any, t: Any, w: Any, ignore_index: int, reduction: str) -> tuple:
    """Per-row target weights for index targets: ``(rows_t, coef, denom, valid)``.

    ``coef[i]`` is the weight of row i's target class (0 where ignored); ``denom`` the
    mean-reduction divisor (sum of coef), or None; ``valid[i]`` whether row i counts.
    """
    xp = K.xp_of(x)
    tf = t.reshape(-1).astype(xp.int64, copy=False)
    valid = tf != ignore_index
    safe = xp.where(valid, tf, 0)
    if w is not None:
        coef = w.astype(x.dtype, copy=False)[safe] * valid
    else:
        coef = valid.astype(x.dtype)
    denom = coef.sum() if reduction == "mean" else None
    return safe, coef, denom, valid


def _mean_div(total: Any, denom: Any) -> Any:
    """``total / denom``; 0/0 (every target ignored) is nan without a warning, as in torch."""
    if isinstance(total, (np.ndarray, np.generic)):
        with np.errstate(invalid="ignore", divide="ignore"):
            return total / denom
    return total / denom


def _mean_row_scale(g: Any, denom: Any, valid: Any) -> Any:
    """Per-row factor of a mean-reduced class loss's gradient: ``g / denom`` where the row's
    target counts, 0 where it is ignored. As in torch, ignored rows get no gradient even when
    every target is ignored (the loss is then 0/0 = nan, but its gradient is 0)."""
    xp = K.xp_of(valid)
    return xp.where(valid, _mean_div(g, denom), xp.zeros((), dtype=g.dtype))


class _NLLLoss(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, w: Any, ignore_index: int, reduction: str) -> Any:
        xp = K.xp_of(x)
        rows = _to_rows(x)
        safe, coef, denom, valid = _class_coeffs(x, t, w, ignore_index, reduction)
        picked = rows[xp.arange(rows.shape[0]), safe]
        losses = -picked * coef
        ctx.safe, ctx.coef, ctx.denom, ctx.reduction = safe, coef, denom, reduction
        ctx.valid = valid
        ctx.xshape, ctx.tshape = x.shape, t.shape
        if reduction == "none":
            return losses.reshape(t.shape)
        total = losses.sum()
        if reduction == "mean":
            total = _mean_div(total, denom)
        return xp.asarray(total, dtype=x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        xp = K.xp_of(g)
        coef = -ctx.coef
        if ctx.reduction == "none":
            coef = coef * g.reshape(-1)
        elif ctx.reduction == "mean":
            coef = coef * _mean_row_scale(g, ctx.denom, ctx.valid)
        else:
            coef = coef * g
        C = 1
        if len(ctx.xshape) >= 1:
            C = ctx.xshape[0] if len(ctx.xshape) == 1 else ctx.xshape[1]
        rows = xp.zeros((coef.shape[0], C), dtype=g.dtype)
        rows[xp.arange(rows.shape[0]), ctx.safe] = coef.astype(g.dtype)  # CuPy lacks put_along_axis
        return _from_rows(rows, ctx.xshape), None, None, None, None


@_autocast.op("nll_loss")
def nll_loss(
    input: Any,  # noqa: A002 - torch's name
    target: Any,
    weight: Any = None,
    size_average: Any = None,
    ignore_index: int = -100,
    reduce: Any = None,
    reduction: str = "mean",
) -> Tensor:
    """Negative log-likelihood of class indices under log-probabilities ``input``.

    Args:
        input: (N, C), (C,) or (N, C, d1, ...) log-probabilities.
        target: integer class indices, (N,), () or (N, d1, ...).
        weight: optional per-class weights (C,).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        ignore_index: target value that contributes neither loss nor gradient.
        reduction: ``'mean'`` (weighted by the targets' class weights), ``'sum'`` or ``'none'``.

    Returns:
        The loss (a 0-d tensor, or per element for ``'none'``).

    Raises:
        RuntimeError: a non-integer target or mismatched shapes.
        IndexError: a target outside ``[0, C)`` that is not ``ignore_index``.

    Example:
        >>> import mpitensor as mt
        >>> nll_loss(mt.tensor([[-1.0, -2.0]]), mt.tensor([1]))
        tensor(2.)
    """
    reduction = _reduction(reduction, size_average, reduce, "nll_loss")
    _as_input(input, "input", "nll_loss")
    target = _as_input(target, "target", "nll_loss")
    _check_float(input, "input", "nll_loss")
    x, t = _arr(input), _arr(target)
    _check_class_target("nll_loss", x, t, weight, ignore_index)
    _check_same_device("nll_loss", input=input, target=target, weight=weight)
    w = _arr(weight) if weight is not None else None
    return _NLLLoss.apply(input, _arr(target), w, int(ignore_index), reduction)


@_half.computes_in_float32
class _CrossEntropy(Function):
    """Fused log_softmax + NLL (index or probability targets, label smoothing, weights)."""

    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, w: Any, ignore_index: int, reduction: str,
                eps: float, prob: bool) -> Any:
        xp = K.xp_of(x)
        rows = _to_rows(x)
        R, C = rows.shape
        lsm = K.log_softmax(rows, 1)
        wv = w.astype(x.dtype, copy=False) if w is not None else None
        if prob:
            tp = _to_rows(t).astype(x.dtype, copy=False)
            if eps:
                tp = tp * (1 - eps) + eps / C
            a = tp * wv if wv is not None else tp  # coefficient of -lsm per (row, class)
            denom = R if reduction == "mean" else None
            valid = None
        else:
            safe, coef, denom, valid = _class_coeffs(x, t, w, ignore_index, reduction)
            a = xp.zeros((R, C), dtype=x.dtype)
            a[xp.arange(R), safe] = (1 - eps) * coef
            if eps:
                sm = (eps / C) * valid.astype(x.dtype)[:, None]
                a += sm * wv if wv is not None else sm
        losses = -(a * lsm).sum(axis=1)
        ctx.save_for_backward(lsm, a)
        ctx.denom, ctx.reduction, ctx.xshape, ctx.tshape = denom, reduction, x.shape, t.shape
        ctx.valid = valid
        if reduction == "none":
            shape = t.shape if not prob else ((x.shape[0], *x.shape[2:]) if x.ndim > 1 else ())
            return losses.reshape(shape)
        total = losses.sum()
        if reduction == "mean":
            total = _mean_div(total, denom)
        return xp.asarray(total, dtype=x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        lsm, a = ctx.saved_tensors
        xp = K.xp_of(lsm)
        if ctx.reduction == "none":
            scale = g.reshape(-1, 1)
        elif ctx.reduction == "mean":
            scale = (g / ctx.denom if ctx.valid is None  # probability targets: denom = rows
                     else _mean_row_scale(g, ctx.denom, ctx.valid)[:, None])
        else:
            scale = g
        # d/dx of -sum_c a_c * lsm_c  =  softmax * sum_c a_c - a
        grad = (xp.exp(lsm) * a.sum(axis=1, keepdims=True) - a) * scale
        return (_from_rows(grad.astype(lsm.dtype, copy=False), ctx.xshape),
                None, None, None, None, None, None)


@_autocast.op("cross_entropy")
def cross_entropy(
    input: Any,  # noqa: A002 - torch's name
    target: Any,
    weight: Any = None,
    size_average: Any = None,
    ignore_index: int = -100,
    reduce: Any = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross entropy between logits ``input`` and ``target`` (log_softmax + NLL, fused).

    Args:
        input: (N, C), (C,) or (N, C, d1, ...) unnormalised logits.
        target: class indices (integer, shaped like :func:`nll_loss`'s target) or class
            probabilities (float, shaped like ``input``).
        weight: optional per-class weights (C,).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        ignore_index: index target that contributes nothing (index targets only).
        reduction: ``'mean'``, ``'sum'`` or ``'none'``, with torch's normalisation.
        label_smoothing: in [0, 1]; mixes the target with the uniform distribution.

    Returns:
        The loss (a 0-d tensor, or per element for ``'none'``).

    Raises:
        RuntimeError: bad target dtype/shape; IndexError: target out of range;
        ValueError: label_smoothing outside [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> round(float(cross_entropy(mt.tensor([[0.0, 0.0]]), mt.tensor([0]))), 4)
        0.6931
    """
    reduction = _reduction(reduction, size_average, reduce, "cross_entropy")
    _as_input(input, "input", "cross_entropy")
    target = _as_input(target, "target", "cross_entropy")
    _check_float(input, "input", "cross_entropy")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(
            f"cross_entropy(): label_smoothing must be between 0.0 and 1.0. Got: "
            f"{label_smoothing}"
        )
    x, t = _arr(input), _arr(target)
    if x.ndim == 0:
        raise RuntimeError("cross_entropy(): input must have at least 1 dimension (the classes)")
    _check_same_device("cross_entropy", input=input, target=target, weight=weight)
    prob = t.dtype.kind == "f"
    if prob:
        if tuple(t.shape) != tuple(x.shape):
            raise RuntimeError(
                f"cross_entropy(): class-probability targets must have the input's shape "
                f"{_shape_str(x.shape)}, got {_shape_str(t.shape)}"
            )
        C = x.shape[0] if x.ndim == 1 else x.shape[1]
        if weight is not None and tuple(_arr(weight).shape) != (C,):
            raise RuntimeError(
                f"cross_entropy(): weight should have shape [{C}], got "
                f"{_shape_str(_arr(weight).shape)}"
            )
    else:
        _check_class_target("cross_entropy", x, t, weight, ignore_index)
    w = _arr(weight) if weight is not None else None
    return _CrossEntropy.apply(input, t, w, int(ignore_index), reduction,
                               float(label_smoothing), prob)


@_half.computes_in_float32
class _MSELoss(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, y: Any, reduction: str) -> Any:
        xp = K.xp_of(x)
        diff = x - y
        ctx.save_for_backward(diff)
        ctx.reduction, ctx.xshape, ctx.yshape = reduction, x.shape, y.shape
        sq = diff * diff
        if reduction == "none":
            return sq
        total = sq.sum()
        if reduction == "mean":
            total = total / sq.size
        return xp.asarray(total, dtype=sq.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (diff,) = ctx.saved_tensors
        scale = g * 2
        if ctx.reduction == "mean":
            scale = scale / diff.size
        gd = diff * scale
        need = ctx.needs_input_grad
        dx = _sum_to(gd, ctx.xshape) if need[0] else None
        dy = -_sum_to(gd, ctx.yshape) if need[1] else None
        return dx, dy, None


@_autocast.op("mse_loss")
def mse_loss(
    input: Any,  # noqa: A002 - torch's name
    target: Any,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
) -> Tensor:
    """Mean squared error ``(input - target) ** 2``, reduced as asked.

    Args:
        input, target: tensors of the same shape (broadcast, with torch's warning, otherwise).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        reduction: ``'mean'``, ``'sum'`` or ``'none'``.

    Returns:
        The loss; gradients flow to both ``input`` and ``target``.

    Raises:
        RuntimeError: shapes that do not broadcast, non-float inputs, mixed devices.

    Example:
        >>> import mpitensor as mt
        >>> mse_loss(mt.tensor([1.0, 3.0]), mt.tensor([0.0, 0.0]))
        tensor(5.)
    """
    reduction = _reduction(reduction, size_average, reduce, "mse_loss")
    _as_input(input, "input", "mse_loss")
    _as_input(target, "target", "mse_loss")
    _check_float(input, "input", "mse_loss")
    _check_float(target, "target", "mse_loss")
    _check_same_device("mse_loss", input=input, target=target)
    x, y = _arr(input), _arr(target)
    if tuple(x.shape) != tuple(y.shape):
        try:
            np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            raise RuntimeError(
                f"mse_loss(): The size of tensor a ({_shape_str(x.shape)}) must match the size "
                f"of tensor b ({_shape_str(y.shape)})"
            ) from None
        warnings.warn(
            f"Using a target size ({_shape_str(y.shape)}) that is different to the input size "
            f"({_shape_str(x.shape)}). This will likely lead to incorrect results due to "
            f"broadcasting. Please ensure they have the same size.", UserWarning, stacklevel=2,
        )
    _check_same_dtype("mse_loss", input=input, target=target)
    return _MSELoss.apply(input, target, reduction)


def _quiet(xp: Any) -> Any:
    """Silence NumPy's floating point warnings (log(0), 0/0): torch computes these silently."""
    return np.errstate(all="ignore") if xp is np else contextlib.nullcontext()


def _reduce_loss(xp: Any, loss: Any, reduction: str, dtype: Any, batch: Optional[int] = None
                 ) -> Any:
    """Apply ``reduction`` ('none', 'sum', 'mean' or 'batchmean') to elementwise losses.

    ``batch`` is what 'batchmean' divides by (the input's first dimension; None for a 0-d
    input, which is not divided).
    """
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "mean":
        total = _mean_div(total, loss.size)
    elif reduction == "batchmean" and batch is not None:
        total = _mean_div(total, batch)
    return xp.asarray(total, dtype=dtype)


def _loss_grad(g: Any, reduction: str, shape: tuple, batch: Optional[int] = None) -> Any:
    """The output gradient of a reduced elementwise loss, per element (broadcastable)."""
    if reduction == "mean":
        return g / max(math.prod(shape), 1)  # an empty input's mean is nan; its gradient 0
    if reduction == "batchmean" and batch is not None:
        return g / max(batch, 1)
    return g


def _broadcasts_to(fname: str, name: str, v: Any, shape: tuple) -> None:
    vs = tuple(_arr(v).shape)
    try:
        ok = np.broadcast_shapes(vs, shape) == shape
    except ValueError:
        ok = False
    if not ok:
        raise RuntimeError(
            f"{fname}(): {name} of shape {_shape_str(vs)} does not broadcast to the input's "
            f"shape {_shape_str(shape)}"
        )


def _no_grad_for(fname: str, **tensors: Any) -> None:
    for name, v in tensors.items():
        if isinstance(v, Tensor) and grad_enabled_for(v):
            raise RuntimeError(
                f"{fname}(): no gradient is defined with respect to '{name}' (as in torch), "
                f"but it requires grad; pass {name}.detach()"
            )


#: the floor of x(1 - x) in binary_cross_entropy's input gradient: torch's 1e-12, which it
#: applies rounded to float32 in every dtype (so float64 gradients at x = 0 or 1 agree too)
_BCE_GUARD = float(np.float32(1e-12))


class _BinaryCrossEntropy(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, w: Any, reduction: str) -> Any:
        xp = K.xp_of(x)
        with _quiet(xp):
            log_x = xp.maximum(xp.log(x), -100)  # as torch: clamped, so x = 0 or 1 is finite
            log_1mx = xp.maximum(xp.log1p(-x), -100)
            loss = (t - 1) * log_1mx - t * log_x
        if w is not None:
            loss *= w
        ctx.save_for_backward(x, t, w)
        ctx.reduction = reduction
        return _reduce_loss(xp, loss, reduction, x.dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, t, w = ctx.saved_tensors
        xp = K.xp_of(x)
        gs = _loss_grad(g, ctx.reduction, x.shape)
        if w is not None:
            gs = gs * w
        need = ctx.needs_input_grad
        dx = dt = None
        with _quiet(xp):
            if need[0]:
                # x(1 - x) is kept above torch's guard, so x at 0 or 1 gives finite gradients
                dx = (x - t) / xp.maximum(x * (1 - x), x.dtype.type(_BCE_GUARD)) * gs
            if need[1]:
                dt = (xp.log1p(-x) - xp.log(x)) * gs
        return dx, dt, None, None


@_autocast.op("binary_cross_entropy")
def binary_cross_entropy(
    input: Any,  # noqa: A002 - torch's name
    target: Any,
    weight: Any = None,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
) -> Tensor:
    """Binary cross entropy between probabilities ``input`` and ``target``.

    Elementwise ``-w * (t * log(x) + (1 - t) * log(1 - x))`` with both logarithms clamped to
    >= -100 (as torch), so probabilities of exactly 0 or 1 give finite losses and gradients.

    Args:
        input: probabilities in [0, 1], any shape.
        target: a tensor of the same shape and dtype, values in [0, 1].
        weight: optional rescaling, broadcastable to the input's shape (no gradient).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        reduction: ``'mean'``, ``'sum'`` or ``'none'``.

    Returns:
        The loss; gradients flow to ``input`` and ``target``.

    Raises:
        ValueError: a target shaped unlike the input, or an unknown reduction.
        RuntimeError: values outside [0, 1] (NaN included), mixed dtypes or devices, a weight
            that does not broadcast or that requires grad.

    Example:
        >>> import mpitensor as mt
        >>> round(float(binary_cross_entropy(mt.tensor([0.5]), mt.tensor([1.0]))), 4)
        0.6931
    """
    fname = "binary_cross_entropy"
    reduction = _reduction(reduction, size_average, reduce, fname)
    _as_input(input, "input", fname)
    _as_input(target, "target", fname)
    x, t = _arr(input), _arr(target)
    if tuple(t.shape) != tuple(x.shape):
        raise ValueError(
            f"{fname}(): target shape {_shape_str(t.shape)} differs from input shape "
            f"{_shape_str(x.shape)}; give them the same shape (no broadcasting here)"
        )
    _check_float(input, "input", fname)
    _check_same_dtype(fname, input=input, target=target)
    _check_same_device(fname, input=input, target=target, weight=weight)
    if weight is not None:
        _as_input(weight, "weight", fname)
        _broadcasts_to(fname, "weight", weight, tuple(x.shape))
        _no_grad_for(fname, weight=weight)
    for name, a in (("input", x), ("target", t)):
        if a.size and not (float(a.min()) >= 0.0 and float(a.max()) <= 1.0):  # NaN fails too
            raise RuntimeError(
                f"{fname}(): every element of {name} must lie in [0, 1]; found values from "
                f"{float(a.min())} to {float(a.max())} (apply sigmoid to logits, or use "
                f"binary_cross_entropy_with_logits)"
            )
    w = _arr(weight).astype(x.dtype, copy=False) if weight is not None else None
    return _BinaryCrossEntropy.apply(input, target, w, reduction)


class _BCEWithLogits(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, w: Any, pw: Any, reduction: str, dtype: Any) -> Any:
        xp = K.xp_of(x)
        xd, td = x.astype(dtype, copy=False), t.astype(dtype, copy=False)
        # log(sigmoid(x)) without overflow: min(x, 0) - log(1 + exp(-|x|)), in the input's own
        # dtype before any promotion (as torch: a float32 input with a float64 target agrees)
        log_sig = (xp.minimum(x, 0) - xp.log1p(xp.exp(-xp.abs(x)))).astype(dtype, copy=False)
        if pw is None:
            loss = (1 - td) * xd - log_sig
        else:
            loss = (1 - td) * xd - (1 + (pw - 1) * td) * log_sig
        if w is not None:
            loss = loss * w
        ctx.save_for_backward(xd, td, w, pw, log_sig)
        ctx.reduction, ctx.shapes = reduction, (x.shape, t.shape, x.dtype, t.dtype)
        return _reduce_loss(xp, loss, reduction, dtype)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, t, w, pw, log_sig = ctx.saved_tensors
        xp = K.xp_of(x)
        xshape, tshape, xdt, tdt = ctx.shapes
        gs = _loss_grad(g, ctx.reduction, x.shape)
        if w is not None:
            gs = gs * w
        need = ctx.needs_input_grad
        dx = dt = None
        if need[0]:
            sig = xp.exp(log_sig)
            # d/dx = (1 + (pw - 1) t) sigmoid(x) - pw t, i.e. sigmoid(x) - t without pw
            dx = (sig - t) if pw is None else ((1 + (pw - 1) * t) * sig - pw * t)
            dx = _sum_to(dx * gs, xshape).astype(xdt, copy=False)
        if need[1]:
            dt = -x if pw is None else (-x - (pw - 1) * log_sig)
            dt = _sum_to(dt * gs, tshape).astype(tdt, copy=False)
        return dx, dt, None, None, None, None


@_autocast.op("binary_cross_entropy_with_logits")
def binary_cross_entropy_with_logits(
    input: Any,  # noqa: A002 - torch's name
    target: Any,
    weight: Any = None,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
    pos_weight: Any = None,
) -> Tensor:
    """Binary cross entropy of ``sigmoid(input)`` against ``target``, computed from the logits.

    Elementwise ``w * ((1 - t) * x - (1 + (pos_weight - 1) * t) * log(sigmoid(x)))``, with
    ``log(sigmoid(x))`` taken as ``min(x, 0) - log1p(exp(-|x|))``: no overflow for any
    logit, and more accurate than ``sigmoid`` followed by :func:`binary_cross_entropy`.

    Args:
        input: logits, any shape.
        target: a tensor of the input's shape (values usually in [0, 1]).
        weight: optional rescaling, broadcastable to the input's shape (no gradient).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        reduction: ``'mean'``, ``'sum'`` or ``'none'``.
        pos_weight: optional weight of the positive term, broadcast along the last
            dimension (one per class), no gradient.

    Returns:
        The loss (dtype promoted from input and target); gradients flow to both.

    Raises:
        ValueError: a target shaped unlike the input, or an unknown reduction.
        RuntimeError: a weight or pos_weight that does not broadcast or that requires grad,
            mixed devices, a non-float input.

    Example:
        >>> import mpitensor as mt
        >>> round(float(binary_cross_entropy_with_logits(mt.tensor([0.0]), mt.tensor([1.0]))), 4)
        0.6931
    """
    fname = "binary_cross_entropy_with_logits"
    reduction = _reduction(reduction, size_average, reduce, fname)
    _as_input(input, "input", fname)
    _as_input(target, "target", fname)
    x, t = _arr(input), _arr(target)
    if tuple(t.shape) != tuple(x.shape):
        raise ValueError(
            f"{fname}(): target shape {_shape_str(t.shape)} must equal the input shape "
            f"{_shape_str(x.shape)}"
        )
    _check_float(input, "input", fname)
    _check_same_device(fname, input=input, target=target, weight=weight, pos_weight=pos_weight)
    dtype = np.result_type(x.dtype, t.dtype)
    if dtype.kind != "f":
        dtype = x.dtype
    extras = []
    for name, v in (("weight", weight), ("pos_weight", pos_weight)):
        if v is not None:
            _as_input(v, name, fname)
            _broadcasts_to(fname, name, v, tuple(x.shape))
            _no_grad_for(fname, **{name: v})
            extras.append(_arr(v).astype(dtype, copy=False))
        else:
            extras.append(None)
    return _BCEWithLogits.apply(input, target, extras[0], extras[1], reduction, dtype)


class _KLDiv(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, t: Any, reduction: str, log_target: bool, dtype: Any) -> Any:
        xp = K.xp_of(x)
        xd, td = x.astype(dtype, copy=False), t.astype(dtype, copy=False)
        with _quiet(xp):
            if log_target:
                et = xp.exp(td)
                loss = et * (td - xd)
            else:
                et = None
                # t * log(t) taken as 0 where t == 0 (the limit), as torch's xlogy does
                loss = xp.where(td == 0, dtype.type(0), td * xp.log(td)) - td * xd
        ctx.save_for_backward(xd, td, et)
        ctx.reduction, ctx.log_target = reduction, log_target
        ctx.shapes = (x.shape, t.shape, x.dtype, t.dtype, loss.shape)
        batch = x.shape[0] if x.ndim else None  # torch: 'batchmean' is over input's dim 0
        ctx.batch = batch
        return _reduce_loss(xp, loss, reduction, dtype, batch)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, t, et = ctx.saved_tensors
        xp = K.xp_of(x)
        xshape, tshape, xdt, tdt, lshape = ctx.shapes
        gs = _loss_grad(g, ctx.reduction, lshape, ctx.batch)
        need = ctx.needs_input_grad
        dx = dt = None
        with _quiet(xp):
            if need[0]:
                dx = _sum_to(xp.broadcast_to(-(et if ctx.log_target else t) * gs, lshape),
                              xshape).astype(xdt, copy=False)
            if need[1]:
                if ctx.log_target:
                    d = et * (t - x + 1)
                else:
                    # d/dt of t log t - t x; like torch, 0/0 = nan where t == 0
                    d = xp.where(t == 0, t.dtype.type(0), xp.log(t)) + t / t - x
                dt = _sum_to(xp.broadcast_to(d * gs, lshape), tshape).astype(tdt, copy=False)
        return dx, dt, None, None, None


@_autocast.op("kl_div")
def kl_div(
    input: Any,  # noqa: A002 - torch's name
    target: Any,
    size_average: Any = None,
    reduce: Any = None,
    reduction: str = "mean",
    log_target: bool = False,
) -> Tensor:
    """Kullback-Leibler divergence of ``target`` from ``input`` (given as log-probabilities).

    Elementwise ``t * (log t - x)`` (``exp(t) * (t - x)`` with ``log_target=True``, where
    ``t`` holds log-probabilities too), 0 where ``t == 0``. Input and target broadcast.

    Args:
        input: log-probabilities.
        target: probabilities (log-probabilities with ``log_target=True``).
        size_average, reduce: deprecated torch arguments (mapped onto ``reduction``).
        reduction: ``'mean'`` (over every element; warns, as torch does), ``'batchmean'``
            (the sum divided by the batch size: the mathematical KL divergence), ``'sum'`` or
            ``'none'``.
        log_target: whether ``target`` is given in log space.

    Returns:
        The loss; gradients flow to ``input`` and ``target``.

    Raises:
        ValueError: an unknown reduction.
        RuntimeError: shapes that do not broadcast, mixed devices, a non-float input.

    Example:
        >>> import mpitensor as mt
        >>> kl_div(mt.tensor([[0.0, 0.0]]).log_softmax(1), mt.tensor([[0.5, 0.5]]),
        ...        reduction="batchmean")
        tensor(0.)
    """
    fname = "kl_div"
    if reduction != "batchmean" or size_average is not None or reduce is not None:
        reduction = _reduction(reduction, size_average, reduce, fname)
    _as_input(input, "input", fname)
    _as_input(target, "target", fname)
    x, t = _arr(input), _arr(target)
    _check_float(input, "input", fname)
    try:
        np.broadcast_shapes(tuple(x.shape), tuple(t.shape))
    except ValueError:
        raise RuntimeError(
            f"{fname}(): input of shape {_shape_str(x.shape)} and target of shape "
            f"{_shape_str(t.shape)} do not broadcast together"
        ) from None
    _check_same_device(fname, input=input, target=target)
    if reduction == "mean":
        warnings.warn(
            "kl_div(): reduction='mean' averages over every element, batch and classes "
            "alike; the KL divergence is the sum over classes averaged over the batch, which "
            "is reduction='batchmean' (torch plans to make 'mean' mean that)",
            UserWarning, stacklevel=2,
        )
    dtype = np.result_type(x.dtype, t.dtype)
    if dtype.kind != "f":
        dtype = x.dtype
    return _KLDiv.apply(input, target, reduction, bool(log_target), np.dtype(dtype))


# --------------------------------------------------------------------------------------------
# dropout, flatten


class _MulMask(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, mask: Any) -> Any:
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (mask,) = ctx.saved_tensors
        return g * mask, None


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
from ._functional.pooling1d import *  # noqa: E402, F403
from ._functional.pooling1d import __all__ as _pooling1d_names  # noqa: E402
from ._functional.poolingnd import *  # noqa: E402, F403
from ._functional.poolingnd import __all__ as _poolingnd_names  # noqa: E402
from ._functional.rms_norm import *  # noqa: E402, F403
from ._functional.rms_norm import __all__ as _rms_norm_names  # noqa: E402
from ._functional.sampling import *  # noqa: E402, F403
from ._functional.sampling import __all__ as _sampling_names  # noqa: E402
from ._functional.spatial import *  # noqa: E402, F403
from ._functional.spatial import __all__ as _spatial_names  # noqa: E402

__all__ += [*_activation_names, *_attention_names, *_bilinear_names, *_ctc_names,
            *_distance_names,
            *_dropout_names, *_embedding_names, *_linear_ce_names, *_loss_names,
            *_pooling1d_names, *_poolingnd_names, *_rms_norm_names, *_sampling_names,
            *_spatial_names]
