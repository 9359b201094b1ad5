"""DDP communication hooks: ``register_comm_hook``, ``GradBucket``, the default hooks, PowerSGD
(checked against a hand computation of its steps), ``Work.get_future`` and
``algorithms.join``. World size 1 here (MPI's singleton); 2 ranks under ``mpiexec`` at the end
(the same hand computations over both ranks' gradients).

Gradients are torch's (the oracle): the model's weights are copied into a torch model.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor._ops import random as _random
from mpitensor.distributed.algorithms.ddp_comm_hooks import (
    DDPCommHookType,
    default_hooks,
    powerSGD_hook,
    register_ddp_comm_hook,
)
from mpitensor.futures import Future
from mpitensor.nn.parallel import DistributedDataParallel as DDP

from .launch import mpiexec_run
from .test_ddp import world  # noqa: F401 - the fixture: a default group of size 1

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parent.parent
DTYPES = [np.float32, np.float64]


def make(dtype, seed=0):
    """Linear(6, 5) -> tanh -> Linear(5, 4) with seeded weights; the same model in torch."""
    rng = np.random.default_rng(seed)
    shapes = [(5, 6), (5,), (4, 5), (4,)]
    vals = [rng.uniform(-0.5, 0.5, s).astype(dtype) for s in shapes]
    m = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4)).to(mt.float64 if dtype ==
                                                                      np.float64 else mt.float32)
    for p, v in zip(m.parameters(), vals):
        p.data = mt.tensor(v.copy())
    t = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 4))
    t = t.to(torch.float64 if dtype == np.float64 else torch.float32)
    with torch.no_grad():
        for p, v in zip(t.parameters(), vals):
            p.copy_(torch.from_numpy(v.copy()))
    return m, t


def inputs(step, dtype, rank=0):
    return np.random.default_rng(100 + 10 * step + rank).standard_normal((8, 6)).astype(dtype)


def torch_grads(tmodel, x):
    """torch's gradients of sum(model(x)**2), in bucket order (reverse registration)."""
    tmodel.zero_grad()
    (tmodel(torch.from_numpy(x)) ** 2).sum().backward()
    return [p.grad.numpy().copy() for p in reversed(list(tmodel.parameters()))]


def our_step(ddp, x):
    for p in ddp.parameters():
        p.grad = None
    (ddp(mt.tensor(x)) ** 2).sum().backward()
    return [p.grad.numpy().copy() for p in reversed(list(ddp.parameters()))]


def tol(dtype, n=8):
    return dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=n * 4e-7,
                                                                        atol=n * 4e-7)


# ---------------------------------------------------------------------------- hand PowerSGD
def orth(m):
    """Gram-Schmidt on the columns of m (n x r), as PowerSGD's for rank <= 2."""
    m = m.copy()
    for i in range(m.shape[1]):
        m[:, i] /= np.linalg.norm(m[:, i])
        for j in range(i + 1, m.shape[1]):
            m[:, j] -= (m[:, i] @ m[:, j]) * m[:, i]
    return m


def hand_powersgd(grads_per_rank, errors, qs, rank=1, min_rate=2):
    """One PowerSGD step over ranks. ``grads_per_rank[r]``: rank r's gradients in bucket order;
    ``errors[r]``: its flat error (or None); ``qs``: per compressed matrix its Q before
    orthogonalization. Returns (result per rank, new error per rank, new qs)."""
    n_ranks = len(grads_per_rank)
    shapes = [g.shape for g in grads_per_rank[0]]
    flats = [np.concatenate([g.ravel() for g in gs]) for gs in grads_per_rank]
    if errors is not None:
        flats = [f + e for f, e in zip(flats, errors)]
    out = np.zeros_like(flats[0])
    new_qs, k, at = [], 0, 0
    for s in shapes:
        size = int(np.prod(s))
        n = s[0] if s else 1
        m = size // n
        r = min(n, m, rank)
        mats = [f[at:at + size].reshape(n, m) for f in flats]
        if (n + m) * r * min_rate < n * m:
            q = orth(qs[k])
            p = orth(sum(mat @ q for mat in mats))
            qn = sum(mat.T @ p for mat in mats) / n_ranks
            out[at:at + size] = (p @ qn.T).ravel()
            new_qs.append(qn)
            k += 1
        else:
            out[at:at + size] = sum(f[at:at + size] for f in flats) / n_ranks
        at += size
    return out, [f - out for f in flats], new_qs


