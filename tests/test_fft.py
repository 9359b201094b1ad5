"""mpitensor.fft: every transform's values and gradients against torch (the oracle, where
installed) and against finite differences (everywhere), in float64 and float32, every norm,
odd and even sizes, cropping and padding, several dimensions; the complex autograd after a
transform (abs, real, view_as_real); a small spectral-convolution layer trained as in torch.

Tolerances: float64 transforms of these sizes (n <= 64) have rounding errors of a few units of
``eps * log2(n) * max|x|`` (eps = 2.2e-16), so 1e-10 relative leaves a wide margin and still
catches any wrong term; float32 ones the same with eps = 1.2e-7, hence 1e-5. Central finite
differences of a linear map are exact up to rounding: ``h = 1e-6`` on O(1) values leaves
errors near ``eps / h = 2e-10``, hence 1e-7.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt

try:
    import torch
except ImportError:  # the oracle half of the tests is skipped; the rest runs
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle) is not installed")
NORMS = [None, "backward", "ortho", "forward"]
RNG = np.random.default_rng(20261129)


def _data(shape, complex_, dtype=np.float64):
    x = RNG.standard_normal(shape)
    if complex_:
        x = x + 1j * RNG.standard_normal(shape)
    return x.astype(np.result_type(dtype, np.complex64) if complex_ else dtype)


# name, input complex?, kwargs; shapes (5, 6) and (4, 7) cover odd and even sizes on each dim
CASES = [
    ("fft", False, {}), ("fft", True, {"n": 9}), ("fft", True, {"n": 3, "dim": 0}),
    ("ifft", True, {}), ("ifft", False, {"n": 8, "dim": 0}),
    ("fft2", True, {}), ("fft2", False, {"s": (3, 8)}), ("ifft2", True, {"s": (6, -1)}),
    ("fftn", True, {}), ("fftn", False, {"s": (7,)}), ("ifftn", True, {"dim": (0,)}),
    ("fftn", True, {"s": (3, 4), "dim": (1, 0)}),
    ("rfft", False, {}), ("rfft", False, {"n": 11}), ("rfft", False, {"n": 4, "dim": 0}),
    ("irfft", True, {}), ("irfft", True, {"n": 9}), ("irfft", True, {"n": 4}),
    ("irfft", True, {"n": 12, "dim": 0}), ("irfft", False, {}),
    ("rfft2", False, {}), ("rfft2", False, {"s": (3, 5)}), ("irfft2", True, {}),
    ("irfft2", True, {"s": (4, 7)}), ("rfftn", False, {"dim": (1, 0)}),
    ("irfftn", True, {"s": (5, 9)}), ("irfftn", True, {"dim": 0}),
    ("hfft", True, {}), ("hfft", True, {"n": 7}), ("hfft", False, {"n": 6, "dim": 0}),
    ("ihfft", False, {}), ("ihfft", False, {"n": 9, "dim": 0}),
    ("hfft2", True, {}), ("hfft2", True, {"s": (3, 5)}), ("ihfft2", False, {}),
    ("hfftn", True, {"dim": (1,)}), ("ihfftn", False, {"s": (4, 3)}),
]
SHAPES = [(5, 6), (4, 7)]


def _ids(case):
    name, cplx, kw = case
    return f"{name}-{'c' if cplx else 'r'}-" + "-".join(f"{k}{v}" for k, v in kw.items())


def _weights(y):
    """A fixed random cotangent for ``y``: the loss is sum(Re(y) a + Im(y) b)."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal(y.shape)
    b = rng.standard_normal(y.shape) if np.iscomplexobj(y) else None
    return a, b


def _loss_np(y, a, b):
    return float((y.real * a).sum() + (0 if b is None else (y.imag * b).sum()))


def _loss(lib, y, a, b):
    if b is None:
        return (y * lib.tensor(a)).sum()
    return (y.real * lib.tensor(a)).sum() + (y.imag * lib.tensor(b)).sum()


def _np(t):
    return t.detach().resolve_conj().numpy() if torch is not None and isinstance(
        t, torch.Tensor) else t.detach().numpy()


