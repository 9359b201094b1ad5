"""Gradient clipping and vector norms on DTensors (issue 28), at 1-4 ranks.

Spec: ``clip_grad_norm_``, ``get_total_norm``, ``clip_grads_with_norm_`` and
``clip_grad_value_`` on the parameters of a model under ``fully_shard``, one under
``parallelize_module`` (colwise + rowwise) and a list mixing DTensors with plain tensors give
the total norm and the clipped gradients of the same plain model on one rank (float64), for
norm types 2, 1, inf and 3; the total is a 0-d DTensor replicated over the parameters' mesh;
a NaN on one rank raises under ``error_if_nonfinite`` on every rank; uneven shards (empty
pieces at 3-4 ranks) take part in every collective. ``Tensor.norm`` and
``linalg.vector_norm`` of a DTensor equal the whole tensor's, with gradients.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_clip_grad_dtensor.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn as nn
from mpitensor.distributed.fsdp import fully_shard
from mpitensor.distributed.tensor import (
    DTensor,
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)
from mpitensor.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

pytestmark = pytest.mark.mpi(min_size=1)

# float64 sums of a few hundred terms, computed in another order than the reference's
TOL = 1e-12
NORMS = [2.0, 1.0, math.inf, 3.0]
IN, HIDDEN, OUT = 6, 12, 3  # OUT rows < 4 ranks: empty pieces at 4 ranks, uneven at 3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(IN, HIDDEN)
        self.down = nn.Linear(HIDDEN, OUT)

    def forward(self, x):
        return self.down(mt.tanh(self.up(x)))


def _plain() -> Net:
    mt.manual_seed(0)
    return Net().double()


def _data():
    rng = np.random.default_rng(7)
    return mt.from_numpy(rng.standard_normal((8, IN))), mt.from_numpy(rng.standard_normal((8, OUT)))


def _backward(model) -> None:
    x, y = _data()
    ((model(x) - y) ** 2).sum().backward()


def _fsdp():
    model = _plain()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fully_shard(model.up, mesh=mesh)
    fully_shard(model.down, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _tp():
    model = _plain()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model


def _whole(g):
    return (g.full_tensor() if isinstance(g, DTensor) else g).detach().numpy()


def _check_clip(model, p, max_norm=0.5):
    plain = _plain()
    _backward(model)
    _backward(plain)
    want = nn.utils.clip_grad_norm_(plain.parameters(), max_norm, p)
    got = nn.utils.clip_grad_norm_(model.parameters(), max_norm, p)
    assert isinstance(got, DTensor) and got.shape == () and \
        all(pl == Replicate() for pl in got.placements)
    np.testing.assert_allclose(got.to_local().numpy(), want.numpy(), rtol=TOL, err_msg=str(p))
    for (name, a), b in zip(model.named_parameters(), plain.parameters()):
        np.testing.assert_allclose(_whole(a.grad), b.grad.numpy(), rtol=TOL, atol=TOL,
                                   err_msg=f"{name} p={p}")


@pytest.mark.parametrize("p", NORMS)
def test_clip_grad_norm_under_fully_shard(p):
    _check_clip(_fsdp(), p)


@pytest.mark.parametrize("p", NORMS)
def test_clip_grad_norm_under_tensor_parallel(p):
    _check_clip(_tp(), p)


@pytest.mark.parametrize("p", NORMS)
def test_total_norm_of_dtensors_and_plain_tensors(p):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rng = np.random.default_rng(3)
    wholes = [rng.standard_normal(s) for s in ((5, 3), (2, 7), (4,), (3,))]
    tensors = [distribute_tensor(mt.from_numpy(wholes[0]), mesh, [Shard(0)]),
               distribute_tensor(mt.from_numpy(wholes[1]), mesh, [Shard(1)]),
               distribute_tensor(mt.from_numpy(wholes[2]), mesh, [Replicate()]),
               mt.from_numpy(wholes[3].copy())]
    want = nn.utils.get_total_norm([mt.from_numpy(w) for w in wholes], p)
    got = nn.utils.get_total_norm(tensors, p, foreach=True)
    np.testing.assert_allclose(got.full_tensor().numpy(), want.numpy(), rtol=TOL)
    # a Partial("sum") DTensor is reduced first: its terms sum to the whole
    n = dist.get_world_size()
    part = DTensor.from_local(mt.from_numpy(wholes[0] / n), mesh, [dist.tensor.Partial()])
    got = nn.utils.get_total_norm([part], p)
    want = nn.utils.get_total_norm([mt.from_numpy(wholes[0] / n * n)], p)
    np.testing.assert_allclose(got.full_tensor().numpy(), want.numpy(), rtol=TOL)


def test_mixed_parameters_clip_and_value():
    model, plain = _fsdp(), _plain()
    extra, ref = nn.Parameter(mt.ones(3).double()), nn.Parameter(mt.ones(3).double())
    _backward(model)
    _backward(plain)
    extra.grad = mt.full((3,), 2.0).double()
    ref.grad = mt.full((3,), 2.0).double()
    want = nn.utils.get_total_norm([q.grad for q in plain.parameters()] + [ref.grad], 3.0)
    got = nn.utils.get_total_norm([q.grad for q in model.parameters()] + [extra.grad], 3.0)
    np.testing.assert_allclose(got.full_tensor().numpy(), want.numpy(), rtol=TOL)
    nn.utils.clip_grads_with_norm_(list(model.parameters()) + [extra], 0.1, got)
    nn.utils.clip_grads_with_norm_(list(plain.parameters()) + [ref], 0.1, want)
    for a, b in zip(list(model.parameters()) + [extra], list(plain.parameters()) + [ref]):
        np.testing.assert_allclose(_whole(a.grad), b.grad.numpy(), rtol=TOL, atol=TOL)
    nn.utils.clip_grad_value_(model.parameters(), 0.01)
    nn.utils.clip_grad_value_(plain.parameters(), 0.01)
    for a, b in zip(model.parameters(), plain.parameters()):
        np.testing.assert_allclose(_whole(a.grad), b.grad.numpy(), rtol=TOL, atol=TOL)


def test_nonfinite_on_one_rank_raises_on_every_rank():
    for p in NORMS:
        model = _fsdp()
        _backward(model)
        g = model.up.weight.to_local().grad
        if dist.get_rank() == dist.get_world_size() - 1:
            g[0, 0] = math.nan
        with pytest.raises(RuntimeError, match="norm"):
            nn.utils.clip_grad_norm_(model.parameters(), 1.0, p, error_if_nonfinite=True)
        total = nn.utils.clip_grad_norm_(model.parameters(), 1.0, p)
        assert math.isnan(float(total.to_local()))
    dist.barrier()


@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, math.inf])
def test_vector_norm_of_a_dtensor_with_gradient(p):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    rng = np.random.default_rng(5)
    whole = rng.standard_normal((3, 5))  # 3 rows: empty pieces at 4 ranks
    for placement in (Shard(0), Shard(1), Replicate()):
        ref = mt.from_numpy(whole.copy()).requires_grad_()
        d = distribute_tensor(mt.from_numpy(whole.copy()), mesh, [placement]).requires_grad_()
        for dim in (None, 0, 1, (0, 1)):  # (0, 1): every dim named, a 0-d output
            out = d.norm(p, dim) if dim is not None else mt.linalg.vector_norm(d, p)
            want = ref.norm(p, dim) if dim is not None else mt.linalg.vector_norm(ref, p)
            np.testing.assert_allclose(_whole(out), want.detach().numpy(), rtol=TOL)
            out.sum().backward()
            want.sum().backward()
            np.testing.assert_allclose(_whole(d.grad), ref.grad.numpy(), rtol=TOL, atol=TOL,
                                       err_msg=f"{placement} dim={dim} p={p}")
            d.grad = None
            ref.grad = None