def first_qs(shapes, seed_rng, dtype, rank=1):
    """The initial Qs the hook draws: one generator seeded from the state's RandomState, its
    numbers taken by the compressed matrices in turn (standard normal, in the bucket dtype)."""
    gen = _random.Generator().manual_seed(int(seed_rng.randint(1_000_000_000)))
    out = []
    for n, m in shapes:
        r = min(n, m, rank)
        out.append(_random.randn(1, m, r, generator=gen, dtype=np.dtype(dtype))._data[0]
                   .astype(np.float64))
    return out


# ------------------------------------------------------------------------------ the hooks
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.usefixtures("world")
def test_allreduce_hook_equals_torch_gradients(dtype):
    m, t = make(dtype)
    ddp = DDP(m)
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    for step in range(2):
        x = inputs(step, dtype)
        for ours, ref in zip(our_step(ddp, x), torch_grads(t, x)):
            np.testing.assert_allclose(ours, ref, **tol(dtype))
            assert ours.dtype == dtype


@pytest.mark.parametrize("name,half,eps", [("fp16_compress_hook", torch.float16, 2.0 ** -11),
                                           ("bf16_compress_hook", torch.bfloat16, 2.0 ** -8)])
@pytest.mark.parametrize("wrapped", [False, True])
@pytest.mark.usefixtures("world")
def test_low_precision_hooks_round_like_torch(name, half, eps, wrapped):
    dtype = np.float32
    m, t = make(dtype)
    hook = getattr(default_hooks, name)
    if wrapped:
        wrap = (default_hooks.fp16_compress_wrapper if half == torch.float16
                else default_hooks.bf16_compress_wrapper)
        hook = wrap(default_hooks.allreduce_hook)
    ddp = DDP(m)
    ddp.register_comm_hook(None, hook)
    x = inputs(0, dtype)
    for ours, ref in zip(our_step(ddp, x), torch_grads(t, x)):
        rounded = torch.from_numpy(ref).to(half).to(torch.float32).numpy()
        assert ours.dtype == np.float32
        # one rounding to the half type (the float32 gradients agree to a few ulps first)
        np.testing.assert_allclose(ours, rounded, rtol=eps, atol=1e-6)
        assert np.abs(ours - ref).max() <= eps * np.abs(ref).max() + 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.usefixtures("world")
