"""FSDP2's way of building a model (pytorch/examples' FSDP2 example): construct it under
``with device("meta")``, ``fully_shard`` each block and the root, ``to_empty(device="cpu")``,
``reset_parameters()``. At 1-4 ranks the sharded model then holds exactly the values a plain
construction under the same seed holds, and trains like it."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
from mpitensor.distributed.fsdp import fully_shard
from mpitensor.distributed.tensor import Shard


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(6)
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        return x + self.fc(self.norm(x)).tanh()

    def reset_parameters(self):
        self.norm.reset_parameters()
        self.fc.reset_parameters()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 6)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.out = nn.Linear(6, 3, bias=False)

    def forward(self, idx):
        h = self.emb(idx)
        for b in self.blocks:
            h = b(h)
        return self.out(h)


def _reset(m):
    for sub in m.modules():
        if not list(sub.children()) and hasattr(sub, "reset_parameters"):
            sub.reset_parameters()


@pytest.mark.mpi(min_size=1)
def test_meta_construction_sharded_then_materialized():
    mt.manual_seed(0)
    plain = Net()
    want = {k: v.detach().numpy().copy() for k, v in plain.state_dict().items()}
    mt.manual_seed(0)
    with mt.device("meta"):
        model = Net()
    assert all(p.is_meta for p in model.parameters())
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
    assert all(p.placements == (Shard(0),) for p in model.parameters())
    model.to_empty(device="cpu")
    mt.manual_seed(0)
    _reset(model)  # the leaves in construction order: the same draws as the plain model
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.full_tensor().detach().numpy(), want[name],
                                      err_msg=name)
    idx = mt.tensor(np.arange(12).reshape(3, 4) % 7)
    opt, ref_opt = mt.optim.Adam(model.parameters(), lr=1e-2), mt.optim.Adam(
        plain.parameters(), lr=1e-2)
    for _ in range(3):
        for m, o in ((model, opt), (plain, ref_opt)):
            o.zero_grad()
            m(idx).square().mean().backward()
            o.step()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.full_tensor().detach().numpy(),
                                   plain.state_dict()[name].detach().numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)
