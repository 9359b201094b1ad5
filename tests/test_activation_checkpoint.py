"""Activation checkpointing (``torch.utils.checkpoint`` and the ``checkpoint_wrapper`` of
``torch.distributed.algorithms._checkpoint``) from the user's side: the gradients of a
checkpointed network equal the plain network's bit for bit (float64, dropout included), what
a checkpoint keeps is one node, and torch's rules for each variant hold (checked against torch
where it is installed)."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import mpitensor as mt
from mpitensor.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from mpitensor.utils.checkpoint import checkpoint, checkpoint_sequential

try:
    import torch
except ImportError:
    torch = None


def _net(T):
    T.manual_seed(0)
    return T.nn.Sequential(T.nn.Linear(4, 8), T.nn.ReLU(), T.nn.Dropout(0.5), T.nn.Linear(8, 8),
                           T.nn.Tanh(), T.nn.Linear(8, 2)).double()


def _grads(net, x):
    return [p.grad.numpy().copy() for p in net.parameters()] + [x.grad.numpy().copy()]


def _run(T, net, how, seed=1):
    for p in net.parameters():
        p.grad = None
    x = T.arange(20.0, dtype=T.float64).reshape(5, 4).div(7).requires_grad_(True)
    T.manual_seed(seed)
    y = how(net, x)
    y.pow(2).sum().backward()
    return y.detach().numpy().copy(), _grads(net, x)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_gradients_equal_the_plain_ones(reentrant):
    net = _net(mt)
    y0, g0 = _run(mt, net, lambda n, x: n(x))
    y1, g1 = _run(mt, net, lambda n, x: checkpoint(n, x, use_reentrant=reentrant))
    np.testing.assert_array_equal(y0, y1)  # dropout drew the same mask, and again in backward
    for a, b in zip(g0, g1):
        np.testing.assert_array_equal(a, b)
    y2, g2 = _run(mt, net, lambda n, x: checkpoint_sequential(n, 3, x,
                                                              use_reentrant=reentrant))
    np.testing.assert_array_equal(y0, y2)
    for a, b in zip(g0, g2):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(torch is None, reason="torch not installed: no oracle")
@pytest.mark.parametrize("reentrant", [False, True])
def test_same_values_as_torch(reentrant):
    ours, theirs = _net(mt), _net(torch)
    theirs.load_state_dict({k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()})
    ours.eval(), theirs.eval()  # the generators differ between the libraries: no dropout
    y0, g0 = _run(mt, ours, lambda n, x: checkpoint(n, x, use_reentrant=reentrant))
    y1, g1 = _run(torch, theirs, lambda n, x: torch.utils.checkpoint.checkpoint(
        n, x, use_reentrant=reentrant))
    np.testing.assert_allclose(y0, y1, rtol=1e-12)
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_a_checkpoint_keeps_one_node():
    net = _net(mt)
    x = mt.ones(3, 4, dtype=mt.float64, requires_grad=True)
    y = checkpoint(net, x, use_reentrant=True)
    assert [n for n, _ in y.grad_fn.next_functions] == [None, None, None, None, x]
    plain = net(x)
    assert plain.grad_fn.next_functions[0][0] is not None  # the plain graph goes on inward


def test_the_variants_follow_torchs_rules():
    lin = mt.nn.Linear(3, 3)
    x = mt.ones(2, 3)  # no input requires grad
    with pytest.warns(UserWarning, match="use_reentrant"):
        y = checkpoint(lin, x.requires_grad_(True))  # omitted: reentrant, with a warning
    assert y.requires_grad
    x = mt.ones(2, 3)
    with pytest.warns(UserWarning, match="none of the inputs"):
        y = checkpoint(lin, x, use_reentrant=True)
    assert not y.requires_grad  # reentrant: the parameters get nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = checkpoint(lin, x, use_reentrant=False)  # non-reentrant: they do
    assert y.requires_grad
    y.sum().backward()
    np.testing.assert_array_equal(lin.bias.grad.numpy(), [2, 2, 2])
    with pytest.raises(ValueError, match="keyword arguments"):
        checkpoint(lambda a, b: a + b, x, b=x, use_reentrant=True)
    with pytest.raises(ValueError, match="context_fn"):
        checkpoint(lin, x, use_reentrant=True, context_fn=lambda: (None, None))
    out = checkpoint(lambda a, b: a * b, x.requires_grad_(True), b=mt.full((2, 3), 3.0),
                     use_reentrant=False)
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3), 3.0))
    with mt.no_grad():
        assert not checkpoint(lin, x, use_reentrant=False).requires_grad
    with pytest.raises(ValueError, match="segments"):
        checkpoint_sequential(mt.nn.Sequential(lin), 0, x, use_reentrant=False)


def test_several_outputs_and_non_tensors():
    a = mt.tensor([1.0, 2.0], requires_grad=True)

    def block(t, k):
        return t * k, "label", t.sum() * 2

    p, label, s = checkpoint(block, a, 3.0, use_reentrant=True)
    assert label == "label"
    (p.sum() + s).backward()
    np.testing.assert_array_equal(a.grad.numpy(), [5.0, 5.0])


def test_a_context_fn_runs_around_both_runs():
    seen = []

    class Note:
        def __init__(self, tag):
            self.tag = tag

        def __enter__(self):
            seen.append(self.tag)

        def __exit__(self, *exc):
            return False

    x = mt.ones(2, requires_grad=True)
    y = checkpoint(lambda t: t * 2, x, use_reentrant=False,
                   context_fn=lambda: (Note("first"), Note("again")))
    y.sum().backward()
    assert seen == ["first", "again"]


class Block(mt.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = mt.nn.Linear(4, 4)
        self.drop = mt.nn.Dropout(0.3)

    def forward(self, x, scale=1.0):
        return mt.tanh(self.drop(self.fc(x))) * scale + x


class Net(mt.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = mt.nn.ModuleList([Block() for _ in range(3)])
        self.head = mt.nn.Linear(4, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x, scale=0.5)
        return self.head(x)


@pytest.mark.parametrize("impl", list(CheckpointImpl))
def test_wrapped_blocks_train_as_the_plain_net(impl):
    mt.manual_seed(0)
    plain = Net().double()
    state = {k: v.clone() for k, v in plain.state_dict().items()}
    wrapped = Net().double()
    apply_activation_checkpointing(
        wrapped, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                         checkpoint_impl=impl),
        check_fn=lambda m: isinstance(m, Block))
    assert all(isinstance(b, CheckpointWrapper) for b in wrapped.blocks)
    assert list(wrapped.state_dict()) == list(state)  # the wrapper adds no name to the keys
    wrapped.load_state_dict(state)
    assert wrapped.blocks[0].fc is wrapped.blocks[0]._checkpoint_wrapped_module.fc
    # the reentrant variant gives the first block's parameters a gradient only when its
    # input requires grad (as torch's does)
    x = (mt.arange(12.0, dtype=mt.float64).reshape(3, 4) / 10).requires_grad_(True)
    for net in (plain, wrapped):
        mt.manual_seed(5)
        net(x).sum().backward()
    for p, q in zip(plain.parameters(), wrapped.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
    plain.load_state_dict(wrapped.state_dict())  # and back


def test_auto_wrap_policy_and_bad_input():
    mt.manual_seed(0)
    net = Net()
    apply_activation_checkpointing(
        net, auto_wrap_policy=lambda module, recurse, nonwrapped_numel: isinstance(
            module, mt.nn.Linear) and nonwrapped_numel > 10)
    assert isinstance(net.blocks[0].fc, CheckpointWrapper)
    assert not isinstance(net.head, CheckpointWrapper)  # 5 parameters: too small
    with pytest.raises(TypeError, match="callables"):
        apply_activation_checkpointing(net, check_fn=3)
    with pytest.raises(TypeError, match="nn.Module"):
        checkpoint_wrapper(lambda x: x)
