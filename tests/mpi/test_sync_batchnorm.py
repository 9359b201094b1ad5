"""``nn.SyncBatchNorm`` at 1-4 ranks: the same numbers as one batch norm on the global batch.

Every rank draws the same seeded global batch, takes its own slice of it (equal, uneven, or
none at all), and runs SyncBatchNorm on that slice; beside it, in the same process, it runs the
references on the whole global batch: ``nn.BatchNorm1d/2d`` (2-D to 4-D inputs), a NumPy
float64 formula, and torch's ``BatchNorm1d/2d/3d`` where torch is installed. On every rank,
after each of several training steps: the output slice, the input gradient slice, the running
statistics (bitwise the same on every rank), and the weight and bias gradients summed over the
ranks (each rank holds its share, which DDP sums) equal the reference's (float64 1e-10, float32
1e-5, relative to each tensor's largest entry). The matrix covers 2-D to 5-D inputs, conv2d's
batch-innermost layout, momentum None, affine off, the world and sub-groups (non-members
normalise alone); then DDP training against one process on the global batch, evaluation
without traffic, and errors: one rank's wrong channel count (the others hear of it), every
rank's, one value per channel in all, and an empty global batch.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_sync_batchnorm.py``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor.errors import PeerFailedError
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.optim import SGD

from . import arrayimpl as ai

pytestmark = pytest.mark.mpi(min_size=1)

TOL = {np.float64: 1e-10, np.float32: 1e-5}
EPS = 1e-5
C = 3


def world():
    return dist.get_world_size(), dist.get_rank()


def _torch():
    try:
        import torch
    except ImportError:  # an oracle only: the other references still run
        return None
    torch.set_num_threads(1)
    return torch


def val(t):
    return np.asarray(t.detach().numpy())


def close(got, want, dtype, what, failures=None, cond=1.0):
    """Assert ``got`` equals ``want`` within ``dtype``'s tolerance (times ``cond``); with a
    ``failures`` list, note the mismatch there instead of raising, so that this rank stays in
    step with the others' collectives until the test's end (:func:`no_failures`)."""
    tol = TOL[dtype] * cond
    want = np.asarray(want, dtype=np.float64)
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    try:
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=tol,
                                   atol=tol * scale, err_msg=f"rank {dist.get_rank()}: {what}")
    except AssertionError as exc:
        if failures is None:
            raise
        failures.append(str(exc))


def no_failures(failures):
    assert not failures, f"{len(failures)} mismatches; the first:\n{failures[0]}"


def batch_sizes(kind, n):
    """Per-rank batch sizes of a split ``kind`` over ``n`` ranks."""
    if kind == "even":
        return [3] * n
    if kind == "uneven":
        return [3 + 2 * r for r in range(n)]
    if kind == "first_empty":
        return [0] + [3 + 2 * r for r in range(1, n)] if n > 1 else [4]
    if kind == "last_empty":
        return [3 + 2 * r for r in range(n - 1)] + [0] if n > 1 else [4]
    raise ValueError(kind)


def draw(step, rows, tail, dtype, offsets=(0.5, -20.0, 30.0)):
    """Step ``step``'s global batch and output gradient: channels with their own offset and
    scale (up to 60 standard deviations from 0: float32's ``E[x^2] - E[x]^2`` would miss the
    variance by ~2e-4)."""
    rng = np.random.default_rng(500 + step)
    shape = (rows, C, *tail)
    bcast = (1, C) + (1,) * len(tail)
    offset = np.array(offsets).reshape(bcast)
    scale = np.array([1.0, 3.0, 0.5]).reshape(bcast)
    x = (rng.standard_normal(shape) * scale + offset).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)
    return x, g


def batch_innermost(a):
    """``a`` (N, C, ...) laid out (C, ..., N) in memory, as conv2d's outputs are."""
    order = (*range(1, a.ndim), 0)
    return np.ascontiguousarray(a.transpose(order)).transpose(np.argsort(order))


