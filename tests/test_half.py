"""Half precision (``mpitensor.bfloat16``, ``mpitensor.float16``/``half``) in one process.

bfloat16 is ml_dtypes' NumPy dtype. Values are compared with PyTorch as the oracle, bit for bit
where torch's algorithm is one rounding of a float32 result (casts, elementwise arithmetic, the
number rules of ``+ - * /``, reductions of exactly representable sums) and within one unit in
the last place where torch's kernels sum in another order or use their own ``exp`` (matmul,
softmax). Tests without torch assert against float32 computations done here.
"""

from __future__ import annotations

import operator
import warnings

import ml_dtypes
import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F
from mpitensor._core import half as _half
from mpitensor import dtypes as mdt

HALVES = ("bfloat16", "float16")
BF16 = np.dtype(ml_dtypes.bfloat16)


def _torch():
    return pytest.importorskip("torch")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16)


def _to_torch(torch, a: np.ndarray):
    """A torch tensor with exactly ``a``'s bits (float16 or bfloat16)."""
    tdt = getattr(torch, np.dtype(a.dtype).name)
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(tdt)


def _from_torch(t) -> np.ndarray:
    """The bits of a torch half tensor, as a NumPy array of the same dtype."""
    dt = mdt.to_dtype(str(t.dtype))
    return t.detach().contiguous().view(__import__("torch").int16).numpy().view(dt)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many representable values lie between ``a`` and ``b`` (same sign assumed)."""
    ia = _bits(a).astype(np.int32)
    ib = _bits(b).astype(np.int32)
    return np.abs(ia - ib)


def _same_bits(m: np.ndarray, t: np.ndarray, what: str) -> None:
    """Equal bits, except that any NaN matches any NaN."""
    assert m.dtype == t.dtype, what
    mf, tf = m.astype(np.float32), t.astype(np.float32)
    both_nan = np.isnan(mf) & np.isnan(tf)
    bad = (_bits(m) != _bits(t)) & ~both_nan
    assert not bad.any(), f"{what}: {int(bad.sum())} of {m.size} differ, e.g. {mf[bad][:4]} " \
                          f"vs torch {tf[bad][:4]}"


def _within_one_ulp(m: np.ndarray, t: np.ndarray, what: str, most: float) -> None:
    """At most one ulp apart everywhere, and bit-equal on at least ``most`` of the elements."""
    assert m.dtype == t.dtype, what
    u = _ulps(m, t)
    assert u.max() <= 1, f"{what}: {int(u.max())} ulps apart"
    assert (u == 0).mean() >= most, f"{what}: only {(u == 0).mean():.3f} bit-equal"


def _quiet(f, *args, **kwargs):
    """``f(*args, **kwargs)`` without NumPy's overflow warning (torch overflows to inf
    silently; mpitensor.tensor() lets NumPy's warning through)."""
    with np.errstate(over="ignore"):
        return f(*args, **kwargs)


def _data(dt: np.dtype, shape=(64, 96), seed=0, scale=2.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dt)


# --------------------------------------------------------------------------------------------
# dtypes


