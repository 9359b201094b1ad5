"""All of ``nn.init`` against torch (issue 25, family 3).

Deterministic outcomes are compared with ``torch.nn.init`` exactly: gains, dirac_/eye_/
constant_ fills, shapes and dtypes, which inputs raise and the class of the exception (ours is
an instance of torch's). Random fills are checked by the properties that define them
(orthogonality, bounds, zeros per column) and by moments within 6 standard deviations of the
estimate, never against torch's numbers (the generators differ).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import backend
from mpitensor.nn import functional as F
from mpitensor.nn import init


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="torch is the oracle for these checks")


def arr(t: Any) -> np.ndarray:
    if hasattr(t, "detach"):
        return t.detach().numpy()
    return backend.to_numpy(t._data)


def _both(torch: Any, call: str) -> tuple:
    """``call`` run with ``T``/``I`` as torch and torch.nn.init, then as mpitensor and
    mpitensor.nn.init: each result, or the exception it raised."""
    out = []
    for T, I in ((torch, torch.nn.init), (mt, init)):  # noqa: N806 - module aliases
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                out.append(eval(call, {"T": T, "I": I}))  # noqa: S307 - fixed strings
            except Exception as e:  # noqa: BLE001 - the exception is the outcome
                out.append(e)
    return tuple(out)


# --------------------------------------------------------------------------------------------
# The module has torch's members


def test_every_documented_member_exists(torch: Any) -> None:
    theirs = {n for n in dir(torch.nn.init) if not n.startswith("_")
              and callable(getattr(torch.nn.init, n))
              and getattr(getattr(torch.nn.init, n), "__module__", "") == "torch.nn.init"}
    assert theirs, "torch.nn.init lists no functions?"
    missing = sorted(n for n in theirs if not hasattr(init, n))
    assert not missing
    assert set(init.__all__) >= theirs


# --------------------------------------------------------------------------------------------
# Gains


@pytest.mark.parametrize("name", [
    "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "sigmoid", "tanh", "relu", "leaky_relu", "selu"])
def test_calculate_gain_matches_torch(torch: Any, name: str) -> None:
    assert init.calculate_gain(name) == pytest.approx(torch.nn.init.calculate_gain(name),
                                                      rel=1e-15)


@pytest.mark.parametrize("param", [None, 0, 0.2, 1, 3.5, -0.1])
def test_leaky_relu_gain_takes_its_slope(torch: Any, param: Any) -> None:
    assert init.calculate_gain("leaky_relu", param) == pytest.approx(
        torch.nn.init.calculate_gain("leaky_relu", param), rel=1e-15)


@pytest.mark.parametrize("call", [
    "I.calculate_gain('leaky_relu', True)", "I.calculate_gain('leaky_relu', '1')",
    "I.calculate_gain('foo')", "I.calculate_gain('Relu')", "I.calculate_gain('relu', 3)"])
def test_calculate_gain_misuse_matches_torch(torch: Any, call: str) -> None:
    theirs, ours = _both(torch, call)
    if isinstance(theirs, Exception):
        assert isinstance(ours, type(theirs)), (call, theirs, ours)
    else:
        assert ours == pytest.approx(theirs)


# --------------------------------------------------------------------------------------------
# Deterministic fills: the same values as torch

FILL_CALLS = [
    "I.dirac_(T.empty(3, 4, 5))", "I.dirac_(T.empty(4, 2, 3), groups=2)",
    "I.dirac_(T.empty(6, 3, 3, 3), groups=3)", "I.dirac_(T.empty(4, 2, 3, 3, 3))",
    "I.dirac_(T.empty(3, 5, 3))", "I.dirac_(T.empty(4, 2, 2, dtype=T.int64))",
    "I.dirac_(T.empty(2, 6, 4, 4))", "I.eye_(T.empty(3, 5))", "I.eye_(T.empty(5, 3))",
    "I.eye_(T.empty(2, 3, dtype=T.int64))", "I.constant_(T.empty(2, 3), 0.25)",
    "I.constant_(T.empty(2, dtype=T.int64), 3)", "I.constant_(T.empty(2), T.tensor(1.5))",
    "I.ones_(T.empty(2, 2))", "I.zeros_(T.empty(3, dtype=T.int32))", "I.ones_(T.empty(0))",
]


@pytest.mark.parametrize("call", FILL_CALLS)
def test_deterministic_fills_equal_torch(torch: Any, call: str) -> None:
    theirs, ours = _both(torch, call)
    assert not isinstance(theirs, Exception) and not isinstance(ours, Exception), (theirs, ours)
    np.testing.assert_array_equal(arr(ours), arr(theirs))
    assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]


@pytest.mark.parametrize("groups,shape", [(1, (4, 4, 5)), (2, (6, 3, 3, 3)), (1, (3, 3, 3, 5, 5))])
def test_dirac_weights_pass_the_input_through(groups: int, shape: tuple) -> None:
    """A convolution with dirac_ weights and 'same' padding returns its input (for as many
    channels as both sides have)."""
    w = init.dirac_(mt.empty(*shape), groups=groups)
    x = mt.randn(2, shape[1] * groups, *([7] * (len(shape) - 2)))
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(shape)]
    pad = tuple(k // 2 for k in shape[2:])
    y = conv(x, w, padding=pad, groups=groups)
    np.testing.assert_allclose(arr(y), arr(x), rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Misuse: what torch refuses, refused with an instance of torch's exception class

MISUSE_CALLS = [
    "I.orthogonal_(T.empty(3))", "I.orthogonal_(T.empty(3, 4, dtype=T.int64))",
    "I.sparse_(T.empty(3), 0.5)", "I.sparse_(T.empty(3, 4, 5), 0.5)",
    "I.sparse_(T.empty(3, 4, dtype=T.int64), 0.5)", "I.dirac_(T.empty(3, 4))",
    "I.dirac_(T.empty(3, 2, 3), groups=2)", "I.dirac_(T.empty(4, 2, 3, 3, 3, 3))",
    "I.dirac_(T.empty(4, 2, 3), groups=0)", "I.eye_(T.empty(2, 3, 4))", "I.eye_(T.empty(3))",
    "I.uniform_(T.empty(2, dtype=T.int64))", "I.uniform_(T.empty(2), 2, 1)",
    "I.normal_(T.empty(2), 0, -1)", "I.normal_(T.empty(2, dtype=T.int64))",
    "I.trunc_normal_(T.empty(2), a=1, b=0)", "I.trunc_normal_(T.empty(2), std=0)",
    "I.trunc_normal_(T.empty(2, dtype=T.int64))", "I.xavier_uniform_(T.empty(3))",
    "I.xavier_normal_(T.empty(3, 4, dtype=T.int64))",
    "I.kaiming_uniform_(T.empty(3, 4), mode='foo')", "I.kaiming_normal_(T.empty(3))",
    "I.kaiming_normal_(T.empty(3, 4), nonlinearity='foo')",
]


@pytest.mark.parametrize("call", MISUSE_CALLS)
def test_misuse_raises_torch_exception_class(torch: Any, call: str) -> None:
    theirs, ours = _both(torch, call)
    assert isinstance(theirs, Exception), f"torch accepts {call}"
    assert isinstance(ours, type(theirs)), (call, theirs, ours)


ACCEPTED_CALLS = [
    "I.orthogonal_(T.empty(0, 4))", "I.orthogonal_(T.empty(3, 4, 5), gain=2.0)",
    "I.orthogonal_(T.empty(3, 4, dtype=T.float64))", "I.sparse_(T.empty(3, 4), 1.5)",
    "I.sparse_(T.empty(3, 4), -0.5)", "I.sparse_(T.empty(3, 4), 0.0, std=0.1)",
    "I.trunc_normal_(T.empty(4), std=-1.0)", "I.trunc_normal_(T.empty(3), a=0.5, b=0.5)",
    "I.kaiming_normal_(T.empty(3, 4), mode='FAN_OUT')",
    "I.kaiming_uniform_(T.empty(3, 4, 2), a=0.1, nonlinearity='relu', mode='fan_out')",
    "I.xavier_uniform_(T.empty(3, 4, dtype=T.float64), gain=2.0)",
    "I.uniform_(T.empty(2), 1.0, 1.0)", "I.normal_(T.empty(2), 3.0, 0.0)",
]


@pytest.mark.parametrize("call", ACCEPTED_CALLS)
def test_accepted_calls_keep_shape_and_dtype(torch: Any, call: str) -> None:
    theirs, ours = _both(torch, call)
    assert not isinstance(theirs, Exception) and not isinstance(ours, Exception), (theirs, ours)
    assert tuple(ours.shape) == tuple(theirs.shape)
    assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
    # the fills with a fixed outcome agree in value too
    if "sparse_(T.empty(3, 4), 1.5)" in call or "b=0.5" in call or "1.0, 1.0" in call \
            or "3.0, 0.0" in call or "T.empty(0, 4)" in call:
        np.testing.assert_array_equal(arr(ours), arr(theirs))


# --------------------------------------------------------------------------------------------
# orthogonal_


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (4, 4), (3, 4, 5), (6, 2, 3, 3), (1, 7)])
@pytest.mark.parametrize("dtype", [mt.float32, mt.float64])
def test_orthogonal_rows_or_columns_are_orthonormal(shape: tuple, dtype: Any) -> None:
    gain = 1.7
    w = init.orthogonal_(mt.empty(*shape, dtype=dtype), gain=gain)
    assert tuple(w.shape) == shape and w.dtype == dtype
    m = arr(w).reshape(shape[0], -1).astype(np.float64) / gain
    small = m @ m.T if m.shape[0] <= m.shape[1] else m.T @ m
    tol = 1e-5 if dtype == mt.float32 else 1e-12
    np.testing.assert_allclose(small, np.eye(small.shape[0]), atol=tol)


def test_orthogonal_law_is_uniform_thanks_to_the_sign_fix() -> None:
    """Under the uniform (Haar) law on 3x3 orthogonal matrices each entry has mean 0 and
    variance 1/3, so the mean of n draws of one entry is within 6 sqrt(1/(3 n)) of 0. A QR
    without the sign fix makes the diagonal of Q one-signed (|mean| near 0.5 or more)."""
    n = 3000
    g = mt.Generator().manual_seed(21)
    diag = np.array([np.diag(arr(init.orthogonal_(mt.empty(3, 3, dtype=mt.float64),
                                                   generator=g))) for _ in range(n)])
    bound = 6 * math.sqrt(1 / (3 * n))
    assert np.all(np.abs(diag.mean(axis=0)) <= bound), diag.mean(axis=0)


# --------------------------------------------------------------------------------------------
# trunc_normal_


def _truncated_moments(mean: float, std: float, a: float, b: float) -> tuple:
    """Mean and variance of N(mean, std²) restricted to [a, b] (standard formulas, with the
    normal's mass written through erfc so that far tails keep their precision)."""
    al, be = (a - mean) / std, (b - mean) / std

    def pdf(x: float) -> float:
        return 0.0 if math.isinf(x) else math.exp(-x * x / 2) / math.sqrt(2 * math.pi)

    if al >= 0:
        z = 0.5 * (math.erfc(al / math.sqrt(2)) - math.erfc(be / math.sqrt(2)))
    else:
        z = 0.5 * (math.erfc(-be / math.sqrt(2)) - math.erfc(-al / math.sqrt(2)))
    d = (pdf(al) - pdf(be)) / z
    xa = 0.0 if math.isinf(al) else al * pdf(al)
    xb = 0.0 if math.isinf(be) else be * pdf(be)
    var = 1 + (xa - xb) / z - d * d
    return mean + std * d, std * std * var


@pytest.mark.parametrize("mean,std,a,b", [
    (0.0, 1.0, -2.0, 2.0), (0.5, 2.0, -1.0, 4.0), (0.0, 1.0, 30.0, 31.0),
    (0.0, 1.0, -31.0, -30.0), (0.0, 1.0, 0.5, 0.6), (0.0, 1.0, -0.1, 0.05),
    (0.0, 1.0, 1.0, math.inf), (1.0, 0.02, -2.0, 2.0), (0.0, 1.0, 3.0, 3.3)])
def test_trunc_normal_draws_the_truncated_law(mean: float, std: float, a: float,
                                              b: float) -> None:
    """Inside [a, b] always; the sample mean within 6 sqrt(var/n) of the law's mean; the
    sample variance within 6 sqrt(2/n) var of the law's (a truncated normal is lighter-tailed
    than the normal, so mu4 <= 3 var², and Var(s²) ~ (mu4 - var²)/n <= 2 var²/n)."""
    n = 200_000
    x = arr(init.trunc_normal_(mt.empty(n, dtype=mt.float64), mean, std, a, b,
                               generator=mt.Generator().manual_seed(9)))
    assert x.min() >= a and x.max() <= b
    m, v = _truncated_moments(mean, std, a, b)
    assert abs(x.mean() - m) <= 6 * math.sqrt(v / n), (x.mean(), m)
    assert abs(x.var() - v) <= 6 * math.sqrt(2 / n) * v, (x.var(), v)


def test_trunc_normal_float32_and_half_stay_in_bounds() -> None:
    for dtype in (mt.float32, mt.float16, mt.bfloat16):
        x = init.trunc_normal_(mt.empty(10_000, dtype=dtype), std=0.02, a=-0.04, b=0.04)
        assert x.dtype == dtype
        v = arr(x.float())
        assert v.min() >= -0.04 - 1e-3 and v.max() <= 0.04 + 1e-3


# --------------------------------------------------------------------------------------------
# sparse_


@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_sparse_zeros_per_column_as_torch(torch: Any, sparsity: float) -> None:
    rows, cols = 40, 30
    ours = arr(init.sparse_(mt.empty(rows, cols), sparsity, std=0.5))
    theirs = arr(torch.nn.init.sparse_(torch.empty(rows, cols), sparsity, std=0.5))
    np.testing.assert_array_equal((ours == 0).sum(axis=0), (theirs == 0).sum(axis=0))
    assert np.all((ours == 0).sum(axis=0) == math.ceil(sparsity * rows))


def test_sparse_zeros_fall_on_random_rows_and_the_rest_is_normal() -> None:
    """Each row is zeroed in a column with probability k/rows: over c columns its count of
    zeros is binomial, within 6 sqrt(c p (1 - p)) of c p. The non-zero entries have standard
    deviation std: the sample std is within 6 std/sqrt(2 m) of it for m entries."""
    rows, cols, sparsity, std = 20, 4000, 0.25, 0.3
    w = arr(init.sparse_(mt.empty(rows, cols, dtype=mt.float64), sparsity, std=std,
                         generator=mt.Generator().manual_seed(4)))
    p = math.ceil(sparsity * rows) / rows
    per_row = (w == 0).sum(axis=1)
    assert np.all(np.abs(per_row - cols * p) <= 6 * math.sqrt(cols * p * (1 - p)))
    nz = w[w != 0]
    assert abs(nz.std() - std) <= 6 * std / math.sqrt(2 * nz.size)
    assert abs(nz.mean()) <= 6 * std / math.sqrt(nz.size)


# --------------------------------------------------------------------------------------------
# The other random fills take generator= and keep their laws


@pytest.mark.parametrize("fill", [
    lambda t, g: init.uniform_(t, -2.0, 3.0, generator=g),
    lambda t, g: init.normal_(t, 1.0, 0.5, generator=g),
    lambda t, g: init.xavier_uniform_(t, gain=2.0, generator=g),
    lambda t, g: init.xavier_normal_(t, generator=g),
    lambda t, g: init.kaiming_uniform_(t, a=0.3, mode="fan_out", generator=g),
    lambda t, g: init.kaiming_normal_(t, nonlinearity="relu", generator=g),
    lambda t, g: init.trunc_normal_(t, generator=g),
    lambda t, g: init.orthogonal_(t, generator=g),
    lambda t, g: init.sparse_(t, 0.3, generator=g),
])
def test_generator_makes_fills_reproducible(fill: Any) -> None:
    a = fill(mt.empty(8, 6), mt.Generator().manual_seed(5))
    b = fill(mt.empty(8, 6), mt.Generator().manual_seed(5))
    c = fill(mt.empty(8, 6), mt.Generator().manual_seed(6))
    np.testing.assert_array_equal(arr(a), arr(b))
    assert not np.array_equal(arr(a), arr(c))


@pytest.mark.parametrize("mode,nonlinearity,a", [
    ("fan_in", "relu", 0.0), ("fan_out", "relu", 0.0), ("fan_in", "leaky_relu", 0.2),
    ("fan_out", "tanh", 0.0), ("fan_in", "selu", 0.0), ("fan_in", "linear", 0.0)])
def test_kaiming_variants_have_the_documented_std(torch: Any, mode: str, nonlinearity: str,
                                                  a: float) -> None:
    """std = gain / sqrt(fan): the normal's sample std is within 6 std/sqrt(2 n); the uniform
    one is bounded by sqrt(3) std (bound taken from torch's own fill of the same shape)."""
    shape = (300, 200, 3)
    fan = {"fan_in": 200 * 3, "fan_out": 300 * 3}[mode]
    std = torch.nn.init.calculate_gain(nonlinearity, a) / math.sqrt(fan)
    n = math.prod(shape)
    w = arr(init.kaiming_normal_(mt.empty(*shape, dtype=mt.float64), a=a, mode=mode,
                                 nonlinearity=nonlinearity))
    assert abs(w.std() - std) <= 6 * std / math.sqrt(2 * n)
    u = arr(init.kaiming_uniform_(mt.empty(*shape), a=a, mode=mode, nonlinearity=nonlinearity))
    ref = arr(torch.nn.init.kaiming_uniform_(torch.empty(*shape), a=a, mode=mode,
                                             nonlinearity=nonlinearity))
    assert np.abs(u).max() <= math.sqrt(3) * std * (1 + 1e-6)
    assert np.abs(ref).max() <= math.sqrt(3) * std * (1 + 1e-6)
    # a uniform on [-b, b] has std b/sqrt(3) = std and mu4 = b^4/5 = 9 std^4/5, so
    # Var(s²) = (9/5 - 1) std^4 / n
    assert abs(u.var() - std**2) <= 6 * math.sqrt(0.8 / n) * std**2


# --------------------------------------------------------------------------------------------
# The deprecated spellings


@pytest.mark.parametrize("old,args", [
    ("uniform", ()), ("normal", ()), ("constant", (0.5,)), ("eye", ()), ("dirac", ()),
    ("xavier_uniform", ()), ("xavier_normal", ()), ("kaiming_uniform", ()),
    ("kaiming_normal", ()), ("orthogonal", ()), ("sparse", (0.5,))])
def test_deprecated_names_warn_as_torch_and_do_the_same(torch: Any, old: str,
                                                        args: tuple) -> None:
    shape = (4, 3, 3) if old == "dirac" else (4, 3)
    with pytest.warns(FutureWarning):
        getattr(torch.nn.init, old)(torch.empty(*shape), *args)

    def kw() -> dict:
        fixed = old in ("constant", "eye", "dirac")
        return {} if fixed else {"generator": mt.Generator().manual_seed(1)}

    with pytest.warns(FutureWarning, match=f"{old}_"):
        a = getattr(init, old)(mt.empty(*shape), *args, **kw())
    b = getattr(init, old + "_")(mt.empty(*shape), *args, **kw())
    np.testing.assert_array_equal(arr(a), arr(b))
