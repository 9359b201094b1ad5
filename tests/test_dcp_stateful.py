"""torch's DCP recipes as a user writes them: Stateful values, loading without a process group,
async_save, the writer's options, format_utils, and torch reading our checkpoints and we its.

The multi-rank cases run tests/dcp_stateful_job.py under ``mpiexec`` (save at 4 ranks, load at
2 and at 1 without a process group, async_save while training, bad input, a rank killed in
async_save's write) and recipe-style programs under ``mp.spawn`` with
``init_process_group("gloo", rank=, world_size=)``; each with a hard timeout.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict

import pytest

import mpitensor as mt
import mpitensor.distributed.checkpoint as dcp
from mpitensor.distributed.checkpoint import format_utils
from mpitensor.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from mpitensor.distributed.checkpoint.stateful import Stateful

from .dcp_stateful_job import AppState as App
from .launch import ROOT, mpiexec_run
from .test_dcp_reshard import _job as _reshard_job
from .test_dcp_reshard import _oks

JOB = str(ROOT / "tests" / "dcp_stateful_job.py")
TIMEOUT = 240


# ------------------------------------------------------------------ one process
class Counter:
    """Stateful without subclassing: two methods are enough."""

    def __init__(self, n: int) -> None:
        self.n, self.loaded = n, None

    def state_dict(self) -> Dict[str, Any]:
        return {"n": self.n, "t": mt.full((3,), float(self.n))}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.loaded = state_dict
        self.n = state_dict["n"]


def _model(seed: int) -> mt.nn.Module:
    mt.manual_seed(seed)
    return mt.nn.Sequential(mt.nn.Linear(5, 4), mt.nn.Tanh(), mt.nn.Linear(4, 3))


def _trained(seed: int = 0) -> tuple:
    model = _model(seed)
    opt = mt.optim.Adam(model.parameters(), lr=0.05)
    for i in range(2):
        opt.zero_grad()
        model(mt.full((6, 5), 0.1 * (i + 1))).square().sum().backward()
        opt.step()
    return model, opt


def _same(a: mt.nn.Module, b: mt.nn.Module) -> bool:
    return all(x.detach().numpy().tobytes() == y.detach().numpy().tobytes()
               for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_stateful_is_the_protocol_torch_names() -> None:
    import mpitensor.distributed.checkpoint.stateful as mod

    assert dcp.Stateful is Stateful is mod.Stateful
    assert isinstance(Counter(1), Stateful)
    assert isinstance(mt.nn.Linear(2, 2), Stateful)
    assert isinstance(mt.optim.SGD([mt.zeros(1, requires_grad=True)], lr=1.0), Stateful)
    assert not isinstance({"a": 1}, Stateful) and not isinstance(mt.zeros(1), Stateful)


def test_stateful_values_round_trip(tmp_path: Path) -> None:
    """save writes each Stateful's state_dict(); load fills what state_dict() returns and
    hands it to load_state_dict(). A module and an optimizer are Stateful as they are."""
    model, opt = _trained()
    dcp.save({"model": model, "optim": opt, "c": Counter(4), "step": 9}, checkpoint_id=tmp_path)
    fresh, c = _model(1), Counter(0)
    assert not _same(model, fresh)
    sd = {"model": fresh, "c": c, "step": 0}
    dcp.load(sd, checkpoint_id=tmp_path)
    assert _same(model, fresh) and sd["model"] is fresh and sd["c"] is c
    assert sd["step"] == 9 and c.n == 4
    assert c.loaded["t"].numpy().tolist() == [4.0, 4.0, 4.0]


def _adam_state(opt: Any) -> list:
    return [(k, v.numpy().tobytes() if isinstance(v, mt.Tensor) else v)
            for s in opt.state_dict()["state"].values() for k, v in sorted(s.items())]


def test_app_state_round_trip_and_plain_dict_load(tmp_path: Path) -> None:
    model, opt = _trained()
    dcp.save({"app": App(model, opt)}, checkpoint_id=str(tmp_path / "ck"))
    fresh = _model(3)
    fresh_opt = mt.optim.Adam(fresh.parameters(), lr=0.05)
    dcp.load({"app": App(fresh, fresh_opt)}, checkpoint_id=tmp_path / "ck")
    assert _same(model, fresh) and _adam_state(fresh_opt) == _adam_state(opt)
    # the recipe's second pattern: a plain dict from get_state_dict, set afterwards
    other = _model(4)
    other_opt = mt.optim.Adam(other.parameters(), lr=0.05)
    msd, osd = get_state_dict(other, other_opt)
    sd = {"app": {"model": msd, "optim": osd}}
    dcp.load(state_dict=sd, checkpoint_id=pathlib.PurePath(tmp_path / "ck"))
    set_state_dict(other, other_opt, model_state_dict=sd["app"]["model"],
                   optim_state_dict=sd["app"]["optim"])
    assert _same(model, other) and _adam_state(other_opt) == _adam_state(opt)


@pytest.mark.parametrize("bad", ["list", "raises"])
def test_bad_stateful_raises_before_anything_is_written(tmp_path: Path, bad: str) -> None:
    class Bad:
        def state_dict(self) -> Any:
            if bad == "raises":
                raise KeyError("no such layer")
            return [1, 2]

        def load_state_dict(self, state_dict: Any) -> None:
            raise AssertionError("not reached")

    want = "returned list, not a dict" if bad == "list" else "raised KeyError"
    with pytest.raises(ValueError, match=want):
        dcp.save({"x": Bad()}, checkpoint_id=tmp_path / "ck")
    with pytest.raises(ValueError, match=want):
        dcp.async_save({"x": Bad()}, checkpoint_id=tmp_path / "ck")
    assert os.listdir(tmp_path) == []
    dcp.save({"x": mt.ones(2)}, checkpoint_id=tmp_path / "ck")
    with pytest.raises(ValueError, match=want):
        dcp.load({"x": Bad()}, checkpoint_id=tmp_path / "ck")


def test_load_errors_leave_the_model_alone(tmp_path: Path) -> None:
    model, opt = _trained()
    dcp.save({"app": App(model, opt)}, checkpoint_id=tmp_path / "ck")
    other = mt.nn.Sequential(mt.nn.Linear(5, 2), mt.nn.Tanh(), mt.nn.Linear(2, 3))
    before = [p.detach().clone() for p in other.parameters()]
    with pytest.raises(ValueError, match=r"has shape \(2, 5\) here but \(4, 5\) in the "
                                         r"checkpoint"):
        dcp.load({"app": App(other, mt.optim.Adam(other.parameters()))},
                 checkpoint_id=tmp_path / "ck")
    assert all(a.equal(b) for a, b in zip(before, other.parameters()))
    with pytest.raises(dcp.CheckpointError, match="does not exist"):
        dcp.load({"app": App(model, opt)}, checkpoint_id=tmp_path / "nowhere")


# ------------------------------------------------------------------ async_save, one process
def test_async_save_holds_the_values_at_the_call(tmp_path: Path) -> None:
    model, opt = _trained()
    at_call = [p.detach().clone() for p in model.parameters()]
    future = dcp.async_save({"app": App(model, opt), "step": 2},
                            checkpoint_id=tmp_path / "ck")
    with mt.no_grad():  # training goes on before the write is known to be done
        for p in model.parameters():
            p.mul_(-3.0)
    meta = future.result()
    assert isinstance(meta, dcp.Metadata) and future.done()
    fresh = _model(5)
    sd = {"app": App(fresh, mt.optim.Adam(fresh.parameters())), "step": 0}
    dcp.load(sd, checkpoint_id=tmp_path / "ck")
    assert sd["step"] == 2
    assert all(a.numpy().tobytes() == b.detach().numpy().tobytes()
               for a, b in zip(at_call, fresh.parameters()))


def test_second_async_save_waits_for_the_first(tmp_path: Path) -> None:
    gate = threading.Event()

    class Slow(dcp.FileSystemWriter):
        def write_item(self, fh: Any, fqn: str, obj: Any) -> tuple:
            assert gate.wait(60)
            return super().write_item(fh, fqn, obj)

    first = dcp.async_save({"w": mt.ones(4)}, storage_writer=Slow(tmp_path / "a"))
    assert not first.done()
    threading.Timer(0.2, gate.set).start()
    second = dcp.async_save({"w": mt.zeros(4)}, checkpoint_id=tmp_path / "b")
    assert first.done()  # the second call returned only once the first was written
    second.result()
    for name, value in (("a", 1.0), ("b", 0.0)):
        sd = {"w": mt.full((4,), -1.0)}
        dcp.load(sd, checkpoint_id=tmp_path / name)
        assert sd["w"].tolist() == [value] * 4


def test_async_save_failure_is_raised_by_result(tmp_path: Path) -> None:
    class Broken(dcp.FileSystemWriter):
        def write_item(self, fh: Any, fqn: str, obj: Any) -> tuple:
            raise OSError(28, "No space left on device")

    dcp.save({"w": mt.ones(2)}, checkpoint_id=tmp_path / "ck")
    future = dcp.async_save({"w": mt.zeros(2)}, storage_writer=Broken(tmp_path / "ck"))
    with pytest.raises(dcp.CheckpointError, match="No space left on device"):
        future.result()
    sd = {"w": mt.zeros(2)}
    dcp.load(sd, checkpoint_id=tmp_path / "ck")  # the previous checkpoint is whole
    assert sd["w"].tolist() == [1.0, 1.0]
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_cached_staging_is_reused_and_holds_each_calls_values(tmp_path: Path) -> None:
    w = mt.arange(4, dtype=mt.float32)
    writer = dcp.FileSystemWriter(tmp_path / "x", cache_staged_state_dict=True)
    first = dcp.async_save({"w": w, "old": mt.ones(2)}, storage_writer=writer,
                           checkpoint_id=tmp_path / "a")
    w.add_(10)
    first.result()
    buffer = writer.staged_cache[("w", ((0,), (4,)))]
    second = dcp.async_save({"w": w}, storage_writer=writer, checkpoint_id=tmp_path / "b")
    w.add_(10)
    second.result()
    assert writer.staged_cache[("w", ((0,), (4,)))] is buffer  # copied into, not made anew
    assert list(writer.staged_cache) == [("w", ((0,), (4,)))]  # "old" is no longer kept
    for name, want in (("a", [0.0, 1.0, 2.0, 3.0]), ("b", [10.0, 11.0, 12.0, 13.0])):
        sd = {"w": mt.zeros(4)}
        dcp.load(sd, checkpoint_id=tmp_path / name)
        assert sd["w"].tolist() == want


def test_async_save_refuses_what_it_does_not_do(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="THREAD"):
        dcp.async_save({"w": mt.ones(1)}, checkpoint_id=tmp_path / "ck",
                       async_checkpointer_type=dcp.AsyncCheckpointerType.PROCESS)
    with pytest.raises(NotImplementedError, match="async_stager"):
        dcp.async_save({"w": mt.ones(1)}, checkpoint_id=tmp_path / "ck", async_stager=object())


# ------------------------------------------------------------------ the writer's options
def test_thread_count_writes_that_many_files(tmp_path: Path) -> None:
    sd = {f"t{i}": mt.arange(10 * (i + 1), dtype=mt.float32) for i in range(5)}
    sd["step"] = 3
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(tmp_path / "ck", thread_count=3))
    assert sorted(os.listdir(tmp_path / "ck")) == [".metadata", "__0_0.distcp",
                                                   "__0_1.distcp", "__0_2.distcp"]
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(tmp_path / "per", single_file_per_rank=False,
                                                     sync_files=False))
    assert len(os.listdir(tmp_path / "per")) == 1 + 6
    for name in ("ck", "per"):
        back = {f"t{i}": mt.zeros(10 * (i + 1)) for i in range(5)}
        back["step"] = 0
        dcp.load(back, storage_reader=dcp.FileSystemReader(tmp_path / name))
        assert back["step"] == 3
        assert all(back[k].equal(sd[k]) for k in sd if k != "step")
    with pytest.raises(ValueError, match="thread_count"):
        dcp.FileSystemWriter(tmp_path / "x", thread_count=0)


def test_overwrite_false_refuses_an_existing_checkpoint(tmp_path: Path) -> None:
    dcp.save({"w": mt.ones(1)}, checkpoint_id=tmp_path / "ck")
    with pytest.raises(dcp.CheckpointError, match="overwrite=False"):
        dcp.save({"w": mt.zeros(1)}, storage_writer=dcp.FileSystemWriter(tmp_path / "ck",
                                                                         overwrite=False))
    sd = {"w": mt.zeros(1)}
    dcp.load(sd, checkpoint_id=tmp_path / "ck")
    assert sd["w"].item() == 1.0


# ------------------------------------------------------------------ format_utils
def test_format_utils_round_trip(tmp_path: Path) -> None:
    model, opt = _trained()
    dcp.save({"app": App(model, opt), "step": 7, "hist": [1.5, 2.5]},
             checkpoint_id=tmp_path / "ck")
    format_utils.dcp_to_torch_save(tmp_path / "ck", tmp_path / "m.pth")
    whole = mt.load(tmp_path / "m.pth")
    assert whole["step"] == 7 and whole["hist"] == [1.5, 2.5]
    assert set(whole["app"]) == {"model", "optim"}
    for name, p in model.state_dict().items():
        assert whole["app"]["model"][name].numpy().tobytes() == p.numpy().tobytes()
    format_utils.torch_save_to_dcp(tmp_path / "m.pth", tmp_path / "again")
    fresh = _model(8)
    fresh_opt = mt.optim.Adam(fresh.parameters(), lr=0.05)
    sd = {"app": App(fresh, fresh_opt), "step": 0}
    dcp.load(sd, checkpoint_id=tmp_path / "again")
    assert sd["step"] == 7 and _same(model, fresh)
    assert _adam_state(fresh_opt) == _adam_state(opt)


def test_format_utils_command_line(tmp_path: Path) -> None:
    mt.save({"w": mt.arange(6, dtype=mt.float64).reshape(2, 3), "n": 4}, tmp_path / "in.pt")
    cli = [sys.executable, "-m", "mpitensor.distributed.checkpoint.format_utils"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120,
                              cwd=ROOT)

    out = run("torch_to_dcp", str(tmp_path / "in.pt"), str(tmp_path / "ck"))
    assert out.returncode == 0, out.stderr
    out = run("dcp_to_torch", str(tmp_path / "ck"), str(tmp_path / "out.pt"))
    assert out.returncode == 0, out.stderr
    back = mt.load(tmp_path / "out.pt")
    assert back["n"] == 4 and back["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["w"].dtype == mt.float64
    bad = run("dcp_to_torch", str(tmp_path / "nowhere"), str(tmp_path / "x.pt"))
    assert bad.returncode == 2 and "is not a directory" in bad.stderr
    bad = run("sideways", "a", "b")
    assert bad.returncode == 2 and "torch_to_dcp" in bad.stderr
    assert "Conversion mode" in run("-h").stdout


# ------------------------------------------------------------------ torch, both ways
def test_torch_and_we_read_each_others_checkpoints(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (the oracle)")
    import torch.distributed.checkpoint as tdcp
    from torch.distributed.checkpoint import format_utils as tfu

    ours = {"w": mt.arange(12, dtype=mt.float32).reshape(3, 4), "b": mt.arange(3) * 2,
            "nested": {"x": mt.full((2,), 0.5, dtype=mt.float64)}, "step": 11}
    dcp.save(ours, storage_writer=dcp.FileSystemWriter(tmp_path / "ours", thread_count=2))
    into = {"w": torch.zeros(3, 4), "b": torch.zeros(3, dtype=torch.int64),
            "nested": {"x": torch.zeros(2, dtype=torch.float64)}, "step": 0}
    tdcp.load(into, checkpoint_id=str(tmp_path / "ours"))
    assert into["step"] == 11 and into["w"].numpy().tobytes() == ours["w"].numpy().tobytes()
    assert into["b"].tolist() == [0, 2, 4] and into["nested"]["x"].tolist() == [0.5, 0.5]

    dcp.save(ours, storage_writer=dcp.FileSystemWriter(tmp_path / "per", thread_count=2,
                                                       single_file_per_rank=False))
    assert len(os.listdir(tmp_path / "per")) == 1 + 4  # one file per record
    into["nested"]["x"].zero_()
    tdcp.load(into, checkpoint_id=str(tmp_path / "per"))
    assert into["nested"]["x"].tolist() == [0.5, 0.5]

    theirs = {"w": torch.arange(8.0).reshape(2, 4), "m": {"k": torch.ones(3, dtype=torch.int32)},
              "lr": 0.25}
    tdcp.save(theirs, checkpoint_id=str(tmp_path / "theirs"))
    back = {"w": mt.zeros(2, 4), "m": {"k": mt.zeros(3, dtype=mt.int32)}, "lr": 0.0}
    dcp.load(back, checkpoint_id=tmp_path / "theirs")
    assert back["lr"] == 0.25 and back["w"].numpy().tobytes() == theirs["w"].numpy().tobytes()
    assert back["m"]["k"].tolist() == [1, 1, 1]

    # format_utils across the two: torch's converter on our checkpoint, ours on torch's
    tfu.dcp_to_torch_save(str(tmp_path / "ours"), str(tmp_path / "ours.pt"))
    whole = torch.load(tmp_path / "ours.pt", weights_only=True)
    assert whole["w"].numpy().tobytes() == ours["w"].numpy().tobytes() and whole["step"] == 11
    format_utils.dcp_to_torch_save(tmp_path / "theirs", tmp_path / "theirs.pt")
    whole = torch.load(tmp_path / "theirs.pt", weights_only=True)
    assert whole["w"].equal(theirs["w"]) and whole["m"]["k"].equal(theirs["m"]["k"])
    torch.save({"v": torch.linspace(0, 1, 5)}, tmp_path / "t.pt")
    format_utils.torch_save_to_dcp(tmp_path / "t.pt", tmp_path / "t_dcp")
    got = {"v": torch.zeros(5)}
    tdcp.load(got, checkpoint_id=str(tmp_path / "t_dcp"))
    assert got["v"].equal(torch.linspace(0, 1, 5))
    mt.save({"v": mt.linspace(0, 1, 5)}, tmp_path / "m.pt")
    tfu.torch_save_to_dcp(str(tmp_path / "m.pt"), str(tmp_path / "m_dcp"))
    mine = {"v": mt.zeros(5)}
    dcp.load(mine, checkpoint_id=tmp_path / "m_dcp")
    assert mine["v"].numpy().tobytes() == torch.linspace(0, 1, 5).numpy().tobytes()


# ------------------------------------------------------------------ several ranks (mpiexec)
def _job(nprocs: int, *args: str) -> str:
    return _reshard_job(nprocs, *args, job=JOB)


@pytest.fixture(scope="module")
def saved_at_4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dcp_stateful") / "ck"
    out = _job(4, "save", str(path))
    assert sorted(re.findall(r"rank (\d) saved", out)) == ["0", "1", "2", "3"], out
    assert sorted(os.listdir(path)) == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)]
    return path


def test_fully_shard_saved_at_4_loads_at_2(saved_at_4: Path) -> None:
    counts = _oks(_job(2, "load", str(saved_at_4)), 2)
    assert len(set(counts)) == 1 and counts[0] > 10


def test_fully_shard_saved_at_4_loads_without_a_process_group(saved_at_4: Path) -> None:
    proc = subprocess.run([sys.executable, JOB, "plain", str(saved_at_4)], capture_output=True,
                          text=True, timeout=TIMEOUT, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _oks(proc.stdout, 1)[0] > 10


def test_fully_shard_saved_at_4_converts_to_one_torch_file(saved_at_4: Path,
                                                          tmp_path: Path) -> None:
    from .dcp_stateful_job import compare

    ref = mt.load(str(saved_at_4) + ".ref")
    format_utils.dcp_to_torch_save(saved_at_4, tmp_path / "whole.pt")
    whole = mt.load(tmp_path / "whole.pt")
    assert whole["step"] == 3 and compare(whole["app"], ref) > 10
    torch = pytest.importorskip("torch", reason="torch is not installed (the oracle)")
    from torch.distributed.checkpoint import format_utils as tfu

    tfu.dcp_to_torch_save(str(saved_at_4), str(tmp_path / "by_torch.pt"))
    theirs = torch.load(tmp_path / "by_torch.pt", weights_only=True)
    for name, value in ref["model"].items():
        assert theirs["app"]["model"][name].numpy().tobytes() == value.numpy().tobytes(), name


@pytest.mark.parametrize("nprocs", [2, 4])
def test_async_save_while_training(tmp_path: Path, nprocs: int) -> None:
    counts = _oks(_job(nprocs, "async", str(tmp_path / "ck")), nprocs)
    assert len(set(counts)) == 1 and counts[0] > 40


def test_bad_input_fails_on_every_rank(tmp_path: Path) -> None:
    out = _job(2, "errors", str(tmp_path / "ck"))
    for what in ("stateful-save", "stateful-async", "stateful-load", "other-model",
                 "missing-dir"):
        assert sorted(re.findall(rf"rank (\d) raised {what}\b", out)) == ["0", "1"], out
    _oks(out, 2)


def test_async_save_killed_midway_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "ck"
    _job(2, "save", str(path))
    proc = mpiexec_run(2, [sys.executable, JOB, "kill", str(path)], timeout=TIMEOUT, cwd=ROOT)
    assert not proc.timed_out and proc.returncode != 0, proc.output[-4000:]
    assert "rank 1 dies writing" in proc.output, proc.output[-4000:]
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    _oks(_job(2, "load", str(path)), 2)  # the previous checkpoint, bit for bit
    _job(2, "save", str(path))  # the next save removes what the killed one left
    assert sorted(os.listdir(tmp_path)) == ["ck", "ck.ref"]


# ------------------------------------------------------------------ the recipe's launch
RECIPE = """\
import os
import sys
import time

