"""``mpitensor-run --max-restarts N``: a failed rank stops the job, and every rank starts again.

The fault tests run ``tests/fault_scripts/elastic_train.py`` (DDP + a shuffling
DistributedSampler + SGD with momentum, a checkpoint after every step, a resume from it at start)
on 2 ranks, with one rank ending itself in the middle of an epoch on the first attempt only. The
restarted run must end with the parameters of an uninterrupted run, bit for bit, on every rank.
Every launch runs in its own session with a hard timeout, with ``TMPDIR`` pointed at a directory
of the test's own, and must leave no process and no temporary file behind.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

from mpitensor.distributed import launch
from mpitensor.distributed.launch import job as launch_job
from mpitensor.distributed.launch import rank_env
from mpitensor.run import main as run_main

from .launch import clean_env, leftovers, run_job

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "tests" / "fault_scripts" / "elastic_train.py"
TIMEOUT = 120.0
STEPS = 18  # elastic_train.py: 3 epochs of 6 steps on 2 ranks
FAULT_STEP = 9  # in the middle of the second epoch

SLEEPY = """\
import os, sys, time
from mpi4py import MPI
MPI.COMM_WORLD.barrier()
sys.stdout.write(f"up {MPI.COMM_WORLD.rank} {os.environ['TORCHELASTIC_RESTART_COUNT']} "
                 f"{os.environ.get('MPITENSOR_RUN_WATCH')}\\n")
sys.stdout.flush()
time.sleep(60)
"""


# ----------------------------------------------------------------------------- helpers


def _temp_dir(base: Path) -> Path:
    tmp = base / "tmpdir"
    tmp.mkdir()
    return tmp


def _train(base: Path, launcher_args: Sequence[str] = (),
           script_args: Sequence[str] = ()) -> Tuple[int, str, str, Path]:
    """Run ``mpitensor-run --nproc-per-node 2 launcher_args... elastic_train.py script_args...``.

    Returns ``(exit code, stdout, stderr, output directory)``; asserts that the launch left no
    process (run_job) and nothing in its TMPDIR.
    """
    base.mkdir(parents=True, exist_ok=True)
    ckpt, out, tmp = base / "ckpt", base / "out", _temp_dir(base)
    ckpt.mkdir()
    out.mkdir()
    code, stdout, stderr, _ = run_job(
        [sys.executable, "-m", "mpitensor.run", "--nproc-per-node", "2", *launcher_args,
         str(TRAIN), "--ckpt-dir", str(ckpt), "--out-dir", str(out), *script_args],
        TIMEOUT, cwd=base, env={"TMPDIR": str(tmp)})
    assert list(tmp.iterdir()) == [], "temporary files left behind"
    return code, stdout, stderr, out


def _params(out: Path, rank: int) -> Dict[str, np.ndarray]:
    with np.load(out / f"final.{rank}.npz") as f:
        return {k: f[k] for k in f.files}


def _attempts(stdout: str) -> List[Tuple[int, int, int]]:
    """(rank, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS) as each rank saw them."""
    return sorted((int(a), int(b), int(c))
                  for a, b, c in re.findall(r"^attempt (\d+) (\d+) (\d+)$", stdout, re.M))


def _launcher_lines(stderr: str) -> List[str]:
    return [line for line in stderr.splitlines() if line.startswith("mpitensor-run: ")]


def _restart_line(failure: str, k: int, n: int) -> str:
    """The pattern of the launcher's line announcing restart k of n."""
    return (f"mpitensor-run: {failure}; every rank was stopped: restart {k} of {n} "
            rf"\(TORCHELASTIC_RESTART_COUNT={k}\)")


# A rank killed by a signal or by os._exit leaves no record: the launcher names it from the
# order in which it sees the ranks end, and on a busy machine mpiexec may have ended the other
# rank too before it looks; then it says so instead of guessing.
_SILENT = r"(?:rank 1 of 2|one of ranks 0, 1 of 2 \(they ended in the same instant\))"
_SAME_INSTANT_KILL = (r"one of ranks 0, 1 of 2 \(they ended in the same instant\) was killed by "
                      r"signal SIGKILL \(exit code 9\)")
