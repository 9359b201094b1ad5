"""The sharding rules of products, reductions, layers and losses at 1-4 ranks: every case is
run on DTensors and on the full tensors, and the forward values and every operand's gradient
must agree (float64; sums of a few terms, rtol 1e-10).

Each case names its operands' placements for one mesh dim; on the 2x2 mesh (4 ranks) it runs
with the placements on one of the two mesh dims (the other replicated), the cases taking the
two dims in turn, and the 2-D cases place both dims. Every rank checks its own pieces of the
output and of each gradient against the same slices of the full computation (no gather, so
the layout is checked too, and only the op's own traffic is timed).

Empty pieces: a dim of length 2 sharded over 3 or 4 ranks leaves a rank with nothing; the
``EMPTY`` cases run one op of every rule family that way (a rank with an empty piece must
still take part in every collective of forward and backward, or the others hang).
"""

from __future__ import annotations

import contextlib
import functools
import itertools

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn.functional as F
from mpitensor.autograd import no_grad
from mpitensor.distributed.tensor import DTensor, Partial, Replicate, Shard, init_device_mesh
from mpitensor.distributed.tensor._dispatch import ShardingError
from mpitensor.distributed.tensor._utils import compute_local_shape_and_global_offset
from mpitensor.distributed.tensor.parallel import loss_parallel

RTOL = 1e-10
S0, S1, S2, R, P = Shard(0), Shard(1), Shard(2), Replicate(), Partial()


@functools.cache
def meshes():
    """The module's meshes, built once: the 1-D one, and 2x2 at 4 ranks."""
    n = dist.get_world_size()
    out = [init_device_mesh("cpu", (n,))]
    if n == 4:
        out.append(init_device_mesh("cpu", (2, 2)))
    return tuple(out)


def mesh1():
    return meshes()[0]


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def local_of(arr, mesh, placements):
    """This rank's piece of ``arr`` laid out as ``placements`` (Partial: the whole)."""
    arr = np.asarray(arr)
    plain = [R if isinstance(p, Partial) else p for p in placements]
    shape, off = compute_local_shape_and_global_offset(arr.shape, mesh, plain)
    return np.asarray(arr[tuple(slice(o, o + s) for o, s in zip(off, shape))])


def place(arr, mesh, placements, grad=True):
    """A DTensor equal to ``arr`` (Partial: rank-dependent terms summing to it), built from
    each rank's slice (no communication)."""
    local = local_of(arr, mesh, placements).copy()
    coord = mesh.get_coordinate()
    for m, p in enumerate(placements):
        if isinstance(p, Partial):
            k = mesh.size(m)
            local = local * (2.0 * (coord[m] + 1) / (k * (k + 1)))
    leaf = DTensor.from_local(mt.tensor(local), mesh, placements, shape=np.shape(arr))
    return leaf.requires_grad_() if grad else leaf


_TURN = itertools.count()


def layouts(mesh, placements):
    """The placements of every operand on this mesh: on a 2-D mesh, on one mesh dim (the
    calls take the two in turn; every rank makes the same calls in the same order)."""
    if mesh.ndim == 1:
        return [[[p] for p in placements]]
    if next(_TURN) % 2:
        return [[[R, p] for p in placements]]
    return [[[p, R] for p in placements]]


def compare(fn, arrays, placements, ints=(), rtol=RTOL, seed=99, ctx=None, frozen=()):
    """Run ``fn`` on DTensors and on plain tensors and compare values and gradients."""
    explicit = isinstance(placements[0], list)
    for mesh in meshes():
        if explicit and mesh.ndim != len(placements[0]):
            continue
        for layout in [placements] if explicit else layouts(mesh, placements):
            run_one(fn, arrays, layout, mesh, ints, rtol, seed, ctx, frozen)


def check_value(out, ref, rtol):
    """``out``'s piece on this rank is ``ref``'s (a Partial output is reduced first)."""
    assert tuple(out.shape) == tuple(ref.shape)
    want = ref.detach().numpy()
    if any(isinstance(p, Partial) for p in out.placements):
        with no_grad():
            got = out.full_tensor().numpy()
    else:
        got = out.to_local().detach().numpy()
        want = local_of(want, out.device_mesh, out.placements)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-12)


