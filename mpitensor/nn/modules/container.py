"""Parameter containers with ``torch.nn``'s names: :class:`ParameterList` and
:class:`ParameterDict` register every tensor they hold as a parameter (state-dict keys
``"0"``, ``"1"``, ... and the dict's keys), and the deprecated :class:`Container`.
(``Sequential``, ``ModuleList`` and ``ModuleDict`` live in :mod:`.layers`.)

A plain Tensor stored in one is wrapped in a :class:`~mpitensor.nn.Parameter` (sharing its
values); any other object is kept as an ordinary attribute, as torch does.

Example:
    >>> import mpitensor as mt
    >>> params = ParameterList([mt.ones(2), mt.zeros(3)])
    >>> list(params.state_dict())
    ['0', '1']
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Iterable, Iterator, Mapping, Optional

from mpitensor.tensor import Tensor

from .module import Module
from ..parameter import Parameter

__all__ = ["ParameterList", "ParameterDict", "Container"]


def _as_parameter(value: Any) -> Any:
    if isinstance(value, Tensor) and not isinstance(value, Parameter):
        return Parameter(value)
    return value


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        kind = "Parameter" if isinstance(value, Parameter) else "Tensor"
        size = "x".join(str(s) for s in value.shape)
        where = "" if value.device.type == "cpu" else f" ({value.device})"
        return f"{kind} containing: [mpitensor.{value.dtype} of size {size}{where}]"
    return f"Object of type: {type(value).__name__}"


def _listing(items: Iterable) -> str:
    # two spaces more than a child module's line, as torch lays them out
    return "\n".join(f"  ({k}): {_describe(v)}" for k, v in items)


class ParameterList(Module):
    """A list of parameters, each registered under its index.

    Args:
        values: an iterable of tensors (wrapped as Parameters) or other objects.

    Example:
        >>> import mpitensor as mt
        >>> params = ParameterList([mt.ones(2)])
        >>> params.append(mt.zeros(1))
        ParameterList(
            (0): Parameter containing: [mpitensor.float32 of size 2]
            (1): Parameter containing: [mpitensor.float32 of size 1]
        )
    """

    def __init__(self, values: Optional[Iterable[Any]] = None) -> None:
        super().__init__()
        self._size = 0
        if values is not None:
            self += values

    def _index(self, idx: int) -> str:
        if not -self._size <= idx < self._size:
            raise IndexError(f"index {idx} is out of range for a ParameterList of length "
                             f"{self._size}")
        return str(idx % self._size)

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            return type(self)(list(self)[idx])
        return getattr(self, self._index(idx))

    def __setitem__(self, idx: int, value: Any) -> None:
        setattr(self, self._index(idx), _as_parameter(value))

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self)))

    def __iadd__(self, values: Iterable[Any]) -> ParameterList:
        return self.extend(values)

    def __dir__(self) -> list:
        return [k for k in super().__dir__() if not k.isdigit()]

    def append(self, value: Any) -> ParameterList:
        """Add ``value`` at the end; returns self."""
        self._size += 1
        self[self._size - 1] = value
        return self

    def extend(self, values: Iterable[Any]) -> ParameterList:
        """Append each of ``values``; returns self.

        Raises:
            TypeError: ``values`` is not iterable (or is a single Tensor).
        """
        if isinstance(values, Tensor) or not isinstance(values, Iterable):
            raise TypeError(f"ParameterList.extend() takes an iterable, got "
                            f"{type(values).__name__}")
        for v in values:
            self.append(v)
        return self

    def extra_repr(self) -> str:
        return _listing((i, v) for i, v in enumerate(self))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("ParameterList is a container and cannot be called")


class ParameterDict(Module):
    """An ordered dict of parameters, each registered under its key.

    A plain mapping given to the constructor or to :meth:`update` is added in sorted key
    order (an ``OrderedDict``, another ParameterDict or a sequence of pairs keeps its own).

    Example:
        >>> import mpitensor as mt
        >>> params = ParameterDict({"b": mt.ones(2), "a": mt.zeros(1)})
        >>> list(params.keys())
        ['a', 'b']
    """

    def __init__(self, parameters: Any = None) -> None:
        super().__init__()
        self._keys: dict = {}
        if parameters is not None:
            self.update(parameters)

    def _key(self, key: Any) -> str:
        if not isinstance(key, str):
            raise TypeError(f"ParameterDict keys must be strings, got {type(key).__name__}")
        return key

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._keys[self._key(key)] = None
        setattr(self, key, _as_parameter(value))

    def __delitem__(self, key: str) -> None:
        del self._keys[key]
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._keys))

    def __reversed__(self) -> Iterator[str]:
        return reversed(list(self._keys))

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def keys(self) -> Iterable[str]:
        """The keys, in order."""
        return list(self._keys)

    def values(self) -> Iterable[Any]:
        """The values, in key order."""
        return [self[k] for k in self._keys]

    def items(self) -> Iterable[tuple]:
        """The (key, value) pairs, in order."""
        return [(k, self[k]) for k in self._keys]

    def get(self, key: str, default: Any = None) -> Any:
        """``self[key]`` if present, else ``default``."""
        return self[key] if key in self else default

    def pop(self, key: str) -> Any:
        """Remove ``key`` and return its value."""
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple:
        """Remove and return the last (key, value) pair."""
        if not self._keys:
            raise KeyError("popitem(): ParameterDict is empty")
        key = next(reversed(self._keys))
        return key, self.pop(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        """``self[key]``, first setting it to ``default`` when absent."""
        if key not in self:
            self[key] = default
        return self[key]

    def clear(self) -> None:
        """Remove every entry."""
        for k in list(self._keys):
            del self[k]

    def copy(self) -> ParameterDict:
        """A new ParameterDict holding the same parameters."""
        return ParameterDict(OrderedDict(self.items()))

    def fromkeys(self, keys: Iterable[str], default: Any = None) -> ParameterDict:
        """A new ParameterDict with each of ``keys`` set to ``default``."""
        return ParameterDict((k, default) for k in keys)

    def update(self, parameters: Any) -> None:
        """Add (or replace) entries from a mapping, a ParameterDict or (key, value) pairs.

        Raises:
            TypeError: ``parameters`` is not a mapping or an iterable of pairs.
        """
        if isinstance(parameters, (OrderedDict, ParameterDict)):
            pairs: Iterable = parameters.items()
        elif isinstance(parameters, Mapping):
            pairs = sorted(parameters.items())
        elif isinstance(parameters, Iterable) and not isinstance(parameters, (str, Tensor)):
            pairs = parameters
        else:
            raise TypeError(f"ParameterDict.update() takes a mapping or an iterable of "
                            f"(key, value) pairs, got {type(parameters).__name__}")
        for i, pair in enumerate(pairs):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"ParameterDict.update(): element {i} is not a (key, value) "
                                 f"pair")
            self[pair[0]] = pair[1]

    def __or__(self, other: ParameterDict) -> ParameterDict:
        out = self.copy()
        out.update(other)
        return out

    def __ror__(self, other: ParameterDict) -> ParameterDict:
        out = other.copy()
        out.update(self)
        return out

    def __ior__(self, other: ParameterDict) -> ParameterDict:
        self.update(other)
        return self

    def extra_repr(self) -> str:
        return _listing(self.items())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("ParameterDict is a container and cannot be called")


class Container(Module):
    """The deprecated ancestor of :class:`~mpitensor.nn.Sequential`: a module holding the
    child modules given as keyword arguments (warns FutureWarning; use Sequential or
    ModuleDict).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     list(Container(act=Module()).named_children())[0][0]
        'act'
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        warnings.warn("nn.Container is deprecated: use nn.Sequential or nn.ModuleDict "
                      "instead", FutureWarning, stacklevel=2)
        for key, value in kwargs.items():
            self.add_module(key, value)
