"""Windows and the short-time Fourier transform: ``torch.*_window``, ``torch.signal.windows``,
``torch.stft`` / ``torch.istft`` and their Tensor methods.

Each is checked against a reference written here from the definitions (NumPy, float64: the
window formulas, a frame-by-frame DFT for ``stft``), against finite differences for the
gradients, and against torch 2.13 (the oracle, where installed) for values, dtypes, gradients
with respect to the input and the window, and the errors of bad calls.

Tolerances, from the arithmetic:
- windows: float64 values are sums of at most 4 cosines of O(1), a few eps (2.2e-16) off, so
  1e-12; a float32 window is the float64 one rounded once (half an ulp, 6e-8 relative), which
  we check to one ulp. torch computes float32 windows in float32 (its ``linspace`` and
  ``exp`` round again): against torch's float32 values 1e-6, except the Gaussian, whose
  argument ``((n - c) / std)^2`` torch forms in float32 (up to ~1000 at M = 64: its rounding,
  1000 * 6e-8, becomes the relative error after ``exp``), checked to 4e-6.
- stft / istft: FFTs of n <= 64 points on O(1) data are within a few units of
  ``eps * log2(n) * sum|x|`` (sum over a frame, <= 64), so 1e-10 in float64 and 1e-4 absolute
  in float32 (eps 1.2e-7 * 6 * 64 = 5e-5) on values of O(10); istft divides by an envelope of
  at least ~0.1 here, which keeps the same bounds. Gradients are the same linear maps
  transposed, with the same bounds.
- finite differences: ``h = 1e-6`` central differences of a linear map are exact up to
  rounding, ``eps * |f| / h`` ~ 1e-8 for |f| ~ 50; of istft (a quotient) the truncation adds
  ``h^2 * f'''`` ~ 1e-11: 1e-6.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import mpitensor as mt

try:
    import torch
    import torch.signal.windows as TW
except ImportError:  # the oracle half is skipped; the references and round trips run
    torch = TW = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle) is not installed")
RNG = np.random.default_rng(20261129)
MW = mt.signal.windows
WINDOW_FNS = ["hann_window", "hamming_window", "blackman_window", "bartlett_window",
              "kaiser_window"]
LENGTHS = [0, 1, 2, 3, 5, 16, 17, 64]


def _np(t):
    return t.detach().numpy()


def _quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


# ------------------------------------------------------------------ window references
def _ref_window(name, n, periodic, **kw):
    """The window from its textbook formula (float64), independent of the package's code."""
    if n == 0:
        return np.zeros(0)
    if n == 1:
        return np.ones(1)
    N = n + 1 if periodic else n
    k = np.arange(N, dtype=np.float64)
    x = 2 * np.pi * k / (N - 1)
    if name == "hann_window":
        w = np.sin(np.pi * k / (N - 1)) ** 2
    elif name == "hamming_window":
        w = kw.get("alpha", 0.54) - kw.get("beta", 0.46) * np.cos(x)
    elif name == "blackman_window":
        w = 0.42 - 0.5 * np.cos(x) + 0.08 * np.cos(2 * x)
    elif name == "bartlett_window":
        half = (N - 1) / 2
        w = 1 - np.abs(k - half) / half
    else:  # kaiser
        beta = kw.get("beta", 12.0)
        half = (N - 1) / 2
        w = np.i0(beta * np.sqrt(1 - ((k - half) / half) ** 2)) / np.i0(beta)
    return w[:n]


def _ulp_close(a32, ref64):
    """float32 ``a32`` is ``ref64`` rounded once: within one ulp (and 1e-15 absolute: the
    float64 formulas themselves differ by a few eps near the zeros of a window)."""
    assert a32.dtype == np.float32
    np.testing.assert_allclose(a32, ref64, rtol=2 ** -23, atol=1e-15)


@pytest.mark.parametrize("name", WINDOW_FNS)
@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("n", LENGTHS)
def test_window_functions_match_their_formulas(name, periodic, n):
    fn = getattr(mt, name)
    w64 = fn(n, periodic, dtype=mt.float64)
    assert w64.dtype == mt.float64 and tuple(w64.shape) == (n,)
    ref = _ref_window(name, n, periodic)
    np.testing.assert_allclose(_np(w64), ref, rtol=0, atol=1e-12)
    w32 = fn(n, periodic)  # the default dtype
    assert w32.dtype == mt.float32
    _ulp_close(_np(w32), ref)


