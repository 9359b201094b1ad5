"""DDP with uneven inputs (``join()``), replica divergence (``verify_in_sync()``) and the bucket
layout checks, at 1-4 ranks.

Uneven inputs: rank r trains on 3 + r batches inside ``ddp.join()``. Nothing may hang, and every
rank must end with bitwise-identical parameters equal (float64, rtol 1e-10) to a reference that
each rank computes in-process by simulating all ranks' shards: at step t the ranks still active
are ``A_t = {r : 3 + r > t}``, and the gradient is ``sum over A_t of grad_r / D`` with ``D`` the
world size (``divide_by_initial_world_size=True``: an even run in which the missing batches
contribute zero gradient) or ``|A_t|`` (False: the mean over the active ranks).

Every outcome that may differ between ranks is recorded and asserted after the collectives,
so a rank whose assertion fails still makes the same collective calls as the others.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_ddp_join.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling
from mpitensor.errors import CollectiveMismatchError, MpiTensorError
from mpitensor.models import LeNet
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.nn.parallel import ReplicaDivergenceError
from mpitensor.optim import SGD

from . import arrayimpl as ai
from .test_ddp import (
    MLP,
    _one_blas_thread,  # noqa: F401 - the module's autouse fixture
    assert_replicas_equal,
    data,
    mse,
    val,
)

pytestmark = pytest.mark.mpi(min_size=1)

BATCH = 8


def world():
    return dist.get_world_size(), dist.get_rank()


def outcome(fn, *args, **kwargs):
    """The exception ``fn`` raised, or None."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the test inspects whatever was raised
        return exc
    return None


def n_batches(r):
    return 3 + r


def batch(r, t, micro=1):
    """Rank r's t-th batch, as ``micro`` micro-batches of (x, y)."""
    x, y = data(100 * r + t, BATCH, np.float64)
    return list(zip(np.split(x, micro), np.split(y, micro)))


def buffer_value(r, t):
    return 100.0 * r + t


def train_uneven(ddp, opt, micro=1, eval_forward=False, set_buffer=False, me=None,
                 **join_kw):
    """This rank's 3 + rank steps inside join(); returns the buffer seen after each forward.

    ``me``: the rank in the DDP's group (default: the global rank).
    """
    if me is None:
        me = dist.get_rank()
    seen = []
    with ddp.join(**join_kw):
        for t in range(n_batches(me)):
            if eval_forward:
                with mt.no_grad():  # a forward that does not sync: the joined ranks skip it
                    ddp(mt.tensor(batch(me, t)[0][0]))
            if set_buffer:  # a rank-dependent buffer update, as a running statistic
                ddp.module.running._data[...] = buffer_value(me, t)
            opt.zero_grad()
            parts = batch(me, t, micro)
            with ddp.no_sync():
                for x, y in parts[:-1]:
                    (mse(ddp(mt.tensor(x)), mt.tensor(y)) / micro).backward()
            x, y = parts[-1]
            out = ddp(mt.tensor(x))
            seen.append(float(val(ddp.module.running)[0]))
            (mse(out, mt.tensor(y)) / micro).backward()
            opt.step()
    return seen


def reference(n, divide_by_initial_world_size=True, micro=1):
    """Simulate all n ranks' uneven shards in one process."""
    ref = MLP(7)
    opt = SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for t in range(n_batches(n - 1)):
        active = [r for r in range(n) if n_batches(r) > t]
        d = n if divide_by_initial_world_size else len(active)
        opt.zero_grad()
        for r in active:
            for x, y in batch(r, t, micro):
                (mse(ref(mt.tensor(x)), mt.tensor(y)) / (micro * d)).backward()
        opt.step()
    return ref


def check_against_reference(ddp, ref):
    assert_replicas_equal(list(ddp.parameters()) + list(ddp.module.buffers()))
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(val(p), val(q), rtol=1e-10,
                                   atol=1e-10 * float(np.abs(val(q)).max()), err_msg=name)


# --------------------------------------------------------------------------------------------
# join(): uneven inputs


