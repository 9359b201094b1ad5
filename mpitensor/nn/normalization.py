"""Normalisation layers with ``torch.nn``'s names, arguments, buffers and ``state_dict`` keys.

:class:`BatchNorm1d` and :class:`BatchNorm2d` normalise each channel over the batch (and
positions), tracking running statistics in the buffers ``running_mean``, ``running_var`` and
``num_batches_tracked`` (int64) for evaluation; :class:`GroupNorm` and :class:`LayerNorm`
normalise each sample on its own and keep no state beyond their affine parameters. The math
and the gradients are :func:`~mpitensor.nn.functional.batch_norm`,
:func:`~mpitensor.nn.functional.group_norm` and :func:`~mpitensor.nn.functional.layer_norm`.

Example:
    >>> import mpitensor as mt
    >>> import mpitensor.nn as nn
    >>> bn = nn.BatchNorm2d(3)
    >>> list(bn.state_dict())
    ['weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked']
    >>> bn(mt.randn(4, 3, 5, 5)).shape
    mpitensor.Size([4, 3, 5, 5])
"""

from __future__ import annotations

import numbers
from typing import Any, Optional, Union

from mpitensor import dtypes as _dt
from mpitensor.autograd import no_grad
from mpitensor.tensor import Tensor, empty, ones, zeros

from . import functional as F  # noqa: N812 - torch's spelling
from . import init
from .layers import _factory, _positive_int
from .module import Module
from .parameter import Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d", "GroupNorm", "LayerNorm"]


def _check_eps(cls: str, eps: Any) -> float:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"{cls}: eps must be a non-negative number, got {eps!r}")
    return float(eps)


def _affine_params(module: Module, shape: tuple, weight: bool, bias: bool, dtype: Any,
                   device: Any) -> None:
    """Register ``weight`` and ``bias`` of ``shape`` (or None), then set them to 1 and 0."""
    for name, wanted in (("weight", weight), ("bias", bias)):
        if wanted:
            module.register_parameter(name, Parameter(empty(*shape, dtype=dtype, device=device)))
        else:
            module.register_parameter(name, None)


def _reset_affine(module: Module) -> None:
    if module.weight is not None:
        init.ones_(module.weight)
    if module.bias is not None:
        init.zeros_(module.bias)


