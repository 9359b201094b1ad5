"""DistributedDataParallel in one process (MPI's singleton world of size 1).

Argument checks, errors before ``init_process_group``, the Module interface (``.module``,
``module.``-prefixed state dicts), bucket layout (against torch's own assignment function),
gradients at world size 1, ``no_sync``, gradient views, recovery from an interrupted backward,
and the tutorial helpers. Multi-rank behaviour is tested in ``tests/mpi/test_ddp.py``.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.errors import NotInitializedError
from mpitensor.nn.parallel import (
    CommStats,
    DistributedDataParallel,
    average_gradients,
    broadcast_parameters,
)
from mpitensor.nn.parallel._reducer import _bucket_assignment
from mpitensor.optim import SGD

from .mpi.test_ddp import MLP, data, mse, val

DDP = DistributedDataParallel


@pytest.fixture
def world():
    """A default process group of size 1 for the test, none before or after."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("mpi")
    yield
    dist.destroy_process_group()


def step(model, seed=0, n=8):
    x, y = data(seed, n, np.float64)
    loss = mse(model(mt.tensor(x)), mt.tensor(y))
    loss.backward()
    return loss


# --------------------------------------------------------------------------------------------
# Errors


def test_needs_an_initialized_group():
    if dist.is_initialized():
        dist.destroy_process_group()
    for call in (lambda: DDP(MLP(1)), lambda: average_gradients(MLP(1)),
                 lambda: broadcast_parameters(MLP(1))):
        with pytest.raises(NotInitializedError, match=r"init_process_group\(\) first"):
            call()


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"bucket_cap_mb": -1}, ValueError, "bucket_cap_mb must be >= 0"),
    ({"bucket_cap_mb": float("nan")}, ValueError, "bucket_cap_mb must be >= 0"),
    ({"bucket_cap_mb": "25"}, TypeError, "bucket_cap_mb must be a number"),
    ({"find_unused_parameters": "yes"}, TypeError, "find_unused_parameters must be True"),
    ({"gradient_as_bucket_view": 1}, TypeError, "gradient_as_bucket_view must be True"),
    ({"overlap": None}, TypeError, "overlap must be True or False"),
    ({"dim": 1}, ValueError, "dim must be 0"),
    ({"device_ids": [0]}, ValueError, r"module.to\('cuda:0'\)"),
    ({"device_ids": ["cpu"]}, ValueError, "a CPU module takes device_ids=None"),
    ({"device_ids": [0, 1]}, ValueError, "list of one device"),
    ({"device_ids": ["tpu"]}, ValueError, "bad device in device_ids"),
    ({"process_group": "world"}, TypeError, "process_group must be a group"),
])
def test_bad_arguments(world, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        DDP(MLP(1), **kwargs)


def test_bad_modules(world):
    with pytest.raises(TypeError, match="module must be an mpitensor.nn.Module"):
        DDP([nn.Parameter(mt.ones(2))])
    with pytest.raises(TypeError, match="module must be an mpitensor.nn.Module"):
        DDP(lambda x: x)
    frozen = MLP(1)
    for p in frozen.parameters():
        p.requires_grad = False
    with pytest.raises(ValueError, match="has no parameter that requires a gradient"):
        DDP(frozen)


def test_errors_come_before_any_traffic(world, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("no message may be sent before the arguments are checked")

    for name in ("broadcast", "all_reduce", "all_gather_object"):
        monkeypatch.setattr(dist, name, boom)
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        DDP(MLP(1), bucket_cap_mb=-5)
    with pytest.raises(ValueError, match="device_ids"):
        DDP(MLP(1), device_ids=["cpu"])


def test_helper_argument_errors(world):
    with pytest.raises(TypeError, match="Module or an iterable of tensors"):
        average_gradients(3)
    with pytest.raises(TypeError, match="expected tensors"):
        broadcast_parameters([np.ones(3)])


# --------------------------------------------------------------------------------------------
# The Module interface


def test_module_interface(world):
    inner = MLP(1)
    ddp = DDP(inner)
    assert isinstance(ddp, nn.Module) and ddp.module is inner
    assert [id(p) for p in ddp.parameters()] == [id(p) for p in inner.parameters()]
    sd = ddp.state_dict()
    assert list(sd) == ["module." + k for k in inner.state_dict()]
    other = DDP(MLP(2))
    other.load_state_dict(sd)
    for p, q in zip(other.parameters(), inner.parameters()):
        assert np.array_equal(val(p), val(q))
    ddp.eval()
    assert not inner.training
    ddp.train()
    assert inner.training
    text = repr(ddp)
    assert text.startswith("DistributedDataParallel(") and "buckets=1" in text
    assert ddp.find_unused_parameters is False and ddp.bucket_bytes_cap == 25 * 1024 * 1024
    assert ddp.require_backward_grad_sync


def test_forward_passes_arguments(world):
    ddp = DDP(MLP(1, extra=True), find_unused_parameters=True)
    x = mt.tensor(data(0, 4, np.float64)[0])
    a = ddp(x, use_extra=False)
    b = ddp.module(x, use_extra=False)
    assert np.array_equal(val(a), val(b))


# --------------------------------------------------------------------------------------------
# Buckets


def _layout_params(sizes, dtypes=None):
    class Raw(nn.Module):
        def __init__(self):
            super().__init__()
            for i, n in enumerate(sizes):
                dt = dtypes[i] if dtypes else np.float32
                setattr(self, f"p{i}", nn.Parameter(mt.tensor(np.zeros(n, dtype=dt))))

        def forward(self, x):
            return x

    return Raw()


@pytest.mark.parametrize("cap_mb", [0, 0.5, 1, 5, 25])
@pytest.mark.parametrize("mixed", [False, True])
def test_bucket_assignment_matches_torch(cap_mb, mixed):
    """Our buckets are torch's rebuilt buckets: reverse order, first one capped at 1 MiB."""
    torch = pytest.importorskip("torch")
    import torch.distributed as tdist

    sizes = [1000, 300_000, 10, 200_000, 5_000_000, 7, 70_000, 400_000, 3]
    dts = [np.float32, np.float64] * 5 if mixed else [np.float32] * 9
    cap = int(cap_mb * 1024 * 1024)
    first = min(1024 * 1024, cap)
    rev = list(range(len(sizes)))[::-1]
    ours = _bucket_assignment(
        [(i, sizes[i] * np.dtype(dts[i]).itemsize, (np.dtype(dts[i]), "cpu")) for i in rev],
        cap, first)
    tensors = [torch.zeros(sizes[i], dtype=torch.float32 if dts[i] == np.float32
                           else torch.float64) for i in rev]
    theirs, _ = tdist._compute_bucket_assignment_by_size(tensors, [first, cap])
    theirs = [[rev[k] for k in b] for b in theirs]
    assert ours == theirs


def test_bucket_layout(world):
    sizes = [1000, 300_000, 10, 200_000, 5_000_000, 7]
    m = _layout_params(sizes)
    per = DDP(m, bucket_cap_mb=0)
    assert per.comm_stats.num_buckets == 6
    assert per.comm_stats.bucket_bytes == [4 * n for n in reversed(sizes)]
    default = DDP(m)
    # reverse order: p5+p4 reach the 1 MiB first cap; the rest fit in one 25 MiB bucket
    assert [b.params for b in default.reducer.buckets] == [[5, 4], [3, 2, 1, 0]]
    for b in default.reducer.buckets:
        assert b.buffer.flags.c_contiguous and b.buffer.ndim == 1
        assert b.buffer.dtype == np.float32
        assert b.nbytes == sum(4 * sizes[i] for i in b.params)
    mixed = DDP(_layout_params([10, 20, 30], [np.float32, np.float64, np.float32]),
                bucket_cap_mb=25)
    assert sorted(b.buffer.dtype.name for b in mixed.reducer.buckets) == ["float32", "float64"]


# --------------------------------------------------------------------------------------------
# Gradients at world size 1


@pytest.mark.parametrize("view", [False, True])
@pytest.mark.parametrize("cap", [0, 25])
def test_gradients_equal_local_ones(world, view, cap):
    ddp = DDP(MLP(5), gradient_as_bucket_view=view, bucket_cap_mb=cap)
    plain = MLP(5)
    for s in range(3):
        ddp.zero_grad()
        plain.zero_grad()
        step(ddp, s)
        step(plain, s)
        for p, q in zip(ddp.parameters(), plain.parameters()):
            assert np.array_equal(val(p.grad), val(q.grad))
        if view:
            for p in ddp.parameters():
                assert any(p.grad._data.base is b.buffer for b in ddp.reducer.buckets)
    st = ddp.comm_stats
    assert st.steps == 3 and st.launched == st.num_buckets
    assert st.total_wait_s >= st.last_wait_s >= 0.0


def test_gradient_view_accumulates_in_place(world):
    ddp = DDP(MLP(5), gradient_as_bucket_view=True)
    opt = SGD(ddp.parameters(), lr=0.1)
    step(ddp, 0)
    grads = {id(p): p.grad for p in ddp.parameters()}
    arrays = {id(p): p.grad._data for p in ddp.parameters()}
    opt.zero_grad(set_to_none=False)
    step(ddp, 1)
    for p in ddp.parameters():
        assert p.grad is grads[id(p)] and p.grad._data is arrays[id(p)]  # no new arrays
    plain = MLP(5)
    step(plain, 1)
    for p, q in zip(ddp.parameters(), plain.parameters()):
        assert np.array_equal(val(p.grad), val(q.grad))


def test_no_sync_accumulates_then_syncs(world):
    ddp = DDP(MLP(5))
    plain = MLP(5)
    with ddp.no_sync():
        assert not ddp.require_backward_grad_sync
        step(ddp, 0)
    assert ddp.require_backward_grad_sync
    assert ddp.comm_stats.steps == 0
    step(ddp, 1)
    assert ddp.comm_stats.steps == 1
    step(plain, 0)
    step(plain, 1)
    for p, q in zip(ddp.parameters(), plain.parameters()):
        np.testing.assert_allclose(val(p.grad), val(q.grad), rtol=1e-14)


def test_backward_without_ddp_forward_does_not_sync(world):
    """As in torch, the forward through DDP arms the reduction; the inner module's does not."""
    ddp = DDP(MLP(5))
    step(ddp.module, 0)
    assert ddp.comm_stats.steps == 0 and not ddp.reducer.in_backward
    step(ddp, 0)
    assert ddp.comm_stats.steps == 1


def test_unused_parameter_error_and_find_unused(world):
    """As torch: backward returns, the next forward with gradients enabled raises (once)."""
    ddp = DDP(MLP(5, unused=True))
    local = MLP(5, unused=True)
    step(ddp)
    step(local)
    assert ddp.module.spare.grad is None  # no gradient, left alone
    for (name, p), q in zip(ddp.module.named_parameters(), local.parameters()):
        if name != "spare":
            np.testing.assert_array_equal(val(p.grad), val(q.grad), err_msg=name)
    with mt.no_grad():  # a forward that will not synchronise does not raise
        ddp(mt.tensor(data(1, 4, np.float64)[0]))
    with pytest.raises(RuntimeError, match=r"no gradient to 1 parameter\(s\).*: spare \(index "
                                           r"4\)\..*find_unused_parameters=True") as info:
        ddp(mt.tensor(data(1, 4, np.float64)[0]))
    assert "rank 0: DistributedDataParallel" in str(info.value)
    # said once; the next step is checked afresh (and fails the same way at the one after)
    step(ddp)
    with pytest.raises(RuntimeError, match="spare"):
        step(ddp)
    ok = DDP(MLP(5, unused=True), find_unused_parameters=True)
    for _ in range(2):
        step(ok)
    assert ok.module.spare.grad is None
    assert all(p.grad is not None for n, p in ok.module.named_parameters() if n != "spare")


def test_unused_error_is_raised_inside_no_sync_too(world):
    """Any forward with gradients enabled reports it, also one under no_sync (as torch)."""
    ddp = DDP(MLP(5, unused=True))
    step(ddp)
    with ddp.no_sync(), pytest.raises(RuntimeError, match="spare"):
        ddp(mt.tensor(data(1, 4, np.float64)[0]))


@pytest.mark.parametrize("find_unused", [False, True])
def test_static_graph_tolerates_unused_from_the_start(world, find_unused):
    ddp = DDP(MLP(5, unused=True), static_graph=True, find_unused_parameters=find_unused)
    for s in range(3):
        ddp.zero_grad()
        step(ddp, s)
    assert ddp.module.spare.grad is None and ddp.reducer.static_unused == [4]
    assert ddp.comm_stats.steps == 3


class _Fails(Function):
    armed = False

    @staticmethod
    def forward(ctx, x):
        return x.copy()

    @staticmethod
    def backward(ctx, g):
        if _Fails.armed:
            raise FloatingPointError("backward failed on purpose")
        return (g,)


class _Fragile(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = MLP(5)

    def forward(self, x):
        h = self.inner(x)
        return _Fails.apply(h)


def test_recovers_after_an_interrupted_backward(world, caplog):
    ddp = DDP(_Fragile(), bucket_cap_mb=0)
    x, y = data(0, 8, np.float64)
    # make the failure happen after some buckets were launched: fail at the first layer
    inner = ddp.module.inner
    calls = []

    def fail_late(p):
        calls.append(1)
        if len(calls) == 1:
            raise FloatingPointError("hook failed on purpose")

    handle = inner.w1.register_post_accumulate_grad_hook(fail_late)
    with pytest.raises(FloatingPointError):
        mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
    assert ddp.reducer.in_backward
    handle.remove()
    with caplog.at_level(logging.WARNING, logger="mpitensor.nn.parallel"):
        ddp.zero_grad()
        mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
    assert "did not finish" in caplog.text
    assert not ddp.reducer.in_backward and ddp.comm_stats.steps == 1
    plain = _Fragile()
    mse(plain(mt.tensor(x)), mt.tensor(y)).backward()
    for p, q in zip(ddp.parameters(), plain.parameters()):
        assert np.array_equal(val(p.grad), val(q.grad))


def test_hooks_do_not_keep_ddp_alive(world):
    import gc
    import weakref

    inner = MLP(5)
    ddp = DDP(inner)
    ref = weakref.ref(ddp)
    del ddp
    gc.collect()
    assert ref() is None
    step(inner)  # the orphaned hooks are inert
    assert all(p.grad is not None for p in inner.parameters())


def test_comm_stats():
    st = CommStats([100, 200])
    assert st.num_buckets == 2 and st.bucket_bytes == [100, 200]
    st.steps, st.total_wait_s = 3, 1.5
    d = st.as_dict()
    assert d["steps"] == 3 and d["num_buckets"] == 2
    assert "steps=3" in repr(st)
    st.reset()
    assert st.steps == 0 and st.total_wait_s == 0.0 and st.num_buckets == 2


# --------------------------------------------------------------------------------------------
# Tutorial helpers at world size 1


def test_helpers_world_one(world):
    m = MLP(5)
    step(m)
    before = [val(p.grad).copy() for p in m.parameters()]
    average_gradients(m)
    for p, b in zip(m.parameters(), before):
        assert np.array_equal(val(p.grad), b)
    w = [val(p).copy() for p in m.parameters()]
    broadcast_parameters(m)
    broadcast_parameters(list(m.parameters()), src=0)
    for p, b in zip(m.parameters(), w):
        assert np.array_equal(val(p), b)
    average_gradients(MLP(6))  # no gradients yet: nothing to do, no error


# --------------------------------------------------------------------------------------------
# GPU (CuPy): buckets on the device, through MPI (host staging or CUDA-aware) and NCCL


def _gpu_world(backend):
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group(backend)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["mpi", "nccl"])
@pytest.mark.parametrize("view", [False, True])
def test_gpu_gradients_match_cpu(backend, view):
    from mpitensor.backend import get_cupy, to_numpy

    if backend == "nccl" and not dist.is_nccl_available():
        pytest.skip("NCCL is not available here")
    cp = get_cupy()
    _gpu_world(backend)
    try:
        gpu = MLP(5).to("cuda")
        DDP(MLP(5).to("cuda"), device_ids=["cuda"])  # the current device, as in torch
        ddp = DDP(gpu, device_ids=[0], gradient_as_bucket_view=view, bucket_cap_mb=0.0005)
        cpu = MLP(5)
        for b in ddp.reducer.buckets:
            assert isinstance(b.buffer, cp.ndarray)
        opt, opt_cpu = SGD(ddp.parameters(), lr=0.1, momentum=0.9), SGD(cpu.parameters(),
                                                                         lr=0.1, momentum=0.9)
        for s in range(3):
            x, y = data(s, 8, np.float64)
            opt.zero_grad()
            mse(ddp(mt.tensor(x, device="cuda")), mt.tensor(y, device="cuda")).backward()
            opt.step()
            opt_cpu.zero_grad()
            mse(cpu(mt.tensor(x)), mt.tensor(y)).backward()
            opt_cpu.step()
        for p, q in zip(ddp.parameters(), cpu.parameters()):
            assert isinstance(p.grad._data, cp.ndarray)
            np.testing.assert_allclose(to_numpy(p.grad._data), val(q.grad), rtol=1e-12)
            np.testing.assert_allclose(to_numpy(p._data), val(q), rtol=1e-12)
        average_gradients(ddp)
        broadcast_parameters(ddp.module)
        for p, q in zip(ddp.parameters(), cpu.parameters()):
            np.testing.assert_allclose(to_numpy(p.grad._data), val(q.grad), rtol=1e-12)
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_gpu_mixed_devices_rejected():
    _gpu_world("mpi")
    try:
        m = MLP(5)
        m.w1.data = m.w1.to("cuda")
        with pytest.raises(ValueError, match="on different devices"):
            DDP(m)
        with pytest.raises(ValueError, match=r"module.to\('cuda:0'\)"):
            DDP(MLP(5), device_ids=["cuda:0"])
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------
# join() and verify_in_sync() at world size 1 (multi-rank: tests/mpi/test_ddp_join.py)


def test_replica_divergence_error_is_an_mpitensor_error():
    from mpitensor.errors import MpiTensorError
    from mpitensor.nn.parallel import ReplicaDivergenceError

    err = ReplicaDivergenceError("x", differences=[{"name": "w"}], ranks=[1], reference_rank=0)
    assert isinstance(err, MpiTensorError) and isinstance(err, RuntimeError)
    assert err.differences == [{"name": "w"}] and err.ranks == [1] and err.reference_rank == 0


def test_verify_in_sync_world_one(world, monkeypatch):
    ddp = DDP(MLP(5))
    assert ddp.verify_in_sync() is None
    assert ddp.verify_in_sync(atol=1e-6, rtol=0) is None
    for name in ("broadcast", "all_reduce", "all_gather_object"):
        monkeypatch.setattr(dist, name, lambda *a, **k: pytest.fail("traffic at world size 1"))
    assert ddp.verify_in_sync() is None


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"atol": -1}, ValueError, "atol must be >= 0"),
    ({"rtol": float("nan")}, ValueError, "rtol must be >= 0"),
    ({"atol": "0"}, TypeError, "atol must be a number"),
    ({"rtol": True}, TypeError, "rtol must be a number"),
])
def test_verify_in_sync_bad_arguments(world, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        DDP(MLP(5)).verify_in_sync(**kwargs)


@pytest.mark.parametrize("divide", [True, False])
def test_join_world_one_is_plain_training(world, divide):
    """One rank inside join(): gradients as without it, nothing shadowed, state cleared."""
    ddp, plain = DDP(MLP(5)), MLP(5)
    with ddp.join(divide_by_initial_world_size=divide):
        assert ddp._join is not None
        for s in range(3):
            for m in (ddp, plain):
                m.zero_grad()
                step(m, seed=s)
            for p, q in zip(ddp.parameters(), plain.parameters()):
                np.testing.assert_array_equal(val(p.grad), val(q.grad))
    assert ddp._join is None and ddp.reducer.divisor == 1 and ddp.reducer.join_zeros is None
    assert ddp.comm_stats.shadowed == 0 and ddp.comm_stats.steps == 3


def test_join_state_cleared_when_the_body_raises(world):
    ddp = DDP(MLP(5))
    with pytest.raises(KeyError):
        with ddp.join(divide_by_initial_world_size=False):
            step(ddp)
            raise KeyError("user error")
    assert ddp._join is None and ddp.reducer.divisor == 1
    with ddp.join():  # usable again
        step(ddp)
    assert ddp.comm_stats.steps == 2


def test_join_bad_arguments(world):
    ddp = DDP(MLP(5))
    with pytest.raises(TypeError, match="enable must be True or False"):
        ddp.join(enable=None)
