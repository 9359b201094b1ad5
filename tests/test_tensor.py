"""Unit tests of mpitensor.Tensor, its constructors, dtypes, seeding and printing (one process).

Values are asserted directly; where PyTorch is installed, extra tests compare against it as an
oracle. GPU tests are marked ``gpu`` and skip with the reason where CuPy or a device is missing.
"""

from __future__ import annotations

import copy
import operator
import pickle
import warnings

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import backend

# --------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Every test starts from the default dtype and print options, and leaves them so."""
    yield
    mt.set_default_dtype(mt.float32)
    mt.set_printoptions(profile="default")


def arr(t: mt.Tensor) -> np.ndarray:
    return backend.to_numpy(t._data)


# --------------------------------------------------------------------------------------------
# dtypes


class TestDtypes:
    def test_names_are_numpy_dtypes(self):
        assert mt.float32 == np.float32 and isinstance(mt.float32, np.dtype)
        assert mt.bool == np.dtype(np.bool_) and mt.bool_ is mt.bool
        for name in ["uint8", "int8", "int16", "int32", "int64", "float16", "float64",
                     "complex64", "complex128"]:
            assert getattr(mt, name) == np.dtype(name)

    def test_torch_aliases(self):
        assert mt.half == mt.float16
        assert mt.float == mt.float32
        assert mt.double == mt.float64
        assert mt.short == mt.int16
        assert mt.int == mt.int32
        assert mt.long == mt.int64
        assert mt.cfloat == mt.complex64
        assert mt.cdouble == mt.complex128

    @pytest.mark.parametrize(
        "spec, expected",
        [
            (mt.float64, np.float64),
            (np.int32, np.int32),
            (np.dtype("f2"), np.float16),
            ("float32", np.float32),
            ("float", np.float32),
            ("long", np.int64),
            ("torch.int16", np.int16),
            ("mpitensor.bool", np.bool_),
            ("f8", np.float64),
            (float, np.float64),
            (int, np.int64),
            (bool, np.bool_),
            (complex, np.complex128),
        ],
    )
    def test_to_dtype(self, spec, expected):
        assert mt.to_dtype(spec) == np.dtype(expected)

    @pytest.mark.parametrize("bad", ["float128", "U3", object, np.dtype("M8[s]"), "nonsense", 3])
    def test_to_dtype_rejects(self, bad):
        with pytest.raises(TypeError, match="unsupported dtype"):
            mt.to_dtype(bad)

    def test_to_dtype_none_and_byteorder(self):
        with pytest.raises(TypeError, match="dtype None"):
            mt.to_dtype(None)
        with pytest.raises(TypeError, match="native byte order"):
            mt.to_dtype(np.dtype(">f4") if np.little_endian else np.dtype("<f4"))

    def test_default_dtype(self):
        assert mt.get_default_dtype() == mt.float32
        mt.set_default_dtype(mt.float64)
        assert mt.get_default_dtype() == mt.float64
        assert mt.tensor([1.5]).dtype == mt.float64
        assert mt.tensor([1j]).dtype == mt.complex128
        assert mt.zeros(2).dtype == mt.float64
        assert (mt.tensor([1, 2]) / 2).dtype == mt.float64
        with pytest.raises(TypeError, match="float32 or mpitensor.float64"):
            mt.set_default_dtype(mt.int64)


# --------------------------------------------------------------------------------------------
# Size


class TestSize:
    def test_tuple_like(self):
        s = mt.zeros(2, 3).shape
        assert isinstance(s, mt.Size) and isinstance(s, tuple)
        assert s == (2, 3) and s[0] == 2 and len(s) == 2
        assert repr(s) == "mpitensor.Size([2, 3])" == str(s)
        assert isinstance(s[1:], mt.Size) and s[1:] == (3,)
        assert isinstance(s + (4,), mt.Size) and s + (4,) == (2, 3, 4)
        assert s.numel() == 6
        assert mt.Size([4]) == (4,)
        assert pickle.loads(pickle.dumps(s)) == s

    def test_rejects_non_ints(self):
        with pytest.raises(TypeError, match="sequence of ints"):
            mt.Size([1.5])


# --------------------------------------------------------------------------------------------
# constructors