class TestDtypes:
    def test_names(self):
        assert mt.bfloat16 == BF16 and isinstance(mt.bfloat16, mt.dtype)
        assert mt.half is mt.float16 and mt.float16 == np.float16
        assert "bfloat16" in mt.__all__ and "finfo" in mt.__all__ and "iinfo" in mt.__all__
        assert repr(mt.zeros(1, dtype=mt.bfloat16)).endswith("dtype=mpitensor.bfloat16)")
        assert mdt.dtype_name(mt.bfloat16) == "bfloat16"

    @pytest.mark.parametrize("spec", ["bfloat16", "torch.bfloat16", "mpitensor.bfloat16",
                                      ml_dtypes.bfloat16, BF16])
    def test_to_dtype(self, spec):
        assert mdt.to_dtype(spec) == mt.bfloat16

    def test_kind(self):
        assert mt.bfloat16.kind == "V"  # why kind_of exists
        assert mdt.kind_of(mt.bfloat16) == "f" and mdt.kind_of(mt.float16) == "f"
        assert mdt.kind_of(mt.int16) == "i" and mdt.kind_of(mt.complex64) == "c"
        assert mdt.is_floating_dtype(mt.bfloat16) and not mdt.is_floating_dtype(mt.uint16)

    @pytest.mark.parametrize("name", ["bfloat16", "float16", "float32", "float64", "complex64",
                                      "complex128"])
    def test_finfo_matches_torch(self, name):
        torch = _torch()
        mine, theirs = mt.finfo(getattr(mt, name)), torch.finfo(getattr(torch, name))
        for attr in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution",
                     "dtype"):
            assert getattr(mine, attr) == getattr(theirs, attr), attr
            assert type(getattr(mine, attr)) is type(getattr(theirs, attr)), attr
        assert repr(mine) == repr(theirs)

    def test_finfo_values(self):
        f = mt.finfo(mt.bfloat16)
        assert (f.bits, f.eps, f.tiny, f.resolution) == (16, 2.0 ** -7, 2.0 ** -126, 0.01)
        assert f.max == float(np.float32(3.3895314e38)) == -f.min
        assert mt.finfo().dtype == "float32" and mt.finfo(mt.float16).max == 65504.0
        assert mt.finfo(mt.float16) == mt.finfo("half") and mt.finfo(mt.float16) != f
        with pytest.raises(TypeError, match="iinfo"):
            mt.finfo(mt.int32)

    @pytest.mark.parametrize("name", ["uint8", "int8", "int16", "int32", "int64"])
    def test_iinfo_matches_torch(self, name):
        torch = _torch()
        mine, theirs = mt.iinfo(getattr(mt, name)), torch.iinfo(getattr(torch, name))
        assert (mine.bits, mine.min, mine.max, mine.dtype) == (theirs.bits, theirs.min,
                                                               theirs.max, theirs.dtype)
        assert repr(mine) == repr(theirs)

    def test_iinfo_refuses_floats_and_bool(self):
        with pytest.raises(TypeError, match="finfo"):
            mt.iinfo(mt.bfloat16)
        with pytest.raises(TypeError):
            mt.iinfo(mt.bool)


# --------------------------------------------------------------------------------------------
# promotion


_PROMO_DTYPES = ("bfloat16", "float16", "float32", "float64", "int64", "int32", "uint8", "bool",
                 "complex64")
_HALF_PAIRS = [(a, b) for a in _PROMO_DTYPES for b in _PROMO_DTYPES if {a, b} & set(HALVES)]


class TestPromotion:
    def test_table(self):
        from mpitensor._core.promotion import promote
        assert promote(mt.bfloat16, mt.float16) == mt.float32
        assert promote(mt.float16, mt.bfloat16) == mt.float32
        assert promote(mt.bfloat16, mt.float32) == mt.float32
        assert promote(mt.bfloat16, mt.float64) == mt.float64
        assert promote(mt.bfloat16, mt.int64) == mt.bfloat16
        assert promote(mt.bool, mt.bfloat16) == mt.bfloat16
        assert promote(mt.bfloat16, mt.complex64) == mt.complex64
        assert promote(mt.complex128, mt.bfloat16) == mt.complex128

    @pytest.mark.parametrize("a, b", _HALF_PAIRS)
    def test_tensors_and_zero_dim_match_torch(self, a, b):
        torch = _torch()
        for shape_b in ((3,), ()):
            x = mt.ones(3, dtype=getattr(mt, a)) + (mt.ones(shape_b, dtype=getattr(mt, b)))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch: ComplexHalf is experimental
                tx = torch.ones(3, dtype=getattr(torch, a)) + torch.ones(shape_b,
                                                                        dtype=getattr(torch, b))
            want = str(tx.dtype).removeprefix("torch.")
            # torch's complex32 (complex float16) has no NumPy dtype: mpitensor gives complex64
            want = "complex64" if want == "complex32" else want
            assert mdt.dtype_name(x.dtype) == want, shape_b

    @pytest.mark.parametrize("name", HALVES)
    @pytest.mark.parametrize("number", [2, 2.5, True])
    def test_python_numbers_keep_half(self, name, number):
        x = mt.ones(3, dtype=getattr(mt, name))
        for op in (operator.add, operator.sub, operator.mul, operator.truediv, operator.pow):
            if number is True and op is operator.sub:
                continue
            assert op(x, number).dtype == x.dtype, op
            assert op(number, x).dtype == x.dtype, op
        assert (x * 1j).dtype == mt.complex64
        assert (mt.tensor([1, 2]) / x[:2]).dtype == x.dtype
        assert (mt.tensor([1, 2]) * 2.5).dtype == mt.float32  # an int tensor: the default

    def test_in_place_keeps_half(self):
        x = mt.ones(3, dtype=mt.bfloat16)
        x += 1.5
        x *= mt.tensor([2.0, 2.0, 2.0])
        assert x.dtype == mt.bfloat16 and x.tolist() == [5.0, 5.0, 5.0]
        with pytest.raises(TypeError, match="can't be cast"):
            y = mt.ones(2, dtype=mt.int32)
            y += mt.ones(2, dtype=mt.bfloat16)