class _BatchNorm(Module):
    """Shared body of the batch-norm layers; subclasses say which input ranks they take."""

    _ranks: tuple = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        cls = type(self).__name__
        self.num_features = _positive_int(num_features, cls, "num_features")
        self.eps = _check_eps(cls, eps)
        if momentum is not None and (isinstance(momentum, bool)
                                     or not isinstance(momentum, numbers.Real)):
            raise ValueError(f"{cls}: momentum must be a number or None (a cumulative "
                             f"average), got {momentum!r}")
        self.momentum = momentum
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        dt = _factory(dtype, cls)
        _affine_params(self, (self.num_features,), self.affine, self.affine and bool(bias), dt,
                       device)
        if self.track_running_stats:
            self.register_buffer("running_mean", zeros(self.num_features, dtype=dt,
                                                       device=device))
            self.register_buffer("running_var", ones(self.num_features, dtype=dt,
                                                     device=device))
            self.register_buffer("num_batches_tracked", zeros((), dtype=_dt.int64,
                                                              device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Set the running mean to 0, the running variance to 1 and the batch count to 0."""
        if self.track_running_stats:
            with no_grad():
                self.running_mean.zero_()
                self.running_var.fill_(1)
                self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        """Reset the running statistics, and the affine parameters to weight 1, bias 0."""
        self.reset_running_stats()
        _reset_affine(self)

    def _check_input_dim(self, input: Tensor) -> None:  # noqa: A002 - torch's name
        if input.ndim not in self._ranks:
            want = " or ".join(f"{r}D" for r in self._ranks)
            raise ValueError(f"{type(self).__name__}: expected a {want} input, got a "
                             f"{input.ndim}D input of shape {tuple(input.shape)}")

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else float(self.momentum)
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked._data += 1
            if self.momentum is None:  # a cumulative average of every batch so far
                factor = 1.0 / float(self.num_batches_tracked._data)
        # Batch statistics while training, and also in eval mode when none are tracked;
        # the running buffers are updated only while training.
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        return F.batch_norm(input, self.running_mean if track else None,
                            self.running_var if track else None, self.weight, self.bias,
                            use_batch, factor, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, bias={self.bias is not None}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of (N, C) or (N, C, L) inputs, per channel, as ``torch.nn``'s.

    In training mode each channel is normalised by the batch's mean and (biased) variance,
    and the running statistics are updated with the unbiased variance:
    ``running = (1 - momentum) * running + momentum * batch`` (``momentum=None``: the
    cumulative average of all batches seen). In evaluation mode the running statistics are
    used (the batch's, when ``track_running_stats=False``).

    Args:
        num_features: the channel count C (> 0).
        eps: added to the variance for stability.
        momentum: the weight of each batch in the running update, or None.
        affine: learn a per-channel ``weight`` (init 1) and ``bias`` (init 0).
        track_running_stats: keep running statistics (buffers) for evaluation.
        device, dtype: where and in which float dtype to create parameters and buffers.
        bias: with ``affine``, whether to learn the bias too (keyword only).

    Raises:
        ValueError: a bad num_features, eps or momentum; in forward, an input of the wrong
            rank, or one value per channel in training.

    Example:
        >>> import mpitensor as mt
        >>> BatchNorm1d(4)(mt.randn(8, 4)).shape
        mpitensor.Size([8, 4])
    """

    _ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of (N, C, H, W) inputs, per channel (arguments as
    :class:`BatchNorm1d`).

    The output keeps the input's memory layout (a conv2d output's batch-innermost one too), so
    a conv -> batch norm -> relu -> conv chain makes no layout copies.

    Example:
        >>> import mpitensor as mt
        >>> BatchNorm2d(3)(mt.randn(2, 3, 4, 4)).shape
        mpitensor.Size([2, 3, 4, 4])
    """

    _ranks = (4,)


class GroupNorm(Module):
    """Group normalisation: each sample's channels normalised in ``num_groups`` groups.

    Args:
        num_groups: groups to split the channels into (must divide ``num_channels``).
        num_channels: the channel count C of the (N, C, *) inputs.
        eps: added to the variance for stability.
        affine: learn a per-channel ``weight`` (init 1) and ``bias`` (init 0).
        device, dtype: where and in which float dtype to create the parameters.
        bias: with ``affine``, whether to learn the bias too (keyword only).

    Raises:
        ValueError: non-positive counts, ``num_channels`` not divisible by ``num_groups``,
            a negative eps.

    Example:
        >>> import mpitensor as mt
        >>> GroupNorm(2, 4)(mt.randn(3, 4, 5)).shape
        mpitensor.Size([3, 4, 5])
    """

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True, device: Any = None, dtype: Any = None, *,
                 bias: bool = True) -> None:
        super().__init__()
        cls = "GroupNorm"
        self.num_groups = _positive_int(num_groups, cls, "num_groups")
        self.num_channels = _positive_int(num_channels, cls, "num_channels")
        if self.num_channels % self.num_groups:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by "
                             f"num_groups ({num_groups})")
        self.eps = _check_eps(cls, eps)
        self.affine = bool(affine)
        _affine_params(self, (self.num_channels,), self.affine, self.affine and bool(bias),
                       _factory(dtype, cls), device)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set the affine parameters to weight 1, bias 0."""
        _reset_affine(self)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_groups}, {self.num_channels}, eps={self.eps}, "
                f"affine={self.affine}, bias={self.bias is not None}")


class LayerNorm(Module):
    """Layer normalisation over the trailing ``normalized_shape`` of each input.

    Args:
        normalized_shape: an int or a sequence of ints: the trailing shape to normalise.
        eps: added to the variance for stability.
        elementwise_affine: learn a ``weight`` (init 1) and ``bias`` (init 0) shaped
            ``normalized_shape``.
        bias: with ``elementwise_affine``, whether to learn the bias too.
        device, dtype: where and in which float dtype to create the parameters.

    Raises:
        TypeError, ValueError: a malformed normalized_shape, a negative eps.

    Example:
        >>> import mpitensor as mt
        >>> LayerNorm(8)(mt.randn(2, 5, 8)).shape
        mpitensor.Size([2, 5, 8])
    """

    def __init__(self, normalized_shape: Union[int, tuple, list], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.normalized_shape = F._normalized_shape(normalized_shape, "LayerNorm")
        self.eps = _check_eps("LayerNorm", eps)
        self.elementwise_affine = bool(elementwise_affine)
        _affine_params(self, self.normalized_shape, self.elementwise_affine,
                       self.elementwise_affine and bool(bias), _factory(dtype, "LayerNorm"),
                       device)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set the affine parameters to weight 1, bias 0."""
        _reset_affine(self)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}")
