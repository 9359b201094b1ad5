"""The error paths of DTensor's sharding rules, in one process (a world of 1).

Every refusal is a clear error that names the operation and the operands' placements (a
missing rule, arguments a rule cannot place), and bad input fails before any data moves:
the collectives a DTensor uses are replaced by ones that fail the test if called, and the
DTensors here are made with ``from_local`` (no traffic). The refusals that need several
ranks to arise (a view whose shard would not stay a block) are checked on the rule with a
mesh that reports two ranks.

Multi-rank values and gradients are in tests/mpi/test_dtensor_ops.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
import mpitensor.nn.functional as F
from mpitensor.distributed.device_mesh import init_device_mesh
from mpitensor.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from mpitensor.distributed.tensor._dispatch import OpCall, ShardingError, dispatch, registered_ops
from mpitensor.distributed.tensor._rules_views import reshape_sharding
from mpitensor.distributed.tensor.parallel import loss_parallel

S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
TRAFFIC = ("all_gather_into_tensor", "all_reduce", "all_to_all_single", "broadcast",
           "reduce_scatter_tensor", "scatter", "all_gather_object", "all_gather")


@pytest.fixture(scope="module")
def meshes():
    """A 1-D and a 2-D mesh over the one rank of a default group made for this module."""
    ours = not dist.is_initialized()
    if ours:
        dist.init_process_group("mpi")
    yield init_device_mesh("cpu", (1,)), init_device_mesh("cpu", (1, 1))
    if ours:
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def no_traffic(meshes, monkeypatch):
    """Any collective called from here on fails the test: errors come before data moves."""
    def moved(name):
        def fail(*args, **kwargs):
            raise AssertionError(f"data moved ({name}) before the error")
        return fail
    for name in TRAFFIC:
        monkeypatch.setattr(dist, name, moved(name))


def dt(arr, mesh, placements, grad=False):
    """A float64 DTensor from this rank's (whole) piece, without communication."""
    local = mt.tensor(np.asarray(arr, dtype=np.float64), requires_grad=grad)
    return DTensor.from_local(local, mesh, placements)


def idx(*values):
    return mt.tensor(np.asarray(values, dtype=np.int64))


def refused(fn, op, placements, why, kind=ShardingError):
    """``fn()`` raises ``kind`` naming ``op``, every operand's placements, and ``why``."""
    with pytest.raises(kind) as info:
        fn()
    text = str(info.value)
    assert op in text, text
    for p in placements:
        assert repr(p) in text, text
    assert re.search(why, text), text


# ------------------------------------------------------------------ a missing rule
MISSING = {
    "cumsum": lambda d: d.cumsum(0),
    "sort": lambda d: d.sort(),
    "topk": lambda d: d.topk(1),
    "var": lambda d: d.var(),
    "index_select": lambda d: d.index_select(0, idx(0)),
    "gather": lambda d: d.gather(0, mt.zeros(1, 3, dtype=mt.int64)),
    "mse_loss": lambda d: F.mse_loss(d, d),
    "flip": lambda d: d.flip(0),
    "normalize": lambda d: F.normalize(d),
    "tolist": lambda d: d.tolist(),
}


@pytest.mark.parametrize("name", list(MISSING))
def test_a_missing_rule_names_the_op_and_the_placements(meshes, name):
    for mesh, placements in ((meshes[0], (S0,)), (meshes[1], (S1, R))):
        d = dt(np.ones((4, 3)), mesh, placements)
        refused(lambda d=d: MISSING[name](d), name, placements, "has no sharding rule")


def test_a_call_without_a_registered_rule(meshes):
    d = dt(np.ones((4, 3)), meshes[0], [P])
    refused(lambda: dispatch("no_such_op", mt.Tensor.exp, (d,), {}), "no_such_op",
            [P], "no sharding rule is registered")
    assert "no_such_op" not in registered_ops()


