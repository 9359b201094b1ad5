"""``nn.DataParallel`` and its building blocks (scatter, gather, replicate, parallel_apply).

On a CPU-only machine DataParallel calls the module directly, as torch does; that path is
checked against ``torch.nn.DataParallel``. The several-GPU path is made of functions that take
any devices, so it runs here on "fake GPUs" (the CPU listed several times): the outputs, the
gradients summed into the original parameters and the BatchNorm statistics are those of
torch's DataParallel semantics, computed with torch chunk by chunk. The GPU tests run where
CuPy and GPUs are present.
"""

from __future__ import annotations

import collections
import importlib
import warnings

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.nn as nn
import mpitensor.nn.functional as F  # noqa: N812 - torch's spelling
from mpitensor.nn.parallel import (
    DataParallel,
    data_parallel,
    gather,
    parallel_apply,
    replicate,
    scatter,
)
from mpitensor.nn.parallel.scatter_gather import scatter_kwargs

# the submodule (the package's attribute of that name is the function, as in torch)
dp_mod = importlib.import_module("mpitensor.nn.parallel.data_parallel")

CPU = mt.device("cpu")
Pair = collections.namedtuple("Pair", "a b")


def val(t):
    return np.array(t.detach().numpy(), copy=True)


def net(seed=0):
    mt.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 2)).double()


def torch_net(torch, mine):
    tn = torch.nn
    theirs = tn.Sequential(tn.Linear(5, 6), tn.BatchNorm1d(6), tn.ReLU(), tn.Linear(6, 2))
    theirs = theirs.double()
    state = {k: torch.from_numpy(val(v)) for k, v in mine.state_dict().items()}
    theirs.load_state_dict(state)
    return theirs


def batch(n=7, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 5)), rng.standard_normal((n, 2))


@pytest.fixture
def fake_gpus(monkeypatch):
    """DataParallel believes the CPU is three GPUs."""
    monkeypatch.setattr(dp_mod, "_gpu_devices", lambda ids: [CPU] * 3)


# --------------------------------------------------------------------------------------------
# CPU-only: the module is called directly, as torch.nn.DataParallel does without GPUs


