"""Parameter containers with ``torch.nn``'s names: :class:`ParameterList` and
:class:`ParameterDict` register every tensor they hold as a parameter (state-dict keys
``"0"``, ``"1"``, ... and the dict's keys), and the deprecated :class:`Container`.
The positional and keyed module containers :class:`Sequential`, :class:`ModuleList` and
:class:`ModuleDict` live here too, as in torch.

A plain Tensor stored in one is wrapped in a :class:`~mpitensor.nn.Parameter` (sharing its
values); any other object is kept as an ordinary attribute, as torch does.

Example:
    >>> import mpitensor as mt
    >>> params = ParameterList([mt.ones(2), mt.zeros(3)])
    >>> list(params.state_dict())
    ['0', '1']
"""

from __future__ import annotations

import operator
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from itertools import groupby
from typing import Any, Optional, Union

from mpitensor.tensor import Tensor

from ..parameter import Parameter
from ._common import _is_int
from .module import Module

__all__ = ["ParameterList", "ParameterDict", "Container", "Sequential", "ModuleList", "ModuleDict"]


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


def _slots(owner: Module) -> Any:
    """The ordered ``name -> child`` registry of ``owner``, a child registered twice included."""
    return owner._modules


def _indent_tail(text: str) -> str:
    """``text`` with every line but the first pushed right by two spaces, for nested reprs."""
    return text.replace("\n", "\n  ")


class _PositionalContainer(Module):
    """Shared machinery of Sequential and ModuleList: children addressed by position.

    Keys are the positions "0", "1", ... (a Sequential built from an OrderedDict keeps its
    own names until an insertion or deletion); any change in the middle relabels every child
    so that key and position agree again.
    """

    def _position(self, idx: Any) -> int:
        """``idx`` (negative counts from the end) as a position in ``range(len(self))``."""
        size = len(self)
        pos = operator.index(idx)
        if pos < -size or pos >= size:
            raise IndexError(
                f"{type(self).__name__} index {pos} is out of range: it holds {size} "
                f"module(s), so use an index from {-size} to {size - 1}"
            )
        return pos + size if pos < 0 else pos

    def _sliced(self, idx: slice) -> Any:
        raise NotImplementedError

    def __getitem__(self, idx: Union[int, slice]) -> Any:
        if isinstance(idx, slice):
            return self._sliced(idx)
        return list(self)[self._position(idx)]

    def _relabel(self, members: list) -> None:
        """Make ``members`` the children, keyed by their positions."""
        for key in list(_slots(self)):
            delattr(self, key)
        for pos, module in enumerate(members):
            self.add_module(str(pos), module)

    def __len__(self) -> int:
        return len(_slots(self))

    def __iter__(self) -> Iterator[Module]:
        return iter(list(_slots(self).values()))

    def __setitem__(self, idx: int, module: Module) -> None:
        self.add_module(list(_slots(self))[self._position(idx)], module)

    def __delitem__(self, idx: Union[int, slice]) -> None:
        members = list(self)
        doomed = set(range(len(members))[idx]) if isinstance(idx, slice) else {self._position(idx)}
        self._relabel([m for pos, m in enumerate(members) if pos not in doomed])

    def __dir__(self) -> list:
        return [name for name in super().__dir__() if not name.isdecimal()]

    def append(self, module: Module) -> Any:
        """Add ``module`` after the last one; returns the container."""
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> Any:
        """Append each module of ``modules`` in turn; returns the container.

        Raises:
            TypeError: ``modules`` is not iterable, or holds something that is not a Module.
        """
        if not isinstance(modules, Iterable):
            raise TypeError(
                f"{type(self).__name__}.extend takes an iterable of modules, got "
                f"{type(modules).__name__}; wrap a single module in a list or use append"
            )
        for module in list(modules):  # a snapshot, so that c.extend(c) terminates
            self.append(module)
        return self

    def pop(self, key: Union[int, slice]) -> Any:
        """Remove the module (or, for a slice, the modules) at ``key`` and return it."""
        taken = self[key]
        del self[key]
        return taken