import mpitensor as torch                                  # was: import torch
import mpitensor.distributed as dist
import mpitensor.distributed.checkpoint as dcp
import mpitensor.multiprocessing as mp
import mpitensor.nn as nn
from mpitensor.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                         set_state_dict)
from mpitensor.distributed.checkpoint.stateful import Stateful
from mpitensor.distributed.fsdp import fully_shard


class Snapshot(Stateful):
    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, sd):
        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"],
                       optim_state_dict=sd["optim"])


class SlowDisk(dcp.FileSystemWriter):
    def __init__(self, path):
        super().__init__(path)
        self.slow = dist.get_rank() == 1

    def write_item(self, fh, fqn, obj):
        if self.slow:
            time.sleep(0.1)
        return super().write_item(fh, fqn, obj)


def make(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def checksum(model):
    sd = get_model_state_dict(model)
    return " ".join(v.full_tensor().numpy().tobytes().hex() for _, v in sorted(sd.items()))


def worker(rank, world_size, mode, ckpt, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    if mode == "save":
        model, optimizer = make(0)
        future = None
        for step in range(3):
            optimizer.zero_grad()
            model(torch.rand(4, 6)).sum().backward()
            optimizer.step()
            if future is not None:
                future.result()
            future = dcp.async_save({"app": Snapshot(model, optimizer)},
                                    storage_writer=SlowDisk(ckpt))
        sys.stdout.write(f"rank {rank} saved {checksum(model)}\\n")  # one write
        sys.stdout.flush()
    else:
        model, optimizer = make(1)
        dcp.load({"app": Snapshot(model, optimizer)}, checkpoint_id=ckpt)
        sys.stdout.write(f"rank {rank} loaded {checksum(model)}\\n")  # one write
        sys.stdout.flush()
    dist.destroy_process_group()   # the last async_save is still writing: it finishes


if __name__ == "__main__":
    n = int(sys.argv[1])
    mp.spawn(worker, args=(n, sys.argv[4], sys.argv[2], sys.argv[3]), nprocs=n, join=True)
"""


def _free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_recipe_programs_under_spawn(tmp_path: Path) -> None:
    """Save (async_save each step) at 2 ranks and load at 2, each started by mp.spawn with
    init_process_group("gloo", rank=, world_size=); the last async_save is still writing (rank
    1 writes slowly) when the program destroys its group and returns: it completes."""
    script = tmp_path / "recipe.py"
    script.write_text(RECIPE)
    ck = str(tmp_path / "checkpoint")
    sums = {}
    for mode, word in (("save", "saved"), ("load", "loaded")):
        proc = subprocess.run([sys.executable, str(script), "2", ck, _free_port(), mode],
                              capture_output=True, text=True, timeout=TIMEOUT, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        found = re.findall(rf"rank (\d) {word} (.+)", proc.stdout)
        assert sorted(r for r, _ in found) == ["0", "1"], proc.stdout + proc.stderr
        sums[mode] = {s for _, s in found}
        assert len(sums[mode]) == 1
    assert sums["save"] == sums["load"]
    plain = {"app": {"model": {"0.bias": mt.zeros(6)}}}
    dcp.load(plain, checkpoint_id=ck, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert plain["app"]["model"]["0.bias"].numpy().tobytes().hex() == \
        next(iter(sums["load"])).split()[0]
