"""torch.autograd.Function written the way torch programs write it (forward and backward on
Tensors), each case run under mpitensor and, where torch is installed, under torch as the
oracle: the same program, the same values."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt

try:
    import torch
except ImportError:  # the oracle half of each comparison is skipped, not the test
    torch = None



def _np(t):
    return None if t is None else np.asarray(t.detach().numpy())


def relu_program(T):
    class MyReLU(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.clamp(min=0)

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            g = grad_output.clone()
            g[x < 0] = 0
            return g

    x = T.tensor([-1.5, 0.5, 2.0, -0.25], requires_grad=True)
    y = MyReLU.apply(x)
    (y * T.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    return [_np(y), _np(x.grad), y.grad_fn.name()]


def two_outputs_program(T, materialize=True):
    seen = {}

    class ProdSum(T.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, k):
            ctx.k = k
            ctx.set_materialize_grads(materialize)
            ctx.save_for_backward(a, b)
            return a * b * k, a + b

        @staticmethod
        def backward(ctx, g_prod, g_sum):
            seen["none"] = (g_prod is None, g_sum is None)
            a, b = ctx.saved_tensors
            ga = g_prod * b * ctx.k if g_prod is not None else T.zeros_like(a)
            gb = g_prod * a * ctx.k if g_prod is not None else T.zeros_like(b)
            if g_sum is not None:
                ga, gb = ga + g_sum, gb + g_sum
            return ga, gb, None

    a = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = T.tensor([0.5, -1.0, 4.0], requires_grad=True)
    p, s = ProdSum.apply(a, b, 2.0)
    (p.sum() + 3 * (s * s).sum()).backward()
    out = [_np(p), _np(s), _np(a.grad), _np(b.grad)]
    a.grad = b.grad = None
    p, s = ProdSum.apply(a, b, 2.0)
    s.sum().backward()  # p gets no gradient: zeros, or None without materializing
    return out + [_np(a.grad), _np(b.grad), seen["none"]]


def sort_program(T):
    class Sort(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            values, idx = x.sort()
            ctx.mark_non_differentiable(idx)
            ctx.save_for_backward(idx)
            return values, idx

        @staticmethod
        def backward(ctx, g_values, g_idx):
            (idx,) = ctx.saved_tensors
            g = T.zeros_like(g_values)
            g[idx] = g_values
            return g

    x = T.tensor([3.0, 1.0, 2.0], requires_grad=True)
    v, i = Sort.apply(x)
    (v * T.tensor([1.0, 10.0, 100.0])).sum().backward()
    return [_np(v), _np(i), i.requires_grad, v.requires_grad, _np(x.grad)]


def dirty_program(T):
    class Double_(T.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x.mul_(2)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    a = T.tensor([1.0, -2.0], requires_grad=True)
    x = a * 3
    y = Double_.apply(x)
    (y * y).sum().backward()
    return [_np(y), y is x, _np(a.grad)]


def new_style_program(T):
    class Cube(T.autograd.Function):
        @staticmethod
        def forward(x, scale):
            return x ** 3 * scale

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, scale = inputs
            ctx.save_for_backward(x)
            ctx.scale = scale

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * x ** 2 * ctx.scale * g, None

    x = T.tensor([1.0, -2.0, 0.5], requires_grad=True)
    Cube.apply(x, 2.0).sum().backward()
    return [_np(x.grad)]


def broadcast_and_needs_program(T):
    needs = []

    class AddBias(T.autograd.Function):
        @staticmethod
        def forward(ctx, x, bias, w):
            needs.append(tuple(ctx.needs_input_grad))
            return x + bias * w

        @staticmethod
        @T.autograd.function.once_differentiable
        def backward(ctx, g):
            return g, g * 1.0, None  # bias's gradient comes back at x's shape: summed to (3,)

    x = T.ones(4, 3, requires_grad=True)
    bias = T.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = T.tensor(2.0)
    y = AddBias.apply(x, bias, w)
    (y * T.arange(12.0).reshape(4, 3)).sum().backward()
    with T.no_grad():
        z = AddBias.apply(x, bias, w)
    return [_np(x.grad), _np(bias.grad), needs, z.requires_grad, z.grad_fn is None]


def gradient_reversal_program(T):
    class Reverse(T.autograd.Function):
        @staticmethod
        def forward(ctx, x, lam):
            ctx.lam = lam
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g.neg() * ctx.lam, None

    T.manual_seed(0)
    w1 = T.tensor([[0.5, -0.25], [0.75, 1.0], [-0.5, 0.25]], requires_grad=True)
    w2 = T.tensor([[1.0, -1.0, 0.5]], requires_grad=True)
    x = T.tensor([[1.0, 2.0], [-1.0, 0.5]])
    h = T.tanh(x @ w1.T)
    out = Reverse.apply(h, 0.5) @ w2.T
    loss = ((out - 1.0) ** 2).mean()
    loss.backward()
    return [_np(loss), _np(w1.grad), _np(w2.grad)]


PROGRAMS = [relu_program, two_outputs_program,
            lambda T: two_outputs_program(T, materialize=False), sort_program, dirty_program,
            new_style_program, broadcast_and_needs_program, gradient_reversal_program]


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                   rtol=1e-6, atol=1e-7)
    elif isinstance(a, (list, tuple)) and not isinstance(a, str):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b, (a, b)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: getattr(p, "__name__", "prog"))
def test_same_values_as_torch(program):
    ours = program(mt)
    if torch is None:
        pytest.skip("torch not installed: the oracle comparison is skipped (values below)")
    _same(ours, program(torch))


def test_values_without_the_oracle():
    """The same programs' results, written out (so the file asserts values without torch)."""
    y, g, name = relu_program(mt)
    np.testing.assert_array_equal(y, [0, 0.5, 2, 0])
    np.testing.assert_array_equal(g, [0, 2, 3, 0])
    assert name == "MyReLUBackward"
    p, s, ga, gb, ga2, gb2, none = two_outputs_program(mt)
    np.testing.assert_array_equal(p, [1, -4, 24])
    np.testing.assert_array_equal(ga, 2 * np.array([0.5, -1, 4]) + 6 * np.array([1.5, 1, 7]))
    np.testing.assert_array_equal(ga2, [1, 1, 1])
    assert none == (False, False)
    assert two_outputs_program(mt, materialize=False)[-1] == (True, False)
    v, i, i_rg, v_rg, gx = sort_program(mt)
    np.testing.assert_array_equal(i, [1, 2, 0])
    assert not i_rg and v_rg
    np.testing.assert_array_equal(gx, [100, 1, 10])
    y, same, ga = dirty_program(mt)
    np.testing.assert_array_equal(y, [6, -12])
    assert same
    np.testing.assert_array_equal(ga, 2 * np.array([6, -12]) * 2 * 3)
    np.testing.assert_array_equal(new_style_program(mt)[0], [6, 24, 1.5])
    gx, gb, needs, z_rg, no_fn = broadcast_and_needs_program(mt)
    np.testing.assert_array_equal(gb, np.arange(12.0).reshape(4, 3).sum(0))
    assert needs == [(True, True, False)] * 2 and not z_rg and no_fn


