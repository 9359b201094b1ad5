"""Autograd on mpitensor.Tensor: every differentiable op against finite differences, plus the
engine's behaviour (hooks, grad mode, retain_graph, in-place rules, .data/detach).

Gradients are checked in float64 by central differences on a random projection of the output
(``sum(w * f(x))``), element by element of every input. Parity tests against PyTorch run only
where torch is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import backend

RNG = np.random.default_rng(1234)


def rand(*shape, low=-2.0, high=2.0):
    return RNG.uniform(low, high, size=shape)


def pos(*shape):
    return RNG.uniform(0.5, 2.0, size=shape)


def away(*shape):
    """Values with |v| in [0.3, 2] (no kink of abs/relu/max nearby)."""
    v = RNG.uniform(0.3, 2.0, size=shape)
    return v * RNG.choice([-1.0, 1.0], size=shape)


def gradcheck(fn, *inputs, eps=1e-6, rtol=1e-6, atol=1e-8):
    """Compare autograd's gradient of ``sum(w * fn(*inputs))`` with central differences."""
    leaves = [mt.tensor(x.copy(), dtype=mt.float64, requires_grad=True) for x in inputs]
    out = fn(*leaves)
    assert out.requires_grad and out.grad_fn is not None
    w = np.random.default_rng(7).standard_normal(tuple(out.shape))
    (out * mt.tensor(w)).sum().backward()

    def f(arrays):
        with mt.no_grad():
            r = fn(*[mt.tensor(a, dtype=mt.float64) for a in arrays])
        return float((r.numpy() * w).sum())

    for i, x in enumerate(inputs):
        num = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            hi = [a.copy() for a in inputs]
            lo = [a.copy() for a in inputs]
            hi[i][idx] += eps
            lo[i][idx] -= eps
            num[idx] = (f(hi) - f(lo)) / (2 * eps)
        g = leaves[i].grad
        assert g is not None, f"input {i} got no gradient"
        assert g.dtype == mt.float64 and tuple(g.shape) == x.shape
        np.testing.assert_allclose(g.numpy(), num, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i}")


# --------------------------------------------------------------------------------------------
# every op against finite differences

