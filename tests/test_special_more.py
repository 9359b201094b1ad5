"""mpitensor.special's Bessel functions of the second kind, Airy's Ai and orthogonal
polynomials (``bessel_j0`` ... ``legendre_polynomial_p``): values against mpmath at 40 digits
(the accuracy reference) and against torch 2.13 (the oracle for the call, the dtypes and the
edge values), float32, broadcasting of ``n``, and the backward (torch has none: it raises).

Tolerances, from the arithmetic:

* the monotone functions (``K0``, ``K1``, their scaled forms, ``Ai`` for x > 0, every function
  near 0) are computed to a few ulps relative: 1e-13 relative;
* the oscillating ones (``J``, ``Y``, ``Ai`` for x < 0) have zeros, where only an absolute error
  makes sense: rounding ``x`` (and the phase computed from it) moves the value by about
  ``eps |x f'(x)|``, ``|f'|`` at most 1 for ``J``/``Y`` and ``|x|^1/2`` for ``Ai``; so
  1e-12 relative plus ``16 eps (1 + |x|)`` (``16 eps (1 + |x|^1.5)`` for Ai) absolute;
* torch 2.13's own ``bessel_j0/j1/y0/y1`` are only good to ~1e-6 absolute for 2 < |x| < 25, and
  its ``airy_ai`` to ~5e-6 for -5 < x < -2 (measured against mpmath): compared there to 2e-6
  absolute (the mpmath test is the accuracy check), elsewhere with the bound above;
* a polynomial of degree n evaluated by its recurrence (or a trigonometric form) in float64
  has a forward error of a few ``eps (n + 1) (|p| + |x p'|)`` (one rounding a step plus the
  rounding of x): ``32 eps (n + 1) (|p| + |x p'|)`` absolute, plus 1e-12 relative;
* float32: the float64 value rounded once: 2 ulps of float32 (2.4e-7) relative, plus the
  absolute bound above for the oscillating functions.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt

try:
    import torch
except ImportError:  # the oracle half of the tests is skipped; the rest runs
    torch = None

try:
    import mpmath
except ImportError:
    mpmath = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle) is not installed")
needs_mpmath = pytest.mark.skipif(mpmath is None, reason="mpmath (the reference) is missing")
S = mt.special
EPS = float(np.finfo(np.float64).eps)
INF, NAN = np.inf, np.nan

EDGES = [0.0, -0.0, 1e-300, -1e-300, 1e-8, INF, -INF, NAN]
GRID = np.concatenate([np.linspace(-40, 40, 321), np.geomspace(1e-6, 1e4, 121),
                       -np.geomspace(1e-6, 300, 61), [0.5, 1.0, 2.0, 25.0, 25.5]])


def _mp(f: object) -> object:
    def ref(v: float) -> float:
        with mpmath.workdps(40):
            return float(f(mpmath.mpf(v)))
    return ref


def _positive(f: object) -> object:
    return lambda v: f(v) if v > 0 else mpmath.nan


# name -> (reference on a float, kind: "mono" | "osc" | "airy")
UNARY = {
    "bessel_j0": (lambda v: mpmath.besselj(0, v), "osc"),
    "bessel_j1": (lambda v: mpmath.besselj(1, v), "osc"),
    "bessel_y0": (_positive(lambda v: mpmath.bessely(0, v)), "osc"),
    "bessel_y1": (_positive(lambda v: mpmath.bessely(1, v)), "osc"),
    "modified_bessel_k0": (_positive(lambda v: mpmath.besselk(0, v)), "mono"),
    "modified_bessel_k1": (_positive(lambda v: mpmath.besselk(1, v)), "mono"),
    "scaled_modified_bessel_k0": (_positive(lambda v: mpmath.besselk(0, v) * mpmath.exp(v)),
                                  "mono"),
    "scaled_modified_bessel_k1": (_positive(lambda v: mpmath.besselk(1, v) * mpmath.exp(v)),
                                  "mono"),
    "airy_ai": (lambda v: mpmath.airyai(v), "airy"),
}


def _absolute(kind: str, x: np.ndarray) -> np.ndarray:
    if kind == "mono":
        return np.zeros_like(x)
    if kind == "osc":
        return 16 * EPS * (1 + np.abs(x))
    return np.where(x < 0, 16 * EPS * (1 + np.minimum(np.abs(x), 1e200) ** 1.5), 0.0)


def _error(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``|a - b|``, 0 where both are the same infinity or NaN."""
    with np.errstate(invalid="ignore"):
        return np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, np.abs(a - b))


