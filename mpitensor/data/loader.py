"""The ``DataLoader`` and the functions that turn samples into batches (``torch.utils.data`` API).

Two ways to build a batch, with equal results. The vectorised one applies when the default
``collate_fn`` is in use and the dataset has a ``gather(indices)`` method
(:class:`TensorDataset`, :class:`~mpitensor.data.datasets.MNIST`, ``Digits``, or a
:class:`Subset` of one of them): the sampler hands over a whole index array per batch and the
dataset answers with one indexing operation per field, so no Python object is made per sample.
Every other dataset, and any custom ``collate_fn``, goes through
``collate_fn([dataset[i] for i in batch])``.

There are no worker processes. ``num_workers > 0`` is accepted so torch scripts run unchanged;
batches are then loaded in this process, identical but not overlapped with compute.
``pin_memory`` is accepted and ignored: host NumPy buffers need no pinning here.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Callable, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor._core.opkit import wrap
from mpitensor.tensor import Tensor, as_tensor

from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, SequentialSampler

__all__ = ["DataLoader", "default_collate", "default_convert", "get_worker_info"]

# dtype kinds with no numeric meaning (object, bytes, str, void): such arrays are not stacked
_NON_NUMERIC_KINDS = frozenset("OSUV")


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or _backend.is_cupy_array(x)


def _stack(arrays: list, what: str) -> Tensor:
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise RuntimeError(f"default_collate: cannot stack {what} of different shapes "
                           f"{sorted(shapes)}; resize or pad the samples to one shape, or pass "
                           "a collate_fn that merges them")
    return wrap(_backend.array_module(arrays[0]).stack(arrays))


@functools.singledispatch
def _collate(first: Any, samples: list) -> Any:
    """Batch ``samples`` (all of the kind of ``first``); registered below per kind."""
    if _is_array(first):  # CuPy arrays: no class to register without importing CuPy
        return _collate_array(first, samples)
    raise TypeError(f"default_collate: cannot batch samples of type {type(first).__name__}; "
                    "samples may hold tensors, arrays, numbers, strings, and dicts, tuples or "
                    "lists of those, otherwise pass DataLoader(collate_fn=...)")


@_collate.register
def _collate_tensor(first: Tensor, samples: list) -> Any:
    return _stack([t._data for t in samples], "tensors")


@_collate.register
def _collate_array(first: np.ndarray, samples: list) -> Any:
    if first.dtype.kind in _NON_NUMERIC_KINDS:
        raise TypeError(f"default_collate: arrays of dtype {first.dtype} hold no numbers to "
                        "stack; convert them, or pass DataLoader(collate_fn=...)")
    return _stack(samples, "arrays")


@_collate.register
def _collate_numpy_scalar(first: np.generic, samples: list) -> Any:
    return wrap(np.asarray(samples, dtype=first.dtype))


def _python_scalar_collator(dtype: type) -> Callable[[Any, list], Any]:
    def collate(first: Any, samples: list) -> Any:
        return wrap(np.asarray(samples, dtype=dtype))
    return collate


# dispatch follows each class's MRO, so bool (an int) and np.float64 (a float, but first an
# np.generic) each reach their own handler whatever the order of registration
for _kind, _dtype in ((bool, np.bool_), (int, np.int64), (float, np.float64)):
    _collate.register(_kind, _python_scalar_collator(_dtype))
del _kind, _dtype


@_collate.register(str)
@_collate.register(bytes)
def _collate_text(first: Any, samples: list) -> Any:
    return list(samples)


@_collate.register
def _collate_mapping(first: Mapping, samples: list) -> Any:
    fields = {key: default_collate([s[key] for s in samples]) for key in first}
    try:
        return type(first)(fields)
    except TypeError:  # a Mapping class whose constructor does not take a dict
        return fields


@_collate.register
def _collate_sequence(first: Sequence, samples: list) -> Any:
    lengths = {len(s) for s in samples}
    if len(lengths) > 1:
        raise RuntimeError(f"default_collate: samples are sequences of different lengths "
                           f"{sorted(lengths)}; make them equal, or pass a collate_fn that "
                           "pads them")
    columns = [default_collate(list(column)) for column in zip(*samples)]
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a namedtuple keeps its type
        return type(first)(*columns)
    return columns


def default_collate(batch: list) -> Any:
    """Merge a list of samples into a batch, as ``torch.utils.data.default_collate``.

    Tensors and arrays are stacked along a new first dimension; Python ints become an int64
    Tensor, floats float64, bools bool; NumPy scalars keep their dtype; strings and bytes stay
    a list; dicts are batched key by key and namedtuples field by field (keeping their type),
    other tuples and lists position by position (giving a list, as torch does).

    Args:
        batch: the samples, all of the same structure.

    Returns:
        The batch, with the structure of one sample.

    Raises:
        ValueError: ``batch`` is empty.
        TypeError: a sample holds something it cannot batch.
        RuntimeError: tensors of different shapes, or sequences of different lengths.

    Example:
        >>> default_collate([(mpitensor.zeros(2), 1), (mpitensor.ones(2), 0)])[1]
        tensor([1, 0])
    """
    if not batch:
        raise ValueError("default_collate: the batch is empty; a batch needs at least one "
                         "sample")
    return _collate(batch[0], batch)


def default_convert(data: Any) -> Any:
    """Turn NumPy data (also inside dicts, tuples and lists) into Tensors, without batching.

    It is the default ``collate_fn`` when batching is off (``batch_size=None``).

    Example:
        >>> default_convert(np.zeros(2))
        tensor([0., 0.], dtype=mpitensor.float64)
    """
    if isinstance(data, (Tensor, str, bytes)):
        return data
    if _is_array(data):
        return data if data.dtype.kind in _NON_NUMERIC_KINDS else as_tensor(data)
    if isinstance(data, np.generic):
        return wrap(np.asarray(data))
    if isinstance(data, Mapping):
        converted = {key: default_convert(value) for key, value in data.items()}
        try:
            return type(data)(converted)
        except TypeError:
            return converted
    if isinstance(data, Sequence):
        items = [default_convert(x) for x in data]
        if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuples keep their type
            return type(data)(*items)
        return items
    return data


def get_worker_info() -> None:
    """Return None, as torch does outside a worker: every batch is loaded in this process."""
    return None


def _check_worker_options(num_workers: Any, timeout: float, prefetch_factor: Optional[int],
                          persistent_workers: bool) -> None:
    """Reject the worker settings torch rejects, though no workers are started here."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"DataLoader: num_workers={num_workers!r}; pass 0 (load in this "
                         "process) or a positive int")
    if timeout < 0:
        raise ValueError(f"DataLoader: timeout={timeout!r} is negative; pass 0 for no limit")
    if prefetch_factor is not None and num_workers == 0:
        raise ValueError(f"DataLoader: prefetch_factor={prefetch_factor!r} applies to worker "
                         "processes only; leave it None or set num_workers > 0")
    if persistent_workers and num_workers == 0:
        raise ValueError("DataLoader: persistent_workers=True needs worker processes; set "
                         "num_workers > 0 or leave persistent_workers=False")