FAILURES = {"kill": _SILENT + r" was killed by signal SIGKILL \(exit code 9\)",
            # os._exit(1) says nothing; the launcher reads its code from /proc before mpiexec
            # reaps the rank. When it looks too late (under load), mpiexec's own code is all it
            # has, and hydra's may be the SIGKILL it ended rank 0 with: then the launcher names
            # neither rank alone, and exits with that code (_exit_codes)
            "exit": rf"(?:{_SILENT} exited with code 1|{_SAME_INSTANT_KILL})",
            "raise": r"rank 1 of 2 raised RuntimeError \(exit code 1\)"}


def _exit_codes(kind: str, code: int) -> Tuple[int, ...]:
    """The exit codes the launcher may give for a rank failing with ``kind``: its own, and
    for os._exit the SIGKILL of the race described at FAILURES."""
    return (code, 9) if kind == "exit" else (code,)


def _assert_lines(stderr: str, patterns: Sequence[str]) -> None:
    lines = _launcher_lines(stderr)
    assert len(lines) == len(patterns), stderr
    for line, pattern in zip(lines, patterns):
        assert re.fullmatch(pattern, line), f"{line!r} does not match {pattern!r}\n{stderr}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output directory of a run with no fault (and no --max-restarts)."""
    code, stdout, stderr, out = _train(tmp_path_factory.mktemp("reference"))
    assert code == 0, stderr
    assert _attempts(stdout) == [(0, 0, 0), (1, 0, 0)], stdout
    assert "resumed" not in stdout and _launcher_lines(stderr) == []
    return out


# ----------------------------------------------------------------------------- restarts


@pytest.mark.parametrize("kind", ["kill", "exit"])
def test_restart_after_a_rank_dies_mid_epoch_ends_as_an_uninterrupted_run(
        kind: str, tmp_path: Path, uninterrupted: Path) -> None:
    """Rank 1 SIGKILLs itself (or calls os._exit(1)) in the middle of step 9 on the first
    attempt; the launcher stops the job, starts both ranks again with
    TORCHELASTIC_RESTART_COUNT=1, they resume from the checkpoint of step 8, and the final
    parameters equal the uninterrupted run's exactly, on both ranks."""
    code, stdout, stderr, out = _train(tmp_path, ["--max-restarts", "1"],
                                       ["--fault", kind, "--fault-step", str(FAULT_STEP)])
    assert code == 0, stderr
    _assert_lines(stderr, [_restart_line(FAILURES[kind], 1, 1)])
    assert _attempts(stdout) == [(0, 0, 1), (0, 1, 1), (1, 0, 1), (1, 1, 1)], stdout
    resumed = sorted(re.findall(r"^resumed (\d+) (\d+)$", stdout, re.M))
    assert resumed == [("0", str(FAULT_STEP - 1)), ("1", str(FAULT_STEP - 1))], stdout
    for rank in (0, 1):
        got, want = _params(out, rank), _params(uninterrupted, rank)
        assert sorted(got) == sorted(want)
        assert int(got["global_step"]) == STEPS
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"rank {rank} {name}")


@pytest.mark.parametrize("kind, restarts, code", [("kill", 2, 9), ("exit", 1, 1),
                                                  ("raise", 1, 1)])
def test_restarts_exhausted_exit_with_the_failing_code(kind: str, restarts: int, code: int,
                                                       tmp_path: Path) -> None:
    """A rank that fails on every attempt: N restarts, each announced, then the failing code
    and a line saying the restarts are used up."""
    got, stdout, stderr, out = _train(tmp_path, ["--max-restarts", str(restarts)],
                                      ["--fault", kind, "--fault-step", "3", "--fault-always"])
    assert got in _exit_codes(kind, code), stderr
    failure = FAILURES[kind]
    _assert_lines(stderr, [
        *(_restart_line(failure, k, restarts) for k in range(1, restarts + 1)),
        rf"mpitensor-run: {failure}; restarts exhausted \({restarts} of --max-restarts "
        rf"{restarts} used\): exiting with code {got}"])
    if got != code:  # the race: the last line must say so, in those words
        assert re.search(_SAME_INSTANT_KILL + "; restarts exhausted", stderr), stderr
    assert _attempts(stdout) == sorted((r, k, restarts) for r in (0, 1)
                                       for k in range(restarts + 1)), stdout
    assert "done" not in stdout and list(out.iterdir()) == []


