"""``mpitensor.multiprocessing``: torch's ``mp.spawn`` / ``start_processes`` on MPI ranks.

Programs written the way torch's tutorials write them run with the import changed; failures
raise what torch raises (compared with ``torch.multiprocessing`` where torch is installed).
Every job runs with a hard timeout, and each test checks that no process and no temporary
directory of it is left.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

import mpitensor
import mpitensor.multiprocessing as mp
from mpitensor.errors import DistributedTimeoutError, MpiTensorError

from .launch import leftovers, run_job

TIMEOUT = 60.0


def _run_script(tmp_path: Path, text: str, *args: str,
                timeout: float = 120.0) -> Tuple[int, str, str]:
    """Run a script with ``python`` (its temporary files under ``tmp_path``); assert that
    neither a process nor a spawn directory of it is left."""
    script = tmp_path / "prog.py"
    script.write_text(text)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    code, out, err, _ = run_job([sys.executable, str(script), *args], timeout, cwd=tmp_path,
                                env={"TMPDIR": str(tmpdir)})
    assert _processes_with(f"TMPDIR={tmpdir}") == [], "processes of the job are left"
    assert list(tmpdir.glob("mpitensor-spawn-*")) == [], "a spawn directory is left"
    return code, out, err


def _processes_with(needle: str, wait: float = 5.0) -> List[int]:
    """Processes (not this one) whose environment holds ``needle`` after ``wait`` seconds."""
    token = needle.encode()
    deadline = time.monotonic() + wait
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if token not in f.read().split(b"\0"):
                        continue
                with open(f"/proc/{entry}/stat", "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                        continue
            except OSError:
                continue
            found.append(int(entry))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


# ----------------------------------------------------------------------------- tutorials

TUTORIAL_NO_MPI = """\
import os
import sys
import mpitensor.multiprocessing as mp   # was: import torch.multiprocessing as mp


def work(rank, world_size, outdir):
    # per-process work that needs no communication
    value = sum(range(rank * 10, rank * 10 + 10))
    with open(os.path.join(outdir, f"part{rank}.txt"), "w") as f:
        f.write(f"{rank} {world_size} {value}")


if __name__ == "__main__":
    world_size = int(sys.argv[1])
    result = mp.spawn(work, args=(world_size, sys.argv[2]), nprocs=world_size, join=True)
    print("spawn returned", result)