CASES = {
    # arithmetic with broadcasting, scalars, reflected forms, ndarray operands
    "add": (lambda x, y: x + y, [rand(3, 4), rand(4)]),
    "add_col_row": (lambda x, y: x + y, [rand(3, 1), rand(1, 4)]),
    "add_scalar": (lambda x: x + 2.5, [rand(3)]),
    "radd_scalar": (lambda x: 2.5 + x, [rand(3)]),
    "add_ndarray": (lambda x: x + np.arange(4.0), [rand(2, 4)]),
    "radd_ndarray": (lambda x: np.arange(4.0) + x, [rand(2, 4)]),
    "add_alpha": (lambda x, y: x.add(y, alpha=3), [rand(3), rand(3)]),
    "sub": (lambda x, y: x - y, [rand(2, 3, 4), rand(3, 1)]),
    "rsub_scalar": (lambda x: 1.5 - x, [rand(3)]),
    "rsub_ndarray": (lambda x: np.ones((2, 3)) - x, [rand(3)]),
    "mul": (lambda x, y: x * y, [rand(2, 3, 4), rand(3, 1)]),
    "mul_scalar": (lambda x: x * 3 + 3 * x, [rand(3)]),
    "mul_0d": (lambda x, y: x * y, [rand(3, 2), rand()]),
    "shared_square": (lambda x: x * x, [rand(5)]),
    "used_twice": (lambda x, y: x * y + x / (y * y + 1) - x, [rand(4), rand(4)]),
    "div": (lambda x, y: x / y, [rand(3, 4), away(4)]),
    "rdiv_scalar": (lambda x: 2 / x, [away(4)]),
    "div_scalar": (lambda x: x / 3, [rand(4)]),
    "rdiv_ndarray": (lambda x: np.full(4, 3.0) / x, [away(4)]),
    "neg": (lambda x: -x, [rand(3)]),
    "pos": (lambda x: +x * 2, [rand(3)]),
    "pow_int": (lambda x: x ** 3, [rand(4)]),
    "pow_two": (lambda x: x ** 2, [rand(4)]),
    "pow_float": (lambda x: x ** 0.5, [pos(4)]),
    "pow_negative": (lambda x: x ** -1.5, [pos(4)]),
    "rpow_scalar": (lambda x: 2 ** x, [rand(4)]),
    "pow_tensor": (lambda x, y: x ** y, [pos(3, 2), rand(2)]),
    "remainder": (lambda x, y: x % y, [rand(5) + 10, np.full(5, 3.0)]),
    "maximum": (lambda x, y: x.max(y), [away(5), away(5)]),
    "minimum": (lambda x, y: x.min(y), [away(2, 3), away(3)]),
    # matmul
    "dot_1d": (lambda x, y: x @ y, [rand(4), rand(4)]),
    "mm": (lambda x, y: x @ y, [rand(3, 4), rand(4, 2)]),
    "bmm": (lambda x, y: x @ y, [rand(2, 3, 4), rand(2, 4, 5)]),
    "matmul_batch_broadcast": (lambda x, y: x.matmul(y), [rand(2, 1, 3, 4), rand(3, 4, 2)]),
    "vec_mat": (lambda x, y: x @ y, [rand(4), rand(4, 3)]),
    "mat_vec": (lambda x, y: x @ y, [rand(3, 4), rand(4)]),
    "vec_batch": (lambda x, y: x @ y, [rand(4), rand(2, 4, 3)]),
    "batch_vec": (lambda x, y: x @ y, [rand(2, 3, 4), rand(4)]),
    "rmatmul_ndarray": (lambda x: np.ones((2, 3)) @ x, [rand(3, 4)]),
    # reductions
    "sum_all": (lambda x: x.sum(), [rand(3, 4)]),
    "sum_dim": (lambda x: x.sum(1), [rand(3, 4)]),
    "sum_neg_dim_keep": (lambda x: x.sum(-1, keepdim=True), [rand(3, 4)]),
    "sum_tuple": (lambda x: x.sum((0, 2)), [rand(2, 3, 4)]),
    "sum_tuple_keep": (lambda x: x.sum(dim=(0, 2), keepdim=True), [rand(2, 3, 4)]),
    "mean_all": (lambda x: x.mean(), [rand(3, 4)]),
    "mean_dim": (lambda x: x.mean(0), [rand(3, 4)]),
    "mean_tuple_keep": (lambda x: x.mean((1, 2), keepdim=True), [rand(2, 3, 4)]),
    "var": (lambda x: x.var(1), [rand(3, 4)]),
    "std_all": (lambda x: x.std(), [rand(3, 4)]),
    "max_all": (lambda x: x.max(), [rand(3, 4)]),
    "min_all": (lambda x: x.min(), [rand(3, 4)]),
    "max_dim": (lambda x: x.max(dim=1).values, [rand(3, 4)]),
    "max_dim_keep": (lambda x: x.max(0, keepdim=True)[0], [rand(3, 4)]),
    "min_dim": (lambda x: x.min(dim=-1).values, [rand(2, 3, 4)]),
    # shapes and views
    "reshape": (lambda x: x.reshape(4, -1), [rand(2, 6)]),
    "view": (lambda x: x.view(3, 4), [rand(2, 6)]),
    "view_as": (lambda x, y: x.view_as(y) * y, [rand(2, 6), rand(3, 4)]),
    "flatten": (lambda x: x.flatten(1), [rand(2, 3, 4)]),
    "squeeze": (lambda x: x.squeeze(), [rand(2, 1, 3)]),
    "squeeze_dim": (lambda x: x.squeeze(1), [rand(2, 1, 3)]),
    "unsqueeze": (lambda x: x.unsqueeze(-1), [rand(2, 3)]),
    "expand": (lambda x: x.expand(2, 3, 4), [rand(3, 1)]),
    "expand_as": (lambda x, y: x.expand_as(y) * y, [rand(1, 4), rand(3, 4)]),
    "repeat": (lambda x: x.repeat(2, 1, 3), [rand(3, 2)]),
    "transpose": (lambda x: x.transpose(0, 2), [rand(2, 3, 4)]),
    "permute": (lambda x: x.permute(2, 0, 1), [rand(2, 3, 4)]),
    "t": (lambda x: x.t(), [rand(2, 3)]),
    "T": (lambda x: x.T, [rand(2, 3)]),
    "mT": (lambda x: x.mT, [rand(2, 3, 4)]),
    "contiguous": (lambda x: x.t().contiguous(), [rand(2, 3)]),
    "clone": (lambda x: x.clone() * x, [rand(2, 3)]),
    "split": (lambda x: x.split([1, 3], dim=1)[1] * 2, [rand(2, 4)]),
    "chunk": (lambda x: x.chunk(2)[0] - x.chunk(2)[1], [rand(4, 3)]),
    "unbind": (lambda x: x.unbind(1)[2] * x.unbind(1)[0], [rand(2, 3)]),
    "iter": (lambda x: sum(row * (i + 1) for i, row in enumerate(x)), [rand(3, 2)]),
    # indexing
    "index_int": (lambda x: x[1], [rand(3, 4)]),
    "index_element": (lambda x: x[1, 2] * x[0, 0], [rand(3, 4)]),
    "index_slices": (lambda x: x[1:, ::2], [rand(3, 4)]),
    "index_none_ellipsis": (lambda x: x[None, ..., 1], [rand(2, 3, 4)]),
    "index_bool_mask": (lambda x: x[np.array([True, False, True])], [rand(3, 2)]),
    "index_bool_tensor": (lambda x: x[mt.tensor([[True, False], [False, True]])], [rand(2, 2)]),
    "index_int_array_repeats": (lambda x: x[np.array([0, 2, 0, 0])], [rand(3, 2)]),
    "index_int_tensor": (lambda x: x[mt.tensor([2, 2, 1])], [rand(3)]),
    "index_int_list": (lambda x: x[[1, 1], [0, 0]], [rand(3, 2)]),
    "index_mixed": (lambda x: x[np.array([1, 1]), 1:3], [rand(2, 4)]),
    "index_gather_rows": (lambda x: x[np.arange(3), np.array([1, 0, 1])], [rand(3, 2)]),
    # element-wise functions
    "exp": (lambda x: x.exp(), [rand(3, 2)]),
    "log": (lambda x: x.log(), [pos(3, 2)]),
    "sqrt": (lambda x: x.sqrt(), [pos(3, 2)]),
    "abs": (lambda x: x.abs() + abs(x), [away(5)]),
    "relu": (lambda x: x.relu(), [away(6)]),
    "sigmoid": (lambda x: x.sigmoid(), [rand(6) * 3]),
    "tanh": (lambda x: x.tanh(), [rand(6)]),
    "clamp": (lambda x: x.clamp(-1.0, 1.0), [np.array([-1.7, -0.5, 0.2, 0.9, 1.4])]),
    "clamp_min": (lambda x: x.clamp(min=0.1), [np.array([-1.7, 0.5, 0.9])]),
    # several tensors
    "cat": (lambda x, y: mt.cat([x, y, x], dim=1), [rand(2, 3), rand(2, 1)]),
    "cat_dim0": (lambda x, y: mt.cat((x, y)), [rand(2, 3), rand(1, 3)]),
    "stack": (lambda x, y: mt.stack([x, y * 2], dim=1), [rand(2, 3), rand(2, 3)]),
    "where": (lambda x, y: mt.where(y > 0, x, y), [rand(2, 3), away(3)]),
    "where_scalar": (lambda x: mt.where(x > 0, x, 0.0), [away(4)]),
    # a small network
    "mlp": (
        lambda x, w1, b1, w2: ((x @ w1 + b1).relu() @ w2).sigmoid().mean(),
        [rand(4, 3), rand(3, 5), rand(5), rand(5, 2)],
    ),
    "log_sum_exp": (
        lambda x: (x - x.max(1, keepdim=True).values).exp().sum(1).log(),
        [rand(3, 4)],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_finite_differences(name):
    fn, inputs = CASES[name]
    gradcheck(fn, *inputs)


def test_torch_style_functions_are_the_methods():
    x = mt.tensor([[1.0, 5.0], [3.0, 2.0]], requires_grad=True)
    values, indices = mt.max(x, 1)
    assert values.tolist() == [5.0, 3.0] and indices.tolist() == [1, 0]
    out = (mt.sum(x * 2) + mt.max(x) + mt.min(x, dim=0).values.sum() + mt.abs(-x).mean()
           + mt.flatten(mt.exp(x) * 0, 0).sum() + mt.relu(x - 2).sum())
    out.backward()
    assert x.grad.tolist() == [[3.25, 4.25], [3.25, 3.25]]
    import builtins

    for name in ("sum", "max", "min", "abs"):  # importing mpitensor patched no builtin
        assert getattr(builtins, name).__module__ == "builtins", name
    assert mt.sum.__name__ == "sum" and "sum" in mt.__all__


def test_gradient_of_float32_cast_and_back():
    x = mt.tensor([1.0, 2.0, 3.0], dtype=mt.float64, requires_grad=True)
    y = x.float()
    assert y.dtype == mt.float32 and y.grad_fn.name() == "ToCopyBackward"
    (y * mt.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.dtype == mt.float64 and x.grad.tolist() == [1.0, 2.0, 3.0]
    z = mt.tensor([1.0, 2.0], requires_grad=True)
    for cast in (lambda t: t.double(), lambda t: t.to(mt.float64), lambda t: t.type(mt.float64)):
        z.grad = None
        (cast(z) ** 2).sum().backward()
        assert z.grad.dtype == mt.float32 and z.grad.tolist() == [2.0, 4.0]
    assert z.float() is z  # no-op casts return the tensor itself, as in torch
    assert not z.long().requires_grad  # an integer result leaves the graph


def test_mixed_dtypes_promote_forward_and_cast_gradients_back():
    a = mt.tensor([1.0, 2.0], dtype=mt.float32, requires_grad=True)
    b = mt.tensor([3.0, 4.0], dtype=mt.float64, requires_grad=True)
    c = a * b
    assert c.dtype == mt.float64
    c.sum().backward()
    assert a.grad.dtype == mt.float32 and a.grad.tolist() == [3.0, 4.0]
    assert b.grad.dtype == mt.float64 and b.grad.tolist() == [1.0, 2.0]
    # an int tensor operand promotes to the float, and gets no gradient
    d = a * mt.tensor([2, 3])
    assert d.dtype == mt.float32
    # the dtype rules of the unrecorded path hold on the recorded one
    h = mt.tensor([1.0], dtype=mt.float16, requires_grad=True)
    assert (h * 2.5).dtype == mt.float16 and (h + mt.tensor(1.0, dtype=mt.float64)).dtype == \
        mt.float16


def test_broadcast_leaf_used_twice_sums_both_paths():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    (x * mt.ones(3, 2) + x).sum().backward()
    assert x.grad.tolist() == [6.0, 6.0]  # 3 rows, twice


# --------------------------------------------------------------------------------------------
# PyTorch as an oracle on composite expressions


def _both(torch, arrays):
    ours = [mt.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    return ours, theirs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parity_with_torch_composites(dtype):
    torch = pytest.importorskip("torch")
    arrays = [rand(4, 3).astype(dtype), rand(3, 5).astype(dtype), rand(5).astype(dtype),
              pos(4, 5).astype(dtype)]
    idx = np.array([0, 2, 2, 1])

    def expr(lib, x, w, b, p):
        h = (x @ w + b).relu()
        z = h * p.sqrt() - (h / p) ** 2 + 0.5 ** x.sum(1, keepdim=True)
        z = z.transpose(0, 1)[:, idx].reshape(-1, 2)
        m = z.max(1, keepdim=True).values
        lse = (z - m).exp().sum(1).log() + m.squeeze(1)
        t = lib.cat([lse, z.tanh().mean(0), x.sigmoid().flatten()[::3]])
        return (t * t.abs()).sum() + lib.stack([b, b * 2]).min()

    ours, theirs = _both(torch, arrays)
    out, ref = expr(mt, *ours), expr(torch, *theirs)
    assert out.grad_fn is not None
    out.backward()
    ref.backward()
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out.item(), ref.item(), rtol=tol)
    for a, b in zip(ours, theirs):
        assert a.grad.dtype == a.dtype
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=tol * 10, atol=tol)


def test_parity_with_torch_grad_fn_names_and_ties():
    torch = pytest.importorskip("torch")
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.5]])
    ours, theirs = _both(torch, [x])
    for lib, (t,) in ((mt, ours), (torch, theirs)):
        (t.max() * 2 + t.min(dim=1).values.sum() + t.max(t.flip(0) if lib is torch else
                                                          t[::-1])[0].sum()).backward()
    np.testing.assert_allclose(ours[0].grad.numpy(), theirs[0].grad.numpy())
    t = mt.tensor([1.0, 2.0], requires_grad=True)
    names = {
        "AddBackward": t + 1, "SubBackward": t - t, "MulBackward": t * 2,
        "DivBackward": t / 2, "PowBackward": t ** 2, "NegBackward": -t,
        "MatMulBackward": t @ t, "SumBackward": t.sum(), "MeanBackward": t.mean(),
        "ExpBackward": t.exp(), "LogBackward": t.log(), "ReluBackward": t.relu(),
        "ViewBackward": t.view(2, 1), "ReshapeBackward": t.reshape(1, 2),
        "IndexBackward": t[0], "CatBackward": mt.cat([t, t]), "CloneBackward": t.clone(),
        "PermuteBackward": t.T,
    }
    for name, r in names.items():
        assert r.grad_fn.name() == name
    assert "grad_fn=<MulBackward>" in repr(t * 2)