class _Keep(mt.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 2


def test_saved_tensor_changed_in_place_is_refused():
    a = mt.tensor([1.0, 2.0], requires_grad=True)
    x = a * 1
    y = _Keep.apply(x)
    x.add_(1)
    with pytest.raises(RuntimeError, match="modified in place"):
        y.sum().backward()


def test_second_backward_needs_retain_graph():
    a = mt.tensor([1.0, 2.0], requires_grad=True)
    y = _Keep.apply(a)
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [4, 4])
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.sum().backward()


def _function(name, forward, backward=None):
    """A custom Function class from two plain functions (forward(ctx, ...), backward(ctx, g))."""
    body = {"forward": staticmethod(forward)}
    if backward is not None:
        body["backward"] = staticmethod(backward)
    return type(name, (mt.autograd.Function,), body)


def _save_int(ctx, x):
    ctx.save_for_backward(x, 3)
    return x


def _dirty_add(ctx, x):
    ctx.mark_dirty(x)
    return x.add_(1)


def test_bad_backward_results_and_saves():
    too_few = _function("TooFew", lambda ctx, x, y: x + y, lambda ctx, g: g)
    bad_shape = _function("BadShape", lambda ctx, x: x * 1, lambda ctx, g: mt.ones(5))
    saves_int = _function("SavesInt", _save_int)
    x = mt.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="returned 1 gradients, but forward took 2"):
        too_few.apply(x, x * 1).sum().backward()
    with pytest.raises(RuntimeError, match="shape"):
        bad_shape.apply(x).sum().backward()
    with pytest.raises(TypeError, match="argument 1 is a int"):
        saves_int.apply(x)


def test_dirty_leaf_is_refused_and_an_input_returned_stays_untouched():
    Inplace = _function("Inplace", _dirty_add, lambda ctx, g: g)  # noqa: N806 - a class
    Same = _function("Same", lambda ctx, x: x, lambda ctx, g: 3 * g)  # noqa: N806 - a class

    leaf = mt.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor"):
        Inplace.apply(leaf)
    a = mt.tensor([1.0, 2.0], requires_grad=True)
    y = Same.apply(a)
    assert y is not a and a.grad_fn is None and y.grad_fn is not None
    y.sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [3, 3])


def test_a_module_built_on_a_custom_function_trains():
    """A user's layer (a straight-through rounding) inside nn.Module, with an optimizer."""
    class RoundSTE(mt.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.round()

        @staticmethod
        def backward(ctx, g):
            return g

    class Net(mt.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = mt.nn.Linear(3, 1)

        def forward(self, x):
            return RoundSTE.apply(self.fc(x) * 4) / 4

    mt.manual_seed(0)
    net = Net()
    opt = mt.optim.SGD(net.parameters(), lr=0.05)
    x = mt.tensor([[1.0, 0.0, 2.0], [0.5, 1.0, -1.0]])
    target = mt.tensor([[1.0], [-0.5]])
    w0 = net.fc.weight.detach().clone()
    loss = ((net(x) - target) ** 2).mean()
    loss.backward()
    # the straight-through gradient: d/dw of ((fc(x)*4 rounded)/4 - t)^2 with round's grad 1
    r = (np.round((x.numpy() @ w0.numpy().T + net.fc.bias.detach().numpy()) * 4) / 4
         - target.numpy())
    np.testing.assert_allclose(net.fc.weight.grad.numpy(), (2 * r * x.numpy()).mean(0,
                               keepdims=True), rtol=1e-6)
    opt.step()
    assert not np.array_equal(net.fc.weight.detach().numpy(), w0.numpy())


def test_saved_tensors_belong_to_the_node_and_go_after_backward():
    """What save_for_backward keeps is released with the graph after backward (the engine
    empties the node), and a ctx that saved nothing has no saved tensors."""
    class Plain(mt.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            assert ctx.saved_tensors == ()
            return g * 2

    a = mt.ones(3, requires_grad=True)
    y = _Keep.apply(a * 1)
    node = y.grad_fn
    assert len(node.saved) == 1
    y.sum().backward()
    assert node.saved == () and node.released
    Plain.apply(a).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [4.0, 4.0, 4.0])  # 2 from each
