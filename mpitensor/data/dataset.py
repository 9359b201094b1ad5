"""Map-style datasets: Dataset, TensorDataset, Subset, ConcatDataset and random_split.

Names and semantics follow ``torch.utils.data``. Beyond torch, a dataset may offer the batched
fast path ``gather(indices)``: given a 1-D integer index array it returns the *collated* batch
(what :func:`~mpitensor.data.default_collate` would build from ``[ds[i] for i in indices]``)
with one vectorised gather per field and no per-sample Python objects. :class:`DataLoader`
uses it whenever ``collate_fn`` is left at its default.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Optional, Union

import numpy as np

from mpitensor import backend as _backend
from mpitensor._core.opkit import wrap
from mpitensor.tensor import Tensor, as_tensor, randperm

__all__ = [
    "Dataset",
    "IterableDataset",
    "TensorDataset",
    "Subset",
    "ConcatDataset",
    "ChainDataset",
    "StackDataset",
    "random_split",
]


def _index_array(indices: Any) -> np.ndarray:
    """A 1-D int64 NumPy index array from a list, range, array or Tensor of indices."""
    if isinstance(indices, Tensor):
        indices = indices._data
    if not isinstance(indices, np.ndarray):
        if _backend.is_cupy_array(indices):
            indices = indices.get()
        else:
            indices = np.fromiter((operator.index(i) for i in indices), dtype=np.int64)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got dtype {indices.dtype}")
    return indices.reshape(-1).astype(np.int64, copy=False)


def _take(arr: Any, idx: np.ndarray) -> Any:
    """Gather rows ``idx`` of ``arr`` (NumPy or CuPy) in one call; the index moves to arr's side."""
    if isinstance(arr, np.ndarray):
        return arr.take(idx, axis=0)
    xp = _backend.array_module(arr)
    return xp.take(arr, xp.asarray(idx), axis=0)


class Dataset:
    """A map-style dataset: ``len(ds)`` samples, ``ds[i]`` returns sample ``i``.

    Subclasses implement ``__getitem__`` (and ``__len__`` for samplers); ``ds1 + ds2`` makes a
    :class:`ConcatDataset`. Optionally implement ``gather(indices)`` returning the collated
    batch in one vectorised step (the :class:`DataLoader` fast path).

    Example:
        >>> class Squares(Dataset):
        ...     def __len__(self): return 4
        ...     def __getitem__(self, i): return i * i
        >>> Squares()[3]
        9
    """

    def __getitem__(self, index: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream of samples: implement ``__iter__``; used with a DataLoader without a sampler.

    Example:
        >>> class Count(IterableDataset):
        ...     def __iter__(self): return iter(range(3))
        >>> list(Count())
        [0, 1, 2]
    """

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement __iter__")

    def __add__(self, other: Dataset) -> Any:
        raise TypeError("IterableDataset does not support +; chain the iterators instead")


class TensorDataset(Dataset):
    """A dataset of tensors sharing their first dimension: sample ``i`` is ``(t[i] for t)``.

    Arrays (NumPy/CuPy) are wrapped without a copy. Batches come from :meth:`gather`, one
    ``take`` per tensor, so a DataLoader over it never builds per-sample tensors.

    Args:
        *tensors: one or more Tensors (or arrays) with equal ``size(0)``.

    Raises:
        ValueError: no tensors, a 0-d tensor, or first dimensions differ.

    Example:
        >>> ds = TensorDataset(mpitensor.zeros(4, 2), mpitensor.arange(4))
        >>> len(ds), ds[1][1].item()
        (4, 1)
    """

    def __init__(self, *tensors: Any) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one tensor")
        ts = tuple(t if isinstance(t, Tensor) else as_tensor(t) for t in tensors)
        for k, t in enumerate(ts):
            if t.dim() == 0:
                raise ValueError(f"TensorDataset: tensor {k} is 0-d; every tensor needs a first "
                                 "(sample) dimension")
        sizes = [t.shape[0] for t in ts]
        if any(s != sizes[0] for s in sizes):
            raise ValueError(f"Size mismatch between tensors: first dimensions {sizes} must all "
                             "be equal (one entry per sample)")
        self.tensors = ts

    def __getitem__(self, index: Any) -> tuple:
        return tuple(t[index] for t in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]

    def gather(self, indices: Any) -> list:
        """Return the collated batch ``[t[indices] for t in tensors]`` (one take per tensor).

        Example:
            >>> TensorDataset(mpitensor.arange(5)).gather([4, 0])[0]
            tensor([4, 0])
        """
        idx = _index_array(indices)
        return [wrap(_take(t._data, idx)) for t in self.tensors]


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order.

    Args:
        dataset: the full dataset.
        indices: a sequence of indices into it.

    Example:
        >>> Subset(TensorDataset(mpitensor.arange(5)), [4, 2])[0][0].item()
        4
    """

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices
        self._idx = _index_array(indices)

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, list):
            return self.dataset[[int(self._idx[i]) for i in idx]]
        return self.dataset[int(self._idx[operator.index(idx)])]

    def __len__(self) -> int:
        return len(self._idx)

    def __getattr__(self, name: str) -> Any:
        # gather exists only when the wrapped dataset has it: the loader tests with getattr
        if name == "gather":
            inner = getattr(self.dataset, "gather", None)
            if callable(inner):
                return lambda indices: inner(self._idx[_index_array(indices)])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class ConcatDataset(Dataset):
    """Several datasets one after another.

    Raises:
        ValueError: empty list. TypeError: an IterableDataset among them.

    Example:
        >>> a = TensorDataset(mpitensor.arange(2)); b = TensorDataset(mpitensor.arange(3))
        >>> len(ConcatDataset([a, b])), ConcatDataset([a, b])[2][0].item()
        (5, 0)
    """

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset needs at least one dataset")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise TypeError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = list(np.cumsum([len(d) for d in self.datasets]).tolist())

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int) -> Any:
        idx = operator.index(idx)
        if idx < 0:
            if -idx > len(self):
                raise IndexError("absolute value of index should not exceed dataset length")
            idx += len(self)
        d = bisect.bisect_right(self.cumulative_sizes, idx)
        if d >= len(self.datasets):
            raise IndexError(f"index {idx} out of range for ConcatDataset of length {len(self)}")
        return self.datasets[d][idx - (self.cumulative_sizes[d - 1] if d else 0)]


