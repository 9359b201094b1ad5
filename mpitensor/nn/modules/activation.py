"""Activation modules with ``torch.nn``'s names, arguments, reprs and state dicts.

Each module keeps its configuration (as given, so its repr reads like torch's) and calls the
function of the same name in :mod:`mpitensor.nn.functional`. :class:`PReLU` holds a learnable
``weight``; :class:`RReLU` draws its slopes from mpitensor's global generator in training.

Example:
    >>> import mpitensor as mt
    >>> import mpitensor.nn as nn
    >>> nn.Sequential(nn.Linear(2, 2), nn.GELU(approximate="tanh"), nn.LeakyReLU(0.2))
    Sequential(
      (0): Linear(in_features=2, out_features=2, bias=True)
      (1): GELU(approximate='tanh')
      (2): LeakyReLU(negative_slope=0.2)
    )
"""

from __future__ import annotations

import inspect
import operator
import warnings
from typing import Any, Optional

from mpitensor import dtypes as _dt
from mpitensor.tensor import Tensor, empty

from .. import functional as F  # noqa: N812 - torch's spelling
from .. import init
from .._functional.checks import is_int, is_number
from ..parameter import Parameter
from ._common import _is_int
from .linear import NonDynamicallyQuantizableLinear
from .module import Module

__all__ = ["GELU", "SiLU", "Mish", "ELU", "SELU", "CELU", "LeakyReLU", "ReLU6", "Hardtanh",
           "Hardsigmoid", "Hardswish", "Hardshrink", "Softshrink", "Tanhshrink", "Softplus",
           "Softsign", "LogSigmoid", "Sigmoid", "Tanh", "Threshold", "GLU", "PReLU", "RReLU",
           "Softmin", "Softmax2d", "ReLU", "LogSoftmax", "Softmax", "MultiheadAttention"]


def _number(cls: str, name: str, v: Any) -> Any:
    if not is_number(v):
        raise TypeError(f"{cls}: {name} must be a real number, got {v!r}")
    return v


def _inplace_repr(inplace: bool) -> str:
    return "inplace=True" if inplace else ""


def _fields_repr(module: Any, *names: str) -> str:
    """``name=value`` for each of ``names``, then ``inplace=True`` where set (torch's repr)."""
    return ", ".join([f"{n}={getattr(module, n)}" for n in names]
                     + ([_inplace_repr(True)] if module.inplace else []))


class _Inplace(Module):
    """An activation without arguments but ``inplace``; ``_fname`` names the F function."""

    _fname = ""
    _show_inplace = True

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return getattr(F, self._fname)(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace) if self._show_inplace else ""


class _Plain(Module):
    """An activation without arguments (extra constructor arguments are ignored, as in
    torch); ``_fname`` names the F function."""

    _fname = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return getattr(F, self._fname)(input)


def _plain(name: str, fname: str, what: str, x: str, out: str, base: type = _Plain,
           **attrs: Any) -> type:
    """An activation ``base`` running ``F.<fname>``; its docstring is ``what`` and an example
    taking ``mt.tensor([x])`` to ``out``; ``attrs`` are further class attributes."""
    doc = (f"{what}\n\n    Example:\n        >>> import mpitensor as mt\n"
           f"        >>> {name}()(mt.tensor([{x}]))\n        {out}\n    ")
    return type(name, (base,), {"_fname": fname, "__doc__": doc, "__module__": __name__, **attrs})


class GELU(_Plain):
    """Gaussian error linear unit (see :func:`~mpitensor.nn.functional.gelu`).

    Args:
        approximate: ``'none'`` or ``'tanh'``.

    Example:
        >>> import mpitensor as mt
        >>> GELU()(mt.tensor([0.0]))
        tensor([0.])
    """

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


SiLU = _plain("SiLU", "silu", "``x * sigmoid(x)``.", "0.0", "tensor([0.])", _Inplace)
Mish = _plain("Mish", "mish", "``x * tanh(softplus(x))``.", "0.0", "tensor([0.])", _Inplace)
SELU = _plain("SELU", "selu", "Scaled exponential linear unit.", "0.0", "tensor([0.])", _Inplace)
Hardsigmoid = _plain("Hardsigmoid", "hardsigmoid", "``relu6(x + 3) / 6``.", "0.0",
                     "tensor([0.5000])", _Inplace, _show_inplace=False)
