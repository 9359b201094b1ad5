"""The tensor-parallel styles that lay out activations (SequenceParallel, PrepareModuleInput,
PrepareModuleOutput) and tensor parallelism under DDP, at 1-4 ranks.

Spec: each case runs a module on this rank's pieces, laid out by a style, and the same
computation on the full tensors (the same values on every rank, from NumPy seeds); the values
(gathered where the style leaves them sharded) and the gradient of every input piece and
parameter must agree. Float64 throughout, sums of a few terms: rtol 1e-10.

The 1-D meshes are the world's and, at 4 ranks, the "tp" line of a 2x2 mesh (so the styles
also run on a sub-mesh whose ranks are not the world's). ``DistributedDataParallel(model,
device_mesh=mesh["dp"])`` over a tensor-parallel model trains as the plain model on the whole
batch, on every (dp, tp) layout of the world.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor import nn
from mpitensor.distributed.tensor import DTensor, Partial, Replicate, Shard, init_device_mesh
from mpitensor.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from mpitensor.nn.parallel import DistributedDataParallel as DDP

RTOL, ATOL = 1e-10, 1e-12
SEQ = 12  # divisible by every world size 1-4


def tp_meshes():
    n = dist.get_world_size()
    out = [init_device_mesh("cpu", (n,))]
    if n == 4:
        out.append(init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"])
    return out


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def rows(arr, mesh, dim):
    """This rank's even piece of ``arr`` along ``dim`` on the 1-D ``mesh``."""
    k, r = mesh.size(), mesh.get_local_rank()
    n = arr.shape[dim] // k
    return np.take(arr, range(r * n, (r + 1) * n), axis=dim)


def close(got, want):
    got = got.full_tensor() if isinstance(got, DTensor) else got
    np.testing.assert_allclose(got.detach().numpy(), np.asarray(want), rtol=RTOL, atol=ATOL)


def leaf(arr):
    return mt.tensor(np.ascontiguousarray(arr), requires_grad=True)


# ------------------------------------------------------------------ SequenceParallel
@pytest.mark.parametrize("local_out", [False, True])
def test_sequence_parallel_layer_norm(local_out):
    x, g = rand((3, SEQ, 5), 1), rand((3, SEQ, 5), 2)
    for mesh in tp_meshes():
        mt.manual_seed(0)
        ref = nn.LayerNorm(5).double()
        with mt.no_grad():
            ref.weight.copy_(mt.tensor(rand(5, 3)))
            ref.bias.copy_(mt.tensor(rand(5, 4)))
        norm = nn.LayerNorm(5).double()
        norm.load_state_dict(ref.state_dict())
        parallelize_module(norm, mesh, SequenceParallel(use_local_output=local_out))
        assert norm.weight.placements == (Replicate(),)
        xs, xf = leaf(rows(x, mesh, 1)), leaf(x)
        out, want = norm(xs), ref(xf)
        assert isinstance(out, DTensor) != local_out
        if local_out:
            close(out, rows(want.detach().numpy(), mesh, 1))
            (out * mt.tensor(rows(g, mesh, 1))).sum().backward()
        else:
            assert out.placements == (Shard(1),)
            close(out, want.detach().numpy())
            (out.full_tensor() * mt.tensor(g)).sum().backward()
        (want * mt.tensor(g)).sum().backward()
        close(xs.grad, rows(xf.grad.numpy(), mesh, 1))
        for name in ("weight", "bias"):  # summed over the sequence pieces
            close(getattr(norm, name).grad, getattr(ref, name).grad.numpy())


def test_sequence_parallel_on_dim_0_and_a_module_without_parameters():
    x, g = rand((SEQ, 4), 5), rand((SEQ, 4), 6)
    for mesh in tp_meshes():
        act = parallelize_module(nn.Tanh(), mesh, SequenceParallel(sequence_dim=0))
        xs, xf = leaf(rows(x, mesh, 0)), leaf(x)
        out = act(xs)
        assert out.placements == (Shard(0),)
        close(out, np.tanh(x))
        (out.full_tensor() * mt.tensor(g)).sum().backward()
        (mt.tanh(xf) * mt.tensor(g)).sum().backward()
        close(xs.grad, rows(xf.grad.numpy(), mesh, 0))