def test_powersgd_matches_the_hand_computation(dtype):
    m, t = make(dtype)
    ddp = DDP(m)
    state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1,
                                        start_powerSGD_iter=2, random_seed=3)
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    for step in range(2):  # plain averaging before start_powerSGD_iter
        x = inputs(step, dtype)
        for ours, ref in zip(our_step(ddp, x), torch_grads(t, x)):
            np.testing.assert_allclose(ours, ref, **tol(dtype))
    assert state.iter == 2 and not state.error_dict
    seeds = np.random.RandomState(3)
    qs = first_qs([(4, 5), (5, 6)], seeds, dtype)  # bucket order: w2, then w1 (biases plain)
    errors = None
    for step in (2, 3):  # the first compressed step (fresh Q), then warm start + error feedback
        x = inputs(step, dtype)
        grads = torch_grads(t, x)
        want, errs, qs = hand_powersgd([[g.astype(np.float64) for g in grads]], errors, qs)
        ours = our_step(ddp, x)
        got = np.concatenate([g.ravel() for g in ours])
        scale = np.abs(want).max()
        t_ = tol(dtype, 64)
        np.testing.assert_allclose(got, want, rtol=t_["rtol"], atol=t_["atol"] * scale)
        np.testing.assert_allclose(state.error_dict[0].numpy(), errs[0], rtol=t_["rtol"],
                                   atol=t_["atol"] * scale)
        errors = errs
        # the two weight gradients are replaced by rank-1 matrices, the biases stay exact
        assert np.linalg.matrix_rank(ours[1].astype(np.float64), tol=1e-4 * scale) == 1
        np.testing.assert_allclose(ours[0], grads[0] + 0, **tol(dtype, 64))
    assert state.iter == 4
    rate, before, after = state.compression_stats()
    assert (before, after) == (2 * (20 + 4 + 30 + 5), 2 * (9 + 4 + 11 + 5))
    assert rate == before / after


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.usefixtures("world")
def test_batched_powersgd_is_a_rank_r_projection(dtype):
    m, t = make(dtype)
    ddp = DDP(m)
    state = powerSGD_hook.PowerSGDState(None, start_powerSGD_iter=2, warm_start=False,
                                        use_error_feedback=False, random_seed=5,
                                        matrix_approximation_rank=2)
    ddp.register_comm_hook(state, powerSGD_hook.batched_powerSGD_hook)
    for step in range(2):
        our_step(ddp, inputs(step, dtype))
    x = inputs(2, dtype)
    grads = torch_grads(t, x)
    flat = np.concatenate([g.ravel() for g in grads]).astype(np.float64)
    side = int(np.ceil(np.sqrt(flat.size)))
    mat = np.zeros(side * side)
    mat[:flat.size] = flat
    mat = mat.reshape(side, side)
    seeds = np.random.RandomState(5)
    seeds.randint(1_000_000_000)  # the two plain steps drew nothing; a fresh Q draws one
    gen = _random.Generator().manual_seed(int(np.random.RandomState(5).randint(1_000_000_000)))
    q = _random.randn(side, 2, generator=gen, dtype=np.dtype(dtype))._data.astype(np.float64)
    p = orth(mat @ orth(q))
    want = (p @ (mat.T @ p).T).ravel()[:flat.size]
    got = np.concatenate([g.ravel() for g in our_step(ddp, x)])
    t_ = tol(dtype, 64)
    np.testing.assert_allclose(got, want, rtol=t_["rtol"], atol=t_["atol"] * np.abs(want).max())
    assert not state.p_memory_dict and not state.q_memory_dict  # no warm start: memory freed


@pytest.mark.usefixtures("world")
def test_grad_bucket_seen_by_a_hook():
    m, _ = make(np.float64)
    ddp = DDP(m, bucket_cap_mb=0)  # one bucket per parameter
    seen = []

    def hook(state, bucket):
        seen.append((state, bucket.index(), bucket.is_last(), bucket.buffer().numel(),
                     [tuple(g.shape) for g in bucket.gradients()],
                     [id(p) for p in bucket.parameters()]))
        bucket.buffer().mul_(2)  # the buffer is the bucket's memory
        fut = Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook("st", hook)
    x = inputs(0, np.float64)
    plain = our_step(DDP(make(np.float64)[0]), x)
    ours = our_step(ddp, x)
    params = list(reversed(list(m.parameters())))
    assert [s[1] for s in seen] == [0, 1, 2, 3]
    assert [s[2] for s in seen] == [False, False, False, True]
    assert all(s[0] == "st" for s in seen)
    assert [s[4] for s in seen] == [[tuple(p.shape)] for p in params]
    assert [s[5] for s in seen] == [[id(p)] for p in params]
    for a, b in zip(ours, plain):
        np.testing.assert_array_equal(a, 2 * b)


@pytest.mark.usefixtures("world")
def test_work_futures_chain():
    t = mt.tensor([1.0, 2.0])
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).then(lambda f: f.value() + 1)
    np.testing.assert_array_equal(doubled.wait().numpy(), [3.0, 5.0])
    assert fut.done() and fut.value()[0] is t


