"""nn.utils.parametrize and nn.utils.parametrizations against torch: values, gradients,
state-dict keys, spectral norm's power iteration from the same u, deepcopy, removal."""

import copy

import numpy as np
import pytest

import mpitensor as mt

torch = pytest.importorskip("torch")

P = mt.nn.utils.parametrize
PS = mt.nn.utils.parametrizations


def _pair(out_f=4, in_f=3, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out_f, in_f)).astype(np.float32)
    b = rng.standard_normal(out_f).astype(np.float32)
    a, t = mt.nn.Linear(in_f, out_f), torch.nn.Linear(in_f, out_f)
    a.load_state_dict({"weight": w, "bias": b})
    t.load_state_dict({"weight": torch.tensor(w), "bias": torch.tensor(b)})
    return a, t


class Sym(mt.nn.Module):
    def forward(self, x):
        return x.triu() + x.triu(1).transpose(-1, -2)


class TSym(torch.nn.Module):
    def forward(self, x):
        return x.triu() + x.triu(1).transpose(-1, -2)


class Double(mt.nn.Module):
    def forward(self, x):
        return 2 * x

    def right_inverse(self, x):
        return x / 2


def _run(a, t, x):
    ya, yt = a(mt.tensor(x)), t(torch.tensor(x))
    np.testing.assert_allclose(ya.detach().numpy(), yt.detach().numpy(), rtol=1e-5, atol=1e-5)
    ya.pow(2).sum().backward()
    yt.pow(2).sum().backward()
    return ya, yt


def test_register_chain_forward_backward_keys():
    a, t = _pair(3, 3)
    P.register_parametrization(a, "weight", Sym())
    torch.nn.utils.parametrize.register_parametrization(t, "weight", TSym())
    assert type(a).__name__ == type(t).__name__ == "ParametrizedLinear"
    assert P.is_parametrized(a) and P.is_parametrized(a, "weight") and not \
        P.is_parametrized(a, "bias")
    _run(a, t, np.ones((2, 3), np.float32))
    np.testing.assert_allclose(a.parametrizations.weight.original.grad.numpy(),
                               t.parametrizations.weight.original.grad.numpy(), rtol=1e-5)
    assert list(a.state_dict()) == list(t.state_dict())
    P.register_parametrization(a, "weight", Double())  # a chain: Double(Sym(original))
    np.testing.assert_allclose(a.weight.detach().numpy(),
                               2 * TSym()(t.parametrizations.weight.original).detach().numpy())
    with pytest.raises(RuntimeError, match="right_inverse"):
        a.weight = mt.zeros(3, 3)  # Sym has no right_inverse


def test_right_inverse_assignment_and_cached():
    a, _ = _pair()
    P.register_parametrization(a, "weight", Double())
    original = a.parametrizations.weight.original
    a.weight = mt.full((4, 3), 6.0)
    assert a.parametrizations.weight.original is original  # the parameter object is kept
    np.testing.assert_array_equal(original.detach().numpy(), np.full((4, 3), 3.0))
    with P.cached():
        assert a.weight is a.weight
    assert a.weight is not a.weight


def test_remove_restores_class_and_values():
    a, _ = _pair()
    P.register_parametrization(a, "weight", Double())
    expected = a.weight.detach().numpy().copy()
    P.remove_parametrizations(a, "weight")
    assert type(a) is mt.nn.Linear and list(a.state_dict()) == ["bias", "weight"]
    np.testing.assert_array_equal(a.weight.detach().numpy(), expected)
    b, _ = _pair()
    before = b.weight.detach().numpy().copy()
    P.register_parametrization(b, "weight", Double())
    P.remove_parametrizations(b, "weight", leave_parametrized=False)
    # the original, which right_inverse set to half the weight at registration (as torch)
    np.testing.assert_array_equal(b.weight.detach().numpy(), before / 2)


def test_state_dict_round_trip_and_deepcopy():
    a, _ = _pair()
    P.register_parametrization(a, "weight", Double())
    c, _ = _pair(seed=5)
    P.register_parametrization(c, "weight", Double())
    c.load_state_dict(a.state_dict())
    np.testing.assert_array_equal(c.weight.detach().numpy(), a.weight.detach().numpy())
    d = copy.deepcopy(a)
    assert type(d) is type(a)
    np.testing.assert_array_equal(d.weight.detach().numpy(), a.weight.detach().numpy())
    with pytest.raises(RuntimeError, match="state_dict"):
        import pickle
        pickle.dumps(a)


@pytest.mark.parametrize("dim", [0, 1, None])
def test_weight_norm_equals_torch(dim):
    a, t = _pair(seed=1)
    PS.weight_norm(a, dim=dim)
    torch.nn.utils.parametrizations.weight_norm(t, dim=dim)
    assert list(a.state_dict()) == list(t.state_dict())
    for k, v in t.state_dict().items():
        np.testing.assert_allclose(a.state_dict()[k].numpy(), v.numpy(), rtol=1e-6)
    _run(a, t, np.arange(6, dtype=np.float32).reshape(2, 3))
    for i in (0, 1):
        np.testing.assert_allclose(
            getattr(a.parametrizations.weight, f"original{i}").grad.numpy(),
            getattr(t.parametrizations.weight, f"original{i}").grad.numpy(), rtol=1e-4,
            atol=1e-5)