def test_softmax_methods_delegate_to_functional():
    torch = pytest.importorskip("torch")
    x = rand(2, 3)
    (a,), (b,) = _both(torch, [x])
    for t in (a, b):
        (t.log_softmax(1)[:, 0].sum() + t.softmax(dim=0)[0].sum() * 2).backward()
    assert a.log_softmax(1).grad_fn.name() == "LogSoftmaxBackward"
    np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(mt.softmax(a, 1).detach().numpy(),
                               torch.softmax(b, 1).detach().numpy(), rtol=1e-12)


# --------------------------------------------------------------------------------------------
# requires_grad, grad mode, leaves


def test_requires_grad_propagation_and_leaves():
    a = mt.ones(2, requires_grad=True)
    b = mt.ones(2)
    assert a.is_leaf and b.is_leaf and a.grad_fn is None
    c = a + b
    assert c.requires_grad and not c.is_leaf and c.grad_fn.name() == "AddBackward"
    d = b * 2 + b.exp()
    assert not d.requires_grad and d.grad_fn is None
    assert (a > 0).grad_fn is None and not (a > 0).requires_grad  # comparisons: no grad
    assert not a.argmax().requires_grad
    with pytest.raises(RuntimeError, match="only tensors of floating point"):
        mt.tensor([1, 2]).requires_grad_()
    with pytest.raises(RuntimeError, match="leaf variables"):
        c.requires_grad = False


