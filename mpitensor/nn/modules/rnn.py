"""Recurrent layers with ``torch.nn``'s names, arguments, parameters and state-dict keys.

``RNN``, ``LSTM`` (with ``proj_size``) and ``GRU`` stack layers, each optionally
bidirectional, over a padded sequence (``(T, B, I)``, ``(B, T, I)`` with ``batch_first``, or
an unbatched ``(T, I)``) or a :class:`~mpitensor.nn.utils.rnn.PackedSequence`. ``RNNCell``,
``LSTMCell`` and ``GRUCell`` compute one step. The arithmetic, one autograd node per layer and
direction, is in :mod:`mpitensor.nn._functional.recurrent`.

Example:
    >>> import mpitensor as mt
    >>> lstm = LSTM(10, 20, num_layers=2)
    >>> out, (h, c) = lstm(mt.randn(5, 3, 10))
    >>> tuple(out.shape), tuple(h.shape), tuple(c.shape)
    ((5, 3, 20), (2, 3, 20), (2, 3, 20))
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, List, Optional, Tuple

import numpy as np

from mpitensor import dtypes as _dt
from mpitensor._core import autocast as _autocast
from mpitensor._ops import create as _creation
from mpitensor.tensor import Tensor, empty

from .. import functional as F  # noqa: N812 - torch's spelling
from .. import init
from .._functional.recurrent import (
    GATES,
    PackedToPadded,
    PaddedToPacked,
    RecurrentLayer,
    padded_rows,
    split_outputs,
)
from ..parameter import Parameter
from ..utils.rnn import PackedSequence
from ._common import _factory, _positive_int, _repr_fields
from .module import Module

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]


def _count(v: Any, cls: str, name: str, low: int) -> int:
    return _positive_int(v, cls, name, allow_zero=low == 0)


def _check_input_dtype(cls: str, x: Tensor, w: Tensor) -> None:
    if x.dtype != w.dtype:
        raise RuntimeError(
            f"{cls}: the input is {_dt.dt_repr(x.dtype)} but the parameters are "
            f"{_dt.dt_repr(w.dtype)}; convert one of them (e.g. input.to(module.weight_ih_l0."
            f"dtype), or module.to(dtype))")


def _check_state(cls: str, name: str, t: Any, want: tuple, dtype: Any, layout: str) -> None:
    """A given hidden (or cell) state must be a tensor of shape ``want`` (its dimensions read
    as ``layout``) in the input's ``dtype``."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{cls}: {name} must be a tensor, got {type(t).__name__}")
    if tuple(t.shape) != want:
        raise RuntimeError(f"{cls}: expected {name} of size {want} {layout}, got "
                           f"{tuple(t.shape)}")
    if t.dtype != dtype:
        raise RuntimeError(f"{cls}: {name} is {_dt.dt_repr(t.dtype)} but the input is "
                           f"{_dt.dt_repr(dtype)}")