# --------------------------------------------------------------------------------------------
# construction and casting


_SPECIAL = [0.0, -0.0, 1.0, -1.5, 0.1, 1 / 3, 65504.0, 65520.0, 1e5, 3.4e38, 1e39, 1e-5, 6e-8,
            1e-40, 9.2e-41, float("inf"), -float("inf"), 2.0 ** -133, 257.0, 259.0, 1.00390625,
            1.0078125 + 2 ** -9]


class TestConstructAndCast:
    @pytest.mark.parametrize("name", HALVES)
    def test_factories(self, name):
        dt = getattr(mt, name)
        assert mt.zeros(2, 3, dtype=dt).dtype == dt and mt.zeros(2, dtype=dt).tolist() == [0, 0]
        assert mt.ones(2, dtype=dt).tolist() == [1.0, 1.0]
        assert mt.empty(4, dtype=dt).dtype == dt
        assert mt.zeros_like(mt.ones(2, dtype=dt)).dtype == dt
        r = mt.randn(1000, dtype=dt)
        assert r.dtype == dt and 0.8 < float(r.float().std()) < 1.2
        u = mt.rand(1000, dtype=dt)
        assert u.dtype == dt and float(u.float().min()) >= 0 and float(u.float().max()) <= 1

    @pytest.mark.parametrize("name", HALVES)
    def test_factories_match_torch(self, name):
        torch = _torch()
        dt, tdt = getattr(mt, name), getattr(torch, name)
        pairs = [(mt.full((3,), 1.3, dtype=dt), torch.full((3,), 1.3, dtype=tdt)),
                 (mt.arange(0, 3, 0.7, dtype=dt), torch.arange(0, 3, 0.7, dtype=tdt)),
                 (mt.linspace(-1, 1, 5, dtype=dt), torch.linspace(-1, 1, 5, dtype=tdt)),
                 (_quiet(mt.tensor, _SPECIAL, dtype=dt), torch.tensor(_SPECIAL, dtype=tdt)),
                 (mt.tensor([1, 2, 300, 2049], dtype=dt), torch.tensor([1, 2, 300, 2049],
                                                                       dtype=tdt))]
        for i, (m, t) in enumerate(pairs):
            _same_bits(m._data, _from_torch(t), f"{name} factory {i}")
        # torch steps a half linspace in half precision; mpitensor rounds exact points once
        _within_one_ulp(mt.linspace(-1, 1, 7, dtype=dt)._data,
                        _from_torch(torch.linspace(-1, 1, 7, dtype=tdt)), "linspace", most=0.4)

    @pytest.mark.parametrize("name", HALVES)
    @pytest.mark.parametrize("src", ["float32", "float64", "int64", "int32", "uint8", "bool"])
    def test_casts_to_half_match_torch(self, name, src):
        torch = _torch()
        rng = np.random.default_rng(5)
        base = np.concatenate([rng.standard_normal(3000) * 10.0 ** rng.integers(-6, 6, 3000),
                               _SPECIAL])
        if src in ("int64", "int32", "uint8", "bool"):
            base = np.nan_to_num(np.abs(base) if src == "uint8" else base, posinf=0, neginf=0)
            base = np.clip(base, -2e9, 2e9) if src != "uint8" else np.clip(base, 0, 255)
        with np.errstate(over="ignore"):
            src_arr = base.astype(src)
        m = mt.tensor(src_arr).to(getattr(mt, name))
        t = torch.from_numpy(src_arr).to(getattr(torch, name))
        _same_bits(m._data, _from_torch(t), f"{src} -> {name}")

    def test_double_rounds_through_float_as_torch(self):
        # 1 + 2**-11 + 2**-40 lies just above a float16 tie: NumPy's direct cast rounds up,
        # torch (through float32, which drops the 2**-40) rounds the tie to even
        v = 1 + 2 ** -11 + 2 ** -40
        assert np.float16(v) == np.float16(1 + 2 ** -10)
        assert mt.tensor([v], dtype=mt.float64).half().item() == 1.0

    @pytest.mark.parametrize("name", HALVES)
    @pytest.mark.parametrize("dst", ["float32", "float64", "int64", "uint8", "bool", "float16",
                                     "bfloat16"])
    def test_casts_from_half_match_torch(self, name, dst):
        torch = _torch()
        a = (np.random.default_rng(2).standard_normal(2000) * 50).astype(getattr(mt, name))
        if dst in ("uint8", "int64"):
            a = np.abs(a) if dst == "uint8" else a
        m = mt.tensor(a).to(getattr(mt, dst))
        t = _to_torch(torch, a).to(getattr(torch, dst))
        if dst in HALVES:
            _same_bits(m._data, _from_torch(t), f"{name} -> {dst}")
        else:
            np.testing.assert_array_equal(m._data, t.numpy())

    def test_method_forms(self):
        x = mt.tensor([1.123456, 2.5, -3.0])
        b, h = x.bfloat16(), x.half()
        assert b.dtype == mt.bfloat16 and h.dtype == mt.float16
        assert b.tolist() == [1.125, 2.5, -3.0] and h.tolist() == [1.123046875, 2.5, -3.0]
        assert b.float().dtype == mt.float32 and b.float().tolist() == [1.125, 2.5, -3.0]
        assert b.bfloat16() is b and h.half() is h
        assert x.to(mt.bfloat16).dtype == mt.bfloat16 and x.to("bfloat16").dtype == mt.bfloat16
        assert x.to(dtype=mt.half).dtype == mt.float16 and x.type(mt.bfloat16).dtype == mt.bfloat16
        assert b.type() == "mpitensor.BFloat16Tensor" and h.type() == "mpitensor.HalfTensor"
        assert b.is_floating_point() and not b.is_complex()
        assert b.dtype == mt.bfloat16 and b.dtype != mt.float16 and h.dtype == mt.half
        assert isinstance(b[0].item(), float) and b[0].item() == 1.125
        assert b.numpy().dtype == BF16

    def test_cast_is_differentiable(self):
        x = mt.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x.bfloat16()
        assert y.requires_grad and y.grad_fn.name() == "ToCopyBackward"
        (y * y).sum().backward()
        assert x.grad.dtype == mt.float32 and x.grad.tolist() == [2.0, 4.0, 6.0]
        leaf = mt.ones(2, dtype=mt.bfloat16, requires_grad=True)
        assert leaf.requires_grad

    def test_printing_matches_torch(self):
        torch = _torch()
        values = [[1.0, 3.0, 256.0, 1000.0], [0.1, -2.5, 3.14159], [1e-5, 3.0, 25600.0],
                  [float("nan"), float("inf"), -0.0, 0.5], [1.5]]
        for name in HALVES:
            for v in values:
                m = repr(mt.tensor(v).to(getattr(mt, name)))
                t = repr(torch.tensor(v).to(getattr(torch, name)))
                assert m == t.replace("torch.", "mpitensor."), (m, t)
            m = repr(mt.tensor(2.5, dtype=getattr(mt, name), requires_grad=True))
            t = repr(torch.tensor(2.5, dtype=getattr(torch, name), requires_grad=True))
            assert m == t.replace("torch.", "mpitensor.")