def _check_stream_options(shuffle: Any, sampler: Any, batch_sampler: Any) -> None:
    """An IterableDataset fixes its own order, so no option that orders indices applies."""
    given = [f"{name}={value!r}" for name, value, set_ in
             (("shuffle", shuffle, shuffle not in (None, False)),
              ("sampler", sampler, sampler is not None),
              ("batch_sampler", batch_sampler, batch_sampler is not None)) if set_]
    if given:
        raise ValueError(f"DataLoader: an IterableDataset yields samples in its own order, so "
                         f"{', '.join(given)} cannot apply; leave it unset")


def _check_batching(batch_size: Optional[int], shuffle: bool, sampler: Any, batch_sampler: Any,
                    drop_last: bool) -> None:
    """Refuse combinations where one option would silently override another."""
    if sampler is not None and shuffle:
        raise ValueError("DataLoader: sampler= is mutually exclusive with shuffle=True: the "
                         "sampler decides the order; shuffle inside it (e.g. RandomSampler) "
                         "or drop shuffle")
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ValueError("DataLoader: batch_sampler= decides the batches by itself; leave "
                             "batch_size, shuffle, sampler and drop_last at their defaults")
    elif batch_size is None:
        if drop_last:
            raise ValueError("DataLoader: batch_size=None turns batching off, so there is no "
                             "last batch for drop_last=True to drop; leave drop_last=False")
    elif isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"DataLoader: batch_size={batch_size!r}; pass a positive int, or "
                         "None to turn batching off")


def _default_sampler(dataset: Any, shuffle: bool, generator: Any) -> Any:
    """The sampler torch picks when none is given: random with ``shuffle``, else in order."""
    if shuffle:
        return RandomSampler(dataset, generator=generator)
    return SequentialSampler(dataset)


