"""Tensor creation and random numbers against torch's documented overloads (issue 25, family 4).

Each call in the tables runs once with ``T = torch`` and once with ``T = mpitensor``: both must
give the same shape, dtype and requires_grad, or both raise, ours an instance of torch's
exception class (ours may be a subclass that is also the ValueError/TypeError older mpitensor
code raised). Random draws are checked with bounds derived from the law (6 standard
deviations of the estimate), never against torch's numbers: the generators differ, and only
"same seed, same numbers" holds within mpitensor.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import backend
from mpitensor.data import (
    DataLoader,
    RandomSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    random_split,
)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="torch is the oracle for these checks")


def arr(t: Any) -> np.ndarray:
    if hasattr(t, "detach"):
        return t.detach().numpy()
    return backend.to_numpy(t._data)


def _outcome(T: Any, call: str) -> Any:
    """What a user sees of ``call`` with ``T`` as torch: (shape, dtype, requires_grad) of a
    tensor, the value of anything else, or the exception."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            v = eval(call, {"T": T})  # noqa: S307 - fixed strings of this file
        except Exception as e:  # noqa: BLE001 - the exception is the outcome
            return e
    if isinstance(v, (T.Tensor,)):
        return (tuple(v.shape), str(v.dtype).split(".")[-1], v.requires_grad)
    return v


def _same(torch: Any, call: str) -> None:
    theirs, ours = _outcome(torch, call), _outcome(mt, call)
    if isinstance(theirs, Exception):
        assert isinstance(ours, type(theirs)), (call, theirs, ours)
    else:
        assert not isinstance(ours, Exception), (call, theirs, ours)
        assert ours == theirs, (call, theirs, ours)


# --------------------------------------------------------------------------------------------
# Overloads, against torch