class RNNBase(Module):
    """The layers shared by :class:`RNN`, :class:`LSTM` and :class:`GRU` (``mode`` picks one:
    ``'RNN_TANH'``, ``'RNN_RELU'``, ``'LSTM'`` or ``'GRU'``), as torch's ``nn.RNNBase``.

    Parameters, per layer ``k`` and direction (suffix ``_reverse`` for the backward one):
    ``weight_ih_l{k}`` (gates*hidden, input), ``weight_hh_l{k}`` (gates*hidden, hidden or
    proj_size), ``bias_ih_l{k}``, ``bias_hh_l{k}`` and, with ``proj_size``, ``weight_hr_l{k}``
    (proj_size, hidden), each drawn from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)).
    """

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        if mode not in GATES:
            raise ValueError(f"RNNBase: unknown mode {mode!r}; use one of {sorted(GATES)}")
        cls = type(self).__name__
        self.mode = mode
        self.input_size = _count(input_size, cls, "input_size", 1)
        self.hidden_size = _count(hidden_size, cls, "hidden_size", 1)
        self.num_layers = _count(num_layers, cls, "num_layers", 1)
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        if (isinstance(dropout, bool) or not isinstance(dropout, numbers.Real)
                or not 0 <= dropout <= 1):
            raise ValueError(f"{cls}: dropout must be a number in [0, 1] (the probability of "
                             f"zeroing an element), got {dropout!r}")
        self.dropout = float(dropout)
        if self.dropout > 0 and self.num_layers == 1:
            warnings.warn(f"{cls}: dropout={self.dropout} has no effect with num_layers=1: it "
                          f"applies between stacked layers, never after the last one",
                          stacklevel=2)
        self.bidirectional = bool(bidirectional)
        self.proj_size = _count(proj_size, cls, "proj_size", 0)
        if self.proj_size and mode != "LSTM":
            raise ValueError(f"{cls}: proj_size is an LSTM option, got proj_size={proj_size}")
        if self.proj_size >= self.hidden_size:
            raise ValueError(f"{cls}: proj_size ({self.proj_size}) must be smaller than "
                             f"hidden_size ({self.hidden_size})")
        dt = _factory(dtype, cls)
        gates = GATES[mode] * self.hidden_size
        real_hidden = self.proj_size or self.hidden_size
        directions = 2 if self.bidirectional else 1
        self._flat_weights_names: List[str] = []
        self._all_weights: List[List[str]] = []
        for layer in range(self.num_layers):
            width = self.input_size if layer == 0 else real_hidden * directions
            for d in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if d else "")
                shapes = [("weight_ih", (gates, width)), ("weight_hh", (gates, real_hidden))]
                if self.bias:
                    shapes += [("bias_ih", (gates,)), ("bias_hh", (gates,))]
                if self.proj_size:
                    shapes.append(("weight_hr", (self.proj_size, self.hidden_size)))
                names = []
                for stem, shape in shapes:
                    name = stem + suffix
                    setattr(self, name, Parameter(empty(*shape, dtype=dt, device=device)))
                    names.append(name)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every parameter from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as torch."""
        bound = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        for name in self._flat_weights_names:
            init.uniform_(getattr(self, name), -bound, bound)

    def flatten_parameters(self) -> None:
        """Nothing to do here, by design: torch copies the weights into one buffer for cuDNN;
        these layers read each parameter where it is, on the CPU and on CuPy alike."""

    @property
    def _flat_weights(self) -> List[Optional[Tensor]]:
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self) -> List[List[Parameter]]:
        """The parameters, one list per layer and direction (torch's order)."""
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    def extra_repr(self) -> str:
        return _repr_fields(self, ("input_size", "hidden_size"), proj_size=0, num_layers=1,
                            bias=True, batch_first=False, dropout=0, bidirectional=False)

    # ------------------------------------------------------------------------------- forward
    def _hidden(self, hx: Any, batch: int, ref: Tensor, unbatched: bool,
                order: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
        """``(h0, c0)`` as (layers*directions, batch, ...) tensors, zeros where ``hx`` is None;
        ``order``: a packed sequence's sorted_indices, applied to the batch dim."""
        cls = type(self).__name__
        lstm = self.mode == "LSTM"
        layers = self.num_layers * (2 if self.bidirectional else 1)
        h_size = self.proj_size or self.hidden_size
        if hx is None:
            h0 = _creation.zeros(layers, batch, h_size, dtype=ref.dtype, device=ref.device)
            c0 = (_creation.zeros(layers, batch, self.hidden_size, dtype=ref.dtype,
                                  device=ref.device) if lstm else None)
            return h0, c0
        if lstm:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"{cls}: hx must be a tuple (h_0, c_0) of tensors, got "
                                f"{type(hx).__name__}")
            pairs = [("h_0", hx[0], h_size), ("c_0", hx[1], self.hidden_size)]
        else:
            if not isinstance(hx, Tensor):
                raise TypeError(f"{cls}: hx must be a tensor, got {type(hx).__name__}")
            pairs = [("h_0", hx, h_size)]
        states = []
        for name, t, width in pairs:
            want = (layers, width) if unbatched else (layers, batch, width)
            _check_state(cls, name, t, want, ref.dtype,
                         f"(layers*directions, {'' if unbatched else 'batch, '}size)")
            if unbatched:
                t = t.unsqueeze(1)
            if order is not None:
                t = t.index_select(1, order)
            states.append(t)
        return states[0], (states[1] if lstm else None)

    def _forward_rounded(self, input: Tensor, hx: Any, low: Any) -> Any:  # noqa: A002
        """Under autocast, torch's CPU LSTM (oneDNN) returns the autocast dtype: run in float32
        and round each result once."""
        out, (h, c) = _autocast.run("rnn", type(self).forward, self, input.float(),
                                    _as_float32(hx))
        return out.to(low), (h.to(low), c.to(low))

    def forward(self, input: Any, hx: Any = None) -> Any:  # noqa: A002 - torch's name
        if _autocast.ON and _autocast.active():
            low = _autocast.lower_dtype(type(self).__name__.lower(), input)
            if low is not None:
                return self._forward_rounded(input, hx, low)
        cls = type(self).__name__
        packed = isinstance(input, PackedSequence)
        order = unorder = None
        batch_sizes = None
        if packed:
            data, bs_t, order, unorder = input
            batch_sizes = np.asarray(bs_t.cpu().numpy(), dtype=np.int64)
            T, B = len(batch_sizes), int(batch_sizes[0])
            rows = padded_rows(batch_sizes, B)
            if data.dim() != 2 or data.shape[1] != self.input_size:
                raise RuntimeError(f"{cls}: expected packed data of size (N, {self.input_size}),"
                                   f" got {tuple(data.shape)}")
            x = PackedToPadded.apply(data, rows, T, B)
            unbatched = False
            batch_sizes_run = None if np.all(batch_sizes == B) else batch_sizes
        else:
            if not isinstance(input, Tensor):
                raise TypeError(f"{cls}: input must be a Tensor or a PackedSequence, got "
                                f"{type(input).__name__}")
            if input.dim() not in (2, 3):
                raise ValueError(f"{cls}: expected a 2-D (unbatched) or 3-D input, got a "
                                 f"{input.dim()}-D tensor of size {tuple(input.shape)}")
            unbatched = input.dim() == 2
            x = input.unsqueeze(1) if unbatched else input
            if self.batch_first and not unbatched:
                x = x.transpose(0, 1)
            if x.shape[-1] != self.input_size:
                raise RuntimeError(f"{cls}: input.size(-1) must equal input_size "
                                   f"({self.input_size}), got {x.shape[-1]}")
            T, B = x.shape[0], x.shape[1]
            batch_sizes_run = None
        if not _dt.is_floating_dtype(x.dtype):
            raise RuntimeError(f"{cls}: the input must be floating point, got "
                               f"{_dt.dt_repr(x.dtype)}")
        _check_input_dtype(cls, x, self.weight_ih_l0)
        h0, c0 = self._hidden(hx, B, x, unbatched, order)
        out, h_n, c_n = self._run(x, h0, c0, batch_sizes_run)
        if packed:
            rows = padded_rows(batch_sizes, B)
            result: Any = PackedSequence(PaddedToPacked.apply(out, rows), input.batch_sizes,
                                         order, unorder)
            if unorder is not None:
                h_n = h_n.index_select(1, unorder)
                c_n = c_n.index_select(1, unorder) if c_n is not None else None
        else:
            if unbatched:
                out, h_n = out.squeeze(1), h_n.squeeze(1)
                c_n = c_n.squeeze(1) if c_n is not None else None
            elif self.batch_first:
                out = out.transpose(0, 1)
            result = out
        return (result, (h_n, c_n)) if self.mode == "LSTM" else (result, h_n)

    def _run(self, x: Tensor, h0: Tensor, c0: Optional[Tensor], batch_sizes: Any
             ) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """The stacked layers over padded ``x`` (T, B, I): ``(out, h_n, c_n)``."""
        from mpitensor._ops import combine as _combining  # noqa: PLC0415 - cat/stack, once the ops are in

        T, B = x.shape[0], x.shape[1]
        lstm = self.mode == "LSTM"
        directions = 2 if self.bidirectional else 1
        P, H = self.proj_size or self.hidden_size, self.hidden_size
        hs: List[Tensor] = []
        cs: List[Tensor] = []
        layer_in = x
        for layer in range(self.num_layers):
            outs = []
            for d in range(directions):
                idx = layer * directions + d
                names = self._all_weights[idx]
                w = {n.rsplit("_l", 1)[0]: getattr(self, n) for n in names}
                flat = RecurrentLayer.apply(
                    layer_in, h0[idx], c0[idx] if lstm else None, w["weight_ih"],
                    w["weight_hh"], w.get("bias_ih"), w.get("bias_hh"), w.get("weight_hr"),
                    self.mode, d == 1, batch_sizes)
                parts = split_outputs(flat, T, B, P, H, lstm)
                outs.append(parts[0])
                hs.append(parts[1])
                if lstm:
                    cs.append(parts[2])
            layer_in = outs[0] if directions == 1 else _combining.cat(outs, 2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_in = F.dropout(layer_in, self.dropout, True)
        h_n = _combining.stack(hs, 0)
        c_n = _combining.stack(cs, 0) if lstm else None
        return layer_in, h_n, c_n


class RNN(RNNBase):
    """A stack of Elman layers: ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)``
    (``nonlinearity='relu'`` for ReLU), as ``torch.nn.RNN``.

    Args: ``input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None``.

    Returns from ``forward(input, h_0=None)``: ``(output, h_n)``.

    Example:
        >>> import mpitensor as mt
        >>> out, h = RNN(4, 8, batch_first=True)(mt.randn(2, 6, 4))
        >>> tuple(out.shape), tuple(h.shape)
        ((2, 6, 8), (1, 2, 8))
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "proj_size" in kwargs:
            raise ValueError("RNN: proj_size is an LSTM option; RNN has no projection")
        if len(args) > 3:  # torch's positional order: ..., num_layers, nonlinearity, bias, ...
            if "nonlinearity" in kwargs:
                raise TypeError("RNN: nonlinearity given by position and by name")
            kwargs["nonlinearity"] = args[3]
            args = args[:3] + args[4:]
        self.nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if self.nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif self.nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"RNN: unknown nonlinearity {self.nonlinearity!r}; use 'tanh' "
                             f"or 'relu'")
        super().__init__(mode, *args, **kwargs)


def _as_float32(hx: Any) -> Any:
    if hx is None:
        return None
    return tuple(h.float() for h in hx) if isinstance(hx, tuple) else hx.float()


class LSTM(RNNBase):
    """A stack of LSTM layers (gates ``i, f, g, o``; optional output projection), as
    ``torch.nn.LSTM``.

    Args: ``input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, proj_size=0, device=None, dtype=None``.

    Returns from ``forward(input, (h_0, c_0)=None)``: ``(output, (h_n, c_n))``; with
    ``proj_size`` the outputs and ``h`` have ``proj_size`` features, ``c`` ``hidden_size``.

    Example:
        >>> import mpitensor as mt
        >>> out, (h, c) = LSTM(4, 8, proj_size=3)(mt.randn(5, 2, 4))
        >>> tuple(out.shape), tuple(h.shape), tuple(c.shape)
        ((5, 2, 3), (1, 2, 3), (1, 2, 8))
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("LSTM", *args, **kwargs)


class GRU(RNNBase):
    """A stack of GRU layers (gates ``r, z, n``), as ``torch.nn.GRU``.

    Args: ``input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
    bidirectional=False, device=None, dtype=None``.

    Returns from ``forward(input, h_0=None)``: ``(output, h_n)``.

    Example:
        >>> import mpitensor as mt
        >>> out, h = GRU(4, 8, num_layers=2, bidirectional=True)(mt.randn(5, 2, 4))
        >>> tuple(out.shape), tuple(h.shape)
        ((5, 2, 16), (4, 2, 8))
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if "proj_size" in kwargs:
            raise ValueError("GRU: proj_size is an LSTM option; GRU has no projection")
        super().__init__("GRU", *args, **kwargs)


# ------------------------------------------------------------------------------------ cells
class RNNCellBase(Module):
    """One step of a recurrent layer: parameters ``weight_ih`` (chunks*hidden, input),
    ``weight_hh`` (chunks*hidden, hidden), ``bias_ih``, ``bias_hh``, as torch's cells."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        cls = type(self).__name__
        self.input_size = _count(input_size, cls, "input_size", 1)
        self.hidden_size = _count(hidden_size, cls, "hidden_size", 1)
        self.bias = bool(bias)
        dt = _factory(dtype, cls)
        rows = num_chunks * self.hidden_size
        self.weight_ih = Parameter(empty(rows, self.input_size, dtype=dt, device=device))
        self.weight_hh = Parameter(empty(rows, self.hidden_size, dtype=dt, device=device))
        if self.bias:
            self.bias_ih = Parameter(empty(rows, dtype=dt, device=device))
            self.bias_hh = Parameter(empty(rows, dtype=dt, device=device))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every parameter from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as torch."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def extra_repr(self) -> str:
        s = _repr_fields(self, ("input_size", "hidden_size"), bias=True)
        nonlinearity = getattr(self, "nonlinearity", "tanh")
        if nonlinearity != "tanh":
            s += f", nonlinearity={nonlinearity}"  # unquoted, as torch prints it
        return s

    def _step(self, mode: str, input: Any, states: List[Any]) -> Tuple[Tensor, ...]:  # noqa: A002
        cls = type(self).__name__
        if not isinstance(input, Tensor):
            raise TypeError(f"{cls}: input must be a Tensor, got {type(input).__name__}")
        if input.dim() not in (1, 2):
            raise ValueError(f"{cls}: expected a 1-D (unbatched) or 2-D input, got a "
                             f"{input.dim()}-D tensor of size {tuple(input.shape)}")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"{cls}: input.size(-1) must equal input_size "
                               f"({self.input_size}), got {input.shape[-1]}")
        _check_input_dtype(cls, input, self.weight_ih)
        unbatched = input.dim() == 1
        x = input.unsqueeze(0) if unbatched else input
        B = x.shape[0]
        full = []
        for name, s in zip(("h", "c"), states):
            if s is None:
                s = _creation.zeros(B, self.hidden_size, dtype=x.dtype, device=x.device)
            else:
                want = (self.hidden_size,) if unbatched else (B, self.hidden_size)
                _check_state(cls, f"the {name} state", s, want, x.dtype,
                             "(hidden_size)" if unbatched else "(batch, hidden_size)")
                s = s.unsqueeze(0) if unbatched else s
            full.append(s)
        lstm = mode == "LSTM"
        flat = RecurrentLayer.apply(x.unsqueeze(0), full[0], full[1] if lstm else None,
                                    self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh,
                                    None, mode, False, None)
        parts = split_outputs(flat, 1, B, self.hidden_size, self.hidden_size, lstm)[1:]
        return tuple(p.squeeze(0) if unbatched else p for p in parts)


class RNNCell(RNNCellBase):
    """One Elman step, ``h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)`` (or ReLU), as
    ``torch.nn.RNNCell(input_size, hidden_size, bias=True, nonlinearity='tanh')``.

    Example:
        >>> import mpitensor as mt
        >>> tuple(RNNCell(4, 8)(mt.randn(3, 4)).shape)
        (3, 8)
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device: Any = None, dtype: Any = None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNNCell: unknown nonlinearity {nonlinearity!r}; use 'tanh' or "
                             f"'relu'")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)

    def forward(self, input: Any, hx: Optional[Tensor] = None) -> Tensor:  # noqa: A002
        mode = "RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU"
        return self._step(mode, input, [hx])[0]


class LSTMCell(RNNCellBase):
    """One LSTM step, as ``torch.nn.LSTMCell(input_size, hidden_size, bias=True)``;
    ``forward(input, (h, c)=None)`` returns ``(h', c')``.

    Example:
        >>> import mpitensor as mt
        >>> h, c = LSTMCell(4, 8)(mt.randn(3, 4))
        >>> tuple(h.shape), tuple(c.shape)
        ((3, 8), (3, 8))
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input: Any, hx: Any = None) -> Tuple[Tensor, Tensor]:  # noqa: A002
        if hx is None:
            states: List[Any] = [None, None]
        elif isinstance(hx, (tuple, list)) and len(hx) == 2:
            states = list(hx)
        else:
            raise TypeError(f"LSTMCell: hx must be a tuple (h, c) of tensors, got "
                            f"{type(hx).__name__}")
        h, c = self._step("LSTM", input, states)
        return h, c


class GRUCell(RNNCellBase):
    """One GRU step, as ``torch.nn.GRUCell(input_size, hidden_size, bias=True)``.

    Example:
        >>> import mpitensor as mt
        >>> tuple(GRUCell(4, 8)(mt.randn(8, 4)).shape)
        (8, 8)
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input: Any, hx: Optional[Tensor] = None) -> Tensor:  # noqa: A002
        return self._step("GRU", input, [hx])[0]