class ChainDataset(IterableDataset):
    """Several iterable datasets, one stream after another (chained lazily).

    Example:
        >>> class Count(IterableDataset):
        ...     def __init__(self, n): self.n = n
        ...     def __iter__(self): return iter(range(self.n))
        >>> list(ChainDataset([Count(2), Count(3)]))
        [0, 1, 0, 1, 2]
    """

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = datasets

    def __iter__(self) -> Iterator[Any]:
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise TypeError(f"ChainDataset only chains IterableDatasets, got "
                                f"{type(d).__name__}")
            yield from d

    def __len__(self) -> int:
        total = 0
        for d in self.datasets:
            if not isinstance(d, IterableDataset):
                raise TypeError(f"ChainDataset only chains IterableDatasets, got "
                                f"{type(d).__name__}")
            total += len(d)  # a stream without __len__ raises TypeError here, as in torch
        return total


class StackDataset(Dataset):
    """Datasets of one length side by side: sample ``i`` is the tuple ``(d[i] for d in
    args)``, or the dict ``{k: d[i]}`` when they are given by keyword.

    Raises:
        ValueError: datasets both by position and by keyword, none at all, or of different
            lengths.

    Example:
        >>> ds = StackDataset(x=TensorDataset(mpitensor.arange(3)), y=[10, 20, 30])
        >>> ds[1]["y"], len(ds)
        (20, 3)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args and kwargs:
            raise ValueError("StackDataset: give the datasets by position (tuple samples) or by "
                             "keyword (dict samples), not both")
        if not args and not kwargs:
            raise ValueError("StackDataset needs at least one dataset")
        self.datasets: Union[tuple, dict] = args if args else kwargs
        parts = list(args) if args else list(kwargs.values())
        lengths = {len(d) for d in parts}
        if len(lengths) != 1:
            raise ValueError(f"StackDataset: the datasets differ in length: {sorted(lengths)}")
        self._length = lengths.pop()

    def __getitem__(self, index: int) -> Any:
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __len__(self) -> int:
        return self._length


def random_split(
    dataset: Dataset,
    lengths: Sequence[Union[int, float]],
    generator: Optional[Any] = None,
) -> list:
    """Split ``dataset`` into non-overlapping random :class:`Subset` s of the given lengths.

    As in torch: ``lengths`` are counts summing to ``len(dataset)``, or fractions summing to 1
    (floored, the remainder spread one by one round-robin). The permutation comes from
    ``generator`` (default: mpitensor's global generator, so ``mpitensor.manual_seed`` fixes it).

    Raises:
        ValueError: lengths do not add up, or a fraction is outside [0, 1].

    Example:
        >>> a, b = random_split(TensorDataset(mpitensor.arange(10)), [0.8, 0.2],
        ...                     generator=mpitensor.Generator().manual_seed(0))
        >>> len(a), len(b)
        (8, 2)
    """
    n = len(dataset)
    lengths = list(lengths)
    if lengths and math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        counts = []
        for frac in lengths:
            if not 0 <= frac <= 1:
                raise ValueError(f"random_split: fraction {frac} is not in [0, 1]")
            counts.append(int(math.floor(n * frac)))
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        lengths = counts
    lengths = [operator.index(x) for x in lengths]
    if any(x < 0 for x in lengths):
        raise ValueError(f"random_split: lengths must be non-negative, got {lengths}")
    if sum(lengths) != n:
        raise ValueError(f"Sum of input lengths ({sum(lengths)}) does not equal the length of the "
                         f"input dataset ({n})")
    perm = randperm(n, generator=generator)._data
    out, offset = [], 0
    for length in lengths:
        out.append(Subset(dataset, perm[offset:offset + length].tolist()))
        offset += length
    return out
