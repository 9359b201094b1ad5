"""DDP's shared-memory gradient all-reduce (``backends/mpi/node_reduce.py``) at 2-4 ranks.

``MPITENSOR_NODE_REDUCE=on`` forces it here (by default it runs only where the ranks outnumber
the node's cores, as they do when CI runs this file at 3 and 4 ranks on 2 cores); ``off``
gives MPI's all-reduce, the oracle.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_node_reduce.py``.
"""

from __future__ import annotations

import glob
import time

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor.distributed.backends.mpi import node_reduce as _node_reduce
from mpitensor.errors import DistributedTimeoutError, PeerFailedError
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.optim import SGD

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture
def mode(monkeypatch):
    def set_mode(value):
        monkeypatch.setenv(_node_reduce.ENV, value)
    return set_mode


def _model(dtype=np.float32, seed=3):
    mt.manual_seed(seed)
    m = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                      nn.Linear(64, 5))
    return m.to(dtype=mt.float32 if dtype == np.float32 else mt.float64)


def _train(dtype, steps=4, **ddp_kw):
    me = dist.get_rank()
    ddp = DDP(_model(dtype), **ddp_kw)
    opt = SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(100 + me)
    for _ in range(steps):
        x = mt.tensor(rng.standard_normal((8, 20)).astype(dtype))
        opt.zero_grad()
        (ddp(x) ** 2).mean().backward()
        opt.step()
    return ddp, np.concatenate([p.detach().numpy().ravel() for p in ddp.parameters()])


def _gathered(a):
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, a.tobytes())
    return every


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cap", [0, 25])
def test_same_training_as_through_mpi_and_equal_replicas(mode, dtype, cap):
    """Forced on: the replicas are bitwise equal, and the parameters equal the MPI run's to
    rounding (the sums are taken in another order)."""
    mode("on")
    ddp, shm = _train(dtype, bucket_cap_mb=cap)
    assert ddp.reducer.node is not None
    assert len(set(_gathered(shm))) == 1, "replicas differ"
    mode("off")
    ddp2, ref = _train(dtype, bucket_cap_mb=cap)
    assert ddp2.reducer.node is None
    np.testing.assert_allclose(shm, ref, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-6 if dtype == np.float32 else 1e-13)


def test_the_sum_is_each_ranks_bucket_in_rank_order(mode):
    """One bucket, values chosen per rank: the all-reduced buffer is exactly
    ((b0 + b1) + b2) + ... on every rank, divided by the world size beforehand (as DDP does)."""
    mode("on")
    n, me = dist.get_world_size(), dist.get_rank()
    ddp = DDP(_model(np.float32))
    node = ddp.reducer.node
    assert node is not None
    buf = ddp.reducer.buckets[0].buffer
    rng = [np.random.default_rng(7 + r) for r in range(n)]
    parts = [g.standard_normal(buf.shape).astype(np.float32) for g in rng]
    for step in range(3):  # both slots, and back to the first
        buf[...] = parts[me] * (step + 1)
        node.start(0, buf).wait()
        want = parts[0] * (step + 1)
        for r in range(1, n):
            want = want + parts[r] * (step + 1)
        assert buf.tobytes() == want.astype(np.float32).tobytes()


def test_no_segment_is_left_in_dev_shm(mode):
    mode("on")
    before = set(glob.glob("/dev/shm/mpitensor-ddp-*"))
    ddp = DDP(_model())
    dist.barrier()
    assert ddp.reducer.node is not None
    assert set(glob.glob("/dev/shm/mpitensor-ddp-*")) - before == set()


def test_where_it_does_not_apply_mpi_is_used(mode):
    """off, half-precision buckets, and (by default) a node with a core per rank: MPI."""
    mode("off")
    assert DDP(_model()).reducer.node is None
    mode("on")
    half = nn.Linear(4, 4).to(dtype=mt.float16)
    assert DDP(half).reducer.node is None
    mode("auto")
    saved = _node_reduce.node_ranks, _node_reduce.node_cpus
    try:
        _node_reduce.note_node(dist.get_world_size(), dist.get_world_size())  # a core each
        assert DDP(_model()).reducer.node is None
        _node_reduce.note_node(dist.get_world_size(), 1)  # more ranks than cores
        assert DDP(_model()).reducer.node is not None
    finally:
        _node_reduce.note_node(*saved)


