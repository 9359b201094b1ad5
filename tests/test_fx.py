"""mpitensor.fx against torch.fx: the same programs give the same graphs, code and numbers."""

from __future__ import annotations

import operator

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn.functional as F
from mpitensor import fx, nn
from mpitensor import tanh as imported_tanh

torch = pytest.importorskip("torch")
tfx = pytest.importorskip("torch.fx")

DTYPES = [("float32", 1e-5), ("float64", 1e-12)]


def _both(build):
    """The same program built once on mpitensor and once on torch (``build(lib)``)."""
    return build(mt), build(torch)


def _close(ours, theirs, rtol):
    np.testing.assert_allclose(np.asarray(ours.detach().numpy()),
                               theirs.detach().numpy(), rtol=rtol, atol=rtol)


def _ops(gm):
    return [(n.op, n.name) for n in gm.graph.nodes]


def _code_lines(gm):
    return [line for line in gm.code.strip().splitlines()]


def _make_net(lib):
    class Block(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lib.nn.Linear(4, 4)
            self.act = lib.nn.ReLU()

        def forward(self, x):
            return self.act(self.lin(x)) + x

    class Net(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.seq = lib.nn.Sequential(lib.nn.Linear(4, 3), lib.nn.Tanh())
            self.scale = lib.nn.Parameter(lib.ones(3))
            self.register_buffer("shift", lib.zeros(3) + 0.5)

        def forward(self, x, k=2):
            y = self.block(x)
            z = self.seq(y) * self.scale + self.shift
            for _ in range(k if isinstance(k, int) else 1):  # control flow on a non-proxy
                z = lib.nn.functional.relu(z, inplace=False)
            w = lib.cat([z, z.sum(dim=1, keepdim=True)], 1)
            return lib.flatten(w, 1).view(x.shape[0], -1) - 1.0, w.mean()
    return Net


def _copy_weights(ours, theirs):
    state = {k: mt.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()}
    ours.load_state_dict(state)


@pytest.mark.parametrize("dtype,rtol", DTYPES)
def test_trace_nested_module_matches_torch(dtype, rtol):
    ours_cls, theirs_cls = _both(_make_net)
    torch.manual_seed(0)
    theirs = theirs_cls().to(getattr(torch, dtype))
    ours = ours_cls().to(getattr(mt, dtype))
    _copy_weights(ours, theirs)
    gm, tgm = fx.symbolic_trace(ours), tfx.symbolic_trace(theirs)
    assert _ops(gm) == _ops(tgm)
    assert _code_lines(gm) == _code_lines(tgm)
    xn = np.random.default_rng(0).standard_normal((5, 4)).astype(dtype)
    x, tx = mt.tensor(xn, requires_grad=True), torch.tensor(xn, requires_grad=True)
    out, tout = gm(x), tgm(tx)
    for a, b in zip(out, tout):
        _close(a, b, rtol * 10)
    for a, b in zip(ours(x), out):  # and the same as the module run eagerly
        _close(a, torch.tensor(b.detach().numpy()), 0)
    (out[0].sum() + out[1]).backward()
    (tout[0].sum() + tout[1]).backward()
    _close(x.grad, tx.grad, rtol * 10)
    _close(gm.block.lin.weight.grad, tgm.block.lin.weight.grad, rtol * 10)


def test_printed_graph_and_module_match_torch():
    def build(lib):
        class M(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = lib.nn.Linear(3, 3)

            def forward(self, x, y):
                return x.shape[0] + self.lin(x)[:, 0], lib.neg(-y), abs(y) @ x.T
        return M()
    m, tm = _both(build)
    gm, tgm = fx.symbolic_trace(m), tfx.symbolic_trace(tm)
    assert str(gm.graph) == str(tgm.graph)
    assert gm.code == tgm.code
    assert str(gm) == str(tgm)


def test_functions_and_wrap_targets_are_the_real_functions():
    gm = fx.symbolic_trace(lambda x, y: mt.add(mt.relu(x), y) + F.relu(y).sum())
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets[0] is mt.relu and targets[1] is mt.add and targets[2] is F.relu
    assert operator.add in targets
    assert not fx._dispatch.active()  # the functions run their own code again


def _uses_imported_tanh(x):
    return imported_tanh(x)


def test_functions_imported_by_name_are_recorded():
    gm = fx.symbolic_trace(_uses_imported_tanh)
    assert [n.target for n in gm.graph.nodes][1] is imported_tanh
    x = mt.randn(3)
    np.testing.assert_array_equal(gm(x).numpy(), mt.tanh(x).numpy())


def test_concrete_args_and_bool_of_proxy():
    class M(nn.Module):
        def forward(self, x, flag):
            return x * 2 if flag else x - 1

    with pytest.raises(fx.proxy.TraceError, match="control"):
        fx.symbolic_trace(M())

    class TorchM(torch.nn.Module):
        forward = M.forward
    with pytest.raises(tfx.proxy.TraceError):  # torch raises the same kind of error
        tfx.symbolic_trace(TorchM())
    assert issubclass(fx.proxy.TraceError, ValueError)
    assert issubclass(tfx.proxy.TraceError, ValueError)
    gm = fx.symbolic_trace(M(), concrete_args={"flag": False})
    x = mt.randn(4)
    np.testing.assert_array_equal(gm(x).numpy(), (x - 1).numpy())
    assert not fx._dispatch.active()  # restored even after the error


def test_iteration_and_len_of_proxy():
    def unpack(x):
        a, b = x.shape
        return x.view(b, a)
    gm = fx.symbolic_trace(unpack)
    x = mt.randn(2, 3)
    assert tuple(gm(x).shape) == (3, 2)
    with pytest.raises(fx.proxy.TraceError, match="iterated"):
        fx.symbolic_trace(lambda x: [t for t in x])
    with pytest.raises(RuntimeError, match="len"):
        fx.symbolic_trace(lambda x: len(x))
    with pytest.raises(RuntimeError):  # torch.fx raises RuntimeError for len() too
        tfx.symbolic_trace(lambda x: len(x))
    with pytest.raises(TypeError, match="integer"):
        fx.symbolic_trace(lambda x: [x[i] for i in range(x.size(0))])
    with pytest.raises(TypeError):
        tfx.symbolic_trace(lambda x: [x[i] for i in range(x.size(0))])


def _double_then_half(x):
    return (x * 2).float() / 2


fx.wrap(_double_then_half)


def test_wrap_makes_a_leaf_and_runs():
    gm = fx.symbolic_trace(lambda x: _double_then_half(x) + 1)
    nodes = list(gm.graph.nodes)
    assert nodes[1].op == "call_function" and nodes[1].target is _double_then_half
    assert 'torch.fx._symbolic_trace.wrap("' in gm.code
    x = mt.randn(3)
    np.testing.assert_allclose(gm(x).numpy(), x.numpy() + 1, rtol=1e-6)
    with pytest.raises(NotImplementedError, match="top level"):
        fx.wrap(_double_then_half)


@pytest.mark.parametrize("dtype,rtol", DTYPES)
def test_graph_edit_and_recompile(dtype, rtol):
    def f(x, y):
        return torch_like.add(x, y) * torch_like.sin(y)
    torch_like = mt
    gm = fx.symbolic_trace(f)
    for n in gm.graph.nodes:
        if n.target is mt.add:
            with gm.graph.inserting_after(n):
                new = gm.graph.call_function(mt.sub, n.args, n.kwargs)
            n.replace_all_uses_with(new)
            gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()
    assert "torch.sub(x, y)" in gm.code
    rng = np.random.default_rng(1)
    xn, yn = (rng.standard_normal(6).astype(dtype) for _ in range(2))
    _close(gm(mt.tensor(xn), mt.tensor(yn)),
           (torch.tensor(xn) - torch.tensor(yn)) * torch.sin(torch.tensor(yn)), rtol * 4)


def test_erase_node_with_users_and_lint_errors():
    gm = fx.symbolic_trace(lambda x: mt.relu(x) + 1)
    relu = list(gm.graph.nodes)[1]
    with pytest.raises(RuntimeError, match="still read"):
        gm.graph.erase_node(relu)
    g = fx.Graph()
    x = g.placeholder("x")
    with pytest.raises(RuntimeError, match="another graph"):
        fx.Graph().call_function(mt.relu, (x,))
    with pytest.raises(ValueError):
        g.create_node("bogus", "t")


def test_dead_code_elimination_and_node_api():
    g = fx.Graph()
    x = g.placeholder("x")
    unused = g.call_function(mt.exp, (x,))
    inplace = g.call_method("add_", (x, 1))
    out = g.call_function(operator.mul, (x, 2))
    g.output(out)
    assert x.users.keys() == {unused, inplace, out}
    assert g.eliminate_dead_code()
    assert [n.name for n in g.nodes] == ["x", "add_", "mul", "output"]
    out.update_arg(1, 3)
    assert out.args == (x, 3) and out.all_input_nodes == [x]
    out.update_kwarg("alpha", x)
    assert out.kwargs == {"alpha": x}
    out.kwargs = {}
    y = g.placeholder("y")
    out.replace_input_with(x, y)
    assert out.args[0] is y and out not in x.users
    out.prepend(y)
    assert [n.name for n in g.nodes] == ["x", "add_", "y", "mul", "output"]


def test_proxy_graph_construction_and_graph_appending_tracer():
    graph = fx.Graph()
    tracer = fx.proxy.GraphAppendingTracer(graph)
    a = fx.Proxy(graph.placeholder("x"), tracer)
    b = fx.Proxy(graph.placeholder("y"), tracer)
    c = mt.neg(mt.tanh(mt.cat([a, b])))
    graph.output(c.node)
    gm = fx.GraphModule(nn.Module(), graph)
    tgraph = tfx.Graph()
    tt = tfx.proxy.GraphAppendingTracer(tgraph)
    ta, tb = (tfx.Proxy(tgraph.placeholder(n), tt) for n in "xy")
    tgraph.output(torch.neg(torch.tanh(torch.cat([ta, tb]))).node)
    tgm = tfx.GraphModule(torch.nn.Module(), tgraph)
    assert gm.code == tgm.code
    x, y = np.ones(2), np.arange(2.0)
    _close(gm(mt.tensor(x), mt.tensor(y)), tgm(torch.tensor(x), torch.tensor(y)), 1e-12)
    del a, b, c


def test_interpreter_and_shape_prop():
    from mpitensor.fx.passes.shape_prop import ShapeProp

    ours_cls, _ = _both(_make_net)
    m = ours_cls()
    gm = fx.symbolic_trace(m)
    x = mt.randn(5, 4)
    got = fx.Interpreter(gm).run(x)
    for a, b in zip(got, m(x)):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    ShapeProp(gm).propagate(x)
    shapes = {n.name: tuple(n.meta["tensor_meta"].shape) for n in gm.graph.nodes
              if isinstance(n.meta.get("tensor_meta"), tuple) and hasattr(
                  n.meta["tensor_meta"], "shape")}
    assert shapes["block_lin"] == (5, 4) and shapes["cat"] == (5, 4)

    class NegSigmoid(fx.Interpreter):
        def call_function(self, target, args, kwargs):
            if target is mt.sigmoid:
                return -super().call_function(target, args, kwargs)
            return super().call_function(target, args, kwargs)
    gm2 = fx.symbolic_trace(lambda x: mt.sigmoid(x))
    np.testing.assert_array_equal(NegSigmoid(gm2).run(x).numpy(), (-mt.sigmoid(x)).numpy())
    with pytest.raises(RuntimeError, match="no value"):
        fx.Interpreter(gm2).run()


def test_transformer_swaps_functions():
    class ReluToSigmoid(fx.Transformer):
        def call_function(self, target, args, kwargs):
            if target is mt.relu:
                target = mt.sigmoid
            return super().call_function(target, args, kwargs)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return mt.relu(self.lin(x)).sum(1)
    m = M()
    new = ReluToSigmoid(fx.symbolic_trace(m)).transform()
    x = mt.randn(2, 3)
    np.testing.assert_allclose(new(x).detach().numpy(),
                               mt.sigmoid(m.lin(x)).sum(1).detach().numpy(), rtol=1e-6)
    assert "torch.sigmoid" in new.code


def test_replace_pattern_matches_torch():
    def build(lib):
        class M(lib.nn.Module):
            def forward(self, x, w1, w2):
                m1 = lib.cat([lib.neg(w1), w2]).sum()
                m2 = lib.cat([lib.neg(w1), w2]).sum()
                return x + lib.max(m1) + lib.max(m2)

        def pattern(a1, a2):
            return lib.cat([lib.neg(a1), a2]).sum()

        def replacement(w1, w2):
            return lib.stack([w1, w2])
        return M(), pattern, replacement
    (m, p, r), (tm, tp, tr) = _both(build)
    gm, tgm = fx.symbolic_trace(m), tfx.symbolic_trace(tm)
    matches = fx.replace_pattern(gm, p, r)
    tfx.replace_pattern(tgm, tp, tr)
    assert len(matches) == 2
    assert gm.code == tgm.code
    x, w = np.ones(3), np.arange(3.0)
    _close(gm(mt.tensor(x), mt.tensor(w), mt.tensor(w)),
           tgm(torch.tensor(x), torch.tensor(w), torch.tensor(w)), 1e-12)
    with pytest.raises(ValueError, match="inputs"):
        fx.replace_pattern(gm, p, lambda a: a)


def test_custom_tracer_hooks():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(x) + 1

    class Lowering(fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return not isinstance(m, nn.ReLU) and super().is_leaf_module(m, qualname)

        def create_node(self, kind, target, args, kwargs, name=None, type_expr=None):
            n = super().create_node(kind, target, args, kwargs, name, type_expr)
            n.tag = "seen"
            return n
    g = Lowering().trace(M())
    assert [n.op for n in g.nodes] == ["placeholder", "call_function", "call_function",
                                       "output"]
    assert list(g.nodes)[1].target is F.relu and all(n.tag == "seen" for n in g.nodes)


def test_graph_module_state_dict_roundtrip_and_copy():
    import copy

    ours_cls, _ = _both(_make_net)
    m = ours_cls()
    gm = fx.symbolic_trace(m)
    assert set(gm.state_dict()) == set(m.state_dict())
    fresh = fx.symbolic_trace(ours_cls())
    fresh.load_state_dict(gm.state_dict())
    x = mt.randn(2, 4)
    np.testing.assert_array_equal(fresh(x)[0].detach().numpy(), gm(x)[0].detach().numpy())
    dup = copy.deepcopy(gm)
    np.testing.assert_array_equal(dup(x)[0].detach().numpy(), gm(x)[0].detach().numpy())
    assert "class Net(torch.nn.Module)" in gm.print_readable(print_output=False)
    with pytest.raises(TypeError):
        fx.GraphModule(42, gm.graph)
    again = type(gm)(gm, copy.deepcopy(gm.graph))  # each instance has its own forward
    again.graph.erase_node(list(again.graph.nodes)[-1])
    again.graph.output(None)
    again.recompile()
    assert again(x) is None and gm(x)[0] is not None

    class Mine(fx.GraphModule):
        pass
    assert isinstance(Mine(gm, gm.graph), Mine)


def test_graph_module_pickles_and_saves(tmp_path):
    import pickle

    ours_cls, _ = _both(_make_net)
    gm = fx.symbolic_trace(ours_cls())
    x = mt.randn(3, 4)
    back = pickle.loads(pickle.dumps(gm))
    assert back.code == gm.code and type(back).__name__ == "Net"
    for a, b in zip(back(x), gm(x)):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    mt.save(gm, tmp_path / "gm.pt")
    loaded = mt.load(tmp_path / "gm.pt", weights_only=False)
    np.testing.assert_array_equal(loaded(x)[1].detach().numpy(), gm(x)[1].detach().numpy())


def test_module_paths_and_constants():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.const = mt.tensor([1.0, 2.0])  # a plain tensor attribute

        def forward(self, x):
            return x + self.const
    m = M()
    gm = fx.symbolic_trace(m)
    assert [n.op for n in gm.graph.nodes][1] == "get_attr"
    x = mt.ones(2)
    np.testing.assert_array_equal(gm(x).numpy(), [2.0, 3.0])

    class Stray(nn.Module):
        def forward(self, x):
            return nn.ReLU()(x)
    with pytest.raises(NameError, match="not a submodule"):
        fx.symbolic_trace(Stray())


def test_no_recording_outside_tracing():
    code, method_code = mt.relu.__code__, mt.Tensor.mul.__code__
    gm = fx.symbolic_trace(lambda x: mt.relu(x))
    assert not fx._dispatch.active() and mt.relu.__code__ is code
    assert mt.Tensor.mul.__code__ is method_code
    graph = fx.Graph()
    p = fx.Proxy(graph.placeholder("x"))
    assert fx._dispatch.active() and mt.relu.__code__ is not code
    assert mt.Tensor.mul.__code__ is method_code  # methods record only during a trace
    assert mt.relu(mt.tensor([-1.0, 2.0])).tolist() == [0.0, 2.0]  # no proxy: runs as usual
    assert mt.relu(p).node.target is mt.relu
    del p
    assert not fx._dispatch.active() and mt.relu.__code__ is code
    assert gm(mt.tensor([-1.0])).tolist() == [0.0]


HAS_GPU = mt.backend.cupy_available() and mt.cuda.is_available()


@pytest.mark.skipif(not HAS_GPU, reason=f"GPU test: {mt.backend.cupy_unavailable_reason()}")
def test_traced_module_runs_on_gpu():
    ours_cls, theirs_cls = _both(_make_net)
    torch.manual_seed(0)
    theirs = theirs_cls().double()
    ours = ours_cls().double()
    _copy_weights(ours, theirs)
    gm = fx.symbolic_trace(ours).to("cuda")
    xn = np.random.default_rng(0).standard_normal((5, 4))
    out = gm(mt.tensor(xn, device="cuda"))
    assert out[0].device.type == "cuda"
    _close(out[0].cpu(), theirs(torch.tensor(xn))[0], 1e-11)


_WRAP_PROGRAM = '''
from math import sqrt
torch.fx.wrap("len")

class M(torch.nn.Module):
    def forward(self, x):
        return x * len(x) + sqrt(x.size(0)) + x.size(1)

gm = torch.fx.symbolic_trace(M())
'''


def test_wrap_by_name_and_autowrapped_math_match_torch():
    ours, theirs = {"torch": mt, "__name__": "fx_prog"}, {"torch": torch, "__name__": "fx_prog"}
    exec(_WRAP_PROGRAM, ours)  # noqa: S102 - a module-level program, as wrap() requires
    exec(_WRAP_PROGRAM, theirs)  # noqa: S102
    assert ours["gm"].code == theirs["gm"].code
    assert 'wrap("len")' in ours["gm"].code
    np.testing.assert_array_equal(ours["gm"](mt.ones(4, 2)).numpy(),
                                  theirs["gm"](torch.ones(4, 2)).numpy())


def _make_scaled(lib):
    class Scaled(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = lib.tensor([1.0, 2.0, 3.0])  # a plain attribute, not a buffer

        def forward(self, x):
            return x + self.scale.mul(x) - self.scale * x
    return Scaled()


@pytest.mark.parametrize("dtype,rtol", DTYPES)
def test_real_tensor_meeting_a_proxy_matches_torch(dtype, rtol):
    m, tm = _both(_make_scaled)
    gm, tgm = fx.symbolic_trace(m), tfx.symbolic_trace(tm)
    # tensor * proxy: torch records the method mul, mpitensor the operator (same value)
    assert [n.target for n in gm.graph.nodes if n.op == "get_attr"] == \
        [n.target for n in tgm.graph.nodes if n.op == "get_attr"]
    assert "= scale.mul(x)" in gm.code and "= scale.mul(x)" in tgm.code
    xn = np.random.default_rng(2).standard_normal((2, 3)).astype(dtype)
    _close(gm(mt.tensor(xn)), tgm(torch.tensor(xn)), rtol)


def test_plain_tensor_sliced_by_a_traced_size():
    class PosEnc(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = mt.arange(24.0).reshape(1, 8, 3)  # torch.fx cannot trace this one

        def forward(self, x):
            return x + self.table[:, :x.size(1)]
    m = PosEnc()
    gm = fx.symbolic_trace(m)
    x = mt.randn(2, 5, 3)
    np.testing.assert_array_equal(gm(x).numpy(), m(x).numpy())
    assert "operator.getitem" in str(gm.graph)


def test_transformer_and_shape_prop_match_torch():
    def build(lib):
        class Swap(lib.fx.Transformer):
            def call_function(self, target, args, kwargs):
                if target is lib.sigmoid:
                    return lib.neg(*args, **kwargs)
                return super().call_function(target, args, kwargs)

            def call_method(self, target, args, kwargs):
                if target == "neg":
                    return args[0].sigmoid(*args[1:], **kwargs)
                return super().call_method(target, args, kwargs)
        return Swap, lambda x: lib.sigmoid(x).neg().transpose(0, 1)
    (swap, f), (tswap, tf) = _both(build)
    new, tnew = swap(fx.symbolic_trace(f)).transform(), tswap(tfx.symbolic_trace(tf)).transform()
    assert new.code == tnew.code
    xn = np.arange(6.0).reshape(2, 3)
    _close(new(mt.tensor(xn)), tnew(torch.tensor(xn)), 1e-12)

    from torch.fx.passes.shape_prop import ShapeProp as TorchShapeProp

    from mpitensor.fx.passes.shape_prop import ShapeProp
    gm, tgm = fx.symbolic_trace(f), tfx.symbolic_trace(tf)
    ShapeProp(gm).propagate(mt.ones(2, 3))
    TorchShapeProp(tgm).propagate(torch.ones(2, 3))
    for n, tn in zip(gm.graph.nodes, tgm.graph.nodes):
        a, b = n.meta["tensor_meta"], tn.meta["tensor_meta"]
        assert (tuple(a.shape), a.requires_grad, a.stride) == \
            (tuple(b.shape), b.requires_grad, b.stride)
        assert str(a.dtype) == str(b.dtype).replace("torch.", "")


def test_sequential_root_module_list_and_dict_output_match_torch():
    def build(lib):
        class M(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = lib.nn.ModuleList([lib.nn.Linear(2, 2) for _ in range(2)])
                self.d = lib.nn.ModuleDict({"a": lib.nn.Tanh()})

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return {"out": self.d["a"](x).clamp(min=-0.5, max=0.5), "n": x.numel()}
        seq = lib.nn.Sequential(lib.nn.Linear(3, 4), lib.nn.ReLU(),
                                lib.nn.Sequential(lib.nn.Linear(4, 2), lib.nn.Sigmoid()))
        return M(), seq
    (m, seq), (tm, tseq) = _both(build)
    for ours, theirs in ((m, tm), (seq, tseq)):
        gm, tgm = fx.symbolic_trace(ours), tfx.symbolic_trace(theirs)
        assert gm.code == tgm.code  # Sequential's parameter 'input' is renamed like torch's
        assert str(gm.graph) == str(tgm.graph)
    x = mt.randn(5, 3)
    np.testing.assert_array_equal(fx.symbolic_trace(seq)(x).detach().numpy(),
                                  seq(x).detach().numpy())


_ANNOTATED = """
import typing

class M(lib.nn.Module):
    def forward(self, x: lib.Tensor, n: int = 2,
                y: typing.Optional[lib.Tensor] = None) -> lib.Tensor:
        return x * n
"""


def test_annotations_print_like_torch():
    # this file postpones annotations (strings are not printed); the program does not
    ours, theirs = {"lib": mt}, {"lib": torch}
    program = compile(_ANNOTATED, "<annotated>", "exec", dont_inherit=True)
    exec(program, ours)  # noqa: S102 - the program, with evaluated annotations
    exec(program, theirs)  # noqa: S102
    gm, tgm = fx.symbolic_trace(ours["M"]()), tfx.symbolic_trace(theirs["M"]())
    assert "x : torch.Tensor" in gm.code
    assert gm.code == tgm.code and str(gm.graph) == str(tgm.graph)
    x = mt.ones(2)
    np.testing.assert_array_equal(gm(x, 3).numpy(), [3.0, 3.0])


def test_submodule_edits_follow_the_graph():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Sequential(nn.ReLU(), nn.Tanh())

        def forward(self, x):
            return self.b(self.a(x))
    gm = fx.symbolic_trace(M())
    assert gm.add_submodule("extra.act", nn.Sigmoid())
    last = [n for n in gm.graph.nodes if n.op == "call_module"][-1]
    with gm.graph.inserting_after(last):
        new = gm.graph.call_module("extra.act", (last,))
    last.replace_all_uses_with(new, delete_user_cb=lambda user: user is not new)
    gm.recompile()
    x = mt.randn(3, 2)
    np.testing.assert_allclose(gm(x).detach().numpy(),
                               mt.sigmoid(mt.tanh(mt.relu(gm.a(x)))).detach().numpy(),
                               rtol=1e-6)
    for n in [n for n in gm.graph.nodes if n.target == "b.0"]:
        n.replace_all_uses_with(n.args[0])
        gm.graph.erase_node(n)
    gm.recompile()
    gm.delete_all_unused_submodules()
    assert sorted(name for name, _ in gm.named_modules()) == \
        ["", "a", "b", "b.1", "extra", "extra.act"]
    assert not gm.delete_submodule("nothing.here")
