"""DDP with parameters that get no gradient, at 1-4 ranks, against torch's DDP (gloo).

A model whose forward uses a branch on some steps only, and on some ranks only, and holds a
parameter it never uses:

* ``find_unused_parameters=True``: every step's gradients and parameters are torch's on every
  rank (a parameter unused on every rank keeps its gradient as it was, None after
  ``zero_grad()``; one used on some ranks gets their contribution averaged over all);
* ``static_graph=True``: the never-used parameter is learned at the first step; same values;
* neither: backward returns and the next forward with gradients enabled raises, as torch.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_ddp_unused.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.optim import SGD

from .test_ddp import (
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
STEPS = 5


def world():
    return dist.get_world_size(), dist.get_rank()


class Branchy(nn.Module):
    """body -> relu -> head, plus an ``aux`` head when asked; ``spare`` is never used."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.spare = nn.Parameter(mt.zeros(4, dtype=mt.float64))
        self.head = nn.Linear(8, 3)
        self.aux = nn.Linear(8, 3)

    def forward(self, x, use_aux=True):
        h = F.relu(self.body(x))
        y = self.head(h)
        return y + self.aux(h) if use_aux else y


def torch_branchy(torch):
    class TorchBranchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(6, 8)
            self.spare = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
            self.head = torch.nn.Linear(8, 3)
            self.aux = torch.nn.Linear(8, 3)

        def forward(self, x, use_aux=True):
            h = torch.relu(self.body(x))
            y = self.head(h)
            return y + self.aux(h) if use_aux else y

    return TorchBranchy().double()


def pair(torch, seed=21):
    mt.manual_seed(seed)
    mine = Branchy().double()
    theirs = torch_branchy(torch)
    copy_state(mine, theirs, torch)
    return mine, theirs


def rank_data(step, rank, n=6):
    rng = np.random.default_rng(900 + 31 * rank + step)
    return rng.standard_normal((n, 6)), rng.standard_normal((n, 3))


def uses_aux(step, rank, n):
    """Even steps everywhere; step 3 on rank 0 only (unused on the others); else nowhere."""
    return step % 2 == 0 or (step == 3 and rank == 0 and n > 1)


def grads(module):
    return {name: None if p.grad is None else np.array(p.grad.detach().numpy(), copy=True)
            for name, p in module.named_parameters()}


def check_grads(a, b, when):
    assert {k: v is None for k, v in a.items()} == {k: v is None for k, v in b.items()}, when
    for name, g in a.items():
        if g is not None:
            np.testing.assert_allclose(g, b[name], rtol=RTOL, atol=RTOL, err_msg=f"{name} {when}")


def train_both(torch, mine, theirs, branch, **ddp_kw):
    """STEPS steps of both DDPs on the same per-rank data; every step's gradients compared."""
    n, me = world()
    ddp = DDP(mine, **ddp_kw)
    tddp = torch.nn.parallel.DistributedDataParallel(theirs, **ddp_kw)
    opt = SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(tddp.parameters(), lr=0.1, momentum=0.9)
    log = []
    for s in range(STEPS):
        x, y = rank_data(s, me)
        use = branch(s, me, n)
        opt.zero_grad()
        ((ddp(mt.tensor(x), use_aux=use) - mt.tensor(y)) ** 2).mean().backward()
        topt.zero_grad()
        ((tddp(to_torch(x, torch), use_aux=use) - to_torch(y, torch)) ** 2).mean().backward()
        log.append((grads(mine), grads(theirs)))
        opt.step()
        topt.step()
    return ddp, log


def check_run(ddp, theirs, log):
    assert_replicas_equal(list(ddp.parameters()))
    for s, (a, b) in enumerate(log):
        check_grads(a, b, f"at step {s}")
    for (name, p), q in zip(ddp.module.named_parameters(), theirs.parameters()):
        np.testing.assert_allclose(val(p), q.detach().numpy(), rtol=RTOL, atol=RTOL, err_msg=name)


@pytest.mark.parametrize("bucket_cap_mb", [0, 25], ids=["per-param", "one-bucket"])
def test_find_unused_parameters_branch_on_some_steps_matches_torch(torch_gloo, bucket_cap_mb):
    mine, theirs = pair(torch_gloo)
    ddp, log = train_both(torch_gloo, mine, theirs, uses_aux, find_unused_parameters=True,
                          bucket_cap_mb=bucket_cap_mb)
    check_run(ddp, theirs, log)
    n, me = world()
    assert all(a["spare"] is None for a, _ in log)  # never used anywhere: left alone
    assert log[1][0]["aux.weight"] is None  # step 1: unused on every rank
    if n > 1:  # step 3: used on rank 0 only, so every rank gets rank 0's share
        assert log[3][0]["aux.weight"] is not None


def test_static_graph_matches_torch(torch_gloo):
    mine, theirs = pair(torch_gloo, seed=4)
    ddp, log = train_both(torch_gloo, mine, theirs, lambda s, r, n: True, static_graph=True)
    check_run(ddp, theirs, log)
    r = ddp.reducer
    assert [r.names[i] for i in r.static_unused] == ["spare"]  # learned at step 0
    assert all(a["spare"] is None for a, _ in log)


def test_unused_without_flag_raises_where_torch_does(torch_gloo):
    """No error in backward or in a no_grad forward; the next forward with grad raises."""
    torch = torch_gloo
    n, me = world()
    mine, theirs = pair(torch, seed=8)
    x, y = rank_data(0, me)

    def events(ddp, tensor, grad_mode):
        out, errors = [], []
        for kind in ("train", "no_grad", "train"):
            try:
                if kind == "no_grad":
                    with grad_mode(False):
                        ddp(tensor(x))
                else:
                    ((ddp(tensor(x)) - tensor(y)) ** 2).mean().backward()
                out.append(f"{kind} ok")
            except RuntimeError as exc:
                out.append(f"{kind} raised")
                errors.append(str(exc))
        return out, errors

    ours, errors = events(DDP(mine), mt.tensor, mt.set_grad_enabled)
    theirs_, _ = events(torch.nn.parallel.DistributedDataParallel(theirs),
                        lambda a: to_torch(a, torch), torch.set_grad_enabled)
    assert ours == theirs_ == ["train ok", "no_grad ok", "train raised"]
    assert f"rank {me}: " in errors[0] and ": spare (index 0)" in errors[0]