# ------------------------------------------------------------------ each rule's refusals
def _cases(m1, m2):
    """(what is called, the op named, the placements named, why, the error type)."""
    a, b = dt(np.ones((4, 3)), m1, [S0]), dt(np.ones((5, 2)), m1, [R])
    p, r = dt(np.ones((4, 3)), m1, [P]), dt(np.ones(3), m1, [R])
    x3 = dt(np.ones((2, 3, 4)), m1, [S1])
    s = dt(np.ones(()), m1, [R])
    table = dt(np.ones((6, 4)), m1, [S0])
    ids = DTensor.from_local(idx(0, 1), m1, [R])
    logits = dt(np.ones((4, 5)), m1, [S1])
    two = dt(np.ones((4, 3)), m2, [S0, R])
    return [
        # pointwise
        (lambda: a + b, "__add__", [S0, R], "do not broadcast", ShardingError),
        (lambda: p.add_(r), "add_", [P, R], "in-place op would have to reduce", ShardingError),
        (lambda: a + mt.ones(4, 3), "__add__", [S0], "plain Tensor", TypeError),
        (lambda: a + two, "__add__", [S0], "different meshes", ValueError),
        # reductions
        (lambda: a.sum(2), "sum", [S0], "dim 2 is out of range", ShardingError),
        (lambda: a.amax((0, -3)), "amax", [S0], "out of range", ShardingError),
        (lambda: mt.max(a, dim=5), "max", [S0], "out of range", ShardingError),
        # products
        (lambda: a @ b, "matmul", [S0, R], "inner dimensions differ", ShardingError),
        (lambda: s @ a, "matmul", [R, S0], "at least one dimension", ShardingError),
        (lambda: x3 @ dt(np.ones((3, 4, 2)), m1, [R]), "matmul", [S1, R], "do not broadcast",
         ShardingError),
        (lambda: mt.mm(x3, b), "mm", [S1, R], "2-D matrices", ShardingError),
        (lambda: mt.bmm(a, b), "bmm", [S0, R], "3-D tensors", ShardingError),
        (lambda: F.linear(a, b), "linear", [S0, R], "linear needs input", ShardingError),
        (lambda: mt.addmm(r, a, b), "addmm", [R, S0, R], "inner dimensions differ",
         ShardingError),
        # softmax, layer_norm, embedding, dropout, cat
        (lambda: F.softmax(a, None), "softmax", [S0], "needs dim", ShardingError),
        (lambda: a.log_softmax(2), "log_softmax", [S0], "out of range", ShardingError),
        (lambda: F.layer_norm(a, (4,)), "layer_norm", [S0], "does not match", ShardingError),
        (lambda: F.layer_norm(mt.ones(4, 3), (3,), r), "layer_norm", [R],
         "plain Tensor arguments", TypeError),
        (lambda: F.embedding(ids, mt.ones(6, 4)), "embedding", [R],
         "table \\(weight\\) must be a DTensor", ShardingError),
        (lambda: F.embedding(idx(0), r), "embedding", [R], "must be 2-D", ShardingError),
        (lambda: F.embedding(idx(0), table, max_norm=1.0), "embedding", [S0],
         "max_norm", ShardingError),
        (lambda: F.dropout(a, 0.5, inplace=True), "dropout", [S0], "in-place", ShardingError),
        (lambda: F.dropout(r, 0.5), "dropout", [R], "every mesh dim to shard", ShardingError),
        (lambda: mt.cat([a, a]), "cat", [S0], "distinct DTensor", ShardingError),
        (lambda: mt.stack([p, p], 1), "stack", [P], "distinct DTensor", ShardingError),
        # cross-entropy
        (lambda: F.cross_entropy(mt.ones(4, 5), DTensor.from_local(idx(0, 1, 2, 3), m1, [R])),
         "cross_entropy", [R], "logits \\(input\\) must be a DTensor", ShardingError),
        (lambda: F.cross_entropy(logits, idx(0, 1, 2, 3), reduction="all"), "cross_entropy",
         [S1], "reduction 'all'", ShardingError),
        (lambda: F.cross_entropy(logits, idx(0, 1, 2, 3), size_average=True),
         "cross_entropy", [S1], "deprecated", ShardingError),
        # views
        (lambda: a.view(-1, -1), "view", [S0], "more than one -1", ShardingError),
        (lambda: a.reshape(5, 3), "reshape", [S0], "invalid for 12 elements", ShardingError),
        (lambda: a.reshape(-1, 5), "reshape", [S0], "invalid for 12 elements", ShardingError),
        (lambda: a.view(), "view", [S0], "no shape given", ShardingError),
        (lambda: a.flatten(3), "flatten", [S0], "out of range", ShardingError),
        (lambda: a.unflatten(0, (3, 2)), "unflatten", [S0], "do not multiply", ShardingError),
        (lambda: a.permute(0, 0), "permute", [S0], "not a permutation", ShardingError),
        (lambda: a.transpose(0, 2), "transpose", [S0], "out of range", ShardingError),
        (lambda: x3.t(), "t", [S1], "at most 2 dimensions", ShardingError),
        (lambda: a.unsqueeze(3), "unsqueeze", [S0], "out of range", ShardingError),
        (lambda: a.squeeze(2), "squeeze", [S0], "out of range", ShardingError),
        (lambda: a.swapaxes(0, -3), "swapaxes", [S0], "out of range", ShardingError),
    ]