def _values(name: str, x: np.ndarray, dtype: object = mt.float64) -> np.ndarray:
    return getattr(S, name)(mt.tensor(x, dtype=dtype)).numpy()


@needs_mpmath
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_against_mpmath(name: str) -> None:
    f, kind = UNARY[name]
    x = GRID[GRID != 0]
    ref = np.array([_mp(f)(v) for v in x])
    ours = _values(name, x)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isnan(ours), np.isnan(ref))
    tol = 1e-12 * np.abs(ref) + _absolute(kind, x)
    if kind == "mono":
        tol = 1e-13 * np.abs(ref)
    err = np.abs(ours - ref)
    assert np.all(err[finite] <= tol[finite]), (x[finite][np.argmax(err[finite] - tol[finite])])


def _torch_slack(name: str, x: np.ndarray) -> np.ndarray:
    """Where torch 2.13's own value is off by up to ~1e-6 (measured against mpmath)."""
    if name.startswith("bessel_"):
        return np.where((np.abs(x) > 2) & (np.abs(x) < 25), 2e-6, 0.0)
    if name == "airy_ai":
        return np.where((x > -5.5) & (x < -2), 2e-5, 0.0)
    return np.zeros_like(x)


@needs_torch
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_against_torch(name: str) -> None:
    kind = UNARY[name][1]
    x = np.concatenate([GRID, EDGES, [1e20, 1e300]])
    ours = _values(name, x)
    theirs = getattr(torch.special, name)(torch.tensor(x, dtype=torch.float64)).numpy()
    # the edges: NaN where torch has NaN (+-inf for J, Y and Ai, negatives for Y and K), the
    # same infinities and zeros
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    assert np.array_equal(ours[np.isinf(theirs)], theirs[np.isinf(theirs)])
    ok = np.isfinite(theirs) & (np.abs(x) < 1e6)   # torch's values beyond: see the module doc
    tol = 1e-12 * np.abs(theirs) + _absolute(kind, x) + _torch_slack(name, x)
    if kind == "mono":
        tol = 1e-13 * np.abs(theirs) + 1e-300
    assert np.all(_error(ours, theirs)[ok] <= tol[ok])


@needs_torch
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_dtypes_and_float32(name: str) -> None:
    kind = UNARY[name][1]
    ints = getattr(S, name)(mt.tensor([1, 2, 3]))
    t_ints = getattr(torch.special, name)(torch.tensor([1, 2, 3]))
    assert str(ints.dtype).split(".")[-1] == str(t_ints.dtype).split(".")[-1] == "float32"
    np.testing.assert_allclose(ints.numpy(), _values(name, np.array([1.0, 2, 3])),
                               rtol=2.4e-7)
    x32 = np.concatenate([GRID, EDGES]).astype(np.float32)
    ours = _values(name, x32, mt.float32)
    assert ours.dtype == np.float32
    wide = _values(name, x32.astype(np.float64))   # the same float32 points in float64
    tiny = float(np.finfo(np.float32).tiny)
    tol = 2.4e-7 * np.abs(wide) + _absolute(kind, x32.astype(np.float64)) + tiny
    ok = np.isfinite(wide) & (np.abs(wide) < 3e38)
    assert np.all(_error(ours, wide)[ok] <= tol[ok])
    assert np.array_equal(np.isnan(ours), np.isnan(wide))


