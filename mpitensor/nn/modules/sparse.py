"""Lookup-table modules with ``torch.nn``'s names: :class:`Embedding`, :class:`EmbeddingBag`.

The table is a ``weight`` parameter of shape (num_embeddings, embedding_dim), drawn from
N(0, 1) as torch draws it (the ``padding_idx`` row zeroed), or given with ``from_pretrained``.

Example:
    >>> import mpitensor as mt
    >>> emb = Embedding(10, 3, padding_idx=0)
    >>> emb
    Embedding(10, 3, padding_idx=0)
    >>> emb(mt.tensor([[0, 2]])).shape
    mpitensor.Size([1, 2, 3])
"""

from __future__ import annotations

from typing import Any, Optional

from mpitensor import dtypes as _dt
from mpitensor.autograd import no_grad
from mpitensor.tensor import Tensor, empty

from .. import functional as F  # noqa: N812 - torch's spelling
from .. import init
from .._functional.checks import is_int
from ..parameter import Parameter
from ._common import _repr_fields
from .module import Module

__all__ = ["Embedding", "EmbeddingBag"]


def _sizes(cls: str, num_embeddings: Any, embedding_dim: Any) -> tuple:
    for name, v in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
        if not is_int(v) or v < 0:
            raise ValueError(f"{cls}: {name} must be a non-negative integer, got {v!r}")
    return int(num_embeddings), int(embedding_dim)


def _padding(cls: str, padding_idx: Optional[int], n: int) -> Optional[int]:
    if padding_idx is None:
        return None
    if not is_int(padding_idx) or not -n <= padding_idx < n:
        raise ValueError(f"{cls}: padding_idx must be within num_embeddings ({n}), got "
                         f"{padding_idx!r}")
    return int(padding_idx) % n


