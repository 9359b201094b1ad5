"""Size and dimension arguments, read the way torch reads them.

Constructors and shape ops take sizes as ``f(2, 3)``, ``f((2, 3))`` or ``f([2, 3])``, and
dimensions as possibly negative ints (a zero-dim tensor accepts 0 and -1). The checks here give
one message per mistake whichever op was called.
"""

from __future__ import annotations

import math
import operator
from typing import Any


def size_from(args: tuple, fname: str, allow_minus_one: bool = False) -> tuple:
    """Sizes given as ints or as one tuple/list, as a tuple of ints.

    Raises:
        TypeError: a size is not an int.
        ValueError: a negative size (other than -1 where ``allow_minus_one``).
    """
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    try:
        shape = tuple([operator.index(s) for s in args])
    except TypeError:
        raise TypeError(
            f"{fname}(): size must be ints or one tuple of ints, got {args!r}"
        ) from None
    for s in shape:
        if s < 0 and not (allow_minus_one and s == -1):
            raise ValueError(
                f"{fname}(): negative dimension {s} in size {list(shape)}; sizes must be >= 0"
            )
    return shape


def keyword_form(args: tuple, kwargs: dict, word: str, fname: str) -> tuple:
    """The sizes or dimensions of a ``*args`` method called in torch's keyword form
    (``x.flip(dims=(0,))``, ``x.view(size=(3, 2))``): ``(kwargs[word],)`` then, else ``args``.

    Raises:
        TypeError: another keyword, or ``word`` given both by position and by keyword.
    """
    if not kwargs:
        return args
    other = [k for k in kwargs if k != word]
    if other:
        raise TypeError(f"{fname}() got an unexpected keyword argument {other[0]!r}")
    if args:
        raise TypeError(f"{fname}() got {word!r} both by position and by keyword")
    return (kwargs[word],)


def wrap_dim(dim: Any, ndim: int) -> int:
    """A dimension index in ``[0, ndim)``; 0-d tensors accept 0 and -1, like torch.

    Raises:
        TypeError: ``dim`` is not an int.
        IndexError: out of range.
    """
    try:
        d = operator.index(dim)
    except TypeError:
        raise TypeError(f"dim must be an int, got {dim!r}") from None
    n = ndim if ndim > 0 else 1
    if d < -n or d >= n:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {d})"
        )
    return d % n


def axes(dim: Any, ndim: int) -> Any:
    """``dim`` (None, an int, a tuple or a list) as the ``axis`` argument of a reduction.

    Raises:
        ValueError: a dimension named twice.
    """
    if dim is None:
        return None
    if isinstance(dim, (tuple, list)):
        wrapped = tuple(wrap_dim(d, ndim) for d in dim)
        if len(set(wrapped)) != len(wrapped):
            raise ValueError(f"dim {dim!r} names a dimension twice")
        return None if ndim == 0 else wrapped
    d = wrap_dim(dim, ndim)
    return None if ndim == 0 else d


def infer_shape(shape: tuple, n: int, fname: str) -> tuple:
    """A target shape for ``n`` elements, its one ``-1`` entry (if any) filled in.

    Raises:
        ValueError: more than one -1, or the shape does not hold ``n`` elements.
    """
    shape = size_from(shape, fname, allow_minus_one=True)
    if shape.count(-1) > 1:
        raise ValueError(f"{fname}(): only one dimension can be inferred (-1), got {list(shape)}")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if known == 0 or n % known:
            raise ValueError(f"shape '{list(shape)}' is invalid for input of size {n}")
        shape = tuple(n // known if s == -1 else s for s in shape)
    elif known != n:
        raise ValueError(f"shape '{list(shape)}' is invalid for input of size {n}")
    return shape


def need_dims(x: Any, fname: str) -> None:
    """Refuse a 0-d array for an op that works along a dimension (``split``, ``unbind``...)."""
    if x.ndim == 0:
        raise IndexError(f"{fname}() needs a tensor with at least one dimension, got a 0-d one")