class Sequential(_PositionalContainer):
    """Run modules one after another; built from modules or from an OrderedDict of them.

    Supports indexing (a slice gives a Sequential that keeps the keys), ``len``, iteration,
    ``append``, ``insert``, ``extend``, ``pop``, ``del``, ``+``, ``+=``, ``*`` and ``*=``.

    Raises:
        TypeError: an element is not a Module.

    Example:
        >>> from collections import OrderedDict
        >>> net = Sequential(OrderedDict([("fc", Linear(2, 2)), ("act", ReLU())]))
        >>> [n for n, _ in net.named_children()], len(net[:1])
        (['fc', 'act'], 1)
    """

    def __init__(self, *args: Any) -> None:
        super().__init__()
        named = len(args) == 1 and isinstance(args[0], OrderedDict)
        pairs = args[0].items() if named else ((str(pos), m) for pos, m in enumerate(args))
        for key, module in pairs:
            self.add_module(key, module)

    def forward(self, input: Any) -> Any:  # noqa: A002 - torch's name
        out = input
        for stage in self:
            out = stage(out)
        return out

    def _sliced(self, idx: slice) -> Sequential:
        return type(self)(OrderedDict(list(_slots(self).items())[idx]))

    def _other_sequential(self, other: Any, op: str) -> Sequential:
        if not isinstance(other, Sequential):
            raise ValueError(
                f"Sequential {op} needs another Sequential on the right, got "
                f"{type(other).__name__}; wrap its modules in nn.Sequential(...) first"
            )
        return other

    def __add__(self, other: Sequential) -> Sequential:
        joined = Sequential()
        joined.extend(self)
        return joined.extend(self._other_sequential(other, "+"))

    def __iadd__(self, other: Sequential) -> Sequential:
        return self.extend(self._other_sequential(other, "+="))

    def _repeats(self, times: Any) -> int:
        if not _is_int(times):
            raise TypeError(
                f"a Sequential can only be repeated an int number of times, got "
                f"{type(times).__name__}"
            )
        if times <= 0:
            raise ValueError(f"a Sequential must be repeated at least once, got {times} times")
        return int(times)

    def __mul__(self, times: int) -> Sequential:
        repeated = Sequential()
        for _ in range(self._repeats(times)):
            repeated.extend(self)
        return repeated

    __rmul__ = __mul__

    def __imul__(self, times: int) -> Sequential:
        once = list(self)
        for _ in range(self._repeats(times) - 1):
            self.extend(once)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        """Put ``module`` at position ``index`` (negative counts from the end); returns self.

        Raises:
            AssertionError: ``module`` is not a Module (torch's exception type).
            IndexError: ``index`` is outside ``[-len, len]``.
        """
        if not isinstance(module, Module):
            raise AssertionError(
                f"Sequential.insert takes a Module, got {type(module).__name__}"
            )
        size = len(self)
        if not -size <= index <= size:
            raise IndexError(
                f"Sequential.insert index {index} is out of range for {size} module(s); "
                f"use an index from {-size} to {size}"
            )
        members = list(self)
        members.insert(index, module)
        self._relabel(members)
        return self


