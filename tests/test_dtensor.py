"""DTensor at world size 1: the API, the dispatch (rules, the guard, the registry), parameters,
and the output placements of the rules against torch's DTensor (gloo, one process).

Multi-rank values and gradients are in tests/mpi/test_dtensor.py.
"""

from __future__ import annotations

import copy
import pickle
import sys
import types

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    _dispatch,
    distribute_tensor,
    init_device_mesh,
)
from mpitensor.distributed.tensor._dispatch import OpCall, Sharding, ShardingError


@pytest.fixture(scope="module")
def mesh():
    """A mesh of the one rank of a default group made for this module."""
    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group("mpi")
    yield init_device_mesh("cpu", (1,))
    if ours:
        dist.destroy_process_group()


def dt(mesh, arr, placements=None):
    """A float64 DTensor of ``arr`` (row-sharded unless told)."""
    return distribute_tensor(mt.tensor(np.asarray(arr, dtype=np.float64)), mesh,
                             list(placements or [Shard(0)]))


# ------------------------------------------------------------------ the API
def test_metadata_is_global(mesh):
    d = dt(mesh, np.arange(6.0).reshape(3, 2))
    assert d.shape == (3, 2) and d.size() == (3, 2) and d.size(-1) == 2
    assert d.ndim == 2 and d.dim() == 2 and d.numel() == 6 and len(d) == 3
    assert d.dtype == mt.float64 and d.stride() == (2, 1) and not d.is_cuda
    assert d.placements == (Shard(0),) and d.device_mesh is mesh
    assert isinstance(d, mt.Tensor) and isinstance(d.to_local(), mt.Tensor)
    assert not isinstance(d.to_local(), DTensor)
    assert "Shard(dim=0)" in repr(d)
    assert d.cpu().placements == d.placements and d.float().dtype == mt.float32


def test_dtensor_is_not_built_directly(mesh):
    with pytest.raises(TypeError, match="distribute_tensor"):
        DTensor(mt.ones(2))


def test_guard_names_the_operation_and_placements(mesh):
    d = dt(mesh, np.ones((3, 2)))
    # ops that no rule file covers (the reductions, matmul, softmax... get theirs in _ops_*)
    with pytest.raises(ShardingError, match=r"\.sort on a DTensor.*\(3, 2\).*Shard\(dim=0\)"):
        d.sort(dim=0)
    with pytest.raises(ShardingError, match="conv1d"):
        mt.nn.functional.conv1d(d.unsqueeze(0), mt.ones(1, 3, 1))
    with pytest.raises(ShardingError):
        np.asarray(d)
    with pytest.raises(ShardingError, match="item"):
        dt(mesh, [1.0]).item()
    conv = mt.nn.Conv1d(3, 1, 1)
    with pytest.raises(ShardingError, match=r"\.conv1d on a DTensor"):
        conv(d.unsqueeze(0))  # named by the op inside the module, not by Module.__call__


def test_mixing_plain_tensors_is_refused(mesh):
    d = dt(mesh, np.ones((3, 2)))
    for bad in (lambda: d + mt.ones(3, 2), lambda: mt.ones(3, 2) * d,
                lambda: mt.nn.functional.relu(d) + mt.ones(3, 2)):
        with pytest.raises(TypeError, match="plain Tensor"):
            bad()
    assert (d + 1.5).to_local().numpy().tolist() == [[2.5, 2.5]] * 3


def test_plain_functions_still_plain(mesh):
    a = mt.tensor([-1.0, 2.0])
    assert getattr(mt.nn.functional.relu, "__dtensor_original__", None) is not None
    out = mt.nn.functional.relu(a)
    assert type(out) is mt.Tensor and out.tolist() == [0.0, 2.0]
    # top-level arithmetic is left unwrapped (plain calls pay nothing); mt.add calls the
    # method, which DTensor has
    assert getattr(mt.add, "__dtensor_original__", None) is None
    twice = mt.add(dt(mesh, [1.0]), dt(mesh, [1.0]))
    assert isinstance(twice, DTensor) and twice.full_tensor().tolist() == [2.0]