RANDOM_CALLS = [
    # randint: (high, size), (low, high, size), keywords, dtype/out/device/requires_grad
    "T.randint(10, (3,))", "T.randint(10, size=(3,))", "T.randint(2, 10, (3,))",
    "T.randint(low=2, high=10, size=(3,))", "T.randint(high=10, size=(3,))",
    "T.randint(2, high=10, size=(3,))", "T.randint(10, (3,), dtype=T.int32)",
    "T.randint(10, [3, 2])", "T.randint(10, T.Size([3]))", "T.randint(10, ())",
    "T.randint(0, 10, (3,), out=T.empty(3, dtype=T.int64))", "T.randint(10, (3,), device='cpu')",
    "T.randint(10, (3,), dtype=T.float32, requires_grad=True)",
    "T.randint(10, (3,), requires_grad=True)", "T.randint(10, 3)", "T.randint(3.5, (2,))",
    "T.randint(5, 5, (3,))", "T.randint(6, 5, (3,))", "T.randint(10)", "T.randint(size=(3,))",
    "T.randint(-5, 0, (2, 2), generator=T.Generator().manual_seed(1))",
    "T.randint(10, (3,), layout=T.strided, pin_memory=False)",
    # rand / randn: sizes as varargs, tuple, list, Size, size=; dtype; generator; out
    "T.rand(2, 3)", "T.rand((2, 3))", "T.rand([2, 3])", "T.rand(T.Size([2, 3]))",
    "T.rand(size=(2, 3))", "T.rand(2, dtype=T.float64)", "T.rand(2, dtype=T.float16)",
    "T.rand(2, dtype=T.int64)", "T.rand(2, out=T.empty(2))", "T.rand(0)", "T.rand(-1)",
    "T.rand(2, requires_grad=True)", "T.rand(2, 3, generator=T.Generator())",
    "T.rand(2, 2.5)", "T.randn(2, 3)", "T.randn((2, 3))", "T.randn([2])", "T.randn(size=[2])",
    "T.randn(T.Size([4]))", "T.randn(2, dtype=T.complex64)", "T.randn(2, dtype=T.int32)",
    "T.randn(2, out=T.empty(2, dtype=T.float64))",
    "T.randn(2, 3, generator=T.Generator().manual_seed(1))",
    # randperm
    "T.randperm(5)", "T.randperm(0)", "T.randperm(5, dtype=T.int32)",
    "T.randperm(5, dtype=T.float32)", "T.randperm(5, generator=T.Generator())",
    "T.randperm(-1)", "T.randperm(5, out=T.empty(5, dtype=T.int64))", "T.randperm(n=5)",
    "T.randperm(5, device='cpu', requires_grad=False)",
    # normal: tensor/tensor, tensor/float, float/tensor, float/float + size
    "T.normal(T.zeros(3), T.ones(3))", "T.normal(T.zeros(3), 1.0)", "T.normal(T.zeros(3))",
    "T.normal(0.0, T.ones(3))", "T.normal(0.0, 1.0, (2, 3))", "T.normal(0.0, 1.0, size=(2, 3))",
    "T.normal(0., 1., (2,), dtype=T.float64)", "T.normal(2, 3, (2,))",
    "T.normal(T.zeros(3), T.ones(3), out=T.empty(3))",
    "T.normal(0., 1., (2,), out=T.empty(2, dtype=T.float64))",
    "T.normal(T.zeros(3, dtype=T.float64), T.ones(3))",
    "T.normal(T.zeros(3), T.ones(3, dtype=T.float64))",
    "T.normal(T.zeros(2, 1), T.ones(3))", "T.normal(mean=T.zeros(3), std=T.ones(3))",
    "T.normal(mean=0., std=1., size=(2,))", "T.normal(0., 1., (2,), requires_grad=True)",
    "T.normal(T.zeros(3, requires_grad=True), 1.0)",
    "T.normal(T.zeros(3), T.ones(3), generator=T.Generator())",
    "T.normal(0.0, 1.0)", "T.normal(0., -1., (2,))", "T.normal(T.zeros(3), -1.0)",
    "T.normal(T.zeros(3, dtype=T.int64), 1.0)", "T.normal(T.zeros(3), T.ones(3), size=(3,))",
    # *_like
    "T.rand_like(T.zeros(2))", "T.rand_like(T.zeros(2), dtype=T.float64)",
    "T.rand_like(T.zeros(2, dtype=T.int64))", "T.rand_like(T.zeros(2), requires_grad=True)",
    "T.rand_like(T.zeros(2), memory_format=T.preserve_format)",
    "T.rand_like(T.zeros(2), generator=T.Generator())",
    "T.randn_like(T.zeros(2, 3))", "T.randn_like(T.zeros(2), generator=T.Generator())",
    "T.randn_like(T.zeros(2, dtype=T.int64))", "T.randn_like(T.zeros(2), dtype=T.complex64)",
    "T.randint_like(T.zeros(2), 5)", "T.randint_like(T.zeros(2), 2, 5)",
    "T.randint_like(T.zeros(2), high=5)", "T.randint_like(T.zeros(2), low=2, high=5)",
    "T.randint_like(T.zeros(2, dtype=T.int32), 5)", "T.randint_like(T.zeros(2), 5, 5)",
    "T.randint_like(T.zeros(2), 5, dtype=T.int64)",
    "T.randint_like(T.zeros(2), 5, generator=T.Generator())",
    "T.randint_like(T.zeros(2), 5, memory_format=T.preserve_format)",
    # the in-place fills and samplers that take generator=, and what they refuse
    "T.zeros(3).random_(generator=T.Generator())", "T.zeros(3).random_(5, generator=T.Generator())",
    "T.zeros(3).random_(1, 5, generator=T.Generator())", "T.zeros(3).random_(5, 1)",
    "T.zeros(3).uniform_(generator=T.Generator())", "T.zeros(3).uniform_(1, 2)",
    "T.zeros(3).uniform_(2, 1)", "T.zeros(3, dtype=T.int64).uniform_()",
    "T.zeros(3).normal_(generator=T.Generator())", "T.zeros(3).normal_(0, -1)",
    "T.zeros(3).normal_(0, 0)", "T.zeros(3, dtype=T.int64).normal_()",
    "T.zeros(3).bernoulli_(0.5, generator=T.Generator())", "T.zeros(3).bernoulli_(2)",
    "T.zeros(3).bernoulli_(-1)", "T.zeros(3).exponential_(generator=T.Generator())",
    "T.zeros(3).exponential_(-1)", "T.zeros(3).exponential_(0)",
    "T.zeros(3).geometric_(0.5, generator=T.Generator())", "T.zeros(3).geometric_(1.0)",
    "T.zeros(3).geometric_(0)", "T.zeros(3).cauchy_(generator=T.Generator())",
    "T.zeros(3).cauchy_(0, -1)", "T.zeros(3).log_normal_(generator=T.Generator())",
    "T.zeros(3).log_normal_(0, 0)", "T.zeros(3).bernoulli(generator=T.Generator())",
    "T.multinomial(T.ones(3), 2, generator=T.Generator())", "T.multinomial(T.ones(3), 4)",
    "T.multinomial(T.tensor([-1., 1.]), 1)", "T.multinomial(T.ones(3), 0)",
    "T.multinomial(T.ones(2, 2, 2), 1)", "T.multinomial(T.ones(2, 3), 5, True)",
    "T.bernoulli(T.ones(3) * 0.5, generator=T.Generator())", "T.bernoulli(T.ones(3) * 2)",
    "T.bernoulli(T.ones(3), 0.5)", "T.poisson(T.ones(3), generator=T.Generator())",
]

