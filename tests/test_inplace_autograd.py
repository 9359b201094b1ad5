"""In-place operations under autograd, against PyTorch as the oracle.

Each program below is written once against a library namespace ``L`` (``mpitensor`` or
``torch``) and run under both with the same inputs: the gradients must agree, and where torch
refuses a backward because a value saved for it was changed in place ("modified by an inplace
operation"), mpitensor must refuse it too. Also: leaves, views taken under no_grad, version
counters (``_version``) and the graph an in-place op leaves behind.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import nn

RNG = np.random.default_rng(20240611)
INPLACE_MSG = "modified by an inplace operation"


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _np(t) -> np.ndarray:
    return np.array(t.detach().numpy())  # a copy: later writes must not change it


def _inputs(*shapes):
    return [RNG.standard_normal(s) for s in shapes]


def _run(L, prog, arrays):
    """Run ``prog(L, *leaves)`` and backward; the loss and every leaf's gradient (or None)."""
    leaves = [L.tensor(a, requires_grad=True) for a in arrays]
    loss = prog(L, *leaves)
    loss.backward()
    return _np(loss), [None if t.grad is None else _np(t.grad) for t in leaves]


def _compare(torch, prog, arrays, rtol=1e-10, atol=1e-12):
    ours = _run(mt, prog, arrays)
    theirs = _run(torch, prog, arrays)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=rtol, atol=atol)
    for i, (a, b) in enumerate(zip(ours[1], theirs[1])):
        assert (a is None) == (b is None), f"leaf {i}: gradient {a} against torch's {b}"
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"leaf {i}")


# --------------------------------------------------------------------------------------------
# Gradients of programs that write in place


def chain_of_ops(L, x, z):
    y = x * 2
    y += 1
    y.mul_(x)
    y.sub_(z, alpha=2)
    y.div_(3)
    y -= z
    y /= z.abs() + 1
    y.clamp_(-1.0, 0.5)
    y *= 4
    y.add_(z, alpha=0.5)
    return (y * y).sum()


def relu_after_linear(L, x, w):
    return L.nn.functional.linear(x, w).relu_().pow(2).sum()


def non_leaf_used_afterwards(L, x, z):
    h = x * z
    h.add_(1)
    s = h.sum()  # reads h at version 1
    h.mul_(z)
    return (h * h).sum() + h.mean() + s


def relu_inplace_functional(L, x, w):
    F = L.nn.functional
    h = F.relu(F.linear(x, w), inplace=True)
    return F.relu_(h * 3).sum() + (h * h).sum()


def writes_into_plain_tensor(L, x, z):
    b = L.ones(3, 4, dtype=L.float64)
    b *= x
    b += z
    b.div_(z * z + 1)
    return (b * b).sum()


def writes_into_views(L, x, z):
    y = x * 1
    y[1:].mul_(2)
    y[0] = z[0] * 3
    v = y[:, 0]
    v += z[:, 1]
    return (y * y).sum() + (v * z[:, 2]).sum()


def view_read_after_base_write(L, x, z):
    y = x * 1
    row, col = y[0], y.t()[1]
    y.mul_(z)
    return (row * row).sum() + (col * 3).sum()


def view_of_view(L, x, z):
    y = x * 1
    v = y.t()[1:3]
    v2 = v[:, 1:]
    v2.mul_(2)
    v.add_(z.t()[:2])
    return (y ** 2).sum() + v2.sum()


def reshaped_views(L, x, z):
    y = x * 1
    flat = y.view(12)
    flat[3:7] *= 5
    y.unsqueeze(0).squeeze(0)[1].sub_(1)
    y.permute(1, 0)[2, :2] = 0
    y.t().mul_(z.t())
    y.flatten().relu_()  # last: relu_ saves its output
    return (y * z).sum() + (flat * flat).sum()


