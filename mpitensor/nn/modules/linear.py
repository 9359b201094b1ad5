"""``torch.nn.modules.linear``: :class:`Identity`, :class:`Linear`, :class:`Bilinear` and
:class:`LazyLinear`.

Example:
    >>> import mpitensor as mt
    >>> Bilinear(2, 3, 4)(mt.ones(5, 2), mt.ones(5, 3)).shape
    mpitensor.Size([5, 4])
"""

from __future__ import annotations

import math
from typing import Any

from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor

from .. import functional as F  # noqa: N812 - torch's spelling
from .. import init
from .._functional.checks import is_int
from ._common import _add_weight_and_bias, _factory, _positive_int, _reset_default
from .lazy import LazyModuleMixin, _placeholders
from .module import Module

__all__ = ["Bilinear", "Identity", "Linear", "LazyLinear"]


class Bilinear(Module):
    """``y = x1ᵀ A x2 + b`` with ``A`` of shape (out_features, in1_features, in2_features).

    Parameters start uniform in ``±1/sqrt(in1_features)``, as in torch.

    Raises:
        ValueError: a non-positive or non-integer feature count.

    Example:
        >>> Bilinear(2, 3, 4)
        Bilinear(in1_features=2, in2_features=3, out_features=4, bias=True)
    """

    def __init__(self, in1_features: int, in2_features: int, out_features: int,
                 bias: bool = True, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        for name, v in (("in1_features", in1_features), ("in2_features", in2_features),
                        ("out_features", out_features)):
            if not is_int(v) or v <= 0:
                raise ValueError(f"Bilinear: {name} must be a positive integer, got {v!r}")
        self.in1_features, self.in2_features = int(in1_features), int(in2_features)
        self.out_features = int(out_features)
        dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
        wshape = (self.out_features, self.in1_features, self.in2_features)
        _add_weight_and_bias(self, wshape, bias, dt, device)

    def reset_parameters(self) -> None:
        """Draw weight and bias uniformly in ``±1/sqrt(in1_features)``."""
        bound = 1 / math.sqrt(self.weight.shape[1])
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
                f"out_features={self.out_features}, bias={self.bias is not None}")


class Identity(Module):
    """Return the input unchanged (arguments are accepted and ignored, as in torch).

    Example:
        >>> Identity(54, unused="x")(3)
        3
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, input: Any) -> Any:  # noqa: A002 - torch's name
        return input


class Linear(Module):
    """``y = x Wᵀ + b``, with ``W`` of shape (out_features, in_features).

    Args:
        in_features: size of each input sample (> 0).
        out_features: size of each output sample (> 0).
        bias: whether to learn an additive bias.
        device, dtype: where and in which float dtype to create the parameters.

    Raises:
        ValueError: a non-positive or non-integer feature count.

    Example:
        >>> import mpitensor as mt
        >>> Linear(20, 30)(mt.randn(128, 20)).shape
        mpitensor.Size([128, 30])
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True,
        device: Any = None, dtype: Any = None,
    ) -> None:
        super().__init__()
        self.in_features = _positive_int(in_features, "Linear", "in_features")
        self.out_features = _positive_int(out_features, "Linear", "out_features")
        _add_weight_and_bias(self, (self.out_features, self.in_features), bias,
                             _factory(dtype, "Linear"), device)

    def reset_parameters(self) -> None:
        """Re-draw the parameters as torch does: kaiming-uniform(a=√5), bias ±1/√fan_in."""
        _reset_default(self.weight, self.bias)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class NonDynamicallyQuantizableLinear(Linear):
    """The output projection of :class:`MultiheadAttention` (a Linear, named as torch's)."""


class LazyLinear(LazyModuleMixin, Linear):
    """:class:`~mpitensor.nn.Linear` whose ``in_features`` is the last size of the first
    input.

    Example:
        >>> LazyLinear(3)
        LazyLinear(in_features=0, out_features=3, bias=True)
    """

    cls_to_become = Linear

    def __init__(self, out_features: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        Linear.__init__(self, 1, out_features, bias, device, dtype)
        _placeholders(self, ("weight", "bias"), ())
        self.in_features = 0
        self._start_lazy()

    def reset_parameters(self) -> None:
        if not self.has_uninitialized_params():
            Linear.reset_parameters(self)

    def initialize_parameters(self, input: Tensor) -> None:  # noqa: A002 - torch's name
        """Materialise the weight (out_features, input.shape[-1]) and the bias."""
        self.in_features = int(input.shape[-1])
        self.weight.materialize((self.out_features, self.in_features))
        if self.bias is not None:
            self.bias.materialize((self.out_features,))
        self.reset_parameters()

    def _sizes_from_parameters(self) -> None:
        self.in_features = int(self.weight.shape[1])