def _table(cls: str, n: int, d: int, weight: Optional[Tensor], freeze: bool, device: Any,
           dtype: Any) -> Parameter:
    if weight is None:
        dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
        return Parameter(empty(n, d, dtype=dt, device=device), requires_grad=not freeze)
    if tuple(weight.shape) != (n, d):
        raise ValueError(f"{cls}: _weight must have shape ({n}, {d}), got {tuple(weight.shape)}")
    return Parameter(weight, requires_grad=not freeze)


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of size ``embedding_dim``, looked up by index.

    Args:
        num_embeddings, embedding_dim: the table's shape.
        padding_idx: a row whose gradient stays 0 (and which starts at zeros).
        max_norm, norm_type: renormalise looked-up rows longer than ``max_norm`` (in place).
        scale_grad_by_freq: divide row gradients by their lookup counts in the batch.
        sparse: give the table a sparse COO gradient (for SparseAdam and SGD).
        _weight, _freeze: torch's private constructor arguments (a given table; no grad).
        device, dtype: where and how to make the table.

    Raises:
        ValueError: negative sizes, ``padding_idx`` out of range, a ``_weight`` of another
            shape.

    Example:
        >>> import mpitensor as mt
        >>> Embedding(4, 2)(mt.tensor([3])).shape
        mpitensor.Size([1, 2])
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 padding_idx: Optional[int] = None, max_norm: Optional[float] = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight: Optional[Tensor] = None, _freeze: bool = False,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = _sizes("Embedding", num_embeddings,
                                                         embedding_dim)
        self.padding_idx = _padding("Embedding", padding_idx, self.num_embeddings)
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        self.weight = _table("Embedding", self.num_embeddings, self.embedding_dim, _weight,
                             _freeze, device, dtype)
        if _weight is None:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the table from N(0, 1) and zero the ``padding_idx`` row."""
        init.normal_(self.weight)
        self._fill_padding_idx_with_zero()

    def _fill_padding_idx_with_zero(self) -> None:
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx].fill_(0)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.embedding(input, self.weight, self.padding_idx, self.max_norm,
                           self.norm_type, self.scale_grad_by_freq, self.sparse)

    def extra_repr(self) -> str:
        s = _repr_fields(self, ("num_embeddings", "embedding_dim"), padding_idx=None,
                         max_norm=None, norm_type=2, scale_grad_by_freq=False)
        return s + (", sparse=True" if self.sparse is not False else "")

    @classmethod
    def from_pretrained(cls, embeddings: Tensor, freeze: bool = True,
                        padding_idx: Optional[int] = None, max_norm: Optional[float] = None,
                        norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool = False) -> Embedding:
        """An Embedding whose table is ``embeddings`` (2-D; shared, not copied), frozen unless
        ``freeze=False``. The ``padding_idx`` row is kept as given.

        Raises:
            ValueError: ``embeddings`` is not 2-D.
        """
        if not isinstance(embeddings, Tensor) or embeddings.ndim != 2:
            raise ValueError("Embedding.from_pretrained: embeddings must be a 2-D tensor")
        rows, cols = embeddings.shape
        return cls(rows, cols, _weight=embeddings, _freeze=freeze, padding_idx=padding_idx,
                   max_norm=max_norm, norm_type=norm_type,
                   scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)


class EmbeddingBag(Module):
    """Sums, means or maxima of bags of embeddings (see
    :func:`~mpitensor.nn.functional.embedding_bag`).

    Raises:
        ValueError: negative sizes, an unknown mode, ``padding_idx`` out of range.

    Example:
        >>> import mpitensor as mt
        >>> EmbeddingBag(10, 3, mode="sum")(mt.tensor([[1, 2], [3, 4]])).shape
        mpitensor.Size([2, 3])
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 max_norm: Optional[float] = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                 _weight: Optional[Tensor] = None, include_last_offset: bool = False,
                 padding_idx: Optional[int] = None, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = _sizes("EmbeddingBag", num_embeddings,
                                                         embedding_dim)
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"EmbeddingBag: mode must be 'sum', 'mean' or 'max', got {mode!r}")
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.padding_idx = _padding("EmbeddingBag", padding_idx, self.num_embeddings)
        self.weight = _table("EmbeddingBag", self.num_embeddings, self.embedding_dim, _weight,
                             False, device, dtype)
        self.mode = mode
        self.sparse = sparse
        self.include_last_offset = include_last_offset
        if _weight is None:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the table from N(0, 1) and zero the ``padding_idx`` row."""
        init.normal_(self.weight)
        if self.padding_idx is not None:
            with no_grad():
                self.weight[self.padding_idx].fill_(0)

    def forward(self, input: Tensor, offsets: Optional[Tensor] = None,  # noqa: A002
                per_sample_weights: Optional[Tensor] = None) -> Tensor:
        return F.embedding_bag(input, self.weight, offsets, self.max_norm, self.norm_type,
                               self.scale_grad_by_freq, self.mode, self.sparse,
                               per_sample_weights, self.include_last_offset, self.padding_idx)

    def extra_repr(self) -> str:
        s = _repr_fields(self, ("num_embeddings", "embedding_dim"), max_norm=None, norm_type=2,
                         scale_grad_by_freq=False)
        s += f", mode={self.mode!r}"  # always shown, quoted, as torch does
        return s + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")

    @classmethod
    def from_pretrained(cls, embeddings: Tensor, freeze: bool = True,
                        max_norm: Optional[float] = None, norm_type: float = 2.0,
                        scale_grad_by_freq: bool = False, mode: str = "mean",
                        sparse: bool = False, include_last_offset: bool = False,
                        padding_idx: Optional[int] = None) -> EmbeddingBag:
        """An EmbeddingBag whose table is ``embeddings`` (2-D), frozen unless
        ``freeze=False``.

        Raises:
            ValueError: ``embeddings`` is not 2-D.
        """
        if not isinstance(embeddings, Tensor) or embeddings.ndim != 2:
            raise ValueError("EmbeddingBag.from_pretrained: embeddings must be a 2-D tensor")
        rows, cols = embeddings.shape
        bag = cls(rows, cols, max_norm=max_norm, norm_type=norm_type,
                  scale_grad_by_freq=scale_grad_by_freq, mode=mode, sparse=sparse,
                  _weight=embeddings, include_last_offset=include_last_offset,
                  padding_idx=padding_idx)
        bag.weight.requires_grad = not freeze
        return bag