class DataLoader:
    """Iterate over a dataset in (shuffled) batches, as ``torch.utils.data.DataLoader``.

    Shuffling uses a :class:`RandomSampler` drawing from ``generator`` (default: mpitensor's
    global generator), so ``mpitensor.manual_seed(s)`` before iterating fixes the order.
    Arguments are checked as torch checks them. With the default collate, datasets offering
    ``gather`` are batched by one vectorised gather (see the module notes); a
    :class:`DistributedSampler` counts the indices handed out, so its ``state_dict()`` taken
    inside the loop resumes after the current batch.

    Args:
        dataset: a map-style dataset (or an :class:`IterableDataset`).
        batch_size: samples per batch; None turns batching off (samples are only converted).
        shuffle: a new order every epoch (not together with ``sampler``).
        sampler: where indices come from (a Sampler or any iterable with ``__len__``).
        batch_sampler: yields lists of indices (not together with batch_size, shuffle,
            sampler, drop_last).
        num_workers: accepted for compatibility; loading always runs in this process.
        collate_fn: merges a list of samples (default :func:`default_collate`).
        pin_memory: accepted, no effect.
        drop_last: leave out the last batch when it is short.
        timeout, worker_init_fn, prefetch_factor, persistent_workers: accepted for
            compatibility; with ``num_workers > 0``, ``worker_init_fn(0)`` runs at the start
            of each pass.
        generator: a :class:`mpitensor.Generator` for the shuffle.

    Raises:
        ValueError: options that contradict each other or are out of range.

    Example:
        >>> ds = TensorDataset(mpitensor.arange(10.0).reshape(5, 2), mpitensor.arange(5))
        >>> [x.shape[0] for x, y in DataLoader(ds, batch_size=2)]
        [2, 2, 1]
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[list], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        generator: Any = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
    ) -> None:
        _check_worker_options(num_workers, timeout, prefetch_factor, persistent_workers)
        streamed = isinstance(dataset, IterableDataset)
        if streamed and getattr(dataset, "_is_datapipe", False):
            # an IterDataPipe takes shuffle= as torch's does: it turns its shufflers on or off
            from mpitensor.utils.data.graph_settings import apply_shuffle_settings  # noqa: PLC0415

            dataset, shuffle = apply_shuffle_settings(dataset, shuffle), None
        if streamed:
            _check_stream_options(shuffle, sampler, batch_sampler)
        shuffle = bool(shuffle)
        _check_batching(batch_size, shuffle, sampler, batch_sampler, drop_last)
        if batch_sampler is not None:  # it owns the batching: these describe nothing
            batch_size, drop_last = None, False
        if not streamed:
            if sampler is None:  # set even beside a batch_sampler, as torch does
                sampler = _default_sampler(dataset, shuffle, generator)
            if batch_sampler is None and batch_size is not None:
                batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.dataset, self._streamed = dataset, streamed
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self.batch_size, self.drop_last = batch_size, drop_last
        self.generator = generator
        # kept only so that code reading them back finds what it passed
        self.num_workers, self.worker_init_fn = num_workers, worker_init_fn
        self.pin_memory, self.timeout = pin_memory, timeout
        self.prefetch_factor, self.persistent_workers = prefetch_factor, persistent_workers
        batched = batch_sampler is not None or (streamed and batch_size is not None)
        if collate_fn is None:
            collate_fn = default_collate if batched else default_convert
        self.collate_fn = collate_fn

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers > 0 and self.worker_init_fn is not None:
            self.worker_init_fn(0)  # the in-process loader stands in for worker 0
        if self._streamed:
            return self._from_stream()
        if self.batch_sampler is None:
            return self._one_by_one()
        gather = getattr(self.dataset, "gather", None)
        if self.collate_fn is default_collate and callable(gather):
            return self._gathered(gather)
        return self._collated()

    def _index_arrays(self) -> Iterator[Any]:
        """The batch sampler's batches: int64 arrays from our samplers, else what it yields."""
        if isinstance(self.batch_sampler, BatchSampler):
            return self.batch_sampler._index_batches()
        return iter(self.batch_sampler)

    def _gathered(self, gather: Callable[[np.ndarray], Any]) -> Iterator[Any]:
        for indices in self._index_arrays():
            yield gather(np.asarray(indices, dtype=np.int64))

    def _collated(self) -> Iterator[Any]:
        dataset, collate = self.dataset, self.collate_fn
        for indices in self._index_arrays():
            if isinstance(indices, np.ndarray):  # plain ints, as a torch dataset expects
                indices = indices.tolist()
            yield collate([dataset[i] for i in indices])

    def _one_by_one(self) -> Iterator[Any]:
        for index in self.sampler:
            yield self.collate_fn(self.dataset[index])

    def _from_stream(self) -> Iterator[Any]:
        samples = iter(self.dataset)
        if self.batch_size is None:
            yield from map(self.collate_fn, samples)
            return
        while True:
            batch = list(itertools.islice(samples, self.batch_size))
            short = len(batch) < self.batch_size
            if batch and not (short and self.drop_last):
                yield self.collate_fn(batch)
            if short:  # the stream has ended: do not pull from it again
                return

    def __len__(self) -> int:
        if not self._streamed:
            return len(self.sampler if self.batch_sampler is None else self.batch_sampler)
        count = len(self.dataset)
        if self.batch_size is None:
            return count
        full, rest = divmod(count, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __repr__(self) -> str:
        return (f"DataLoader(dataset={type(self.dataset).__name__}(len={len(self.dataset)}), "
                f"batch_size={self.batch_size}, sampler={type(self.sampler).__name__}, "
                f"drop_last={self.drop_last})")