def test_a_bad_setting_is_refused_naming_the_variable(mode):
    mode("sometimes")
    with pytest.raises(ValueError, match="MPITENSOR_NODE_REDUCE='sometimes' is not one of "
                                         "AUTO, ON, OFF"):
        _node_reduce.setting()


def test_a_rank_that_never_posts_times_out_naming_the_call(mode):
    """The last rank skips a backward: the others wait for its bucket, and the group's
    timeout ends the wait with a clear error (never a silent hang)."""
    mode("on")
    n, me = dist.get_world_size(), dist.get_rank()
    g = dist.new_group(list(range(n)), timeout=1.5)
    ddp = DDP(_model(), process_group=g)
    assert ddp.reducer.node is not None
    x = mt.tensor(np.ones((2, 20), np.float32))
    t0 = time.monotonic()
    if me != n - 1:
        with pytest.raises((DistributedTimeoutError, PeerFailedError)) as info:
            (ddp(x) ** 2).sum().backward()
        assert time.monotonic() - t0 < 15
        assert "all_reduce" in str(info.value)
    dist.barrier()
    dist.destroy_process_group(g)


def test_a_rank_that_raises_in_backward_ends_the_others_wait(mode):
    """An exception in the middle of one rank's backward (caught by its loop): the buckets it
    never posted end the others' wait with PeerFailedError naming it, as through MPI."""
    from mpitensor.autograd import Function

    class Boom(Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            raise FloatingPointError("boom on the last rank")

    class Middle(nn.Module):
        def __init__(self, boom):
            super().__init__()
            self.boom = boom

        def forward(self, x):
            return Boom.apply(x) if self.boom else x

    mode("on")
    n, me = dist.get_world_size(), dist.get_rank()
    g = dist.new_group(list(range(n)), timeout=30)
    mt.manual_seed(5)
    model = nn.Sequential(nn.Linear(20, 32), Middle(me == n - 1), nn.Tanh(), nn.Linear(32, 5))
    ddp = DDP(model, process_group=g, bucket_cap_mb=0)
    assert ddp.reducer.node is not None
    x = mt.tensor(np.ones((2, 20), np.float32))
    t0 = time.monotonic()
    with pytest.raises((PeerFailedError, FloatingPointError)) as info:
        (ddp(x) ** 2).sum().backward()
    if me == n - 1:
        assert isinstance(info.value, FloatingPointError)
    else:
        assert isinstance(info.value, PeerFailedError), info.value
        assert f"rank {n - 1}" in str(info.value)
        assert time.monotonic() - t0 < 10
    dist.barrier()
    dist.destroy_process_group(g)


def test_env_is_read_alike_on_every_rank_or_agreed(mode):
    """The ranks disagree (one says off): none uses shared memory, and training works."""
    me = dist.get_rank()
    mode("off" if me == 0 else "on")
    ddp, params = _train(np.float32, steps=2)
    assert ddp.reducer.node is None
    assert len(set(_gathered(params))) == 1


def test_no_room_in_dev_shm_means_mpi_and_no_file_left(mode, monkeypatch):
    """Rank 0 cannot reserve the segment (a container's small /dev/shm: ENOSPC): every rank
    uses MPI, training works, and no file is left behind."""
    import errno

    mode("on")
    if dist.get_rank() == 0:
        def full(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(_node_reduce.os, "posix_fallocate", full)
    before = set(glob.glob("/dev/shm/mpitensor-ddp-*"))
    ddp, params = _train(np.float32, steps=2)
    assert ddp.reducer.node is None
    assert len(set(_gathered(params))) == 1
    dist.barrier()
    assert set(glob.glob("/dev/shm/mpitensor-ddp-*")) - before == set()