CREATION_CALLS = [
    # empty / zeros / ones
    "T.empty(2, 3)", "T.empty((2, 3))", "T.empty([2, 3])", "T.empty(T.Size([2]))",
    "T.empty(size=(2,))", "T.empty(2, dtype=T.int32)", "T.empty(2, requires_grad=True)",
    "T.empty(2, memory_format=T.contiguous_format)", "T.empty(2, out=T.empty(5))",
    "T.empty(2, pin_memory=False, layout=T.strided, device='cpu')", "T.empty(-1)",
    "T.empty(2, 2.0)", "T.zeros(2, out=T.empty(2))", "T.ones(2, 3, out=T.empty(1))",
    "T.zeros(size=(1, 2))", "T.ones(T.Size([3]), dtype=T.int8)",
    "T.zeros(2, dtype=T.int64, requires_grad=True)",
    # full: dtype follows the value
    "T.full((2,), 1.5)", "T.full((2,), True)", "T.full([2, 2], 3)", "T.full(T.Size([2]), 3)",
    "T.full(size=(2,), fill_value=3)", "T.full((2,), 1 + 2j)", "T.full((2,), 3, dtype=T.float32)",
    "T.full((2,), 3, out=T.empty(2, dtype=T.int64))", "T.full((2,), 1.5, requires_grad=True)",
    "T.full((2,), 'a')", "T.full((2,), T.tensor(2.5))",
    # arange: overloads and dtype inference
    "T.arange(5)", "T.arange(1, 5)", "T.arange(1, 5, 2)", "T.arange(0, 1, 0.25)", "T.arange(5.0)",
    "T.arange(end=5)", "T.arange(start=1, end=5)", "T.arange(1, 5, step=2)",
    "T.arange(5, dtype=T.float64)", "T.arange(T.tensor(5))", "T.arange(T.tensor(5.0))",
    "T.arange(1.5, 2)", "T.arange(10, 0, -3)", "T.arange(0, 1, 0.1, dtype=T.float64)",
    "T.arange(5., requires_grad=True)", "T.arange(5, requires_grad=True)",
    "T.arange(0.5, 3, dtype=T.int64)", "T.arange(5, out=T.empty(5, dtype=T.int64))",
    "T.arange(0, 5, 0)", "T.arange(5, 0)", "T.arange(0, 1, 0.25, dtype=T.int64)",
    "T.arange(float('nan'))", "T.arange(float('inf'))", "T.arange(5, dtype=T.bool)",
    "T.arange()", "T.arange('a')",
    # *_like
    "T.full_like(T.zeros(2), 3)", "T.full_like(T.zeros(2), 3, dtype=T.int64)",
    "T.full_like(T.zeros(2), fill_value=3, memory_format=T.preserve_format)",
    "T.full_like(T.zeros(2, dtype=T.int64), 2.7)",
    "T.empty_like(T.zeros(2), memory_format=T.preserve_format)",
    "T.empty_like(T.zeros(2, 3), dtype=T.float16, requires_grad=True)",
    "T.zeros_like(T.zeros(2), memory_format=T.contiguous_format)",
    "T.ones_like(T.zeros(2), dtype=T.int64, memory_format=T.preserve_format)",
    "T.zeros_like(T.zeros(2), layout=T.strided, device='cpu')", "T.ones_like(input=T.zeros(2))",
    "T.zeros_like(T.zeros(2, requires_grad=True))", "T.ones_like(T.zeros(2), requires_grad=True)",
]

