"""ZeroRedundancyOptimizer at 1-4 ranks.

Spec: a model trained for 20 steps with ZeRO (over DDP) gives the losses and the weights of
the same model under DDP with the plain optimizer (rtol 1e-5 in float32), on every rank; each
rank keeps the optimizer state of its share only (the shares add up to the whole state, and
none exceeds 1/N of it by more than the largest parameter's state); the partition is torch's
(checked against torch's ZeroRedundancyOptimizer over gloo where torch is installed); the
consolidated state dict is the plain optimizer's and loads back; bad input fails on every rank.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_zero.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor.distributed.optim import ZeroRedundancyOptimizer
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.optim import Adam, lr_scheduler

from .sharded_models import OPTIMIZERS, RTOL, STEPS, batch, mlp, torch_twin
from .torch_gloo import (
    to_torch,
    torch_gloo_fixture,  # noqa: F401 - the fixture torch_gloo
)

pytestmark = pytest.mark.mpi(min_size=1)



def _train(model, opt, steps=STEPS, sched=None):
    losses = []
    for s in range(steps):
        x, y = batch(s, dist.get_rank())
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(float(loss.item()))
    return np.array(losses)


def _check_close(a, b, what):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=0, err_msg=what)


def _params(model):
    return [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("bucket_view", [False, True])
@pytest.mark.parametrize("opt_cls, kw", OPTIMIZERS)
def test_zero_trains_like_ddp(bucket_view, opt_cls, kw):
    ref = DDP(mlp())
    ref_opt = opt_cls(ref.parameters(), **kw)
    ref_losses = _train(ref, ref_opt)
    model = DDP(mlp())
    opt = ZeroRedundancyOptimizer(model.parameters(), opt_cls,
                                  parameters_as_bucket_view=bucket_view, **kw)
    losses = _train(model, opt)
    _check_close(losses, ref_losses, "losses")
    for a, b in zip(_params(model), _params(ref)):
        _check_close(a, b, "weights")
    # every replica holds the same weights after the exchange
    for a in _params(model):
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, a)
        for other in everyone:
            np.testing.assert_array_equal(other, a)


def test_groups_and_scheduler_reach_the_local_optimizer():
    def groups(m):
        ps = list(m.parameters())
        return [{"params": ps[:2], "lr": 0.02}, {"params": ps[2:]}]

    ref = DDP(mlp(1))
    ref_opt = Adam(groups(ref), lr=0.01)
    ref_losses = _train(ref, ref_opt, sched=lr_scheduler.StepLR(ref_opt, 5, gamma=0.5))
    model = DDP(mlp(1))
    opt = ZeroRedundancyOptimizer(groups(model), Adam, lr=0.01)
    losses = _train(model, opt, sched=lr_scheduler.StepLR(opt, 5, gamma=0.5))
    _check_close(losses, ref_losses, "losses")
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ref_opt.param_groups]


def test_add_param_group_keeps_owners_and_trains_like_ddp():
    def run(make_opt):
        model = DDP(mlp(2))
        ps = list(model.parameters())
        opt = make_opt(ps[:4])
        first = _train(model, opt, steps=5)
        opt.add_param_group({"params": ps[4:], "lr": 0.03})
        return np.concatenate([first, _train(model, opt, steps=5)]), opt

    ref_losses, _ = run(lambda ps: Adam(ps, lr=0.01))
    before = {}

    def make(ps):
        z = ZeroRedundancyOptimizer(ps, Adam, lr=0.01)
        before.update({id(p): r for r, gs in enumerate(z._partition_parameters())
                       for g in gs for p in g["params"]})
        return z

    losses, z = run(make)
    _check_close(losses, ref_losses, "losses")
    after = {id(p): r for r, gs in enumerate(z._partition_parameters())
             for g in gs for p in g["params"]}
    assert all(after[k] == r for k, r in before.items())
    assert len(after) == 6


def test_state_is_sharded_and_adds_up():
    n = dist.get_world_size()
    model = DDP(mlp(3))
    opt = ZeroRedundancyOptimizer(model.parameters(), Adam, lr=0.01)
    _train(model, opt, steps=2)
    # Adam's moments: two float32 tensors per parameter (the step counters are left out)
    mine = sum(v.numel() * v.element_size() for s in opt.optim.state.values()
               for k, v in s.items() if k in ("exp_avg", "exp_avg_sq"))
    everyone = [None] * n
    dist.all_gather_object(everyone, mine)
    full = sum(2 * 4 * p.numel() for p in model.parameters())
    largest = max(2 * 4 * p.numel() for p in model.parameters())
    assert sum(everyone) == full
    assert mine <= full / n + largest
    assert not opt.state  # the wrapper itself holds no state
    assert opt.bucket_bytes() <= (4 * sum(p.numel() for p in model.parameters()) / n
                                  + largest if n > 1 else 0)


def test_consolidated_state_dict_is_the_plain_optimizers_and_loads_back():
    n = dist.get_world_size()
    to = n - 1
    ref = DDP(mlp(4))
    ref_opt = Adam(ref.parameters(), lr=0.01)
    _train(ref, ref_opt, steps=3)
    model = DDP(mlp(4))
    opt = ZeroRedundancyOptimizer(model.parameters(), Adam, lr=0.01)
    _train(model, opt, steps=3)
    opt.consolidate_state_dict(to=to)
    if dist.get_rank() == to:
        sd, want = opt.state_dict(), ref_opt.state_dict()
        assert sd["param_groups"] == want["param_groups"]
        assert sorted(sd["state"]) == sorted(want["state"])
        for k in want["state"]:
            for name, v in want["state"][k].items():
                _check_close(np.asarray(sd["state"][k][name].detach().numpy()),
                             np.asarray(v.detach().numpy()), f"state {k} {name}")
    else:
        with pytest.raises(RuntimeError, match="consolidate_state_dict"):
            opt.state_dict()
        sd = None
    box = [sd]
    dist.broadcast_object_list(box, src=to)
    # a fresh ZeRO from the checkpoint continues exactly as the plain optimizer does
    model2 = DDP(mlp(4))
    with mt.no_grad():
        for p, q in zip(model2.parameters(), model.parameters()):
            p.copy_(q)
    opt2 = ZeroRedundancyOptimizer(model2.parameters(), Adam, lr=0.5)
    opt2.load_state_dict(box[0])
    assert opt2.optim.param_groups[0]["lr"] == 0.01
    _check_close(_train(model2, opt2, steps=3), _train(ref, ref_opt, steps=3), "losses")


def test_bad_input_fails_on_every_rank_before_traffic():
    with pytest.raises(TypeError, match="optimizer_class"):
        ZeroRedundancyOptimizer(mlp().parameters(), "Adam", lr=0.1)
    with pytest.raises(NotImplementedError, match="overlap_with_ddp"):
        ZeroRedundancyOptimizer(mlp().parameters(), Adam, overlap_with_ddp=True, lr=0.1)
    opt = ZeroRedundancyOptimizer(mlp().parameters(), Adam, lr=0.1)
    with pytest.raises(ValueError, match="to=99"):
        opt.consolidate_state_dict(to=99)


@pytest.mark.mpi(min_size=2)
def test_parameters_that_differ_across_ranks_fail_on_every_rank():
    width = 5 if dist.get_rank() == 1 else 4
    with pytest.raises(ValueError, match=r"differ across ranks.*rank 1"):
        ZeroRedundancyOptimizer(nn.Linear(width, 3).parameters(), Adam, lr=0.1)
    extra = [nn.Parameter(mt.zeros(2))] if dist.get_rank() == 0 else []
    with pytest.raises(ValueError, match="parameters on rank"):
        ZeroRedundancyOptimizer(list(nn.Linear(4, 3).parameters()) + extra, Adam, lr=0.1)


def test_uneven_inputs_with_join():
    from mpitensor.distributed.algorithms.join import Join

    rank, n = dist.get_rank(), dist.get_world_size()
    model = DDP(mlp(5))
    opt = ZeroRedundancyOptimizer(model.parameters(), Adam, lr=0.01)
    with Join([model, opt]):
        for s in range(3 + rank):
            x, y = batch(s, rank)
            opt.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
    everyone = [None] * n
    mine = np.concatenate([a.ravel() for a in _params(model)])
    dist.all_gather_object(everyone, mine)
    for other in everyone:
        np.testing.assert_array_equal(other, mine)


def test_partition_and_training_match_torch(torch_gloo):
    torch = torch_gloo
    from torch.distributed.optim import ZeroRedundancyOptimizer as TorchZero

    ours = mlp(6)
    theirs = torch_twin(ours, torch)
    z = ZeroRedundancyOptimizer(ours.parameters(), Adam, lr=0.01)
    tz = TorchZero(theirs.parameters(), torch.optim.Adam, lr=0.01)
    idx_o = {id(p): i for i, p in enumerate(ours.parameters())}
    idx_t = {id(p): i for i, p in enumerate(theirs.parameters())}
    mine = [[[idx_o[id(p)] for p in g["params"]] for g in gs] for gs in z._partition_parameters()]
    want = [[[idx_t[id(p)] for p in g["params"]] for g in gs]
            for gs in tz._partition_parameters()]
    assert mine == want
    ddp = torch.nn.parallel.DistributedDataParallel(theirs)
    model = DDP(ours)
    for s in range(5):
        x, y = batch(s, dist.get_rank())
        z.zero_grad()
        tz.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        z.step()
        tloss = ((ddp(to_torch(x, torch)) - to_torch(y, torch)) ** 2).mean()
        tloss.backward()
        tz.step()
        _check_close(loss.item(), tloss.item(), f"loss at step {s}")
    for a, b in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-4,
                                   atol=1e-6)