def test_no_grad_results_have_no_graph():
    a = mt.ones(2, 3, requires_grad=True)
    with mt.no_grad():
        outs = [a + 1, a * a, a @ a.T, a.sum(), a[0], a.reshape(6), a.exp(), a.relu(),
                mt.cat([a, a]), a.double(), a.max(1).values, -a]
        assert not mt.is_grad_enabled()
    assert mt.is_grad_enabled()
    for r in outs:
        assert not r.requires_grad and r.grad_fn is None


def test_grad_mode_switches_as_context_and_decorator():
    a = mt.ones(2, requires_grad=True)

    @mt.no_grad()
    def f(t):
        return t * 2

    @mt.enable_grad()
    def g(t):
        return t * 2

    @mt.set_grad_enabled(False)
    def h(t):
        return t * 2

    assert not f(a).requires_grad and not h(a).requires_grad
    with mt.no_grad():
        assert g(a).requires_grad
        with mt.enable_grad():
            assert (a * 2).requires_grad
        assert not (a * 2).requires_grad
    with mt.set_grad_enabled(False):
        assert not (a * 2).requires_grad
    assert (a * 2).requires_grad
    mt.set_grad_enabled(False)
    try:
        assert not (a * 2).requires_grad
    finally:
        mt.set_grad_enabled(True)
    with mt.inference_mode():
        assert not (a * 2).requires_grad