LEGACY_CALLS = [
    "T.FloatTensor(2, 3)", "T.FloatTensor([1, 2])", "T.LongTensor([1, 2])", "T.FloatTensor()",
    "T.DoubleTensor(2)", "T.HalfTensor(2)", "T.BFloat16Tensor(2)", "T.IntTensor([1])",
    "T.ShortTensor([1])", "T.CharTensor([1])", "T.ByteTensor([1])", "T.BoolTensor([1, 0])",
    "T.FloatTensor(T.tensor([1., 2.]))", "T.FloatTensor(T.tensor([1, 2]))",
    "T.FloatTensor((2, 3))", "T.FloatTensor(T.Size([2, 3]))", "T.LongTensor([1.5])",
    "T.FloatTensor([[1, 2], [3, 4]])", "T.FloatTensor(2, 3, device='cpu')", "T.FloatTensor(0)",
    "T.FloatTensor(2, 0)", "T.FloatTensor([])", "T.FloatTensor(T.tensor(3.))",
    "T.FloatTensor(2.5)", "T.FloatTensor(-1)", "T.FloatTensor(True)", "T.FloatTensor('ab')",
    "T.FloatTensor([[1], [2, 3]])", "T.FloatTensor(requires_grad=True)",
    "isinstance(T.zeros(2), T.FloatTensor)", "isinstance(T.zeros(2, dtype=T.int64), T.FloatTensor)",
    "isinstance(T.zeros(2, dtype=T.int64), T.LongTensor)", "isinstance(T.FloatTensor(2), T.Tensor)",
    "isinstance(T.zeros(2, requires_grad=True), T.FloatTensor)", "isinstance(3, T.FloatTensor)",
    "isinstance(T.zeros(2, dtype=T.bool), T.BoolTensor)", "type(T.zeros(2)) is T.FloatTensor",
    "issubclass(T.FloatTensor, T.Tensor)", "T.FloatTensor.__name__", "T.FloatTensor.is_cuda",
    "T.FloatTensor.dtype == T.float32", "T.LongTensor.dtype == T.int64",
    "T.zeros(2).type('torch.DoubleTensor')", "T.zeros(2).type(T.DoubleTensor)",
    "T.zeros(2).type(T.int64)", "T.zeros(2).type(dtype='torch.IntTensor')",
    "T.zeros(2).type('torch.FloatTensor', non_blocking=True)", "T.zeros(2).type('torch.Foo')",
    "T.zeros(2).type('float')", "T.zeros(2).type(5)",
    "(lambda a: a.type('torch.FloatTensor') is a)(T.zeros(2))",
    "(lambda a: a.type(T.float32) is a)(T.zeros(2))",
    "T.DoubleTensor([1]).type().split('.')[-1]", "T.ByteTensor([1]).type().split('.')[-1]",
]


@pytest.mark.parametrize("call", RANDOM_CALLS)
def test_random_overloads_match_torch(torch: Any, call: str) -> None:
    _same(torch, call)


@pytest.mark.parametrize("call", CREATION_CALLS)
def test_creation_overloads_match_torch(torch: Any, call: str) -> None:
    _same(torch, call)


@pytest.mark.parametrize("call", LEGACY_CALLS)
def test_legacy_types_match_torch(torch: Any, call: str) -> None:
    _same(torch, call)


