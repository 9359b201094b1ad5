"""DistributedDataParallel at 1-4 ranks: equivalence with single-process training, and the rest.

The key test: for world size n, every rank trains a reference copy of the same seeded model in
one process on the full global batch, and a DDP replica on its shard (global / n samples); after
N steps of SGD with momentum both must hold the same parameters (float64 rtol 1e-10, float32
rtol 1e-5, tolerances relative to each tensor's largest entry), and every replica must be
bitwise equal to every other. The matrix covers bucket sizes (one per parameter, tiny,
default), overlap on and off, gradient_as_bucket_view, no_sync gradient accumulation, ranks that
start from different weights, unused parameters, a sub-group, and LeNet. Buffer broadcasts
follow torch's rule (the previous forward decides; checked against torch itself in
``test_ddp_buffers.py``).

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_ddp.py``.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling
from mpitensor.autograd import ArrayFunction as Function
from mpitensor.backend import array_module
from mpitensor.models import LeNet
from mpitensor.nn.parallel import (
    DistributedDataParallel as DDP,
)
from mpitensor.nn.parallel import (
    average_gradients,
    broadcast_parameters,
)
from mpitensor.optim import SGD

from . import arrayimpl as ai

pytestmark = pytest.mark.mpi(min_size=1)


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread():
    """One BLAS thread per rank: N ranks on few cores with N spinning BLAS pools run LeNet ~10x
    slower (OpenBLAS threads busy-wait, as MPI ranks do)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # not a dependency of mpitensor; only the speed of this file suffers
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield

STEPS = 5
RTOL = {np.float64: 1e-10, np.float32: 1e-5}


def world():
    return dist.get_world_size(), dist.get_rank()


def global_batch(n):
    return 48 if n == 3 else 64


# --------------------------------------------------------------------------------------------
# A small model made of test-local autograd Functions, so that most tests exercise DDP on its
# own (the library's layers have their own tests); LeNet, with the library's layers and losses,
# runs at the end.


class _Linear(Function):
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x @ w.T + b

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.T @ x, g.sum(axis=0)


class _Tanh(Function):
    @staticmethod
    def forward(ctx, x):
        y = array_module(x).tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return (g * (1 - y * y),)


class _MSE(Function):
    @staticmethod
    def forward(ctx, y, t):
        d = y - t
        ctx.save_for_backward(d)
        return array_module(d).asarray((d * d).mean())  # NumPy gives a scalar: make it 0-d

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        return (g * 2 * d / d.size, None)


class _AddBias(Function):
    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, g):
        return g, g.sum(axis=0)


def mse(y, t):
    return _MSE.apply(y, t)


class MLP(nn.Module):
    """12 -> 16 -> 16 -> 3, tanh; optional unused parameter, optional extra branch, a buffer."""

    def __init__(self, seed, dtype=np.float64, unused=False, extra=False):
        super().__init__()
        rng = np.random.default_rng(seed)

        def p(*shape):
            return nn.Parameter(mt.tensor(rng.uniform(-0.5, 0.5, shape).astype(dtype)))

        self.w1, self.b1 = p(16, 12), p(16)
        self.w2, self.b2 = p(16, 16), p(16)
        if unused:
            self.spare = p(5)
        self.w3, self.b3 = p(3, 16), p(3)
        if extra:
            self.extra = p(3)
        self.register_buffer("running", mt.tensor(rng.uniform(0, 1, 4).astype(dtype)))

    def forward(self, x, use_extra=True):
        h = _Tanh.apply(_Linear.apply(x, self.w1, self.b1))
        h = _Tanh.apply(_Linear.apply(h, self.w2, self.b2))
        y = _Linear.apply(h, self.w3, self.b3)
        if use_extra and "extra" in self._parameters:
            y = _AddBias.apply(y, self.extra)
        return y


def data(step, n_samples, dtype):
    rng = np.random.default_rng(1000 + step)
    x = rng.standard_normal((n_samples, 12)).astype(dtype)
    y = rng.standard_normal((n_samples, 3)).astype(dtype)
    return x, y


def shard(arr, n, r):
    b = arr.shape[0] // n
    return arr[r * b:(r + 1) * b]


