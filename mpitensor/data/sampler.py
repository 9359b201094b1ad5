"""Samplers: which indices a DataLoader fetches, in which order, on which rank.

``Sampler``, ``SequentialSampler``, ``RandomSampler``, ``SubsetRandomSampler``,
``BatchSampler`` and ``DistributedSampler`` follow ``torch.utils.data``. The index-array samplers
also hand the loader whole NumPy index arrays per batch (``_index_batches``), so batching costs
one slice per batch instead of one Python int per sample.

Beyond torch, :class:`DistributedSampler` has an evaluation mode (``even=False``, or
:class:`DistributedEvalSampler`) that gives every sample to exactly one rank, and
``state_dict()``/``load_state_dict()`` that resume an epoch at the next unconsumed index.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import numpy as np

from mpitensor.tensor import Generator, randint, randperm

__all__ = [
    "Sampler",
    "SequentialSampler",
    "RandomSampler",
    "SubsetRandomSampler",
    "BatchSampler",
    "DistributedSampler",
    "DistributedEvalSampler",
]


class Sampler:
    """Base class: an iterable of dataset indices, with ``__len__`` where the count is known.

    Example:
        >>> class Evens(Sampler):
        ...     def __iter__(self): return iter(range(0, 6, 2))
        ...     def __len__(self): return 3
        >>> list(Evens())
        [0, 2, 4]
    """

    def __init__(self, data_source: Any = None) -> None:
        pass

    def __iter__(self) -> Iterator[int]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")


class _ArraySampler(Sampler):
    """A sampler whose pass is one NumPy int64 index array (``_epoch_array``)."""

    def _epoch_array(self) -> np.ndarray:
        raise NotImplementedError

    def __iter__(self) -> Iterator[int]:
        yield from self._epoch_array().tolist()

    def _index_batches(self, batch_size: int, drop_last: bool) -> Iterator[np.ndarray]:
        """Yield the pass as index arrays of ``batch_size`` (last one short unless drop_last)."""
        idx = self._epoch_array()
        stop = len(idx) - len(idx) % batch_size if drop_last else len(idx)
        for start in range(0, stop, batch_size):
            yield idx[start:start + batch_size]


class SequentialSampler(_ArraySampler):
    """Indices ``0 .. len(data_source)-1`` in order.

    Example:
        >>> list(SequentialSampler(range(3)))
        [0, 1, 2]
    """

    def __init__(self, data_source: Any) -> None:
        self.data_source = data_source

    def _epoch_array(self) -> np.ndarray:
        return np.arange(len(self.data_source), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(_ArraySampler):
    """A random order of the indices (or ``num_samples`` draws with replacement).

    Each pass draws a fresh permutation from ``generator`` (default: mpitensor's global
    generator), so ``mpitensor.manual_seed(s)`` makes the sequence of epochs reproducible.

    Args:
        data_source: the dataset (only its length is used).
        replacement: draw with replacement.
        num_samples: samples per pass (default ``len(data_source)``).
        generator: a :class:`mpitensor.Generator` (or NumPy Generator), or None.

    Raises:
        ValueError: ``num_samples`` not positive. TypeError: ``replacement`` not a bool.

    Example:
        >>> g = mpitensor.Generator().manual_seed(0)
        >>> sorted(RandomSampler(range(4), generator=g))
        [0, 1, 2, 3]
    """

    def __init__(self, data_source: Any, replacement: bool = False,
                 num_samples: Optional[int] = None, generator: Any = None) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got {replacement!r}")
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError("num_samples should be a positive integer value, but got "
                             f"num_samples={self.num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def _epoch_array(self) -> np.ndarray:
        n = len(self.data_source)
        if self.replacement:
            return randint(0, n, (self.num_samples,), generator=self.generator)._data
        reps = [randperm(n, generator=self.generator)._data
                for _ in range(-(-self.num_samples // n))]
        return np.concatenate(reps)[:self.num_samples] if len(reps) > 1 else reps[0]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(_ArraySampler):
    """The given indices in a random order drawn from ``generator`` each pass.

    Example:
        >>> sorted(SubsetRandomSampler([5, 7, 9]))
        [5, 7, 9]
    """

    def __init__(self, indices: Sequence[int], generator: Any = None) -> None:
        self.indices = indices
        self._idx = np.asarray([operator.index(i) for i in indices], dtype=np.int64)
        self.generator = generator

    def _epoch_array(self) -> np.ndarray:
        return self._idx[randperm(len(self._idx), generator=self.generator)._data]

    def __len__(self) -> int:
        return len(self._idx)


class BatchSampler(Sampler):
    """Group the indices of ``sampler`` into lists of ``batch_size``.

    Raises:
        ValueError: ``batch_size`` not a positive int or ``drop_last`` not a bool.

    Example:
        >>> list(BatchSampler(SequentialSampler(range(5)), 2, drop_last=False))
        [[0, 1], [2, 3], [4]]
    """

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool) -> None:
        if (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                or batch_size <= 0):
            raise ValueError("batch_size should be a positive integer value, but got "
                             f"batch_size={batch_size!r}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got {drop_last!r}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list]:
        fast = getattr(self.sampler, "_index_batches", None)
        if fast is not None:
            for idx in fast(self.batch_size, self.drop_last):
                yield idx.tolist()
            return
        batch: list = []
        for i in self.sampler:
            batch.append(i)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def _index_batches(self, batch_size: int = 0, drop_last: bool = False) -> Iterator[np.ndarray]:
        """Yield this sampler's batches as index arrays (its own batch_size and drop_last)."""
        fast = getattr(self.sampler, "_index_batches", None)
        if fast is not None:
            yield from fast(self.batch_size, self.drop_last)
        else:
            for b in self:
                yield np.asarray(b, dtype=np.int64)

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


