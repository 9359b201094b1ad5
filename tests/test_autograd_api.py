"""The autograd API programs call beside backward(): autograd.grad, Variable, anomaly mode,
gradcheck and autograd.functional. Each program runs under mpitensor and, where torch is
installed, under torch as the oracle: the same program, the same values."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor as mt

try:
    import torch
except ImportError:  # the oracle half of each comparison is skipped, not the test
    torch = None

LIBS = [mt] + ([torch] if torch is not None else [])


def _np(t):
    return None if t is None else np.asarray(t.detach().numpy())


def _both(program):
    """Run ``program(T)`` under each library; return mpitensor's result and torch's (or None)."""
    results = [program(T) for T in LIBS]
    return results[0], (results[1] if len(results) > 1 else None)


def _same(a, b, rtol=0.0, atol=0.0):
    """Nested results equal (float64 programs: a few ulps apart at most)."""
    if b is None:
        return
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y, rtol, atol)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k], rtol, atol)
    elif a is None or isinstance(a, (bool, str, int)):
        assert a == b
    else:
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------ autograd.grad


def leaves_program(T):
    x = T.tensor([1.0, -2.0, 3.0], dtype=T.float64, requires_grad=True)
    w = T.tensor([[0.5, 1.0], [2.0, -1.0], [0.25, 4.0]], dtype=T.float64, requires_grad=True)
    y = x @ w                      # two outputs of two inputs
    z = (x * x).sum()
    gy = T.tensor([1.0, -3.0], dtype=T.float64)
    gx, gw = T.autograd.grad([y, z], [x, w], grad_outputs=[gy, None])
    return _np(gx), _np(gw), x.grad is None, w.grad is None


def test_grad_of_leaves_several_outputs_and_inputs():
    mine, oracle = _both(leaves_program)
    gx, gw, x_untouched, w_untouched = mine
    x = np.array([1.0, -2.0, 3.0])
    w = np.array([[0.5, 1.0], [2.0, -1.0], [0.25, 4.0]])
    gy = np.array([1.0, -3.0])
    np.testing.assert_array_equal(gx, w @ gy + 2 * x)
    np.testing.assert_array_equal(gw, np.outer(x, gy))
    assert x_untouched and w_untouched
    _same(mine, oracle)


def hooks_program(T):
    x = T.tensor([1.0, 2.0], dtype=T.float64, requires_grad=True)
    seen = []
    x.register_hook(lambda g: g * 10)                       # runs, as in torch
    x.register_post_accumulate_grad_hook(lambda t: seen.append("post"))  # does not
    h = x * 3
    h.register_hook(lambda g: g * 100)
    y = (h * h).sum()
    both = T.autograd.grad(y, [x, h], retain_graph=True)
    only_h = T.autograd.grad(y, h, retain_graph=True)
    only_x = T.autograd.grad(y, x)
    return [_np(g) for g in both], _np(only_h[0]), _np(only_x[0]), seen, x.grad is None


def test_grad_of_non_leaves_and_hooks():
    mine, oracle = _both(hooks_program)
    both, only_h, only_x, seen, untouched = mine
    # y = sum(h^2), h = 3x: dy/dh = 2h, then x100 (h's hook) and x10 (x's hook) on the way;
    # as torch, h's hook is in its captured gradient only when the pass stops at h
    np.testing.assert_array_equal(both[1], [6.0, 12.0])
    np.testing.assert_array_equal(only_h, [600.0, 1200.0])
    np.testing.assert_array_equal(both[0], np.array([6.0, 12.0]) * 100 * 3 * 10)
    np.testing.assert_array_equal(only_x, both[0])
    assert seen == [] and untouched
    _same(mine, oracle)


def unused_program(T):
    x = T.tensor([1.0, 2.0], requires_grad=True)
    u = T.tensor([5.0], requires_grad=True)
    y = (x * 2).sum()
    out = {}
    try:
        T.autograd.grad(y, [x, u], retain_graph=True)
    except RuntimeError:
        out["raises"] = True
    out["none"] = T.autograd.grad(y, [x, u], retain_graph=True, allow_unused=True)[1] is None
    out["zeros"] = _np(T.autograd.grad(y, [x, u], retain_graph=True,
                                       materialize_grads=True)[1])
    try:
        T.autograd.grad(y, [x, u], allow_unused=False, materialize_grads=True)
    except ValueError:
        out["both_refused"] = True
    return out


def test_allow_unused_and_materialize_grads():
    mine, oracle = _both(unused_program)
    assert mine["raises"] and mine["none"] and mine["both_refused"]
    np.testing.assert_array_equal(mine["zeros"], [0.0])
    _same(mine, oracle)


def retain_program(T):
    x = T.tensor([0.5, 1.5], dtype=T.float64, requires_grad=True)
    y = (x.exp() * x).sum()
    first = T.autograd.grad(y, x, retain_graph=True)[0]
    second = T.autograd.grad(y, x)[0]           # the graph is released after this one
    try:
        T.autograd.grad(y, x)
        third = "ran"
    except RuntimeError:
        third = "refused"
    # a pass that stops at a non-leaf leaves the graph below it alone
    z = x.sin()
    s = (z * z).sum()
    gz = T.autograd.grad(s, z)[0]
    gx = T.autograd.grad(z.sum(), x)[0]
    return _np(first), _np(second), third, _np(gz), _np(gx)


def test_retain_graph_rules():
    mine, oracle = _both(retain_program)
    first, second, third, gz, gx = mine
    x = np.array([0.5, 1.5])
    np.testing.assert_allclose(first, np.exp(x) * (1 + x), rtol=4e-16)
    np.testing.assert_array_equal(first, second)
    assert third == "refused"
    np.testing.assert_array_equal(gz, 2 * np.sin(x))
    np.testing.assert_array_equal(gx, np.cos(x))
    _same(mine, oracle, rtol=4e-16)


def test_create_graph_refused_clearly():
    x = mt.tensor([1.0], requires_grad=True)
    with pytest.raises(NotImplementedError, match="create_graph=True.*higher-order"):
        mt.autograd.grad((x * x).sum(), x, create_graph=True)


def test_inputs_must_require_grad_and_dict_inputs():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    c = mt.tensor([3.0, 4.0])
    with pytest.raises(RuntimeError, match="input 1 of grad.. does not require grad"):
        mt.autograd.grad((x * c).sum(), [x, c])
    y = (x * c).sum()
    out = mt.autograd.grad(y, {"x": x})
    assert list(out) == ["x"] and out["x"].tolist() == [3.0, 4.0]


def batched_program(T):
    x = T.tensor([1.0, 2.0, 3.0], dtype=T.float64, requires_grad=True)
    y = x * x
    eye = T.eye(3, dtype=T.float64)
    (jac,) = T.autograd.grad(y, x, eye, is_grads_batched=True)
    return _np(jac)


def test_is_grads_batched_gives_the_jacobian():
    mine, oracle = _both(batched_program)
    np.testing.assert_array_equal(mine, np.diag([2.0, 4.0, 6.0]))
    _same(mine, oracle)


def test_variable_is_a_tensor():
    base = mt.tensor([1.0, 2.0], requires_grad=True)
    v = mt.autograd.Variable(base)
    assert isinstance(v, mt.Tensor) and isinstance(base, mt.autograd.Variable)
    assert not v.requires_grad and v is not base
    w = mt.autograd.Variable(mt.ones(2), requires_grad=True)
    (w * 2).sum().backward()
    assert w.is_leaf and w.grad.tolist() == [2.0, 2.0]
    with pytest.raises(TypeError):
        mt.autograd.Variable([1.0])


# ------------------------------------------------------------------------------ anomaly mode


def nan_program(T, kind):
    x = T.tensor([0.0, 1.0], requires_grad=True)
    if kind == "sqrt":
        y = (T.sqrt(x) * 0).sum()     # d sqrt / dx at 0 is inf, times 0: NaN
    else:
        y = (x / x).sum()             # 0/0 in forward and backward
    with T.autograd.set_detect_anomaly(True):
        try:
            y.backward()
        except RuntimeError as e:
            return str(e)
    return "no error"


@pytest.mark.parametrize("kind, node, which", [("sqrt", "SqrtBackward", "0th"),
                                               ("div", "DivBackward", "1th")])
def test_anomaly_mode_names_the_node(kind, node, which):
    # x / x at 0: the numerator's gradient 1/x is inf, the denominator's -x/x^2 is NaN
    message = nan_program(mt, kind)
    assert f"{node} returned nan values in its {which} output" in message
    if torch is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = nan_program(torch, kind)
        assert f"{node}0' returned nan values in its {which} output" in theirs


def test_anomaly_mode_shows_the_forward_call_and_is_off_by_default():
    assert not mt.autograd.is_anomaly_enabled()
    x = mt.tensor([0.0], requires_grad=True)
    (mt.sqrt(x) * 0).sum().backward()          # off: the NaN goes into .grad silently
    assert np.isnan(x.grad.numpy()).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mt.autograd.detect_anomaly():
            assert mt.autograd.is_anomaly_enabled()
            y = mt.sqrt(x)                       # the line the message must point at
            with pytest.raises(RuntimeError) as err:
                (y * 0).sum().backward()
    assert not mt.autograd.is_anomaly_enabled()
    assert "test_autograd_api.py" in str(err.value) and "y = mt.sqrt(x)" in str(err.value)
    assert not hasattr(mt.sqrt(x).grad_fn, "forward_stack")    # nothing recorded when off


def test_anomaly_decorator_and_check_nan_off():
    @mt.autograd.detect_anomaly(check_nan=False)
    def run():
        x = mt.tensor([0.0], requires_grad=True)
        (mt.sqrt(x) * 0).sum().backward()
        return mt.autograd.is_anomaly_enabled(), x.grad

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on, g = run()
    assert on and np.isnan(g.numpy()).all() and not mt.autograd.is_anomaly_enabled()
    mt.autograd.set_detect_anomaly(True)
    try:
        assert mt.autograd.is_anomaly_check_nan_enabled()
    finally:
        mt.autograd.set_detect_anomaly(False)
    assert not mt.autograd.is_anomaly_enabled()


# ------------------------------------------------------------------------------ gradcheck


def _dbl(T, *shape, seed):
    rng = np.random.default_rng(seed)
    return T.tensor(rng.standard_normal(shape), dtype=T.float64, requires_grad=True)


CHECKED = {
    "matmul": (lambda T: (lambda a, b: a @ b), [(3, 4), (4, 2)]),
    "conv2d": (lambda T: (lambda x, w, b: T.nn.functional.conv2d(x, w, b, padding=1)),
               [(1, 2, 4, 4), (3, 2, 3, 3), (3,)]),
    "softmax": (lambda T: (lambda x: T.softmax(x, dim=1)), [(2, 5)]),
    "layer_norm": (lambda T: (lambda x, w, b: T.nn.functional.layer_norm(x, (4,), w, b)),
                   [(3, 4), (4,), (4,)]),
}


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_gradcheck_passes_on_correct_ops(name):
    make, shapes = CHECKED[name]
    for T in LIBS:
        inputs = tuple(_dbl(T, *s, seed=i) for i, s in enumerate(shapes))
        assert T.autograd.gradcheck(make(T), inputs) is True


def wrong_function(T):
    class WrongSquare(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 3 * x          # should be 2x

    return WrongSquare.apply


def test_gradcheck_fails_on_a_wrong_backward():
    x = _dbl(mt, 3, seed=7)
    with pytest.raises(mt.autograd.GradcheckError, match="output 0 with respect to input 0"):
        mt.autograd.gradcheck(wrong_function(mt), (x,))
    assert issubclass(mt.autograd.GradcheckError, RuntimeError)
    assert mt.autograd.gradcheck(wrong_function(mt), (x,), raise_exception=False) is False
    assert mt.autograd.gradcheck(lambda t: t * t, x, check_batched_grad=True,
                                 check_grad_dtypes=True)
    if torch is not None:
        assert torch.autograd.gradcheck(wrong_function(torch), (_dbl(torch, 3, seed=7),),
                                        raise_exception=False) is False


def test_gradgradcheck_and_second_order_refused():
    x = _dbl(mt, 2, seed=1)
    with pytest.raises(NotImplementedError, match="double backward"):
        mt.autograd.gradgradcheck(lambda t: t * t, (x,))
    for fn in (mt.autograd.functional.hessian, mt.autograd.functional.hvp,
               mt.autograd.functional.vhp):
        with pytest.raises(NotImplementedError, match="double backward"):
            fn(lambda t: (t * t).sum(), x) if fn is mt.autograd.functional.hessian else \
                fn(lambda t: (t * t).sum(), x, mt.ones(2, dtype=mt.float64))


# ------------------------------------------------------------------------------ functional


def functional_program(T):
    F = T.autograd.functional
    a = T.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=T.float64)
    b = T.tensor([0.3, -0.7], dtype=T.float64)

    def two_in_two_out(x, y):
        return (x * y).sin(), x.exp().sum()

    out = {
        "one": _np(F.jacobian(lambda x: x.tanh() * 2, a)),
        "tuple": [[_np(j) for j in row] for row in F.jacobian(two_in_two_out, (a[0], b))],
        "in_tuple": [_np(j) for j in F.jacobian(lambda x, y: x @ y, (a, b))],
    }
    v, g = F.vjp(lambda x: x * x, b, T.tensor([1.0, 2.0], dtype=T.float64))
    out["vjp"] = (_np(v), _np(g))
    v, g = F.jvp(two_in_two_out, (a[0], b), (b, a[1]))
    out["jvp"] = ([_np(t) for t in v], [_np(t) for t in g])
    out["vjp_scalar"] = _np(F.vjp(lambda x: (x ** 3).sum(), b)[1])
    return out


def test_jacobian_vjp_jvp_equal_torch():
    mine, oracle = _both(functional_program)
    a = np.array([[1.0, 2.0], [0.5, -1.0]])
    np.testing.assert_allclose(mine["one"].reshape(4, 4),
                               np.diag(2 * (1 - np.tanh(a.ravel()) ** 2)), rtol=1e-15)
    np.testing.assert_array_equal(mine["vjp"][1], [0.6, -2.8])
    np.testing.assert_allclose(mine["vjp_scalar"], 3 * np.array([0.3, -0.7]) ** 2, rtol=1e-15)
    _same(mine, oracle, rtol=1e-14, atol=1e-15)


def test_jacobian_strict_and_zeros():
    x = mt.tensor([1.0, 2.0], dtype=mt.float64)
    j = mt.autograd.functional.jacobian(lambda t: mt.ones(3, dtype=mt.float64), x)
    assert tuple(j.shape) == (3, 2) and not j.numpy().any()
    with pytest.raises(RuntimeError, match="does not depend on input 0"):
        mt.autograd.functional.jacobian(lambda t: mt.ones(3, dtype=mt.float64), x, strict=True)
    with pytest.raises(NotImplementedError, match="create_graph"):
        mt.autograd.functional.jacobian(lambda t: t, x, create_graph=True)
