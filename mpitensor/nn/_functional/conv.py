"""The convolutions of ``torch.nn.functional``: ``conv2d`` (im2col bands, Winograd 3x3 and the
compiled loops, see :mod:`mpitensor.nn._kernels`) and the family built on its kernels
(``conv1d``, ``conv3d``, ``conv_tbc``, ``conv_transpose1d/2d/3d``), with the argument checks
they share."""

from __future__ import annotations

import numbers
from typing import Any, Callable, Union

from mpitensor._base.parallel import one_thread as one_blas_thread
from mpitensor._core import autocast as _autocast
from mpitensor._core import half as _half
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor

from .. import _kernels as K
from .._kernels import convnd as CN
from .checks import (
    _arr,
    _as_input,
    _check_float,
    _check_same_device,
    _check_same_dtype,
    _IntOrPair,
    _pair,
    _reshape,
    _shape_str,
    pad_misfit,
)
from .checks import as_tensor as _tensor_arg

__all__ = ["conv2d", "conv1d", "conv_tbc", "conv3d", "conv_transpose1d", "conv_transpose2d",
           "conv_transpose3d"]


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
    geom, xshape, unbatched = _conv2d_geometry(input, weight, bias, stride, padding, dilation,
                                               groups)
    if xshape[0] == 0:
        return _EmptyBatchConv.apply(input, weight, bias, (0, geom.O, geom.OH, geom.OW))
    xin = _reshape(input, xshape) if unbatched else input
    out = _Conv2d.apply(xin, weight, bias, geom)
    return _reshape(out, tuple(out.shape[1:])) if unbatched else out


def _conv2d_geometry(input: Any, weight: Any, bias: Any, stride: Any, padding: Any,  # noqa: A002
                     dilation: Any, groups: int) -> tuple:
    """Check conv2d's arguments (before any data moves) and return its geometry, the input's
    batched shape and whether it came unbatched."""
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
    return geom, xshape, unbatched


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
        why = pad_misfit(mode, lo, hi, n)
        if why is not None:
            raise _ConvArgumentError(f"padding_mode={mode!r}: {why}")
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


def conv1d(input: Any, weight: Any, bias: Any = None,  # noqa: A002 - torch's name
           stride: Union[int, tuple] = 1, padding: Union[int, tuple, str] = 0,
           dilation: Union[int, tuple] = 1, groups: int = 1) -> Tensor:
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


def conv3d(input: Any, weight: Any, bias: Any = None,  # noqa: A002 - torch's name
           stride: Union[int, tuple] = 1, padding: Union[int, tuple, str] = 0,
           dilation: Union[int, tuple] = 1, groups: int = 1) -> Tensor:
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


def _transposed(nd: int, doc: str) -> Callable:
    """The public ``conv_transpose{nd}d`` with torch's signature and the docstring ``doc``."""
    name = f"conv_transpose{nd}d"

    def api(input: Any, weight: Any, bias: Any = None,  # noqa: A002 - torch's name
            stride: Union[int, tuple] = 1, padding: Union[int, tuple] = 0,
            output_padding: Union[int, tuple] = 0, groups: int = 1,
            dilation: Union[int, tuple] = 1) -> Tensor:
        return _conv_transpose_nd(name, nd, input, weight, bias, stride, padding,
                                  output_padding, groups, dilation)

    api.__name__ = api.__qualname__ = name
    api.__doc__ = doc
    return api


conv_transpose1d = _transposed(1, """1-D transposed convolution, as
    ``torch.nn.functional.conv_transpose1d``: the input gradient of :func:`conv1d` with the
    same weight and geometry.

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
    """)


conv_transpose2d = _transposed(2, """2-D transposed convolution, as
    ``torch.nn.functional.conv_transpose2d`` (conv2d's input gradient: col2im of one product
    per group).

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
        >>> y = conv_transpose2d(mt.ones(1, 8, 4, 4), mt.ones(8, 3, 3, 3), stride=2, padding=1,
        ...                      output_padding=1)
        >>> y.shape  # (4 - 1) * 2 - 2 * 1 + (3 - 1) + 1 + 1 = 8
        mpitensor.Size([1, 3, 8, 8])
    """)


conv_transpose3d = _transposed(3, """3-D transposed convolution, as
    ``torch.nn.functional.conv_transpose3d``.

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
        >>> conv_transpose3d(mt.ones(1, 2, 2, 2, 2), mt.ones(2, 1, 3, 3, 3), stride=2).shape
        mpitensor.Size([1, 1, 5, 5, 5])
    """)