# ------------------------------------------------------------------ PrepareModuleInput
class Affine(nn.Module):
    """a @ w + b * scale, on whatever tensors it is given (records what it got)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(mt.tensor(rand((4, 3), 7)))
        self.seen = []

    def forward(self, a, b, scale=None):
        self.seen = [a, b, scale]
        return a @ self.w + b * scale


def test_prepare_module_input_gathers_positional_and_keyword_inputs():
    a, b, s = rand((SEQ, 4), 8), rand((SEQ, 3), 9), rand((SEQ, 1), 10)
    g = rand((SEQ, 3), 11)
    for mesh in tp_meshes():
        mod = Affine().double()
        parallelize_module(mod, mesh, PrepareModuleInput(
            input_layouts=(Shard(0), None), desired_input_layouts=(Replicate(), None),
            input_kwarg_layouts={"scale": Shard(0)},
            desired_input_kwarg_layouts={"scale": Replicate()}, use_local_output=True))
        ap, sp, bf = leaf(rows(a, mesh, 0)), leaf(rows(s, mesh, 0)), leaf(b)
        out = mod(ap, bf, scale=sp)
        seen = mod.seen
        assert not any(isinstance(t, DTensor) for t in seen)  # use_local_output
        assert seen[1] is bf  # no layout given: left alone
        close(seen[0], a)
        close(seen[2], s)
        af, sf = leaf(a), leaf(s)
        want = af @ mod.w.detach() + bf.detach() * sf
        close(out, want.detach().numpy())
        (out * mt.tensor(g)).sum().backward()
        (want * mt.tensor(g)).sum().backward()
        close(ap.grad, rows(af.grad.numpy(), mesh, 0))  # each piece: its rows of the gradient
        close(sp.grad, rows(sf.grad.numpy(), mesh, 0))


def test_prepare_module_input_hands_dtensors_on():
    a = rand((SEQ, SEQ), 12)
    for mesh in tp_meshes():
        mod = nn.Identity()
        parallelize_module(mod, mesh, PrepareModuleInput(input_layouts=Shard(0),
                                                         desired_input_layouts=Shard(1)))
        out = mod(mt.tensor(rows(a, mesh, 0)))
        assert isinstance(out, DTensor) and out.placements == (Shard(1),)
        close(out, a)
        close(out.to_local(), rows(a, mesh, 1))
        with pytest.raises(ValueError, match="differ from the declared input layout"):
            mod(DTensor.from_local(mt.tensor(rows(a, mesh, 1)), mesh, [Shard(1)]))


def test_prepare_module_input_bad_arguments():
    mesh = tp_meshes()[0]
    with pytest.raises(ValueError, match="as many inputs"):
        PrepareModuleInput(input_layouts=(Shard(0), Shard(1)), desired_input_layouts=Replicate())
    with pytest.raises(TypeError, match="Placement"):
        PrepareModuleInput(input_layouts="shard", desired_input_layouts=Replicate())
    mod = parallelize_module(nn.Identity(), mesh, PrepareModuleInput(
        input_layouts=(Shard(0), Shard(0)), desired_input_layouts=(Replicate(), Replicate())))
    with pytest.raises(ValueError, match="names 2 inputs but the module got 1"):
        mod(mt.ones(SEQ, 2))
    with pytest.raises(ValueError, match="1-D device mesh"):
        parallelize_module(nn.Identity(), init_device_mesh("cpu", (1, dist.get_world_size())),
                           PrepareModuleInput(input_layouts=Shard(0),
                                              desired_input_layouts=Replicate()))


# ------------------------------------------------------------------ PrepareModuleOutput
class HalfProducts(nn.Module):
    """Row-parallel by hand: this rank's columns of x times its rows of w (a partial sum), and
    x's columns as they are (a Shard(1) piece)."""

    def forward(self, x_cols, w_rows):
        return x_cols @ w_rows, x_cols * 2