def setitem_into_buffer(L, x, z):
    buf = L.zeros(3, 4, dtype=L.float64)
    buf[0] = x[1]
    buf[:, 1] = z[:, 2] * 2
    buf[[0, 2], [3, 3]] = x[0, :2]
    buf[z > 1.0] = 0.0
    return (buf * buf).sum()


def masked_fills(L, x, z):
    y = x * 1
    y.masked_fill_(z > 0, 0.5)
    y2 = y.masked_fill(x < 0, z.sum())
    y3 = x * 2
    y3.masked_fill_(z < 0, z[0, 0])
    return (y2 * y2).sum() + (y3 * y3).sum()


def copies_and_fills(L, x, z):
    buf = L.zeros(3, 4, dtype=L.float64)
    buf.copy_(x * 2)
    y = z * 1
    y.copy_(x[0])  # broadcast
    f = x * 2
    f[1:].fill_(3.0)
    g = z * 1
    g.zero_()
    h = x * 2
    h.fill_(z[1, 1])
    return (buf * y).sum() + (f * z).sum() + (g * x).sum() + (h * x).sum()


def base_write_seen_by_expanded_view(L, x, z):
    y = x[0] * 1
    e = y.expand(3, 4)
    y.mul_(2)
    return (e * z).sum()


def write_under_no_grad(L, x, z):
    y = x * z  # saves x and z, not y
    with L.no_grad():
        y.mul_(2)  # not recorded: the gradient ignores it, as in torch
    return (y * 1).sum()


def residual_block(L, x, w1, w2):
    F = L.nn.functional
    identity = x
    out = F.relu(F.conv2d(x, w1, padding=1), inplace=True)
    out = F.conv2d(out, w2, padding=1)
    out += identity
    out = F.relu(out, inplace=True)
    return (out * out).mean()


PROGRAMS = [
    (chain_of_ops, [(3, 4), (3, 4)]),
    (relu_after_linear, [(3, 4), (5, 4)]),
    (non_leaf_used_afterwards, [(3, 4), (3, 4)]),
    (relu_inplace_functional, [(3, 4), (5, 4)]),
    (writes_into_plain_tensor, [(3, 4), (3, 4)]),
    (writes_into_views, [(3, 4), (3, 4)]),
    (view_read_after_base_write, [(3, 4), (3, 4)]),
    (view_of_view, [(3, 4), (3, 4)]),
    (reshaped_views, [(3, 4), (3, 4)]),
    (setitem_into_buffer, [(3, 4), (3, 4)]),
    (masked_fills, [(3, 4), (3, 4)]),
    (copies_and_fills, [(3, 4), (3, 4)]),
    (base_write_seen_by_expanded_view, [(3, 4), (3, 4)]),
    (write_under_no_grad, [(3, 4), (3, 4)]),
    (residual_block, [(2, 3, 5, 5), (3, 3, 3, 3), (3, 3, 3, 3)]),
]


@pytest.mark.parametrize("prog, shapes", PROGRAMS, ids=[p.__name__ for p, _ in PROGRAMS])
def test_gradients_match_torch(torch, prog, shapes):
    _compare(torch, prog, _inputs(*shapes))


class _Block:
    """A residual block written as torch users write it, for either library."""

    def __init__(self, L, channels: int) -> None:
        self.conv1 = L.nn.Conv2d(channels, channels, 3, padding=1)
        self.relu = L.nn.ReLU(inplace=True)
        self.conv2 = L.nn.Conv2d(channels, channels, 3, padding=1)

    def __call__(self, x):
        identity = x
        out = self.relu(self.conv1(x))
        out = self.conv2(out)
        out += identity
        return self.relu(out)

    def params(self):
        return [self.conv1.weight, self.conv1.bias, self.conv2.weight, self.conv2.bias]