class TestConstructors:
    @pytest.mark.parametrize(
        "data, dtype",
        [
            (1.5, mt.float32),
            ([1.0, 2.0], mt.float32),
            ([[1, 2], [3, 4]], mt.int64),
            (3, mt.int64),
            ([True, False], mt.bool),
            (True, mt.bool),
            ([1 + 2j], mt.complex64),
            ([1, 2.5], mt.float32),
            ([], mt.float32),
            ([[]], mt.float32),
            (np.float64(1.5), mt.float64),
            (np.arange(3, dtype=np.int16), mt.int16),
            (np.zeros(2), mt.float64),
        ],
    )
    def test_tensor_dtype_inference(self, data, dtype):
        t = mt.tensor(data)
        assert t.dtype == dtype
        np.testing.assert_array_equal(arr(t), np.asarray(data))

    def test_tensor_copies(self):
        a = np.arange(3.0)
        t = mt.tensor(a)
        a[0] = 10
        assert t.tolist() == [0.0, 1.0, 2.0]
        u = mt.tensor(t)
        u[1] = 5
        assert t[1].item() == 1.0

    def test_tensor_dtype_device_requires_grad(self):
        t = mt.tensor([1, 2], dtype=mt.float64, device="cpu", requires_grad=True)
        assert t.dtype == mt.float64 and t.device == "cpu" and t.requires_grad
        assert mt.tensor([1.7, -1.7], dtype=mt.int32).tolist() == [1, -1]
        assert mt.tensor([mt.tensor(1.0), mt.tensor(2.0)]).tolist() == [1.0, 2.0]

    @pytest.mark.parametrize(
        "data, exc, match",
        [
            ([[1, 2], [3]], ValueError, "rectangular"),
            (["a"], TypeError, "numeric dtype"),
            ("abc", TypeError, "cannot make a tensor from str"),
            ({1: 2}, TypeError, "numeric dtype"),
        ],
    )
    def test_tensor_bad_data(self, data, exc, match):
        with pytest.raises(exc, match=match):
            mt.tensor(data)

    def test_tensor_bad_device(self):
        with pytest.raises(ValueError, match="unknown device type 'tpu'"):
            mt.tensor([1], device="tpu")
        with pytest.raises(TypeError, match="device must be"):
            mt.zeros(2, device=1.5)

    def test_wrapping_shares_memory(self):
        a = np.zeros(3, np.float32)
        t = mt.Tensor(a)
        assert t._data is a
        f = mt.from_numpy(a)
        assert f._data is a
        f[0] = 7
        assert a[0] == 7
        a[1] = 8
        assert f.tolist() == [7.0, 8.0, 0.0]
        w = mt.Tensor._wrap(a)
        assert w._data is a and not w.requires_grad and w.grad is None and w.grad_fn is None
        assert w.is_leaf

    def test_tensor_class_legacy_forms(self):
        assert mt.Tensor([1, 2]).dtype == mt.float32  # torch.Tensor(list) -> default float
        assert mt.Tensor(2, 3).shape == (2, 3)
        assert mt.Tensor().shape == (0,)
        with pytest.raises(TypeError, match="unsupported dtype"):
            mt.Tensor(np.array(["x"]))

    def test_from_numpy_rejects(self):
        with pytest.raises(TypeError, match="expects a numpy.ndarray, got list"):
            mt.from_numpy([1, 2])
        with pytest.raises(TypeError, match="unsupported dtype"):
            mt.from_numpy(np.array([None]))

    def test_as_tensor(self):
        a = np.arange(3)
        assert mt.as_tensor(a)._data is a
        t = mt.tensor([1.0])
        assert mt.as_tensor(t) is t
        assert mt.as_tensor(t, dtype=mt.float64).dtype == mt.float64
        assert mt.as_tensor([1, 2]).tolist() == [1, 2]

    @pytest.mark.parametrize("fn, value", [(mt.zeros, 0), (mt.ones, 1)])
    def test_zeros_ones(self, fn, value):
        for t in (fn(2, 3), fn((2, 3)), fn([2, 3])):
            assert t.shape == (2, 3) and t.dtype == mt.float32
            assert (arr(t) == value).all()
        assert fn(()).shape == () and fn(0).numel() == 0
        assert fn(2, dtype=mt.int8).dtype == mt.int8
        assert fn(2, requires_grad=True).requires_grad
        assert fn(mt.tensor(3)).shape == (3,)  # one-element int tensors act as sizes

    def test_size_errors(self):
        with pytest.raises(ValueError, match=r"negative dimension -1 in size \[2, -1\]"):
            mt.zeros(2, -1)
        with pytest.raises(TypeError, match="size must be ints"):
            mt.ones(2.5)
        with pytest.raises(TypeError, match="unsupported dtype"):
            mt.zeros(2, dtype="str")

    def test_empty_full(self):
        assert mt.empty(2, 2).shape == (2, 2) and mt.empty(3).dtype == mt.float32
        assert mt.full((2,), 7).tolist() == [7, 7] and mt.full((2,), 7).dtype == mt.int64
        assert mt.full((2,), 1.5).dtype == mt.float32
        assert mt.full((1,), True).dtype == mt.bool
        assert mt.full((1,), 1j).dtype == mt.complex64
        assert mt.full(3, 2.0, dtype=mt.float64).tolist() == [2.0, 2.0, 2.0]
        assert mt.full((2,), mt.tensor(4)).tolist() == [4, 4]
        with pytest.raises(TypeError, match="fill_value must be a number"):
            mt.full((2,), "x")

    def test_arange(self):
        t = mt.arange(5)
        assert t.dtype == mt.int64 and t.tolist() == [0, 1, 2, 3, 4]
        assert mt.arange(1, 7, 2).tolist() == [1, 3, 5]
        assert mt.arange(5, 0, -2).tolist() == [5, 3, 1]
        f = mt.arange(0, 1, 0.25)
        assert f.dtype == mt.float32 and f.tolist() == [0.0, 0.25, 0.5, 0.75]
        assert mt.arange(0.0, 3).dtype == mt.float32
        assert mt.arange(0, 1, 0.1).numel() == 10
        assert mt.arange(3, dtype=mt.float64).dtype == mt.float64
        assert mt.arange(0).numel() == 0
        with pytest.raises(ValueError, match="step must be nonzero"):
            mt.arange(0, 10, 0)
        with pytest.raises(ValueError, match="inconsistent with step sign"):
            mt.arange(0, 10, -1)
        with pytest.raises(TypeError, match="real numbers"):
            mt.arange("3")

    def test_linspace_eye(self):
        assert mt.linspace(0, 1, 5).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
        assert mt.linspace(0, 1, 5).dtype == mt.float32
        assert mt.eye(2).tolist() == [[1.0, 0.0], [0.0, 1.0]]
        assert mt.eye(2, 3, dtype=mt.int64).shape == (2, 3)
        with pytest.raises(ValueError, match="non-negative"):
            mt.linspace(0, 1, -1)

    def test_like_functions(self):
        src = mt.ones(2, 3, dtype=mt.float64)
        for fn in (mt.zeros_like, mt.ones_like, mt.empty_like, mt.rand_like, mt.randn_like):
            t = fn(src)
            assert t.shape == (2, 3) and t.dtype == mt.float64 and t.device == "cpu"
            assert t._data is not src._data
        assert (arr(mt.zeros_like(src)) == 0).all() and (arr(mt.ones_like(src)) == 1).all()
        assert mt.full_like(src, 3).tolist() == [[3.0] * 3] * 2
        assert mt.zeros_like(src, dtype=mt.int32).dtype == mt.int32
        assert mt.zeros_like(np.zeros((4,), np.int8)).dtype == mt.int8
        assert mt.ones_like(src, requires_grad=True).requires_grad
        with pytest.raises(TypeError, match="floating point dtype"):
            mt.rand_like(mt.tensor([1, 2]))
        with pytest.raises(TypeError, match="expected a Tensor or an array, got list"):
            mt.zeros_like([1, 2])

    def test_requires_grad_rules(self):
        t = mt.zeros(2)
        assert t.requires_grad is False and t.grad is None and t.grad_fn is None and t.is_leaf
        assert t.requires_grad_() is t and t.requires_grad
        t.requires_grad = False
        assert not t.requires_grad
        with pytest.raises(RuntimeError, match="floating point and complex"):
            mt.tensor([1, 2], requires_grad=True)
        d = mt.ones(2, requires_grad=True).detach()
        assert not d.requires_grad


# --------------------------------------------------------------------------------------------
# random numbers


class TestRandom:
    def test_manual_seed_reproducible(self):
        mt.manual_seed(123)
        a, b = mt.rand(5), mt.randn(2, 3)
        mt.manual_seed(123)
        assert mt.equal(a, mt.rand(5)) and mt.equal(b, mt.randn((2, 3)))
        mt.manual_seed(124)
        assert not mt.equal(a, mt.rand(5))
        assert mt.initial_seed() == 124

    def test_defaults_and_ranges(self):
        r = mt.rand(1000)
        assert r.dtype == mt.float32 and 0 <= float(r.min()) and float(r.max()) < 1
        n = mt.randn(20000, dtype=mt.float64)
        assert n.dtype == mt.float64 and abs(float(n.mean())) < 0.05
        assert abs(float(n.std()) - 1) < 0.05
        assert mt.rand(2, dtype=mt.float16).dtype == mt.float16
        c = mt.randn(20000, dtype=mt.complex64)
        assert c.dtype == mt.complex64 and abs(float((c.abs() ** 2).mean()) - 1) < 0.05

    def test_generators(self):
        g1, g2 = mt.Generator().manual_seed(7), mt.Generator().manual_seed(7)
        assert mt.equal(mt.rand(4, generator=g1), mt.rand(4, generator=g2))
        assert g1.initial_seed() == 7
        state = g1.get_state()
        x = mt.randn(3, generator=g1)
        g1.set_state(state)
        assert mt.equal(x, mt.randn(3, generator=g1))
        ng = np.random.default_rng(5)
        assert mt.equal(mt.rand(3, generator=ng), mt.rand(3, generator=np.random.default_rng(5)))
        mt.manual_seed(0)
        st = mt.get_rng_state()
        y = mt.rand(2)
        mt.set_rng_state(st)
        assert mt.equal(y, mt.rand(2))
        assert isinstance(mt.seed(), int)
        with pytest.raises(TypeError, match="generator must be"):
            mt.rand(2, generator=42)
        with pytest.raises(TypeError, match="seed must be an int"):
            mt.manual_seed(1.5)
        assert mt.manual_seed(-1) is mt.default_generator  # torch accepts negative seeds

    def test_randint_randperm(self):
        mt.manual_seed(0)
        r = mt.randint(0, 10, (100,))
        assert r.dtype == mt.int64 and r.shape == (100,)
        assert 0 <= int(r.min()) and int(r.max()) < 10
        assert mt.randint(3, (4,)).max().item() < 3
        p = mt.randperm(10, generator=mt.Generator().manual_seed(1))
        assert sorted(p.tolist()) == list(range(10)) and p.dtype == mt.int64
        with pytest.raises(ValueError, match="low < high"):
            mt.randint(5, 5, (2,))

    def test_rand_rejects_int_dtype(self):
        with pytest.raises(TypeError, match="floating point dtype"):
            mt.rand(2, dtype=mt.int64)
        with pytest.raises(TypeError, match="floating point dtype"):
            mt.randn(2, dtype=mt.int32)


# --------------------------------------------------------------------------------------------
# metadata and Python conversions