def test_window_arguments_alpha_beta_and_defaults():
    np.testing.assert_allclose(_np(mt.hamming_window(9, False, 0.5, 0.3, dtype=mt.float64)),
                               _ref_window("hamming_window", 9, False, alpha=0.5, beta=0.3),
                               atol=1e-12)
    np.testing.assert_allclose(_np(mt.kaiser_window(10, True, 5.0, dtype=mt.float64)),
                               _ref_window("kaiser_window", 10, True, beta=5.0), atol=1e-12)
    np.testing.assert_allclose(_np(mt.kaiser_window(10, beta=3.0, dtype=mt.float64)),
                               _ref_window("kaiser_window", 10, True, beta=3.0), atol=1e-12)
    w = mt.hann_window(8, requires_grad=True, layout=mt.strided, device="cpu")
    assert w.requires_grad and w.is_leaf and w.grad_fn is None
    assert mt.hann_window(5).tolist() == mt.hann_window(5, True).tolist()
    h = mt.hann_window(6, dtype=mt.float16)
    assert h.dtype == mt.float16
    np.testing.assert_allclose(_np(h).astype(np.float64), _ref_window("hann_window", 6, True),
                               atol=2 ** -11)


@pytest.mark.parametrize("name", WINDOW_FNS)
def test_window_function_errors(name):
    fn = getattr(mt, name)
    with pytest.raises(RuntimeError, match="non-negative"):
        fn(-1)
    with pytest.raises(RuntimeError, match="floating point"):
        fn(4, dtype=mt.int64)
    with pytest.raises(NotImplementedError, match="complex"):
        fn(4, dtype=mt.complex64)
    with pytest.raises(TypeError, match="int"):
        fn(2.5)
    with pytest.raises(TypeError, match="int"):
        fn(True)


@needs_torch
@pytest.mark.parametrize("name", WINDOW_FNS)
@pytest.mark.parametrize("periodic", [True, False])
def test_window_functions_match_torch(name, periodic):
    for n in LENGTHS + [400]:
        for mdt, tdt, tol in [(mt.float64, torch.float64, 1e-12),
                              (mt.float32, torch.float32, 1e-6)]:
            a = _np(getattr(mt, name)(n, periodic, dtype=mdt))
            b = getattr(torch, name)(n, periodic, dtype=tdt).numpy()
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=0, atol=tol)
    a = mt.hamming_window(7, False, 0.5, 0.4, dtype=mt.float64)
    b = torch.hamming_window(7, False, 0.5, 0.4, dtype=torch.float64)
    np.testing.assert_allclose(_np(a), b.numpy(), atol=1e-12)
    a = mt.kaiser_window(7, False, 4.5, dtype=mt.float64)
    b = torch.kaiser_window(7, False, 4.5, dtype=torch.float64)
    np.testing.assert_allclose(_np(a), b.numpy(), atol=1e-12)


# ------------------------------------------------------------------ torch.signal.windows
SIGNAL_CASES = [
    ("bartlett", {}), ("blackman", {}), ("cosine", {}), ("exponential", {}),
    ("exponential", {"tau": 2.5}), ("gaussian", {}), ("gaussian", {"std": 3.2}),
    ("general_cosine", {"a": [0.5, 0.5]}), ("general_cosine", {"a": (0.3, 0.2, 0.5)}),
    ("general_hamming", {}), ("general_hamming", {"alpha": 0.6}), ("hamming", {}),
    ("hann", {}), ("kaiser", {}), ("kaiser", {"beta": 3.0}), ("nuttall", {}),
]


def _ref_signal(name, m, sym, **kw):
    if m == 0:
        return np.zeros(0)
    if name == "exponential":
        if "center" in kw:
            c = kw["center"]
        else:
            c = 0.0 if m == 1 else ((m - 1) / 2 if sym else m / 2)
        return np.exp(-np.abs(np.arange(m) - c) / kw.get("tau", 1.0))
    if m == 1:
        return np.ones(1)
    N = m if sym else m + 1
    k = np.arange(N, dtype=np.float64)
    x = 2 * np.pi * k / (N - 1)
    cos_family = {"hann": [0.5, 0.5], "hamming": [0.54, 0.46], "blackman": [0.42, 0.5, 0.08],
                  "nuttall": [0.3635819, 0.4891775, 0.1365995, 0.0106411],
                  "general_hamming": [kw.get("alpha", 0.54), 1 - kw.get("alpha", 0.54)],
                  "general_cosine": list(kw.get("a", []))}
    if name in cos_family:
        w = sum((-1) ** j * a * np.cos(j * x) for j, a in enumerate(cos_family[name]))
    elif name == "cosine":
        w = np.sin(np.pi * (k + 0.5) / N)
    elif name == "gaussian":
        w = np.exp(-0.5 * ((k - (N - 1) / 2) / kw.get("std", 1.0)) ** 2)
    else:
        w = _ref_window(name.replace("kaiser", "kaiser_window").replace(
            "bartlett", "bartlett_window"), N, False, **kw)
    return w[:m]


