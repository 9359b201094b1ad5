"""Normalisation, adaptive pooling and channel dropout: ``nn.BatchNorm1d/2d``, ``GroupNorm``,
``LayerNorm``, ``AdaptiveAvgPool1d/2d``, ``Dropout2d`` and their ``nn.functional`` forms.

Finite differences (float64, no torch needed) check every gradient; parity tests run the same
inputs through PyTorch (skipped where it is missing) in float64 (1e-10) and float32 (1e-5),
for several shapes, options and memory layouts (conv2d's batch-innermost one included), and
compare running statistics over several training steps, ``state_dict`` keys and values, and a
small ResNet-style block end to end.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F
from tests.test_nn_functional import _cpu_gpu_grads, _fd_check

RNG = np.random.default_rng(2024)
TOL = {np.float32: 1e-5, np.float64: 1e-10}
DTYPES = [np.float32, np.float64]


def _torch():
    return pytest.importorskip("torch")


def _np(t: mt.Tensor) -> np.ndarray:
    return np.asarray(t.detach()._data)


def _laid_out(a: np.ndarray, layout: str) -> np.ndarray:
    """``a`` (N, C, ...) with the same values in another memory layout."""
    if layout == "nchw":
        return np.ascontiguousarray(a)
    if layout == "batch_inner":  # conv2d's outputs: (C, *S, N) in memory
        order = (*range(1, a.ndim), 0)
        return np.ascontiguousarray(a.transpose(order)).transpose(np.argsort(order))
    if layout == "channels_last":  # (N, *S, C) in memory
        order = (0, *range(2, a.ndim), 1)
        return np.ascontiguousarray(a.transpose(order)).transpose(np.argsort(order))
    if layout == "strided":  # not dense in any order: every other element of a bigger array
        big = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
        big[..., ::2] = a
        return big[..., ::2]
    raise ValueError(layout)


def _leaf(a: np.ndarray) -> mt.Tensor:
    """A leaf that requires grad and keeps ``a``'s memory layout (no copy)."""
    t = mt.Tensor(a)
    t.requires_grad_(True)
    return t


def _close(got, want, dtype, what="", cond=1.0):
    tol = TOL[dtype]
    want = np.asarray(want)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale * cond, err_msg=what)


def _run_both(mt_fn, th_fn, arrays, layouts=None, dtype=np.float64, g=None):
    """Forward and backward in mpitensor and torch; return (mt out, mt grads, th out, th grads).

    ``arrays`` are float arrays (all get gradients) or None; ``layouts`` lays each one out in
    memory for mpitensor (torch always gets contiguous copies).
    """
    torch = _torch()
    arrays = [None if a is None else a.astype(dtype) for a in arrays]
    layouts = layouts or ["nchw"] * len(arrays)
    leaves = [None if a is None else _leaf(_laid_out(a, lay) if a.ndim >= 2 else a.copy())
              for a, lay in zip(arrays, layouts)]
    out = mt_fn(*leaves)
    if g is None:
        g = RNG.standard_normal(tuple(out.shape)).astype(dtype)
    out.backward(mt.tensor(g))
    tleaves = [None if a is None else torch.tensor(a, requires_grad=True) for a in arrays]
    tout = th_fn(*tleaves)
    tout.backward(torch.tensor(g))
    grads = [None if t is None else _np(t.grad) for t in leaves]
    tgrads = [None if t is None else t.grad.numpy() for t in tleaves]
    return _np(out), grads, tout.detach().numpy(), tgrads


def _assert_parity(mt_fn, th_fn, arrays, dtype, layouts=None, grad_cond=1.0):
    """Same values and gradients; ``grad_cond`` widens the gradients' tolerance for inputs
    whose gradients cancel (see :func:`_group_condition`)."""
    out, grads, tout, tgrads = _run_both(mt_fn, th_fn, arrays, layouts, dtype)
    assert out.dtype == tout.dtype
    _close(out, tout, dtype, "output")
    for i, (a, b) in enumerate(zip(grads, tgrads)):
        if b is not None:
            _close(a, b, dtype, f"gradient of input {i}", grad_cond)


def _group_condition(x: np.ndarray, groups: int) -> float:
    """max |mean| / std over the normalisation groups of ``x``: how much the input gradient
    (a difference of terms of size |x| / std, in both libraries) loses to cancellation."""
    xg = x.reshape(x.shape[0], groups, -1)
    return float(max(1.0, (np.abs(xg.mean(axis=2)) / xg.std(axis=2)).max()))


# --------------------------------------------------------------------------------------------
# batch norm: functional