def test_leaf_gradients_accumulate_across_backward_calls():
    w = mt.tensor([1.0, -1.0], requires_grad=True)
    for _ in range(3):
        (w * mt.tensor([2.0, 3.0])).sum().backward()
    assert w.grad.tolist() == [6.0, 9.0]
    g = w.grad
    (w * 1.0).sum().backward()
    assert w.grad is g  # accumulated in place: views of .grad stay valid


def test_backward_with_gradient_argument_and_errors():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    with pytest.raises(RuntimeError, match="without a gradient needs a one-element output"):
        y.backward()
    y.backward(mt.tensor([1.0, 10.0]))
    assert x.grad.tolist() == [3.0, 30.0]
    with pytest.raises(RuntimeError, match="does not require grad"):
        mt.ones(2).sum().backward()
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        (x * 2).backward(mt.ones(3))


def test_retain_graph_and_second_backward_error():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.tolist() == [4.0, 8.0]
    with pytest.raises(RuntimeError, match="already run backward.*retain_graph=True"):
        y.backward()


def test_floor_divide_is_not_differentiable():
    x = mt.tensor([3.0, 5.0], requires_grad=True)
    y = x // 2
    assert y.requires_grad
    with pytest.raises(RuntimeError, match="derivative for floor_divide is not implemented"):
        y.sum().backward()