class TestMetadata:
    def test_shape_size_dim(self):
        t = mt.zeros(2, 3, 4)
        assert t.shape == (2, 3, 4) and t.size() == (2, 3, 4) and isinstance(t.size(), mt.Size)
        assert t.size(1) == 3 and t.size(-1) == 4
        assert t.dim() == 3 == t.ndim
        assert t.numel() == 24 and t.element_size() == 4 and t.nbytes == 96
        assert t.itemsize == 4 and t.stride() == (12, 4, 1) and t.stride(0) == 12
        assert t.dtype == mt.float32 and t.device == mt.device("cpu") and t.device == "cpu"
        assert not t.is_cuda and t.is_cpu
        assert t.is_floating_point() and not t.is_complex() and mt.is_floating_point(t)
        assert t.data_ptr() == t._data.ctypes.data
        with pytest.raises(IndexError, match=r"expected to be in range of \[-3, 2\], but got 3"):
            t.size(3)

    def test_item_and_scalar_conversions(self):
        assert mt.tensor([2.5]).item() == 2.5 and isinstance(mt.tensor(3).item(), int)
        assert float(mt.tensor(2.5)) == 2.5 and int(mt.tensor([[7]])) == 7
        assert int(mt.tensor(2.7)) == 2 and complex(mt.tensor(1j)) == 1j
        assert bool(mt.tensor([1])) and not bool(mt.tensor(0.0))
        assert [10, 20, 30][mt.tensor(1)] == 20 and operator.index(mt.tensor([2])) == 2
        with pytest.raises(RuntimeError, match="a Tensor with 2 elements cannot be converted"):
            mt.tensor([1, 2]).item()
        with pytest.raises(ValueError, match="only one element tensors can be converted"):
            float(mt.tensor([1.0, 2.0]))
        with pytest.raises(ValueError, match="only one element tensors can be converted"):
            int(mt.tensor([1, 2]))
        with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
            bool(mt.tensor([1, 2]))
        with pytest.raises(RuntimeError, match="no values is ambiguous"):
            bool(mt.tensor([]))
        with pytest.raises(TypeError, match="only integer tensors of a single element"):
            [1, 2][mt.tensor(1.0)]

    def test_len_iter(self):
        t = mt.tensor([[1, 2], [3, 4]])
        assert len(t) == 2
        rows = list(t)
        assert [r.tolist() for r in rows] == [[1, 2], [3, 4]]
        elems = list(mt.tensor([5, 6]))
        assert all(isinstance(e, mt.Tensor) and e.dim() == 0 for e in elems)
        rows[0][0] = 100  # iteration yields views
        assert t[0, 0].item() == 100
        with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
            len(mt.tensor(1))
        with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
            iter(mt.tensor(1))
        assert 3 in mt.tensor([1, 3]) and 5 not in mt.tensor([1, 3])
        with pytest.raises(TypeError, match="only supports a Tensor or a number"):
            "a" in mt.tensor([1])  # noqa: B015

    def test_hash_and_identity_eq(self):
        a, b = mt.zeros(2), mt.zeros(2)
        assert len({a, b}) == 2 and {a: 1}[a] == 1
        assert (a == None) is False and (a != None) is True  # noqa: E711

    def test_tolist(self):
        assert mt.tensor([[1, 2]]).tolist() == [[1, 2]]
        assert mt.tensor(3.5).tolist() == 3.5


# --------------------------------------------------------------------------------------------
# arithmetic, promotion, comparisons