def test_residual_block_of_modules_matches_torch(torch):
    mt.manual_seed(0)
    ours, theirs = _Block(mt, 4), _Block(torch, 4)
    with torch.no_grad():
        for p, q in zip(ours.params(), theirs.params()):
            q.copy_(torch.tensor(_np(p), dtype=q.dtype))
    x = RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)
    xm, xt = mt.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    hm = xm * 1  # a non-leaf input, as inside a network
    ht = xt * 1
    lm = ours(ours(hm)).pow(2).mean()
    lt = theirs(theirs(ht)).pow(2).mean()
    lm.backward()
    lt.backward()
    np.testing.assert_allclose(_np(lm), _np(lt), rtol=1e-5)
    np.testing.assert_allclose(_np(xm.grad), _np(xt.grad), rtol=1e-4, atol=1e-6)
    for p, q in zip(ours.params(), theirs.params()):
        np.testing.assert_allclose(_np(p.grad), _np(q.grad), rtol=1e-4, atol=1e-6)


def test_relu_inplace_module_is_an_inplace_op():
    relu = nn.ReLU(inplace=True)
    x = mt.tensor([-1.0, 2.0, -3.0], requires_grad=True)
    h = x * 2
    out = relu(h)
    assert out is h and h._version == 1 and h.grad_fn.name() == "ReluBackward"
    out.sum().backward()
    assert x.grad.tolist() == [0.0, 2.0, 0.0]


# --------------------------------------------------------------------------------------------
# Values changed after being saved: torch refuses the backward, and so must we


def exp_output_changed(L, x, z):
    y = x.exp()
    y.add_(1)
    return y.sum()


def sigmoid_output_changed(L, x, z):
    a = x.sigmoid()
    a.mul_(2)
    return a.sum()


def tanh_output_changed_through_view(L, x, z):
    a = x.tanh()
    a[0].mul_(2)
    return a.sum()


def relu_output_changed(L, x, z):
    a = x.relu()
    a += 1
    return a.sum()


def mul_operand_changed(L, x, z):
    a = x * 1
    b = a * z  # saves a for z's gradient
    a.add_(1)
    return b.sum()


def linear_input_changed(L, x, z):
    h = x * 1
    out = L.nn.functional.linear(h, z)
    h.mul_(2)
    return out.sum()


def saved_output_changed_under_no_grad(L, x, z):
    e = x.exp()
    with L.no_grad():
        e.add_(1)
    return e.sum()


def pow_output_changed(L, x, z):
    p = x.abs() ** z
    p.add_(1)
    return p.sum()


def operand_is_self(L, x, z):
    y = x * 1
    y.mul_(y)
    return y.sum()


def relu_inplace_twice(L, x, z):
    y = x * 1
    y.relu_()
    s = y.sigmoid()
    s.relu_()
    return s.sum()


def mask_changed(L, x, z):
    m = z > 0
    y = x.masked_fill(m, 0.0)
    m.fill_(True)
    return y.sum()


ERRORS = [exp_output_changed, sigmoid_output_changed, tanh_output_changed_through_view,
          relu_output_changed, mul_operand_changed, linear_input_changed,
          saved_output_changed_under_no_grad, pow_output_changed, operand_is_self,
          relu_inplace_twice, mask_changed]


@pytest.mark.parametrize("prog", ERRORS, ids=[p.__name__ for p in ERRORS])
def test_backward_through_a_changed_saved_value_raises_like_torch(torch, prog):
    arrays = _inputs((3, 4), (4, 4) if prog is linear_input_changed else (3, 4))
    with pytest.raises(RuntimeError, match=INPLACE_MSG) as theirs:
        _run(torch, prog, arrays)
    with pytest.raises(RuntimeError, match=INPLACE_MSG) as ours:
        _run(mt, prog, arrays)
    # the same versions: (now, saved)
    found = re.search(r"is at version (\d+); expected version (\d+)", str(theirs.value))
    now, saved = found.groups()
    assert f"at version {now}, but version {saved} was saved" in str(ours.value)


def test_error_names_the_op_and_the_versions():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()
    y.add_(1)
    y.mul_(2)
    with pytest.raises(RuntimeError) as err:
        y.sum().backward()
    msg = str(err.value)
    assert INPLACE_MSG in msg
    assert "ExpBackward" in msg and "version 2" in msg and "version 0" in msg