def leaf(a):
    t = mt.Tensor(a)
    t.requires_grad_(True)
    return t


def numpy_reference(x, g, w, b, rm, rv, momentum):
    """One training step of batch norm in float64: ``(y, dx, dw, db, rm, rv)``."""
    x, g = x.astype(np.float64), g.astype(np.float64)
    axes = (0, *range(2, x.ndim))
    bcast = (1, C) + (1,) * (x.ndim - 2)
    n = x.size // C
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    invstd = 1.0 / np.sqrt(var + EPS)
    xhat = (x - mean.reshape(bcast)) * invstd.reshape(bcast)
    wv = np.ones(C) if w is None else w
    y = xhat * wv.reshape(bcast) + (0.0 if b is None else b.reshape(bcast))
    gh = g * wv.reshape(bcast)
    dx = invstd.reshape(bcast) * (gh - gh.mean(axis=axes, keepdims=True)
                                  - xhat * (gh * xhat).mean(axis=axes, keepdims=True))
    dw, db = (g * xhat).sum(axis=axes), g.sum(axis=axes)
    rm = (1 - momentum) * rm + momentum * mean
    rv = (1 - momentum) * rv + momentum * var * n / (n - 1)
    return y, dx, dw, db, rm, rv


def module_pair(dtype, affine, momentum, group, ndim):
    """A SyncBatchNorm with non-trivial weights, and the mpitensor BatchNorm that is its
    reference (None for 5-D inputs: mpitensor has no BatchNorm3d)."""
    sync = nn.SyncBatchNorm(C, eps=EPS, momentum=momentum, affine=affine, process_group=group,
                            dtype=dtype)
    if affine:
        with mt.no_grad():
            sync.weight.copy_(mt.tensor(np.array([1.5, 0.5, 2.0], dtype=dtype)))
            sync.bias.copy_(mt.tensor(np.array([0.1, -1.0, 0.3], dtype=dtype)))
    cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}.get(ndim)
    ref = None
    if cls is not None:
        ref = cls(C, eps=EPS, momentum=momentum, affine=affine, dtype=dtype)
        ref.load_state_dict(sync.state_dict())
    return sync, ref


def torch_module(torch, sync, ndim, dtype):
    cls = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d", 5: "BatchNorm3d"}[ndim]
    tm = getattr(torch.nn, cls)(C, eps=EPS, momentum=sync.momentum, affine=sync.affine)
    tm = tm.to(getattr(torch, np.dtype(dtype).name))
    tm.load_state_dict({k: torch.from_numpy(val(v).copy()) for k, v in
                        sync.state_dict().items()})
    return tm


def sum_over(group, arr):
    """``arr`` summed over the members of ``group`` (float64, a copy)."""
    out = np.array(arr, dtype=np.float64)
    dist.all_reduce(out, group=group)
    return out


