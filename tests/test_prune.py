"""nn.utils.prune against torch's masks on the same weights (deterministic methods exactly;
random ones by count and structure), and a pruning program written torch's way."""

import numpy as np
import pytest

import mpitensor as mt

pytest.importorskip("torch")
import torch  # noqa: E402
import torch.nn.utils.prune  # noqa: E402 - torch.nn does not import this submodule

P = mt.nn.utils.prune
TP = torch.nn.utils.prune


def _pair(shape, seed=0):
    w = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)  # no ties
    a, b = mt.nn.Linear(shape[1], shape[0]), torch.nn.Linear(shape[1], shape[0])
    bias = np.linspace(-1, 1, shape[0], dtype=np.float32)
    with mt.no_grad():
        a.weight.copy_(mt.tensor(w))
        a.bias.copy_(mt.tensor(bias))
    with torch.no_grad():
        b.weight.copy_(torch.tensor(w))
        b.bias.copy_(torch.tensor(bias))
    return a, b


@pytest.mark.parametrize("amount", [0.3, 0.25, 0.5, 3, 0])
def test_l1_unstructured_mask_equals_torch(amount):
    a, b = _pair((4, 6))
    P.l1_unstructured(a, "weight", amount)
    TP.l1_unstructured(b, "weight", amount)
    np.testing.assert_array_equal(a.weight_mask.numpy(), b.weight_mask.numpy())
    np.testing.assert_array_equal(a.weight.detach().numpy(), b.weight.detach().numpy())
    assert list(a.state_dict()) == list(b.state_dict()) == ["bias", "weight_orig", "weight_mask"]


@pytest.mark.parametrize("n, dim, amount", [(2, 0, 2), (1, 1, 0.5), (float("inf"), 0, 0.34),
                                            (-2, 1, 0.4)])
def test_ln_structured_then_l1_container_equals_torch(n, dim, amount):
    a, b = _pair((6, 5), seed=1)
    P.ln_structured(a, "weight", amount, n=n, dim=dim)
    TP.ln_structured(b, "weight", amount, n=n, dim=dim)
    np.testing.assert_array_equal(a.weight_mask.numpy(), b.weight_mask.numpy())
    P.l1_unstructured(a, "weight", 3)  # a container: on the entries still unpruned
    TP.l1_unstructured(b, "weight", 3)
    np.testing.assert_array_equal(a.weight_mask.numpy(), b.weight_mask.numpy())
    hooks = [h.fn for h in a._forward_pre_hooks]
    assert len(hooks) == 1 and isinstance(hooks[0], P.PruningContainer) and len(hooks[0]) == 2


def test_global_unstructured_equals_torch_across_modules():
    (a1, b1), (a2, b2) = _pair((4, 3), 2), _pair((5, 4), 3)
    P.l1_unstructured(a1, "weight", 2)
    TP.l1_unstructured(b1, "weight", 2)
    P.global_unstructured([(a1, "weight"), (a2, "weight")], P.L1Unstructured, amount=0.4)
    TP.global_unstructured([(b1, "weight"), (b2, "weight")], TP.L1Unstructured, amount=0.4)
    for a, b in ((a1, b1), (a2, b2)):
        np.testing.assert_array_equal(a.weight_mask.numpy(), b.weight_mask.numpy())
    assert int((a1.weight_mask == 0).sum() + (a2.weight_mask == 0).sum()) == 2 + round(0.4 * 30)


def test_random_methods_count_and_structure():
    a, _ = _pair((6, 5))
    P.random_structured(a, "weight", 0.5, dim=1)  # round(2.5) = 2 columns (halves to even)
    cols = a.weight_mask.numpy().sum(axis=0)
    assert sorted(cols.tolist()) == [0, 0, 6, 6, 6]
    P.random_unstructured(a, "weight", 5)
    assert int((a.weight_mask == 0).sum()) == 12 + 5
    assert (a.weight_mask.numpy()[:, cols == 0] == 0).all()


