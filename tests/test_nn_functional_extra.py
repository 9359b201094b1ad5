"""Lookup, padding, resampling, pooling, dropout and bilinear ops of
``mpitensor.nn.functional`` beyond the first set, with their modules, against PyTorch.

Values and gradients (float64 to 1e-10, float32 to 1e-5) over shapes and options; module
reprs, attributes and state dicts; bad arguments. Random ops (dropout variants) are checked
for their structure and statistics, as their draws are not torch's.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F
from tests.test_nn_functional import _fd_check

RNG = np.random.default_rng(7)
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


def _parity(call, arrays, grad_idx, dtype, check_dtype=True):
    """``call(lib_functional, *tensors)`` in both libraries: values (and a second output, such
    as indices, compared exactly) and the gradients of the arrays at ``grad_idx``."""
    torch = _torch()
    arrays = [a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
              for a in arrays]
    ours = [mt.tensor(a, requires_grad=i in grad_idx) if isinstance(a, np.ndarray) else a
            for i, a in enumerate(arrays)]
    theirs = [torch.tensor(a, requires_grad=i in grad_idx) if isinstance(a, np.ndarray) else a
              for i, a in enumerate(arrays)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = call(F, *ours)
        tout = call(torch.nn.functional, *theirs)
    if isinstance(out, tuple):
        np.testing.assert_array_equal(_np(out[1]), tout[1].numpy())
        assert _np(out[1]).dtype == tout[1].numpy().dtype
        out, tout = out[0], tout[0]
    assert tuple(out.shape) == tuple(tout.shape)
    if check_dtype:
        assert _np(out).dtype == tout.detach().numpy().dtype
    _close(_np(out), tout.detach().numpy(), dtype, "value")
    if not grad_idx:
        return
    g = RNG.standard_normal(tuple(out.shape)).astype(_np(out).dtype)
    out.backward(mt.tensor(g))
    tout.backward(torch.tensor(g))
    for i in grad_idx:
        _close(_np(ours[i].grad), theirs[i].grad.numpy(), dtype, f"gradient of argument {i}")


# --------------------------------------------------------------------------------------------
# one_hot, embedding, embedding_bag


@pytest.mark.parametrize("shape,num", [((5,), -1), ((2, 3), 6), ((), 4), ((0,), 3)])
def test_one_hot_matches_torch(shape, num):
    torch = _torch()
    x = RNG.integers(0, 4, shape)
    got = F.one_hot(mt.tensor(x), num)
    want = torch.nn.functional.one_hot(torch.tensor(x), num)
    assert got.dtype == mt.int64
    np.testing.assert_array_equal(_np(got), want.numpy())


@pytest.mark.parametrize("call", [
    lambda: F.one_hot(mt.tensor([0, 3]), 2),
    lambda: F.one_hot(mt.tensor([-1, 1])),
    lambda: F.one_hot(mt.tensor([], dtype=mt.int64)),
    lambda: F.one_hot(mt.tensor([1, 2], dtype=mt.int32)),
])
def test_one_hot_bad_inputs_raise(call):
    with pytest.raises(RuntimeError):
        call()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("padding_idx", [None, 2, -1])
@pytest.mark.parametrize("by_freq", [False, True])
@pytest.mark.parametrize("ishape", [(7,), (3, 4), ()])
def test_embedding_matches_torch(ishape, padding_idx, by_freq, dtype):
    w = RNG.standard_normal((6, 3))
    idx = RNG.integers(0, 6, ishape)
    if idx.size > 2:
        idx.reshape(-1)[:3] = [2, 2, 5]  # repeats and the padding rows
    _parity(lambda f, i, a: f.embedding(i, a, padding_idx=padding_idx,
                                        scale_grad_by_freq=by_freq),
            [idx, w], [1], dtype)


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_embedding_max_norm_renormalises_like_torch(norm_type):
    torch = _torch()
    w = RNG.standard_normal((6, 4)) * 3
    idx = np.array([[0, 2], [2, 5]])
    ours, theirs = mt.tensor(w.copy(), requires_grad=True), torch.tensor(w.copy(),
                                                                          requires_grad=True)
    v0 = ours._version
    out = F.embedding(mt.tensor(idx), ours, max_norm=1.5, norm_type=norm_type)
    tout = torch.nn.functional.embedding(torch.tensor(idx), theirs, max_norm=1.5,
                                         norm_type=norm_type)
    _close(_np(ours), theirs.detach().numpy(), np.float64, "renormalised table")
    _close(_np(out), tout.detach().numpy(), np.float64, "lookup")
    assert ours._version > v0
    g = RNG.standard_normal(out.shape)
    out.backward(mt.tensor(g))
    tout.backward(torch.tensor(g))
    _close(_np(ours.grad), theirs.grad.numpy(), np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("layout", ["2d", "offsets", "last_offset"])
@pytest.mark.parametrize("padding_idx", [None, 1])
def test_embedding_bag_matches_torch(mode, layout, padding_idx, dtype):
    w = RNG.standard_normal((7, 3))
    if layout == "2d":
        idx, off = RNG.integers(0, 7, (4, 3)), None
    else:
        idx = RNG.integers(0, 7, 9)
        off = np.array([0, 2, 2, 6]) if layout == "offsets" else np.array([0, 2, 2, 6, 9])
    idx.reshape(-1)[0] = 1

    def call(f, i, a, o=None):
        return f.embedding_bag(i, a, o, mode=mode, padding_idx=padding_idx,
                               include_last_offset=layout == "last_offset")

    arrays = [idx, w] + ([off] if off is not None else [])
    _parity(call, arrays, [1], dtype)


def test_embedding_bag_per_sample_weights_match_torch():
    w = RNG.standard_normal((7, 3))
    idx, off = RNG.integers(0, 7, 8), np.array([0, 3, 3])
    psw = RNG.standard_normal(8)
    _parity(lambda f, i, a, o, p: f.embedding_bag(i, a, o, mode="sum", per_sample_weights=p),
            [idx, w, off, psw], [1, 3], np.float64)


def test_embedding_module_matches_torch():
    torch = _torch()
    for args, kw in [((10, 3), {}), ((10, 3), {"padding_idx": -1}),
                     ((10, 3), {"max_norm": 1.0, "norm_type": 1.0, "scale_grad_by_freq": True,
                                "sparse": True})]:
        ours, theirs = nn.Embedding(*args, **kw), torch.nn.Embedding(*args, **kw)
        assert repr(ours) == repr(theirs)
        assert ours.padding_idx == theirs.padding_idx
        assert list(ours.state_dict()) == list(theirs.state_dict())
        if ours.padding_idx is not None:
            assert not _np(ours.weight[ours.padding_idx]).any()
    for kw in [{}, {"mode": "sum", "padding_idx": 2, "max_norm": 2.0}]:
        assert repr(nn.EmbeddingBag(10, 3, **kw)) == repr(torch.nn.EmbeddingBag(10, 3, **kw))


def test_embedding_module_trains_and_padding_row_gets_no_gradient():
    emb = nn.Embedding(5, 2, padding_idx=0)
    out = emb(mt.tensor([[0, 1, 1], [0, 4, 3]]))
    out.sum().backward()
    g = _np(emb.weight.grad)
    assert not g[0].any() and np.allclose(g[1], 2.0) and np.allclose(g[2], 0.0)


def test_embedding_from_pretrained_shares_and_freezes():
    table = mt.tensor(RNG.standard_normal((4, 2)))
    emb = nn.Embedding.from_pretrained(table)
    assert not emb.weight.requires_grad and repr(emb) == "Embedding(4, 2)"
    np.testing.assert_array_equal(_np(emb(mt.tensor([3]))), _np(table)[[3]])
    emb2 = nn.Embedding.from_pretrained(table, freeze=False, padding_idx=1)
    assert emb2.weight.requires_grad and _np(emb2.weight)[1].any()
    bag = nn.EmbeddingBag.from_pretrained(table, mode="sum")
    np.testing.assert_allclose(_np(bag(mt.tensor([[0, 1]]))), _np(table)[[0]] + _np(table)[[1]])
    with pytest.raises(ValueError):
        nn.Embedding.from_pretrained(mt.ones(3))


@pytest.mark.parametrize("call, exc", [
    (lambda: F.embedding(mt.tensor([1.0]), mt.ones(3, 2)), RuntimeError),
    (lambda: F.embedding(mt.tensor([5]), mt.ones(3, 2)), IndexError),
    (lambda: F.embedding(mt.tensor([1]), mt.ones(3, 2), padding_idx=3), ValueError),
    (lambda: F.embedding_bag(mt.tensor([1, 2]), mt.ones(3, 2)), ValueError),
    (lambda: F.embedding_bag(mt.tensor([[1, 2]]), mt.ones(3, 2), mt.tensor([0])), ValueError),
    (lambda: F.embedding_bag(mt.tensor([1, 2]), mt.ones(3, 2), mt.tensor([0]), mode="mean",
                             per_sample_weights=mt.ones(2)), ValueError),
    (lambda: F.embedding_bag(mt.tensor([1, 2]), mt.ones(3, 2), mt.tensor([0]), mode="prod"),
     ValueError),
    (lambda: nn.Embedding(3, 2, padding_idx=5), ValueError),
])
def test_embedding_bad_inputs_raise(call, exc):
    with pytest.raises(exc):
        call()


# --------------------------------------------------------------------------------------------
# pad


PAD_CASES = [
    ("constant", (2, 3, 5, 4), (1, 2)), ("constant", (2, 3, 5, 4), (1, -2, 2, 0, 1, 1)),
    ("constant", (5,), (-2, 3)), ("constant", (2, 3), (0, 0, 1, 1)),
    ("reflect", (2, 5), (2, 3)), ("reflect", (2, 3, 5), (-1, 2)),
    ("reflect", (2, 3, 5, 4), (1, 3, 2, 0)), ("reflect", (2, 3, 4, 5, 4), (1, 2, 2, 1, 3, 0)),
    ("replicate", (2, 3, 5), (6, 1)), ("replicate", (3, 5, 4), (1, 3, 2, 2)),
    ("replicate", (1, 2, 3, 4, 5), (1, 1, 2, 2, 3, 3)), ("circular", (2, 3, 5), (5, 2)),
    ("circular", (2, 3, 5, 4), (1, -1, 2, 4)), ("circular", (2, 3, 4, 3), (3, 3, 4, 4)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode,shape,amounts", PAD_CASES)
def test_pad_matches_torch(mode, shape, amounts, dtype):
    x = RNG.standard_normal(shape)
    value = 2.5 if mode == "constant" else None
    _parity(lambda f, a: f.pad(a, amounts, mode=mode, value=value), [x], [0], dtype)


def test_pad_integer_constant_like_torch():
    torch = _torch()
    got = F.pad(mt.tensor([1, 2]), (1, 1), value=2.7)
    want = torch.nn.functional.pad(torch.tensor([1, 2]), (1, 1), value=2.7)
    np.testing.assert_array_equal(_np(got), want.numpy())


@pytest.mark.parametrize("call, exc", [
    (lambda: F.pad(mt.ones(2, 5), (1, 1, 1)), RuntimeError),
    (lambda: F.pad(mt.ones(2, 5), (1, 1) * 3), RuntimeError),
    (lambda: F.pad(mt.ones(2, 5), (5, 0), mode="reflect"), RuntimeError),
    (lambda: F.pad(mt.ones(2, 5), (6, 0), mode="circular"), RuntimeError),
    (lambda: F.pad(mt.ones(5), (1, 1), mode="reflect"), NotImplementedError),
    (lambda: F.pad(mt.ones(2, 3, 4, 5), (1, 1), mode="reflect"), NotImplementedError),
    (lambda: F.pad(mt.ones(2, 5), (1, 1), mode="reflect", value=1.0), RuntimeError),
    (lambda: F.pad(mt.ones(2, 5), (-3, -3)), RuntimeError),
    (lambda: F.pad(mt.ones(2, 5), (1, 1), mode="mirror"), ValueError),
])
def test_pad_bad_inputs_raise(call, exc):
    with pytest.raises(exc):
        call()


PAD_MODULES = [("ZeroPad1d", (1,)), ("ZeroPad2d", (1,)), ("ZeroPad2d", ((1, 2, 3, 0),)),
               ("ZeroPad3d", (1,)), ("ConstantPad1d", (2, 3.5)),
               ("ConstantPad2d", ((1, 0, 2, 1), -1.0)), ("ConstantPad3d", (1, 0.0)),
               ("ReflectionPad1d", (2,)), ("ReflectionPad2d", ((1, 0, 2, 1),)),
               ("ReflectionPad3d", (1,)), ("ReplicationPad1d", (3,)),
               ("ReplicationPad2d", (2,)), ("ReplicationPad3d", ((1, 0, 0, 1, 2, 0),)),
               ("CircularPad1d", (2,)), ("CircularPad2d", ((1, 2, 0, 1),)),
               ("CircularPad3d", (1,))]


@pytest.mark.parametrize("name,args", PAD_MODULES)
def test_pad_modules_match_torch(name, args):
    torch = _torch()
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    assert repr(ours) == repr(theirs)
    assert ours.padding == theirs.padding
    dims = int(name[-2])
    x = RNG.standard_normal((2, 3, 4, 5, 6)[: dims + 2])
    _close(_np(ours(mt.tensor(x))), theirs(torch.tensor(x)).numpy(), np.float64)


# --------------------------------------------------------------------------------------------
# interpolate


INTERP = [
    ("nearest", (2, 3, 5), {"scale_factor": 2}), ("nearest", (2, 3, 5), {"size": 7}),
    ("nearest", (2, 3, 5, 6), {"scale_factor": 1.7}),
    ("nearest", (2, 3, 5, 6), {"scale_factor": (0.6, 2.3)}),
    ("nearest", (1, 2, 3, 4, 5), {"size": (5, 3, 7)}),
    ("nearest-exact", (2, 3, 5, 6), {"scale_factor": 1.7}),
    ("nearest-exact", (2, 3, 5), {"size": 3}),
    ("linear", (2, 3, 5), {"scale_factor": 2.5}), ("linear", (2, 3, 5), {"size": 3}),
    ("bilinear", (2, 3, 5, 6), {"scale_factor": 2}),
    ("bilinear", (2, 3, 5, 6), {"size": (7, 3)}),
    ("bilinear", (2, 3, 5, 6), {"scale_factor": (0.6, 2.3)}),
    ("bilinear", (2, 3, 5, 6), {"scale_factor": 1.7, "recompute_scale_factor": True}),
    ("bicubic", (2, 3, 5, 6), {"scale_factor": 1.5}),
    ("bicubic", (2, 3, 5, 6), {"size": (3, 9)}),
    ("trilinear", (1, 2, 3, 4, 5), {"scale_factor": 1.5}),
    ("area", (2, 3, 7, 6), {"size": (3, 4)}), ("area", (2, 3, 7), {"size": 4}),
]


INTERP_ALIGN = [(m, s, kw, a) for m, s, kw in INTERP
                for a in ([None] if m in ("nearest", "nearest-exact", "area")
                          else [None, True, False])]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode,shape,kw,align", INTERP_ALIGN)
def test_interpolate_matches_torch(mode, shape, kw, align, dtype):
    x = RNG.standard_normal(shape)
    _parity(lambda f, a: f.interpolate(a, mode=mode, align_corners=align, **kw), [x], [0],
            dtype)


@pytest.mark.parametrize("call, exc", [
    (lambda: F.interpolate(mt.ones(1, 1, 4), mode="bilinear", scale_factor=2),
     NotImplementedError),
    (lambda: F.interpolate(mt.ones(1, 1, 4)), ValueError),
    (lambda: F.interpolate(mt.ones(1, 1, 4), size=2, scale_factor=2), ValueError),
    (lambda: F.interpolate(mt.ones(1, 1, 4), size=2, align_corners=True), ValueError),
    (lambda: F.interpolate(mt.ones(1, 1, 4, 4), size=2, mode="bilinear", antialias=True),
     NotImplementedError),
    (lambda: F.interpolate(mt.ones(4), size=2), NotImplementedError),
    (lambda: F.interpolate(mt.ones(1, 1, 4), size=2, mode="cubic"), ValueError),
])
def test_interpolate_bad_inputs_raise(call, exc):
    with pytest.raises(exc):
        call()


def test_deprecated_upsample_functions_warn_and_match_torch():
    x = RNG.standard_normal((1, 2, 3, 4))
    with pytest.warns(UserWarning):
        F.upsample(mt.tensor(x), scale_factor=2)
    _parity(lambda f, a: f.upsample_bilinear(a, scale_factor=2), [x], [0], np.float64)
    _parity(lambda f, a: f.upsample_nearest(a, size=(5, 5)), [x], [0], np.float64)


@pytest.mark.parametrize("name,kw", [
    ("Upsample", {"scale_factor": 2}), ("Upsample", {"size": (3, 7), "mode": "bilinear"}),
    ("Upsample", {"scale_factor": (2, 3), "mode": "bilinear", "align_corners": True}),
    ("Upsample", {"scale_factor": 1.5, "mode": "bicubic"}),
    ("UpsamplingNearest2d", {"scale_factor": 2}), ("UpsamplingBilinear2d", {"size": 4}),
])
def test_upsample_modules_match_torch(name, kw):
    torch = _torch()
    ours, theirs = getattr(nn, name)(**kw), getattr(torch.nn, name)(**kw)
    assert repr(ours) == repr(theirs)
    x = RNG.standard_normal((2, 3, 4, 5))
    _close(_np(ours(mt.tensor(x))), theirs(torch.tensor(x)).numpy(), np.float64)


# --------------------------------------------------------------------------------------------
# shuffles, unfold/fold, unflatten


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,r", [((2, 8, 3, 5), 2), ((9, 2, 4), 3), ((2, 1, 4, 3, 2), 1)])
def test_pixel_shuffle_matches_torch(shape, r, dtype):
    _parity(lambda f, a: f.pixel_shuffle(a, r), [RNG.standard_normal(shape)], [0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,r", [((2, 3, 4, 6), 2), ((1, 6, 9), 3), ((2, 2, 2, 4, 4), 4)])
def test_pixel_unshuffle_matches_torch(shape, r, dtype):
    _parity(lambda f, a: f.pixel_unshuffle(a, r), [RNG.standard_normal(shape)], [0], dtype)


@pytest.mark.parametrize("shape,g", [((2, 6, 4), 3), ((2, 8, 3, 3), 2)])
def test_channel_shuffle_matches_torch(shape, g):
    torch = _torch()
    x = RNG.standard_normal(shape)
    np.testing.assert_array_equal(_np(F.channel_shuffle(mt.tensor(x), g)),
                                  torch.nn.functional.channel_shuffle(torch.tensor(x),
                                                                      g).numpy())


UNFOLD = [((2, 3, 6, 7), dict(kernel_size=(2, 3), dilation=(1, 2), padding=1, stride=(2, 1))),
          ((1, 2, 5, 5), dict(kernel_size=3)), ((3, 4, 5), dict(kernel_size=2, stride=2)),
          ((2, 1, 4, 6), dict(kernel_size=(1, 2), padding=(0, 1), stride=(1, 3)))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,kw", UNFOLD)
def test_unfold_and_fold_match_torch(shape, kw, dtype):
    x = RNG.standard_normal(shape)
    _parity(lambda f, a: f.unfold(a, **kw), [x], [0], dtype)
    cols = F.unfold(mt.tensor(x), **kw)
    blocks = RNG.standard_normal(tuple(cols.shape))
    _parity(lambda f, a: f.fold(a, shape[-2:], **kw), [blocks], [0], dtype)


def test_shape_modules_match_torch():
    torch = _torch()
    cases = [(nn.PixelShuffle(2), torch.nn.PixelShuffle(2), (1, 8, 2, 3)),
             (nn.PixelUnshuffle(2), torch.nn.PixelUnshuffle(2), (1, 2, 4, 6)),
             (nn.ChannelShuffle(2), torch.nn.ChannelShuffle(2), (1, 4, 3)),
             (nn.Unfold(2, padding=1), torch.nn.Unfold(2, padding=1), (2, 3, 4, 4)),
             (nn.Fold((4, 5), 2, padding=1), torch.nn.Fold((4, 5), 2, padding=1), (2, 8, 30)),
             (nn.Unflatten(1, (2, 3)), torch.nn.Unflatten(1, (2, 3)), (4, 6, 5)),
             (nn.Unflatten(-1, (2, -1)), torch.nn.Unflatten(-1, (2, -1)), (4, 6))]
    for ours, theirs, shape in cases:
        assert repr(ours) == repr(theirs)
        x = RNG.standard_normal(shape)
        xm, xt = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        out, tout = ours(xm), theirs(xt)
        _close(_np(out), tout.detach().numpy(), np.float64)
        (out * out).sum().backward()
        (tout * tout).sum().backward()
        _close(_np(xm.grad), xt.grad.numpy(), np.float64)


@pytest.mark.parametrize("call", [
    lambda: F.pixel_shuffle(mt.ones(1, 3, 2, 2), 2),
    lambda: F.pixel_unshuffle(mt.ones(1, 1, 3, 2), 2),
    lambda: F.pixel_shuffle(mt.ones(4, 2), 2),
    lambda: F.channel_shuffle(mt.ones(1, 5, 2), 2),
    lambda: F.fold(mt.ones(1, 5, 9), (4, 4), 2),
    lambda: F.fold(mt.ones(1, 4, 8), (4, 4), 2),
    lambda: F.unfold(mt.ones(1, 1, 2, 2), 3),
    lambda: nn.Unflatten(1, (4, 4))(mt.ones(2, 6)),
])
def test_shape_ops_bad_inputs_raise(call):
    with pytest.raises(RuntimeError):
        call()


# --------------------------------------------------------------------------------------------
# 1-D pooling


POOL = [(2, None, 0, 1, False), (3, 2, 1, 1, True), (3, 2, 1, 2, True), (4, 3, 2, 1, True),
        (5, 1, 2, 1, False), (3, 3, 1, 2, True), ((2,), (1,), (1,), (1,), False)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,s,p,d,ceil", POOL)
@pytest.mark.parametrize("shape", [(2, 3, 11), (3, 8)])
def test_max_pool1d_matches_torch(shape, k, s, p, d, ceil, dtype):
    x = RNG.standard_normal(shape)
    x[..., 3] = x[..., 4]  # a tie: the first maximum takes the gradient
    _parity(lambda f, a: f.max_pool1d(a, k, s, p, d, ceil, return_indices=True), [x], [0],
            dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,s,p,ceil", [(2, None, 0, False), (3, 2, 1, True), (4, 3, 2, True),
                                        (5, 1, 2, False), (3, 3, 1, True)])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 11), (3, 8)])
def test_avg_pool1d_matches_torch(shape, k, s, p, ceil, count_include_pad, dtype):
    x = RNG.standard_normal(shape)
    _parity(lambda f, a: f.avg_pool1d(a, k, s, p, ceil, count_include_pad), [x], [0], dtype)


@pytest.mark.parametrize("shape,out", [((2, 3, 11), 4), ((3, 7), 7), ((2, 2, 5), 8)])
def test_adaptive_max_pool1d_matches_torch(shape, out):
    x = RNG.standard_normal(shape)
    _parity(lambda f, a: f.adaptive_max_pool1d(a, out, return_indices=True), [x], [0],
            np.float64)


def test_max_pool1d_propagates_nan_like_torch():
    x = np.array([[[1.0, np.nan, 2.0, 3.0]]])
    _parity(lambda f, a: f.max_pool1d(a, 2), [x], [], np.float64)


@pytest.mark.parametrize("ours,theirs", [
    (lambda n: n.MaxPool1d(2), None), (lambda n: n.MaxPool1d(3, 2, 1, 2, False, True), None),
    (lambda n: n.AvgPool1d(2), None), (lambda n: n.AvgPool1d(3, 1, 1, True, False), None),
    (lambda n: n.AdaptiveMaxPool1d(3), None),
])
def test_pool1d_modules_match_torch(ours, theirs):
    torch = _torch()
    m, tm = ours(nn), ours(torch.nn)
    assert repr(m) == repr(tm)
    x = RNG.standard_normal((2, 3, 9))
    _close(_np(m(mt.tensor(x))), tm(torch.tensor(x)).numpy(), np.float64)


@pytest.mark.parametrize("call", [
    lambda: F.max_pool1d(mt.ones(4), 2),
    lambda: F.max_pool1d(mt.ones(1, 1, 4), 2, padding=2),
    lambda: F.avg_pool1d(mt.ones(1, 1, 4), 3, padding=2),
    lambda: F.max_pool1d(mt.ones(1, 1, 2), 5),
])
def test_pool1d_bad_inputs_raise(call):
    with pytest.raises(RuntimeError):
        call()


# --------------------------------------------------------------------------------------------
# dropout variants


def test_dropout1d_and_3d_drop_whole_channels():
    mt.manual_seed(1)
    x = mt.ones(64, 16, 5)
    y = _np(F.dropout1d(x, 0.25))
    per_channel = y.reshape(64, 16, 5)
    assert set(np.unique(per_channel).tolist()) <= {0.0, float(np.float32(1 / 0.75))}
    assert (per_channel.min(axis=2) == per_channel.max(axis=2)).all()
    assert abs((per_channel[:, :, 0] == 0).mean() - 0.25) < 0.05
    y3 = _np(F.dropout3d(mt.ones(8, 6, 2, 2, 2), 0.5))
    assert (y3.reshape(8, 6, -1).min(axis=2) == y3.reshape(8, 6, -1).max(axis=2)).all()
    y1u = _np(F.dropout1d(mt.ones(6, 4), 0.5))  # unbatched (C, L)
    assert (y1u.min(axis=1) == y1u.max(axis=1)).all()
    assert F.dropout1d(x, 0.5, training=False) is x


def test_alpha_dropout_keeps_mean_and_variance():
    mt.manual_seed(2)
    x = mt.tensor(RNG.standard_normal(200000))
    for fn in (F.alpha_dropout, F.feature_alpha_dropout):
        arg = x if fn is F.alpha_dropout else x.reshape(20000, 10)
        y = _np(fn(arg, 0.2, training=True))
        assert abs(y.mean()) < 0.02 and abs(y.std() - 1) < 0.02
    assert F.alpha_dropout(x, 0.5) is x  # training=False by default, as in torch
    assert not _np(F.alpha_dropout(x, 1.0, True)).any()


def test_alpha_dropout_values_match_torchs_affine_map():
    torch = _torch()
    torch.manual_seed(0)
    t = torch.nn.functional.alpha_dropout(torch.ones(1000, dtype=torch.float64), 0.3, True)
    mt.manual_seed(0)
    ours = _np(F.alpha_dropout(mt.ones(1000, dtype=mt.float64), 0.3, True))
    np.testing.assert_allclose(np.unique(ours), np.unique(t.numpy()), rtol=1e-12)


def test_dropout_variants_backprop_their_masks_and_work_in_place():
    mt.manual_seed(3)
    leaf = mt.tensor(RNG.standard_normal((4, 6, 5)), requires_grad=True)
    y = F.dropout1d(leaf, 0.5)
    y.sum().backward()
    kept = (_np(y) != 0)
    np.testing.assert_allclose(_np(leaf.grad), kept * 2.0)
    h = leaf * 1.0
    v = h._version
    assert F.feature_alpha_dropout(h, 0.5, True, inplace=True) is h and h._version > v
    with pytest.raises(RuntimeError, match="leaf"):
        F.dropout1d(leaf, 0.5, inplace=True)


@pytest.mark.parametrize("name", ["Dropout1d", "Dropout3d", "AlphaDropout",
                                  "FeatureAlphaDropout"])
def test_dropout_modules_match_torch(name):
    torch = _torch()
    for args in [(), (0.2,), (0.3, True)]:
        assert repr(getattr(nn, name)(*args)) == repr(getattr(torch.nn, name)(*args))
    m = getattr(nn, name)(0.5).eval()
    x = mt.ones(2, 3, 4, 4, 4) if name == "Dropout3d" else mt.ones(2, 3, 4)
    assert m(x) is x
    with pytest.raises(ValueError):
        getattr(nn, name)(1.5)


def test_dropout_bad_inputs_raise():
    with pytest.raises(RuntimeError):
        F.dropout1d(mt.ones(4), 0.5)
    with pytest.raises(ValueError):
        F.alpha_dropout(mt.ones(4), -0.1, True)
    with pytest.raises(RuntimeError):
        F.feature_alpha_dropout(mt.ones(4), 0.5, True)
    with pytest.warns(UserWarning):
        F.dropout3d(mt.ones(2, 3, 4), 0.5)


# --------------------------------------------------------------------------------------------
# bilinear


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead,bias", [((5,), True), ((2, 6), True), ((), False)])
def test_bilinear_matches_torch(lead, bias, dtype):
    arrays = [RNG.standard_normal((*lead, 3)), RNG.standard_normal((*lead, 4)),
              RNG.standard_normal((5, 3, 4))]
    if bias:
        arrays.append(RNG.standard_normal(5))
        _parity(lambda f, a, b, w, c: f.bilinear(a, b, w, c), arrays, [0, 1, 2, 3], dtype)
    else:
        _parity(lambda f, a, b, w: f.bilinear(a, b, w), arrays, [0, 1, 2], dtype)


def test_bilinear_module_matches_torch():
    torch = _torch()
    for kw in [{}, {"bias": False}]:
        ours, theirs = nn.Bilinear(3, 4, 5, **kw).double(), torch.nn.Bilinear(3, 4, 5,
                                                                              **kw).double()
        assert repr(ours) == repr(theirs)
        assert list(ours.state_dict()) == list(theirs.state_dict())
        bound = 1 / np.sqrt(3)
        assert np.abs(_np(ours.weight)).max() <= bound
        ours.load_state_dict({k: mt.tensor(v.numpy()) for k, v in theirs.state_dict().items()})
        a, b = RNG.standard_normal((6, 3)), RNG.standard_normal((6, 4))
        _close(_np(ours(mt.tensor(a), mt.tensor(b))),
               theirs(torch.tensor(a), torch.tensor(b)).detach().numpy(), np.float64)


def test_bilinear_bad_inputs_raise():
    with pytest.raises(RuntimeError):
        F.bilinear(mt.ones(2, 3), mt.ones(4), mt.ones(5, 3, 4))
    with pytest.raises(RuntimeError):
        F.bilinear(mt.ones(2, 3), mt.ones(2, 4), mt.ones(5, 4, 3))
    with pytest.raises(ValueError):
        nn.Bilinear(0, 2, 3)


# --------------------------------------------------------------------------------------------
# finite differences (no torch needed)


def test_finite_differences():
    x = RNG.standard_normal((2, 3, 5, 4))
    _fd_check(lambda a: F.pad(a, (1, 2, 2, 1), mode="reflect"), [x], [0])
    _fd_check(lambda a: F.interpolate(a, scale_factor=1.5, mode="bicubic"), [x], [0])
    _fd_check(lambda a: F.interpolate(a, size=(3, 7), mode="bilinear", align_corners=True),
              [x], [0])
    _fd_check(lambda a: F.unfold(a, 2, padding=1, stride=2), [x], [0])
    _fd_check(lambda a: F.avg_pool1d(a, 3, 2, 1, True, False), [x[0]], [0])
    _fd_check(lambda a, b, w: F.bilinear(a, b, w),
              [RNG.standard_normal((4, 2)), RNG.standard_normal((4, 3)),
               RNG.standard_normal((2, 2, 3))], [0, 1, 2])
    _fd_check(lambda w: F.embedding_bag(mt.tensor([0, 1, 1, 2]), w, mt.tensor([0, 2]),
                                        mode="mean"), [RNG.standard_normal((3, 2))], [0])


# --------------------------------------------------------------------------------------------
# lp_pool1d, max_unpool1d, local_response_norm, gumbel_softmax, NLLLoss2d


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p,k,s,ceil", [(2, 3, 2, True), (1.5, 2, None, False),
                                        (3, 3, 1, False)])
def test_lp_pool1d_matches_torch(p, k, s, ceil, dtype):
    x = np.abs(RNG.standard_normal((2, 3, 10))) + 0.1
    _parity(lambda f, a: f.lp_pool1d(a, p, k, s, ceil), [x], [0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,s,p,size", [(2, None, 0, None), (3, 2, 1, None),
                                        (2, None, 0, (2, 3, 9))])
def test_max_unpool1d_matches_torch(k, s, p, size, dtype):
    torch = _torch()
    x = RNG.standard_normal((2, 3, 9 if size else 11)).astype(dtype)
    out, idx = F.max_pool1d(mt.tensor(x), k, s, p, return_indices=True)
    tout, tidx = torch.nn.functional.max_pool1d(torch.tensor(x), k, s, p, return_indices=True)
    pooled = RNG.standard_normal(tuple(out.shape)).astype(dtype)
    _parity(lambda f, a, i: f.max_unpool1d(a, i, k, s, p, size), [pooled, _np(idx)], [0],
            dtype)
    np.testing.assert_array_equal(_np(idx), tidx.numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,args", [((2, 5, 4), (3,)), ((2, 5, 4, 3), (2, 1e-2, 0.5, 2.0)),
                                        ((2, 6, 3, 2, 2), (4, 0.1))])
def test_local_response_norm_matches_torch(shape, args, dtype):
    _parity(lambda f, a: f.local_response_norm(a, *args), [RNG.standard_normal(shape)], [0],
            dtype)


def test_extra_pooling_modules_match_torch():
    torch = _torch()
    for make in (lambda n: n.LPPool1d(2, 3), lambda n: n.LPPool1d(1.5, 3, 2, True),
                 lambda n: n.LocalResponseNorm(2), lambda n: n.LocalResponseNorm(3, 1e-3, 0.5,
                                                                                   2.0)):
        ours, theirs = make(nn), make(torch.nn)
        assert repr(ours) == repr(theirs)
        x = np.abs(RNG.standard_normal((2, 4, 9)))
        _close(_np(ours(mt.tensor(x))), theirs(torch.tensor(x)).numpy(), np.float64)
    ours, theirs = nn.MaxUnpool1d(3, 2, 1), torch.nn.MaxUnpool1d(3, 2, 1)
    assert repr(ours) == repr(theirs)
    with pytest.warns(FutureWarning):
        assert repr(nn.NLLLoss2d()) == "NLLLoss2d()"
    with pytest.raises(ValueError):
        F.local_response_norm(mt.ones(2, 3), 2)
    with pytest.raises(RuntimeError):
        F.max_unpool1d(mt.ones(1, 1, 2), mt.tensor([[[0, 9]]]), 2)


def test_gumbel_softmax_samples_and_straight_through_gradient():
    mt.manual_seed(0)
    logits = mt.tensor(np.log(np.array([[0.2, 0.3, 0.5]])).repeat(20000, 0))
    soft = _np(F.gumbel_softmax(logits, tau=1.0))
    np.testing.assert_allclose(soft.sum(-1), 1.0, rtol=1e-6)
    hard = _np(F.gumbel_softmax(logits, hard=True))
    assert set(np.unique(hard).tolist()) == {0.0, 1.0} and (hard.sum(-1) == 1).all()
    np.testing.assert_allclose(hard.mean(0), [0.2, 0.3, 0.5], atol=0.015)  # Gumbel-max sampling
    x = mt.tensor(RNG.standard_normal((4, 5)), requires_grad=True)
    mt.manual_seed(1)
    y = F.gumbel_softmax(x, tau=0.7, hard=True, dim=1)
    w = mt.tensor(RNG.standard_normal((4, 5)))
    (y * w).sum().backward()
    mt.manual_seed(1)
    x2 = mt.tensor(_np(x), requires_grad=True)
    (F.gumbel_softmax(x2, tau=0.7, dim=1) * w).sum().backward()
    np.testing.assert_allclose(_np(x.grad), _np(x2.grad), rtol=1e-12)  # the soft gradient


# --------------------------------------------------------------------------------------------
# half precision: the dtype is kept, values within a unit or two of the last place


HALF_CASES = {
    "avg_pool1d": lambda f, x: f.avg_pool1d(x, 3, 2, 1),
    "max_pool1d": lambda f, x: f.max_pool1d(x, 3, 2, 1),
    "pad_reflect": lambda f, x: f.pad(x, (1, 2), mode="reflect"),
    "interp_linear": lambda f, x: f.interpolate(x, scale_factor=2, mode="linear"),
    "interp_nearest": lambda f, x: f.interpolate(x, scale_factor=2),
    "l1": lambda f, x: f.l1_loss(x, x * 0.5),
    "smooth_l1": lambda f, x: f.smooth_l1_loss(x, x * 0.5),
    "huber": lambda f, x: f.huber_loss(x, x * 0.5, reduction="none"),
    "normalize": lambda f, x: f.normalize(x, dim=-1),
    "cosine_similarity": lambda f, x: f.cosine_similarity(x, x * 2 + 1),
    "hardtanh": lambda f, x: f.hardtanh(x),
    "sdpa": lambda f, x: f.scaled_dot_product_attention(x, x, x),
}


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(HALF_CASES))
def test_half_precision_matches_torch(name, half):
    torch = _torch()
    x = RNG.standard_normal((2, 4, 6)).astype(np.float32)
    a = mt.tensor(x).to(getattr(mt, half)).requires_grad_()
    b = torch.tensor(x).to(getattr(torch, half)).requires_grad_()
    out, tout = HALF_CASES[name](F, a), HALF_CASES[name](torch.nn.functional, b)
    assert out.dtype == getattr(mt, half)
    tol = 2e-2 if half == "bfloat16" else 2e-3
    np.testing.assert_allclose(_np(out.float()), tout.detach().float().numpy(), rtol=tol,
                               atol=tol)
    out.float().sum().backward()
    tout.float().sum().backward()
    assert a.grad.dtype == getattr(mt, half)
    np.testing.assert_allclose(_np(a.grad.float()), b.grad.float().numpy(), rtol=tol, atol=tol)


# --------------------------------------------------------------------------------------------
# rms_norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,ns,weighted,eps", [((3, 8), (8,), True, None),
                                                   ((2, 3, 4, 5), (4, 5), True, 1e-3),
                                                   ((4, 6), (6,), False, None)])
def test_rms_norm_matches_torch(shape, ns, weighted, eps, dtype):
    x = RNG.standard_normal(shape)
    if weighted:
        w = RNG.standard_normal(ns)
        _parity(lambda f, a, b: f.rms_norm(a, ns, b, eps), [x, w], [0, 1], dtype)
    else:
        _parity(lambda f, a: f.rms_norm(a, ns, eps=eps), [x], [0], dtype)


def test_rms_norm_module_and_errors():
    torch = _torch()
    for args, kw in [((8,), {}), (((4, 8),), {"eps": 1e-6, "elementwise_affine": False})]:
        ours, theirs = nn.RMSNorm(*args, **kw), torch.nn.RMSNorm(*args, **kw)
        assert repr(ours) == repr(theirs)
        assert list(ours.state_dict()) == list(theirs.state_dict())
    x = RNG.standard_normal((2, 8))
    m, tm = nn.RMSNorm(8).double(), torch.nn.RMSNorm(8).double()
    _close(_np(m(mt.tensor(x))), tm(torch.tensor(x)).detach().numpy(), np.float64)
    with pytest.raises(RuntimeError):
        F.rms_norm(mt.ones(3, 8), (4,))
    h = mt.ones(2, 8).half()
    assert F.rms_norm(h, 8).dtype == mt.float16
