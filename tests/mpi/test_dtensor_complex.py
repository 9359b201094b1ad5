"""view_as_complex / view_as_real on DTensors at 1-4 ranks, against the same computation on
the full tensors (built from a seed on every rank): a Shard of a dim other than the pairs'
keeps its place, the pairs' dim sharded is gathered first, and gradients come back sharded
like their inputs. The rotary embedding of llama (as pytorch/examples' fsdp_tp_example runs
it on head-split DTensors) is the case that matters."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

RTOL = 1e-13  # float64: one complex product per element, summed over a few terms


def full(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("placement", [Shard(0), Shard(1), Shard(-2), Shard(2), Replicate()])
def test_rotary_on_dtensors(placement):
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    arr, rot = full((2 * n, 3 * n, 2), 1), full((3 * n, 2), 2)
    rot_c = rot[:, 0] + 1j * rot[:, 1]
    x = distribute_tensor(mt.tensor(arr), mesh, [placement]).requires_grad_()
    z = mt.view_as_complex(x)
    want_place = (Replicate(),) if placement in (Shard(2), Shard(-1)) else (
        (Shard(placement.dim % 3),) if isinstance(placement, Shard) else (Replicate(),))
    assert z.placements == want_place
    assert tuple(z.shape) == (2 * n, 3 * n)
    f = distribute_tensor(mt.tensor(rot_c), mesh, [Replicate()])
    y = mt.view_as_real(z * f)
    assert y.placements == want_place and tuple(y.shape) == (2 * n, 3 * n, 2)
    out = y.flatten(1)
    ref = mt.tensor(arr, requires_grad=True)
    ref_out = mt.view_as_real(mt.view_as_complex(ref) * mt.tensor(rot_c)).flatten(1)
    np.testing.assert_allclose(out.full_tensor().detach().numpy(), ref_out.detach().numpy(),
                               rtol=RTOL)
    w = full(tuple(ref_out.shape), 3)
    (out.full_tensor() * mt.tensor(w)).sum().backward()
    (ref_out * mt.tensor(w)).sum().backward()
    assert x.grad.placements == x.placements
    np.testing.assert_allclose(x.grad.full_tensor().numpy(), ref.grad.numpy(), rtol=RTOL)


@pytest.mark.mpi(min_size=2)
def test_pieces_are_views_of_the_local_pieces():
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    x = distribute_tensor(mt.tensor(full((n, 4, 2), 4)), mesh, [Shard(0)])
    z = mt.view_as_complex(x)
    loc = z.to_local()
    assert tuple(loc.shape) == (1, 4)
    x.to_local()[0, 1, 1] = 9.0  # the local complex piece reads the local real piece
    assert loc[0, 1].item().imag == 9.0
    r = mt.view_as_real(z)
    assert r.placements == (Shard(0),) and tuple(r.to_local().shape) == (1, 4, 2)
