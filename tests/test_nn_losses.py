"""Losses of ``mpitensor.nn``: ``binary_cross_entropy``, ``binary_cross_entropy_with_logits``,
``kl_div`` (and ``mse_loss``'s reductions) with their modules ``BCELoss``,
``BCEWithLogitsLoss``, ``KLDivLoss``.

Finite differences (float64, no torch needed) check every gradient; parity tests run the same
inputs through PyTorch (skipped where it is missing) in float64 (1e-10) and float32 (1e-5),
for every reduction, weights, extreme values and broadcasting.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F
from tests.test_nn_functional import _cpu_gpu_grads, _fd_check

RNG = np.random.default_rng(77)
TOL = {np.float32: 1e-5, np.float64: 1e-10}
DTYPES = [np.float32, np.float64]
REDUCTIONS = ["mean", "sum", "none"]


def _torch():
    return pytest.importorskip("torch")


def _np(t: mt.Tensor) -> np.ndarray:
    return np.asarray(t.detach()._data)


def _close(got, want, dtype, what="", equal_nan=False):
    tol = TOL[dtype]
    want = np.asarray(want)
    finite = want[np.isfinite(want)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=what,
                               equal_nan=equal_nan)


def _parity(mt_fn, th_fn, arrays, grad_idx, dtype, equal_nan=False):
    """Forward values and the gradients of inputs ``grad_idx`` in both libraries.

    ``arrays`` may hold None (an absent optional argument) and arrays already given their own
    dtype (left alone); float64 arrays are cast to ``dtype``.
    """
    torch = _torch()
    arrays = [None if a is None else (a.astype(dtype) if a.dtype == np.float64 else a)
              for a in arrays]
    ours = [None if a is None else mt.tensor(a, requires_grad=i in grad_idx)
            for i, a in enumerate(arrays)]
    theirs = [None if a is None else torch.tensor(a, requires_grad=i in grad_idx)
              for i, a in enumerate(arrays)]
    out = mt_fn(*ours)
    tout = th_fn(*theirs)
    g = RNG.standard_normal(tuple(out.shape)).astype(_np(out).dtype)
    out.backward(mt.tensor(g))
    tout.backward(torch.tensor(g))
    assert _np(out).dtype == tout.detach().numpy().dtype
    assert tuple(out.shape) == tuple(tout.shape)
    _close(_np(out), tout.detach().numpy(), dtype, "value", equal_nan)
    for i in grad_idx:
        _close(_np(ours[i].grad), theirs[i].grad.numpy(), dtype, f"gradient of argument {i}",
               equal_nan)


# --------------------------------------------------------------------------------------------
# binary_cross_entropy


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape,wshape", [((5,), None), ((3, 4), None), ((3, 4), (4,)),
                                          ((2, 3, 4), (3, 1)), ((2, 3), (2, 3)), ((), None)])
def test_binary_cross_entropy_matches_torch(dtype, reduction, shape, wshape):
    torch = _torch()
    x = RNG.uniform(0.02, 0.98, shape)
    t = RNG.uniform(0, 1, shape)
    w = RNG.uniform(0.5, 2, wshape) if wshape else None
    _parity(lambda a, b, c: F.binary_cross_entropy(a, b, c, reduction=reduction),
            lambda a, b, c: torch.nn.functional.binary_cross_entropy(a, b, c,
                                                                     reduction=reduction),
            [x, t, w], [0, 1], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_cross_entropy_at_0_and_1_is_clamped_like_torch(dtype):
    """log is clamped to >= -100 (finite losses) and the input gradient's denominator
    x(1 - x) to >= 1e-12; the target's gradient is -logit(x): infinite at 0 and 1."""
    x = np.array([0.0, 1.0, 0.0, 1.0, 1e-30, 0.5, 1e-8])
    t = np.array([1.0, 0.0, 0.0, 1.0, 0.3, 0.5, 0.9])
    _parity(lambda a, b: F.binary_cross_entropy(a, b, reduction="none"),
            lambda a, b: __import__("torch").nn.functional.binary_cross_entropy(
                a, b, reduction="none"), [x, t], [0, 1], dtype)
    out = _np(F.binary_cross_entropy(mt.tensor(x), mt.tensor(t), reduction="none"))
    assert out[0] == out[1] == 100.0


def test_binary_cross_entropy_finite_differences():
    x, t = RNG.uniform(0.1, 0.9, (3, 4)), RNG.uniform(0, 1, (3, 4))
    w = RNG.uniform(0.5, 2, (4,))
    for reduction in REDUCTIONS:
        _fd_check(lambda a, b, r=reduction: F.binary_cross_entropy(a, b, mt.tensor(w),
                                                                   reduction=r), [x, t], [0, 1])