def test_unary_known_values() -> None:
    """Values known in closed form, without an oracle."""
    x = mt.tensor([0.0, 1e-300], dtype=mt.float64)
    assert S.bessel_j0(x).tolist() == [1.0, 1.0]
    assert S.bessel_j1(x).tolist() == [0.0, 5e-301]
    assert S.bessel_y0(x)[0].item() == -INF
    assert S.modified_bessel_k1(x)[0].item() == INF
    assert S.airy_ai(mt.tensor([0.0], dtype=mt.float64)).item() == pytest.approx(
        0.35502805388781723926, rel=1e-15)
    # J1 = -J0', Y1 = -Y0', K1 = -K0' by central differences (h = 1e-5: error ~ 1e-10)
    v = np.array([0.5, 3.0, 10.0, 30.0, 80.0])
    h = 1e-5
    for z, o in (("bessel_j0", "bessel_j1"), ("bessel_y0", "bessel_y1"),
                 ("modified_bessel_k0", "modified_bessel_k1")):
        d = (_values(z, v + h) - _values(z, v - h)) / (2 * h)
        np.testing.assert_allclose(-d, _values(o, v), rtol=1e-7, atol=1e-9)
    # the Wronskian J1 Y0 - J0 Y1 = 2 / (pi x) over all three methods
    w = _values("bessel_j1", v) * _values("bessel_y0", v) - \
        _values("bessel_j0", v) * _values("bessel_y1", v)
    np.testing.assert_allclose(w, 2 / (np.pi * v), rtol=1e-13)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_backward_raises(name: str) -> None:
    x = mt.tensor([0.5, 1.5], dtype=mt.float64, requires_grad=True)
    y = getattr(S, name)(x)
    with pytest.raises(RuntimeError, match="derivative is not implemented"):
        y.sum().backward()
    assert getattr(S, name)(x.detach()).requires_grad is False


def test_unary_out_and_refusals() -> None:
    out = mt.empty(2, dtype=mt.float64)
    r = S.bessel_j0(mt.tensor([0.0, 1.0], dtype=mt.float64), out=out)
    assert r is out and out[0].item() == 1.0
    with pytest.raises(TypeError):
        S.bessel_j0(1.0)
    with pytest.raises(TypeError, match="complex"):
        S.bessel_y0(mt.tensor([1 + 1j]))


# --------------------------------------------------------------------------------------------
# Orthogonal polynomials: the exact values from each family's explicit sum, in rationals

POLYNOMIALS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
               "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
               "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
               "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
               "laguerre_polynomial_l", "legendre_polynomial_p"]