Hardswish = _plain("Hardswish", "hardswish", "``x * relu6(x + 3) / 6``.", "0.0", "tensor([0.])",
                   _Inplace, _show_inplace=False)


_REQUIRED = inspect.Parameter.empty
_ARG = inspect.Parameter.POSITIONAL_OR_KEYWORD


class _Numbers(Module):
    """An activation with the numbers named in ``_fields`` (and ``inplace`` where it takes
    one); the repr lists them. Made by :func:`_numbers`."""

    _fields: tuple = ()
    inplace = False

    def extra_repr(self) -> str:
        return _fields_repr(self, *self._fields)


def _numbers(name: str, fname: str, numbers: dict, inplace: bool, what: str, call: str, x: str,
             out: str, **attrs: Any) -> type:
    """An activation module ``name(*numbers, inplace=False)`` running
    ``F.<fname>(input, *numbers[, inplace])``.

    ``numbers`` maps each constructor argument, in order, to its default (``_REQUIRED``:
    none); each is checked to be a real number. ``inplace``: whether the module takes
    ``inplace``. Its docstring is ``what`` and an example taking ``mt.tensor([x])`` through
    ``call`` (the constructor call) to ``out``; ``attrs`` are further class attributes.
    """
    params = [inspect.Parameter("self", _ARG)]
    params += [inspect.Parameter(n, _ARG, default=d, annotation=float) for n, d in numbers.items()]
    if inplace:
        params.append(inspect.Parameter("inplace", _ARG, default=False, annotation=bool))
    sig = inspect.Signature(params, return_annotation=None)
    fields = tuple(numbers)
    names = fields + (("inplace",) if inplace else ())
    read = operator.attrgetter(*names) if len(names) > 1 else (lambda m: (getattr(m, names[0]),))

    def __init__(self: Module, *args: Any, **kwargs: Any) -> None:  # noqa: N807 - the method
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        Module.__init__(self)
        for n in fields:
            setattr(self, n, _number(name, n, bound.arguments[n]))
        if inplace:
            self.inplace = bound.arguments["inplace"]

    def forward(self: Module, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        # F.<fname> looked up at each call, as a call written out would be: whatever wraps the
        # public function later (the DTensor sharding rules) sees the module's calls too
        return getattr(F, fname)(input, *read(self))

    __init__.__signature__ = sig  # type: ignore[attr-defined]
    doc = (f"{what}\n\n    Example:\n        >>> import mpitensor as mt\n"
           f"        >>> {call}(mt.tensor([{x}]))\n        {out}\n    ")
    return type(name, (_Numbers,), {"__doc__": doc, "__module__": __name__, "_fields": fields,
                                    "__init__": __init__, "forward": forward, **attrs})


ELU = _numbers("ELU", "elu", {"alpha": 1.0}, True,
               "Exponential linear unit with parameter ``alpha``.", "ELU(alpha=0.5)", "1.0",
               "tensor([1.])")
CELU = _numbers("CELU", "celu", {"alpha": 1.0}, True,
                "Continuously differentiable ELU with parameter ``alpha``.", "CELU()", "1.0",
                "tensor([1.])")
LeakyReLU = _numbers("LeakyReLU", "leaky_relu", {"negative_slope": 1e-2}, True,
                     "``x`` for x > 0, ``negative_slope * x`` otherwise.", "LeakyReLU(0.5)",
                     "-2.0", "tensor([-1.])")


class Hardtanh(Module):
    """Clip to ``[min_val, max_val]``.

    Args:
        min_val, max_val: the bounds.
        inplace: overwrite the input.
        min_value, max_value: torch's deprecated spellings of the bounds (warn).

    Raises:
        ValueError: ``min_val > max_val``.

    Example:
        >>> import mpitensor as mt
        >>> Hardtanh()(mt.tensor([-3.0, 3.0]))
        tensor([-1.,  1.])
    """

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False,
                 min_value: Optional[float] = None, max_value: Optional[float] = None) -> None:
        super().__init__()
        if min_value is not None:
            warnings.warn("keyword argument `min_value` is deprecated and renamed to `min_val`",
                          FutureWarning, stacklevel=2)
            min_val = min_value
        if max_value is not None:
            warnings.warn("keyword argument `max_value` is deprecated and renamed to `max_val`",
                          FutureWarning, stacklevel=2)
            max_val = max_value
        self.min_val = _number(type(self).__name__, "min_val", min_val)
        self.max_val = _number(type(self).__name__, "max_val", max_val)
        self.inplace = inplace
        if self.max_val <= self.min_val:
            raise ValueError(f"{type(self).__name__}: max_val ({max_val}) must be greater than "
                             f"min_val ({min_val})")

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return _fields_repr(self, "min_val", "max_val")


