"""Recurrent layers, cells and packed sequences against torch, the oracle, and by finite
differences where torch is absent.

Tolerances come from the arithmetic: in float64 the two libraries differ only by the order of
their sums (2**-53 per operation over a few dozen operations per step and a handful of steps),
so they agree to 1e-10 of each tensor's largest entry; in float32 to 64 u per step, u = 2**-24.
"""

from __future__ import annotations

import itertools
from typing import Any, Dict, List

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import nn
from mpitensor.nn.utils import rnn as rnn_utils

U32 = 2.0 ** -24
T, B, I, H = 5, 3, 4, 6


def _torch() -> Any:
    return pytest.importorskip("torch")


def _tol(dtype: Any, steps: int = T) -> float:
    return 1e-10 if np.dtype(dtype) == np.float64 else 64 * U32 * steps


def _close(ours: Any, theirs: Any, tol: float, what: str) -> None:
    a = ours.detach().numpy() if isinstance(ours, mt.Tensor) else np.asarray(ours)
    b = theirs.detach().numpy()
    assert a.shape == b.shape, (what, a.shape, b.shape)
    scale = max(float(np.abs(b).max()), 1e-30)
    worst = float(np.abs(a - b).max()) / scale
    assert worst <= tol, f"{what}: differs by {worst:.3g} of its largest entry (> {tol:.3g})"


def _pair(torch: Any, cls: str, dtype: Any, **kw: Any) -> tuple:
    """The same layer in both libraries, mpitensor's weights copied from torch's."""
    tdt = getattr(torch, np.dtype(dtype).name)
    theirs = getattr(torch.nn, cls)(**kw).to(tdt)
    ours = getattr(nn, cls)(**kw, dtype=np.dtype(dtype).name)
    state = {k: mt.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()}
    assert list(state) == list(ours.state_dict()), "state-dict keys (and their order) differ"
    ours.load_state_dict(state)
    return ours, theirs


def _both(torch: Any, arr: np.ndarray, grad: bool = True) -> tuple:
    return (mt.tensor(arr, requires_grad=grad), torch.tensor(arr, requires_grad=grad))


def _flat_outputs(result: Any) -> List[Any]:
    out, state = result
    out = out.data if isinstance(out, tuple) else out  # PackedSequence: its data
    states = list(state) if isinstance(state, tuple) else [state]
    return [out, *states]


def _check_layer(torch: Any, cls: str, dtype: Any, rng: np.random.Generator,
                 with_state: bool, **kw: Any) -> None:
    ours, theirs = _pair(torch, cls, dtype, input_size=I, hidden_size=H, **kw)
    batch_first = kw.get("batch_first", False)
    x = rng.standard_normal((B, T, I) if batch_first else (T, B, I)).astype(dtype)
    xo, xt = _both(torch, x)
    args_o, args_t = [xo], [xt]
    states_o: List[Any] = []
    states_t: List[Any] = []
    if with_state:
        layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
        widths = [kw.get("proj_size") or H] + ([H] if cls == "LSTM" else [])
        for w in widths:
            so, st = _both(torch, rng.standard_normal((layers, B, w)).astype(dtype))
            states_o.append(so)
            states_t.append(st)
        args_o.append(tuple(states_o) if cls == "LSTM" else states_o[0])
        args_t.append(tuple(states_t) if cls == "LSTM" else states_t[0])
    outs_o = _flat_outputs(ours(*args_o))
    outs_t = _flat_outputs(theirs(*args_t))
    tol = _tol(dtype)
    for k, (a, b) in enumerate(zip(outs_o, outs_t)):
        _close(a, b, tol, f"{cls} {kw} output {k}")
    # backward from a random weighting of every output
    weights = [rng.standard_normal(tuple(b.shape)).astype(dtype) for b in outs_t]
    sum((o * mt.tensor(w)).sum() for o, w in zip(outs_o, weights)).backward()
    sum((o * torch.tensor(w)).sum() for o, w in zip(outs_t, weights)).backward()
    _close(xo.grad, xt.grad, tol, f"{cls} {kw} input grad")
    for so, st in zip(states_o, states_t):
        _close(so.grad, st.grad, tol, f"{cls} {kw} initial-state grad")
    for (name, po), (_, pt) in zip(ours.named_parameters(), theirs.named_parameters()):
        _close(po.grad, pt.grad, tol, f"{cls} {kw} {name}.grad")


