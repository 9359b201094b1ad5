"""``torch.nn.modules.normalization``: the per-sample normalisation layers, which keep no
running statistics: :class:`LayerNorm`, :class:`GroupNorm`, :class:`RMSNorm`, and the
cross-channel :class:`LocalResponseNorm` and :class:`CrossMapLRN2d` (batch norm is in
:mod:`.batchnorm`, instance norm in :mod:`.instancenorm`).

Example:
    >>> import mpitensor as mt
    >>> import mpitensor.nn as nn
    >>> ln = nn.LayerNorm(3)
    >>> list(ln.state_dict())
    ['weight', 'bias']
    >>> ln(mt.randn(4, 3)).shape
    mpitensor.Size([4, 3])
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor, empty

from .. import functional as F  # noqa: N812 - torch's spelling
from .. import init
from .._functional.checks import is_int, xp_of
from .._functional.norm import _normalized_shape
from ..parameter import Parameter
from ._common import _affine_params, _check_eps, _factory, _positive_int, _reset_affine
from .module import Module

__all__ = ["GroupNorm", "LayerNorm", "LocalResponseNorm", "CrossMapLRN2d", "RMSNorm"]


class _AffineNorm(Module):
    """A normalisation layer whose optional affine map starts as weight 1, bias 0: its forward
    is ``F.<_norm>(input, <_lead's first attribute>, weight, bias, eps)``; its repr lists the
    ``_lead`` attributes, ``eps``, the ``_flag`` attribute (whether it is affine) and the
    bias. ``F.<_norm>`` is looked up at each call, as a call written out would be, so that
    whatever wraps the public function later (the DTensor sharding rules) sees the module's
    calls too."""

    _norm = ""
    _lead: tuple = ()
    _flag = ""

    def _init_affine(self, cls: str, shape: tuple, eps: Any, affine: bool, bias: bool,
                     dtype: Any, device: Any) -> None:
        """Check ``eps``, register the (optional) affine parameters of ``shape``, reset them."""
        self.eps = _check_eps(cls, eps)
        _affine_params(self, shape, affine, affine and bool(bias), _factory(dtype, cls), device)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set the affine parameters to weight 1, bias 0."""
        _reset_affine(self)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return getattr(F, self._norm)(input, getattr(self, self._lead[0]), self.weight, self.bias,
                                      self.eps)

    def extra_repr(self) -> str:
        lead = ", ".join(str(getattr(self, n)) for n in self._lead)
        return (f"{lead}, eps={self.eps}, {self._flag}={getattr(self, self._flag)}, "
                f"bias={self.bias is not None}")


class GroupNorm(_AffineNorm):
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

    _norm = "group_norm"
    _lead = ("num_groups", "num_channels")
    _flag = "affine"

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
        self.affine = bool(affine)
        self._init_affine(cls, (self.num_channels,), eps, self.affine, bias, dtype, device)


class LayerNorm(_AffineNorm):
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

    _norm = "layer_norm"
    _lead = ("normalized_shape",)
    _flag = "elementwise_affine"

    def __init__(self, normalized_shape: Union[int, tuple, list], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.normalized_shape = _normalized_shape(normalized_shape, "LayerNorm")
        self.elementwise_affine = bool(elementwise_affine)
        self._init_affine("LayerNorm", self.normalized_shape, eps, self.elementwise_affine, bias,
                          dtype, device)


class _ChannelWindowNorm(Module):
    """What LocalResponseNorm and CrossMapLRN2d share: ``size``, ``alpha``, ``beta``, ``k``
    kept as given, and their repr."""

    def __init__(self, size: int, alpha: float, beta: float, k: float) -> None:
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"


class LocalResponseNorm(_ChannelWindowNorm):
    """Normalise by the mean square over ``size`` neighbouring channels.

    Example:
        >>> LocalResponseNorm(2)
        LocalResponseNorm(2, alpha=0.0001, beta=0.75, k=1.0)
    """

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75,
                 k: float = 1.0) -> None:
        super().__init__(size, alpha, beta, k)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.local_response_norm(input, self.size, self.alpha, self.beta, self.k)


class CrossMapLRN2d(_ChannelWindowNorm):
    """torch's older cross-channel normalisation of a 4-D (N, C, H, W) input:
    ``x / (k + alpha / size * S) ^ beta``, where ``S`` sums ``x^2`` over a channel window.

    The window is the one torch's running sum gives, kept for parity: channels
    ``0 .. c + P - 1`` (``P = (size - 1) // 2 + 1``) less channels ``1 .. c - P`` (torch
    never drops channel 0 from the sum). This is not :class:`LocalResponseNorm`'s window.

    Example:
        >>> CrossMapLRN2d(3)
        CrossMapLRN2d(3, alpha=0.0001, beta=0.75, k=1)
    """

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1) -> None:
        super().__init__(size, alpha, beta, k)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        if input.ndim != 4:
            raise ValueError(f"CrossMapLRN2d: expected a 4-D (N, C, H, W) input, got "
                             f"{input.ndim}-D")
        c = input.shape[1]
        pre = (self.size - 1) // 2 + 1
        j = np.arange(c)[None, :]
        row = np.arange(c)[:, None]
        window = (j <= np.minimum(row + pre - 1, c - 1)) & ~((j >= 1) & (j <= row - pre))
        xp = xp_of(input)
        m = Tensor._wrap(xp.asarray(window.T.astype(input._data.dtype)))
        sq = (input * input).transpose(1, 3)  # (N, W, H, C)
        total = (sq @ m).transpose(1, 3)
        return input * (total * (float(self.alpha) / self.size) + float(self.k)) ** (
            -float(self.beta))


class RMSNorm(Module):
    """Root-mean-square normalisation over the trailing ``normalized_shape``, with a learned
    scale (``elementwise_affine``, starting at ones).

    Raises:
        TypeError: a malformed ``normalized_shape``.

    Example:
        >>> RMSNorm(8)
        RMSNorm((8,), eps=None, elementwise_affine=True)
    """

    def __init__(self, normalized_shape: Any, eps: Optional[float] = None,
                 elementwise_affine: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        shape = (normalized_shape,) if is_int(normalized_shape) else tuple(normalized_shape)
        if not all(is_int(s) and s >= 0 for s in shape):
            raise TypeError(f"RMSNorm: normalized_shape must be an int or ints, got "
                            f"{normalized_shape!r}")
        self.normalized_shape = tuple(int(s) for s in shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
            self.weight = Parameter(empty(*self.normalized_shape, dtype=dt, device=device))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Set the scale to ones."""
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")