@pytest.mark.filterwarnings("ignore:The number of elements in the out tensor")  # torch's
def test_deterministic_values_match_torch(torch: Any) -> None:
    """Where nothing is random, the values are torch's."""
    calls = [
        "T.arange(0, 1, 0.1)", "T.arange(-1.5, 2.2, 0.7)", "T.arange(0, 5.5, 2, dtype=T.int64)",
        "T.arange(0.5, 3.5, 1.5, dtype=T.int64)", "T.arange(-0.5, 2, dtype=T.int64)",
        "T.arange(-2.5, 2, 1.5, dtype=T.int32)", "T.arange(-3.5, 0.5, 1.5, dtype=T.uint8)",
        "T.arange(10, 0, -3)", "T.full((2, 2), 7)", "T.full_like(T.zeros(3, dtype=T.int64), 2.7)",
        "T.FloatTensor([[1, 2], [3, 4]])", "T.LongTensor([1.7, -1.7])", "T.BoolTensor([2, 0])",
        "T.ByteTensor([255, 1])", "T.zeros(3).type('torch.IntTensor') + 1",
        "T.arange(5, out=T.empty(2))",
    ]
    for call in calls:
        theirs, ours = eval(call, {"T": torch}), eval(call, {"T": mt})  # noqa: S307
        np.testing.assert_array_equal(arr(ours), arr(theirs), err_msg=call)
        assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1], call


# --------------------------------------------------------------------------------------------
# What a call promises beyond shape and dtype


def test_out_is_written_and_returned() -> None:
    for make in (lambda o: mt.rand(3, out=o), lambda o: mt.randn(3, out=o),
                 lambda o: mt.zeros(3, out=o), lambda o: mt.normal(0.0, 1.0, (3,), out=o),
                 lambda o: mt.normal(mt.zeros(3), 1.0, out=o)):
        out = mt.full((5,), 9.0)
        res = make(out)
        assert res is out and out.shape == (3,) and not bool((out == 9.0).any())
    out = mt.empty(4, dtype=mt.int64)
    assert mt.randint(3, 7, (4,), out=out) is out and bool(((out >= 3) & (out < 7)).all())
    out = mt.empty(4, dtype=mt.int64)
    assert mt.randperm(4, out=out) is out and sorted(out.tolist()) == [0, 1, 2, 3]
    out = mt.empty(2)
    assert mt.arange(4, out=out) is out and out.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert mt.full((2,), 3, out=out) is out and out.tolist() == [3.0, 3.0]


def test_legacy_constructor_shares_a_same_dtype_tensor() -> None:
    a = mt.zeros(3)
    b = mt.FloatTensor(a)
    b[0] = 5.0
    assert a[0].item() == 5.0
    assert isinstance(mt.FloatTensor(2, 3), mt.FloatTensor)
    assert mt.zeros(2).type() == "mpitensor.FloatTensor"
    with pytest.raises(RuntimeError):  # a legacy CPU constructor refuses another device
        mt.FloatTensor(2, device="cuda")


def test_randint_covers_its_range_evenly() -> None:
    """Each of k values appears n/k times, give or take 6 standard deviations of a binomial
    count, sqrt(n p (1 - p)); nothing falls outside [low, high)."""
    n, low, high = 60_000, -3, 7
    k = high - low
    x = arr(mt.randint(low, high, (n,), generator=mt.Generator().manual_seed(5)))
    assert x.min() >= low and x.max() < high
    counts = np.bincount(x - low, minlength=k)
    p = 1 / k
    assert np.all(np.abs(counts - n * p) <= 6 * math.sqrt(n * p * (1 - p)))


@pytest.mark.parametrize("dtype", [mt.float32, mt.float64])
def test_rand_and_randn_moments(dtype: Any) -> None:
    """U[0, 1): mean 1/2, variance 1/12; N(0, 1): mean 0, variance 1. The sample mean is off
    by at most 6 sigma/sqrt(n); the sample variance by 6 sqrt((mu4 - sigma^4)/n), with
    mu4 = 1/80 for the uniform and 3 for the normal."""
    n = 200_000
    g = mt.Generator().manual_seed(11)
    u = arr(mt.rand(n, generator=g, dtype=dtype)).astype(np.float64)
    assert u.min() >= 0 and u.max() < 1
    assert abs(u.mean() - 0.5) <= 6 * math.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) <= 6 * math.sqrt((1 / 80 - 1 / 144) / n)
    z = arr(mt.randn(n, generator=g, dtype=dtype)).astype(np.float64)
    assert abs(z.mean()) <= 6 * math.sqrt(1 / n)
    assert abs(z.var() - 1) <= 6 * math.sqrt(2 / n)


