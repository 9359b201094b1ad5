"""``mpitensor.testing.assert_close``, ``mpitensor.version`` and the float32 product precision
setting, against torch where it is installed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import mpitensor as mt


def _torch() -> Any:
    return pytest.importorskip("torch")


CASES = [
    # (actual, expected, kwargs): each run under both libraries, which must agree on pass/fail
    ([1.0, 2.0], [1.0, 2.0 + 1e-7], {}),
    ([1.0, 2.0], [1.0, 2.0 + 1e-4], {}),
    ([1.0, 2.0], [1.0, 2.1], dict(rtol=0.1, atol=0.0)),
    ([1.0, math.nan], [1.0, math.nan], {}),
    ([1.0, math.nan], [1.0, math.nan], dict(equal_nan=True)),
    ([math.inf], [math.inf], {}),
    ([math.inf], [-math.inf], {}),
    ([[1.0, 2.0]], [1.0, 2.0], {}),
]


def test_assert_close_agrees_with_torch() -> None:
    torch = _torch()
    for actual, expected, kw in CASES:
        for dtype in ("float32", "float64"):
            def verdict(lib: Any, actual: Any = actual, expected: Any = expected,
                        kw: dict = kw, dtype: str = dtype) -> bool:
                try:
                    lib.testing.assert_close(lib.tensor(actual, dtype=getattr(lib, dtype)),
                                             lib.tensor(expected, dtype=getattr(lib, dtype)),
                                             **kw)
                except AssertionError:
                    return False
                return True
            assert verdict(mt) == verdict(torch), (actual, expected, kw, dtype)


def test_assert_close_checks_like_torch() -> None:
    torch = _torch()
    pairs = [
        (lambda lib: (lib.ones(2), lib.ones(2, dtype=lib.float64)), {}),
        (lambda lib: (lib.ones(2), lib.ones(2, dtype=lib.float64)), dict(check_dtype=False)),
        (lambda lib: (lib.ones(2), lib.ones(3)), {}),
        (lambda lib: ({"a": lib.ones(2)}, {"a": lib.ones(2)}), {}),
        (lambda lib: ({"a": lib.ones(2)}, {"b": lib.ones(2)}), {}),
        (lambda lib: ([lib.ones(1), lib.zeros(1)], [lib.ones(1)]), {}),
        (lambda lib: (1, 1.0), {}),
        (lambda lib: (1, 1.0), dict(check_dtype=False)),
        (lambda lib: (lib.tensor([1, 2]), lib.tensor([1, 3])), {}),
        (lambda lib: (lib.tensor([1.0]), lib.tensor([1.5])), dict(rtol=0.0, atol=0.6)),
    ]
    for make, kw in pairs:
        outcome = []
        for lib in (mt, torch):
            try:
                lib.testing.assert_close(*make(lib), **kw)
                outcome.append(None)
            except Exception as exc:  # the class must match
                outcome.append(type(exc))
        assert outcome[0] == outcome[1], (kw, outcome)
    for lib in (mt, torch):
        with pytest.raises(ValueError):
            lib.testing.assert_close(lib.ones(1), lib.ones(1), rtol=1e-3)


def test_assert_close_message_and_numpy_inputs() -> None:
    with pytest.raises(AssertionError, match=r"1 of 3 elements .*index \(1,\).*by 1\.0"):
        mt.testing.assert_close(mt.ones(3), mt.tensor([1.0, 2.0, 1.0]))
    with pytest.raises(AssertionError, match="custom"):
        mt.testing.assert_close(mt.ones(1), mt.zeros(1), msg="custom")
    with pytest.raises(AssertionError, match="wrapped: not close"):
        mt.testing.assert_close(mt.ones(1), mt.zeros(1), msg=lambda m: "wrapped: " + m)
    mt.testing.assert_close(np.ones(2), np.ones(2))


def test_version_module() -> None:
    assert mt.version.__version__ == mt.__version__
    assert mt.version.hip is None and mt.version.debug is False
    try:
        import cupy  # noqa: F401
    except Exception:
        assert mt.version.cuda is None  # as a CPU build of torch answers
    torch = pytest.importorskip("torch")
    assert {"__version__", "cuda", "hip", "debug", "git_version"} <= set(dir(torch.version))


def test_float32_matmul_precision_is_kept_and_checked() -> None:
    assert mt.get_float32_matmul_precision() == "highest"
    try:
        for p in ("high", "medium", "highest"):
            mt.set_float32_matmul_precision(p)
            assert mt.get_float32_matmul_precision() == p
        with pytest.raises(ValueError, match="'fast'"):
            mt.set_float32_matmul_precision("fast")
        # whatever is set, float32 products are full float32 ones
        mt.set_float32_matmul_precision("medium")
        a = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
        assert np.array_equal((mt.tensor(a) @ mt.tensor(a)).numpy(), a @ a)
    finally:
        mt.set_float32_matmul_precision("highest")


# ---------------------------------------------------------------------------- assert_allclose
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("rel", [0.5, 2.0])
def test_assert_allclose_defaults_match_torch(dtype: str, rel: float) -> None:
    """The deprecated spelling: its wider per-dtype tolerances decide as torch's do, just
    inside and just outside each bound; it warns FutureWarning, as torch's."""
    torch = pytest.importorskip("torch")
    tol = {"float16": (1e-3, 1e-3), "float32": (1e-4, 1e-5), "float64": (1e-5, 1e-8)}[dtype]
    a = [1.0, 100.0]
    b = [1.0, 100.0 + rel * (tol[1] + tol[0] * 100.0)]

    def verdict(lib) -> bool:  # type: ignore[no-untyped-def]
        with pytest.warns(FutureWarning):
            try:
                lib.testing.assert_allclose(lib.tensor(a, dtype=getattr(lib, dtype)),
                                            lib.tensor(b, dtype=getattr(lib, dtype)))
                return True
            except AssertionError:
                return False

    assert verdict(mt) == verdict(torch) == (rel < 1)


def test_assert_allclose_converts_and_matches_nans() -> None:
    with pytest.warns(FutureWarning):
        mt.testing.assert_allclose(mt.tensor([1.0, float("nan")]), [1.0, float("nan")])
    with pytest.warns(FutureWarning):
        mt.testing.assert_allclose(mt.tensor([1.0], dtype=mt.float64), mt.tensor([1.0]))
    with pytest.warns(FutureWarning), pytest.raises(AssertionError):
        mt.testing.assert_allclose(mt.tensor([1, 2]), [1, 3])
