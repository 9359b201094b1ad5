"""``DataLoader`` and the default collate functions, as in ``torch.utils.data``.

Fast path: with the default ``collate_fn``, a dataset that offers ``gather(indices)``
(:class:`TensorDataset`, :class:`~mpitensor.data.datasets.MNIST`, ``Digits``, and a
:class:`Subset` of any of them) is batched with one vectorised gather per field per batch,
fed by whole index arrays from the sampler: no per-sample Python loop and no per-sample tensor.
Any other dataset, or a custom ``collate_fn``, takes the general path
``collate_fn([dataset[i] for i in batch])``; both give the same batches.

``num_workers > 0`` is accepted for source compatibility but the batches are always loaded
in this process (there are no worker processes): results are identical, only not overlapped.
``pin_memory`` is accepted and has no effect (NumPy memory needs no pinning here).
"""

from __future__ import annotations

import collections.abc
from collections.abc import Iterator
from typing import Any, Callable, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor.tensor import Tensor, _new, as_tensor

from .dataset import IterableDataset
from .sampler import BatchSampler, RandomSampler, SequentialSampler

__all__ = ["DataLoader", "default_collate", "default_convert", "get_worker_info"]


def _is_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) or _backend.is_cupy_array(x)


def default_collate(batch: list) -> Any:
    """Merge a list of samples into a batch, as ``torch.utils.data.default_collate``.

    Tensors and arrays are stacked into a Tensor with a new first dimension; Python ints become
    an int64 Tensor, floats float64, bools bool; NumPy scalars keep their dtype; strings and
    bytes stay a list; mappings, namedtuples and sequences are collated field by field
    (tuples and lists give a list, as in torch).

    Raises:
        TypeError: an element type it cannot collate. RuntimeError: sequences of unequal size.

    Example:
        >>> default_collate([(mpitensor.zeros(2), 1), (mpitensor.ones(2), 0)])[1]
        tensor([1, 0])
    """
    if not batch:
        raise ValueError("default_collate: empty batch")
    elem = batch[0]
    if isinstance(elem, Tensor):
        arrays = [t._data for t in batch]
        return _new(_backend.array_module(arrays[0]).stack(arrays))
    if _is_array(elem):
        if elem.dtype.kind in "OSUV":
            raise TypeError(f"default_collate: cannot collate arrays of dtype {elem.dtype}")
        return _new(_backend.array_module(elem).stack(batch))
    if isinstance(elem, np.generic):
        return _new(np.asarray(batch, dtype=elem.dtype))
    if isinstance(elem, bool):
        return _new(np.asarray(batch, dtype=np.bool_))
    if isinstance(elem, int):
        return _new(np.asarray(batch, dtype=np.int64))
    if isinstance(elem, float):
        return _new(np.asarray(batch, dtype=np.float64))
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, collections.abc.Mapping):
        merged = {k: default_collate([d[k] for d in batch]) for k in elem}
        try:
            return type(elem)(merged)
        except TypeError:  # a Mapping type that cannot be built from a dict
            return merged
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return type(elem)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        size = len(elem)
        if any(len(e) != size for e in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        return [default_collate(list(s)) for s in zip(*batch)]
    raise TypeError(f"default_collate: batch must contain tensors, arrays, numbers, dicts or "
                    f"lists; found {type(elem).__name__}")


def default_convert(data: Any) -> Any:
    """Turn arrays (and arrays inside containers) into Tensors without batching them.

    Example:
        >>> default_convert(np.zeros(2))
        tensor([0., 0.], dtype=mpitensor.float64)
    """
    if isinstance(data, Tensor):
        return data
    if _is_array(data):
        return data if data.dtype.kind in "OSUV" else as_tensor(data)
    if isinstance(data, np.generic):
        return _new(np.asarray(data))
    if isinstance(data, collections.abc.Mapping):
        return {k: default_convert(v) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return [default_convert(d) for d in data]
    return data


def get_worker_info() -> None:
    """Return None: batches are always loaded in the main process (see the module notes)."""
    return None


class DataLoader:
    """Iterate over a dataset in (shuffled) batches, as ``torch.utils.data.DataLoader``.

    Shuffling uses a :class:`RandomSampler` drawing from ``generator`` (default: mpitensor's
    global generator), so ``mpitensor.manual_seed(s)`` before building the iterator fixes the
    order. Arguments are validated as in torch. With the default collate, datasets offering
    ``gather`` are batched by one vectorised gather (see the module notes); a
    :class:`DistributedSampler` counts the indices handed out, so its ``state_dict()`` taken
    inside the loop resumes after the current batch.

    Args:
        dataset: a map-style dataset (or an :class:`IterableDataset`).
        batch_size: samples per batch; None disables batching (samples are only converted).
        shuffle: reshuffle every epoch (mutually exclusive with ``sampler``).
        sampler: where indices come from (a Sampler or any iterable with ``__len__``).
        batch_sampler: yields lists of indices (mutually exclusive with batch_size, shuffle,
            sampler, drop_last).
        num_workers: accepted for compatibility; loading always runs in this process.
        collate_fn: merges a list of samples (default :func:`default_collate`).
        pin_memory: accepted, no effect.
        drop_last: drop the last incomplete batch.
        timeout, worker_init_fn, prefetch_factor, persistent_workers: accepted for
            compatibility; ``worker_init_fn(0)`` is called once at the start of each pass when
            ``num_workers > 0``.
        generator: a :class:`mpitensor.Generator` for the shuffle.

    Raises:
        ValueError: conflicting options, as torch raises them.

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
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                             "disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                             "let num_workers > 0 to enable multiprocessing, otherwise set "
                             "prefetch_factor to None.")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset = dataset
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.generator = generator
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle not in (False, None):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"shuffle option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"sampler option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"batch_sampler option, but got batch_sampler={batch_sampler}")
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None:
            if drop_last:
                raise ValueError("batch_size=None option disables auto-batching and is mutually "
                                 "exclusive with drop_last")
        elif (not isinstance(batch_size, int) or isinstance(batch_size, bool)
              or batch_size <= 0):
            raise ValueError(f"batch_size should be a positive integer value, but got "
                             f"batch_size={batch_size!r}")
        if sampler is None and not self._iterable:
            sampler = (RandomSampler(dataset, generator=generator) if shuffle
                       else SequentialSampler(dataset))
        if batch_size is not None and batch_sampler is None and not self._iterable:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self._auto_collation = batch_sampler is not None or (self._iterable and batch_size)
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn

    def _gather_fn(self) -> Optional[Callable[[np.ndarray], Any]]:
        if self.collate_fn is not default_collate or self._iterable:
            return None
        fn = getattr(self.dataset, "gather", None)
        return fn if callable(fn) else None

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers > 0 and self.worker_init_fn is not None:
            self.worker_init_fn(0)
        if self._iterable:
            return self._iter_iterable()
        if self.batch_sampler is None:
            return self._iter_unbatched()
        gather = self._gather_fn()
        if gather is not None:
            return self._iter_fast(gather)
        return self._iter_slow()

    def _index_batches(self) -> Iterator[Any]:
        bs = self.batch_sampler
        fast = getattr(bs, "_index_batches", None)
        if isinstance(bs, BatchSampler) and fast is not None:
            return fast()
        return iter(bs)

    def _iter_fast(self, gather: Callable[[np.ndarray], Any]) -> Iterator[Any]:
        for idx in self._index_batches():
            yield gather(idx if isinstance(idx, np.ndarray) else np.asarray(idx, np.int64))

    def _iter_slow(self) -> Iterator[Any]:
        ds, collate = self.dataset, self.collate_fn
        if isinstance(self.batch_sampler, BatchSampler):
            batches = (b.tolist() for b in self._index_batches())
        else:
            batches = iter(self.batch_sampler)
        for batch in batches:
            yield collate([ds[i] for i in batch])

    def _iter_unbatched(self) -> Iterator[Any]:
        for i in self.sampler:
            yield self.collate_fn(self.dataset[i])

    def _iter_iterable(self) -> Iterator[Any]:
        it = iter(self.dataset)
        if not self.batch_size:
            for sample in it:
                yield self.collate_fn(sample)
            return
        while True:
            batch = []
            for sample in it:
                batch.append(sample)
                if len(batch) == self.batch_size:
                    break
            if not batch or (len(batch) < self.batch_size and self.drop_last):
                return
            yield self.collate_fn(batch)
            if len(batch) < self.batch_size:
                return

    def __len__(self) -> int:
        if self._iterable:
            n = len(self.dataset)
            if not self.batch_size:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        return len(self.sampler)

    def __repr__(self) -> str:
        return (f"DataLoader(dataset={type(self.dataset).__name__}(len={len(self.dataset)}), "
                f"batch_size={self.batch_size}, sampler={type(self.sampler).__name__}, "
                f"drop_last={self.drop_last})")