def test_normal_overloads_draw_their_laws() -> None:
    """Each element of normal(mean, std) has that element's mean and std: the 6-sigma bound
    on a sample mean is 6 std/sqrt(n)."""
    n = 100_000
    g = mt.Generator().manual_seed(3)
    means = mt.tensor([[-5.0], [0.0], [10.0]])
    stds = mt.tensor([0.5, 2.0])
    x = arr(mt.normal(means.expand(3, n), 2.0, generator=g))
    for i, m in enumerate((-5.0, 0.0, 10.0)):
        assert abs(x[i].mean() - m) <= 6 * 2.0 / math.sqrt(n)
    y = arr(mt.normal(1.0, stds.reshape(2, 1).expand(2, n), generator=g))
    for i, s in enumerate((0.5, 2.0)):
        assert abs(y[i].mean() - 1.0) <= 6 * s / math.sqrt(n)
        assert abs(y[i].std() - s) <= 6 * s / math.sqrt(2 * n)
    z = arr(mt.normal(3.0, 0.25, (n,), generator=g))
    assert abs(z.mean() - 3.0) <= 6 * 0.25 / math.sqrt(n)


def test_normal_gives_tensor_parameters_a_zero_gradient(torch: Any) -> None:
    for T in (torch, mt):
        m = T.zeros(3, requires_grad=True)
        s = T.ones(3, requires_grad=True)
        out = T.normal(m, s * 2)
        assert out.requires_grad
        out.sum().backward()
        assert m.grad.tolist() == [0.0] * 3 and s.grad.tolist() == [0.0] * 3


# --------------------------------------------------------------------------------------------
# Generators: same seed, same numbers


def _draws(g: Any) -> list:
    """Everything that takes generator=, drawn in order from ``g``."""
    x = mt.zeros(4)
    w = mt.tensor([1.0, 2.0, 3.0, 4.0])
    return [
        mt.rand(3, generator=g), mt.randn(2, 2, generator=g), mt.randint(10, (5,), generator=g),
        mt.randint(3, 9, size=(2,), generator=g), mt.randperm(6, generator=g),
        mt.normal(0.0, 1.0, (3,), generator=g), mt.normal(mt.zeros(2), 1.0, generator=g),
        mt.rand_like(x, generator=g), mt.randn_like(x, generator=g),
        mt.randint_like(x, 7, generator=g), mt.multinomial(w, 2, generator=g),
        mt.bernoulli(mt.full((4,), 0.5), generator=g), mt.poisson(mt.full((3,), 4.0), g),
        mt.zeros(4).uniform_(-1, 1, generator=g), mt.zeros(4).normal_(generator=g),
        mt.zeros(4).random_(5, generator=g), mt.zeros(4).bernoulli_(0.3, generator=g),
        mt.zeros(4).exponential_(generator=g), mt.zeros(4).geometric_(0.4, generator=g),
        mt.zeros(4).cauchy_(generator=g), mt.zeros(4).log_normal_(generator=g),
        mt.nn.init.orthogonal_(mt.empty(3, 3), generator=g),
        mt.nn.init.trunc_normal_(mt.empty(5), generator=g),
        mt.nn.init.sparse_(mt.empty(4, 3), 0.5, generator=g),
        mt.nn.init.kaiming_uniform_(mt.empty(2, 3), generator=g),
        mt.nn.init.xavier_normal_(mt.empty(2, 3), generator=g),
    ]