CONFIGS = [dict(), dict(num_layers=2), dict(bidirectional=True),
           dict(num_layers=2, bidirectional=True, batch_first=True), dict(bias=False)]


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_layers_match_torch(cls: str, dtype: Any) -> None:
    torch = _torch()
    rng = np.random.default_rng(7)
    for kw, with_state in itertools.product(CONFIGS, (False, True)):
        _check_layer(torch, cls, dtype, rng, with_state, **kw)


@pytest.mark.parametrize("kw", [dict(nonlinearity="relu"), dict(nonlinearity="relu",
                                                                 num_layers=2,
                                                                 bidirectional=True)])
def test_relu_rnn_matches_torch(kw: Dict[str, Any]) -> None:
    torch = _torch()
    _check_layer(torch, "RNN", np.float64, np.random.default_rng(1), True, **kw)


@pytest.mark.parametrize("kw", [dict(proj_size=2), dict(proj_size=3, num_layers=2,
                                                        bidirectional=True)])
def test_lstm_projection_matches_torch(kw: Dict[str, Any]) -> None:
    torch = _torch()
    for dtype, state in itertools.product((np.float64, np.float32), (False, True)):
        _check_layer(torch, "LSTM", dtype, np.random.default_rng(2), state, **kw)


@pytest.mark.parametrize("cls", ["RNN", "LSTM", "GRU"])
def test_packed_unsorted_batch_matches_torch(cls: str) -> None:
    """A packed batch in arbitrary order (enforce_sorted=False): the same packed output, final
    states in the batch's order, and gradients, through bidirectional stacked layers."""
    torch = _torch()
    rng = np.random.default_rng(3)
    lengths = [3, 5, 1, 4]
    x = rng.standard_normal((max(lengths), len(lengths), I))
    ours, theirs = _pair(torch, cls, np.float64, input_size=I, hidden_size=H, num_layers=2,
                         bidirectional=True)
    xo, xt = _both(torch, x)
    po = rnn_utils.pack_padded_sequence(xo, lengths, enforce_sorted=False)
    pt = torch.nn.utils.rnn.pack_padded_sequence(xt, lengths, enforce_sorted=False)
    _close(po.data, pt.data, 0, "packed data")
    assert po.batch_sizes.tolist() == pt.batch_sizes.tolist()
    assert po.sorted_indices.tolist() == pt.sorted_indices.tolist()
    assert po.unsorted_indices.tolist() == pt.unsorted_indices.tolist()
    res_o, res_t = ours(po), theirs(pt)
    outs_o, outs_t = _flat_outputs(res_o), _flat_outputs(res_t)
    for k, (a, b) in enumerate(zip(outs_o, outs_t)):
        _close(a, b, 1e-10, f"{cls} packed output {k}")
    pad_o, len_o = rnn_utils.pad_packed_sequence(res_o[0], batch_first=True, padding_value=-1,
                                                 total_length=6)
    pad_t, len_t = torch.nn.utils.rnn.pad_packed_sequence(res_t[0], batch_first=True,
                                                          padding_value=-1, total_length=6)
    _close(pad_o, pad_t, 1e-10, "pad_packed_sequence")
    assert len_o.tolist() == len_t.tolist() == lengths
    weights = [rng.standard_normal(tuple(b.shape)) for b in outs_t]
    sum((o * mt.tensor(w)).sum() for o, w in zip(outs_o, weights)).backward()
    sum((o * torch.tensor(w)).sum() for o, w in zip(outs_t, weights)).backward()
    _close(xo.grad, xt.grad, 1e-10, "input grad through packing")
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        _close(a.grad, b.grad, 1e-10, f"{cls} packed {name}.grad")