class ReLU6(Hardtanh):
    """``min(max(0, x), 6)``.

    Example:
        >>> import mpitensor as mt
        >>> ReLU6()(mt.tensor([-1.0, 8.0]))
        tensor([0., 6.])
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return _inplace_repr(self.inplace)


def _value_repr(module: Module) -> str:
    return f"{module.lambd}"  # type: ignore[attr-defined]


Hardshrink = _numbers("Hardshrink", "hardshrink", {"lambd": 0.5}, False,
                      "``x`` where ``|x| > lambd``, else 0.", "Hardshrink()", "0.1, 1.0",
                      "tensor([0., 1.])", extra_repr=_value_repr)
Softshrink = _numbers("Softshrink", "softshrink", {"lambd": 0.5}, False,
                      "Soft shrinkage by ``lambd``.", "Softshrink()", "1.0", "tensor([0.5000])",
                      extra_repr=_value_repr)


Tanhshrink = _plain("Tanhshrink", "tanhshrink", "``x - tanh(x)``.", "0.0", "tensor([0.])")
Softsign = _plain("Softsign", "softsign", "``x / (1 + |x|)``.", "1.0", "tensor([0.5000])")
LogSigmoid = _plain("LogSigmoid", "logsigmoid", "``log(sigmoid(x))``, computed stably.", "0.0",
                    "tensor([-0.6931])")
Sigmoid = _plain("Sigmoid", "sigmoid", "``1 / (1 + exp(-x))``.", "0.0", "tensor([0.5000])")
Tanh = _plain("Tanh", "tanh", "The hyperbolic tangent.", "0.0", "tensor([0.])")


Softplus = _numbers("Softplus", "softplus", {"beta": 1.0, "threshold": 20.0}, False,
                    "``log(1 + exp(beta * x)) / beta``, linear above ``threshold``.",
                    "Softplus(beta=2.0)", "30.0", "tensor([30.])")
Threshold = _numbers("Threshold", "threshold", {"threshold": _REQUIRED, "value": _REQUIRED}, True,
                     "``x`` where ``x > threshold``, ``value`` elsewhere.", "Threshold(0.5, -1.0)",
                     "0.0, 1.0", "tensor([-1.,  1.])")


class GLU(Module):
    """Gated linear unit along ``dim``.

    Example:
        >>> import mpitensor as mt
        >>> GLU()(mt.tensor([2.0, 0.0]))
        tensor([1.])
    """

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        if not is_int(dim):
            raise TypeError(f"GLU: dim must be an int, got {dim!r}")
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class PReLU(Module):
    """Leaky ReLU with a learnable slope: one (``num_parameters=1``) or one per channel.

    Args:
        num_parameters: 1, or the number of channels (dimension 1 of the input).
        init: the initial slope.
        device, dtype: where and how to make the weight.

    Raises:
        ValueError: ``num_parameters`` is not a positive integer.

    Example:
        >>> import mpitensor as mt
        >>> PReLU()(mt.tensor([-4.0]))
        tensor([-1.], grad_fn=<PreluBackward>)
    """

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        if not is_int(num_parameters) or num_parameters < 1:
            raise ValueError(f"PReLU: num_parameters must be a positive integer, got "
                             f"{num_parameters!r}")
        self.num_parameters = int(num_parameters)
        self.init = _number("PReLU", "init", init)
        self.weight = Parameter(empty(self.num_parameters, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Fill the weight with ``init``."""
        from mpitensor.autograd import no_grad  # noqa: PLC0415 - light

        with no_grad():
            self.weight.fill_(self.init)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class RReLU(Module):
    """Randomized leaky ReLU: random slopes in ``[lower, upper]`` in training, their mean in
    evaluation.

    Example:
        >>> import mpitensor as mt
        >>> RReLU(0.2, 0.4).eval()(mt.tensor([-1.0]))
        tensor([-0.3000])
    """

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3,
                 inplace: bool = False) -> None:
        super().__init__()
        self.lower = _number("RReLU", "lower", lower)
        self.upper = _number("RReLU", "upper", upper)
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.rrelu(input, self.lower, self.upper, self.training, self.inplace)

    def extra_repr(self) -> str:
        return _fields_repr(self, "lower", "upper")


