"""DDP's module buffers at 1-4 ranks, against torch's DDP (gloo) run beside it on the same ranks.

With ``broadcast_buffers=True`` (the default) torch broadcasts the buffers from rank 0 at the
start of a forward when the *previous* forward synchronised gradients (or at the first forward):
so the first evaluation forward after training runs on rank 0's running statistics everywhere.
Each test runs the same model, weights and per-rank data through ``mpitensor`` and ``torch``
and asserts what every rank holds: buffers, parameters and outputs.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_ddp_buffers.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.optim import SGD

from .test_ddp import (
    TORCH_BUFFER_SYNCS,
    _one_blas_thread,  # noqa: F401 - the module's autouse fixture
    assert_replicas_equal,
    val,
)
from .torch_gloo import (
    copy_state,
    to_torch,
    torch_gloo_fixture,  # noqa: F401 - the fixture torch_gloo
)

pytestmark = pytest.mark.mpi(min_size=1)

RTOL = 1e-10


def world():
    return dist.get_world_size(), dist.get_rank()


def rank_data(step, rank, n=8):
    """Rank-dependent inputs and targets: the replicas see different batches."""
    rng = np.random.default_rng(500 + 37 * rank + step)
    return rng.standard_normal((n, 6)) * (1 + rank), rng.standard_normal((n, 3))


def close(a, b, what):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=RTOL * max(1.0, float(np.abs(b).max())),
                               err_msg=what)


# --------------------------------------------------------------------------------------------
# A buffer that forward updates (an exponential moving average of the input), in both libraries


class Ema(nn.Module):
    """Subtracts a running mean of its input, updated in place while training."""

    def __init__(self, features):
        super().__init__()
        self.register_buffer("ema", mt.zeros(features, dtype=mt.float64))
        self.register_buffer("seen", mt.tensor(np.array(0, np.int64)))

    def forward(self, x):
        if self.training:
            self.ema._data[...] = 0.75 * self.ema._data + 0.25 * x._data.mean(axis=0)
            self.seen._data[...] += 1
        return x - self.ema


def torch_ema(torch, features):
    class TorchEma(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("ema", torch.zeros(features, dtype=torch.float64))
            self.register_buffer("seen", torch.tensor(0, dtype=torch.int64))

        def forward(self, x):
            if self.training:
                with torch.no_grad():
                    self.ema.mul_(0.75).add_(0.25 * x.mean(dim=0))
                    self.seen += 1
            return x - self.ema

    return TorchEma()


def models(torch, seed):
    """The same network in both libraries, torch's holding mpitensor's initial state."""
    mt.manual_seed(seed)
    mine = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), Ema(8),
                         nn.Linear(8, 3)).double()
    tn = torch.nn
    theirs = tn.Sequential(tn.Linear(6, 8), tn.BatchNorm1d(8), tn.ReLU(), torch_ema(torch, 8),
                           tn.Linear(8, 3)).double()
    copy_state(mine, theirs, torch)
    return mine, theirs


def state(module):
    """Every parameter and buffer as a NumPy array, by name (either library)."""
    out = {}
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        out[name] = np.array(t.detach().numpy(), copy=True)
    return out


def check_same_state(mine, theirs, when):
    a, b = state(mine), state(theirs)
    assert list(a) == list(b)
    for name in a:
        close(a[name], b[name], f"{name} {when}")


# --------------------------------------------------------------------------------------------
# Tests


def test_buffer_sync_rule_matches_torch(torch_gloo):
    """The forwards that broadcast buffers, forward kind by forward kind, are torch's."""
    torch = torch_gloo
    n, me = world()
    from .test_ddp import MLP, buffer_sync_sequence

    ours = buffer_sync_sequence(DDP(MLP(7)), me)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(12, 3).double()
            self.register_buffer("running", torch.zeros(4, dtype=torch.float64))

        def forward(self, x):
            return self.lin(x)

    ddp = torch.nn.parallel.DistributedDataParallel(Tiny())
    x = torch.randn(4, 12, dtype=torch.float64)
    theirs = {}
    for tag in TORCH_BUFFER_SYNCS:
        grad = not tag.startswith(("no_grad", "eval no_grad"))
        ddp.module.running.fill_(me + 1.0)
        ddp.train(not tag.startswith("eval"))
        ctx = ddp.no_sync() if tag.startswith("no_sync") else torch.enable_grad()
        with ctx, torch.set_grad_enabled(grad):
            out = ddp(x)
            theirs[tag] = float(ddp.module.running[0])
            if grad:
                out.sum().backward()
    assert ours == theirs
    assert theirs == {k: 1.0 if v else me + 1.0 for k, v in TORCH_BUFFER_SYNCS.items()}