@pytest.mark.usefixtures("world")
def test_registration_errors():
    ddp = DDP(make(np.float64)[0])
    with pytest.raises(TypeError, match="callable"):
        ddp.register_comm_hook(None, 5)
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    with pytest.raises(RuntimeError, match="once"):
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    with pytest.raises(RuntimeError, match="once"):
        ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    with pytest.raises(ValueError, match="start_powerSGD_iter"):
        powerSGD_hook.PowerSGDState(None, start_powerSGD_iter=1)
    with pytest.raises(TypeError, match="DDPCommHookType"):
        register_ddp_comm_hook("ALLREDUCE", ddp)


def test_powersgd_state_pickles_without_its_group():
    import pickle

    state = powerSGD_hook.PowerSGDState(None, start_powerSGD_iter=3, random_seed=4)
    state.iter = 7
    state.error_dict[0] = mt.ones(3)
    back = pickle.loads(pickle.dumps(state))
    assert back.process_group is None and back.iter == 7 and back.start_powerSGD_iter == 3
    np.testing.assert_array_equal(back.error_dict[0].numpy(), [1, 1, 1])
    assert back.rng.randint(1000) == np.random.RandomState(4).randint(1000)


@pytest.mark.usefixtures("world")
def test_powersgd_refuses_complex_buckets():
    class Bucket:  # the GradBucket API, over a complex buffer
        def __init__(self):
            self.buf = mt.tensor(np.ones(6, np.complex128))

        def buffer(self):
            return self.buf

        def is_last(self):
            return True

    state = powerSGD_hook.PowerSGDState(None, start_powerSGD_iter=2)
    for _ in range(2):  # plain averaging of complex numbers is fine
        powerSGD_hook.powerSGD_hook(state, Bucket()).wait()
    for hook in (powerSGD_hook.powerSGD_hook, powerSGD_hook.batched_powerSGD_hook):
        with pytest.raises(TypeError, match="complex"):
            hook(state, Bucket())


def _bad_hooks():
    def returns_tensor(state, bucket):
        return bucket.buffer()

    def wrong_size(state, bucket):
        fut = Future()
        fut.set_result(mt.zeros(1))
        return fut

    def holds_a_string(state, bucket):
        fut = Future()
        fut.set_result("x")
        return fut

    return [(returns_tensor, "must return a mpitensor.futures.Future"),
            (wrong_size, "returned 1 elements"), (holds_a_string, "must hold a tensor")]


@pytest.mark.parametrize("hook,match", _bad_hooks())
@pytest.mark.usefixtures("world")
def test_bad_hook_results_raise(hook, match):
    ddp = DDP(make(np.float64)[0])
    ddp.register_comm_hook(None, hook)
    with pytest.raises(RuntimeError, match=match):
        our_step(ddp, inputs(0, np.float64))


@pytest.mark.usefixtures("world")
def test_builtin_and_enum_registration():
    x = inputs(0, np.float32)
    m, t = make(np.float32)
    ddp = DDP(m)
    ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    for ours, ref in zip(our_step(ddp, x), torch_grads(t, x)):
        np.testing.assert_allclose(ours, ref, rtol=2.0 ** -11, atol=1e-6)
    for kind in (DDPCommHookType.ALLREDUCE, DDPCommHookType.POWER_SGD, DDPCommHookType.NOOP):
        m, t = make(np.float64)
        ddp = DDP(m)
        register_ddp_comm_hook(kind, ddp)
        for ours, ref in zip(our_step(ddp, x.astype(np.float64)),
                             torch_grads(t, x.astype(np.float64))):
            np.testing.assert_allclose(ours, ref, **tol(np.float64))


