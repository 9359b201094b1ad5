"""Discrete Fourier transforms on tensors, with their gradients: the complex transform
(``fftn``/``ifftn``: :class:`FFTN`), the real-to-half-complex one (``rfftn``) and its inverse
(``irfftn``) (both :class:`RFFTN`), each over any set of dimensions, on NumPy's or CuPy's
``fft`` module (the input's).

Every transform is linear, so its gradient is its adjoint applied to the output's gradient
(gradients of complex tensors are conjugate Wirtinger derivatives, ``dL/dRe + i dL/dIm``, as
torch's):

- ``fftn(norm)``'s adjoint is ``ifftn`` with the dual norm (``backward`` <-> ``forward``,
  ``ortho`` itself): ``F^H = conj(F)`` and the two norms put the same scale on both sides.
- ``rfftn`` is ``fftn`` of a real input keeping the first ``n // 2 + 1`` entries of the last
  dimension; its adjoint zero-fills the dropped entries, runs the dual ``ifftn`` and keeps the
  real part (the input is real).
- ``irfftn`` reads each entry ``1 <= k < n - n // 2`` of the last dimension twice (as itself
  and as its mirrored conjugate) and the others (the zero frequency, and the Nyquist one of an
  even ``n``) once, real part only; its adjoint is the dual ``rfftn`` with those entries
  weighted by 2.

Cropping or zero-padding an input to the sizes ``s`` (``n``) is a linear step too: the
gradient is padded or cropped back to the input's shape.

Values: NumPy 2's pocketfft computes float32/complex64 inputs in single precision (NumPy 1
computed them in double and returned complex128: the result is cast to the dtype torch gives
either way). Torch's kernels (pocketfft or MKL) add the terms in another order, so float32
results differ from torch's in the last bits, a few units of ``eps * log2(n)`` of the
largest values; float64 results agree to about ``1e-15`` relative.

Example:
    >>> import numpy as np
    >>> out = FFTN.forward(NO_RECORD, np.ones(4), (4,), (0,), "backward", False)
    >>> out.tolist()
    [(4+0j), 0j, 0j, 0j]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core.devices import xp
from mpitensor._core.opkit import NO_RECORD, Function

__all__: list = []  # private module: mpitensor.fft holds the public functions

_COMPLEX_OF = {np.dtype(np.float32): np.dtype(np.complex64),
               np.dtype(np.float64): np.dtype(np.complex128),
               np.dtype(np.complex64): np.dtype(np.complex64),
               np.dtype(np.complex128): np.dtype(np.complex128)}
_REAL_OF = {np.dtype(np.complex64): np.dtype(np.float32),
            np.dtype(np.complex128): np.dtype(np.float64),
            np.dtype(np.float32): np.dtype(np.float32),
            np.dtype(np.float64): np.dtype(np.float64)}

#: the norm whose scale on the other direction equals this norm's on this one
DUAL = {"backward": "forward", "forward": "backward", "ortho": "ortho"}


def fit(a: Any, axes: tuple, sizes: tuple) -> Any:
    """``a`` cropped or zero-padded at the end of each of ``axes`` to ``sizes``."""
    crop = [slice(None)] * a.ndim
    pad = [(0, 0)] * a.ndim
    for ax, n in zip(axes, sizes):
        have = a.shape[ax]
        if have > n:
            crop[ax] = slice(0, n)
        elif have < n:
            pad[ax] = (0, n - have)
    a = a[tuple(crop)]
    if any(p != (0, 0) for p in pad):
        a = xp(a).pad(a, pad)
    return a


def _keep(ctx: Any, x: Any, *args: Any) -> None:
    """What the backward needs: the input's shape and dtype, and the transform's arguments."""
    if ctx is not NO_RECORD:
        ctx.meta = (x.shape, x.dtype)
        ctx.args = args


def _back_to_input(ctx: Any, gx: Any, axes: tuple) -> Any:
    """The gradient ``gx`` brought to the input's shape (the adjoint of cropping/padding)
    and dtype (the real part for a real input)."""
    shape, dtype = ctx.meta
    gx = fit(gx, axes, tuple(shape[a] for a in axes))
    if dtype.kind != "c":
        gx = gx.real
    return gx.astype(dtype, copy=False)


class FFTN(Function):
    """``fftn`` (``inverse`` False) or ``ifftn`` of ``x`` over ``axes``, each cropped or
    zero-padded to ``sizes``; complex result."""

    @staticmethod
    def forward(ctx: Any, x: Any, sizes: tuple, axes: tuple, norm: str, inverse: bool) -> Any:
        f = xp(x).fft
        out = (f.ifftn if inverse else f.fftn)(x, s=sizes, axes=axes, norm=norm)
        _keep(ctx, x, sizes, axes, norm, inverse)
        return out.astype(_COMPLEX_OF[np.dtype(x.dtype)], copy=False)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        sizes, axes, norm, inverse = ctx.args
        f = xp(g).fft
        gx = (f.fftn if inverse else f.ifftn)(g, s=sizes, axes=axes, norm=DUAL[norm])
        return _back_to_input(ctx, gx, axes), None, None, None, None


class RFFTN(Function):
    """``rfftn`` (``inverse`` False) of the real ``x`` over ``axes`` (the last one halved),
    cropped or zero-padded to ``sizes``; or ``irfftn`` of the half spectrum ``x``: a real result
    of ``sizes`` (the last dimension's input cropped or zero-padded to ``sizes[-1] // 2 + 1``
    entries)."""

    @staticmethod
    def forward(ctx: Any, x: Any, sizes: tuple, axes: tuple, norm: str, inverse: bool) -> Any:
        f = xp(x).fft
        out = (f.irfftn if inverse else f.rfftn)(x, s=sizes, axes=axes, norm=norm)
        _keep(ctx, x, sizes, axes, norm, inverse)
        return out.astype((_REAL_OF if inverse else _COMPLEX_OF)[np.dtype(x.dtype)], copy=False)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        sizes, axes, norm, inverse = ctx.args
        f = xp(g).fft
        if inverse:
            gx = f.rfftn(g, s=sizes, axes=axes, norm=DUAL[norm])
            n = sizes[-1]
            twice = [slice(None)] * gx.ndim
            twice[axes[-1]] = slice(1, n - n // 2)  # the entries irfftn reads twice
            gx[tuple(twice)] *= 2
        else:
            full = fit(g, axes[-1:], sizes[-1:])  # the dropped half: zero
            gx = f.ifftn(full, s=sizes, axes=axes, norm=DUAL[norm])
        return _back_to_input(ctx, gx, axes), None, None, None, None


def compute_dtype(dt: Any, fname: str, real_only: bool = False) -> np.dtype:
    """The dtype a transform computes an input of dtype ``dt`` in: integers and bools in the
    default float dtype, floats and complex numbers in their own.

    Raises:
        TypeError: a half-precision input (no CPU transform takes them, as in torch), or a
            complex one where ``real_only``.
    """
    dt = np.dtype(dt)
    k = _dt.kind_of(dt)
    if k in "biu":
        return _dt.get_default_dtype()
    if dt not in _COMPLEX_OF:
        raise TypeError(f"{fname}() does not take {_dt.dt_repr(dt)} tensors; convert first, "
                        f"e.g. x.float()")
    if real_only and k == "c":
        raise TypeError(f"{fname}() expects a real input tensor, got {_dt.dt_repr(dt)}; "
                        f"use fft() for complex inputs")
    return dt
