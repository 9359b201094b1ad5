"""Numerical derivatives by finite differences (``gradient``) and multi-dimensional histograms
(``histogramdd``).

``gradient`` is made of slicing and arithmetic on tensors, so autograd differentiates it;
it follows ``numpy.gradient``'s formulas: central differences inside, one-sided differences
of first or second order at the edges, on unit, scalar or coordinate spacing.

Example:
    >>> import mpitensor as mt
    >>> mt.gradient(mt.tensor([1.0, 4.0, 9.0, 16.0]))
    (tensor([3., 4., 6., 7.]),)
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any, Optional

from mpitensor import dtypes as _dt
from mpitensor._core.devices import xp
from mpitensor._core.dims import wrap_dim
from mpitensor._core.opkit import wrap
from mpitensor.tensor import Tensor

__all__ = ["gradient", "histogramdd"]


def _dims(dim: Any, ndim: int) -> list:
    if dim is None:
        return list(range(ndim))
    dims = [wrap_dim(d, ndim) for d in ((dim,) if isinstance(dim, int) else dim)]
    for d in dims:
        if dims.count(d) > 1:
            raise RuntimeError(f"gradient(): dim {d} appears more than once in {list(dim)}")
    return dims


def _spacings(spacing: Any, dims: list, given_dim: bool, ndim: int) -> list:
    """One spacing per dimension of ``dims``: a number, or a 1-D tensor of coordinates."""
    if not isinstance(spacing, (list, tuple)):
        return [spacing] * len(dims)
    want = len(dims)
    if len(spacing) != want:
        what = f"the {want} dims given" if given_dim else f"the tensor's {ndim} dimensions"
        raise RuntimeError(f"gradient(): spacing has {len(spacing)} entries, one for each of "
                           f"{what} was expected (or one number for all)")
    for s in spacing:
        if isinstance(s, Tensor) and s.ndim != 1:
            raise RuntimeError(f"gradient(): a spacing tensor holds coordinates and must be "
                               f"1-D, got one with {s.ndim} dimensions")
    return list(spacing)


def _uniform(f: Tensor, d: int, h: float, edge_order: int) -> Tensor:
    n = f.shape[d]

    def at(i: int, k: int = 1) -> Tensor:
        return f.narrow(d, i % n, k)

    inner = (f.narrow(d, 2, n - 2) - f.narrow(d, 0, n - 2)) / (2 * h)
    if edge_order == 1:
        first = (at(1) - at(0)) / h
        last = (at(-1) - at(-2)) / h
    else:
        first = (-1.5 * at(0) + 2 * at(1) - 0.5 * at(2)) / h
        last = (0.5 * at(-3) - 2 * at(-2) + 1.5 * at(-1)) / h
    return _cat(first, inner, last, d)


def _cat(first: Tensor, inner: Tensor, last: Tensor, d: int) -> Tensor:
    from mpitensor._ops.combine import cat  # noqa: PLC0415 - a sibling op module

    return cat([first, inner, last], dim=d)


def _coordinates(f: Tensor, d: int, x: Tensor, edge_order: int) -> Tensor:
    n = f.shape[d]
    if x.shape[0] != n:
        raise RuntimeError(f"gradient(): the coordinates for dim {d} have {x.shape[0]} "
                           f"entries, the dimension {n}")
    x = x.to(f.dtype).reshape([n if k == d else 1 for k in range(f.ndim)])

    def at(t: Tensor, i: int, k: int = 1) -> Tensor:
        return t.narrow(d, i % n, k)

    hd = x.narrow(d, 1, n - 2) - x.narrow(d, 0, n - 2)   # to the left of each inner point
    hs = x.narrow(d, 2, n - 2) - x.narrow(d, 1, n - 2)   # to the right
    inner = (-hs / (hd * (hd + hs)) * f.narrow(d, 0, n - 2)
             + (hs - hd) / (hd * hs) * f.narrow(d, 1, n - 2)
             + hd / (hs * (hd + hs)) * f.narrow(d, 2, n - 2))
    if edge_order == 1:
        first = (at(f, 1) - at(f, 0)) / (at(x, 1) - at(x, 0))
        last = (at(f, -1) - at(f, -2)) / (at(x, -1) - at(x, -2))
    else:
        a1, a2 = at(x, 1) - at(x, 0), at(x, 2) - at(x, 1)
        first = (-(2 * a1 + a2) / (a1 * (a1 + a2)) * at(f, 0)
                 + (a1 + a2) / (a1 * a2) * at(f, 1) - a1 / (a2 * (a1 + a2)) * at(f, 2))
        b1, b2 = at(x, -2) - at(x, -3), at(x, -1) - at(x, -2)
        last = (b2 / (b1 * (b1 + b2)) * at(f, -3) - (b1 + b2) / (b1 * b2) * at(f, -2)
                + (2 * b2 + b1) / (b2 * (b1 + b2)) * at(f, -1))
    return _cat(first, inner, last, d)


def gradient(input: Tensor, *, spacing: Any = 1, dim: Any = None,  # noqa: A002
             edge_order: int = 1) -> tuple:
    """The derivative of ``input`` along each of ``dim`` (all by default), estimated by
    finite differences: central inside, one-sided at the edges (``edge_order`` 1 or 2).

    Args:
        input: the sampled values (an integer tensor is taken as the default float dtype).
        spacing: the distance between samples: one number for every dimension, a list with a
            number or a 1-D tensor of sample coordinates per dimension.
        dim: a dimension or a list of them.
        edge_order: the order of the one-sided differences at the edges.

    Returns:
        A tuple with one tensor per dimension, shaped like ``input``.

    Raises:
        RuntimeError: an ``edge_order`` other than 1 or 2, a dimension shorter than
            ``edge_order + 1``, or a ``spacing`` list of the wrong length.

    Example:
        >>> import mpitensor as mt
        >>> mt.gradient(mt.tensor([0.0, 1.0, 4.0]), spacing=0.5)
        (tensor([2., 4., 6.]),)
    """
    if edge_order not in (1, 2):
        raise RuntimeError(f"gradient(): edge_order must be 1 or 2, got {edge_order}")
    f = input
    if _dt.kind_of(f._data.dtype) not in "fc":
        f = f.to(_dt.get_default_dtype())
    dims = _dims(dim, f.ndim)
    steps = _spacings(spacing, dims, dim is not None, f.ndim)
    out = []
    for d, h in zip(dims, steps):
        if f.shape[d] < edge_order + 1:
            raise RuntimeError(f"gradient(): dim {d} has {f.shape[d]} samples; edge_order "
                               f"{edge_order} needs at least {edge_order + 1}")
        if isinstance(h, Tensor) and h.ndim == 0:
            h = h.item()
        if isinstance(h, Tensor):
            out.append(_coordinates(f, d, h, edge_order))
        else:
            out.append(_uniform(f, d, float(h), edge_order))
    return tuple(out)


histogramdd_result = namedtuple("histogramdd", ["hist", "bin_edges"])


def histogramdd(input: Tensor, bins: Any = 10, *, range: Optional[Any] = None,  # noqa: A002
                weight: Optional[Tensor] = None, density: bool = False) -> Any:
    """The histogram of points in D dimensions: ``input``'s last dimension holds each point's
    D coordinates. Counts (or summed ``weight``, or a density) and the D tensors of bin edges.

    Args:
        input: a float tensor of shape ``(..., D)``.
        bins: a number of bins for every dimension, one number per dimension, or one tensor
            of increasing edges per dimension.
        range: ``[min_0, max_0, min_1, max_1, ...]`` (each dimension's data range by default).
        weight: one weight per point.
        density: divide by the total and by each bin's volume.

    Returns:
        ``(hist, bin_edges)``, a named tuple; ``bin_edges`` is a tuple of D tensors.

    Example:
        >>> import mpitensor as mt
        >>> mt.histogramdd(mt.tensor([[0.0, 0.0], [1.0, 1.0]]), bins=2).hist
        tensor([[1., 0.],
                [0., 1.]])
    """
    x = input._data
    if x.ndim < 2:
        raise RuntimeError(f"histogramdd(): input must have at least 2 dimensions (points, "
                           f"coordinates), got {x.ndim}")
    if _dt.kind_of(x.dtype) != "f":
        raise RuntimeError(f"histogramdd(): expected a floating point tensor, got "
                           f"{_dt.dt_repr(x.dtype)}")
    m = xp(x)
    pts = x.reshape(-1, x.shape[-1]).astype(_dt.float64)
    D = pts.shape[1]
    if isinstance(bins, (list, tuple)) and bins and isinstance(bins[0], Tensor):
        b: Any = [m.asarray(e._data, dtype=_dt.float64) for e in bins]
    else:
        b = list(bins) if isinstance(bins, (list, tuple)) else bins
    rng = None
    if range is not None:
        r = [float(v) for v in range]
        if len(r) != 2 * D:
            raise RuntimeError(f"histogramdd(): range needs a min and a max for each of the "
                               f"{D} dimensions, got {len(r)} numbers")
        rng = list(zip(r[0::2], r[1::2]))
    w = None if weight is None else weight._data.reshape(-1).astype(_dt.float64)
    hist, edges = m.histogramdd(pts, bins=b, range=rng, weights=w, density=density)
    return histogramdd_result(wrap(hist.astype(x.dtype)),
                              tuple(wrap(e.astype(x.dtype)) for e in edges))