@pytest.mark.parametrize("divide", [True, False], ids=["divide-initial", "divide-active"])
@pytest.mark.parametrize("config", [
    {"bucket_cap_mb": 0},
    {"bucket_cap_mb": 25, "overlap": False},
    {"bucket_cap_mb": 0.0005, "find_unused_parameters": True, "gradient_as_bucket_view": True},
], ids=["per-param", "one-bucket-no-overlap", "tiny-unused-view"])
def test_join_uneven_inputs(divide, config):
    n, me = world()
    ddp = DDP(MLP(7 + me), **config)  # construction broadcasts rank 0's weights
    opt = SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    train_uneven(ddp, opt, divide_by_initial_world_size=divide)
    check_against_reference(ddp, reference(n, divide))
    assert ddp.comm_stats.steps == n_batches(me)
    assert ddp.comm_stats.shadowed == n_batches(n - 1) - n_batches(me)
    assert ddp._join is None and ddp.reducer.divisor == n  # the bookkeeping is gone after join()


@pytest.mark.parametrize("divide", [True, False], ids=["divide-initial", "divide-active"])
def test_join_no_sync_micro_batches_and_eval_forwards(divide):
    """Accumulation under no_sync and no_grad forwards: the joined ranks shadow only syncs."""
    n, me = world()
    ddp = DDP(MLP(7), bucket_cap_mb=0)
    opt = SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    train_uneven(ddp, opt, micro=2, eval_forward=True, divide_by_initial_world_size=divide)
    check_against_reference(ddp, reference(n, divide, micro=2))
    assert ddp.comm_stats.shadowed == n_batches(n - 1) - n_batches(me)


@pytest.mark.mpi(min_size=3)
def test_join_on_a_sub_group():
    """DDP over global ranks 1..n-1 with uneven inputs; rank 0 is not involved at all."""
    n, me = world()
    tail = ai.get_group("tail")
    r = dist.get_rank(tail)
    if r < 0:
        return
    size = n - 1
    ddp = DDP(MLP(7), process_group=tail, bucket_cap_mb=0)
    opt = SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    train_uneven(ddp, opt, me=r, divide_by_initial_world_size=False)
    mine = [np.asarray(p._data) for p in ddp.parameters()]
    everyone = [None] * size
    dist.all_gather_object(everyone, mine, group=tail)
    ref = reference(size, divide_by_initial_world_size=False)
    for theirs in everyone:
        for a, b in zip(theirs, mine):
            assert np.array_equal(a, b)
    for p, q in zip(ddp.parameters(), ref.parameters()):
        np.testing.assert_allclose(val(p), val(q), rtol=1e-10, atol=1e-12)
    assert ddp.comm_stats.shadowed == n_batches(size - 1) - n_batches(r)


def test_join_buffers_come_from_the_highest_active_rank():
    """As torch inside join(): the highest active rank's buffers (rank 0 may have joined)."""
    n, me = world()
    ddp = DDP(MLP(7))
    opt = SGD(ddp.parameters(), lr=0.1)
    seen = train_uneven(ddp, opt, set_buffer=True)
    last = n_batches(n - 1) - 1
    final = val(ddp.module.running).copy()
    # rank n - 1 runs the most steps: it is active, and the highest, at every step
    expected = [buffer_value(n - 1, t) for t in range(n_batches(me))]
    assert seen == expected
    # at the end every rank holds the buffers of the last rank to finish
    assert np.all(final == buffer_value(n - 1, last))


@pytest.mark.parametrize("broadcast_buffers", [True, False])
def test_join_exit_syncs_from_the_last_rank_even_inputs(broadcast_buffers):
    """As torch: leaving join() broadcasts the parameters, and the buffers only with
    broadcast_buffers, from the highest rank that ran every step, even inputs included."""
    n, me = world()
    ddp = DDP(MLP(7), broadcast_buffers=broadcast_buffers)
    opt = SGD(ddp.parameters(), lr=0.1)
    with ddp.join():
        for t in range(2):
            opt.zero_grad()
            x, y = batch(me, t)[0]
            mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
            opt.step()
            ddp.module.running._data[...] = buffer_value(me, t)  # after the forward's sync
    got = float(val(ddp.module.running)[0])
    assert_replicas_equal(list(ddp.parameters()))
    assert got == buffer_value(n - 1 if broadcast_buffers else me, 1)


