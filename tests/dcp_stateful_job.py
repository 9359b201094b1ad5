"""A job for tests/test_dcp_stateful.py: torch's DCP recipe, written our way, on fully_shard.

    mpiexec -n 4 python tests/dcp_stateful_job.py save DIR        (train, save {"app": AppState})
    mpiexec -n K python tests/dcp_stateful_job.py load DIR        (K ranks, fresh fully_shard model)
    python tests/dcp_stateful_job.py plain DIR                    (no process group: a plain model)
    mpiexec -n K python tests/dcp_stateful_job.py async DIR       (async_save while training)
    mpiexec -n 2 python tests/dcp_stateful_job.py errors DIR      (bad input: every rank raises)
    mpiexec -n 2 python tests/dcp_stateful_job.py kill DIR        (rank 1 dies in the write)

``save`` also writes ``DIR.ref`` (mpitensor.save of the full model and optimizer state at the
save); every later mode compares what it loaded with it bit for bit and prints
``rank R ok N`` (N: values compared), or fails.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Dict, List, Tuple

import numpy as np

import mpitensor as torch
import mpitensor.distributed as dist
import mpitensor.distributed.checkpoint as dcp
import mpitensor.nn as nn
from mpitensor.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from mpitensor.distributed.checkpoint.stateful import Stateful
from mpitensor.distributed.fsdp import fully_shard

FULL = StateDictOptions(full_state_dict=True)


class AppState(Stateful):
    """The model and optimizer behind one checkpoint entry, as torch's recipe wraps them."""

    def __init__(self, model: nn.Module, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> Dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(16, 16)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(16, 8)

    def forward(self, x: Any) -> Any:
        return self.net2(self.relu(self.net1(x)))


def build(sharded: bool, seed: int = 0) -> Tuple[nn.Module, Any]:
    torch.manual_seed(seed)
    model = Toy()
    if sharded:
        fully_shard(model.net1)
        fully_shard(model.net2)
        fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def train(model: nn.Module, optimizer: Any, step: int) -> None:
    gen = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    optimizer.zero_grad()
    model(torch.rand(8, 16, generator=gen)).sum().backward()
    optimizer.step()


def frozen(x: Any) -> Any:
    """A copy that later training cannot change (a state dict shares the optimizer's tensors)."""
    if isinstance(x, dict):
        return {k: frozen(v) for k, v in x.items()}
    if isinstance(x, list):
        return [frozen(v) for v in x]
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def full_state(model: nn.Module, optimizer: Any, distributed: bool = True) -> Dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optimizer,
                                        options=FULL if distributed else None)
    return frozen({"model": model_sd, "optim": optim_sd})


def flat(x: Any, prefix: str = "") -> List[Tuple[str, Any]]:
    if isinstance(x, dict):
        return [kv for k in sorted(x, key=str) for kv in flat(x[k], f"{prefix}{k}.")]
    if isinstance(x, (list, tuple)):
        return [kv for i, v in enumerate(x) for kv in flat(v, f"{prefix}{i}.")]
    return [(prefix[:-1], x)]


def compare(got: Dict[str, Any], ref: Dict[str, Any]) -> int:
    """How many values ``got`` holds exactly as ``ref`` does; AssertionError otherwise."""
    a, b = dict(flat(got)), dict(flat(ref))
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for key, want in b.items():
        have = a[key]
        if isinstance(want, torch.Tensor):
            have = have.full_tensor() if hasattr(have, "full_tensor") else have
            assert have.dtype == want.dtype and tuple(have.shape) == tuple(want.shape), key
            assert np.asarray(have.numpy()).tobytes() == np.asarray(want.numpy()).tobytes(), key
        else:
            assert have == want, (key, have, want)
    return len(b)


def say(text: str) -> None:
    sys.stdout.write(f"rank {dist.get_rank() if dist.is_initialized() else 0} {text}\n")
    sys.stdout.flush()


def save(path: str) -> None:
    model, optimizer = build(True)
    for step in range(3):
        train(model, optimizer, step)
    dcp.save({"app": AppState(model, optimizer), "step": 3}, checkpoint_id=path)
    ref = full_state(model, optimizer)
    if dist.get_rank() == 0:
        torch.save(ref, path + ".ref")
    say("saved")


def load(path: str) -> None:
    model, optimizer = build(True, seed=7)  # other initial values: the load must set them all
    sd = {"app": AppState(model, optimizer), "step": -1}
    dcp.load(sd, checkpoint_id=path)
    assert sd["step"] == 3, sd["step"]
    assert isinstance(sd["app"], AppState)
    say(f"ok {compare(full_state(model, optimizer), torch.load(path + '.ref')) + 1}")


