"""DTensor across 1-4 ranks: every redistribution and every op compared with the same
computation on the full tensor (built from a seed on every rank), with gradients.

The full tensors come from NumPy generators with fixed seeds, so every rank holds the same
values; a DTensor's pieces are checked against the slices compute_local_shape_and_global_offset
names, and its gradients against those of the same expression on plain tensors.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)
from mpitensor.distributed.tensor._dispatch import ShardingError
from mpitensor.distributed.tensor._utils import compute_local_shape_and_global_offset

RTOL = 1e-12  # float64 throughout: sums of a few terms


def meshes():
    """The meshes of this world: 1-D, and 2-D where the world has a factor pair."""
    n = dist.get_world_size()
    out = [init_device_mesh("cpu", (n,))]
    for a in range(2, n):
        if n % a == 0:
            out.append(init_device_mesh("cpu", (a, n // a)))
            break
    return out


def full(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def piece(arr, mesh, placements):
    """The slice of the full array this rank holds (Partial dims hold the whole)."""
    plain = [p if isinstance(p, Shard) else Replicate() for p in placements]
    shape, off = compute_local_shape_and_global_offset(arr.shape, mesh, plain)
    return arr[tuple(slice(o, o + s) for o, s in zip(off, shape))]


def terms(arr, mesh, placements):
    """This rank's local values of a DTensor equal to ``arr`` (Partial dims: uneven terms)."""
    local = piece(arr, mesh, placements).copy()
    coord = mesh.get_coordinate()
    for m, p in enumerate(placements):
        if isinstance(p, Partial):
            k, c = mesh.size(m), coord[m]
            if p.reduce_op == "sum":
                local = local * (2.0 * (c + 1) / (k * (k + 1)))
            elif p.reduce_op == "avg":
                local = local * (2.0 * (c + 1) / (k + 1))
            elif p.reduce_op == "max":
                local = local - c
    return local


def make(arr, mesh, placements, requires_grad=False):
    """A DTensor of ``arr`` placed as given, and its local leaf tensor."""
    leaf = mt.tensor(terms(arr, mesh, placements), requires_grad=requires_grad)
    return DTensor.from_local(leaf, mesh, placements, shape=arr.shape), leaf


def expected_grad(g, mesh, placements):
    """The local gradient of a DTensor laid out as ``placements`` when the full one is g."""
    out = piece(g, mesh, placements)
    for m, p in enumerate(placements):
        if isinstance(p, Partial) and p.reduce_op == "avg":
            out = out / mesh.size(m)
    return out


def check(dt, arr, rtol=RTOL):
    np.testing.assert_allclose(dt.full_tensor().detach().numpy(), arr, rtol=rtol, atol=1e-12)
    if not any(isinstance(p, Partial) for p in dt.placements):
        np.testing.assert_allclose(dt.to_local().detach().numpy(), piece(arr, dt.device_mesh,
                                                                dt.placements),
                                   rtol=rtol, atol=1e-12)
    assert tuple(dt.shape) == arr.shape


def options(ndim, with_partial=True):
    out = [Shard(d) for d in range(ndim)] + [Replicate()]
    if with_partial:
        out += [Partial("sum"), Partial("avg")]
    return out


# ------------------------------------------------------------------ distribute_tensor
@pytest.mark.parametrize("shape", [(5, 3), (4, 6), (1, 2)])
def test_distribute_tensor_matches_the_slices(shape):
    arr = full(shape, 1)
    for mesh in meshes():
        for pl in itertools.product(options(2, False), repeat=mesh.ndim):
            dt = distribute_tensor(mt.tensor(arr), mesh, list(pl))
            check(dt, arr)
            assert dt.to_local().numpy().flags.c_contiguous


def test_distribute_tensor_takes_the_source_ranks_values():
    n, me = dist.get_world_size(), dist.get_rank()
    arr = np.arange(12.0).reshape(6, 2)
    mine = arr + 100 * me  # only rank 0's values count
    mesh = init_device_mesh("cpu", (n,))
    for pl in ([Shard(0)], [Replicate()], [Shard(1)]):
        dt = distribute_tensor(mt.tensor(mine), mesh, pl)
        check(dt, arr)
    dt = distribute_tensor(mt.tensor(mine), mesh, [Replicate()], src_data_rank=n - 1)
    check(dt, arr + 100 * (n - 1))
    own = distribute_tensor(mt.tensor(mine), mesh, [Shard(0)], src_data_rank=None)
    np.testing.assert_array_equal(own.to_local().numpy(), piece(mine, mesh, [Shard(0)]))
    np.testing.assert_array_equal(mine, arr + 100 * me)  # the caller's tensor is untouched