"""


def test_tutorial_spawn_without_communication(tmp_path: Path) -> None:
    outdir = tmp_path / "out"
    outdir.mkdir()
    code, out, err = _run_script(tmp_path, TUTORIAL_NO_MPI, "3", str(outdir))
    assert code == 0, err
    assert out.splitlines() == ["spawn returned None"]
    for r in range(3):
        assert (outdir / f"part{r}.txt").read_text() == f"{r} 3 {sum(range(r * 10, r * 10 + 10))}"


TUTORIAL_DDP = """\
import os
import sys
import mpitensor as torch                     # was: import torch
import mpitensor.distributed as dist          # was: import torch.distributed as dist
import mpitensor.multiprocessing as mp        # was: import torch.multiprocessing as mp
import mpitensor.nn as nn
from mpitensor.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def demo_basic(rank, world_size):
    setup(rank, world_size)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    x = torch.full((8, 4), float(rank + 1))
    loss = loss_fn(ddp_model(x), torch.zeros(8, 2))
    loss.backward()
    grad = model.weight.grad.clone()
    optimizer.step()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    sys.stdout.write(f"rank {rank} of {dist.get_world_size()} sum {t.item():g} "
                     f"local_rank {os.environ['LOCAL_RANK']} "
                     f"grad {float(grad.sum()):.6f}\\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = int(sys.argv[1])
    mp.spawn(demo_basic, args=(world_size,), nprocs=world_size, join=True)
"""


def test_tutorial_spawn_with_process_group(tmp_path: Path) -> None:
    """The DDP tutorial's layout, import changed: rank/world_size passed to
    init_process_group match MPI's, the gradients are averaged across the ranks."""
    code, out, err = _run_script(tmp_path, TUTORIAL_DDP, "2")
    assert code == 0, err
    lines = sorted(line for line in out.splitlines() if line.startswith("rank "))
    grads = {line.split()[-1] for line in lines}
    assert len(grads) == 1, lines  # DDP: every rank holds the same averaged gradient
    assert [line.rsplit(" grad ", 1)[0] for line in lines] == [
        "rank 0 of 2 sum 3 local_rank 0", "rank 1 of 2 sum 3 local_rank 1"], out + err


PROCESS_TEMPLATE = """\
import os
import sys

import mpitensor as torch
import mpitensor.distributed as dist
import mpitensor.multiprocessing as mp


def init_process(rank, size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = sys.argv[1]
    dist.init_process_group("gloo", rank=rank, world_size=size)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    sys.stdout.write(f"rank {dist.get_rank()} of {dist.get_world_size()} sum {t.item()}\\n")
    sys.stdout.flush()


if __name__ == "__main__":
    mp.set_start_method("spawn")
    processes = [mp.Process(target=init_process, args=(rank, 2)) for rank in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    print("exit codes", [p.exitcode for p in processes])
"""


def test_processes_started_without_mpi_meet(tmp_path: Path) -> None:
    """torch's other tutorial layout (mp.Process + MASTER_ADDR/PORT): the processes meet in
    init_process_group and form one MPI job (tests/test_rendezvous.py has the details)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    code, out, err = _run_script(tmp_path, PROCESS_TEMPLATE, port, timeout=60)
    assert code == 0, err
    assert sorted(out.splitlines()) == ["exit codes [0, 0]", "rank 0 of 2 sum 3.0",
                                        "rank 1 of 2 sum 3.0"], out + err


# ----------------------------------------------------------------------------- in-process

def _index_and_args(i: int, scale: int, outdir: str) -> int:
    Path(outdir, f"p{i}").write_text(f"{i} {scale} {os.environ.get('PMI_RANK')}")
    return i * scale


def _raise_on_one(i: int, n: int) -> None:
    if i == 1:
        raise KeyError(f"bad key on {i} of {n}")
    time.sleep(30)


def _exit_on_one(i: int) -> None:
    if i == 1:
        sys.exit(3)
    time.sleep(30)


def _exit_zero(i: int) -> None:
    sys.exit(0)


def _kill_zero(i: int) -> None:
    if i == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def _sleep(i: int, seconds: float) -> str:
    time.sleep(seconds)
    return f"slept {i}"


def _unpicklable(i: int) -> object:
    return lambda: i


def test_spawn_calls_fn_with_index_and_args(tmp_path: Path) -> None:
    assert mp.spawn(_index_and_args, args=(7, str(tmp_path)), nprocs=3, timeout=TIMEOUT) is None
    for i in range(3):  # process i is MPI rank i
        assert (tmp_path / f"p{i}").read_text() == f"{i} 7 {i}"
    ctx = mp.start_processes(_index_and_args, args=(5, str(tmp_path)), nprocs=2, join=False,
                             timeout=TIMEOUT)
    assert isinstance(ctx, mp.ProcessContext)
    assert ctx.join() is True
    assert ctx.results == [0, 5]
    assert [p.exitcode for p in ctx.processes] == [0, 0]
    assert leftovers(ctx.job_id) == []


def test_context_pids_processes_and_join_timeout() -> None:
    ctx = mp.spawn(_sleep, args=(3.0,), nprocs=2, join=False, timeout=TIMEOUT)
    try:
        pids = ctx.pids()
        assert len(pids) == 2 and len(set(pids)) == 2 and all(isinstance(p, int) for p in pids)
        assert [p.pid for p in ctx.processes] == pids
        assert [p.name for p in ctx.processes] == ["rank-0", "rank-1"]
        assert all(p.is_alive() for p in ctx.processes)
        assert all(p.exitcode is None for p in ctx.processes)
        assert ctx.join(timeout=0.2) is False
        while not ctx.join(timeout=0.5):
            pass
        assert ctx.results == ["slept 0", "slept 1"]
        assert [p.is_alive() for p in ctx.processes] == [False, False]
        assert [p.exitcode for p in ctx.processes] == [0, 0]
        assert ctx.join() is True  # again: still done
    finally:
        ctx.kill()
    assert leftovers(ctx.job_id) == []


def test_raised_exception_names_the_process(capfd: pytest.CaptureFixture) -> None:
    ctx = mp.spawn(_raise_on_one, args=(2,), nprocs=2, join=False, timeout=TIMEOUT)
    start = time.monotonic()
    with pytest.raises(mp.ProcessRaisedException) as info:
        ctx.join()
    assert time.monotonic() - start < 15
    exc = info.value
    assert isinstance(exc, mp.ProcessException) and isinstance(exc, MpiTensorError)
    assert exc.error_index == 1 and exc.rank == 1 and exc.exc_type == "KeyError"
    assert isinstance(exc.error_pid, int) and exc.error_pid > 0 and exc.pid == exc.error_pid
    assert str(exc).startswith("rank 1 of 2 raised KeyError: 'bad key on 1 of 2'\n\n"
                               f"-- traceback of rank 1 (pid {exc.pid}):\n"
                               "Traceback (most recent call last):\n")
    assert exc.traceback_text.rstrip().endswith("KeyError: 'bad key on 1 of 2'")
    assert "in _raise_on_one" in exc.traceback_text
    assert "[rank 1] KeyError: 'bad key on 1 of 2'" in capfd.readouterr().err
    with pytest.raises(mp.ProcessRaisedException):  # a later join says the same
        ctx.join()
    assert leftovers(ctx.job_id) == []
    # the exceptions travel through pickle with their attributes
    back = pickle.loads(pickle.dumps(exc))
    assert (type(back), back.error_index, back.error_pid, back.exc_type, back.traceback_text,
            str(back)) == (type(exc), 1, exc.pid, "KeyError", exc.traceback_text, str(exc))


def test_exit_code_and_signal() -> None:
    with pytest.raises(mp.ProcessExitedException) as info:
        mp.spawn(_exit_on_one, nprocs=2, timeout=TIMEOUT)
    exc = info.value
    assert (exc.error_index, exc.exit_code, exc.signal_name) == (1, 3, None)
    assert str(exc) == "rank 1 of 2 exited with code 3"
    assert isinstance(exc.pid, int)
    back = pickle.loads(pickle.dumps(exc))
    assert (back.error_index, back.error_pid, back.exit_code, back.signal_name) == (
        1, exc.error_pid, 3, None)
    with pytest.raises(mp.ProcessExitedException) as info:
        mp.spawn(_kill_zero, nprocs=2, timeout=TIMEOUT)
    exc = info.value
    assert (exc.exit_code, exc.signal_name) == (-9, "SIGKILL")
    # which rank went first is watched, not reported by MPI: None when both ended at once
    assert exc.error_index in (0, None)
    assert "was killed by signal SIGKILL" in str(exc)
    assert mp.spawn(_exit_zero, nprocs=2, timeout=TIMEOUT) is None  # sys.exit(0) is no error


def test_unpicklable_return_value_is_ignored() -> None:
    ctx = mp.spawn(_unpicklable, nprocs=1, join=False, timeout=TIMEOUT)
    assert ctx.join() and ctx.results == [None]


def test_timeout_kills_the_job() -> None:
    ctx = mp.start_processes(_sleep, args=(60,), nprocs=2, join=False, timeout=3)
    with pytest.raises(DistributedTimeoutError, match="did not finish within the timeout of 3"):
        ctx.join()
    assert leftovers(ctx.job_id) == []


def test_bad_arguments_are_rejected_before_anything_starts() -> None:
    def nested(i: int) -> None:
        pass

    with pytest.raises(ValueError, match="nprocs must be a positive integer, got 0"):
        mp.spawn(_sleep, args=(0,), nprocs=0)
    with pytest.raises(TypeError, match="args must be a tuple, got int"):
        mp.spawn(_sleep, args=5, nprocs=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lambda or a nested function"):
        mp.spawn(lambda i: None, nprocs=1)
    with pytest.raises(TypeError, match="lambda or a nested function"):
        mp.start_processes(nested, nprocs=1)
    with pytest.raises(ValueError, match=r"start_method must be one of .*got 'bogus'"):
        mp.spawn(_sleep, args=(0,), nprocs=1, start_method="bogus")
    with pytest.raises(TypeError, match="daemon must be True or False"):
        mp.spawn(_sleep, args=(0,), nprocs=1, daemon="yes")  # type: ignore[arg-type]


def test_other_start_methods_warn_and_run(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="start_method='fork' is accepted but has no effect"):
        mp.spawn(_index_and_args, args=(2, str(tmp_path)), nprocs=1, start_method="fork",
                 timeout=TIMEOUT)
    assert (tmp_path / "p0").read_text() == "0 2 0"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default start method says nothing
        mp.start_processes(_index_and_args, args=(3, str(tmp_path)), nprocs=1,
                           timeout=TIMEOUT)
    assert (tmp_path / "p0").read_text() == "0 3 0"


def test_module_reexports_python_multiprocessing() -> None:
    assert mpitensor.multiprocessing is mp
    for name in ("Process", "Queue", "SimpleQueue", "Pool", "Lock", "Event", "Manager",
                 "set_start_method", "get_context", "get_start_method", "cpu_count",
                 "get_all_start_methods", "current_process", "active_children"):
        assert getattr(mp, name) is getattr(multiprocessing, name), name
        assert name in mp.__all__
    assert mp.SpawnContext is mp.ProcessContext
    assert mp.get_all_sharing_strategies() == {"file_descriptor", "file_system"}
    was = mp.get_sharing_strategy()
    assert was == "file_descriptor"
    try:
        mp.set_sharing_strategy("file_system")
        assert mp.get_sharing_strategy() == "file_system"
        with pytest.raises(ValueError, match="'shm' is not one of"):
            mp.set_sharing_strategy("shm")
    finally:
        mp.set_sharing_strategy(was)


def test_queue_carries_tensors_between_plain_processes() -> None:
    """The re-exported stdlib pieces work with mpitensor tensors (pickled with their data)."""
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    t = mpitensor.arange(6).reshape(2, 3)
    q.put(t)
    got = q.get()
    assert isinstance(got, mpitensor.Tensor) and got.tolist() == t.tolist()


# ----------------------------------------------------------------------------- at exit

AT_EXIT = """\
import sys, time
from pathlib import Path
import mpitensor.multiprocessing as mp


def slow(i, out, seconds):
    time.sleep(seconds)
    Path(out, f"done{i}").write_text("yes")


if __name__ == "__main__":
    daemon = sys.argv[1] == "daemon"
    ctx = mp.spawn(slow, args=(sys.argv[2], 20 if daemon else 1.5), nprocs=2, join=False,
                   daemon=daemon)
    print("pids", len(ctx.pids()))
    # leaves without join: a daemonic job is killed, another one waited for
"""


@pytest.mark.parametrize("daemon", [False, True])
def test_unjoined_job_at_parent_exit(tmp_path: Path, daemon: bool) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, out, err = _run_script(tmp_path, AT_EXIT, "daemon" if daemon else "wait",
                                 str(out_dir), timeout=60)
    assert code == 0, err
    assert out.splitlines() == ["pids 2"]
    done = sorted(p.name for p in out_dir.iterdir())
    assert done == ([] if daemon else ["done0", "done1"]), err


# ----------------------------------------------------------------------------- oracle

ORACLE = """\
import json, os, signal, sys, time
if sys.argv[1] == "torch":
    import torch.multiprocessing as mp
else:
    import mpitensor.multiprocessing as mp


def raiser(i, n):
    if i == 1:
        raise KeyError(f"bad {i} of {n}")
    time.sleep(20)


def exiter(i):
    if i == 1:
        sys.exit(3)
    time.sleep(20)


def killer(i):
    if i == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(20)


def ok(i, x):
    return i * x


if __name__ == "__main__":
    out = {"ok": mp.spawn(ok, args=(3,), nprocs=2)}
    for name, fn, args in (("raise", raiser, (2,)), ("exit", exiter, ()),
                           ("kill", killer, ())):
        try:
            mp.spawn(fn, args=args, nprocs=2)
            out[name] = None
        except Exception as e:
            out[name] = {"type": type(e).__name__,
                         "bases": [c.__name__ for c in type(e).__mro__
                                   if c.__name__.startswith("Process")],
                         "error_index": e.error_index, "pid": isinstance(e.error_pid, int),
                         "exit_code": getattr(e, "exit_code", None),
                         "signal_name": getattr(e, "signal_name", None),
                         "tail": str(e).rstrip().splitlines()[-1]}
    print(json.dumps(out))
"""


def test_spawn_failures_match_torch(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    results: Dict[str, dict] = {}
    for lib in ("torch", "mpitensor"):
        code, out, err = _run_script(tmp_path, ORACLE, lib, timeout=240)
        assert code == 0, err
        results[lib] = json.loads(out.strip().splitlines()[-1])
    torch_r, ours = results["torch"], results["mpitensor"]
    assert ours["ok"] is None and torch_r["ok"] is None
    # the same classes, index, pid, exit code and signal; the raising rank's last line too
    # (the other messages are worded differently)
    assert ours["raise"] == torch_r["raise"]
    assert torch_r["raise"]["tail"] == "KeyError: 'bad 1 of 2'"
    for case in ("exit", "kill"):
        del ours[case]["tail"], torch_r[case]["tail"]
    assert ours["exit"] == torch_r["exit"] == {
        "type": "ProcessExitedException",
        "bases": ["ProcessExitedException", "ProcessException"], "error_index": 1,
        "pid": True, "exit_code": 3, "signal_name": None}
    # a signal: which process went first is exact in torch (its own children), watched in
    # ours (None when two ranks vanished in the same instant)
    assert torch_r["kill"]["error_index"] == 0
    if ours["kill"]["error_index"] is None:
        ours["kill"].update(error_index=0, pid=True)
    assert ours["kill"] == torch_r["kill"] == {
        "type": "ProcessExitedException",
        "bases": ["ProcessExitedException", "ProcessException"], "error_index": 0,
        "pid": True, "exit_code": -9, "signal_name": "SIGKILL"}
