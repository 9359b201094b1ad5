"""The torch.* / Tensor ops beyond the operators, against PyTorch as the oracle.

Each check runs one expression through ``mpitensor`` and through ``torch`` (``fn(lib, *xs)``
with the same code for both), and compares the values, the dtypes and, for differentiable
ops, the gradients of a random upstream gradient: float64 to 1e-10, float32 to 1e-5. Bad
arguments must raise torch's exception types or ValueError/TypeError.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import mpitensor as mt

RNG = np.random.default_rng(20240607)
TOL = {"float64": (1e-10, 1e-12), "float32": (1e-5, 1e-6)}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _np(t) -> np.ndarray:
    if hasattr(t, "detach"):
        t = t.detach()
    if hasattr(t, "numpy"):
        return np.asarray(t.numpy())
    return np.asarray(t)


def _dtname(dt) -> str:
    return str(dt).replace("torch.", "")


def assert_close(ours, theirs, dtype="float64", what="value", rtol=None, atol=None):
    r, a = TOL.get(dtype, (1e-3, 1e-3))
    rtol = r if rtol is None else rtol
    atol = a if atol is None else atol
    o, t = _np(ours), _np(theirs)
    assert o.shape == t.shape, f"{what}: shape {o.shape} != torch's {t.shape}"
    np.testing.assert_allclose(o.astype(np.float64) if o.dtype.kind != "c" else o,
                               t.astype(np.float64) if t.dtype.kind != "c" else t,
                               rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def check(torch, fn, *arrays, grad=True, dtype="float64", rtol=None, atol=None,
          grad_of=None, check_dtype=True):
    """``fn(lib, *tensors)`` in both libraries: values (each of a tuple), dtypes and the
    gradients of ``arrays`` (the ones listed in ``grad_of``, all float ones by default)."""
    grad_of = range(len(arrays)) if grad_of is None else grad_of
    mts, ts = [], []
    for i, a in enumerate(arrays):
        want = grad and i in grad_of and np.asarray(a).dtype.kind == "f"
        mts.append(mt.tensor(a, requires_grad=want))
        ts.append(torch.tensor(a, requires_grad=want))
    out_m, out_t = fn(mt, *mts), fn(torch, *ts)
    outs_m = out_m if isinstance(out_m, tuple) else (out_m,)
    outs_t = out_t if isinstance(out_t, tuple) else (out_t,)
    assert len(outs_m) == len(outs_t)
    for k, (om, ot) in enumerate(zip(outs_m, outs_t)):
        if hasattr(ot, "dtype") and check_dtype:
            assert _dtname(om.dtype) == _dtname(ot.dtype), (k, om.dtype, ot.dtype)
        assert_close(om, ot, dtype, f"output {k}", rtol, atol)
    if not grad:
        return out_m
    om, ot = outs_m[0], outs_t[0]
    if not getattr(ot, "requires_grad", False):
        return out_m
    g = RNG.standard_normal(tuple(ot.shape)).astype(dtype)
    om.backward(mt.tensor(g))
    ot.backward(torch.tensor(g))
    for i, (a, b) in enumerate(zip(mts, ts)):
        if b.requires_grad:
            gt = b.grad
            if gt is None or gt._is_zerotensor():
                gt = torch.zeros_like(b)
            gm = a.grad if a.grad is not None else mt.zeros_like(a)
            assert_close(gm, gt, dtype, f"gradient of input {i}", rtol, atol)
    return out_m


def rand(*shape, lo=-3.0, hi=3.0, dtype="float64"):
    return RNG.uniform(lo, hi, shape).astype(dtype)


# --------------------------------------------------------------------------------------------
# Unary functions

UNARY_DOMAINS = {
    "sin": (-3, 3), "cos": (-3, 3), "tan": (-1.2, 1.2), "asin": (-0.9, 0.9),
    "acos": (-0.9, 0.9), "atan": (-3, 3), "sinh": (-3, 3), "cosh": (-3, 3), "asinh": (-3, 3),
    "acosh": (1.1, 4), "atanh": (-0.9, 0.9), "exp2": (-3, 3), "expm1": (-3, 3),
    "log2": (0.1, 4), "log10": (0.1, 4), "log1p": (-0.5, 3), "reciprocal": (0.2, 3),
    "rsqrt": (0.2, 3), "square": (-3, 3), "sign": (-3, 3), "sgn": (-3, 3), "floor": (-3, 3),
    "ceil": (-3, 3), "round": (-3, 3), "trunc": (-3, 3), "fix": (-3, 3), "frac": (-3, 3),
    "erf": (-3, 3), "erfc": (-3, 3), "erfinv": (-0.95, 0.95), "lgamma": (0.1, 6),
    "digamma": (0.1, 6), "logit": (0.05, 0.95), "neg": (-3, 3), "negative": (-3, 3),
    "positive": (-3, 3), "deg2rad": (-200, 200), "rad2deg": (-3, 3), "arcsin": (-0.9, 0.9),
    "arccos": (-0.9, 0.9), "arctan": (-3, 3), "arcsinh": (-3, 3), "arccosh": (1.1, 4),
    "arctanh": (-0.9, 0.9), "absolute": (-3, 3), "sinc": (-3, 3), "nan_to_num": (-3, 3),
    "exp": (-3, 3), "log": (0.1, 4), "sqrt": (0.1, 4), "sigmoid": (-3, 3), "tanh": (-3, 3),
    "abs": (-3, 3),
}


# torch's trigamma (digamma's gradient) is a short asymptotic series, good to about 1e-9
LOOSER = {("digamma", "float64"): (1e-8, 1e-9)}


@pytest.mark.parametrize("name", sorted(UNARY_DOMAINS))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_unary_values_and_gradients(torch, name, dtype):
    lo, hi = UNARY_DOMAINS[name]
    x = rand(4, 5, lo=lo, hi=hi, dtype=dtype)
    rtol, atol = LOOSER.get((name, dtype), (None, None))
    check(torch, lambda lib, t: getattr(lib, name)(t), x, dtype=dtype, rtol=rtol, atol=atol)
    check(torch, lambda lib, t: getattr(t, name)(), x, dtype=dtype, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", sorted(n for n in UNARY_DOMAINS if n not in (
    "positive", "sgn", "absolute", "negative", "nan_to_num", "sinc")) + ["sinc", "nan_to_num"])
def test_unary_inplace_records_like_torch(torch, name):
    lo, hi = UNARY_DOMAINS[name]
    x = rand(3, 4, lo=lo, hi=hi)
    if not hasattr(torch.Tensor, name + "_"):
        pytest.skip(f"torch has no {name}_")
    # torch has no derivative for these in-place forms (ours has): compare the values
    grad = name not in ("acosh", "arccosh", "asinh", "arcsinh", "atanh", "arctanh")

    def fn(lib, t):
        y = t * 1.0
        r = getattr(y, name + "_")()
        assert r is y
        return y

    rtol, atol = LOOSER.get((name, "float64"), (None, None))
    check(torch, fn, x, rtol=rtol, atol=atol, grad=grad)
    if not grad:
        t = mt.tensor(x, requires_grad=True)
        y = t * 1.0
        getattr(y, name + "_")()
        y.sum().backward()
        assert_close(t.grad, _unary_grad(torch, name, x))


def _unary_grad(torch, name, x):
    t = torch.tensor(x, requires_grad=True)
    getattr(torch, name)(t).sum().backward()
    return t.grad


def test_unary_special_values(torch):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1e-300, 1e10, -1e10, -2.5, 2.5,
                  -1.0, 1.0, 0.5, -3.0, 40.0])
    for name in ("erf", "erfc", "lgamma", "digamma", "sign", "floor", "round", "trunc",
                 "frac", "sinc", "expm1", "log1p", "exp2", "nan_to_num", "deg2rad"):
        check(torch, lambda lib, t, n=name: getattr(lib, n)(t), x, grad=False)
    y = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1 - 2 ** -52, -(1 - 2 ** -52), 1e-300, 2.0, np.nan])
    check(torch, lambda lib, t: lib.erfinv(t), y, grad=False)


@pytest.mark.parametrize("name", ["erf", "erfc", "erfinv", "lgamma", "digamma"])
def test_special_functions_over_a_wide_range(torch, name):
    lo, hi = {"erfinv": (-0.999999, 0.999999), "lgamma": (-30.3, 50),
              "digamma": (-30.3, 50)}.get(name, (-7, 7))
    x = RNG.uniform(lo, hi, 20000)
    x = x[np.abs(x - np.round(x)) > 1e-3]  # away from the poles of lgamma and digamma
    check(torch, lambda lib, t: getattr(lib, name)(t), x, grad=False, rtol=1e-12, atol=1e-12)


def test_digamma_gradient_is_trigamma(torch):
    # torch's trigamma is accurate to about 1e-9 only (a short asymptotic series): compare
    # with a tolerance above its error and with mpmath-grade values at a few points
    x = rand(50, lo=-4.5, hi=8)
    check(torch, lambda lib, t: lib.digamma(t), x, rtol=1e-8, atol=1e-9)
    from mpitensor._ops import special as _special

    got = _special.trigamma(np.array([1.0, 0.5, 2.5, -1.5]))
    want = [math.pi ** 2 / 6, math.pi ** 2 / 2, 0.4903577561002349, 9.37924664498912]
    np.testing.assert_allclose(got, want, rtol=1e-13)


@pytest.mark.parametrize("name", ["sin", "exp2", "erf", "lgamma", "floor", "round", "rsqrt",
                                  "atan", "logit", "nan_to_num", "sign"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_unary_half_rounds_once_as_torch(torch, name, dtype):
    lo, hi = UNARY_DOMAINS[name]
    x = rand(64, lo=lo, hi=hi).astype(np.float32)
    tt = torch.tensor(x).to(getattr(torch, dtype))
    tm = mt.tensor(x).to(getattr(mt, dtype))
    om, ot = getattr(tm, name)(), getattr(tt, name)()
    assert _dtname(om.dtype) == _dtname(ot.dtype)
    np.testing.assert_allclose(_np(om.float()), ot.float().numpy(), rtol=1e-2, atol=1e-2)
    same = (_np(om.float()) == ot.float().numpy()).mean()
    assert same > 0.9, f"{name}: only {same:.0%} of the {dtype} results equal torch's"


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "bool"])
def test_unary_integer_and_bool_dtypes_follow_torch(torch, dtype):
    x = np.array([0, 1, 2, 1], dtype=dtype)
    for name in ("sin", "exp2", "log1p", "reciprocal", "rsqrt", "square", "sign", "sgn",
                 "floor", "ceil", "round", "trunc", "fix", "erf", "lgamma", "deg2rad",
                 "nan_to_num", "isnan", "isinf", "isfinite", "isposinf", "isneginf",
                 "signbit", "logical_not"):
        tt = torch.tensor(x)
        try:
            ot = getattr(torch, name)(tt)
        except (RuntimeError, NotImplementedError, TypeError):
            with pytest.raises((TypeError, ValueError, RuntimeError)):
                getattr(mt, name)(mt.tensor(x))
            continue
        om = getattr(mt, name)(mt.tensor(x))
        assert _dtname(om.dtype) == _dtname(ot.dtype), (name, om.dtype, ot.dtype)
        assert_close(om, ot, "float32", name)


def test_round_decimals_logit_eps_and_nan_to_num_arguments(torch):
    x = rand(20, lo=-50, hi=50)
    for d in (0, 1, 2, -1):
        check(torch, lambda lib, t, d=d: lib.round(t, decimals=d), x, grad=False)
    p = rand(20, lo=-0.2, hi=1.2)
    check(torch, lambda lib, t: lib.logit(t, eps=0.1), p)
    check(torch, lambda lib, t: t.logit(1e-3), rand(10, lo=0.01, hi=0.99))
    v = np.array([np.nan, np.inf, -np.inf, 1.5, -2.0])
    check(torch, lambda lib, t: lib.nan_to_num(t, nan=7.0, posinf=1e3, neginf=-5.0), v)
    check(torch, lambda lib, t: lib.nan_to_num(t), v.astype("float32"), dtype="float32")
    check(torch, lambda lib, t: t.clone().nan_to_num_(posinf=2.0), v, grad=False)


def test_predicates(torch):
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.5, -2.0])
    for name in ("isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit", "isreal"):
        check(torch, lambda lib, t, n=name: getattr(lib, n)(t), x, grad=False)
        check(torch, lambda lib, t, n=name: getattr(t, n)(), x.astype("float32"),
              grad=False)


def test_unary_bad_inputs_raise():
    with pytest.raises(TypeError):
        mt.tensor([1, 2]).frac()
    with pytest.raises(TypeError):
        mt.tensor([True]).floor()
    with pytest.raises(TypeError):
        mt.tensor([True]).positive()
    with pytest.raises(TypeError):
        mt.tensor([1, 2]).sin_()  # a float result cannot be written into an int tensor
    leaf = mt.tensor([0.5], requires_grad=True)
    with pytest.raises(RuntimeError):
        leaf.sin_()
    with mt.no_grad():
        leaf.sin_()  # allowed, as parameter updates are
    assert leaf._version == 1


def test_inplace_unary_bumps_the_version_and_refuses_stale_saves(torch):
    x = mt.tensor([0.3, 0.7], requires_grad=True)
    y = x * 2
    z = y.sin()  # saves y
    v = y._version
    y.cos_()
    assert y._version == v + 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


def test_inplace_unary_through_a_view(torch):
    x = rand(3, 4)

    def fn(lib, t):
        y = t * 1.0
        y[1].exp_()
        y[:, 2].sin_()  # also changes y[1], whose exp_ saved its output: both refuse
        return y

    for lib in (mt, torch):
        y = fn(lib, lib.tensor(x, requires_grad=True))
        with pytest.raises(RuntimeError):
            y.sum().backward()

    def fn2(lib, t):
        y = t * 1.0
        y[1].sin_()
        y[:, 2].mul_(3.0)
        y[0].tanh_()
        return y * y

    check(torch, fn2, x)


def test_out_argument(torch):
    x = rand(5)
    o = mt.empty(5, dtype=mt.float64)
    r = mt.sin(mt.tensor(x), out=o)
    assert r is o
    assert_close(o, torch.sin(torch.tensor(x)))
    o2 = mt.empty(0, dtype=mt.float64)  # resized, as torch resizes
    mt.add(mt.tensor(x), 1.0, out=o2)
    assert_close(o2, torch.tensor(x) + 1)
    vals, idx = mt.empty(0, dtype=mt.float64), mt.empty(0, dtype=mt.int64)
    mt.cummax(mt.tensor(x), 0, out=(vals, idx))
    assert_close(vals, torch.cummax(torch.tensor(x), 0).values)
    with pytest.raises(TypeError):
        mt.sin(mt.tensor(x), out=mt.empty(5, dtype=mt.int64))
    with pytest.raises(TypeError):
        mt.sin([1.0, 2.0])


# --------------------------------------------------------------------------------------------
# Binary functions

BINARY = {
    "atan2": lambda lib, a, b: lib.atan2(a, b),
    "arctan2": lambda lib, a, b: lib.arctan2(a, b),
    "hypot": lambda lib, a, b: lib.hypot(a, b),
    "logaddexp": lambda lib, a, b: lib.logaddexp(a, b),
    "logaddexp2": lambda lib, a, b: lib.logaddexp2(a, b),
    "fmod": lambda lib, a, b: lib.fmod(a, b),
    "remainder": lambda lib, a, b: lib.remainder(a, b),
    "copysign": lambda lib, a, b: lib.copysign(a, b),
    "xlogy": lambda lib, a, b: lib.xlogy(a, b.abs() + 0.1),
    "maximum": lambda lib, a, b: lib.maximum(a, b),
    "minimum": lambda lib, a, b: lib.minimum(a, b),
    "fmax": lambda lib, a, b: lib.fmax(a, b),
    "fmin": lambda lib, a, b: lib.fmin(a, b),
    "float_power": lambda lib, a, b: lib.float_power(a.abs() + 0.5, b),
    "true_divide": lambda lib, a, b: lib.true_divide(a, b),
    "divide": lambda lib, a, b: lib.divide(a, b),
    "multiply": lambda lib, a, b: lib.multiply(a, b),
    "subtract": lambda lib, a, b: lib.subtract(a, b, alpha=2.5),
    "add": lambda lib, a, b: lib.add(a, b, alpha=0.5),
    "mul": lambda lib, a, b: lib.mul(a, b),
    "sub": lambda lib, a, b: lib.sub(a, b),
    "div": lambda lib, a, b: lib.div(a, b),
    "pow": lambda lib, a, b: lib.pow(a.abs() + 0.5, b),
    "rsub": lambda lib, a, b: lib.rsub(a, b, alpha=3),
    "lerp_scalar": lambda lib, a, b: lib.lerp(a, b, 0.3),
    "lerp_scalar_high": lambda lib, a, b: lib.lerp(a, b, 0.8),
    "lerp_tensor": lambda lib, a, b: lib.lerp(a, b, b.sigmoid()),
    "addcmul": lambda lib, a, b: lib.addcmul(a, b, b * 2, value=0.5),
    "addcdiv": lambda lib, a, b: lib.addcdiv(a, b, b.abs() + 1, value=-2),
    "ldexp": lambda lib, a, b: lib.ldexp(a, lib.tensor([1, 2, 3, 0])),
    "dist": lambda lib, a, b: lib.dist(a, b, 3),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_binary_values_and_gradients_with_broadcasting(torch, name, dtype):
    a = rand(3, 4, dtype=dtype)
    b = rand(4, dtype=dtype)
    b[np.abs(b) < 0.3] = 0.7  # no division by (nearly) zero
    check(torch, BINARY[name], a, b, dtype=dtype)
    check(torch, lambda lib, x, y: BINARY[name](lib, y, x), a, b, dtype=dtype)


def test_binary_ties_and_nans_share_gradients_as_torch(torch):
    a = np.array([1.0, 2.0, np.nan, 3.0, np.nan, -1.0])
    b = np.array([1.0, 3.0, 1.0, np.nan, np.nan, -1.0])
    for name in ("maximum", "minimum", "fmax", "fmin"):
        check(torch, lambda lib, x, y, n=name: getattr(lib, n)(x, y), a, b)
    check(torch, lambda lib, x, y: lib.xlogy(x, y), np.array([0.0, 0.0, 2.0, 1.0]),
          np.array([0.0, np.nan, 3.0, 0.5]))
    check(torch, lambda lib, x, y: lib.copysign(x, y), np.array([0.0, 1.0, -2.0, 3.0]),
          np.array([-1.0, -0.0, 2.0, -3.0]))


def test_binary_integer_dtypes(torch):
    a = np.array([5, -7, 8, 3])
    b = np.array([3, 3, -3, 2])
    for name in ("atan2", "copysign", "xlogy", "fmod", "remainder", "maximum", "fmax",
                 "true_divide", "floor_divide", "gcd", "lcm", "float_power", "bitwise_and",
                 "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
                 "logical_and", "logical_xor", "heaviside"):
        check(torch, lambda lib, x, y, n=name: getattr(lib, n)(x, y.abs() if "shift" in n
                                                                  else y), a, b, grad=False,
              dtype="float32")
    check(torch, lambda lib, x, y: lib.div(x, y, rounding_mode="trunc"), a, b, grad=False)
    check(torch, lambda lib, x, y: lib.div(x, y, rounding_mode="floor"), a, b, grad=False)
    check(torch, lambda lib, x: lib.bitwise_not(x), a, grad=False)
    with pytest.raises(TypeError):
        mt.hypot(mt.tensor(a), mt.tensor(b))
    with pytest.raises(TypeError):
        mt.logaddexp(mt.tensor(a), mt.tensor(b))
    with pytest.raises(TypeError):
        mt.tensor(a).atan2_(mt.tensor(b))
    with pytest.raises(TypeError):
        mt.addcdiv(mt.tensor(a), mt.tensor(a), mt.tensor(b))
    with pytest.raises(TypeError):
        mt.lerp(mt.tensor(a), mt.tensor(b), 0.5)
    with pytest.raises(TypeError):
        mt.bitwise_and(mt.tensor([1.0]), mt.tensor([1.0]))


def test_number_first_arguments(torch):
    x = rand(4)
    check(torch, lambda lib, t: lib.pow(2, t), x)
    check(torch, lambda lib, t: lib.add(2, t), x)
    check(torch, lambda lib, t: lib.mul(3.5, t), x)


BINARY_INPLACE = ["atan2_", "hypot_", "fmod_", "remainder_", "copysign_",
                  "xlogy_", "lerp_", "addcmul_", "addcdiv_", "multiply_", "divide_",
                  "subtract_", "true_divide_", "float_power_"]


@pytest.mark.parametrize("name", BINARY_INPLACE)
def test_binary_inplace_forms(torch, name):
    a = rand(3, 4, lo=0.5, hi=3)
    b = rand(4, lo=0.5, hi=3)

    def fn(lib, x, y):
        z = x * 1.0
        extra = {"lerp_": (0.25,), "addcmul_": (y,), "addcdiv_": (y,)}.get(name, ())
        r = getattr(z, name)(y, *extra)
        assert r is z
        return z

    check(torch, fn, a, b)


def test_comparisons_aliases_and_inplace(torch):
    a = rand(3, 4).round()
    b = rand(4).round()
    for name in ("eq", "ne", "lt", "le", "gt", "ge", "greater", "greater_equal", "less",
                 "less_equal", "not_equal"):
        check(torch, lambda lib, x, y, n=name: getattr(lib, n)(x, y), a, b, grad=False)
        check(torch, lambda lib, x, y, n=name: getattr(x.clone(), n + "_")(y), a, b,
              grad=False)
        check(torch, lambda lib, x, n=name: getattr(x.clone(), n + "_")(0.0), a, grad=False)

    def fn(lib, x, y):  # recorded: the comparison's gradient is zero
        z = x * 2.0
        z.lt_(y)
        return z + x

    check(torch, fn, a, b)
    i = np.array([1, 2, 3])
    check(torch, lambda lib, x: x.clone().eq_(2.5), i, grad=False)


def test_logical_and_bitwise(torch):
    a = np.array([0.0, 1.0, -2.0, 0.0])
    b = np.array([0.0, 0.0, 3.0, 5.0])
    for name in ("logical_and", "logical_or", "logical_xor"):
        check(torch, lambda lib, x, y, n=name: getattr(lib, n)(x, y), a, b, grad=False)
        check(torch, lambda lib, x, y, n=name: getattr(x.clone(), n + "_")(y), a, b,
              grad=False)
    check(torch, lambda lib, x: lib.logical_not(x), a, grad=False)
    check(torch, lambda lib, x: x.clone().logical_not_(), a, grad=False)
    i = np.array([5, 12, -3, 0])
    j = np.array([3, 10, 6, 1])
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
                 "bitwise_right_shift"):
        check(torch, lambda lib, x, y, n=name: getattr(x.clone(), n + "_")(y), i, j,
              grad=False)
    check(torch, lambda lib, x: x.clone().bitwise_not_(), i, grad=False)
    bools = np.array([True, False, True])
    check(torch, lambda lib, x: lib.bitwise_not(x), bools, grad=False)


def test_isclose(torch):
    a = np.array([1.0, 1.0 + 1e-9, np.nan, np.inf, -np.inf, 1.0, 0.0])
    b = np.array([1.0, 1.0, np.nan, np.inf, np.inf, 1.1, 1e-9])
    check(torch, lambda lib, x, y: lib.isclose(x, y), a, b, grad=False)
    check(torch, lambda lib, x, y: lib.isclose(x, y, equal_nan=True), a, b, grad=False)
    check(torch, lambda lib, x, y: x.isclose(y, rtol=0.2, atol=0.0), a, b, grad=False)
    check(torch, lambda lib, x, y: lib.isclose(x, y), np.array([1, 2, 3]),
          np.array([1, 3, 3]), grad=False)
    with pytest.raises(TypeError):
        mt.isclose(mt.tensor([1.0]), mt.tensor([1]))


def test_clamp_min_max(torch):
    x = rand(3, 4)
    check(torch, lambda lib, t: lib.clamp_min(t, -0.5), x)
    check(torch, lambda lib, t: lib.clamp_max(t, 0.5), x)
    check(torch, lambda lib, t: (t * 1.0).clamp_min_(0.1), x)
    check(torch, lambda lib, t: (t * 1.0).clamp_max_(0.1), x)


def test_conj_and_adjoint(torch):
    x = rand(2, 3)
    check(torch, lambda lib, t: t.conj() * 2, x)
    check(torch, lambda lib, t: t.mH, x)
    check(torch, lambda lib, t: t.H, x)
    check(torch, lambda lib, t: t.adjoint(), x)
    c = (rand(2, 3) + 1j * rand(2, 3))
    check(torch, lambda lib, t: lib.conj_physical(t), c, grad=False)
    assert not mt.tensor(x).is_conj() and not mt.tensor(x).is_neg()


# --------------------------------------------------------------------------------------------
# Reductions and scans


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_cumulative_ops(torch, dtype):
    x = rand(3, 5, dtype=dtype)
    for dim in (0, 1, -1):
        check(torch, lambda lib, t, d=dim: lib.cumsum(t, d), x, dtype=dtype)
        check(torch, lambda lib, t, d=dim: t.cumprod(d), x, dtype=dtype)
        check(torch, lambda lib, t, d=dim: lib.logcumsumexp(t, d), x, dtype=dtype)
        check(torch, lambda lib, t, d=dim: tuple(lib.cummax(t, d)), x, dtype=dtype)
        check(torch, lambda lib, t, d=dim: tuple(t.cummin(d)), x, dtype=dtype)
    check(torch, lambda lib, t: (t * 1).cumsum_(1), x, dtype=dtype)
    check(torch, lambda lib, t: (t * 1).cumprod_(0), x, dtype=dtype)


def test_cumprod_gradient_with_zeros(torch):
    x = np.array([[2.0, 0.0, 3.0, 0.0, 4.0], [1.5, -2.0, 0.0, 5.0, 1.0],
                  [0.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 0.0]])
    for dim in (0, 1):
        check(torch, lambda lib, t, d=dim: lib.cumprod(t, d), x)


def test_cumulative_dtypes_ties_and_nans(torch):
    i = np.array([[1, 5, 2], [3, 3, 0]], dtype=np.int32)
    for name in ("cumsum", "cumprod"):
        check(torch, lambda lib, t, n=name: getattr(lib, n)(t, 1), i, grad=False)
        check(torch, lambda lib, t, n=name: getattr(lib, n)(t, 0), i.astype(bool),
              grad=False)
    check(torch, lambda lib, t: lib.cumsum(t, 0, dtype=lib.float64), i, grad=False)
    x = np.array([1.0, 3.0, 3.0, 2.0, np.nan, 5.0, np.nan, 0.0])
    check(torch, lambda lib, t: tuple(lib.cummax(t, 0)), x)
    check(torch, lambda lib, t: tuple(lib.cummin(t, 0)), x)
    check(torch, lambda lib, t: tuple(lib.cummax(t, 0)), np.array([1, 0, 1, 2, 2]),
          grad=False)
    big = np.array([0.0, -1000.0, 1000.0, -np.inf, 3.0])
    check(torch, lambda lib, t: lib.logcumsumexp(t, 0), big)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_reductions_with_dims(torch, dtype):
    x = rand(3, 4, 5, dtype=dtype)
    for dim, keep in ((None, False), (1, False), ((0, 2), True), (-1, True)):
        kw = {} if dim is None else {"dim": dim, "keepdim": keep}
        check(torch, lambda lib, t, k=kw: lib.amax(t, **k), x, dtype=dtype)
        check(torch, lambda lib, t, k=kw: t.amin(**k), x, dtype=dtype)
        check(torch, lambda lib, t, k=kw: lib.nansum(t, **k), x, dtype=dtype)
        check(torch, lambda lib, t, k=kw: lib.nanmean(t, **k), x, dtype=dtype)
        check(torch, lambda lib, t, k=kw: lib.count_nonzero(t.round(), **(
            {"dim": k["dim"]} if k else {})), x, dtype=dtype)
        if dim is not None:
            check(torch, lambda lib, t, d=dim, k=keep: lib.logsumexp(t, d, k), x, dtype=dtype)
            check(torch, lambda lib, t, d=dim, k=keep: lib.prod(t, d if isinstance(d, int)
                                                                 else 1, k), x, dtype=dtype)
    check(torch, lambda lib, t: lib.prod(t), x[0], dtype=dtype)
    check(torch, lambda lib, t: tuple(lib.aminmax(t)), x, dtype=dtype)
    check(torch, lambda lib, t: tuple(lib.aminmax(t, dim=1, keepdim=True)), x, dtype=dtype)


def test_amax_amin_keep_an_empty_dim_they_do_not_reduce(torch):
    empty = np.zeros((0, 3, 2))
    for dim in (1, (1, 2), -1):
        check(torch, lambda lib, t, d=dim: lib.amax(t, d), empty)
        check(torch, lambda lib, t, d=dim: t.amin(d, keepdim=True), empty)
    for dim in (0, (0, 1), ()):  # reducing the empty dim has no extreme, in both libraries
        with pytest.raises(ValueError, match="cannot reduce an empty dim"):
            mt.amax(mt.tensor(empty), dim)
        with pytest.raises((IndexError, RuntimeError)):
            torch.amax(torch.tensor(empty), dim)


def test_reductions_ties_zeros_and_nans(torch):
    ties = np.array([[1.0, 3.0, 3.0, 1.0], [2.0, 2.0, 2.0, 0.0]])
    check(torch, lambda lib, t: lib.amax(t, 1), ties)
    check(torch, lambda lib, t: lib.amin(t), ties)
    zeros = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 1.0], [1.0, 2.0, 3.0]])
    check(torch, lambda lib, t: lib.prod(t, 1), zeros)
    check(torch, lambda lib, t: lib.prod(t, 0, keepdim=True), zeros)
    check(torch, lambda lib, t: lib.prod(t), zeros[2:])
    check(torch, lambda lib, t: lib.prod(t), zeros)
    nans = np.array([[1.0, np.nan, 2.0], [np.nan, np.nan, np.nan]])
    check(torch, lambda lib, t: lib.nansum(t, 1), nans)
    check(torch, lambda lib, t: lib.nanmean(t, 1), nans)
    check(torch, lambda lib, t: lib.logsumexp(t, 1),
          np.array([[-np.inf, -np.inf], [np.inf, 1.0], [1000.0, 1000.0]]), grad=False)
    check(torch, lambda lib, t: lib.logsumexp(t, 0), np.array([1, 2, 3]), grad=False,
          dtype="float32")
    check(torch, lambda lib, t: lib.prod(t, 1), np.array([[1, 2], [3, 4]], dtype=np.int32),
          grad=False)
    with pytest.raises(TypeError):
        mt.nanmean(mt.tensor([1, 2]))


def test_var_std_signatures(torch):
    x = rand(4, 6)
    for call in (lambda lib, t: t.var(), lambda lib, t: t.std(1),
                 lambda lib, t: t.var(1, False), lambda lib, t: t.std(0, True, True),
                 lambda lib, t: t.var(False), lambda lib, t: t.var(dim=1, unbiased=False),
                 lambda lib, t: t.std(dim=(0, 1), correction=2, keepdim=True),
                 lambda lib, t: lib.var(t, 0, correction=0),
                 lambda lib, t: tuple(lib.std_mean(t, 1)),
                 lambda lib, t: tuple(lib.var_mean(t, dim=0, correction=0))):
        check(torch, call, x)
    with pytest.raises(ValueError):
        mt.tensor(x).var(0, True, correction=1)


def test_median_mode_kthvalue(torch):
    x = np.array([[3.0, 1.0, 2.0, 1.0, 3.0, 3.0, 1.0], [5.0, 5.0, 4.0, 4.0, 0.0, 0.0, 7.0]])
    for fn in (lambda lib, t: lib.median(t), lambda lib, t: t.nanmedian()):
        check(torch, fn, x)
    u = rand(4, 7)  # no ties: the indices are torch's
    for dim, keep in ((1, False), (0, True), (-1, False)):
        check(torch, lambda lib, t, d=dim, k=keep: tuple(lib.median(t, d, k)), u)
        check(torch, lambda lib, t, d=dim, k=keep: tuple(t.nanmedian(d, k)), u)
        check(torch, lambda lib, t, d=dim, k=keep: tuple(lib.kthvalue(t, 2, d, k)), u)
        check(torch, lambda lib, t, d=dim, k=keep: tuple(lib.mode(t.round(), d, k)), u,
              grad=False)
    check(torch, lambda lib, t: tuple(lib.mode(t, 1)), x, grad=False)
    check(torch, lambda lib, t: tuple(lib.mode(t)), np.array([1, 2, 2, 1, 3]), grad=False)
    # with ties, the values are torch's and each index holds its value
    ours = mt.tensor(x).median(1)
    assert_close(ours.values, torch.tensor(x).median(1).values)
    assert (np.take_along_axis(x, _np(ours.indices)[:, None], 1)[:, 0] == _np(ours.values)).all()
    nan = np.array([[1.0, np.nan, 0.0, np.nan], [2.0, 1.0, 3.0, 4.0]])
    check(torch, lambda lib, t: lib.median(t), nan)
    check(torch, lambda lib, t: lib.nanmedian(t), nan)
    check(torch, lambda lib, t: tuple(lib.median(t, 1)), nan)
    check(torch, lambda lib, t: tuple(lib.nanmedian(t, 1)), nan)
    check(torch, lambda lib, t: lib.kthvalue(t, 4, 1).values, nan)
    check(torch, lambda lib, t: lib.msort(t), u)
    with pytest.raises(ValueError):
        mt.tensor(u).kthvalue(8, 1)


NORMS = [
    lambda lib, t: lib.norm(t),
    lambda lib, t: t.norm(1),
    lambda lib, t: t.norm(3, dim=1),
    lambda lib, t: lib.norm(t, float("inf"), dim=0, keepdim=True),
    lambda lib, t: lib.norm(t, -float("inf")),
    lambda lib, t: lib.norm(t, 0.5, dim=(0, 1)),
    lambda lib, t: lib.norm(t, "fro", dim=(0, 1)),
    lambda lib, t: lib.norm(t, "nuc"),
    lambda lib, t: lib.linalg.vector_norm(t, 2, dim=-1),
    lambda lib, t: lib.linalg.vector_norm(t, float("inf")),
    lambda lib, t: lib.linalg.matrix_norm(t),
    lambda lib, t: lib.linalg.matrix_norm(t, 1),
    lambda lib, t: lib.linalg.matrix_norm(t, -1),
    lambda lib, t: lib.linalg.matrix_norm(t, float("inf"), keepdim=True),
    lambda lib, t: lib.linalg.matrix_norm(t, 2),
    lambda lib, t: lib.linalg.matrix_norm(t, -2),
    lambda lib, t: lib.linalg.matrix_norm(t, "nuc"),
    lambda lib, t: lib.linalg.norm(t),
    lambda lib, t: lib.linalg.norm(t, 2),
    lambda lib, t: lib.linalg.norm(t, dim=1),
    lambda lib, t: lib.linalg.norm(t, 1, dim=(1, 0)),
    lambda lib, t: lib.linalg.norm(t[0], 3),
]


@pytest.mark.parametrize("k", range(len(NORMS)))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_norms(torch, k, dtype):
    check(torch, NORMS[k], rand(4, 5, dtype=dtype), dtype=dtype,
          rtol=None if dtype == "float64" else 2e-5)


def test_norm_gradients_at_zero_and_ties(torch):
    z = np.array([0.0, 0.0, 3.0, -3.0, 1.0])
    for p in (1, 2, 3, 0.5, float("inf"), -float("inf")):
        check(torch, lambda lib, t, p=p: lib.norm(t, p), z)
    check(torch, lambda lib, t: lib.norm(t * 0.0), z)
    check(torch, lambda lib, t: lib.norm(t, 0), z, grad=False)
    with pytest.raises(TypeError):
        mt.norm(mt.tensor([1, 2]))


# --------------------------------------------------------------------------------------------
# Linear algebra

LINALG = {
    "mm": (lambda lib, a, b: lib.mm(a, b), [(3, 4), (4, 2)]),
    "bmm": (lambda lib, a, b: lib.bmm(a, b), [(2, 3, 4), (2, 4, 5)]),
    "mv": (lambda lib, a, b: lib.mv(a, b), [(3, 4), (4,)]),
    "dot": (lambda lib, a, b: lib.dot(a, b), [(5,), (5,)]),
    "vdot": (lambda lib, a, b: lib.vdot(a, b), [(5,), (5,)]),
    "inner": (lambda lib, a, b: lib.inner(a, b), [(2, 3, 4), (5, 4)]),
    "outer": (lambda lib, a, b: lib.outer(a, b), [(3,), (4,)]),
    "ger": (lambda lib, a, b: a.ger(b), [(3,), (4,)]),
    "addmm": (lambda lib, c, a: lib.addmm(c, a, a.t(), beta=0.5, alpha=2), [(3,), (3, 4)]),
    "addmm_beta0": (lambda lib, c, a: lib.addmm(c * float("nan"), a, a.t(), beta=0),
                    [(3, 3), (3, 4)]),
    "addbmm": (lambda lib, c, a: lib.addbmm(c, a, a.mT, alpha=-1), [(3, 3), (2, 3, 4)]),
    "baddbmm": (lambda lib, c, a: lib.baddbmm(c, a, a.mT, beta=2), [(1, 3), (2, 3, 4)]),
    "addmv": (lambda lib, c, a, v: lib.addmv(c, a, v, alpha=3), [(3,), (3, 4), (4,)]),
    "addr": (lambda lib, c, a, v: lib.addr(c, a, v, beta=-1), [(3, 4), (3,), (4,)]),
    "kron": (lambda lib, a, b: lib.kron(a, b), [(2, 3), (4, 2)]),
    "kron_nd": (lambda lib, a, b: lib.kron(a, b), [(2, 1, 3), (3, 2)]),
    "tensordot": (lambda lib, a, b: lib.tensordot(a, b, dims=([1, 2], [1, 0])),
                  [(2, 3, 4), (4, 3, 5)]),
    "tensordot_int": (lambda lib, a, b: lib.tensordot(a, b, 1), [(2, 3), (3, 4)]),
    "trace": (lambda lib, a: lib.trace(a), [(4, 4)]),
    "tril": (lambda lib, a: lib.tril(a, -1), [(2, 4, 5)]),
    "triu": (lambda lib, a: a.triu(1), [(4, 5)]),
    "tril_": (lambda lib, a: (a * 1).tril_(), [(4, 5)]),
    "triu_": (lambda lib, a: (a * 1).triu_(2), [(3, 5)]),
    "diag_vec": (lambda lib, a: lib.diag(a, 1), [(4,)]),
    "diag_mat": (lambda lib, a: lib.diag(a, -1), [(4, 5)]),
    "diagonal": (lambda lib, a: lib.diagonal(a, 1, 0, 2), [(3, 2, 4)]),
    "diag_embed": (lambda lib, a: lib.diag_embed(a, 1, 0, 2), [(3, 4)]),
    "diag_embed_default": (lambda lib, a: lib.diag_embed(a), [(2, 3)]),
    "diagflat": (lambda lib, a: lib.diagflat(a, -1), [(2, 2)]),
    "inverse": (lambda lib, a: lib.inverse(a), [(2, 3, 3)]),
    "det": (lambda lib, a: lib.det(a), [(2, 3, 3)]),
    "logdet": (lambda lib, a: lib.logdet(a @ a.mT + lib.eye(3, dtype=a.dtype)), [(3, 3)]),
    "slogdet": (lambda lib, a: tuple(reversed(lib.slogdet(a))), [(3, 3)]),
    "matrix_power3": (lambda lib, a: lib.matrix_power(a, 3), [(3, 3)]),
    "matrix_power_neg": (lambda lib, a: lib.matrix_power(a, -2), [(2, 3, 3)]),
    "linalg_inv": (lambda lib, a: lib.linalg.inv(a), [(3, 3)]),
    "linalg_det": (lambda lib, a: lib.linalg.det(a), [(3, 3)]),
    "linalg_solve": (lambda lib, a, b: lib.linalg.solve(a, b), [(3, 3), (3, 2)]),
    "linalg_solve_vec": (lambda lib, a, b: lib.linalg.solve(a, b), [(2, 3, 3), (2, 3)]),
    "linalg_solve_right": (lambda lib, a, b: lib.linalg.solve(a, b, left=False),
                           [(3, 3), (2, 3)]),
    "linalg_cross": (lambda lib, a, b: lib.linalg.cross(a, b), [(4, 3), (4, 3)]),
    "cross": (lambda lib, a, b: lib.cross(a, b, dim=0), [(3, 4), (3, 1)]),
    "multi_dot": (lambda lib, a, b: lib.linalg.multi_dot([a, b, a.t()]), [(3, 4), (4, 4)]),
    "vecdot": (lambda lib, a, b: lib.linalg.vecdot(a, b), [(3, 4), (4,)]),
}


@pytest.mark.parametrize("name", sorted(LINALG))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_linear_algebra(torch, name, dtype):
    fn, shapes = LINALG[name]
    arrays = [rand(*s, dtype=dtype) for s in shapes]
    if name.startswith(("inverse", "det", "linalg_inv", "linalg_det", "linalg_solve",
                        "matrix_power")):  # well conditioned
        arrays[0] = arrays[0] + 4 * np.eye(arrays[0].shape[-1], dtype=dtype)
    check(torch, fn, *arrays, dtype=dtype, rtol=None if dtype == "float64" else 1e-4,
          atol=None if dtype == "float64" else 1e-5)


EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("ii", [(4, 4)]),
    ("ii->i", [(4, 4)]),
    ("iij->ji", [(3, 3, 2)]),
    ("i,i->", [(5,), (5,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ijk->", [(2, 3, 4)]),
    ("ij->", [(2, 3)]),
    ("ij,ik->j", [(3, 4), (3, 5)]),
    ("...i->...", [(2, 3, 4)]),
    ("b i , b j -> b i j", [(2, 3), (2, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("i,i,i->i", [(4,), (4,), (4,)]),
]


@pytest.mark.parametrize("k", range(len(EINSUM)))
def test_einsum(torch, k):
    eq, shapes = EINSUM[k]
    arrays = [rand(*s) for s in shapes]
    check(torch, lambda lib, *ts: lib.einsum(eq, *ts), *arrays)
    check(torch, lambda lib, *ts: lib.einsum(eq, list(ts)), *arrays, grad=False)


def test_det_of_singular_matrices_and_logdet_of_negative(torch):
    s = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])  # rank 2
    check(torch, lambda lib, a: lib.det(a), s, grad=False)
    # the gradient is the cofactor matrix, also for a singular matrix (checked against
    # finite differences: torch 2.13 answers zeros here)
    t = mt.tensor(s, requires_grad=True)
    t.det().backward()
    eps, fd = 1e-6, np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            e = np.zeros((3, 3))
            e[i, j] = eps
            fd[i, j] = (np.linalg.det(s + e) - np.linalg.det(s - e)) / (2 * eps)
    np.testing.assert_allclose(_np(t.grad), fd, atol=1e-8)
    neg = np.array([[0.0, 1.0], [1.0, 0.0]])
    check(torch, lambda lib, a: lib.logdet(a), neg, grad=False)
    check(torch, lambda lib, a: tuple(reversed(lib.slogdet(a))), neg)


def test_diagonal_is_a_writable_view(torch):
    for lib in (mt, torch):
        a = lib.zeros(3, 3)
        d = a.diagonal()
        d += 1
        a.diagonal(1).fill_(5)
        assert a.tolist() == [[1.0, 5.0, 0.0], [0.0, 1.0, 5.0], [0.0, 0.0, 1.0]]
    x = rand(3, 3)

    def fn(lib, t):
        y = t * 2
        y.diagonal().mul_(3)
        return y

    check(torch, fn, x)


def test_matrix_power_zero_and_bad_inputs(torch):
    a = rand(2, 3, 3)
    check(torch, lambda lib, t: lib.matrix_power(t, 0), a, grad=False)
    check(torch, lambda lib, t: lib.matrix_power(t, 1), a)
    bad = [
        (ValueError, lambda: mt.mm(mt.ones(3), mt.ones(3, 2))),
        (ValueError, lambda: mt.mm(mt.ones(3, 2), mt.ones(3, 2))),
        (TypeError, lambda: mt.mm(mt.ones(3, 2), mt.ones(2, 2, dtype=mt.float64))),
        (ValueError, lambda: mt.bmm(mt.ones(3, 2), mt.ones(2, 2))),
        (ValueError, lambda: mt.mv(mt.ones(3, 2), mt.ones(3))),
        (TypeError, lambda: mt.dot(mt.ones(3), mt.ones(3, dtype=mt.int64))),
        (ValueError, lambda: mt.dot(mt.ones(3), mt.ones(4))),
        (ValueError, lambda: mt.inverse(mt.ones(2, 3))),
        (TypeError, lambda: mt.det(mt.ones(2, 2, dtype=mt.int64))),
        (ValueError, lambda: mt.inverse(mt.zeros(2, 2))),
        (ValueError, lambda: mt.tril(mt.ones(3))),
        (ValueError, lambda: mt.diag(mt.ones(2, 2, 2))),
        (ValueError, lambda: mt.diagonal(mt.ones(2, 2), 0, 1, 1)),
        (ValueError, lambda: mt.einsum("ij,jk->ik", mt.ones(2, 3))),
        (ValueError, lambda: mt.einsum("ijk->i", mt.ones(2, 3))),
        (ValueError, lambda: mt.einsum("ij->k", mt.ones(2, 3))),
        (ValueError, lambda: mt.tensordot(mt.ones(2, 3), mt.ones(2, 3), 1)),
        (ValueError, lambda: mt.trace(mt.ones(3))),
        (ValueError, lambda: mt.cross(mt.ones(2, 2), mt.ones(2, 2))),
        (ValueError, lambda: mt.linalg.matrix_norm(mt.ones(3))),
        (ValueError, lambda: mt.linalg.matrix_norm(mt.ones(3, 3), "bad")),
    ]
    for exc, call in bad:
        with pytest.raises(exc):
            call()


# --------------------------------------------------------------------------------------------
# Gather, scatter and friends

IDX = np.array([[0, 2, 1], [1, 1, 0]])


def _ix(lib, a):
    return lib.tensor(a)


GATHER_SCATTER = {
    "gather0": (lambda lib, x: lib.gather(x, 0, _ix(lib, IDX)), [(3, 4)]),
    "gather1": (lambda lib, x: x.gather(1, _ix(lib, IDX)), [(2, 5)]),
    "gather_int32": (lambda lib, x: x.gather(1, lib.tensor(IDX).int()), [(2, 5)]),
    "scatter_src": (lambda lib, x, s: lib.scatter(x, 1, _ix(lib, [[0, 2], [1, 3]]), s),
                    [(2, 4), (2, 2)]),
    "scatter_value": (lambda lib, x: x.scatter(0, _ix(lib, [[1, 0, 2]]), 7.5), [(3, 3)]),
    "scatter_value_kw": (lambda lib, x: x.scatter(0, _ix(lib, [[1, 0, 2]]), value=-1.0),
                         [(3, 3)]),
    "scatter_add": (lambda lib, x, s: lib.scatter_add(x, 0, _ix(lib, IDX), s),
                    [(3, 3), (2, 3)]),
    "scatter_add_": (lambda lib, x, s: (x * 1).scatter_add_(1, _ix(lib, IDX), s),
                     [(2, 3), (2, 3)]),
    "scatter_": (lambda lib, x, s: (x * 1).scatter_(1, _ix(lib, [[2], [0]]), s),
                 [(2, 3), (2, 1)]),
    "index_select": (lambda lib, x: lib.index_select(x, 1, _ix(lib, [3, 0, 3])), [(2, 4)]),
    "index_select0": (lambda lib, x: x.index_select(0, _ix(lib, [1])), [(2, 4)]),
    "index_add": (lambda lib, x, s: lib.index_add(x, 0, _ix(lib, [2, 0, 2]), s, alpha=2),
                  [(3, 2), (3, 2)]),
    "index_add_": (lambda lib, x, s: (x * 1).index_add_(1, _ix(lib, [1, 1]), s),
                   [(3, 2), (3, 2)]),
    "index_copy": (lambda lib, x, s: lib.index_copy(x, 0, _ix(lib, [2, 0]), s),
                   [(3, 2), (2, 2)]),
    "index_copy_": (lambda lib, x, s: (x * 1).index_copy_(1, _ix(lib, [1]), s),
                    [(3, 2), (3, 1)]),
    "index_fill": (lambda lib, x: lib.index_fill(x, 1, _ix(lib, [0, 2]), -1.5), [(2, 3)]),
    "index_fill_tensor": (lambda lib, x, v: x.index_fill(0, _ix(lib, [1]), v.sum()),
                          [(2, 3), (2,)]),
    "index_fill_": (lambda lib, x: (x * 1).index_fill_(0, _ix(lib, [1]), 2.0), [(2, 3)]),
    "masked_select": (lambda lib, x: lib.masked_select(x, x > 0), [(3, 4)]),
    "masked_select_bcast": (lambda lib, x: x.masked_select(
        lib.tensor([True, False, True, True])), [(3, 4)]),
    "masked_scatter": (lambda lib, x, s: lib.masked_scatter(x, x > 0, s), [(3, 4), (12,)]),
    "masked_scatter_": (lambda lib, x, s: (x * 1).masked_scatter_(
        lib.tensor([True, False, True, False]), s), [(2, 4), (3, 3)]),
    "take": (lambda lib, x: lib.take(x, _ix(lib, [[0, 5], [-1, 5]])), [(2, 3)]),
    "take_along_dim": (lambda lib, x: lib.take_along_dim(x, _ix(lib, [[1], [0]]), 1),
                       [(2, 3)]),
    "take_along_dim_bcast": (lambda lib, x: lib.take_along_dim(
        x, _ix(lib, [[[1, 0]]]), 2), [(2, 3, 4)]),
    "take_along_dim_flat": (lambda lib, x: lib.take_along_dim(x, _ix(lib, [4, 0, 4])),
                            [(2, 3)]),
    "put": (lambda lib, x, s: x.put(_ix(lib, [0, 5, -2]), s), [(2, 3), (3,)]),
    "put_accumulate": (lambda lib, x, s: x.put(_ix(lib, [1, 1, 4]), s, True),
                       [(2, 3), (3,)]),
    "put_": (lambda lib, x, s: (x * 1).put_(_ix(lib, [[0, 2]]), s), [(2, 3), (1, 2)]),
    "nonzero": (lambda lib, x: lib.nonzero(x.round()), [(3, 4)]),
    "nonzero_tuple": (lambda lib, x: lib.nonzero(x.round(), as_tuple=True), [(3, 4)]),
    "argwhere": (lambda lib, x: lib.argwhere(x.round()), [(3, 4)]),
}


@pytest.mark.parametrize("name", sorted(GATHER_SCATTER))
def test_gather_scatter_and_index_ops(torch, name):
    fn, shapes = GATHER_SCATTER[name]
    check(torch, fn, *[rand(*s) for s in shapes])


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter_with_a_larger_src_and_the_old_reduce(torch):
    x, s = rand(2, 4), rand(3, 5)
    idx = np.array([[0, 2], [1, 3]])
    check(torch, lambda lib, t, u: lib.scatter(t, 1, lib.tensor(idx), u), x, s, grad=False)
    check(torch, lambda lib, t, u: t.scatter_add(1, lib.tensor(idx), u), x, s, grad=False)
    for reduce in ("add", "multiply"):
        check(torch, lambda lib, t, u, r=reduce: t.scatter(1, lib.tensor(idx), u, reduce=r),
              x, s, grad=False)
        check(torch, lambda lib, t, r=reduce: t.scatter(1, lib.tensor(idx), 2.5, reduce=r),
              x, grad=False)
    # torch has no derivative for the old reduce=; ours is scatter_add's
    t = mt.tensor(x, requires_grad=True)
    u = mt.tensor(s[:2, :2].copy(), requires_grad=True)
    t.scatter(1, mt.tensor(idx), u, reduce="add").sum().backward()
    assert t.grad.tolist() == np.ones((2, 4)).tolist()
    assert u.grad.tolist() == np.ones((2, 2)).tolist()
    # src larger than the index: its extra elements get zero gradient
    u = mt.tensor(s, requires_grad=True)
    mt.tensor(x).scatter(1, mt.tensor(idx), u).sum().backward()
    assert _np(u.grad).sum() == 4 and _np(u.grad)[:2, :2].tolist() == [[1, 1], [1, 1]]


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(torch, reduce, include_self):
    x = rand(3, 4)
    x[0, 1] = 0.0  # a zero for prod's gradient
    src = rand(2, 4)
    src[1, 2] = 0.0
    src[0, 3] = src[1, 3]  # a tie for amax/amin
    idx = np.array([[0, 1, 0, 2], [0, 1, 2, 2]])
    check(torch, lambda lib, t, s: lib.scatter_reduce(t, 0, lib.tensor(idx), s, reduce,
                                                      include_self=include_self), x, src)
    check(torch, lambda lib, t, s: (t * 1).scatter_reduce_(0, lib.tensor(idx), s, reduce,
                                                           include_self=include_self), x, src)
    i = np.array([[1, 2, 3], [4, 5, 6]])
    check(torch, lambda lib, t, s: t.scatter_reduce(1, lib.tensor([[0, 0], [1, 1]]), s[:, :2],
                                                    reduce, include_self=include_self),
          i, i, grad=False)


def test_gather_scatter_bad_inputs():
    x = mt.ones(2, 3)
    bad = [
        (ValueError, lambda: x.gather(1, mt.tensor([0, 1]))),
        (IndexError, lambda: x.gather(1, mt.tensor([[3]]))),
        (IndexError, lambda: x.gather(1, mt.tensor([[-1]]))),
        (TypeError, lambda: x.gather(1, mt.tensor([[0.0]]))),
        (ValueError, lambda: x.gather(1, mt.tensor([[0], [0], [1]]))),
        (ValueError, lambda: x.scatter_reduce(0, mt.tensor([[0]]), mt.ones(1, 1), "max")),
        (ValueError, lambda: x.scatter(0, mt.tensor([[0]]), mt.ones(1, 1), reduce="sum")),
        (TypeError, lambda: x.scatter(0, mt.tensor([[0]]), "a")),
        (IndexError, lambda: x.index_select(1, mt.tensor([-1]))),
        (ValueError, lambda: x.index_select(1, mt.tensor([[0]]))),
        (ValueError, lambda: x.index_add(0, mt.tensor([0]), mt.ones(1, 2))),
        (ValueError, lambda: x.index_fill(0, mt.tensor([0]), mt.ones(2))),
        (TypeError, lambda: x.masked_select(mt.tensor([1, 0, 1]))),
        (ValueError, lambda: x.masked_scatter(x > 0, mt.ones(2))),
        (IndexError, lambda: x.take(mt.tensor([6]))),
        (ValueError, lambda: x.put(mt.tensor([0, 1]), mt.ones(3))),
    ]
    for exc, call in bad:
        with pytest.raises(exc):
            call()
    leaf = mt.ones(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError):
        leaf.scatter_(0, mt.tensor([[0]]), 2.0)
    with pytest.raises(RuntimeError):
        leaf.index_fill_(0, mt.tensor([0]), 2.0)


# --------------------------------------------------------------------------------------------
# Shapes and arrangements

SHAPE_OPS = {
    "flip": (lambda lib, x: lib.flip(x, (0, 2)), (2, 3, 4)),
    "flip_method": (lambda lib, x: x.flip(-1), (2, 3)),
    "fliplr": (lambda lib, x: lib.fliplr(x), (2, 3)),
    "flipud": (lambda lib, x: x.flipud(), (3, 2)),
    "roll": (lambda lib, x: lib.roll(x, 2), (2, 3)),
    "roll_dims": (lambda lib, x: x.roll((1, -2), (0, 1)), (3, 4)),
    "rot90": (lambda lib, x: lib.rot90(x), (2, 3)),
    "rot90_k": (lambda lib, x: lib.rot90(x, -3, (1, 2)), (2, 3, 4)),
    "narrow": (lambda lib, x: lib.narrow(x, 1, 1, 2), (3, 4)),
    "narrow_neg": (lambda lib, x: x.narrow(-1, -3, 2), (3, 4)),
    "select": (lambda lib, x: lib.select(x, 1, -1), (3, 4)),
    "movedim": (lambda lib, x: lib.movedim(x, 0, -1), (2, 3, 4)),
    "movedim_tuple": (lambda lib, x: x.moveaxis((0, 1), (2, 0)), (2, 3, 4)),
    "swapdims": (lambda lib, x: lib.swapdims(x, 0, 2), (2, 3, 4)),
    "swapaxes": (lambda lib, x: lib.swapaxes(x, 0, 1), (2, 3)),
    "ravel": (lambda lib, x: lib.ravel(x.t()), (2, 3)),
    "unflatten": (lambda lib, x: lib.unflatten(x, 1, (2, -1)), (3, 6)),
    "broadcast_to": (lambda lib, x: lib.broadcast_to(x, (2, 3, 4)), (3, 1)),
    "repeat_interleave": (lambda lib, x: lib.repeat_interleave(x, 2), (2, 3)),
    "repeat_interleave_dim": (lambda lib, x: x.repeat_interleave(3, dim=1), (2, 3)),
    "repeat_interleave_tensor": (lambda lib, x: x.repeat_interleave(
        lib.tensor([1, 0, 2]), dim=0), (3, 2)),
    "tile": (lambda lib, x: lib.tile(x, (2,)), (2, 3)),
    "tile_more": (lambda lib, x: x.tile(2, 1, 2), (2, 3)),
    "chunk": (lambda lib, x: lib.chunk(x, 3, 1), (2, 7)),
    "split": (lambda lib, x: lib.split(x, [1, 3], 1), (2, 4)),
    "split_with_sizes": (lambda lib, x: x.split_with_sizes([2, 1]), (3, 2)),
    "tensor_split": (lambda lib, x: lib.tensor_split(x, 3, 1), (2, 7)),
    "tensor_split_idx": (lambda lib, x: x.tensor_split([1, 5, 9], dim=1), (2, 7)),
    "tensor_split_tensor": (lambda lib, x: x.tensor_split(lib.tensor(4)), (9,)),
    "hsplit": (lambda lib, x: lib.hsplit(x, 2), (3, 4)),
    "hsplit_idx": (lambda lib, x: lib.hsplit(x, [1, 2]), (6,)),
    "vsplit": (lambda lib, x: lib.vsplit(x, [1]), (3, 4)),
    "dsplit": (lambda lib, x: lib.dsplit(x, 2), (2, 3, 4)),
    "unbind": (lambda lib, x: lib.unbind(x, 1), (2, 3)),
    "diff": (lambda lib, x: lib.diff(x), (3, 5)),
    "diff_n": (lambda lib, x: x.diff(2, 0), (5, 3)),
    "diff_pre_app": (lambda lib, x: lib.diff(x, 1, -1, prepend=x[:, :1] * 2,
                                             append=x[:, -2:]), (3, 4)),
    "atleast_1d": (lambda lib, x: lib.atleast_1d(x.sum()), (2,)),
    "atleast_2d": (lambda lib, x: lib.atleast_2d(x), (3,)),
    "atleast_3d": (lambda lib, x: lib.atleast_3d(x), (2, 3)),
    "atleast_3d_vec": (lambda lib, x: lib.atleast_3d(x), (3,)),
    "cartesian_prod_one": (lambda lib, x: lib.cartesian_prod(x), (3,)),
    "clone": (lambda lib, x: lib.clone(x), (2,)),
    "t": (lambda lib, x: lib.t(x), (2, 3)),
}


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_ops(torch, name):
    fn, shape = SHAPE_OPS[name]

    def joined(lib, x):
        r = fn(lib, x)
        return tuple(r) if isinstance(r, (tuple, list)) else r

    out = check(torch, joined, rand(*shape))
    if isinstance(out, tuple) and len(out) > 1:  # the pieces' gradients, all of them
        check(torch, lambda lib, x: lib.cat([p.reshape(-1) * (i + 1) for i, p in
                                            enumerate(fn(lib, x))]), rand(*shape))


def test_views_share_storage_as_in_torch():
    x = mt.arange(12.0).reshape(3, 4)
    x.narrow(1, 1, 2).zero_()
    x.select(0, 2).fill_(-1)
    x.movedim(0, 1)[0, 0] = 100
    assert x.tolist() == [[100.0, 0.0, 0.0, 3.0], [4.0, 0.0, 0.0, 7.0],
                          [-1.0, -1.0, -1.0, -1.0]]
    y = mt.arange(6.0)
    y.unflatten(0, (2, 3))[1, 1] = 9
    assert y[4].item() == 9.0
    a, b = mt.arange(4.0).tensor_split(2)
    b[0] = 7
    assert mt.arange(4.0).tensor_split(2)[1].tolist() != b.tolist()


def test_functions_of_several_tensors(torch):
    a, b, c = rand(2, 3), rand(2, 3), rand(3)
    for name in ("hstack", "vstack", "dstack", "column_stack", "row_stack"):
        check(torch, lambda lib, x, y, n=name: getattr(lib, n)([x, y]), a, b)
    check(torch, lambda lib, x, y: lib.hstack([x, y]), c, c)
    check(torch, lambda lib, x, y: lib.column_stack([x, y]), c, c)
    check(torch, lambda lib, x, y: lib.vstack((x, y)), a, c)
    check(torch, lambda lib, x, y: lib.dstack([x, y]), c, c)
    check(torch, lambda lib, x, y: tuple(lib.broadcast_tensors(x, y)), rand(2, 1), c)
    check(torch, lambda lib, x, y: lib.block_diag(x, y, x[0, 0]), a, rand(2, 2))
    check(torch, lambda lib, x, y: lib.concatenate([x, y], 1), a, b)
    for indexing in ("ij", "xy"):
        check(torch, lambda lib, x, y, z, i=indexing: tuple(lib.meshgrid(x, y, z, indexing=i)),
              rand(2), rand(3), rand(4))
    check(torch, lambda lib, x, y: tuple(lib.meshgrid(x, y, indexing="ij")), rand(2), rand(3))
    check(torch, lambda lib, x, y, z: lib.cartesian_prod(x, y, z), rand(2), rand(3), rand(2))
    assert tuple(mt.broadcast_shapes((2, 1), (3,), 1)) == tuple(
        torch.broadcast_shapes((2, 1), (3,), 1))
    for args in ((3, 4), (4, 3, 1), (3, 3, -1), (0, 2)):
        for name in ("tril_indices", "triu_indices"):
            assert getattr(mt, name)(*args).tolist() == getattr(torch, name)(*args).tolist()


def test_diff_of_bools_and_integers(torch):
    check(torch, lambda lib, x: lib.diff(x), np.array([True, True, False, True]), grad=False)
    check(torch, lambda lib, x: lib.diff(x, 2), np.array([1, 4, 9, 16]), grad=False)
    check(torch, lambda lib, x: lib.diff(x, append=lib.tensor([0])), np.array([3, 1]),
          grad=False)


@pytest.mark.filterwarnings("ignore:Using torch.cross without specifying the dim")
def test_cross_default_dim_and_repeat_interleave_forms(torch):
    check(torch, lambda lib, a, b: lib.cross(a, b), rand(2, 3, 3), rand(2, 3, 3))
    check(torch, lambda lib, r: lib.repeat_interleave(r), np.array([2, 0, 3]), grad=False)
    check(torch, lambda lib, x: lib.repeat_interleave(x, lib.tensor([2])), rand(3))
    with pytest.raises(ValueError):
        mt.repeat_interleave(mt.ones(3), mt.tensor([1, 2]))
    with pytest.raises(ValueError):
        mt.repeat_interleave(mt.ones(3), -1)


def test_shape_ops_bad_inputs():
    x = mt.ones(3, 4)
    bad = [
        (IndexError, lambda: x.narrow(1, 3, 2)),
        (IndexError, lambda: x.select(0, 3)),
        (ValueError, lambda: x.movedim((0, 1), 0)),
        (ValueError, lambda: x.movedim((0, 0), (0, 1))),
        (ValueError, lambda: x.unflatten(1, (3, 2))),
        (ValueError, lambda: x.roll((1, 2), 0)),
        (ValueError, lambda: x.rot90(1, (0, 0))),
        (ValueError, lambda: x.hsplit(3)),
        (ValueError, lambda: mt.ones(3).vsplit(1)),
        (ValueError, lambda: x.dsplit(2)),
        (ValueError, lambda: x.tensor_split(0)),
        (ValueError, lambda: mt.ones(2).fliplr()),
        (ValueError, lambda: mt.meshgrid(mt.ones(2, 2))),
        (ValueError, lambda: mt.meshgrid(mt.ones(2), indexing="ab")),
        (TypeError, lambda: mt.hstack([mt.ones(2), [1.0]])),
        (ValueError, lambda: mt.broadcast_tensors(mt.ones(2), mt.ones(3))),
        (IndexError, lambda: mt.ones(3).flip(1)),
    ]
    for exc, call in bad:
        with pytest.raises(exc):
            call()


# --------------------------------------------------------------------------------------------
# Counting and searching


def test_bincount_histc(torch):
    i = np.array([0, 2, 2, 5, 1])
    check(torch, lambda lib, x: lib.bincount(x), i, grad=False)
    check(torch, lambda lib, x: x.bincount(minlength=9), i, grad=False)
    for w in (rand(5), rand(5).astype("float32"), np.arange(5)):
        check(torch, lambda lib, x, y: lib.bincount(x, y), i, w, grad=False,
              dtype="float32" if w.dtype == np.float32 else "float64")
    x = rand(200)
    check(torch, lambda lib, t: lib.histc(t, 10), x, grad=False)
    check(torch, lambda lib, t: lib.histc(t, bins=7, min=-1, max=2), x, grad=False)
    check(torch, lambda lib, t: t.histc(4, 0, 3), np.array([1.0, 2, 1, 4, 3, 0]), grad=False)
    check(torch, lambda lib, t: lib.histc(t, 5), np.array([2.0, 2.0]), grad=False)
    with pytest.raises(TypeError):
        mt.histc(mt.tensor([1, 2]))
    with pytest.raises(TypeError):
        mt.bincount(mt.tensor([1.0]))
    with pytest.raises(ValueError):
        mt.bincount(mt.tensor([-1, 2]))


def test_searchsorted_and_bucketize(torch):
    seq = np.array([1.0, 3.0, 3.0, 5.0, 7.0])
    vals = np.array([[0.0, 3.0, 6.0], [7.0, 8.0, 3.0]])
    for kw in ({}, {"right": True}, {"side": "right"}, {"out_int32": True}):
        check(torch, lambda lib, s, v, k=kw: lib.searchsorted(s, v, **k), seq, vals,
              grad=False)
        check(torch, lambda lib, v, s, k=kw: lib.bucketize(v, s, **{
            a: b for a, b in k.items() if a != "side"}), vals, seq, grad=False)
    seq2 = np.sort(rand(3, 6), axis=1)
    check(torch, lambda lib, s, v: lib.searchsorted(s, v), seq2, rand(3, 4), grad=False)
    perm = np.array([2, 0, 1])
    check(torch, lambda lib, s, v: lib.searchsorted(s, v, sorter=lib.tensor(perm)),
          np.array([5.0, 1.0, 3.0]), np.array([2.0, 4.0]), grad=False)
    assert mt.searchsorted(mt.tensor(seq), 4.0).item() == 3
    with pytest.raises(ValueError):
        mt.searchsorted(mt.tensor(seq), mt.tensor(vals), side="left", right=True)


def test_unique_and_unique_consecutive(torch):
    x = np.array([[3, 1, 3], [2, 1, 3], [3, 1, 3]])
    for kw in ({}, {"return_inverse": True}, {"return_counts": True},
               {"return_inverse": True, "return_counts": True}, {"dim": 0},
               {"dim": 1, "return_inverse": True, "return_counts": True}):
        check(torch, lambda lib, t, k=kw: lib.unique(t, **k), x, grad=False)
        check(torch, lambda lib, t, k=kw: t.unique_consecutive(**k), x, grad=False)
    f = np.array([1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 3.0])
    check(torch, lambda lib, t: lib.unique_consecutive(t, return_inverse=True,
                                                       return_counts=True), f, grad=False)
    check(torch, lambda lib, t: lib.unique(t, sorted=True, return_inverse=True), f, grad=False)


# --------------------------------------------------------------------------------------------
# Random fills and sampling


def test_random_fills_are_reproducible_and_distributed():
    n = 200_000
    for name, args, mean, var in (
            ("normal_", (2.0, 3.0), 2.0, 9.0), ("uniform_", (-1.0, 3.0), 1.0, 16 / 12),
            ("exponential_", (2.0,), 0.5, 0.25), ("log_normal_", (0.0, 0.5),
                                                  math.exp(0.125), None),
            ("bernoulli_", (0.3,), 0.3, 0.21), ("geometric_", (0.25,), 4.0, 12.0)):
        mt.manual_seed(5)
        a = getattr(mt.empty(n, dtype=mt.float64), name)(*args)
        mt.manual_seed(5)
        b = getattr(mt.empty(n, dtype=mt.float64), name)(*args)
        assert mt.equal(a, b), name
        d = _np(a)
        assert abs(d.mean() - mean) < 0.02 * max(1.0, abs(mean)), (name, d.mean())
        if var is not None:
            assert abs(d.var() - var) < 0.05 * var, (name, d.var())
    u = _np(mt.empty(n).uniform_(2.0, 2.5))
    assert u.min() >= 2.0 and u.max() < 2.5 and u.dtype == np.float32
    g = _np(mt.empty(n).geometric_(0.5))
    assert g.min() >= 1 and (g == np.round(g)).all()
    c = _np(mt.empty(n, dtype=mt.float64).cauchy_(1.0, 2.0))
    assert abs(np.median(c) - 1.0) < 0.05
    assert (_np(mt.empty(n).log_normal_()) > 0).all()
    gen = mt.Generator().manual_seed(3)
    x1 = mt.empty(5).normal_(generator=gen)
    x2 = mt.empty(5).normal_(generator=mt.Generator().manual_seed(3))
    assert mt.equal(x1, x2)


def test_random_integers():
    r = _np(mt.empty(10_000, dtype=mt.int64).random_(-3, 4))
    assert r.min() == -3 and r.max() == 3
    r = _np(mt.zeros(10_000, dtype=mt.int32).random_(5))
    assert r.min() == 0 and r.max() == 4
    r = _np(mt.zeros(1000, dtype=mt.uint8).random_())
    assert r.max() > 200
    r = _np(mt.zeros(1000).random_())
    assert r.max() > 2 ** 20 and (r == np.round(r)).all() and r.max() <= 2 ** 24
    b = _np(mt.zeros(1000, dtype=mt.bool).random_())
    assert b.any() and not b.all()
    p = mt.rand(3, 1000)
    bern = _np(mt.zeros(3, 1000).bernoulli_(p))
    assert set(np.unique(bern)) <= {0.0, 1.0}
    with pytest.raises(ValueError):
        mt.zeros(3, dtype=mt.int64).random_(4, 2)
    with pytest.raises(TypeError):
        mt.zeros(3, dtype=mt.int64).normal_()
    with pytest.raises(ValueError):
        mt.zeros(3).bernoulli_(1.5)


def test_random_fills_are_inplace_writes():
    leaf = mt.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError):
        leaf.normal_()
    with mt.no_grad():
        leaf.uniform_()
    assert leaf._version == 1
    x = mt.ones(4, requires_grad=True)
    y = x * 2
    y[:2].normal_()
    (y * 3).sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 6.0, 6.0]  # the overwritten part gets no gradient


def test_bernoulli_multinomial_normal_poisson():
    mt.manual_seed(0)
    p = mt.tensor([[0.0, 1.0, 0.5]]).expand(20_000, 3)
    b = _np(mt.bernoulli(p))
    assert (b[:, 0] == 0).all() and (b[:, 1] == 1).all() and abs(b[:, 2].mean() - 0.5) < 0.02
    assert _np(mt.bernoulli(mt.zeros(1000), 0.25)).mean() == pytest.approx(0.25, abs=0.05)
    w = mt.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 2.0]])
    s = _np(mt.multinomial(w, 20_000, replacement=True))
    assert s.shape == (2, 20_000) and s.dtype == np.int64
    assert not (s[0] == 0).any() and not (s[1] == 1).any()
    assert abs((s[0] == 2).mean() - 0.75) < 0.02 and abs((s[1] == 0).mean() - 0.5) < 0.02
    s = _np(mt.multinomial(mt.tensor([1.0, 0.0, 2.0, 4.0]), 3))
    assert sorted(s.tolist()) == [0, 2, 3]
    counts = np.bincount(np.concatenate([_np(mt.multinomial(mt.tensor([1.0, 1.0, 8.0]), 1))
                                         for _ in range(2000)]), minlength=3)
    assert counts[2] > 1400
    with pytest.raises(ValueError):
        mt.multinomial(mt.tensor([1.0, 0.0]), 2)
    with pytest.raises(ValueError):
        mt.multinomial(mt.tensor([1.0, -1.0]), 1)
    m = mt.normal(mt.full((50_000,), 3.0, dtype=mt.float64), 2.0)
    assert m.dtype == mt.float64 and abs(_np(m).mean() - 3) < 0.05
    assert abs(_np(m).std() - 2) < 0.05
    m = mt.normal(1.0, mt.tensor([0.0, 0.0]))
    assert m.tolist() == [1.0, 1.0]
    m = mt.normal(mt.zeros(2, 1), mt.ones(3))
    assert m.shape == (2, 3)
    assert mt.normal(0.0, 1.0, (4, 2)).shape == (4, 2)
    with pytest.raises(TypeError):
        mt.normal(0.0, 1.0)
    lam = _np(mt.poisson(mt.full((50_000,), 4.0)))
    assert abs(lam.mean() - 4) < 0.1 and (lam == np.round(lam)).all()
    r = mt.randint_like(mt.zeros(1000, dtype=mt.int32), 3, 6)
    assert r.dtype == mt.int32 and _np(r).min() == 3 and _np(r).max() == 5


# --------------------------------------------------------------------------------------------
# Small Tensor methods


def test_misc_tensor_methods(torch):
    for data in ([1.0], [1], [True], np.array([1], dtype=np.uint8)):
        assert mt.tensor(data).is_signed() == torch.tensor(data).is_signed()
    assert mt.tensor([2.0]).is_nonzero() and not mt.tensor([[0]]).is_nonzero()
    with pytest.raises(RuntimeError):
        mt.tensor([1, 2]).is_nonzero()
    assert mt.ones(2, 3).is_same_size(mt.zeros(2, 3))
    assert not mt.is_same_size(mt.ones(2, 3), mt.zeros(3, 2))
    assert mt.ones(2).get_device() == torch.ones(2).get_device() == -1
    t = mt.ones(3)
    assert t.pin_memory() is t and not t.is_pinned()
    x = mt.tensor([1.0, 2.0, 3.0])
    assert x.apply_(lambda v: v * 10) is x and x.tolist() == [10.0, 20.0, 30.0]
    assert x._version == 1
    x.map_(mt.tensor([1.0, 2.0, 3.0]), lambda a, b: a - b)
    assert x.tolist() == [9.0, 18.0, 27.0]
    with pytest.raises(RuntimeError):
        mt.ones(2, requires_grad=True).apply_(lambda v: v)
    e = mt.ones(2, dtype=mt.float64).new_empty_strided((2, 3), (3, 1))
    assert e.shape == (2, 3) and e.dtype == mt.float64
    assert mt.ones(2, 3, dtype=mt.int16).type_as(mt.ones(1)).dtype == mt.float32
    a = mt.arange(10.0)
    assert a[3:].storage_offset() == torch.arange(10.0)[3:].storage_offset() == 3
    assert a.element_size() == 4 and a.nbytes == 40 and a.itemsize == 4
    assert a[2:].data_ptr() - a.data_ptr() == 8


# --------------------------------------------------------------------------------------------
# Less common names


EXTRAS = {
    "angle": (lambda lib, x: lib.angle(x), [(3, 4)]),
    "real": (lambda lib, x: x.real * 2, [(3,)]),
    "frexp": (lambda lib, x: tuple(lib.frexp(x * 100)), [(5,)]),
    "index_put": (lambda lib, x, v: lib.index_put(x, (lib.tensor([0, 2, 0]),), v), [(3, 2),
                                                                                    (2,)]),
    "index_put_acc": (lambda lib, x, v: x.index_put((lib.tensor([0, 2, 0]),
                                                     lib.tensor([1, 1, 1])), v, True),
                      [(3, 2), (3,)]),
    "index_put_": (lambda lib, x, v: (x * 1).index_put_((lib.tensor([1]),), v, True),
                   [(3, 2), (1, 2)]),
    "select_scatter": (lambda lib, x, s: lib.select_scatter(x, s, 1, 0), [(3, 2), (3,)]),
    "slice_scatter": (lambda lib, x, s: lib.slice_scatter(x, s, 0, 1, 5, 2), [(6, 2), (2, 2)]),
    "diagonal_scatter": (lambda lib, x, s: lib.diagonal_scatter(x, s, 1), [(3, 4), (3,)]),
    "fill_diagonal_": (lambda lib, x: (x * 1).fill_diagonal_(-2.0), [(3, 3)]),
    "fill_diagonal_tall": (lambda lib, x: (x * 1).fill_diagonal_(5.0), [(7, 3)]),
    "fill_diagonal_wrap": (lambda lib, x: (x * 1).fill_diagonal_(5.0, wrap=True), [(7, 3)]),
    "fill_diagonal_3d": (lambda lib, x: (x * 1).fill_diagonal_(1.5), [(2, 2, 2)]),
    "nonzero_static": (lambda lib, x: lib.nonzero_static(x.round(), size=4), [(3, 3)]),
    "nonzero_static_pad": (lambda lib, x: x.round().nonzero_static(size=20, fill_value=-7),
                           [(2, 3)]),
    "unfold": (lambda lib, x: x.unfold(1, 3, 2), [(2, 7)]),
    "unfold_dim0": (lambda lib, x: x.unfold(0, 2, 1), [(4, 3)]),
    "sum_to_size": (lambda lib, x: x.sum_to_size(1, 3), [(2, 4, 3)]),
    "narrow_copy": (lambda lib, x: x.narrow_copy(0, 1, 2), [(4, 3)]),
    "unsafe_split": (lambda lib, x: tuple(lib.unsafe_split(x, 2)), [(5, 2)]),
    "unsafe_chunk": (lambda lib, x: tuple(x.unsafe_chunk(2, 1)), [(5, 4)]),
    "renorm": (lambda lib, x: lib.renorm(x, 2, 0, 2.0), [(4, 3)]),
    "renorm_p1": (lambda lib, x: x.renorm(1, 1, 3.0), [(4, 3)]),
    "renorm_": (lambda lib, x: (x * 1).renorm_(3, 0, 1.5), [(4, 3)]),
    "dist": (lambda lib, a, b: a.dist(b, 1.5), [(3, 4), (4,)]),
    "cdist": (lambda lib, a, b: lib.cdist(a, b), [(5, 3), (4, 3)]),
    "cdist_p1": (lambda lib, a, b: lib.cdist(a, b, 1.0), [(2, 5, 3), (2, 4, 3)]),
    "cov": (lambda lib, x: lib.cov(x), [(3, 6)]),
    "cov_vec": (lambda lib, x: x.cov(correction=0), [(6,)]),
    "corrcoef": (lambda lib, x: lib.corrcoef(x), [(3, 6)]),
    "trapezoid": (lambda lib, y: lib.trapezoid(y), [(3, 5)]),
    "trapezoid_x": (lambda lib, y, x: lib.trapezoid(y, x.cumsum(0), dim=1), [(3, 5), (5,)]),
    "trapz": (lambda lib, y: lib.trapz(y, dx=0.5, dim=0), [(3, 5)]),
    "cumulative_trapezoid": (lambda lib, y: lib.cumulative_trapezoid(y, dx=2.0), [(3, 5)]),
    "combinations": (lambda lib, x: lib.combinations(x), [(4,)]),
    "combinations_r3": (lambda lib, x: lib.combinations(x, 3, with_replacement=True), [(3,)]),
    "std_mean": (lambda lib, x: tuple(lib.std_mean(x, 1)), [(3, 4)]),
    "var_mean": (lambda lib, x: tuple(lib.var_mean(x, 0, False)), [(3, 4)]),
    "rsub": (lambda lib, x: lib.rsub(x, 2.0, alpha=3), [(3,)]),
}


@pytest.mark.parametrize("name", sorted(EXTRAS))
def test_less_common_names(torch, name):
    fn, shapes = EXTRAS[name]
    check(torch, fn, *[rand(*s) for s in shapes])


def test_vander(torch):
    # torch 2.13's vander cannot be differentiated (it writes into a saved view): values only
    x = rand(4)
    check(torch, lambda lib, t: lib.vander(t), x, grad=False)
    check(torch, lambda lib, t: lib.vander(t, 3, True), x, grad=False)
    check(torch, lambda lib, t: lib.vander(t, 3), np.array([1, 2, 3]), grad=False)
    t = mt.tensor(x, requires_grad=True)
    mt.vander(t, 3).sum().backward()
    np.testing.assert_allclose(_np(t.grad), 2 * x + 1, rtol=1e-12)


@pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")
def test_index_reduce(torch):
    x, src = rand(4, 3), rand(5, 3)
    idx = np.array([0, 2, 0, 3, 2])
    for reduce in ("prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            check(torch, lambda lib, t, s, r=reduce, i=include_self: lib.index_reduce(
                t, 0, lib.tensor(idx), s, r, include_self=i), x, src)
    check(torch, lambda lib, t, s: (t * 1).index_reduce_(1, lib.tensor([1, 1]), s, "amax"),
          rand(3, 3), rand(3, 2))
    with pytest.raises(ValueError):
        mt.ones(3).index_reduce(0, mt.tensor([0]), mt.ones(1), "sum")


def test_complex_parts_and_inplace_view_ops(torch):
    c = rand(3) + 1j * rand(3)
    check(torch, lambda lib, z: (lib.real(z), lib.imag(z), lib.angle(z)), c, grad=False)
    z = mt.tensor(c)
    z.real[0] = 10.0
    assert z[0].item().real == 10.0
    with pytest.raises(TypeError):
        mt.ones(2).imag  # noqa: B018
    for name, args, shape in (("t_", (), (3, 4)), ("transpose_", (0, 1), (3, 4)),
                              ("swapdims_", (1, 0), (3, 4)), ("squeeze_", (), (3, 1, 4)),
                              ("unsqueeze_", (1,), (3, 4))):
        def fn(lib, x, n=name, a=args, s=shape):
            y = (x * 1).reshape(s)
            r = getattr(y, n)(*a)
            assert r is y
            return y * lib.arange(y.numel(), dtype=y.dtype).reshape(y.shape)

        check(torch, fn, rand(3, 4))
    leaf = mt.ones(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError):
        leaf.t_()
    plain = mt.ones(2, 3)
    assert plain.t_().shape == (3, 2) and plain._version == 1


def test_counting_extras(torch):
    a, b = np.array([[1, 2], [3, 4]]), np.array([2, 3, 9])
    for kw in ({}, {"invert": True}):
        check(torch, lambda lib, x, y, k=kw: lib.isin(x, y, **k), a, b, grad=False)
    check(torch, lambda lib, x: lib.isin(x, 3), a, grad=False)
    x = rand(100)
    for kw in ({"bins": 7}, {"bins": 5, "range": (-1.0, 1.0)}, {"bins": 4, "density": True}):
        check(torch, lambda lib, t, k=kw: tuple(lib.histogram(t, **k)), x, grad=False)
    check(torch, lambda lib, t, w: tuple(lib.histogram(
        t, lib.tensor([-3.0, 0.0, 1.0, 3.0], dtype=lib.float64), weight=w)), x, rand(100),
        grad=False)
    ours = mt.unravel_index(mt.tensor([0, 5, 11, -1]), (3, 4))
    theirs = torch.unravel_index(torch.tensor([0, 5, 11, -1]), (3, 4))
    assert [o.tolist() for o in ours] == [t.tolist() for t in theirs]
    with pytest.raises(IndexError):
        mt.unravel_index(mt.tensor([12]), (3, 4))


def test_small_functions_and_constants(torch):
    assert (mt.pi, mt.e, mt.inf) == (torch.pi, torch.e, torch.inf) and math.isnan(mt.nan)
    assert mt.newaxis is None
    pairs = [(mt.int32, mt.float16), (mt.uint8, mt.int8), (mt.bool, mt.int64),
             (mt.bfloat16, mt.float16), (mt.float32, mt.complex64)]
    for a, b in pairs:
        ta, tb = getattr(torch, _dtname(a)), getattr(torch, _dtname(b))
        assert _dtname(mt.promote_types(a, b)) == _dtname(torch.promote_types(ta, tb))
        assert mt.can_cast(a, b) == torch.can_cast(ta, tb)
        assert mt.can_cast(b, a) == torch.can_cast(tb, ta)
    for x, y in ((mt.tensor([1, 2]), 2.5), (mt.tensor([1.0]), mt.tensor(2, dtype=mt.float64)),
                 (mt.tensor([True]), 3)):
        tx = torch.tensor(x.tolist(), dtype=getattr(torch, _dtname(x.dtype)))
        ty = torch.tensor(y.item(), dtype=getattr(torch, _dtname(y.dtype))) \
            if isinstance(y, mt.Tensor) else y
        assert _dtname(mt.result_type(x, y)) == _dtname(torch.result_type(tx, ty))
    assert mt.empty_strided((2, 3), (3, 1)).shape == (2, 3)
    assert mt.scalar_tensor(3).dtype == mt.float32 and mt.scalar_tensor(3).item() == 3.0
    assert_close(mt.logspace(0, 3, 4), torch.logspace(0, 3, 4), "float32")
    assert_close(mt.logspace(1, 2, 5, base=2.0), torch.logspace(1, 2, 5, base=2.0), "float32")
    n = np.arange(3.0)
    shared = mt.asarray(n)
    shared[0] = 7
    assert n[0] == 7 and mt.asarray(n, copy=True).data_ptr() != shared.data_ptr()
    t = mt.ones(3)
    mt.zero_(t)
    assert t.tolist() == [0.0, 0.0, 0.0]
    mt.manual_seed(1)
    assert mt.ones(4).bernoulli().tolist() == [1.0] * 4
    assert mt.tensor([0.0, 1.0]).multinomial(3, True).tolist() == [1, 1, 1]


def test_tensor_flags(torch):
    t, tt = mt.ones(2), torch.ones(2)
    for name in ("is_sparse", "is_quantized", "is_meta", "is_mkldnn", "is_nested", "is_xpu",
                 "is_mps"):
        assert getattr(t, name) == getattr(tt, name), name
    assert not t.is_inference() and not t.is_shared() and t.share_memory_() is t
    assert t.is_set_to(t) and not t.is_set_to(mt.ones(2))
    x = mt.ones(2, requires_grad=True)
    y = x * 2
    assert not y.retains_grad
    y.retain_grad()
    assert y.retains_grad


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_binary_and_reductions(torch, dtype):
    a = rand(4, 6, dtype="float32")
    b = rand(6, lo=0.5, hi=3, dtype="float32")
    cases = [lambda lib, x, y: lib.atan2(x, y), lambda lib, x, y: lib.hypot(x, y),
             lambda lib, x, y: lib.fmod(x, y), lambda lib, x, y: lib.maximum(x, y),
             lambda lib, x, y: lib.lerp(x, y, 0.25), lambda lib, x, y: lib.xlogy(y, y),
             lambda lib, x, y: lib.cumsum(x, 1), lambda lib, x, y: lib.logsumexp(x, 1),
             lambda lib, x, y: lib.amax(x, 0), lambda lib, x, y: lib.prod(y),
             lambda lib, x, y: lib.norm(x), lambda lib, x, y: lib.nansum(x, 1)]
    for k, fn in enumerate(cases):
        om = fn(mt, mt.tensor(a).to(getattr(mt, dtype)), mt.tensor(b).to(getattr(mt, dtype)))
        ot = fn(torch, torch.tensor(a).to(getattr(torch, dtype)),
                torch.tensor(b).to(getattr(torch, dtype)))
        assert _dtname(om.dtype) == _dtname(ot.dtype), k
        np.testing.assert_allclose(_np(om.float()), ot.float().numpy(), rtol=2e-2, atol=2e-2,
                                   err_msg=str(k))


@pytest.mark.parametrize("values", [[1 + 2j, 0.5 - 1j, 2 + 0.3j], [1 + 2j, 0j, 2 + 0.3j, 1 - 1j]])
def test_cumprod_gradient_of_complex_input_is_conjugate(torch, values):
    """cumprod is holomorphic: the input's gradient is sum_k g_k conj(out_k / x_i), as torch's
    (it was the plain derivative, conjugated the wrong way), with and without a zero."""
    grads = []
    for lib in (mt, torch):
        x = lib.tensor(np.array(values), requires_grad=True)
        y = x.cumprod(0)
        (y.real.sum() + 2 * y.imag.sum()).backward()
        grads.append(_np(x.grad))
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-13, atol=1e-13)
