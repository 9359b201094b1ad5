"""The basic IterDataPipes: wrapping, mapping, filtering, batching, grouping, sharding,
sampling and shuffling."""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Iterator
from typing import Any, Callable, Optional

from mpitensor.data.sampler import SequentialSampler

from .._decorator import functional_datapipe
from .._shuffling import ShuffleSwitch
from ..datapipe import Batching, DataChunk, IterDataPipe

__all__ = ["Batcher", "Collator", "Filter", "Grouper", "IterableWrapper", "Mapper", "Sampler",
           "ShardingFilter", "Shuffler", "UnBatcher"]


def _no_len(pipe: Any) -> TypeError:
    return TypeError(f"{type(pipe).__name__} instance doesn't have valid length")


def _length(pipe: Any, source: Any) -> int:
    try:
        return len(source)
    except TypeError:
        raise _no_len(pipe) from None


class IterableWrapperIterDataPipe(IterDataPipe):
    """Wrap an iterable as an IterDataPipe; with ``deepcopy`` (the default), each iteration
    walks a deep copy made when it starts, so changes to the items made downstream do not
    reach the source."""

    def __init__(self, iterable: Any, deepcopy: bool = True) -> None:
        self.iterable = iterable
        self.deepcopy = deepcopy

    def __iter__(self) -> Iterator[Any]:
        source = self.iterable
        if self.deepcopy:
            try:
                source = copy.deepcopy(self.iterable)
            except TypeError:  # an iterable that cannot be copied (a generator) is used as is
                pass
        yield from source

    def __len__(self) -> int:
        return _length(self, self.iterable)


def _check_cols(input_col: Any, output_col: Any) -> None:
    if input_col is None and output_col is not None:
        raise ValueError("output_col must be None when input_col is None")
    if isinstance(output_col, (list, tuple)):
        if len(output_col) > 1:
            raise ValueError("output_col must be a single-element list or tuple")


def _apply_cols(fn: Callable, data: Any, input_col: Any, output_col: Any) -> Any:
    """``fn`` on the columns ``input_col`` of ``data``, written to ``output_col`` (the input
    column when None, appended for -1), in a copy of ``data``."""
    if input_col is None:
        return fn(data)
    many = isinstance(input_col, (list, tuple))
    res = fn(*(data[c] for c in input_col)) if many else fn(data[input_col])
    was_tuple = isinstance(data, tuple)
    out = list(data) if was_tuple else copy.copy(data)
    if isinstance(output_col, (list, tuple)):
        output_col = output_col[0]
    if output_col is None:
        if many:
            out[input_col[0]] = res
            rest = list(input_col[1:])
            if all(isinstance(c, int) for c in rest):
                rest.sort(reverse=True)  # later positions first: earlier ones stay put
            for c in rest:
                del out[c]
        else:
            out[input_col] = res
    elif output_col == -1:
        out.append(res)
    else:
        out[output_col] = res
    return tuple(out) if was_tuple else out


@functional_datapipe("map")
class MapperIterDataPipe(IterDataPipe):
    """Apply ``fn`` to each item (functional name ``map``); ``input_col`` picks the
    column(s) given to it and ``output_col`` where the result goes (-1: appended)."""

    def __init__(self, datapipe: IterDataPipe, fn: Callable, input_col: Any = None,
                 output_col: Any = None) -> None:
        if not callable(fn):
            raise TypeError(f"map: fn must be callable, got {type(fn).__name__}")
        _check_cols(input_col, output_col)
        self.datapipe, self.fn = datapipe, fn
        self.input_col, self.output_col = input_col, output_col

    def __iter__(self) -> Iterator[Any]:
        for data in self.datapipe:
            yield _apply_cols(self.fn, data, self.input_col, self.output_col)

    def __len__(self) -> int:
        return _length(self, self.datapipe)


@functional_datapipe("collate")
class CollatorIterDataPipe(MapperIterDataPipe):
    """Collate each item (a batch) into tensors (functional name ``collate``), with
    ``collate_fn`` or by ``default_collate``."""

    def __init__(self, datapipe: IterDataPipe, conversion: Any = None,
                 collate_fn: Optional[Callable] = None) -> None:
        from mpitensor.data.loader import default_collate  # noqa: PLC0415

        if collate_fn is not None:
            fn = collate_fn
        elif conversion is None:
            fn = default_collate
        elif callable(conversion):
            fn = conversion
        else:
            raise NotImplementedError("collate(): a dict of per-column conversions (torch's "
                                      "data-frame collation) is not supported; pass a "
                                      "function")
        super().__init__(datapipe, fn)