def test_register_a_rule_for_a_new_function(mesh):
    mod = types.ModuleType("dt_test_ops")

    def double_rows(x):
        return mt.cat([x, x], dim=0)

    mod.double_rows = double_rows
    sys.modules["dt_test_ops"] = mod
    try:
        def rule(call: OpCall) -> Sharding:
            (x,) = call.dtensors
            if any(isinstance(p, Shard) and p.dim == 0 for p in x.placements):
                raise call.fail("cannot stack rows of a row-sharded tensor")
            return Sharding(placements=x.placements, shape=(2 * x.shape[0],) + x.shape[1:])

        _dispatch.register_sharding_rule("dt_test_ops.double_rows", rule)
        assert "dt_test_ops.double_rows" in _dispatch.registered_ops()
        d = dt(mesh, np.arange(4.0).reshape(2, 2), [Shard(1)])
        out = mod.double_rows(d)
        assert out.shape == (4, 2) and out.placements == (Shard(1),)
        np.testing.assert_array_equal(out.full_tensor().numpy(),
                                      np.tile(np.arange(4.0).reshape(2, 2), (2, 1)))
        with pytest.raises(ShardingError, match=r"double_rows on DTensors.*cannot stack"):
            mod.double_rows(dt(mesh, np.ones((2, 2))))
        assert mod.double_rows(mt.ones(1, 2)).shape == (2, 2)  # plain calls untouched
    finally:
        del sys.modules["dt_test_ops"]
    with pytest.raises(ValueError, match="no method"):
        _dispatch.register_sharding_rule("no_such_method", rule)


# ------------------------------------------------------------------ autograd and parameters
def test_parameter_of_a_dtensor(mesh):
    d = dt(mesh, np.ones((4, 2)))
    p = mt.nn.Parameter(d)
    assert isinstance(p, DTensor) and isinstance(p, mt.nn.Parameter)
    assert p.requires_grad and p.is_leaf and p.placements == (Shard(0),)
    m = mt.nn.Module()
    m.w = p
    assert dict(m.named_parameters())["w"] is p and m.state_dict()["w"] is not None
    assert repr(p).startswith("Parameter containing:\nDTensor(")
    frozen = mt.nn.Parameter(d, requires_grad=False)
    assert not frozen.requires_grad
    twin = copy.deepcopy(p)
    assert isinstance(twin, mt.nn.Parameter) and twin.placements == p.placements
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(p)


def test_grad_is_a_dtensor_with_the_placements(mesh):
    p = mt.nn.Parameter(dt(mesh, np.arange(4.0).reshape(2, 2), [Replicate()]))
    (p * p).full_tensor().sum().backward()
    assert isinstance(p.grad, DTensor) and p.grad.placements == (Replicate(),)
    np.testing.assert_array_equal(p.grad.to_local().numpy(), 2 * np.arange(4.0).reshape(2, 2))
    with pytest.raises(TypeError, match="placed"):
        p.grad = dt(mesh, np.ones((2, 2)), [Shard(0)])
    with pytest.raises(TypeError, match="placed"):
        p.grad = mt.ones(2, 2)
    p.grad = None
    assert p.grad is None


def test_backward_from_a_dtensor(mesh):
    leaf = mt.ones(3, requires_grad=True)
    x = DTensor.from_local(leaf, mesh, [Shard(0)])
    assert not x.is_leaf  # from_local is a node of the graph, as in torch
    y = (x * 3.0)
    y.backward(dt(mesh, [1.0, 2.0, 3.0], [Replicate()]))
    assert leaf.grad.tolist() == [3.0, 6.0, 9.0]
    with pytest.raises(RuntimeError, match="scalar"):
        (x * 3.0).backward()
    with pytest.raises(TypeError, match="DTensor"):
        (x * 3.0).backward(mt.ones(3))


def test_to_local_grad_placements(mesh):
    leaf = mt.ones(2, requires_grad=True)
    x = DTensor.from_local(leaf, mesh, [Replicate()])
    loc = x.to_local(grad_placements=[Partial()])
    (loc * 5.0).sum().backward()
    assert leaf.grad.tolist() == [5.0, 5.0]


def test_no_gradient_through_a_nonlinear_partial(mesh):
    leaf = mt.ones(2, requires_grad=True)
    x = DTensor.from_local(leaf, mesh, [Partial("max")])
    y = x.redistribute(mesh, [Replicate()])
    assert y.to_local().tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match=r"no gradient through Partial\(max\)"):
        y.to_local().sum().backward()


def test_hooks_see_dtensors(mesh):
    p = mt.nn.Parameter(dt(mesh, np.ones((2, 2))))
    seen = []
    p.register_hook(lambda g: seen.append(type(g)))
    p.register_post_accumulate_grad_hook(lambda q: seen.append(q is p))
    (p * 2.0).full_tensor().sum().backward()
    assert seen == [DTensor, True]


def test_optimizer_state_is_local(mesh):
    p = mt.nn.Parameter(dt(mesh, np.ones((2, 2))))
    opt = mt.optim.Adam([p], lr=0.1)
    (p * p).full_tensor().sum().backward()
    opt.step()
    np.testing.assert_allclose(p.to_local().detach().numpy(), np.full((2, 2), 0.9), rtol=1e-6)
    opt.zero_grad()
    assert p.grad is None


def test_optimizers_that_are_not_elementwise_refuse(mesh):
    p = mt.nn.Parameter(dt(mesh, np.ones((2, 2))))
    opt = mt.optim.LBFGS([p])

    def closure():
        opt.zero_grad()
        loss = (p * p).full_tensor().sum()
        loss.backward()
        return loss

    with pytest.raises(ShardingError, match="lbfgs"):
        opt.step(closure)