def test_sequence_utilities_match_torch() -> None:
    torch = _torch()
    rng = np.random.default_rng(4)
    seqs = [rng.standard_normal((n, 2)) for n in (4, 2, 3)]
    ours = [mt.tensor(s) for s in seqs]
    theirs = [torch.tensor(s) for s in seqs]
    for kw in (dict(), dict(batch_first=True, padding_value=9.0),
               dict(batch_first=True, padding_side="left")):
        _close(rnn_utils.pad_sequence(ours, **kw), torch.nn.utils.rnn.pad_sequence(theirs, **kw),
               0, f"pad_sequence {kw}")
    po = rnn_utils.pack_sequence(ours, enforce_sorted=False)
    pt = torch.nn.utils.rnn.pack_sequence(theirs, enforce_sorted=False)
    _close(po.data, pt.data, 0, "pack_sequence")
    back = rnn_utils.unpack_sequence(po)
    assert [tuple(b.shape) for b in back] == [(4, 2), (2, 2), (3, 2)]
    for b, s in zip(back, seqs):
        assert np.array_equal(b.numpy(), s)
    padded = rnn_utils.pad_sequence(ours, batch_first=True)
    for b, s in zip(rnn_utils.unpad_sequence(padded, [4, 2, 3], batch_first=True), seqs):
        assert np.array_equal(b.numpy(), s)


