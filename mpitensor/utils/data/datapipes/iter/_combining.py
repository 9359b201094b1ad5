"""IterDataPipes over several sources: ``concat``, ``zip``, ``mux``, ``fork``, ``demux``."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Callable, List, Optional

from .._decorator import functional_datapipe
from ..datapipe import IterDataPipe, ManySources
from ._basic import _length

__all__ = ["Concater", "Demultiplexer", "Forker", "Multiplexer", "Zipper"]


class _Several(ManySources, IterDataPipe):
    """A pipe over several sources whose length is ``_size`` of theirs."""

    _size: Callable[[List[int]], int] = staticmethod(sum)

    def __len__(self) -> int:
        return self._size([_length(self, dp) for dp in self.datapipes])


@functional_datapipe("concat")
class ConcaterIterDataPipe(_Several):
    """The items of each source in turn (functional name ``concat``)."""

    _what = "concat"

    def __iter__(self) -> Iterator[Any]:
        for dp in self.datapipes:
            yield from dp


@functional_datapipe("zip")
class ZipperIterDataPipe(_Several):
    """Tuples of one item from each source, until the shortest ends (functional name
    ``zip``)."""

    _what = "zip"
    _size = staticmethod(min)

    def __iter__(self) -> Iterator[tuple]:
        yield from zip(*self.datapipes)


@functional_datapipe("mux")
class MultiplexerIterDataPipe(_Several):
    """One item from each source in turn, until the shortest ends (functional name
    ``mux``)."""

    _what = "mux"
    _size = staticmethod(lambda lengths: min(lengths) * len(lengths))

    def __iter__(self) -> Iterator[Any]:
        its = [iter(dp) for dp in self.datapipes]
        while True:
            row = []
            for it in its:
                try:
                    row.append(next(it))
                except StopIteration:
                    return  # the round a source ran out in is dropped whole
            yield from row


class _Shared:
    """One pass over a source, read by several children, each at its own pace; items wait in
    a buffer until every child has read them (at most ``buffer_size``, -1: no bound)."""

    def __init__(self, source: IterDataPipe, n: int, buffer_size: int,
                 route: Optional[Callable[[Any], Optional[int]]], drop_none: bool,
                 what: str) -> None:
        self.source, self.n, self.buffer_size = source, n, buffer_size
        self.route, self.drop_none, self.what = route, drop_none, what
        self.it: Optional[Iterator] = None
        self.queues: List[deque] = []
        self.started: List[bool] = []
        self.done = False

    def start(self, child: int) -> None:
        # one pass feeds every child; a child that iterates again starts the next pass
        if self.it is None or self.started[child]:
            self.it = iter(self.source)
            self.queues = [deque() for _ in range(self.n)]
            self.started = [False] * self.n
            self.done = False
        self.started[child] = True

    def _held(self) -> int:
        return sum(len(q) for q in self.queues) if self.route else max(
            len(q) for q in self.queues)

    def next(self, child: int) -> Any:
        q = self.queues[child]
        while not q:
            if self.done:
                raise StopIteration
            try:
                item = next(self.it)
            except StopIteration:
                self.done = True
                continue
            if self.route is None:
                for c in range(self.n):
                    self.queues[c].append(item)
            else:
                c = self.route(item)
                if c is None and self.drop_none:
                    continue
                if not (isinstance(c, int) and 0 <= c < self.n):
                    raise ValueError(f"{self.what}: classifier_fn must return an int in [0, "
                                     f"{self.n - 1}], got {c!r}")
                self.queues[c].append(item)
            if 0 <= self.buffer_size < self._held():
                raise BufferError(f"{self.what}: the buffer of {self.buffer_size} items is "
                                  f"full; read the children more evenly or raise buffer_size")
        return q.popleft()


class _Child(IterDataPipe):
    def __init__(self, shared: _Shared, index: int) -> None:
        self.shared, self.index = shared, index

    def __iter__(self) -> Iterator[Any]:
        self.shared.start(self.index)
        while True:
            try:
                yield self.shared.next(self.index)
            except StopIteration:
                return

    def __len__(self) -> int:
        if self.shared.route is not None:
            raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
        return _length(self, self.shared.source)


def _num(what: str, n: int) -> int:
    if n < 1:
        raise ValueError(f"{what}: num_instances must be at least 1, got {n}")
    return n


@functional_datapipe("fork")
class ForkerIterDataPipe(IterDataPipe):
    """Split one source into ``num_instances`` children that each yield every item
    (functional name ``fork``); items wait for the slowest child in a buffer of at most
    ``buffer_size`` (-1: unbounded), ``BufferError`` past it. One child: the source."""

    def __new__(cls, datapipe: IterDataPipe, num_instances: int, buffer_size: int = 1000,
                copy: Any = None) -> Any:
        _num("fork", num_instances)
        if copy is not None:
            raise NotImplementedError("fork(copy=...) is not supported; copy in a map() step")
        if num_instances == 1:
            return datapipe
        shared = _Shared(datapipe, num_instances, buffer_size, None, False, "fork")
        return [_Child(shared, i) for i in range(num_instances)]


@functional_datapipe("demux")
class DemultiplexerIterDataPipe(IterDataPipe):
    """Split one source into ``num_instances`` children by ``classifier_fn(item)`` (the
    child's index; None drops the item when ``drop_none``) (functional name ``demux``)."""

    def __new__(cls, datapipe: IterDataPipe, num_instances: int,
                classifier_fn: Callable[[Any], Optional[int]], drop_none: bool = False,
                buffer_size: int = 1000) -> Any:
        _num("demux", num_instances)
        shared = _Shared(datapipe, num_instances, buffer_size, classifier_fn, drop_none,
                         "demux")
        return [_Child(shared, i) for i in range(num_instances)]


# torch's classes are named <Name>IterDataPipe; these are their public names
Concater = ConcaterIterDataPipe
Demultiplexer = DemultiplexerIterDataPipe
Forker = ForkerIterDataPipe
Multiplexer = MultiplexerIterDataPipe
Zipper = ZipperIterDataPipe
