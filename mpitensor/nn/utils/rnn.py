"""Variable-length sequences for the recurrent layers, as ``torch.nn.utils.rnn``.

A :class:`PackedSequence` holds a batch of sequences of different lengths without padding:
``data`` stacks, time step by time step, the rows of the sequences still running at that step
(longest first), and ``batch_sizes[t]`` says how many there are. ``sorted_indices`` and
``unsorted_indices`` remember the order the batch came in, when packing had to sort it.

Example:
    >>> import mpitensor as mt
    >>> a, b = mt.tensor([1.0, 2.0, 3.0]), mt.tensor([4.0, 5.0])
    >>> packed = pack_sequence([a, b])
    >>> packed.data
    tensor([1., 4., 2., 5., 3.])
    >>> packed.batch_sizes
    tensor([2, 2, 1])
    >>> padded, lengths = pad_packed_sequence(packed, batch_first=True)
    >>> padded
    tensor([[1., 2., 3.],
            [4., 5., 0.]])
"""

from __future__ import annotations

import numbers
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from mpitensor._ops import combine as _combining
from mpitensor._ops import create as _creation
from mpitensor.tensor import Tensor

__all__ = ["PackedSequence", "pack_padded_sequence", "pad_packed_sequence", "pad_sequence",
           "pack_sequence", "unpad_sequence", "unpack_sequence", "invert_permutation"]


def invert_permutation(permutation: Optional[Tensor]) -> Optional[Tensor]:
    """The permutation that undoes ``permutation`` (None stays None)."""
    if permutation is None:
        return None
    p = np.asarray(_host(permutation), dtype=np.int64)
    inv = np.empty_like(p)
    inv[p] = np.arange(p.size, dtype=np.int64)
    return _creation.tensor(inv, device=permutation.device)


def _host(t: Any) -> np.ndarray:
    return t.cpu().numpy() if isinstance(t, Tensor) else np.asarray(t)


class _Packed(NamedTuple):
    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Optional[Tensor]
    unsorted_indices: Optional[Tensor]


class PackedSequence(_Packed):
    """A packed batch of sequences (see the module's description); the fields are torch's:
    ``data``, ``batch_sizes`` (int64, on the CPU), ``sorted_indices``, ``unsorted_indices``.

    Build it with :func:`pack_padded_sequence` or :func:`pack_sequence`, not by hand.
    """

    def __new__(cls, data: Tensor, batch_sizes: Optional[Tensor] = None,
                sorted_indices: Optional[Tensor] = None,
                unsorted_indices: Optional[Tensor] = None) -> "PackedSequence":
        if batch_sizes is None:
            raise TypeError("PackedSequence needs batch_sizes; build one with "
                            "pack_padded_sequence or pack_sequence")
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def _with_data(self, data: Tensor) -> "PackedSequence":
        move = (lambda t: t if t is None else t.to(data.device))  # noqa: E731
        return type(self)(data, self.batch_sizes, move(self.sorted_indices),
                          move(self.unsorted_indices))

    def to(self, *args: Any, **kwargs: Any) -> "PackedSequence":
        """``data.to(...)``; the indices follow the data's device, batch_sizes stays on the
        CPU. Returns ``self`` where nothing changes."""
        data = self.data.to(*args, **kwargs)
        return self if data is self.data else self._with_data(data)

    def cuda(self, *args: Any, **kwargs: Any) -> "PackedSequence":
        return self._with_data(self.data.cuda(*args, **kwargs))

    def cpu(self, *args: Any, **kwargs: Any) -> "PackedSequence":
        return self._with_data(self.data.cpu(*args, **kwargs))

    def double(self) -> "PackedSequence":
        return self._with_data(self.data.double())

    def float(self) -> "PackedSequence":
        return self._with_data(self.data.float())

    def half(self) -> "PackedSequence":
        return self._with_data(self.data.half())

    def long(self) -> "PackedSequence":
        return self._with_data(self.data.long())

    def int(self) -> "PackedSequence":
        return self._with_data(self.data.int())

    @property
    def is_cuda(self) -> bool:
        """Whether the data is on a GPU."""
        return self.data.is_cuda

    def is_pinned(self) -> bool:
        return False