NO_ERRORS = [
    # what was saved is not what changed, or nothing was saved: torch computes these
    lambda L, x, z: _touch(L, x * 1, lambda a: a * 3),  # mul by a number saves nothing of a
    lambda L, x, z: _touch(L, x * 1, lambda a: a + z),
    lambda L, x, z: _touch(L, x * 1, lambda a: a.sum()),
    lambda L, x, z: _touch(L, x * 1, lambda a: a.relu()),  # saves its output, not a
    lambda L, x, z: _touch(L, x * 1, lambda a: a.exp() / z),
]


def _touch(L, a, use):
    out = use(a)
    a.add_(1)
    return out.sum() + a.sum()


@pytest.mark.parametrize("i", range(len(NO_ERRORS)))
def test_in_place_after_use_that_saved_nothing_of_it(torch, i):
    _compare(torch, NO_ERRORS[i], _inputs((3, 4), (3, 4)))


# --------------------------------------------------------------------------------------------
# Leaves, views of leaves, views taken under no_grad


LEAF_WRITES = [
    ("add_", lambda L, t: t.add_(1)), ("iadd", lambda L, t: t.__iadd__(1)),
    ("mul_", lambda L, t: t.mul_(2)), ("div_", lambda L, t: t.div_(2)),
    ("sub_", lambda L, t: t.sub_(1)), ("relu_", lambda L, t: t.relu_()),
    ("clamp_", lambda L, t: t.clamp_(0, 1)), ("zero_", lambda L, t: t.zero_()),
    ("fill_", lambda L, t: t.fill_(1.0)), ("copy_", lambda L, t: t.copy_(t.detach() * 2)),
    ("masked_fill_", lambda L, t: t.masked_fill_(t.detach() > 0, 0.0)),
    ("setitem", lambda L, t: t.__setitem__(0, 5.0)),
    ("F.relu(inplace=True)", lambda L, t: L.nn.functional.relu(t, inplace=True)),
    ("nn.ReLU(inplace=True)", lambda L, t: L.nn.ReLU(inplace=True)(t)),
]


@pytest.mark.parametrize("name, write", LEAF_WRITES, ids=[n for n, _ in LEAF_WRITES])
def test_in_place_on_a_leaf_that_requires_grad_raises(torch, name, write):
    done = []
    for L in (torch, mt):
        w = L.tensor([1.0, -2.0, 3.0], requires_grad=True)
        with pytest.raises(RuntimeError, match="leaf"):
            write(L, w)
        with pytest.raises(RuntimeError, match="leaf"):
            write(L, w[1:])  # a view of the leaf
        assert w.tolist() == [1.0, -2.0, 3.0] and w._version == 0
        with L.no_grad():  # as optimisers do
            write(L, w)
        assert w.requires_grad and w.is_leaf and w.grad_fn is None
        done.append((w.tolist(), w._version))
    assert done[0] == done[1]


def test_write_into_a_view_taken_under_no_grad_raises(torch):
    for L in (torch, mt):
        x = L.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x * 1
        with L.no_grad():
            v = y[:2]
        with pytest.raises(RuntimeError, match="no_grad"):
            v.mul_(2)
        with L.no_grad():
            v.mul_(2)  # both under no_grad: allowed, not recorded
        assert y.tolist() == [2.0, 4.0, 3.0]


def test_write_into_an_expanded_view_raises(torch):
    for L in (torch, mt):
        y = L.tensor([1.0, 2.0], requires_grad=True) * 1
        with pytest.raises(RuntimeError, match="clone"):
            y.expand(3, 2).add_(1)


def test_dtype_that_cannot_be_written_raises():
    i = mt.tensor([1, 2, 3])
    w = mt.tensor([0.5, 0.5, 0.5], requires_grad=True)
    with pytest.raises(TypeError, match="can't be cast"):
        i += w
    assert i.tolist() == [1, 2, 3]


