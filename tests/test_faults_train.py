"""Fault tests of training jobs (issue 4, section 4: faults 1, 2, 7, 8 and 9).

Each test injects a fault into a real job -- ``mpiexec -n 2`` or ``mpitensor-run -n 2`` running
``examples/train.py``, directly or through ``tests/fault_scripts/train_fault.py`` (which patches
one fault into train.py's own ``__main__``) -- and asserts the outcome: exit codes, each rank's
stderr, how fast the job ends, what is on disk afterwards.

Every job runs in its own session under a hard timeout and carries a unique
``MPITENSOR_JOB_ID`` in its environment. MPICH's hydra starts its proxies and the ranks in
sessions of their own, so killing the launcher's process group does not reach them; the marker
does: after every test no process whose ``/proc/PID/environ`` carries the test's marker may be
left, and any that is gets SIGKILLed before the test fails.

``MPITENSOR_FAULT_TIMEOUT`` (seconds, default 120) bounds each launch.
"""

from __future__ import annotations

import gzip
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pytest

from mpitensor.distributed.launch import job as launch_job

from .launch import find_mpiexec, leftovers

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train.py"
FAULT = Path(__file__).resolve().parent / "fault_scripts" / "train_fault.py"
MNIST_DIR = ROOT.parent / "shared" / "data" / "mnist"
MNIST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
HAVE_MNIST = all((MNIST_DIR / f).is_file() for f in MNIST_FILES)
needs_mnist = pytest.mark.skipif(
    not HAVE_MNIST, reason=f"the MNIST test set is not in {MNIST_DIR} (t10k-*-ubyte.gz)")
HARD = float(os.environ.get("MPITENSOR_FAULT_TIMEOUT", "120"))
JOB_VAR = launch_job._JOB_ID_VAR

#: a small, quick Digits run: 640 samples, 2 ranks x 16 = 20 steps per epoch
DIGITS = ("--dataset", "digits", "--train-size", "640", "--batch-size", "16", "--no-progress",
          "--no-plot")


# ----------------------------------------------------------------------------- jobs
def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    for var in ("PMI_RANK", "PMI_SIZE", "MPITENSOR_DATA_DIR", "MT_FAULT", JOB_VAR):
        env.pop(var, None)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _mpitensor_run() -> List[str]:
    script = Path(sys.executable).parent / "mpitensor-run"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mpitensor.run"]


def command(launcher: str, nprocs: int, script: Path, args: Sequence[str]) -> List[str]:
    """``launcher`` is ``mpiexec``, ``mpitensor-run`` or ``python`` (one plain process)."""
    if launcher == "python":
        return [sys.executable, str(script), *args]
    if launcher == "mpiexec":
        return [find_mpiexec(), "-n", str(nprocs), sys.executable, str(script), *args]
    return [*_mpitensor_run(), "-n", str(nprocs), str(script), *args]