def test_binary_cross_entropy_errors():
    x, t = mt.tensor([0.5, 0.2]), mt.tensor([1.0, 0.0])
    with pytest.raises(RuntimeError, match="input must lie in"):
        F.binary_cross_entropy(mt.tensor([1.5, 0.2]), t)
    with pytest.raises(RuntimeError, match="input must lie in"):
        F.binary_cross_entropy(mt.tensor([np.nan, 0.2]), t)
    with pytest.raises(RuntimeError, match="target must lie in"):
        F.binary_cross_entropy(x, mt.tensor([3.0, -1.0]))
    with pytest.raises(ValueError, match="target shape"):
        F.binary_cross_entropy(x, mt.tensor([1.0]))
    with pytest.raises(ValueError, match="target shape"):
        F.binary_cross_entropy(x.reshape(1, 2), t)
    with pytest.raises(RuntimeError, match="should be the same"):
        F.binary_cross_entropy(x, t.double())
    with pytest.raises(RuntimeError, match="does not broadcast"):
        F.binary_cross_entropy(x, t, weight=mt.ones(3))
    with pytest.raises(RuntimeError, match="no gradient"):
        F.binary_cross_entropy(x, t, weight=mt.ones(2, requires_grad=True))
    with pytest.raises(ValueError, match="reduction"):
        F.binary_cross_entropy(x, t, reduction="batchmean")
    with pytest.raises(RuntimeError, match="floating point"):
        F.binary_cross_entropy(mt.tensor([1, 0]), mt.tensor([1, 0]))
    with pytest.raises(TypeError, match="Tensor or a NumPy"):
        F.binary_cross_entropy([0.5], t)


# --------------------------------------------------------------------------------------------
# binary_cross_entropy_with_logits


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape,wshape,pshape", [((5,), None, None), ((3, 4), (4,), None),
                                                 ((3, 4), None, (4,)), ((2, 3, 4), (3, 1), (4,)),
                                                 ((2, 3), (2, 3), (1,)), ((), None, None)])
def test_bce_with_logits_matches_torch(dtype, reduction, shape, wshape, pshape):
    torch = _torch()
    x = RNG.standard_normal(shape) * 4
    t = RNG.uniform(0, 1, shape)
    w = RNG.uniform(0.5, 2, wshape) if wshape else None
    pw = RNG.uniform(0.5, 3, pshape) if pshape else None
    _parity(lambda a, b, c, d: F.binary_cross_entropy_with_logits(a, b, c, reduction=reduction,
                                                                  pos_weight=d),
            lambda a, b, c, d: torch.nn.functional.binary_cross_entropy_with_logits(
                a, b, c, reduction=reduction, pos_weight=d),
            [x, t, w, pw], [0, 1], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bce_with_logits_is_stable_for_extreme_logits(dtype):
    x = np.array([-1e4, -200.0, -50.0, 0.0, 30.0, 200.0, 1e4])
    t = np.array([0.2, 1.0, 0.0, 0.5, 1.0, 0.7, 0.0])
    pw = np.array([2.0])
    for p in (None, pw):
        _parity(lambda a, b, c: F.binary_cross_entropy_with_logits(a, b, reduction="none",
                                                                   pos_weight=c),
                lambda a, b, c: __import__("torch").nn.functional
                .binary_cross_entropy_with_logits(a, b, reduction="none", pos_weight=c),
                [x, t, p], [0, 1], dtype)
        out = F.binary_cross_entropy_with_logits(mt.tensor(x.astype(dtype)),
                                                 mt.tensor(t.astype(dtype)), reduction="none",
                                                 pos_weight=None if p is None else mt.tensor(
                                                     p.astype(dtype)))
        assert np.all(np.isfinite(_np(out)))


def test_bce_with_logits_promotes_mixed_dtypes_like_torch():
    """A float32 input with a float64 target gives a float64 loss; log(sigmoid(x)) is taken
    in the input's float32 first, as torch does, so the two agree to float32 precision."""
    torch = _torch()
    x = RNG.standard_normal((3, 2)).astype(np.float32)
    t = RNG.uniform(0, 1, (3, 2))
    xm, tm = mt.tensor(x, requires_grad=True), mt.tensor(t, requires_grad=True)
    xt, tt = torch.tensor(x, requires_grad=True), torch.tensor(t, requires_grad=True)
    out = F.binary_cross_entropy_with_logits(xm, tm, reduction="none")
    tout = torch.nn.functional.binary_cross_entropy_with_logits(xt, tt, reduction="none")
    assert out.dtype == mt.float64 and tout.dtype == torch.float64
    g = RNG.standard_normal((3, 2))
    out.backward(mt.tensor(g))
    tout.backward(torch.tensor(g))
    _close(_np(out), tout.detach().numpy(), np.float32, "value")
    assert xm.grad.dtype == mt.float32 and tm.grad.dtype == mt.float64
    _close(_np(xm.grad), xt.grad.numpy(), np.float32, "input gradient")
    _close(_np(tm.grad), tt.grad.numpy(), np.float32, "target gradient")


def test_bce_with_logits_equals_bce_of_sigmoid():
    x = RNG.standard_normal((4, 3))
    t = RNG.uniform(0, 1, (4, 3))
    a = F.binary_cross_entropy_with_logits(mt.tensor(x), mt.tensor(t))
    b = F.binary_cross_entropy(mt.tensor(1 / (1 + np.exp(-x))), mt.tensor(t))
    np.testing.assert_allclose(float(a), float(b), rtol=1e-12)


def test_bce_with_logits_finite_differences():
    x, t = RNG.standard_normal((3, 4)) * 3, RNG.uniform(0, 1, (3, 4))
    w, pw = RNG.uniform(0.5, 2, (3, 1)), RNG.uniform(0.5, 3, (4,))
    for reduction in REDUCTIONS:
        _fd_check(lambda a, b, r=reduction: F.binary_cross_entropy_with_logits(
            a, b, mt.tensor(w), reduction=r, pos_weight=mt.tensor(pw)), [x, t], [0, 1])
        _fd_check(lambda a, b, r=reduction: F.binary_cross_entropy_with_logits(a, b, reduction=r),
                  [x, t], [0, 1])


def test_bce_with_logits_errors():
    x, t = mt.tensor([0.5, 0.2]), mt.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match="must equal the input shape"):
        F.binary_cross_entropy_with_logits(x, mt.tensor([1.0]))
    with pytest.raises(RuntimeError, match="pos_weight of shape"):
        F.binary_cross_entropy_with_logits(x.reshape(1, 2), t.reshape(1, 2),
                                           pos_weight=mt.ones(3))
    with pytest.raises(RuntimeError, match="no gradient"):
        F.binary_cross_entropy_with_logits(x, t, pos_weight=mt.ones(2, requires_grad=True))
    with pytest.raises(RuntimeError, match="no gradient"):
        F.binary_cross_entropy_with_logits(x, t, weight=mt.ones(2, requires_grad=True))
    with pytest.raises(ValueError, match="reduction"):
        F.binary_cross_entropy_with_logits(x, t, reduction="avg")
    with pytest.raises(RuntimeError, match="floating point"):
        F.binary_cross_entropy_with_logits(mt.tensor([1, 2]), t)


