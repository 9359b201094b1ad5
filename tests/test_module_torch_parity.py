"""``nn.Module`` and ``nn.Parameter`` checked against PyTorch as the oracle.

Each test builds the same model twice, once from mpitensor and once from torch, through the
public API only, and asserts that what a user can observe is the same: state-dict keys and
their order, load errors and results, hook call orders, module iteration with shared
children, reprs. The whole module is skipped where torch is not installed.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn

torch = pytest.importorskip("torch", reason="torch is the oracle for these parity tests")

OURS = (mt, nn)
THEIRS = (torch, torch.nn)


def _build_block(lib, lnn):
    """A block with a parameter, persistent/non-persistent/None buffers and a None param."""

    class Block(lnn.Module):
        def __init__(self):
            super().__init__()
            self.fc = lnn.Linear(3, 2)
            self.register_buffer("running", lib.zeros(2))
            self.register_buffer("scratch", lib.zeros(4), persistent=False)
            self.register_buffer("empty", None)
            self.gain = lnn.Parameter(lib.ones(1))
            self.register_parameter("unused", None)

        def forward(self, x):
            return self.fc(x) * self.gain

    return Block()


def _build_tree(lib, lnn):
    """Nested model: a shared child under two names, a None child, containers, a tied weight."""

    class Tree(lnn.Module):
        def __init__(self):
            super().__init__()
            self.body = _build_block(lib, lnn)
            self.alias = self.body  # the same module under a second name
            self.head = lnn.Sequential(lnn.Linear(2, 2), lnn.ReLU(), lnn.Linear(2, 1))
            self.gone = None
            self.add_module("missing_child", None)
            self.table = lnn.ModuleDict({"a": lnn.Linear(1, 1), "b": lnn.Identity()})
            self.table["a"].bias = self.body.gain  # a parameter shared across modules
            self.register_buffer("steps", lib.zeros(1, dtype=lib.int64))

        def forward(self, x):
            return self.head(self.body(x))

    return Tree()


def _names(pairs):
    return [name for name, _ in pairs]


# --------------------------------------------------------------------------------------------
# Iteration and state_dict keys


def test_named_iterators_with_shared_and_none_children_match_torch():
    ours, theirs = _build_tree(*OURS), _build_tree(*THEIRS)
    for method in ("named_modules", "named_parameters", "named_buffers"):
        for dedupe in (True, False):
            got = _names(getattr(ours, method)(remove_duplicate=dedupe))
            want = _names(getattr(theirs, method)(remove_duplicate=dedupe))
            assert got == want, (method, dedupe)
    assert _names(ours.named_children()) == _names(theirs.named_children())
    assert _names(ours.named_modules(prefix="m")) == _names(theirs.named_modules(prefix="m"))
    assert (_names(ours.named_parameters(prefix="p", recurse=False))
            == _names(theirs.named_parameters(prefix="p", recurse=False)))
    assert len(list(ours.modules())) == len(list(theirs.modules()))
    assert len(list(ours.parameters())) == len(list(theirs.parameters()))
    # a memo given by the caller leaves its modules (and their subtrees) out
    got = _names(ours.named_modules(memo={ours.body}))
    want = _names(theirs.named_modules(memo={theirs.body}))
    assert got == want and "body" not in got


def test_state_dict_keys_order_and_values_match_torch():
    ours, theirs = _build_tree(*OURS), _build_tree(*THEIRS)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert (list(ours.state_dict(prefix="model.")) == list(theirs.state_dict(prefix="model.")))
    ours.load_state_dict(theirs.state_dict())
    for (key, mine), (tkey, tv) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert key == tkey
        np.testing.assert_array_equal(np.asarray(mine._data), tv.numpy(), err_msg=key)
        assert not mine.requires_grad and not tv.requires_grad
    kept = ours.state_dict(keep_vars=True)
    tkept = theirs.state_dict(keep_vars=True)
    assert ([isinstance(v, nn.Parameter) for v in kept.values()]
            == [isinstance(v, torch.nn.Parameter) for v in tkept.values()])


def test_reassignment_keeps_registration_order_like_torch():
    def reassign(lib, lnn):
        m = lnn.Linear(2, 2)
        m.weight = lnn.Parameter(lib.zeros(2, 2))  # replaces in place: weight stays first
        m.register_buffer("b1", lib.zeros(1))
        m.extra = lnn.Identity()
        m.b1 = lnn.ReLU()  # a module takes over a buffer's name
        m.extra = lnn.Flatten()  # a module replacing a module keeps its place
        m.first = lnn.Linear(1, 1)
        del m.first
        return m

    ours, theirs = reassign(*OURS), reassign(*THEIRS)
    assert _names(ours.named_parameters()) == _names(theirs.named_parameters())
    assert _names(ours.named_children()) == _names(theirs.named_children())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)


# --------------------------------------------------------------------------------------------
# load_state_dict


def _bad_state(sd, lib):
    del sd["head.2.bias"]
    del sd["alias.running"]
    sd["extra"] = lib.zeros(1)  # unknown at the root
    sd["body.nope"] = lib.zeros(1)  # unknown inside a child
    sd["body.fc.deeper.x"] = lib.zeros(1)  # a path through a module that does not exist
    sd["ghost.weight"] = lib.zeros(1)  # a child that does not exist
    sd["body.scratch"] = lib.zeros(4)  # a non-persistent buffer is not loadable
    sd["body.unused"] = lib.zeros(1)  # a parameter slot holding None
    sd["gone.weight"] = lib.zeros(1)  # "gone" is a plain attribute (None), not a child
    sd["missing_child.weight"] = lib.zeros(1)  # under a registered None child: ignored
    return sd


def _load_problems(text: str) -> dict:
    """The keys an error message names as missing, unexpected or of a wrong shape: torch's
    wording or ours, so the two libraries can be compared on what they report."""
    import re

    def keys(line: str) -> list:
        return re.findall(r'"([^"]+)"', line)

    out: dict = {"missing": [], "unexpected": [], "shape": []}
    for line in text.splitlines():
        if "Missing key(s)" in line or "missing from the state dict" in line:
            out["missing"] = keys(line)
        elif "Unexpected key(s)" in line or "not in the model" in line:
            out["unexpected"] = keys(line)
        elif "size mismatch for" in line:
            out["shape"].append(line.split("size mismatch for ", 1)[1].split(":")[0])
        elif re.match(r"\s+\S+: shape \(", line):
            out["shape"].append(line.strip().split(":")[0])
    return out


def test_load_strict_errors_match_torch():
    ours, theirs = _build_tree(*OURS), _build_tree(*THEIRS)
    tsd = _bad_state(theirs.state_dict(), torch)
    tsd["head.0.weight"] = torch.zeros(3, 3)  # and a shape mismatch
    sd = _bad_state(ours.state_dict(), mt)
    sd["head.0.weight"] = mt.zeros(3, 3)
    with pytest.raises(RuntimeError) as texc:
        theirs.load_state_dict(tsd)
    before = {k: np.asarray(v._data).copy() for k, v in ours.state_dict().items()}
    with pytest.raises(RuntimeError) as exc:
        ours.load_state_dict(sd)
    # the same keys reported in each category as torch; the wording is ours
    assert _load_problems(str(exc.value)) == _load_problems(str(texc.value))
    assert _load_problems(str(exc.value))["missing"]  # the scenario has all three kinds
    assert _load_problems(str(exc.value))["unexpected"]
    assert _load_problems(str(exc.value))["shape"] == ["head.0.weight"]
    # nothing was written by the failed load
    for k, v in ours.state_dict().items():
        np.testing.assert_array_equal(np.asarray(v._data), before[k], err_msg=k)


def test_load_non_strict_result_matches_torch():
    ours, theirs = _build_tree(*OURS), _build_tree(*THEIRS)
    tres = theirs.load_state_dict(_bad_state(theirs.state_dict(), torch), strict=False)
    res = ours.load_state_dict(_bad_state(ours.state_dict(), mt), strict=False)
    assert res.missing_keys == tres.missing_keys
    assert res.unexpected_keys == tres.unexpected_keys
    assert repr(res) == repr(tres)
    missing, unexpected = res  # unpacks like the namedtuple it is
    assert (missing, unexpected) == (tres.missing_keys, tres.unexpected_keys)
    ok = _build_tree(*OURS).load_state_dict(ours.state_dict())
    tok = _build_tree(*THEIRS).load_state_dict(theirs.state_dict())
    assert repr(ok) == repr(tok) == "<All keys matched successfully>"


def test_load_accepts_torch_values_and_casts_like_torch():
    theirs = _build_block(*THEIRS).double()
    ours = _build_block(*OURS)  # float32: values are cast to each tensor's own dtype
    ours.load_state_dict(theirs.state_dict())
    assert ours.fc.weight.dtype == mt.float32
    np.testing.assert_allclose(np.asarray(ours.fc.weight._data),
                               theirs.fc.weight.detach().numpy().astype(np.float32))


# --------------------------------------------------------------------------------------------
# Hooks


def _hook_log(lnn, fail: str = ""):
    """Register a mix of hooks on a small module and return (module, log list)."""

    class Add(lnn.Module):
        def forward(self, x, y=0):
            log.append(("forward", x, y))
            if fail == "forward":
                raise ValueError("forward failed")
            return x + y

    log: list = []
    m = Add()
    m.register_forward_pre_hook(lambda mod, args: log.append("pre1"))
    m.register_forward_pre_hook(lambda mod, args: (args[0] * 10,))
    m.register_forward_pre_hook(lambda mod, args: log.append("pre0"), prepend=True)
    m.register_forward_pre_hook(
        lambda mod, args, kw: (args, {"y": kw.get("y", 0) + 1}), with_kwargs=True)
    m.register_forward_hook(lambda mod, args, out: log.append(("post1", args, out)))
    m.register_forward_hook(lambda mod, args, out: out * 2)
    m.register_forward_hook(lambda mod, args, kw, out: log.append(("kw", kw, out)),
                            with_kwargs=True)
    m.register_forward_hook(lambda mod, args, out: log.append(("always", out)),
                            always_call=True)
    m.register_forward_hook(lambda mod, args, out: log.append(("post0", out)), prepend=True)

    def failing_post(mod, args, out):
        if fail == "hook":
            raise KeyError("hook failed")

    m.register_forward_hook(failing_post)
    m.register_forward_hook(lambda mod, args, out: log.append(("late-always", out)),
                            always_call=True)
    return m, log


@pytest.mark.parametrize("fail", ["", "forward", "hook"])
def test_forward_hook_order_and_always_call_match_torch(fail):
    ours, log = _hook_log(nn, fail)
    theirs, tlog = _hook_log(torch.nn, fail)
    if fail:
        err = ValueError if fail == "forward" else KeyError
        with pytest.raises(err):
            ours(1, y=2)
        with pytest.raises(err):
            theirs(1, y=2)
    else:
        assert ours(1, y=2) == theirs(1, y=2)
    assert log == tlog


def test_hook_handles_remove_like_torch():
    def run(lnn):
        m = lnn.Identity()
        seen = []
        h1 = m.register_forward_hook(lambda mod, a, o: seen.append("a"))
        with m.register_forward_hook(lambda mod, a, o: seen.append("b")):
            m(1)
        m(1)
        h1.remove()
        h1.remove()  # removing twice is harmless
        m(1)
        return seen

    assert run(nn) == run(torch.nn)


def test_always_call_hook_failure_is_silenced_with_a_warning():
    def run(lnn):
        class Boom(lnn.Module):
            def forward(self, x):
                raise ValueError("forward failed")

        m = Boom()

        def bad(mod, args, out):
            raise RuntimeError("hook failed too")

        m.register_forward_hook(bad, always_call=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ValueError, match="forward failed"):
                m(1)
        return len(caught)

    assert run(nn) == run(torch.nn) == 1


# --------------------------------------------------------------------------------------------
# repr, modes, lookups


class _Multi:
    """Factory of a module whose extra_repr spans two lines."""

    @staticmethod
    def build(lnn):
        class Multi(lnn.Module):
            def extra_repr(self):
                return "first=1\nsecond=2"

        class OneLine(lnn.Module):
            def extra_repr(self):
                return "k=3"

        class Outer(lnn.Module):
            def __init__(self):
                super().__init__()
                self.multi = Multi()
                self.one = OneLine()
                self.seq = lnn.Sequential(lnn.Linear(2, 3), lnn.Sequential(lnn.ReLU()))
                self.none_child = None
                self.add_module("declared", None)
                self.dict = lnn.ModuleDict({"x": OneLine()})

            def extra_repr(self):
                return "outer=True"

        return Outer()


def test_repr_of_nested_model_matches_torch():
    assert repr(_Multi.build(nn)) == repr(_Multi.build(torch.nn))
    assert repr(nn.Module()) == repr(torch.nn.Module())
    assert str(_build_tree(*OURS)) == str(_build_tree(*THEIRS)).replace("torch.", "mpitensor.")


def test_train_eval_apply_and_lookups_match_torch():
    ours, theirs = _build_tree(*OURS), _build_tree(*THEIRS)
    for mode in (False, True):
        ours.train(mode)
        theirs.train(mode)
        assert [m.training for m in ours.modules()] == [m.training for m in theirs.modules()]
    ours.eval()
    theirs.eval()
    assert not any(m.training for m in ours.modules())
    seen, tseen = [], []
    ours.apply(lambda m: seen.append(type(m).__name__))
    theirs.apply(lambda m: tseen.append(type(m).__name__))
    assert seen == tseen
    for path in ("", "body", "head.1", "table.a"):
        assert type(ours.get_submodule(path)).__name__ == type(theirs.get_submodule(path)).__name__
    assert ours.get_parameter("table.a.bias") is ours.body.gain
    assert ours.get_buffer("body.scratch") is ours.body.scratch
    for call, arg in ((ours.get_submodule, "body.nope"), (ours.get_parameter, "body.running"),
                      (ours.get_buffer, "body.gain"), (ours.get_submodule, "body.gain")):
        with pytest.raises(AttributeError):
            call(arg)
    for call, arg in ((theirs.get_submodule, "body.nope"), (theirs.get_parameter,
                      "body.running"), (theirs.get_buffer, "body.gain"),
                      (theirs.get_submodule, "body.gain")):
        with pytest.raises(AttributeError):
            call(arg)


def test_to_dtype_and_zero_grad_match_torch():
    ours, theirs = _build_tree(*OURS), _build_tree(*THEIRS)
    ours.to(mt.float64)
    theirs.to(torch.float64)
    assert ([str(v.dtype).replace("torch.", "") for v in theirs.state_dict().values()]
            == [str(v.dtype) for v in ours.state_dict().values()])
    for m, lib in ((ours, mt), (theirs, torch)):
        for p in m.parameters():
            p.grad = lib.ones(*p.shape, dtype=p.dtype)
        m.zero_grad(set_to_none=False)
    assert ([float(p.grad.sum()) for p in ours.parameters()]
            == [float(p.grad.sum()) for p in theirs.parameters()])
    ours.zero_grad()
    theirs.zero_grad()
    assert [p.grad is None for p in ours.parameters()] == [p.grad is None
                                                           for p in theirs.parameters()]


def test_registration_errors_raise_the_same_types_as_torch():
    cases = [
        lambda lib, lnn, m: m.register_parameter("a.b", lnn.Parameter(lib.zeros(1))),
        lambda lib, lnn, m: m.register_buffer("", lib.zeros(1)),
        lambda lib, lnn, m: m.register_parameter("w", lib.zeros(1)),
        lambda lib, lnn, m: m.add_module("x", 3),
        lambda lib, lnn, m: m.register_buffer("b", np.zeros(1)),
        lambda lib, lnn, m: m.register_buffer("training", lib.zeros(1)),
        lambda lib, lnn, m: setattr(m, "w", lib.zeros(1)),
        lambda lib, lnn, m: setattr(m, "w", lnn.ReLU()),
        lambda lib, lnn, m: setattr(m, "sub", lib.zeros(1)),
        lambda lib, lnn, m: setattr(m, "buf", 3.0),
        lambda lib, lnn, m: m.train("yes"),
        lambda lib, lnn, m: m.load_state_dict([1, 2]),
    ]

    def outcome(lib, lnn, case):
        m = lnn.Module()
        m.w = lnn.Parameter(lib.zeros(1))
        m.sub = lnn.ReLU()
        m.register_buffer("buf", lib.zeros(1))
        try:
            case(lib, lnn, m)
        except Exception as exc:  # noqa: BLE001 - the type is what is compared
            return type(exc)
        return None

    for i, case in enumerate(cases):
        assert outcome(mt, nn, case) is outcome(torch, torch.nn, case), i


# --------------------------------------------------------------------------------------------
# Parameter


def test_parameter_copy_pickle_and_repr_match_torch():
    values = [[0.5, -1.0], [2.0, 3.0]]
    ours = nn.Parameter(mt.tensor(values))
    theirs = torch.nn.Parameter(torch.tensor(values))
    frozen = nn.Parameter(mt.tensor(values), requires_grad=False)
    tfrozen = torch.nn.Parameter(torch.tensor(values), requires_grad=False)
    assert repr(ours) == repr(theirs) and repr(frozen) == repr(tfrozen)
    assert (ours.requires_grad, ours.is_leaf) == (theirs.requires_grad, theirs.is_leaf)
    for p, tp in ((ours, theirs), (frozen, tfrozen)):
        back, tback = pickle.loads(pickle.dumps(p)), pickle.loads(pickle.dumps(tp))
        assert type(back) is nn.Parameter and type(tback) is torch.nn.Parameter
        assert back.requires_grad == tback.requires_grad
        np.testing.assert_array_equal(np.asarray(back._data), tback.detach().numpy())
    ours.grad = mt.ones(2, 2)
    theirs.grad = torch.ones(2, 2)
    # neither framework carries a gradient through a pickle
    assert pickle.loads(pickle.dumps(ours)).grad is None
    assert pickle.loads(pickle.dumps(theirs)).grad is None
    twin = copy.deepcopy(ours)
    assert type(twin) is nn.Parameter and twin is not ours and twin.requires_grad
    assert twin._data is not ours._data
    np.testing.assert_array_equal(np.asarray(twin._data), np.asarray(ours._data))
    # a Parameter made from a Parameter or a non-leaf result is a fresh leaf in both
    x = mt.ones(2, requires_grad=True) * 2
    tx = torch.ones(2, requires_grad=True) * 2
    p, tp = nn.Parameter(x), torch.nn.Parameter(tx)
    assert (p.is_leaf, p.grad_fn is None) == (tp.is_leaf, tp.grad_fn is None)
    empty, tempty = nn.Parameter(), torch.nn.Parameter()
    assert tuple(empty.shape) == tuple(tempty.shape)