@pytest.mark.parametrize("local_out", [True, False])
def test_prepare_module_output_reduces_partial_and_gathers_shards(local_out):
    x, w = rand((5, SEQ), 13), rand((SEQ, 3), 14)
    g1, g2 = rand((5, 3), 15), rand((5, SEQ), 16)
    for mesh in tp_meshes():
        mod = parallelize_module(HalfProducts(), mesh, PrepareModuleOutput(
            output_layouts=(Partial(), Shard(1)), desired_output_layouts=(Replicate(),
                                                                          Replicate()),
            use_local_output=local_out))
        xs, ws = leaf(rows(x, mesh, 1)), leaf(rows(w, mesh, 0))
        y, z = mod(xs, ws)
        assert isinstance(y, DTensor) != local_out and isinstance(z, DTensor) != local_out
        if not local_out:
            assert y.placements == z.placements == (Replicate(),)
            y, z = y.to_local(), z.to_local()
        close(y, x @ w)
        close(z, 2 * x)
        xf, wf = leaf(x), leaf(w)
        ((y * mt.tensor(g1)).sum() + (z * mt.tensor(g2)).sum()).backward()
        ((xf @ wf * mt.tensor(g1)).sum() + (xf * 2 * mt.tensor(g2)).sum()).backward()
        close(xs.grad, rows(xf.grad.numpy(), mesh, 1))
        close(ws.grad, rows(wf.grad.numpy(), mesh, 0))


def test_prepare_module_output_counts_the_outputs():
    mesh = tp_meshes()[0]
    mod = parallelize_module(HalfProducts(), mesh, PrepareModuleOutput(
        output_layouts=Partial(), desired_output_layouts=Replicate()))
    with pytest.raises(ValueError, match="names 1 outputs but the module returned 2"):
        mod(mt.ones(2, SEQ // mesh.size()), mt.ones(SEQ // mesh.size(), 2))
    with pytest.raises(ValueError, match="as many"):
        PrepareModuleOutput(output_layouts=(Partial(), Shard(0)),
                            desired_output_layouts=Replicate())


# ------------------------------------------------------------------ tensor parallel + DDP
def layouts():
    """(dp, tp) for every factor pair of the world."""
    n = dist.get_world_size()
    return [(n // t, t) for t in range(1, n + 1) if n % t == 0 and t in (1, 2, 4)]


def mlp():
    mt.manual_seed(3)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 6), nn.LayerNorm(6)).double()


TP_PLAN = {"0": ColwiseParallel(), "2": RowwiseParallel(output_layouts=Shard(0)),
           "3": SequenceParallel(sequence_dim=0, use_local_output=True)}


def test_ddp_over_dp_trains_the_tensor_parallel_model_as_one():
    for dp, tp in layouts():
        train_both(dp, tp)


def train_both(dp, tp):
    """Three SGD steps of the plain model on the whole batch, and of the tensor-parallel one
    under DDP on a (dp, tp) mesh; every parameter piece must agree."""
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    ref, model = mlp(), mlp()
    parallelize_module(model, mesh["tp"], TP_PLAN)
    model = DDP(model, device_mesh=mesh["dp"])
    opt = mt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = mt.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    r, c = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    batch = 4 * dp * tp  # each dp rank's rows split again in tp pieces (SequenceParallel)
    for step in range(3):
        x, y = rand((batch, 6), 20 + step), rand((batch, 6), 40 + step)
        mine = slice(r * batch // dp, (r + 1) * batch // dp)
        piece = slice(mine.start + c * 4, mine.start + (c + 1) * 4)
        out = model(mt.tensor(x[mine]))  # Shard(0) over tp: this rank's rows of its share
        loss = ((out - mt.tensor(y[piece])) ** 2).sum() / batch * dp
        opt.zero_grad()
        loss.backward()
        opt.step()
        ref_loss = ((ref(mt.tensor(x)) - mt.tensor(y)) ** 2).sum() / batch
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
    full = {n: p for n, p in ref.named_parameters()}
    for name, p in model.module.named_parameters():
        placement = TP_PLAN[name.split(".")[0]]
        want = full[name].detach().numpy()
        if isinstance(placement, ColwiseParallel):
            want = rows(want, mesh["tp"], 0)
        elif isinstance(placement, RowwiseParallel) and name.endswith("weight"):
            want = rows(want, mesh["tp"], 1)
        close(p, want)


def test_ddp_device_mesh_bad_arguments():
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n, 1), mesh_dim_names=("dp", "tp"))
    with pytest.raises(ValueError, match="process_group or device_mesh, not both"):
        DDP(mlp(), device_mesh=mesh["dp"], process_group=mesh.get_group("dp"))
    with pytest.raises(ValueError, match="1-D DeviceMesh"):
        DDP(mlp(), device_mesh=mesh)
    if n > 1:  # tensor parallel over the very ranks DDP would average over
        model = parallelize_module(mlp(), mesh["dp"], {"0": ColwiseParallel()})
        with pytest.raises(ValueError, match="shares ranks"):
            DDP(model, device_mesh=mesh["dp"])
