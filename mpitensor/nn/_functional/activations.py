"""Smooth activation functions of ``torch.nn.functional`` (gelu, silu, mish, elu, selu, celu,
softplus, sigmoid, glu, softmin, ...); the piecewise-linear ones are in :mod:`.piecewise`.

Each one is an autograd :class:`~mpitensor.autograd.Function` with its forward and backward
side by side, on raw NumPy/CuPy arrays, vectorised (no loop over elements). The gradients are
the ones torch defines, including its choices at the kinks (``leaky_relu`` takes the negative
slope at 0, ``hardtanh`` passes no gradient at its bounds, ...). Half tensors are computed in
float32 and rounded once, as torch's CPU kernels do. The ``inplace=True`` forms (and the ``_``
functions) go through the tensor in-place machinery: they raise on a leaf that requires grad,
bump the version counter and are recorded for autograd.

Re-exported by :mod:`mpitensor.nn.functional`; import them from there.

Example:
    >>> import mpitensor as mt
    >>> x = mt.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    >>> elu(x).sum().backward()
    >>> x.grad
    tensor([0.3679, 1.0000, 1.0000])
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Optional

import numpy as np

from mpitensor import backend as _backend
from mpitensor import dtypes as _dt
from mpitensor._ops.random import _draw
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.tensor import Tensor, _new

from ..._ops.special import erf  # NumPy has none; one implementation for the package
from .checks import (
    as_tensor,
    check_float,
    half_safe,
    quiet,
    run_inplace,
    wrap_dim,
    xp_of,
)
from .checks import real_number as _real

__all__ = ["gelu", "silu", "mish", "elu", "elu_", "selu", "selu_", "celu", "celu_", "tanhshrink",
           "softplus", "softsign", "logsigmoid", "sigmoid", "tanh", "glu", "softmin",
           "gumbel_softmax"]

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # the tanh approximation's coefficient
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_KAPPA = 0.044715
_ONE_SIXTH_F32 = float(np.float32(1.0) / np.float32(6.0))
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


# --------------------------------------------------------------------------------------------
# helpers


def _float_input(input: Any, fname: str) -> Tensor:  # noqa: A002 - torch's name
    t = as_tensor(input, "input", fname)
    check_float(t, "input", fname)
    return t


def _pointwise(fn: type, fname: str, input: Any, inplace: bool, *args: Any) -> Tensor:  # noqa: A002
    """``fn`` applied to a floating ``input``, in place when asked."""
    t = _float_input(input, fname)
    if inplace:
        return run_inplace(input, getattr(fn, "inplace_variant", fn), f"{fname}(inplace=True)",
                           *args)
    return fn.apply(t, *args)


def _inplace_only(fn: type, fname: str, input: Any, *args: Any) -> Tensor:  # noqa: A002
    _float_input(input, fname)
    return run_inplace(input, getattr(fn, "inplace_variant", fn), f"{fname}()", *args)


def _unary_api(fn: type, name: str, summary: str, example: str, result: str,
               check: Optional[Callable] = None) -> Callable:
    """The public function of ``fn``, an activation of one tensor without parameters:
    ``name(input, inplace=False)`` on a floating tensor, or ``name(input)`` when ``check`` is
    given (it takes the input and the name and returns the tensor ``fn`` is applied to). Its
    docstring is ``summary`` and the doctest ``name(mt.tensor(example))`` giving ``result``."""
    if check is None:
        def api(input: Any, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's names
            return _pointwise(fn, name, input, inplace)
    else:
        def api(input: Any) -> Tensor:  # type: ignore[misc]  # noqa: A002 - torch's name
            return fn.apply(check(input, name))
    return _documented(api, name, summary, example, result)


def _tensor_method(name: str, summary: str, example: str, result: str) -> Callable:
    """The public function ``name(input)``: the Tensor method ``name`` of ``input`` made a
    tensor; its docstring as :func:`_unary_api`'s."""
    def api(input: Any) -> Tensor:  # noqa: A002 - torch's name
        return getattr(as_tensor(input, "input", name), name)()
    return _documented(api, name, summary, example, result)


def _documented(api: Callable, name: str, summary: str, example: str, result: str) -> Callable:
    api.__name__ = api.__qualname__ = name
    api.__doc__ = (f"{summary}\n\n    Example:\n        >>> import mpitensor as mt\n"
                   f"        >>> {name}(mt.tensor({example}))\n        {result}\n    ")
    return api


