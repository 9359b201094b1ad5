"""``distributed.nn.RemoteModule`` against torch's: the same two-worker script runs under each
library (worker0 drives, worker1 hosts the module; separately started, meeting through
MASTER_ADDR/MASTER_PORT) and prints JSON: forward outputs, the input's and the remote
parameters' gradients from distributed autograd, the weights after a DistributedOptimizer
step, in float32 and float64, and the error types of the refused uses."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict

import numpy as np
import pytest

from .launch import run_job
from .test_programs_rpc import free_ports

SCRIPT = r'''
import json, os, pickle, sys
import numpy as np
if os.environ["LIB"] == "torch":
    import torch
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.distributed.nn import RemoteModule
    from torch.distributed.nn.api.remote_module import RemoteModule as FromApi
    from torch.distributed.optim import DistributedOptimizer
else:
    import mpitensor as torch
    import mpitensor.distributed.autograd as dist_autograd
    import mpitensor.distributed.rpc as rpc
    from mpitensor.distributed.nn import RemoteModule
    from mpitensor.distributed.nn.api.remote_module import RemoteModule as FromApi
    from mpitensor.distributed.optim import DistributedOptimizer
nn = torch.nn


class Net(nn.Module):
    """Two layers with fixed weights, so both libraries start from the same numbers."""

    def __init__(self, dtype, scale=1.0):
        super().__init__()
        self.fc1 = nn.Linear(3, 4).to(dtype)
        self.fc2 = nn.Linear(4, 2, bias=False).to(dtype)
        with torch.no_grad():
            for i, p in enumerate([self.fc1.weight, self.fc1.bias, self.fc2.weight]):
                n = p.numel()
                p.copy_(torch.from_numpy(np.cos(np.arange(n) * 0.7 + i) * scale)
                        .reshape(p.shape).to(dtype))

    def forward(self, x, shift=0.0):
        return self.fc2(torch.tanh(self.fc1(x))) + shift


def remote_grads(cid, module_rref):
    grads = dist_autograd.get_gradients(cid)
    return [grads[p].tolist() for p in module_rref.local_value().parameters()]


def weights(module_rref):
    return [p.detach().tolist() for p in module_rref.local_value().parameters()]


def kinds(fn):
    try:
        fn()
    except BaseException as exc:
        return [isinstance(exc, ValueError), isinstance(exc, RuntimeError),
                isinstance(exc, TypeError)]
    return "no error"


rank = int(sys.argv[1])
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2,
             rpc_backend_options=rpc.TensorPipeRpcBackendOptions(num_worker_threads=4))
if rank == 0:
    out = {"same_class": FromApi is RemoteModule}
    for name in ("float32", "float64"):
        dtype = getattr(torch, name)
        rm = RemoteModule("worker1/cpu", Net, args=(dtype,), kwargs={"scale": 0.5})
        x = torch.from_numpy(np.linspace(-1, 1, 15).reshape(5, 3)).to(dtype).requires_grad_()
        with dist_autograd.context() as cid:
            y = rm(x, shift=0.25)
            y2 = rm.forward_async(x * 2).wait()
            loss = (y * y).sum() + y2.sum()
            dist_autograd.backward(cid, [loss])
            rec = {"y": y.tolist(), "y2": y2.tolist(), "loss": loss.item(),
                   "x_grad": dist_autograd.get_gradients(cid)[x].tolist(),
                   "p_grads": rpc.rpc_sync("worker1", remote_grads,
                                           args=(cid, rm.get_module_rref()))}
            params = rm.remote_parameters()
            rec["n_params"] = len(params)
            rec["n_direct"] = len(rm.remote_parameters(recurse=False))
            DistributedOptimizer(torch.optim.SGD, params, lr=0.1).step(cid)
        rec["after"] = rpc.rpc_sync("worker1", weights, args=(rm.get_module_rref(),))
        rec["owner"] = rm.get_module_rref().owner().name
        out[name] = rec
    rm = RemoteModule("rank:1/cpu", Net, args=(torch.float64,))
    out["by_rank"] = rm.get_module_rref().owner().name
    out["no_device"] = RemoteModule("worker1", Net, args=(torch.float64,)).get_module_rref() \
        .owner().name
    errors = {}
    for bad in ("worker1/nodevice", "a/b/c", "rank:x/cpu", "/cpu", "w:1:2/cpu"):
        errors[bad] = kinds(lambda: RemoteModule(bad, Net, args=(torch.float64,)))
    for method, args in (("parameters", ()), ("named_parameters", ()), ("state_dict", ()),
                         ("load_state_dict", ({},)), ("to", ("cpu",)), ("cuda", ()),
                         ("buffers", ()), ("children", ()), ("modules", ()),
                         ("zero_grad", ()), ("requires_grad_", ()), ("apply", (print,)),
                         ("register_forward_hook", (print,)), ("share_memory", ()),
                         ("add_module", ("m", None))):
        errors[method] = kinds(lambda: getattr(rm, method)(*args))
    errors["pickle"] = kinds(lambda: pickle.dumps(rm))
    out["errors"] = errors
    out["train"] = type(rm.train()).__name__
    out["eval"] = type(rm.eval()).__name__
    print("RESULT " + json.dumps(out), flush=True)
rpc.shutdown()
'''


def _run(lib: str, tmp_path: Path) -> Dict:
    script = tmp_path / "remote_module_script.py"
    script.write_text(SCRIPT)
    py = f"'{sys.executable}' '{script}'"
    # two separately started processes, as a user starts two shells; `wait` collects both
    cmd = f"{py} 1 & one=$!; {py} 0; zero=$?; wait $one; exit $((zero | $?))"
    env = {"LIB": lib, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_ports(1)[0]),
           "OMP_NUM_THREADS": "1"}
    rc, out, err, _ = run_job(["timeout", "-k", "5", "150", "sh", "-c", cmd], timeout=170,
                              cwd=tmp_path, env=env)
    assert rc == 0, f"{lib}:\n{out}\n{err}"
    line = [s for s in out.splitlines() if s.startswith("RESULT ")]
    assert line, f"{lib}:\n{out}\n{err}"
    return json.loads(line[0][len("RESULT "):])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Dict]:
    got = {"mpitensor": _run("mpitensor", tmp_path_factory.mktemp("ours"))}
    try:
        import torch  # noqa: F401
    except ImportError:
        return got
    got["torch"] = _run("torch", tmp_path_factory.mktemp("torch"))
    return got


def _flat(x: object) -> list:
    return [v for item in x for v in _flat(item)] if isinstance(x, list) else [x]


def _close(a: object, b: object, rtol: float, what: str) -> None:
    np.testing.assert_allclose(np.array(_flat(a)), np.array(_flat(b)), rtol=rtol, atol=rtol,
                               err_msg=what)


@pytest.mark.parametrize("dtype, rtol", [("float32", 1e-5), ("float64", 1e-12)])
def test_forward_gradients_and_step_match_torch(results: Dict[str, Dict], dtype: str,
                                                rtol: float) -> None:
    """Outputs, the local input's gradient, the remote parameters' gradients (accumulated in
    the context over two forwards) and the weights after one SGD step: as torch's. float32
    tolerance: a few ulps over reductions of at most 5 terms, stacked over two layers."""
    ours = results["mpitensor"][dtype]
    assert ours["owner"] == "worker1" and ours["n_params"] == 3 and ours["n_direct"] == 0
    if "torch" not in results:
        pytest.skip("torch is not installed (the oracle)")
    theirs = results["torch"][dtype]
    for key in ("y", "y2", "loss", "x_grad", "p_grads", "after"):
        _close(ours[key], theirs[key], rtol, f"{dtype} {key}")
    assert (ours["n_params"], ours["n_direct"]) == (theirs["n_params"], theirs["n_direct"])


def test_remote_device_forms_and_refusals_match_torch(results: Dict[str, Dict]) -> None:
    ours = results["mpitensor"]
    assert ours["same_class"] and ours["by_rank"] == "worker1" and ours["no_device"] == "worker1"
    assert ours["errors"]["a/b/c"] == [True, False, False]
    assert ours["errors"]["parameters"] == [True, False, False]
    assert ours["errors"]["pickle"] == [False, True, False]
    assert ours["train"] == ours["eval"] == "Net"
    if "torch" not in results:
        pytest.skip("torch is not installed (the oracle)")
    theirs = results["torch"]
    for key in ("same_class", "by_rank", "no_device", "train", "eval"):
        assert ours[key] == theirs[key], key
    for what, kind in theirs["errors"].items():
        got = ours["errors"][what]
        # an unknown device type: torch raises RuntimeError; ours is a ValueError that is
        # also a RuntimeError (mpitensor.device's error), so `except RuntimeError` still works
        assert [a or b for a, b in zip(got, kind)] == got and any(
            g and k for g, k in zip(got, kind)), (what, got, kind)


GPU_SCRIPT = r'''
import json
import numpy as np
import mpitensor as torch
import mpitensor.distributed as dist
import mpitensor.distributed.autograd as dist_autograd
import mpitensor.distributed.rpc as rpc
from mpitensor.distributed.nn import RemoteModule


def make(seed):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 2).double()


rank = dist.launcher_rank()
rpc.init_rpc(f"worker{rank}")
if rank == 0:
    rm = RemoteModule("worker1/cuda:0", make, args=(7,))
    local = make(7)
    x = torch.from_numpy(np.linspace(-1, 1, 12).reshape(4, 3)).requires_grad_()
    x_local = x.detach().clone().requires_grad_()
    with dist_autograd.context() as cid:
        y = rm(x)
        dist_autograd.backward(cid, [(y * y).sum()])
        gx = dist_autograd.get_gradients(cid)[x]
    y_local = local(x_local)
    (y_local * y_local).sum().backward()
    print("RESULT " + json.dumps({"device": str(y.device),
                                  "y": float((y - y_local).abs().max()),
                                  "gx": float((gx - x_local.grad).abs().max())}), flush=True)
rpc.shutdown()
'''


@pytest.mark.gpu
def test_gpu_remote_module_returns_cpu_tensors(tmp_path: Path) -> None:
    """``"worker1/cuda:0"``: the module is moved to that GPU there, inputs follow it, outputs
    come back on the CPU (torch without device maps); values and gradients as on the CPU."""
    from .launch import find_mpiexec

    script = tmp_path / "gpu_remote_module.py"
    script.write_text(GPU_SCRIPT)
    rc, out, err, _ = run_job([find_mpiexec(), "-n", "2", sys.executable, str(script)],
                              timeout=150, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert rc == 0, f"{out}\n{err}"
    got = json.loads([s for s in out.splitlines() if s.startswith("RESULT ")][0][7:])
    assert got["device"] == "cpu"
    assert got["y"] < 1e-12 and got["gx"] < 1e-12, got