def test_distribute_partial_splits_the_value():
    arr = full((3, 4), 2)
    for mesh in meshes():
        dt = distribute_tensor(mt.tensor(arr), mesh, [Partial()] * mesh.ndim)
        check(dt, arr)


# ------------------------------------------------------------------ redistribute
@pytest.mark.parametrize("shape", [(5, 3), (4, 4)])
def test_every_redistribution_forward_and_backward(shape):
    arr = full(shape, 3)
    g = full(shape, 4)
    for mesh in meshes():
        layouts = list(itertools.product(options(2, with_partial=True), repeat=mesh.ndim))
        pairs = list(itertools.product(layouts, repeat=2))
        if mesh.ndim > 1 and shape != (5, 3):
            continue  # the 2-D mesh: the uneven shape is the harder one
        if mesh.ndim > 1:  # 625 pairs: every layout from and to a few, and a stride of the rest
            few = {(Replicate(),) * 2, (Shard(0), Shard(1)), (Partial(), Shard(0))}
            pairs = [(a, b) for i, (a, b) in enumerate(pairs)
                     if a in few or b in few or i % 7 == 0]
        for src, dst in pairs:
            x, leaf = make(arr, mesh, list(src), requires_grad=True)
            y = x.redistribute(mesh, list(dst))
            assert y.placements == tuple(dst)
            check(y, arr)
            (y.full_tensor() * mt.tensor(g)).sum().backward()
            np.testing.assert_allclose(leaf.grad.numpy(), expected_grad(g, mesh, src),
                                       rtol=RTOL, atol=1e-12, err_msg=f"{src} -> {dst}")


def test_replicate_to_partial_terms_are_torchs():
    # torch's terms: sum divides the value by the mesh dim's size, avg and max keep it
    arr = full((3, 2), 27)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x = distribute_tensor(mt.tensor(arr), mesh, [Replicate()])
    k = mesh.size()
    for op, local in (("sum", arr / k), ("avg", arr), ("max", arr)):
        p = x.redistribute(mesh, [Partial(op)])
        np.testing.assert_allclose(p.to_local().numpy(), local, rtol=1e-15)
        check(p, arr)


def test_partial_max_and_min_reduce():
    arr = full((4, 3), 5)
    for mesh in meshes():
        x, _ = make(arr, mesh, [Partial("max")] * mesh.ndim)
        check(x.redistribute(mesh, [Replicate()] * mesh.ndim), arr)
        check(x.redistribute(mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1)), arr)


def test_shard_to_shard_is_one_all_to_all(monkeypatch):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    arr = full((5, 7), 6)
    x = distribute_tensor(mt.tensor(arr), mesh, [Shard(0)])
    calls = []
    for name in ("all_to_all_single", "all_gather_into_tensor", "all_reduce",
                 "reduce_scatter_tensor"):
        real = getattr(dist, name)
        monkeypatch.setattr(dist, name, lambda *a, _r=real, _n=name, **k: (calls.append(_n),
                                                                          _r(*a, **k))[1])
    one = dist.get_world_size() == 1  # a mesh of one rank: no collective at all, as torch
    y = x.redistribute(mesh, [Shard(1)])
    assert calls == ([] if one else ["all_to_all_single"])
    calls.clear()
    y.redistribute(mesh, [Replicate()])
    assert calls == ([] if one else ["all_gather_into_tensor"])
    calls.clear()
    p, _ = make(arr, mesh, [Partial()])
    p.redistribute(mesh, [Shard(1)])
    assert calls == ([] if one else ["reduce_scatter_tensor"])
    monkeypatch.undo()
    check(y, arr)


# ------------------------------------------------------------------ ops
def _binary_cases():
    S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
    # (a shape, a placement, b shape, b placement, op)
    return [((5, 3), S0, (3,), R, "add"), ((5, 3), S0, (5, 3), S0, "mul"),
            ((5, 3), S1, (5, 3), S0, "sub"), ((5, 3), P, (5, 3), R, "mul"),
            ((5, 3), P, (5, 3), P, "add"), ((5, 3), S0, (5, 1), R, "div"),
            ((5, 3), R, (5, 3), S1, "maximum"), ((4, 3), P, (3,), R, "div"),
            ((4, 3), S0, (4, 3), P, "add"), ((4, 3), P, (4, 3), R, "add")]