# --------------------------------------------------------------------------------------------
# kl_div


def _kl_torch(reduction, log_target):
    def fn(a, b):
        torch = _torch()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's note on reduction='mean'
            return torch.nn.functional.kl_div(a, b, reduction=reduction, log_target=log_target)
    return fn


def _kl_ours(reduction, log_target):
    def fn(a, b):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return F.kl_div(a, b, reduction=reduction, log_target=log_target)
    return fn


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS + ["batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
@pytest.mark.parametrize("xshape,tshape", [((4, 5), (4, 5)), ((2, 3, 4), (2, 3, 4)),
                                           ((3, 4), (4,)), ((4,), (3, 4)), ((), ())])
def test_kl_div_matches_torch(dtype, reduction, log_target, xshape, tshape):
    x = np.log(RNG.dirichlet(np.ones(xshape[-1]), xshape[:-1] or None)) if xshape else \
        np.array(-0.7)
    p = RNG.dirichlet(np.ones(tshape[-1]), tshape[:-1] or None) if tshape else np.array(0.4)
    t = np.log(p) if log_target else p
    _parity(_kl_ours(reduction, log_target), _kl_torch(reduction, log_target), [x, t], [0, 1],
            dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_kl_div_zero_targets_like_torch(dtype):
    """t log t is 0 where t == 0 (the loss and the input's gradient are finite); the target's
    gradient there is nan in torch (0/0), and so it is here."""
    x = np.log(np.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]]))
    t = np.array([[0.0, 0.4, 0.6], [0.5, 0.0, 0.5]])
    _parity(_kl_ours("sum", False), _kl_torch("sum", False), [x, t], [0, 1], dtype,
            equal_nan=True)
    assert np.isfinite(float(F.kl_div(mt.tensor(x), mt.tensor(t), reduction="sum")))


def test_kl_div_finite_differences():
    x = np.log(RNG.dirichlet(np.ones(4), 3))
    p = RNG.dirichlet(np.ones(4), 3)
    for reduction in REDUCTIONS + ["batchmean"]:
        _fd_check(_kl_ours(reduction, False), [x, p], [0, 1])
        _fd_check(_kl_ours(reduction, True), [x, np.log(p)], [0, 1])
    _fd_check(_kl_ours("sum", False), [x, p[0]], [0, 1])  # a broadcast target


