"""``nn.init`` on DTensors at 1-4 ranks: the initialisation FSDP2's example does after
``fully_shard`` (``model.reset_parameters()``) fills every rank's piece.

Spec: under one seed, each in-place initializer on a DTensor (every placement on a 1-D and a
2-D mesh, uneven pieces included) leaves exactly the values one process gets on the whole
tensor, and the generator where one process leaves it; ``reset_parameters`` on a model after
``fully_shard`` (1-D) and after ``parallelize_module`` + ``fully_shard`` (2-D) gives the
model one process gets (its forward equal); plain tensors are filled as before; a ``Partial``
DTensor is refused. Loading as FSDP2's checkpoint example loads (whole tensors distributed as
the sharded parameters are, ``load_state_dict(assign=True)``) fills the shards, on 1-D and
2-D (FSDP + TP) models; another dtype and (with ``strict``) a missing key are refused.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_fsdp_tp_init.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.distributed.tensor as dtensor
import mpitensor.nn as nn
from mpitensor.distributed.fsdp import fully_shard
from mpitensor.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

pytestmark = pytest.mark.mpi(min_size=1)

Shard, Replicate, Partial = dtensor.Shard, dtensor.Replicate, dtensor.Partial

FILLS = [
    ("uniform_", dict(a=-0.5, b=2.0)),
    ("normal_", dict(mean=1.0, std=0.3)),
    ("trunc_normal_", dict(std=0.5, a=-0.4, b=0.6)),
    ("constant_", dict(val=0.25)),
    ("ones_", {}),
    ("zeros_", {}),
    ("xavier_uniform_", dict(gain=1.5)),
    ("xavier_normal_", {}),
    ("kaiming_uniform_", dict(a=math.sqrt(5))),
    ("kaiming_normal_", dict(mode="fan_out")),
    ("orthogonal_", {}),
    ("eye_", {}),
]


def _meshes():
    n = dist.get_world_size()
    out = [dtensor.init_device_mesh("cpu", (n,))]
    if n % 2 == 0 and n > 2:
        out.append(dtensor.init_device_mesh("cpu", (2, n // 2)))
    return out


def _placements(mesh):
    one = [Shard(0), Shard(1), Replicate()]
    if mesh.ndim == 1:
        return [(p,) for p in one]
    return [(a, b) for a in one for b in one]


@pytest.mark.parametrize("name, kw", FILLS)
def test_each_initializer_gives_one_process_values(name, kw):
    fill = getattr(nn.init, name)
    for mesh in _meshes():
        for placements in _placements(mesh):
            d = dtensor.distribute_tensor(mt.zeros(7, 5, dtype=mt.float64), mesh, placements)
            whole = mt.zeros(7, 5, dtype=mt.float64)
            mt.manual_seed(11)
            assert fill(d, **kw) is d
            after = mt.rand(3)  # where the generator was left
            mt.manual_seed(11)
            fill(whole, **kw)
            np.testing.assert_array_equal(d.full_tensor().numpy(), whole.numpy(),
                                          err_msg=f"{name} {placements}")
            np.testing.assert_array_equal(after.numpy(), mt.rand(3).numpy())
            assert d.placements == placements


def _check_model(model, ref, width):
    """The forward of the sharded model against one process's: the parameters are equal, the
    sums of a row-parallel layer add its pieces in another order (float64, 8 terms)."""
    x = mt.from_numpy(np.random.default_rng(2).standard_normal((3, width)))
    out = model(x).detach()
    out = out.full_tensor() if isinstance(out, dtensor.DTensor) else out
    np.testing.assert_allclose(out.numpy(), ref(x).detach().numpy(), rtol=1e-12, atol=1e-12)


def _reset(model):
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()


def _two_models(build):
    mt.manual_seed(0)
    model, ref = build(), build()
    ref.load_state_dict(model.state_dict())
    return model, ref


def _mlp():
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5), nn.LayerNorm(5)).double()


def test_reset_parameters_after_fully_shard_is_one_process_init():
    model, ref = _two_models(_mlp)
    for m in (model[0], model[2]):
        fully_shard(m)
    fully_shard(model)
    for seed in (5, 6):
        mt.manual_seed(seed)
        _reset(model)
        mt.manual_seed(seed)
        _reset(ref)
        _check_model(model, ref, 6)


def test_reset_parameters_after_tensor_parallel_and_fully_shard():
    n = dist.get_world_size()
    for tp in (t for t in (1, 2, 4) if n % t == 0):
        mesh = dtensor.init_device_mesh("cpu", (n // tp, tp), mesh_dim_names=("dp", "tp"))
        model, ref = _two_models(_mlp)
        from mpitensor.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        mt.manual_seed(9)
        _reset(model)
        mt.manual_seed(9)
        _reset(ref)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            np.testing.assert_array_equal(p.detach().full_tensor().numpy(), q.detach().numpy(),
                                          err_msg=f"tp {tp}: {name}")
        _check_model(model, ref, 6)


def test_plain_tensors_are_filled_as_before():
    t = mt.zeros(4, 3)
    mt.manual_seed(1)
    nn.init.normal_(t)
    mt.manual_seed(1)
    np.testing.assert_array_equal(t.numpy(), mt.randn(4, 3).numpy())


def test_a_partial_dtensor_is_refused():
    mesh = dtensor.init_device_mesh("cpu", (dist.get_world_size(),))
    d = dtensor.DTensor.from_local(mt.zeros(2, 2), mesh, [Partial()])
    with pytest.raises(ValueError, match="Partial"):
        nn.init.normal_(d)


def _load_as_fsdp2_checkpoint_example(model, full_sd):
    """FSDP2's checkpoint example: each whole tensor distributed as the sharded parameter is,
    wrapped in a Parameter, loaded with assign=True."""
    sharded = model.state_dict()
    sd = {k: nn.Parameter(dtensor.distribute_tensor(v, sharded[k].device_mesh,
                                                    sharded[k].placements))
          for k, v in full_sd.items()}
    return model.load_state_dict(sd, strict=False, assign=True)


def test_load_state_dict_with_assign_fills_the_shards():
    n = dist.get_world_size()
    for tp in (t for t in (1, 2) if n % t == 0):
        mesh = dtensor.init_device_mesh("cpu", (n // tp, tp), mesh_dim_names=("dp", "tp"))
        mt.manual_seed(0)
        model = _mlp()
        mt.manual_seed(1)
        ref = _mlp()  # other weights: the load must replace the model's
        if tp > 1:
            from mpitensor.distributed.tensor.parallel import parallelize_module

            parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(),
                                                   "2": RowwiseParallel()})
        fully_shard(model[0], mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        result = _load_as_fsdp2_checkpoint_example(
            model, {k: v.detach() for k, v in ref.state_dict().items()})
        assert list(result.missing_keys) == [] and list(result.unexpected_keys) == []
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert isinstance(p, dtensor.DTensor) and p.requires_grad, name
            np.testing.assert_array_equal(p.detach().full_tensor().numpy(), q.detach().numpy(),
                                          err_msg=f"tp {tp}: {name}")
        _check_model(model, ref, 6)
        model(mt.randn(2, 6, dtype=mt.float64)).sum().backward()  # the shards train on
        assert all(p.grad is not None for p in model.parameters())


def test_load_state_dict_with_assign_refuses_other_dtypes_and_missing_keys():
    mt.manual_seed(0)
    model = _mlp()
    fully_shard(model)
    sd = {k: v.detach().full_tensor() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="assign=True.*float32"):
        model.load_state_dict({**sd, "0.weight": sd["0.weight"].float()}, assign=True)
    del sd["2.bias"]
    with pytest.raises(RuntimeError, match=r"missing keys \['2.bias'\]"):
        model.load_state_dict(sd, assign=True)
    result = model.load_state_dict(sd, strict=False, assign=True)
    assert list(result.missing_keys) == ["2.bias"]