class Softmax2d(_Plain):
    """Softmax over the channels of a (N, C, H, W) or (C, H, W) input.

    Raises:
        ValueError: an input of another rank.

    Example:
        >>> import mpitensor as mt
        >>> Softmax2d()(mt.zeros(2, 1, 1)).flatten()
        tensor([0.5000, 0.5000])
    """

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        if input.ndim not in (3, 4):
            raise ValueError(f"Softmax2d: expected a 3-D or 4-D input, got {input.ndim}-D")
        return F.softmax(input, -3)


class ReLU(Module):
    """``max(0, x)`` elementwise.

    Args:
        inplace: overwrite the input (saves memory).

    Example:
        >>> import mpitensor as mt
        >>> ReLU()(mt.tensor([-1.0, 2.0]))
        tensor([0., 2.])
    """

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = bool(inplace)

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class _SoftmaxLike(Module):
    """Shared body of :class:`LogSoftmax`, :class:`Softmax` and :class:`Softmin`: ``_fname``
    names the F op; a ``dim`` that is neither an int nor None raises ``_dim_error``."""

    _fname = ""
    _dim_error: type = ValueError

    def __init__(self, dim: Optional[int] = None) -> None:
        super().__init__()
        if dim is not None and not _is_int(dim):
            raise self._dim_error(f"{type(self).__name__}: dim must be an int or None, got "
                                  f"{dim!r}")
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        dim = self.dim if self.dim is not None else F._softmax_dim(self._fname, input.ndim)
        return getattr(F, self._fname)(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(_SoftmaxLike):
    """``log(softmax(x))`` along ``dim``, computed stably.

    Example:
        >>> import mpitensor as mt
        >>> LogSoftmax(dim=1)(mt.zeros(1, 2)).exp()
        tensor([[0.5000, 0.5000]])
    """

    _fname = "log_softmax"


class Softmax(_SoftmaxLike):
    """``exp(x) / sum(exp(x))`` along ``dim``.

    Example:
        >>> import mpitensor as mt
        >>> Softmax(dim=0)(mt.zeros(2))
        tensor([0.5000, 0.5000])
    """

    _fname = "softmax"


class Softmin(_SoftmaxLike):
    """``softmax(-x)`` along ``dim``.

    Example:
        >>> import mpitensor as mt
        >>> Softmin(dim=0)(mt.tensor([0.0, 0.0]))
        tensor([0.5000, 0.5000])
    """

    _dim_error = TypeError

    def forward(self, input: Tensor) -> Tensor:  # noqa: A002 - torch's name
        return F.softmin(input, self.dim, _stacklevel=5)


class MultiheadAttention(Module):
    """Multi-head attention, ``softmax(Q K^T / sqrt(d)) V`` per head with learned projections.

    Args:
        embed_dim: the model size E (divisible by ``num_heads``).
        num_heads: the number of heads.
        dropout: dropout on the attention weights, in training.
        bias: biases on the input and output projections.
        add_bias_kv: learn a key and a value row appended to every sequence.
        add_zero_attn: append a zero key and value to every sequence.
        kdim, vdim: the key and value sizes (default E); when either differs, the projections
            are separate ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` parameters, as in
            torch, else one stacked ``in_proj_weight``.
        batch_first: inputs and outputs are (N, L, E) instead of (L, N, E).
        device, dtype: where and how to make the parameters.

    Raises:
        ValueError: ``embed_dim`` not divisible by ``num_heads``, non-positive sizes.

    Example:
        >>> MultiheadAttention(8, 2)
        MultiheadAttention(
          (out_proj): NonDynamicallyQuantizableLinear(in_features=8, out_features=8, bias=True)
        )
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: Optional[int] = None, vdim: Optional[int] = None,
                 batch_first: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        for name, v in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if not is_int(v) or v <= 0:
                raise ValueError(f"MultiheadAttention: {name} must be a positive integer, got "
                                 f"{v!r}")
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible by "
                             f"num_heads ({num_heads})")
        self.embed_dim = int(embed_dim)
        self.kdim = kdim if kdim is not None else self.embed_dim
        self.vdim = vdim if vdim is not None else self.embed_dim
        self._qkv_same_embed_dim = self.kdim == self.embed_dim and self.vdim == self.embed_dim
        self.num_heads = int(num_heads)
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = self.embed_dim // self.num_heads
        dt = _dt.get_default_dtype() if dtype is None else _dt.to_dtype(dtype)
        e = self.embed_dim

        def param(*shape: int) -> Parameter:
            return Parameter(empty(*shape, dtype=dt, device=device))

        # one packed (3e, e) projection when query, key and value share the width, else three;
        # the absent ones are registered as None, so the state-dict keys are torch's
        packed = self._qkv_same_embed_dim
        for name, shape, used in (("in_proj_weight", (3 * e, e), packed),
                                  ("q_proj_weight", (e, e), not packed),
                                  ("k_proj_weight", (e, self.kdim), not packed),
                                  ("v_proj_weight", (e, self.vdim), not packed),
                                  ("in_proj_bias", (3 * e,), bias)):
            self.register_parameter(name, param(*shape) if used else None)
        self.out_proj = NonDynamicallyQuantizableLinear(e, e, bias=bias, device=device,
                                                        dtype=dt)
        if add_bias_kv:
            self.bias_k = param(1, 1, e)
            self.bias_v = param(1, 1, e)
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._init_weights()

    def _init_weights(self) -> None:
        """torch's initialisation: Xavier-uniform projections, zero biases, Xavier-normal
        ``bias_k``/``bias_v``."""
        for w in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight,
                  self.v_proj_weight):
            if w is not None:
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            for b in (self.in_proj_bias, self.out_proj.bias):
                init.constant_(b, 0.0)
        for b in (self.bias_k, self.bias_v):
            if b is not None:
                init.xavier_normal_(b)

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Optional[Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple:
        """Attend from ``query`` to ``key``/``value``.

        Returns:
            ``(output, weights)``: the output shaped like the query (E features), and the
            attention weights averaged over heads, (N, L, S) (or per head, (N, H, L, S), with
            ``average_attn_weights=False``), or None with ``need_weights=False``.
        """
        batched = query.ndim == 3
        if self.batch_first and batched:
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = query.transpose(1, 0), key.transpose(1, 0)
                    value = key
            else:
                query, key, value = (t.transpose(1, 0) for t in (query, key, value))
        out, weights = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight,
            self.in_proj_bias, self.bias_k, self.bias_v, self.add_zero_attn, self.dropout,
            self.out_proj.weight, self.out_proj.bias, training=self.training,
            key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
            use_separate_proj_weight=not self._qkv_same_embed_dim,
            q_proj_weight=self.q_proj_weight, k_proj_weight=self.k_proj_weight,
            v_proj_weight=self.v_proj_weight, average_attn_weights=average_attn_weights,
            is_causal=is_causal)
        if self.batch_first and batched:
            out = out.transpose(1, 0)
        return out, weights