@functional_datapipe("filter")
class FilterIterDataPipe(IterDataPipe):
    """Keep the items for which ``filter_fn`` (on ``input_col``, if given) returns True
    (functional name ``filter``); a result that is not a bool raises ``ValueError``."""

    def __init__(self, datapipe: IterDataPipe, filter_fn: Callable, input_col: Any = None
                 ) -> None:
        if not callable(filter_fn):
            raise TypeError(f"filter: filter_fn must be callable, got "
                            f"{type(filter_fn).__name__}")
        self.datapipe, self.filter_fn, self.input_col = datapipe, filter_fn, input_col

    def __iter__(self) -> Iterator[Any]:
        col = self.input_col
        for data in self.datapipe:
            if col is None:
                keep = self.filter_fn(data)
            elif isinstance(col, (list, tuple)):
                keep = self.filter_fn(*(data[c] for c in col))
            else:
                keep = self.filter_fn(data[col])
            if not isinstance(keep, bool):
                raise ValueError(f"filter_fn of {type(self).__name__} must return a bool, got "
                                 f"{type(keep).__name__}")
            if keep:
                yield data


@functional_datapipe("batch")
class BatcherIterDataPipe(Batching, IterDataPipe):
    """Group consecutive items into batches of ``batch_size`` (functional name ``batch``);
    the last, shorter one is kept unless ``drop_last``."""

    def __iter__(self) -> Iterator[Any]:
        batch: list = []
        for x in self.datapipe:
            batch.append(x)
            if len(batch) == self.batch_size:
                yield self.wrapper_class(batch)
                batch = []
        if batch and not self.drop_last:
            yield self.wrapper_class(batch)

    def __len__(self) -> int:
        return self._batches(_length(self, self.datapipe))


@functional_datapipe("unbatch")
class UnBatcherIterDataPipe(IterDataPipe):
    """Undo ``unbatch_level`` levels of batching (-1: all of them) (functional name
    ``unbatch``)."""

    def __init__(self, datapipe: IterDataPipe, unbatch_level: int = 1) -> None:
        if unbatch_level < -1:
            raise ValueError(f"unbatch: unbatch_level must be -1 or more, got {unbatch_level}")
        self.datapipe, self.unbatch_level = datapipe, unbatch_level

    def _flatten(self, item: Any, level: int) -> Iterator[Any]:
        if level == 0:
            yield item
            return
        if not isinstance(item, list):
            if level == -1:
                yield item
                return
            raise IndexError(f"unbatch_level {self.unbatch_level} is deeper than the batches")
        for x in item:
            yield from self._flatten(x, level if level == -1 else level - 1)

    def __iter__(self) -> Iterator[Any]:
        for item in self.datapipe:
            yield from self._flatten(item, self.unbatch_level)


@functional_datapipe("groupby")
class GrouperIterDataPipe(IterDataPipe):
    """Group items by ``group_key_fn`` into batches (functional name ``groupby``): a group is
    yielded when it reaches ``group_size``, when the buffer of ``buffer_size`` items is full
    (its largest group), and at the end."""

    def __init__(self, datapipe: IterDataPipe, group_key_fn: Callable, *,
                 keep_key: bool = False, buffer_size: int = 10000,
                 group_size: Optional[int] = None, guaranteed_group_size: Optional[int] = None,
                 drop_remaining: bool = False) -> None:
        if buffer_size <= 0:
            raise ValueError(f"groupby: buffer_size must be positive, got {buffer_size}")
        if group_size is not None and not 0 < group_size <= buffer_size:
            raise ValueError(f"groupby: group_size must be in (0, buffer_size], got "
                             f"{group_size}")
        if guaranteed_group_size is not None:
            if group_size is None or not 0 < guaranteed_group_size <= group_size:
                raise ValueError("groupby: guaranteed_group_size needs a group_size and must "
                                 "be in (0, group_size]")
        self.datapipe, self.group_key_fn, self.keep_key = datapipe, group_key_fn, keep_key
        self.buffer_size, self.group_size = buffer_size, group_size
        self.guaranteed_group_size = guaranteed_group_size
        self.drop_remaining = drop_remaining
        self.wrapper_class = DataChunk

    def _out(self, key: Any, items: list) -> Any:
        chunk = self.wrapper_class(items)
        return (key, chunk) if self.keep_key else chunk

    def __iter__(self) -> Iterator[Any]:
        groups: dict = defaultdict(list)
        held = 0
        guaranteed = self.guaranteed_group_size
        for x in self.datapipe:
            key = self.group_key_fn(x)
            groups[key].append(x)
            held += 1
            if self.group_size is not None and len(groups[key]) == self.group_size:
                held -= self.group_size
                yield self._out(key, groups.pop(key))
            if held == self.buffer_size:
                big = max(groups, key=lambda k: len(groups[k]))
                items = groups.pop(big)
                held -= len(items)
                if guaranteed is not None and len(items) < guaranteed:
                    if not self.drop_remaining:
                        raise RuntimeError(f"groupby: the buffer is full and its largest group "
                                           f"{items} is smaller than guaranteed_group_size")
                    continue
                yield self._out(big, items)
        for key in list(groups):
            yield self._out(key, groups.pop(key))