# ------------------------------------------------------------------------------ 2 ranks
SCRIPT = r'''
import sys
import numpy as np
sys.path.insert(0, {root!r})
import mpitensor as mt, mpitensor.distributed as dist
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.distributed.algorithms import Join, Joinable, JoinHook
from mpitensor.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from tests.test_ddp_comm_hooks import (make, inputs, torch_grads, our_step, hand_powersgd,
                                       first_qs, tol)
dist.init_process_group("mpi")
rank, n = dist.get_rank(), dist.get_world_size()

def everyone(grads):
    out = []
    for r in range(n):
        got = [np.zeros_like(g) for g in grads]
        for g, o in zip(grads, got):
            lst = [mt.zeros(g.shape, dtype=mt.float64 if g.dtype == np.float64 else mt.float32)
                   for _ in range(n)]
            dist.all_gather(lst, mt.tensor(g))
            o[...] = lst[r].numpy()
        out.append(got)
    return out

for dtype in (np.float32, np.float64):
    m, t = make(dtype)
    ddp = DDP(m)
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    x = inputs(0, dtype, rank)
    all_g = everyone(torch_grads(t, x))
    for ours, *refs in zip(our_step(ddp, x), *all_g):
        np.testing.assert_allclose(ours, sum(refs) / n, **tol(dtype))

    m, t = make(dtype)
    ddp = DDP(m)
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    import torch
    for ours, *refs in zip(our_step(ddp, x), *all_g):
        # each rank's gradient rounded to float16 and halved, summed in float32, rounded once
        halves = [torch.from_numpy(r).to(torch.float16) / n for r in refs]
        want = sum(h.to(torch.float32) for h in halves).to(torch.float16).to(torch.float32)
        np.testing.assert_allclose(ours, want.numpy(), rtol=2.0 ** -10, atol=1e-6)

    m, t = make(dtype)
    ddp = DDP(m)
    state = powerSGD_hook.PowerSGDState(None, start_powerSGD_iter=2, random_seed=7)
    ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    for step in range(2):
        our_step(ddp, inputs(step, dtype, rank))
    qs = first_qs([(4, 5), (5, 6)], np.random.RandomState(7), dtype)
    errors = None
    for step in (2, 3):
        x = inputs(step, dtype, rank)
        all_g = everyone(torch_grads(t, x))
        want, errs, qs = hand_powersgd([[g.astype(np.float64) for g in gs] for gs in all_g],
                                       errors, qs)
        got = np.concatenate([g.ravel() for g in our_step(ddp, x)])
        t_ = tol(dtype, 64)
        sc = np.abs(want).max()
        np.testing.assert_allclose(got, want, rtol=t_["rtol"], atol=t_["atol"] * sc)
        np.testing.assert_allclose(state.error_dict[0].numpy(), errs[rank], rtol=t_["rtol"],
                                   atol=t_["atol"] * sc)
        errors = errs

# one bucket per parameter: each hook's chained sums start at wait time, in bucket order, on
# every rank (were a callback run where its first sum happened to finish, the ranks' collectives
# would interleave differently); the replicas end with equal, rank-1 weight gradients
m, t = make(np.float64)
ddp = DDP(m, bucket_cap_mb=0)
state = powerSGD_hook.PowerSGDState(None, start_powerSGD_iter=2)
ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
for step in range(4):
    grads = our_step(ddp, inputs(step, np.float64, rank))
for mine, *theirs in zip(grads, *everyone(grads)):
    for other in theirs:
        np.testing.assert_array_equal(mine, other)
assert np.linalg.matrix_rank(grads[1], tol=1e-8 * np.abs(grads[1]).max()) == 1

class Counter(Joinable):
    def __init__(self):
        super().__init__()
        self.total = 0.0
        self.last = None
    def step(self):
        Join.notify_join_context(self)
        t = mt.ones(1)
        dist.all_reduce(t)
        self.total += float(t[0])
    def join_hook(self, **kw):
        c = self
        class H(JoinHook):
            def main_hook(self):
                dist.all_reduce(mt.zeros(1))
            def post_hook(self, is_last_joiner):
                c.last = is_last_joiner
        return H()
    @property
    def join_device(self):
        return "cpu"
    @property
    def join_process_group(self):
        return dist.group.WORLD

c = Counter()
with Join([c]):
    for _ in range(3 + 2 * rank):
        c.step()
assert c.last == (rank == n - 1), (rank, c.last)
# iterations where both ranks are active count 2 each; the rest 1
assert c.total == 3 * 2 + 2 * rank * 1, (rank, c.total)

c = Counter()
try:
    with Join([c], throw_on_early_termination=True):
        for _ in range(3 + 2 * rank):
            c.step()
    raise AssertionError("no rank raised")
except RuntimeError as e:
    assert "ran out of inputs" in str(e), e

# DDP is a Joinable: Join([ddp]) trains on uneven inputs as ddp.join() does (same final state);
# with allreduce_hook the joined ranks run the hook on zero buckets
def train(use_generic, hook, divide=True):
    m, _ = make(np.float64)
    ddp = DDP(m)
    if hook:
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = mt.optim.SGD(ddp.parameters(), lr=0.1)
    ctx = (Join([ddp], divide_by_initial_world_size=divide) if use_generic
           else ddp.join(divide_by_initial_world_size=divide))
    with ctx:
        for step in range(2 + 2 * rank):
            opt.zero_grad()
            (ddp(mt.tensor(inputs(step, np.float64, rank))) ** 2).sum().backward()
            opt.step()
    return [p.detach().numpy().copy() for p in ddp.parameters()]

ref = train(False, False)
for generic, hook in ((True, False), (True, True), (False, True)):
    for a, b in zip(train(generic, hook), ref):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
for a, b in zip(train(True, False, False), train(False, False, False)):
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
dist.destroy_process_group()
print("rank", rank, "OK", flush=True)
'''