def _keeps_input(name: str, forward: Callable, backward: Callable, doc: str = "",
                 half: bool = True) -> type:
    """An autograd Function of one tensor and fixed parameters ``*p`` that keeps only its
    input for the backward: ``forward(xp, x, *p)`` is its result and ``backward(xp, x, g, *p)``
    the input's gradient (the parameters get none). ``name`` is the class's (its ``grad_fn``
    prints it); ``half``: half tensors computed in float32 and rounded once."""

    def fwd(ctx: Any, x: Any, *p: Any) -> Any:
        ctx.save_for_backward(x)
        ctx.params = p
        return forward(xp_of(x), x, *p)

    def bwd(ctx: Any, g: Any) -> tuple:
        (x,) = ctx.saved_tensors
        p = ctx.params
        return (backward(xp_of(x), x, g, *p),) + (None,) * len(p)

    fn = type(name, (Function,), {"__doc__": doc or None, "__module__": __name__,
                                  "forward": staticmethod(fwd), "backward": staticmethod(bwd)})
    return half_safe(fn) if half else fn


def _sigmoid(xp: Any, x: Any) -> Any:
    with quiet(xp):
        return 1.0 / (1.0 + xp.exp(-x))


# --------------------------------------------------------------------------------------------
# gelu, silu, mish


@half_safe
class _Gelu(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, approximate: str) -> Any:
        xp = xp_of(x)
        ctx.approximate = approximate
        if approximate == "tanh":
            ctx.save_for_backward(x)
            inner = _SQRT_2_OVER_PI * (x + _KAPPA * (x * x * x))
            return 0.5 * x * (1 + xp.tanh(inner))
        cdf = 0.5 * (1 + erf(x * _SQRT1_2))
        ctx.save_for_backward(x, cdf)
        return x * cdf

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        saved = ctx.saved_tensors
        x = saved[0]
        xp = xp_of(x)
        if ctx.approximate == "tanh":
            x2 = x * x
            t = xp.tanh(_SQRT_2_OVER_PI * (x + _KAPPA * x2 * x))
            d_in = (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * _KAPPA * x2)
            return g * (0.5 * (1 + t) + 0.5 * x * d_in), None
        with quiet(xp):
            pdf = xp.exp(-0.5 * x * x) * _INV_SQRT_2PI
        return g * (saved[1] + x * pdf), None


def gelu(input: Any, approximate: str = "none") -> Tensor:  # noqa: A002 - torch's name
    """Gaussian error linear unit: ``x * Phi(x)``, Phi the standard normal CDF.

    Args:
        input: a floating point tensor.
        approximate: ``'none'`` (exact, through erf) or ``'tanh'``
            (``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``).

    Returns:
        A tensor like ``input``.

    Raises:
        RuntimeError: another ``approximate``. NotImplementedError: an integer input.

    Example:
        >>> import mpitensor as mt
        >>> gelu(mt.tensor([0.0, 1.0]))
        tensor([0.0000, 0.8413])
    """
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"gelu(): approximate must be 'none' or 'tanh', got {approximate!r}")
    return _Gelu.apply(_float_input(input, "gelu"), approximate)