BN_SHAPES = [(6, 3), (4, 3, 7), (4, 3, 5, 6), (2, 5, 3, 3), (3, 2, 1, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
@pytest.mark.parametrize("layout", ["nchw", "batch_inner", "channels_last", "strided"])
def test_batch_norm_training_matches_torch(dtype, shape, affine, layout):
    torch = _torch()
    C = shape[1]
    x = RNG.standard_normal(shape) * 3 + 2
    w = RNG.uniform(0.5, 1.5, C) if affine != "none" else None
    b = RNG.standard_normal(C) if affine == "both" else None
    rm, rv = RNG.standard_normal(C).astype(dtype), RNG.uniform(0.5, 2, C).astype(dtype)
    mrm, mrv = mt.tensor(rm), mt.tensor(rv)
    trm, trv = torch.tensor(rm), torch.tensor(rv)
    _assert_parity(
        lambda x_, w_, b_: F.batch_norm(x_, mrm, mrv, w_, b_, training=True, momentum=0.3),
        lambda x_, w_, b_: torch.nn.functional.batch_norm(x_, trm, trv, w_, b_, training=True,
                                                          momentum=0.3),
        [x, w, b], dtype, [layout, "nchw", "nchw"])
    _close(_np(mrm), trm.numpy(), dtype, "running_mean")
    _close(_np(mrv), trv.numpy(), dtype, "running_var")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("layout", ["nchw", "batch_inner"])
def test_batch_norm_eval_matches_torch(dtype, shape, layout):
    torch = _torch()
    C = shape[1]
    x = RNG.standard_normal(shape)
    rm, rv = RNG.standard_normal(C).astype(dtype), RNG.uniform(0.5, 2, C).astype(dtype)
    _assert_parity(
        lambda x_, w_, b_: F.batch_norm(x_, mt.tensor(rm), mt.tensor(rv), w_, b_, eps=1e-3),
        lambda x_, w_, b_: torch.nn.functional.batch_norm(x_, torch.tensor(rm),
                                                          torch.tensor(rv), w_, b_, eps=1e-3),
        [x, RNG.standard_normal(C), RNG.standard_normal(C)], dtype, [layout, "nchw", "nchw"])


def test_batch_norm_without_running_stats_and_raw_arrays():
    x = RNG.standard_normal((5, 2, 3))
    out = F.batch_norm(x, None, None, training=True)  # raw arrays are accepted
    mean = x.mean(axis=(0, 2), keepdims=True)
    var = x.var(axis=(0, 2), keepdims=True)
    np.testing.assert_allclose(_np(out), (x - mean) / np.sqrt(var + 1e-5), rtol=1e-12)


@pytest.mark.parametrize("layout", ["nchw", "batch_inner", "channels_last"])
def test_batch_norm_keeps_the_memory_layout(layout):
    x = _leaf(_laid_out(RNG.standard_normal((4, 3, 5, 6)), layout))
    h = x * 1  # a non-leaf, so that its gradient is seen as batch norm's backward made it
    seen = []
    h.register_hook(lambda g: seen.append(g))
    out = F.batch_norm(h, None, None, training=True)

    def order(a):
        return tuple(int(i) for i in np.argsort([-s for s in a.strides], kind="stable"))

    assert order(h._data) == order(x._data)
    assert order(out._data) == order(x._data)
    out.backward(mt.tensor(_laid_out(RNG.standard_normal((4, 3, 5, 6)), layout)))
    assert order(seen[0]._data) == order(x._data)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(5, 2), (3, 2, 4), (2, 3, 3, 2)])
def test_batch_norm_finite_differences(training, shape):
    C = shape[1]
    x = RNG.standard_normal(shape)
    w, b = RNG.uniform(0.5, 1.5, C), RNG.standard_normal(C)
    rm, rv = RNG.standard_normal(C), RNG.uniform(0.5, 2.0, C)

    def fn(x_, w_, b_):
        # fresh copies: a training call updates the running statistics in place
        return F.batch_norm(x_, mt.tensor(rm.copy()), mt.tensor(rv.copy()), w_, b_,
                            training=training)

    _fd_check(fn, [x, w, b], [0, 1, 2])