def _default_world(num_replicas: Optional[int], rank: Optional[int]) -> tuple:
    if num_replicas is not None and rank is not None:
        return num_replicas, rank
    from mpitensor import distributed as dist

    if not dist.is_initialized():
        from mpitensor.errors import NotInitializedError

        raise NotInitializedError(
            "DistributedSampler: num_replicas/rank default to the default process group, which "
            "is not initialized; call mpitensor.distributed.init_process_group() first, or pass "
            "num_replicas= and rank= explicitly")
    if num_replicas is None:
        num_replicas = dist.get_world_size()
    if rank is None:
        rank = dist.get_rank()
    return num_replicas, rank


class DistributedSampler(_ArraySampler):
    """Give each rank its own shard of the indices, as ``torch.utils.data.DistributedSampler``.

    The index assignment is PyTorch's: a permutation of ``range(len(dataset))`` seeded with
    ``seed + epoch`` (or the identity with ``shuffle=False``), padded by wrap-around to a
    multiple of ``num_replicas`` (or truncated with ``drop_last=True``), then rank ``r`` takes
    ``indices[r:total:num_replicas]``. With ``shuffle=False`` the shards equal torch's exactly;
    with shuffling the permutation comes from mpitensor's generator (NumPy PCG64), so it is
    deterministic and identical on every rank but not torch's bit for bit. Call
    :meth:`set_epoch` at the start of every epoch for a new order.

    Beyond torch:

    * ``even=False`` (evaluation mode; see :class:`DistributedEvalSampler`): no padding and no
      truncation, rank ``r`` takes ``indices[r::num_replicas]``, so every sample is seen by
      exactly one rank and shard lengths differ by at most one. Use it for evaluation only:
      ranks may run different numbers of batches, so no per-batch collective may follow.
    * :meth:`state_dict` / :meth:`load_state_dict` record the epoch and how many indices this
      rank has yielded; after loading, the next pass yields only the unconsumed rest of that
      epoch, and later epochs (after :meth:`set_epoch` with a new epoch) are whole again. A
      DataLoader pulls indices batch by batch, so a state taken inside ``for batch in loader``
      counts the batch in hand as consumed.

    Args:
        dataset: the dataset (only its length is used).
        num_replicas: number of ranks (default: the default process group's world size).
        rank: this rank (default: ``mpitensor.distributed.get_rank()``).
        shuffle: shuffle the indices every epoch.
        seed: base seed; must be the same on every rank.
        drop_last: truncate to a multiple of ``num_replicas`` instead of padding.
        even: pad/truncate so all shards are equal (torch's behaviour); False for evaluation.

    Raises:
        NotInitializedError: num_replicas/rank left out and the process group is not set up.
        ValueError: rank outside ``[0, num_replicas)``, ``num_replicas < 1``, or
            ``even=False`` with ``drop_last=True``.

    Example:
        >>> s = DistributedSampler(range(5), num_replicas=2, rank=1, shuffle=False)
        >>> list(s)
        [1, 3, 0]
    """

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, even: bool = True) -> None:
        num_replicas, rank = _default_world(num_replicas, rank)
        num_replicas, rank = operator.index(num_replicas), operator.index(rank)
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be at least 1, got {num_replicas}")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]")
        if not even and drop_last:
            raise ValueError("even=False (evaluation mode) keeps every sample exactly once; it "
                             "cannot be combined with drop_last=True")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = operator.index(seed)
        self.drop_last = drop_last
        self.even = even
        self.epoch = 0
        self._position = 0  # indices of this epoch yielded so far
        self._resume_from = 0  # set by load_state_dict, used by the next pass
        n = len(dataset)
        if not even:
            self.num_samples = len(range(rank, n, num_replicas))
            self.total_size = n
        else:
            if drop_last and n % num_replicas != 0:
                self.num_samples = math.ceil((n - num_replicas) / num_replicas)
            else:
                self.num_samples = math.ceil(n / num_replicas)
            self.total_size = self.num_samples * num_replicas

    def _shard(self) -> np.ndarray:
        n = len(self.dataset)
        if self.shuffle:
            g = Generator().manual_seed(self.seed + self.epoch)
            indices = randperm(n, generator=g)._data
        else:
            indices = np.arange(n, dtype=np.int64)
        if self.even:
            # np.resize repeats cyclically: torch's wrap-around padding, or a truncation
            indices = np.resize(indices, self.total_size) if n else indices[:0]
            return indices[self.rank:self.total_size:self.num_replicas]
        return indices[self.rank::self.num_replicas]

    def _epoch_array(self) -> np.ndarray:
        start, self._resume_from = self._resume_from, 0
        self._position = start
        return self._shard()[start:]

    def __iter__(self) -> Iterator[int]:
        for i in self._epoch_array().tolist():
            self._position += 1
            yield i

    def _index_batches(self, batch_size: int, drop_last: bool) -> Iterator[np.ndarray]:
        idx = self._epoch_array()
        stop = len(idx) - len(idx) % batch_size if drop_last else len(idx)
        for start in range(0, stop, batch_size):
            batch = idx[start:start + batch_size]
            self._position += len(batch)
            yield batch

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which seeds the shuffle (``seed + epoch``); same value on all ranks.

        A pending resume position (from :meth:`load_state_dict`) is kept only when ``epoch``
        is the loaded epoch.

        Example:
            >>> s = DistributedSampler(range(8), num_replicas=1, rank=0); s.set_epoch(1)
        """
        epoch = operator.index(epoch)
        if epoch != self.epoch:
            self._resume_from = 0
            self._position = 0
        self.epoch = epoch

    @property
    def position(self) -> int:
        """How many indices of the current epoch this rank has yielded (or will skip)."""
        return self._resume_from or self._position

    def state_dict(self) -> dict:
        """Return ``{"epoch", "position", ...}``: enough to resume this epoch mid-way.

        Example:
            >>> DistributedSampler(range(4), num_replicas=2, rank=0).state_dict()["position"]
            0
        """
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "even": self.even,
            "num_replicas": self.num_replicas,
            "rank": self.rank,
            "dataset_len": len(self.dataset),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore epoch and position; the next pass yields only the unconsumed indices.

        Raises:
            ValueError: the state was saved with another seed, shuffle, drop_last, even,
                number of ranks or dataset length (its position would name other samples).

        Example:
            >>> a = DistributedSampler(range(4), num_replicas=1, rank=0, shuffle=False)
            >>> it = iter(a); _ = next(it); b = DistributedSampler(range(4), 1, 0, shuffle=False)
            >>> b.load_state_dict(a.state_dict()); list(b)
            [1, 2, 3]
        """
        if not isinstance(state, dict) or "epoch" not in state or "position" not in state:
            raise TypeError("load_state_dict() takes the dict returned by state_dict()")
        mine = self.state_dict()
        for key in ("seed", "shuffle", "drop_last", "even", "num_replicas", "dataset_len"):
            if key in state and state[key] != mine[key]:
                raise ValueError(
                    f"DistributedSampler.load_state_dict: saved {key}={state[key]!r} but this "
                    f"sampler has {key}={mine[key]!r}; resume with the same settings and number "
                    "of ranks")
        position = operator.index(state["position"])
        if not 0 <= position <= self.num_samples:
            raise ValueError(f"DistributedSampler.load_state_dict: position {position} is "
                             f"outside [0, {self.num_samples}]")
        self.epoch = operator.index(state["epoch"])
        self._position = position
        self._resume_from = position


class DistributedEvalSampler(DistributedSampler):
    """Evaluation sharding: every sample on exactly one rank, in order, no padding.

    Same as ``DistributedSampler(dataset, num_replicas, rank, shuffle=False, even=False)``.

    Example:
        >>> list(DistributedEvalSampler(range(5), num_replicas=2, rank=1))
        [1, 3]
    """

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = False, seed: int = 0) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                         seed=seed, drop_last=False, even=False)
