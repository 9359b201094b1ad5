"""Attention: ``scaled_dot_product_attention``, ``nn.MultiheadAttention`` and the transformer
modules, against PyTorch with the same weights (state dicts copied across).

Values and gradients of inputs and parameters (float64 to 1e-10, float32 to 1e-5), with
boolean and float masks (both conventions), causal masks, padding masks, grouped-query
attention, batch_first, separate key/value sizes, bias_k/v and zero attention; module reprs and
state-dict keys; bad arguments.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F

RNG = np.random.default_rng(11)
TOL = {np.float32: 1e-5, np.float64: 1e-10}
DTYPES = [np.float32, np.float64]


def _torch():
    return pytest.importorskip("torch")


def _np(t):
    return np.asarray(t.detach()._data)


def _close(got, want, dtype, what=""):
    tol = TOL[dtype]
    want = np.asarray(want)
    finite = want[np.isfinite(want)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=what,
                               equal_nan=True)


def _copy_weights(ours, theirs):
    ours.load_state_dict({k: mt.tensor(v.detach().numpy()) for k, v in
                          theirs.state_dict().items()})


# --------------------------------------------------------------------------------------------
# scaled_dot_product_attention


SDPA = [
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), {}),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), {"is_causal": True}),
    ((2, 3, 6, 8), (2, 3, 4, 8), (2, 3, 4, 8), {"is_causal": True}),
    ((4, 8), (6, 8), (6, 5), {"scale": 0.3}),
    ((2, 4, 8), (2, 6, 8), (2, 6, 5), {"mask": "bool"}),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), {"mask": "float"}),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), {"mask": "bool_row"}),
    ((2, 6, 4, 8), (2, 2, 6, 8), (2, 2, 6, 5), {"enable_gqa": True}),
]


def _mask(kind, L, S):
    if kind == "bool":
        m = RNG.random((L, S)) < 0.7
        m[:, 0] = True
        return m
    if kind == "bool_row":  # one query that may attend to nothing: zeros, as in torch
        m = RNG.random((L, S)) < 0.7
        m[:, 0] = True
        m[1] = False
        return m
    return RNG.standard_normal((L, S))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qs,ks,vs,kw", SDPA)
def test_sdpa_matches_torch(qs, ks, vs, kw, dtype):
    torch = _torch()
    kw = dict(kw)
    arrays = [RNG.standard_normal(s).astype(dtype) for s in (qs, ks, vs)]
    ours = [mt.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    kind = kw.pop("mask", None)
    if kind is not None:
        m = _mask(kind, qs[-2], ks[-2])
        m = m.astype(dtype) if m.dtype.kind == "f" else m
        kw_m, kw_t = {"attn_mask": mt.tensor(m)}, {"attn_mask": torch.tensor(m)}
    else:
        kw_m = kw_t = {}
    out = F.scaled_dot_product_attention(*ours, **kw, **kw_m)
    tout = torch.nn.functional.scaled_dot_product_attention(*theirs, **kw, **kw_t)
    _close(_np(out), tout.detach().numpy(), dtype, "value")
    g = RNG.standard_normal(tuple(out.shape)).astype(dtype)
    out.backward(mt.tensor(g))
    tout.backward(torch.tensor(g))
    for name, a, b in zip("qkv", ours, theirs):
        _close(_np(a.grad), b.grad.numpy(), dtype, f"gradient of {name}")


def test_sdpa_dropout_scales_kept_weights():
    mt.manual_seed(5)
    q = mt.zeros(1, 1, 2000, 4)
    v = mt.ones(1, 1, 10, 3)
    out = _np(F.scaled_dot_product_attention(q, mt.zeros(1, 1, 10, 4), v, dropout_p=0.5))
    # uniform weights 0.1, each kept with probability 0.5 and doubled: the mean stays 1
    assert abs(out.mean() - 1.0) < 0.05 and out.std() > 0.1


@pytest.mark.parametrize("call", [
    lambda: F.scaled_dot_product_attention(mt.ones(2, 4), mt.ones(3, 4), mt.ones(3, 2),
                                           attn_mask=mt.ones(2, 3), is_causal=True),
    lambda: F.scaled_dot_product_attention(mt.ones(2, 4), mt.ones(3, 5), mt.ones(3, 2)),
    lambda: F.scaled_dot_product_attention(mt.ones(2, 4), mt.ones(3, 4), mt.ones(2, 2)),
    lambda: F.scaled_dot_product_attention(mt.ones(1, 3, 2, 4), mt.ones(1, 2, 3, 4),
                                           mt.ones(1, 2, 3, 2), enable_gqa=True),
])
def test_sdpa_bad_inputs_raise(call):
    with pytest.raises(RuntimeError):
        call()


# --------------------------------------------------------------------------------------------
# MultiheadAttention

MHA = [{}, {"batch_first": True}, {"kdim": 3, "vdim": 5}, {"bias": False},
       {"add_bias_kv": True}, {"add_zero_attn": True},
       {"add_bias_kv": True, "add_zero_attn": True, "batch_first": True}]


def _mha_inputs(kw, batched=True, L=4, S=6, N=2, E=8):
    kd, vd = kw.get("kdim", E), kw.get("vdim", E)

    def shape(T, d):
        if not batched:
            return (T, d)
        return (N, T, d) if kw.get("batch_first") else (T, N, d)

    return [RNG.standard_normal(shape(L, E)), RNG.standard_normal(shape(S, kd)),
            RNG.standard_normal(shape(S, vd))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("need,avg", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("masks", ["none", "bool", "float", "3d"])
@pytest.mark.parametrize("kw", MHA)
def test_multihead_attention_matches_torch(kw, masks, need, avg, dtype):
    torch = _torch()
    tdt = getattr(torch, np.dtype(dtype).name)
    theirs = torch.nn.MultiheadAttention(8, 2, **kw).to(tdt)
    ours = nn.MultiheadAttention(8, 2, **kw).to(getattr(mt, np.dtype(dtype).name))
    _copy_weights(ours, theirs)
    arrays = [a.astype(dtype) for a in _mha_inputs(kw)]
    mkw, tkw = {}, {}
    if masks != "none":
        L, S, N, H = 4, 6, 2, 2
        kpm = np.zeros((N, S), bool)
        kpm[0, 4:] = True
        am = np.triu(np.ones((L, S), bool), 3)
        if masks == "float":
            kpm = np.where(kpm, -np.inf, 0.0).astype(dtype)
            am = (RNG.standard_normal((L, S)) * 0.5).astype(dtype)
        elif masks == "3d":
            am = RNG.random((N * H, L, S)) < 0.3
            am[:, :, 0] = False
        mkw = {"key_padding_mask": mt.tensor(kpm), "attn_mask": mt.tensor(am)}
        tkw = {"key_padding_mask": torch.tensor(kpm), "attn_mask": torch.tensor(am)}
    ins = [mt.tensor(a, requires_grad=True) for a in arrays]
    tins = [torch.tensor(a, requires_grad=True) for a in arrays]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, w = ours(*ins, need_weights=need, average_attn_weights=avg, **mkw)
        tout, tw = theirs(*tins, need_weights=need, average_attn_weights=avg, **tkw)
    _close(_np(out), tout.detach().numpy(), dtype, "output")
    if need:
        assert tuple(w.shape) == tuple(tw.shape)
        _close(_np(w), tw.detach().numpy(), dtype, "weights")
    else:
        assert w is None and tw is None
    g = RNG.standard_normal(tuple(out.shape)).astype(dtype)
    out.backward(mt.tensor(g))
    tout.backward(torch.tensor(g))
    for i, (a, b) in enumerate(zip(ins, tins)):
        _close(_np(a.grad), b.grad.numpy(), dtype, f"gradient of input {i}")
    tparams = dict(theirs.named_parameters())
    for n, p in ours.named_parameters():
        _close(_np(p.grad), tparams[n].grad.numpy(), dtype, f"gradient of {n}")


@pytest.mark.parametrize("kw", [{}, {"kdim": 3, "vdim": 5}])
def test_multihead_attention_unbatched_matches_torch(kw):
    torch = _torch()
    theirs = torch.nn.MultiheadAttention(8, 2, **kw).double()
    ours = nn.MultiheadAttention(8, 2, **kw).double()
    _copy_weights(ours, theirs)
    arrays = _mha_inputs(kw, batched=False)
    kpm = np.array([False, False, False, False, True, True])
    out, w = ours(*[mt.tensor(a) for a in arrays], key_padding_mask=mt.tensor(kpm))
    tout, tw = theirs(*[torch.tensor(a) for a in arrays], key_padding_mask=torch.tensor(kpm))
    _close(_np(out), tout.detach().numpy(), np.float64)
    _close(_np(w), tw.detach().numpy(), np.float64)


def test_multihead_attention_self_attention_shares_inputs_with_batch_first():
    torch = _torch()
    theirs = torch.nn.MultiheadAttention(8, 4, batch_first=True).double()
    ours = nn.MultiheadAttention(8, 4, batch_first=True).double()
    _copy_weights(ours, theirs)
    x = RNG.standard_normal((3, 5, 8))
    xm, xt = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, _ = ours(xm, xm, xm)
    tout, _ = theirs(xt, xt, xt)
    _close(_np(out), tout.detach().numpy(), np.float64)
    out.sum().backward()
    tout.sum().backward()
    _close(_np(xm.grad), xt.grad.numpy(), np.float64)


@pytest.mark.parametrize("kw", MHA)
def test_multihead_attention_repr_and_state_dict_match_torch(kw):
    torch = _torch()
    ours, theirs = nn.MultiheadAttention(8, 2, **kw), torch.nn.MultiheadAttention(8, 2, **kw)
    assert repr(ours) == repr(theirs)
    sd, tsd = ours.state_dict(), theirs.state_dict()
    assert list(sd) == list(tsd)
    for k in sd:
        assert tuple(sd[k].shape) == tuple(tsd[k].shape), k
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    if ours.in_proj_bias is not None:
        assert not _np(ours.in_proj_bias).any() and not _np(ours.out_proj.bias).any()
    w = _np(ours.in_proj_weight if ours.in_proj_weight is not None else ours.q_proj_weight)
    bound = np.sqrt(6.0 / sum(w.shape))
    assert np.abs(w).max() <= bound


def test_multihead_attention_dropout_only_in_training():
    mha = nn.MultiheadAttention(8, 2, dropout=0.9)
    x = mt.tensor(RNG.standard_normal((4, 2, 8)).astype(np.float32))
    a = _np(mha.eval()(x, x, x)[0])
    b = _np(mha.eval()(x, x, x)[0])
    np.testing.assert_array_equal(a, b)
    mt.manual_seed(0)
    c = _np(mha.train()(x, x, x)[0])
    assert not np.allclose(a, c)


@pytest.mark.parametrize("call, exc", [
    (lambda: nn.MultiheadAttention(8, 3), ValueError),
    (lambda: nn.MultiheadAttention(8, 2)(mt.ones(4, 2, 8), mt.ones(5, 2, 8), mt.ones(5, 2, 8),
                                         attn_mask=mt.ones(4, 4, dtype=mt.bool)), RuntimeError),
    (lambda: nn.MultiheadAttention(8, 2)(mt.ones(4, 2, 8), mt.ones(5, 2, 8), mt.ones(5, 2, 8),
                                         key_padding_mask=mt.ones(2, 4, dtype=mt.bool)),
     RuntimeError),
    (lambda: nn.MultiheadAttention(8, 2)(mt.ones(4, 2, 8), mt.ones(5, 2, 8), mt.ones(5, 2, 8),
                                         is_causal=True), RuntimeError),
    (lambda: nn.MultiheadAttention(8, 2)(mt.ones(4, 2, 8), mt.ones(5, 8), mt.ones(5, 8)),
     RuntimeError),
])
def test_multihead_attention_bad_inputs_raise(call, exc):
    with pytest.raises(exc):
        call()


# --------------------------------------------------------------------------------------------
# transformer modules


ENC = [{}, {"norm_first": True}, {"activation": "gelu", "batch_first": True},
       {"bias": False}]


@pytest.mark.parametrize("masks", [False, True])
@pytest.mark.parametrize("kw", ENC)
def test_transformer_encoder_layer_matches_torch(kw, masks):
    torch = _torch()
    theirs = torch.nn.TransformerEncoderLayer(8, 2, 16, **kw).double().eval()
    ours = nn.TransformerEncoderLayer(8, 2, 16, **kw).double().eval()
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    _copy_weights(ours, theirs)
    shape = (3, 5, 8) if kw.get("batch_first") else (5, 3, 8)
    x = RNG.standard_normal(shape)
    mkw, tkw = {}, {}
    if masks:
        causal = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
        kpm = np.zeros((3, 5), bool)
        kpm[1, 3:] = True
        mkw = {"src_mask": mt.tensor(causal.numpy()), "src_key_padding_mask": mt.tensor(kpm)}
        tkw = {"src_mask": causal, "src_key_padding_mask": torch.tensor(kpm)}
    xm, xt = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, tout = ours(xm, **mkw), theirs(xt, **tkw)
    _close(_np(out), tout.detach().numpy(), np.float64)
    out.sum().backward()
    tout.sum().backward()
    _close(_np(xm.grad), xt.grad.numpy(), np.float64)
    tparams = dict(theirs.named_parameters())
    for n, p in ours.named_parameters():
        _close(_np(p.grad), tparams[n].grad.numpy(), np.float64, n)


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
def test_transformer_encoder_and_full_transformer_match_torch():
    torch = _torch()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tlayer = torch.nn.TransformerEncoderLayer(8, 2, 16)
        theirs = torch.nn.TransformerEncoder(tlayer, 2, torch.nn.LayerNorm(8)).double().eval()
    ours = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 2,
                                 nn.LayerNorm(8)).double().eval()
    assert repr(ours) == repr(theirs)
    _copy_weights(ours, theirs)
    x = RNG.standard_normal((5, 3, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _close(_np(ours(mt.tensor(x))), theirs(torch.tensor(x)).detach().numpy(), np.float64)
    tt = torch.nn.Transformer(8, 2, 2, 2, 16, dropout=0.0).double().eval()
    mm = nn.Transformer(8, 2, 2, 2, 16, dropout=0.0).double().eval()
    assert repr(mm) == repr(tt)
    assert list(mm.state_dict()) == list(tt.state_dict())
    _copy_weights(mm, tt)
    src, tgt = RNG.standard_normal((5, 3, 8)), RNG.standard_normal((4, 3, 8))
    causal = nn.Transformer.generate_square_subsequent_mask(4, dtype=mt.float64)
    tcausal = torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
    np.testing.assert_array_equal(_np(causal), tcausal.numpy())
    sm, st = mt.tensor(src, requires_grad=True), torch.tensor(src, requires_grad=True)
    out = mm(sm, mt.tensor(tgt), tgt_mask=causal)
    tout = tt(st, torch.tensor(tgt), tgt_mask=tcausal)
    _close(_np(out), tout.detach().numpy(), np.float64)
    out.sum().backward()
    tout.sum().backward()
    _close(_np(sm.grad), st.grad.numpy(), np.float64)


@pytest.mark.parametrize("kw", [{}, {"norm_first": True, "batch_first": True}])
def test_transformer_decoder_layer_matches_torch(kw):
    torch = _torch()
    theirs = torch.nn.TransformerDecoderLayer(8, 2, 16, **kw).double().eval()
    ours = nn.TransformerDecoderLayer(8, 2, 16, **kw).double().eval()
    assert repr(ours) == repr(theirs)
    _copy_weights(ours, theirs)
    bf = kw.get("batch_first")
    tgt = RNG.standard_normal((3, 4, 8) if bf else (4, 3, 8))
    mem = RNG.standard_normal((3, 5, 8) if bf else (5, 3, 8))
    out = ours(mt.tensor(tgt), mt.tensor(mem))
    tout = theirs(torch.tensor(tgt), torch.tensor(mem))
    _close(_np(out), tout.detach().numpy(), np.float64)


def test_transformer_layer_trains():
    mt.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True)
    opt = mt.optim.SGD(layer.parameters(), lr=0.05)
    x = mt.randn(4, 6, 8)
    target = mt.randn(4, 6, 8)
    first = None
    for _ in range(20):
        opt.zero_grad()
        loss = F.mse_loss(layer(x), target)
        loss.backward()
        opt.step()
        first = float(loss) if first is None else first
    assert float(loss) < first