def _terms(family: str, n: int) -> list:
    """``[(coefficient, power)]`` of ``p_n`` (explicit sums, Abramowitz & Stegun 22.3)."""
    from fractions import Fraction
    from math import comb, factorial

    def u(k: int) -> list:
        return [(Fraction((-1) ** j * comb(k - j, j) * 2 ** (k - 2 * j)), k - 2 * j)
                for j in range(k // 2 + 1)] if k >= 0 else []

    if family == "t":
        if n < 2:
            return [(Fraction(1), n)]
        return [(c / 2, p) for c, p in u(n)] + [(-c / 2, p) for c, p in u(n - 2)]
    if family in "uvw":
        sign = {"u": 0, "v": -1, "w": 1}[family]
        return u(n) + [(sign * c, p) for c, p in u(n - 1)]
    if family == "hermite_h":
        return [(Fraction((-1) ** j * factorial(n) * 2 ** (n - 2 * j),
                          factorial(j) * factorial(n - 2 * j)), n - 2 * j)
                for j in range(n // 2 + 1)]
    if family == "hermite_he":
        return [(Fraction((-1) ** j * factorial(n), factorial(j) * factorial(n - 2 * j) * 2 ** j),
                 n - 2 * j) for j in range(n // 2 + 1)]
    if family == "laguerre_l":
        return [(Fraction((-1) ** j * comb(n, j), factorial(j)), j) for j in range(n + 1)]
    return [(Fraction((-1) ** j * comb(n, j) * comb(2 * n - 2 * j, n), 2 ** n), n - 2 * j)
            for j in range(n // 2 + 1)]   # Legendre


def _exact(name: str, x: np.ndarray, n: int) -> tuple:
    """``(p_n(x), the bound 32 eps (n + 1) (|p| + |x p'| + 1))`` exactly at the float ``x``."""
    from fractions import Fraction
    family = name.split("_polynomial_")[-1] if "chebyshev" in name else name.replace(
        "_polynomial", "")
    terms = _terms(family, n)
    values, bounds = [], []
    for v in x:
        f = Fraction(float(v))
        z = 2 * f - 1 if name.startswith("shifted") else f
        p = sum((c * z ** k for c, k in terms), Fraction(0))
        dp = sum((c * k * z ** (k - 1) for c, k in terms if k), Fraction(0))
        lever = abs(z) + (2 * abs(f) if name.startswith("shifted") else 0)
        values.append(float(p))
        bounds.append(32 * EPS * (n + 1) * (abs(float(p)) + float(lever * abs(dp)) + 1))
    return np.array(values), np.array(bounds)


def _x_for(name: str) -> np.ndarray:
    if name.startswith("shifted"):
        return np.linspace(-0.25, 1.25, 31)
    if name.startswith("hermite"):
        return np.linspace(-4, 4, 33)
    if name.startswith("laguerre"):
        return np.linspace(-2, 12, 29)
    return np.linspace(-1.5, 1.5, 31)


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_exact_values(name: str) -> None:
    x = np.concatenate([_x_for(name), [0.0, 1.0, -1.0, 0.3, 0.7]])
    for n in range(31):
        exact, bound = _exact(name, x, n)
        ours = getattr(S, name)(mt.tensor(x, dtype=mt.float64), n).numpy()
        err = np.abs(ours - exact)
        assert np.all(err <= 1e-12 * np.abs(exact) + bound), (n, x[np.argmax(err - bound)])


@needs_mpmath
@pytest.mark.parametrize("name", POLYNOMIALS[:8])
def test_chebyshev_large_degree(name: str) -> None:
    """Degrees 100 and 1000 inside the interval, against the trigonometric forms at 40
    digits: the error is a few ``eps n (1 + |x p'|)``, ``|p'| <= n^2``-ish near the ends."""
    shifted = name.startswith("shifted")
    x = np.linspace(0.01, 0.99, 41) if shifted else np.linspace(-0.98, 0.98, 41)
    z = 2 * x - 1 if shifted else x
    family = name[-1]
    for n in (100, 1000):
        with mpmath.workdps(40):
            t = [mpmath.acos(2 * mpmath.mpf(v) - 1 if shifted else mpmath.mpf(v)) for v in x]
            ref = {"t": lambda a, k: mpmath.cos(k * a),
                   "u": lambda a, k: mpmath.sin((k + 1) * a) / mpmath.sin(a),
                   "v": lambda a, k: mpmath.cos((k + 0.5) * a) / mpmath.cos(a / 2),
                   "w": lambda a, k: mpmath.sin((k + 0.5) * a) / mpmath.sin(a / 2)}[family]
            exact = np.array([float(ref(a, n)) for a in t])
        ours = getattr(S, name)(mt.tensor(x, dtype=mt.float64), n).numpy()
        steep = (n + 1) ** 2 / np.sqrt(1 - z * z) * (3 if shifted else 1)
        assert np.all(np.abs(ours - exact) <= 32 * EPS * (n + 1) * (np.abs(exact) + steep))


@needs_torch
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_against_torch(name: str) -> None:
    x = np.concatenate([_x_for(name), [0.0, 1.0, -1.0, INF, -INF]])
    ns = [*range(-3, 31), 2.5, 2.7, -0.5, -2.5, NAN, 100]
    for n in ns:
        ours = getattr(S, name)(mt.tensor(x, dtype=mt.float64), n).numpy()
        theirs = getattr(torch.special, name)(torch.tensor(x, dtype=torch.float64), n).numpy()
        assert np.array_equal(np.isnan(ours), np.isnan(theirs)), n
        assert np.array_equal(ours[np.isinf(theirs)], theirs[np.isinf(theirs)]), n
        ok = np.isfinite(theirs) & np.isfinite(x)
        k = int(n) if n == n else -1   # n truncated toward 0, as torch
        if k < 0:   # a negative or NaN degree: 0, as torch
            assert np.all(ours[ok] == 0) and np.all(theirs[ok] == 0), n
            continue
        _, bound = _exact(name, x[ok], k)   # both sides' rounding: twice the bound
        err = _error(ours[ok], theirs[ok])
        assert np.all(err <= 1e-12 * np.abs(theirs[ok]) + 2 * bound), n
    # n = 0 gives 1 and any other n NaN at a NaN x (torch's CPU kernel leaves other lanes'
    # values there; mpitensor does not copy that)
    nan_row = getattr(S, name)(mt.tensor([NAN], dtype=mt.float64), mt.tensor([0.0, 1, 3, -1]))
    assert nan_row.numpy()[0] == 1 and np.isnan(nan_row.numpy()[1:3]).all()
    assert nan_row.numpy()[3] == 0


@needs_torch
def test_polynomial_broadcasting_and_dtypes() -> None:
    name = "legendre_polynomial_p"
    f, g = getattr(S, name), getattr(torch.special, name)
    x = np.linspace(-1, 1, 4).reshape(4, 1)
    n = np.array([0, 1, 2, 5, 30])
    ours = f(mt.tensor(x), mt.tensor(n))
    theirs = g(torch.tensor(x), torch.tensor(n))
    assert tuple(ours.shape) == tuple(theirs.shape) == (4, 5)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-12, atol=1e-13)
    # a number x with a tensor n, keywords as torch spells them
    np.testing.assert_allclose(f(0.5, mt.tensor(n)).numpy(), g(0.5, torch.tensor(n)).numpy(),
                               rtol=1e-6)
    np.testing.assert_allclose(f(x=mt.tensor([0.5]), n=3).numpy(),
                               g(x=torch.tensor([0.5]), n=3).numpy(), rtol=1e-6)
    cases = [((np.array([1, 2]), None), (3, None)),                         # ints -> float32
             ((np.array([1.0, 2.0]), "float32"), (np.array(3.0), "float64")),  # 0-dim n
             ((np.array([0.5]), "float64"), (np.array([3.0]), "float32")),
             ((np.array([0.5]), "float32"), (np.array([3]), None)),
             ((np.array([0.5]), "float32"), (3.5, None))]
    for (xv, xd), (nv, nd) in cases:
        def make(lib: object, v: object, d: object) -> object:
            if not isinstance(v, np.ndarray):
                return v
            return lib.tensor(v) if d is None else lib.tensor(v, dtype=getattr(lib, d))
        ours = f(make(mt, xv, xd), make(mt, nv, nd))
        theirs = g(make(torch, xv, xd), make(torch, nv, nd))
        assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)
    out = mt.empty(2)
    assert f(mt.tensor([0.5, 1.0]), 2, out=out) is out
    assert out.tolist() == [-0.125, 1.0]


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_backward_raises(name: str) -> None:
    x = mt.tensor([0.25, 0.5], dtype=mt.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="derivative is not implemented"):
        getattr(S, name)(x, 3).sum().backward()
    n = mt.tensor([2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=name):
        getattr(S, name)(mt.tensor([0.5, 0.25]), n).sum().backward()
    with pytest.raises(TypeError):
        getattr(S, name)(0.5, 3)


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_float32(name: str) -> None:
    """float32 in, float32 out: the float64 value at the same points, rounded once."""
    x = _x_for(name).astype(np.float32)
    for n in (0, 1, 5, 12, 30):
        ours = getattr(S, name)(mt.tensor(x), n).numpy()
        assert ours.dtype == np.float32
        wide = getattr(S, name)(mt.tensor(x.astype(np.float64)), n).numpy()
        _, bound = _exact(name, x.astype(np.float64), n)
        ok = np.abs(wide) < 3e38
        assert np.all(np.abs(ours - wide)[ok] <= (2.4e-7 * np.abs(wide) + bound)[ok]), n


@needs_torch
@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomial_huge_degree(name: str) -> None:
    """Degrees past overflow (700, 5001) and of 10^9 where the value is known without 10^9
    steps (Chebyshev at +-1 and inside, any family once it has overflowed): torch's values."""
    x = np.array([-50.0, -3.0, -1.5, -1.0, 1.0, 1.5, 3.0, 50.0])
    if name.startswith("shifted"):
        x = (x + 1) / 2
    for n in (700, 701, 5001):
        ours = getattr(S, name)(mt.tensor(x, dtype=mt.float64), n).numpy()
        theirs = getattr(torch.special, name)(torch.tensor(x, dtype=torch.float64), n).numpy()
        assert np.array_equal(np.isnan(ours), np.isnan(theirs)), n
        np.testing.assert_allclose(ours[~np.isnan(ours)], theirs[~np.isnan(theirs)],
                                   rtol=1e-9)   # integers times ~1e3 roundings at most
    if "chebyshev" in name:
        z = np.array([-1.0, 1.0, 0.3, 1.5, -2.0])
        z = (z + 1) / 2 if name.startswith("shifted") else z
        n = mt.tensor([1e9, 1e9 + 1, 1e9, 1e9, 1e9 + 1], dtype=mt.float64)
        ours = getattr(S, name)(mt.tensor(z, dtype=mt.float64), n).numpy()
        theirs = getattr(torch.special, name)(torch.tensor(z, dtype=torch.float64),
                                              torch.tensor(n.numpy())).numpy()
        assert np.array_equal(np.isnan(ours), np.isnan(theirs))
        # inside the interval the phase n acos(x) carries ~n eps of rounding: 1e-6
        np.testing.assert_allclose(ours[:3], theirs[:3], rtol=1e-6)


def test_cupy_arrays() -> None:
    """On a GPU the kernels run on CuPy arrays (the array module taken from the input) and
    give the CPU's values."""
    if not mt.cuda.is_available():
        pytest.skip("no CUDA device (CuPy and a GPU are needed)")
    x = np.concatenate([GRID, EDGES])
    for name in UNARY:
        on_gpu = getattr(S, name)(mt.tensor(x, dtype=mt.float64, device="cuda"))
        assert on_gpu.device.type == "cuda"
        ours, on_cpu = on_gpu.cpu().numpy(), _values(name, x)
        # CUDA's sin/cos/exp/log may round other ways than the CPU's by an ulp or few
        tol = 1e-12 * np.abs(on_cpu) + _absolute(UNARY[name][1], x)
        assert np.array_equal(np.isnan(ours), np.isnan(on_cpu))
        assert np.all(_error(ours, on_cpu)[~np.isnan(on_cpu)] <= tol[~np.isnan(on_cpu)])
    xs = np.linspace(-1.5, 1.5, 31)
    n = mt.tensor([[0.0], [3.0], [30.0], [100.0]], device="cuda")
    for name in POLYNOMIALS:
        on_gpu = getattr(S, name)(mt.tensor(xs, dtype=mt.float64, device="cuda"), n)
        assert on_gpu.device.type == "cuda"
        on_cpu = getattr(S, name)(mt.tensor(xs, dtype=mt.float64), n.cpu()).numpy()
        scale = np.abs(on_cpu).max(axis=1, keepdims=True)   # near a zero: absolute
        assert np.all(np.abs(on_gpu.cpu().numpy() - on_cpu) <= 1e-12 * (np.abs(on_cpu) + scale))