def test_join_even_inputs_is_plain_ddp():
    """Even inputs inside join(): the same parameters as without it."""
    n, me = world()
    ddp, plain = DDP(MLP(7), bucket_cap_mb=0), DDP(MLP(7), bucket_cap_mb=0)
    opts = SGD(ddp.parameters(), lr=0.1, momentum=0.9), SGD(plain.parameters(), lr=0.1,
                                                               momentum=0.9)
    calls = []
    real = ddp._join_wait

    def spy(state):
        calls.append(state.step)
        return real(state)

    ddp._join_wait = spy
    with ddp.join(throw_on_early_termination=True):
        for t in range(3):
            for model, opt in zip((ddp, plain), opts):
                opt.zero_grad()
                x, y = batch(me, t)[0]
                mse(model(mt.tensor(x)), mt.tensor(y)).backward()
                opt.step()
    assert calls == [3]  # three steps, then the exit
    for p, q in zip(ddp.parameters(), plain.parameters()):
        assert np.array_equal(val(p), val(q))
    assert ddp.comm_stats.shadowed == 0


def test_join_disabled_is_a_no_op():
    n, me = world()
    ddp = DDP(MLP(7))
    with ddp.join(enable=False):
        inside = ddp._join
        x, y = batch(me, 0)[0]
        mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
    assert inside is None and ddp.comm_stats.steps == 1


def test_join_argument_errors():
    ddp = DDP(MLP(7))
    with pytest.raises(TypeError, match="divide_by_initial_world_size must be True or False"):
        ddp.join(divide_by_initial_world_size=1)
    with pytest.raises(TypeError, match="throw_on_early_termination"):
        ddp.join(throw_on_early_termination="yes")
    with ddp.join():
        with pytest.raises(RuntimeError, match="already inside join"):
            ddp.join()
        with pytest.raises(RuntimeError, match="not inside join"):
            ddp.verify_in_sync()


def test_join_throw_on_early_termination():
    """The first rank to run out makes every rank raise at the same join step."""
    n, me = world()
    ddp = DDP(MLP(7))
    opt = SGD(ddp.parameters(), lr=0.1)
    done = []

    def loop():
        with ddp.join(throw_on_early_termination=True):
            for t in range(n_batches(me)):
                x, y = batch(me, t)[0]
                opt.zero_grad()
                mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
                opt.step()
                done.append(t)

    err = outcome(loop)
    # the next collective works on every rank
    ones = np.ones(3)
    dist.all_reduce(ones)
    assert np.all(ones == n)
    assert ddp._join is None
    if n == 1:
        assert err is None
        return
    assert isinstance(err, MpiTensorError), repr(err)
    assert "exhausted inputs" in str(err) and "[0]" in str(err) and "join step 4" in str(err)
    assert done == [0, 1, 2]  # every rank stopped after rank 0's three batches
    assert_replicas_equal(list(ddp.parameters()))


def test_join_in_debug_mode():
    """Debug mode: the joined ranks shadow the bucket layout checks too."""
    n, me = world()
    with ai.debug_mode(True):
        ddp = DDP(MLP(7 + me), bucket_cap_mb=0)
        opt = SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        train_uneven(ddp, opt)
    check_against_reference(ddp, reference(n))