@needs_torch
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("norm", NORMS[1:])  # (None is "backward": test_known_values)
@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_values_and_gradients_match_torch(case, norm, shape, dtype, rtol):
    name, cplx, kw = case
    x = _data(shape, cplx, dtype)
    xm = mt.tensor(x, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    ym = getattr(mt.fft, name)(xm, norm=norm, **kw)
    yt = getattr(torch.fft, name)(xt, norm=norm, **kw)
    assert str(ym.dtype).split(".")[-1] == str(yt.dtype).split(".")[-1]
    assert tuple(ym.shape) == tuple(yt.shape)
    vm, vt = _np(ym), _np(yt)
    scale = np.abs(vt).max()
    np.testing.assert_allclose(vm, vt, rtol=0, atol=rtol * scale)
    a, b = _weights(vt)
    _loss(mt, ym, a, b).backward()
    _loss(torch, yt, a, b).backward()
    gm, gt = _np(xm.grad), _np(xt.grad)
    assert gm.dtype == gt.dtype
    np.testing.assert_allclose(gm, gt, rtol=0, atol=rtol * max(np.abs(gt).max(), 1.0))


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_gradient_is_the_finite_difference(case, norm):
    """dL/dRe x + i dL/dIm x, each by central differences (L is linear, so exact but for
    rounding)."""
    name, cplx, kw = case
    x = _data((4, 5), cplx)
    xm = mt.tensor(x, requires_grad=True)
    y = getattr(mt.fft, name)(xm, norm=norm, **kw)
    a, b = _weights(y.detach().numpy())
    _loss(mt, y, a, b).backward()
    g = xm.grad.numpy()

    def f(v):
        return _loss_np(getattr(mt.fft, name)(mt.tensor(v), norm=norm, **kw).numpy(), a, b)

    h = 1e-6
    fd = np.zeros(x.shape, dtype=x.dtype)
    for idx in np.ndindex(x.shape):
        for unit in ((1, 1j) if cplx else (1,)):
            e = np.zeros(x.shape, dtype=x.dtype)
            e[idx] = h * unit
            fd[idx] += unit * (f(x + e) - f(x - e)) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=0, atol=1e-7 * max(1.0, np.abs(fd).max()))


def test_inverse_pairs_round_trip():
    x = _data((6, 7), False)
    t = mt.tensor(x)
    for norm in NORMS:
        np.testing.assert_allclose(mt.fft.ifft(mt.fft.fft(t, norm=norm), norm=norm).real.numpy(),
                                   x, atol=1e-13)
        np.testing.assert_allclose(mt.fft.irfft(mt.fft.rfft(t, norm=norm), n=7,
                                                norm=norm).numpy(), x, atol=1e-13)
        np.testing.assert_allclose(mt.fft.irfftn(mt.fft.rfftn(t, norm=norm), s=(6, 7),
                                                 norm=norm).numpy(), x, atol=1e-13)
        np.testing.assert_allclose(mt.fft.hfft(mt.fft.ihfft(t, norm=norm), n=7,
                                               norm=norm).numpy(), x, atol=1e-13)