@pytest.mark.parametrize("name, kw", SIGNAL_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("sym", [True, False])
def test_signal_windows_match_their_formulas(name, kw, sym):
    fn = getattr(MW, name)
    for m in [0, 1, 2, 3, 6, 7, 64]:
        ref = _ref_signal(name, m, sym, **kw)
        w64 = fn(m, sym=sym, dtype=mt.float64, **kw)
        assert w64.dtype == mt.float64 and tuple(w64.shape) == (m,)
        np.testing.assert_allclose(_np(w64), ref, rtol=0, atol=1e-12)
        _ulp_close(_np(fn(m, sym=sym, **kw)), ref)


def test_signal_exponential_center_and_errors():
    ref = _ref_signal("exponential", 6, False, center=1.5, tau=0.7)
    np.testing.assert_allclose(_np(MW.exponential(6, center=1.5, tau=0.7, sym=False,
                                                  dtype=mt.float64)), ref, atol=1e-12)
    with pytest.raises(ValueError, match="center"):
        MW.exponential(5, center=1.0)
    with pytest.raises(ValueError, match="tau"):
        MW.exponential(5, tau=0.0)
    with pytest.raises(ValueError, match="std"):
        MW.gaussian(5, std=-1.0)
    with pytest.raises(ValueError, match="beta"):
        MW.kaiser(5, beta=-1.0)
    with pytest.raises(ValueError, match="empty"):
        MW.general_cosine(5, a=[])
    with pytest.raises(TypeError, match="list or tuple"):
        MW.general_cosine(5, a=1.0)
    for name, kw in SIGNAL_CASES:
        fn = getattr(MW, name)
        with pytest.raises(ValueError, match="non-negative"):
            fn(-1, **kw)
        with pytest.raises(ValueError, match="float32 or float64"):
            fn(3, dtype=mt.int64, **kw)
        with pytest.raises(ValueError, match="float32 or float64"):
            fn(3, dtype=mt.float16, **kw)
        with pytest.raises(TypeError):
            fn(3.0, **kw)
    w = MW.hann(5, requires_grad=True)
    assert w.requires_grad and w.is_leaf


@needs_torch
@pytest.mark.parametrize("name, kw", SIGNAL_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("sym", [True, False])
def test_signal_windows_match_torch(name, kw, sym):
    f32_tol = 4e-6 if name == "gaussian" else 1e-6
    for m in [0, 1, 2, 3, 6, 7, 64]:
        for mdt, tdt, tol in [(mt.float64, torch.float64, 1e-12),
                              (mt.float32, torch.float32, f32_tol)]:
            a = _np(getattr(MW, name)(m, sym=sym, dtype=mdt, **kw))
            b = getattr(TW, name)(m, sym=sym, dtype=tdt, **kw).numpy()
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=0, atol=tol)


@needs_torch
def test_signal_windows_errors_as_torch():
    calls = [("exponential", (5,), {"center": 1.0}), ("exponential", (5,), {"tau": -1.0}),
             ("gaussian", (5,), {"std": 0.0}), ("kaiser", (5,), {"beta": -1.0}),
             ("general_cosine", (5,), {"a": []}), ("general_cosine", (5,), {"a": 1.0}),
             ("hann", (-1,), {}), ("hann", (3,), {"dtype": "int64"})]
    for name, args, kw in calls:
        errs = []
        for lib, mod in ((torch, TW), (mt, MW)):
            kw2 = {k: (getattr(lib, v) if k == "dtype" else v) for k, v in kw.items()}
            with pytest.raises(Exception) as info:
                getattr(mod, name)(*args, **kw2)
            errs.append(info.type)
        assert errs[0] is errs[1], (name, kw, errs)
    a = _np(MW.exponential(1, center=1.0, sym=False, dtype=mt.float64))
    np.testing.assert_allclose(a, TW.exponential(1, center=1.0, sym=False,
                                                 dtype=torch.float64).numpy(), atol=1e-15)


# ------------------------------------------------------------------ stft reference
def _pad_ref(x, p, mode):
    if p == 0:
        return x
    widths = [(0, 0)] * (x.ndim - 1) + [(p, p)]
    np_mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge",
               "circular": "wrap"}[mode]
    return np.pad(x, widths, mode=np_mode)