def test_cpu_calls_the_module_directly():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU: its DataParallel would not take the CPU path")
    inner = net()
    model = DataParallel(inner)
    tmodel = torch.nn.DataParallel(torch_net(torch, inner))
    assert model.module is inner and model.device_ids == tmodel.device_ids == []
    assert model.output_device is None
    assert list(model.state_dict()) == list(tmodel.state_dict())
    assert list(model.state_dict())[0] == "module.0.weight"
    assert [id(p) for p in model.parameters()] == [id(p) for p in inner.parameters()]
    x, y = batch()
    out = model(mt.tensor(x))
    tout = tmodel(torch.from_numpy(x))
    np.testing.assert_allclose(val(out), tout.detach().numpy(), rtol=1e-12)
    ((out - mt.tensor(y)) ** 2).mean().backward()
    ((tout - torch.from_numpy(y)) ** 2).mean().backward()
    for p, q in zip(model.parameters(), tmodel.parameters()):
        np.testing.assert_allclose(val(p.grad), q.grad.numpy(), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(val(inner[1].running_mean), tmodel.module[1].running_mean.numpy(),
                               rtol=1e-12)
    model.eval()
    assert not inner.training
    # loading a state dict saved from the wrapper, and from torch's wrapper
    fresh = DataParallel(net(seed=5))
    fresh.load_state_dict(model.state_dict())
    for p, q in zip(fresh.parameters(), model.parameters()):
        np.testing.assert_array_equal(val(p), val(q))


def test_cpu_passes_keyword_arguments_and_any_output():
    class Two(nn.Module):
        def forward(self, x, scale=1.0, extra=None):
            return {"y": x * scale, "extra": extra}

    out = DataParallel(Two())(mt.ones(2), scale=3.0, extra="kept")
    assert out["extra"] == "kept" and val(out["y"]).tolist() == [3.0, 3.0]


def test_device_ids_are_ignored_without_gpus():
    """torch ignores device_ids when no GPU can be used."""
    model = DataParallel(nn.Linear(2, 1), device_ids=[0, 1], output_device=1)
    assert model.device_ids == [] and tuple(model(mt.ones(3, 2)).shape) == (3, 1)


def test_data_parallel_function_needs_a_gpu_like_torch():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU")
    with pytest.raises(RuntimeError):
        torch.nn.parallel.data_parallel(torch.nn.Linear(2, 1), torch.ones(3, 2))
    with pytest.raises(RuntimeError, match="no usable GPU"):
        data_parallel(nn.Linear(2, 1), mt.ones(3, 2))


def test_rejects_non_modules():
    with pytest.raises(TypeError, match="must be an mpitensor.nn.Module"):
        DataParallel(lambda x: x)


def test_exported_where_torch_has_them():
    import mpitensor.nn.parallel as par

    assert nn.DataParallel is DataParallel is par.DataParallel
    for name in ("DataParallel", "data_parallel", "replicate", "scatter", "gather",
                 "parallel_apply", "DistributedDataParallel"):
        assert name in par.__all__
    assert "DataParallel" in nn.__all__


# --------------------------------------------------------------------------------------------
# scatter / gather


@pytest.mark.parametrize("n,k", [(7, 3), (6, 3), (4, 3), (2, 3), (5, 1)])
def test_scatter_chunks_like_torch_chunk(n, k):
    torch = pytest.importorskip("torch")
    x = mt.arange(float(n * 2)).reshape(n, 2)
    parts = scatter(x, [CPU] * k)
    want = torch.arange(float(n * 2)).reshape(n, 2).chunk(k, 0)
    assert len(parts) == len(want)
    for p, w in zip(parts, want):
        np.testing.assert_array_equal(val(p), w.numpy())


def test_scatter_structures():
    x = mt.arange(12.0).reshape(6, 2)
    parts = scatter((x, [x, 5], {"k": x, "s": "same"}, Pair(x, None)), [CPU, CPU], dim=0)
    assert len(parts) == 2
    for i, (a, lst, d, pair) in enumerate(parts):
        rows = slice(3 * i, 3 * i + 3)
        np.testing.assert_array_equal(val(a), val(x)[rows])
        assert isinstance(lst, list) and lst[1] == 5
        np.testing.assert_array_equal(val(lst[0]), val(x)[rows])
        assert d["s"] == "same" and isinstance(pair, Pair) and pair.b is None
        np.testing.assert_array_equal(val(pair.a), val(x)[rows])
    cols = scatter(x, [CPU, CPU], dim=1)
    np.testing.assert_array_equal(val(cols[1]), val(x)[:, 1:])


def test_scatter_is_differentiable():
    x = mt.tensor(np.arange(6.0), requires_grad=True)
    a, b = scatter(x, [CPU, CPU])
    (a.sum() * 2 + b.sum() * 3).backward()
    assert val(x.grad).tolist() == [2, 2, 2, 3, 3, 3]


def test_scatter_kwargs_pads_the_shorter_side():
    x = mt.zeros(4, 1)
    ins, kws = scatter_kwargs((x,), {}, [CPU, CPU])
    assert len(ins) == len(kws) == 2 and kws == ({}, {})
    ins, kws = scatter_kwargs((), {"x": x}, [CPU, CPU])
    assert ins == ((), ()) and all(tuple(k["x"].shape) == (2, 1) for k in kws)
    assert scatter_kwargs((), {}, [CPU]) == ((), ())


def test_gather_structures_and_dims():
    a, b = mt.ones(2, 3), mt.zeros(1, 3)
    assert tuple(gather([a, b], CPU).shape) == (3, 3)
    assert tuple(gather([a, mt.zeros(2, 1)], -1, dim=1).shape) == (2, 4)
    out = gather([{"y": a, "n": None, "p": Pair(a, [a])}, {"y": b, "n": None, "p": Pair(b, [b])}],
                 "cpu")
    assert tuple(out["y"].shape) == (3, 3) and out["n"] is None
    assert isinstance(out["p"], Pair) and tuple(out["p"].b[0].shape) == (3, 3)
    with pytest.raises(ValueError, match="different keys"):
        gather([{"y": a}, {"z": a}], CPU)
    with pytest.raises(TypeError, match="cannot gather outputs of type int"):
        gather([1, 2], CPU)


def test_gather_scalars_become_a_vector_with_a_warning():
    with pytest.warns(UserWarning, match="scalar"):
        v = gather([mt.tensor(1.5), mt.tensor(2.5)], CPU)
    assert val(v).tolist() == [1.5, 2.5]


def test_gather_is_differentiable():
    a = mt.tensor(np.ones((1, 2)), requires_grad=True)
    b = mt.tensor(np.ones((2, 2)), requires_grad=True)
    (gather([a, b], CPU) * mt.tensor(np.arange(6.0).reshape(3, 2))).sum().backward()
    assert val(a.grad).tolist() == [[0, 1]] and val(b.grad).tolist() == [[2, 3], [4, 5]]


# --------------------------------------------------------------------------------------------
# replicate / parallel_apply


class Shared(nn.Module):
    """Two references to one layer, a buffer, a None parameter."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.again = self.lin
        self.register_buffer("count", mt.zeros(1))
        self.register_parameter("unset", None)

    def forward(self, x):
        self.count._data += 1
        return self.again(self.lin(x))


def test_replicate_structure():
    mt.manual_seed(3)
    m = Shared()
    reps = replicate(m, [CPU, CPU, CPU])
    assert len(reps) == 3 and len({id(r) for r in reps}) == 3
    for j, r in enumerate(reps):
        assert type(r) is Shared and r is not m and r._is_replica
        assert r.lin is r.again and r.lin is not m.lin  # sharing kept inside each replica
        assert list(r.parameters()) == []  # non-leaf copies are plain attributes, as torch
        assert r.lin.weight.grad_fn is not None and not r.lin.weight.is_leaf
        np.testing.assert_array_equal(val(r.lin.weight), val(m.lin.weight))
        assert r.unset is None
        # the first replica shares the buffers; the others have copies
        assert (r.count is m.count) == (j == 0)
        np.testing.assert_array_equal(val(r.count), val(m.count))
    assert m.lin.weight.is_leaf and len(list(m.parameters())) == 2


def test_replica_gradients_sum_into_the_original():
    mt.manual_seed(4)
    m = Shared().double()
    xs = [mt.tensor(np.random.default_rng(i).standard_normal((2, 3))) for i in range(3)]
    reps = replicate(m, [CPU] * 3)
    sum(r(x).sum() for r, x in zip(reps, xs)).backward()
    mt.manual_seed(4)
    ref = Shared().double()
    sum(ref(x).sum() for x in xs).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        np.testing.assert_allclose(val(p.grad), val(q.grad), rtol=1e-12)
    # buffers: only the first replica's in-place update reached the original
    assert val(m.count).tolist() == [1.0] and val(reps[1].count).tolist() == [1.0]


def test_replicate_detached_and_under_no_grad():
    m = nn.Linear(2, 1)
    (r,) = replicate(m, [CPU], detach=True)
    assert r.weight.grad_fn is None and not r.weight.requires_grad
    with mt.no_grad():
        (r,) = replicate(m, [CPU])
    assert r.weight.grad_fn is None
    with pytest.raises(TypeError, match="must be an mpitensor.nn.Module"):
        replicate(object(), [CPU])
    assert replicate(m, []) == []


def test_parallel_apply_order_kwargs_and_errors():
    class Scale(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        def forward(self, x, bias=0.0):
            if self.k < 0:
                raise ValueError("negative")
            return x * self.k + bias

    outs = parallel_apply([Scale(1), Scale(2)], [mt.ones(1), (mt.ones(1),)],
                          [{}, {"bias": 5.0}], [CPU, "cpu"])
    assert [float(o) for o in outs] == [1.0, 7.0]
    with pytest.raises(ValueError, match="negative") as info:
        parallel_apply([Scale(1), Scale(-1)], [(mt.ones(1),), (mt.ones(1),)])
    assert "replica 1 on device cpu" in "".join(info.value.__notes__)
    with pytest.raises(ValueError, match="2 modules but 1 inputs"):
        parallel_apply([Scale(1), Scale(2)], [(mt.ones(1),)])


# --------------------------------------------------------------------------------------------
# DataParallel over several devices (fake GPUs: the CPU three times)


def test_fake_gpus_match_torch_semantics(fake_gpus):
    """Batch of 8 over 3 replicas (chunks 3, 3, 2): each replica's BatchNorm uses its own
    chunk; outputs are the chunks' outputs concatenated; gradients are summed into the
    module; the running statistics are those of the first chunk only. torch computes the
    same chunk by chunk."""
    torch = pytest.importorskip("torch")
    inner = net(seed=2)
    first_only = torch_net(torch, inner)
    chunked = torch_net(torch, inner)
    model = DataParallel(inner)
    assert model.device_ids == [-1, -1, -1] and model.output_device == -1
    x, y = batch(8)
    xt = mt.tensor(x, requires_grad=True)
    out = model(xt)
    loss = ((out - mt.tensor(y)) ** 2).mean()
    loss.backward()
    tx = torch.from_numpy(x).requires_grad_()
    tout = torch.cat([chunked(c) for c in tx.chunk(3)])
    ((tout - torch.from_numpy(y)) ** 2).mean().backward()
    first_only(torch.from_numpy(x).chunk(3)[0])
    np.testing.assert_allclose(val(out), tout.detach().numpy(), rtol=1e-12, atol=1e-14)
    for (name, p), q in zip(inner.named_parameters(), chunked.parameters()):
        np.testing.assert_allclose(val(p.grad), q.grad.numpy(), rtol=1e-10, atol=1e-14,
                                   err_msg=name)
    np.testing.assert_allclose(val(xt.grad), tx.grad.numpy(), rtol=1e-10, atol=1e-14)
    bn, tbn = inner[1], first_only[1]
    np.testing.assert_allclose(val(bn.running_mean), tbn.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(val(bn.running_var), tbn.running_var.numpy(), rtol=1e-12)
    assert int(val(bn.num_batches_tracked)) == 1
    # eval mode: the running statistics, the same for every chunk: the plain module's output
    model.eval()
    with mt.no_grad():
        np.testing.assert_allclose(val(model(mt.tensor(x))), val(inner(mt.tensor(x))),
                                   rtol=1e-12)


def test_fake_gpus_training_steps_equal_plain_training_without_batchnorm(fake_gpus):
    """Without batch statistics, DataParallel is plain training on the whole batch."""
    def mlp():
        mt.manual_seed(9)
        return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2)).double()

    plain, inner = mlp(), mlp()
    model = DataParallel(inner)
    opts = [mt.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (plain, model)]
    for step in range(3):
        x, y = batch(8, seed=step)
        for m, opt in zip((plain, model), opts):
            opt.zero_grad()
            F.mse_loss(m(mt.tensor(x)), mt.tensor(y)).backward()
            opt.step()
    for p, q in zip(plain.parameters(), inner.parameters()):
        np.testing.assert_allclose(val(p), val(q), rtol=1e-12, atol=1e-14)


def test_fake_gpus_small_batch_uses_fewer_replicas(fake_gpus, monkeypatch):
    used = []
    real = DataParallel.replicate

    def spy(self, module, devices):
        used.append(len(devices))
        return real(self, module, devices)

    monkeypatch.setattr(DataParallel, "replicate", spy)
    model = DataParallel(nn.Linear(5, 2).double())
    out = model(mt.tensor(batch(2)[0]))
    assert used == [2] and tuple(out.shape) == (2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a (2,)-shaped output is gathered without a warning
        model(mt.tensor(batch(4)[0]))


def test_fake_gpus_kwargs_and_no_arguments(fake_gpus):
    class Kw(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(mt.ones(1))

        def forward(self, x=None, scale=None):
            if x is None:
                return self.w * 2
            return x * scale * self.w

    model = DataParallel(Kw())
    out = model(x=mt.arange(6.0), scale=mt.full((6,), 2.0))
    assert val(out).tolist() == [0, 2, 4, 6, 8, 10]
    assert val(model()).tolist() == [2.0]  # no arguments: one call


def test_fake_gpus_module_on_another_device(monkeypatch):
    """The module must live on device_ids[0]."""
    cuda0 = mt.device("cuda", 0)
    monkeypatch.setattr(dp_mod, "_gpu_devices", lambda ids: [cuda0, cuda0])
    model = DataParallel(nn.Linear(2, 1))
    assert model.device_ids == [0, 0] and model.output_device == 0
    with pytest.raises(RuntimeError, match=r"must be on cuda:0 \(device_ids\[0\]\), but one is "
                                           "on cpu"):
        model(mt.ones(2, 2))


def test_backward_device_guard(monkeypatch):
    """Every node made by a multi-device forward makes its device current in backward (the
    gradient's, or for a copy between devices its source's); the caller's is put back."""
    calls = []
    monkeypatch.setattr(dp_mod, "_use_device", lambda d: calls.append(d))
    monkeypatch.setattr(dp_mod, "_current_device", lambda: "caller's device")
    mt.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1)).double()
    x = mt.tensor(np.ones((4, 3)), requires_grad=True)
    pre = x * 2  # made before DataParallel's forward: not hooked
    ins, kws = scatter_kwargs((pre,), {}, [CPU, CPU])
    reps = replicate(m, [CPU, CPU])
    out = gather(parallel_apply(reps, ins, kws), CPU)
    hooked = dp_mod._guard_backward(out, [pre])
    assert hooked > 0
    out.sum().backward(retain_graph=True)
    assert len(calls) == hooked + 1 and calls[-1] == "caller's device"
    assert all(c == CPU for c in calls[:-1])
    out.sum().backward()  # a second backward hooks again and restores again
    assert len(calls) == 2 * (hooked + 1) and calls[-1] == "caller's device"
    assert val(x.grad).shape == (4, 3)


