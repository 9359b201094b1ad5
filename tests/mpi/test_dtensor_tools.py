"""The DTensor tools beside the core API, at 1-4 ranks: CommDebugMode, visualize_sharding,
implicit_replication, local_map, register_sharding, PrepareModuleInputOutput.

Spec: CommDebugMode counts every collective issued inside it, one per collective the group
really runs (counted independently here by wrapping the mesh group's own methods), keyed as
torch keys them, and the same counts as torch's CommDebugMode for the same program over gloo;
visualize_sharding prints torch's table (tabulate's layout); the experimental tools give the
values of the same computation on full tensors (float64, a few terms: rtol 1e-12).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor import nn
from mpitensor.distributed.device_mesh import init_device_mesh
from mpitensor.distributed.tensor import DTensor, Replicate, Shard, _dispatch, distribute_tensor
from mpitensor.distributed.tensor.debug import CommDebugMode, ops, visualize_sharding
from mpitensor.distributed.tensor.experimental import (
    context_parallel,
    implicit_replication,
    local_map,
    register_sharding,
)
from mpitensor.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    parallelize_module,
)
from mpitensor.distributed.tensor.placement_types import Partial

from .torch_gloo import torch_gloo_fixture  # noqa: F401 - the fixture torch_gloo

RTOL = 1e-12
GROUP_CALLS = ("all_reduce", "all_reduce_into", "broadcast", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_to_all_single", "all_gather", "reduce_scatter")


def world_mesh():
    return init_device_mesh("cpu", (dist.get_world_size(),))


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def close(got, want):
    got = got.full_tensor() if isinstance(got, DTensor) else got
    np.testing.assert_allclose(got.detach().numpy(), np.asarray(want), rtol=RTOL, atol=1e-12)


@contextlib.contextmanager
def group_calls(mesh):
    """Count the collectives each group of ``mesh`` runs (its own methods, wrapped)."""
    seen = []
    groups = {id(g): g for g in mesh.get_all_groups()}.values()
    undo = []
    for g in groups:
        for name in GROUP_CALLS:
            f = getattr(g, name, None)
            if f is None:
                continue

            def counted(*a, _f=f, _n=name, **k):
                seen.append(_n)
                return _f(*a, **k)

            setattr(g, name, counted)
            undo.append((g, name))
    try:
        yield seen
    finally:
        for g, name in undo:
            delattr(g, name)


def mlp(lib):
    """The TP tutorial's MLP shape, in mpitensor or in torch."""

    class MLP(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = lib.nn.Linear(8, 12, dtype=lib.float64)  # 12: even pieces at 1-4 ranks
            self.down = lib.nn.Linear(12, 8, dtype=lib.float64)

        def forward(self, x):
            return self.down(self.up(x).relu())

    return MLP()


def tp_mlp(mesh):
    mt.manual_seed(0)
    return parallelize_module(mlp(mt), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


# ---------------------------------------------------------------- CommDebugMode
@pytest.mark.parametrize("x_grad", [False, True])
def test_comm_counts_equal_group_calls_tp_mlp(x_grad):
    mesh = world_mesh()
    model = tp_mlp(mesh)
    x = mt.tensor(rand((4, 8), 1), requires_grad=x_grad)
    k = int(dist.get_world_size() > 1)  # a mesh dim of one rank changes layout without any
    ar = {ops.c10d_functional.all_reduce: 1} if k else {}
    with group_calls(mesh) as seen, CommDebugMode() as fwd:
        y = model(x)
    assert fwd.get_total_counts() == len(seen) == k
    assert dict(fwd.get_comm_counts()) == ar
    assert fwd.get_comm_counts()["c10d_functional.all_reduce"] == k
    with group_calls(mesh) as seen, CommDebugMode() as both:
        model(x).sum().backward()
    # backward: the input's gradient (Partial over the column shards) summed, where x wants one
    assert both.get_total_counts() == len(seen) == k * (1 + int(x_grad))
    assert both.get_comm_module_counts()["Global"]["backward"] == (ar if x_grad else {})
    if k:
        assert both.get_comm_module_counts()["MLP.down"]["forward"] == ar
    assert both.get_sharding_info() == {
        "MLP.up.weight": (Shard(0),), "MLP.up.bias": (Shard(0),),
        "MLP.down.weight": (Shard(1),), "MLP.down.bias": (Replicate(),)}
    assert y.shape == (4, 8)


@pytest.mark.mpi(min_size=2)  # a mesh of one rank changes layouts with no collective
def test_comm_tracing_table_and_file(tmp_path):
    mesh = world_mesh()
    model = tp_mlp(mesh)
    with CommDebugMode() as mode:
        model(mt.tensor(rand((4, 8), 1)))
    y, r = "\033[1;33m", "\033[0m"
    assert mode.generate_comm_debug_tracing_table(noise_level=0) == (
        f"Global\n  FORWARD PASS\n{y}    *c10d_functional.all_reduce: 1{r}\n"
        f"    MLP\n      FORWARD PASS\n{y}        *c10d_functional.all_reduce: 1{r}\n"
        f"        MLP.up\n        MLP.down\n          FORWARD PASS\n"
        f"{y}            *c10d_functional.all_reduce: 1{r}\n")
    table = mode.generate_comm_debug_tracing_table(noise_level=1)
    assert "        *module type: class 'mpitensor.nn.modules.linear.Linear'\n" \
           "        *Parameter List\n         *weight: (Shard(dim=0),)\n" in table
    red = "\033[1;31m"
    assert (f"{y}            **mpitensor.nn.functional.linear{r}\n"
            f"{red}              shape: [(4, 8), (12, 8), (12,)]{r}\n"
            f"{red}              sharding: [(Replicate(),), (Shard(dim=0),), (Shard(dim=0),)]{r}\n"
            f"{red}              device mesh: {mesh!r}{r}\n") in table
    path = tmp_path / f"log{dist.get_rank()}.txt"
    mode.log_comm_debug_tracing_table_to_file(str(path), noise_level=0)
    assert path.read_text() == mode.generate_comm_debug_tracing_table(0).replace(y, "").replace(
        r, "")


def test_comm_counts_plain_collectives_and_nothing_outside():
    n = dist.get_world_size()
    originals = {k: getattr(dist, k) for k in ("all_reduce", "all_gather_into_tensor")}
    t = mt.ones(4 * n, dtype=mt.float64)
    with CommDebugMode() as mode:
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        dist.all_gather_into_tensor(mt.empty(4 * n * n, dtype=mt.float64), t)
        dist.reduce_scatter_tensor(mt.empty(4, dtype=mt.float64), t)
        dist.all_to_all_single(mt.empty(4 * n, dtype=mt.float64), t)
        dist.barrier()
    # torch 2.13 (gloo) keys these the same way and counts no barrier
    assert {str(k): v for k, v in mode.get_comm_counts().items()} == {
        "c10d.allreduce_": 1, "c10d.broadcast_": 1, "c10d._allgather_base_": 1,
        "c10d._reduce_scatter_base_": 1, "c10d.alltoall_base_": 1}
    assert mode.get_total_counts() == 5
    dist.all_reduce(t)  # outside: not counted, and the functions are the originals again
    assert mode.get_total_counts() == 5
    assert {k: getattr(dist, k) for k in originals} == originals


@pytest.mark.parametrize("rows", [8, 2 ** 16])  # 2**16 x 8 float64: 4 MiB, the direct path
def test_comm_counts_redistribute(rows):
    mesh = world_mesh()
    full = rand((rows, 8), 2)
    cases = [([Shard(0)], [Replicate()], "all_gather_into_tensor"),
             ([Shard(1)], [Replicate()], "all_gather_into_tensor"),
             ([Partial()], [Replicate()], "all_reduce"),
             ([Partial()], [Shard(0)], "reduce_scatter_tensor"),
             ([Shard(0)], [Shard(1)], "all_to_all_single"),
             ([Replicate()], [Shard(0)], None)]
    for src, dst, kind in cases:
        dt = distribute_tensor(mt.tensor(full), mesh, [Replicate()]).redistribute(mesh, src)
        with CommDebugMode() as mode:
            out = dt.redistribute(mesh, dst)
        # a mesh of one rank: the one piece is the whole, no collective (as torch)
        one = dist.get_world_size() == 1
        want = {} if kind is None or one else {getattr(ops.c10d_functional, kind): 1}
        assert dict(mode.get_comm_counts()) == want, (src, dst)
        close(out, full)  # Replicate -> Partial keeps the value (terms of value / k)


@pytest.mark.mpi(min_size=4)
def test_comm_counts_2d_mesh():
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2))
    dt = distribute_tensor(mt.tensor(rand((8, 6), 3)), mesh, [Shard(0), Shard(1)])
    with CommDebugMode() as mode:
        dt.redistribute(mesh, [Replicate(), Replicate()])
    assert dict(mode.get_comm_counts()) == {ops.c10d_functional.all_gather_into_tensor: 2}


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # torch's mode's own hooks
def test_comm_counts_match_torch(torch_gloo):
    """The same TP MLP program under torch 2.13 (gloo) counts the same collectives."""
    torch = torch_gloo
    from torch.distributed.device_mesh import init_device_mesh as t_mesh
    from torch.distributed.tensor.debug import CommDebugMode as TMode
    from torch.distributed.tensor.parallel import ColwiseParallel as TCol
    from torch.distributed.tensor.parallel import RowwiseParallel as TRow
    from torch.distributed.tensor.parallel import parallelize_module as t_par

    n = dist.get_world_size()
    torch.manual_seed(0)
    t_model = t_par(mlp(torch), t_mesh("cpu", (n,)), {"up": TCol(), "down": TRow()})
    model = tp_mlp(world_mesh())
    for x_grad in (False, True):
        got, want = [], []
        for lib, m, mode_cls, out in ((mt, model, CommDebugMode, got),
                                      (torch, t_model, TMode, want)):
            x = lib.tensor(rand((4, 8), 1), requires_grad=x_grad)
            with mode_cls() as mode:
                m(x)
            out.append({str(k): v for k, v in mode.get_comm_counts().items()})
            with mode_cls() as mode:
                m(x).sum().backward()
            out.append({str(k): v for k, v in mode.get_comm_counts().items()})
        # at 1 rank both skip the collectives of a mesh dim of size 1: none counted
        assert got == want, (x_grad, got, want)