def _stft_ref(x, n_fft, hop, win, window, center, mode, normalized, onesided):
    """stft from its definition: frame by frame, a DFT as a sum of exponentials."""
    x2 = np.atleast_2d(x)
    if center:
        x2 = _pad_ref(x2, n_fft // 2, mode)
    w = np.ones(win) if window is None else window
    left = (n_fft - win) // 2
    wfull = np.zeros(n_fft, dtype=w.dtype)
    wfull[left:left + win] = w
    count = 1 + (x2.shape[-1] - n_fft) // hop
    freqs = n_fft // 2 + 1 if onesided else n_fft
    dft = np.exp(-2j * np.pi * np.outer(np.arange(freqs), np.arange(n_fft)) / n_fft)
    out = np.zeros((x2.shape[0], freqs, count), dtype=complex)
    for t in range(count):
        out[:, :, t] = (x2[:, t * hop:t * hop + n_fft] * wfull) @ dft.T
    if normalized:
        out /= math.sqrt(n_fft)
    return out if x.ndim == 2 else out[0]


STFT_CASES = [  # (shape, n_fft, hop, win_length, window?, center, pad_mode, normalized, cplx)
    ((40,), 16, None, None, True, True, "reflect", False, False),
    ((3, 41), 15, 3, None, False, True, "constant", True, False),
    ((2, 50), 16, 5, 9, True, True, "replicate", False, False),
    ((50,), 16, 16, None, True, True, "circular", False, False),
    ((2, 37), 8, 2, 5, True, False, "reflect", True, False),
    ((30,), 8, 3, None, True, True, "reflect", False, True),
    ((2, 30), 9, 2, 6, False, False, "reflect", False, True),
]


def _stft_args(case, lib, dtype=np.float64, grad=False):
    shape, n_fft, hop, win, has_w, center, mode, norm, cplx = case
    rng = np.random.default_rng(abs(hash(str(case))) % 2**32)
    x = rng.standard_normal(shape) + (1j * rng.standard_normal(shape) if cplx else 0)
    x = x.astype(np.result_type(dtype, np.complex64) if cplx else dtype)
    wl = win or n_fft
    w = (0.3 + rng.random(wl)).astype(dtype) if has_w else None
    xt = lib.tensor(x, requires_grad=grad)
    wt = None if w is None else lib.tensor(w, requires_grad=grad)
    kw = dict(n_fft=n_fft, hop_length=hop, win_length=win, window=wt, center=center,
              pad_mode=mode, normalized=norm, return_complex=True)
    return x, w, xt, wt, kw


@pytest.mark.parametrize("case", STFT_CASES, ids=str)
def test_stft_matches_its_definition(case):
    x, w, xt, wt, kw = _stft_args(case, mt)
    n_fft = kw["n_fft"]
    hop = kw["hop_length"] or n_fft // 4
    win = kw["win_length"] or n_fft
    onesided = not np.iscomplexobj(x)
    y = _quiet(mt.stft, xt, **kw)
    assert y.dtype == mt.complex128
    ref = _stft_ref(x, n_fft, hop, win, w, kw["center"], kw["pad_mode"], kw["normalized"],
                    onesided)
    assert tuple(y.shape) == ref.shape
    np.testing.assert_allclose(_np(y), ref, rtol=0, atol=1e-10)
    _, _, x32, _, kw32 = _stft_args(case, mt, np.float32)
    y32 = _quiet(mt.stft, x32, **kw32)
    assert y32.dtype == mt.complex64
    np.testing.assert_allclose(_np(y32), ref, rtol=0, atol=1e-4)


def test_stft_onesided_false_normalized_and_methods():
    x = RNG.standard_normal(33)
    w = np.hanning(12)
    xt, wt = mt.tensor(x), mt.tensor(w)
    y = mt.stft(xt, 12, 4, window=wt, onesided=False, normalized=True, return_complex=True)
    ref = _stft_ref(x, 12, 4, 12, w, True, "reflect", True, False)
    np.testing.assert_allclose(_np(y), ref, atol=1e-10)
    m = xt.stft(12, 4, window=wt, onesided=False, normalized=True, return_complex=True)
    np.testing.assert_array_equal(_np(m), _np(y))
    back = m.istft(12, 4, window=wt, normalized=True, onesided=False, length=33)
    np.testing.assert_allclose(_np(back), x, atol=1e-12)


def _fd_check(f, arrays, which, h=1e-6, tol=1e-6):
    """The gradient of ``sum(f(...) * G)`` (real part) for ``arrays[which]`` against central
    differences at a few entries."""
    ts = [mt.tensor(a, requires_grad=(i == which)) for i, a in enumerate(arrays)]
    y = f(*ts)
    g = RNG.standard_normal(tuple(y.shape)) + (1j * RNG.standard_normal(tuple(y.shape))
                                                if y.is_complex() else 0)

    def loss(y):
        return float(np.sum(np.real(_np(y) * np.conj(g))))

    gt = mt.tensor(g)
    (y.real * gt.real + (y.imag * gt.imag if y.is_complex() else 0)).sum().backward()
    analytic = _np(ts[which].grad)
    base = arrays[which]
    for idx in list(np.ndindex(base.shape))[::max(1, base.size // 7)]:
        num = 0
        for step, part in ((h, 1.0), (1j * h, 1j) if np.iscomplexobj(base) else (None, None)):
            if step is None:
                continue
            plus, minus = base.copy(), base.copy()
            plus[idx] += step
            minus[idx] -= step
            d = (loss(f(*[mt.tensor(plus if i == which else a) for i, a in enumerate(arrays)]))
                 - loss(f(*[mt.tensor(minus if i == which else a)
                            for i, a in enumerate(arrays)]))) / (2 * h)
            num = num + part * d
        assert abs(analytic[idx] - num) < tol, (idx, analytic[idx], num)


@pytest.mark.parametrize("which", [0, 1])
def test_stft_gradients_by_finite_differences(which):
    x = RNG.standard_normal((2, 30))
    w = 0.5 + RNG.random(8)

    def f(xt, wt):
        return _quiet(mt.stft, xt, 16, 5, 8, wt, pad_mode="reflect", return_complex=True)

    _fd_check(f, [x, w], which)


@pytest.mark.parametrize("which", [0, 1])
def test_istft_gradients_by_finite_differences(which):
    X = RNG.standard_normal((9, 7)) + 1j * RNG.standard_normal((9, 7))
    w = 0.5 + RNG.random(16)

    def f(Xt, wt):
        return mt.istft(Xt, 16, 4, window=wt, length=30)

    _fd_check(f, [X, w], which)


@pytest.mark.parametrize("center, pad_mode", [(True, "reflect"), (True, "constant"),
                                              (True, "replicate"), (True, "circular"),
                                              (False, "reflect")])
@pytest.mark.parametrize("n_fft, hop, win", [(16, 4, 16), (15, 5, 15), (16, 3, 10)])
def test_istft_of_stft_is_the_signal(center, pad_mode, n_fft, hop, win):
    L = 64
    x = RNG.standard_normal((3, L))
    w = mt.hann_window(win, dtype=mt.float64) + 0.1  # nonzero ends: NOLA holds uncentered
    X = mt.stft(mt.tensor(x), n_fft, hop, win, w, center, pad_mode, return_complex=True)
    frames_end = n_fft + hop * (X.shape[-1] - 1) - (n_fft // 2 if center else 0)
    length = min(L, frames_end)
    if not center and win < n_fft:  # the window's zero padding leaves the first samples out
        with pytest.raises(RuntimeError, match="NOLA"):
            mt.istft(X, n_fft, hop, win, w, center, length=length)
        return
    y = mt.istft(X, n_fft, hop, win, w, center, length=length)
    assert tuple(y.shape) == (3, length) and y.dtype == mt.float64
    np.testing.assert_allclose(_np(y), x[:, :length], atol=1e-12)
    xc = x[0] + 1j * x[1]
    Xc = mt.stft(mt.tensor(xc), n_fft, hop, win, w, center, pad_mode, return_complex=True)
    yc = mt.istft(Xc, n_fft, hop, win, w, center, length=length, return_complex=True)
    np.testing.assert_allclose(_np(yc), xc[:length], atol=1e-12)


def test_round_trip_float32_and_default_length():
    x = RNG.standard_normal(400).astype(np.float32)
    w = mt.hann_window(64)
    X = mt.stft(mt.tensor(x), 64, 16, window=w, return_complex=True)
    assert X.dtype == mt.complex64 and tuple(X.shape) == (33, 26)
    y = mt.istft(X, 64, 16, window=w)
    assert y.dtype == mt.float32 and tuple(y.shape) == (400,)  # (T - 1) * hop
    np.testing.assert_allclose(_np(y), x, atol=1e-5)
    longer = mt.istft(X, 64, 16, window=w, length=420)
    np.testing.assert_allclose(_np(longer)[:400], x, atol=1e-5)
    assert not _np(longer)[400 + 32:].any()  # past the frames' reach: zeros


def test_return_complex_false_and_defaults():
    x = mt.tensor(RNG.standard_normal((2, 40)))
    w = mt.hann_window(16, dtype=mt.float64)
    with pytest.raises(RuntimeError, match="return_complex"):
        mt.stft(x, 16, window=w)
    with pytest.warns(UserWarning, match="return_complex=False"):
        r = mt.stft(x, 16, window=w, return_complex=False)
    c = mt.stft(x, 16, window=w, return_complex=True)
    assert tuple(r.shape) == (2, 9, 11, 2) and r.dtype == mt.float64
    np.testing.assert_array_equal(_np(r), _np(mt.view_as_real(c)))
    assert tuple(c.shape) == (2, 9, 1 + 40 // 4)  # hop n_fft // 4, center: 1 + L // hop
    xc = mt.tensor(RNG.standard_normal(40) + 1j * RNG.standard_normal(40))
    yc = mt.stft(xc, 16, window=w)  # complex input: complex, two-sided by default
    assert yc.is_complex() and tuple(yc.shape) == (16, 11)
    with pytest.warns(UserWarning, match="window"):
        mt.stft(x, 16, return_complex=True)
    with pytest.warns(UserWarning, match="window"):
        y = mt.istft(c, 16)  # rectangular: the envelope is 4 everywhere, still invertible
    assert tuple(y.shape) == (2, 40)


@pytest.mark.parametrize("call, err, match", [
    (lambda x, w: mt.stft(x, 64, window=mt.ones(64), center=False, return_complex=True),
     RuntimeError, "n_fft"),
    (lambda x, w: mt.stft(x, 16, 0, window=w, return_complex=True), RuntimeError, "hop_length"),
    (lambda x, w: mt.stft(x, 16, window=mt.ones(10), return_complex=True), RuntimeError,
     "win_length"),
    (lambda x, w: mt.stft(x, 16, win_length=20, return_complex=True), RuntimeError,
     "win_length"),
    (lambda x, w: mt.stft(x, 100, window=mt.ones(100), return_complex=True), RuntimeError,
     "reflect"),
    (lambda x, w: mt.stft(x, 16, window=w, pad_mode="zeros", return_complex=True),
     NotImplementedError, "padding mode"),
    (lambda x, w: mt.stft(x.reshape(1, 2, 20), 8, window=mt.ones(8), return_complex=True),
     RuntimeError, "1-D or 2-D"),
    (lambda x, w: mt.stft(x.long(), 16, window=w, return_complex=True), RuntimeError,
     "float32/float64"),
    (lambda x, w: mt.stft(x.to(mt.complex64), 16, window=w, onesided=True,
                          return_complex=True), RuntimeError, "onesided"),
    (lambda x, w: mt.stft(x, 16, window=w, center=True, align_to_window=True,
                          return_complex=True), RuntimeError, "align_to_window"),
])
def test_stft_bad_calls(call, err, match):
    x = mt.randn(40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(err, match=match):
            call(x, mt.hann_window(16))


def test_istft_bad_calls():
    w = mt.hann_window(16)
    X = mt.stft(mt.randn(100), 16, 4, window=w, return_complex=True)
    with pytest.raises(RuntimeError, match="NOLA"):
        mt.istft(X, 16, 4, window=w, center=False)  # the periodic Hann window starts at 0
    with pytest.raises(RuntimeError, match="NOLA"):
        mt.istft(X, 16, 4, window=mt.zeros(16))
    with pytest.raises(RuntimeError, match="complex input"):
        mt.istft(X.real, 16, 4, window=w)
    with pytest.raises(RuntimeError, match="hop_length"):
        mt.istft(X, 16, 17, window=w)
    with pytest.raises(RuntimeError, match="win_length"):
        mt.istft(X, 16, 4, window=mt.ones(8))
    with pytest.raises(RuntimeError, match="n_fft // 2 \\+ 1"):
        mt.istft(X, 14, 4, window=mt.ones(14))
    with pytest.raises(RuntimeError, match="onesided=False"):
        mt.istft(X, 16, 4, window=w, onesided=False)
    with pytest.raises(RuntimeError, match="full spectrum"):
        mt.istft(X, 16, 4, window=w, return_complex=True)
    with pytest.raises(RuntimeError, match="complex window"):
        mt.istft(X, 16, 4, window=w.to(mt.complex64))
    with pytest.raises(RuntimeError, match="empty"):
        mt.istft(X[:, :0], 16, 4, window=w)
    with pytest.raises(RuntimeError, match="dimensions"):
        mt.istft(X.reshape(1, 1, 9, 26), 16, 4, window=w)


# ------------------------------------------------------------------ against torch
@needs_torch
@pytest.mark.parametrize("case", STFT_CASES, ids=str)
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_stft_values_and_gradients_match_torch(case, dtype, tol):
    def run_args(lib):
        _, _, xt, wt, kw = _stft_args(case, lib, dtype, grad=True)
        return [xt] if wt is None else [xt, wt], kw

    outs = []
    cot = None
    for lib in (torch, mt):
        tensors, kw = run_args(lib)
        y = _quiet(lib.stft, tensors[0], **kw)
        if cot is None:
            cot = (RNG.standard_normal(tuple(y.shape))
                   + 1j * RNG.standard_normal(tuple(y.shape)))
        g = lib.tensor(cot)
        (y.real * g.real + y.imag * g.imag).sum().backward()
        outs.append([y.detach().numpy()] + [t.grad.numpy() for t in tensors])
    for a, b in zip(*outs):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(b, a, rtol=0, atol=tol * max(1.0, np.abs(a).max()))


ISTFT_CASES = [  # (batch, T, n_fft, hop, win, center, normalized, onesided, length, rc)
    (None, 9, 16, 4, None, True, False, None, None, False),
    (2, 9, 15, 3, None, True, True, None, 20, False),
    (2, 9, 16, None, 9, True, False, None, 30, False),
    (None, 9, 16, 4, None, False, False, None, None, False),
    (None, 9, 16, 4, None, True, False, False, None, True),
    (2, 6, 16, 4, None, True, False, False, 25, False),
    (None, 1, 16, 4, None, False, False, None, None, False),
]


@needs_torch
@pytest.mark.parametrize("case", ISTFT_CASES, ids=str)
@pytest.mark.parametrize("dtype, tol", [(np.complex128, 1e-10), (np.complex64, 1e-5)])
def test_istft_values_and_gradients_match_torch(case, dtype, tol):
    batch, T, n_fft, hop, win, center, norm, onesided, length, rc = case
    freqs = n_fft if onesided is False else n_fft // 2 + 1
    shape = (freqs, T) if batch is None else (batch, freqs, T)
    X = (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)
    w = (0.2 + RNG.random(win or n_fft)).astype(np.float64 if dtype == np.complex128
                                                 else np.float32)

    def args(lib):
        Xt = lib.tensor(X, requires_grad=True)
        wt = lib.tensor(w, requires_grad=True)
        return [Xt, wt], dict(n_fft=n_fft, hop_length=hop, win_length=win, center=center,
                              normalized=norm, onesided=onesided, length=length,
                              return_complex=rc)

    outs = []
    cot = None
    for lib in (torch, mt):
        (Xt, wt), kw = args(lib)
        y = lib.istft(Xt, window=wt, **kw)
        if cot is None:
            cot = RNG.standard_normal(tuple(y.shape)) + (
                1j * RNG.standard_normal(tuple(y.shape)) if y.is_complex() else 0)
        g = lib.tensor(cot)
        (y.real * g.real + (y.imag * g.imag if y.is_complex() else 0)).sum().backward()
        outs.append([y.detach().numpy(), Xt.grad.numpy(), wt.grad.numpy()])
    for a, b in zip(*outs):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(b, a, rtol=0, atol=tol * max(1.0, np.abs(a).max()))


@needs_torch
def test_stft_istft_errors_match_torch():
    x_np = RNG.standard_normal(40).astype(np.float32)
    calls = [
        ("stft", dict(n_fft=64, window="ones64", center=False, return_complex=True)),
        ("stft", dict(n_fft=16, hop_length=0, window="hann16", return_complex=True)),
        ("stft", dict(n_fft=16, window="ones10", return_complex=True)),
        ("stft", dict(n_fft=100, window="ones100", return_complex=True)),
        ("stft", dict(n_fft=16, window="hann16", pad_mode="zeros", return_complex=True)),
        ("stft", dict(n_fft=16, window="hann16")),
        ("stft", dict(n_fft=100, window="ones100", pad_mode="circular", return_complex=True)),
    ]
    for fname, kw in calls:
        errs = []
        for lib in (torch, mt):
            kw2 = dict(kw)
            spec = kw2["window"]
            n = int(spec.removeprefix("hann").removeprefix("ones"))
            kw2["window"] = lib.hann_window(n) if spec.startswith("hann") else lib.ones(n)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with pytest.raises(Exception) as info:
                    getattr(lib, fname)(lib.tensor(x_np), **kw2)
            errs.append(info.type)
        assert errs[0] is errs[1], (kw, errs)
    w = (torch.hann_window(16), mt.hann_window(16))
    X = torch.stft(torch.tensor(x_np), 16, 4, window=w[0], return_complex=True).numpy()
    for kw in [dict(center=False), dict(hop_length=17), dict(onesided=False),
               dict(return_complex=True)]:
        errs = []
        for lib, wt in zip((torch, mt), w):
            kw2 = {"hop_length": 4} | kw
            with pytest.raises(Exception) as info:
                lib.istft(lib.tensor(X), 16, window=wt, **kw2)
            errs.append(info.type)
        assert errs[0] is errs[1], (kw, errs)


def _spectrogram_program(torch, steps=3):
    """A user's program, written for torch: a learnable 1-D convolution trained so that the
    log-power spectrogram of its output matches a target's."""
    nn = torch.nn
    gen = np.random.default_rng(7)
    signal = torch.tensor(gen.standard_normal((4, 1, 800)).astype(np.float32))
    target = torch.tensor(gen.standard_normal((4, 1, 800)).astype(np.float32))
    conv = nn.Conv1d(1, 1, kernel_size=9, padding=4)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor(gen.standard_normal((1, 1, 9)).astype(np.float32) / 3))
        conv.bias.copy_(torch.tensor([0.1], dtype=torch.float32))
    opt = torch.optim.SGD(conv.parameters(), lr=0.05)
    window = torch.hann_window(128)

    def logspec(x):
        spec = torch.stft(x.squeeze(1), n_fft=128, hop_length=32, window=window,
                          return_complex=True)
        return torch.log1p(spec.abs().pow(2))

    want = logspec(target)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = (logspec(conv(signal)) - want).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, conv.weight.detach().numpy().copy()


def test_spectrogram_loss_program_trains():
    losses, _ = _spectrogram_program(mt, steps=3)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


@needs_torch
def test_spectrogram_loss_program_matches_torch():
    ours, w_ours = _spectrogram_program(mt)
    theirs, w_theirs = _spectrogram_program(torch)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)
    np.testing.assert_allclose(w_ours, w_theirs, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ GPU (CuPy)
_CUPY_REASON = mt.backend.cupy_unavailable_reason()
gpu = pytest.mark.skipif(bool(_CUPY_REASON), reason=_CUPY_REASON or "CuPy is available")


@pytest.mark.gpu
@gpu
def test_stft_istft_on_the_gpu_match_the_cpu():
    x = RNG.standard_normal((2, 300))
    results = []
    for device in ("cpu", "cuda"):
        xt = mt.tensor(x, device=device, requires_grad=True)
        w = mt.hann_window(64, dtype=mt.float64, device=device, requires_grad=True)
        assert w.device.type == device
        X = mt.stft(xt, 64, 16, window=w, pad_mode="replicate", return_complex=True)
        y = mt.istft(X * 2, 64, 16, window=w, length=300)
        (X.abs().sum() + y.pow(2).sum()).backward()
        results.append([t.detach().cpu().numpy() for t in (X, y, xt.grad, w.grad)])
    for a, b in zip(*results):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-10 * max(1.0, np.abs(a).max()))
    np.testing.assert_allclose(results[0][1], 2 * x, atol=1e-12)


@needs_torch
@pytest.mark.parametrize("L, n_fft, hop, win", [(40, 16, 4, 6), (41, 16, 5, 16)])
def test_stft_align_to_window_matches_torch(L, n_fft, hop, win):
    """With ``center=False`` and ``align_to_window=True`` frame ``t`` starts where its window
    does: ``1 + (L - win_length) // hop`` frames."""
    x = RNG.standard_normal((2, L))
    w = RNG.random(win) + 0.2
    outs = []
    for lib in (torch, mt):
        xt = lib.tensor(x, requires_grad=True)
        wt = lib.tensor(w, requires_grad=True)
        y = lib.stft(xt, n_fft, hop, win, wt, center=False, return_complex=True,
                     align_to_window=True)
        y.abs().sum().backward()
        outs.append((y.detach().numpy(), xt.grad.numpy(), wt.grad.numpy()))
    assert outs[1][0].shape == (2, n_fft // 2 + 1, 1 + (L - win) // hop)
    for a, b in zip(*outs):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-10 * max(1.0, np.abs(a).max()))
