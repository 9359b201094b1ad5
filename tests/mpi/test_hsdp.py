"""HSDP: ``fully_shard`` over a 2-D mesh (replicate, shard) at 1-4 ranks.

Spec: on every (replicate, shard) layout of the world (2x2, 1x4 and 4x1 at 4 ranks; 1x2 and
2x1 at 2), a model whose blocks and root are given to ``fully_shard(mesh=2-D)`` trains for 20
steps to the losses of the same model under DDP (rtol 1e-5, float32) and to its weights (to
1e-5 of each tensor's largest entry: the same sums, grouped otherwise); parameters and
gradients are DTensors placed ``(Replicate(), Shard(0))`` whose pieces are ``torch.chunk``'s
rows of the shard dim, and every rank's whole tensors are bitwise the same (the replicas add
the same numbers in the same order); mixed precision gathers in bfloat16 and reduces in
float32; gradient accumulation without sync equals DDP's; sharded and full state dicts
round-trip, and a distributed checkpoint saved under HSDP loads bit-exact on a 1-D mesh and on
another 2-D one; clipping equals DDP's; torch's HSDP over gloo gives the same losses; a 3-D
mesh, a mesh whose dims do not multiply to the world, parameters that differ between replicas
and a tensor-parallel parameter fail on every rank before any gather.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_hsdp.py``.
"""

from __future__ import annotations

import shutil
from typing import List, Tuple

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.distributed.fsdp as fsdp
import mpitensor.nn as nn
from mpitensor.distributed.device_mesh import init_device_mesh
from mpitensor.distributed.fsdp import FSDPModule, fully_shard
from mpitensor.distributed.tensor import DTensor, Replicate, Shard
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.optim import Adam

from .sharded_models import OPTIMIZERS, RTOL, STEPS, batch, mlp, torch_twin
from .test_fsdp import accumulate_beside_ddp, train_beside_torch
from .torch_gloo import torch_gloo_fixture  # noqa: F401 - the fixture torch_gloo

pytestmark = pytest.mark.mpi(min_size=1)

HSDP = (Replicate(), Shard(0))


def _layouts() -> List[Tuple[int, int]]:
    """Every (replicate, shard) shape of the world: 1xN, Nx1 and those between."""
    n = dist.get_world_size()
    return [(r, n // r) for r in range(1, n + 1) if n % r == 0]


def _mesh(r: int, s: int):
    return init_device_mesh("cpu", (r, s), mesh_dim_names=("replicate", "shard"))


def _shard(model, mesh, **kw):
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    return model


def _step(model, opt, s):
    x, y = batch(s, dist.get_rank())
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    return float(loss.item())


def _close(a, b, what, rtol=RTOL):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=0, err_msg=what)


def _same_on_every_rank(arr: np.ndarray, what: str) -> None:
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, arr)
    for r, other in enumerate(everyone):
        assert other.tobytes() == arr.tobytes(), f"{what}: rank {r} holds other bits"


