"""``nn.SyncBatchNorm`` in one process: batch norm when nothing is pooled, its pooled code path
on a world of one rank, the combination of per-rank statistics, ``convert_sync_batchnorm``,
its torch-compatible surface and its errors.

The pooled results on 2-4 ranks (uneven and empty batches, sub-groups, DDP) are checked
against batch norm on the global batch in ``tests/mpi/test_sync_batchnorm.py``.
"""

from __future__ import annotations

import copy
import inspect

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling
from mpitensor import backend
from mpitensor.nn._functional import sync_batchnorm as SB

RNG = np.random.default_rng(77)
TOL = {np.float32: 1e-5, np.float64: 1e-12}


@pytest.fixture(autouse=True)
def _no_default_group():
    """Every test starts and ends without a default process group."""
    if dist.is_initialized():
        dist.destroy_process_group()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def world():
    """The default group of this one process (MPI's singleton world)."""
    dist.init_process_group("mpi")
    return dist.group.WORLD


def _np(t):
    return np.asarray(t.detach()._data)


def _leaf(a):
    t = mt.Tensor(a)
    t.requires_grad_(True)
    return t


def _laid_out(a, layout):
    """``a`` (N, C, ...) with the same values in another memory layout."""
    if layout == "nchw":
        return np.ascontiguousarray(a)
    if layout == "batch_inner":  # conv2d's outputs: (C, *S, N) in memory
        order = (*range(1, a.ndim), 0)
    elif layout == "channels_last":  # (N, *S, C) in memory
        order = (0, *range(2, a.ndim), 1)
    else:  # "strided": not dense in any order
        big = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
        big[..., ::2] = a
        return big[..., ::2]
    return np.ascontiguousarray(a.transpose(order)).transpose(np.argsort(order))


def _data(shape, dtype, offset=2.0):
    x = RNG.standard_normal(shape) * 1.5 + offset
    g = RNG.standard_normal(shape)
    return x.astype(dtype), g.astype(dtype)


def _pair(cls, dtype, **options):
    """A SyncBatchNorm and a BatchNorm of class ``cls`` holding the same random-ish state."""
    sync = nn.SyncBatchNorm(3, dtype=dtype, **options)
    with mt.no_grad():
        for p in sync.parameters():
            p.copy_(mt.tensor(RNG.uniform(0.5, 1.5, tuple(p.shape)).astype(dtype)))
    ref = cls(3, dtype=dtype, **options)
    ref.load_state_dict(sync.state_dict())
    return sync, ref


def _assert_same_steps(sync, ref, shape, dtype, steps=3):
    """Train both for ``steps`` steps, then evaluate: the same outputs, input and parameter
    gradients and state, bitwise (the same code runs)."""
    for step in range(steps + 1):
        if step == steps:
            sync.eval()
            ref.eval()
        x, g = _data(shape, dtype, offset=step)
        xs, xr = _leaf(x), _leaf(x.copy())
        ys, yr = sync(xs), ref(xr)
        (ys * mt.tensor(g)).sum().backward()
        (yr * mt.tensor(g)).sum().backward()
        np.testing.assert_array_equal(_np(ys), _np(yr))
        np.testing.assert_array_equal(_np(xs.grad), _np(xr.grad))
        for (name, p), q in zip(sync.named_parameters(), ref.parameters()):
            np.testing.assert_array_equal(_np(p.grad), _np(q.grad), err_msg=name)
        theirs = ref.state_dict()
        for k, v in sync.state_dict().items():
            np.testing.assert_array_equal(_np(v), _np(theirs[k]), err_msg=k)
        sync.zero_grad()
        ref.zero_grad()


# --------------------------------------------------------------------------------------------
# nothing to pool: batch norm


CASES = [(nn.BatchNorm1d, (6, 3)), (nn.BatchNorm1d, (4, 3, 5)), (nn.BatchNorm2d, (4, 3, 2, 5))]
OPTIONS = [{}, dict(momentum=None), dict(affine=False), dict(bias=False),
           dict(track_running_stats=False)]


@pytest.mark.parametrize("cls,shape", CASES)
@pytest.mark.parametrize("options", OPTIONS)
def test_without_a_process_group_it_is_batch_norm(cls, shape, options):
    sync, ref = _pair(cls, np.float64, **options)
    _assert_same_steps(sync, ref, shape, np.float64)