def test_kl_div_warnings_and_errors():
    x, t = mt.zeros(2, 3), mt.ones(2, 3) / 3
    with pytest.warns(UserWarning, match="batchmean"):
        F.kl_div(x, t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.kl_div(x, t, reduction="batchmean")
        F.kl_div(x, t, reduction="sum")
    with pytest.raises(ValueError, match="reduction"):
        F.kl_div(x, t, reduction="avg")
    with pytest.raises(RuntimeError, match="do not broadcast"):
        F.kl_div(mt.zeros(3, 4), mt.ones(2, 4))
    with pytest.raises(RuntimeError, match="floating point"):
        F.kl_div(mt.zeros(2, dtype=mt.int64), t)


# --------------------------------------------------------------------------------------------
# mse_loss (already there): every reduction, against torch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_mse_loss_reductions_match_torch(dtype, reduction):
    torch = _torch()
    x, y = RNG.standard_normal((3, 5)), RNG.standard_normal((3, 5))
    _parity(lambda a, b: F.mse_loss(a, b, reduction=reduction),
            lambda a, b: torch.nn.functional.mse_loss(a, b, reduction=reduction), [x, y], [0, 1],
            dtype)
    m, tm = nn.MSELoss(reduction=reduction), torch.nn.MSELoss(reduction=reduction)
    _parity(lambda a, b: m(a, b), lambda a, b: tm(a, b), [x, y], [0, 1], dtype)


# --------------------------------------------------------------------------------------------
# modules


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_loss_modules_match_torch(reduction):
    torch = _torch()
    x, t = RNG.uniform(0.05, 0.95, (4, 3)), RNG.uniform(0, 1, (4, 3))
    w, pw = RNG.uniform(0.5, 2, (3,)), RNG.uniform(0.5, 3, (3,))
    pairs = [
        (nn.BCELoss(reduction=reduction), torch.nn.BCELoss(reduction=reduction)),
        (nn.BCELoss(mt.tensor(w), reduction=reduction),
         torch.nn.BCELoss(torch.tensor(w), reduction=reduction)),
        (nn.BCEWithLogitsLoss(reduction=reduction),
         torch.nn.BCEWithLogitsLoss(reduction=reduction)),
        (nn.BCEWithLogitsLoss(mt.tensor(w), reduction=reduction, pos_weight=mt.tensor(pw)),
         torch.nn.BCEWithLogitsLoss(torch.tensor(w), reduction=reduction,
                                    pos_weight=torch.tensor(pw))),
        (nn.KLDivLoss(reduction=reduction), torch.nn.KLDivLoss(reduction=reduction)),
        (nn.KLDivLoss(reduction="batchmean", log_target=True),
         torch.nn.KLDivLoss(reduction="batchmean", log_target=True)),
    ]
    for m, tm in pairs:
        assert repr(m) == repr(tm)
        assert list(m.state_dict()) == list(tm.state_dict())
        assert m.reduction == tm.reduction
        args = [np.log(x), t] if isinstance(m, nn.KLDivLoss) else [x, t]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _parity(m, tm, args, [0, 1], np.float64)


def test_loss_module_arguments():
    with pytest.raises(ValueError, match="reduction"):
        nn.BCELoss(reduction="batchmean")
    with pytest.raises(ValueError, match="reduction"):
        nn.KLDivLoss(reduction="avg")
    with pytest.raises(TypeError, match="weight"):
        nn.BCELoss(weight=[1.0, 2.0])
    with pytest.raises(TypeError, match="pos_weight"):
        nn.BCEWithLogitsLoss(pos_weight=np.ones(3))
    with pytest.warns(UserWarning, match="deprecated"):
        assert nn.KLDivLoss(size_average=False).reduction == "sum"
    m = nn.BCEWithLogitsLoss(pos_weight=mt.ones(3))
    assert list(m.state_dict()) == ["pos_weight"]


# --------------------------------------------------------------------------------------------
# GPU (CuPy): the same kernels, the same results


_T = np.random.default_rng(9).uniform(0, 1, (4, 3))
GPU_CASES = {
    "bce": (lambda x: F.binary_cross_entropy(x.sigmoid(), mt.tensor(_T, device=x.device)),
            [(4, 3)]),
    "bce_logits": (lambda x: F.binary_cross_entropy_with_logits(
        x, mt.tensor(_T, device=x.device), pos_weight=mt.ones(3, dtype=x.dtype,
                                                               device=x.device) * 2), [(4, 3)]),
    "kl_div": (lambda x: F.kl_div(x.log_softmax(1), mt.tensor(_T, device=x.device),
                                  reduction="batchmean"), [(4, 3)]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_gpu_matches_cpu(name):
    fn, shapes = GPU_CASES[name]
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s) for s in shapes]
    (cv, cg), (gv, gg) = _cpu_gpu_grads(fn, arrays)
    np.testing.assert_allclose(gv, cv, rtol=1e-10, atol=1e-12)
    for a, b in zip(cg, gg):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