def test_forward_backward_remove_and_custom_mask():
    a, b = _pair((3, 4))
    mask = np.array([[1, 0, 1, 1], [0, 0, 1, 1], [1, 1, 1, 0]], np.float32)
    P.custom_from_mask(a, "weight", mt.tensor(mask))
    TP.custom_from_mask(b, "weight", torch.tensor(mask))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    a(mt.tensor(x)).pow(2).sum().backward()
    b(torch.tensor(x)).pow(2).sum().backward()
    np.testing.assert_allclose(a.weight_orig.grad.numpy(), b.weight_orig.grad.numpy(),
                               rtol=1e-6, atol=1e-5)
    assert P.is_pruned(a)
    P.remove(a, "weight")
    TP.remove(b, "weight")
    assert not P.is_pruned(a) and list(a.state_dict()) == list(b.state_dict())
    assert isinstance(a.weight, mt.nn.Parameter)
    np.testing.assert_array_equal(a.weight.detach().numpy() == 0, mask == 0)
    with pytest.raises(ValueError, match="has to be pruned"):
        P.remove(a, "weight")


def test_bad_amounts():
    a, _ = _pair((2, 2))
    with pytest.raises(ValueError):
        P.l1_unstructured(a, "weight", 1.5)
    with pytest.raises(ValueError):
        P.l1_unstructured(a, "weight", 5)
    with pytest.raises(TypeError):
        P.l1_unstructured(a, "weight", "half")
    assert sorted(a.state_dict()) == ["bias", "weight"]  # a failed pruning is undone


PROGRAM = '''
import mpitensor as torch
import mpitensor.nn as nn
import mpitensor.nn.functional as F
import mpitensor.nn.utils.prune as prune

torch.manual_seed(0)
model = nn.Sequential()
model.add_module("conv", nn.Conv2d(1, 4, 3))
model.add_module("act", nn.ReLU())
model.add_module("flat", nn.Flatten())
model.add_module("fc", nn.Linear(4 * 6 * 6, 10))
prune.random_unstructured(model.conv, name="weight", amount=0.3)
prune.l1_unstructured(model.conv, name="bias", amount=3)
prune.ln_structured(model.conv, name="weight", amount=0.5, n=2, dim=0)
for hook in model.conv._forward_pre_hooks.values():
    if hook._tensor_name == "weight":
        assert len(list(hook)) == 2
params = ((model.conv, "weight"), (model.fc, "weight"))
prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=0.2)
total = model.conv.weight.nelement() + model.fc.weight.nelement()
zeros = float((model.conv.weight == 0).sum() + (model.fc.weight == 0).sum())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = F.cross_entropy(model(torch.randn(2, 1, 8, 8)), torch.tensor([1, 2]))
loss.backward()
opt.step()
prune.remove(model.conv, "weight")
print(sorted(model.conv.state_dict()), round(zeros / total, 3), prune.is_pruned(model))
'''


def test_pruning_program_runs_under_mpitensor(tmp_path):
    import subprocess
    import sys
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM)
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    keys, *rest = out.stdout.rsplit("]", 1)
    assert keys + "]" == "['bias_mask', 'bias_orig', 'weight']"
    frac, pruned = rest[0].split()
    # conv: 36 weights, 11 random then 2 of 4 filters; fc: 1440; the global 20 % counts all
    assert float(frac) >= 0.2 and pruned == "True"


class EveryOther(P.BasePruningMethod):
    """A user's method, written as torch's tutorial shows: a mask edited through a view."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        mask = default_mask.clone()
        mask.view(-1)[::2] = 0
        return mask


def test_custom_method_and_hook_listing():
    m = mt.nn.Linear(3, 4)
    EveryOther.apply(m, "bias")
    np.testing.assert_array_equal(m.bias_mask.numpy(), [0, 1, 0, 1])
    assert list(dict(m.named_buffers())) == ["bias_mask"]
    P.random_unstructured(m, "weight", 0.25)  # round(3.0) = 3
    P.l1_unstructured(m, "weight", 2)
    hooks = list(m._forward_pre_hooks.values())
    assert [type(h).__name__ for h in hooks] == ["EveryOther", "PruningContainer"]
    assert [type(h).__name__ for h in hooks[1]] == ["RandomUnstructured", "L1Unstructured"]
    assert repr(m._forward_pre_hooks).startswith("OrderedDict([(")
    assert float(mt.sum(m.weight == 0)) / m.weight.nelement() == 5 / 12