@pytest.mark.parametrize("offset", [100.0, 1000.0])
def test_batch_norm_float32_keeps_its_accuracy_far_from_zero(offset):
    """Inputs whose mean is far above their spread (un-normalised data into the first norm
    layer): float32 output, gradients and running statistics stay within float32 rounding of
    a float64 computation, as torch's do (measured, torch 2.13 float32 at offset 1000: input
    grad 7.5e-7, weight grad 1.9e-5). An uncentred mean and sum(g * x_hat) lost up to ~3e-4."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((16, 8, 10, 10)) * 2.0 + offset).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    got, want = {}, {}
    for dtype, out in ((np.float32, got), (np.float64, want)):
        m = nn.BatchNorm2d(8).to(dtype=mt.float32 if dtype == np.float32 else mt.float64)
        xt = mt.tensor(x.astype(dtype), requires_grad=True)
        y = m(xt)
        (y * mt.tensor(g.astype(dtype))).sum().backward()
        out.update(y=y.detach().numpy(), dx=xt.grad.numpy(), dw=m.weight.grad.numpy(),
                   db=m.bias.grad.numpy(), rm=m.running_mean.numpy(), rv=m.running_var.numpy())
    bounds = {"y": 2e-6, "dx": 2e-6, "dw": 4e-5, "db": 1e-6, "rm": 1e-6, "rv": 2e-5}
    for key, bound in bounds.items():
        err = np.abs(got[key] - want[key]).max() / np.abs(want[key]).max()
        assert err < bound, f"{key}: relative error {err:.2e} (bound {bound:.0e})"


def test_batch_norm_errors():
    x = mt.randn(4, 3, 2)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(mt.randn(1, 3), None, None, training=True)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(mt.randn(1, 3, 1, 1), mt.zeros(3), mt.ones(3), training=True)
    F.batch_norm(mt.randn(1, 3), mt.zeros(3), mt.ones(3))  # evaluation needs no variance
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        F.batch_norm(mt.randn(4), None, None, training=True)
    with pytest.raises(RuntimeError, match="running_mean is None"):
        F.batch_norm(x, None, mt.ones(3))
    for kw in (dict(weight=mt.ones(4)), dict(bias=mt.ones(2)), dict(running_mean=mt.zeros(4)),
               dict(running_var=mt.ones(3, 1))):
        args = dict(running_mean=None, running_var=None, training=True)
        args.update(kw)
        with pytest.raises(RuntimeError, match="one value per channel"):
            F.batch_norm(x, **args)
    with pytest.raises(RuntimeError, match="should be the same"):
        F.batch_norm(x, None, None, mt.ones(3, dtype=mt.float64), training=True)
    with pytest.raises(RuntimeError, match="floating point"):
        F.batch_norm(mt.ones(4, 3, dtype=mt.int64), None, None, training=True)
    with pytest.raises(TypeError, match="Tensor or a NumPy"):
        F.batch_norm([[1.0, 2.0]], None, None, training=True)


def test_batch_norm_empty_batch_leaves_the_statistics_alone():
    rm, rv = mt.zeros(3), mt.ones(3)
    out = F.batch_norm(mt.zeros(0, 3, 2), rm, rv, training=True)
    assert tuple(out.shape) == (0, 3, 2)
    np.testing.assert_array_equal(_np(rm), 0)
    np.testing.assert_array_equal(_np(rv), 1)


# --------------------------------------------------------------------------------------------
# batch norm: modules


def _pair_modules(mt_cls, th_cls, *args, dtype=np.float64, **kwargs):
    """The same module in both libraries, the torch one's random-ish state copied across."""
    torch = _torch()
    tm = th_cls(*args, **kwargs).to(getattr(torch, np.dtype(dtype).name))
    with torch.no_grad():
        for p in tm.parameters():
            p.copy_(torch.tensor(RNG.uniform(0.5, 1.5, tuple(p.shape))))
    m = mt_cls(*args, **kwargs, dtype=dtype)
    m.load_state_dict({k: v.numpy() for k, v in tm.state_dict().items()})
    return m, tm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (8, 4)), ("BatchNorm1d", (6, 4, 5)),
                                       ("BatchNorm2d", (4, 4, 3, 5))])
@pytest.mark.parametrize("momentum", [0.1, 0.5, None])
@pytest.mark.parametrize("options", [{}, dict(affine=False), dict(bias=False),
                                     dict(track_running_stats=False)])
def test_batch_norm_module_over_several_steps_matches_torch(dtype, cls, shape, momentum,
                                                            options):
    torch = _torch()
    C = shape[1]
    m, tm = _pair_modules(getattr(nn, cls), getattr(torch.nn, cls), C, momentum=momentum,
                          dtype=dtype, **options)
    for step in range(4):
        x = (RNG.standard_normal(shape) * (step + 1) + step).astype(dtype)
        _assert_parity(m, tm, [x], dtype, ["batch_inner" if step % 2 else "nchw"])
        mine, theirs = m.state_dict(), tm.state_dict()
        assert list(mine) == list(theirs)
        for k in theirs:
            _close(_np(mine[k]), theirs[k].numpy(), dtype, k)
            assert _np(mine[k]).dtype == theirs[k].numpy().dtype, k
    m.eval()
    tm.eval()
    x = RNG.standard_normal(shape)
    _assert_parity(m, tm, [x], dtype)
    for k, v in tm.state_dict().items():
        _close(_np(m.state_dict()[k]), v.numpy(), dtype, k)  # eval changes no statistics