@pytest.mark.parametrize("case", range(len(_binary_cases())))
def test_binary_ops_with_broadcasting(case):
    sa, pa, sb, pb, op = _binary_cases()[case]
    a_full, b_full, g = full(sa, 7), full(sb, 8) + 3.0, None
    for mesh in meshes():
        pla = [pa] + [Replicate()] * (mesh.ndim - 1)
        plb = [pb] + [Replicate()] * (mesh.ndim - 1)
        a, la = make(a_full, mesh, pla, True)
        b, lb = make(b_full, mesh, plb, True)
        out = getattr(a, op)(b)
        ta = mt.tensor(a_full, requires_grad=True)
        tb = mt.tensor(b_full, requires_grad=True)
        ref = getattr(ta, op)(tb)
        check(out, ref.detach().numpy())
        g = full(tuple(ref.shape), 9)
        (out.full_tensor() * mt.tensor(g)).sum().backward()
        (ref * mt.tensor(g)).sum().backward()
        np.testing.assert_allclose(la.grad.numpy(), expected_grad(ta.grad.numpy(), mesh, pla),
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(lb.grad.numpy(), expected_grad(tb.grad.numpy(), mesh, plb),
                                   rtol=1e-10, atol=1e-12)


def test_partial_stays_partial_only_where_linear():
    arr = full((4, 3), 10)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    p, _ = make(arr, mesh, [Partial()])
    assert (p * 2).placements == (Partial(),) and (-p).placements == (Partial(),)
    assert (p + p).placements == (Partial(),) and (p / 3.0).placements == (Partial(),)
    for out, ref in (((p + 1), arr + 1), (p.relu(), np.maximum(arr, 0)),
                     (p.exp(), np.exp(arr)), (p * p, arr * arr)):
        assert out.placements == (Replicate(),)
        check(out, ref, rtol=1e-10)
    check(p * 2, arr * 2)


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "relu", "abs", "neg", "sqrt"])
def test_unary_ops_and_gradients(name):
    arr = full((5, 4), 11)
    if name == "sqrt":
        arr = np.abs(arr) + 0.5
    for mesh in meshes():
        for pl in itertools.product([Shard(0), Shard(1), Replicate()], repeat=mesh.ndim):
            x, leaf = make(arr, mesh, list(pl), True)
            y = getattr(x, name)()
            t = mt.tensor(arr, requires_grad=True)
            ref = getattr(t, name)()
            assert y.placements == tuple(pl)
            check(y, ref.detach().numpy(), rtol=1e-12)
            g = full(arr.shape, 12)
            (y.full_tensor() * mt.tensor(g)).sum().backward()
            (ref * mt.tensor(g)).sum().backward()
            np.testing.assert_allclose(leaf.grad.numpy(), piece(t.grad.numpy(), mesh, pl),
                                       rtol=1e-12, atol=1e-14)


def test_functional_forms():
    arr = full((5, 4), 13)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x, _ = make(arr, mesh, [Shard(1)])
    check(mt.nn.functional.gelu(x), mt.nn.functional.gelu(mt.tensor(arr)).numpy(), 1e-12)
    check(x.add(x, alpha=2), 3 * arr)
    check(x.where(x > 0, x * 0.5), np.where(arr > 0, arr, arr * 0.5))
    check(mt.nn.functional.silu(x), mt.nn.functional.silu(mt.tensor(arr)).numpy(), 1e-12)
    check(x.clamp(-0.5, 0.5), np.clip(arr, -0.5, 0.5))


def test_inplace_ops_keep_the_layout():
    arr, other = full((6, 3), 14), full((6, 3), 15)
    for mesh in meshes():
        pl = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
        x, _ = make(arr, mesh, pl)
        y, _ = make(other, mesh, pl)
        x.mul_(0.5).add_(y, alpha=2.0).addcdiv_(y, y.abs() + 1.0, value=0.1).lerp_(y, 0.25)
        ref = arr * 0.5 + 2 * other
        ref = ref + 0.1 * other / (np.abs(other) + 1)
        ref = ref + 0.25 * (other - ref)
        check(x, ref, rtol=1e-12)
        x.zero_()
        check(x, np.zeros_like(arr))


