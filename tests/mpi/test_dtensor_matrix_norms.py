"""Matrix norms of DTensors (issue 28), at 1-4 ranks.

Spec: ``linalg.matrix_norm`` for every ord torch takes ("fro", "nuc", 1, -1, 2, -2, inf,
-inf), ``linalg.norm`` with a matrix ord, ``Tensor.norm`` / ``mpitensor.norm`` with
``p="fro"``, ``"nuc"`` and ``p=2`` over two dims, on DTensors sharded on every dim (batch
and matrix dims, uneven pieces and empty ones at 3-4 ranks), replicated, ``Partial`` and on a
2-D mesh, give the whole tensor's value (float64, 1e-12 relative) and its gradient, as torch
computes them all on DTensors (checked with torch 2.13 over gloo); a Shard of a batch dim
stays a Shard of the output; bad arguments raise the plain op's ``ValueError`` on every rank.

Run: ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_dtensor_matrix_norms.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed.device_mesh import init_device_mesh
from mpitensor.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

pytestmark = pytest.mark.mpi(min_size=1)

# float64: sums of a few dozen terms and an SVD of a 5x3 matrix, in another order than the
# whole tensor's computation
TOL = 1e-12
ORDS = ["fro", "nuc", 1, -1, 2, -2, math.inf, -math.inf]
SHAPE = (3, 5, 3)  # 3 rows and 3 columns: uneven pieces at 2 ranks, empty ones at 4


def _whole(t):
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().numpy()


def _data(seed=7, shape=SHAPE):
    # distinct magnitudes: no ties among the sums of |x| that a max or min picks
    return np.random.default_rng(seed).standard_normal(shape) * np.linspace(1, 2, shape[-1])


def _check(fn, whole, mesh, placements, what):
    """``fn`` of the DTensor and of the whole tensor: values, then gradients of a weighted
    sum (the weights differ per output entry, so a misplaced gradient shows)."""
    ref = mt.from_numpy(whole.copy()).requires_grad_()
    d = distribute_tensor(mt.from_numpy(whole.copy()), mesh, placements).requires_grad_()
    out, want = fn(d), fn(ref)
    assert isinstance(out, DTensor), what
    assert tuple(out.shape) == tuple(want.shape), what
    np.testing.assert_allclose(_whole(out), want.detach().numpy(), rtol=TOL, atol=0,
                               err_msg=what)
    w = np.arange(1.0, want.numel() + 1).reshape(tuple(want.shape))
    (want * mt.from_numpy(w)).sum().backward()
    weights = distribute_tensor(mt.from_numpy(w), mesh, out.placements)
    (out * weights).sum().backward()
    np.testing.assert_allclose(_whole(d.grad), ref.grad.numpy(), rtol=TOL, atol=TOL,
                               err_msg=f"gradient of {what}")
    return out


def _mesh():
    return init_device_mesh("cpu", (dist.get_world_size(),))


@pytest.mark.parametrize("order", ORDS, ids=str)
def test_matrix_norm_every_ord_and_placement(order):
    mesh, whole = _mesh(), _data()
    for pl in (Shard(0), Shard(1), Shard(2), Replicate()):
        for keep in (False, True):
            out = _check(lambda t, k=keep: mt.linalg.matrix_norm(t, order, keepdim=k), whole,
                         mesh, [pl], f"matrix_norm(ord={order}, keepdim={keep}) of {pl}")
            if pl == Shard(0):  # each rank computes the norms of its own matrices
                assert out.placements == (Shard(0),)
        # the matrix dims named otherwise: (0, 2), the batch dim in the middle
        out = _check(lambda t: mt.linalg.matrix_norm(t, order, dim=(2, 0)), whole, mesh,
                     [pl], f"matrix_norm(ord={order}, dim=(2, 0)) of {pl}")
        if pl == Shard(1):
            assert out.placements == (Shard(0),)


@pytest.mark.parametrize("order", ORDS, ids=str)
def test_linalg_norm_with_a_matrix_ord(order):
    mesh = _mesh()
    flat = _data(8, SHAPE[1:])
    for pl in (Shard(0), Shard(1), Replicate()):
        _check(lambda t: mt.linalg.norm(t, order), flat, mesh, [pl],
               f"linalg.norm(2-D, ord={order}) of {pl}")
        _check(lambda t: mt.linalg.norm(t, order, dim=(1, 2)), _data(), mesh, [pl],
               f"linalg.norm(3-D, ord={order}, dim=(1, 2)) of {pl}")


def test_tensor_norm_fro_nuc_and_p2_over_two_dims():
    mesh, whole = _mesh(), _data(9)
    cases = {
        "norm(fro)": lambda t: t.norm(p="fro"),
        "torch.norm(fro, dim)": lambda t: mt.norm(t, p="fro", dim=(-2, -1)),
        "norm(nuc)": lambda t: t.norm(p="nuc"),
        "torch.norm(nuc, keepdim)": lambda t: mt.norm(t, p="nuc", keepdim=True),
        "norm(2, dim pair)": lambda t: t.norm(2, (-2, -1)),  # a vector 2-norm, as torch
    }
    for pl in (Shard(0), Shard(1), Shard(2), Replicate()):
        for name, fn in cases.items():
            _check(fn, whole, mesh, [pl], f"{name} of {pl}")


@pytest.mark.parametrize("order", ORDS, ids=str)
def test_partial_input_is_reduced_first(order):
    mesh, whole = _mesh(), _data(10)
    n = dist.get_world_size()
    part = DTensor.from_local(mt.from_numpy(whole / n), mesh, [Partial()])
    out = mt.linalg.matrix_norm(part, order)
    want = mt.linalg.matrix_norm(mt.from_numpy(whole / n * n), order)
    np.testing.assert_allclose(_whole(out), want.numpy(), rtol=TOL)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("order", ORDS, ids=str)
def test_matrix_norms_on_a_2d_mesh(order):
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2))
    whole = _data(11, (4, 6, 5))
    for pls in ([Shard(0), Shard(1)], [Shard(1), Shard(2)], [Shard(2), Shard(2)],
                [Replicate(), Shard(1)], [Shard(0), Shard(0)]):
        _check(lambda t: mt.linalg.matrix_norm(t, order), whole, mesh, pls,
               f"matrix_norm(ord={order}) of {pls}")


def test_bad_arguments_raise_the_plain_errors_on_every_rank():
    mesh = _mesh()
    d = distribute_tensor(mt.from_numpy(_data()), mesh, [Shard(1)])
    with pytest.raises(ValueError, match="ord must be"):
        mt.linalg.matrix_norm(d, "bad")
    with pytest.raises(ValueError, match="two different dimensions"):
        mt.linalg.matrix_norm(d, "fro", dim=(1, 1))
    with pytest.raises(ValueError, match="two different dimensions"):
        mt.linalg.matrix_norm(d, 1, dim=(0, 3))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        mt.linalg.matrix_norm(distribute_tensor(mt.ones(4).double(), mesh, [Shard(0)]))
    with pytest.raises(ValueError, match="p must be"):
        d.norm(p="bad")
    with pytest.raises(ValueError, match="1-D or 2-D"):  # as the plain op, and torch
        mt.linalg.norm(d, "fro")
