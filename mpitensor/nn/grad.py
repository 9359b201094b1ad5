"""``torch.nn.grad``: the gradients of a convolution with respect to its input and to its
weight, computed on their own (for custom backward passes).

Each is the vector-Jacobian product of the matching :mod:`mpitensor.nn.functional`
convolution, taken by autograd at a zero input (the convolution is linear in each argument,
so the point does not matter).

Example:
    >>> import mpitensor as mt
    >>> w, g = mt.ones(1, 1, 2, 2), mt.ones(1, 1, 2, 2)
    >>> conv2d_input((1, 1, 3, 3), w, g).tolist()
    [[[[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]]]
"""

from __future__ import annotations

from typing import Any, Callable

from mpitensor import autograd as _autograd
from mpitensor.tensor import Tensor, zeros

from . import functional as F  # noqa: N812 - torch's spelling
from ._functional.checks import as_tensor

__all__ = ["conv1d_input", "conv1d_weight", "conv2d_input", "conv2d_weight", "conv3d_input",
           "conv3d_weight"]


def _size(v: Any, fname: str, name: str) -> tuple:
    try:
        return tuple(int(s) for s in v)
    except TypeError:
        raise TypeError(f"{fname}(): {name} must be a sequence of ints, got {v!r}") from None


def _vjp(conv: Callable, fname: str, which: str, fixed: Tensor, size: Any, grad_output: Any,
         stride: Any, padding: Any, dilation: Any, groups: int) -> Tensor:
    g = as_tensor(grad_output, "grad_output", fname)
    fixed = fixed.detach()
    free = zeros(*_size(size, fname, f"{which}_size"), dtype=fixed.dtype,
                 device=fixed.device).requires_grad_()
    with _autograd.enable_grad():
        if which == "input":
            out = conv(free, fixed, None, stride, padding, dilation, groups)
        else:
            out = conv(fixed, free, None, stride, padding, dilation, groups)
    if tuple(out.shape) != tuple(g.shape):
        raise RuntimeError(f"{fname}(): grad_output has shape {tuple(g.shape)}, but the "
                           f"convolution gives {tuple(out.shape)}")
    out.backward(g)
    return free.grad


def _input_grad(nd: int) -> Callable:
    conv = getattr(F, f"conv{nd}d")
    name = f"conv{nd}d_input"

    def fn(input_size: Any, weight: Tensor, grad_output: Tensor, stride: Any = 1,
           padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
        return _vjp(conv, name, "input", weight, input_size, grad_output, stride, padding,
                    dilation, groups)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"The gradient of ``conv{nd}d`` with respect to an input of ``input_size``."
    return fn


def _weight_grad(nd: int) -> Callable:
    conv = getattr(F, f"conv{nd}d")
    name = f"conv{nd}d_weight"

    def fn(input: Tensor, weight_size: Any, grad_output: Tensor,  # noqa: A002
           stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
        return _vjp(conv, name, "weight", input, weight_size, grad_output, stride, padding,
                    dilation, groups)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"The gradient of ``conv{nd}d`` with respect to a weight of ``weight_size``."
    return fn


conv1d_input, conv2d_input, conv3d_input = (_input_grad(nd) for nd in (1, 2, 3))
conv1d_weight, conv2d_weight, conv3d_weight = (_weight_grad(nd) for nd in (1, 2, 3))