@half_safe
class _Silu(Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        s = _sigmoid(xp_of(x), x)
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, s = ctx.saved_tensors
        return (g * s * (1 + x * (1 - s)),)


silu = _unary_api(_Silu, "silu", "Sigmoid linear unit (swish): ``x * sigmoid(x)`` (``inplace``: "
                  "write the result into ``input``).", "[0.0]", "tensor([0.])")


@half_safe
class _Mish(Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        xp = xp_of(x)
        with quiet(xp):
            ts = xp.tanh(xp.log1p(xp.exp(x)))
        ctx.save_for_backward(x, ts)
        return x * ts

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, ts = ctx.saved_tensors
        s = _sigmoid(xp_of(x), x)
        return (g * (ts + x * s * (1 - ts * ts)),)


mish = _unary_api(_Mish, "mish", "``x * tanh(softplus(x))``.", "[0.0]", "tensor([0.])")


# --------------------------------------------------------------------------------------------
# elu family


@half_safe
class _Elu(Function):
    """``scale * x`` for x > 0, ``scale * alpha * (exp(x * input_scale) - 1)`` otherwise.

    ``grad_input_scale`` is the input scale the gradient uses: torch's celu takes it as
    ``1 / alpha`` with alpha rounded to float32 first, so its gradients differ from the exact
    ones by that rounding; matching them keeps ported programs' numbers the same.
    """

    @staticmethod
    def forward(ctx: Any, x: Any, alpha: float, scale: float, input_scale: float,
                grad_input_scale: float) -> Any:
        xp = xp_of(x)
        ctx.save_for_backward(x)
        ctx.coefs = (alpha, scale, grad_input_scale)
        with quiet(xp):
            neg = xp.expm1(x * input_scale) * (alpha * scale)
        return xp.where(x > 0, x * scale, neg)

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (x,) = ctx.saved_tensors
        alpha, scale, input_scale = ctx.coefs
        xp = xp_of(x)
        with quiet(xp):
            neg = g * (input_scale * alpha * scale) * xp.exp(x * input_scale)
        return xp.where(x > 0, g * scale, neg), None, None, None, None


@half_safe
class _EluResult(Function):
    """:class:`_Elu` written in place: the gradient is read from the result (torch's form for
    ``elu_``, ``selu_`` and ``celu_``), which is all the op keeps."""

    @staticmethod
    def forward(ctx: Any, x: Any, alpha: float, scale: float, input_scale: float,
                grad_input_scale: float) -> Any:
        out = _Elu.forward(ctx, x, alpha, scale, input_scale, grad_input_scale)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (out,) = ctx.saved_tensors
        alpha, scale, input_scale = ctx.coefs
        xp = xp_of(out)
        neg = g * input_scale * (out + alpha * scale)
        return xp.where(out > 0, g * scale, neg), None, None, None, None


_Elu.inplace_variant = _EluResult


def elu(input: Any, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    """Exponential linear unit: ``x`` for x > 0, ``alpha * (exp(x) - 1)`` otherwise.

    Example:
        >>> import mpitensor as mt
        >>> elu(mt.tensor([1.0, 0.0]))
        tensor([1., 0.])
    """
    return _pointwise(_Elu, "elu", input, inplace, _real(alpha, "alpha", "elu"), 1.0, 1.0, 1.0)


def elu_(input: Any, alpha: float = 1.0) -> Tensor:  # noqa: A002 - torch's name
    """In-place :func:`elu`."""
    return _inplace_only(_Elu, "elu_", input, _real(alpha, "alpha", "elu_"), 1.0, 1.0, 1.0)


def selu(input: Any, inplace: bool = False) -> Tensor:  # noqa: A002 - torch's name
    """Scaled ELU with the self-normalising constants (alpha ~ 1.6733, scale ~ 1.0507).

    Example:
        >>> import mpitensor as mt
        >>> selu(mt.tensor([0.0]))
        tensor([0.])
    """
    return _pointwise(_Elu, "selu", input, inplace, SELU_ALPHA, SELU_SCALE, 1.0, 1.0)


def selu_(input: Any) -> Tensor:  # noqa: A002 - torch's name
    """In-place :func:`selu`."""
    return _inplace_only(_Elu, "selu_", input, SELU_ALPHA, SELU_SCALE, 1.0, 1.0)


def _celu_alpha(alpha: Any, fname: str) -> float:
    a = _real(alpha, "alpha", fname)
    if a == 0:
        raise RuntimeError(f"{fname}(): alpha must not be 0 (the negative part is "
                           f"alpha * (exp(x / alpha) - 1))")
    return a


def _celu_grad_scale(alpha: float) -> float:
    return 1.0 / float(np.float32(alpha))


def celu(input: Any, alpha: float = 1.0, inplace: bool = False) -> Tensor:  # noqa: A002
    """Continuously differentiable ELU: ``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``.

    Raises:
        RuntimeError: ``alpha`` is 0.

    Example:
        >>> import mpitensor as mt
        >>> celu(mt.tensor([2.0]))
        tensor([2.])
    """
    a = _celu_alpha(alpha, "celu")
    return _pointwise(_Elu, "celu", input, inplace, a, 1.0, 1.0 / a, _celu_grad_scale(a))


def celu_(input: Any, alpha: float = 1.0) -> Tensor:  # noqa: A002 - torch's name
    """In-place :func:`celu`."""
    a = _celu_alpha(alpha, "celu_")
    return _inplace_only(_Elu, "celu_", input, a, 1.0, 1.0 / a, _celu_grad_scale(a))


# --------------------------------------------------------------------------------------------
# smooth ones


def _float_or_promoted(input: Any, fname: str) -> Tensor:  # noqa: A002 - torch's name
    """A floating tensor; integers and bools promoted to the default dtype (as torch's
    composite ops built on ``tanh``/division do)."""
    t = as_tensor(input, "input", fname)
    if not _dt.is_floating_dtype(t._data.dtype):
        t = t.to(_dt.get_default_dtype())
    return t


@half_safe
class _Tanhshrink(Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        t = xp_of(x).tanh(x)
        ctx.save_for_backward(t)
        return x - t

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        (t,) = ctx.saved_tensors
        return (g - g * (1 - t * t),)


tanhshrink = _unary_api(_Tanhshrink, "tanhshrink", "``x - tanh(x)``.", "[0.0]", "tensor([0.])",
                        _float_or_promoted)


def _softplus(xp: Any, x: Any, beta: float, threshold: float) -> Any:
    xb = x * beta
    with quiet(xp):
        soft = xp.log1p(xp.exp(xb)) / beta
    return xp.where(xb > threshold, x, soft)


def _softplus_grad(xp: Any, x: Any, g: Any, beta: float, threshold: float) -> Any:
    xb = x * beta
    with quiet(xp):
        z = xp.exp(xb)
        soft = g * z / (z + 1)
    return xp.where(xb > threshold, g, soft)


_Softplus = _keeps_input("_Softplus", _softplus, _softplus_grad)


def softplus(input: Any, beta: float = 1.0, threshold: float = 20.0) -> Tensor:  # noqa: A002
    """``log(1 + exp(beta * x)) / beta``, linear (``x``) where ``beta * x > threshold``.

    Example:
        >>> import mpitensor as mt
        >>> round(float(softplus(mt.tensor(0.0))), 4)
        0.6931
    """
    t = _float_input(input, "softplus")
    return _Softplus.apply(t, _real(beta, "beta", "softplus"),
                           _real(threshold, "threshold", "softplus"))


@half_safe
class _Softsign(Function):
    @staticmethod
    def forward(ctx: Any, x: Any) -> Any:
        d = abs(x) + 1
        ctx.save_for_backward(x, d)
        return x / d

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        x, d = ctx.saved_tensors
        xp = xp_of(x)
        return (g / d - g * x / (d * d) * xp.sign(x),)


softsign = _unary_api(_Softsign, "softsign", "``x / (1 + |x|)``.", "[1.0]", "tensor([0.5000])",
                      _float_or_promoted)


def _logsigmoid(xp: Any, x: Any) -> Any:
    with quiet(xp):
        return xp.minimum(x, 0) - xp.log1p(xp.exp(-abs(x)))


def _logsigmoid_grad(xp: Any, x: Any, g: Any) -> Any:
    z = xp.exp(-abs(x))
    q = z / (1 + z)
    return g * xp.where(x < 0, 1 - q, q)


_LogSigmoid = _keeps_input("_LogSigmoid", _logsigmoid, _logsigmoid_grad)


logsigmoid = _unary_api(_LogSigmoid, "logsigmoid", "``log(sigmoid(x))``, computed as "
                        "``min(x, 0) - log1p(exp(-|x|))`` (no overflow).", "[0.0]",
                        "tensor([-0.6931])", _float_input)


sigmoid = _tensor_method("sigmoid", "``1 / (1 + exp(-x))`` (integers promoted to the default "
                         "dtype).", "[0.0]", "tensor([0.5000])")
tanh = _tensor_method("tanh", "The hyperbolic tangent (integers promoted to the default dtype).",
                      "[0.0]", "tensor([0.])")


# --------------------------------------------------------------------------------------------
# glu


@half_safe
class _Glu(Function):
    @staticmethod
    def forward(ctx: Any, x: Any, dim: int) -> Any:
        xp = xp_of(x)
        h = x.shape[dim] // 2
        a = xp.take(x, xp.arange(h), axis=dim)
        b = xp.take(x, xp.arange(h, 2 * h), axis=dim)
        s = _sigmoid(xp, b)
        ctx.save_for_backward(a, s)
        ctx.dim = dim
        return a * s

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        a, s = ctx.saved_tensors
        xp = xp_of(a)
        ga = g * s
        gb = (1 - s) * s * a * g
        return xp.concatenate([ga, gb], axis=ctx.dim), None


def glu(input: Any, dim: int = -1) -> Tensor:  # noqa: A002 - torch's name
    """Gated linear unit: split ``input`` in halves ``a, b`` along ``dim``; ``a * sigmoid(b)``.

    Raises:
        RuntimeError: a 0-d input, or an odd size along ``dim``.

    Example:
        >>> import mpitensor as mt
        >>> glu(mt.tensor([2.0, 0.0]))
        tensor([1.])
    """
    t = _float_input(input, "glu")
    x = t._data
    if x.ndim == 0:
        raise RuntimeError("glu(): a 0-d tensor cannot be halved; give it a dimension of even "
                           "size")
    d = wrap_dim(dim, x.ndim, "glu")
    if x.shape[d] % 2:
        raise RuntimeError(f"glu(): the halved dimension must have an even size, but dimension "
                           f"{d} has size {x.shape[d]}")
    return _Glu.apply(t, d)


# --------------------------------------------------------------------------------------------
# softmin


def legacy_softmax_dim(name: str, ndim: int, stacklevel: int = 4) -> int:
    """torch's deprecated implicit dimension of the softmax family, with its warning."""
    dim = 0 if ndim in (0, 1, 3) else 1
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call "
                  f"to include dim=X as an argument.", UserWarning, stacklevel=stacklevel)
    return dim


def softmin(input: Any, dim: Optional[int] = None, _stacklevel: int = 3,  # noqa: A002
            dtype: Any = None) -> Tensor:
    """``softmax(-x)`` along ``dim``.

    Args:
        input: a tensor.
        dim: the dimension to normalise over (torch's implicit choice, with a warning, if
            None).
        dtype: cast to this dtype before the softmax.

    Example:
        >>> import mpitensor as mt
        >>> softmin(mt.tensor([1.0, 1.0]), dim=0)
        tensor([0.5000, 0.5000])
    """
    t = as_tensor(input, "input", "softmin")
    if dim is None:
        dim = legacy_softmax_dim("softmin", t.ndim, _stacklevel)
    neg = -t
    if dtype is not None:
        neg = neg.to(dtype)
    check_float(neg, "input", "softmin")
    return neg.softmax(wrap_dim(dim, neg.ndim, "softmin"))


def gumbel_softmax(logits: Any, tau: float = 1.0, hard: bool = False, eps: float = 1e-10,
                   dim: int = -1) -> Tensor:
    """A sample of the Gumbel-softmax (concrete) distribution over ``dim``:
    ``softmax((logits + g) / tau)`` with g standard Gumbel noise from mpitensor's global
    generator. With ``hard=True`` the result is the one-hot of its argmax in the forward pass
    and the soft sample's gradient in the backward pass (straight-through).

    Args:
        logits: unnormalised log-probabilities.
        tau: the temperature (> 0).
        hard: return one-hot samples (straight-through gradients).
        eps: unused; kept for torch's signature.
        dim: the dimension of the categories.

    Example:
        >>> import mpitensor as mt
        >>> y = gumbel_softmax(mt.zeros(2, 3), hard=True)
        >>> y.sum(-1).tolist()
        [1.0, 1.0]
    """
    t = _float_input(logits, "gumbel_softmax")
    x = t._data
    xp = xp_of(x)
    draw_dt = x.dtype if x.dtype in (_dt.float32, _dt.float64) else _dt.float32
    u = _draw("rand", tuple(x.shape), None, np.dtype(draw_dt), _backend.device_of(x))
    with quiet(xp):
        # -log(E) with E ~ Exp(1) drawn as -log(1 - u), u in [0, 1)
        gumbels = (-xp.log(-xp.log1p(-u))).astype(x.dtype, copy=False)
    d = wrap_dim(dim, t.ndim, "gumbel_softmax")
    soft = ((t + _new(gumbels)) / float(tau)).softmax(d)
    if not hard:
        return soft
    y = soft._data
    idx = y.argmax(axis=d)
    shape = [1] * y.ndim
    shape[d] = y.shape[d]
    one_hot = (xp.expand_dims(idx, d) == xp.arange(y.shape[d]).reshape(shape)).astype(y.dtype)
    return _new(one_hot) - soft.detach() + soft