def test_join_lenet_batches_of_different_sizes():
    """Library layers and a last batch that is smaller on some ranks."""
    n, me = world()

    def make():
        mt.manual_seed(3)
        return LeNet().double()

    def shard_batches(r):
        rng = np.random.default_rng(50 + r)
        sizes = [4] * (1 + r % 2) + [3]  # 2 or 3 batches, the last one smaller
        return [(rng.standard_normal((s, 1, 28, 28)), rng.integers(0, 10, s)) for s in sizes]

    ddp = DDP(make(), bucket_cap_mb=0.1)
    opt = SGD(ddp.parameters(), lr=0.05)
    with ddp.join():
        for x, y in shard_batches(me):
            opt.zero_grad()
            F.nll_loss(ddp(mt.tensor(x)), mt.tensor(y)).backward()
            opt.step()
    ref = make()
    opt_ref = SGD(ref.parameters(), lr=0.05)
    everyone = [shard_batches(r) for r in range(n)]
    for t in range(max(len(b) for b in everyone)):
        opt_ref.zero_grad()
        for b in everyone:
            if t < len(b):
                x, y = b[t]
                (F.nll_loss(ref(mt.tensor(x)), mt.tensor(y)) / n).backward()
        opt_ref.step()
    check_against_reference(ddp, ref)


# --------------------------------------------------------------------------------------------
# verify_in_sync(): replicas that drifted apart


def test_verify_in_sync_passes_when_equal():
    n, me = world()
    ddp = DDP(MLP(7 + me))
    assert ddp.verify_in_sync() is None
    opt = SGD(ddp.parameters(), lr=0.1)
    for t in range(2):
        x, y = batch(me, t)[0]
        opt.zero_grad()
        mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
        opt.step()
    assert ddp.verify_in_sync() is None
    ddp.module.w1._data[0, 0] = np.nan  # the same NaN everywhere is in sync
    assert ddp.verify_in_sync() is None


@pytest.mark.mpi(min_size=2)
def test_verify_in_sync_perturbed_weight_on_rank_1():
    n, me = world()
    ddp = DDP(MLP(7))
    before = val(ddp.module.w2)[3, 4]
    if me == 1:
        ddp.module.w2._data[3, 4] += 0.5
    err = outcome(ddp.verify_in_sync)
    ones = np.ones(2)
    dist.all_reduce(ones)  # the next collective works
    assert np.all(ones == n)
    assert isinstance(err, ReplicaDivergenceError), repr(err)
    assert isinstance(err, MpiTensorError)
    msg = str(err)
    assert "parameter 'w2'" in msg and "rank 1" in msg and "ranks that differ: [1]" in msg
    assert "w1" not in msg and "running" not in msg
    assert "index (3, 4)" in msg
    assert err.ranks == [1] and err.reference_rank == 0
    (d,) = err.differences
    assert d["name"] == "w2" and d["kind"] == "parameter" and d["ranks"] == [1]
    assert d["count"] == 1
    assert d["max_abs_diff"] == pytest.approx(abs((before + 0.5) - before), rel=1e-12)
    assert d["detail"][1]["index"] == (3, 4)


@pytest.mark.mpi(min_size=2)
def test_verify_in_sync_tolerance_and_nan():
    n, me = world()
    ddp = DDP(MLP(7))
    if me == 1:
        ddp.module.b1._data[2] += 1e-9
    strict = outcome(ddp.verify_in_sync)
    loose = outcome(ddp.verify_in_sync, atol=1e-6)
    relative = outcome(ddp.verify_in_sync, rtol=1e-3)
    if me == 1:
        ddp.module.b1._data[2] = np.nan
    nan = outcome(ddp.verify_in_sync, atol=1.0)
    assert isinstance(strict, ReplicaDivergenceError) and "'b1'" in str(strict)
    assert loose is None and relative is None
    assert isinstance(nan, ReplicaDivergenceError) and "nan" in str(nan).lower()


@pytest.mark.mpi(min_size=3)
def test_verify_in_sync_rank_0_odd_one_out():
    n, me = world()
    ddp = DDP(MLP(7))
    if me == 0:
        ddp.module.running._data[1] = -7.0
    err = outcome(ddp.verify_in_sync)
    assert isinstance(err, ReplicaDivergenceError), repr(err)
    assert "buffer 'running'" in str(err)
    assert "rank 0 is the odd one out" in str(err)
    assert err.ranks == list(range(1, n))