def test_retain_grad_on_non_leaf():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3
    h.retain_grad()
    h.retain_grad()  # once is enough
    (h * h).sum().backward()
    assert h.grad.tolist() == [6.0, 12.0] and x.grad.tolist() == [18.0, 36.0]


# --------------------------------------------------------------------------------------------
# hooks


def test_leaf_hook_modifies_gradient_and_can_be_removed():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    seen = []

    def double(g):
        seen.append(g.tolist())
        return g * 2

    handle = x.register_hook(double)
    (x * x).sum().backward()
    assert seen == [[2.0, 4.0]] and x.grad.tolist() == [4.0, 8.0]
    handle.remove()
    handle.remove()  # a no-op the second time
    x.grad = None
    (x * x).sum().backward()
    assert x.grad.tolist() == [2.0, 4.0] and len(seen) == 1


def test_non_leaf_hook_sees_and_replaces_gradient():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3
    seen = []
    h.register_hook(lambda g: seen.append(g.tolist()))
    h.register_hook(lambda g: g * 10)
    (h * mt.tensor([1.0, 2.0])).sum().backward()
    assert seen == [[1.0, 2.0]]
    assert x.grad.tolist() == [30.0, 60.0]
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        mt.ones(1).register_hook(lambda g: g)


def test_post_accumulate_hook_fires_once_per_backward():
    w = mt.tensor([1.0, 2.0], requires_grad=True)
    calls = []
    handle = w.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.tolist()))
    (w * w + w * 3).sum().backward()  # w used three times
    assert calls == [[5.0, 7.0]]
    (w * 2).sum().backward()
    assert calls == [[5.0, 7.0], [7.0, 9.0]]
    handle.remove()
    (w * 2).sum().backward()
    assert len(calls) == 2
    with pytest.raises(RuntimeError, match="non-leaf"):
        (w * 2).register_post_accumulate_grad_hook(lambda p: None)


def test_queue_callback_runs_after_backward():
    w = mt.tensor([1.0], requires_grad=True)
    order = []

    def hook(p):
        order.append("hook")
        mt.autograd.queue_callback(lambda: order.append("callback"))

    w.register_post_accumulate_grad_hook(hook)
    (w * 2).sum().backward()
    assert order == ["hook", "callback"]


# --------------------------------------------------------------------------------------------
# in-place operations, .data and detach


def test_in_place_on_leaf_requiring_grad_raises_and_works_under_no_grad():
    w = mt.tensor([1.0, 2.0], requires_grad=True)
    msg = "an in-place change of a leaf tensor that requires grad"
    for op in (lambda: w.__iadd__(1), lambda: w.add_(1), lambda: w.mul_(2),
               lambda: w.__setitem__(0, 5.0), lambda: w.copy_(mt.zeros(2)),
               lambda: w.fill_(0), lambda: w.zero_(), lambda: w.sub_(w, alpha=0.1)):
        with pytest.raises(RuntimeError, match=msg):
            op()
    assert w.tolist() == [1.0, 2.0]
    with mt.no_grad():
        w -= 0.5
        w.mul_(2)
        w[0] = 7.0
        w.add_(mt.ones(2), alpha=2)
    assert w.tolist() == [9.0, 5.0] and w.requires_grad and w.is_leaf