class Job:
    """A launched job: stdout lines with arrival times, stderr, kill-everything, reaping."""

    def __init__(self, argv: Sequence[str], cwd: Path, env: Optional[Dict[str, str]] = None):
        self.argv = list(argv)
        self.job_id = f"faults-train-{uuid.uuid4().hex}"
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
            env=_env({**(env or {}), JOB_VAR: self.job_id}), stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.exit_time: Optional[float] = None
        self._lines: "queue.Queue[Tuple[float, str]]" = queue.Queue()
        self.out: List[Tuple[float, str]] = []
        self._err: List[str] = []
        self._threads = [threading.Thread(target=self._read_out, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put((time.time(), line.rstrip("\n")))

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._err.append(line)

    def _drain(self) -> None:
        while True:
            try:
                self.out.append(self._lines.get_nowait())
            except queue.Empty:
                return

    def wait_line(self, pred: Callable[[str], bool], timeout: float = HARD) -> Tuple[float, str]:
        """The first stdout line matching ``pred`` (with its arrival time); fail after timeout."""
        for t, line in self.out:
            if pred(line):
                return t, line
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                t, line = self._lines.get(timeout=0.05)
            except queue.Empty:
                if self.proc.poll() is not None and self._lines.empty():
                    self.finish(5)
                    pytest.fail(f"the job ended before the expected line:\n{self}")
                continue
            self.out.append((t, line))
            if pred(line):
                return t, line
        self.kill()
        pytest.fail(f"no expected line within {timeout} s:\n{self}")

    def wait(self, timeout: float = HARD) -> int:
        """Wait for the launcher to exit (``exit_time`` records when); kill all on timeout."""
        try:
            self.proc.wait(timeout=timeout)
            self.exit_time = time.time()
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{' '.join(self.argv)} did not end within {timeout:.0f} s:\n{self}")
        self.finish(10)
        return self.proc.returncode

    def finish(self, timeout: float) -> None:
        for t in self._threads:
            t.join(timeout)
        self._drain()

    def kill(self) -> None:
        """SIGKILL the launcher's process group and every process carrying the job's marker."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        launch_job._kill_job(self.job_id, wait=0)
        self.proc.wait()
        if self.exit_time is None:
            self.exit_time = time.time()
        self.finish(10)

    def leftovers(self, grace: float = 5.0) -> List[int]:
        """The job's processes still alive after up to ``grace`` s (then they are killed)."""
        left = leftovers(self.job_id, grace)
        launch_job._kill_job(self.job_id, wait=0)
        return left

    @property
    def stdout(self) -> str:
        self._drain()
        return "".join(line + "\n" for _, line in self.out)

    @property
    def stderr(self) -> str:
        return "".join(self._err)

    @property
    def err_lines(self) -> List[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]

    def __str__(self) -> str:
        return (f"$ {' '.join(self.argv)}\nexit code {self.proc.returncode}\n--- stdout\n"
                f"{self.stdout}--- stderr\n{self.stderr}")


@pytest.fixture
def jobs() -> Iterator[Callable[..., Job]]:
    """Start jobs; afterwards kill what is still running and assert that nothing is left."""
    started: List[Job] = []

    def start(argv: Sequence[str], cwd: Path, env: Optional[Dict[str, str]] = None) -> Job:
        job = Job(argv, cwd, env)
        started.append(job)
        return job

    yield start
    left: Dict[str, List[int]] = {}
    for job in started:
        if job.proc.poll() is None:
            job.kill()
        pids = job.leftovers()
        if pids:
            left[" ".join(job.argv)] = pids
    assert not left, f"processes of these jobs were left running (now killed): {left}"


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A fresh directory, deleted after the test."""
    with tempfile.TemporaryDirectory(prefix="mpitensor-faults-") as d:
        yield Path(d)


def run(jobs: Callable[..., Job], argv: Sequence[str], cwd: Path,
        env: Optional[Dict[str, str]] = None, timeout: float = HARD) -> Job:
    """Start a job and wait for it under the hard timeout; assert nothing of it is left."""
    job = jobs(argv, cwd, env)
    job.wait(timeout)
    assert job.leftovers() == [], f"processes left after the job ended:\n{job}"
    return job


def load(path: Path) -> dict:
    import mpitensor

    return mpitensor.load(path)


# ----------------------------------------------------------------------------- fault 1
@pytest.mark.parametrize("launcher", ["mpiexec", "mpitensor-run"])
def test_raise_on_one_rank_ends_the_job(launcher: str, jobs: Callable[..., Job],
                                        tmp_path: Path) -> None:
    """Rank 1 raises after its 5th step: the job exits non-zero within 10 s, rank 1's
    traceback on stderr with every line prefixed ``[rank 1]``."""
    job = run(jobs, command(launcher, 2, FAULT, [*DIGITS, "--epochs", "50", "--checkpoint-dir",
                                                 str(tmp_path / "ck")]),
              tmp_path, env={"MT_FAULT": "raise:1:5"})
    assert job.proc.returncode != 0, str(job)
    raised = [line for _, line in job.out if line.startswith("raising ")]
    assert len(raised) == 1, str(job)
    assert job.exit_time is not None
    took = job.exit_time - float(raised[0].split()[1])
    print(f"{launcher}: raise -> job exit {took:.3f} s")
    assert 0 <= took < 10.0, f"the job took {took:.1f} s to end after the raise:\n{job}"

    err = job.stderr
    assert "[rank 1] Traceback (most recent call last):" in err, str(job)
    assert "[rank 1] RuntimeError: injected fault on rank 1 at step 5" in err, str(job)
    assert "[rank 1] unhandled exception; aborting the MPI job (MPI_Abort)" in err, str(job)
    # every line of the traceback carries the prefix; rank 0 printed none
    block = err[err.index("[rank 1] Traceback"):err.index("[rank 1] RuntimeError")]
    assert all(ln.startswith("[rank 1] ") for ln in block.splitlines()), block
    assert 'File "' in block and "optimizer.step()" in block
    assert "[rank 0] Traceback" not in err and "\nTraceback" not in err, str(job)
    assert "final held-out accuracy" not in job.stdout


# ----------------------------------------------------------------------------- fault 2
@pytest.mark.parametrize("launcher", ["mpiexec", "mpitensor-run"])
def test_sigkill_of_one_rank_ends_the_others(launcher: str, jobs: Callable[..., Job],
                                             tmp_path: Path) -> None:
    """SIGKILL rank 1 mid-training: rank 0 and the launcher are gone within 30 s, non-zero."""
    job = jobs(command(launcher, 2, FAULT, [*DIGITS, "--epochs", "50", "--checkpoint-dir",
                                            str(tmp_path / "ck")]),
               tmp_path, env={"MT_FAULT": "slow:0.02"})
    job.wait_line(lambda ln: ln == "step 1 3")
    pids = {int(m.group(1)): int(m.group(2)) for m in
            (re.fullmatch(r"pid (\d+) (\d+)", ln) for _, ln in job.out) if m}
    assert sorted(pids) == [0, 1], str(job)
    assert _alive(pids[0]) and _alive(pids[1])
    os.kill(pids[1], signal.SIGKILL)
    killed = time.time()
    code = job.wait(timeout=30)
    assert job.exit_time is not None
    took = job.exit_time - killed
    print(f"{launcher}: SIGKILL of rank 1 -> job exit {took:.3f} s, exit code {code}")
    assert code != 0, str(job)
    assert not _alive(pids[0]), "rank 0 outlived the job"
    assert job.leftovers(grace=2.0) == [], f"processes left after the job ended:\n{job}"
    # MPICH's hydra names the dead rank's pid and the signal (on stdout)
    said = job.stdout + job.stderr
    assert "BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES" in said, str(job)
    assert f"PID {pids[1]} RUNNING AT" in said and "signal 9" in said, str(job)
    assert "final held-out accuracy" not in job.stdout


# ----------------------------------------------------------------------------- fault 7
BASE = (*DIGITS, "--epochs", "2", "--seed", "3")
RESUME = (*BASE, "--checkpoint-every", "5")


def _same_result(a: dict, b: dict) -> None:
    """Two final checkpoints hold bitwise the same model, momentum and loss history."""
    assert a["global_step"] == b["global_step"] == 40
    assert list(a["model_state"]) == list(b["model_state"])
    for name in a["model_state"]:
        x, y = a["model_state"][name].numpy(), b["model_state"][name].numpy()
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f"{name} differs"
    for sa, sb in zip(a["optimizer_state"]["state"].values(),
                      b["optimizer_state"]["state"].values()):
        assert sa["momentum_buffer"].numpy().tobytes() == sb["momentum_buffer"].numpy().tobytes()
    assert a["history"]["train_loss"] == b["history"]["train_loss"]


@pytest.fixture(scope="module")
def uninterrupted() -> Iterator[dict]:
    """The final checkpoint of an unbroken 2-rank run of ``RESUME``."""
    with tempfile.TemporaryDirectory(prefix="mpitensor-faults-full-") as d:
        proc = subprocess.run(command("mpiexec", 2, TRAIN, [*RESUME, "--checkpoint-dir", d]),
                              capture_output=True, text=True, env=_env(), cwd=d, timeout=HARD,
                              start_new_session=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield load(Path(d) / "last.mt")


def _checkpoint_like(d: Path) -> List[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".mt"))


def test_kill_while_writing_a_checkpoint(uninterrupted: dict, jobs: Callable[..., Job],
                                        tmp_path: Path) -> None:
    """SIGKILL the whole job while rank 0 is half-way through writing last.mt: the previous
    last.mt stays loadable, the partial file is never taken for a checkpoint, and --resume
    ends with bitwise the parameters of an uninterrupted run."""
    from mpitensor.checkpoint import CheckpointError

    cut_dir = tmp_path / "cut"
    # rank 0's 3rd write of last.mt (step 15) stops half-way; last.mt still holds step 10
    job = jobs(command("mpiexec", 2, FAULT, [*RESUME, "--checkpoint-dir", str(cut_dir)]),
               tmp_path, env={"MT_FAULT": "pause-save:3"})
    job.wait_line(lambda ln: ln.startswith("paused "))
    partial = [p for p in cut_dir.iterdir() if p.name.startswith(".last.mt.")]
    assert len(partial) == 1 and partial[0].name.endswith(".tmp"), sorted(cut_dir.iterdir())
    assert partial[0].stat().st_size > 0
    job.kill()  # SIGKILL: the launcher's group and everything carrying the job's marker
    assert job.proc.returncode == -signal.SIGKILL
    assert job.leftovers(grace=2.0) == []

    before = load(cut_dir / "last.mt")  # the previous checkpoint is whole
    assert (before["epoch"], before["step_in_epoch"], before["global_step"]) == (0, 10, 10)
    assert _checkpoint_like(cut_dir) == ["last.mt"], sorted(cut_dir.iterdir())
    assert partial[0].exists()  # the killed save left its hidden temporary file, which ...
    with pytest.raises(CheckpointError, match="truncated"):  # ... was really cut mid-file
        load(partial[0])

    resumed = run(jobs, command("mpiexec", 2, TRAIN, [*RESUME, "--checkpoint-dir",
                                                      str(cut_dir), "--resume"]), tmp_path)
    assert resumed.proc.returncode == 0, str(resumed)
    assert (f"resumed from {cut_dir / 'last.mt'} at epoch 1, step 10 of 20 (global step 10)"
            in resumed.stdout), str(resumed)
    assert (f"removed 1 partial checkpoint file(s) left in {cut_dir} by an interrupted save: "
            f"{partial[0].name}") in resumed.stdout, str(resumed)
    assert sorted(p.name for p in cut_dir.iterdir()) == ["epoch001.mt", "epoch002.mt", "last.mt"]

    _same_result(uninterrupted, load(cut_dir / "last.mt"))


def test_kill_at_random_moments_then_resume(uninterrupted: dict, jobs: Callable[..., Job],
                                            tmp_path: Path) -> None:
    """A checkpoint after every step, the job SIGKILLed at seeded random moments and resumed
    each time: every kill leaves a loadable last.mt, and the end equals an unbroken run."""
    import random

    rng = random.Random(4)
    ck = tmp_path / "ck"
    args = [*BASE, "--checkpoint-every", "1", "--checkpoint-dir", str(ck)]
    seen = []
    for _ in range(3):
        resume = ["--resume"] if (ck / "last.mt").exists() else []
        job = jobs(command("mpiexec", 2, TRAIN, [*args, *resume]), tmp_path)
        job.wait_line(lambda ln: ln.startswith("training LeNet"))
        time.sleep(rng.uniform(0.0, 0.5))
        if job.proc.poll() is not None:
            break
        job.kill()
        assert job.leftovers(grace=2.0) == []
        names = sorted(p.name for p in ck.iterdir()) if ck.exists() else []
        assert all(re.fullmatch(r"last\.mt|epoch\d{3}\.mt|\.(last|epoch\d{3})\.mt\.\w+\.tmp", n)
                   for n in names), names
        if "last.mt" in names:
            seen.append((load(ck / "last.mt")["global_step"],
                         any(n.endswith(".tmp") for n in names)))
    print(f"kills left last.mt at (global step, a save was cut): {seen}")
    resume = ["--resume"] if (ck / "last.mt").exists() else []
    final = run(jobs, command("mpiexec", 2, TRAIN, [*args, *resume]), tmp_path)
    assert final.proc.returncode == 0, str(final)
    assert not any(p.name.endswith(".tmp") for p in ck.iterdir())
    _same_result(uninterrupted, load(ck / "last.mt"))


def test_resume_on_another_number_of_ranks(jobs: Callable[..., Job], tmp_path: Path) -> None:
    """A 2-rank run stopped inside its first epoch, resumed on 3 ranks and then on 1: each
    resume deals the rest of the epoch to the ranks it has, keeps the global batch (the
    default --batch-size), says so, and trains every remaining sample of the epoch once."""
    ck = tmp_path / "ck"
    common = ["--dataset", "digits", "--train-size", "640", "--no-progress", "--no-plot",
              "--epochs", "2", "--checkpoint-dir", str(ck)]
    first = run(jobs, command("mpiexec", 2, TRAIN, [*common, "--max-steps", "3"]), tmp_path)
    assert first.proc.returncode == 0, str(first)
    saved = load(ck / "last.mt")
    assert (saved["config"]["world_size"], saved["config"]["batch_size"]) == (2, 32)
    assert (saved["epoch"], saved["step_in_epoch"], saved["global_step"]) == (0, 3, 3)

    # 3 ranks: 640 - 3 x 64 = 448 samples left, 150 per rank (padded), batch 64 // 3 = 21:
    # 8 steps finish epoch 1 (step 3 + 8 = 11 of 11 at this size), then 11 steps of epoch 2
    second = run(jobs, command("mpiexec", 3, TRAIN, [*common, "--resume", "--max-steps", "14"]),
                 tmp_path)
    assert second.proc.returncode == 0, str(second)
    assert (f"resumed from {ck / 'last.mt'} at epoch 1, step 3 of 10 (global step 3); it was "
            "written by 2 rank(s), this run has 3: the 450 samples left in the epoch are dealt "
            "afresh to these ranks, global batch 63 (21 per rank); the result is not "
            "bit-identical to a run without the change") in second.stdout, str(second)
    assert re.search(r"^epoch 1/2: train loss [\d.]+, held-out", second.stdout, re.M), str(second)
    mid = load(ck / "last.mt")
    assert (mid["config"]["world_size"], mid["config"]["batch_size"]) == (3, 21)
    # the end of epoch 1 came after 3 + 8 steps; epoch 2 stopped at global step 14
    assert (mid["epoch"], mid["step_in_epoch"], mid["global_step"]) == (1, 3, 14)
    assert len(mid["history"]["train_loss"]) == 1
    assert len(mid["history"]["step_loss"]) == 14

    # back to one process, with --batch-size given: it is kept
    third = run(jobs, command("python", 1, TRAIN, [*common, "--resume", "--batch-size", "16"]),
                tmp_path)
    assert third.proc.returncode == 0, str(third)
    assert ("at epoch 2, step 3 of 11 (global step 14); it was written by 3 rank(s), this "
            "run has 1: the 451 samples left in the epoch "
            "are dealt afresh to these ranks, global batch 16 (16 per rank, --batch-size)"
            ) in third.stdout, str(third)
    end = load(ck / "last.mt")
    # epoch 2 had 3 x 3 x 21 = 189 of its 640 samples done: 640 - 189 = 451 left, in 29 steps
    assert (end["epoch"], end["step_in_epoch"], end["global_step"]) == (2, 0, 14 + 29)
    assert len(end["history"]["train_loss"]) == 2
    assert all(np.isfinite(v) for v in end["history"]["train_loss"])


# ----------------------------------------------------------------------------- fault 8
def _per_rank_error(job: Job, nprocs: int) -> str:
    """The error every rank found (they agree on it before exiting 1), said once, by rank 0,
    as one unprefixed line (issue 27: it used to be one ``[rank N]`` line per rank); returns
    its message."""
    lines = job.err_lines
    assert len(lines) == 1, f"expected one error line for the {nprocs} ranks:\n{job}"
    m = re.fullmatch(r"train\.py: error: (.+)", lines[0])
    assert m, f"not train.py's error line: {lines[0]!r}\n{job}"
    return m.group(1)


def _snapshot(d: Path) -> Dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())} if d.exists() else {}


@pytest.fixture(scope="module")
def one_rank_checkpoint() -> Iterator[Path]:
    """A train.py checkpoint of a 1-process run (20 steps on 320 Digits samples)."""
    with tempfile.TemporaryDirectory(prefix="mpitensor-faults-ck-") as d:
        proc = subprocess.run(command("python", 1, TRAIN, [
            "--dataset", "digits", "--train-size", "320", "--batch-size", "16", "--epochs", "1",
            "--no-progress", "--no-plot", "--checkpoint-dir", d]),
            capture_output=True, text=True, env=_env(), cwd=d, timeout=HARD)
        assert proc.returncode == 0, proc.stderr
        yield Path(d) / "last.mt"


def _flip(data: bytes) -> bytes:
    b = bytearray(data)
    for i in range(len(b) // 2, len(b) // 2 + 8):
        b[i] ^= 0xFF
    return bytes(b)


def _rewritten(src: Path, edit: Callable[[dict], None]) -> bytes:
    """The bytes of checkpoint ``src`` after ``edit`` changed it in place."""
    from mpitensor import save

    ckpt = load(src)
    edit(ckpt)
    with tempfile.TemporaryDirectory() as d:
        save(ckpt, Path(d) / "x.mt")
        return (Path(d) / "x.mt").read_bytes()


def _edit_model(src: Path, how: str) -> bytes:
    def edit(ckpt: dict) -> None:
        state = ckpt["model_state"]
        if how == "renamed":
            state["head.weight"] = state.pop("fc3.weight")
        else:  # a wider first fully connected layer
            state["fc1.weight"] = np.zeros((130, state["fc1.weight"].shape[1]), np.float32)

    return _rewritten(src, edit)


def _edit_config(src: Path, **changes: object) -> bytes:
    return _rewritten(src, lambda ckpt: ckpt["config"].update(changes))


@pytest.mark.parametrize("case, needle", [
    ("flipped", "corrupt: the payload's SHA-256 checksum does not match"),
    ("truncated", "truncated"),
    ("not-a-checkpoint", "not an mpitensor checkpoint"),
    ("other-seed", "was written with --seed = 7, this run has 0; resume with the same "
                   "setting"),
    ("no-world", "does not record the number of ranks and the batch size that wrote it"),
    ("renamed-key", "holds a different model than this run's LeNet (it lacks fc3.weight; it "
                    "has head.weight, which this model does not); resume from a checkpoint of "
                    "the same model or start without --resume"),
    ("other-shape", "holds a different model than this run's LeNet (shapes differ: fc1.weight "
                    "(130, 400) instead of (120, 400))"),
])
def test_bad_checkpoint_is_the_same_error_on_every_rank(
        case: str, needle: str, one_rank_checkpoint: Path, jobs: Callable[..., Job],
        tmp_path: Path) -> None:
    """--resume from a damaged or foreign checkpoint: one identical line per rank naming the
    file, exit code 1, and the checkpoint directory left byte for byte as it was."""
    good = one_rank_checkpoint.read_bytes()
    data = {"flipped": lambda: _flip(good), "truncated": lambda: good[:len(good) // 2],
            "not-a-checkpoint": lambda: b"epoch=3\nweights=...\n" * 10,
            "other-seed": lambda: _edit_config(one_rank_checkpoint, seed=7),
            "no-world": lambda: _edit_config(one_rank_checkpoint, world_size=None),
            "renamed-key": lambda: _edit_model(one_rank_checkpoint, "renamed"),
            "other-shape": lambda: _edit_model(one_rank_checkpoint, "shape")}[case]()
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "last.mt").write_bytes(data)
    # an intact earlier checkpoint beside it, which the error points to
    shutil.copy(one_rank_checkpoint.parent / "epoch001.mt", ck / "epoch001.mt")
    before = _snapshot(ck)
    job = run(jobs, command("mpiexec", 2, TRAIN, [
        "--dataset", "digits", "--train-size", "320", "--batch-size", "8", "--epochs", "1",
        "--no-progress", "--no-plot", "--checkpoint-dir", str(ck), "--resume"]), tmp_path)
    assert job.proc.returncode == 1, str(job)
    message = _per_rank_error(job, 2)
    assert str(ck / "last.mt") in message and needle in message, message
    if case in ("flipped", "truncated", "not-a-checkpoint"):  # read by rank 0, checked by all
        assert message.startswith(f"cannot resume from {ck / 'last.mt'}: on rank(s) [0, 1]: ")
        assert message.endswith(f"; pass an intact checkpoint with --resume PATH (the newest "
                                f"other checkpoint there is {ck / 'epoch001.mt'}) or start "
                                f"without --resume"), message
    assert job.stdout == "", str(job)
    assert _snapshot(ck) == before, "the failed run changed the checkpoint directory"


def _damage(how: str, d: Path) -> Path:
    """Damage one of the MNIST test-set files copied into ``d``; return the damaged file."""
    if how == "truncated-images":
        bad = d / MNIST_FILES[0]
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    elif how == "flipped-labels":
        bad = d / MNIST_FILES[1]
        bad.write_bytes(_flip(bad.read_bytes()))
    else:  # "short-labels": a valid gzip whose IDX header promises more labels than it holds
        bad = d / MNIST_FILES[1]
        raw = gzip.decompress(bad.read_bytes())
        bad.write_bytes(gzip.compress(raw[:-100]))
    return bad


@needs_mnist
@pytest.mark.parametrize("how, needle", [
    ("truncated-images", "not a valid gzip file"),
    ("flipped-labels", "not a valid gzip file"),
    ("short-labels", "(decompressed) but the header (10000,) of uint8 needs 10008; the file is "
                     "truncated"),
])
def test_bad_dataset_file_is_the_same_error_on_every_rank(
        how: str, needle: str, jobs: Callable[..., Job], tmp_path: Path) -> None:
    """A truncated or corrupt MNIST file: one identical line per rank naming the file, exit
    code 1, no checkpoint written."""
    data = tmp_path / "mnist"
    data.mkdir()
    for name in MNIST_FILES:
        shutil.copy(MNIST_DIR / name, data / name)
    bad = _damage(how, data)
    damaged = bad.read_bytes()
    ck = tmp_path / "ck"
    job = run(jobs, command("mpiexec", 2, TRAIN, [
        "--dataset", "mnist", "--data-dir", str(data), "--no-download", "--train-size", "256",
        "--val-size", "64", "--batch-size", "16", "--epochs", "1", "--no-progress", "--no-plot",
        "--checkpoint-dir", str(ck)]), tmp_path)
    assert job.proc.returncode == 1, str(job)
    message = _per_rank_error(job, 2)
    assert message.startswith(f"MNIST in {data} is unusable: {bad}"), message
    assert needle in message, message
    assert job.stdout == ""
    assert not ck.exists(), "a checkpoint directory was created by a run that never trained"
    assert bad.read_bytes() == damaged and sorted(p.name for p in data.iterdir()) == sorted(
        MNIST_FILES), "the data directory was changed"


def test_data_failing_on_one_rank_only_is_agreed(jobs: Callable[..., Job],
                                                 tmp_path: Path) -> None:
    """Rank 1 alone cannot load its data (a host set up differently): both ranks report it,
    naming the failing rank, and exit 1 instead of rank 0 waiting for rank 1 in DDP."""
    job = run(jobs, command("mpiexec", 2, FAULT, [*DIGITS, "--epochs", "1", "--checkpoint-dir",
                                                  str(tmp_path / "ck")]),
              tmp_path, env={"MT_FAULT": "no-sklearn:1"}, timeout=60)
    assert job.proc.returncode == 1, str(job)
    message = _per_rank_error(job, 2)
    assert message == ("--dataset digits needs scikit-learn (No module named 'sklearn' "
                       "(injected)) (on rank(s) [1] only; the other ranks succeeded)")
    assert not (tmp_path / "ck").exists()


# ----------------------------------------------------------------------------- fault 9
@pytest.mark.parametrize("args, needle", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
    (["--epochs", "-1"], "argument --epochs: must be at least 1, got -1"),
    (["--lr", "nan"], "argument --lr: must be in (0.0, 1000000.0], got nan"),
])
@pytest.mark.parametrize("launcher", ["python", "mpiexec"])
def test_train_bad_command_line(launcher: str, args: List[str], needle: str,
                                jobs: Callable[..., Job], tmp_path: Path) -> None:
    """One line on stderr (rank 0's only, under mpiexec -n 2), exit code 2, nothing else."""
    job = run(jobs, command(launcher, 2, TRAIN, [*args, "--checkpoint-dir", str(tmp_path / "ck")]),
              tmp_path, timeout=60)
    assert job.proc.returncode == 2, str(job)
    assert job.err_lines == [f"train.py: error: {needle} (see train.py --help)"], str(job)
    assert job.stdout == ""
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("case, needle", [
    ("unknown-flag", "unrecognized argument: --bogus"),
    ("zero-ranks", "argument -n: must be a positive number of ranks, got 0"),
    ("missing-hostfile", "hostfile {d}/nohosts does not exist"),
    ("malformed-hostfile", "hostfile {d}/hosts line 2: 'node2 3' is neither"),
])
def test_mpitensor_run_bad_command_line(case: str, needle: str, jobs: Callable[..., Job],
                                        tmp_path: Path) -> None:
    """The console script: one line on stderr, exit code 2, and nothing launched."""
    marker = tmp_path / "ran"
    script = tmp_path / "job.py"
    script.write_text(f"open({str(marker)!r}, 'a').write('x')\n")
    (tmp_path / "hosts").write_text("node1:2\nnode2 3\n")
    args = {"unknown-flag": ["--bogus", str(script)], "zero-ranks": ["-n", "0", str(script)],
            "missing-hostfile": ["-n", "2", "--hostfile", str(tmp_path / "nohosts"),
                                 str(script)],
            "malformed-hostfile": ["-n", "2", "--hostfile", str(tmp_path / "hosts"),
                                   str(script)]}[case]
    job = run(jobs, [*_mpitensor_run(), *args], tmp_path, timeout=60)
    assert job.proc.returncode == 2, str(job)
    assert len(job.err_lines) == 1, str(job)
    assert job.err_lines[0].startswith("mpitensor-run: error: " + needle.format(d=tmp_path)), \
        str(job)
    assert job.stdout == ""
    assert not marker.exists(), "the target ran despite the bad command line"
