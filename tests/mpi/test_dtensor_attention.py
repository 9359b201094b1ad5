"""F.scaled_dot_product_attention on DTensors at 1-4 ranks, against the plain computation
on the full tensors: head- or batch-sharded operands keep their Shard (the tensor-parallel
attention of llama-style models), other placements are gathered first, gradients come back
placed like their inputs, and dropout on replicated operands is refused."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling
from mpitensor.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor.distributed.tensor._dispatch import ShardingError

RTOL = 1e-12  # float64: a softmax over 6 keys and two small products


def full(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


CASES = [((Shard(1),) * 3, (Shard(1),)), ((Shard(0),) * 3, (Shard(0),)),
         ((Shard(2),) * 3, (Replicate(),)), ((Replicate(),) * 3, (Replicate(),)),
         ((Shard(1), Shard(1), Replicate()), (Replicate(),)),
         ((Shard(-3),) * 3, (Shard(1),))]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("causal", [False, True])
def test_attention_on_dtensors(case, causal):
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    ins, want = CASES[case]
    shapes = [(2 * n, 2 * n, 6, 4), (2 * n, 2 * n, 6, 4), (2 * n, 2 * n, 6, 3)]
    arrs = [full(s, i) for i, s in enumerate(shapes)]
    ds = [distribute_tensor(mt.tensor(a), mesh, [p]).requires_grad_() for a, p in zip(arrs, ins)]
    out = F.scaled_dot_product_attention(*ds, is_causal=causal)
    assert out.placements == want
    assert tuple(out.shape) == (2 * n, 2 * n, 6, 3)
    plain = [mt.tensor(a, requires_grad=True) for a in arrs]
    ref = F.scaled_dot_product_attention(*plain, is_causal=causal)
    np.testing.assert_allclose(out.full_tensor().detach().numpy(), ref.detach().numpy(),
                               rtol=RTOL, atol=1e-14)
    w = mt.tensor(full(tuple(ref.shape), 9))
    (out.full_tensor() * w).sum().backward()
    (ref * w).sum().backward()
    for d, t in zip(ds, plain):
        assert d.grad.placements == d.placements
        np.testing.assert_allclose(d.grad.full_tensor().numpy(), t.grad.numpy(), rtol=RTOL,
                                   atol=1e-14)


@pytest.mark.mpi(min_size=2)
def test_mask_and_dropout():
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    arrs = [full((1, 2 * n, 5, 4), i) for i in range(3)]
    mask = full((5, 5), 7) > 0
    mask[:, 0] = True  # every query sees a key
    ds = [distribute_tensor(mt.tensor(a), mesh, [Shard(1)]) for a in arrs]
    dm = distribute_tensor(mt.tensor(mask), mesh, [Replicate()])
    out = F.scaled_dot_product_attention(*ds, attn_mask=dm)
    ref = F.scaled_dot_product_attention(*[mt.tensor(a) for a in arrs], attn_mask=mt.tensor(mask))
    assert out.placements == (Shard(1),)
    np.testing.assert_allclose(out.full_tensor().numpy(), ref.numpy(), rtol=RTOL, atol=1e-14)
    reps = [distribute_tensor(mt.tensor(a), mesh, [Replicate()]) for a in arrs]
    with pytest.raises(ShardingError, match="dropout_p"):
        F.scaled_dot_product_attention(*reps, dropout_p=0.5)
    dropped = F.scaled_dot_product_attention(*ds, dropout_p=0.5)  # each rank its own heads
    assert dropped.placements == (Shard(1),)