@pytest.mark.parametrize("reshard", [True, False])
@pytest.mark.parametrize("opt_cls, kw", OPTIMIZERS)
def test_hsdp_trains_like_ddp(reshard, opt_cls, kw):
    for r, s in _layouts():
        mesh = _mesh(r, s)
        ref = DDP(mlp())
        ref_opt = opt_cls(ref.parameters(), **kw)
        model = _shard(mlp(), mesh, reshard_after_forward=reshard)
        opt = opt_cls(model.parameters(), **kw)
        for step in range(STEPS):
            _close(_step(model, opt, step), _step(ref, ref_opt, step),
                   f"{r}x{s}: loss at step {step}")
        rank_in_shard = mesh.get_local_rank("shard")
        for (name, p), q in zip(model.named_parameters(), ref.module.parameters()):
            want = q.detach().numpy()
            assert isinstance(p, DTensor) and p.placements == HSDP, name
            assert p.device_mesh == mesh, name
            assert isinstance(p.grad, DTensor) and p.grad.placements == HSDP, name
            rows = -(-want.shape[0] // s)
            assert tuple(p.to_local().shape)[0] == max(0, min(rows, want.shape[0]
                                                              - rank_in_shard * rows)), name
            whole = p.full_tensor().detach().numpy()
            # the sums of DDP's all_reduce and of reduce_scatter + all_reduce group the
            # ranks' float32 terms otherwise: near-zero entries compare to the largest
            np.testing.assert_allclose(whole, want, rtol=0,
                                       atol=RTOL * float(np.abs(want).max()),
                                       err_msg=f"{r}x{s}: {name}")
            _same_on_every_rank(whole, f"{r}x{s}: {name}")


def test_gradients_are_the_mean_over_every_rank():
    """One backward: each rank's gradient rows are exactly its rows of DDP's mean gradient
    (float64: the grouping of the sums changes nothing at this tolerance)."""
    for r, s in _layouts():
        mesh = _mesh(r, s)
        model = _shard(mlp(1).to(mt.float64), mesh)
        ref = DDP(mlp(1).to(mt.float64))
        for m in (model, ref):
            x, y = batch(0, dist.get_rank())
            ((m(x.double()) - y.double()) ** 2).mean().backward()
        for (name, p), q in zip(model.named_parameters(), ref.module.parameters()):
            np.testing.assert_allclose(p.grad.full_tensor().numpy(), q.grad.numpy(),
                                       rtol=1e-12, atol=1e-15, err_msg=f"{r}x{s}: {name}")


def test_all_reduce_over_replicas_overlaps_backward():
    model = _shard(mlp(2), _mesh(*_layouts()[len(_layouts()) // 2]))
    _step(model, Adam(model.parameters(), lr=0.01), 0)  # the first forward records the order
    units = [m._fsdp_state for m in model if isinstance(m, FSDPModule)]
    x, y = batch(1, dist.get_rank())
    x.requires_grad_()
    seen = []
    # _reduce holds (work, out, None) once a unit's all-reduce over the replicas is in flight
    x.register_hook(lambda g: seen.append(
        [u.group._reduce is not None and u.group._reduce[2] is None for u in units]))
    ((model(x) - y) ** 2).mean().backward()
    # the last unit's all-reduce started when the unit before it had its gradients, before
    # the gradient reached the input (so it overlapped the rest of backward)
    assert seen[0][-1], seen
    assert all(u.group._reduce is None for u in units)  # all waited for at the end


def test_gradient_accumulation_without_sync_equals_ddp():
    for r, s in _layouts():
        ref = DDP(mlp(3))
        model = _shard(mlp(3), _mesh(r, s))
        accumulate_beside_ddp(model, ref)
        for (name, p), q in zip(model.named_parameters(), ref.module.parameters()):
            want = q.detach().numpy()
            np.testing.assert_allclose(p.full_tensor().detach().numpy(), want, rtol=0,
                                       atol=RTOL * float(np.abs(want).max()),
                                       err_msg=f"{r}x{s}: {name}")


def test_checkpoint_saved_under_hsdp_loads_on_other_meshes(tmp_path):
    """dcp.save of the (Replicate(), Shard(0)) state dict, loaded by fully_shard models on a
    1-D mesh and on the 2-D mesh of the other shape: the same whole tensors, bit for bit."""
    import mpitensor.distributed.checkpoint as dcp

    n = dist.get_world_size()
    where = [str(tmp_path / "ckpt")]
    dist.broadcast_object_list(where)  # rank 0's directory for every rank
    saved = _shard(mlp(13), _mesh(*_layouts()[len(_layouts()) // 2]))  # 2x2 at 4 ranks
    _step(saved, Adam(saved.parameters(), lr=0.01), 0)
    try:
        dcp.save({"model": saved.state_dict()}, checkpoint_id=where[0])
        for mesh in (init_device_mesh("cpu", (n,)), _mesh(1, n)):
            other = _shard(mlp(14), mesh)
            sd = {"model": other.state_dict()}
            dcp.load(sd, checkpoint_id=where[0])
            other.load_state_dict(sd["model"])
            for (name, p), q in zip(saved.named_parameters(), other.parameters()):
                np.testing.assert_array_equal(q.full_tensor().detach().numpy(),
                                              p.full_tensor().detach().numpy(), err_msg=name)
    finally:
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(where[0], ignore_errors=True)


def test_mixed_precision_gathers_in_bf16_and_reduces_in_fp32():
    mp = fsdp.MixedPrecisionPolicy(param_dtype=mt.bfloat16, reduce_dtype=mt.float32,
                                   output_dtype=mt.float32)
    for r, s in _layouts():
        model = _shard(mlp(4), _mesh(r, s), mp_policy=mp)
        seen = []
        model[0].register_forward_pre_hook(
            lambda m, a, seen=seen: seen.append((m.weight.dtype, a[0].dtype)))
        opt = Adam(model.parameters(), lr=0.01)
        ref = DDP(mlp(4))
        ref_opt = Adam(ref.parameters(), lr=0.01)
        for step in range(3):
            # bfloat16 keeps 8 bits: the losses agree to a few of its units in the last place
            _close(_step(model, opt, step), _step(ref, ref_opt, step),
                   f"{r}x{s}: loss at step {step}", rtol=3e-2)
        assert seen[0] == (mt.bfloat16, mt.bfloat16)
        for name, p in model.named_parameters():
            assert p.dtype == mt.float32 and p.grad.dtype == mt.float32, name
            _same_on_every_rank(p.full_tensor().detach().numpy(), f"{r}x{s}: {name}")
        assert model[0]._fsdp_state.group.reduce_dtype == mt.float32


def test_sharded_and_full_state_dicts():
    from mpitensor.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    full_opts = StateDictOptions(full_state_dict=True)
    x, _ = batch(0, dist.get_rank())
    for r, s in _layouts():
        mesh = _mesh(r, s)
        model = _shard(mlp(6), mesh)
        _step(model, Adam(model.parameters(), lr=0.01), 0)
        sd = model.state_dict()
        assert list(sd) == list(mlp(6).state_dict())
        assert all(v.placements == HSDP for v in sd.values())
        other = _shard(mlp(7), mesh)
        other.load_state_dict(sd)
        with mt.no_grad():
            want = model(x).numpy()
            np.testing.assert_array_equal(other(x).numpy(), want)
        full = get_model_state_dict(model, options=full_opts)
        for k, v in sd.items():
            assert not isinstance(full[k], DTensor), k
            np.testing.assert_array_equal(full[k].numpy(), v.full_tensor().numpy(), err_msg=k)
            _same_on_every_rank(full[k].numpy(), k)
        third = _shard(mlp(8), mesh)
        set_model_state_dict(third, full, options=full_opts)
        fourth = _shard(mlp(9), mesh)
        fourth.load_state_dict(full)  # whole tensors: each rank keeps its rows
        with mt.no_grad():
            np.testing.assert_array_equal(third(x).numpy(), want)
            np.testing.assert_array_equal(fourth(x).numpy(), want)
    one_d = _shard(mlp(10), init_device_mesh("cpu", (dist.get_world_size(),)))
    if dist.get_world_size() > 1:  # a 1-D layout is another DTensor than the 2-D one
        with pytest.raises(ValueError, match="redistribute it first"):
            fourth.load_state_dict(one_d.state_dict())


def test_clip_grad_norm_matches_ddp():
    for r, s in _layouts():
        model = _shard(mlp(11).to(mt.float64), _mesh(r, s))
        ref = DDP(mlp(11).to(mt.float64))
        for m in (model, ref):
            x, y = batch(1, dist.get_rank())
            ((m(x.double()) - y.double()) ** 2).mean().backward()
        got = nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        want = nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        _close(got.full_tensor().item(), want.item(), f"{r}x{s}: norm", rtol=1e-12)
        for (name, p), q in zip(model.named_parameters(), ref.module.parameters()):
            np.testing.assert_allclose(p.grad.full_tensor().numpy(), q.grad.numpy(),
                                       rtol=1e-12, atol=1e-15, err_msg=f"{r}x{s}: {name}")


def test_losses_match_torch_hsdp(torch_gloo):
    torch = torch_gloo
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    for r, s in _layouts():
        ours = mlp(12)
        theirs = torch_twin(ours, torch)
        tmesh = torch_mesh("cpu", (r, s), mesh_dim_names=("replicate", "shard"))
        for m in theirs:
            if isinstance(m, torch.nn.Linear):
                torch_fully_shard(m, mesh=tmesh)
        torch_fully_shard(theirs, mesh=tmesh)
        _shard(ours, _mesh(r, s))
        train_beside_torch(ours, theirs, torch, what=f"{r}x{s}: ")


def test_bad_meshes_fail_on_every_rank_before_any_gather():
    n = dist.get_world_size()
    with pytest.raises(ValueError, match="has 3 dimensions"):
        fully_shard(nn.Linear(2, 2), mesh=init_device_mesh("cpu", (1, 1, n)))
    with pytest.raises(ValueError, match="world has"):  # the dims do not multiply to the world
        init_device_mesh("cpu", (n + 1, 2), mesh_dim_names=("replicate", "shard"))
    # the model is untouched by a refused call, and a good mesh still works after it
    layer = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="has 3 dimensions"):
        fully_shard(layer, mesh=init_device_mesh("cpu", (n, 1, 1)))
    assert not isinstance(layer.weight, DTensor)
    fully_shard(layer, mesh=_mesh(1, n))
    assert layer.weight.placements == HSDP


@pytest.mark.mpi(min_size=2)
def test_values_that_differ_between_replicas_are_kept_as_torch_does():
    """Without MPITENSOR_DEBUG each rank keeps its rows of its own values (torch's
    behaviour): replicas then hold different rows, which the debug mode refuses (next test)."""
    for r, s in _layouts():
        mesh = _mesh(r, s)
        mt.manual_seed(dist.get_rank())
        layer = nn.Linear(4, 3)
        own = layer.weight.detach().numpy().copy()
        fully_shard(layer, mesh=mesh)
        rows = -(-3 // s)
        start = min(mesh.get_local_rank("shard") * rows, 3)
        np.testing.assert_array_equal(layer.weight.to_local().detach().numpy(),
                                      own[start:start + rows], err_msg=f"{r}x{s}")


@pytest.mark.mpi(min_size=2)
def test_parameters_that_differ_between_replicas_fail_on_every_rank(monkeypatch):
    from mpitensor._base import config

    n = dist.get_world_size()
    monkeypatch.setattr(config, "DEBUG", True)  # as MPITENSOR_DEBUG=1 sets it at import
    for r, s in _layouts():
        if r == 1:
            continue
        mesh = _mesh(r, s)
        mt.manual_seed(mesh.get_local_rank("replicate"))  # alike in a shard line only
        with pytest.raises(ValueError, match=r"differ across ranks of the mesh.*rank \d"
                                             r".*MPITENSOR_DEBUG=1"):
            fully_shard(nn.Linear(4, 3), mesh=mesh)
    monkeypatch.setattr(config, "DEBUG", False)  # the shapes are checked in either mode
    mt.manual_seed(0)
    width = 5 if dist.get_rank() == n - 1 else 4
    with pytest.raises(ValueError, match="differ across ranks"):
        fully_shard(nn.Linear(width, 3), mesh=_mesh(n, 1))


def test_tensor_parallel_parameter_on_a_2d_mesh_is_refused():
    from mpitensor.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (1, 1, n), mesh_dim_names=("replicate", "shard", "tp"))
    layer = parallelize_module(nn.Linear(4, 2 * n), mesh["tp"], ColwiseParallel())
    with pytest.raises(NotImplementedError, match="HSDP over a tensor-parallel model"):
        fully_shard(layer, mesh=mesh["replicate", "shard"])
