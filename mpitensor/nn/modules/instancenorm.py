"""``torch.nn.modules.instancenorm``: instance normalisation (``InstanceNorm1d/2d/3d`` and their
lazy forms): each sample's channels normalised over their own spatial positions."""

from __future__ import annotations

import warnings
from typing import Any, Optional

from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .batchnorm import _NormBase, _ranked
from .lazy import _lazy_norm

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LazyInstanceNorm1d",
           "LazyInstanceNorm2d", "LazyInstanceNorm3d"]


class _InstanceNorm(_NormBase):
    """Shared body of the instance-norm layers: each (sample, channel) plane is normalised by
    its own statistics; an unbatched input (one rank fewer) is taken as a batch of one."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = False, track_running_stats: bool = False, device: Any = None,
                 dtype: Any = None, *, bias: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                         dtype, bias=bias)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        self._check_input_dim(input)
        unbatched = input.ndim == self._ranks[0]
        channel_dim = 0 if unbatched else 1
        if input.shape[channel_dim] != self.num_features:
            if self.affine:
                raise ValueError(f"{type(self).__name__}: expected {self.num_features} channels "
                                 f"(dimension {channel_dim}) to match num_features, got "
                                 f"{input.shape[channel_dim]}")
            warnings.warn(f"{type(self).__name__}: input has {input.shape[channel_dim]} "
                          f"channels but num_features is {self.num_features}; with "
                          f"affine=False the channels are normalised anyway", stacklevel=2)
        x = input.unsqueeze(0) if unbatched else input
        out = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                              self.training or not self.track_running_stats,
                              0.0 if self.momentum is None else float(self.momentum), self.eps)
        return out.squeeze(0) if unbatched else out


class InstanceNorm1d(_InstanceNorm):
    """Instance normalisation of (N, C, L) or (C, L) inputs: each plane by its own mean and
    (biased) variance.

    Args: as :class:`BatchNorm1d`, but ``affine`` and ``track_running_stats`` default to
    False; with running statistics, evaluation mode normalises with them.

    Example:
        >>> import mpitensor as mt
        >>> InstanceNorm1d(3).extra_repr()
        '3, eps=1e-05, momentum=0.1, affine=False, bias=False, track_running_stats=False'
    """

    _ranks = (2, 3)


InstanceNorm2d = _ranked(_InstanceNorm, "InstanceNorm2d", (3, 4), """Instance normalisation of
    (N, C, H, W) or (C, H, W) inputs (see :class:`InstanceNorm1d`).""", (2, 3, 4, 4))
InstanceNorm3d = _ranked(_InstanceNorm, "InstanceNorm3d", (4, 5), """Instance normalisation of
    (N, C, D, H, W) or (C, D, H, W) inputs (see :class:`InstanceNorm1d`).""", (2, 3, 2, 4, 4))


LazyInstanceNorm1d = _lazy_norm(InstanceNorm1d, True, _NormBase)


LazyInstanceNorm2d = _lazy_norm(InstanceNorm2d, True, _NormBase)


LazyInstanceNorm3d = _lazy_norm(InstanceNorm3d, True, _NormBase)