def backward_both(out, ref, seed):
    """Backward from ``out`` and ``ref`` with the same random output gradient."""
    g = np.asarray(rand(tuple(ref.shape), seed))  # float64 even when 0-d
    lay = tuple(R if isinstance(p, Partial) else p for p in out.placements)
    gd = DTensor.from_local(mt.tensor(local_of(g, out.device_mesh, lay).copy()),
                            out.device_mesh, lay, shape=g.shape)
    out.backward(gd)
    ref.backward(mt.tensor(g))


def run_one(fn, arrays, layout, mesh, ints, rtol, seed, ctx, frozen):
    grads = [a.dtype.kind == "f" and i not in frozen for i, a in enumerate(arrays)]
    ds = [place(a, mesh, p, grad=g) for a, p, g in zip(arrays, layout, grads)]
    refs = [mt.tensor(a, requires_grad=g) for a, g in zip(arrays, grads)]
    with (ctx() if ctx else contextlib.nullcontext()):
        out = fn(*ds, *ints)
        ref = fn(*refs, *ints)
        out = out[0] if isinstance(out, tuple) else out
        ref = ref[0] if isinstance(ref, tuple) else ref
        check_value(out, ref, rtol)
        if not ref.is_floating_point() or not ref.requires_grad:
            return
        backward_both(out, ref, seed)
    for d, r in zip(ds, refs):
        if r.requires_grad:
            grad = d.grad
            want = tuple(R if isinstance(p, Partial) else p for p in d.placements)
            assert grad.placements == want  # a Partial's gradient is the whole one
            np.testing.assert_allclose(grad.to_local().numpy(),
                                       local_of(r.grad.numpy(), mesh, want), rtol=rtol,
                                       atol=1e-12)


# ------------------------------------------------------------------ products
LINEAR = [((R, S0, S0), (1,)), ((S1, S1, R), ()), ((S0, R, R), ()), ((S1, S0, S0), (1,)),
          ((P, R, R), ()), ((R, R, P), ()), ((S0, S1, R), ()), ((S1, R, S0), (1,))]


@pytest.mark.parametrize("case", range(len(LINEAR)))
def test_linear(case):
    pl, _ = LINEAR[case]
    compare(F.linear, [rand((5, 6), 1), rand((7, 6), 2), rand(7, 3)], list(pl))


def test_linear_placements_as_torch():
    mesh = mesh1()
    x, w = place(rand((4, 6), 1), mesh, [R]), place(rand((5, 6), 2), mesh, [S0])
    assert F.linear(x, w).placements == (Shard(1),)
    x, w = place(rand((4, 6), 1), mesh, [S1]), place(rand((5, 6), 2), mesh, [S1])
    assert F.linear(x, w).placements == (Partial(),)
    x, w = place(rand((4, 6), 1), mesh, [S0]), place(rand((5, 6), 2), mesh, [R])
    assert F.linear(x, w).placements == (Shard(0),)


MATMUL = [((4, 5), (5, 3), (S0, R)), ((4, 5), (5, 3), (R, S1)), ((4, 5), (5, 3), (S1, S0)),
          ((4, 5), (5, 3), (S1, R)), ((2, 4, 5), (5, 3), (S0, R)),
          ((2, 4, 5), (5, 3), (S2, S0)), ((3, 4, 5), (3, 5, 2), (S0, S0)),
          ((3, 4, 5), (1, 5, 2), (S0, R)), ((5,), (5, 3), (S0, S0)), ((4, 5), (5,), (S1, R)),
          ((4, 5), (5, 3), (P, R))]


@pytest.mark.parametrize("case", range(len(MATMUL)))
def test_matmul(case):
    sa, sb, pl = MATMUL[case]
    compare(lambda a, b: a @ b, [rand(sa, 3), rand(sb, 4)], list(pl))


def test_mm_bmm_addmm():
    compare(mt.mm, [rand((4, 5), 1), rand((5, 3), 2)], [S1, S0])
    compare(mt.bmm, [rand((3, 4, 5), 1), rand((3, 5, 2), 2)], [S0, S0])
    compare(lambda b, x, y: mt.addmm(b, x, y, beta=0.5, alpha=2.0),
            [rand(3, 0), rand((4, 5), 1), rand((5, 3), 2)], [R, S1, S0])
    compare(mt.addmm, [rand((4, 3), 0), rand((4, 5), 1), rand((5, 3), 2)], [S0, S0, R])