# --------------------------------------------------------------------------------------------
# arithmetic


_BINARY = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
           "truediv": operator.truediv, "pow": lambda a, b: abs(a) ** b}
_WITH_NUMBER = {
    "x + s": lambda x, s: x + s, "x - s": lambda x, s: x - s, "s - x": lambda x, s: s - x,
    "x * s": lambda x, s: x * s, "s * x": lambda x, s: s * x, "x / s": lambda x, s: x / s,
    "s / x": lambda x, s: s / x, "x ** s": lambda x, s: abs(x) ** s, "x % s": lambda x, s: x % s,
    "x // s": lambda x, s: x // s, "x < s": lambda x, s: x < s, "x == s": lambda x, s: x == s,
}
_UNARY = {"neg": lambda x: -x, "abs": lambda x: x.abs(), "exp": lambda x: x.exp(),
          "log": lambda x: x.abs().log(), "sqrt": lambda x: x.abs().sqrt(),
          "tanh": lambda x: x.tanh(), "sigmoid": lambda x: x.sigmoid(),
          "relu": lambda x: x.relu(), "clamp": lambda x: x.clamp(-1, 1.3)}


class TestArithmetic:
    @pytest.mark.parametrize("name", HALVES)
    @pytest.mark.parametrize("op", list(_BINARY))
    def test_tensor_op_tensor_is_torch_bit_for_bit(self, name, op):
        torch = _torch()
        a, b = _data(getattr(mt, name), seed=1), _data(getattr(mt, name), seed=2)
        m = _BINARY[op](mt.tensor(a), mt.tensor(b))
        t = _BINARY[op](_to_torch(torch, a), _to_torch(torch, b))
        _same_bits(m._data, _from_torch(t), f"{name} {op}")

    @pytest.mark.parametrize("name", HALVES)
    @pytest.mark.parametrize("op", list(_WITH_NUMBER))
    def test_number_rules_are_torch_bit_for_bit(self, name, op):
        """torch rounds a number to the tensor's dtype for + - ** % and comparisons, but keeps
        it in float32 for * / //; s / x is the rounded reciprocal times s."""
        torch = _torch()
        a = _data(getattr(mt, name), shape=(4000,), seed=3, scale=4.0)
        f = _WITH_NUMBER[op]
        for s in (0.3, 1.0039, 2.7182818, 1000.3, 3, 2, -2, -1, 0.5, 1.5):
            m, t = f(mt.tensor(a), s), f(_to_torch(torch, a), s)
            if t.dtype == torch.bool:
                np.testing.assert_array_equal(m._data, t.numpy(), f"{name} {op} {s}")
            elif op == "x % s":  # exact multiples: torch gives -0.0 (in float32 as well)
                np.testing.assert_array_equal(m._data.astype(np.float32),
                                              _from_torch(t).astype(np.float32))
            else:
                _same_bits(m._data, _from_torch(t), f"{name} {op} {s}")

    @pytest.mark.parametrize("name", HALVES)
    def test_zero_dim_float32_acts_as_a_number(self, name):
        torch = _torch()
        a = _data(getattr(mt, name), shape=(1000,), seed=4, scale=100.0)
        for op in (operator.add, operator.mul):
            m = op(mt.tensor(a), mt.tensor(1.0039))
            t = op(_to_torch(torch, a), torch.tensor(1.0039))
            assert m.dtype == getattr(mt, name)
            _same_bits(m._data, _from_torch(t), f"{name} {op.__name__} 0-d")

    def test_rounding_once_not_twice(self):
        x = mt.tensor([256.0, 3.0], dtype=mt.bfloat16)
        # 256 + 1.0039: the number rounds to 1 first, then 257 ties to even: 256 (torch's add)
        assert (x + 1.0039).tolist() == [256.0, 4.0]
        # * keeps the number in float32: 3 * 1.0039 = 3.0117 rounds to 3.015625
        assert (x * 1.0039).tolist() == [256.0, 3.015625]
        # the NumPy/ml_dtypes results this replaces: a float32 array
        assert (x._data + 1.0039).dtype == np.float32

    @pytest.mark.parametrize("name", HALVES)
    @pytest.mark.parametrize("op", list(_UNARY))
    def test_unary_within_one_ulp_of_torch(self, name, op):
        torch = _torch()
        a = _data(getattr(mt, name), seed=5)
        m, t = _UNARY[op](mt.tensor(a)), _UNARY[op](_to_torch(torch, a))
        assert m.dtype == getattr(mt, name)
        _within_one_ulp(m._data, _from_torch(t), f"{name} {op}", most=0.999)

    @pytest.mark.parametrize("name", HALVES)
    def test_matmul_is_one_rounding_of_a_float32_product(self, name):
        dt = getattr(mt, name)
        a, w = _data(dt, (64, 96), 6), _data(dt, (96, 48), 7, 1.0)
        m = mt.tensor(a) @ mt.tensor(w)
        assert m.dtype == dt
        want = (a.astype(np.float32) @ w.astype(np.float32)).astype(dt)
        _same_bits(m._data, want, f"{name} matmul")
        v = mt.tensor(a[0]) @ mt.tensor(a[1])  # a dot product, 0-d
        assert v.dtype == dt and v.item() == float(
            np.float32(a[0].astype(np.float32) @ a[1].astype(np.float32)).astype(dt))
        # bfloat16's own NumPy matmul would have returned float32
        assert _half.matmul(a, w).dtype == dt

    @pytest.mark.parametrize("name", HALVES)
    def test_matmul_and_linear_match_torch(self, name):
        """Equal to torch's but for float32 summation order: within one rounding of the result
        plus float32's error on the sum of the terms' magnitudes, and mostly bit-equal."""
        torch = _torch()
        dt = getattr(mt, name)
        a, w, b = _data(dt, (64, 96), 6), _data(dt, (48, 96), 7, 1.0), _data(dt, (48,), 8)
        bound = np.abs(a.astype(np.float32)) @ np.abs(w.astype(np.float32)).T
        for m, t in (((mt.tensor(a) @ mt.tensor(w).T), _to_torch(torch, a) @ _to_torch(torch, w).T),
                     (F.linear(mt.tensor(a), mt.tensor(w), mt.tensor(b)),
                      torch.nn.functional.linear(_to_torch(torch, a), _to_torch(torch, w),
                                                 _to_torch(torch, b)))):
            assert m.dtype == dt
            mv, tv = m._data.astype(np.float32), _from_torch(t).astype(np.float32)
            tol = np.abs(tv) * mt.finfo(dt).eps + (bound + np.abs(b.astype(np.float32))) * 1e-6
            assert (np.abs(mv - tv) <= tol).all()
            assert (mv == tv).mean() >= 0.99

    @pytest.mark.parametrize("name", HALVES)
    def test_sum_and_mean_accumulate_in_float32(self, name):
        dt = getattr(mt, name)
        a = np.random.default_rng(9).standard_normal(100_000).astype(dt)
        exact = a.astype(np.float64).sum()
        s = mt.tensor(a).sum()
        assert s.dtype == dt
        assert s.item() == float(np.float32(a.astype(np.float32).sum()).astype(dt))
        assert abs(s.item() - exact) <= abs(exact) * mt.finfo(dt).eps
        m = mt.tensor(a).mean()
        assert m.dtype == dt and abs(m.item() - exact / a.size) <= abs(exact / a.size) * 0.01
        if dt == mt.bfloat16:  # what summing in bfloat16 gives instead
            assert abs(float(a.sum()) - exact) > 5
        rows = mt.tensor(a.reshape(100, 1000))
        np.testing.assert_array_equal(
            rows.sum(1)._data, a.reshape(100, 1000).astype(np.float32).sum(1).astype(dt))
        assert rows.sum(1, dtype=mt.float32).dtype == mt.float32
        assert mt.tensor([1, 2]).mean(dtype=dt).item() == 1.5

    @pytest.mark.parametrize("name", HALVES)
    def test_reductions_match_torch(self, name):
        torch = _torch()
        a = _data(getattr(mt, name), seed=10)
        # integer-valued data: every float32 sum is exact, so the once-rounded results match
        ints = np.round(a.astype(np.float32) * 20).astype(getattr(mt, name))
        for f in (lambda x: x.sum(), lambda x: x.sum(0), lambda x: x.sum(1), lambda x: x.mean(1)):
            _same_bits(f(mt.tensor(ints))._data, _from_torch(f(_to_torch(torch, ints))), name)
        for f in (lambda x: x.max(), lambda x: x.min(1).values, lambda x: x.var(1),
                  lambda x: x.std(), lambda x: x.softmax(1), lambda x: x.log_softmax(1)):
            m, t = f(mt.tensor(a)), f(_to_torch(torch, a))
            assert m.dtype == getattr(mt, name)
            _within_one_ulp(m._data, _from_torch(t), name, most=0.85)
        assert mt.tensor(a).argmax().item() == _to_torch(torch, a).argmax().item()