def run_and_compare(dtype, tail, split, group, affine=True, momentum=0.1, layout="nchw",
                    steps=3):
    """Train ``steps`` steps of SyncBatchNorm over ``group`` and check every rank's results
    against the references on the batch of the ranks it pools with (its own, for a rank outside
    the group). Mismatches are collected and raised at the end, after the last collective."""
    n, me = world()
    members = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    mine = me in members
    peers = members if mine else [me]
    sizes = batch_sizes(split, n)
    offsets = np.cumsum([0] + sizes)
    ndim = 2 + len(tail)
    sync, ref = module_pair(dtype, affine, momentum, group, ndim)
    torch = _torch()
    tm = torch_module(torch, sync, ndim, dtype) if torch is not None else None
    rm, rv = np.zeros(C), np.ones(C)
    failures: list = []
    for step in range(steps):
        x_all, g_all = draw(step, int(offsets[-1]), tail, dtype)
        rows = np.concatenate([np.arange(offsets[r], offsets[r + 1]) for r in peers])
        xg, gg = x_all[rows], g_all[rows]  # the batch this rank's statistics cover
        start = sum(sizes[r] for r in peers if r < me)
        within = slice(start, start + sizes[me])  # this rank's rows among xg's
        xs = x_all[int(offsets[me]):int(offsets[me + 1])]
        x = leaf(batch_innermost(xs) if layout == "batch_inner" and xs.shape[0] > 1 else
                 np.ascontiguousarray(xs))
        y = sync(x)
        (y * mt.tensor(gg[within])).sum().backward()
        if tuple(y.shape) != xs.shape or y.dtype != x.dtype:
            failures.append(f"step {step}: output {tuple(y.shape)} {y.dtype}")
        if int(sync.num_batches_tracked) != step + 1:
            failures.append(f"step {step}: num_batches_tracked {int(sync.num_batches_tracked)}")
        got = {"output": val(y), "input grad": val(x.grad),
               "running_mean": val(sync.running_mean), "running_var": val(sync.running_var)}
        if affine:  # each rank holds its share: the sum over the pooling ranks is the gradient
            got["weight grad"] = sum_over(group, sync.weight.grad) if mine else \
                val(sync.weight.grad)
            got["bias grad"] = sum_over(group, sync.bias.grad) if mine else val(sync.bias.grad)

        wants = {}
        w0 = val(sync.weight) if affine else None
        b0 = val(sync.bias) if affine else None
        factor = momentum if momentum is not None else 1.0 / (step + 1)
        wy, wdx, wdw, wdb, rm, rv = numpy_reference(xg, gg, w0, b0, rm, rv, factor)
        wants["NumPy"] = {"output": wy, "input grad": wdx, "running_mean": rm,
                          "running_var": rv, "weight grad": wdw, "bias grad": wdb}
        if ref is not None:
            xr = leaf(xg.copy())
            yr = ref(xr)
            (yr * mt.tensor(gg)).sum().backward()
            wants["BatchNorm"] = {"output": val(yr), "input grad": val(xr.grad),
                                  "running_mean": val(ref.running_mean),
                                  "running_var": val(ref.running_var)}
            if affine:
                wants["BatchNorm"].update({"weight grad": val(ref.weight.grad),
                                           "bias grad": val(ref.bias.grad)})
            ref.zero_grad()
        if tm is not None:
            xt = torch.from_numpy(xg.copy()).requires_grad_(True)
            yt = tm(xt)
            (yt * torch.from_numpy(gg)).sum().backward()
            wants["torch"] = {"output": yt.detach().numpy(), "input grad": xt.grad.numpy(),
                              "running_mean": tm.running_mean.numpy(),
                              "running_var": tm.running_var.numpy()}
            if affine:
                wants["torch"].update({"weight grad": tm.weight.grad.numpy(),
                                       "bias grad": tm.bias.grad.numpy()})
            tm.zero_grad()
        for source, want in wants.items():
            for key, value in got.items():
                if key in ("output", "input grad"):
                    w = want[key][within]
                else:
                    w = want[key]
                # (BatchNorm's float32 gradients used to lose ~(mean / std) * 6e-8 here, up to
                # 5e-5: its mean was one float32 sum and its sum(g * x_hat) was expanded as
                # sum(g x) - mean sum(g); both are centred now, and the tolerance is the same)
                close(value, w, dtype, f"step {step}: {key} vs {source}", failures)
        sync.zero_grad()

    # the running statistics are bitwise the same on every rank that pools with this one
    state = np.concatenate([val(sync.running_mean), val(sync.running_var)]).tobytes()
    every = [None] * n
    dist.all_gather_object(every, state)
    if not all(every[r] == state for r in peers):
        failures.append("the running statistics differ between ranks")
    no_failures(failures)


