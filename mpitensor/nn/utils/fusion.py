"""Folding an inference-mode BatchNorm into the convolution or linear layer before it, as
``torch.nn.utils.fuse_conv_bn_eval`` / ``fuse_linear_bn_eval`` and their ``*_weights`` forms.

BatchNorm in eval mode is ``y = (x - mean) * w / sqrt(var + eps) + b``, an affine map per
channel; composed with the layer before it, it is the same layer with each output channel's
weights scaled by ``w / sqrt(var + eps)`` and the bias moved accordingly.

Example:
    >>> import mpitensor as mt
    >>> conv, bn = mt.nn.Conv2d(3, 4, 3).eval(), mt.nn.BatchNorm2d(4).eval()
    >>> fused = fuse_conv_bn_eval(conv, bn)
    >>> x = mt.randn(1, 3, 8, 8)
    >>> bool((fused(x) - bn(conv(x))).abs().max() < 1e-5)
    True
"""

from __future__ import annotations

import copy
from typing import Any, Optional, Tuple

from mpitensor.tensor import Tensor

from ..parameter import Parameter

__all__ = ["fuse_conv_bn_eval", "fuse_conv_bn_weights", "fuse_linear_bn_eval",
           "fuse_linear_bn_weights"]


def _scale(bn_rv: Tensor, bn_eps: float, bn_w: Optional[Tensor]) -> Tensor:
    inv = (bn_rv + bn_eps).rsqrt()
    return inv if bn_w is None else bn_w * inv


def fuse_conv_bn_weights(conv_w: Tensor, conv_b: Optional[Tensor], bn_rm: Tensor,
                         bn_rv: Tensor, bn_eps: float, bn_w: Optional[Tensor],
                         bn_b: Optional[Tensor], transpose: bool = False
                         ) -> Tuple[Parameter, Parameter]:
    """The weight and bias of one convolution computing ``bn(conv(x))`` in eval mode.

    ``transpose``: ``conv_w`` is a transposed convolution's (C_in, C_out, ...), whose output
    channels are its second dimension.
    """
    dtype = conv_w.dtype
    if conv_b is None:
        conv_b = bn_rm.new_zeros(bn_rm.shape)
    shift = bn_b if bn_b is not None else bn_rm.new_zeros(bn_rm.shape)
    scale = _scale(bn_rv, bn_eps, bn_w)
    shape = [1] * conv_w.dim()
    shape[1 if transpose else 0] = -1
    with_grad = conv_w.requires_grad
    w = (conv_w * scale.reshape(shape)).to(dtype).detach()
    b = ((conv_b - bn_rm) * scale + shift).to(dtype).detach()
    return Parameter(w, with_grad), Parameter(b, with_grad)


def fuse_conv_bn_eval(conv: Any, bn: Any, transpose: bool = False) -> Any:
    """A new convolution computing ``bn(conv(x))`` of two modules in eval mode.

    Raises:
        AssertionError: either module is in training mode (torch's class for it).
    """
    if conv.training or bn.training:
        raise AssertionError("fuse_conv_bn_eval: both modules must be in eval mode (call "
                             ".eval() on them): training-mode BatchNorm uses batch statistics")
    fused = copy.deepcopy(conv)
    fused.weight, fused.bias = fuse_conv_bn_weights(
        fused.weight, fused.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias,
        transpose)
    return fused


def fuse_linear_bn_weights(linear_w: Tensor, linear_b: Optional[Tensor], bn_rm: Tensor,
                           bn_rv: Tensor, bn_eps: float, bn_w: Tensor, bn_b: Tensor
                           ) -> Tuple[Parameter, Parameter]:
    """The weight and bias of one linear layer computing ``bn(linear(x))`` in eval mode."""
    if linear_b is None:
        linear_b = bn_rm.new_zeros(bn_rm.shape)
    scale = _scale(bn_rv, bn_eps, bn_w)
    with_grad = linear_w.requires_grad
    w = (linear_w * scale.unsqueeze(-1)).detach()
    b = ((linear_b - bn_rm) * scale + bn_b).detach()
    return Parameter(w, with_grad), Parameter(b, with_grad)


def fuse_linear_bn_eval(linear: Any, bn: Any) -> Any:
    """A new linear layer computing ``bn(linear(x))`` of two modules in eval mode.

    Raises:
        AssertionError: either module is in training mode, or the BatchNorm's features are
            neither the linear layer's outputs nor 1.
    """
    if linear.training or bn.training:
        raise AssertionError("fuse_linear_bn_eval: both modules must be in eval mode (call "
                             ".eval() on them): training-mode BatchNorm uses batch statistics")
    if bn.num_features not in (linear.out_features, 1):
        raise AssertionError(f"fuse_linear_bn_eval: the BatchNorm has {bn.num_features} "
                             f"features for {linear.out_features} linear outputs; they must "
                             f"match (or be 1, broadcast)")
    fused = copy.deepcopy(linear)
    fused.weight, fused.bias = fuse_linear_bn_weights(
        fused.weight, fused.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
    return fused