# --------------------------------------------------------------------------------------------
# autograd


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.c(self.b(self.a(x).relu()).sigmoid())


class TestAutograd:
    @pytest.mark.parametrize("name", HALVES)
    def test_elementwise_gradients_match_torch(self, name):
        torch = _torch()
        dt = getattr(mt, name)
        rng = np.random.default_rng(11)
        a, b, go = (rng.standard_normal(500).astype(dt) for _ in range(3))
        exact = {"mul": lambda x, y: x * y, "exp": lambda x, y: x.exp() * y,
                 "tanh": lambda x, y: x.tanh() - y, "relu": lambda x, y: x.relu() * y,
                 "square": lambda x, y: x ** 2 + y, "rsub": lambda x, y: (1.7 - x) * y,
                 "softmax": lambda x, y: (x.reshape(20, 25).softmax(1) * y.reshape(20, 25))}
        if name == "bfloat16":
            exact["sigmoid"] = lambda x, y: x.sigmoid() * y
            exact["add number"] = lambda x, y: x + y * 0.3
        close = {"sigmoid": lambda x, y: x.sigmoid() * y, "div": lambda x, y: x / (y.abs() + 1),
                 "add number": lambda x, y: x + y * 0.3}
        for kind, fns in (("exact", exact), ("close", close)):
            for op, f in fns.items():
                tx, ty = (_to_torch(torch, v).requires_grad_() for v in (a, b))
                mx, my = (mt.tensor(v).requires_grad_() for v in (a, b))
                tout, mout = f(tx, ty), f(mx, my)
                tout.backward(_to_torch(torch, go).reshape(tout.shape))
                mout.backward(mt.tensor(go).reshape(mout.shape))
                for mg, tg in ((mx.grad, tx.grad), (my.grad, ty.grad)):
                    assert mg.dtype == dt
                    want = _from_torch(tg)
                    if kind == "exact":  # values: relu's masked zeros may differ in sign
                        np.testing.assert_array_equal(mg._data.astype(np.float32),
                                                      want.astype(np.float32), f"{name} {op}")
                    else:
                        assert _ulps(np.abs(mg._data), np.abs(want)).max() <= 2, op

    @pytest.mark.parametrize("name", HALVES)
    @pytest.mark.parametrize("loss", ["mse", "cross_entropy"])
    def test_mlp_gradients_match_torch(self, name, loss):
        torch = _torch()
        tnn = torch.nn
        dt, tdt = getattr(mt, name), getattr(torch, name)
        torch.manual_seed(0)
        tm = tnn.Sequential(tnn.Linear(16, 32), tnn.ReLU(), tnn.Linear(32, 32), tnn.Sigmoid(),
                            tnn.Linear(32, 8)).to(tdt)
        mm = _MLP().to(dt)
        for tp, mp in zip(tm.parameters(), mm.parameters()):
            assert mp.dtype == dt
            mp.data = mt.tensor(_from_torch(tp))
        x = torch.randn(64, 16).to(tdt)
        mx = mt.tensor(_from_torch(x))
        if loss == "mse":
            y = torch.randn(64, 8).to(tdt)
            tl = tnn.functional.mse_loss(tm(x), y)
            ml = F.mse_loss(mm(mx), mt.tensor(_from_torch(y)))
        else:
            y = torch.randint(0, 8, (64,))
            tl = tnn.functional.cross_entropy(tm(x), y)
            ml = F.cross_entropy(mm(mx), mt.tensor(y.numpy()))
        tl.backward()
        ml.backward()
        assert ml.dtype == dt
        assert abs(ml.item() - tl.item()) <= abs(tl.item()) * 2 * mt.finfo(dt).eps
        for tp, mp in zip(tm.parameters(), mm.parameters()):
            tg = tp.grad.float().numpy()
            assert mp.grad.dtype == dt
            np.testing.assert_allclose(mp.grad.float().numpy(), tg, rtol=1e-2,
                                       atol=1e-2 * np.abs(tg).max())
            if loss == "mse" and name == "bfloat16":  # every step one rounding, as torch's
                np.testing.assert_array_equal(mp.grad.float().numpy(), tg)

    def test_module_casts(self):
        m = _MLP()
        assert m.bfloat16() is m and m.a.weight.dtype == mt.bfloat16
        assert m.half().a.weight.dtype == mt.float16
        assert m.to(mt.bfloat16).c.bias.dtype == mt.bfloat16
        assert m.float().b.weight.dtype == mt.float32
        lin = nn.Linear(3, 2, dtype=mt.bfloat16)
        assert lin.weight.dtype == mt.bfloat16 and lin.weight.requires_grad
        out = lin(mt.ones(4, 3, dtype=mt.bfloat16))
        assert out.dtype == mt.bfloat16
        out.sum().backward()
        assert lin.weight.grad.dtype == mt.bfloat16 and lin.weight.grad.tolist() == [[4.0] * 3] * 2

    def test_sgd_step_keeps_bfloat16(self):
        lin = nn.Linear(3, 2, dtype=mt.bfloat16)
        opt = mt.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
        before = lin.weight.detach().float().numpy().copy()
        lin(mt.ones(4, 3, dtype=mt.bfloat16)).sum().backward()
        opt.step()
        assert lin.weight.dtype == mt.bfloat16
        np.testing.assert_allclose(lin.weight.detach().float().numpy(), before - 0.4, atol=0.02)