# --------------------------------------------------------------------------------------------
# GPUs


def _gpus():
    return mt.cuda.device_count() if mt.cuda.is_available() else 0


@pytest.mark.gpu
def test_gpu_one_device_runs_the_module_there():
    if _gpus() < 1:
        pytest.skip("no GPU")
    inner = net()
    ref = net()
    model = DataParallel(inner, device_ids=[0])
    assert inner[0].weight.device == mt.device("cuda", 0)
    x, y = batch()
    out = model(mt.tensor(x))
    assert out.device == mt.device("cuda", 0)
    np.testing.assert_allclose(val(out.cpu()), val(ref(mt.tensor(x))), rtol=1e-10)


@pytest.mark.gpu
def test_gpu_several_devices_match_the_cpu():
    if _gpus() < 2:
        pytest.skip("fewer than 2 GPUs")
    k = _gpus()
    mt.manual_seed(1)
    plain = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2)).double()
    mt.manual_seed(1)
    inner = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2)).double().cuda(0)
    model = DataParallel(inner)
    assert model.device_ids == list(range(k))
    x, y = batch(4 * k)
    out = model(mt.tensor(x).cuda(0))
    assert out.device == mt.device("cuda", 0)
    F.mse_loss(out, mt.tensor(y).cuda(0)).backward()
    F.mse_loss(plain(mt.tensor(x)), mt.tensor(y)).backward()
    np.testing.assert_allclose(val(out.cpu()), val(plain(mt.tensor(x))), rtol=1e-10)
    for p, q in zip(inner.parameters(), plain.parameters()):
        assert p.grad.device == mt.device("cuda", 0)
        np.testing.assert_allclose(val(p.grad.cpu()), val(q.grad), rtol=1e-9, atol=1e-12)
    assert mt.cuda.current_device() == 0