@pytest.mark.parametrize("cls", ["RNNCell", "LSTMCell", "GRUCell"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cells_match_torch(cls: str, dtype: Any) -> None:
    torch = _torch()
    rng = np.random.default_rng(5)
    kwargs = [dict(), dict(bias=False)] + ([dict(nonlinearity="relu")] if cls == "RNNCell"
                                           else [])
    for kw, batched, with_state in itertools.product(kwargs, (True, False), (False, True)):
        ours, theirs = _pair(torch, cls, dtype, input_size=I, hidden_size=H, **kw)
        lead = (B,) if batched else ()
        xo, xt = _both(torch, rng.standard_normal(lead + (I,)).astype(dtype))
        so, st = [], []
        if with_state:
            for _ in range(2 if cls == "LSTMCell" else 1):
                a, b = _both(torch, rng.standard_normal(lead + (H,)).astype(dtype))
                so.append(a)
                st.append(b)
        arg_o = (tuple(so) if cls == "LSTMCell" else so[0]) if so else None
        arg_t = (tuple(st) if cls == "LSTMCell" else st[0]) if st else None
        ro, rt = ours(xo, arg_o), theirs(xt, arg_t)
        ro = list(ro) if isinstance(ro, tuple) else [ro]
        rt = list(rt) if isinstance(rt, tuple) else [rt]
        tol = _tol(dtype, 1)
        for a, b in zip(ro, rt):
            _close(a, b, tol, f"{cls} {kw} output")
        weights = [rng.standard_normal(tuple(b.shape)).astype(dtype) for b in rt]
        sum((o * mt.tensor(w)).sum() for o, w in zip(ro, weights)).backward()
        sum((o * torch.tensor(w)).sum() for o, w in zip(rt, weights)).backward()
        _close(xo.grad, xt.grad, tol, f"{cls} {kw} input grad")
        for a, b in zip(so, st):
            _close(a.grad, b.grad, tol, f"{cls} {kw} state grad")
        for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
            _close(a.grad, b.grad, tol, f"{cls} {kw} {name}.grad")


def test_unbatched_layers_match_torch() -> None:
    torch = _torch()
    rng = np.random.default_rng(6)
    for cls in ("RNN", "LSTM", "GRU"):
        ours, theirs = _pair(torch, cls, np.float64, input_size=I, hidden_size=H, num_layers=2)
        x = rng.standard_normal((T, I))
        for a, b in zip(_flat_outputs(ours(mt.tensor(x))),
                        _flat_outputs(theirs(torch.tensor(x)))):
            _close(a, b, 1e-10, f"{cls} unbatched")


def test_gradients_by_finite_differences() -> None:
    """Without torch: every parameter's gradient of a packed bidirectional LSTM with a
    projection, against central differences in float64."""
    rng = np.random.default_rng(8)
    lstm = nn.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2, dtype="float64")
    x = mt.tensor(rng.standard_normal((4, 2, 3)))
    packed = rnn_utils.pack_padded_sequence(x, [4, 2])
    w = rng.standard_normal((6, 4))

    def loss() -> Any:
        out, (h, c) = lstm(packed)
        return (out.data * mt.tensor(w)).sum() + (h ** 2).sum() + c.sum()

    loss().backward()
    for name, p in lstm.named_parameters():
        flat = p.detach().numpy().reshape(-1)
        for j in range(0, flat.size, max(1, flat.size // 5)):
            keep = flat[j]
            with mt.no_grad():
                flat[j] = keep + 1e-6
                up = float(loss())
                flat[j] = keep - 1e-6
                down = float(loss())
                flat[j] = keep
            fd = (up - down) / 2e-6
            assert abs(fd - float(p.grad.numpy().reshape(-1)[j])) <= 1e-6 * max(1, abs(fd)), name


def test_dropout_between_layers_only_in_training() -> None:
    mt.manual_seed(0)
    gru = nn.GRU(I, H, num_layers=3, dropout=0.5)
    x = mt.randn(T, B, I)
    gru.eval()
    a, _ = gru(x)
    b, _ = gru(x)
    assert np.array_equal(a.detach().numpy(), b.detach().numpy())
    gru.train()
    c, _ = gru(x)
    assert not np.allclose(a.detach().numpy(), c.detach().numpy())
    with pytest.warns(UserWarning, match="num_layers=1"):
        nn.LSTM(I, H, dropout=0.3)


def test_state_dict_keys_and_defaults_are_torchs() -> None:
    torch = _torch()
    for cls, kw in [("LSTM", dict(num_layers=2, bidirectional=True, proj_size=3)),
                    ("GRU", dict(bias=False)), ("RNN", dict(nonlinearity="relu")),
                    ("LSTMCell", dict()), ("GRUCell", dict()),
                    ("RNNCell", dict(nonlinearity="relu", bias=False))]:
        ours = getattr(nn, cls)(I, H, **kw)
        theirs = getattr(torch.nn, cls)(I, H, **kw)
        assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == \
            {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
        assert repr(ours) == repr(theirs)
        bound = 1 / np.sqrt(H)
        for p in ours.parameters():
            assert p.dtype == mt.float32 and float(p.abs().max()) <= bound
    lstm = nn.LSTM(I, H)
    lstm.flatten_parameters()  # documented: nothing to do
    assert [len(w) for w in lstm.all_weights] == [4]
    # positional arguments in torch's order: RNN's nonlinearity is the fourth
    assert nn.RNN(I, H, 2, "relu").nonlinearity == "relu"


def _raises_like_torch(torch: Any, fn: Any) -> None:
    """``fn(lib)`` raises the same exception class under both libraries."""
    with pytest.raises(Exception) as theirs:
        fn(torch)
    with pytest.raises(theirs.type):
        fn(mt)


def test_bad_input_gets_torchs_error() -> None:
    torch = _torch()
    cases = [
        lambda lib: lib.nn.utils.rnn.pack_padded_sequence(lib.zeros(4, 2, 3), [2, 4]),
        lambda lib: lib.nn.utils.rnn.pack_padded_sequence(lib.zeros(4, 2, 3), [4, 0]),
        lambda lib: lib.nn.LSTM(3, 4)(lib.zeros(5, 2, 7)),
        lambda lib: lib.nn.LSTM(3, 4)(lib.zeros(5, 2, 3), (lib.zeros(1, 3, 4), lib.zeros(1, 2, 4))),
        lambda lib: lib.nn.GRU(3, 4)(lib.zeros(5, 2, 3), lib.zeros(2, 2, 4)),
        lambda lib: lib.nn.RNN(3, 4)(lib.zeros(2, 5, 2, 3)),
        lambda lib: lib.nn.LSTM(3, 4, proj_size=4),
        lambda lib: lib.nn.LSTM(3, 4, proj_size=-1),
        lambda lib: lib.nn.GRU(3, 4, proj_size=2),
        lambda lib: lib.nn.RNN(3, 4, nonlinearity="sigmoid"),
        lambda lib: lib.nn.LSTM(3, 4, dropout=1.5),
        lambda lib: lib.nn.LSTMCell(3, 4)(lib.zeros(2, 5)),
        lambda lib: lib.nn.utils.rnn.pad_packed_sequence(
            lib.nn.utils.rnn.pack_sequence([lib.zeros(3, 1)]), total_length=2),
    ]
    for fn in cases:
        _raises_like_torch(torch, fn)