# --------------------------------------------------------------------------------------------
# Version counters and the graph


def _versions(L):
    """The version of a tensor and its views through a sequence of writes, as torch counts."""
    seen = []
    t = L.ones(2, 3)
    v = t[0]
    d = t.detach()
    r = t.view(6)
    seen.append((t._version, v._version))
    t += 1
    t.add_(1)
    seen.append((t._version, v._version, d._version, r._version))
    v.mul_(2)
    r[0] = 7.0
    t[1, 1] = 3.0
    seen.append((t._version, v._version, d._version, r._version))
    d.zero_()
    t.fill_(1.0)
    t.copy_(L.zeros(2, 3))
    t.clamp_(0, 1)
    t.relu_()
    t.masked_fill_(t > 0, 2.0)
    seen.append((t._version, v._version, d._version, r._version))
    data = t.data
    data.add_(1)  # .data has a counter of its own
    seen.append((t._version, data._version))
    c = t.clone()
    c.sub_(1)
    seen.append((t._version, c._version))
    x = L.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.mul_(3)
    y.div_(2)
    seen.append((x._version, y._version))
    return seen


def test_version_counts_like_torch(torch):
    assert _versions(mt) == _versions(torch)


def test_version_is_read_only():
    with pytest.raises(AttributeError):
        mt.zeros(2)._version = 3


def test_in_place_op_becomes_the_grad_fn():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    before = y.grad_fn
    y.add_(1)
    assert y.grad_fn.name() == "AddBackward" and not y.is_leaf and y.requires_grad
    assert y.grad_fn.next_functions[0][0] is before
    z = mt.zeros(3)
    z[1:] = y
    assert z.requires_grad and z.grad_fn is not None and not z.is_leaf
    z.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]


def test_views_join_the_graph_when_their_base_does():
    buf = mt.zeros(4)
    head = buf[:2]
    assert not head.requires_grad
    x = mt.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    buf.add_(x * 3)
    assert head.requires_grad and head.tolist() == [3.0, 6.0]
    (head * head).sum().backward()
    assert x.grad.tolist() == [18.0, 36.0, 0.0, 0.0]


def test_retain_graph_sees_writes_between_backwards():
    x = mt.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()
    s = y.sum()
    s.backward(retain_graph=True)
    np.testing.assert_allclose(x.grad.numpy(), np.exp([1.0, 2.0]))
    with mt.no_grad():
        y.mul_(2)
    with pytest.raises(RuntimeError, match=INPLACE_MSG):
        s.backward()


# --------------------------------------------------------------------------------------------
# CuPy: the same programs on a GPU give the CPU's gradients

GPU_PROGRAMS = [chain_of_ops, non_leaf_used_afterwards, writes_into_views,
                view_read_after_base_write, view_of_view, reshaped_views, masked_fills,
                base_write_seen_by_expanded_view, write_under_no_grad]


@pytest.mark.gpu
@pytest.mark.parametrize("prog", GPU_PROGRAMS, ids=[p.__name__ for p in GPU_PROGRAMS])
def test_gpu_gradients_match_cpu(prog):
    arrays = _inputs((3, 4), (3, 4))
    grads = {}
    for device in ("cpu", "cuda"):
        leaves = [mt.tensor(a, requires_grad=True, device=device) for a in arrays]
        prog(mt, *leaves).backward()
        assert all(t.grad.device.type == device for t in leaves)
        grads[device] = [t.grad.cpu().numpy() for t in leaves]
    for a, b in zip(grads["cpu"], grads["cuda"]):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
def test_gpu_saved_value_changed_raises():
    x = mt.tensor([1.0, 2.0], device="cuda", requires_grad=True)
    y = x.exp()
    y[0].add_(1)
    with pytest.raises(RuntimeError, match=INPLACE_MSG):
        y.sum().backward()