def val(t):
    """A tensor's values as a NumPy array (shared, not copied)."""
    return t.detach().numpy()


def assert_close(got, ref, dtype, what):
    rtol = RTOL[dtype]
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * float(np.abs(ref).max()),
                               err_msg=what)


def assert_replicas_equal(params):
    """Every rank holds bitwise the same values (gathered to every rank, checked everywhere)."""
    mine = [np.asarray(p._data) for p in params]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    for r, theirs in enumerate(everyone):
        for i, (a, b) in enumerate(zip(theirs, mine)):
            assert np.array_equal(a, b), f"parameter {i} differs between rank {r} and this rank"


def train_pair(dtype=np.float64, micro=1, different_start=False, model_kw=None,
               make=None, batches=None, loss=None, lr=0.1, **ddp_kw):
    """Train a single-process reference and a DDP replica; return both models and the DDP.

    ``make(seed, dtype)`` builds the model (default: :class:`MLP`), ``batches(step, n, dtype)``
    gives a global batch of arrays ``(x, y)`` (default: :func:`data`), ``loss(out, y)`` the
    loss (default: MSE). With ``micro > 1`` each step accumulates ``micro - 1`` micro-batches
    under ``no_sync`` and syncs on the last; ``ddp.test_sync_log`` records
    ``comm_stats.steps`` around them.
    """
    n, me = world()
    g = global_batch(n)
    model_kw = model_kw or {}
    make = make or (lambda seed, dt: MLP(seed, dt, **model_kw))
    batches = batches or data
    loss = loss or mse
    ref = make(7, dtype)
    ddp = DDP(make(7 + (97 * me if different_start else 0), dtype), **ddp_kw)
    ddp.test_sync_log = []
    opt_ref = SGD(ref.parameters(), lr=lr, momentum=0.9)
    opt = SGD(ddp.parameters(), lr=lr, momentum=0.9)
    for step in range(STEPS):
        x, y = batches(step, g, dtype)
        opt_ref.zero_grad()
        loss(ref(mt.tensor(x)), mt.tensor(y)).backward()
        opt_ref.step()

        xs, ys = shard(x, n, me), shard(y, n, me)
        opt.zero_grad()
        if micro == 1:
            loss(ddp(mt.tensor(xs)), mt.tensor(ys)).backward()
        else:
            parts = list(zip(np.split(xs, micro), np.split(ys, micro)))
            log = [ddp.comm_stats.steps]
            with ddp.no_sync():
                for xp, yp in parts[:-1]:
                    (loss(ddp(mt.tensor(xp)), mt.tensor(yp)) / micro).backward()
            log.append(ddp.comm_stats.steps)
            xp, yp = parts[-1]
            (loss(ddp(mt.tensor(xp)), mt.tensor(yp)) / micro).backward()
            log.append(ddp.comm_stats.steps)
            ddp.test_sync_log.append(log)
        opt.step()
    return ref, ddp


def check_equivalent(ref, ddp, dtype):
    # Collectives first, rank-local assertions after: a rank that fails must not leave the
    # others waiting in a collective it never enters.
    assert_replicas_equal(list(ddp.parameters()))
    for (name, p), (rname, q) in zip(ddp.module.named_parameters(), ref.named_parameters()):
        assert name == rname
        assert p.dtype == np.dtype(dtype)
        assert_close(val(p), val(q), dtype, f"parameter {name} after {STEPS} steps")


