"""The compiled loops (``mpitensor/_cpu_kernels.c``) against the NumPy loops they stand for.

conv2d: both compute the same bands in the same order; the products come from the same BLAS, so the
two agree to rounding. The band budget is shrunk here so that small layers are cut into many
bands, including parts of a row, and every geometry the loops index (stride, dilation,
asymmetric padding, bias or none, float32 and float64) runs on one thread and split across two.
Where torch is installed it is the oracle of the forward and backward results as well.
2x2 max pooling: the same values, winners (ties, NaN) and gradients, bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn.functional as F
from mpitensor.nn import _kernels as K
from mpitensor.nn._kernels import native as _native

pytestmark = pytest.mark.skipif(
    _native.get(np.float32) is None,
    reason="mpitensor._cpu_kernels was not built (no C compiler at install) or no CBLAS "
           "gemm was found in NumPy's BLAS: conv2d uses its NumPy loops")


@pytest.fixture
def numpy_loops(monkeypatch):
    """A switch: inside ``with numpy_loops():`` conv2d takes its NumPy loops."""
    import contextlib

    @contextlib.contextmanager
    def use() -> object:
        saved = dict(_native._state)
        _native._state.clear()
        _native._state.update(loaded=True, module=None, by_size={})
        try:
            yield
        finally:
            _native._state.clear()
            _native._state.update(saved)

    return use


GEOMETRIES = [
    # (N, C, H, W, O, k, stride, padding, dilation)
    (4, 1, 12, 12, 6, (5, 5), (1, 1), (2, 2), (1, 1)),
    (3, 6, 9, 11, 16, (5, 5), (1, 1), (0, 0), (1, 1)),
    (2, 3, 13, 10, 5, (3, 3), (2, 2), (1, 1), (1, 1)),
    (2, 4, 12, 12, 3, (3, 2), (1, 2), (2, 0), (2, 1)),
    (5, 2, 7, 16, 4, (1, 3), (3, 1), (0, 1), (1, 3)),
]


def _run(x0, w0, b0, stride, padding, dilation, threads):
    mt.set_num_threads(threads)
    x = mt.tensor(x0, requires_grad=True)
    w = mt.tensor(w0, requires_grad=True)
    b = mt.tensor(b0, requires_grad=True) if b0 is not None else None
    y = F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation)
    gy = np.random.default_rng(1).standard_normal(y.shape).astype(x0.dtype)
    y.backward(mt.tensor(gy))
    return (y.detach().numpy().copy(), x.grad.numpy().copy(), w.grad.numpy().copy(),
            None if b is None else b.grad.numpy().copy(), gy)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("geom", GEOMETRIES)
@pytest.mark.parametrize("band_bytes", [1 << 9, 1 << 12])
def test_compiled_loops_agree_with_numpy_loops(monkeypatch, numpy_loops, geom, bias, dtype,
                                               band_bytes):
    N, C, H, W, O, k, stride, padding, dilation = geom
    monkeypatch.setattr(K, "BAND_BYTES", band_bytes)
    monkeypatch.setattr(K, "BAND_COLUMNS", 64)
    import mpitensor.nn._functional.conv as fn
    monkeypatch.setattr(fn, "SPLIT_NATIVE_WORK", 0)  # split however small
    monkeypatch.setattr(fn, "SPLIT_BAND_WORK", 0)
    monkeypatch.setattr(fn, "SPLIT_TOTAL_WORK", 0)
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((N, C, H, W)).astype(dtype)
    w0 = rng.standard_normal((O, C) + k).astype(dtype)
    b0 = rng.standard_normal(O).astype(dtype) if bias else None
    pads = (padding[0], padding[0], padding[1], padding[1])
    applies = K.native_applies(x0, K.ConvGeom(x0.shape, w0.shape, stride, pads, dilation, 1),
                               bias)
    assert applies or band_bytes > 1 << 9  # the small budget bands every geometry here
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    threads0 = mt.get_num_threads()
    try:
        with numpy_loops():
            ref = _run(x0, w0, b0, stride, padding, dilation, 1)
        for threads in (1, 2):
            got = _run(x0, w0, b0, stride, padding, dilation, threads)
            for name, a, r in zip(("output", "input grad", "weight grad", "bias grad"),
                                  got[:4], ref[:4]):
                if r is None:
                    assert a is None
                    continue
                np.testing.assert_allclose(a, r, err_msg=f"{name}, {threads} thread(s)", **tol)
    finally:
        mt.set_num_threads(threads0)
    torch = pytest.importorskip("torch")
    xt = torch.tensor(x0, requires_grad=True)
    wt = torch.tensor(w0, requires_grad=True)
    bt = torch.tensor(b0, requires_grad=True) if bias else None
    yt = torch.nn.functional.conv2d(xt, wt, bt, stride=stride, padding=padding,
                                    dilation=dilation)
    yt.backward(torch.tensor(got[4]))
    ttol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got[0], yt.detach().numpy(), **ttol)
    np.testing.assert_allclose(got[1], xt.grad.numpy(), **ttol)
    np.testing.assert_allclose(got[2], wt.grad.numpy(), **ttol)
    if bias:
        np.testing.assert_allclose(got[3], bt.grad.numpy(), **ttol)


def test_loops_refuse_buffers_that_do_not_fit_the_geometry():
    """The C entry points check every buffer against the sizes before touching memory."""
    mod, gemm = _native.get(np.float32)
    geom = (1, 6, 6, 2, 2, 3, 3, 1, 1, 1, 1, 4, 4, 10)  # C Hp Wp N O kh kw sh sw dh dw OH OW
    src = np.zeros((1, 6, 6, 2), np.float32)
    w = np.zeros((2, 10), np.float32)
    out = np.zeros((2, 32), np.float32)
    plan = np.array([[0, 4, 0, 4]], np.int64)
    buf = np.zeros((10, 32), np.float32)
    mod.forward(src, w, out, geom, plan, 0, 1, buf, gemm, 4)  # fits
    with pytest.raises(ValueError, match="buf: too small"):
        mod.forward(src, w, out, geom, plan, 0, 1, buf[:5], gemm, 4)
    with pytest.raises(ValueError, match="out: too small"):
        mod.forward(src, w, np.zeros((2, 8), np.float32), geom, plan, 0, 1, buf, gemm, 4)
    with pytest.raises(ValueError, match="a band outside the output"):
        mod.forward(src, w, out, geom, np.array([[0, 5, 0, 4]], np.int64), 0, 1, buf, gemm, 4)
    with pytest.raises(ValueError, match="a range within it"):
        mod.forward(src, w, out, geom, plan, 0, 2, buf, gemm, 4)
    with pytest.raises(ValueError, match="inconsistent sizes"):
        mod.forward(src, w, out, geom[:11] + (5, 4, 10), plan, 0, 1, buf, gemm, 4)
    with pytest.raises(ValueError, match="positive"):
        mod.forward(src, w, out, geom[:7] + (0,) + geom[8:], plan, 0, 1, buf, gemm, 4)
    with pytest.raises(TypeError, match="argument 3"):
        mod.forward(src, w, out[:, ::2], geom, plan, 0, 1, buf, gemm, 4)  # not contiguous
    with pytest.raises(ValueError, match="64-bit integer CBLAS only"):
        mod.forward(src, w, out, geom, plan, 0, 1, buf, (gemm[0], False), 4)


def test_switched_off_by_the_environment():
    """MPITENSOR_NATIVE=0 as a user sets it: the layers take their NumPy loops (and give the
    same numbers); unset, the compiled loops."""
    code = ("import numpy as np, mpitensor as mt, mpitensor.nn.functional as F; "
            "from mpitensor.nn._kernels import native as _native; "
            "x = np.random.default_rng(0).standard_normal((64, 1, 28, 28)).astype(np.float32); "
            "w = np.ones((6, 1, 5, 5), np.float32); "
            "y = F.max_pool2d(F.conv2d(mt.tensor(x), mt.tensor(w), padding=2), 2); "
            "print(_native.get(np.float32) is not None, _native.module(np.float32) is not None,"
            " float(y.sum()))")
    runs = {}
    for value in ("0", None):
        env = {k: v for k, v in os.environ.items() if k != "MPITENSOR_NATIVE"}
        if value is not None:
            env["MPITENSOR_NATIVE"] = value
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        on_conv, on_pool, total = out.stdout.split()
        runs[value] = (on_conv, on_pool, float(total))
    assert runs["0"][:2] == ("False", "False")
    assert runs[None][:2] == ("True", "True")
    assert runs["0"][2] == pytest.approx(runs[None][2], rel=1e-5)
    assert _native.get(np.float16) is None


def _chwn(a):
    """``a`` (N, C, H, W) laid out (C, H, W, N) in memory, as conv2d's outputs are."""
    return np.ascontiguousarray(a.transpose(1, 2, 3, 0)).transpose(3, 0, 1, 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("hw", [(8, 8), (7, 9)])
@pytest.mark.parametrize("grad_layout", ["nchw", "chwn"])
@pytest.mark.parametrize("threads", [1, 2])
def test_maxpool2x2_compiled_agrees_with_numpy(monkeypatch, numpy_loops, dtype, hw, grad_layout,
                                               threads):
    """Values, winners (first on ties), NaN windows and the gradient, whatever its layout."""
    from mpitensor._base import parallel as _parallel

    monkeypatch.setattr(_parallel, "SPLIT_ELEMENTS", 0)  # split however small
    rng = np.random.default_rng(2)
    N, C = 5, 3
    x = rng.integers(-3, 3, (N, C) + hw).astype(dtype)  # many ties
    x[0, 0, 0, 0] = np.nan
    x[1, 2, 3, 2] = x[1, 2, 2, 3] = np.nan
    x = _chwn(x)
    oh, ow = hw[0] // 2, hw[1] // 2
    g = rng.standard_normal((N, C, oh, ow)).astype(dtype)
    g[2, 1, 1, 1] = np.nan
    if grad_layout == "chwn":
        g = _chwn(g)
    threads0 = mt.get_num_threads()
    mt.set_num_threads(threads)
    try:
        out, code = K.maxpool2x2_forward(x, oh, ow)
        gin = K.maxpool2x2_backward(g, code, x.shape)
        with numpy_loops():
            ref_out, ref_code = K.maxpool2x2_forward(x, oh, ow)
            ref_gin = K.maxpool2x2_backward(g, ref_code, x.shape)
    finally:
        mt.set_num_threads(threads0)
    np.testing.assert_array_equal(out, ref_out)  # NaN == NaN here
    np.testing.assert_array_equal(code, ref_code)
    np.testing.assert_array_equal(gin, ref_gin)
    assert out.flags.c_contiguous  # NCHW, as torch's, so view() works on it


def test_maxpool2x2_compiled_refuses_misfits():
    mod = _native.module(np.float32)
    x = np.zeros((2, 4, 4, 3), np.float32)
    out = np.zeros((3, 2, 2, 2), np.float32)
    code = np.zeros((2, 2, 2, 3), np.uint8)
    dims, strides = (2, 4, 4, 3, 2, 2), (8, 4, 2, 1)
    mod.maxpool2x2(x, out, code, dims, strides, 0, 2, 4)
    with pytest.raises(ValueError, match="too small for its strides"):
        mod.maxpool2x2(x, out, code, dims, (9, 4, 2, 1), 0, 2, 4)
    with pytest.raises(ValueError, match="do not fit"):
        mod.maxpool2x2(x[:1], out, code, dims, strides, 0, 2, 4)
    with pytest.raises(ValueError, match="do not fit"):
        mod.maxpool2x2(x, out, code, dims, strides, 0, 3, 4)
    with pytest.raises(ValueError, match="inconsistent"):
        mod.maxpool2x2(x, out, code, (2, 3, 4, 3, 2, 2), strides, 0, 2, 4)
    gin = np.zeros_like(x)
    with pytest.raises(ValueError, match="inconsistent"):
        mod.maxpool2x2_backward(out, (-8, 4, 2, 1), code, gin, dims, 0, 2, 4)
