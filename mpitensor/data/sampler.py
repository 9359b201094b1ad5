"""Samplers: which dataset indices a DataLoader fetches, in which order, and on which rank.

The public classes carry ``torch.utils.data``'s names, arguments and index sequences (the
shuffled ones drawn from mpitensor's generators). Internally every built-in sampler plans a
whole pass as one NumPy int64 array (``_plan``); the DataLoader asks for it cut into batch-sized
slices (``_index_batches``), so batching a pass costs one slice per batch rather than one
Python int per sample.

Additions to torch: :class:`DistributedSampler` has an evaluation mode (``even=False``, also
spelled :class:`DistributedEvalSampler`) in which every sample goes to exactly one rank, and a
``state_dict()``/``load_state_dict()`` pair that resumes an epoch at its first unconsumed index.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Optional

import numpy as np

from mpitensor.tensor import Generator, randint, randperm

__all__ = [
    "Sampler",
    "SequentialSampler",
    "RandomSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
    "BatchSampler",
    "DistributedSampler",
    "DistributedEvalSampler",
]


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _array_chunks(order: np.ndarray, size: int, drop_last: bool) -> Iterator[np.ndarray]:
    """Views of ``order``, ``size`` at a time; a short tail is kept unless ``drop_last``."""
    end = len(order)
    if drop_last:
        end -= end % size
    for start in range(0, end, size):
        yield order[start:start + size]


def _list_chunks(items: Iterable[Any], size: int, drop_last: bool) -> Iterator[list]:
    """Lists of ``size`` items pulled lazily from ``items``; the same tail rule as above."""
    source = iter(items)
    while True:
        chunk = list(itertools.islice(source, size))
        if len(chunk) < size:
            if chunk and not drop_last:
                yield chunk
            return
        yield chunk


class Sampler:
    """Base class of samplers: iterate over dataset indices; define ``__len__`` when known.

    Example:
        >>> class Evens(Sampler):
        ...     def __iter__(self): return iter(range(0, 6, 2))
        ...     def __len__(self): return 3
        >>> list(Evens())
        [0, 2, 4]
    """

    def __init__(self, data_source: Any = None) -> None:
        # torch subclasses call super().__init__(data_source); nothing needs keeping
        pass

    def __iter__(self) -> Iterator[int]:
        raise NotImplementedError(
            f"{type(self).__name__} is a Sampler without __iter__; define __iter__ to yield "
            "the dataset indices of one pass")


class _PlannedSampler(Sampler):
    """A sampler whose pass is computed up front as one int64 array by ``_plan()``."""

    def _plan(self) -> np.ndarray:
        raise NotImplementedError

    # both are generators so that the pass is planned (and random numbers drawn) at the first
    # next(), as with torch's samplers, not when iter() is called

    def __iter__(self) -> Iterator[int]:
        yield from self._plan().tolist()

    def _index_batches(self, batch_size: int, drop_last: bool) -> Iterator[np.ndarray]:
        """Yield one pass as index arrays of ``batch_size`` entries."""
        yield from _array_chunks(self._plan(), batch_size, drop_last)


class SequentialSampler(_PlannedSampler):
    """Indices ``0 .. len(data_source)-1`` in order.

    Example:
        >>> list(SequentialSampler(range(3)))
        [0, 1, 2]
    """

    def __init__(self, data_source: Any) -> None:
        self.data_source = data_source

    def _plan(self) -> np.ndarray:
        return np.arange(len(self.data_source), dtype=np.int64)

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(_PlannedSampler):
    """A random order of the indices, or ``num_samples`` draws with replacement.

    Each pass draws afresh from ``generator`` (default: mpitensor's global generator), so
    ``mpitensor.manual_seed(s)`` makes a run's sequence of epochs repeatable. Without
    replacement and with ``num_samples`` above the dataset size, whole permutations follow one
    another and the last one is cut short.

    Args:
        data_source: the dataset (only its length is used).
        replacement: draw with replacement.
        num_samples: indices per pass (default ``len(data_source)``).
        generator: a :class:`mpitensor.Generator` (or NumPy Generator), or None.

    Raises:
        ValueError: ``num_samples`` is not a positive int.
        TypeError: ``replacement`` is not a bool.

    Example:
        >>> g = Generator().manual_seed(0)
        >>> sorted(RandomSampler(range(4), generator=g))
        [0, 1, 2, 3]
    """

    def __init__(self, data_source: Any, replacement: bool = False,
                 num_samples: Optional[int] = None, generator: Any = None) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(f"RandomSampler: replacement must be True or False, got "
                            f"{replacement!r} ({type(replacement).__name__})")
        self.data_source, self.generator = data_source, generator
        self.replacement = replacement
        self._requested = num_samples  # None: follow the dataset's length as it is now
        count = self.num_samples
        if not _positive_int(count):
            raise ValueError(f"RandomSampler: num_samples={count!r} is not a positive int; "
                             "pass num_samples >= 1 or use a non-empty dataset")

    @property
    def num_samples(self) -> int:
        """Indices per pass: ``num_samples`` if given, else the dataset's length."""
        return len(self.data_source) if self._requested is None else self._requested

    def _plan(self) -> np.ndarray:
        size, count = len(self.data_source), self.num_samples
        if self.replacement:
            return randint(0, size, (count,), generator=self.generator)._data
        rounds = -(-count // size)
        perms = [randperm(size, generator=self.generator)._data for _ in range(rounds)]
        whole = perms[0] if rounds == 1 else np.concatenate(perms)
        return whole[:count]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(_PlannedSampler):
    """The given indices, in a new random order (drawn from ``generator``) each pass.

    Example:
        >>> sorted(SubsetRandomSampler([5, 7, 9]))
        [5, 7, 9]
    """

    def __init__(self, indices: Sequence[int], generator: Any = None) -> None:
        self.indices = indices
        self.generator = generator
        self._pool = np.fromiter((operator.index(i) for i in indices), dtype=np.int64,
                                 count=len(indices))

    def _plan(self) -> np.ndarray:
        return self._pool[randperm(len(self._pool), generator=self.generator)._data]

    def __len__(self) -> int:
        return len(self._pool)


class WeightedRandomSampler(_PlannedSampler):
    """``num_samples`` indices drawn with probabilities proportional to ``weights``.

    Args:
        weights: one non-negative weight per index (a sequence or a 1-D tensor); they need not
            sum to 1.
        num_samples: indices per pass.
        replacement: draw with replacement (default); without it, ``num_samples`` may not
            exceed the number of non-zero weights.
        generator: a :class:`mpitensor.Generator`, or None for the global one.

    The draws come from mpitensor's generators, so they differ from torch's for the same seed;
    their distribution is the same.

    Raises:
        ValueError: ``num_samples`` not a positive int, ``replacement`` not a bool, or weights
            that are not a 1-D sequence of finite non-negative numbers with a positive sum.

    Example:
        >>> list(WeightedRandomSampler([0.0, 0.0, 1.0], 3))
        [2, 2, 2]
    """

    def __init__(self, weights: Any, num_samples: int, replacement: bool = True,
                 generator: Any = None) -> None:
        if not _positive_int(num_samples):
            raise ValueError(f"WeightedRandomSampler: num_samples should be a positive integer, "
                             f"got {num_samples!r}")
        if not isinstance(replacement, bool):
            raise ValueError(f"WeightedRandomSampler: replacement should be a bool, got "
                             f"{replacement!r}")
        from mpitensor.tensor import Tensor, as_tensor  # noqa: PLC0415

        w = weights._data if isinstance(weights, Tensor) else np.asarray(weights)
        if getattr(w, "ndim", 1) != 1:
            raise ValueError(f"WeightedRandomSampler: weights must be 1-D, got shape "
                             f"{tuple(w.shape)}")
        self.weights = as_tensor(w, dtype=np.float64)
        self.num_samples = int(num_samples)
        self.replacement = replacement
        self.generator = generator

    def _plan(self) -> np.ndarray:
        from mpitensor._ops.random import multinomial  # noqa: PLC0415

        return np.asarray(multinomial(self.weights, self.num_samples, self.replacement,
                                      generator=self.generator)._data, dtype=np.int64)

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Group the indices of ``sampler`` into lists of ``batch_size``.

    Args:
        sampler: any iterable of indices (a Sampler, a range, a list...).
        batch_size: indices per batch.
        drop_last: leave out a last batch shorter than ``batch_size``.

    Raises:
        ValueError: ``batch_size`` is not a positive int, or ``drop_last`` is not a bool.

    Example:
        >>> list(BatchSampler(SequentialSampler(range(5)), 2, drop_last=False))
        [[0, 1], [2, 3], [4]]
    """

    def __init__(self, sampler: Any, batch_size: int, drop_last: bool) -> None:
        if not _positive_int(batch_size):
            raise ValueError(f"BatchSampler: batch_size={batch_size!r} is not a positive int; "
                             "pass the number of indices per batch (>= 1)")
        if not isinstance(drop_last, bool):
            raise ValueError(f"BatchSampler: drop_last={drop_last!r} must be True or False")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self) -> Iterator[list]:
        planned = getattr(self.sampler, "_index_batches", None)
        if planned is None:
            yield from _list_chunks(self.sampler, self.batch_size, self.drop_last)
        else:
            for chunk in planned(self.batch_size, self.drop_last):
                yield chunk.tolist()

    def _index_batches(self, batch_size: int = 0, drop_last: bool = False) -> Iterator[np.ndarray]:
        """Yield this sampler's batches as int64 arrays.

        The arguments exist so a BatchSampler can sit where a planned sampler is expected;
        the batching of this object (its own ``batch_size``/``drop_last``) always wins.
        """
        planned = getattr(self.sampler, "_index_batches", None)
        if planned is not None:
            yield from planned(self.batch_size, self.drop_last)
        else:
            for chunk in _list_chunks(self.sampler, self.batch_size, self.drop_last):
                yield np.asarray(chunk, dtype=np.int64)

    def __len__(self) -> int:
        full, rest = divmod(len(self.sampler), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)


def _world_of_default_group(num_replicas: Optional[int], rank: Optional[int]) -> tuple:
    """Fill in whichever of ``num_replicas``/``rank`` is None from the default process group."""
    if num_replicas is not None and rank is not None:
        return num_replicas, rank
    from mpitensor import distributed as dist

    if not dist.is_initialized():
        from mpitensor.errors import NotInitializedError

        raise NotInitializedError(
            "DistributedSampler: num_replicas/rank default to the default process group, which "
            "is not initialized; call mpitensor.distributed.init_process_group() first, or pass "
            "num_replicas= and rank= explicitly")
    return (dist.get_world_size() if num_replicas is None else num_replicas,
            dist.get_rank() if rank is None else rank)


class DistributedSampler(_PlannedSampler):
    """Give each rank its own shard of the indices, as ``torch.utils.data.DistributedSampler``.

    Which rank gets which index is torch's rule. Take the epoch's order (the identity, or with
    ``shuffle`` a permutation seeded by ``seed + epoch``) and stretch it cyclically to a
    multiple of ``num_replicas`` (shrink it to one with ``drop_last=True``); rank ``r`` then
    holds the entries at positions ``r, r + num_replicas, r + 2*num_replicas, ...``. Without
    shuffling the shards equal torch's; shuffled orders come from mpitensor's generator (NumPy
    PCG64): identical on every rank and repeatable, but not torch's bit for bit. Call
    :meth:`set_epoch` before each epoch to get a new order.

    Beyond torch:

    * ``even=False`` (evaluation mode; see :class:`DistributedEvalSampler`): the order is
      neither stretched nor shrunk, so every sample lands on exactly one rank and shard lengths
      differ by at most one. Use it for evaluation only: ranks may run different numbers of
      batches, so no per-batch collective may follow.
    * :meth:`state_dict` / :meth:`load_state_dict` record the epoch and how many indices this
      rank has handed out; after loading, the next pass hands out only the rest of that epoch,
      and later epochs (after :meth:`set_epoch` with another epoch) are whole again. A
      DataLoader takes indices a batch at a time, so a state taken inside
      ``for batch in loader`` counts the batch in hand as consumed. A state saved by another
      number of ranks is resharded (see :meth:`load_state_dict`); :meth:`remaining` says how
      many indices the next pass hands out.

    Args:
        dataset: the dataset (only its length is used).
        num_replicas: number of ranks (default: the default process group's world size).
        rank: this rank (default: ``mpitensor.distributed.get_rank()``).
        shuffle: shuffle the indices every epoch.
        seed: base seed; must be the same on every rank.
        drop_last: shrink to a multiple of ``num_replicas`` instead of stretching.
        even: give every rank the same number of indices (torch's behaviour); False for
            evaluation.

    Raises:
        NotInitializedError: num_replicas/rank left out and the process group is not set up.
        ValueError: rank outside ``[0, num_replicas)``, ``num_replicas < 1``, or
            ``even=False`` with ``drop_last=True``.

    Example:
        >>> s = DistributedSampler(range(5), num_replicas=2, rank=1, shuffle=False)
        >>> list(s)
        [1, 3, 0]
    """

    # a saved position names other samples unless these agree; rank is not among them because
    # in the even mode every rank has handed out the same count, so one rank's state serves all
    _MUST_MATCH = ("seed", "shuffle", "drop_last", "even", "num_replicas", "dataset_len")

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, even: bool = True) -> None:
        world, me = map(operator.index, _world_of_default_group(num_replicas, rank))
        if world < 1:
            raise ValueError(f"DistributedSampler: num_replicas={world}; it counts the ranks "
                             "sharing the data, so pass 1 or more")
        if not 0 <= me < world:
            raise ValueError(f"Invalid rank {me} for num_replicas={world}: pass this process's "
                             f"rank, a number from 0 to {world - 1}")
        if drop_last and not even:
            raise ValueError("DistributedSampler: even=False (evaluation mode) keeps every "
                             "sample exactly once, so it cannot drop any; leave drop_last=False")
        self.dataset = dataset
        self.num_replicas = world
        self.rank = me
        self.shuffle = shuffle
        self.seed = operator.index(seed)
        self.drop_last = drop_last
        self.even = even
        self.epoch = 0
        self._handed_out = 0  # indices of this epoch given out by this rank so far
        self._skip_next = 0  # from load_state_dict: how many the next pass leaves out
        # positions of this epoch's order consumed before its indices were dealt to these ranks
        # (above 0 after resuming mid-epoch at another number of ranks)
        self._offset = 0
        size = len(dataset)
        if even:
            rounds = size // world if drop_last else -(-size // world)
            self.total_size = rounds * world
            self.num_samples = rounds
        else:
            self.total_size = size
            self.num_samples = len(range(me, size, world))

    def _epoch_order(self) -> np.ndarray:
        """All of this epoch's indices in order, before they are dealt to the ranks."""
        size = len(self.dataset)
        if not self.shuffle:
            return np.arange(size, dtype=np.int64)
        return randperm(size, generator=Generator().manual_seed(self.seed + self.epoch))._data

    def _shard(self) -> np.ndarray:
        order = self._epoch_order()[self._offset:]
        if not self.even:
            return order[self.rank::self.num_replicas]
        if len(order) == 0:
            return order
        total = self.total_size
        if self._offset:  # what is left of the epoch, dealt evenly to these ranks
            world = self.num_replicas
            total = (len(order) // world if self.drop_last else -(-len(order) // world)) * world
        # positions past the end of the order wrap to its start: the padding of torch's rule
        slots = np.arange(self.rank, total, self.num_replicas)
        return order[slots % len(order)]

    def _plan(self) -> np.ndarray:
        skip, self._skip_next = self._skip_next, 0
        self._handed_out = skip
        return self._shard()[skip:]

    def __iter__(self) -> Iterator[int]:
        for index in self._plan().tolist():
            self._handed_out += 1
            yield index

    def _index_batches(self, batch_size: int, drop_last: bool) -> Iterator[np.ndarray]:
        for chunk in _array_chunks(self._plan(), batch_size, drop_last):
            self._handed_out += len(chunk)
            yield chunk

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which seeds the shuffle (``seed + epoch``); same value on all ranks.

        A resume point loaded by :meth:`load_state_dict` survives only when ``epoch`` is the
        loaded epoch.

        Example:
            >>> s = DistributedSampler(range(8), num_replicas=1, rank=0); s.set_epoch(1)
        """
        epoch = operator.index(epoch)
        if epoch != self.epoch:
            self._handed_out = self._skip_next = self._offset = 0
        self.epoch = epoch

    @property
    def position(self) -> int:
        """How many indices of the current epoch this rank has yielded (or will skip)."""
        return self._skip_next or self._handed_out

    def remaining(self) -> int:
        """How many indices the next pass over the current epoch hands out on this rank.

        ``len(self)`` for a fresh epoch; less after :meth:`load_state_dict` restored a point
        inside it (a training loop uses it to know how many of the epoch's steps are left).

        Example:
            >>> s = DistributedSampler(range(8), num_replicas=2, rank=0, shuffle=False)
            >>> s.load_state_dict({"epoch": 0, "position": 1, "num_replicas": 4}); s.remaining()
            2
        """
        if not self._offset:
            return max(0, self.num_samples - self._skip_next)
        return max(0, len(self._shard()) - self._skip_next)

    def state_dict(self) -> dict:
        """Return ``{"epoch", "position", ...}``: enough to resume this epoch mid-way.

        Example:
            >>> DistributedSampler(range(4), num_replicas=2, rank=0).state_dict()["position"]
            0
        """
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "shuffle": self.shuffle, "drop_last": self.drop_last, "even": self.even,
                "num_replicas": self.num_replicas, "rank": self.rank,
                "dataset_len": len(self.dataset), "offset": self._offset}

    def load_state_dict(self, state: dict) -> None:
        """Restore epoch and position; the next pass yields only the unconsumed indices.

        A state saved by another number of ranks is resharded: every rank of the saving run
        is taken to have consumed ``position`` indices (as under DDP, where all ranks step
        together), so the epoch's first ``position * saved num_replicas`` positions are done,
        and the rest of the epoch is dealt afresh to this sampler's ranks (evenly, with
        torch's padding rule). Together the new ranks then yield each remaining index once
        (plus padding), and the next epoch is the one a run of this size would have.

        Raises:
            TypeError: ``state`` is not a dict from :meth:`state_dict`.
            ValueError: the state was saved with another seed, shuffle, drop_last, even or
                dataset length (its position would name other samples).

        Example:
            >>> a = DistributedSampler(range(4), num_replicas=1, rank=0, shuffle=False)
            >>> it = iter(a); _ = next(it); b = DistributedSampler(range(4), 1, 0, shuffle=False)
            >>> b.load_state_dict(a.state_dict()); list(b)
            [1, 2, 3]
        """
        if not (isinstance(state, dict) and {"epoch", "position"} <= state.keys()):
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise TypeError(f"DistributedSampler.load_state_dict: expected the dict made by "
                            f"state_dict() (with 'epoch' and 'position'), got {got}")
        current = self.state_dict()
        for key in self._MUST_MATCH:
            mine = current[key]
            if key != "num_replicas" and key in state and state[key] != mine:
                raise ValueError(
                    f"DistributedSampler.load_state_dict: saved {key}={state[key]!r} but this "
                    f"sampler has {key}={mine!r}; resume with the same settings (the number "
                    "of ranks may differ)")
        position = operator.index(state["position"])
        offset = operator.index(state.get("offset", 0))
        saved_world = operator.index(state.get("num_replicas", self.num_replicas))
        size = len(self.dataset)
        if saved_world < 1 or not 0 <= offset <= size:
            raise ValueError(f"DistributedSampler.load_state_dict: num_replicas={saved_world}, "
                             f"offset={offset} do not describe a sampler of {size} indices")
        left = size - offset  # the length of the order that run dealt out
        if self.even:
            most = left // saved_world if self.drop_last else -(-left // saved_world)
        else:
            most = -(-left // saved_world)
        if not 0 <= position <= most:
            raise ValueError(f"DistributedSampler.load_state_dict: position {position} is "
                             f"outside [0, {most}], the length of a shard of the saving run")
        self.epoch = operator.index(state["epoch"])
        if saved_world == self.num_replicas:
            self._offset = offset
            self._handed_out = self._skip_next = position
        else:  # reshard: the saving ranks consumed position * saved_world positions together
            self._offset = min(size, offset + position * saved_world)
            self._handed_out = self._skip_next = 0


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