def test_every_rule_refuses_clearly(meshes):
    cases = _cases(*meshes)
    for fn, op, placements, why, kind in cases:
        refused(fn, op, placements, why, kind)


def test_loss_parallel_refuses_class_weights(meshes):
    logits = dt(np.ones((4, 5)), meshes[0], [S1])
    with loss_parallel():
        refused(lambda: F.cross_entropy(logits, idx(0, 1, 2, 3), weight=mt.ones(5)),
                "cross_entropy", [S1], "no class weights")


class _TwoRanks:
    """A mesh as a rule sees it, with two ranks on its one dimension."""

    ndim = 1

    def size(self, m=None):
        return 2

    def get_coordinate(self):
        return [0]


def test_a_view_that_would_move_data_is_refused(meshes):
    # 5 rows cut in two are not blocks of 15 elements: view refuses, reshape gathers
    d = dt(np.ones((5, 3)), meshes[0], [S0])
    call = OpCall("view", (d, 15), {}, _TwoRanks(), [d])
    refused(lambda: reshape_sharding(call, (15,), False, mt.Tensor.view), "view", [S0],
            "cannot keep Shard\\(dim=0\\) on mesh dim 0")
    assert reshape_sharding(call, (15,), True, mt.Tensor.reshape).inputs == [(R,)]


# ------------------------------------------------------------------ bad input, no traffic
BAD = [
    ([S0, R], ValueError, "2 placements .* for a mesh of 1 dimension"),
    ([Shard(2)], ValueError, "Shard\\(dim=2\\) is beyond the tensor's 2 dimension"),
    ([Shard(-3)], ValueError, "is beyond the tensor's 2 dimension"),
    (["Shard(0)"], TypeError, "is not a Shard, Replicate or Partial"),
    (S0, None, None),  # one Placement alone is taken as the list of one
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_placements_fail_before_any_data_moves(meshes, case):
    placements, kind, why = BAD[case]
    mesh = meshes[0]
    d = dt(np.ones((4, 3)), mesh, [S0])
    calls = {"distribute_tensor": lambda: distribute_tensor(mt.ones(4, 3), mesh, placements),
             "DTensor.from_local": lambda: DTensor.from_local(mt.ones(4, 3), mesh, placements),
             "DTensor.redistribute": lambda: d.redistribute(mesh, placements),
             "to_local": lambda: d.to_local(grad_placements=placements)}
    for name, fn in calls.items():
        if kind is None:
            continue
        with pytest.raises(kind, match=why) as info:
            fn()
        assert name in str(info.value)
    if kind is None:
        assert DTensor.from_local(mt.ones(4, 3), mesh, placements).placements == (S0,)


def test_a_2d_mesh_needs_two_placements(meshes):
    mesh = meshes[1]
    with pytest.raises(ValueError, match="1 placements \\[Shard\\(dim=0\\)\\] for a mesh of 2"):
        distribute_tensor(mt.ones(4, 3), mesh, [S0])
    with pytest.raises(ValueError, match="another mesh|between meshes"):
        dt(np.ones((4, 3)), meshes[0], [S0]).redistribute(mesh, [S0, R])