def test_known_values_and_dtypes():
    """The DFT of an impulse is flat, of a constant an impulse; dtypes as torch's."""
    e = mt.tensor([0.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(mt.fft.fft(e).numpy(), np.exp(-2j * np.pi * np.arange(4) / 4),
                               atol=1e-7)
    assert mt.fft.fft(e).dtype == mt.complex64
    assert mt.fft.rfft(e.double()).dtype == mt.complex128
    assert mt.fft.irfft(mt.fft.rfft(e)).dtype == mt.float32
    assert mt.fft.fft(mt.tensor([1, 2, 3])).dtype == mt.complex64  # integers: default float
    assert mt.fft.hfft(mt.tensor([1.0, 0.0, 0.0])).tolist() == [1.0, 1.0, 1.0, 1.0]
    np.testing.assert_allclose(mt.fft.fft(mt.ones(4), norm="ortho").numpy(), [2, 0, 0, 0])
    np.testing.assert_allclose(mt.fft.fft(mt.ones(4), norm="forward").numpy(), [1, 0, 0, 0])
    x = mt.tensor(_data((3, 4), True))
    for name in ("fft", "ifft", "fftn", "irfft", "hfft", "ihfft2"):
        y = mt.fft.ihfft2(x.real) if name == "ihfft2" else getattr(mt.fft, name)(x)
        z = mt.fft.ihfft2(x.real, norm="backward") if name == "ihfft2" else getattr(
            mt.fft, name)(x, norm="backward")
        np.testing.assert_array_equal(y.numpy(), z.numpy())


def test_bad_arguments_raise():
    x = mt.ones(4)
    with pytest.raises(TypeError, match="real input"):
        mt.fft.rfft(mt.ones(4, dtype=mt.complex64))
    with pytest.raises(TypeError, match="float16"):
        mt.fft.fft(mt.ones(4, dtype=mt.float16))
    with pytest.raises(ValueError, match="norm"):
        mt.fft.fft(x, norm="unitary")
    with pytest.raises(ValueError, match="at least 1"):
        mt.fft.fft(x, n=0)
    with pytest.raises(ValueError, match="at least 1"):
        mt.fft.irfft(mt.ones(1, dtype=mt.complex64))
    with pytest.raises(ValueError, match="s has 2 sizes"):
        mt.fft.fftn(mt.ones(3, 3), s=(2, 2), dim=(0,))
    with pytest.raises(ValueError, match="unique"):
        mt.fft.fftn(mt.ones(3, 3), dim=(0, 0))
    with pytest.raises(IndexError):
        mt.fft.fft(x, dim=1)
    with pytest.raises(TypeError, match="Tensor"):
        mt.fft.fft([1.0, 2.0])


def test_out_argument():
    x = mt.tensor([1.0, 2.0, 3.0])
    out = mt.empty(0, dtype=mt.complex64)
    r = mt.fft.fft(x, out=out)
    assert r is out
    np.testing.assert_allclose(out.numpy(), np.fft.fft([1.0, 2.0, 3.0]), rtol=1e-6)
    with pytest.raises(RuntimeError, match="autograd"):
        mt.fft.fft(mt.tensor([1.0, 2.0], requires_grad=True), out=out)


@needs_torch
@pytest.mark.parametrize("n, d", [(1, 1.0), (4, 1.0), (5, 0.1), (8, 2.5)])
@pytest.mark.parametrize("dtype", [None, "float64"])
def test_frequencies_match_torch(n, d, dtype):
    kw = {} if dtype is None else {"dtype": getattr(mt, dtype)}
    kt = {} if dtype is None else {"dtype": getattr(torch, dtype)}
    for name in ("fftfreq", "rfftfreq"):
        a = getattr(mt.fft, name)(n, d, **kw)
        b = getattr(torch.fft, name)(n, d, **kt)
        assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1]
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


@needs_torch
@pytest.mark.parametrize("dim", [None, 0, (1,), (0, 1), -1])
def test_shifts_match_torch_with_gradients(dim):
    x = RNG.standard_normal((5, 6))
    for name in ("fftshift", "ifftshift"):
        xm = mt.tensor(x, requires_grad=True)
        xt = torch.tensor(x, requires_grad=True)
        ym = getattr(mt.fft, name)(xm, dim=dim)
        yt = getattr(torch.fft, name)(xt, dim=dim)
        np.testing.assert_array_equal(ym.detach().numpy(), yt.detach().numpy())
        w = RNG.standard_normal((5, 6))
        (ym * mt.tensor(w)).sum().backward()
        (yt * torch.tensor(w)).sum().backward()
        np.testing.assert_array_equal(xm.grad.numpy(), xt.grad.numpy())
    np.testing.assert_array_equal(mt.fft.ifftshift(mt.fft.fftshift(mt.tensor(x))).numpy(), x)


@needs_torch
@pytest.mark.parametrize("head", ["abs", "real", "imag", "view_as_real", "angle", "abs2"])
def test_complex_intermediates_give_torchs_gradients(head):
    """A real loss of a complex transform: the conjugate Wirtinger convention end to end."""
    x = RNG.standard_normal((3, 8))
    w = RNG.standard_normal((3, 8))

    def run(lib):
        xt = lib.tensor(x, requires_grad=True)
        z = lib.fft.fft(xt * lib.tensor(w).exp(), norm="ortho")
        z = lib.fft.ifft(z * (1 + 2j), n=6)
        if head == "view_as_real":
            y = lib.view_as_real(z)
        elif head == "abs2":
            y = (z * z.conj()).real
        else:
            y = getattr(z, head)() if head in ("abs", "angle") else getattr(z, head)
        (y ** 2).sum().backward()
        return xt.grad.detach().numpy()

    np.testing.assert_allclose(run(mt), run(torch), rtol=1e-10, atol=1e-12)


def _spectral_layer(lib, w0, x0, steps=5):
    """An FNO-style 1-D spectral convolution trained a few steps: rfft, the lowest modes
    multiplied by complex weights (a channel mixing), irfft; returns the losses."""
    nn = lib.nn

    class SpectralConv1d(nn.Module):
        def __init__(self, modes):
            super().__init__()
            self.modes = modes
            self.weights = nn.Parameter(lib.tensor(w0, dtype=lib.cfloat))

        def forward(self, x):
            xf = lib.fft.rfft(x)
            out = lib.zeros(x.shape[0], self.weights.shape[1], x.shape[-1] // 2 + 1,
                            dtype=lib.cfloat)
            out[:, :, :self.modes] = lib.einsum("bix,iox->box", xf[:, :, :self.modes],
                                                self.weights)
            return lib.fft.irfft(out, n=x.shape[-1])

    layer = SpectralConv1d(w0.shape[-1])
    opt = lib.optim.Adam(layer.parameters(), lr=1e-2)
    x = lib.tensor(x0)
    target = lib.sin(x * 3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ((layer(x) - target) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses)


@needs_torch
def test_spectral_convolution_trains_as_in_torch():
    rng = np.random.default_rng(3)
    w0 = (rng.standard_normal((2, 2, 6)) + 1j * rng.standard_normal((2, 2, 6))) / 4
    x0 = rng.standard_normal((4, 2, 32)).astype(np.float32)
    ours = _spectral_layer(mt, w0, x0)
    theirs = _spectral_layer(torch, w0, x0)
    assert ours[-1] < ours[0]  # it learns
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


HOLOMORPHIC = ["exp", "log", "sqrt", "tanh", "sigmoid", "sin", "cos", "tan", "sinh", "cosh",
               "asin", "acos", "atan", "asinh", "acosh", "atanh", "expm1", "log1p", "log2",
               "log10", "reciprocal", "rsqrt", "square", "exp2", "neg", "conj", "abs", "angle",
               "sgn"]  # (the last four are not holomorphic: each has its own rule)
PRODUCTS = {
    "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "pow": lambda a, b: a ** b,
    "pow2": lambda a, b: a ** 2 + b, "rpow": lambda a, b: 2 ** a + b,
    "matmul": lambda a, b: a[:, None] @ b[None, :], "dot": lambda a, b: a.dot(b),
    "einsum": lambda a, b: __import__("mpitensor").einsum("i,j->ij", a, b)
    if isinstance(a, mt.Tensor) else torch.einsum("i,j->ij", a, b),
    "prod": lambda a, b: (a * b).prod(), "sum": lambda a, b: (a * b).sum(),
}


@needs_torch
@pytest.mark.parametrize("name", HOLOMORPHIC + sorted(PRODUCTS))
def test_complex_gradients_follow_torchs_convention(name):
    """A real loss of complex ops: each op's gradient is g * conj(f') for a holomorphic f
    (the conjugate Wirtinger derivative torch uses), which an FFT pipeline meets everywhere."""
    rng = np.random.default_rng(11)
    a0 = (rng.standard_normal(5) + 1j * rng.standard_normal(5)) * 0.5 + 0.3
    b0 = (rng.standard_normal(5) + 1j * rng.standard_normal(5)) * 0.5 + 0.3

    def grads(lib):
        a = lib.tensor(a0, requires_grad=True)
        b = lib.tensor(b0, requires_grad=True)
        y = PRODUCTS[name](a, b) if name in PRODUCTS else getattr(a, name)() * b
        y = y if y.is_complex() else y * (1 + 0j)
        ((y.real ** 2) + 3 * y.imag).sum().backward()
        return [np.zeros(5) if v.grad is None else v.grad.detach().resolve_conj().numpy()
                for v in (a, b)]

    for ours, theirs in zip(grads(mt), grads(torch)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
