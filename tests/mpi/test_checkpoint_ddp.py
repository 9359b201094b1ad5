"""Activation checkpointing under DDP at 1-4 ranks: a model whose blocks are checkpointed
(``apply_activation_checkpointing``, both variants, and ``torch.utils.checkpoint`` inside a
forward) trains exactly as the same model without checkpointing, in float64, step for step.

The recomputation runs a backward inside DDP's backward; the hooks it fires (DDP's bucket
reductions) and what they queue must behave as in one pass, which is what this checks.
Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_checkpoint_ddp.py``.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.utils.checkpoint import checkpoint

pytestmark = pytest.mark.mpi(min_size=1)


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return x + self.fc2(self.drop(mt.tanh(self.fc1(x))))


class Net(nn.Module):
    def __init__(self, width=6, depth=3, inline=None):
        super().__init__()
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)
        self.inline = inline  # None, or use_reentrant for checkpoint() called in forward

    def forward(self, x):
        for b in self.blocks:
            x = b(x) if self.inline is None else checkpoint(b, x, use_reentrant=self.inline)
        return self.head(x)


def _train(make, steps=4):
    """Parameters after ``steps`` SGD steps of a DDP copy of ``make()``, on this rank's batch."""
    mt.manual_seed(0)
    model = make().double()
    ddp = DDP(model, bucket_cap_mb=0.0005)  # several buckets: hooks fire across the blocks
    opt = mt.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    rank = dist.get_rank()
    for step in range(steps):
        g = np.random.default_rng(100 * step + rank)
        x = mt.tensor(g.standard_normal((5, 6)), requires_grad=True)
        y = mt.tensor(g.standard_normal((5, 1)))
        mt.manual_seed(1000 + 10 * step + rank)  # dropout: the same masks in both runs
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def _wrapped(impl, kinds=(Block,)):
    net = Net()
    apply_activation_checkpointing(
        net, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=impl),
        check_fn=lambda m: isinstance(m, kinds))
    return net


MAKERS = {
    "wrapper-non-reentrant": lambda: _wrapped(CheckpointImpl.NO_REENTRANT),
    "wrapper-reentrant": lambda: _wrapped(CheckpointImpl.REENTRANT),
    # every parameter inside a checkpoint: DDP's first hook fires inside a recomputation
    "wrapper-everything": lambda: _wrapped(CheckpointImpl.NO_REENTRANT, (Block, nn.Linear)),
    "inline-non-reentrant": lambda: Net(inline=False),
    "inline-reentrant": lambda: Net(inline=True),
}


@pytest.mark.parametrize("how", list(MAKERS))
def test_checkpointed_ddp_trains_as_plain_ddp(how):
    plain = _train(Net)
    ours = _train(MAKERS[how])
    for a, b in zip(plain, ours):
        np.testing.assert_array_equal(a, b)
    # and every replica holds the same parameters
    for a in ours:
        seen = [None] * dist.get_world_size()
        dist.all_gather_object(seen, a.tobytes())
        assert len(set(seen)) == 1