class ModuleList(_PositionalContainer):
    """A list of modules, registered so that ``parameters()`` and ``to()`` see them.

    Indexing (a slice gives a ModuleList numbered from 0), ``len``, iteration, ``append``,
    ``insert``, ``extend``, ``pop``, ``del``, ``+`` and ``+=`` behave as on a list. The repr
    folds runs of identical modules into one line.

    Raises:
        TypeError: an element is not a Module.

    Example:
        >>> layers = ModuleList([Linear(2, 2) for _ in range(3)])
        >>> len(list(layers.parameters()))
        6
    """

    def __init__(self, modules: Optional[Iterable[Module]] = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def _sliced(self, idx: slice) -> ModuleList:
        return type(self)(list(self)[idx])

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList(self).extend(other)

    def insert(self, index: int, module: Module) -> None:
        """Put ``module`` before position ``index``, with ``list.insert``'s index rules.

        Raises:
            TypeError: ``module`` is not a Module.
        """
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList.insert takes a Module, got {type(module).__name__}")
        members = list(self)
        members.insert(index, module)
        self._relabel(members)

    def __repr__(self) -> str:
        if not len(self):
            return self._get_name() + "()"
        rows, first = [], 0
        for text, run in groupby(repr(m) for m in self):
            count = sum(1 for _ in run)
            if count == 1:
                head = f"({first}): "
            else:
                head = f"({first}-{first + count - 1}): {count} x "
            rows.append(_indent_tail(head + text))
            first += count
        return self._get_name() + "(" + "".join("\n  " + row for row in rows) + "\n)"


def _module_pairs(source: Any) -> Iterator[tuple]:
    """The ``(key, module)`` pairs of a mapping, a ModuleDict or an iterable of pairs.

    Pairs are checked one at a time as they are consumed, so an update stops at the first
    malformed one having applied those before it, like ``dict.update``.
    """
    if isinstance(source, (Mapping, ModuleDict)):
        yield from source.items()
        return
    if not isinstance(source, Iterable):
        raise TypeError(
            f"ModuleDict.update takes a mapping or an iterable of (key, module) pairs, got "
            f"{type(source).__name__}"
        )
    for pos, pair in enumerate(source):
        if not isinstance(pair, Iterable):
            raise TypeError(
                f"ModuleDict.update: item #{pos} is a {type(pair).__name__}, not a "
                f"(key, module) pair"
            )
        pair = tuple(pair)
        if len(pair) != 2:
            raise ValueError(
                f"ModuleDict.update: item #{pos} has length {len(pair)}, but each item must "
                f"be a (key, module) pair of length 2"
            )
        yield pair


class ModuleDict(Module):
    """An ordered dict of modules, registered so that ``parameters()`` and ``to()`` see them.

    Keys keep their insertion order; assigning to an existing key replaces the module in
    place. ``update`` takes a mapping, another ModuleDict or an iterable of pairs.

    Raises:
        TypeError: a value is not a Module.

    Example:
        >>> d = ModuleDict({"enc": Linear(2, 2), "act": ReLU()})
        >>> list(d.keys())
        ['enc', 'act']
    """

    def __init__(self, modules: Optional[Any] = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return _slots(self)[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        if key not in _slots(self):
            raise KeyError(key)
        delattr(self, key)

    def __len__(self) -> int:
        return len(_slots(self))

    def __iter__(self) -> Iterator[str]:
        return iter(_slots(self))

    def __contains__(self, key: object) -> bool:
        return key in _slots(self)

    def clear(self) -> None:
        """Remove every module."""
        for key in list(_slots(self)):
            delattr(self, key)

    def pop(self, key: str) -> Module:
        """Remove the module under ``key`` and return it.

        Raises:
            KeyError: no module has that key.
        """
        module = self[key]
        del self[key]
        return module

    def keys(self) -> Iterable[str]:
        """The keys, in insertion order."""
        return _slots(self).keys()

    def items(self) -> Iterable[tuple]:
        """The ``(key, module)`` pairs, in insertion order."""
        return _slots(self).items()

    def values(self) -> Iterable[Module]:
        """The modules, in insertion order."""
        return _slots(self).values()

    def update(self, modules: Any) -> None:
        """Add (or replace) modules from a mapping or an iterable of ``(key, module)`` pairs.

        Raises:
            TypeError: ``modules`` is neither, an item is not a pair, or a value is not a
                Module.
            ValueError: an item has a length other than 2.
        """
        for key, module in _module_pairs(modules):
            self[key] = module
