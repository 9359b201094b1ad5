"""Shard(i) -> Shard(j) (one all_to_all) across 1-4 ranks, compared bit for bit with the
slices of the full tensor: every dtype class, uneven and empty pieces, non-contiguous local
pieces, 3-D tensors with every (i, j) pair, a swap on one dim of a 2-D mesh, gradients.

The full tensors are built from a seed on every rank; a piece is right when its bytes equal
those of the full tensor's slice that compute_local_shape_and_global_offset names.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor import dtypes
from mpitensor.distributed.tensor import DTensor, Partial, Replicate, Shard, init_device_mesh
from mpitensor.distributed.tensor._utils import compute_local_shape_and_global_offset

DTYPES = [np.float32, np.float64, np.int64, np.bool_, np.complex64, np.float16,
          dtypes.bfloat16]


def full(shape, dtype, seed=0):
    """Distinct values of ``dtype`` (every element its own, where the dtype has room)."""
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-2**40, 2**40, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def piece(arr, mesh, placements):
    shape, off = compute_local_shape_and_global_offset(arr.shape, mesh, placements)
    return arr[tuple(slice(o, o + s) for o, s in zip(off, shape))]


def same_bits(got, want, what):
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.shape, want.shape)
    assert got.tobytes() == want.tobytes(), what


def placed(arr, mesh, placements, strided=False):
    """A DTensor holding ``arr`` as ``placements`` (built from this rank's slice alone);
    ``strided``: the local tensor is a non-contiguous view (every other element of a wider
    array, transposed)."""
    local = piece(arr, mesh, placements)
    if strided:
        wide = np.zeros(local.shape[::-1] + (2,), local.dtype)
        view = wide[..., 0]
        view[...] = local.transpose()
        t = mt.from_numpy(view).permute(*reversed(range(local.ndim)))
        assert not t.is_contiguous() or local.size <= 1
        np.testing.assert_array_equal(t.numpy(), local)
    else:
        t = mt.from_numpy(np.ascontiguousarray(local))
    return DTensor.from_local(t, mesh, placements, shape=arr.shape)


def swap_and_check(arr, mesh, src, dst, strided=False):
    x = placed(arr, mesh, src, strided)
    y = x.redistribute(mesh, dst)
    assert y.placements == tuple(dst)
    what = f"{arr.dtype} {arr.shape} {src} -> {dst} on {mesh.shape}"
    same_bits(y.to_local().numpy(), piece(arr, mesh, dst), what)
    return y


def test_swap_preserves_every_dtype_bit_exactly():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for dtype in DTYPES:
        arr = full((5, 7, 3), dtype)
        for i, j in itertools.permutations(range(3), 2):
            swap_and_check(arr, mesh, [Shard(i)], [Shard(j)])


@pytest.mark.parametrize("shape", [(5, 7, 3), (4, 8, 12), (2, 3, 1), (1, 6, 5), (7, 1, 2),
                                   (3, 0, 2)])
def test_every_pair_of_dims_uneven_and_empty_pieces(shape):
    # lengths below the world size leave some ranks empty pieces (torch.chunk's split)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    arr = full(shape, np.float64, seed=1)
    for i, j in itertools.permutations(range(3), 2):
        y = swap_and_check(arr, mesh, [Shard(i)], [Shard(j)])
        np.testing.assert_array_equal(y.full_tensor().numpy(), arr)


def test_two_dimensional_tensors_both_ways():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for shape in ((9, 10), (3, 2), (16, 5)):
        arr = full(shape, np.float32, seed=2)
        for i, j in ((0, 1), (1, 0)):
            swap_and_check(arr, mesh, [Shard(i)], [Shard(j)])


def test_non_contiguous_local_pieces():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for dtype in (np.float32, np.int64, dtypes.bfloat16):
        arr = full((6, 5, 4), dtype, seed=3)
        for i, j in itertools.permutations(range(3), 2):
            swap_and_check(arr, mesh, [Shard(i)], [Shard(j)], strided=True)


def test_swap_on_one_dim_of_a_two_dimensional_mesh():
    n = dist.get_world_size()
    shapes = [(a, n // a) for a in range(1, n + 1) if n % a == 0]
    arr = full((6, 5, 7), np.float64, seed=4)
    for shape in shapes:
        mesh = init_device_mesh("cpu", shape)
        for a, b, c in itertools.permutations(range(3)):
            # mesh dim 0 shards dim a and stays; mesh dim 1 moves from b to c
            swap_and_check(arr, mesh, [Shard(a), Shard(b)], [Shard(a), Shard(c)])
            swap_and_check(arr, mesh, [Shard(b), Replicate()], [Shard(c), Replicate()])


def test_swapped_pieces_compute_and_swap_back():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    arr = full((5, 6, 7), np.float64, seed=5)
    for i, j in itertools.permutations(range(3), 2):
        y = swap_and_check(arr, mesh, [Shard(i)], [Shard(j)])
        z = (y * 2 + 1).redistribute(mesh, [Shard(i)])
        same_bits(z.to_local().numpy(), piece(arr * 2 + 1, mesh, [Shard(i)]), (i, j))


def test_gradient_of_a_swap_is_the_swap_back():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    arr = full((5, 4, 6), np.float64, seed=6)
    g = full((5, 4, 6), np.float64, seed=7)
    for i, j in itertools.permutations(range(3), 2):
        leaf = mt.tensor(piece(arr, mesh, [Shard(i)]), requires_grad=True)
        x = DTensor.from_local(leaf, mesh, [Shard(i)], shape=arr.shape)
        y = x.redistribute(mesh, [Shard(j)])
        (y.to_local() * mt.tensor(piece(g, mesh, [Shard(j)]))).sum().backward()
        same_bits(leaf.grad.numpy(), piece(g, mesh, [Shard(i)]), (i, j))


# ------------------------------------------------------------------ gather and scatter, any dim
def test_gather_along_every_dim_every_dtype():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for dtype in DTYPES:
        for shape in ((5, 7, 3), (2, 4, 9)):
            arr = full(shape, dtype, seed=8)
            for d in range(3):
                for strided in (False, True):
                    x = placed(arr, mesh, [Shard(d)], strided)
                    y = x.redistribute(mesh, [Replicate()])
                    same_bits(y.to_local().numpy(), arr, (dtype, shape, d, strided))
                    assert y.to_local().numpy().flags.c_contiguous


def test_reduce_scatter_along_every_dim():
    # integer-valued terms: every order of summation gives the same bits
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,))
    for dtype in (np.float32, np.float64, np.int64, np.complex64):
        for shape in ((5, 7, 3), (4, 1, 8), (3, 2, 0)):
            term = np.arange(np.prod(shape), dtype=np.int64).reshape(shape) % 97 + me
            whole = sum(np.arange(np.prod(shape), dtype=np.int64).reshape(shape) % 97 + r
                        for r in range(n)).astype(dtype)
            for d in range(3):
                x = DTensor.from_local(mt.from_numpy(term.astype(dtype)), mesh, [Partial()],
                                       shape=shape)
                y = x.redistribute(mesh, [Shard(d)])
                same_bits(y.to_local().numpy(), piece(whole, mesh, [Shard(d)]),
                          (dtype, shape, d))


def test_the_cupy_paths_on_numpy_arrays():
    # CuPy pieces take the moved-front, padded paths; they are array-module generic, so run
    # them here on NumPy pieces against the NumPy paths
    from mpitensor.distributed.tensor import _redistribute as R
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,))
    for shape in ((5, 7, 3), (2, 4, 9), (3, 0, 2)):
        arr = full(shape, np.float64, seed=9)
        for d in range(3):
            mine = np.ascontiguousarray(piece(arr, mesh, [Shard(d)]))
            same_bits(R.front_all_gather(mine, d, shape[d], mesh, 0), arr, ("gather", d))
            for e in set(range(3)) - {d}:
                got = R.padded_all_to_all(mine, d, e, shape[d], mesh, 0)
                same_bits(got, piece(arr, mesh, [Shard(e)]), ("swap", d, e))
            term = np.floor(arr * 8) + me  # integer-valued: exact sums in any order
            whole = sum(np.floor(arr * 8) + r for r in range(n))
            same_bits(R.front_reduce_scatter(term, d, "sum", mesh, 0),
                      piece(whole, mesh, [Shard(d)]), ("scatter", d))
