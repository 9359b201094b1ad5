"""The small models and batches the sharding tests (ZeRO, fully_shard) train."""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

import mpitensor as mt
import mpitensor.nn as nn

STEPS = 20
RTOL = 1e-5  # float32 sums of a few terms
DIMS = (6, 16, 5, 3)  # the last two are smaller than 4 ranks: torch.chunk pads those shards


def mlp(seed: int = 0, dims: Sequence[int] = DIMS) -> nn.Sequential:
    """Linear layers of widths ``dims`` with Tanh between them, seeded."""
    mt.manual_seed(seed)
    layers = []
    for a, b in zip(dims[:-1], dims[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def batch(step: int, rank: int, dims: Sequence[int] = DIMS) -> Tuple[mt.Tensor, mt.Tensor]:
    """Four samples and targets, different on every rank and step."""
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.standard_normal((4, dims[0])).astype(np.float32)
    y = rng.standard_normal((4, dims[-1])).astype(np.float32)
    return mt.from_numpy(x), mt.from_numpy(y)


def torch_twin(ours: nn.Sequential, torch: object) -> object:
    """torch's model of the same layers as ``ours`` (an :func:`mlp`), with its weights."""
    from .torch_gloo import copy_state

    layers = []
    for m in ours:
        if isinstance(m, nn.Linear):
            layers.append(torch.nn.Linear(m.in_features, m.out_features))
        else:
            layers.append(torch.nn.Tanh())
    theirs = torch.nn.Sequential(*layers)
    copy_state(ours, theirs, torch)
    return theirs


#: the optimizers the equivalence tests run: (class, hyper-parameters)
OPTIMIZERS = [(mt.optim.Adam, {"lr": 0.01}), (mt.optim.SGD, {"lr": 0.05, "momentum": 0.9})]