# --------------------------------------------------------------------------------------------
# the matrix


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("split", ["even", "uneven", "first_empty", "last_empty"])
@pytest.mark.parametrize("tail", [(), (4,), (2, 3), (2, 2, 2)], ids=["2d", "3d", "4d", "5d"])
def test_matches_batch_norm_on_the_global_batch(dtype, split, tail):
    run_and_compare(dtype, tail, split, None)


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("affine", [True, False])
def test_options(affine, momentum):
    run_and_compare(np.float64, (2, 3), "uneven", None, affine=affine, momentum=momentum)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_conv2d_batch_innermost_layout(dtype):
    run_and_compare(dtype, (3, 2), "uneven", None, layout="batch_inner")


@pytest.mark.parametrize("name", ["full", "evens", "tail", "ends"])
def test_sub_group(name):
    """Members pool their batches; the others (get_world_size -1) normalise their own."""
    run_and_compare(np.float64, (2, 2), "uneven", ai.get_group(name))


def test_weight_gradient_only_needs_no_input_gradient():
    """With an input that needs no gradient, backward sends nothing and the parameters' shares
    still sum to the global gradient."""
    n, me = world()
    sizes = batch_sizes("uneven", n)
    offsets = np.cumsum([0] + sizes)
    x_all, g_all = draw(7, int(offsets[-1]), (2,), np.float64)
    sync, ref = module_pair(np.float64, True, 0.1, None, 3)
    here = slice(int(offsets[me]), int(offsets[me + 1]))
    pg = dist.group.WORLD
    y = sync(mt.tensor(x_all[here]))
    before = pg.seq
    (y * mt.tensor(g_all[here])).sum().backward()
    sent = pg.seq - before
    dw, db = sum_over(None, sync.weight.grad), sum_over(None, sync.bias.grad)
    (ref(mt.tensor(x_all)) * mt.tensor(g_all)).sum().backward()
    assert sent == 0, "backward communicated"
    close(dw, val(ref.weight.grad), np.float64, "weight grad")
    close(db, val(ref.bias.grad), np.float64, "bias grad")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_statistics_keep_their_precision_far_from_zero(dtype):
    """Means thousands of standard deviations from 0: the pooled variance is as accurate as
    the dtype allows (``E[x^2] - E[x]^2`` would be off by percents in float32)."""
    n, me = world()
    sizes = batch_sizes("uneven", n)
    offsets = np.cumsum([0] + sizes)
    x_all, _ = draw(9, int(offsets[-1]), (5,), dtype, offsets=(3e3, -1e4, 5e2))
    sync = nn.SyncBatchNorm(C, momentum=1.0, dtype=dtype)  # running stats = the batch's
    sync(mt.tensor(x_all[int(offsets[me]):int(offsets[me + 1])]))
    x64 = x_all.astype(np.float64)
    var = x64.var(axis=(0, 2), ddof=1)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(val(sync.running_var), var, rtol=tol)
    np.testing.assert_allclose(val(sync.running_mean), x64.mean(axis=(0, 2)), rtol=tol)


def test_evaluation_uses_running_statistics_without_traffic():
    n, me = world()
    sync = nn.SyncBatchNorm(C, dtype=mt.float64)
    x, _ = draw(3, 4 * n, (2,), np.float64)
    sync(mt.tensor(x[4 * me:4 * me + 4]))  # training: pools
    sync.eval()
    ref = nn.BatchNorm1d(C, dtype=mt.float64).eval()
    ref.load_state_dict(sync.state_dict())
    pg = dist.group.WORLD
    before = pg.seq
    xs = mt.tensor(x[:2 + me])  # a different batch size on every rank: no collective to match
    close(val(sync(xs)), val(ref(xs)), np.float64, "eval output")
    free = nn.SyncBatchNorm(C, track_running_stats=False, dtype=mt.float64).eval()
    xs_np = val(xs)
    want = (xs_np - xs_np.mean(axis=(0, 2), keepdims=True)) / np.sqrt(
        xs_np.var(axis=(0, 2), keepdims=True) + EPS)
    close(val(free(xs)), want, np.float64, "eval without running statistics: its own batch")
    assert pg.seq == before, "evaluation communicated"
    assert int(sync.num_batches_tracked) == 1


# --------------------------------------------------------------------------------------------
# with DDP