@pytest.mark.parametrize("bucket_cap_mb", [0, 25], ids=["per-param", "one-bucket"])
def test_batchnorm_and_ema_buffers_match_torch(torch_gloo, bucket_cap_mb):
    """Different data per rank; training steps, evaluation, training again, evaluation again:
    parameters, buffers and outputs on every rank are torch's; after each first evaluation
    forward the buffers are rank 0's on every rank."""
    torch = torch_gloo
    n, me = world()
    mine, theirs = models(torch, seed=11)
    ddp = DDP(mine, bucket_cap_mb=bucket_cap_mb)
    tddp = torch.nn.parallel.DistributedDataParallel(theirs, bucket_cap_mb=bucket_cap_mb)
    opt = SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    topt = torch.optim.SGD(tddp.parameters(), lr=0.05, momentum=0.9)
    evals = []

    def train(steps, first):
        for s in range(first, first + steps):
            x, y = rank_data(s, me)
            opt.zero_grad()
            ((ddp(mt.tensor(x)) - mt.tensor(y)) ** 2).mean().backward()
            opt.step()
            topt.zero_grad()
            ((tddp(to_torch(x, torch)) - to_torch(y, torch)) ** 2).mean().backward()
            topt.step()

    def evaluate(s):
        x, _ = rank_data(100 + s, me)
        ddp.eval()
        tddp.eval()
        with mt.no_grad():
            out = val(ddp(mt.tensor(x))).copy()
        with torch.no_grad():
            tout = tddp(to_torch(x, torch)).numpy()
        ddp.train()
        tddp.train()
        evals.append((out, tout, state(mine)))

    train(3, 0)
    before_eval = state(mine)  # local running statistics: they differ between ranks
    evaluate(0)
    evaluate(1)  # a second evaluation forward: no broadcast, nothing changes
    train(2, 3)
    evaluate(2)
    # collectives first: gather rank 0's pre-evaluation buffers and every rank's state
    rank0 = [None]
    rank0[0] = before_eval if me == 0 else None
    dist.broadcast_object_list(rank0, src=0)
    assert_replicas_equal(list(ddp.parameters()) + list(mine.buffers()))
    check_same_state(mine, theirs, "after the last evaluation")
    for out, tout, _ in evals:
        close(out, tout, "evaluation output")
    first_eval_state = evals[0][2]
    for name, arr in first_eval_state.items():
        if "running" in name or "ema" in name or "seen" in name or "num_batches" in name:
            np.testing.assert_array_equal(arr, rank0[0][name], err_msg=name)
    assert evals[1][2].keys() == first_eval_state.keys()
    for name in first_eval_state:
        np.testing.assert_array_equal(evals[1][2][name], first_eval_state[name], err_msg=name)
    if n > 1 and me == 1:  # the ranks' own statistics differed before the evaluation
        assert not np.array_equal(before_eval["1.running_mean"], rank0[0]["1.running_mean"])


@pytest.mark.filterwarnings("ignore:`broadcast_buffers` is deprecated:FutureWarning")
def test_broadcast_buffers_false_keeps_local_buffers_like_torch(torch_gloo):
    torch = torch_gloo
    n, me = world()
    mine, theirs = models(torch, seed=5)
    ddp = DDP(mine, broadcast_buffers=False)
    tddp = torch.nn.parallel.DistributedDataParallel(theirs, broadcast_buffers=False)
    for s in range(2):
        x, y = rank_data(s, me)
        ((ddp(mt.tensor(x)) - mt.tensor(y)) ** 2).mean().backward()
        ((tddp(to_torch(x, torch)) - to_torch(y, torch)) ** 2).mean().backward()
    ddp.eval()
    tddp.eval()
    x, _ = rank_data(50, me)
    with mt.no_grad():
        out = val(ddp(mt.tensor(x))).copy()
    with torch.no_grad():
        tout = tddp(to_torch(x, torch)).numpy()
    everyone = [None] * n
    dist.all_gather_object(everyone, state(mine)["1.running_mean"])
    close(out, tout, "evaluation output")
    check_same_state(mine, theirs, "with broadcast_buffers=False")
    for ddp_grad, tp in zip(ddp.parameters(), tddp.parameters()):
        close(val(ddp_grad.grad), tp.grad.numpy(), "gradient")
    if n > 1:
        assert not np.array_equal(everyone[0], everyone[1])  # never broadcast


@pytest.mark.filterwarnings("ignore:`broadcast_buffers` is deprecated:FutureWarning")
@pytest.mark.filterwarnings("ignore:Both `broadcast_buffers`:FutureWarning")
@pytest.mark.parametrize("kwargs", [
    {}, {"broadcast_buffers": False}, {"broadcast_buffers": True},
    {"forward_sync_buffers": False}, {"forward_sync_buffers": True},
    {"broadcast_buffers": False, "forward_sync_buffers": True},
], ids=["default", "bb-false", "bb-true", "fsb-false", "fsb-true", "both"])
def test_construction_and_first_forward_buffers_like_torch(torch_gloo, kwargs):
    """Which buffers construction and the first forward broadcast, per switch, as torch 2.13:
    ``broadcast_buffers=False`` leaves them out of both, ``forward_sync_buffers=False`` only
    out of the forwards."""
    torch = torch_gloo
    n, me = world()
    mine, theirs = models(torch, seed=3)
    mine[3].ema._data.fill(me + 1.0)
    with torch.no_grad():
        theirs[3].ema.fill_(me + 1.0)
    ddp = DDP(mine, **kwargs)
    tddp = torch.nn.parallel.DistributedDataParallel(theirs, **kwargs)
    seen = [float(val(mine[3].ema)[0])]
    tseen = [float(theirs[3].ema[0])]
    with torch.no_grad():
        theirs[3].ema.fill_(me + 5.0)
    mine[3].ema._data.fill(me + 5.0)
    ddp.eval()  # the buffer then keeps what the broadcast left
    tddp.eval()
    x, _ = rank_data(0, me)
    ddp(mt.tensor(x))
    tddp(to_torch(x, torch))
    seen.append(float(val(mine[3].ema)[0]))
    tseen.append(float(theirs[3].ema[0]))
    assert seen == tseen
    at_init = kwargs.get("broadcast_buffers") is not False or "forward_sync_buffers" in kwargs
    in_forward = kwargs.get("forward_sync_buffers", kwargs.get("broadcast_buffers", True))
    assert seen == [1.0 if at_init else me + 1.0, 5.0 if in_forward else me + 5.0]
    assert ddp.forward_sync_buffers == tddp.forward_sync_buffers == ddp.broadcast_buffers