@pytest.mark.parametrize("cls,shape", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_on_a_world_of_one_it_is_batch_norm_and_sends_nothing(world, cls, shape, dtype):
    sync, ref = _pair(cls, dtype)
    before = world.seq
    _assert_same_steps(sync, ref, shape, dtype)
    assert world.seq == before


def test_five_dimensional_input_matches_torch():
    torch = pytest.importorskip("torch")
    sync = nn.SyncBatchNorm(3, dtype=mt.float64)
    tm = torch.nn.BatchNorm3d(3).double()
    for step in range(3):
        x, g = _data((2, 3, 2, 3, 2), np.float64, offset=step)
        xs, xt = _leaf(x), torch.tensor(x, requires_grad=True)
        ys, yt = sync(xs), tm(xt)
        (ys * mt.tensor(g)).sum().backward()
        (yt * torch.tensor(g)).sum().backward()
        np.testing.assert_allclose(_np(ys), yt.detach().numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(_np(xs.grad), xt.grad.numpy(), rtol=1e-10, atol=1e-12)
        for k, v in tm.state_dict().items():
            np.testing.assert_allclose(_np(sync.state_dict()[k]), v.numpy(), rtol=1e-12)


# --------------------------------------------------------------------------------------------
# the pooled code path, on one rank


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(7, 3), (3, 3, 5), (4, 3, 2, 3), (2, 3, 2, 2, 3)])
@pytest.mark.parametrize("layout", ["nchw", "batch_inner", "channels_last", "strided"])
@pytest.mark.parametrize("affine", [True, False])
def test_pooled_path_matches_batch_norm(world, dtype, shape, layout, affine):
    """The all_gather/all_reduce path on a world of one rank gives batch_norm's numbers."""
    x, g = _data(shape, dtype, offset=5.0)
    w = b = None
    if affine:
        w = _leaf(RNG.uniform(0.5, 1.5, 3).astype(dtype))
        b = _leaf(RNG.uniform(-1, 1, 3).astype(dtype))
    rm, rv = mt.zeros(3, dtype=dtype), mt.ones(3, dtype=dtype)
    rm2, rv2 = mt.zeros(3, dtype=dtype), mt.ones(3, dtype=dtype)
    xs, xr = _leaf(_laid_out(x, layout)), _leaf(x.copy())
    ys = SB.sync_batch_norm(xs, rm, rv, w, b, 0.3, 1e-5, world)
    grads_s = None
    (ys * mt.tensor(g)).sum().backward()
    if affine:
        grads_s = [_np(w.grad).copy(), _np(b.grad).copy()]
        w.grad = b.grad = None
    yr = F.batch_norm(xr, rm2, rv2, w, b, training=True, momentum=0.3, eps=1e-5)
    (yr * mt.tensor(g)).sum().backward()
    tol = TOL[dtype]
    np.testing.assert_allclose(_np(ys), _np(yr), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(xs.grad), _np(xr.grad), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(rm), _np(rm2), rtol=tol, atol=tol)
    np.testing.assert_allclose(_np(rv), _np(rv2), rtol=tol, atol=tol)
    if affine:
        np.testing.assert_allclose(grads_s[0], _np(w.grad), rtol=tol * 10, atol=tol * 10)
        np.testing.assert_allclose(grads_s[1], _np(b.grad), rtol=tol, atol=tol)
    assert ys.dtype == xs.dtype and tuple(ys.shape) == shape
    assert ys.grad_fn.name() == "SyncBatchNormBackward"


def test_pooled_path_empty_and_single_value(world):
    rm, rv = mt.zeros(3), mt.ones(3)
    x = _leaf(np.zeros((0, 3, 4), np.float32))
    y = SB.sync_batch_norm(x, rm, rv, None, None, 0.1, 1e-5, world)
    assert tuple(y.shape) == (0, 3, 4)
    y.sum().backward()
    assert tuple(x.grad.shape) == (0, 3, 4)
    np.testing.assert_array_equal(_np(rm), 0)  # nothing seen: nothing to update
    np.testing.assert_array_equal(_np(rv), 1)
    with pytest.raises(ValueError, match="more than 1 value per channel over the whole group"):
        SB.sync_batch_norm(mt.randn(1, 3, 1), rm, rv, None, None, 0.1, 1e-5, world)


