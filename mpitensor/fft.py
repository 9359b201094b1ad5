"""``mpitensor.fft``: the discrete Fourier transforms of ``torch.fft``, differentiable.

``import mpitensor as torch`` then ``torch.fft.rfft(x)``, ``torch.fft.irfft(X, n)``... Same
names, arguments (``n``/``s`` to crop or zero-pad, ``dim``, ``norm`` = ``"backward"``,
``"ortho"`` or ``"forward"``, ``out=``) and dtypes as torch: float32 (and integer) inputs give
complex64, float64 gives complex128, and the inverse real transforms give the matching real
dtype. Every transform has its gradient (its adjoint: see ``mpitensor._ops.fft``), so a
spectral layer (``rfft``, a product with complex weights, ``irfft``) trains as in torch.

Example:
    >>> import mpitensor as mt
    >>> mt.fft.rfft(mt.tensor([1.0, 2.0, 3.0, 4.0]))
    tensor([10.+0.j, -2.+2.j, -2.+0.j])
    >>> mt.fft.irfft(mt.fft.rfft(mt.tensor([1.0, 2.0, 3.0, 4.0])))
    tensor([1., 2., 3., 4.])
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence, Union

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core.dims import wrap_dim
from mpitensor._core.opkit import Tensor, run
from mpitensor._ops import create as _create
from mpitensor._ops.fft import DUAL, FFTN, RFFTN, compute_dtype

__all__ = [
    "fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2",
    "rfftn", "irfftn", "hfft", "ihfft", "hfft2", "ihfft2", "hfftn", "ihfftn",
    "fftfreq", "rfftfreq", "fftshift", "ifftshift",
]

Dims = Optional[Union[int, Sequence[int]]]
Sizes = Optional[Sequence[int]]


def _norm(norm: Optional[str], fname: str) -> str:
    if norm is None:
        return "backward"
    if norm not in DUAL:
        raise ValueError(f"{fname}(): norm must be 'backward', 'ortho', 'forward' or None, got "
                         f"{norm!r}")
    return norm


def _input(x: Any, fname: str, real_only: bool = False) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{fname}(): input must be a Tensor, got {type(x).__name__}")
    dt = compute_dtype(x._data.dtype, fname, real_only)
    return x if x._data.dtype == dt else x.to(dt)


def _plan(x: Tensor, s: Sizes, dim: Dims, fname: str, halved: bool = False) -> tuple:
    """``(sizes, axes)`` of a transform of ``x``: torch's rules for ``s`` and ``dim`` (no
    ``dim``: the last ``len(s)`` dimensions, or all; an ``s`` entry of -1: the input's size;
    ``halved``: the last size of a real output from a half spectrum, ``2 * (m - 1)`` unless
    given).

    Raises:
        ValueError: ``s`` and ``dim`` differ in length, a dimension repeats, or a size is < 1.
        IndexError: a dimension out of range.
    """
    nd = x.dim()
    if dim is None:
        axes = tuple(range(nd)) if s is None else tuple(range(nd - len(s), nd))
    else:
        axes = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        axes = tuple(wrap_dim(d, nd) for d in axes)
    if len(set(axes)) != len(axes):
        raise ValueError(f"{fname}(): dims must be unique, got {list(axes)}")
    if s is not None and len(s) != len(axes):
        raise ValueError(f"{fname}(): s has {len(s)} sizes but there are {len(axes)} dims")
    if not axes:
        raise ValueError(f"{fname}(): transforms over no dimension are not defined")
    if any(a < 0 for a in axes):
        raise IndexError(f"{fname}(): dims {list(axes)} out of range for a tensor of {nd} "
                         f"dimensions")
    shape = x.shape
    sizes = [shape[a] if s is None or s[i] == -1 else operator.index(s[i])
             for i, a in enumerate(axes)]
    if halved and (s is None or s[-1] == -1):
        sizes[-1] = 2 * (shape[axes[-1]] - 1)
    if any(n < 1 for n in sizes):
        raise ValueError(f"{fname}(): invalid number of data points {sizes} along dims "
                         f"{list(axes)}; each must be at least 1")
    return tuple(sizes), axes


def _finish(r: Tensor, out: Optional[Tensor], fname: str) -> Tensor:
    if out is None:
        return r
    if r.requires_grad:
        raise RuntimeError(f"{fname}(): out= does not take part in autograd, but the input "
                           f"requires grad; drop out= or call under no_grad()")
    return _create.write_into(out, r._data, fname)


def _c2c(x: Tensor, s: Sizes, dim: Dims, norm: Optional[str], out: Optional[Tensor],
         fname: str, inverse: bool) -> Tensor:
    x = _input(x, fname)
    sizes, axes = _plan(x, s, dim, fname)
    return _finish(run(FFTN, x, sizes, axes, _norm(norm, fname), inverse), out, fname)


def _r2c(x: Tensor, s: Sizes, dim: Dims, norm: str, fname: str) -> Tensor:
    x = _input(x, fname, real_only=True)
    sizes, axes = _plan(x, s, dim, fname)
    return run(RFFTN, x, sizes, axes, norm, False)


def _c2r(x: Tensor, s: Sizes, dim: Dims, norm: str, fname: str) -> Tensor:
    x = _input(x, fname)
    sizes, axes = _plan(x, s, dim, fname, halved=True)
    return run(RFFTN, x, sizes, axes, norm, True)


def _one(n: Optional[int]) -> Sizes:
    return None if n is None else (n,)


def fftn(input: Tensor, s: Sizes = None, dim: Dims = None, norm: Optional[str] = None, *,  # noqa: A002
         out: Optional[Tensor] = None) -> Tensor:
    """Return the n-dimensional discrete Fourier transform of ``input`` over ``dim`` (all
    dimensions, or the last ``len(s)``), each cropped or zero-padded to ``s``.

    Args:
        input: a real or complex tensor (integers are taken as the default float dtype).
        s: the signal size along each transformed dimension (-1: the input's).
        dim: the dimensions to transform.
        norm: ``"backward"`` (no scaling, the default), ``"ortho"`` (``1/sqrt(n)``) or
            ``"forward"`` (``1/n``).
        out: a tensor to write the result into (no autograd).

    Raises:
        TypeError: a half-precision input. ValueError: bad ``s``, ``dim`` or ``norm``.

    Example:
        >>> import mpitensor as mt
        >>> mt.fft.fftn(mt.ones(2, 2))
        tensor([[4.+0.j, 0.+0.j],
                [0.+0.j, 0.+0.j]])
    """
    return _c2c(input, s, dim, norm, out, "fftn", False)


def ifftn(input: Tensor, s: Sizes = None, dim: Dims = None, norm: Optional[str] = None, *,  # noqa: A002
          out: Optional[Tensor] = None) -> Tensor:
    """Return the n-dimensional inverse transform (``norm="backward"`` divides by ``n``); the
    arguments as :func:`fftn`'s."""
    return _c2c(input, s, dim, norm, out, "ifftn", True)


def fft(input: Tensor, n: Optional[int] = None, dim: int = -1, norm: Optional[str] = None, *,  # noqa: A002
        out: Optional[Tensor] = None) -> Tensor:
    """Return the 1-D discrete Fourier transform along ``dim``, the signal cropped or
    zero-padded to ``n``; see :func:`fftn`."""
    return _c2c(input, _one(n), dim, norm, out, "fft", False)


def ifft(input: Tensor, n: Optional[int] = None, dim: int = -1, norm: Optional[str] = None, *,  # noqa: A002
         out: Optional[Tensor] = None) -> Tensor:
    """Return the 1-D inverse transform along ``dim``; see :func:`ifftn`."""
    return _c2c(input, _one(n), dim, norm, out, "ifft", True)


def fft2(input: Tensor, s: Sizes = None, dim: Dims = (-2, -1), norm: Optional[str] = None, *,  # noqa: A002
         out: Optional[Tensor] = None) -> Tensor:
    """Return the 2-D transform over ``dim`` (the last two by default); see :func:`fftn`."""
    return _c2c(input, s, dim, norm, out, "fft2", False)


def ifft2(input: Tensor, s: Sizes = None, dim: Dims = (-2, -1), norm: Optional[str] = None, *,  # noqa: A002
          out: Optional[Tensor] = None) -> Tensor:
    """Return the 2-D inverse transform over ``dim``; see :func:`ifftn`."""
    return _c2c(input, s, dim, norm, out, "ifft2", True)


def rfftn(input: Tensor, s: Sizes = None, dim: Dims = None, norm: Optional[str] = None, *,  # noqa: A002
          out: Optional[Tensor] = None) -> Tensor:
    """Return the transform of a real ``input`` over ``dim``, keeping the ``n // 2 + 1``
    non-redundant entries of the last transformed dimension; the arguments as :func:`fftn`'s.

    Raises:
        TypeError: a complex input.
    """
    return _finish(_r2c(input, s, dim, _norm(norm, "rfftn"), "rfftn"), out, "rfftn")


def irfftn(input: Tensor, s: Sizes = None, dim: Dims = None, norm: Optional[str] = None, *,  # noqa: A002
           out: Optional[Tensor] = None) -> Tensor:
    """Return the real signal whose :func:`rfftn` is ``input``: the last size is ``2 * (m - 1)``
    for ``m`` input entries unless ``s`` gives it (an odd size needs ``s``); the imaginary
    parts of the zero (and Nyquist) frequencies are ignored."""
    return _finish(_c2r(input, s, dim, _norm(norm, "irfftn"), "irfftn"), out, "irfftn")


def rfft(input: Tensor, n: Optional[int] = None, dim: int = -1, norm: Optional[str] = None, *,  # noqa: A002
         out: Optional[Tensor] = None) -> Tensor:
    """Return the 1-D transform of a real signal, ``n // 2 + 1`` entries; see :func:`rfftn`."""
    return _finish(_r2c(input, _one(n), dim, _norm(norm, "rfft"), "rfft"), out, "rfft")


def irfft(input: Tensor, n: Optional[int] = None, dim: int = -1, norm: Optional[str] = None, *,  # noqa: A002
          out: Optional[Tensor] = None) -> Tensor:
    """Return the real signal of ``n`` samples whose :func:`rfft` is ``input``; see
    :func:`irfftn`."""
    return _finish(_c2r(input, _one(n), dim, _norm(norm, "irfft"), "irfft"), out, "irfft")


def rfft2(input: Tensor, s: Sizes = None, dim: Dims = (-2, -1), norm: Optional[str] = None, *,  # noqa: A002
          out: Optional[Tensor] = None) -> Tensor:
    """Return the 2-D :func:`rfftn` over ``dim`` (the last two by default)."""
    return _finish(_r2c(input, s, dim, _norm(norm, "rfft2"), "rfft2"), out, "rfft2")


def irfft2(input: Tensor, s: Sizes = None, dim: Dims = (-2, -1), norm: Optional[str] = None, *,  # noqa: A002
           out: Optional[Tensor] = None) -> Tensor:
    """Return the 2-D :func:`irfftn` over ``dim`` (the last two by default)."""
    return _finish(_c2r(input, s, dim, _norm(norm, "irfft2"), "irfft2"), out, "irfft2")


# The Hermitian transforms are the real ones of the conjugate with the dual norm: hfftn(x) =
# irfftn(conj(x)) (a sum with e^{-i...} of a Hermitian signal is real, so it equals its own
# conjugate), and ihfftn(x) = conj(rfftn(x)); their gradients come through conj and those.
def _hermitian(x: Tensor, s: Sizes, dim: Dims, norm: Optional[str], out: Optional[Tensor],
               fname: str) -> Tensor:
    x = _input(x, fname)
    return _finish(_c2r(x.conj(), s, dim, DUAL[_norm(norm, fname)], fname), out, fname)


def _inverse_hermitian(x: Tensor, s: Sizes, dim: Dims, norm: Optional[str],
                       out: Optional[Tensor], fname: str) -> Tensor:
    return _finish(_r2c(x, s, dim, DUAL[_norm(norm, fname)], fname).conj(), out, fname)


def hfft(input: Tensor, n: Optional[int] = None, dim: int = -1, norm: Optional[str] = None, *,  # noqa: A002
         out: Optional[Tensor] = None) -> Tensor:
    """Return the (real) transform of a Hermitian-symmetric signal given by its first half
    ``input``: ``n`` samples, ``2 * (m - 1)`` by default."""
    return _hermitian(input, _one(n), dim, norm, out, "hfft")


def ihfft(input: Tensor, n: Optional[int] = None, dim: int = -1, norm: Optional[str] = None, *,  # noqa: A002
          out: Optional[Tensor] = None) -> Tensor:
    """Return the inverse of :func:`hfft`: the first ``n // 2 + 1`` entries of the inverse
    transform of a real signal."""
    return _inverse_hermitian(input, _one(n), dim, norm, out, "ihfft")


def hfft2(input: Tensor, s: Sizes = None, dim: Dims = (-2, -1), norm: Optional[str] = None, *,  # noqa: A002
          out: Optional[Tensor] = None) -> Tensor:
    """Return the 2-D :func:`hfftn` over ``dim`` (the last two by default)."""
    return _hermitian(input, s, dim, norm, out, "hfft2")


def ihfft2(input: Tensor, s: Sizes = None, dim: Dims = (-2, -1), norm: Optional[str] = None, *,  # noqa: A002
           out: Optional[Tensor] = None) -> Tensor:
    """Return the 2-D :func:`ihfftn` over ``dim`` (the last two by default)."""
    return _inverse_hermitian(input, s, dim, norm, out, "ihfft2")


def hfftn(input: Tensor, s: Sizes = None, dim: Dims = None, norm: Optional[str] = None, *,  # noqa: A002
          out: Optional[Tensor] = None) -> Tensor:
    """Return the n-dimensional transform of a signal Hermitian-symmetric in the last of
    ``dim``, given by its first half there: a real tensor; see :func:`irfftn` for ``s``."""
    return _hermitian(input, s, dim, norm, out, "hfftn")


def ihfftn(input: Tensor, s: Sizes = None, dim: Dims = None, norm: Optional[str] = None, *,  # noqa: A002
           out: Optional[Tensor] = None) -> Tensor:
    """Return the inverse of :func:`hfftn`: the inverse transform of a real signal, the last
    of ``dim`` halved."""
    return _inverse_hermitian(input, s, dim, norm, out, "ihfftn")


def _freq(values: np.ndarray, out: Optional[Tensor], dtype: Any, device: Any,
          requires_grad: bool, fname: str) -> Tensor:
    dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
    if out is not None:
        return _create.write_into(out, values.astype(out._data.dtype), fname)
    return _create.tensor(values.astype(dt), device=device, requires_grad=requires_grad)


def fftfreq(n: int, d: float = 1.0, *, out: Optional[Tensor] = None, dtype: Any = None,
            layout: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Return the sample frequencies of an ``n``-point transform with sample spacing ``d``:
    ``[0, 1, ..., (n - 1) // 2, -(n // 2), ..., -1] / (d * n)``.

    Example:
        >>> import mpitensor as mt
        >>> mt.fft.fftfreq(4)
        tensor([ 0.0000,  0.2500, -0.5000, -0.2500])
    """
    _create.check_placement("fftfreq", layout)
    return _freq(np.fft.fftfreq(operator.index(n), d), out, dtype, device, requires_grad,
                 "fftfreq")


def rfftfreq(n: int, d: float = 1.0, *, out: Optional[Tensor] = None, dtype: Any = None,
             layout: Any = None, device: Any = None, requires_grad: bool = False) -> Tensor:
    """Return the ``n // 2 + 1`` non-negative sample frequencies of :func:`rfft`'s output:
    ``[0, 1, ..., n // 2] / (d * n)``."""
    _create.check_placement("rfftfreq", layout)
    return _freq(np.fft.rfftfreq(operator.index(n), d), out, dtype, device, requires_grad,
                 "rfftfreq")


def _shift(x: Tensor, dim: Dims, sign: int) -> Tensor:
    nd = x.dim()
    axes = tuple(range(nd)) if dim is None else (
        (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim))
    axes = tuple(wrap_dim(a, nd) for a in axes)
    return x.roll(tuple(sign * (x.shape[a] // 2) for a in axes), axes)


def fftshift(input: Tensor, dim: Dims = None) -> Tensor:  # noqa: A002
    """Return ``input`` rolled so that the zero frequency is at the centre of each of ``dim``
    (all dimensions by default)."""
    return _shift(input, dim, 1)


def ifftshift(input: Tensor, dim: Dims = None) -> Tensor:  # noqa: A002
    """Return the inverse of :func:`fftshift`."""
    return _shift(input, dim, -1)