def run_on_ranks(tmp_path, script_text, nprocs=2, timeout=240):
    """Run ``script_text`` (a template with ``{root}``) under ``mpiexec -n nprocs``; every
    rank must print ``OK``."""
    script = tmp_path / "ranks.py"
    script.write_text(script_text.format(root=str(ROOT)))
    proc = mpiexec_run(nprocs, [sys.executable, str(script)], timeout=timeout, cwd=ROOT)
    assert not proc.timed_out, proc.output[-4000:]
    assert proc.returncode == 0, proc.output[-6000:]
    assert proc.output.count("OK") == nprocs, proc.output[-4000:]


def test_two_ranks(tmp_path):
    run_on_ranks(tmp_path, SCRIPT)


# ------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("hook_name", ["allreduce_hook", "fp16_compress_hook", "powerSGD_hook",
                                       "batched_powerSGD_hook"])
@pytest.mark.usefixtures("world")
def test_gpu_hooks_match_cpu(hook_name):
    """The hooks on a CUDA model give the CPU model's gradients (same seeds: PowerSGD's Q is
    drawn on the CPU, as torch's)."""
    from mpitensor.backend import get_cupy, to_numpy

    cp = get_cupy()
    results = []
    for device in ("cpu", "cuda"):
        m, _ = make(np.float64)
        ddp = DDP(m.to(device), device_ids=[0] if device == "cuda" else None)
        if "powerSGD" in hook_name:
            state = powerSGD_hook.PowerSGDState(None, start_powerSGD_iter=2, random_seed=1)
            ddp.register_comm_hook(state, getattr(powerSGD_hook, hook_name))
        else:
            ddp.register_comm_hook(None, getattr(default_hooks, hook_name))
        for step in range(4):
            for p in ddp.parameters():
                p.grad = None
            (ddp(mt.tensor(inputs(step, np.float64), device=device)) ** 2).sum().backward()
        if device == "cuda":
            assert all(isinstance(p.grad._data, cp.ndarray) for p in ddp.parameters())
        results.append([to_numpy(p.grad._data) for p in ddp.parameters()])
    for a, b in zip(*results):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-11)