# ------------------------------------------------------------------ argument checks
def test_from_local_arguments(mesh):
    with pytest.raises(ValueError, match="device_mesh"):
        DTensor.from_local(mt.ones(2))
    with pytest.raises(ValueError, match="2 placements"):
        DTensor.from_local(mt.ones(2), mesh, [Shard(0), Shard(0)])
    with pytest.raises(ValueError, match=r"Shard\(dim=1\) is beyond"):
        DTensor.from_local(mt.ones(2), mesh, [Shard(1)])
    with pytest.raises(TypeError, match="plain Tensor"):
        DTensor.from_local(dt(mesh, [1.0]), mesh)
    d = DTensor.from_local(mt.ones(2, 3), mesh, [Shard(-1)], run_check=True)
    assert d.placements == (Shard(1),)
    with pytest.raises(ValueError, match="run_check"):
        DTensor.from_local(mt.ones(2, 3), mesh, [Shard(0)], run_check=True, shape=(5, 3))


def test_redistribute_arguments(mesh):
    d = dt(mesh, np.ones((2, 3)))
    assert d.redistribute(mesh, [Shard(0)]) is d
    assert d.redistribute().placements == (Replicate(),)
    other = init_device_mesh("cpu", (1,), mesh_dim_names=("x",))
    with pytest.raises(ValueError, match="between meshes"):
        d.redistribute(other, [Replicate()])


def test_view_refuses_to_move_data(mesh):
    # a shard that a view cannot keep: only possible with several ranks, so check the rule
    from mpitensor.distributed.tensor._rules_views import _map_dim

    assert _map_dim((4, 3), (12,), 0, 2) == 0 and _map_dim((5, 3), (15,), 0, 2) is None
    assert _map_dim((4, 3), (12,), 1, 2) is None and _map_dim((6,), (2, 3), 0, 2) == 0
    assert _map_dim((5, 3), (5, 3), 0, 4) == 0  # kept whole: uneven is fine


# ------------------------------------------------------------------ torch as the oracle
def _placement_cases(Shard, Replicate, Partial, T):  # noqa: N803 - the placement classes
    x = T.arange(12.0).reshape(4, 3)
    return [
        ("S0 + bias", lambda f: f(x, [Shard(0)]) + f(T.ones(3), [Replicate()])),
        ("P * 2", lambda f: f(x, [Partial()]) * 2),
        ("P + P", lambda f: f(x, [Partial()]) + f(x, [Partial()])),
        ("P + 1", lambda f: f(x, [Partial()]) + 1),
        ("relu(P)", lambda f: f(x, [Partial()]).relu()),
        ("S1 * S1", lambda f: f(x, [Shard(1)]) * f(x, [Shard(1)])),
        ("t(S0)", lambda f: f(x, [Shard(0)]).t()),
        ("view(S0)", lambda f: f(x, [Shard(0)]).view(12)),
        ("unsqueeze(S1)", lambda f: f(x, [Shard(1)]).unsqueeze(0)),
        ("permute(S0)", lambda f: f(x.reshape(2, 2, 3), [Shard(0)]).permute(2, 0, 1)),
    ]


def test_output_placements_match_torch(mesh):
    torch = pytest.importorskip("torch", reason="torch is the oracle for the placements")
    import torch.distributed as tdist
    from torch.distributed.tensor import DTensor as TDTensor
    from torch.distributed.tensor import Partial as TP
    from torch.distributed.tensor import Replicate as TR
    from torch.distributed.tensor import Shard as TS

    if tdist.is_initialized():
        pytest.skip("a torch process group is already set up in this process")
    # torch's "fake" backend (each collective the identity at one rank) rather than gloo, whose
    # worker threads can deadlock with the group's destructor (see test_ddp_comm_hooks)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    tdist.init_process_group("fake", rank=0, world_size=1, store=FakeStore())
    try:
        from torch.distributed.device_mesh import init_device_mesh as tmesh

        tm = tmesh("cpu", (1,))

        def theirs(t, pl):
            return TDTensor.from_local(t, tm, pl)

        def ours(t, pl):
            back = {TS: Shard, TR: Replicate, TP: Partial}
            mine = [back[type(p)](p.dim) if isinstance(p, TS) else back[type(p)]()
                    for p in pl]
            return DTensor.from_local(mt.tensor(t.numpy()), mesh, mine)

        for (name, theirs_fn), (_, ours_fn) in zip(
                _placement_cases(TS, TR, TP, torch), _placement_cases(TS, TR, TP, torch)):
            want = [repr(p) for p in theirs_fn(theirs).placements]
            got = [repr(p) for p in ours_fn(ours).placements]
            assert got == want, name
    finally:
        tdist.destroy_process_group()
