"""Tensors in shared memory: ``share_memory_``, ``Module.share_memory``, ``is_shared``, and
tensors that cross ``Process`` arguments, ``Queue`` and ``Pipe`` as the same memory.

Before, ``share_memory_`` returned self and shared nothing: a Hogwild! program trained copies
in its children and tested an untrained model (8 % accuracy, no error). Every cross-process
test here asserts values that only shared memory can produce, under each start method.
"""

from __future__ import annotations

import copy
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.multiprocessing as mp
from mpitensor import nn

ROOT = Path(__file__).resolve().parent.parent
HOGWILD = ROOT / "tests" / "programs" / "hogwild.py"
METHODS = [m for m in ("fork", "spawn", "forkserver") if m in mp.get_all_start_methods()]


def test_share_memory_moves_the_data_and_keeps_the_values() -> None:
    for arr in (np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(0, np.float64),
                np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2], np.array(3.5)):
        t = mt.tensor(arr)
        assert not t.is_shared()
        assert t.share_memory_() is t
        assert t.is_shared() and t.share_memory_().is_shared()
        assert t.dtype == arr.dtype and tuple(t.shape) == arr.shape
        assert np.array_equal(t.numpy(), arr)
    t = mt.ones(4).share_memory_()
    assert t[1:3].is_shared()  # a view of shared memory is shared
    # plain pickling and deepcopy copy the values, as torch's do
    assert not pickle.loads(pickle.dumps(t)).is_shared()
    assert not copy.deepcopy(t).is_shared()


def test_share_memory_of_a_view_raises() -> None:
    base = mt.zeros(4)
    view = base[1:]
    with pytest.raises(RuntimeError, match="view"):
        view.share_memory_()


def test_module_share_memory_shares_parameters_buffers_and_grads() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    model(mt.randn(5, 3)).sum().backward()
    before = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    assert model.share_memory() is model
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        assert t.is_shared(), name
        assert np.array_equal(t.detach().numpy(), before[name])
    assert all(p.grad.is_shared() for p in model.parameters())
    # the optimizer updates the shared memory in place
    opt = mt.optim.SGD(model.parameters(), lr=0.5)
    opt.step()
    assert all(p.is_shared() for p in model.parameters())


def _child(model: nn.Module, q: object, conn: object, rank: int) -> None:
    with mt.no_grad():
        model.weight.add_(rank + 1)
    t = q.get()  # through a Queue
    t.add_(10)
    u = conn.recv()  # through a Pipe
    u.mul_(2)
    conn.send(float(t.sum()))


@pytest.mark.parametrize("method", METHODS)
def test_children_write_what_the_parent_reads(method: str) -> None:
    ctx = mp.get_context(method)
    model = nn.Linear(3, 2)
    model.share_memory()
    with mt.no_grad():
        model.weight.zero_()
    q = ctx.Queue()
    t = mt.zeros(4).share_memory_()
    u = mt.ones(2).share_memory_()
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=_child, args=(model, q, pipes[r][1], r)) for r in range(2)]
    for p in procs:
        p.start()
    for _ in procs:
        q.put(t)
    for parent_end, _ in pipes:
        parent_end.send(u)
    seen = [parent_end.recv() for parent_end, _ in pipes]
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert np.array_equal(model.weight.detach().numpy(), np.full((2, 3), 3.0, np.float32))
    assert t.tolist() == [20.0] * 4
    assert u.tolist() == [4.0, 4.0]
    assert all(s in (40.0, 80.0) for s in seen)  # each child saw the shared t


def test_descriptors_are_released_with_the_last_array() -> None:
    code = """
import gc, os
import mpitensor as mt
before = len(os.listdir('/proc/self/fd'))
for _ in range(50):
    t = mt.ones(1000).share_memory_()
    v = t[10:20]
    del t
    assert v.is_shared()
    del v
gc.collect()
print(len(os.listdir('/proc/self/fd')) - before)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


def _run_hogwild(method: str, torch_lib: bool) -> str:
    env = dict(os.environ, USE_MPITENSOR="0" if torch_lib else "1", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, str(HOGWILD), "--start-method", method],
                         capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _accuracies(out: str) -> tuple:
    before = float(re.search(r"before: accuracy (\d\.\d+)", out).group(1))
    after = float(re.search(r"after: accuracy (\d\.\d+)", out).group(1))
    return before, after


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_hogwild_program_trains_the_parents_model(method: str) -> None:
    out = _run_hogwild(method, torch_lib=False)
    before, after = _accuracies(out)
    assert before < 0.6 and after >= 0.95, out
    assert "shared: True" in out


def test_hogwild_program_under_torch_agrees() -> None:
    pytest.importorskip("torch")
    ours = _accuracies(_run_hogwild("spawn", torch_lib=False))[1]
    theirs = _accuracies(_run_hogwild("spawn", torch_lib=True))[1]
    # lock-free updates race differently each run: the same outcome, not the same digits
    assert ours >= 0.95 and theirs >= 0.95


def test_supports_context_flag_of_older_torch() -> None:
    """Programs written for torch before 2.x test ``mp._supports_context`` (torch 2.13 no
    longer has it); it is True wherever multiprocessing has contexts, as here."""
    assert mp._supports_context is True
    assert mp.get_context("spawn") is not None