def test_in_place_on_non_leaf_and_into_plain_tensor_are_recorded():
    # (more in test_inplace_autograd.py, against torch)
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    h = x * 2
    h += 1
    assert h.grad_fn is not None and h._version == 1
    buf = mt.zeros(2)
    buf[0] = x[0]
    buf += x
    assert buf.requires_grad and not buf.is_leaf
    (h * buf).sum().backward()
    # h = 2x + 1, buf = (x0 + x0, x1): d/dx0 (2x0+1)*2x0 = 8x0+2, d/dx1 (2x1+1)*x1 = 4x1+1
    assert x.grad.tolist() == [10.0, 9.0]
    buf2 = mt.zeros(2)
    buf2 += x.detach()
    assert buf2.tolist() == [1.0, 2.0] and not buf2.requires_grad


def test_data_is_a_detached_view_sharing_storage():
    p = mt.tensor([2.0, 4.0], requires_grad=True)
    (p * p).sum().backward()
    p.grad.data /= 2  # the tutorials' gradient averaging
    assert p.grad.tolist() == [2.0, 4.0]
    d = p.data
    assert not d.requires_grad and d.grad_fn is None
    d[0] = 10.0  # allowed: d is outside autograd
    assert p.tolist() == [10.0, 4.0]
    p.data = mt.tensor([1.0, 1.0])
    assert p.tolist() == [1.0, 1.0] and p.requires_grad


def test_detach_shares_storage_and_stops_gradient():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    h = x * 2
    d = h.detach()
    assert not d.requires_grad and d.grad_fn is None and d.is_leaf
    d[1] = 0.0
    assert h.tolist() == [2.0, 0.0]
    (x * d).sum().backward()
    assert x.grad.tolist() == [2.0, 0.0]
    h.detach_()
    assert h.grad_fn is None and not h.requires_grad
    with pytest.raises(RuntimeError, match="detach"):
        x.numpy()
    assert x.detach().numpy().tolist() == [1.0, 2.0]


# --------------------------------------------------------------------------------------------
# CuPy: the same graphs on a GPU give the CPU's gradients


def _grads_on(device, fn, inputs):
    leaves = [mt.tensor(x, dtype=mt.float64, device=device, requires_grad=True) for x in inputs]
    out = fn(*leaves)
    w = np.random.default_rng(7).standard_normal(tuple(out.shape))
    (out * mt.tensor(w, device=device)).sum().backward()
    return [backend.to_numpy(t.grad._data) for t in leaves], out


_GPU_SKIP = {"add_ndarray", "radd_ndarray", "rsub_ndarray", "rdiv_ndarray", "rmatmul_ndarray",
             "index_bool_mask", "index_int_array_repeats", "index_mixed", "index_gather_rows"}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(set(CASES) - _GPU_SKIP))
def test_gpu_gradients_match_cpu(name):
    fn, inputs = CASES[name]
    cpu, _ = _grads_on("cpu", fn, inputs)
    gpu, out = _grads_on("cuda", fn, inputs)
    assert out.is_cuda
    for a, b in zip(cpu, gpu):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
def test_gpu_scatter_add_indexing_and_device_moves():
    import cupy as cp

    x = mt.tensor([1.0, 2.0, 3.0], device="cuda", requires_grad=True)
    x[cp.array([0, 0, 2])].sum().backward()
    assert x.grad.is_cuda and x.grad.tolist() == [2.0, 0.0, 1.0]
    y = mt.tensor([1.0, 2.0], requires_grad=True)  # CPU leaf, used on the GPU
    (y.cuda() * 3).sum().backward()
    assert y.grad.is_cpu and y.grad.tolist() == [3.0, 3.0]
    z = mt.tensor([1.0, 2.0], device="cuda", requires_grad=True)
    (z.cpu() * z.cpu()).sum().backward()
    assert z.grad.is_cuda and z.grad.tolist() == [2.0, 4.0]
