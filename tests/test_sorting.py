"""``sort``, ``argsort`` and ``topk`` against PyTorch as the oracle.

Values must equal torch's exactly (NaN placed where torch places it); indices must equal
torch's where no two elements tie (and for ``stable=True`` always), and elsewhere pick the
values returned (``gather``). The values' gradient goes back to where they came from.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt

RNG = np.random.default_rng(31337)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _np(t) -> np.ndarray:
    return np.array(t.detach().numpy())


def _check_picks(x: np.ndarray, values, indices, dim: int) -> None:
    """``indices`` are int64 positions along ``dim``, each at most once, holding ``values``."""
    idx = _np(indices)
    assert indices.dtype == mt.int64 and idx.dtype == np.int64
    np.testing.assert_array_equal(np.take_along_axis(x, idx, dim), _np(values))
    s = np.sort(idx, axis=dim)
    assert (np.diff(s, axis=dim) > 0).all(), "an index appears twice"


SHAPES_DIMS = [((7,), -1), ((4, 9), 1), ((4, 9), 0), ((3, 5, 6), 1), ((2, 3, 700), -1),
               ((2, 1, 3), 1), ((0, 4), 1), ((3, 0), 1)]


@pytest.mark.parametrize("shape, dim", SHAPES_DIMS)
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("stable", [False, True])
def test_sort_matches_torch_without_ties(torch, shape, dim, descending, stable):
    x = RNG.standard_normal(shape).astype(np.float32)
    ours = mt.sort(mt.tensor(x), dim=dim, descending=descending, stable=stable)
    theirs = torch.sort(torch.tensor(x), dim=dim, descending=descending, stable=stable)
    np.testing.assert_array_equal(_np(ours.values), _np(theirs.values))
    np.testing.assert_array_equal(_np(ours.indices), _np(theirs.indices))
    assert ours.values.dtype == mt.float32 and ours.indices.dtype == mt.int64
    np.testing.assert_array_equal(
        _np(mt.argsort(mt.tensor(x), dim, descending, stable)), _np(theirs.indices))
    np.testing.assert_array_equal(
        _np(mt.tensor(x).argsort(dim=dim, descending=descending)), _np(theirs.indices))


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", ["int64", "float64", "bool", "uint8"])
def test_sort_with_ties(torch, descending, dtype):
    x = RNG.integers(0, 4, size=(5, 40)).astype(dtype)
    t = torch.tensor(x)
    for dim in (0, 1):
        ours = mt.tensor(x).sort(dim, descending)
        theirs = t.sort(dim, descending)
        np.testing.assert_array_equal(_np(ours.values), _np(theirs.values))
        assert ours.values.dtype == mt.tensor(x).dtype
        _check_picks(x, ours.values, ours.indices, dim)
        # stable: equal elements keep their order, so the indices are torch's
        ours = mt.tensor(x).sort(dim, descending, stable=True)
        theirs = t.sort(dim=dim, descending=descending, stable=True)
        np.testing.assert_array_equal(_np(ours.indices), _np(theirs.indices))
        np.testing.assert_array_equal(
            _np(mt.argsort(mt.tensor(x), dim, descending, stable=True)),
            _np(torch.argsort(t, dim=dim, descending=descending, stable=True)))


@pytest.mark.parametrize("descending", [False, True])
def test_sort_puts_nan_where_torch_does(torch, descending):
    x = np.array([[3.0, np.nan, -1.0, np.inf, 2.0, -np.inf, np.nan],
                  [0.0, -0.5, np.nan, 7.0, 1.0, 1.5, 2.5]])
    ours = mt.tensor(x).sort(descending=descending, stable=True)
    theirs = torch.tensor(x).sort(descending=descending, stable=True)
    np.testing.assert_array_equal(_np(ours.values), _np(theirs.values))
    np.testing.assert_array_equal(_np(ours.indices), _np(theirs.indices))
    top = mt.tensor(x).topk(3, largest=not descending)
    top_t = torch.tensor(x).topk(3, largest=not descending)
    np.testing.assert_array_equal(_np(top.values), _np(top_t.values))


TOPK_CASES = [((9,), 3, -1), ((9,), 9, 0), ((9,), 0, 0), ((6, 10), 4, 1), ((6, 10), 2, 0),
              ((3, 4, 5), 5, 2), ((3, 2000), 7, 1), ((2, 3000), 1000, -1), ((1, 20000), 15000, 1),
              ((600, 3), 2, 0), ((4, 0), 0, 1)]


@pytest.mark.parametrize("shape, k, dim", TOPK_CASES)
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch_without_ties(torch, shape, k, dim, largest):
    x = RNG.standard_normal(shape)
    ours = mt.topk(mt.tensor(x), k, dim=dim, largest=largest)
    theirs = torch.topk(torch.tensor(x), k, dim=dim, largest=largest)
    np.testing.assert_array_equal(_np(ours.values), _np(theirs.values))
    np.testing.assert_array_equal(_np(ours.indices), _np(theirs.indices))
    assert ours.indices.dtype == mt.int64 and ours.values.dtype == mt.float64
    method = mt.tensor(x).topk(k, dim, largest)
    np.testing.assert_array_equal(_np(method.indices), _np(theirs.indices))
    # sorted=False: the same elements, in any order
    loose = mt.tensor(x).topk(k, dim=dim, largest=largest, sorted=False)
    np.testing.assert_array_equal(np.sort(_np(loose.values), axis=dim),
                                  np.sort(_np(theirs.values), axis=dim))
    _check_picks(x, loose.values, loose.indices, dim)


@pytest.mark.parametrize("shape, k", [((3, 50), 10), ((2, 4000), 30), ((2, 4000), 3000)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_with_ties(torch, shape, k, largest):
    x = RNG.integers(0, 5, size=shape).astype(np.float32)
    ours = mt.tensor(x).topk(k, largest=largest)
    theirs = torch.tensor(x).topk(k, largest=largest)
    np.testing.assert_array_equal(_np(ours.values), _np(theirs.values))
    _check_picks(x, ours.values, ours.indices, -1)


def test_zero_dim_and_out_of_range(torch):
    s = mt.tensor(2.5)
    for res, ref in ((s.sort(), torch.tensor(2.5).sort()), (s.topk(1), torch.tensor(2.5).topk(1)),
                     (mt.sort(s, 0), torch.sort(torch.tensor(2.5), 0))):
        assert res.values.shape == ref.values.shape == () and res.values.item() == 2.5
        assert res.indices.shape == () and res.indices.item() == 0
        assert res.indices.dtype == mt.int64
    assert s.argsort().item() == 0 and s.argsort().shape == ()
    x = mt.arange(5.0)
    for k in (6, -1):
        with pytest.raises(RuntimeError):
            torch.arange(5.0).topk(k)
        with pytest.raises(ValueError, match="out of range"):
            x.topk(k)
    with pytest.raises(ValueError, match="out of range"):
        s.topk(2)
    for fn in (lambda t: t.sort(dim=2), lambda t: t.topk(1, dim=-3), lambda t: t.argsort(1)):
        for L in (torch, mt):
            with pytest.raises(IndexError):
                fn(L.zeros(3))
    with pytest.raises(TypeError, match="complex"):
        mt.tensor([1 + 2j, 3j]).sort()
    with pytest.raises(TypeError, match="complex"):
        mt.tensor([1 + 2j, 3j]).topk(1)


@pytest.mark.parametrize("op", ["sort", "sort_desc", "topk", "topk_small", "topk_big"])
def test_values_gradient_matches_torch(torch, op):
    x = RNG.standard_normal((4, 3000) if op == "topk_big" else (4, 9))
    w = RNG.standard_normal((4, 3000) if op == "topk_big" else (4, 9))

    def run(L):
        t = L.tensor(x, requires_grad=True)
        if op == "sort":
            v = L.sort(t * 2, dim=0).values
        elif op == "sort_desc":
            v = t.sort(dim=1, descending=True)[0]
        elif op == "topk":
            v = L.topk(t, 4, dim=1).values
        elif op == "topk_small":
            v = t.topk(2, dim=0, largest=False, sorted=False)[0].sort(dim=0).values
        else:
            v = t.topk(25).values
        weights = L.tensor(w[tuple(slice(0, n) for n in v.shape)])
        (v * weights).sum().backward()
        return _np(t.grad)

    np.testing.assert_allclose(run(mt), run(torch), rtol=1e-12, atol=0)


def test_results_are_named_tuples():
    r = mt.tensor([[3.0, 1.0, 2.0]]).topk(2)
    values, indices = r
    assert values is r.values and indices is r.indices and r[0] is values
    assert repr(r).startswith("mpitensor.return_types.topk(")
    assert repr(mt.sort(mt.tensor([1, 0]))).startswith("mpitensor.return_types.sort(")
    assert values.grad_fn is None and indices.tolist() == [[0, 2]]
    g = mt.tensor([2.0, 1.0], requires_grad=True).sort()
    assert g.values.grad_fn.name() == "SortBackward" and not g.indices.requires_grad
    assert {"sort", "argsort", "topk"} <= set(mt.__all__)


@pytest.mark.gpu
@pytest.mark.parametrize("descending", [False, True])
def test_gpu_matches_cpu(descending):
    x = RNG.standard_normal((3, 2000))
    x[0, 5] = x[1, 7] = np.nan
    ties = RNG.integers(0, 3, size=(4, 50)).astype(np.float32)
    for device in ("cpu", "cuda"):
        t = mt.tensor(x, device=device, requires_grad=True)
        s = t.sort(descending=descending, stable=True)
        k = t.topk(9, largest=not descending)
        (s.values[:, :3].sum() + (k.values * 2).sum()).backward()
        u = mt.tensor(ties, device=device).sort(dim=0, descending=descending, stable=True)
        got = [r.cpu().numpy() for r in (s.values, s.indices, k.values, k.indices, t.grad,
                                          u.values, u.indices)]
        if device == "cpu":
            want = got
        else:
            assert s.values.is_cuda and k.indices.is_cuda
            for a, b in zip(want, got):
                np.testing.assert_array_equal(b, a)