# ------------------------------------------------------------------ torch's own PowerSGD
@pytest.fixture(scope="module")
def torch_gloo() -> Iterator[None]:
    """torch's gloo group of one rank, made once for this file's oracle tests.

    Made and destroyed around each test, it deadlocked now and then: the last DDP step's
    call finishes on one of gloo's worker threads, which then releases the call's tensors and
    needs the GIL for it, while the main thread, holding the GIL, destroys the group and waits
    for that thread's lock. Kept for the module, the group outlives every DDP object made on
    it; it is destroyed once, long after its last call."""
    tdist = torch.distributed
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    yield
    tdist.destroy_process_group()


@pytest.mark.usefixtures("world", "torch_gloo")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batched,rank", [(False, 2), (False, 3), (True, 2)])
def test_powersgd_equals_torchs_hook_from_the_same_q(dtype, batched, rank, monkeypatch):
    """torch's DDP with torch's PowerSGD hook (gloo, one rank) as the oracle: before the first
    compressed step both states get the same warm-start Q (the only random input), then two
    compressed steps (warm start, error feedback) must give torch's gradients.

    torch 2.13's batched hook hands its orthogonalization a 2-D matrix, which that function
    refuses (AssertionError at the first compressed step); the oracle gets it as a batch of
    one (a view: the in-place work lands in the matrix)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as tps

    orthogonalize = tps._orthogonalize
    monkeypatch.setattr(tps, "_orthogonalize", lambda mats, epsilon=0: orthogonalize(
        mats.unsqueeze(0) if mats.dim() == 2 else mats, epsilon))

    m, t = make(dtype)
    tddp = torch.nn.parallel.DistributedDataParallel(t)
    ddp = DDP(m)
    # rank 3 (QR, not Gram-Schmidt) compresses these small matrices only below rate 2
    kw = dict(matrix_approximation_rank=rank, start_powerSGD_iter=2,
              min_compression_rate=2 if rank == 2 else 0.5)
    tstate, state = tps.PowerSGDState(None, **kw), powerSGD_hook.PowerSGDState(None, **kw)
    name = "batched_powerSGD_hook" if batched else "powerSGD_hook"
    tddp.register_comm_hook(tstate, getattr(tps, name))
    ddp.register_comm_hook(state, getattr(powerSGD_hook, name))
    n = 4 + 20 + 5 + 30  # the bucket: b2, w2, b1, w1
    side = int(np.ceil(np.sqrt(n)))
    # P and Q memories: the compressed matrices' (n, r) and (m, r) blocks, in bucket order
    p_total = q_total = 0
    for n_, m_ in ((4, 1), (4, 5), (5, 1), (5, 6)):  # bucket order, as matrices
        r = min(n_, m_, rank)
        if (n_ + m_) * r * kw["min_compression_rate"] < n_ * m_:
            p_total, q_total = p_total + n_ * r, q_total + m_ * r
    p_size, q_shape = ((side, rank), (side, rank)) if batched else ((p_total,), (q_total,))
    q0 = np.random.default_rng(9).standard_normal(q_shape).astype(dtype)
    for step in range(4):
        x = inputs(step, dtype)
        if step == 2:
            tstate.p_memory_dict[0] = torch.zeros(p_size, dtype=torch.from_numpy(q0).dtype)
            tstate.q_memory_dict[0] = torch.from_numpy(q0.copy())
            state.p_memory_dict[0] = mt.zeros(p_size, dtype=m[0].weight.dtype)
            state.q_memory_dict[0] = mt.tensor(q0.copy())
        tddp.zero_grad()
        (tddp(torch.from_numpy(x)) ** 2).sum().backward()
        want = [p.grad.numpy() for p in t.parameters()]
        got = [g for g in reversed(our_step(ddp, x))]
        scale = max(np.abs(w).max() for w in want)
        t_ = tol(dtype, 64)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=t_["rtol"], atol=t_["atol"] * scale)
    assert state.iter == tstate.iter == 4
    np.testing.assert_allclose(state.error_dict[0].numpy(), tstate.error_dict[0].numpy(),
                               rtol=t_["rtol"], atol=t_["atol"] * scale)
