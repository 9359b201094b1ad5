"""mpitensor.special: every function's values on its domain (edges included: 0, negatives,
large arguments, infinities, NaN) and its gradient, against torch 2.13 (the oracle, where
installed), finite differences and known values (everywhere).

Tolerances: the kernels are accurate to a few units of float64's eps (2.2e-16) relative, and
torch's to about the same, except torch's trigamma (polygamma(1, x)), good to ~5e-10 only;
1e-10 relative (with an absolute floor of 1e-300 for values that underflow, and of 1e-14 near
the zeros of lgamma) leaves a wide margin. float32 values are float64 ones rounded once on
both sides, so they differ by at most an ulp or two (1.2e-7): 1e-5 relative. Central finite
differences with h = 1e-6 on smooth functions of O(1) values carry errors near
``eps / h + h^2 f'''`` ~ 1e-9: 1e-6 relative.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import mpitensor as mt

try:
    import torch
except ImportError:  # the oracle half of the tests is skipped; the rest runs
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle) is not installed")
S = mt.special
INF, NAN = np.inf, np.nan

# name -> points of its domain, edges included
POINTS = {
    "erf": [*np.linspace(-6, 6, 49), 0.0, -0.0, 1e-300, 30, -30, INF, -INF, NAN],
    "erfc": [*np.linspace(-6, 27, 67), 0.0, 1e-300, -30, INF, -INF, NAN],
    "erfcx": [*np.linspace(-26, 30, 113), 0.0, 1e-300, 1e3, 1e10, 1e200, INF, -30, NAN],
    "erfinv": [*np.linspace(-0.999, 0.999, 41), 0.0, 1e-300, 1 - 1e-16, -1.0, 1.0, 1.5, NAN],
    "expit": [*np.linspace(-40, 40, 41), 0.0, 800, -800, INF, -INF, NAN],
    "logit": [*np.linspace(0.001, 0.999, 37), 0.0, 1.0, 1e-300, -0.5, 2.0, NAN],
    "exp2": [*np.linspace(-20, 20, 41), 0.0, 2000, -2000, INF, -INF],
    "expm1": [*np.linspace(-20, 20, 41), 0.0, 1e-20, -1e-20, 800, -INF],
    "log1p": [*np.linspace(-0.999, 20, 41), 0.0, 1e-20, -1.0, -2.0, INF],
    "gammaln": [*np.linspace(-9.7, 30.3, 81), 1.0, 2.0, 0.0, -1.0, -2.0, 1e-300, 1e5, 1e300,
                INF],
    "digamma": [*np.linspace(-9.7, 30.3, 81), 0.0, -1.0, -3.0, 1e-8, 1e5, INF],
    "psi": [*np.linspace(-3.3, 8.1, 20), 0.0],
    "i0": [*np.linspace(-50, 50, 101), 0.0, 19.999, 20.0, 700, -700, NAN],
    "i0e": [*np.linspace(-50, 50, 101), 0.0, 20.0, 700, -700, 1e4, 1e10, INF, -INF, NAN],
    "i1": [*np.linspace(-50, 50, 101), 0.0, 1e-300, 20.0, 700, -700, NAN],
    "i1e": [*np.linspace(-50, 50, 101), 0.0, 20.0, 700, -700, 1e4, 1e10, INF, -INF, NAN],
    "modified_bessel_i0": [*np.linspace(-30, 30, 31), 0.0],
    "modified_bessel_i1": [*np.linspace(-30, 30, 31), 0.0],
    "ndtr": [*np.linspace(-40, 40, 81), 0.0, INF, -INF, NAN],
    "ndtri": [*np.linspace(0, 1, 101), 1e-300, 1e-100, 1e-20, 1e-5, 0.4999, 0.5001,
              1 - 1e-16, 1 - 1e-10, -0.1, 1.1, NAN],
    "log_ndtr": [*np.linspace(-50, 40, 91), -1e5, -1.0, -0.999, 0.0, 1e3, -INF, INF, NAN],
    "sinc": [*np.linspace(-5, 5, 41), 0.0, 1e-10, 1e5],
    "entr": [*np.linspace(0, 10, 21), 1e-300, -1.0, -1e-300, INF, NAN],
    "spherical_bessel_j0": [*np.linspace(-30, 30, 61), 0.0, 1e-3, -1e-3, 1e-2, 0.0099, 1e-8],
}
# (the Bessel functions at +-inf: i0 and i1 give inf, torch's kernels NaN; see test below)


def _close(ours, theirs, rtol, floor=1e-300):
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    same_special = (np.isnan(ours) & np.isnan(theirs)) | ((ours == theirs) & np.isinf(theirs))
    tol = rtol * np.abs(theirs) + floor
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf: same_special
        ok = same_special | (np.abs(ours - theirs) <= tol)
    assert ok.all(), (np.flatnonzero(~ok)[:8], ours[~ok][:8], theirs[~ok][:8])


def _floor(name, dtype):
    f64 = dtype == np.float64
    if name == "gammaln":  # lgamma's zeros at 1 and 2: a few ulps of the terms cancelling there
        return 1e-14 if f64 else 1e-6
    if name == "expit":  # mpitensor's sigmoid, 0.5 + 0.5 tanh(x/2), is exact to eps absolute
        return 2.3e-16 if f64 else 1.2e-7
    return 1e-300 if f64 else 1e-36  # (float32's subnormals keep fewer digits)


@needs_torch
@pytest.mark.parametrize("name", sorted(POINTS))
@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_values_match_torch(name, dtype, rtol):
    with np.errstate(over="ignore"):  # (points beyond float32's range become inf)
        x = np.array(POINTS[name]).astype(dtype)
    ours = getattr(S, name)(mt.tensor(x))
    if name == "ndtr":  # torch's ndtr is 0 below -8 in float64: its erfc keeps the tail
        theirs = 0.5 * torch.special.erfc(torch.tensor(-x / np.sqrt(2).astype(dtype)))
    else:
        theirs = getattr(torch.special, name)(torch.tensor(x))
    assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
    with np.errstate(all="ignore"):
        _close(ours.numpy(), theirs.numpy(), rtol, _floor(name, dtype))


# name -> interior points where the function is smooth (the gradient's domain)
GRAD_POINTS = {
    "erf": [-3, -0.5, 0.0, 0.7, 2.5], "erfc": [-2, 0.0, 1.4, 1.6, 5.0],
    "erfcx": [-3, -1.6, -0.2, 0.0, 1.2, 1.6, 8.0, 40.0], "erfinv": [-0.9, -0.1, 0.0, 0.6, 0.99],
    "expit": [-5, 0.0, 3.0], "logit": [0.1, 0.5, 0.8], "exp2": [-2, 0.5, 3.0],
    "expm1": [-2, 1e-3, 1.0], "log1p": [-0.5, 0.0, 4.0], "gammaln": [-2.5, 0.3, 1.0, 7.5],
    "digamma": [-1.5, 0.25, 2.0, 12.0], "psi": [0.5, 3.0],
    "i0": [-25, -3, 0.0, 0.5, 19.5, 21.0], "i0e": [-25, -3, 0.5, 19.5, 21.0, 60.0],
    "i1": [-25, -3, 0.0, 0.5, 19.5, 21.0], "i1e": [-25, -3, 0.0, 0.5, 19.5, 21.0, 60.0],
    "ndtr": [-6, -1, 0.0, 2.0], "ndtri": [1e-10, 0.01, 0.3, 0.5, 0.9, 0.999],
    "log_ndtr": [-30, -3, -1.0, 0.0, 2.0, 9.0], "sinc": [-1.3, 0.0, 0.4, 2.5],
    "entr": [0.01, 0.5, 1.0, 3.0], "modified_bessel_i0": [], "modified_bessel_i1": [],
    "spherical_bessel_j0": [],  # torch gives these three no gradient: checked below
}


@needs_torch
@pytest.mark.parametrize("name", sorted(n for n, p in GRAD_POINTS.items() if p))
def test_gradients_match_torch(name):
    x = np.array(GRAD_POINTS[name], dtype=np.float64)
    xm, xt = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    w = np.linspace(0.5, 1.5, len(x))
    (getattr(S, name)(xm) * mt.tensor(w)).sum().backward()
    (getattr(torch.special, name)(xt) * torch.tensor(w)).sum().backward()
    # digamma's gradient is trigamma, torch's good to about 5e-10 relative
    _close(xm.grad.numpy(), xt.grad.numpy(), 1e-8 if name in ("digamma", "psi") else 1e-10)


@pytest.mark.parametrize("name", sorted(n for n, p in GRAD_POINTS.items() if p)
                         + ["spherical_bessel_j0"])
def test_gradients_are_finite_differences(name):
    pts = GRAD_POINTS[name] or [-7.0, -0.005, 0.0, 0.003, 0.5, 4.0]
    x = np.array(pts, dtype=np.float64)
    xm = mt.tensor(x, requires_grad=True)
    getattr(S, name)(xm).sum().backward()
    h = 1e-6 * np.maximum(1.0, np.abs(x))
    h = np.where((name == "ndtri") & (x < 1e-5), x * 1e-4, h)  # stay inside (0, 1)
    f = getattr(S, name)
    fd = (f(mt.tensor(x + h)).numpy() - f(mt.tensor(x - h)).numpy()) / (2 * h)
    np.testing.assert_allclose(xm.grad.numpy(), fd, rtol=1e-6, atol=1e-9)


def test_known_values():
    """Without the oracle: textbook values and identities."""
    t = lambda v: mt.tensor(v, dtype=mt.float64)  # noqa: E731
    assert S.ndtri(t([0.975])).item() == pytest.approx(1.959963984540054, rel=1e-14)
    assert S.ndtr(t([1.959963984540054])).item() == pytest.approx(0.975, rel=1e-14)
    assert S.i0(t([1.0])).item() == pytest.approx(1.2660658777520082, rel=1e-14)
    assert S.i1(t([1.0])).item() == pytest.approx(0.5651591039924851, rel=1e-14)
    assert S.i0e(t([1e6])).item() == pytest.approx(1 / math.sqrt(2 * math.pi * 1e6), rel=1e-6)
    assert S.erfcx(t([0.0])).item() == 1.0
    assert S.erfcx(t([1e8])).item() == pytest.approx(1 / (1e8 * math.sqrt(math.pi)), rel=1e-14)
    assert S.zeta(t([2.0]), t([1.0])).item() == pytest.approx(math.pi ** 2 / 6, rel=1e-14)
    assert S.zeta(t([4.0]), 1.0).item() == pytest.approx(math.pi ** 4 / 90, rel=1e-14)
    assert S.polygamma(1, t([1.0])).item() == pytest.approx(math.pi ** 2 / 6, rel=1e-14)
    assert S.polygamma(2, t([1.0])).item() == pytest.approx(-2 * 1.2020569031595942,
                                                            rel=1e-14)
    assert S.log_ndtr(t([-40.0])).item() == pytest.approx(
        -800 - math.log(40 * math.sqrt(2 * math.pi))
        + math.log1p(-1 / 1600 + 3 / 1600 ** 2 - 15 / 1600 ** 3), rel=1e-12)
    assert S.entr(t([0.0, 1.0, -1.0])).tolist() == [0.0, -0.0, -math.inf]
    assert S.multigammaln(t([2.5]), 2).item() == pytest.approx(
        math.log(math.pi) / 2 + math.lgamma(2.5) + math.lgamma(2.0), rel=1e-14)
    assert S.xlog1py(t([0.0, 2.0]), t([-1.0, 1.0])).tolist() == [0.0, 2 * math.log(2.0)]
    p = np.concatenate([np.logspace(-300, -1, 60), np.linspace(0.1, 0.9, 17)])
    back = S.ndtr(S.ndtri(t(p))).numpy()
    # ndtr magnifies a relative error of x by about x^2 in the tail (x^2 < 1400 here)
    np.testing.assert_allclose(back, p, rtol=1e-12)
    assert np.isinf(S.i0(t([INF, -INF])).numpy()).all()  # (torch's kernels give NaN here)
    assert S.i1(t([-INF])).item() == -INF


@needs_torch
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 7])
def test_polygamma_matches_torch(n):
    x = np.array([*np.linspace(-5.3, 25, 61), 0.0, -1.0, -2.0, 1e-8, 1e3, INF])
    xm, xt = mt.tensor(x[1:-6], requires_grad=True), torch.tensor(x[1:-6], requires_grad=True)
    with np.errstate(all="ignore"):
        ours = S.polygamma(n, mt.tensor(x)).numpy()
        theirs = torch.special.polygamma(n, torch.tensor(x)).numpy()
    if n == 1:  # torch's trigamma is good to about 5e-10 relative, and finite at its poles
        assert np.isinf(ours[-6:-3]).all()
        ours, theirs = ours[[*range(len(x) - 6), -3, -2, -1]], theirs[[*range(len(x) - 6), -3,
                                                                        -2, -1]]
    _close(ours, theirs, 1e-8 if n == 1 else 1e-10)
    S.polygamma(n, xm).sum().backward()
    torch.special.polygamma(n, xt).sum().backward()
    _close(xm.grad.numpy(), xt.grad.numpy(), 1e-8 if n == 0 else 1e-10)


@needs_torch
def test_zeta_matches_torch_with_gradient():
    xs = np.array([1.0, 1.5, 2.0, 3.0, 4.5, 10.0, 30.0, 0.5, -1.0])
    qs = np.array([1e-3, 0.1, 0.5, 1.0, 2.0, 5.5, 10.0, 100.0, 1e4, 0.0, -1.0, -2.5, -10.3])
    x, q = np.meshgrid(xs, qs)
    _close(S.zeta(mt.tensor(x), mt.tensor(q)).numpy(),
           torch.special.zeta(torch.tensor(x), torch.tensor(q)).numpy(), 1e-10)
    xv, qv = np.array([2.0, 3.5, 6.0]), np.array([0.5, 2.0, 7.0])
    qm, qt = mt.tensor(qv, requires_grad=True), torch.tensor(qv, requires_grad=True)
    S.zeta(mt.tensor(xv), qm).sum().backward()
    torch.special.zeta(torch.tensor(xv), qt).sum().backward()
    _close(qm.grad.numpy(), qt.grad.numpy(), 1e-10)
    xm = mt.tensor(xv, requires_grad=True)
    with pytest.raises(RuntimeError, match="derivative"):
        S.zeta(xm, mt.tensor(qv)).sum().backward()
    assert S.zeta(3.0, mt.tensor([1.0])).dtype == mt.float32  # a number with a tensor


@needs_torch
@pytest.mark.parametrize("name", ["xlogy", "xlog1py"])
def test_xlogy_family_matches_torch(name):
    a = np.array([0.0, 0.0, 0.0, 1.5, -2.0, 3.0, 0.0, 2.0])
    b = np.array([0.5, -1.0, NAN, 2.0, 0.25, -0.5, 0.0, INF])
    am, bm = mt.tensor(a, requires_grad=True), mt.tensor(b, requires_grad=True)
    at, bt = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    ym, yt = getattr(S, name)(am, bm), getattr(torch.special, name)(at, bt)
    _close(ym.detach().numpy(), yt.detach().numpy(), 1e-14)
    keep = [0, 3, 4, 5]  # where the gradients are finite on both sides
    ym[keep].sum().backward()
    yt[keep].sum().backward()
    _close(am.grad.numpy()[keep], at.grad.numpy()[keep], 1e-14)
    _close(bm.grad.numpy()[keep], bt.grad.numpy()[keep], 1e-14)
    for lhs, rhs in ((2.0, mt.tensor([3.0])), (mt.tensor([3.0]), 2.0)):
        tl = torch.tensor([3.0]) if isinstance(lhs, mt.Tensor) else lhs
        tr = torch.tensor([3.0]) if isinstance(rhs, mt.Tensor) else rhs
        _close(getattr(S, name)(lhs, rhs).numpy(), getattr(torch.special, name)(tl, tr).numpy(),
               1e-6)


@needs_torch
def test_composite_functions_match_torch():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4))
    xm, xt = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    pairs = [
        (S.logsumexp(xm, 1), torch.special.logsumexp(xt, 1)),
        (S.logsumexp(xm, (0, 1), keepdim=True), torch.special.logsumexp(xt, (0, 1), True)),
        (S.softmax(xm, 0), torch.special.softmax(xt, 0)),
        (S.log_softmax(xm, -1), torch.special.log_softmax(xt, -1)),
        (S.round(xm * 100, decimals=-1), torch.special.round(xt * 100, decimals=-1)),
        (S.logit(xm.sigmoid(), eps=0.3), torch.special.logit(xt.sigmoid(), eps=0.3)),
        (S.multigammaln(xm.abs() + 3, 4), torch.special.multigammaln(xt.abs() + 3, 4)),
    ]
    for a, b in pairs:
        _close(a.detach().numpy(), b.detach().numpy(), 1e-12)
        w = rng.standard_normal(tuple(b.shape))
        (a * mt.tensor(w)).sum().backward()
        (b * torch.tensor(w)).sum().backward()
        _close(xm.grad.numpy(), xt.grad.numpy(), 1e-12)
    assert S.softmax(mt.tensor([1.0, 2.0]), 0, dtype=mt.float64).dtype == mt.float64


def test_half_and_integer_inputs():
    """float16 computed in float32 and rounded once; integers as the default float dtype."""
    h = S.erfcx(mt.tensor([0.5, 2.0], dtype=mt.float16))
    assert h.dtype == mt.float16
    np.testing.assert_allclose(h.float().numpy(), [0.6156903441929259, 0.2553956763105057],
                               rtol=1e-3)
    i = S.i0(mt.tensor([0, 1, 2]))
    assert i.dtype == mt.float32
    np.testing.assert_allclose(i.numpy(), [1.0, 1.2660658777520082, 2.2795853023360673],
                               rtol=1e-6)


def test_bad_arguments_raise():
    with pytest.raises(TypeError, match="Tensor"):
        S.erfcx(0.5)
    with pytest.raises(ValueError, match="non-negative"):
        S.polygamma(-1, mt.tensor([1.0]))
    with pytest.raises(ValueError, match="greater than"):
        S.multigammaln(mt.tensor([0.9]), 3)
    with pytest.raises(TypeError, match="tensor"):
        S.zeta(2.0, 1.0)


@needs_torch
@pytest.mark.parametrize("name", ["gammainc", "gammaincc"])
def test_incomplete_gamma_matches_torch(name):
    """Values over a grid with its edges, and the gradient in x; torch's kernels are good to
    about 5e-10 relative for a >= 20 (against 50-digit values), so there 1e-8."""
    a = np.array([1e-3, 0.1, 0.5, 1.0, 2.5, 10.0, 19.0, 50.0, 300.0, 1e4, 0.0, -1.0, INF])
    x = np.array([0.0, 1e-5, 0.1, 1.0, 2.0, 3.5, 9.0, 11.0, 50.0, 60.0, 200.0, 1e4, 1.01e4,
                  INF, -1.0])
    av, xv = np.meshgrid(a, x)
    ours = getattr(S, name)(mt.tensor(av), mt.tensor(xv)).numpy()
    theirs = getattr(torch.special, name)(torch.tensor(av), torch.tensor(xv)).numpy()
    small = av < 20
    _close(ours[small], theirs[small], 1e-10)
    _close(ours[~small], theirs[~small], 1e-8)
    ag, xg = np.array([0.5, 2.0, 10.0, 3.0]), np.array([0.3, 2.5, 12.0, 40.0])
    xm, xt = mt.tensor(xg, requires_grad=True), torch.tensor(xg, requires_grad=True)
    getattr(S, name)(mt.tensor(ag), xm).sum().backward()
    getattr(torch.special, name)(torch.tensor(ag), xt).sum().backward()
    _close(xm.grad.numpy(), xt.grad.numpy(), 1e-12)
    with pytest.raises(RuntimeError, match="derivative"):
        getattr(S, name)(mt.tensor(ag, requires_grad=True), mt.tensor(xg)).sum().backward()
    # NaN in, NaN out (torch's gives 0 or 1 for a = inf)
    assert np.isnan(getattr(S, name)(mt.tensor([2.0, INF]), mt.tensor([NAN, NAN])).numpy()).all()


def test_incomplete_gamma_known_values():
    """P(1, x) = 1 - e^-x; P(1/2, x) = erf(sqrt(x)); P + Q = 1; d/dx by finite differences."""
    x = np.array([0.01, 0.5, 1.0, 1.9, 2.1, 7.0, 40.0])
    t = mt.tensor
    np.testing.assert_allclose(S.gammainc(t(np.ones(7)), t(x)).numpy(), -np.expm1(-x),
                               rtol=1e-14)
    np.testing.assert_allclose(S.gammaincc(t(np.full(7, 0.5)), t(x)).numpy(),
                               [math.erfc(math.sqrt(v)) for v in x], rtol=1e-13)
    a = np.array([0.3, 1.5, 4.0, 9.0, 30.0, 100.0, 2.0])
    np.testing.assert_allclose((S.gammainc(t(a), t(x)) + S.gammaincc(t(a), t(x))).numpy(), 1.0,
                               rtol=1e-14)
    xm = t(x, requires_grad=True)
    S.gammainc(t(a), xm).sum().backward()
    h = 1e-6 * x
    fd = (S.gammainc(t(a), t(x + h)).numpy() - S.gammainc(t(a), t(x - h)).numpy()) / (2 * h)
    np.testing.assert_allclose(xm.grad.numpy(), fd, rtol=1e-6, atol=1e-12)
