"""Tests of ``mpitensor.nn.functional``: finite differences (float64) and parity with PyTorch.

Gradients are driven through the functional ops themselves (``out.backward(grad)``), so these
tests depend only on the autograd engine and the ops under test. Finite-difference checks run
without torch; parity tests skip where torch is missing.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn.functional as F
from mpitensor._base import config as _config
from mpitensor._base import parallel as _parallel
from mpitensor._base import workspace as W
from mpitensor.nn import _kernels as K

RNG = np.random.default_rng(1234)


def _t(a: np.ndarray, grad: bool = True) -> mt.Tensor:
    return mt.tensor(a, requires_grad=grad)


def _np(t: mt.Tensor) -> np.ndarray:
    return np.asarray(t._data)


def _grads(fn, arrays, g=None):
    """Run ``fn`` on leaf tensors, backprop ``g`` (random by default); return (out, grads)."""
    ts = [_t(a) if a.dtype.kind == "f" else mt.tensor(a) for a in arrays]
    out = fn(*ts)
    if g is None:
        g = RNG.standard_normal(tuple(out.shape)).astype(_np(out).dtype)
    out.backward(mt.tensor(g))
    return _np(out), [None if t.grad is None else _np(t.grad) for t in ts], g


def _fd_check(fn, arrays, wrt, eps=1e-6, rtol=1e-5, atol=1e-7, before=None):
    """Compare analytic gradients of ``sum(fn(*x) * G)`` with central differences."""
    arrays = [a.copy() for a in arrays]
    if before:
        before()
    out, grads, g = _grads(fn, arrays)

    def value() -> float:
        if before:
            before()
        with mt.no_grad():
            ts = [mt.tensor(a) for a in arrays]
            return float((_np(fn(*ts)) * g).sum())

    for i in wrt:
        a = arrays[i]
        num = np.zeros_like(a)
        flat, nflat = a.reshape(-1), num.reshape(-1)
        for j in range(flat.size):
            old = flat[j]
            flat[j] = old + eps
            fp = value()
            flat[j] = old - eps
            fm = value()
            flat[j] = old
            nflat[j] = (fp - fm) / (2 * eps)
        np.testing.assert_allclose(grads[i], num, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")


# --------------------------------------------------------------------------------------------
# Finite differences (no torch needed)

CONV_CASES = [
    # (N, C, H, W, O, k, stride, padding, dilation, groups, bias)
    (2, 2, 6, 5, 3, 3, 1, 0, 1, 1, True),
    (1, 2, 7, 7, 2, 3, 2, 1, 1, 1, True),
    (2, 4, 6, 6, 4, (2, 3), (1, 2), (1, 0), (2, 1), 2, False),
    (1, 1, 5, 6, 2, 4, 1, "same", 1, 1, True),
    (1, 3, 5, 5, 3, 3, 1, "valid", 1, 3, True),
]


@pytest.fixture(params=["whole", "banded"])
def conv_bands(request, monkeypatch):
    """conv2d on the CPU builds a big im2col matrix band by band (K.BAND_BYTES); "banded"
    forces one output row per band and one input channel per input-gradient chunk."""
    monkeypatch.setattr(K, "BAND_BYTES", 1 if request.param == "banded" else 1 << 40)
    return request.param


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_finite_differences(case, conv_bands):
    N, C, H, W, O, k, s, p, d, g, bias = case
    kk = (k, k) if isinstance(k, int) else k
    x = RNG.standard_normal((N, C, H, W))
    w = RNG.standard_normal((O, C // g, *kk))
    arrays = [x, w] + ([RNG.standard_normal(O)] if bias else [])

    def fn(*t):
        return F.conv2d(t[0], t[1], t[2] if bias else None, s, p, d, g)

    _fd_check(fn, arrays, range(len(arrays)))


def _conv2d_values_and_grads(x, w, b, geometry, gout=None):
    """conv2d forward and backward: ([out, dx, dw, (db)], the output gradient used), drawing
    that gradient from RNG when ``gout`` is None (so repeated runs can share it)."""
    ts = [mt.tensor(a, requires_grad=True) for a in (x, w, b) if a is not None]
    out = F.conv2d(ts[0], ts[1], ts[2] if b is not None else None, *geometry)
    if gout is None:
        gout = RNG.standard_normal(out.shape)
    out.backward(mt.tensor(gout))
    return [out.detach().numpy()] + [t.grad.numpy() for t in ts], gout


@pytest.mark.parametrize("case", CONV_CASES + [(3, 3, 11, 9, 5, 5, 1, 2, 1, 1, True),
                                             (2, 6, 12, 12, 4, 3, 2, 0, 2, 1, False)])
@pytest.mark.parametrize("band_bytes", [1, 40000, 300000])
def test_conv2d_bands_equal_the_whole_matrix(case, band_bytes, monkeypatch):
    """Built band by band (several band and chunk sizes, last band short), conv2d gives the
    values and gradients of the one-matrix computation, in float64 to rounding."""
    N, C, H, W, O, k, s, p, d, g, bias = case
    kk = (k, k) if isinstance(k, int) else k
    x = RNG.standard_normal((N, C, H, W))
    w = RNG.standard_normal((O, C // g, *kk))
    b = RNG.standard_normal(O) if bias else None
    gout = None
    results = []
    for limit in (1 << 40, band_bytes):
        monkeypatch.setattr(K, "BAND_BYTES", limit)
        got, gout = _conv2d_values_and_grads(x, w, b, (s, p, d, g), gout)
        results.append(got)
    for whole, banded, name in zip(*results, ["out", "dx", "dw", "db"]):
        np.testing.assert_allclose(banded, whole, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("case", [(8, 3, 12, 12, 5, 3, 1, 1, 1, 1, True),
                                  (16, 2, 10, 9, 3, 3, 1, 0, 1, 1, False),
                                  (8, 4, 11, 11, 4, 3, 2, 1, 1, 2, True)])
@pytest.mark.parametrize("band_bytes", [60000, 1 << 40])
def test_conv2d_blocked_products_equal_single_calls(case, band_bytes, monkeypatch):
    """Thin products cut into column blocks (K.SMALL_GEMM) give, in float64 to rounding, what
    one BLAS call per band gives; and the NumPy col2im input gradient what the full-grid one
    (CuPy's method) gives."""
    N, C, H, W, O, k, s, p, d, g, bias = case
    x = RNG.standard_normal((N, C, H, W))
    w = RNG.standard_normal((O, C // g, k, k))
    b = RNG.standard_normal(O) if bias else None
    gout = None
    results = []
    monkeypatch.setattr(K, "BAND_BYTES", band_bytes)
    for blocked in (False, True):
        K._block_width.cache_clear()  # its answers depend on SMALL_GEMM
        if blocked:
            monkeypatch.setattr(K, "SMALL_GEMM", 1)  # blocks of 65..128 columns
        else:
            monkeypatch.setattr(K, "_block_width", lambda width, mk: width)
        got, gout = _conv2d_values_and_grads(x, w, b, (s, p, d, g), gout)
        results.append(got)
        monkeypatch.undo()
        monkeypatch.setattr(K, "BAND_BYTES", band_bytes)
    K._block_width.cache_clear()
    for single, blocks, name in zip(*results, ["out", "dx", "dw", "db"]):
        np.testing.assert_allclose(blocks, single, rtol=1e-12, atol=1e-12, err_msg=name)
    geom = K.ConvGeom(x.shape, w.shape, (s, s), (p, p, p, p), (d, d), g)
    gc = np.ascontiguousarray(gout.transpose(1, 2, 3, 0))
    wmat = w.reshape(g, O // g, -1)
    np.testing.assert_allclose(K._input_grad_col2im(gc, wmat, geom),
                               K._input_grad_full_grid(gc, wmat, geom), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("args", [
    dict(kernel_size=2), dict(kernel_size=2, ceil_mode=True), dict(kernel_size=3, stride=2,
                                                                   padding=1),
    dict(kernel_size=(2, 3), stride=(1, 2), dilation=(2, 1)),
])
def test_max_pool2d_finite_differences(args):
    # A permutation: no ties, so the maximum is differentiable everywhere.
    x = RNG.permutation(2 * 2 * 7 * 7).reshape(2, 2, 7, 7).astype(np.float64) / 10
    _fd_check(lambda t: F.max_pool2d(t, **args), [x], [0], eps=1e-4)


@pytest.mark.parametrize("args", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1,
                                                            ceil_mode=True,
                                                            count_include_pad=False)])
def test_avg_pool2d_finite_differences(args):
    x = RNG.standard_normal((2, 2, 7, 6))
    _fd_check(lambda t: F.avg_pool2d(t, **args), [x], [0])


def test_linear_finite_differences():
    x, w, b = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((5, 4)), RNG.standard_normal(5)
    _fd_check(F.linear, [x, w, b], [0, 1, 2])
    _fd_check(lambda a, c: F.linear(a, c), [x, w], [0, 1])


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_family_finite_differences(dim):
    x = RNG.standard_normal((3, 4, 2))
    _fd_check(lambda t: F.log_softmax(t, dim), [x], [0])
    _fd_check(lambda t: F.softmax(t, dim), [x], [0])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_finite_differences(reduction):
    x = RNG.standard_normal((5, 4))
    t = np.array([0, 3, 1, -100, 2])
    w = RNG.uniform(0.5, 2.0, 4)
    lp = x - np.log(np.exp(x).sum(1, keepdims=True))
    _fd_check(lambda a: F.nll_loss(a, mt.tensor(t), mt.tensor(w), reduction=reduction),
              [lp], [0])
    _fd_check(lambda a: F.cross_entropy(a, mt.tensor(t), mt.tensor(w), reduction=reduction,
                                        label_smoothing=0.2), [x], [0])
    probs = RNG.dirichlet(np.ones(4), 5)
    _fd_check(lambda a: F.cross_entropy(a, mt.tensor(probs), reduction=reduction), [x], [0])
    y = RNG.standard_normal((5, 4))
    _fd_check(lambda a, b: F.mse_loss(a, b, reduction=reduction), [x, y], [0, 1])


def test_dropout_finite_differences_with_fixed_mask():
    x = RNG.standard_normal((4, 5))
    _fd_check(lambda t: F.dropout(t, 0.4), [x], [0], before=lambda: mt.manual_seed(7))


def test_relu_and_flatten_finite_differences():
    x = RNG.standard_normal((2, 3, 4))
    x[np.abs(x) < 1e-3] = 0.5  # keep away from the kink
    _fd_check(lambda t: F.relu(t), [x], [0])
    _fd_check(lambda t: F.flatten(t, 1), [x], [0])
    _fd_check(lambda t: F.flatten(t, 0, 1), [x], [0])


# --------------------------------------------------------------------------------------------
# Behaviour (no torch needed)


def test_conv2d_skips_unneeded_input_gradient():
    x = mt.tensor(RNG.standard_normal((2, 1, 6, 6)))
    w = _t(RNG.standard_normal((3, 1, 3, 3)))
    out = F.conv2d(x, w)
    out.backward(mt.ones(*out.shape, dtype=out.dtype))
    assert x.grad is None and w.grad is not None


def test_conv2d_output_is_nchw_to_the_user():
    x = RNG.standard_normal((2, 3, 6, 5)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    out = F.conv2d(mt.tensor(x), mt.tensor(w), padding=1)
    ref = _conv_ref(x.astype(np.float64), w.astype(np.float64), 1)
    np.testing.assert_allclose(_np(out), ref, rtol=1e-4, atol=1e-4)
    # reshape / flatten / indexing / contiguous see NCHW order whatever the memory layout
    np.testing.assert_allclose(_np(F.flatten(out, 1)), ref.reshape(2, -1), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_np(out.reshape(2, -1)), ref.reshape(2, -1), rtol=1e-4,
                               atol=1e-4)
    np.testing.assert_allclose(_np(out[1, 2]), ref[1, 2], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_np(out.contiguous().view(2, -1)), ref.reshape(2, -1),
                               rtol=1e-4, atol=1e-4)
    assert _np(out).dtype == np.float32
    pooled = F.max_pool2d(F.relu(out), 2)
    assert _np(pooled).flags.c_contiguous  # so .view(N, -1) works after pooling
    np.testing.assert_allclose(_np(pooled.view(2, -1)),
                               np.maximum(ref, 0)[:, :, :6, :4].reshape(2, 4, 3, 2, 2, 2)
                               .max(axis=(3, 5)).reshape(2, -1), rtol=1e-4, atol=1e-4)


def _conv_ref(x, w, pad):
    """Direct (slow) cross-correlation for reference values."""
    N, C, H, W = x.shape
    O, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = H + 2 * pad - kh + 1, W + 2 * pad - kw + 1
    out = np.zeros((N, O, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + oh, j:j + ow], w[:, :, i, j])
    return out


def test_conv2d_unbatched_and_raw_arrays():
    x = RNG.standard_normal((2, 5, 5))
    w = RNG.standard_normal((3, 2, 3, 3))
    out = F.conv2d(x, w)  # raw arrays are accepted
    assert isinstance(out, mt.Tensor) and tuple(out.shape) == (3, 3, 3)
    np.testing.assert_allclose(_np(out), _conv_ref(x[None], w, 0)[0], rtol=1e-12)


def test_max_pool2d_ties_go_to_the_first_maximum():
    x = np.zeros((1, 1, 4, 4))
    x[0, 0, :2, :2] = [[1, 1], [1, 1]]
    x[0, 0, :2, 2:] = [[0, 2], [2, 2]]
    x[0, 0, 2:, :2] = [[0, 0], [3, 3]]
    out, grads, _ = _grads(lambda t: F.max_pool2d(t, 2), [x], g=np.ones((1, 1, 2, 2)))
    expect = np.zeros((4, 4))
    expect[0, 0] = expect[0, 3] = expect[3, 0] = expect[2, 2] = 1
    np.testing.assert_array_equal(grads[0][0, 0], expect)
    out, grads, _ = _grads(lambda t: F.max_pool2d(t, 3, 1, 1), [x],
                           g=np.ones((1, 1, 4, 4)))
    assert grads[0].sum() == 16


def test_max_pool2d_keeps_dtype_and_handles_odd_sizes():
    x = RNG.standard_normal((2, 3, 9, 7)).astype(np.float32)
    out = F.max_pool2d(mt.tensor(x), 2)
    assert _np(out).dtype == np.float32 and tuple(out.shape) == (2, 3, 4, 3)
    ref = x[:, :, :8, :6].reshape(2, 3, 4, 2, 3, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(_np(out), ref)


def test_dropout_reproducible_and_scaled():
    x = mt.ones(1000, 10)
    mt.manual_seed(3)
    a = _np(F.dropout(x, 0.3))
    mt.manual_seed(3)
    b = _np(F.dropout(x, 0.3))
    np.testing.assert_array_equal(a, b)
    kept = a != 0
    assert 0.66 < kept.mean() < 0.74
    np.testing.assert_allclose(a[kept], 1 / 0.7, rtol=1e-6)
    assert F.dropout(x, 0.3, training=False) is x
    assert float(F.dropout(x, 1.0).sum()) == 0.0
    xt = _t(np.ones((50, 4)))
    mt.manual_seed(5)
    out = F.dropout(xt, 0.5)
    out.backward(mt.ones(50, 4, dtype=mt.float64))
    np.testing.assert_array_equal(_np(xt.grad), _np(out))


def test_relu_inplace():
    t = mt.tensor([-1.0, 0.5, -2.0])
    r = F.relu(t, inplace=True)
    assert r is t
    np.testing.assert_array_equal(_np(t), [0.0, 0.5, 0.0])
    leaf = _t(np.array([-1.0, 2.0]))
    with pytest.raises(RuntimeError, match="in-place"):
        F.relu(leaf, inplace=True)
    # in place on a non-leaf keeps the gradient right
    leaf = _t(np.array([-1.0, 2.0, 3.0]))
    w = _t(np.array([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 1.0]]))
    h = F.linear(leaf, w)
    F.relu_(h)
    h.backward(mt.tensor([1.0, 1.0, 1.0]))
    np.testing.assert_array_equal(_np(leaf.grad), [0.0, 0.0, 1.0])


def test_relu_keeps_layout():
    x = np.ascontiguousarray(RNG.standard_normal((3, 2, 4, 4))).transpose(1, 0, 2, 3)
    out = F.relu(x)
    assert _np(out).strides == x.strides
    np.testing.assert_array_equal(_np(out), np.maximum(x, 0))


def test_workspace_recycles_only_free_buffers():
    a = K.empty(np, (512, 512), np.float32)
    b = K.empty(np, (512, 512), np.float32)
    assert not np.shares_memory(a, b)
    ptr = a.ctypes.data
    del a
    c = K.empty(np, (512, 512), np.float32)
    assert c.ctypes.data == ptr and not np.shares_memory(b, c)
    v = c[3:]
    del c
    d = K.empty(np, (512, 512), np.float32)
    assert not np.shares_memory(v, d)
    # bounded: many live arrays of new sizes never grow the cache past its limits
    live = [K.empty(np, (300 + i, 300), np.float32) for i in range(W._Workspace.MAX_BUFFERS + 5)]
    bufs = W._workspace._bufs
    assert len(bufs) <= W._Workspace.MAX_BUFFERS
    assert sum(b.nbytes for b in bufs) <= W._Workspace.MAX_BYTES
    assert len({a.ctypes.data for a in live}) == len(live)


def test_full_lenet_step_gradients_do_not_depend_on_layout():
    # conv -> relu -> pool twice, flatten, linear, log_softmax, nll: compare with a slow
    # reference that uses only the direct convolution and NumPy.
    x = RNG.standard_normal((3, 1, 12, 12))
    w1, b1 = RNG.standard_normal((4, 1, 5, 5)) * 0.3, RNG.standard_normal(4)
    w2, b2 = RNG.standard_normal((5, 4, 3, 3)) * 0.3, RNG.standard_normal(5)
    fw = RNG.standard_normal((3, 20)) * 0.3
    y = np.array([0, 2, 1])

    def net(xx, a, ab, c, cb, f):
        h = F.max_pool2d(F.relu(F.conv2d(xx, a, ab, padding=2)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, c, cb)), 2)
        return F.nll_loss(F.log_softmax(F.linear(F.flatten(h, 1), f), 1), mt.tensor(y))

    _fd_check(net, [x, w1, b1, w2, b2, fw], [1, 2, 3, 4, 5], eps=1e-6, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Error messages


def test_conv2d_errors():
    x = mt.zeros(2, 3, 8, 8)
    w = mt.zeros(4, 3, 3, 3)
    with pytest.raises(RuntimeError, match="3D .*or 4D"):
        F.conv2d(mt.zeros(8, 8), w)
    with pytest.raises(RuntimeError, match="to have 1 channels, but got 3"):
        F.conv2d(x, mt.zeros(4, 1, 3, 3))
    with pytest.raises(RuntimeError, match="divisible by groups"):
        F.conv2d(x, mt.zeros(4, 1, 3, 3), groups=3)
    with pytest.raises(RuntimeError, match="bias must have shape"):
        F.conv2d(x, w, mt.zeros(3))
    with pytest.raises(RuntimeError, match="should be the same"):
        F.conv2d(x, mt.zeros(4, 3, 3, 3, dtype=mt.float64))
    with pytest.raises(RuntimeError, match="Kernel size can't be greater"):
        F.conv2d(mt.zeros(1, 3, 2, 2), w)
    with pytest.raises(ValueError, match="strided"):
        F.conv2d(x, w, padding="same", stride=2)
    with pytest.raises(ValueError, match="invalid padding string"):
        F.conv2d(x, w, padding="full")
    with pytest.raises(ValueError, match="padding must be >= 0"):
        F.conv2d(x, w, padding=-1)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        F.conv2d(x, w, stride=0)
    with pytest.raises(RuntimeError, match="floating point"):
        F.conv2d(mt.zeros(2, 3, 8, 8, dtype=mt.int64), mt.zeros(4, 3, 3, 3, dtype=mt.int64))
    with pytest.raises(TypeError, match="must be a Tensor"):
        F.conv2d([[1.0]], w)


def test_pool_and_loss_errors():
    with pytest.raises(RuntimeError, match="at most half"):
        F.max_pool2d(mt.zeros(1, 1, 4, 4), 2, padding=2)
    with pytest.raises(RuntimeError, match="3D or 4D"):
        F.max_pool2d(mt.zeros(4, 4), 2)
    with pytest.raises(RuntimeError, match="too small"):
        F.max_pool2d(mt.zeros(1, 1, 1, 1), 2)
    x = mt.zeros(3, 4)
    with pytest.raises(RuntimeError, match="integer dtype"):
        F.nll_loss(x, mt.zeros(3))
    with pytest.raises(IndexError, match="Target 4 is out of bounds"):
        F.nll_loss(x, mt.tensor([0, 4, 1]))
    with pytest.raises(IndexError, match="Target -1 is out of bounds"):
        F.cross_entropy(x, mt.tensor([0, -1, 1]))
    with pytest.raises(ValueError, match="batch_size"):
        F.cross_entropy(x, mt.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="weight tensor should be defined"):
        F.nll_loss(x, mt.tensor([0, 1, 2]), weight=mt.ones(3))
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        F.mse_loss(x, x, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(x, mt.tensor([0, 1, 2]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(x, 1.5)
    with pytest.raises(IndexError, match="Dimension out of range"):
        F.log_softmax(x, 2)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        F.linear(x, mt.zeros(2, 5))
    with pytest.raises(RuntimeError, match="must match the size"):
        F.mse_loss(x, mt.zeros(2, 4))


def test_ignore_index_everything_ignored_gives_nan_mean():
    out = F.nll_loss(mt.zeros(2, 3), mt.tensor([-100, -100]))
    assert np.isnan(float(out))


# --------------------------------------------------------------------------------------------
# Parity with PyTorch


def _torch():
    return pytest.importorskip("torch")


def _parity(mt_fn, th_fn, arrays, dtype, rtol, atol, grad_idx=None):
    """Same forward values and input gradients in mpitensor and torch."""
    torch = _torch()
    arrays = [a.astype(dtype) if a.dtype.kind == "f" else a for a in arrays]
    out, grads, g = _grads(mt_fn, arrays)
    tts = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    tout = th_fn(*tts)
    tout.backward(torch.tensor(g))
    np.testing.assert_allclose(out, tout.detach().numpy(), rtol=rtol, atol=atol)
    assert out.dtype == tout.detach().numpy().dtype
    for i, (gm, tt) in enumerate(zip(grads, tts)):
        if grad_idx is not None and i not in grad_idx:
            continue
        if tt.grad is None:
            continue
        np.testing.assert_allclose(gm, tt.grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"grad {i}")


TOL = {np.float32: (2e-4, 2e-4), np.float64: (1e-10, 1e-10)}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CONV_CASES + [
    (8, 1, 28, 28, 6, 5, 1, 2, 1, 1, True),      # LeNet conv1
    (8, 6, 14, 14, 16, 5, 1, 0, 1, 1, True),     # LeNet conv2
    (3, 3, 11, 9, 5, 3, (2, 3), (2, 1), 1, 1, True),
    (2, 6, 9, 9, 6, 3, 1, 1, 1, 6, False),       # depthwise
    (2, 2, 8, 7, 4, 2, 1, "same", (2, 1), 2, True),
])
def test_conv2d_matches_torch(case, dtype):
    torch = _torch()
    N, C, H, W, O, k, s, p, d, g, bias = case
    kk = (k, k) if isinstance(k, int) else k
    arrays = [RNG.standard_normal((N, C, H, W)), RNG.standard_normal((O, C // g, *kk))]
    if bias:
        arrays.append(RNG.standard_normal(O))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _parity(lambda *t: F.conv2d(t[0], t[1], t[2] if bias else None, s, p, d, g),
                lambda *t: torch.nn.functional.conv2d(t[0], t[1], t[2] if bias else None, s, p,
                                                      d, g),
                arrays, dtype, *TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,args", [
    ((4, 6, 28, 28), dict(kernel_size=2)),
    ((2, 3, 9, 7), dict(kernel_size=2)),
    ((2, 3, 9, 7), dict(kernel_size=2, ceil_mode=True)),
    ((2, 3, 10, 11), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((2, 2, 11, 9), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), dilation=(1, 2))),
    ((1, 2, 8, 8), dict(kernel_size=3, stride=1)),
    ((2, 8, 8), dict(kernel_size=2, stride=1)),
])
def test_max_pool2d_matches_torch_with_ties(shape, args, dtype):
    torch = _torch()
    x = RNG.integers(0, 3, shape).astype(np.float64)  # many ties
    # Overlapping windows sum several gradients into one input: allow rounding differences.
    tol = 1e-6 if dtype == np.float32 else 1e-13
    _parity(lambda t: F.max_pool2d(t, **args), lambda t: torch.nn.functional.max_pool2d(t, **args),
            [x], dtype, tol, tol)
    out, idx = F.max_pool2d(mt.tensor(x), return_indices=True, **args)
    tout, tidx = torch.nn.functional.max_pool2d(torch.tensor(x), return_indices=True, **args)
    np.testing.assert_array_equal(_np(idx), tidx.numpy())
    assert _np(idx).dtype == np.int64


@pytest.mark.parametrize("args", [
    dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(2, 3), stride=1, divisor_override=4),
])
def test_avg_pool2d_matches_torch(args):
    torch = _torch()
    x = RNG.standard_normal((2, 3, 9, 8))
    for dt in (np.float32, np.float64):
        _parity(lambda t: F.avg_pool2d(t, **args),
                lambda t: torch.nn.functional.avg_pool2d(t, **args), [x], dt, *TOL[dt])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_relu_softmax_match_torch(dtype):
    torch = _torch()
    TF = torch.nn.functional
    x, w, b = RNG.standard_normal((2, 3, 7)), RNG.standard_normal((5, 7)), RNG.standard_normal(5)
    _parity(F.linear, TF.linear, [x, w, b], dtype, *TOL[dtype])
    _parity(lambda a: F.relu(a), TF.relu, [x], dtype, *TOL[dtype])
    for dim in (0, 1, 2, -1):
        _parity(lambda a, d=dim: F.log_softmax(a, d), lambda a, d=dim: TF.log_softmax(a, d), [x],
                dtype, *TOL[dtype])
        _parity(lambda a, d=dim: F.softmax(a, d), lambda a, d=dim: TF.softmax(a, d), [x], dtype,
                *TOL[dtype])
    big = np.array([[1000.0, 0.0, -1000.0]])
    _parity(lambda a: F.log_softmax(a, 1), lambda a: TF.log_softmax(a, 1), [big], dtype,
            *TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_and_cross_entropy_match_torch(dtype, reduction, weighted):
    torch = _torch()
    TF = torch.nn.functional
    C = 5
    w = RNG.uniform(0.2, 2.0, C).astype(dtype) if weighted else None

    def wt(mod):
        return None if w is None else mod.tensor(w)

    for xshape, tshape in [((6, C), (6,)), ((3, C, 4, 2), (3, 4, 2)), ((C,), ())]:
        x = RNG.standard_normal(xshape)
        t = RNG.integers(0, C, tshape)
        for ii in (-100, 2):
            t = t.copy()
            if t.ndim:
                t.reshape(-1)[::3] = ii  # some ignored targets
            _parity(lambda a, t=t, ii=ii: F.nll_loss(a, mt.tensor(t), wt(mt), ignore_index=ii,
                                                     reduction=reduction),
                    lambda a, t=t, ii=ii: TF.nll_loss(a, torch.tensor(t), wt(torch),
                                                      ignore_index=ii, reduction=reduction),
                    [x], dtype, *TOL[dtype])
            for ls in (0.0, 0.3):
                kw = dict(ignore_index=ii, reduction=reduction, label_smoothing=ls)
                _parity(lambda a, t=t, kw=kw: F.cross_entropy(a, mt.tensor(t), wt(mt), **kw),
                        lambda a, t=t, kw=kw: TF.cross_entropy(a, torch.tensor(t), wt(torch),
                                                               **kw),
                        [x], dtype, *TOL[dtype])
        probs = RNG.dirichlet(np.ones(C), int(np.prod(tshape)) or 1).reshape(*tshape, C)
        probs = np.moveaxis(probs, -1, 1) if len(xshape) > 2 else probs.reshape(xshape)
        probs = probs.astype(dtype)
        for ls in (0.0, 0.25):
            kw = dict(reduction=reduction, label_smoothing=ls)
            _parity(lambda a, p=probs, kw=kw: F.cross_entropy(a, mt.tensor(p), wt(mt), **kw),
                    lambda a, p=probs, kw=kw: TF.cross_entropy(a, torch.tensor(p), wt(torch),
                                                               **kw),
                    [x], dtype, *TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_matches_torch(dtype, reduction):
    torch = _torch()
    x, y = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    _parity(lambda a, b: F.mse_loss(a, b, reduction=reduction),
            lambda a, b: torch.nn.functional.mse_loss(a, b, reduction=reduction), [x, y], dtype,
            *TOL[dtype])
    yb = RNG.standard_normal((3,))
    with pytest.warns(UserWarning, match="target size"):
        _parity(lambda a, b: F.mse_loss(a, b, reduction=reduction),
                lambda a, b: torch.nn.functional.mse_loss(a, b, reduction=reduction), [x, yb],
                dtype, *TOL[dtype])


def test_lenet_forward_backward_matches_torch():
    torch = _torch()
    TF = torch.nn.functional
    shapes = [(6, 1, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 400), (120,), (84, 120), (84,),
              (10, 84), (10,)]
    params = [RNG.standard_normal(s).astype(np.float32) * 0.2 for s in shapes]
    x = RNG.standard_normal((16, 1, 28, 28)).astype(np.float32)
    y = RNG.integers(0, 10, 16)

    def net(Fm, flat, xx, p, target):
        h = Fm.max_pool2d(Fm.relu(Fm.conv2d(xx, p[0], p[1], padding=2)), 2)
        h = Fm.max_pool2d(Fm.relu(Fm.conv2d(h, p[2], p[3])), 2)
        h = flat(h, 1)
        h = Fm.relu(Fm.linear(h, p[4], p[5]))
        h = Fm.relu(Fm.linear(h, p[6], p[7]))
        return Fm.cross_entropy(Fm.linear(h, p[8], p[9]), target)

    pm = [_t(a) for a in params]
    loss = net(F, F.flatten, mt.tensor(x), pm, mt.tensor(y))
    loss.backward()
    pt = [torch.tensor(a, requires_grad=True) for a in params]
    tloss = net(TF, torch.flatten, torch.tensor(x), pt, torch.tensor(y))
    tloss.backward()
    np.testing.assert_allclose(float(loss), float(tloss.detach()), rtol=1e-5)
    for a, b in zip(pm, pt):
        np.testing.assert_allclose(_np(a.grad), b.grad.numpy(), rtol=2e-4, atol=2e-5)


# --------------------------------------------------------------------------------------------
# GPU (CuPy): the same kernels, the same results


def _cpu_gpu_grads(fn, arrays):
    """Values and gradients of ``sum(fn(*x) * G)`` on the CPU and on the GPU (float64)."""
    from mpitensor import backend

    g = None
    res = []
    for device in ("cpu", "cuda"):
        leaves = [mt.tensor(a, device=device, requires_grad=True) for a in arrays]
        out = fn(*leaves)
        if g is None:
            g = np.random.default_rng(3).standard_normal(tuple(out.shape))
        out.backward(mt.tensor(g, device=device))
        assert out.is_cuda == (device == "cuda")
        res.append((backend.to_numpy(out._data),
                    [backend.to_numpy(t.grad._data) for t in leaves]))
    return res


GPU_CASES = {
    "conv_lenet1": (lambda x, w, b: F.conv2d(x, w, b, padding=2),
                    [(4, 1, 12, 12), (6, 1, 5, 5), (6,)]),
    "conv_strided_groups": (lambda x, w: F.conv2d(x, w, None, 2, 1, (2, 1), 2),
                            [(2, 4, 9, 8), (4, 2, 3, 3)]),
    "relu_pool2x2": (lambda x: F.max_pool2d(F.relu(x), 2), [(2, 3, 9, 8)]),
    "pool_generic": (lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True), [(2, 3, 9, 8)]),
    "avg_pool": (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [(2, 3, 9, 8)]),
    "linear_logsoftmax": (lambda x, w: F.log_softmax(F.linear(x, w), 1), [(5, 7), (4, 7)]),
    "softmax": (lambda x: F.softmax(x, 0), [(5, 7)]),
    "cross_entropy": (lambda x: F.cross_entropy(x, mt.tensor([1, 0, 3, -100, 2], device=x.device),
                                                label_smoothing=0.1), [(5, 4)]),
    "nll": (lambda x: F.nll_loss(x, mt.tensor([1, 0, 3, 2, 2], device=x.device),
                                 reduction="sum"), [(5, 4)]),
    "mse": (lambda x, y: F.mse_loss(x, y), [(5, 4), (5, 4)]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_gpu_matches_cpu(name):
    fn, shapes = GPU_CASES[name]
    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal(s) for s in shapes]
    (cv, cg), (gv, gg) = _cpu_gpu_grads(fn, arrays)
    np.testing.assert_allclose(gv, cv, rtol=1e-10, atol=1e-12)
    for a, b in zip(cg, gg):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
def test_gpu_dropout_uses_the_seeded_cupy_state():
    x = mt.ones(64, 32, device="cuda")
    mt.manual_seed(9)
    a = F.dropout(x, 0.25)
    mt.manual_seed(9)
    b = F.dropout(x, 0.25)
    assert a.is_cuda
    np.testing.assert_array_equal(a.cpu()._data, b.cpu()._data)
    kept = (a.cpu()._data != 0).mean()
    assert 0.65 < kept < 0.85


def test_band_bytes_from_the_environment(monkeypatch):
    """MPITENSOR_CONV_BAND_BYTES is parsed by _config (a malformed value raises, as every
    switch read at import does; it used to warn and use the default)."""
    monkeypatch.setenv("MPITENSOR_CONV_BAND_BYTES", "65536")
    assert _config.conv_band_bytes() == 65536
    for bad in ("abc", "0", "-5"):
        monkeypatch.setenv("MPITENSOR_CONV_BAND_BYTES", bad)
        with pytest.raises(ValueError, match="MPITENSOR_CONV_BAND_BYTES="):
            _config.conv_band_bytes()
    monkeypatch.delenv("MPITENSOR_CONV_BAND_BYTES")
    assert _config.conv_band_bytes() == 1 << 20


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(4, 3), (3,)])
def test_every_target_ignored_mean_loss_is_nan_with_zero_gradient(shape, weighted):
    """As torch: the mean over no counted target is 0/0 = nan, but no row gets a gradient."""
    x = RNG.standard_normal(shape)
    t = np.full(shape[:-1], 1)
    w = mt.tensor([1.0, 0.5, 2.0]) if weighted else None
    cases = [(F.nll_loss, {}), (F.cross_entropy, {}), (F.cross_entropy, {"label_smoothing": 0.3})]
    for fn, kw in cases:
        a = mt.tensor(x, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no 0/0 warnings either
            loss = fn(a, mt.tensor(t), w, ignore_index=1, **kw)
            loss.backward()
        assert np.isnan(loss.item()), (fn.__name__, kw)
        np.testing.assert_array_equal(a.grad.numpy(), np.zeros(shape), err_msg=fn.__name__)


# --------------------------------------------------------------------------------------------
# conv2d by Winograd F(2x2, 3x3), and conv2d's work shared out over threads (_parallel.run_split)

def _rel_err(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(np.abs(b).max(), 1e-300))


WINOGRAD_CASES = [
    # (N, C, H, W, O, padding, bias)
    (2, 3, 6, 6, 4, 1, False),
    (2, 3, 7, 5, 4, 1, True),        # odd sizes: the last tiles are cut
    (3, 5, 9, 8, 2, 0, True),        # "valid"
    (2, 4, 5, 6, 3, 2, False),       # padding 2
    (1, 2, 4, 4, 3, (0, 1), False),  # different paddings per side
    (1, 2, 1, 2, 2, 1, True),        # a one-row input
]


@pytest.fixture
def winograd_everywhere(monkeypatch):
    """Winograd for any channel count (it is only taken from WINOGRAD_MIN_CHANNELS on)."""
    monkeypatch.setattr(K, "WINOGRAD_MIN_CHANNELS", 1)
    calls = []
    real = K.winograd_forward
    monkeypatch.setattr(K, "winograd_forward", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-10)])
@pytest.mark.parametrize("case", WINOGRAD_CASES)
def test_conv2d_winograd_matches_torch(case, dtype, tol, winograd_everywhere):
    """3x3 stride-1 conv2d by Winograd: values and all three gradients as torch's, to a
    relative error (of the largest entry) of 1e-5 in float32 and 1e-10 in float64."""
    torch = _torch()
    N, C, H, W, O, p, bias = case
    x = RNG.standard_normal((N, C, H, W)).astype(dtype)
    w = RNG.standard_normal((O, C, 3, 3)).astype(dtype)
    b = RNG.standard_normal(O).astype(dtype) if bias else None
    got, gout = _conv2d_values_and_grads(x, w, b, (1, p, 1, 1))
    assert winograd_everywhere, "the Winograd path was not taken"
    ts = [torch.tensor(a, requires_grad=True) for a in (x, w, b) if a is not None]
    tout = torch.nn.functional.conv2d(ts[0], ts[1], ts[2] if bias else None, 1, p)
    tout.backward(torch.tensor(gout.astype(dtype)))
    want = [tout.detach().numpy()] + [t.grad.numpy() for t in ts]
    for g_, w_, name in zip(got, want, ["out", "dx", "dw", "db"]):
        assert g_.dtype == dtype
        assert _rel_err(g_, w_) < tol, name


@pytest.mark.parametrize("case", WINOGRAD_CASES[:4])
def test_conv2d_winograd_finite_differences(case, winograd_everywhere):
    N, C, H, W, O, p, bias = case
    arrays = [RNG.standard_normal((N, C, H, W)), RNG.standard_normal((O, C, 3, 3))]
    if bias:
        arrays.append(RNG.standard_normal(O))
    _fd_check(lambda *t: F.conv2d(t[0], t[1], t[2] if bias else None, 1, p), arrays,
              range(len(arrays)))
    assert winograd_everywhere


def test_conv2d_winograd_taken_for_wide_layers_only():
    """Winograd for 3x3/stride 1/no dilation/one group with enough channels; else im2col."""
    def geom(C, O, k=3, s=1, d=1, groups=1):
        return K.ConvGeom((2, C, 8, 8), (O, C // groups, k, k), (s, s), (1, 1, 1, 1), (d, d),
                          groups)

    x = np.zeros((2, 64, 8, 8), np.float32)
    assert K.winograd_applies(x, geom(64, 64))
    assert not K.winograd_applies(x, geom(64, 32))          # too few output channels
    assert not K.winograd_applies(x, geom(64, 64, s=2))
    assert not K.winograd_applies(x, geom(64, 64, k=5))
    assert not K.winograd_applies(x, geom(64, 64, d=2))
    assert not K.winograd_applies(x, geom(64, 64, groups=2))
    assert not K.winograd_applies(x.astype(np.float16), geom(64, 64))


@pytest.mark.parametrize("case", [(4, 64, 8, 8, 64, 1, False), (3, 64, 7, 9, 80, 1, True),
                                  (2, 64, 6, 6, 64, 0, False)])
@pytest.mark.parametrize("threads,band_bytes", [(1, 1), (2, 1 << 40), (3, 1)])
def test_conv2d_winograd_bands_and_threads_agree(case, threads, band_bytes, monkeypatch):
    """Winograd in bands of tile rows and shared out over threads (float64): what one band on
    one thread gives, to rounding."""
    N, C, H, W, O, p, bias = case
    x, w = RNG.standard_normal((N, C, H, W)), RNG.standard_normal((O, C, 3, 3))
    b = RNG.standard_normal(O) if bias else None
    ref, gout = _conv2d_values_and_grads(x, w, b, (1, p, 1, 1))
    monkeypatch.setattr(K, "WINOGRAD_BAND_BYTES", band_bytes)
    monkeypatch.setattr(K, "WINOGRAD_BAND_COLUMNS", 1)
    monkeypatch.setattr(K, "blas_threads", lambda: threads)
    got, _ = _conv2d_values_and_grads(x, w, b, (1, p, 1, 1), gout)
    for r, g_, name in zip(ref, got, ["out", "dx", "dw", "db"]):
        np.testing.assert_allclose(g_, r, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("case", [(8, 4, 24, 24, 16, 3, 2, 1, 1, 1, True),  # 1152 columns
                                  (2, 4, 9, 9, 6, 1, 2, 0, 1, 1, False),    # 1x1, stride 2
                                  (2, 4, 10, 10, 6, 3, 1, 1, 1, 2, True)])  # groups: one share
@pytest.mark.parametrize("band_bytes", [1, 1 << 40])
def test_conv2d_threads_share_out_the_im2col_work(case, band_bytes, monkeypatch):
    """im2col conv2d with its bands, columns, input channels and output channels shared out
    over 3 threads (float64): what one thread gives, to rounding."""
    N, C, H, W, O, k, s, p, d, g, bias = case
    x, w = RNG.standard_normal((N, C, H, W)), RNG.standard_normal((O, C // g, k, k))
    b = RNG.standard_normal(O) if bias else None
    monkeypatch.setattr(K, "BAND_BYTES", band_bytes)
    ref, gout = _conv2d_values_and_grads(x, w, b, (s, p, d, g))
    monkeypatch.setattr(K, "blas_threads", lambda: 3)
    got, _ = _conv2d_values_and_grads(x, w, b, (s, p, d, g), gout)
    for r, g_, name in zip(ref, got, ["out", "dx", "dw", "db"]):
        np.testing.assert_allclose(g_, r, rtol=1e-12, atol=1e-12, err_msg=name)


def test_run_split_runs_every_part_and_raises_the_first_error():
    seen = []
    assert _parallel.run_split(lambda p: seen.append(p) or p * 2, [1, 2, 3]) == [2, 4, 6]
    assert sorted(seen) == [1, 2, 3]
    assert _parallel.run_split(lambda p: p, []) == []
    assert _parallel.split_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)]
    assert _parallel.split_ranges(2, 4) == [(0, 1), (1, 2)]

    def fail(p):
        if p == 2:
            raise ValueError("part 2")
        return p

    with pytest.raises(ValueError, match="part 2"):
        _parallel.run_split(fail, [1, 2, 3])
    assert _parallel.blas_threads() >= 1


def test_run_split_nested_and_concurrent_splits_run_their_parts_in_place():
    """A split started from inside a part, or by a second Python thread while one runs, runs
    its parts itself (the helpers are busy): every part runs once, nothing deadlocks."""
    import threading

    inner = []

    def outer(p):
        return sum(_parallel.run_split(lambda q: inner.append((p, q)) or q, [p, p + 10]))

    assert _parallel.run_split(outer, [1, 2, 3]) == [12, 14, 16]
    assert sorted(inner) == [(1, 1), (1, 11), (2, 2), (2, 12), (3, 3), (3, 13)]
    results = {}

    def user_thread(k):
        results[k] = [sum(_parallel.run_split(lambda s: sum(range(*s)),
                                              _parallel.split_ranges(1000, 2)))
                      for _ in range(200)]

    threads = [threading.Thread(target=user_thread, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {k: [499500] * 200 for k in range(3)}


def test_split_pass_covers_every_row_once_and_shares_only_big_passes(monkeypatch):
    monkeypatch.setattr(_parallel, "blas_threads", lambda: 2)
    calls = []
    _parallel.split_pass(calls.append, 10, _parallel.SPLIT_ELEMENTS)
    assert sorted(calls) == [(0, 5), (5, 10)]
    calls.clear()
    _parallel.split_pass(calls.append, 10, _parallel.SPLIT_ELEMENTS - 1)
    assert calls == [(0, 10)]
    calls.clear()
    _parallel.split_pass(calls.append, 1, 1 << 30)  # one row cannot be split
    assert calls == [(0, 1)]


def _relu_pool_values(x):
    """relu -> 2x2 max pool forward, and the input gradient for a fixed output gradient."""
    t = mt.Tensor(x.copy()).requires_grad_()
    h = F.relu(t * 1.0)
    out = F.max_pool2d(h, 2)
    gout = np.arange(out.numel(), dtype=x.dtype).reshape(tuple(out.shape)) % 7 - 3
    out.backward(mt.Tensor(gout))
    return h.detach().numpy().copy(), out.detach().numpy().copy(), t.grad.numpy().copy()


@pytest.mark.parametrize("shape", [(4, 6, 8, 8), (3, 5, 7, 9), (2, 1, 6, 6), (8, 3, 4, 2)])
@pytest.mark.parametrize("layout", ["nchw", "chwn"])
def test_relu_and_maxpool_shared_across_threads_give_the_one_thread_values(
        monkeypatch, shape, layout):
    """relu and 2x2 max pooling (both directions) split by channel or by flat range across 3
    threads give bit for bit what one pass gives: ties (many zeros after relu), odd sizes, a
    single channel, both memory layouts."""
    from mpitensor._ops import elementwise as E

    rng = np.random.default_rng(1)
    x = rng.integers(-3, 4, shape).astype(np.float32)  # small integers: many ties
    if layout == "chwn":
        x = np.ascontiguousarray(x.transpose(1, 2, 3, 0)).transpose(3, 0, 1, 2)
    ref = _relu_pool_values(x)
    monkeypatch.setattr(_parallel, "SPLIT_ELEMENTS", 1)
    monkeypatch.setattr(E, "SPLIT_ELEMENTS", 1)
    monkeypatch.setattr(_parallel, "blas_threads", lambda: 3)
    got = _relu_pool_values(x)
    for r, g_, name in zip(ref, got, ["relu", "pool", "grad"]):
        np.testing.assert_array_equal(g_, r, err_msg=name)
    # and against the definition
    h = np.maximum(x, 0)
    np.testing.assert_array_equal(got[0], h)
    oh, ow = shape[2] // 2, shape[3] // 2
    win = h[:, :, :2 * oh, :2 * ow].reshape(shape[0], shape[1], oh, 2, ow, 2)
    np.testing.assert_array_equal(got[1], win.max(axis=(3, 5)))


def test_one_thread_blocks_still_report_the_budget_to_splits():
    """Inside ``one_thread`` (small products on one BLAS thread) ``blas_threads`` reports the
    budget from before, so a layer's own split still uses it; outside it reports the live
    limit."""
    before = _parallel.blas_threads()
    with _parallel.one_thread(0):
        assert _parallel.blas_threads() == before
        with _parallel.one_thread(0):
            assert _parallel.blas_threads() == before
    assert _parallel.blas_threads() == before
    assert _parallel._lowered == []