@pytest.mark.parametrize("n_iter", [1, 3])
def test_spectral_norm_sigma_equals_torch_from_same_u(n_iter):
    a, t = _pair(5, 4, seed=2)
    PS.spectral_norm(a, n_power_iterations=n_iter)
    torch.nn.utils.parametrizations.spectral_norm(t, n_power_iterations=n_iter)
    assert list(a.state_dict()) == list(t.state_dict())
    sn, tsn = a.parametrizations.weight[0], t.parametrizations.weight[0]
    with mt.no_grad():
        sn._u.copy_(mt.tensor(tsn._u.numpy()))
        sn._v.copy_(mt.tensor(tsn._v.numpy()))
    for _ in range(2):  # training mode: each access iterates, from the same vectors
        _run(a, t, np.ones((2, 4), np.float32))
        np.testing.assert_allclose(sn._u.numpy(), tsn._u.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.parametrizations.weight.original.grad.numpy(),
                               t.parametrizations.weight.original.grad.numpy(), rtol=1e-4,
                               atol=1e-5)
    a.eval()
    u = sn._u.numpy().copy()
    _ = a.weight
    np.testing.assert_array_equal(sn._u.numpy(), u)  # no iteration in eval mode
    w = a.parametrizations.weight.original.detach().numpy()
    sigma = np.linalg.svd(w, compute_uv=False)[0]
    np.testing.assert_allclose(np.linalg.svd(a.weight.detach().numpy(), compute_uv=False)[0],
                               1.0, rtol=1e-2)  # sigma estimate close to the exact one
    assert sigma > 1.0


def test_orthogonal_cayley_equals_torch_square():
    a, t = _pair(3, 3, seed=3)
    PS.orthogonal(a, orthogonal_map="cayley")
    torch.nn.utils.parametrizations.orthogonal(t, orthogonal_map="cayley")
    assert list(a.state_dict()) == list(t.state_dict())
    np.testing.assert_allclose(a.weight.detach().numpy(), t.weight.detach().numpy(), atol=1e-5)
    _run(a, t, np.ones((2, 3), np.float32))
    b, _ = _pair(5, 3)
    PS.orthogonal(b)
    w = b.weight.detach().numpy()
    np.testing.assert_allclose(w.T @ w, np.eye(3), atol=1e-5)
    with pytest.raises(NotImplementedError, match="cayley"):
        PS.orthogonal(_pair()[0], orthogonal_map="matrix_exp")


@pytest.mark.parametrize("cls, dim", [("Conv2d", 0), ("ConvTranspose2d", 1)])
def test_spectral_norm_on_convolutions_as_gan_layers(cls, dim):
    a = getattr(mt.nn, cls)(3, 4, 3)
    t = getattr(torch.nn, cls)(3, 4, 3)
    t.load_state_dict({k: torch.tensor(v.numpy()) for k, v in a.state_dict().items()})
    PS.spectral_norm(a)
    torch.nn.utils.parametrizations.spectral_norm(t)
    sn, tsn = a.parametrizations.weight[0], t.parametrizations.weight[0]
    assert sn.dim == tsn.dim == dim and tuple(sn._u.shape) == tuple(tsn._u.shape)
    with mt.no_grad():
        sn._u.copy_(mt.tensor(tsn._u.numpy()))
        sn._v.copy_(mt.tensor(tsn._v.numpy()))
    x = np.random.default_rng(4).standard_normal((2, 3, 6, 6)).astype(np.float32)
    _run(a, t, x)


DDP_PROGRAM = '''
import sys

import numpy as np
import mpitensor as torch
import mpitensor.distributed as dist
from mpitensor.nn.parallel import DistributedDataParallel as DDP
from mpitensor.nn.utils import parametrizations, prune

dist.init_process_group("mpi")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
parametrizations.weight_norm(net[0])
parametrizations.spectral_norm(net[2])
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.tensor(np.random.default_rng(rank).standard_normal((5, 4)).astype(np.float32))
model(x).pow(2).sum().backward()
g = net[0].parametrizations.weight.original1.grad.clone()
everyone = [torch.zeros_like(g) for _ in range(dist.get_world_size())]
dist.all_gather(everyone, g)
assert all(bool((e == everyone[0]).all()) for e in everyone), "gradients differ"
opt.step()
keys = sorted(model.module.state_dict())
assert "0.parametrizations.weight.original0" in keys and "2.parametrizations.weight.0._u" in keys
sys.stdout.write(f"OK {rank}\\n")  # one write: two ranks' pieces cannot interleave
sys.stdout.flush()
dist.destroy_process_group()
'''


def test_parametrized_model_under_ddp_two_ranks(tmp_path):
    import sys

    from .launch import ROOT, mpiexec_run
    script = tmp_path / "ddp_param.py"
    script.write_text(DDP_PROGRAM)
    proc = mpiexec_run(2, [sys.executable, str(script)], timeout=240, cwd=ROOT)
    assert not proc.timed_out, proc.output[-4000:]
    assert proc.returncode == 0, proc.output[-4000:]
    assert sorted(line for line in proc.output.splitlines() if line.startswith("OK")) == \
        ["OK 0", "OK 1"]


def test_buffer_parametrized_stays_a_buffer_and_module_moves():
    m = mt.nn.BatchNorm1d(3)
    P.register_parametrization(m, "running_var", Double())
    assert "parametrizations.running_var.original" in m.state_dict()
    assert not any(n.endswith("running_var.original") for n, _ in m.named_parameters())
    np.testing.assert_array_equal(m.running_var.numpy(), np.ones(3))
    m.double()
    assert m.parametrizations.running_var.original.dtype == mt.float64
    assert m.running_var.dtype == mt.float64