def test_batch_norm_state_dict_layout_and_torch_round_trip():
    torch = _torch()
    for ours, theirs in ((nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)),
                         (nn.BatchNorm1d(3, affine=False), torch.nn.BatchNorm1d(3, affine=False)),
                         (nn.BatchNorm2d(3, track_running_stats=False),
                          torch.nn.BatchNorm2d(3, track_running_stats=False)),
                         (nn.BatchNorm2d(3, bias=False), torch.nn.BatchNorm2d(3, bias=False))):
        sd, tsd = ours.state_dict(), theirs.state_dict()
        assert list(sd) == list(tsd)
        for k in tsd:
            np.testing.assert_array_equal(_np(sd[k]), tsd[k].numpy())
            assert _np(sd[k]).dtype == tsd[k].numpy().dtype
            assert tuple(sd[k].shape) == tuple(tsd[k].shape)
        assert repr(ours) == repr(theirs)
        assert [n for n, _ in ours.named_parameters()] == \
            [n for n, _ in theirs.named_parameters()]
    # a trained torch model's statistics load into ours and give its evaluation output
    tm = torch.nn.BatchNorm2d(3).double()
    for _ in range(3):
        tm(torch.randn(4, 3, 2, 2, dtype=torch.float64) * 2 + 1)
    tm.eval()
    m = nn.BatchNorm2d(3, dtype=mt.float64)
    m.load_state_dict(tm.state_dict())
    assert int(m.num_batches_tracked) == 3
    x = RNG.standard_normal((2, 3, 2, 2))
    np.testing.assert_allclose(_np(m.eval()(mt.tensor(x))),
                               tm(torch.tensor(x)).detach().numpy(), rtol=1e-12, atol=1e-12)
    # and ours back into torch
    m2 = nn.BatchNorm2d(3, dtype=mt.float64)
    m2(mt.randn(4, 3, 2, 2, dtype=mt.float64))
    tm2 = torch.nn.BatchNorm2d(3).double()
    tm2.load_state_dict({k: torch.tensor(_np(v)) for k, v in m2.state_dict().items()})
    assert int(tm2.num_batches_tracked) == 1


def test_batch_norm_module_behaviour():
    bn = nn.BatchNorm2d(2, momentum=None)
    assert bn.running_mean.dtype == mt.float32 and bn.num_batches_tracked.dtype == mt.int64
    x1 = mt.randn(4, 2, 3, 3) + 1
    x2 = mt.randn(4, 2, 3, 3) * 2 - 3
    bn(x1)
    bn(x2)
    expect = (_np(x1).mean(axis=(0, 2, 3)) + _np(x2).mean(axis=(0, 2, 3))) / 2
    np.testing.assert_allclose(_np(bn.running_mean), expect, rtol=1e-5, atol=1e-6)
    assert int(bn.num_batches_tracked) == 2
    bn.eval()
    before = _np(bn.running_mean).copy()
    bn(x1)
    np.testing.assert_array_equal(_np(bn.running_mean), before)
    assert int(bn.num_batches_tracked) == 2
    bn.reset_running_stats()
    np.testing.assert_array_equal(_np(bn.running_mean), 0)
    np.testing.assert_array_equal(_np(bn.running_var), 1)
    assert int(bn.num_batches_tracked) == 0
    assert bn.double().num_batches_tracked.dtype == mt.int64  # only floats are recast
    # eval without tracked statistics normalises with the batch's own
    free = nn.BatchNorm1d(3, track_running_stats=False).eval()
    x = mt.randn(5, 3)
    xs = _np(x)
    np.testing.assert_allclose(_np(free(x)), (xs - xs.mean(0)) / np.sqrt(xs.var(0) + 1e-5),
                               rtol=1e-4, atol=1e-5)
    one = nn.BatchNorm1d(3)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        one(mt.randn(1, 3))
    one.eval()(mt.randn(1, 3))


def test_batch_norm_module_errors():
    with pytest.raises(ValueError, match="expected a 4D input"):
        nn.BatchNorm2d(3)(mt.randn(2, 3, 4))
    with pytest.raises(ValueError, match="expected a 2D or 3D input"):
        nn.BatchNorm1d(3)(mt.randn(2, 3, 4, 4))
    with pytest.raises(RuntimeError, match="one value per channel"):
        nn.BatchNorm2d(3)(mt.randn(2, 4, 3, 3))
    for bad in (0, -1, 2.5, "3", True):
        with pytest.raises(ValueError, match="num_features"):
            nn.BatchNorm2d(bad)
    with pytest.raises(ValueError, match="eps"):
        nn.BatchNorm2d(3, eps=-1.0)
    with pytest.raises(ValueError, match="momentum"):
        nn.BatchNorm2d(3, momentum="fast")
    with pytest.raises(TypeError, match="floating point"):
        nn.BatchNorm2d(3, dtype=mt.int64)


# --------------------------------------------------------------------------------------------
# group norm