@functional_datapipe("sharding_filter")
class ShardingFilterIterDataPipe(IterDataPipe):
    """Keep every ``num_of_instances``-th item, from ``instance_id`` on, once
    :meth:`apply_sharding` has been called (functional name ``sharding_filter``); all items
    before that."""

    def __init__(self, source_datapipe: IterDataPipe, sharding_group_filter: Any = None
                 ) -> None:
        self.source_datapipe = source_datapipe
        self.sharding_group_filter = sharding_group_filter
        self.num_of_instances, self.instance_id = 1, 0

    def is_shardable(self) -> bool:
        return True

    def apply_sharding(self, num_of_instances: int, instance_id: int,
                       sharding_group: Any = None) -> None:
        """Keep item ``i`` when ``i % num_of_instances == instance_id``."""
        if not 0 <= instance_id < num_of_instances:
            raise ValueError(f"apply_sharding: instance_id {instance_id} must be in [0, "
                             f"{num_of_instances})")
        self.num_of_instances, self.instance_id = num_of_instances, instance_id

    def __iter__(self) -> Iterator[Any]:
        for i, item in enumerate(self.source_datapipe):
            if i % self.num_of_instances == self.instance_id:
                yield item

    def __len__(self) -> int:
        n = _length(self, self.source_datapipe)
        return n // self.num_of_instances + (1 if self.instance_id < n % self.num_of_instances
                                             else 0)


class SamplerIterDataPipe(IterDataPipe):
    """Yield the items of ``datapipe`` in the order a sampler over it gives (a
    ``SequentialSampler`` by default); ``datapipe`` must have a length."""

    def __init__(self, datapipe: IterDataPipe, sampler: type = SequentialSampler,
                 sampler_args: Optional[tuple] = None,
                 sampler_kwargs: Optional[dict] = None) -> None:
        self.datapipe = datapipe
        self.sampler = sampler(datapipe, *(sampler_args or ()), **(sampler_kwargs or {}))

    def __iter__(self) -> Iterator[Any]:
        return iter(self.sampler)

    def __len__(self) -> int:
        return _length(self, self.sampler)


@functional_datapipe("shuffle")
class ShufflerIterDataPipe(ShuffleSwitch, IterDataPipe):
    """Shuffle with a buffer of ``buffer_size`` items (functional name ``shuffle``): the
    buffer fills, then each new item replaces a random one, which is yielded. A new seed each
    epoch is drawn from mpitensor's generator unless :meth:`set_seed` fixed one; ``set_shuffle
    (False)`` (or ``DataLoader(shuffle=False)``) passes the items through in order."""

    def __init__(self, datapipe: IterDataPipe, *, buffer_size: int = 10000,
                 unbatch_level: int = 0) -> None:
        if buffer_size <= 0:
            raise ValueError(f"shuffle: buffer_size must be positive, got {buffer_size}")
        self.datapipe = datapipe if unbatch_level == 0 else datapipe.unbatch(unbatch_level)
        self.buffer_size = buffer_size
        self._init_switch()

    def reset(self) -> None:
        if self._enabled:
            self._seed_rng()

    def __iter__(self) -> Iterator[Any]:
        if not self._enabled:
            yield from self.datapipe
            return
        self.reset()
        buf: list = []
        for x in self.datapipe:
            if len(buf) == self.buffer_size:
                i = self._rng.randint(0, len(buf) - 1)
                buf[i], x = x, buf[i]
                yield x
            else:
                buf.append(x)
        while buf:
            yield buf.pop(self._rng.randint(0, len(buf) - 1))

    def __len__(self) -> int:
        return _length(self, self.datapipe)


# torch's classes are named <Name>IterDataPipe; these are their public names
Batcher = BatcherIterDataPipe
Collator = CollatorIterDataPipe
Filter = FilterIterDataPipe
Grouper = GrouperIterDataPipe
IterableWrapper = IterableWrapperIterDataPipe
Mapper = MapperIterDataPipe
Sampler = SamplerIterDataPipe
ShardingFilter = ShardingFilterIterDataPipe
Shuffler = ShufflerIterDataPipe
UnBatcher = UnBatcherIterDataPipe
