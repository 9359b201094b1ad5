"""``torch.utils.data.datapipes.map``: the built-in map-style DataPipes.

Each is also a method of every MapDataPipe under its functional name: ``Mapper`` is
``dp.map``, ``Batcher`` ``dp.batch``, ``Concater`` ``dp.concat``, ``Shuffler`` ``dp.shuffle``
and ``Zipper`` ``dp.zip``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, Callable, Optional

from .._decorator import functional_datapipe
from .._shuffling import ShuffleSwitch
from ..datapipe import Batching, ManySources, MapDataPipe

__all__ = ["Batcher", "Concater", "Mapper", "SequenceWrapper", "Shuffler", "Zipper"]


class SequenceWrapperMapDataPipe(MapDataPipe):
    """Wrap a sequence or mapping as a MapDataPipe (a deep copy of it with ``deepcopy``, the
    default)."""

    def __init__(self, sequence: Any, deepcopy: bool = True) -> None:
        if deepcopy:
            try:
                sequence = copy.deepcopy(sequence)
            except TypeError:
                pass
        self.sequence = sequence

    def __getitem__(self, index: Any) -> Any:
        return self.sequence[index]

    def __len__(self) -> int:
        return len(self.sequence)


def _identity(x: Any) -> Any:
    return x


@functional_datapipe("map")
class MapperMapDataPipe(MapDataPipe):
    """``fn(dp[i])`` for each key (functional name ``map``)."""

    def __init__(self, datapipe: MapDataPipe, fn: Callable = _identity) -> None:
        if not callable(fn):
            raise TypeError(f"map: fn must be callable, got {type(fn).__name__}")
        self.datapipe, self.fn = datapipe, fn

    def __getitem__(self, index: Any) -> Any:
        return self.fn(self.datapipe[index])

    def __len__(self) -> int:
        return len(self.datapipe)


@functional_datapipe("batch")
class BatcherMapDataPipe(Batching, MapDataPipe):
    """Batch ``i`` holds items ``i * batch_size`` on (functional name ``batch``); the last,
    shorter one is kept unless ``drop_last``."""

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < len(self):
            raise IndexError(f"Index {index} is out of bound.")
        start = index * self.batch_size
        stop = min(start + self.batch_size, len(self.datapipe))
        return self.wrapper_class([self.datapipe[i] for i in range(start, stop)])

    def __len__(self) -> int:
        return self._batches(len(self.datapipe))


@functional_datapipe("concat")
class ConcaterMapDataPipe(ManySources, MapDataPipe):
    """The items of each source in turn, indexed 0 to the total length (functional name
    ``concat``)."""

    _what = "concat"

    def __getitem__(self, index: int) -> Any:
        offset = index
        for dp in self.datapipes:
            if 0 <= offset < len(dp):
                return dp[offset]
            offset -= len(dp)
        raise IndexError(f"Index {index} is out of range.")

    def __len__(self) -> int:
        return sum(len(dp) for dp in self.datapipes)


@functional_datapipe("zip")
class ZipperMapDataPipe(ManySources, MapDataPipe):
    """``(dp1[i], dp2[i], ...)``, as long as the shortest (functional name ``zip``)."""

    _what = "zip"

    def __getitem__(self, index: Any) -> tuple:
        return tuple(dp[index] for dp in self.datapipes)

    def __len__(self) -> int:
        return min(len(dp) for dp in self.datapipes)


@functional_datapipe("shuffle")
class ShufflerMapDataPipe(ShuffleSwitch, MapDataPipe):
    """The items at ``indices`` (all keys ``range(len)`` by default) in a random order, new
    each epoch (functional name ``shuffle``); ``dp[i]`` reads the i-th key of that order, and
    iterating yields them. :meth:`set_seed` fixes the next order, ``set_shuffle(False)``
    keeps ``indices`` in order."""

    def __init__(self, datapipe: MapDataPipe, *, indices: Optional[list] = None) -> None:
        self.datapipe = datapipe
        self.indices = list(range(len(datapipe))) if indices is None else list(indices)
        self._init_switch()
        self._order: Optional[list] = None

    def reset(self) -> None:
        """Draw the next order."""
        if not self._enabled:
            self._order = list(self.indices)
            return
        self._seed_rng()
        # drawn as a sample and read from its end, as torch does: one seed, one order
        self._order = self._rng.sample(self.indices, len(self.indices))[::-1]

    def __getitem__(self, index: int) -> Any:
        if self._order is None:
            self.reset()
        return self.datapipe[self._order[index]]

    def __iter__(self) -> Iterator[Any]:
        self.reset()
        for i in self._order:
            yield self.datapipe[i]

    def __len__(self) -> int:
        return len(self.indices)


# torch's classes are named <Name>MapDataPipe; these are their public names
Batcher = BatcherMapDataPipe
Concater = ConcaterMapDataPipe
Mapper = MapperMapDataPipe
SequenceWrapper = SequenceWrapperMapDataPipe
Shuffler = ShufflerMapDataPipe
Zipper = ZipperMapDataPipe