# ---------------------------------------------------------------- visualize_sharding
# torch 2.13's text for these layouts (tabulate installed), 8 x 6 float64
TABLES_1D = {
    (1, "S0"): "         Col 0-5\n-------  ---------\nRow 0-7  cpu:0",
    (2, "S0"): "         Col 0-5\n-------  ---------\nRow 0-3  cpu:0\nRow 4-7  cpu:1",
    (3, "S0"): "         Col 0-5\n-------  ---------\nRow 0-2  cpu:0\nRow 3-5  cpu:1\n"
               "Row 6-7  cpu:2",
    (4, "S0"): "         Col 0-5\n-------  ---------\nRow 0-1  cpu:0\nRow 2-3  cpu:1\n"
               "Row 4-5  cpu:2\nRow 6-7  cpu:3",
    (1, "S1"): "         Col 0-5\n-------  ---------\nRow 0-7  cpu:0",
    (2, "S1"): "         Col 0-2    Col 3-5\n-------  ---------  ---------\n"
               "Row 0-7  cpu:0      cpu:1",
    (3, "S1"): "         Col 0-1    Col 2-3    Col 4-5\n-------  ---------  ---------  ---------\n"
               "Row 0-7  cpu:0      cpu:1      cpu:2",
    (4, "S1"): "         Col 0-1    Col 2-3    Col 4-5    Col 6-5\n"
               "-------  ---------  ---------  ---------  ---------\n"
               "Row 0-7  cpu:0      cpu:1      cpu:2      cpu:3",
    (1, "R"): "         Col 0-5\n-------  ---------\nRow 0-7  cpu:0",
    (2, "R"): "         Col 0-5\n-------  ---------\nRow 0-7  cpu:0,1",
    (3, "R"): "         Col 0-5\n-------  ---------\nRow 0-7  cpu:0,1,2",
    (4, "R"): "         Col 0-5\n-------  -----------\nRow 0-7  cpu:0,1,2,3",
}
TABLES_2D = {  # a 2 x 2 mesh
    "S0S1": "         Col 0-2    Col 3-5\n-------  ---------  ---------\n"
            "Row 0-3  cpu:0      cpu:1\nRow 4-7  cpu:2      cpu:3",
    "S0R": "         Col 0-5\n-------  ---------\nRow 0-3  cpu:0,1\nRow 4-7  cpu:2,3",
    "RS1": "         Col 0-2    Col 3-5\n-------  ---------  ---------\n"
           "Row 0-7  cpu:0,2    cpu:1,3",
    "S1S0": "         Col 0-2    Col 3-5\n-------  ---------  ---------\n"
            "Row 0-3  cpu:0      cpu:2\nRow 4-7  cpu:1      cpu:3",
    "RR": "         Col 0-5\n-------  -----------\nRow 0-7  cpu:0,1,2,3",
}
PLACE = {"S0": Shard(0), "S1": Shard(1), "R": Replicate()}


