"""Regression, margin, embedding and likelihood losses of ``mpitensor.nn.functional`` (and
their modules), plus the distances they build on, against PyTorch.

Values and the gradients of every input that takes one (float64 to 1e-10, float32 to 1e-5),
for every reduction, with broadcasting, weights, kinks (a difference of exactly ``beta``, a
margin met exactly) and options; module reprs, attributes and state dicts; bad arguments.
Finite-difference checks run without torch.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F
from tests.test_nn_functional import _fd_check

RNG = np.random.default_rng(99)
TOL = {np.float32: 1e-5, np.float64: 1e-10}
DTYPES = [np.float32, np.float64]
REDUCTIONS = ["mean", "sum", "none"]


def _torch():
    return pytest.importorskip("torch")


def _np(t):
    return np.asarray(t.detach()._data)


def _close(got, want, dtype, what=""):
    tol = TOL[dtype]
    want = np.asarray(want)
    finite = want[np.isfinite(want)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=what,
                               equal_nan=True)


def _parity(call, arrays, grad_idx, dtype, kwargs=None):
    """Run ``call(lib_functional, *tensors)`` in both libraries; compare value and gradients
    of the arrays at ``grad_idx`` (float arrays are cast to ``dtype``; others kept)."""
    torch = _torch()
    kwargs = kwargs or {}
    arrays = [a.astype(dtype) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
              for a in arrays]
    ours = [mt.tensor(a, requires_grad=i in grad_idx) if isinstance(a, np.ndarray) else a
            for i, a in enumerate(arrays)]
    theirs = [torch.tensor(a, requires_grad=i in grad_idx) if isinstance(a, np.ndarray) else a
              for i, a in enumerate(arrays)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = call(F, *ours, **kwargs)
        tout = call(torch.nn.functional, *theirs, **kwargs)
    assert tuple(out.shape) == tuple(tout.shape)
    assert _np(out).dtype == tout.detach().numpy().dtype
    _close(_np(out), tout.detach().numpy(), dtype, "value")
    if not grad_idx:
        return
    g = RNG.standard_normal(tuple(out.shape)).astype(_np(out).dtype)
    out.backward(mt.tensor(g))
    tout.backward(torch.tensor(g))
    for i in grad_idx:
        _close(_np(ours[i].grad), theirs[i].grad.numpy(), dtype, f"gradient of argument {i}")


def _kinked(shape, dtype, beta=1.0):
    """(input, target) with some differences of exactly +-beta and 0."""
    x = RNG.standard_normal(shape) * 2
    y = RNG.standard_normal(shape) * 2
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    for i, d in enumerate([beta, -beta, 0.0][: max(flat_x.size - 1, 0)]):
        flat_x[i] = flat_y[i] + d
    return x.astype(dtype), y.astype(dtype)


SHAPES = [(5,), (3, 4), (2, 3, 4)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name,kw", [("l1_loss", {}), ("smooth_l1_loss", {}),
                                     ("smooth_l1_loss", {"beta": 0.5}),
                                     ("smooth_l1_loss", {"beta": 0.0}),
                                     ("huber_loss", {}), ("huber_loss", {"delta": 2.5}),
                                     ("mse_loss", {})])
def test_regression_losses_match_torch(name, kw, shape, reduction, dtype):
    beta = kw.get("beta", kw.get("delta", 1.0))
    x, y = _kinked(shape, np.float64, beta)

    def call(f, a, b):
        return getattr(f, name)(a, b, reduction=reduction, **kw)

    _parity(call, [x, y], [0, 1], dtype)


@pytest.mark.parametrize("xshape,yshape", [((3, 4), (4,)), ((3, 1), (1, 5)), ((2, 3), ())])
@pytest.mark.parametrize("name", ["l1_loss", "smooth_l1_loss", "huber_loss"])
def test_regression_losses_broadcast_with_torchs_warning(name, xshape, yshape):
    x, y = RNG.standard_normal(xshape), RNG.standard_normal(yshape)
    _parity(lambda f, a, b: getattr(f, name)(a, b), [x, y], [0, 1], np.float64)
    with pytest.warns(UserWarning, match="target size"):
        getattr(F, name)(mt.tensor(x), mt.tensor(y))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", ["l1_loss", "huber_loss"])
def test_weighted_regression_losses_match_torch(name, reduction):
    x, y = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    w = RNG.uniform(0.1, 2.0, (3, 4))
    _parity(lambda f, a, b, c: getattr(f, name)(a, b, reduction=reduction, weight=c),
            [x, y, w], [0, 1, 2], np.float64)


def test_regression_losses_promote_like_torch():
    x = RNG.standard_normal(4).astype(np.float32)
    _parity(lambda f, a, b: f.l1_loss(a, b), [x, np.array([0, 1, 2, 3])], [0], np.float32)
    _parity(lambda f, a, b: f.smooth_l1_loss(a, b), [x, np.arange(4.0)], [0], np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_soft_margin_loss_matches_torch(shape, reduction, dtype):
    x = RNG.standard_normal(shape) * 3
    y = np.where(RNG.random(shape) < 0.5, -1.0, 1.0)
    _parity(lambda f, a, b: f.soft_margin_loss(a, b, reduction=reduction), [x, y], [0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shapes", [((5,), (5,), (5,)), ((3, 1), (1, 4), (3, 4))])
@pytest.mark.parametrize("margin", [0.0, 0.5])
def test_margin_ranking_loss_matches_torch(shapes, margin, reduction, dtype):
    a, b = RNG.standard_normal(shapes[0]), RNG.standard_normal(shapes[1])
    t = np.where(RNG.random(shapes[2]) < 0.5, -1.0, 1.0)
    a.reshape(-1)[0] = b.reshape(-1)[0] + margin * t.reshape(-1)[0]  # exactly on the margin
    _parity(lambda f, p, q, r: f.margin_ranking_loss(p, q, r, margin=margin,
                                                     reduction=reduction),
            [a, b, t], [0, 1, 2], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", [1.0, 0.3])
def test_hinge_embedding_loss_matches_torch(margin, reduction, dtype):
    x = RNG.standard_normal((4, 5))
    x[0, 0] = margin
    t = RNG.choice([-1.0, 1.0, 0.0, 2.0], size=(4, 5), p=[0.45, 0.45, 0.05, 0.05])
    _parity(lambda f, a, b: f.hinge_embedding_loss(a, b, margin=margin, reduction=reduction),
            [x, t], [0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("margin", [0.0, 0.2])
def test_cosine_embedding_loss_matches_torch(batched, margin, reduction, dtype):
    shape = (6, 5) if batched else (5,)
    a, b = RNG.standard_normal(shape), RNG.standard_normal(shape)
    t = np.array([1.0, -1.0, 1.0, -1.0, -1.0, 1.0]) if batched else np.array(-1.0)
    _parity(lambda f, p, q, r: f.cosine_embedding_loss(p, q, r, margin=margin,
                                                       reduction=reduction),
            [a, b, t], [0, 1], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p,swap", [(2.0, False), (2.0, True), (1.0, False), (3.0, True)])
@pytest.mark.parametrize("batched", [True, False])
def test_triplet_margin_loss_matches_torch(p, swap, batched, reduction, dtype):
    shape = (5, 4) if batched else (4,)
    a, pos, neg = (RNG.standard_normal(shape) for _ in range(3))
    _parity(lambda f, x, y, z: f.triplet_margin_loss(x, y, z, margin=0.7, p=p, swap=swap,
                                                     reduction=reduction),
            [a, pos, neg], [0, 1, 2], dtype)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("swap", [False, True])
def test_triplet_margin_with_distance_loss_matches_torch(swap, reduction):
    a, pos, neg = (RNG.standard_normal((5, 4)) for _ in range(3))
    _parity(lambda f, x, y, z: f.triplet_margin_with_distance_loss(x, y, z, swap=swap,
                                                                   reduction=reduction),
            [a, pos, neg], [0, 1, 2], np.float64)

    def cos_dist(f):
        return lambda u, v: 1.0 - f.cosine_similarity(u, v)

    _parity(lambda f, x, y, z: f.triplet_margin_with_distance_loss(
        x, y, z, distance_function=cos_dist(f), margin=0.5, swap=swap, reduction=reduction),
        [a, pos, neg], [0, 1, 2], np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("log_input,full", [(True, False), (False, False), (True, True),
                                            (False, True)])
def test_poisson_nll_loss_matches_torch(log_input, full, reduction, dtype):
    x = RNG.standard_normal((4, 5)) if log_input else RNG.uniform(0.1, 3.0, (4, 5))
    t = RNG.poisson(2.0, (4, 5)).astype(np.float64) + 0.5
    t[0, :3] = [0.5, 1.0, 3.0]
    _parity(lambda f, a, b: f.poisson_nll_loss(a, b, log_input=log_input, full=full,
                                               reduction=reduction),
            [x, t], [0, 1], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("vshape", [(4, 3), (4,), (4, 1), "float"])
@pytest.mark.parametrize("full", [False, True])
def test_gaussian_nll_loss_matches_torch(vshape, full, reduction, dtype):
    x, t = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    if vshape == "float":
        _parity(lambda f, a, b: f.gaussian_nll_loss(a, b, 0.7, full=full, reduction=reduction),
                [x, t], [0, 1], dtype)
        return
    v = RNG.uniform(0.2, 2.0, vshape)
    v.reshape(-1)[0] = 1e-9  # floored at eps; the gradient passes as if it were not
    _parity(lambda f, a, b, c: f.gaussian_nll_loss(a, b, c, full=full, reduction=reduction),
            [x, t, v], [0, 1, 2], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 5)])
@pytest.mark.parametrize("weighted", [False, True])
def test_multilabel_soft_margin_loss_matches_torch(shape, weighted, reduction, dtype):
    x = RNG.standard_normal(shape) * 2
    t = (RNG.random(shape) < 0.4).astype(np.float64)
    if weighted:
        w = RNG.uniform(0.2, 2.0, shape[-1])
        _parity(lambda f, a, b, c: f.multilabel_soft_margin_loss(a, b, weight=c,
                                                                 reduction=reduction),
                [x, t, w], [0, 1], dtype)
    else:
        _parity(lambda f, a, b: f.multilabel_soft_margin_loss(a, b, reduction=reduction),
                [x, t], [0, 1], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("batched", [True, False])
def test_multi_margin_loss_matches_torch(p, weighted, batched, reduction, dtype):
    x = RNG.standard_normal((6, 4) if batched else (4,))
    t = RNG.integers(0, 4, 6 if batched else 1)
    if batched:
        x[0, (t[0] + 1) % 4] = x[0, t[0]] - 0.9  # a margin term of exactly... 0.1
    args = [x, t]
    kw = {"p": p, "margin": 0.9, "reduction": reduction}
    if weighted:
        args.append(RNG.uniform(0.2, 2.0, 4))
        _parity(lambda f, a, b, c: f.multi_margin_loss(a, b, weight=c, **kw), args, [0], dtype)
    else:
        _parity(lambda f, a, b: f.multi_margin_loss(a, b, **kw), args, [0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("batched", [True, False])
def test_multilabel_margin_loss_matches_torch(batched, reduction, dtype):
    if batched:
        x = RNG.standard_normal((3, 5))
        t = np.array([[3, 0, -1, 1, 2], [4, 4, 1, -1, -1], [0, 1, 2, 3, 4]])
    else:
        x = RNG.standard_normal(5)
        t = np.array([2, -1, 0, 0, 0])
    _parity(lambda f, a, b: f.multilabel_margin_loss(a, b, reduction=reduction), [x, t], [0],
            dtype)


# --------------------------------------------------------------------------------------------
# distances


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, float("inf"), 0.5])
@pytest.mark.parametrize("shapes,keepdim", [(((4, 5), (4, 5)), False), (((4, 5), (5,)), True),
                                            (((5,), (5,)), False), (((5,), (5,)), True),
                                            (((2, 3, 4), (3, 4)), False)])
def test_pairwise_distance_matches_torch(shapes, keepdim, p, dtype):
    a, b = RNG.standard_normal(shapes[0]), RNG.standard_normal(shapes[1])
    _parity(lambda f, x, y: f.pairwise_distance(x, y, p=p, keepdim=keepdim), [a, b], [0, 1],
            dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes,dim", [(((4, 5), (4, 5)), 1), (((3, 1, 4), (5, 4)), -1),
                                        (((4, 5), (4, 5)), 0), (((6,), (6,)), 0)])
def test_cosine_similarity_matches_torch(shapes, dim, dtype):
    a, b = RNG.standard_normal(shapes[0]), RNG.standard_normal(shapes[1])
    _parity(lambda f, x, y: f.cosine_similarity(x, y, dim=dim), [a, b], [0, 1], dtype)


def test_cosine_similarity_near_zero_vectors_match_torch():
    a = np.array([[1e-9, 2e-9], [1.0, 2.0], [0.0, 0.0]])
    b = np.array([[3.0, 1.0], [1e-10, 0.0], [1.0, 1.0]])
    _parity(lambda f, x, y: f.cosine_similarity(x, y), [a, b], [0, 1], np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, 0), (3.0, -1), (float("inf"), 1),
                                   (2.0, (0, 1))])
def test_normalize_matches_torch(p, dim, dtype):
    x = RNG.standard_normal((4, 5))
    x[0] = 0.0  # a zero row stays zero, with torch's gradient there
    _parity(lambda f, a: f.normalize(a, p=p, dim=dim), [x], [0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, float("inf")])
def test_pdist_matches_torch(p, dtype):
    x = RNG.standard_normal((6, 3))
    x[4] = x[2]  # a zero distance: torch's gradient there is 0
    _parity(lambda f, a: f.pdist(a, p=p), [x], [0], dtype)


def test_normalize_out_and_distance_modules():
    torch = _torch()
    x = RNG.standard_normal((3, 4))
    out = mt.empty(3, 4, dtype=mt.float64)
    assert F.normalize(mt.tensor(x), out=out) is out
    np.testing.assert_allclose(_np(out), torch.nn.functional.normalize(torch.tensor(x)).numpy())
    for ours, theirs in [(nn.PairwiseDistance(), torch.nn.PairwiseDistance()),
                         (nn.PairwiseDistance(1.0, 0.0, True),
                          torch.nn.PairwiseDistance(1.0, 0.0, True)),
                         (nn.CosineSimilarity(), torch.nn.CosineSimilarity()),
                         (nn.CosineSimilarity(0, 1e-6), torch.nn.CosineSimilarity(0, 1e-6))]:
        assert repr(ours) == repr(theirs)
        a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
        _close(_np(ours(mt.tensor(a), mt.tensor(b))),
               theirs(torch.tensor(a), torch.tensor(b)).numpy(), np.float64)


# --------------------------------------------------------------------------------------------
# modules

MODULES = [
    ("L1Loss", {}), ("L1Loss", {"reduction": "sum"}), ("SmoothL1Loss", {"beta": 0.5}),
    ("HuberLoss", {"delta": 2.0, "reduction": "none"}), ("SoftMarginLoss", {}),
    ("MarginRankingLoss", {"margin": 0.3}), ("HingeEmbeddingLoss", {"margin": 2.0}),
    ("CosineEmbeddingLoss", {"margin": 0.1}),
    ("TripletMarginLoss", {"margin": 0.5, "p": 1.0, "swap": True}),
    ("TripletMarginWithDistanceLoss", {"margin": 0.5}), ("PoissonNLLLoss", {"full": True}),
    ("GaussianNLLLoss", {"full": True, "eps": 1e-3}), ("MultiLabelSoftMarginLoss", {}),
    ("MultiMarginLoss", {"p": 2, "margin": 0.5}), ("MultiLabelMarginLoss", {}),
]
ATTRS = ["reduction", "beta", "delta", "margin", "p", "eps", "swap", "log_input", "full"]


def _module_inputs(name):
    x, y = RNG.standard_normal((4, 5)), RNG.standard_normal((4, 5))
    sign = np.where(RNG.random((4,)) < 0.5, -1.0, 1.0)
    if name in ("MarginRankingLoss",):
        return [RNG.standard_normal(4), RNG.standard_normal(4), sign]
    if name == "CosineEmbeddingLoss":
        return [x, y, sign]
    if name.startswith("Triplet"):
        return [x, y, RNG.standard_normal((4, 5))]
    if name == "GaussianNLLLoss":
        return [x, y, RNG.uniform(0.5, 1.5, (4, 5))]
    if name == "MultiMarginLoss":
        return [x, RNG.integers(0, 5, 4)]
    if name == "MultiLabelMarginLoss":
        return [x, np.array([[1, -1, 0, 0, 0]] * 4)]
    if name in ("SoftMarginLoss", "HingeEmbeddingLoss"):
        return [x, np.where(y < 0, -1.0, 1.0)]
    if name == "MultiLabelSoftMarginLoss":
        return [x, (y > 0).astype(np.float64)]
    if name == "PoissonNLLLoss":
        return [x, np.abs(y) * 3]
    return [x, y]


@pytest.mark.parametrize("name,kwargs", MODULES)
def test_loss_module_matches_torch(name, kwargs):
    torch = _torch()
    ours, theirs = getattr(nn, name)(**kwargs), getattr(torch.nn, name)(**kwargs)
    assert repr(ours) == repr(theirs)
    for a in ATTRS:
        if hasattr(theirs, a):
            assert getattr(ours, a) == getattr(theirs, a), a
    assert list(ours.state_dict()) == list(theirs.state_dict())
    arrays = _module_inputs(name)
    ins = [mt.tensor(a, requires_grad=a.dtype.kind == "f" and i == 0)
           for i, a in enumerate(arrays)]
    tins = [torch.tensor(a, requires_grad=a.dtype.kind == "f" and i == 0)
            for i, a in enumerate(arrays)]
    out, tout = ours(*ins), theirs(*tins)
    _close(_np(out), tout.detach().numpy(), np.float64)
    out.sum().backward()
    tout.sum().backward()
    _close(_np(ins[0].grad), tins[0].grad.numpy(), np.float64)


@pytest.mark.parametrize("name", ["MultiMarginLoss", "MultiLabelSoftMarginLoss"])
def test_weighted_loss_modules_keep_the_weight_as_a_buffer(name):
    torch = _torch()
    w = RNG.uniform(0.5, 1.5, 5)
    ours, theirs = getattr(nn, name)(weight=mt.tensor(w)), getattr(torch.nn, name)(
        weight=torch.tensor(w))
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight"]
    arrays = _module_inputs(name)
    out = ours(*[mt.tensor(a) for a in arrays])
    tout = theirs(*[torch.tensor(a) for a in arrays])
    _close(_np(out), tout.numpy(), np.float64)


def test_legacy_size_average_and_reduce_flags():
    x, y = RNG.standard_normal(4), RNG.standard_normal(4)
    with pytest.warns(UserWarning):
        s = F.l1_loss(mt.tensor(x), mt.tensor(y), size_average=False)
    np.testing.assert_allclose(_np(s), np.abs(x - y).sum())
    with pytest.warns(UserWarning):
        m = nn.SmoothL1Loss(reduce=False)
    assert m.reduction == "none"


# --------------------------------------------------------------------------------------------
# no torch needed


def test_finite_differences():
    x, y = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    _fd_check(lambda a, b: F.smooth_l1_loss(a, b, beta=0.7), [x, y], [0, 1])
    _fd_check(lambda a, b: F.huber_loss(a, b, delta=0.7), [x, y], [0, 1])
    _fd_check(lambda a: F.soft_margin_loss(a, mt.tensor(np.sign(y))), [x], [0])
    _fd_check(lambda a, b: F.cosine_embedding_loss(a, b, mt.tensor([1.0, -1.0, 1.0]), 0.1),
              [x, y], [0, 1])
    _fd_check(lambda a, b, c: F.triplet_margin_loss(a, b, c, swap=True),
              [x, y, RNG.standard_normal((3, 4))], [0, 1, 2])
    _fd_check(lambda a: F.multi_margin_loss(a, mt.tensor([0, 2, 3]), p=2), [x], [0])
    _fd_check(lambda a: F.multilabel_margin_loss(a, mt.tensor([[0, 1, -1, 0]] * 3)), [x], [0])
    _fd_check(lambda a, v: F.gaussian_nll_loss(a, mt.tensor(y), v),
              [x, RNG.uniform(0.5, 1.5, (3, 4))], [0, 1])
    _fd_check(lambda a, b: F.pairwise_distance(a, b, p=3.0), [x, y], [0, 1])
    _fd_check(lambda a: F.pdist(a), [x], [0])


@pytest.mark.parametrize("call, exc", [
    (lambda: F.smooth_l1_loss(mt.ones(2), mt.ones(2), beta=-1.0), RuntimeError),
    (lambda: F.huber_loss(mt.ones(2), mt.ones(2), delta=0.0), RuntimeError),
    (lambda: F.l1_loss(mt.ones(2), mt.ones(3)), RuntimeError),
    (lambda: F.l1_loss(mt.tensor([1, 2]), mt.tensor([0, 0])), RuntimeError),
    (lambda: F.l1_loss(mt.ones(2), mt.ones(2), reduction="avg"), ValueError),
    (lambda: F.l1_loss(mt.ones(2), mt.ones(2), weight=mt.ones(3)), ValueError),
    (lambda: F.soft_margin_loss(mt.ones(2), mt.ones(2, requires_grad=True)), RuntimeError),
    (lambda: F.margin_ranking_loss(mt.ones(3), mt.ones(3, 1), mt.ones(3)), RuntimeError),
    (lambda: F.cosine_embedding_loss(mt.ones(3, 4), mt.ones(3, 4), mt.ones(3, 1)),
     RuntimeError),
    (lambda: F.cosine_embedding_loss(mt.ones(2, 3, 4), mt.ones(2, 3, 4), mt.ones(2)),
     RuntimeError),
    (lambda: F.triplet_margin_loss(mt.ones(3, 4), mt.ones(4), mt.ones(3, 4)), RuntimeError),
    (lambda: F.triplet_margin_loss(mt.ones(4), mt.ones(4), mt.ones(4), margin=0.0),
     ValueError),
    (lambda: F.triplet_margin_with_distance_loss(mt.ones(4), mt.ones(4), mt.ones(4),
                                                 margin=-1.0), ValueError),
    (lambda: F.gaussian_nll_loss(mt.ones(3, 4), mt.ones(3, 4), -mt.ones(3, 4)), ValueError),
    (lambda: F.gaussian_nll_loss(mt.ones(3, 4), mt.ones(3, 4), mt.ones(3, 2)), ValueError),
    (lambda: F.gaussian_nll_loss(mt.ones(3, 4), mt.ones(3, 4), -0.5), ValueError),
    (lambda: F.gaussian_nll_loss(mt.ones(3, 4), mt.ones(3, 4), 1.0, reduction="x"),
     ValueError),
    (lambda: F.multi_margin_loss(mt.ones(2, 4), mt.tensor([0, 1]), p=3), ValueError),
    (lambda: F.multi_margin_loss(mt.ones(2, 4), mt.tensor([0, 5])), RuntimeError),
    (lambda: F.multi_margin_loss(mt.ones(2, 4), mt.tensor([0.0, 1.0])), RuntimeError),
    (lambda: F.multilabel_margin_loss(mt.ones(2, 4), mt.tensor([[0, 7, -1, 0]] * 2)),
     RuntimeError),
    (lambda: F.pdist(mt.ones(2, 3, 4)), RuntimeError),
    (lambda: F.pairwise_distance(mt.ones(3, 4), mt.ones(2, 4)), RuntimeError),
    (lambda: nn.MultiMarginLoss(p=3), ValueError),
    (lambda: nn.TripletMarginLoss(margin=0.0), ValueError),
    (lambda: nn.L1Loss(reduction="avg"), ValueError),
])
def test_bad_arguments_raise(call, exc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(exc):
            call()