def plain(path: str) -> None:
    """The recipe's third program: no process group, a model nobody sharded."""
    assert not dist.is_initialized()
    model, optimizer = build(False, seed=7)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state_dict = {"app": {"model": model_sd, "optim": optim_sd}}
    dcp.load(state_dict, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state_dict["app"]["model"],
                   optim_state_dict=state_dict["app"]["optim"])
    got = full_state(model, optimizer, distributed=False)
    say(f"ok {compare(got, torch.load(path + '.ref'))}")


class SlowOnRank0(dcp.FileSystemWriter):
    """Rank 0 writes slowly: the other ranks' writer threads wait in their agreement while
    every main thread trains (collectives on the program's group) meanwhile."""

    def write_item(self, fh: Any, fqn: str, obj: Any) -> Tuple[int, int]:
        if dist.get_rank() == 0:
            time.sleep(0.02)
        return super().write_item(fh, fqn, obj)


def run_async(path: str) -> None:
    """async_save every step while training goes on (its collectives run meanwhile); each
    checkpoint holds the values of its call, not the later ones."""
    model, optimizer = build(True)
    refs, future = [], None
    for step in range(4):
        train(model, optimizer, step)
        if future is not None:
            future.result()
        future = dcp.async_save({"app": AppState(model, optimizer)},
                                checkpoint_id=f"{path}_step{step}",
                                storage_writer=SlowOnRank0(path))
        refs.append(full_state(model, optimizer))
        for extra in range(2):  # training (collectives on the program's group) meanwhile
            train(model, optimizer, 100 + 10 * step + extra)
    meta = future.result()
    assert meta.storage_meta.checkpoint_id == os.path.abspath(f"{path}_step3")
    count = 0
    for step, ref in enumerate(refs):
        fresh, opt = build(True, seed=9)
        dcp.load({"app": AppState(fresh, opt)}, checkpoint_id=f"{path}_step{step}")
        count += compare(full_state(fresh, opt), ref)
    say(f"ok {count}")


class ReturnsList:
    def state_dict(self) -> Any:
        return [1, 2] if dist.get_rank() == 1 else {"x": 1}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        raise AssertionError("never reached")


def _raises(what: str, fn: Any, error: type, needle: str) -> None:
    try:
        fn()
    except error as exc:
        assert needle in str(exc), (what, str(exc))
        say(f"raised {what}")
        return
    raise AssertionError(f"{what}: no {error.__name__}")


def errors(path: str) -> None:
    """Bad input: a clear error on every rank, before any data moves."""
    model, optimizer = build(True)
    train(model, optimizer, 0)
    dcp.save({"app": AppState(model, optimizer)}, checkpoint_id=path)
    before = full_state(model, optimizer)
    _raises("stateful-save", lambda: dcp.save({"bad": ReturnsList()}, checkpoint_id=path + "x"),
            ValueError, "returned list, not a dict")
    _raises("stateful-async", lambda: dcp.async_save({"bad": ReturnsList()},
                                                     checkpoint_id=path + "x"),
            ValueError, "returned list, not a dict")
    _raises("stateful-load", lambda: dcp.load({"bad": ReturnsList()}, checkpoint_id=path),
            ValueError, "returned list, not a dict")
    assert not os.path.exists(path + "x")

    torch.manual_seed(3)
    other = nn.Sequential(nn.Linear(16, 4), nn.Linear(4, 8))  # another model
    fully_shard(other)
    other_opt = torch.optim.Adam(other.parameters(), lr=0.1)
    other_before = full_state(other, other_opt)
    _raises("other-model", lambda: dcp.load({"app": AppState(other, other_opt)},
                                            checkpoint_id=path),
            ValueError, "does not fit the state_dict")
    compare(full_state(other, other_opt), other_before)  # nothing was loaded
    _raises("missing-dir", lambda: dcp.load({"app": AppState(model, optimizer)},
                                            checkpoint_id=path + "_missing"),
            dcp.CheckpointError, "does not exist")
    say(f"ok {compare(full_state(model, optimizer), before)}")


class DieMidWrite(dcp.FileSystemWriter):
    """Rank 1 writes part of a record in async_save's writer thread, then is killed."""

    def write_item(self, fh: Any, fqn: str, obj: Any) -> Tuple[int, int]:
        if dist.get_rank() == 1:
            fh.write(b"PK\x03\x04 part of a record")
            fh.flush()
            say(f"dies writing {fqn}")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().write_item(fh, fqn, obj)


def kill(path: str) -> None:
    model, optimizer = build(True)
    for step in range(5):
        train(model, optimizer, 50 + step)
    future = dcp.async_save({"app": AppState(model, optimizer), "step": 5},
                            storage_writer=DieMidWrite(path))
    train(model, optimizer, 99)
    future.result()


def main() -> None:
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "plain":
        plain(path)
        return
    dist.init_process_group("mpi")
    {"save": save, "load": load, "async": run_async, "errors": errors, "kill": kill}[mode](path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