def printed(capsys, dt, header=""):
    capsys.readouterr()
    visualize_sharding(dt, header=header)
    return capsys.readouterr().out


@pytest.mark.parametrize("kind", ["S0", "S1", "R"])
def test_visualize_sharding_1d(capsys, kind):
    n = dist.get_world_size()
    dt = distribute_tensor(mt.tensor(rand((8, 6), 4)), world_mesh(), [PLACE[kind]])
    out = printed(capsys, dt)
    assert out == (TABLES_1D[(n, kind)] + "\n" if dist.get_rank() == 0 else "")
    out = printed(capsys, dt, header="w1")
    assert out == ("w1\n" + TABLES_1D[(n, kind)] + "\n" if dist.get_rank() == 0 else "")


@pytest.mark.mpi(min_size=4)
@pytest.mark.parametrize("kind", sorted(TABLES_2D))
def test_visualize_sharding_2d(capsys, kind):
    if dist.get_world_size() != 4:
        pytest.skip("the tables are those of a 2 x 2 mesh")
    mesh = init_device_mesh("cpu", (2, 2))
    names = [kind[i:i + 2] if kind[i] == "S" else "R" for i in range(len(kind))
             if kind[i] in "SR"]
    dt = distribute_tensor(mt.tensor(rand((8, 6), 4)), mesh, [PLACE[k] for k in names])
    assert printed(capsys, dt) == (TABLES_2D[kind] + "\n" if dist.get_rank() == 0 else "")