# --------------------------------------------------------------------------------------------
# serialization


class TestSerialization:
    def _tensors(self):
        bits = np.array([0x3FC0, 0x7FC1, 0xFF81, 0x7F80, 0xFF80, 0x0001, 0x8000, 0x4049],
                        dtype=np.uint16)
        hbits = np.array([0x3E00, 0x7E01, 0xFC01, 0x7C00, 0x0001, 0x8000, 0x4248],
                         dtype=np.uint16)
        return bits.view(BF16), hbits.view(np.float16)

    def test_mpitensor_format_round_trip(self, tmp_path):
        b, h = self._tensors()
        obj = {"b": mt.tensor(b), "h": mt.tensor(h), "p": nn.Parameter(mt.tensor(b)),
               "dt": mt.bfloat16, "arr": b.reshape(2, 4), "scalar": b[0]}
        mt.save(obj, tmp_path / "x.ckpt")
        out = mt.load(tmp_path / "x.ckpt")
        for k in ("b", "h", "p"):
            assert out[k].dtype == obj[k].dtype
            np.testing.assert_array_equal(_bits(out[k]._data), _bits(obj[k]._data), k)
        assert out["p"].requires_grad
        assert out["dt"] == mt.bfloat16 and out["arr"].dtype == BF16
        np.testing.assert_array_equal(_bits(out["arr"]), _bits(b.reshape(2, 4)))
        assert out["scalar"].dtype == BF16 and out["scalar"] == b[0]

    def test_torch_file_loads_with_identical_bits(self, tmp_path):
        torch = _torch()
        b, h = self._tensors()
        tb, th = _to_torch(torch, b), _to_torch(torch, h)
        sd = {"b": tb, "h": th, "view": tb[1::2], "p": torch.nn.Parameter(tb.clone()),
              "dt": torch.bfloat16, "lin": torch.nn.Linear(3, 2).to(torch.bfloat16).state_dict()}
        torch.save(sd, tmp_path / "t.pt")
        out = mt.load(tmp_path / "t.pt")
        for k in ("b", "h", "view", "p"):
            np.testing.assert_array_equal(_bits(out[k]._data), _bits(_from_torch(sd[k])), k)
        assert out["dt"] == mt.bfloat16 and out["b"].dtype == mt.bfloat16
        assert out["lin"]["weight"].dtype == mt.bfloat16
        np.testing.assert_array_equal(_bits(out["lin"]["weight"]._data),
                                      _bits(_from_torch(sd["lin"]["weight"])))

    def test_torch_format_written_by_mpitensor_loads_in_torch(self, tmp_path):
        torch = _torch()
        b, h = self._tensors()
        mt.save({"b": mt.tensor(b), "h": mt.tensor(h), "dt": mt.bfloat16}, tmp_path / "m.pt")
        back = torch.load(tmp_path / "m.pt", weights_only=True)
        assert back["b"].dtype == torch.bfloat16 and back["dt"] is torch.bfloat16
        np.testing.assert_array_equal(_bits(_from_torch(back["b"])), _bits(b))
        np.testing.assert_array_equal(_bits(_from_torch(back["h"])), _bits(h))