def _lengths(lengths: Any, fname: str) -> np.ndarray:
    if isinstance(lengths, Tensor):
        if lengths.dim() != 1:
            raise RuntimeError(f"{fname}: lengths must be a 1-D tensor, got size "
                               f"{tuple(lengths.shape)}")
        if lengths.is_cuda:
            raise RuntimeError(f"{fname}: lengths must be a CPU tensor or a list of ints, got "
                               f"a tensor on {lengths.device}; pass lengths.cpu()")
        out = lengths.numpy()
    else:
        out = np.asarray(list(lengths))
    if out.dtype.kind not in "iu" and not (out.dtype.kind == "f"
                                           and np.all(out == np.round(out))):
        raise TypeError(f"{fname}: lengths must be integers, got {out.dtype}")
    return out.astype(np.int64)


def pack_padded_sequence(input: Tensor, lengths: Any, batch_first: bool = False,  # noqa: A002
                         enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded batch (``(T, B, *)``, or ``(B, T, *)`` with ``batch_first``) whose
    sequence ``b`` is ``lengths[b]`` long.

    Args:
        input: the padded batch.
        lengths: one length per sequence (a list or a 1-D CPU int64 tensor), each in
            ``1 .. T``.
        batch_first: whether ``input`` is ``(B, T, *)``.
        enforce_sorted: require lengths in decreasing order; with False they are sorted here
            and the order is kept in the result (``sorted_indices``).

    Raises:
        RuntimeError: unsorted lengths with ``enforce_sorted=True``, a length of 0 or past the
            padded length, or as many lengths as sequences not given.
    """
    fname = "pack_padded_sequence()"
    if not isinstance(input, Tensor):
        raise TypeError(f"{fname}: input must be a Tensor, got {type(input).__name__}")
    lens = _lengths(lengths, fname)
    if input.dim() < 2:
        raise RuntimeError(f"{fname}: input must have a time and a batch dimension, got size "
                           f"{tuple(input.shape)}")
    x = input.transpose(0, 1) if batch_first else input
    T, B = x.shape[0], x.shape[1]
    if lens.size != B:
        raise RuntimeError(f"{fname}: {lens.size} lengths for a batch of {B} sequences")
    if B and lens.min() <= 0:
        raise RuntimeError(f"{fname}: every sequence needs a length of at least 1, got "
                           f"{lens.tolist()}")
    if B and lens.max() > T:
        raise RuntimeError(f"{fname}: a length of {int(lens.max())} in a padded batch of "
                           f"{T} steps")
    sorted_indices = None
    if enforce_sorted:
        if np.any(lens[1:] > lens[:-1]):
            raise RuntimeError(
                f"{fname}: with enforce_sorted=True the lengths must be in decreasing order, "
                f"got {lens.tolist()}; sort the batch by length, or pass enforce_sorted=False "
                f"and the order is kept in the PackedSequence")
    else:
        order = np.argsort(-lens, kind="stable")
        lens = lens[order]
        sorted_indices = _creation.tensor(order.astype(np.int64), device=x.device)
        x = x.index_select(1, sorted_indices)
    from mpitensor.nn._functional.recurrent import PaddedToPacked, padded_rows  # noqa: PLC0415

    steps = int(lens[0]) if B else 0
    batch_sizes = np.array([(lens > t).sum() for t in range(steps)], dtype=np.int64)
    x = x[:steps]
    rows = padded_rows(batch_sizes, B)
    data = PaddedToPacked.apply(x, rows)
    return PackedSequence(data, _creation.tensor(batch_sizes), sorted_indices, None)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False,
                        padding_value: float = 0.0, total_length: Optional[int] = None
                        ) -> Tuple[Tensor, Tensor]:
    """Undo :func:`pack_padded_sequence`: ``(padded, lengths)``, in the batch's original order.

    Args:
        sequence: a PackedSequence.
        batch_first: return ``(B, T, *)`` instead of ``(T, B, *)``.
        padding_value: the value of the padded positions.
        total_length: pad to this many steps (at least the longest sequence), as a model that
            must return a fixed length needs.

    Returns:
        The padded batch and an int64 CPU tensor of the lengths.
    """
    fname = "pad_packed_sequence()"
    if not isinstance(sequence, PackedSequence):
        raise TypeError(f"{fname}: expected a PackedSequence, got {type(sequence).__name__}")
    from mpitensor.nn._functional.recurrent import PackedToPadded, padded_rows  # noqa: PLC0415

    data, bs_t, _, unsorted = sequence
    batch_sizes = np.asarray(_host(bs_t), dtype=np.int64)
    T = len(batch_sizes)
    B = int(batch_sizes[0]) if T else 0
    if total_length is not None:
        if isinstance(total_length, bool) or not isinstance(total_length, numbers.Integral):
            raise TypeError(f"{fname}: total_length must be an int, got {total_length!r}")
        if total_length < T:
            raise ValueError(f"{fname}: total_length ({total_length}) is shorter than the "
                             f"longest sequence ({T} steps)")
    rows = padded_rows(batch_sizes, B)
    padded = PackedToPadded.apply(data, rows, T, B)
    if padding_value != 0:
        mask = np.zeros(T * B, dtype=bool)
        mask[rows] = True
        keep = _creation.tensor(mask.reshape((T, B) + (1,) * (data.dim() - 1)),
                                device=data.device)
        padded = padded.masked_fill(~keep, padding_value)
    if total_length is not None and total_length > T:
        extra = _creation.full((total_length - T, B) + tuple(data.shape[1:]), padding_value,
                               dtype=data.dtype, device=data.device)
        padded = _combining.cat([padded, extra], 0)
    # sequence b runs at every step whose batch size exceeds b
    lengths = (batch_sizes[:, None] > np.arange(B)[None, :]).sum(axis=0).astype(np.int64)
    if unsorted is not None:
        padded = padded.index_select(1, unsorted)
        lengths = lengths[_host(unsorted)]
    if batch_first:
        padded = padded.transpose(0, 1)
    return padded, _creation.tensor(lengths)


def pad_sequence(sequences: Any, batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Stack tensors of sizes ``(L_i, *)`` into one ``(L_max, B, *)`` tensor (``(B, L_max, *)``
    with ``batch_first``), padding each with ``padding_value`` on ``padding_side``."""
    fname = "pad_sequence()"
    if padding_side not in ("right", "left"):
        raise ValueError(f"{fname}: padding_side must be 'left' or 'right', got "
                         f"{padding_side!r}")
    if isinstance(sequences, Tensor):
        sequences = list(sequences.unbind(0))
    seqs = list(sequences)
    if not seqs:
        raise RuntimeError(f"{fname}: received an empty list of sequences")
    for i, s in enumerate(seqs):
        if not isinstance(s, Tensor):
            raise TypeError(f"{fname}: sequence {i} is a {type(s).__name__}, not a Tensor")
        if s.dim() < 1 or tuple(s.shape[1:]) != tuple(seqs[0].shape[1:]):
            raise RuntimeError(f"{fname}: every sequence must be (L, *) with the same trailing "
                               f"size; sequence {i} is {tuple(s.shape)}, sequence 0 "
                               f"{tuple(seqs[0].shape)}")
    longest = max(s.shape[0] for s in seqs)
    rows = []
    for s in seqs:
        missing = longest - s.shape[0]
        if missing:
            fill = _creation.full((missing,) + tuple(s.shape[1:]), padding_value,
                                  dtype=s.dtype, device=s.device)
            s = _combining.cat([s, fill] if padding_side == "right" else [fill, s], 0)
        rows.append(s)
    return _combining.stack(rows, 0 if batch_first else 1)


def pack_sequence(sequences: Sequence[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of tensors ``(L_i, *)``: :func:`pad_sequence`, then
    :func:`pack_padded_sequence` with their lengths."""
    seqs = list(sequences)
    lengths = [int(s.shape[0]) if isinstance(s, Tensor) and s.dim() else 0 for s in seqs]
    return pack_padded_sequence(pad_sequence(seqs), lengths, enforce_sorted=enforce_sorted)


def unpad_sequence(padded_sequences: Tensor, lengths: Any, batch_first: bool = False
                   ) -> List[Tensor]:
    """Split a padded batch back into its sequences, sequence ``b`` cut to ``lengths[b]``."""
    lens = _lengths(lengths, "unpad_sequence()")
    x = padded_sequences if batch_first else padded_sequences.transpose(0, 1)
    if lens.size != x.shape[0]:
        raise RuntimeError(f"unpad_sequence(): {lens.size} lengths for {x.shape[0]} sequences")
    return [x[b, :int(n)] for b, n in enumerate(lens)]


def unpack_sequence(packed_sequences: PackedSequence) -> List[Tensor]:
    """The sequences of a PackedSequence, as a list of tensors in the batch's order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
