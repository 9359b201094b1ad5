"""Loss modules with ``torch.nn``'s names, arguments and attributes: every one of them, and
the base classes ``_Loss`` and ``_WeightedLoss`` that programs subclass.

Each module keeps its configuration and calls the function of the same name in
:mod:`mpitensor.nn.functional`. Class weights are buffers, as in torch, so they appear in the
state dict and follow ``.to()``.

Example:
    >>> import mpitensor as mt
    >>> import mpitensor.nn as nn
    >>> nn.SmoothL1Loss(beta=0.5)(mt.tensor([1.0]), mt.tensor([0.0]))
    tensor(0.7500)
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Optional

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .._functional.checks import is_number
from .._functional.linear_ce import LinearCrossEntropyOptions
from ._common import _is_int, _reduction
from .distance import PairwiseDistance
from .linear import Linear
from .module import Module

__all__ = ["NLLLoss", "CrossEntropyLoss", "MSELoss", "BCELoss", "BCEWithLogitsLoss", "KLDivLoss",
           "L1Loss", "SmoothL1Loss", "HuberLoss", "SoftMarginLoss", "MarginRankingLoss",
           "HingeEmbeddingLoss", "CosineEmbeddingLoss", "TripletMarginLoss",
           "TripletMarginWithDistanceLoss", "PoissonNLLLoss", "GaussianNLLLoss",
           "MultiLabelSoftMarginLoss", "MultiMarginLoss", "MultiLabelMarginLoss", "NLLLoss2d",
           "CTCLoss", "LinearCrossEntropyLoss", "LinearCrossEntropyOptions"]


class _Loss(Module):
    """A loss of ``(input, target)``; by default forward calls ``F.<_fname>`` with the
    reduction (a loss with more arguments writes its own forward: passing them from a table
    cost 0.4 us a call)."""

    _fname = ""

    def __init__(
        self, size_average: Any = None, reduce: Any = None, reduction: str = "mean"
    ) -> None:
        super().__init__()
        self.reduction = _reduction(size_average, reduce, reduction, type(self).__name__)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return getattr(F, self._fname)(input, target, reduction=self.reduction)


class _WeightedLoss(_Loss):
    def __init__(
        self, weight: Optional[Tensor] = None, size_average: Any = None, reduce: Any = None,
        reduction: str = "mean",
    ) -> None:
        super().__init__(size_average, reduce, reduction)
        if weight is not None:
            if not isinstance(weight, Tensor):
                raise TypeError(f"{type(self).__name__}: weight must be a 1-D Tensor of class "
                                f"weights, got {type(weight).__name__}")
            if weight.ndim != 1:
                raise ValueError(f"{type(self).__name__}: weight must be 1-D (one weight per "
                                 f"class), got shape {tuple(weight.shape)}")
        self.register_buffer("weight", weight)


class NLLLoss(_WeightedLoss):
    """Negative log-likelihood of class ``target`` under log-probabilities ``input``.

    Args:
        weight: a 1-D tensor of per-class weights.
        ignore_index: a target value that contributes neither loss nor gradient.
        reduction: "mean" (weighted mean), "sum" or "none".
        size_average, reduce: torch's deprecated flags, folded into ``reduction``.

    Raises:
        ValueError: an unknown reduction or a weight that is not 1-D.

    Example:
        >>> import mpitensor as mt
        >>> NLLLoss()(mt.tensor([[-0.5, -1.0]]), mt.tensor([1]))
        tensor(1.)
    """

    def __init__(
        self, weight: Optional[Tensor] = None, size_average: Any = None, ignore_index: int = -100,
        reduce: Any = None, reduction: str = "mean",
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        if not _is_int(ignore_index):
            raise ValueError(f"NLLLoss: ignore_index must be an int, got {ignore_index!r}")
        self.ignore_index = int(ignore_index)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.nll_loss(input, target, weight=self.weight, ignore_index=self.ignore_index,
                          reduction=self.reduction)


class CrossEntropyLoss(_WeightedLoss):
    """``nll_loss(log_softmax(input, 1), target)`` with optional label smoothing.

    Args:
        weight: a 1-D tensor of per-class weights.
        ignore_index: a target value that contributes neither loss nor gradient.
        reduction: "mean", "sum" or "none".
        label_smoothing: in [0, 1]; mixes the target with the uniform distribution.
        size_average, reduce: torch's deprecated flags, folded into ``reduction``.

    Raises:
        ValueError: an unknown reduction, a weight that is not 1-D, or label_smoothing outside
            [0, 1].

    Example:
        >>> import mpitensor as mt
        >>> round(float(CrossEntropyLoss()(mt.zeros(1, 2), mt.tensor([0]))), 4)
        0.6931
    """

    def __init__(
        self, weight: Optional[Tensor] = None, size_average: Any = None, ignore_index: int = -100,
        reduce: Any = None, reduction: str = "mean", label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        if not _is_int(ignore_index):
            raise ValueError(f"CrossEntropyLoss: ignore_index must be an int, got "
                             f"{ignore_index!r}")
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
                or not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"CrossEntropyLoss: label_smoothing must be between 0.0 and 1.0, "
                             f"got {label_smoothing!r}")
        self.ignore_index = int(ignore_index)
        self.label_smoothing = float(label_smoothing)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        if self.label_smoothing:
            return F.cross_entropy(input, target, weight=self.weight,
                                   ignore_index=self.ignore_index, reduction=self.reduction,
                                   label_smoothing=self.label_smoothing)
        return F.cross_entropy(input, target, weight=self.weight, ignore_index=self.ignore_index,
                               reduction=self.reduction)


class MSELoss(_Loss):
    """Mean (or summed) squared error between ``input`` and ``target``.

    Args:
        reduction: "mean", "sum" or "none".
        size_average, reduce: torch's deprecated flags, folded into ``reduction``.

    Raises:
        ValueError: an unknown reduction.

    Example:
        >>> import mpitensor as mt
        >>> MSELoss()(mt.tensor([1.0, 3.0]), mt.tensor([0.0, 0.0]))
        tensor(5.)
    """

    _fname = "mse_loss"


def _loss_tensor(cls: str, name: str, value: Optional[Tensor]) -> Optional[Tensor]:
    if value is not None and not isinstance(value, Tensor):
        raise TypeError(f"{cls}: {name} must be a Tensor or None, got {type(value).__name__}")
    return value


class BCELoss(_Loss):
    """Binary cross entropy between probabilities ``input`` and ``target`` in [0, 1].

    Args:
        weight: optional rescaling of each element, broadcastable to the input (a buffer).
        reduction: "mean", "sum" or "none".
        size_average, reduce: torch's deprecated flags, folded into ``reduction``.

    Raises:
        ValueError: an unknown reduction. TypeError: a weight that is not a Tensor.

    Example:
        >>> import mpitensor as mt
        >>> round(float(BCELoss()(mt.tensor([0.5]), mt.tensor([1.0]))), 4)
        0.6931
    """

    def __init__(self, weight: Optional[Tensor] = None, size_average: Any = None,
                 reduce: Any = None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", _loss_tensor("BCELoss", "weight", weight))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.binary_cross_entropy(input, target, weight=self.weight,
                                      reduction=self.reduction)


class BCEWithLogitsLoss(_Loss):
    """Binary cross entropy on logits: ``sigmoid`` and :class:`BCELoss` in one stable step.

    Args:
        weight, reduction, size_average, reduce: as in :class:`BCELoss`.
        pos_weight: optional weight of the positive term per class (last dimension; a
            buffer).

    Raises:
        ValueError, TypeError: as :class:`BCELoss` (pos_weight is checked like weight).

    Example:
        >>> import mpitensor as mt
        >>> round(float(BCEWithLogitsLoss()(mt.tensor([0.0]), mt.tensor([1.0]))), 4)
        0.6931
    """

    def __init__(self, weight: Optional[Tensor] = None, size_average: Any = None,
                 reduce: Any = None, reduction: str = "mean",
                 pos_weight: Optional[Tensor] = None) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", _loss_tensor("BCEWithLogitsLoss", "weight", weight))
        self.register_buffer("pos_weight",
                             _loss_tensor("BCEWithLogitsLoss", "pos_weight", pos_weight))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.binary_cross_entropy_with_logits(input, target, self.weight,
                                                  pos_weight=self.pos_weight,
                                                  reduction=self.reduction)


class KLDivLoss(_Loss):
    """Kullback-Leibler divergence loss between log-probabilities ``input`` and ``target``.

    Args:
        reduction: "mean" (over every element; warns, as torch), "batchmean" (the KL
            divergence proper: sum over classes, mean over the batch), "sum" or "none".
        log_target: whether the target holds log-probabilities.
        size_average, reduce: torch's deprecated flags, folded into ``reduction``.

    Raises:
        ValueError: an unknown reduction.

    Example:
        >>> import mpitensor as mt
        >>> KLDivLoss(reduction="batchmean")(mt.zeros(1, 2), mt.ones(1, 2))
        tensor(0.)
    """

    def __init__(self, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
                 log_target: bool = False) -> None:
        batchmean = reduction == "batchmean" and size_average is None and reduce is None
        super().__init__(size_average, reduce, "mean" if batchmean else reduction)
        if batchmean:
            self.reduction = "batchmean"
        self.log_target = bool(log_target)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


def _number(cls: str, name: str, v: Any) -> Any:
    if not is_number(v):
        raise TypeError(f"{cls}: {name} must be a real number, got {v!r}")
    return v


class L1Loss(_Loss):
    """Mean absolute error.

    Example:
        >>> import mpitensor as mt
        >>> L1Loss()(mt.tensor([1.0, -1.0]), mt.tensor([0.0, 0.0]))
        tensor(1.)
    """

    _fname = "l1_loss"


class _OneNumberLoss(_Loss):
    """A loss with one more real number, the attribute ``_param``, which forward passes to
    ``F.<_fname>`` by that name."""

    _param = ""

    def _keep(self, value: Any) -> None:
        setattr(self, self._param, _number(type(self).__name__, self._param, value))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return getattr(F, self._fname)(input, target, reduction=self.reduction,
                                       **{self._param: getattr(self, self._param)})


class SmoothL1Loss(_OneNumberLoss):
    """Squared error below ``beta``, absolute error above.

    Example:
        >>> import mpitensor as mt
        >>> SmoothL1Loss()(mt.tensor([3.0]), mt.tensor([0.0]))
        tensor(2.5000)
    """

    _fname, _param = "smooth_l1_loss", "beta"

    def __init__(self, size_average: Any = None, reduce: Any = None, reduction: str = "mean",
                 beta: float = 1.0) -> None:
        super().__init__(size_average, reduce, reduction)
        self._keep(beta)


class HuberLoss(_OneNumberLoss):
    """Halved squared error below ``delta``, ``delta``-scaled absolute error above.

    Example:
        >>> import mpitensor as mt
        >>> HuberLoss(delta=2.0)(mt.tensor([3.0]), mt.tensor([0.0]))
        tensor(4.)
    """

    _fname, _param = "huber_loss", "delta"

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self._keep(delta)


class SoftMarginLoss(_Loss):
    """Two-class logistic loss, targets in {1, -1}.

    Example:
        >>> import mpitensor as mt
        >>> round(float(SoftMarginLoss()(mt.tensor([0.0]), mt.tensor([1.0]))), 4)
        0.6931
    """

    _fname = "soft_margin_loss"


class _MarginLoss(_Loss):
    """A loss with a ``margin`` (torch's default 0; a subclass with another default
    restates the signature)."""

    def __init__(self, margin: float = 0.0, size_average: Any = None, reduce: Any = None,
                 reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.margin = _number(type(self).__name__, "margin", margin)


class _PairMarginLoss(_MarginLoss):
    """A margin loss of two inputs and a target of 1 or -1, through ``F.<_fname>``."""

    _fname = ""

    def forward(self, input1: Tensor, input2: Tensor, target: Tensor) -> Tensor:
        return getattr(F, self._fname)(input1, input2, target, margin=self.margin,
                                       reduction=self.reduction)


class MarginRankingLoss(_PairMarginLoss):
    """``max(0, -target * (x1 - x2) + margin)``.

    Example:
        >>> import mpitensor as mt
        >>> MarginRankingLoss()(mt.tensor([1.0]), mt.tensor([2.0]), mt.tensor([1.0]))
        tensor(1.)
    """

    _fname = "margin_ranking_loss"


class HingeEmbeddingLoss(_MarginLoss):
    """``x`` for target 1, ``max(0, margin - x)`` for target -1.

    Example:
        >>> import mpitensor as mt
        >>> HingeEmbeddingLoss()(mt.tensor([0.25]), mt.tensor([-1.0]))
        tensor(0.7500)
    """

    def __init__(self, margin: float = 1.0, size_average: Any = None, reduce: Any = None,
                 reduction: str = "mean") -> None:
        super().__init__(margin, size_average, reduce, reduction)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.hinge_embedding_loss(input, target, margin=self.margin,
                                      reduction=self.reduction)


class CosineEmbeddingLoss(_PairMarginLoss):
    """``1 - cos`` for target 1, ``max(0, cos - margin)`` for target -1.

    Example:
        >>> import mpitensor as mt
        >>> CosineEmbeddingLoss()(mt.tensor([[1.0, 0.0]]), mt.tensor([[0.0, 1.0]]),
        ...                       mt.tensor([1.0]))
        tensor(1.)
    """

    _fname = "cosine_embedding_loss"


class TripletMarginLoss(_Loss):
    """``max(0, d(a, p) - d(a, n) + margin)`` with the p-norm distance.

    Raises:
        ValueError: ``margin <= 0``.

    Example:
        >>> import mpitensor as mt
        >>> a = mt.zeros(1, 2)
        >>> TripletMarginLoss(eps=0.0)(a, a, mt.tensor([[0.0, 3.0]]))
        tensor(0.)
    """

    def __init__(self, margin: float = 1.0, p: float = 2.0, eps: float = 1e-6,
                 swap: bool = False, size_average: Any = None, reduce: Any = None,
                 reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        if not _number("TripletMarginLoss", "margin", margin) > 0:
            raise ValueError(f"TripletMarginLoss: margin must be greater than 0, got {margin}")
        self.margin = margin
        self.p = _number("TripletMarginLoss", "p", p)
        self.eps = _number("TripletMarginLoss", "eps", eps)
        self.swap = swap

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return F.triplet_margin_loss(anchor, positive, negative, margin=self.margin, p=self.p,
                                     eps=self.eps, swap=self.swap, reduction=self.reduction)


class TripletMarginWithDistanceLoss(_Loss):
    """:class:`TripletMarginLoss` with any distance (default :class:`PairwiseDistance`, a
    child module, as in torch).

    Raises:
        ValueError: ``margin <= 0``.

    Example:
        >>> import mpitensor as mt
        >>> a = mt.zeros(1, 2)
        >>> TripletMarginWithDistanceLoss()(a, a, mt.tensor([[0.0, 3.0]]))
        tensor(0.)
    """

    def __init__(self, *, distance_function: Optional[Callable] = None, margin: float = 1.0,
                 swap: bool = False, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        if not _number("TripletMarginWithDistanceLoss", "margin", margin) > 0:
            raise ValueError(f"TripletMarginWithDistanceLoss: margin must be greater than 0, "
                             f"got {margin}")
        self.distance_function = (distance_function if distance_function is not None
                                  else PairwiseDistance())
        self.margin = margin
        self.swap = swap

    def forward(self, anchor: Tensor, positive: Tensor, negative: Tensor) -> Tensor:
        return F.triplet_margin_with_distance_loss(
            anchor, positive, negative, distance_function=self.distance_function,
            margin=self.margin, swap=self.swap, reduction=self.reduction)


class PoissonNLLLoss(_Loss):
    """Poisson negative log-likelihood (see :func:`~mpitensor.nn.functional.poisson_nll_loss`).

    Example:
        >>> import mpitensor as mt
        >>> PoissonNLLLoss()(mt.tensor([0.0]), mt.tensor([1.0]))
        tensor(1.)
    """

    def __init__(self, log_input: bool = True, full: bool = False, size_average: Any = None,
                 eps: float = 1e-8, reduce: Any = None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_input = log_input
        self.full = full
        self.eps = _number("PoissonNLLLoss", "eps", eps)

    def forward(self, log_input: Tensor, target: Tensor) -> Tensor:
        return F.poisson_nll_loss(log_input, target, log_input=self.log_input, full=self.full,
                                  eps=self.eps, reduction=self.reduction)


class GaussianNLLLoss(_Loss):
    """Gaussian negative log-likelihood (see
    :func:`~mpitensor.nn.functional.gaussian_nll_loss`).

    Example:
        >>> import mpitensor as mt
        >>> GaussianNLLLoss()(mt.tensor([1.0]), mt.tensor([1.0]), mt.tensor([1.0]))
        tensor(0.)
    """

    def __init__(self, *, full: bool = False, eps: float = 1e-6,
                 reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        self.full = full
        self.eps = _number("GaussianNLLLoss", "eps", eps)

    def forward(self, input: Tensor, target: Tensor, var: Any) -> Tensor:  # noqa: A002
        return F.gaussian_nll_loss(input, target, var, full=self.full, eps=self.eps,
                                   reduction=self.reduction)


class MultiLabelSoftMarginLoss(_WeightedLoss):
    """Per-class logistic loss averaged over the classes.

    Example:
        >>> import mpitensor as mt
        >>> round(float(MultiLabelSoftMarginLoss()(mt.zeros(1, 2), mt.ones(1, 2))), 4)
        0.6931
    """

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.multilabel_soft_margin_loss(input, target, weight=self.weight,
                                             reduction=self.reduction)


class MultiMarginLoss(_WeightedLoss):
    """Multi-class hinge loss (``p`` = 1 or 2).

    Raises:
        ValueError: another ``p``, or a weight that is not 1-D.

    Example:
        >>> import mpitensor as mt
        >>> MultiMarginLoss()(mt.tensor([[0.0, 0.5]]), mt.tensor([0]))
        tensor(0.7500)
    """

    def __init__(self, p: int = 1, margin: float = 1.0, weight: Optional[Tensor] = None,
                 size_average: Any = None, reduce: Any = None, reduction: str = "mean") -> None:
        super().__init__(weight, size_average, reduce, reduction)
        if p not in (1, 2) or isinstance(p, bool):
            raise ValueError(f"MultiMarginLoss: p must be 1 or 2, got {p!r}")
        self.p = p
        self.margin = _number("MultiMarginLoss", "margin", margin)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.multi_margin_loss(input, target, p=self.p, margin=self.margin,
                                   weight=self.weight, reduction=self.reduction)


class MultiLabelMarginLoss(_Loss):
    """Multi-label hinge loss (targets: class indices, ended by -1).

    Example:
        >>> import mpitensor as mt
        >>> MultiLabelMarginLoss()(mt.tensor([[0.1, 0.2, 0.4, 0.8]]), mt.tensor([[3, 0, -1, 1]]))
        tensor(0.8500)
    """

    _fname = "multilabel_margin_loss"



class NLLLoss2d(NLLLoss):
    """Deprecated: :class:`NLLLoss` under its old name for (N, C, H, W) inputs (warns, as in
    torch); it takes any shape NLLLoss takes.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     NLLLoss2d()
        NLLLoss2d()
    """

    def __init__(self, weight: Optional[Tensor] = None, size_average: Any = None,
                 ignore_index: int = -100, reduce: Any = None, reduction: str = "mean") -> None:
        warnings.warn("NLLLoss2d is deprecated; use NLLLoss, which takes the same inputs",
                      FutureWarning, stacklevel=2)
        super().__init__(weight, size_average, ignore_index, reduce, reduction)


class CTCLoss(_Loss):
    """The connectionist temporal classification loss (see
    :func:`mpitensor.nn.functional.ctc_loss`).

    Args:
        blank: the blank class (default 0).
        reduction: ``'mean'`` (each sample's loss over its target length, averaged),
            ``'sum'`` or ``'none'``.
        zero_infinity: impossible alignments give a loss and gradient of 0.

    Example:
        >>> import mpitensor as mt
        >>> lp = mt.randn(6, 2, 4).log_softmax(2)
        >>> CTCLoss()(lp, mt.tensor([[1, 2], [3, 3]]), (6, 5), (2, 2)).shape
        mpitensor.Size([])
    """

    def __init__(self, blank: int = 0, reduction: str = "mean",
                 zero_infinity: bool = False) -> None:
        super().__init__(reduction=reduction)
        self.blank = blank
        self.zero_infinity = zero_infinity

    def forward(self, log_probs: Tensor, targets: Tensor, input_lengths: Any,
                target_lengths: Any) -> Tensor:
        return F.ctc_loss(log_probs, targets, input_lengths, target_lengths, self.blank,
                          self.reduction, self.zero_infinity)


class LinearCrossEntropyLoss(_WeightedLoss):
    """A classifier head and its cross entropy in one: ``self.linear`` maps the inputs to
    ``num_classes`` (times ``prod(out_features)`` for a K-dimensional loss) logits, scored
    by :func:`~mpitensor.nn.functional.linear_cross_entropy`.

    Args:
        in_features: the size of each input row.
        num_classes: the class count C.
        out_features: extra loss dimensions (d1, ..., dK); the logits are (N, C, d1, ...).
        bias: give the linear map a bias.
        device, dtype: for the linear map's parameters.
        reduction, weight, ignore_index, label_smoothing: as
            :class:`~mpitensor.nn.CrossEntropyLoss` (``ignore_index=None`` means -100).
        options: a :class:`LinearCrossEntropyOptions` to chunk the batch, or None.

    Example:
        >>> import mpitensor as mt
        >>> loss = LinearCrossEntropyLoss(4, 5)
        >>> loss(mt.randn(3, 4), mt.tensor([0, 1, 4])).shape
        mpitensor.Size([])
    """

    def __init__(self, in_features: int, num_classes: int, *, out_features: tuple = (),
                 bias: bool = False, device: Any = None, dtype: Any = None,
                 reduction: str = "mean", weight: Optional[Tensor] = None,
                 ignore_index: Optional[int] = None, label_smoothing: float = 0.0,
                 options: Optional[LinearCrossEntropyOptions] = None) -> None:
        super().__init__(weight, None, None, reduction)
        self.num_classes = num_classes
        self.out_features = tuple(out_features)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.options = options
        self.linear = Linear(in_features, num_classes * math.prod(self.out_features), bias=bias,
                             device=device, dtype=dtype)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:  # noqa: A002 - torch's name
        w = self.linear.weight.reshape((self.num_classes, *self.out_features,
                                        self.linear.in_features))
        b = self.linear.bias
        if b is not None:
            b = b.reshape((self.num_classes, *self.out_features))
        return F.linear_cross_entropy(input, w, target, linear_bias=b, weight=self.weight,
                                      reduction=self.reduction, ignore_index=self.ignore_index,
                                      label_smoothing=self.label_smoothing,
                                      options=self.options)

    def extra_repr(self) -> str:
        return (f"in_features={self.linear.in_features}, num_classes={self.num_classes}, "
                f"out_features={self.out_features}, bias={self.linear.bias is not None}, "
                f"reduction={self.reduction}, ignore_index={self.ignore_index}, "
                f"label_smoothing={self.label_smoothing}, options={self.options}")