class TestArithmetic:
    def test_values(self):
        a, b = mt.tensor([1.0, 2.0, 3.0]), mt.tensor([4.0, 5.0, 6.0])
        assert (a + b).tolist() == [5, 7, 9]
        assert (b - a).tolist() == [3, 3, 3]
        assert (a * b).tolist() == [4, 10, 18]
        assert (b / a).tolist() == [4, 2.5, 2]
        assert (b // a).tolist() == [4, 2, 2]
        assert (b % a).tolist() == [0, 1, 0]
        assert (a**2).tolist() == [1, 4, 9]
        assert (a @ b).item() == 32 and (a @ b).dim() == 0
        assert (-a).tolist() == [-1, -2, -3] and abs(-a).tolist() == [1, 2, 3]
        assert (+a)._data is a._data

    def test_reflected(self):
        a = mt.tensor([1.0, 2.0])
        assert (1 + a).tolist() == [2, 3] and (1 - a).tolist() == [0, -1]
        assert (2 * a).tolist() == [2, 4] and (2 / a).tolist() == [2, 1]
        assert (5 // a).tolist() == [5, 2] and (5 % a).tolist() == [0, 1]
        assert (2**a).tolist() == [2, 4]
        m = np.eye(2, dtype=np.float32) @ mt.tensor([[1.0, 2.0], [3.0, 4.0]])
        assert isinstance(m, mt.Tensor) and m.tolist() == [[1, 2], [3, 4]]

    def test_ndarray_op_tensor_returns_tensor(self):
        n = np.arange(3.0)
        for r in (n + mt.ones(3), n * mt.ones(3), n - mt.ones(3), n < mt.ones(3)):
            assert isinstance(r, mt.Tensor)
        assert (n + mt.ones(3)).tolist() == [1, 2, 3]
        assert isinstance(np.float64(2) * mt.ones(2), mt.Tensor)

    @pytest.mark.parametrize(
        "make, expected",
        [
            (lambda: mt.tensor([1.0], dtype=mt.float16) + 2.5, mt.float16),
            (lambda: mt.tensor([1.0]) * 2, mt.float32),
            (lambda: mt.tensor([1.0], dtype=mt.float64) + 1.5, mt.float64),
            (lambda: mt.tensor([1, 2]) / 2, mt.float32),
            (lambda: mt.tensor([1, 2]) / mt.tensor([2, 2]), mt.float32),
            (lambda: mt.tensor([1, 2], dtype=mt.int32) / 2, mt.float32),
            (lambda: mt.tensor([1, 2]) + 2.5, mt.float32),
            (lambda: mt.tensor([1, 2]) * 2, mt.int64),
            (lambda: mt.tensor([1, 2], dtype=mt.int32) + 5, mt.int32),
            (lambda: mt.tensor([1, 2], dtype=mt.int32) + mt.tensor(5), mt.int32),
            (lambda: mt.tensor([1, 2], dtype=mt.int32) + mt.tensor(5.0, dtype=mt.float64),
             mt.float64),
            (lambda: mt.tensor([1, 2], dtype=mt.int64) + mt.tensor([1.0]), mt.float32),
            (lambda: mt.tensor([1.0]) + mt.tensor([1.0], dtype=mt.float64), mt.float64),
            (lambda: mt.tensor([1, 2], dtype=mt.uint8) + mt.tensor([1], dtype=mt.int8),
             mt.int16),
            (lambda: mt.tensor([True]) + 1, mt.int64),
            (lambda: mt.tensor([True]) + True, mt.bool),
            (lambda: mt.tensor([1.0]) + 1j, mt.complex64),
            (lambda: mt.tensor([1.0], dtype=mt.float64) * 1j, mt.complex128),
            (lambda: mt.tensor([1]) + 1j, mt.complex64),
            (lambda: mt.tensor([1.0]) + np.float64(2), mt.float32),
            (lambda: mt.tensor([1.0]) + np.array([2.0]), mt.float64),
            (lambda: mt.tensor([1, 2]) // 2, mt.int64),
            (lambda: mt.tensor([1, 2]) ** 2.5, mt.float32),
        ],
    )
    def test_type_promotion(self, make, expected):
        assert make().dtype == expected

    def test_int_wraps_like_torch(self):
        assert (mt.tensor([250], dtype=mt.uint8) + 10).tolist() == [4]
        assert (mt.tensor([1, 2], dtype=mt.uint8) + 300).tolist() == [45, 46]

    def test_division_by_zero_is_silent(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r = mt.tensor([1.0, -1.0, 0.0]) / 0
            assert np.isinf(arr(r)[:2]).all() and np.isnan(arr(r)[2])
            assert (mt.tensor([1.0]) / mt.tensor([0.0])).tolist() == [float("inf")]
            mt.tensor([1.0]) // mt.tensor([0.0])

    def test_div_rounding_modes(self):
        a = mt.tensor([-7, 7])
        assert a.div(2).tolist() == [-3.5, 3.5]
        assert a.div(2, rounding_mode="trunc").tolist() == [-3, 3]
        assert a.div(2, rounding_mode="floor").tolist() == [-4, 3]
        assert mt.tensor([-7.0]).div(2, rounding_mode="trunc").tolist() == [-3.0]
        with pytest.raises(ValueError, match="rounding_mode"):
            a.div(2, rounding_mode="round")

    def test_named_methods(self):
        a = mt.tensor([1.0, 2.0])
        assert a.add(1, alpha=2).tolist() == [3, 4] and a.sub(a).tolist() == [0, 0]
        assert a.mul(3).tolist() == [3, 6] and a.pow(2).tolist() == [1, 4]
        assert a.eq(1).tolist() == [True, False] and a.matmul(a).item() == 5

    def test_bool_rules(self):
        m = mt.tensor([True, False])
        with pytest.raises(TypeError, match="Subtraction, the `-` operator, with a bool"):
            m - m
        with pytest.raises(TypeError, match="Subtraction"):
            mt.tensor([1]) - True
        with pytest.raises(TypeError, match="Negation, the `-` operator, on a bool tensor"):
            _ = -m
        with pytest.raises(TypeError, match="not implemented for bool tensors"):
            m // m

    def test_comparisons(self):
        a, b = mt.tensor([1, 2, 3]), mt.tensor([3, 2, 1])
        assert (a == b).tolist() == [False, True, False] and (a == b).dtype == mt.bool
        assert (a != b).tolist() == [True, False, True]
        assert (a < b).tolist() == [True, False, False] and (a <= 2).tolist() == [1, 1, 0]
        assert (a > 1.5).tolist() == [False, True, True] and (a >= b).tolist() == [0, 1, 1]
        assert (mt.tensor([1, 2], dtype=mt.uint8) < 300).tolist() == [True, True]

    def test_bitwise(self):
        a, b = mt.tensor([0b1100, 0b1010]), mt.tensor([0b1010, 0b0110])
        assert (a & b).tolist() == [8, 2] and (a | b).tolist() == [14, 14]
        assert (a ^ b).tolist() == [6, 12] and (~a).tolist() == [-13, -11]
        assert (a << 1).tolist() == [24, 20] and (a >> 2).tolist() == [3, 2]
        m = mt.tensor([True, False])
        assert (~m).tolist() == [False, True] and (m & True).dtype == mt.bool
        assert (mt.tensor([1, 2], dtype=mt.int8) & mt.tensor(1)).dtype == mt.int8
        with pytest.raises(TypeError, match="unsupported operand dtypes for &"):
            mt.tensor([1.0]) & 1
        with pytest.raises(TypeError, match="needs an integer or bool tensor"):
            ~mt.tensor([1.0])

    def test_unsupported_operand(self):
        with pytest.raises(TypeError):
            mt.tensor([1]) + "a"
        with pytest.raises(TypeError):
            mt.tensor([1]) + [1, 2]


class TestInPlace:
    def test_inplace_writes_into_data(self):
        a = mt.tensor([1.0, 2.0])
        data = a._data
        ident = id(a)
        a += 1
        a *= mt.tensor([2.0, 3.0])
        a -= 1
        a /= 2
        a **= 2
        assert id(a) == ident and a._data is data
        assert a.tolist() == [2.25, 16.0]
        i = mt.tensor([7, 8])
        i //= 2
        i %= 3
        i &= 3
        i |= 4
        i ^= 1
        i <<= 1
        i >>= 1
        assert i.tolist() == [5, 4]

    def test_inplace_through_view(self):
        base = mt.zeros(4)
        v = base[1:3]
        v += 5
        assert base.tolist() == [0, 5, 5, 0]

    def test_inplace_casts_like_torch(self):
        a = mt.tensor([1.0, 2.0])
        a += mt.tensor([1, 1])  # int into float: allowed
        a += mt.tensor([0.5], dtype=mt.float64)  # computed in float64, stored as float32
        assert a.dtype == mt.float32 and a.tolist() == [2.5, 3.5]
        u = mt.tensor([250], dtype=mt.uint8)
        u += mt.tensor([10])  # wraps
        assert u.tolist() == [4]

    @pytest.mark.parametrize(
        "make",
        [
            lambda: mt.tensor([1, 2]).__iadd__(1.5),
            lambda: mt.tensor([1, 2]).__itruediv__(2),
            lambda: mt.tensor([1.0]).__iadd__(1j),
            lambda: mt.tensor([True]).__iadd__(1),
        ],
    )
    def test_inplace_refuses_narrowing(self, make):
        with pytest.raises(TypeError, match="can't be cast to the desired output type"):
            make()

    def test_inplace_methods(self):
        a = mt.ones(2)
        assert a.add_(1, alpha=2) is a and a.tolist() == [3, 3]
        assert a.sub_(1).mul_(2).div_(4).tolist() == [1, 1]
        assert a.pow_(3).tolist() == [1, 1]
        with pytest.raises(ValueError, match="read-only"):
            e = mt.zeros(2).expand(2, 2)
            e += 1

    def test_copy_fill_zero(self):
        a = mt.zeros(3)
        assert a.copy_(mt.tensor([1, 2, 3])) is a and a.tolist() == [1, 2, 3]
        a.copy_(np.array([4.0, 5, 6]))
        assert a.tolist() == [4, 5, 6] and a.dtype == mt.float32
        m = mt.zeros(2, 3)
        m.copy_(mt.tensor([1.0, 2.0, 3.0]))  # broadcasts
        assert m.tolist() == [[1, 2, 3], [1, 2, 3]]
        assert a.fill_(7).tolist() == [7, 7, 7]
        assert a.fill_(mt.tensor(2)).tolist() == [2, 2, 2]
        assert a.zero_().tolist() == [0, 0, 0]
        i = mt.zeros(2, dtype=mt.int64).fill_(2.9)
        assert i.tolist() == [2, 2]


# --------------------------------------------------------------------------------------------
# indexing and views


class TestIndexing:
    def test_views_share_storage(self):
        t = mt.arange(6.0).reshape(2, 3)
        row = t[1]
        row[0] = 100
        assert t[1, 0].item() == 100
        s = t[:, 1:3]
        s.fill_(-1)
        assert t.tolist() == [[0, -1, -1], [100, -1, -1]]
        assert np.shares_memory(t[0:1]._data, t._data)

    def test_element_is_zero_dim_view(self):
        t = mt.tensor([1.0, 2.0])
        e = t[0]
        assert isinstance(e, mt.Tensor) and e.dim() == 0 and isinstance(e._data, np.ndarray)
        e.fill_(9)
        assert t.tolist() == [9, 2]
        assert t[..., 1].item() == 2 and t[None].shape == (1, 2)

    def test_setitem(self):
        t = mt.zeros(2, 3)
        t[0] = 1
        t[1, 1:] = mt.tensor([5.0, 6.0])
        t[:, 0] = np.array([7.0, 8.0])
        assert t.tolist() == [[7, 1, 1], [8, 5, 6]]
        t[t > 5] = 0
        assert t.tolist() == [[0, 1, 1], [0, 5, 0]]

    def test_tensor_indices(self):
        t = mt.tensor([10, 20, 30, 40])
        assert t[mt.tensor([True, False, True, False])].tolist() == [10, 30]
        assert t[mt.tensor([3, 0])].tolist() == [40, 10]
        assert t[mt.tensor(2)].item() == 30
        m = mt.arange(6).reshape(2, 3)
        assert m[mt.tensor([1]), mt.tensor([2])].tolist() == [5]
        t[mt.tensor([0, 1])] = mt.tensor([-1, -2])
        assert t.tolist() == [-1, -2, 30, 40]
        with pytest.raises(IndexError):
            t[mt.tensor([0.0])]


class TestShapes:
    def test_clone_contiguous(self):
        t = mt.tensor([1.0, 2.0])
        c = t.clone()
        c[0] = 5
        assert t.tolist() == [1, 2] and c._data is not t._data
        assert t.contiguous() is t and t.is_contiguous()
        tt = mt.arange(6).reshape(2, 3).t()
        assert not tt.is_contiguous()
        cc = tt.contiguous()
        assert cc.is_contiguous() and cc.tolist() == tt.tolist()

    def test_reshape_view(self):
        t = mt.arange(6)
        v = t.view(2, 3)
        v[0, 0] = 9
        assert t[0].item() == 9 and t.view(-1, 2).shape == (3, 2)
        assert t.reshape((3, 2)).shape == (3, 2) and t.view([6]).shape == (6,)
        assert t.view_as(mt.zeros(3, 2)).shape == (3, 2)
        r = t.reshape(2, 3).t().reshape(6)  # needs a copy, reshape makes one
        assert r.tolist() == [9, 3, 1, 4, 2, 5]
        with pytest.raises(RuntimeError, match="view size is not compatible.*Use .reshape"):
            t.reshape(2, 3).t().view(6)
        with pytest.raises(ValueError, match=r"shape '\[4\]' is invalid for input of size 6"):
            t.view(4)
        with pytest.raises(ValueError, match="only one dimension can be inferred"):
            t.reshape(-1, -1)
        bits = mt.tensor([1.0], dtype=mt.float32).view(mt.int32)
        assert bits.item() == 1065353216

    def test_flatten_squeeze_unsqueeze(self):
        t = mt.zeros(2, 1, 3, 1)
        assert t.flatten().shape == (6,) and t.flatten(1).shape == (2, 3)
        assert t.flatten(0, 1).shape == (2, 3, 1) and mt.tensor(3.0).flatten().shape == (1,)
        assert t.squeeze().shape == (2, 3) and t.squeeze(1).shape == (2, 3, 1)
        assert t.squeeze(0).shape == (2, 1, 3, 1) and t.squeeze((1, 3)).shape == (2, 3)
        assert t.unsqueeze(0).shape == (1, 2, 1, 3, 1) and t.unsqueeze(-1).shape[-1] == 1
        assert mt.tensor(3.0).squeeze(0).shape == ()
        with pytest.raises(IndexError, match="Dimension out of range"):
            t.unsqueeze(6)
        with pytest.raises(ValueError, match="start_dim"):
            t.flatten(2, 1)

    def test_transpose_permute(self):
        t = mt.arange(6).reshape(2, 3)
        assert t.t().shape == (3, 2) and t.T.tolist() == [[0, 3], [1, 4], [2, 5]]
        assert t.transpose(0, 1).tolist() == t.T.tolist()
        tt = t.t()
        tt[0, 1] = 50
        assert t[1, 0].item() == 50  # views
        c = mt.zeros(2, 3, 4)
        assert c.permute(2, 0, 1).shape == (4, 2, 3) and c.permute((1, 2, 0)).shape == (3, 4, 2)
        assert c.mT.shape == (2, 4, 3) and c.T.shape == (4, 3, 2)
        with pytest.raises(ValueError, match="t\\(\\) expects a tensor with <= 2 dimensions"):
            c.t()
        with pytest.raises(ValueError, match="number of dims"):
            c.permute(0, 1)
        with pytest.raises(ValueError, match="not a permutation"):
            c.permute(0, 0, 1)
        with pytest.raises(IndexError, match="Dimension out of range"):
            t.transpose(0, 2)

    def test_expand_repeat_split(self):
        t = mt.tensor([[1], [2]])
        e = t.expand(2, 3)
        assert e.tolist() == [[1, 1, 1], [2, 2, 2]] and np.shares_memory(e._data, t._data)
        assert t.expand(4, -1, 3).shape == (4, 2, 3)
        assert t.expand_as(mt.zeros(2, 5)).shape == (2, 5)
        with pytest.raises(ValueError, match="must match the existing size"):
            mt.zeros(2, 3).expand(2, 4)
        with pytest.raises(ValueError, match="number of sizes provided"):
            mt.zeros(2, 3).expand(3)
        assert mt.tensor([1, 2]).repeat(2, 2).tolist() == [[1, 2, 1, 2], [1, 2, 1, 2]]
        parts = mt.arange(5).split(2)
        assert [p.tolist() for p in parts] == [[0, 1], [2, 3], [4]]
        assert [p.tolist() for p in mt.arange(5).split([1, 4])] == [[0], [1, 2, 3, 4]]
        assert [p.tolist() for p in mt.arange(6).chunk(3)] == [[0, 1], [2, 3], [4, 5]]
        assert [u.tolist() for u in mt.arange(4).reshape(2, 2).unbind(1)] == [[0, 2], [1, 3]]


# --------------------------------------------------------------------------------------------
# dtype and device conversions


class TestConversions:
    def test_numpy_shares(self):
        t = mt.zeros(3)
        n = t.numpy()
        n[0] = 4
        assert t[0].item() == 4 and n is t._data
        with pytest.raises(RuntimeError, match="Use tensor.detach\\(\\).numpy\\(\\)"):
            mt.zeros(2, requires_grad=True).numpy()

    def test_dtype_methods(self):
        i = mt.tensor([1, 2])
        f = i.float()
        assert isinstance(f, mt.Tensor) and f.dtype == mt.float32 and f.tolist() == [1.0, 2.0]
        assert f.float() is f
        assert i.double().dtype == mt.float64 and i.half().dtype == mt.float16
        assert f.int().dtype == mt.int32 and f.long().dtype == mt.int64
        assert i.bool().tolist() == [True, True] and i.short().dtype == mt.int16
        assert i.byte().dtype == mt.uint8 and i.char().dtype == mt.int8
        assert i.cfloat().dtype == mt.complex64 and i.cdouble().dtype == mt.complex128
        assert float(mt.tensor(2.5)) == 2.5  # the builtin is __float__

    def test_to_and_type(self):
        t = mt.tensor([1.5, 2.5])
        assert t.to("cpu") is t and t.to(mt.float32) is t and t.to(device="cpu") is t
        assert t.to(mt.float64).dtype == mt.float64
        assert t.to("cpu", mt.int32).tolist() == [1, 2]
        assert t.to(dtype=mt.int64).dtype == mt.int64
        assert t.to(mt.device("cpu"), copy=True)._data is not t._data
        assert t.to(mt.tensor([1])).dtype == mt.int64
        assert t.type() == "mpitensor.FloatTensor"
        assert mt.tensor([1]).type() == "mpitensor.LongTensor"
        assert t.type(mt.float64).dtype == mt.float64 and t.type(mt.float32) is t
        assert t.type_as(mt.tensor([1])).dtype == mt.int64
        assert t.cpu() is t
        with pytest.raises(TypeError, match="to\\(\\) takes a device, a dtype or a tensor"):
            t.to([1])

    def test_new_methods(self):
        t = mt.tensor([1.0], dtype=mt.float64)
        assert t.new_zeros(2, 3).dtype == mt.float64 and t.new_zeros((2,)).shape == (2,)
        assert t.new_ones(2).tolist() == [1.0, 1.0] and t.new_empty(4).numel() == 4
        assert t.new_full((2,), 3).tolist() == [3.0, 3.0]
        assert t.new_tensor([1, 2]).dtype == mt.float64

    @pytest.mark.skipif(backend.cupy_available(), reason="checks the error when CuPy is missing")
    def test_cuda_without_cupy(self):
        with pytest.raises(RuntimeError, match="CuPy is missing"):
            mt.zeros(2).cuda()
        with pytest.raises(RuntimeError, match="CuPy is missing"):
            mt.zeros(2, device="cuda")
        with pytest.raises(RuntimeError, match="CuPy is missing"):
            mt.tensor([1.0]).to("cuda:0")


# --------------------------------------------------------------------------------------------
# reductions and functions on several tensors


class TestReductions:
    def test_sum_mean_prod(self):
        t = mt.tensor([[1, 2], [3, 4]])
        assert t.sum().item() == 10 and t.sum().dim() == 0 and t.sum().dtype == mt.int64
        assert t.sum(0).tolist() == [4, 6] and t.sum(dim=1, keepdim=True).shape == (2, 1)
        assert t.sum((0, 1)).item() == 10 and t.sum(dtype=mt.float32).dtype == mt.float32
        assert mt.tensor([1, 2], dtype=mt.uint8).sum().dtype == mt.int64
        assert mt.tensor([True, True]).sum().item() == 2
        assert t.prod().item() == 24 and t.prod(1).tolist() == [2, 12]
        f = t.float()
        assert f.mean().item() == 2.5 and f.mean(0).tolist() == [2, 3]
        assert t.mean(dtype=mt.float64).item() == 2.5
        with pytest.raises(TypeError, match="mean\\(\\): could not infer output dtype"):
            t.mean()
        assert mt.tensor([1.0, 3.0]).var().item() == 2.0
        assert mt.tensor([1.0, 3.0]).std(correction=0).item() == 1.0
        with pytest.raises(IndexError, match="Dimension out of range"):
            t.sum(2)

    def test_max_min_arg(self):
        t = mt.tensor([[1, 5], [7, 2]])
        assert t.max().item() == 7 and t.min().item() == 1
        values, indices = t.max(1)
        assert values.tolist() == [5, 7] and indices.tolist() == [1, 0]
        r = t.min(dim=0, keepdim=True)
        assert r.values.tolist() == [[1, 2]] and r.indices.tolist() == [[0, 1]]
        assert r.indices.dtype == mt.int64
        assert repr(t.max(1)) == (
            "mpitensor.return_types.max(\nvalues=tensor([5, 7]),\nindices=tensor([1, 0]))"
        )
        assert t.argmax().item() == 2 and t.argmin(1).tolist() == [0, 1]
        assert t.argmax(keepdim=True).shape == (1, 1)
        assert t.max(mt.tensor([[3, 3], [3, 3]])).tolist() == [[3, 5], [7, 3]]
        assert t.all().item() and mt.tensor([0, 1]).any().item()
        assert not mt.tensor([0, 1]).all().item()
        with pytest.raises(ValueError, match="cannot reduce an empty tensor"):
            mt.tensor([]).max()

    def test_allclose_equal(self):
        a = mt.tensor([1.0, 2.0])
        assert a.allclose(a + 1e-9) and mt.allclose(a, np.array([1.0, 2.0]))
        assert not mt.allclose(a, a + 1e-3)
        assert mt.allclose(mt.tensor([float("nan")]), mt.tensor([float("nan")]), equal_nan=True)
        assert mt.equal(a, mt.tensor([1.0, 2.0])) and a.equal(mt.tensor([1, 2]))
        assert not mt.equal(a, mt.tensor([1.0])) and not mt.equal(a, mt.tensor([1.0, 3.0]))

    def test_cat_stack_where(self):
        c = mt.cat([mt.tensor([1, 2]), mt.tensor([3])])
        assert c.tolist() == [1, 2, 3] and c.dtype == mt.int64
        assert mt.cat([mt.tensor([1]), mt.tensor([1.5])]).dtype == mt.float32
        assert mt.cat((mt.zeros(1, 2), mt.ones(1, 2)), dim=1).shape == (1, 4)
        s = mt.stack([mt.tensor([1, 2]), mt.tensor([3, 4])], dim=1)
        assert s.tolist() == [[1, 3], [2, 4]]
        with pytest.raises(ValueError, match="non-empty list"):
            mt.cat([])
        with pytest.raises(ValueError, match="equal size"):
            mt.stack([mt.zeros(2), mt.zeros(3)])
        with pytest.raises(TypeError, match="list or tuple of tensors"):
            mt.cat(mt.zeros(2))
        cond = mt.tensor([True, False, True])
        w = mt.where(cond, mt.tensor([1.0, 2.0, 3.0]), 0.0)
        assert w.tolist() == [1, 0, 3] and w.dtype == mt.float32
        assert mt.where(cond, 1.0, 2.0).dtype == mt.float32
        assert mt.where(cond, 1, 2).dtype == mt.int64
        assert [i.tolist() for i in mt.where(cond)] == [[0, 2]]
        assert mt.tensor([5, 6, 7]).where(cond, -1).tolist() == [5, -1, 7]
        assert mt.tensor([[0, 1], [1, 0]]).nonzero().tolist() == [[0, 1], [1, 0]]
        with pytest.raises(TypeError, match="either only condition"):
            mt.where(cond, 1.0)

    def test_misc_functions(self):
        assert mt.is_tensor(mt.zeros(1)) and not mt.is_tensor(np.zeros(1))
        assert mt.numel(mt.zeros(2, 3)) == 6
        assert mt.tensor([-4.0, 9.0]).abs().sqrt().tolist() == [2.0, 3.0]
        assert mt.tensor([4, 9]).sqrt().dtype == mt.float32
        assert mt.tensor([0.0]).exp().item() == 1.0 and mt.tensor([1.0]).log().item() == 0.0
        assert mt.tensor([-2, 0, 5]).clamp(-1, 3).tolist() == [-1, 0, 3]
        assert mt.tensor([-2.0, 5.0]).clamp(min=0).tolist() == [0.0, 5.0]


# --------------------------------------------------------------------------------------------
# array protocols, DLPack and MPI


class TestProtocols:
    def test_array_protocol_zero_copy(self):
        t = mt.arange(3.0)
        a = np.asarray(t)
        assert a is t._data
        assert np.array(t, copy=True) is not t._data
        assert np.asarray(t, dtype=np.float64).dtype == np.float64
        with pytest.raises(ValueError, match="needs a copy"):
            t.__array__(np.int32, copy=False)
        assert np.sin(mt.tensor([0.0])).tolist() == [0.0]

    def test_no_cuda_array_interface_on_cpu(self):
        assert not hasattr(mt.zeros(2), "__cuda_array_interface__")

    def test_dlpack(self):
        t = mt.arange(4.0)
        assert t.__dlpack_device__() == (1, 0)
        a = np.from_dlpack(t)
        a[0] = 42
        assert t[0].item() == 42

    def test_mpi4py_buffers_in_place(self):
        MPI = pytest.importorskip("mpi4py.MPI")
        t = mt.arange(4.0)
        data = t._data
        MPI.COMM_WORLD.Bcast(t, root=0)
        assert t._data is data and t.tolist() == [0, 1, 2, 3]
        dst = mt.zeros(3)
        MPI.COMM_SELF.Allreduce(mt.tensor([1.0, 2.0, 3.0]), dst, op=MPI.SUM)
        assert dst.tolist() == [1, 2, 3]
        recv = mt.zeros(2, dtype=mt.int64)
        MPI.COMM_SELF.Sendrecv(mt.tensor([5, 6]), 0, 0, recv, 0, 0)
        assert recv.tolist() == [5, 6]
        with pytest.raises(BufferError, match="contiguous"):
            MPI.COMM_SELF.Bcast(mt.zeros(3, 4)[:, 1], root=0)

    def test_pickle_and_deepcopy(self):
        t = mt.tensor([1.0, 2.0], requires_grad=True)
        u = pickle.loads(pickle.dumps(t))
        assert u.tolist() == [1, 2] and u.requires_grad and u.grad is None
        d = copy.deepcopy(t)
        d.data[0] = 5
        assert t[0].item() == 1 and d.requires_grad
        assert copy.copy(t).tolist() == [1, 2]


# --------------------------------------------------------------------------------------------
# printing


REPRS = [
    (lambda: mt.tensor([1.0, 2.0]), "tensor([1., 2.])"),
    (lambda: mt.tensor([1, 2, 3]), "tensor([1, 2, 3])"),
    (lambda: mt.tensor(4.0), "tensor(4.)"),
    (lambda: mt.tensor(4), "tensor(4)"),
    (lambda: mt.tensor([1.0, 2.5]), "tensor([1.0000, 2.5000])"),
    (lambda: mt.tensor([0.1, 0.2, 0.3]), "tensor([0.1000, 0.2000, 0.3000])"),
    (lambda: mt.tensor([1.0, 2.0], dtype=mt.float64), "tensor([1., 2.], dtype=mpitensor.float64)"),
    (lambda: mt.tensor([1, 2], dtype=mt.int32), "tensor([1, 2], dtype=mpitensor.int32)"),
    (lambda: mt.tensor([True, False]), "tensor([ True, False])"),
    (lambda: mt.tensor([1e-5, 1.0]), "tensor([1.0000e-05, 1.0000e+00])"),
    (lambda: mt.tensor([1e10, 1.0]), "tensor([1.0000e+10, 1.0000e+00])"),
    (lambda: mt.tensor([123456789.0, 1.0]), "tensor([1.2346e+08, 1.0000e+00])"),
    (lambda: mt.tensor([float("nan"), float("inf"), -1.0]), "tensor([nan, inf, -1.])"),
    (lambda: mt.tensor([0.0, -0.0]), "tensor([0., -0.])"),
    (lambda: mt.tensor([-1.5, 100.25]), "tensor([ -1.5000, 100.2500])"),
    (lambda: mt.tensor([1 + 2j, 3 - 1j]), "tensor([1.+2.j, 3.-1.j])"),
    (
        lambda: mt.tensor([1.5, 2.0], dtype=mt.float16),
        "tensor([1.5000, 2.0000], dtype=mpitensor.float16)",
    ),
    (lambda: mt.tensor([[1.0, 2.0], [3.0, 4.0]]), "tensor([[1., 2.],\n        [3., 4.]])"),
    (lambda: mt.tensor([[1, 20], [300, 4]]), "tensor([[  1,  20],\n        [300,   4]])"),
    (
        lambda: mt.arange(8).reshape(2, 2, 2),
        "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]])",
    ),
    (lambda: mt.tensor([]), "tensor([])"),
    (lambda: mt.tensor([], dtype=mt.int64), "tensor([], dtype=mpitensor.int64)"),
    (lambda: mt.empty(0, 3), "tensor([], size=(0, 3))"),
    (lambda: mt.zeros(2, requires_grad=True), "tensor([0., 0.], requires_grad=True)"),
    (
        lambda: mt.zeros(2, dtype=mt.float64, requires_grad=True),
        "tensor([0., 0.], dtype=mpitensor.float64, requires_grad=True)",
    ),
    (lambda: mt.arange(2000), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])"),
    (
        lambda: mt.arange(12.0) / 7,
        "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429,\n"
        "        1.2857, 1.4286, 1.5714])",
    ),
    (
        lambda: mt.arange(2000).reshape(40, 50),
        "tensor([[   0,    1,    2,  ...,   47,   48,   49],\n"
        "        [  50,   51,   52,  ...,   97,   98,   99],\n"
        "        [ 100,  101,  102,  ...,  147,  148,  149],\n"
        "        ...,\n"
        "        [1850, 1851, 1852,  ..., 1897, 1898, 1899],\n"
        "        [1900, 1901, 1902,  ..., 1947, 1948, 1949],\n"
        "        [1950, 1951, 1952,  ..., 1997, 1998, 1999]])",
    ),
]


class TestPrinting:
    @pytest.mark.parametrize("make, expected", REPRS)
    def test_repr_exact(self, make, expected):
        t = make()
        assert repr(t) == expected
        assert str(t) == expected

    def test_repr_with_default_float64(self):
        mt.set_default_dtype(mt.float64)
        assert repr(mt.tensor([1.0], dtype=mt.float32)) == "tensor([1.], dtype=mpitensor.float32)"
        assert repr(mt.tensor([1.0])) == "tensor([1.])"

    def test_format(self):
        assert f"{mt.tensor(4.0)}" == "4.0"
        assert f"{mt.tensor(4.0):.2f}" == "4.00"
        assert f"{mt.tensor(7):>3}" == "  7"
        assert format(mt.tensor([1.0, 2.0]), "") == "tensor([1., 2.])"
        assert f"{mt.tensor([1, 2])}" == "tensor([1, 2])"
        with pytest.raises(TypeError, match="unsupported format string passed to Tensor"):
            format(mt.tensor([1.0, 2.0]), ".2f")

    def test_printoptions(self):
        mt.set_printoptions(precision=2)
        assert repr(mt.tensor([1.2345])) == "tensor([1.23])"
        mt.set_printoptions(profile="default", threshold=5)
        assert repr(mt.arange(10)) == "tensor([0, 1, 2,  ..., 7, 8, 9])"
        mt.set_printoptions(profile="default")
        with mt.printoptions(sci_mode=True):
            assert repr(mt.tensor([1.0, 2.0])) == "tensor([1.0000e+00, 2.0000e+00])"
        assert repr(mt.tensor([1.0, 2.0])) == "tensor([1., 2.])"
        assert mt.get_printoptions()["threshold"] == 1000
        with pytest.raises(ValueError, match="unknown print profile"):
            mt.set_printoptions(profile="tiny")

    def test_suffix_wraps_long_lines(self):
        t = mt.arange(10.0, dtype=mt.float64) / 3
        assert repr(t) == (
            "tensor([0.0000, 0.3333, 0.6667, 1.0000, 1.3333, 1.6667, 2.0000, 2.3333, 2.6667,\n"
            "        3.0000], dtype=mpitensor.float64)"
        )


# --------------------------------------------------------------------------------------------
# PyTorch as an oracle (extra checks, only where torch is installed)


def _parity_arrays():
    rng = np.random.default_rng(0)
    return [
        np.array([1.0, 2.0], np.float32),
        np.array(4.0, np.float32),
        np.array([1.0, 2.5], np.float32),
        np.array([[1, 2], [3, 4]], np.int32),
        np.array([1e-5, 1.0], np.float32),
        np.array([np.nan, np.inf, -np.inf, 1.0], np.float32),
        np.arange(2000),
        np.arange(2000.0, dtype=np.float32).reshape(40, 50),
        np.arange(1001, dtype=np.float32) / 7,
        rng.standard_normal((3, 4)).astype(np.float32),
        rng.standard_normal((2, 3, 4, 5)),
        (rng.standard_normal((12, 12, 12)) * 1000).astype(np.float32),
        np.array([[True], [False]]),
        np.array([1.5 + 2j, -3 - 1.25j]),
        np.array([1, 2], np.uint8),
        np.array([1.5, 2], np.float16),
        np.empty((0, 3), np.float32),
        np.empty((2, 0), np.bool_),
        rng.integers(-1000, 1000, (50, 50)),
        rng.standard_normal((3, 3)) + 1j * rng.standard_normal((3, 3)),
        np.arange(3000, dtype=np.float64).reshape(3, 1000),
    ]


_TORCH_INTEGRAL = {f"torch.{n}" for n in ("bool", "uint8", "int8", "int16", "int32", "int64")}


class TestTorchParity:
    def test_repr_matches_torch(self):
        torch = pytest.importorskip("torch")
        for a in _parity_arrays():
            expected = repr(torch.from_numpy(a.copy())).replace("torch.", "mpitensor.")
            assert repr(mt.from_numpy(a.copy())) == expected

    def test_repr_matches_torch_with_options(self):
        torch = pytest.importorskip("torch")
        try:
            for opts in (dict(precision=2), dict(threshold=5), dict(linewidth=40),
                         dict(edgeitems=1, threshold=4), dict(sci_mode=True)):
                torch.set_printoptions(**opts)
                mt.set_printoptions(**opts)
                for a in (np.arange(10.0, dtype=np.float32) / 3, np.arange(20).reshape(4, 5)):
                    expected = repr(torch.from_numpy(a)).replace("torch.", "mpitensor.")
                    assert repr(mt.from_numpy(a)) == expected, opts
                torch.set_printoptions(profile="default")
                mt.set_printoptions(profile="default")
        finally:
            torch.set_printoptions(profile="default")

    def test_promotion_matches_torch(self):
        torch = pytest.importorskip("torch")
        names = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32",
                 "float64", "complex64", "complex128"]
        ops = [operator.add, operator.mul, operator.truediv, operator.eq]
        for n1 in names:
            for n2 in names:
                for z1, z2 in ((False, False), (False, True), (True, False)):
                    a = np.array(1 if z1 else [1, 2], dtype=n1)
                    b = np.array(1 if z2 else [1, 2], dtype=n2)
                    for op in ops:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")  # torch: ComplexHalf experimental
                            expected = str(torch.result_type(torch.from_numpy(a),
                                                             torch.from_numpy(b)))
                        if expected == "torch.complex32":
                            continue  # no complex32 here: complex64 instead
                        if op is operator.eq:
                            expected = "torch.bool"
                        elif op is operator.truediv and expected in _TORCH_INTEGRAL:
                            expected = "torch.float32"
                        got = op(mt.from_numpy(a), mt.from_numpy(b)).dtype
                        assert f"torch.{mt.dtypes.dtype_name(got)}" == expected, (n1, n2, op)
            for s in (True, 2, 2.5, 1j):
                a = np.array([1, 2], dtype=n1)
                for op in ops:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        expected = str(torch.result_type(torch.from_numpy(a), s))
                    if op is operator.eq:
                        expected = "torch.bool"
                    elif op is operator.truediv and expected in _TORCH_INTEGRAL:
                        expected = "torch.float32"
                    if expected == "torch.complex32":
                        continue  # no complex32 here: complex64 instead
                    got = op(mt.from_numpy(a), s).dtype
                    assert f"torch.{mt.dtypes.dtype_name(got)}" == expected, (n1, s, op)


# --------------------------------------------------------------------------------------------
# GPU (CuPy); skipped with the reason where CuPy or a device is missing

_CUPY_REASON = backend.cupy_unavailable_reason()
gpu = pytest.mark.skipif(bool(_CUPY_REASON), reason=_CUPY_REASON or "CuPy is available")


@pytest.mark.gpu
@gpu
class TestCuda:
    def test_constructors_on_device(self):
        import cupy as cp

        for t in (mt.zeros(2, 3, device="cuda"), mt.ones(2, device="cuda:0"),
                  mt.tensor([1.0, 2.0], device=mt.device("cuda")), mt.arange(4, device="cuda"),
                  mt.full((2,), 3, device="cuda"), mt.rand(3, device="cuda"),
                  mt.randn(3, device="cuda"), mt.randint(0, 5, (3,), device="cuda"),
                  mt.randperm(5, device="cuda"), mt.eye(2, device="cuda")):
            assert isinstance(t._data, cp.ndarray)
            assert t.is_cuda and t.device == mt.device("cuda", 0) and t.device.type == "cuda"
        assert mt.zeros_like(mt.zeros(2, device="cuda")).is_cuda

    def test_round_trip_and_sharing(self):
        import cupy as cp

        t = mt.tensor([1.0, 2.0]).cuda()
        assert t.is_cuda and t.cuda() is t and t.to("cuda:0") is t
        back = t.cpu()
        assert isinstance(back._data, np.ndarray) and back.tolist() == [1.0, 2.0]
        a = cp.arange(3, dtype=cp.float32)
        w = mt.Tensor(a)
        assert w._data is a
        w[0] = 5
        assert float(a[0]) == 5
        assert t.to(mt.float64).dtype == mt.float64 and t.to(mt.float64).is_cuda

    def test_ops_stay_on_device(self):
        import cupy as cp

        a = mt.tensor([1.0, 2.0], device="cuda")
        b = mt.tensor([3.0, 4.0], device="cuda")
        for r in (a + b, a * 2, 2 / a, a @ b, a == b, -a, a.sum(), a[0], a.T, a.view(2, 1)):
            assert isinstance(r._data, cp.ndarray)
        data = a._data
        a += b
        a *= 2
        assert a._data is data and a.tolist() == [8.0, 12.0]
        assert (mt.tensor([1, 2], device="cuda") / 2).dtype == mt.float32
        assert (a + mt.tensor(1.0)).is_cuda  # a CPU 0-d tensor acts as a scalar
        with pytest.raises(RuntimeError, match="same device"):
            a + mt.tensor([1.0, 2.0])
        v = mt.arange(6, device="cuda").reshape(2, 3).t()
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            v.view(6)
        assert a.max(0).indices.item() == 1 and mt.cat([a, b]).is_cuda
        assert mt.where(a > 9, a, 0.0).tolist() == [0.0, 12.0]

    def test_numpy_refused_and_protocols(self):
        t = mt.arange(3.0, device="cuda")
        with pytest.raises(TypeError, match="Use Tensor.cpu\\(\\)"):
            t.numpy()
        with pytest.raises(TypeError, match="Use Tensor.cpu\\(\\)"):
            np.asarray(t)
        assert t.numpy(force=True).tolist() == [0.0, 1.0, 2.0]
        cai = t.__cuda_array_interface__
        assert cai["shape"] == (3,) and cai["data"][0] == t.data_ptr()
        assert t.__dlpack_device__()[0] == 2  # kDLCUDA
        assert hasattr(t, "__cuda_array_interface__")

    def test_repr_shows_device(self):
        assert repr(mt.tensor([1.0, 2.0], device="cuda")) == "tensor([1., 2.], device='cuda:0')"
        assert repr(mt.arange(2000, device="cuda")) == (
            "tensor([   0,    1,    2,  ..., 1997, 1998, 1999], device='cuda:0')"
        )

    def test_seeded_cuda_random(self):
        mt.manual_seed(3)
        a = mt.rand(4, device="cuda")
        mt.manual_seed(3)
        assert mt.equal(a, mt.rand(4, device="cuda"))
        assert a.dtype == mt.float32

    def test_copy_between_devices(self):
        g = mt.zeros(3, device="cuda")
        g.copy_(mt.tensor([1.0, 2.0, 3.0]))
        c = mt.zeros(3)
        c.copy_(g)
        assert c.tolist() == [1.0, 2.0, 3.0]
        g[0:2] = np.array([7.0, 8.0])
        assert g.tolist() == [7.0, 8.0, 3.0]

    def test_mpi4py_reads_device_buffer(self):
        MPI = pytest.importorskip("mpi4py.MPI")
        t = mt.arange(4.0, device="cuda")
        try:
            MPI.COMM_SELF.Bcast(t, root=0)
        except Exception as exc:  # MPI without CUDA support
            pytest.skip(f"MPI cannot use device buffers here: {exc}")
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_data_shares_storage_and_can_be_replaced():
    t = mt.ones(3)
    d = t.data
    d /= 4  # the tutorials' param.grad.data /= world_size
    assert t.tolist() == [0.25, 0.25, 0.25]
    assert d.requires_grad is False
    t.data = mt.zeros(2, dtype=mt.float64)
    assert t.shape == (2,) and t.dtype == mt.float64
    with pytest.raises(TypeError, match="Tensor or an array"):
        t.data = [1, 2]