def test_no_failure_no_restart(tmp_path: Path, uninterrupted: Path) -> None:
    """With restarts allowed and nothing failing, the job runs once and says nothing more."""
    code, stdout, stderr, out = _train(tmp_path, ["--max-restarts", "3"])
    assert code == 0, stderr
    assert _launcher_lines(stderr) == [] and _attempts(stdout) == [(0, 0, 3), (1, 0, 3)]
    for rank in (0, 1):
        np.testing.assert_array_equal(_params(out, rank)["2.weight"],
                                      _params(uninterrupted, rank)["2.weight"])


# ----------------------------------------------------------------------------- signals


def _lines(stream: Optional[object]) -> "queue.Queue[Optional[str]]":
    """The lines of ``stream`` as a thread reads them (None at the end), so reads can time out."""
    q: "queue.Queue[Optional[str]]" = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_signal_to_the_launcher_never_restarts(sig: str, tmp_path: Path) -> None:
    """SIGTERM, SIGHUP or SIGINT to mpitensor-run --max-restarts 3 ends every rank within
    seconds, with no restart, no process and no temporary file left."""
    script = tmp_path / "sleepy.py"
    script.write_text(SLEEPY)
    tmp = _temp_dir(tmp_path)
    job_id = f"test-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpitensor.run", "--max-restarts", "3", "-n", "2", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env=clean_env({"MPITENSOR_JOB_ID": job_id, "TMPDIR": str(tmp)}),
        start_new_session=True)
    out, err = _lines(proc.stdout), _lines(proc.stderr)
    took = None
    try:
        up = [out.get(timeout=60) for _ in range(2)]
        assert sorted(up) == ["up 0 0 None\n", "up 1 0 None\n"], up
        t0 = time.monotonic()
        proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:  # the test failed: leave nothing behind
            os.killpg(proc.pid, signal.SIGKILL)
            launch_job._kill_job(job_id, wait=0)
            proc.wait(timeout=10)
    rest_out = list(iter(lambda: out.get(timeout=10), None))
    rest_err = "".join(iter(lambda: err.get(timeout=10), None))
    assert took is not None and took < 4, f"took {took} s"
    assert proc.returncode != 0
    if sig == "SIGINT":
        assert proc.returncode == 130
    assert not any(line.startswith("up") for line in rest_out), rest_out
    assert "restart" not in rest_err, rest_err
    assert leftovers(job_id) == []
    assert list(tmp.iterdir()) == [], "temporary files left behind"


# ----------------------------------------------------------------------------- command line


def _dry(capsys: pytest.CaptureFixture, *args: str) -> Tuple[int, str, str]:
    code = run_main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    p.write_text("pass\n")
    return p


def test_dry_run_shows_the_restart_variables(script: Path, capsys: pytest.CaptureFixture) -> None:
    mpiexec, worker = launch.find_mpiexec(), f"{sys.executable} -m mpitensor.run --_worker"
    code, out, err = _dry(capsys, "--nproc-per-node", "2", "--max-restarts", "2", "--dry-run",
                          str(script))
    assert (code, err) == (0, "")
    assert out == (f"{mpiexec} -n 2 {worker} --_env TORCHELASTIC_RESTART_COUNT=0 --_env "
                   f"TORCHELASTIC_MAX_RESTARTS=2 {script}\n")
    # --max-restarts 0 (torchrun's default) is the plain launch
    code, out, err = _dry(capsys, "--nproc-per-node", "2", "--max_restarts=0", "--dry-run",
                          str(script))
    assert out == f"{mpiexec} -n 2 {worker} {script}\n"