def test_pooled_path_checks_its_arguments_first(world):
    before = world.seq
    x = mt.randn(4, 3, 2)
    with pytest.raises(RuntimeError, match="one value per channel"):
        SB.sync_batch_norm(x, None, None, mt.ones(4), None, 0.1, 1e-5, world)
    with pytest.raises(RuntimeError, match="floating point"):
        SB.sync_batch_norm(mt.ones(4, 3, dtype=mt.int64), None, None, None, None, 0.1, 1e-5,
                           world)
    with pytest.raises(RuntimeError, match="should be the same"):
        SB.sync_batch_norm(x, None, None, mt.ones(3, dtype=mt.float64), None, 0.1, 1e-5,
                           world)
    with pytest.raises(TypeError, match="Tensor or a NumPy"):
        SB.sync_batch_norm([[1.0, 2.0, 3.0]], None, None, None, None, 0.1, 1e-5, world)
    # alone, every failed call is everyone's: the group is still usable
    dist.all_reduce(np.zeros(1))
    assert world.seq > before


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_combining_ranks_statistics(dtype):
    """Per-rank (count, mean, M2) rows combine into the global mean and variance, whatever
    the split (empty shares included), and far from 0 without loss."""
    x = (RNG.standard_normal((40, 3)) * [1.0, 0.01, 3.0] + [0.0, 1e4, -50.0]).astype(dtype)
    want_mean = x.astype(np.float64).mean(axis=0)
    want_var = x.astype(np.float64).var(axis=0)
    for cuts in ([0, 40], [0, 0, 13, 40], [0, 1, 2, 39, 40, 40]):
        rows = []
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            part = x[lo:hi].astype(np.float64)
            if len(part):
                rows.append([len(part), *part.mean(0), *((part - part.mean(0)) ** 2).sum(0)])
            else:
                rows.append([0.0] * 7)
        count, mean, var = SB._combine(np.array(rows), 3)
        assert count == 40
        np.testing.assert_allclose(mean, want_mean, rtol=1e-14)
        # a mean 1e6 standard deviations from 0: float64's own two-pass variance is good to
        # ~1e-16 * 1e6 there (a naive E[x^2] - E[x]^2 would have no digit left)
        np.testing.assert_allclose(var, want_var, rtol=1e-9)
    assert SB._combine(np.zeros((3, 7)), 3) == (0.0, None, None)


# --------------------------------------------------------------------------------------------
# convert_sync_batchnorm


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4, momentum=None, eps=1e-3)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16, 5), nn.BatchNorm1d(5, affine=False),
                                  nn.Sequential(nn.BatchNorm1d(5, bias=False,
                                                               track_running_stats=False)))

    def forward(self, x):
        return self.head(self.bn(self.conv(x)))


def test_convert_sync_batchnorm_keeps_structure_state_and_flags():
    net = _Net()
    net(mt.randn(3, 3, 4, 4))  # running statistics that are not the initial ones
    net.bn.weight.requires_grad_(False)
    net.head[2].eval()
    state = {k: _np(v).copy() for k, v in net.state_dict().items()}
    params = dict(net.named_parameters())
    buffers = dict(net.named_buffers())
    modes = {n: m.training for n, m in net.named_modules()}
    conv = net.conv
    out = nn.SyncBatchNorm.convert_sync_batchnorm(net)
    assert out is net and out.conv is conv  # changed in place, other modules kept
    for name in ("bn", "head.2", "head.3.0"):
        assert type(out.get_submodule(name)) is nn.SyncBatchNorm, name
        assert out.get_submodule(name).process_group is None
    assert [n for n, _ in out.named_modules()] == list(modes)
    assert {n: m.training for n, m in out.named_modules()} == modes
    assert list(out.state_dict()) == list(state)
    for k, v in out.state_dict().items():
        np.testing.assert_array_equal(_np(v), state[k], err_msg=k)
    for n, p in out.named_parameters():
        assert p is params[n], n  # the same tensors: an optimizer built before still works
    assert not out.bn.weight.requires_grad and out.bn.bias.requires_grad
    for n, b in out.named_buffers():
        assert b is buffers[n], n
    bn = out.bn
    assert (bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats) == \
        (4, 1e-3, None, True, True)
    assert out.head[2].weight is None and out.head[2].bias is None
    assert out.head[3][0].bias is None and out.head[3][0].weight is not None
    assert out.head[3][0].running_mean is None
    assert tuple(out(mt.randn(2, 3, 4, 4)).shape) == (2, 5)


def test_convert_a_batch_norm_itself_and_with_a_group(world):
    bn = nn.BatchNorm1d(4)
    bn.eval()
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(bn, process_group=world)
    assert type(sync) is nn.SyncBatchNorm and sync is not bn
    assert sync.process_group is world and not sync.training
    assert sync.weight is bn.weight and sync.running_var is bn.running_var
    again = nn.SyncBatchNorm.convert_sync_batchnorm(sync)  # a SyncBatchNorm is batch norm too
    assert type(again) is nn.SyncBatchNorm and again.process_group is None
    plain = nn.Linear(2, 2)
    assert nn.SyncBatchNorm.convert_sync_batchnorm(plain) is plain


