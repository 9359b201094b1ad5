"""Distance modules with ``torch.nn``'s names: :class:`PairwiseDistance`,
:class:`CosineSimilarity`.

Example:
    >>> import mpitensor as mt
    >>> CosineSimilarity(dim=0)(mt.tensor([1.0, 0.0]), mt.tensor([2.0, 0.0]))
    tensor(1.)
"""

from __future__ import annotations

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .._functional.checks import is_int, is_number
from .module import Module

__all__ = ["PairwiseDistance", "CosineSimilarity"]


class PairwiseDistance(Module):
    """``||x1 - x2 + eps||_p`` over the last dimension.

    Args:
        p: the norm's exponent.
        eps: added to the difference (keeps the gradient finite at 0).
        keepdim: keep the reduced dimension.

    Example:
        >>> import mpitensor as mt
        >>> PairwiseDistance(eps=0.0)(mt.tensor([[0.0, 0.0]]), mt.tensor([[3.0, 4.0]]))
        tensor([5.])
    """

    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> None:
        super().__init__()
        if not is_number(p) or not is_number(eps):
            raise TypeError(f"PairwiseDistance: p and eps must be numbers, got {p!r}, {eps!r}")
        self.norm = p
        self.eps = eps
        self.keepdim = keepdim

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


class CosineSimilarity(Module):
    """Cosine of the angle between ``x1`` and ``x2`` along ``dim``.

    Example:
        >>> import mpitensor as mt
        >>> CosineSimilarity()(mt.tensor([[1.0, 0.0]]), mt.tensor([[0.0, 1.0]]))
        tensor([0.])
    """

    def __init__(self, dim: int = 1, eps: float = 1e-8) -> None:
        super().__init__()
        if not is_int(dim):
            raise TypeError(f"CosineSimilarity: dim must be an int, got {dim!r}")
        self.dim = dim
        self.eps = eps

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return F.cosine_similarity(x1, x2, self.dim, self.eps)