# ------------------------------------------------------------------ views
VIEWS = [("view", (15,), (5, 3)), ("reshape", (3, 5), (5, 3)), ("view", (2, 2, 3), (4, 3)),
         ("transpose", (0, 1), (5, 3)), ("permute", (2, 0, 1), (4, 3, 2)), ("t", (), (5, 3)),
         ("flatten", (), (4, 3, 2)), ("flatten", (1,), (4, 3, 2)),
         ("unflatten", (0, (2, 2)), (4, 3)), ("unsqueeze", (1,), (5, 3)),
         ("squeeze", (), (5, 1, 3)), ("reshape", (12,), (3, 4))]


@pytest.mark.parametrize("case", range(len(VIEWS)))
def test_views_forward_and_backward(case):
    name, args, shape = VIEWS[case]
    arr = full(shape, 16)
    for mesh in meshes():
        for pl in itertools.product(options(len(shape), with_partial=False) + [Partial()],
                                    repeat=mesh.ndim):
            x, leaf = make(arr, mesh, list(pl), True)
            try:
                y = getattr(x, name)(*args)
            except ShardingError as exc:  # a view that cannot keep the shard: must say so
                assert name == "view" and "cannot keep" in str(exc)
                continue
            t = mt.tensor(arr, requires_grad=True)
            ref = getattr(t, name)(*args)
            check(y, ref.detach().numpy())
            g = full(tuple(ref.shape), 17)
            (y.full_tensor() * mt.tensor(g)).sum().backward()
            (ref * mt.tensor(g)).sum().backward()
            np.testing.assert_allclose(leaf.grad.numpy(), expected_grad(t.grad.numpy(), mesh,
                                                                        pl), rtol=RTOL)


def test_even_shard_survives_flatten():
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    x = distribute_tensor(mt.tensor(full((2 * n, 3), 18)), mesh, [Shard(0)])
    assert x.view(6 * n).placements == (Shard(0),)  # merged: the shard is the outer part
    assert x.view(n, 2, 3).placements == ((Shard(0),) if n > 1 else (Shard(1),))  # split
    assert x.transpose(0, 1).placements == (Shard(1),)
    check(x.view(n, 2, 3), full((2 * n, 3), 18).reshape(n, 2, 3))


# ------------------------------------------------------------------ parameters
@pytest.mark.parametrize("opt", ["SGD", "Adam", "AdamW"])
def test_optimizers_step_on_dtensor_parameters(opt):
    w_full = full((6, 4), 19)
    x_full = full((6, 4), 20)
    for mesh in meshes():
        pl = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
        p = mt.nn.Parameter(distribute_tensor(mt.tensor(w_full), mesh, pl))
        x = distribute_tensor(mt.tensor(x_full), mesh, pl)
        ref = mt.nn.Parameter(mt.tensor(w_full))
        kw = {"lr": 0.1, "momentum": 0.9} if opt == "SGD" else {"lr": 0.01}
        o, o_ref = getattr(mt.optim, opt)([p], **kw), getattr(mt.optim, opt)([ref], **kw)
        for _ in range(3):
            o.zero_grad()
            o_ref.zero_grad()
            ((p * x).tanh().full_tensor() ** 2).sum().backward()
            ((ref * mt.tensor(x_full)).tanh() ** 2).sum().backward()
            assert isinstance(p.grad, DTensor) and p.grad.placements == tuple(pl)
            o.step()
            o_ref.step()
        check(p.detach(), ref.detach().numpy(), rtol=1e-10)


def test_replicated_parameter_gradient_is_summed_over_shards():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x_full, b_full = full((5, 3), 21), full((3,), 22)
    b = mt.nn.Parameter(distribute_tensor(mt.tensor(b_full), mesh, [Replicate()]))
    x = distribute_tensor(mt.tensor(x_full), mesh, [Shard(0)])
    ((x + b) ** 2).full_tensor().sum().backward()
    assert b.grad.placements == (Replicate(),)
    np.testing.assert_allclose(b.grad.to_local().numpy(),
                               (2 * (x_full + b_full)).sum(0), rtol=1e-12)