def test_convert_matches_torch_structure():
    torch = pytest.importorskip("torch")
    ours = nn.SyncBatchNorm.convert_sync_batchnorm(
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                      nn.Sequential(nn.BatchNorm1d(4, affine=False))))
    theirs = torch.nn.SyncBatchNorm.convert_sync_batchnorm(
        torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                            torch.nn.Sequential(torch.nn.BatchNorm1d(4, affine=False))))
    assert repr(ours) == repr(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())


# --------------------------------------------------------------------------------------------
# torch's surface


def test_signature_state_dict_and_repr_match_torch():
    torch = pytest.importorskip("torch")
    ours = inspect.signature(nn.SyncBatchNorm.__init__).parameters
    theirs = inspect.signature(torch.nn.SyncBatchNorm.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.values()]
    for options in ({}, dict(affine=False), dict(track_running_stats=False), dict(bias=False),
                    dict(momentum=None, eps=1e-3)):
        m, tm = nn.SyncBatchNorm(5, **options), torch.nn.SyncBatchNorm(5, **options)
        assert repr(m) == repr(tm)
        sd, tsd = m.state_dict(), tm.state_dict()
        assert list(sd) == list(tsd)
        for k in tsd:
            np.testing.assert_array_equal(_np(sd[k]), tsd[k].numpy())
            assert _np(sd[k]).dtype == tsd[k].numpy().dtype, k
    # a torch SyncBatchNorm's (or BatchNorm2d's) trained state loads into ours
    tm = torch.nn.BatchNorm2d(3).double()
    for _ in range(2):
        tm(torch.randn(4, 3, 2, 2, dtype=torch.float64) * 3 + 1)
    m = nn.SyncBatchNorm(3, dtype=mt.float64)
    m.load_state_dict(tm.state_dict())
    x = RNG.standard_normal((2, 3, 2, 2))
    np.testing.assert_allclose(_np(m.eval()(mt.tensor(x))),
                               tm.eval()(torch.tensor(x)).detach().numpy(), rtol=1e-12)
    assert int(m.num_batches_tracked) == 2


def test_deepcopy_shares_the_process_group(world):
    net = nn.Sequential(nn.SyncBatchNorm(2, process_group=world))
    dup = copy.deepcopy(net)
    assert dup[0].process_group is world
    assert dup[0].weight is not net[0].weight
    np.testing.assert_array_equal(_np(dup[0].running_var), _np(net[0].running_var))
    plain = copy.deepcopy(nn.SyncBatchNorm(2))
    assert plain.process_group is None


# --------------------------------------------------------------------------------------------
# errors


def test_errors():
    sync = nn.SyncBatchNorm(3)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        sync(mt.randn(3))
    with pytest.raises(ValueError, match="no channel"):
        sync(mt.randn(4, 0, 2))
    with pytest.raises(RuntimeError, match="one value per channel"):
        sync(mt.randn(4, 5, 2))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        sync(mt.randn(1, 3))
    sync.eval()(mt.randn(1, 3))  # evaluation needs no variance
    for bad in (0, -2, 1.5, "3", True):
        with pytest.raises(ValueError, match="num_features"):
            nn.SyncBatchNorm(bad)
    with pytest.raises(ValueError, match="eps"):
        nn.SyncBatchNorm(3, eps=-1)
    with pytest.raises(ValueError, match="momentum"):
        nn.SyncBatchNorm(3, momentum="fast")
    with pytest.raises(TypeError, match="process_group must be a process group"):
        nn.SyncBatchNorm(3, process_group="world")
    with pytest.raises(TypeError, match="floating point"):
        nn.SyncBatchNorm(3, dtype=mt.int64)


def test_errors_on_a_world_of_one(world):
    sync = nn.SyncBatchNorm(3, process_group=world)
    with pytest.raises(RuntimeError, match="one value per channel"):
        sync(mt.randn(4, 5, 2))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        sync(mt.randn(3))


# --------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
def test_pooled_path_on_the_gpu_matches_the_cpu(world):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3, 5, 6)) + 3
    g = rng.standard_normal((4, 3, 5, 6))
    res = []
    for device in ("cpu", "cuda"):
        xs = mt.tensor(x, device=device, requires_grad=True)
        w = mt.tensor([1.5, 0.5, 2.0], dtype=mt.float64, device=device, requires_grad=True)
        rm = mt.zeros(3, dtype=mt.float64, device=device)
        rv = mt.ones(3, dtype=mt.float64, device=device)
        y = SB.sync_batch_norm(xs, rm, rv, w, None, 0.1, 1e-5, world)
        y.backward(mt.tensor(g, device=device))
        res.append([backend.to_numpy(t._data) for t in (y, xs.grad, w.grad, rm, rv)])
    for a, b in zip(*res):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