# ------------------------------------------------------------------ reductions
REDUCE = [("sum", (), {}), ("sum", (1,), {}), ("sum", ((0, 1),), {"keepdim": True}),
          ("mean", (), {}), ("mean", (0,), {"keepdim": True}), ("mean", (1,), {}),
          ("amax", (1,), {}), ("amin", (0,), {}), ("max", (), {}), ("max", (1,), {}),
          ("min", (0,), {"keepdim": True}), ("prod", (1,), {})]


@pytest.mark.parametrize("pl", [S0, S1, R, P], ids=str)
def test_reductions(pl):
    for name, args, kw in REDUCE:
        here = R if isinstance(pl, Partial) and name not in ("sum", "mean") else pl
        compare(lambda t, f=name, a=args, k=kw: getattr(t, f)(*a, **k), [rand((5, 3), 5)],
                [here])


@pytest.mark.parametrize("pl", [S0, S1], ids=str)
def test_argmax_names_global_positions(pl):
    arr = rand((5, 7), 6)
    for mesh in meshes():
        d = place(arr, mesh, [pl] + [R] * (mesh.ndim - 1), grad=False)
        np.testing.assert_array_equal(d.argmax(1).full_tensor().numpy(), arr.argmax(1))
        np.testing.assert_array_equal(d.argmin(0).full_tensor().numpy(), arr.argmin(0))


def test_sum_over_a_sharded_dim_is_partial():
    mesh = mesh1()
    d = place(rand((5, 3), 1), mesh, [S0])
    assert d.sum(0).placements == (Partial(),) and d.sum(1).placements == (Shard(0),)
    assert d.amax(0).placements == (Replicate(),)


# ------------------------------------------------------------------ layers
@pytest.mark.parametrize("pl", [S0, S1, S2, R, P], ids=str)
def test_softmax_and_log_softmax(pl):
    arr = rand((3, 4, 5), 7)
    compare(lambda t: F.softmax(t, -1), [arr], [pl])
    compare(lambda t: t.log_softmax(1), [arr], [pl])


@pytest.mark.parametrize("pl", [S0, S1, S2, R], ids=str)
def test_layer_norm(pl):
    compare(lambda x, w, b: F.layer_norm(x, (5,), w, b),
            [rand((4, 4, 5), 1), rand(5, 2), rand(5, 3)], [pl, R, R])


@pytest.mark.parametrize("pl", [S0, S1, R], ids=str)
def test_embedding(pl):
    idx = np.random.default_rng(4).integers(0, 9, (3, 4))
    for pad in (None, 2):
        compare(lambda w, pad=pad: F.embedding(mt.tensor(idx), w, pad), [rand((9, 4), 1)], [pl])
    compare(lambda i, w: F.embedding(i, w), [idx, rand((9, 4), 1)], [S0, pl])


@pytest.mark.parametrize("dims", [(0,), (1,)])
def test_cat_and_stack(dims):
    for pl in (S0, S1, R, P):
        compare(lambda a, b: mt.cat([a, b * 2], dims[0]), [rand((4, 3), 1), rand((4, 3), 2)],
                [pl, pl])
        compare(lambda a, b: mt.stack([a, b], dims[0]), [rand((4, 3), 1), rand((4, 3), 2)],
                [pl, pl])
    compare(lambda a, b: mt.cat([a, b], 1), [rand((4, 3), 1), rand((4, 3), 2)], [S0, S1])


def test_dropout():
    mesh = mesh1()
    d = place(rand((6, 4), 1), mesh, [S0])
    np.testing.assert_array_equal(F.dropout(d, 0.5, training=False).full_tensor().detach()
                                  .numpy(), rand((6, 4), 1))
    y = F.dropout(d, 0.5).to_local().detach().numpy()
    kept = y != 0
    np.testing.assert_allclose(y[kept], 2 * d.to_local().detach().numpy()[kept], rtol=1e-15)
    r = place(rand((6, 4), 1), mesh, [R])
    with pytest.raises(ShardingError, match="every mesh dim to shard"):
        F.dropout(r, 0.5)