def test_visualize_sharding_1d_tensor_and_limits(capsys):
    n = dist.get_world_size()
    mesh = world_mesh()
    dt = distribute_tensor(mt.tensor(rand((6,), 5)), mesh, [Shard(0)])
    rows = [(r * -(-6 // n), min(6, (r + 1) * -(-6 // n)) - 1) for r in range(n)]
    want = "         Col 0-0\n-------  ---------\n" + "\n".join(
        f"Row {a}-{b}  cpu:{r}" for r, (a, b) in enumerate(rows)) + "\n"
    assert printed(capsys, dt) == (want if dist.get_rank() == 0 else "")
    with pytest.raises(RuntimeError, match="1-D and 2-D"):
        visualize_sharding(distribute_tensor(mt.zeros(2, 2, 2), mesh, [Replicate()]))


# ---------------------------------------------------------------- experimental
def test_implicit_replication():
    mesh = world_mesh()
    a, b = rand((8, 6), 6), rand((6,), 7)
    dt = distribute_tensor(mt.tensor(a), mesh, [Shard(0)])
    with pytest.raises(TypeError, match="plain Tensor"):
        dt + mt.tensor(b)
    with implicit_replication():
        close(dt + mt.tensor(b), a + b)
        close(mt.tensor(b) * dt, a * b)
        close(dt.mul(mt.tensor(b)), a * b)
    with pytest.raises(TypeError, match="plain Tensor"):
        dt * mt.tensor(b)
    original = _dispatch.dispatch
    with CommDebugMode() as mode, implicit_replication():  # both swap the dispatcher
        diff = dt - mt.tensor(b)
    assert mode.get_total_counts() == 0 and _dispatch.dispatch is original
    assert mode.generate_comm_debug_tracing_table(1).count("**__sub__") == 1
    close(diff, a - b)
    with pytest.raises(TypeError, match="plain Tensor"):
        dt - mt.tensor(b)


def test_implicit_replication_gradient():
    mesh = world_mesh()
    a, b = rand((8, 6), 6), rand((6,), 7)
    dt = distribute_tensor(mt.tensor(a), mesh, [Shard(0)]).requires_grad_()
    bias = mt.tensor(b, requires_grad=True)
    with implicit_replication():
        (dt * bias).sum().backward()
    close(dt.grad, np.broadcast_to(b, (8, 6)))
    close(bias.grad, a.sum(0))


def test_local_map():
    mesh = world_mesh()
    x, w = rand((8, 6), 8), rand((6, 5), 9)
    dx = distribute_tensor(mt.tensor(x), mesh, [Shard(0)])
    dw = distribute_tensor(mt.tensor(w), mesh, [Replicate()])
    mm = local_map(mt.mm, out_placements=[Shard(0)], in_placements=([Shard(0)], [Replicate()]))
    with CommDebugMode() as mode:
        out = mm(dx, dw)
    assert isinstance(out, DTensor) and out.placements == (Shard(0),)
    assert mode.get_total_counts() == 0
    if dist.get_world_size() in (1, 2, 4):  # even rows: from_local's global shape
        close(out, x @ w)
    np.testing.assert_allclose(out.to_local().numpy(), dx.to_local().numpy() @ w, rtol=RTOL)
    assert mm(mt.tensor(x), mt.tensor(w)).shape == (8, 5)  # no DTensor: runs as it is
    with pytest.raises(ValueError, match="redistribute_inputs"):
        mm(dw.redistribute(mesh, [Replicate()]), dw) if False else mm(
            distribute_tensor(mt.tensor(x), mesh, [Replicate()]), dw)
    moved = local_map(mt.mm, out_placements=[Shard(0)], in_placements=([Shard(0)], [Replicate()]),
                      redistribute_inputs=True)
    np.testing.assert_allclose(
        moved(distribute_tensor(mt.tensor(x), mesh, [Replicate()]), dw).to_local().numpy(),
        dx.to_local().numpy() @ w, rtol=RTOL)


def test_local_map_two_outputs_and_decorator():
    mesh = world_mesh()
    x = rand((4 * dist.get_world_size(), 3), 10)
    dx = distribute_tensor(mt.tensor(x), mesh, [Shard(0)])

    @local_map(out_placements=([Shard(0)], None), in_placements=([Shard(0)],))
    def twice_and_rows(t):
        return t * 2, t.shape[0]

    out, nrows = twice_and_rows(dx)
    close(out, 2 * x)
    assert nrows == 4


@contextlib.contextmanager
def registered(name):
    """Undo a test's registration: the rule and DTensor method there were before (if any)."""
    rule, method = _dispatch._RULES.get(name), vars(DTensor).get(name)
    try:
        yield
    finally:
        _dispatch._RULES.pop(name, None)
        if rule is not None:
            _dispatch._RULES[name] = rule
        if name in vars(DTensor):
            delattr(DTensor, name)
        if method is not None:
            setattr(DTensor, name, method)


def test_register_sharding_custom_rule():
    mesh = world_mesh()
    x = rand((8, 6), 11)
    with registered("cumsum"):
        @register_sharding(ops.aten.cumsum.default)
        def cumsum_sharding(t, dim):
            d = dim % t.ndim
            return [([Replicate()], [Replicate(), None])] + [
                ([Shard(k)], [Shard(k), None]) for k in range(t.ndim) if k != d]

        rows = distribute_tensor(mt.tensor(x), mesh, [Shard(0)])
        with CommDebugMode() as mode:
            out = rows.cumsum(1)
        assert out.placements == (Shard(0),) and mode.get_total_counts() == 0
        close(out, np.cumsum(x, 1))
        cols = distribute_tensor(mt.tensor(x), mesh, [Shard(1)])
        with CommDebugMode() as mode:
            out = cols.cumsum(1)  # a column shard must move: to Replicate, the first listed
        assert out.placements == (Replicate(),)
        assert mode.get_total_counts() == int(dist.get_world_size() > 1)  # 1 rank: none
        close(out, np.cumsum(x, 1))
    with pytest.raises(_dispatch.ShardingError):
        rows.cumsum(1)  # the rule is gone again


def test_register_sharding_by_name_on_2d_mesh():
    n = dist.get_world_size()
    shape = (2, n // 2) if n % 2 == 0 else (1, n)
    mesh = init_device_mesh("cpu", shape)
    x = rand((8, 6), 12)
    with registered("flip"):
        @register_sharding("flip")
        def flip_sharding(t, dims):
            return [([Replicate()], [Replicate(), None])] + [
                ([Shard(k)], [Shard(k), None]) for k in range(t.ndim) if k not in dims]

        dt = distribute_tensor(mt.tensor(x), mesh, [Shard(0), Shard(1)])
        out = dt.flip([1])
        assert out.placements == (Shard(0), Replicate())
        close(out, x[:, ::-1])


def cumsum_strategies(t, dim):
    d = dim % t.ndim
    return [([Replicate()], [Replicate(), None])] + [
        ([Shard(k)], [Shard(k), None]) for k in range(t.ndim) if k != d]


def test_register_sharding_inplace_op():
    mesh = world_mesh()
    x = rand((8, 6), 14)
    with registered("cumsum_"):
        register_sharding(ops.aten.cumsum_.default)(cumsum_strategies)
        rows = distribute_tensor(mt.tensor(x), mesh, [Shard(0)])
        with CommDebugMode() as mode:
            same = rows.cumsum_(1)
        assert same is rows and mode.get_total_counts() == 0
        close(rows, np.cumsum(x, 1))
        cols = distribute_tensor(mt.tensor(x), mesh, [Shard(1)])
        with pytest.raises(_dispatch.ShardingError, match="in-place"):
            cols.cumsum_(1)  # no listed strategy keeps the column shard it would write


def test_register_sharding_function():
    from mpitensor.nn import functional as F

    mesh = world_mesh()
    x = rand((8, 6), 15)
    path = "mpitensor.nn.functional.normalize"
    with registered(path):
        @register_sharding(F.normalize)
        def normalize_strategies(t, p=2.0, dim=1, eps=1e-12):
            d = dim % t.ndim
            return [([Replicate()], [Replicate()])] + [
                ([Shard(k)], [Shard(k)]) for k in range(t.ndim) if k != d]

        assert path in _dispatch.registered_ops()
        rows = distribute_tensor(mt.tensor(x), mesh, [Shard(0)])
        with CommDebugMode() as mode:
            out = F.normalize(rows, dim=1)
        assert out.placements == (Shard(0),) and mode.get_total_counts() == 0
        close(out, x / np.linalg.norm(x, axis=1, keepdims=True))


def test_prepare_module_input_output_equals_both():
    mesh = world_mesh()
    n = dist.get_world_size()
    x = rand((2 * n, 4), 13)
    piece = x[2 * dist.get_rank():2 * dist.get_rank() + 2]
    outs = []
    for both in (True, False):
        mt.manual_seed(1)
        lin = nn.Linear(4, 3, dtype=mt.float64)
        if both:
            style = PrepareModuleInputOutput(
                input_layouts=Shard(0), desired_input_layouts=Replicate(), use_local_input=True,
                output_layouts=Replicate(), desired_output_layouts=Shard(0))
        else:
            lin = parallelize_module(lin, mesh, PrepareModuleInput(
                input_layouts=Shard(0), desired_input_layouts=Replicate(),
                use_local_output=True))
            style = PrepareModuleOutput(output_layouts=Replicate(),
                                        desired_output_layouts=Shard(0))
        model = parallelize_module(lin, mesh, style)
        xin = mt.tensor(piece, requires_grad=True)
        y = model(xin)
        (y * y).sum().backward()
        outs.append((y.detach().numpy(), xin.grad.numpy(), lin.weight.grad.numpy()))
        full = x @ lin.weight.detach().numpy().T + lin.bias.detach().numpy()
        np.testing.assert_allclose(y.detach().numpy(), full[2 * dist.get_rank():][:2],
                                   rtol=RTOL)
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_context_parallel_raises():
    with pytest.raises(NotImplementedError, match="ring attention"):
        context_parallel(world_mesh(), buffers=[mt.zeros(2, 4)], buffer_seq_dims=[1])
