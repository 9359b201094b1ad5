"""The DataPipe base classes: :class:`IterDataPipe`, :class:`MapDataPipe`, :class:`DataChunk`
and :class:`DFIterDataPipe`, with the registry of functional forms.

A DataPipe class registered under a name (``@functional_datapipe("map")``) becomes a method of
every DataPipe of its kind: ``dp.map(fn)`` is ``Mapper(dp, fn)``.

Example:
    >>> from mpitensor.utils.data.datapipes.iter import IterableWrapper
    >>> list(IterableWrapper(range(4)).map(lambda x: x * 10).filter(lambda x: x > 0))
    [10, 20, 30]
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, Callable, Dict

from mpitensor.data.dataset import Dataset, IterableDataset

from ._typing import DataPipeType

__all__ = ["DFIterDataPipe", "DataChunk", "IterDataPipe", "MapDataPipe"]

_ANY = DataPipeType(Any)


class _TypedPipe:
    """What both kinds share: the element type (``Pipe[T]``) and the functional registry."""

    functions: Dict[str, Callable] = {}
    type: DataPipeType = _ANY
    _typed_cache: Dict[Any, type] = {}

    def __class_getitem__(cls, param: Any) -> type:
        key = (cls, param)
        hit = _TypedPipe._typed_cache.get(key)
        if hit is None:
            name = f"{cls.__name__}[{DataPipeType(param)!r}]"
            hit = type(cls)(name, (cls,), {"type": DataPipeType(param),
                                          "__module__": cls.__module__,
                                          "__qualname__": name})
            _TypedPipe._typed_cache[key] = hit
        return hit

    @classmethod
    def register_function(cls, function_name: str, function: Callable) -> None:
        """Make ``function(self, ...)`` callable as ``dp.<function_name>(...)``."""
        cls.functions[function_name] = function

    @classmethod
    def register_datapipe_as_function(cls, function_name: str, cls_to_register: type,
                                      enable_df_api_tracing: bool = False) -> None:
        """Make ``dp.<function_name>(*args)`` build ``cls_to_register(dp, *args)``.

        Raises:
            RuntimeError: the name is taken.
            NotImplementedError: ``enable_df_api_tracing`` (data-frame tracing is not here).
        """
        if enable_df_api_tracing:
            raise NotImplementedError("the data-frame API tracing of torch's DataPipes is not "
                                      "supported; register without enable_df_api_tracing")
        if function_name in cls.functions:
            raise RuntimeError(f"Unable to add DataPipe function name {function_name} as it "
                               f"is already taken")

        def build(source: Any, *args: Any, **kwargs: Any) -> Any:
            return cls_to_register(source, *args, **kwargs)

        functools.update_wrapper(build, cls_to_register)
        cls.functions[function_name] = build

    def __getattr__(self, name: str) -> Any:
        fn = type(self).functions.get(name)
        if fn is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        return functools.partial(fn, self)

    def __dir__(self) -> list:
        return sorted(set(super().__dir__()) | set(type(self).functions))

    def __repr__(self) -> str:
        return type(self).__qualname__

    __str__ = __repr__


class IterDataPipe(_TypedPipe, IterableDataset):
    """An iterable-style DataPipe: ``iter(dp)`` yields its items.

    Subclasses implement ``__iter__`` (and ``__len__`` where the length is known). Every
    IterDataPipe has the functional forms registered for it (``map``, ``filter``, ``batch``,
    ``shuffle``, ``zip``, ...), and is an :class:`~mpitensor.data.IterableDataset`, so a
    :class:`~mpitensor.data.DataLoader` takes it.
    """

    functions: Dict[str, Callable] = {}
    _is_datapipe = True  # DataLoader's mark: shuffle= switches the pipe's shufflers
    repr_hook: Any = None
    str_hook: Any = None

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} does not implement __iter__")

    def reset(self) -> None:
        """Called at the start of each iteration; pipes with per-epoch state override it."""

    def __add__(self, other: Any) -> Any:
        raise TypeError("IterDataPipe does not support +; use .concat(other) instead")


class MapDataPipe(_TypedPipe, Dataset):
    """A map-style DataPipe: ``dp[key]`` returns an item and ``len(dp)`` counts them.

    Subclasses implement ``__getitem__`` and ``__len__``; the functional forms registered for
    map pipes (``map``, ``batch``, ``shuffle``, ``zip``, ``concat``) are methods of each.
    """

    functions: Dict[str, Callable] = {}

    def __getitem__(self, index: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement __getitem__")


class DataChunk(list):
    """A batch of items as a list (what ``batch`` yields); ``raw_iterator()`` walks it."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self.items = self

    def as_str(self, indent: str = "") -> str:
        """The chunk as text, after ``indent``."""
        return indent + "[" + ", ".join(str(i) for i in iter(self)) + "]"

    def __str__(self) -> str:
        return self.as_str()

    def raw_iterator(self) -> Iterator[Any]:
        """Iterate over the items as a plain list would."""
        yield from list.__iter__(self)


class DFIterDataPipe(IterDataPipe):
    """An IterDataPipe whose items are data frames (pandas ones, where torch's data-frame
    pipes are used); a marker base class that pipes of data frames derive from."""

    def _is_dfpipe(self) -> bool:
        return True


class ManySources:
    """Mixin of the pipes over several sources (``concat``, ``zip``, ``mux``): ``__init__``
    keeps them as ``self.datapipes``, after checking there is one at least, each a pipe of
    the class's own kind (``ValueError``, ``TypeError``)."""

    _what = ""

    def __init__(self, *datapipes: Any) -> None:
        kind = IterDataPipe if isinstance(self, IterDataPipe) else MapDataPipe
        if not datapipes:
            raise ValueError(f"{self._what}: expected at least one DataPipe, got none")
        if not all(isinstance(dp, kind) for dp in datapipes):
            raise TypeError(f"{self._what}: every input must be an {kind.__name__}")
        self.datapipes = datapipes


class Batching:
    """Mixin of the ``batch`` pipes: their arguments, checked, and the number of batches."""

    def __init__(self, datapipe: Any, batch_size: int, drop_last: bool = False,
                 wrapper_class: type = DataChunk) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch: batch_size must be positive, got {batch_size}")
        self.datapipe, self.batch_size = datapipe, batch_size
        self.drop_last, self.wrapper_class = drop_last, wrapper_class

    def _batches(self, n: int) -> int:
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