# --------------------------------------------------------------------------------------------
# Equivalence


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("cap", [0, 0.0005, 25], ids=["per-param", "tiny", "default"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_equivalence(dtype, cap, overlap):
    ref, ddp = train_pair(dtype, bucket_cap_mb=cap, overlap=overlap)
    check_equivalent(ref, ddp, dtype)
    assert ddp.comm_stats.steps == STEPS
    if cap == 0:
        assert ddp.comm_stats.num_buckets == 6  # one per parameter
    if cap == 25:
        assert ddp.comm_stats.num_buckets == 1  # 4 kB of parameters: one bucket
    if overlap and cap == 0:
        assert ddp.comm_stats.overlapped >= 1  # launched before backward ended
    if not overlap:
        assert ddp.comm_stats.overlapped == 0


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("cap", [0, 25], ids=["per-param", "default"])
def test_equivalence_no_sync(dtype, cap):
    """Two micro-batches accumulated under no_sync, then one synced: same as one big batch."""
    ref, ddp = train_pair(dtype, micro=2, bucket_cap_mb=cap)
    check_equivalent(ref, ddp, dtype)
    assert ddp.comm_stats.steps == STEPS
    # no communication inside no_sync; one sync by the first backward after it
    assert ddp.test_sync_log == [[s, s, s + 1] for s in range(STEPS)]


@pytest.mark.parametrize("micro", [1, 2])
def test_equivalence_gradient_as_bucket_view(micro):
    ref, ddp = train_pair(np.float64, micro=micro, bucket_cap_mb=0.0005,
                          gradient_as_bucket_view=True)
    check_equivalent(ref, ddp, np.float64)
    # every gradient is a view of its bucket's flat buffer
    for p in ddp.parameters():
        base = p.grad._data.base
        assert base is not None and any(base is b.buffer for b in ddp.reducer.buckets)


def test_equivalence_set_to_none_false():
    """zero_grad(set_to_none=False) keeps .grad objects; with bucket views no copy is needed."""
    n, me = world()
    ddp = DDP(MLP(7), gradient_as_bucket_view=True)
    ref = MLP(7)
    opt, opt_ref = SGD(ddp.parameters(), lr=0.05), SGD(ref.parameters(), lr=0.05)
    for step in range(STEPS):
        x, y = data(step, global_batch(n), np.float64)
        for o, m, xs, ys in ((opt_ref, ref, x, y), (opt, ddp, shard(x, n, me), shard(y, n, me))):
            o.zero_grad(set_to_none=False)
            mse(m(mt.tensor(xs)), mt.tensor(ys)).backward()
            o.step()
    check_equivalent(ref, ddp, np.float64)


def test_ranks_start_different_end_equal():
    """Construction broadcasts rank 0's parameters and buffers: different seeds, same result."""
    n, me = world()
    model = MLP(7 + 97 * me)
    before = val(model.running).copy()
    ddp = DDP(model)
    ref = MLP(7)
    ref2, ddp2 = train_pair(np.float64, different_start=True)
    check_equivalent(ref2, ddp2, np.float64)
    for (name, p), q in zip(ddp.module.named_parameters(), ref.parameters()):
        assert np.array_equal(val(p), val(q)), name
    assert np.array_equal(val(ddp.module.running), val(ref.running))
    if me != 0:
        assert not np.array_equal(before, val(ref.running))
    # one coalesced broadcast for all parameters and buffers of the one dtype
    assert ddp._init_broadcasts == 1


def test_init_broadcast_one_per_dtype(monkeypatch):
    n, me = world()
    model = MLP(3 + me)
    model.half_param = nn.Parameter(mt.tensor(np.full(4, float(me), dtype=np.float32)))
    calls = []
    world_group = dist.group.WORLD
    real = world_group.broadcast

    def counting(tensor, *args, **kwargs):
        calls.append(getattr(tensor, "dtype", None))
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(world_group, "broadcast", counting)
    DDP(model)
    monkeypatch.undo()
    assert len(calls) == 2, calls  # float64 (params + buffer) and float32
    assert np.array_equal(val(model.half_param), np.zeros(4, np.float32))
    assert np.array_equal(val(model.w1), val(MLP(3).w1))


# --------------------------------------------------------------------------------------------
# Overlap: all-reduces are launched while backward still runs


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_order_of_events(overlap):
    n, me = world()
    ddp = DDP(MLP(7), bucket_cap_mb=0, overlap=overlap)
    m = ddp.module
    bucket_of = {}
    for b in ddp.reducer.buckets:
        for i in b.params:
            bucket_of[id(ddp.reducer.params[i])] = b.index
    events = []
    real_launch = ddp.reducer._launch

    def logged_launch(bucket):
        events.append(("launch", bucket.index))
        return real_launch(bucket)

    ddp.reducer._launch = logged_launch
    seen_at_w1 = {}

    def on_w1(p):
        events.append(("grad", "w1"))
        seen_at_w1["launched"] = [b.work is not None for b in ddp.reducer.buckets]
        seen_at_w1["in_backward"] = ddp.reducer.in_backward

    for name in ("w3", "w2"):
        getattr(m, name).register_post_accumulate_grad_hook(
            lambda p, name=name: events.append(("grad", name)))
    m.w1.register_post_accumulate_grad_hook(on_w1)
    x, y = data(0, 8, np.float64)
    waits_before = ddp.comm_stats.total_wait_s
    t0 = time.perf_counter()
    mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
    step_s = time.perf_counter() - t0
    last = bucket_of[id(m.b3)]
    assert last == 0  # reverse registration order: the last layer's bias comes first
    assert seen_at_w1["in_backward"]
    launches = [e[1] for e in events if e[0] == "launch"]
    assert launches == sorted(launches) == list(range(6))  # in bucket order, each once
    i_w1 = events.index(("grad", "w1"))
    i_last = events.index(("launch", last))
    i_w3 = events.index(("launch", bucket_of[id(m.w3)]))
    if overlap:
        # the last layer's buckets were on the wire before the first layer's gradient existed
        assert i_last < i_w1 and i_w3 < i_w1
        assert seen_at_w1["launched"][last] and seen_at_w1["launched"][bucket_of[id(m.w3)]]
        assert ddp.comm_stats.overlapped >= 4
    else:
        assert i_last > i_w1
        assert not any(seen_at_w1["launched"])
        assert ddp.comm_stats.overlapped == 0
    assert ddp.comm_stats.launched == 6
    # the wait is measured inside this backward: part of its time, and added to the total
    assert 0.0 <= ddp.comm_stats.last_wait_s <= step_s
    assert ddp.comm_stats.total_wait_s == pytest.approx(waits_before
                                                        + ddp.comm_stats.last_wait_s)


# --------------------------------------------------------------------------------------------
# Unused parameters


def test_unused_parameter_without_flag_raises():
    """As torch: backward returns, the next forward with gradients enabled raises on every rank
    (the unused parameter is the same on every rank), and the group stays usable."""
    n, me = world()
    ddp = DDP(MLP(7, unused=True), bucket_cap_mb=0)
    x, y = data(0, 8, np.float64)
    mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
    after_backward = (ddp.module.spare.grad is None, ddp.comm_stats.steps,
                      ddp.module.w1.grad is not None)
    err = None
    try:
        ddp(mt.tensor(x))
    except RuntimeError as exc:
        err = exc
    # every rank raised the same error in the same call: the group is still usable
    mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
    assert_replicas_equal([p.grad for n_, p in ddp.module.named_parameters() if n_ != "spare"])
    assert after_backward == (True, 1, True)
    assert err is not None and "find_unused_parameters=True" in str(err)
    assert f"rank {me}: " in str(err) and "spare" in str(err)
    assert ddp.comm_stats.steps == 2


@pytest.mark.mpi(min_size=2)
def test_unused_parameter_on_one_rank_only_never_hangs():
    """Without find_unused_parameters, a branch unused on the last rank only: backward
    completes everywhere, that rank raises at its next forward, and the others are told
    (PeerFailedError) instead of waiting for it."""
    from mpitensor.errors import PeerFailedError

    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="ddp_unused")
    ddp = DDP(MLP(7, extra=True), process_group=g, bucket_cap_mb=0)
    bad = n - 1
    x, y = data(0, 8, np.float64)
    mse(ddp(mt.tensor(x), use_extra=(me != bad)), mt.tensor(y)).backward()
    extra = val(ddp.module.extra.grad).copy() if ddp.module.extra.grad is not None else None
    outcome = None
    try:
        for _ in range(2):
            mse(ddp(mt.tensor(x)), mt.tensor(y)).backward()
        outcome = "ok"
    except PeerFailedError as exc:
        outcome = ("peer", exc.rank)
    except RuntimeError as exc:
        outcome = ("own", "find_unused_parameters=True" in str(exc) and "extra" in str(exc))
    dist.destroy_process_group(g)
    if me == bad:
        assert outcome == ("own", True)
        assert extra is None  # no gradient there: left alone
    else:
        assert outcome == ("peer", bad)
        assert extra is not None


@pytest.mark.parametrize("cap", [0, 25])
def test_find_unused_parameters_equivalence(cap):
    ref, ddp = train_pair(np.float64, model_kw={"unused": True}, bucket_cap_mb=cap,
                          find_unused_parameters=True)
    check_equivalent(ref, ddp, np.float64)
    assert ddp.module.spare.grad is None  # unused on every rank: left alone, as torch


def test_parameter_used_on_some_ranks_only():
    """A branch used only on rank 0: its gradient is rank 0's / n on every rank."""
    n, me = world()
    g = global_batch(n)
    ddp = DDP(MLP(7, extra=True), find_unused_parameters=True, bucket_cap_mb=0)
    x, y = data(0, g, np.float64)
    xs, ys = shard(x, n, me), shard(y, n, me)
    mse(ddp(mt.tensor(xs), use_extra=(me == 0)), mt.tensor(ys)).backward()
    # expected: rank 0's local gradient of `extra`, divided by n (the others contribute zero)
    local = MLP(7, extra=True)
    mse(local(mt.tensor(shard(x, n, 0)), use_extra=True), mt.tensor(shard(y, n, 0))).backward()
    assert_replicas_equal([p.grad for p in ddp.module.parameters()])
    np.testing.assert_allclose(val(ddp.module.extra.grad), val(local.extra.grad) / n,
                               rtol=1e-12, atol=1e-15)


def test_static_graph_learns_unused():
    ref, ddp = train_pair(np.float64, model_kw={"unused": True}, static_graph=True)
    check_equivalent(ref, ddp, np.float64)
    r = ddp.reducer
    assert r.static_unused == [i for i, p in enumerate(r.params) if p is ddp.module.spare]
    assert ddp.module.spare.grad is None


# --------------------------------------------------------------------------------------------
# Buffers, groups, state_dict, the tutorial helpers


def buffer_sync_sequence(ddp, me):
    """Drive ``ddp`` through forwards of every kind; return the buffer each one saw.

    Before each forward every rank sets the buffer to ``me + 1``; the value the module then
    holds is rank 0's (1.0) where that forward broadcast the buffers.
    """
    x, y = data(0, 4, np.float64)
    seen = {}

    def run(tag, grad=True, backward=True, no_sync=False, train=True):
        ddp.module.running._data[...] = me + 1.0
        ddp.train(train)
        ctx = ddp.no_sync() if no_sync else mt.enable_grad()
        with ctx, mt.set_grad_enabled(grad):
            out = ddp(mt.tensor(x))
            seen[tag] = float(val(ddp.module.running)[0])
            if backward:
                mse(out, mt.tensor(y)).backward()

    run("no_grad, first forward", grad=False, backward=False)
    run("no_grad, again", grad=False, backward=False)
    run("train after no_grad")
    run("train after train")
    run("eval no_grad after train", grad=False, backward=False, train=False)
    run("no_sync after eval", no_sync=True)
    run("train after no_sync")
    run("eval mode with grad, after train", train=False)
    return seen


#: torch.nn.parallel.DistributedDataParallel's buffer broadcasts for that sequence, as
#: observed with torch 2.x and gloo (test_ddp_buffers.py checks them against torch itself):
#: the previous forward decides (it synchronised gradients, or there was none).
TORCH_BUFFER_SYNCS = {
    "no_grad, first forward": True,
    "no_grad, again": False,
    "train after no_grad": False,
    "train after train": True,
    "eval no_grad after train": True,
    "no_sync after eval": False,
    "train after no_sync": False,
    "eval mode with grad, after train": True,
}


def test_broadcast_buffers_follow_the_previous_forward():
    n, me = world()
    seen = buffer_sync_sequence(DDP(MLP(7)), me)
    off = buffer_sync_sequence(DDP(MLP(7), broadcast_buffers=False), me)
    assert seen == {k: 1.0 if v else me + 1.0 for k, v in TORCH_BUFFER_SYNCS.items()}
    assert off == {k: me + 1.0 for k in TORCH_BUFFER_SYNCS}


def test_broadcast_buffers_one_coalesced_broadcast_per_dtype(monkeypatch):
    """A forward that syncs buffers makes one broadcast per dtype; the others make none."""
    n, me = world()
    model = MLP(7)
    model.register_buffer("count", mt.tensor(np.array(me, np.int64)))
    ddp = DDP(model)
    calls = []
    real = ddp.process_group.broadcast

    def counting(tensor, *args, **kwargs):
        calls.append(np.dtype(tensor.dtype).name)
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(ddp.process_group, "broadcast", counting)
    x = mt.tensor(data(0, 4, np.float64)[0])
    ddp(x)
    first = sorted(calls)
    with mt.no_grad():
        ddp(x)  # broadcasts: the previous forward synchronised
        ddp(x)  # does not
    monkeypatch.undo()
    if n == 1:  # nothing to broadcast to
        assert calls == []
        return
    assert first == ["float64", "int64"]
    assert len(calls) == 4
    assert int(val(model.count)) == 0


@pytest.mark.mpi(min_size=2)
def test_process_group_subset():
    """DDP over the group of ranks 1..n-1: averages over its members only."""
    n, me = world()
    tail = ai.get_group("tail")
    if dist.get_rank(tail) < 0:
        with pytest.raises(ValueError, match="not a member"):
            DDP(MLP(7), process_group=tail)
        return
    size = n - 1
    g = 16 * size
    ddp = DDP(MLP(7 + me), process_group=tail, bucket_cap_mb=0.0005)
    ref = MLP(7 + 1)  # group rank 0 is global rank 1: its weights win
    opt, opt_ref = SGD(ddp.parameters(), lr=0.1, momentum=0.9), SGD(ref.parameters(), lr=0.1,
                                                                    momentum=0.9)
    for step in range(3):
        x, y = data(step, g, np.float64)
        opt_ref.zero_grad()
        mse(ref(mt.tensor(x)), mt.tensor(y)).backward()
        opt_ref.step()
        r = dist.get_rank(tail)
        opt.zero_grad()
        mse(ddp(mt.tensor(shard(x, size, r))), mt.tensor(shard(y, size, r))).backward()
        opt.step()
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        assert_close(val(p), val(q), np.float64, "sub-group replica")


def test_state_dict_and_module():
    ddp = DDP(MLP(7))
    keys = list(ddp.state_dict())
    assert keys[0] == "module.w1" and "module.running" in keys
    assert set(keys) == {"module." + k for k in ddp.module.state_dict()}
    assert [id(p) for p in ddp.parameters()] == [id(p) for p in ddp.module.parameters()]


def test_average_gradients_and_broadcast_parameters():
    """The tutorial's explicit recipe gives the same result as DDP."""
    n, me = world()
    g = global_batch(n)
    model = MLP(7 + me)
    model.half_param = nn.Parameter(mt.tensor(np.full(4, float(me), dtype=np.float32)))
    broadcast_parameters(model)
    ref = MLP(7)
    start_ok = [np.array_equal(val(p), val(q)) for p, q in zip(model.parameters(),
                                                                 ref.parameters())]
    start_ok.append(np.array_equal(val(model.running), val(ref.running)))
    start_ok.append(np.array_equal(val(model.half_param), np.zeros(4, np.float32)))
    opt, opt_ref = SGD(model.parameters(), lr=0.1), SGD(ref.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = data(step, g, np.float64)
        opt_ref.zero_grad()
        mse(ref(mt.tensor(x)), mt.tensor(y)).backward()
        opt_ref.step()
        opt.zero_grad()
        mse(model(mt.tensor(shard(x, n, me))), mt.tensor(shard(y, n, me))).backward()
        average_gradients(model)
        opt.step()
    assert_replicas_equal(list(model.parameters()))
    assert all(start_ok), start_ok
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert_close(val(p), val(q), np.float64, name)


def test_average_gradients_tutorial_values():
    """Every rank's grad becomes the mean over ranks; a list of tensors works too."""
    n, me = world()
    a = mt.tensor(np.full((2, 3), float(me + 1)), requires_grad=True)
    b = mt.tensor(np.arange(4, dtype=np.float32) * (me + 1), requires_grad=True)
    a.grad, b.grad = mt.tensor(val(a).copy()), mt.tensor(val(b).copy())
    average_gradients([a, b])
    mean = (n + 1) / 2
    np.testing.assert_allclose(val(a.grad), np.full((2, 3), mean))
    np.testing.assert_allclose(val(b.grad), np.arange(4) * mean, rtol=1e-6)


# --------------------------------------------------------------------------------------------
# LeNet with the library's layers and losses


def lenet(seed, dtype):
    mt.manual_seed(seed)
    net = LeNet()
    return net.double() if dtype == np.float64 else net


def images(step, n_samples, dtype):
    rng = np.random.default_rng(2000 + step)
    x = rng.standard_normal((n_samples, 1, 28, 28)).astype(dtype)
    y = rng.integers(0, 10, n_samples)
    return x, y


@pytest.mark.parametrize("dtype,cap,overlap,loss", [
    (np.float64, 0, True, F.nll_loss),
    (np.float32, 25, True, F.nll_loss),
    (np.float32, 0.1, False, F.cross_entropy),
], ids=["f64-per-param-overlap-nll", "f32-default-nll", "f32-0.1MB-no-overlap-ce"])
def test_lenet_equivalence(dtype, cap, overlap, loss):
    ref, ddp = train_pair(dtype, make=lenet, batches=images, loss=loss, lr=0.05,
                          different_start=True, bucket_cap_mb=cap, overlap=overlap)
    check_equivalent(ref, ddp, dtype)
    if cap == 0:
        assert ddp.comm_stats.num_buckets == 10
        assert ddp.comm_stats.overlapped >= 1
    if cap == 25:
        assert ddp.comm_stats.num_buckets == 1  # 247 kB: under the 1 MiB first-bucket cap


@pytest.mark.parametrize("view", [False, True])
def test_lenet_equivalence_no_sync(view):
    ref, ddp = train_pair(np.float64, micro=2, make=lenet, batches=images, loss=F.nll_loss,
                          lr=0.05, bucket_cap_mb=0.1, gradient_as_bucket_view=view)
    check_equivalent(ref, ddp, np.float64)
    assert ddp.test_sync_log == [[s, s, s + 1] for s in range(STEPS)]


@pytest.mark.mpi(min_size=2)
def test_exception_in_backward_on_one_rank_never_diverges():
    """A hook raises during one rank's backward; that rank catches it and trains on. The other
    ranks' gradient all-reduces must never match its next step's (silent divergence): every
    rank raises PeerFailedError at its next DDP step, and no rank stepped after the fault."""
    from mpitensor.errors import PeerFailedError

    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="ddp_fault")
    ddp = DDP(MLP(7), process_group=g, bucket_cap_mb=0)  # one bucket per parameter
    opt = SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    bad = n - 1
    calls = []

    def fail_at_step_1(p):
        calls.append(1)
        if me == bad and len(calls) == 2:
            raise FloatingPointError("hook failed on purpose")

    handle = ddp.module.w1.register_post_accumulate_grad_hook(fail_at_step_1)
    outcomes = []
    for step in range(4):
        x, y = data(step, 4 * n, np.float64)
        try:
            opt.zero_grad()
            mse(ddp(mt.tensor(shard(x, n, me))), mt.tensor(shard(y, n, me))).backward()
            opt.step()
            outcomes.append("ok")
        except FloatingPointError as exc:  # the careless loop: log and go on
            assert any("ddp_fault is unusable from here on" in note for note in exc.__notes__)
            outcomes.append("own")
        except PeerFailedError as exc:
            assert re.search(rf"rank {bad}( \(this rank\))? failed in DistributedDataParallel "
                             r"backward .*FloatingPointError interrupted", str(exc)), str(exc)
            assert exc.rank == bad
            outcomes.append("peer")
            break
    handle.remove()
    assert outcomes == (["ok", "own", "peer"] if me == bad else ["ok", "peer"]), outcomes
    assert_replicas_equal(list(ddp.parameters()))  # one step each, on the world group
    dist.destroy_process_group(g)