def test_same_seed_gives_same_numbers_everywhere() -> None:
    a = _draws(mt.Generator().manual_seed(1234))
    b = _draws(mt.Generator().manual_seed(1234))
    c = _draws(mt.Generator().manual_seed(1235))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(arr(x), arr(y))
    assert any(not np.array_equal(arr(x), arr(y)) for x, y in zip(a, c))
    # the global generator, seeded alike, draws the same numbers as a Generator
    mt.manual_seed(77)
    glob = mt.rand(5)
    again = mt.rand(5, generator=mt.Generator().manual_seed(77))
    np.testing.assert_array_equal(arr(glob), arr(again))


def test_generator_api(torch: Any) -> None:
    for T in (torch, mt):
        g = T.Generator(device="cpu")
        assert g.manual_seed(42) is g and g.initial_seed() == 42
        assert str(g.device) == "cpu"
        s = g.seed()
        assert isinstance(s, int) and g.initial_seed() == s
        g.manual_seed(5)
        state = g.get_state()
        first = T.rand(4, generator=g)
        g.set_state(state)
        assert T.equal(T.rand(4, generator=g), first)
        other = T.Generator().set_state(state)  # a state moves to another generator
        assert T.equal(T.rand(4, generator=other), first)
        with pytest.raises(RuntimeError):  # torch: RuntimeError; ours is also a TypeError
            g.manual_seed("a")
        with pytest.raises(TypeError):
            T.rand(2, generator=5)


def test_data_shuffles_follow_their_generator() -> None:
    ds = TensorDataset(mt.arange(20))

    def order(seed: int) -> list:
        loader = DataLoader(ds, batch_size=5, shuffle=True,
                            generator=mt.Generator().manual_seed(seed))
        return [int(v) for (batch,) in loader for v in batch.tolist()]

    assert order(3) == order(3) and order(3) != order(4)
    assert sorted(order(3)) == list(range(20))
    s1 = list(RandomSampler(range(10), generator=mt.Generator().manual_seed(8)))
    s2 = list(RandomSampler(range(10), generator=mt.Generator().manual_seed(8)))
    assert s1 == s2
    for make in (lambda g: SubsetRandomSampler([3, 5, 7, 9, 11], generator=g),
                 lambda g: WeightedRandomSampler([0.1, 0.5, 0.2, 0.2], 12, generator=g)):
        first, again = (list(make(mt.Generator().manual_seed(6))) for _ in range(2))
        assert first == again
    a1, _ = random_split(ds, [15, 5], generator=mt.Generator().manual_seed(2))
    a2, _ = random_split(ds, [15, 5], generator=mt.Generator().manual_seed(2))
    assert list(a1.indices) == list(a2.indices)


def test_set_default_tensor_type_as_torch(torch: Any) -> None:
    for T in (torch, mt):
        try:
            with pytest.warns(UserWarning):
                T.set_default_tensor_type(T.DoubleTensor)
            assert str(T.zeros(1).dtype).split(".")[-1] == "float64"
            assert str(T.get_default_dtype()).split(".")[-1] == "float64"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                T.set_default_tensor_type("torch.FloatTensor")
                assert str(T.rand(1).dtype).split(".")[-1] == "float32"
                with pytest.raises(TypeError):
                    T.set_default_tensor_type("torch.LongTensor")
                with pytest.raises(TypeError):
                    T.set_default_tensor_type(T.float64)
        finally:
            T.set_default_dtype(T.float32)


def test_torch_random_module(torch: Any) -> None:
    """torch.random's members, and fork_rng putting the global state back (or, disabled,
    leaving it moved), in both libraries."""
    names = ("Generator", "default_generator", "fork_rng", "get_rng_state", "initial_seed",
             "manual_seed", "seed", "set_rng_state")
    for T in (torch, mt):
        assert all(hasattr(T.random, n) for n in names)
        assert T.random.default_generator is T.default_generator
        T.random.manual_seed(4)
        assert T.random.initial_seed() == 4
        a = T.rand(3)
        T.manual_seed(4)
        with T.random.fork_rng():
            inside = T.rand(3)
        assert T.equal(inside, a)  # the CPU numbers continue from the entry state
        assert T.equal(T.rand(3), a)  # and leaving put the state back
        T.manual_seed(4)
        with T.random.fork_rng(enabled=False):
            T.rand(3)
        assert not T.equal(T.rand(3), a)