def test_nnodes_range_takes_the_hosts_once(script: Path, capsys: pytest.CaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """--nnodes MIN:MAX: the hostfile's hosts, at most MAX; one node without a hostfile."""
    for var in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "PBS_JOBID"):
        monkeypatch.delenv(var, raising=False)
    mpiexec, worker = launch.find_mpiexec(), f"{sys.executable} -m mpitensor.run --_worker"
    hf = script.parent / "hosts"
    hf.write_text("n1:4\nn2:4\nn3:4\n")
    for spec, nodes in (("1:4", 3), ("2:3", 3), ("1:2", 2), ("3:3", 3)):
        code, out, err = _dry(capsys, "--hostfile", str(hf), "--nnodes", spec,
                              "--nproc-per-node", "2", "--dry-run", str(script))
        assert code == 0, err
        assert out == f"{mpiexec} -f {hf} -n {2 * nodes} -ppn 2 {worker} {script}\n", spec
    code, out, err = _dry(capsys, "--nnodes", "1:4", "--nproc-per-node", "2", "--dry-run",
                          str(script))
    assert out == f"{mpiexec} -n 2 {worker} {script}\n"
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")
    code, out, err = _dry(capsys, "--nnodes", "2:4", "--nproc-per-node", "2", "--dry-run",
                          str(script))
    assert out == f"{mpiexec} -n 6 -ppn 2 {worker} {script}\n"


@pytest.mark.parametrize("args, message", [
    (["--nnodes", "4:2"], "argument --nnodes: 4:2 gives MIN > MAX; write MIN:MAX with MIN <= MAX"),
    (["--nnodes", "1:0"], "argument --nnodes: must be a positive number of nodes, got 0"),
    (["--nnodes", "3:4", "--hostfile", "{hf}"], "argument --nnodes: 3:4 needs at least 3 "
                                                "nodes, but hostfile {hf} names 2"),
    (["--max-restarts", "-1"], "argument --max-restarts: must be at least 0, got -1"),
    (["--max-restarts", "x"], "argument --max-restarts: invalid int value: 'x'"),
    (["--rdzv-conf", "join_timeout=soon"], "argument --rdzv-conf: join_timeout must be a "
                                           "positive number of seconds, got 'soon'"),
    (["--rdzv-conf", "keep_alive_interval=0"], "argument --rdzv-conf: keep_alive_interval must "
                                               "be a positive number of seconds, got '0'"),
    (["--rdzv-conf", "join_timeout=inf"], "argument --rdzv-conf: join_timeout must be a "
                                          "positive number of seconds, got 'inf'"),
    (["--rdzv-conf", "keep_alive_max_attempt=0"], "argument --rdzv-conf: must be a positive "
                                                  "number of attempts, got 0"),
    (["--rdzv-conf", "join_timeout"], "argument --rdzv-conf: expected KEY=VALUE[,KEY=VALUE...], "
                                      "got 'join_timeout'"),
    (["--rdzv-conf", "jointimeout=5"], "argument --rdzv-conf: unknown key 'jointimeout' (known: "
                                       "join_timeout, keep_alive_interval, "
                                       "keep_alive_max_attempt, and torchrun's timeout,"),
])
def test_bad_elastic_input_is_one_line_and_exit_2(args: Sequence[str], message: str,
                                                  script: Path, capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "PBS_JOBID"):
        monkeypatch.delenv(var, raising=False)
    hf = script.parent / "hosts"
    hf.write_text("n1:2\nn2:2\n")
    code, out, err = _dry(capsys, *[a.format(hf=hf) for a in args], "--dry-run", str(script))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mpitensor-run: error: " + message.format(hf=hf)), err


def test_rank_env_carries_the_restart_count() -> None:
    launcher = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
    env = rank_env({"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "3"},
                   environ=launcher)
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("2", "3")
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2"
    env = rank_env({}, environ=launcher)
    assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "0")