# ------------------------------------------------------------------ losses
def _targets(n, c, seed):
    t = np.random.default_rng(seed).integers(0, c, n)
    t[1] = -100
    return t


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("pl", [S0, S1, R], ids=str)
def test_cross_entropy(reduction, pl):
    x, t = rand((6, 7), 1), _targets(6, 7, 2)
    for smooth in (0.0, 0.2):
        def ce(a, b, s=smooth):
            return F.cross_entropy(a, b, reduction=reduction, label_smoothing=s)
        compare(lambda a: ce(a, mt.tensor(t)), [x], [pl])
        compare(ce, [x, t], [pl, S0 if pl == S0 else R])
    w = np.abs(rand(7, 3)) + 0.5
    compare(lambda a, ww: F.cross_entropy(a, mt.tensor(t), weight=ww, reduction=reduction),
            [x, w], [pl, R], frozen=(1,))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_in_loss_parallel(reduction):
    x, t = rand((6, 7), 1), _targets(6, 7, 2)
    for smooth in (0.0, 0.3):
        compare(lambda a, s=smooth: F.cross_entropy(a, mt.tensor(t), reduction=reduction,
                                                    label_smoothing=s),
                [x], [S1], ctx=loss_parallel)
    compare(lambda a: F.cross_entropy(a, mt.tensor(t[:, None].repeat(3, 1) % 7),
                                      reduction=reduction),
            [rand((6, 7, 3), 5)], [S1], ctx=loss_parallel)


@pytest.mark.mpi(min_size=4)
def test_class_and_batch_sharded_logits_on_a_2d_mesh():
    x, t = rand((6, 7), 1), _targets(6, 7, 2)
    mesh = meshes()[1]
    d = place(x, mesh, [S0, S1])
    with loss_parallel():
        loss = F.cross_entropy(d, mt.tensor(t))
        assert loss.placements == (Partial(), Replicate())
        loss.backward()
    ref = mt.tensor(x, requires_grad=True)
    F.cross_entropy(ref, mt.tensor(t)).backward()
    np.testing.assert_allclose(loss.full_tensor().detach().numpy(),
                               F.cross_entropy(mt.tensor(x), mt.tensor(t)).numpy(), rtol=RTOL)
    np.testing.assert_allclose(d.grad.full_tensor().numpy(), ref.grad.numpy(), rtol=RTOL,
                               atol=1e-12)


@pytest.mark.mpi(min_size=4)
def test_two_dim_linear():
    compare(F.linear, [rand((4, 6), 1), rand((5, 6), 2), rand(5, 3)],
            [[S0, R], [R, S0], [R, S0]])
    compare(F.linear, [rand((4, 6), 1), rand((5, 6), 2), rand(5, 3)],
            [[S0, S1], [R, S1], [R, R]])


# ------------------------------------------------------------------ empty pieces
def _lookup(w):
    return F.embedding(mt.tensor(np.array([[0, 1, 1], [1, 0, 0]])), w)


def _ce(x):
    return F.cross_entropy(x, mt.tensor(np.array([1, 0, 1])))


