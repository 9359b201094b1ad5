"""The recurrent layers' kernels: one layer, one direction, a whole sequence per call.

``nn.RNN``, ``nn.LSTM``, ``nn.GRU`` and their cells (:mod:`mpitensor.nn.modules.rnn`) all run
through :class:`RecurrentLayer`, one autograd node per layer and direction:

- **Products over the whole sequence are one product.** The input's share of every gate
  (``x W_ih^T + b``) is one matrix product over all time steps before the time loop; in
  backward, the input gradient, ``dW_ih``, ``dW_hh`` and the projection's gradient are each one
  product over the gate gradients kept for every step.
- **One step is a handful of array calls, never one per gate.** Each step multiplies the hidden
  state by ``W_hh^T`` once, for all gates at once, and applies the gates' nonlinearities to
  slices of that one block; backward writes each step's gate gradients into one block and
  multiplies it by ``W_hh`` once. The Python loop runs once per time step, as torch's own CPU
  loop does.
- **Packed sequences** run on the padded layout with ``batch_sizes``: at step ``t`` only the
  first ``batch_sizes[t]`` rows (the sequences still running, longest first) are computed. A row
  that has finished keeps its last state, which is then its final state; in the reverse
  direction a row starts from its initial state at its own last step. Inactive rows get no
  gradient, and their output is zero, as ``pad_packed_sequence`` pads.

The sigmoid is ``0.5 * tanh(x / 2) + 0.5``: one transcendental call, no overflow for large
``|x|`` (``1 / (1 + exp(-x))`` overflows ``exp`` below -88 in float32).

The gate order and the weights' layout are torch's (``W_ih`` stacks the gates' rows):
LSTM ``i, f, g, o``; GRU ``r, z, n``, where ``b_hh``'s ``n`` part sits inside the reset gate's
product, ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from mpitensor import backend as _backend
from mpitensor.autograd import ArrayFunction as Function

__all__ = ["RecurrentLayer", "GATES", "PackedToPadded", "PaddedToPacked", "padded_rows"]

#: gates per mode: the rows of W_ih and W_hh are GATES[mode] * hidden_size
GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _sigmoid_(xp: Any, a: Any) -> Any:
    """``a = sigmoid(a)`` in place (see the module's note)."""
    a *= 0.5
    xp.tanh(a, out=a)
    a *= 0.5
    a += 0.5
    return a


def _steps(T: int, reverse: bool) -> range:
    return range(T - 1, -1, -1) if reverse else range(T)


def _active(batch_sizes: Optional[Any], t: int, B: int) -> int:
    return B if batch_sizes is None else int(batch_sizes[t])


class RecurrentLayer(Function):
    """One recurrent layer over a sequence, one direction.

    ``apply(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse, batch_sizes)``:

    - ``x`` (T, B, I); ``h0`` (B, P); ``c0`` (B, H) for LSTM, else None;
    - ``w_ih`` (G*H, I), ``w_hh`` (G*H, P), ``b_ih``/``b_hh`` (G*H,) or None, ``w_hr`` (P, H)
      (LSTM's projection) or None; P is H without a projection;
    - ``mode`` a key of :data:`GATES`; ``reverse`` runs from the last step to the first;
      ``batch_sizes`` None (every row runs every step) or a NumPy int array of length T,
      non-increasing (rows ``batch_sizes[t]:`` are finished at step ``t``).

    Returns one flat array: the outputs (T, B, P), then the final ``h`` (B, P), then, for
    LSTM, the final ``c`` (B, H); :func:`split_outputs` cuts it into its parts.
    """

    @staticmethod
    def forward(ctx: Any, x: Any, h0: Any, c0: Any, w_ih: Any, w_hh: Any, b_ih: Any,
                b_hh: Any, w_hr: Any, mode: str, reverse: bool, batch_sizes: Any) -> Any:
        xp = _backend.array_module(x)
        T, B, I = x.shape
        G = GATES[mode]
        H = w_ih.shape[0] // G
        P = h0.shape[1]
        dt = x.dtype
        xw = (x.reshape(T * B, I) @ w_ih.T).reshape(T, B, G * H)
        if b_ih is not None:
            xw += b_ih
        if b_hh is not None and mode != "GRU":  # GRU's b_hh goes with W_hh h (the n gate)
            xw += b_hh
        # W_hh^T laid out as the product reads it: OpenBLAS runs the per-step (B x P)(P x GH)
        # product on a transposed view up to 2.3x slower at a batch of 20 (float32)
        w_hh_t = xp.ascontiguousarray(w_hh.T)
        out = xp.zeros((T, B, P), dt)
        h_prev = xp.zeros((T, B, P), dt)  # the state each step starts from (for dW_hh)
        h = h0.copy()
        keep: dict = {}
        if mode == "LSTM":
            keep, final = _lstm_forward(xp, xw, w_hh_t, w_hr, h, c0, h_prev, out, reverse,
                                        batch_sizes)
        elif mode == "GRU":
            keep, final = _gru_forward(xp, xw, w_hh_t, b_hh, h, h_prev, out, reverse,
                                       batch_sizes)
        else:
            _rnn_forward(xp, xw, w_hh_t, h, h_prev, out, mode, reverse, batch_sizes)
            final = (out, h)
        if ctx.needs_input_grad and any(ctx.needs_input_grad):
            # saved: in-place changes to the input or the weights before backward are caught
            ctx.save_for_backward(x, w_ih, w_hh, w_hr)
            ctx.keep = keep
            ctx.args = (h_prev, out, mode, reverse, batch_sizes)
        return xp.concatenate([f.ravel() for f in final])

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple:
        x, w_ih, w_hh, w_hr = ctx.saved_tensors
        h_prev, out, mode, reverse, batch_sizes = ctx.args
        k = ctx.keep
        xp = _backend.array_module(grad)
        T, B, I = x.shape
        G = GATES[mode]
        H = w_ih.shape[0] // G
        P = out.shape[2]
        n_out = T * B * P
        dout = grad[:n_out].reshape(T, B, P)
        dh = grad[n_out:n_out + B * P].reshape(B, P).copy()
        dt = grad.dtype
        dgx = xp.zeros((T, B, G * H), dt)  # the gates' pre-activation gradients
        dgh = dgx  # ... as W_hh sees them (GRU's n gate differs: r * dn)
        dh_all = None
        if mode == "LSTM":
            dc = grad[n_out + B * P:].reshape(B, H).copy()
            dh_all = _lstm_backward(xp, k, dout, dh, dc, dgx, w_hh, w_hr, reverse, batch_sizes)
            dc0 = dc
        elif mode == "GRU":
            dgh = _gru_backward(xp, k, dout, dh, dgx, h_prev, w_hh, reverse, batch_sizes)
            dc0 = None
        else:
            _rnn_backward(xp, dout, dh, dgx, out, w_hh, mode, reverse, batch_sizes)
            dc0 = None
        need = ctx.needs_input_grad
        flat_x = dgx.reshape(T * B, G * H)
        flat_h = dgh.reshape(T * B, G * H)
        dx = (flat_x @ w_ih).reshape(T, B, I) if need[0] else None
        dw_ih = flat_x.T @ x.reshape(T * B, I) if need[3] else None
        dw_hh = flat_h.T @ h_prev.reshape(T * B, P) if need[4] else None
        db_ih = flat_x.sum(axis=0) if need[5] else None
        db_hh = flat_h.sum(axis=0) if need[6] else None
        dw_hr = None
        if need[7]:
            dw_hr = dh_all.reshape(T * B, P).T @ k["m_all"].reshape(T * B, H)
        return (dx, dh if need[1] else None, dc0 if need[2] else None, dw_ih, dw_hh, db_ih,
                db_hh, dw_hr, None, None, None)


def _lstm_forward(xp: Any, xw: Any, w_hh_t: Any, w_hr: Any, h: Any, c0: Any, h_prev: Any,
                  out: Any, reverse: bool, batch_sizes: Any) -> tuple:
    """LSTM's steps: gates (i, f, g, o), cell and output (through the projection ``w_hr`` where
    there is one); returns what backward keeps and the final (out, h, c)."""
    H = c0.shape[1]
    T, B = xw.shape[:2]
    dt = out.dtype
    c = c0.copy()
    acts = xp.zeros((T, B, 4 * H), dt)
    c_prev = xp.zeros((T, B, H), dt)
    tanh_c = xp.zeros((T, B, H), dt)
    m_all = xp.zeros((T, B, H), dt) if w_hr is not None else None
    for t in _steps(T, reverse):
        a = _active(batch_sizes, t, B)
        g = acts[t, :a]
        _pre_activation(xp, h, h_prev, xw, w_hh_t, t, a, g)
        _sigmoid_(xp, g[:, :2 * H])
        xp.tanh(g[:, 2 * H:3 * H], out=g[:, 2 * H:3 * H])
        _sigmoid_(xp, g[:, 3 * H:])
        cp = c[:a]
        c_prev[t, :a] = cp
        cn = g[:, H:2 * H] * cp
        cn += g[:, :H] * g[:, 2 * H:3 * H]
        tc = tanh_c[t, :a]
        xp.tanh(cn, out=tc)
        c[:a] = cn
        if w_hr is None:
            xp.multiply(g[:, 3 * H:], tc, out=out[t, :a])
        else:
            m = m_all[t, :a]
            xp.multiply(g[:, 3 * H:], tc, out=m)
            xp.matmul(m, w_hr.T, out=out[t, :a])
        h[:a] = out[t, :a]
    keep = dict(acts=acts, c_prev=c_prev, tanh_c=tanh_c, m_all=m_all)
    return keep, (out, h, c)


def _gru_forward(xp: Any, xw: Any, w_hh_t: Any, b_hh: Any, h: Any, h_prev: Any, out: Any,
                 reverse: bool, batch_sizes: Any) -> tuple:
    """GRU's steps: reset and update gates, then the candidate n, whose ``W_hh h + b_hh`` part
    is kept for backward; returns what backward keeps and the final (out, h)."""
    H = xw.shape[2] // 3
    T, B = xw.shape[:2]
    dt = out.dtype
    acts = xp.zeros((T, B, 3 * H), dt)
    hn_all = xp.zeros((T, B, H), dt)
    for t in _steps(T, reverse):
        a = _active(batch_sizes, t, B)
        hp = h[:a]
        h_prev[t, :a] = hp
        hw = hp @ w_hh_t
        if b_hh is not None:
            hw += b_hh
        g = acts[t, :a]
        xp.add(xw[t, :a, :2 * H], hw[:, :2 * H], out=g[:, :2 * H])
        _sigmoid_(xp, g[:, :2 * H])
        hn_all[t, :a] = hw[:, 2 * H:]
        n = g[:, 2 * H:]
        xp.multiply(g[:, :H], hw[:, 2 * H:], out=n)
        n += xw[t, :a, 2 * H:]
        xp.tanh(n, out=n)
        hnew = out[t, :a]
        xp.subtract(hp, n, out=hnew)
        hnew *= g[:, H:2 * H]
        hnew += n
        h[:a] = hnew
    keep = dict(acts=acts, hn_all=hn_all)
    return keep, (out, h)


def _pre_activation(xp: Any, h: Any, h_prev: Any, xw: Any, w_hh_t: Any, t: int, a: int,
                    dest: Any) -> None:
    """Step ``t``'s pre-activation of the ``a`` active rows into ``dest``:
    ``h[:a] @ w_hh_t + xw[t, :a]``, keeping the hidden state it read in ``h_prev[t]``."""
    hp = h[:a]
    h_prev[t, :a] = hp
    xp.matmul(hp, w_hh_t, out=dest)
    dest += xw[t, :a]


def _rnn_forward(xp: Any, xw: Any, w_hh_t: Any, h: Any, h_prev: Any, out: Any, mode: str,
                 reverse: bool, batch_sizes: Any) -> None:
    """The plain RNN's steps (tanh or relu), written into ``out`` and ``h``."""
    T, B = xw.shape[:2]
    for t in _steps(T, reverse):
        a = _active(batch_sizes, t, B)
        o = out[t, :a]
        _pre_activation(xp, h, h_prev, xw, w_hh_t, t, a, o)
        if mode == "RNN_TANH":
            xp.tanh(o, out=o)
        else:
            xp.maximum(o, 0, out=o)
        h[:a] = o


def _lstm_backward(xp: Any, k: dict, dout: Any, dh: Any, dc: Any, dgx: Any, w_hh: Any,
                   w_hr: Any, reverse: bool, batch_sizes: Any) -> Any:
    """LSTM's steps backwards: fills the gates' gradients ``dgx`` and carries ``dh``/``dc`` to
    the first step; returns the outputs' gradients before the projection (None without one)."""
    T, B = dgx.shape[:2]
    H, P = dc.shape[1], dh.shape[1]
    dt = dgx.dtype
    dh_all = None
    acts, c_prev, tanh_c = k["acts"], k["c_prev"], k["tanh_c"]
    if w_hr is not None:
        dh_all = xp.zeros((T, B, P), dt)
    for t in _steps(T, not reverse):
        a = _active(batch_sizes, t, B)
        dha = dh[:a]
        dha += dout[t, :a]
        if w_hr is not None:
            dh_all[t, :a] = dha
            dm = dha @ w_hr
        else:
            dm = dha
        g = acts[t, :a]
        i, f, gg, o = g[:, :H], g[:, H:2 * H], g[:, 2 * H:3 * H], g[:, 3 * H:]
        tc = tanh_c[t, :a]
        dca = dc[:a]
        dca += dm * o * (1 - tc * tc)
        d = dgx[t, :a]
        xp.multiply(dm, tc, out=d[:, 3 * H:])
        d[:, 3 * H:] *= o * (1 - o)
        xp.multiply(dca, gg, out=d[:, :H])
        d[:, :H] *= i * (1 - i)
        xp.multiply(dca, c_prev[t, :a], out=d[:, H:2 * H])
        d[:, H:2 * H] *= f * (1 - f)
        xp.multiply(dca, i, out=d[:, 2 * H:3 * H])
        d[:, 2 * H:3 * H] *= 1 - gg * gg
        dca *= f
        xp.matmul(d, w_hh, out=dha)
    return dh_all


def _gru_backward(xp: Any, k: dict, dout: Any, dh: Any, dgx: Any, h_prev: Any, w_hh: Any,
                  reverse: bool, batch_sizes: Any) -> Any:
    """GRU's steps backwards: fills ``dgx`` and returns the gates' gradients as ``W_hh`` sees
    them (the n gate's is ``r * dn`` there), carrying ``dh`` to the first step."""
    T, B = dgx.shape[:2]
    H = dgx.shape[2] // 3
    dt = dgx.dtype
    dgh = xp.zeros((T, B, 3 * H), dt)
    acts, hn_all = k["acts"], k["hn_all"]
    for t in _steps(T, not reverse):
        a = _active(batch_sizes, t, B)
        dha = dh[:a]
        dha += dout[t, :a]
        g = acts[t, :a]
        r, z, n = g[:, :H], g[:, H:2 * H], g[:, 2 * H:]
        dx_t, dh_t = dgx[t, :a], dgh[t, :a]
        dan = dx_t[:, 2 * H:]
        xp.multiply(dha, 1 - z, out=dan)
        dan *= 1 - n * n
        xp.multiply(dan, r, out=dh_t[:, 2 * H:])
        xp.multiply(dan, hn_all[t, :a], out=dx_t[:, :H])
        dx_t[:, :H] *= r * (1 - r)
        xp.subtract(h_prev[t, :a], n, out=dx_t[:, H:2 * H])
        dx_t[:, H:2 * H] *= dha
        dx_t[:, H:2 * H] *= z * (1 - z)
        dh_t[:, :2 * H] = dx_t[:, :2 * H]
        dha *= z
        dha += dh_t @ w_hh
    return dgh


def _rnn_backward(xp: Any, dout: Any, dh: Any, dgx: Any, out: Any, w_hh: Any, mode: str,
                  reverse: bool, batch_sizes: Any) -> None:
    """The plain RNN's steps backwards: fills ``dgx``, carrying ``dh`` to the first step."""
    T, B = dgx.shape[:2]
    for t in _steps(T, not reverse):
        a = _active(batch_sizes, t, B)
        dha = dh[:a]
        dha += dout[t, :a]
        d = dgx[t, :a]
        if mode == "RNN_TANH":
            o = out[t, :a]
            xp.multiply(dha, 1 - o * o, out=d)
        else:
            xp.multiply(dha, out[t, :a] > 0, out=d)
        xp.matmul(d, w_hh, out=dha)


def split_outputs(flat: Any, T: int, B: int, P: int, H: int, lstm: bool) -> Tuple[Any, ...]:
    """``RecurrentLayer``'s flat result as ``(out (T, B, P), h (B, P)[, c (B, H)])`` views."""
    n_out, n_h = T * B * P, B * P
    parts = [flat[:n_out].view(T, B, P), flat[n_out:n_out + n_h].view(B, P)]
    if lstm:
        parts.append(flat[n_out + n_h:].view(B, H))
    return tuple(parts)


def padded_rows(batch_sizes: np.ndarray, B: int) -> np.ndarray:
    """For each row of a packed sequence's data, its flat position ``t * B + b`` in the
    padded (T, B, ...) layout (step ``t`` holds rows ``0 .. batch_sizes[t] - 1``)."""
    T = len(batch_sizes)
    grid = np.arange(T * B, dtype=np.int64).reshape(T, B)
    keep = np.arange(B)[None, :] < np.asarray(batch_sizes)[:, None]
    return grid[keep]


class PackedToPadded(Function):
    """``apply(data (N, F), rows, T, B)``: the (T, B, F) padded layout, zeros where finished."""

    @staticmethod
    def forward(ctx: Any, data: Any, rows: Any, T: int, B: int) -> Any:
        xp = _backend.array_module(data)
        out = xp.zeros((T * B,) + data.shape[1:], data.dtype)
        out[rows] = data
        ctx.rows = rows
        return out.reshape((T, B) + data.shape[1:])

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        flat = g.reshape((-1,) + g.shape[2:])
        return flat[ctx.rows], None, None, None


class PaddedToPacked(Function):
    """``apply(padded (T, B, F), rows)``: the packed rows, in time-major order."""

    @staticmethod
    def forward(ctx: Any, padded: Any, rows: Any) -> Any:
        ctx.shape = padded.shape
        ctx.rows = rows
        return padded.reshape((-1,) + padded.shape[2:])[rows]

    @staticmethod
    def backward(ctx: Any, g: Any) -> tuple:
        xp = _backend.array_module(g)
        T, B = ctx.shape[:2]
        out = xp.zeros((T * B,) + tuple(ctx.shape[2:]), g.dtype)
        out[ctx.rows] = g
        return out.reshape(ctx.shape), None