GN_CASES = [((2, 6, 4, 5), 1), ((2, 6, 4, 5), 2), ((2, 6, 4, 5), 3), ((2, 6, 4, 5), 6),
            ((3, 4), 2), ((2, 4, 7), 4), ((1, 8, 2, 2, 3), 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups", GN_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_matches_torch(dtype, shape, groups, affine):
    torch = _torch()
    C = shape[1]
    x = RNG.standard_normal(shape) * 2 + 1
    params = [RNG.uniform(0.5, 1.5, C), RNG.standard_normal(C)] if affine else [None, None]
    for layout in ("nchw", "batch_inner", "strided"):
        _assert_parity(lambda x_, w_, b_: F.group_norm(x_, groups, w_, b_, eps=1e-4),
                       lambda x_, w_, b_: torch.nn.functional.group_norm(x_, groups, w_, b_,
                                                                         eps=1e-4),
                       [x, *params], dtype, [layout, "nchw", "nchw"],
                       grad_cond=_group_condition(x, groups))


def test_group_norm_module_matches_torch():
    torch = _torch()
    for kwargs in ({}, dict(affine=False), dict(bias=False)):
        m, tm = _pair_modules(nn.GroupNorm, torch.nn.GroupNorm, 2, 6, **kwargs)
        _assert_parity(m, tm, [RNG.standard_normal((3, 6, 4, 4))], np.float64)
        assert repr(m) == repr(tm)
        assert list(m.state_dict()) == list(tm.state_dict())


@pytest.mark.parametrize("shape,groups", [((2, 4, 3), 2), ((2, 6, 2, 2), 3), ((3, 2), 1)])
def test_group_norm_finite_differences(shape, groups):
    C = shape[1]
    arrays = [RNG.standard_normal(shape), RNG.uniform(0.5, 1.5, C), RNG.standard_normal(C)]
    _fd_check(lambda x_, w_, b_: F.group_norm(x_, groups, w_, b_), arrays, [0, 1, 2])
    _fd_check(lambda x_: F.group_norm(x_, groups), arrays[:1], [0])


def test_group_norm_errors():
    with pytest.raises(RuntimeError, match="cannot be split"):
        F.group_norm(mt.randn(2, 6, 3), 4)
    with pytest.raises(ValueError, match="num_groups"):
        F.group_norm(mt.randn(2, 6, 3), 0)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        F.group_norm(mt.randn(6), 2)
    with pytest.raises(RuntimeError, match="one value per channel"):
        F.group_norm(mt.randn(2, 6, 3), 2, mt.ones(3))
    with pytest.raises(ValueError, match="divisible"):
        nn.GroupNorm(4, 6)
    with pytest.raises(ValueError, match="num_channels"):
        nn.GroupNorm(2, 0)


# --------------------------------------------------------------------------------------------
# layer norm


LN_CASES = [((4, 5), 5), ((2, 3, 4), [4]), ((2, 3, 4), (3, 4)), ((2, 3, 4, 5), [3, 4, 5]),
            ((7,), 7)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,normalized", LN_CASES)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_layer_norm_matches_torch(dtype, shape, normalized, affine):
    torch = _torch()
    ns = (normalized,) if isinstance(normalized, int) else tuple(normalized)
    x = RNG.standard_normal(shape) * 3 - 1
    w = RNG.uniform(0.5, 1.5, ns) if affine != "none" else None
    b = RNG.standard_normal(ns) if affine == "both" else None
    _assert_parity(lambda x_, w_, b_: F.layer_norm(x_, normalized, w_, b_),
                   lambda x_, w_, b_: torch.nn.functional.layer_norm(x_, ns, w_, b_),
                   [x, w, b], dtype, ["batch_inner" if x.ndim > 2 else "nchw", "nchw", "nchw"])


def test_layer_norm_module_matches_torch():
    torch = _torch()
    for args, kwargs in (((8,), {}), (([3, 8],), dict(bias=False)),
                         ((8,), dict(elementwise_affine=False))):
        m, tm = _pair_modules(nn.LayerNorm, torch.nn.LayerNorm, *args, **kwargs)
        _assert_parity(m, tm, [RNG.standard_normal((2, 3, 8))], np.float64)
        assert repr(m) == repr(tm)
        assert list(m.state_dict()) == list(tm.state_dict())


def test_layer_norm_finite_differences():
    arrays = [RNG.standard_normal((3, 2, 4)), RNG.uniform(0.5, 1.5, (2, 4)),
              RNG.standard_normal((2, 4))]
    _fd_check(lambda x_, w_, b_: F.layer_norm(x_, (2, 4), w_, b_), arrays, [0, 1, 2])
    _fd_check(lambda x_: F.layer_norm(x_, 4), arrays[:1], [0])


def test_layer_norm_errors():
    with pytest.raises(RuntimeError, match="trailing shape"):
        F.layer_norm(mt.randn(2, 5), (4,))
    with pytest.raises(RuntimeError, match="trailing shape"):
        F.layer_norm(mt.randn(4), (2, 4))
    with pytest.raises(RuntimeError, match="weight must have shape"):
        F.layer_norm(mt.randn(2, 4), (4,), weight=mt.ones(3))
    with pytest.raises(TypeError, match="normalized_shape"):
        nn.LayerNorm(2.5)
    with pytest.raises(ValueError, match="normalized_shape"):
        nn.LayerNorm(0)
    with pytest.raises(ValueError, match="normalized_shape"):
        nn.LayerNorm([])


# --------------------------------------------------------------------------------------------
# adaptive average pooling


POOL_CASES = [((2, 3, 8, 8), 1), ((2, 3, 8, 8), (2, 4)), ((2, 3, 7, 9), (3, 4)),
              ((2, 3, 7, 9), (None, 2)), ((2, 3, 7, 9), (7, 9)), ((2, 3, 5, 6), (8, 11)),
              ((3, 6, 5), 2), ((1, 2, 10, 10), (3, 3)), ((4, 2, 9, 9), 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,size", POOL_CASES)
@pytest.mark.parametrize("layout", ["nchw", "batch_inner", "strided"])
def test_adaptive_avg_pool2d_matches_torch(dtype, shape, size, layout):
    torch = _torch()
    x = RNG.standard_normal(shape)
    _assert_parity(lambda x_: F.adaptive_avg_pool2d(x_, size),
                   lambda x_: torch.nn.functional.adaptive_avg_pool2d(x_, size), [x], dtype,
                   [layout])
    out = F.adaptive_avg_pool2d(mt.tensor(_laid_out(x, layout)), size)
    assert out._data.flags.c_contiguous  # so .view(N, -1) works, as after torch's


@pytest.mark.parametrize("size", [(0, 2), 0])
def test_adaptive_avg_pool2d_empty_output(size):
    torch = _torch()
    x = RNG.standard_normal((2, 3, 4, 4))
    out = F.adaptive_avg_pool2d(mt.tensor(x), size)
    assert tuple(out.shape) == tuple(torch.nn.functional.adaptive_avg_pool2d(
        torch.tensor(x), size).shape)


def test_adaptive_avg_pool2d_bins_follow_torch():
    """Bins overlap when the output does not divide the input: cell i of n -> m covers
    positions floor(i*n/m) .. ceil((i+1)*n/m) - 1."""
    x = np.arange(5.0).reshape(1, 1, 1, 5)
    out = _np(F.adaptive_avg_pool2d(mt.tensor(x), (1, 3)))
    np.testing.assert_allclose(out.ravel(), [np.mean([0, 1]), np.mean([1, 2, 3]),
                                             np.mean([3, 4])])


@pytest.mark.parametrize("shape,size", [((2, 2, 5, 7), (3, 2)), ((2, 2, 6, 4), (3, 2)),
                                        ((2, 2, 4, 4), 1), ((2, 2, 3, 3), 5)])
def test_adaptive_avg_pool2d_finite_differences(shape, size):
    x = RNG.standard_normal(shape)
    _fd_check(lambda x_: F.adaptive_avg_pool2d(x_, size), [x], [0])
    # the batch-innermost path gives the same gradient, in its own layout
    x2 = _leaf(_laid_out(x, "batch_inner"))
    out = F.adaptive_avg_pool2d(x2, size)
    g = RNG.standard_normal(tuple(out.shape))
    out.backward(mt.tensor(g))
    ref = _leaf(x.copy())
    F.adaptive_avg_pool2d(ref, size).backward(mt.tensor(g))
    np.testing.assert_allclose(_np(x2.grad), _np(ref.grad), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,size", [((2, 3, 10), 4), ((2, 3, 8), 1), ((3, 7), 3),
                                        ((2, 3, 4), 6)])
def test_adaptive_avg_pool1d_matches_torch(dtype, shape, size):
    torch = _torch()
    _assert_parity(lambda x_: F.adaptive_avg_pool1d(x_, size),
                   lambda x_: torch.nn.functional.adaptive_avg_pool1d(x_, size),
                   [RNG.standard_normal(shape)], dtype)
    m, tm = nn.AdaptiveAvgPool1d(size), torch.nn.AdaptiveAvgPool1d(size)
    assert repr(m) == repr(tm)


def test_adaptive_avg_pool_modules_and_errors():
    torch = _torch()
    for size in (1, (2, 3), (None, 2)):
        m, tm = nn.AdaptiveAvgPool2d(size), torch.nn.AdaptiveAvgPool2d(size)
        assert repr(m) == repr(tm)
        x = RNG.standard_normal((2, 3, 6, 7))
        np.testing.assert_allclose(_np(m(mt.tensor(x))), tm(torch.tensor(x)).numpy(),
                                   rtol=1e-12)
    with pytest.raises(ValueError, match="tuple of 2"):
        F.adaptive_avg_pool2d(mt.randn(2, 3, 4, 4), (2, 2, 2))
    with pytest.raises(ValueError, match=">= 0"):
        F.adaptive_avg_pool2d(mt.randn(2, 3, 4, 4), -1)
    with pytest.raises(TypeError, match="ints or None"):
        F.adaptive_avg_pool2d(mt.randn(2, 3, 4, 4), (2.0, 2))
    with pytest.raises(RuntimeError, match="3-D"):
        F.adaptive_avg_pool2d(mt.randn(4, 4), 2)
    with pytest.raises(RuntimeError, match="empty"):
        F.adaptive_avg_pool2d(mt.randn(2, 3, 0, 4), 2)
    with pytest.raises(RuntimeError, match="floating point"):
        F.adaptive_avg_pool2d(mt.ones(1, 1, 2, 2, dtype=mt.int64), 1)
    with pytest.raises(ValueError, match="tuple of 2"):
        nn.AdaptiveAvgPool2d((1, 2, 3))
    with pytest.raises(TypeError, match="None"):
        nn.AdaptiveAvgPool1d(None)
    with pytest.raises(RuntimeError, match="2-D"):
        F.adaptive_avg_pool1d(mt.randn(2, 3, 4, 5), 2)


# --------------------------------------------------------------------------------------------
# Dropout2d


def test_dropout2d_drops_whole_channels_reproducibly():
    x = mt.ones(40, 50, 3, 2)
    mt.manual_seed(11)
    a = _np(F.dropout2d(x, 0.3))
    mt.manual_seed(11)
    b = _np(nn.Dropout2d(0.3)(x))
    np.testing.assert_array_equal(a, b)
    per_channel = a.reshape(40, 50, -1)
    assert np.all(per_channel == per_channel[:, :, :1])  # a channel is kept or dropped whole
    kept = per_channel[:, :, 0] != 0
    assert abs(kept.mean() - 0.7) < 3 * np.sqrt(0.21 / 2000)
    np.testing.assert_allclose(per_channel[kept], 1 / 0.7, rtol=1e-6)
    assert F.dropout2d(x, 0.3, training=False) is x
    assert nn.Dropout2d(0.3).eval()(x) is x
    assert float(F.dropout2d(x, 1.0).sum()) == 0.0
    assert F.dropout2d(x, 0.0) is x


def test_dropout2d_gradient_is_the_mask():
    x = _leaf(RNG.standard_normal((6, 5, 4, 4)))
    mt.manual_seed(2)
    out = F.dropout2d(x, 0.5)
    out.backward(mt.ones(6, 5, 4, 4, dtype=mt.float64))
    mask = np.where(_np(out) != 0, 2.0, 0.0)
    np.testing.assert_array_equal(_np(x.grad), mask)
    _fd_check(lambda t: F.dropout2d(t, 0.4), [RNG.standard_normal((3, 4, 2, 2))], [0],
              before=lambda: mt.manual_seed(7))


def test_dropout2d_inplace_and_other_ranks():
    x = mt.ones(8, 6, 2, 2)
    y = x * 1
    mt.manual_seed(4)
    out = F.dropout2d(y, 0.5, inplace=True)
    assert out is y
    assert set(np.unique(_np(y))) <= {0.0, 2.0}
    leaf = mt.ones(2, 3, 2, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        F.dropout2d(leaf, 0.5, inplace=True)
    with pytest.warns(UserWarning, match="3-D input"):
        out = _np(F.dropout2d(mt.ones(30, 40, 5), 0.5))
    assert np.all(out == out[:, :, :1])  # (N, C, L): whole length-L channels
    with pytest.warns(UserWarning, match="deprecated"):
        F.dropout2d(mt.ones(2, 3, 2, 2, 2), 0.5)
    with pytest.raises(RuntimeError, match="at least 2 dimensions"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        F.dropout2d(mt.ones(3), 0.5)
    for bad in (-0.1, 1.5, "x"):
        with pytest.raises(ValueError, match="probability"):
            F.dropout2d(x, bad)
        with pytest.raises(ValueError, match="probability"):
            nn.Dropout2d(bad)


def test_dropout2d_repr_matches_torch():
    torch = _torch()
    assert repr(nn.Dropout2d(0.2, inplace=True)) == repr(torch.nn.Dropout2d(0.2, inplace=True))


# --------------------------------------------------------------------------------------------
# a ResNet-style block, end to end


def _resnet_block(lib):
    class Block(lib.nn.Module):
        def __init__(self, c: int, classes: int) -> None:
            super().__init__()
            self.conv1 = lib.nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn1 = lib.nn.BatchNorm2d(c)
            self.conv2 = lib.nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = lib.nn.BatchNorm2d(c)
            self.pool = lib.nn.AdaptiveAvgPool2d((1, 1))
            self.fc = lib.nn.Linear(c, classes)

        def forward(self, x):
            out = lib.nn.functional.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            out = lib.nn.functional.relu(out + x)  # the identity shortcut, not in place
            return self.fc(lib.flatten(self.pool(out), 1))

    return Block


@pytest.mark.parametrize("dtype", DTYPES)
def test_resnet_block_matches_torch(dtype):
    torch = _torch()
    tdt = getattr(torch, np.dtype(dtype).name)
    torch.manual_seed(0)
    tnet = _resnet_block(torch)(8, 5).to(tdt)
    net = _resnet_block(mt)(8, 5).to(np.dtype(dtype))
    net.load_state_dict({k: v.numpy() for k, v in tnet.state_dict().items()})
    tol = 1e-10 if dtype == np.float64 else 2e-5
    for _ in range(2):
        x = RNG.standard_normal((6, 8, 7, 7)).astype(dtype)
        y = RNG.integers(0, 5, 6)
        xm, xt = _leaf(x.copy()), torch.tensor(x, requires_grad=True)
        loss = F.cross_entropy(net(xm), mt.tensor(y))
        tloss = torch.nn.functional.cross_entropy(tnet(xt), torch.tensor(y))
        net.zero_grad()
        tnet.zero_grad()
        loss.backward()
        tloss.backward()
        np.testing.assert_allclose(float(loss), float(tloss.detach()), rtol=tol)
        np.testing.assert_allclose(_np(xm.grad), xt.grad.numpy(), rtol=tol, atol=tol)
        tparams = dict(tnet.named_parameters())
        for name, p in net.named_parameters():
            ref = tparams[name].grad.numpy()
            np.testing.assert_allclose(_np(p.grad), ref, rtol=tol,
                                       atol=tol * max(1.0, float(np.abs(ref).max())),
                                       err_msg=name)
        tsd = tnet.state_dict()
        for k, v in net.state_dict().items():
            np.testing.assert_allclose(_np(v), tsd[k].numpy(), rtol=tol, atol=tol, err_msg=k)
    net.eval()
    tnet.eval()
    x = RNG.standard_normal((3, 8, 7, 7)).astype(dtype)
    np.testing.assert_allclose(_np(net(mt.tensor(x))), tnet(torch.tensor(x)).detach().numpy(),
                               rtol=tol, atol=tol)


# --------------------------------------------------------------------------------------------
# GPU (CuPy): the same kernels, the same results


GPU_CASES = {
    "batch_norm_train": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                         [(4, 3, 5, 6), (3,), (3,)]),
    "batch_norm_eval": (lambda x, w, b: F.batch_norm(
        x, mt.zeros(3, dtype=x.dtype, device=x.device) + 0.5,
        mt.ones(3, dtype=x.dtype, device=x.device) * 2, w, b), [(4, 3, 5, 6), (3,), (3,)]),
    "batch_norm_conv_layout": (lambda x, w: F.batch_norm(F.conv2d(x, w), None, None,
                                                         training=True),
                               [(4, 2, 6, 6), (3, 2, 3, 3)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [(2, 4, 3, 5), (4,), (4,)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (3, 5), w, b), [(2, 4, 3, 5), (3, 5),
                                                                    (3, 5)]),
    "adaptive_pool": (lambda x: F.adaptive_avg_pool2d(x, (3, 2)), [(2, 3, 7, 5)]),
    "adaptive_pool_global_conv": (lambda x, w: F.adaptive_avg_pool2d(F.conv2d(x, w), 1),
                                  [(4, 2, 6, 6), (3, 2, 3, 3)]),
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


# --------------------------------------------------------------------------------------------
# batch norm shared out over threads (conv2d's layout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", ["both", "none"])
@pytest.mark.parametrize("threads", [2, 3])
def test_batch_norm_split_over_threads_matches_torch(dtype, affine, threads, monkeypatch):
    """Batch norm of a batch-innermost input cut into channel shares, one per thread
    (``_norm_kernels.SPLIT_ELEMENTS`` lowered so that a small input is split): torch's values,
    gradients and running statistics."""
    from mpitensor.nn._kernels import norm as NK

    torch = _torch()
    calls = []
    real = NK.run_split
    monkeypatch.setattr(NK, "SPLIT_ELEMENTS", 1)
    monkeypatch.setattr(NK, "blas_threads", lambda: threads)
    monkeypatch.setattr(NK, "run_split", lambda fn, parts: calls.append(len(parts))
                        or real(fn, parts))
    shape, C = (4, 7, 5, 6), 7
    x = RNG.standard_normal(shape) * 3 + 2
    w = RNG.uniform(0.5, 1.5, C) if affine == "both" else None
    b = RNG.standard_normal(C) if affine == "both" else None
    rm, rv = RNG.standard_normal(C).astype(dtype), RNG.uniform(0.5, 2, C).astype(dtype)
    mrm, mrv = mt.tensor(rm), mt.tensor(rv)
    trm, trv = torch.tensor(rm), torch.tensor(rv)
    _assert_parity(
        lambda x_, w_, b_: F.batch_norm(x_, mrm, mrv, w_, b_, training=True, momentum=0.3),
        lambda x_, w_, b_: torch.nn.functional.batch_norm(x_, trm, trv, w_, b_, training=True,
                                                          momentum=0.3),
        [x, w, b], dtype, ["batch_inner", "nchw", "nchw"])
    _close(_np(mrm), trm.numpy(), dtype, "running_mean")
    _close(_np(mrv), trv.numpy(), dtype, "running_var")
    assert calls and all(n == threads for n in calls)  # forward and backward both split