# One op of every rule family with a dim of length 2 sharded: pieces (1, 1, 0) at 3 ranks,
# (1, 1, 0, 0) at 4; on the 2x2 mesh the 2-D layouts nest two shards of a dim of 3 (2 | 1,
# then 1 | 1 and 1 | 0).
EMPTY = {
    "pointwise": (lambda x, b: (x * b + b).exp(), [rand((2, 3), 1), rand(3, 2)], [S0, R]),
    "pointwise-partial": (lambda x, y: x - y, [rand((2, 3), 1), rand((2, 3), 2)], [S0, P]),
    "sum": (lambda x: x.sum(0), [rand((2, 3), 1)], [S0]),
    "mean": (lambda x: x.mean(), [rand((3, 2), 1)], [S1]),
    "amax": (lambda x: x.amax(0), [rand((2, 3), 1)], [S0]),
    "max-dim": (lambda x: x.max(1), [rand((2, 3), 1)], [S0]),
    "prod": (lambda x: x.prod(1), [rand((2, 3), 1)], [S0]),
    "linear-batch": (F.linear, [rand((2, 4), 1), rand((3, 4), 2), rand(3, 3)], [S0, R, R]),
    "linear-inner": (F.linear, [rand((3, 2), 1), rand((4, 2), 2), rand(4, 3)], [S1, S1, R]),
    "linear-out": (F.linear, [rand((3, 4), 1), rand((2, 4), 2), rand(2, 3)], [R, S0, S0]),
    "matmul": (lambda a, b: a @ b, [rand((2, 3, 4), 1), rand((4, 5), 2)], [S0, R]),
    "softmax": (lambda x: F.softmax(x, -1), [rand((2, 3), 1)], [S0]),
    "log_softmax-gathered": (lambda x: x.log_softmax(0), [rand((2, 3), 1)], [S0]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b),
                   [rand((2, 3, 4), 1), rand(4, 2), rand(4, 3)], [S0, R, R]),
    "layer_norm-S1": (lambda x, w: F.layer_norm(x, (4,), w),
                      [rand((3, 2, 4), 1), rand(4, 2)], [S1, R]),
    "embedding-vocab": (_lookup, [rand((2, 4), 1)], [S0]),
    "embedding-dim": (_lookup, [rand((2, 2), 1)], [S1]),
    "embedding-batch": (lambda i, w: F.embedding(i, w), [np.array([[0, 1], [1, 1]]),
                                                          rand((2, 3), 1)], [S0, R]),
    "cross_entropy-batch": (lambda x, t: F.cross_entropy(x, t),
                            [rand((2, 5), 1), np.array([4, 0])], [S0, S0]),
    "cross_entropy-classes": (_ce, [rand((3, 2), 1)], [S1]),
    "views": (lambda x: x.reshape(len(x), -1).t().unsqueeze(0).flatten(0, 1).transpose(0, 1)
              .reshape(-1), [rand((2, 3, 4), 1)], [S0]),
    "cat": (lambda a, b: mt.cat([a, b], 1), [rand((2, 3), 1), rand((2, 1), 2)], [S0, S0]),
}


@pytest.mark.parametrize("name", list(EMPTY))
def test_empty_pieces_take_part_in_every_collective(name):
    fn, arrays, pl = EMPTY[name]
    compare(fn, arrays, pl)
    if name == "cross_entropy-classes":
        compare(fn, arrays, pl, ctx=loss_parallel)


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("name", ["pointwise", "linear-batch", "layer_norm", "softmax",
                                  "embedding-batch", "cross_entropy-batch", "views"])
def test_empty_pieces_of_nested_shards(name):
    fn, arrays, pl = EMPTY[name]
    grow = [np.concatenate([a, a[:1]]) for a in arrays]  # dim 0 of length 3
    compare(fn, [g if p == S0 else a for g, a, p in zip(grow, arrays, pl)],
            [[p, p] if p == S0 else [R, R] for p in pl])


# ------------------------------------------------------------------ parallelize_module
def test_parallelize_module_matches_the_plain_model():
    from mpitensor import nn
    from mpitensor.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    mesh = mesh1()
    mt.manual_seed(0)
    model = nn.Sequential(nn.Embedding(9, 6), nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6))
    ref = nn.Sequential(nn.Embedding(9, 6), nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 6))
    model.double(), ref.double()
    ref.load_state_dict(model.state_dict())
    parallelize_module(model, mesh, {"0": RowwiseParallel(input_layouts=Replicate()),
                                     "1": ColwiseParallel(),
                                     "3": RowwiseParallel()})
    assert model[1].weight.placements == (Shard(0),)
    assert model[3].weight.placements == (Shard(1),)
    assert model[0].weight.placements == (Shard(0),)
    idx = mt.tensor(np.random.default_rng(1).integers(0, 9, (3, 4)))
    y, r = model(idx), ref(idx)
    assert not isinstance(y, DTensor)
    np.testing.assert_allclose(y.detach().numpy(), r.detach().numpy(), rtol=RTOL, atol=1e-12)
    (y ** 2).sum().backward()
    (r ** 2).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.full_tensor().numpy(), q.grad.numpy(), rtol=RTOL,
                                   atol=1e-12)
    with pytest.raises(TypeError, match="ReLU"):
        parallelize_module(model, mesh, {"2": ColwiseParallel()})
    with pytest.raises(ValueError, match="nothing"):
        parallelize_module(model, mesh, {"nothing": ColwiseParallel()})