def test_distribute_module():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    class Scale(mt.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = mt.nn.Parameter(mt.tensor(full((4, 3), 23)))
            self.b = mt.nn.Parameter(mt.tensor(full((3,), 24)))

        def forward(self, x):
            return x * self.w + self.b

    def partition(name, module, m):
        if name == "":
            module.register_parameter("w", mt.nn.Parameter(
                distribute_tensor(module.w.data, m, [Shard(0)])))

    m = mt.distributed.tensor.distribute_module(
        Scale(), mesh, partition,
        input_fn=lambda mod, inputs, m: tuple(distribute_tensor(i, m, [Shard(0)])
                                              for i in inputs),
        output_fn=lambda mod, out, m: out.full_tensor())
    assert m.w.placements == (Shard(0),) and m.b.placements == (Replicate(),)
    x = full((4, 3), 25)
    out = m(mt.tensor(x))
    want = x * full((4, 3), 23) + full((3,), 24)
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-12)


# ------------------------------------------------------------------ factories
def test_factories():
    for mesh in meshes():
        pl = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
        z = mt.distributed.tensor.zeros(5, 3, device_mesh=mesh, placements=pl)
        check(z, np.zeros((5, 3)))
        check(mt.distributed.tensor.full((5, 3), 2.5, device_mesh=mesh, placements=pl),
              np.full((5, 3), 2.5))
        check(mt.distributed.tensor.ones((2, 7), device_mesh=mesh), np.ones((2, 7)))
        mt.manual_seed(7)
        r = mt.distributed.tensor.randn(5, 3, device_mesh=mesh, placements=pl)
        mt.manual_seed(7)
        check(r, mt.randn(5, 3).numpy())


# ------------------------------------------------------------------ bad input
def test_bad_placements_fail_before_any_traffic():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    t = mt.ones(4, 3)
    with pytest.raises(ValueError, match="2 placements"):
        distribute_tensor(t, mesh, [Shard(0), Shard(1)])
    with pytest.raises(ValueError, match=r"Shard\(dim=2\) is beyond"):
        distribute_tensor(t, mesh, [Shard(2)])
    d = distribute_tensor(t, mesh, [Shard(0)])
    with pytest.raises(ValueError, match=r"Shard\(dim=5\)"):
        d.redistribute(mesh, [Shard(5)])
    with pytest.raises(TypeError, match="plain Tensor"):
        d + t
    with pytest.raises(ShardingError, match=r"\.sort on a DTensor.*Shard\(dim=0\)"):
        d.sort(dim=0)  # an op no rule covers


@pytest.mark.mpi(min_size=2)
def test_mismatched_arguments_fail_on_every_rank():
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,))
    with pytest.raises(ValueError, match="distribute_tensor"):
        distribute_tensor(mt.ones(4, 3 if me else 2), mesh, [Shard(0)])
    with pytest.raises(ValueError, match="distribute_tensor"):
        distribute_tensor(mt.ones(4, 3), mesh, [Shard(0) if me else Shard(1)])
    local = mt.ones(2 if me == 0 else 1, 3)  # rank 0's piece is too long for shape (n, 3)
    with pytest.raises(ValueError, match="run_check"):
        DTensor.from_local(local, mesh, [Shard(0)], run_check=True, shape=(n, 3))
    # the world is still in step
    t = mt.ones(1)
    dist.all_reduce(t)
    assert t.item() == n


def test_from_local_run_check_broadcasts_replicas():
    n, me = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (n,))
    d = DTensor.from_local(mt.full((2,), float(me)), mesh, [Replicate()], run_check=True)
    np.testing.assert_array_equal(d.to_local().numpy(), [0.0, 0.0])
    s = DTensor.from_local(mt.full((2, 2), float(me)), mesh, [Shard(0)], run_check=True)
    assert s.shape == (2 * n, 2)


@pytest.mark.mpi(min_size=4)
def test_dtensors_on_a_sub_mesh():
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"]
    arr = full((5, 3), 26) + mesh.get_local_rank("dp")  # each tp group its own tensor
    x = distribute_tensor(mt.tensor(arr), tp, [Shard(0)])
    check(x, arr)
    check(x.redistribute(tp, [Shard(1)]), arr)
    y = DTensor.from_local(x.to_local(), tp, [Shard(0)], run_check=True, shape=(5, 3))
    check((y * 2).redistribute(tp, [Replicate()]), 2 * arr)