@pytest.mark.mpi(min_size=2)
def test_verify_in_sync_structure_differs():
    n, me = world()
    ddp = DDP(MLP(7))
    if me == 1:
        ddp.module.register_buffer("extra", mt.tensor(np.zeros(3)))
    err = outcome(ddp.verify_in_sync)
    ones = np.ones(2)
    dist.all_reduce(ones)
    assert np.all(ones == n)
    assert isinstance(err, ReplicaDivergenceError), repr(err)
    assert "differ in structure" in str(err) and err.ranks == [1]


def test_init_sync_false_verifies_at_construction():
    n, me = world()
    same = DDP(MLP(7), init_sync=False)
    err = outcome(DDP, MLP(7 + me), init_sync=False)
    assert same.verify_in_sync() is None
    if n == 1:
        assert err is None
    else:
        assert isinstance(err, ReplicaDivergenceError), repr(err)
        assert err.ranks == list(range(1, n))
        assert "'w1'" in str(err)


# --------------------------------------------------------------------------------------------
# Bucket layouts agree across ranks (construction always; every sync in debug mode)


class _Wider(MLP):
    """Same parameter names, one layer wider: a different model."""

    def __init__(self, seed):
        super().__init__(seed)
        rng = np.random.default_rng(seed)
        self.w1 = nn.Parameter(mt.tensor(rng.uniform(-0.5, 0.5, (16, 13))))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("debug", [True, False], ids=["debug", "no-debug"])
def test_different_model_on_one_rank(debug):
    n, me = world()
    with ai.debug_mode(debug):
        err = outcome(DDP, _Wider(7) if me == 1 else MLP(7))
    ones = np.ones(2)
    dist.all_reduce(ones)
    assert np.all(ones == n)
    assert isinstance(err, CollectiveMismatchError), repr(err)
    msg = str(err)
    assert "parameter 0 (w1) is (16, 13) float64 on rank 1 but (16, 12) float64" in msg
    for r in range(n):
        assert f"  rank {r}: 1 bucket(s) of [" in msg
    assert "[531 float64]" in msg and "[547 float64]" in msg


@pytest.mark.mpi(min_size=2)
def test_different_bucket_cap_on_one_rank():
    n, me = world()
    err = outcome(DDP, MLP(7), bucket_cap_mb=0 if me == 1 else 25)
    assert isinstance(err, CollectiveMismatchError), repr(err)
    assert "rank 1 has 6 buckets, rank 0 has 1" in str(err)
    assert "same bucket_cap_mb" in str(err)


@pytest.mark.mpi(min_size=2)
def test_debug_sync_check_catches_ranks_in_different_ddps():
    """Rank 1 runs backward through another DDP: every rank raises instead of mixing buckets."""
    n, me = world()
    a = DDP(MLP(7), bucket_cap_mb=0)
    b = DDP(MLP(8, extra=True), bucket_cap_mb=0)
    x, y = batch(0, 0)[0]
    with ai.debug_mode(True):
        err = outcome(lambda: mse((b if me == 1 else a)(mt.tensor(x)), mt.tensor(y)).backward())
        ones = np.ones(2)
        dist.all_reduce(ones)  # the next matching collective works
        # and so does the next matching step
        mse(a(mt.tensor(x)), mt.tensor(y)).backward()
    assert np.all(ones == n)
    assert isinstance(err, CollectiveMismatchError), repr(err)
    msg = str(err)
    assert "sync check" in msg and "rank 1 has 7 buckets, rank 0 has 6" in msg
    for r in range(n):
        assert f"  rank {r}: " in msg
    assert a.comm_stats.steps == 1 and b.comm_stats.steps == 0
    assert_replicas_equal([p.grad for p in a.parameters()])


def test_no_layout_traffic_outside_debug(monkeypatch):
    """The hot path stays as it was: no layout check per step unless debug mode is on."""
    n, me = world()
    ddp = DDP(MLP(7))
    calls = []
    monkeypatch.setattr(ddp, "_check_layout", lambda when: calls.append(when))
    x, y = batch(me, 0)[0]
    with ai.debug_mode(False):
        mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
    with ai.debug_mode(True):
        mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
    assert calls == ([] if n == 1 else ["sync"])