def _net(dtype):
    mt.manual_seed(11)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 4 * 4, 2)).to(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ddp_training_matches_one_process_on_the_global_batch(dtype):
    """DDP over a converted model, each rank on its share of the batch, against the original
    model trained in one process on the whole batch: the same parameters and statistics."""
    n, me = world()
    mdt = getattr(mt, np.dtype(dtype).name)
    ref = _net(mdt)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref))
    assert isinstance(model[1], nn.SyncBatchNorm)
    ddp = DDP(model)
    opt = SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    ref_opt = SGD(ref.parameters(), lr=0.1, momentum=0.9)
    per = 12 // n  # 12 samples in all at 1, 2, 3 and 4 ranks
    rng = np.random.default_rng(3)
    failures: list = []
    for step in range(3):
        x = (rng.standard_normal((12, 3, 4, 4)) * 2 + 1).astype(dtype)
        t = rng.standard_normal((12, 2)).astype(dtype)
        mine = slice(me * per, (me + 1) * per)
        opt.zero_grad()
        ((ddp(mt.tensor(x[mine])) - mt.tensor(t[mine])) ** 2).mean().backward()
        opt.step()
        ref_opt.zero_grad()
        ((ref(mt.tensor(x)) - mt.tensor(t)) ** 2).mean().backward()
        ref_opt.step()
        theirs = ref.state_dict()
        for k, v in model.state_dict().items():
            close(val(v), val(theirs[k]), dtype, f"step {step}: {k}", failures)
    no_failures(failures)


# --------------------------------------------------------------------------------------------
# errors


@pytest.mark.mpi(min_size=2)
def test_wrong_channel_count_on_one_rank_reaches_the_others():
    """The rank with the wrong input raises before any traffic; the others raise
    PeerFailedError instead of waiting for it (on a fresh group: it is unusable afterwards)."""
    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="syncbn_fault")
    bad = n - 1
    sync = nn.SyncBatchNorm(C, process_group=g)
    x = mt.randn(4, C + 1 if me == bad else C, 2)
    try:
        if me == bad:
            with pytest.raises(RuntimeError, match="one value per channel"):
                sync(x)
        else:
            with pytest.raises(PeerFailedError, match=f"rank {bad}.*SyncBatchNorm"):
                sync(x)
    finally:
        dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_wrong_channel_count_everywhere_leaves_the_group_usable():
    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="syncbn_all_wrong")
    try:
        sync = nn.SyncBatchNorm(C, process_group=g, dtype=mt.float64)
        with pytest.raises(RuntimeError, match="one value per channel"):
            sync(mt.randn(4, C + 1, 2, dtype=mt.float64))
        x, _ = draw(0, 2 * n, (), np.float64)
        y = sync(mt.tensor(x[2 * me:2 * me + 2]))
        want = (x - x.mean(0)) / np.sqrt(x.var(0) + EPS)
        close(val(y), want[2 * me:2 * me + 2], np.float64, "after the failed call")
    finally:
        dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_one_value_per_channel_in_all_raises_on_every_rank():
    n, me = world()
    sync = nn.SyncBatchNorm(C)
    x = mt.randn(1 if me == 0 else 0, C)
    with pytest.raises(ValueError, match="more than 1 value per channel over the whole group"):
        sync(x)
    y = sync(mt.randn(2, C))  # the world group is still in step
    assert tuple(y.shape) == (2, C)


def test_an_empty_global_batch_leaves_the_statistics_alone():
    sync = nn.SyncBatchNorm(C)
    x = leaf(np.zeros((0, C, 2), np.float32))
    y = sync(x)
    assert tuple(y.shape) == (0, C, 2)
    y.sum().backward()
    assert tuple(x.grad.shape) == (0, C, 2)
    np.testing.assert_array_equal(val(sync.running_mean), 0)
    np.testing.assert_array_equal(val(sync.running_var), 1)
    assert int(sync.num_batches_tracked) == 1  # counted, as torch's batch norm does
