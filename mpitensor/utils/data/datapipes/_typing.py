"""The element types of DataPipes: ``IterDataPipe[int]`` and the subtype checks that
``argument_validation`` and ``runtime_validation`` make with them."""

from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any, Union

__all__ = ["DataPipeType", "issubinstance", "issubtype"]

_UNION_ORIGINS = (Union, types.UnionType) if hasattr(types, "UnionType") else (Union,)


def _origin(t: Any) -> Any:
    o = typing.get_origin(t)
    return t if o is None else o


def issubtype(left: Any, right: Any) -> bool:
    """True when every value of type ``left`` is a value of type ``right``."""
    if right is Any or left == right:
        return True
    if left is Any:
        return False
    lo, ro = typing.get_origin(left), typing.get_origin(right)
    if lo in _UNION_ORIGINS:
        return all(issubtype(a, right) for a in typing.get_args(left))
    if ro in _UNION_ORIGINS:
        return any(issubtype(left, b) for b in typing.get_args(right))
    lcls, rcls = _origin(left), _origin(right)
    if not (isinstance(lcls, type) and isinstance(rcls, type) and issubclass(lcls, rcls)):
        return False
    rargs = typing.get_args(right)
    if not rargs:
        return True
    largs = typing.get_args(left)
    if not largs:  # List is List[Any]: not known to hold only what right asks
        return all(a is Any for a in rargs)
    if len(largs) != len(rargs):
        return False
    return all(issubtype(a, b) for a, b in zip(largs, rargs))


def issubinstance(data: Any, t: Any) -> bool:
    """True when the value ``data`` is of type ``t`` (containers checked element by element)."""
    if t is Any:
        return True
    o = typing.get_origin(t)
    if o in _UNION_ORIGINS:
        return any(issubinstance(data, a) for a in typing.get_args(t))
    cls = _origin(t)
    if not isinstance(cls, type) or not isinstance(data, cls):
        return False
    args = typing.get_args(t)
    if not args:
        return True
    if isinstance(data, collections.abc.Mapping):
        kt, vt = args if len(args) == 2 else (Any, Any)
        return all(issubinstance(k, kt) and issubinstance(v, vt) for k, v in data.items())
    if isinstance(data, tuple) and cls is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return all(issubinstance(d, args[0]) for d in data)
        return len(args) == len(data) and all(issubinstance(d, a) for d, a in zip(data, args))
    if isinstance(data, collections.abc.Iterable) and len(args) == 1:
        if isinstance(data, (collections.abc.Iterator, collections.abc.Generator)):
            return True  # consuming it to check would lose the values
        return all(issubinstance(d, args[0]) for d in data)
    return True


class DataPipeType:
    """The element type of a DataPipe (``Any`` unless the class was declared ``[T]``)."""

    __slots__ = ("param",)

    def __init__(self, param: Any) -> None:
        self.param = param

    def __repr__(self) -> str:
        return typing._type_repr(self.param)  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataPipeType) and self.param == other.param

    def __hash__(self) -> int:
        return hash(self.param)

    def issubtype(self, other: Any) -> bool:
        """True when this type is a subtype of ``other`` (a DataPipeType or a type)."""
        return issubtype(self.param, other.param if isinstance(other, DataPipeType) else other)

    def issubtype_of_instance(self, other: Any) -> bool:
        """True when the value ``other`` is of this type."""
        return issubinstance(other, self.param)
