"""End-to-end tests of ``examples/train.py``: accuracy, exact resume after SIGKILL, CLI errors.

Every run is a real subprocess (``mpiexec -n N`` or plain ``python``) under a hard timeout; on
timeout the whole process group is killed and reaped. Runs use temporary directories, removed after
each test. The MNIST tests read the shared test set in ``../shared/data/mnist``
(relative to the repository root) and are skipped with a reason where it is absent.

``MPITENSOR_TRAIN_TIMEOUT`` (seconds, default 600) bounds each launch.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import numpy as np
import pytest

from .launch import find_mpiexec

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "examples" / "train.py"
MNIST_DIR = ROOT.parent / "shared" / "data" / "mnist"
TIMEOUT = float(os.environ.get("MPITENSOR_TRAIN_TIMEOUT", "600"))
HAVE_MNIST = all((MNIST_DIR / f"t10k-{k}-idx{d}-ubyte.gz").is_file()
                 for k, d in (("images", 3), ("labels", 1)))
needs_mnist = pytest.mark.skipif(
    not HAVE_MNIST, reason=f"the MNIST test set is not in {MNIST_DIR} (t10k-*-ubyte.gz)")

FINAL = re.compile(r"^final held-out accuracy (\d+\.\d+)% \((\d+)/(\d+)\) after (\d+) epoch")
EPOCH = re.compile(r"^epoch (\d+)/(\d+): train loss (\d+\.\d+), held-out accuracy "
                   r"(\d+\.\d+)% \((\d+)/(\d+)\), ([\d,]+) samples/s$")


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A fresh directory, deleted after the test (pytest's own keeps the last three runs')."""
    with tempfile.TemporaryDirectory(prefix="mpitensor-train-") as d:
        yield Path(d)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> List[str]:
        return [ln for ln in self.stdout.splitlines() if ln.strip()]

    @property
    def err_lines(self) -> List[str]:
        return [ln for ln in self.stderr.splitlines() if ln.strip()]

    def __str__(self) -> str:
        return f"exit code {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    for var in ("PMI_RANK", "PMI_SIZE", "MPITENSOR_DATA_DIR"):  # no outer job, no user data
        env.pop(var, None)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _command(nprocs: int, args: Sequence[str]) -> List[str]:
    base = [sys.executable, str(TRAIN), "--no-progress", *args]
    return base if nprocs == 0 else [find_mpiexec(), "-n", str(nprocs), *base]


def _start(nprocs: int, args: Sequence[str], cwd: Path,
           env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Start train.py (nprocs 0: plain python) in its own process group."""
    return subprocess.Popen(_command(nprocs, args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(env), cwd=cwd,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the whole process group (mpiexec, its proxies, every rank) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def train(nprocs: int, *args: str, cwd: Path, env: Optional[Dict[str, str]] = None,
          timeout: float = TIMEOUT) -> Run:
    """Run train.py to completion under a hard timeout (nprocs 0: plain ``python``)."""
    proc = _start(nprocs, args, cwd, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        pytest.fail(f"train.py {' '.join(args)} on {nprocs} rank(s) hung (> {timeout:.0f} s)")
    return Run(proc.returncode, out, err)


def load_checkpoint(path: Path) -> dict:
    import mpitensor

    return mpitensor.load(path)


# ----------------------------------------------------------------------------- accuracy
@needs_mnist
@pytest.mark.parametrize("nprocs", [2])
def test_accuracy_mnist_split(nprocs: int, tmp_path: Path) -> None:
    """8,000 t10k images for training, 2,000 held out: >= 95 % after 5 epochs, global batch 64.

    At 4 ranks the docs test runs the same training (docs/training.md's command, as written)
    and compares every epoch's loss and accuracy with the transcript there."""
    run = train(nprocs, "--data-dir", str(MNIST_DIR), "--dataset", "mnist", "--epochs", "5",
                "--batch-size", str(64 // nprocs), "--lr", "0.03", "--momentum", "0.9",
                "--gamma", "0.6", "--seed", "0", "--checkpoint-dir", str(tmp_path / "ck"),
                "--checkpoint-every", "0", "--no-plot", cwd=tmp_path)
    # mpiexec exits 0 only when every rank exited 0
    assert run.returncode == 0, str(run)
    epochs = [m for m in map(EPOCH.match, run.lines) if m]
    assert [int(m.group(1)) for m in epochs] == [1, 2, 3, 4, 5], str(run)
    assert all(int(m.group(6)) == 2000 for m in epochs), str(run)
    losses = [float(m.group(3)) for m in epochs]
    assert losses[-1] < losses[0], f"training loss did not fall: {losses}"
    final = FINAL.match(run.lines[-1])
    assert final, f"no final line:\n{run}"
    accuracy, correct, total = float(final.group(1)), int(final.group(2)), int(final.group(3))
    assert total == 2000, "every held-out image evaluated exactly once"
    assert correct / total == pytest.approx(accuracy / 100, abs=5e-5)
    assert accuracy >= 95.0, f"held-out accuracy {accuracy}% < 95% at {nprocs} ranks:\n{run}"
    assert "MNIST t10k split 8,000 train / 2,000 held out" in run.lines[0]


# ----------------------------------------------------------------------------- resume
RESUME_ARGS = ("--data-dir", str(MNIST_DIR), "--dataset", "mnist", "--train-size", "2560",
               "--val-size", "256", "--epochs", "2", "--batch-size", "32",
               "--checkpoint-every", "3", "--seed", "7", "--no-plot")


def _wait_for_mid_epoch_checkpoint(proc: subprocess.Popen, path: Path, epoch: int,
                                   timeout: float) -> dict:
    """Poll ``path`` until it records a position inside ``epoch`` (0-based); return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended before a mid-epoch checkpoint of epoch {epoch + 1} "
                        f"appeared:\n{Run(proc.returncode, out, err)}")
        if path.exists():
            try:
                ckpt = load_checkpoint(path)
            except Exception:  # noqa: BLE001 - replaced while we read it: poll again
                ckpt = None
            if ckpt is not None and ckpt["epoch"] == epoch and ckpt["step_in_epoch"] > 0:
                return ckpt
        time.sleep(0.02)
    _kill(proc)
    pytest.fail(f"no mid-epoch checkpoint of epoch {epoch + 1} in {path} after {timeout} s")


@needs_mnist
def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path: Path) -> None:
    """Kill a 2-rank run mid-epoch, resume it: the final parameters equal an unbroken run's."""
    full = train(2, *RESUME_ARGS, "--checkpoint-dir", str(tmp_path / "full"), cwd=tmp_path)
    assert full.returncode == 0, str(full)

    killed_dir = tmp_path / "killed"
    proc = _start(2, [*RESUME_ARGS, "--checkpoint-dir", str(killed_dir)], cwd=tmp_path)
    try:
        _wait_for_mid_epoch_checkpoint(proc, killed_dir / "last.mt", epoch=1, timeout=TIMEOUT)
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL
    at_kill = load_checkpoint(killed_dir / "last.mt")
    assert at_kill["epoch"] == 1 and 0 < at_kill["step_in_epoch"] < 40, (
        at_kill["epoch"], at_kill["step_in_epoch"])
    assert not (killed_dir / "epoch002.mt").exists()

    resumed = train(2, *RESUME_ARGS, "--checkpoint-dir", str(killed_dir), "--resume",
                    cwd=tmp_path)
    assert resumed.returncode == 0, str(resumed)
    step = at_kill["step_in_epoch"]
    assert f"resumed from {killed_dir / 'last.mt'} at epoch 2, step {step} of 40" in resumed.stdout
    assert [ln for ln in resumed.lines if ln.startswith("epoch ")][0].startswith("epoch 2/2")

    a = load_checkpoint(tmp_path / "full" / "last.mt")
    b = load_checkpoint(killed_dir / "last.mt")
    assert a["global_step"] == b["global_step"] == 80
    assert a["epoch"] == b["epoch"] == 2
    assert list(a["model_state"]) == list(b["model_state"])
    for name in a["model_state"]:
        x, y = a["model_state"][name].numpy(), b["model_state"][name].numpy()
        assert x.dtype == y.dtype == np.float32
        assert np.array_equal(x, y), f"{name} differs after resume (max |diff| " \
                                     f"{np.abs(x - y).max()})"
    for sa, sb in zip(a["optimizer_state"]["state"].values(),
                      b["optimizer_state"]["state"].values()):
        assert np.array_equal(sa["momentum_buffer"].numpy(), sb["momentum_buffer"].numpy())
    # the per-epoch log is the same too (the resumed epoch's loss counts its first part)
    assert a["history"]["train_loss"] == b["history"]["train_loss"]
    assert a["history"]["accuracy"] == b["history"]["accuracy"]

    # the finished 2-rank run resumed by one process: nothing is left to train, and it says
    # that the number of ranks changed; its evaluation of the same model agrees
    alone = train(0, *RESUME_ARGS, "--checkpoint-dir", str(killed_dir), "--resume", cwd=tmp_path)
    assert alone.returncode == 0, str(alone)
    assert (f"resumed from {killed_dir / 'last.mt'} at the end of epoch 2 (global step 80); it "
            "was written by 2 rank(s), this run has 1: global batch") in alone.stdout, str(alone)
    final = [ln for ln in resumed.lines if ln.startswith("final held-out accuracy")]
    again = [ln for ln in alone.lines if ln.startswith("final held-out accuracy")]
    assert final and again and final[0].split(" after ")[0] == again[0].split(" after ")[0], (
        final, again)


def test_elastic_restart_resumes_by_itself(tmp_path: Path) -> None:
    """Started again by ``mpitensor-run --max-restarts`` (TORCHELASTIC_RESTART_COUNT > 0),
    train.py resumes from --checkpoint-dir/last.mt without --resume, and the result equals an
    uninterrupted run's; a first attempt, or a restart with no checkpoint yet, starts afresh."""
    args = ("--dataset", "digits", "--epochs", "2", "--no-plot", "--seed", "0",
            "--checkpoint-every", "0")
    full = train(2, *args, "--checkpoint-dir", str(tmp_path / "full"), cwd=tmp_path)
    assert full.returncode == 0, str(full)
    part = train(2, *args[:2], "--epochs", "1", *args[4:], "--checkpoint-dir",
                 str(tmp_path / "part"), cwd=tmp_path)
    assert part.returncode == 0, str(part)
    restart = {"TORCHELASTIC_RESTART_COUNT": "1"}
    resumed = train(2, *args, "--checkpoint-dir", str(tmp_path / "part"), cwd=tmp_path,
                    env=restart)
    assert resumed.returncode == 0, str(resumed)
    assert (f"resumed from {tmp_path / 'part' / 'last.mt'} at the end of epoch 1"
            in resumed.stdout), str(resumed)
    a = load_checkpoint(tmp_path / "full" / "last.mt")
    b = load_checkpoint(tmp_path / "part" / "last.mt")
    for name in a["model_state"]:
        assert np.array_equal(a["model_state"][name].numpy(), b["model_state"][name].numpy())
    fresh = train(2, *args[:2], "--epochs", "1", *args[4:], "--checkpoint-dir",
                  str(tmp_path / "none"), cwd=tmp_path, env=restart)
    assert fresh.returncode == 0, str(fresh)
    assert "resumed from" not in fresh.stdout


def test_resume_refuses_other_model_and_missing_file(tmp_path: Path) -> None:
    """A file that is not a LeNet train.py checkpoint, or none at all: one line, exit 1."""
    from mpitensor import save

    args = ("--dataset", "digits", "--epochs", "1", "--no-plot", "--checkpoint-dir",
            str(tmp_path))
    missing = train(0, *args, "--resume", cwd=tmp_path)
    assert missing.returncode == 1 and len(missing.err_lines) == 1, str(missing)
    assert str(tmp_path / "last.mt") in missing.err_lines[0]
    assert "no such file" in missing.err_lines[0]

    other = tmp_path / "other.mt"
    save({"format": "mpitensor-train-checkpoint", "version": 1, "model_name": "MLP",
          "model_state": {"fc.weight": np.zeros((2, 2), np.float32)}}, other)
    wrong = train(0, *args, "--resume", str(other), cwd=tmp_path)
    assert wrong.returncode == 1 and len(wrong.err_lines) == 1, str(wrong)
    assert str(other) in wrong.err_lines[0] and "different model" in wrong.err_lines[0]


# ----------------------------------------------------------------------------- CLI errors
@pytest.mark.parametrize("args, needle", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
    (["--epochs", "-3"], "argument --epochs: must be at least 1, got -3"),
    (["--epochs", "two"], "argument --epochs: expected an integer, got 'two'"),
    (["--lr", "-0.1"], "argument --lr: must be in (0.0"),
    (["--dataset", "cifar"], "argument --dataset: invalid choice: 'cifar'"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
])
def test_bad_command_line_is_one_line_and_exit_2(args: List[str], needle: str,
                                                 tmp_path: Path) -> None:
    run = train(0, *args, cwd=tmp_path, timeout=60)
    assert run.returncode == 2, str(run)
    assert run.stdout == ""
    assert len(run.err_lines) == 1, str(run)
    assert run.err_lines[0].startswith("train.py: error: ") and needle in run.err_lines[0]


def test_bad_command_line_under_mpiexec_prints_once(tmp_path: Path) -> None:
    run = train(2, "--batch-size", "0", cwd=tmp_path, timeout=120)
    assert run.returncode == 2, str(run)
    assert run.err_lines == ["train.py: error: argument --batch-size: must be at least 1, got 0 "
                             "(see train.py --help)"], str(run)


@pytest.mark.parametrize("args, needle", [
    (["--dataset", "mnist", "--no-download"], "--dataset mnist: no MNIST files in data/mnist"),
    (["--device", "cuda"], "--device cuda needs CuPy and a CUDA GPU"),
    (["--dataset", "digits", "--resume"], "cannot resume from checkpoints/last.mt: no such file"),
])
def test_runtime_error_under_mpiexec_is_one_line(args: List[str], needle: str,
                                                 tmp_path: Path) -> None:
    """docs/training.md: a problem found while running prints *one* ``train.py: error:`` line,
    and every rank exits 1; at -n 4 it used to be four lines, each prefixed ``[rank N]``."""
    if args[0] == "--device":
        from mpitensor import backend

        if not backend.cupy_unavailable_reason():
            pytest.skip("CuPy and a GPU are present here: --device cuda would train")
    run = train(4, *args, cwd=tmp_path, timeout=120)
    assert run.returncode == 1, str(run)
    assert len(run.err_lines) == 1, str(run)
    assert run.err_lines[0].startswith(f"train.py: error: {needle}"), str(run)
    assert run.stdout == ""


def test_torchrun_as_documented(tmp_path: Path) -> None:
    """``torchrun --nproc-per-node 2 train.py --lr 0.1`` (docs/launching.md, training.md):
    train.py used to import mpi4py.MPI before init_process_group, so each process was an MPI
    job of its own and both exited 1."""
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip("torchrun is not installed (torch is the tests' optional oracle)")
    (tmp_path / "train.py").write_bytes(TRAIN.read_bytes())
    env = _env({"MPITENSOR_MNIST_MIRRORS": "http://127.0.0.1:9/"})  # offline at once
    proc = subprocess.Popen([str(torchrun), "--nproc-per-node", "2", "train.py", "--lr", "0.1",
                             "--epochs", "1", "--max-steps", "4", "--no-plot"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tmp_path, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        _kill(proc)
        pytest.fail("torchrun --nproc-per-node 2 train.py hung")
    run = Run(proc.returncode, out, err)
    assert run.returncode == 0, str(run)
    assert "2 rank(s) x batch 32 = global batch 64" in run.lines[0], str(run)
    assert "lr 0.1 " in run.lines[0], str(run)
    assert run.lines[-1].startswith("final held-out accuracy") and "4 steps on 2 rank(s)" in \
        run.lines[-1], str(run)


# ----------------------------------------------------------------------------- datasets
def test_auto_falls_back_to_digits_with_one_warning(tmp_path: Path) -> None:
    """Empty --data-dir and no reachable mirror: Digits, announced by exactly one line."""
    empty = tmp_path / "no-mnist-here"
    empty.mkdir()
    # a closed local port: the download fails at once, with or without a network
    env = {"MPITENSOR_MNIST_MIRRORS": "http://127.0.0.1:9/"}
    run = train(2, "--data-dir", str(empty), "--epochs", "2", "--batch-size", "16",
                "--checkpoint-dir", str(tmp_path / "ck"), "--no-plot", cwd=tmp_path, env=env)
    assert run.returncode == 0, str(run)
    warnings = [ln for ln in run.err_lines if "warning" in ln]
    assert len(warnings) == 1 and run.err_lines == warnings, str(run)
    assert "Digits" in warnings[0] and "MNIST unavailable" in warnings[0]
    # the reason is said, not an empty pair of parentheses after a colon (issue 27 item 3)
    assert ":)" not in warnings[0] and "http://127.0.0.1:9/" in warnings[0], warnings[0]
    assert "Digits (scikit-learn) 1,438 train / 359 held out" in run.lines[0]
    final = FINAL.match(run.lines[-1])
    assert final and int(final.group(3)) == 359, str(run)
    assert float(final.group(1)) > 40.0, "two epochs (90 steps) on Digits learn something"
    assert not any(empty.iterdir()), "nothing was left in the data dir by the failed download"


def test_mnist_required_but_missing_is_one_line_error(tmp_path: Path) -> None:
    run = train(0, "--dataset", "mnist", "--data-dir", str(tmp_path), "--no-download",
                cwd=tmp_path, timeout=120)
    assert run.returncode == 1, str(run)
    assert len(run.err_lines) == 1 and str(tmp_path) in run.err_lines[0], str(run)


# ----------------------------------------------------------------------------- single process
def test_plain_python_is_one_rank(tmp_path: Path) -> None:
    """``python examples/train.py`` (no mpiexec): 1 rank, epoch lines, checkpoints, a PNG."""
    ck, png = tmp_path / "ck", tmp_path / "plots" / "curves.png"
    run = train(0, "--dataset", "digits", "--epochs", "2", "--batch-size", "64",
                "--train-size", "640", "--checkpoint-dir", str(ck), "--plot", str(png),
                cwd=tmp_path, timeout=300)
    assert run.returncode == 0, str(run)
    assert run.err_lines == [], str(run)
    assert "1 rank(s) x batch 64 = global batch 64" in run.lines[0]
    epochs = [m for m in map(EPOCH.match, run.lines) if m]
    assert [(int(m.group(1)), int(m.group(2))) for m in epochs] == [(1, 2), (2, 2)], str(run)
    final = FINAL.match(run.lines[-1])
    assert final and int(final.group(4)) == 2, str(run)
    assert run.lines[-1].endswith(f"curves: {png}")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in ck.iterdir()) == ["epoch001.mt", "epoch002.mt", "last.mt"]
    last = load_checkpoint(ck / "last.mt")
    assert last["config"]["world_size"] == 1 and last["global_step"] == 20
    assert last["epoch"] == 2 and last["step_in_epoch"] == 0
    assert set(last["model_state"]) == {f"{layer}.{kind}" for layer in
                                        ("conv1", "conv2", "fc1", "fc2", "fc3")
                                        for kind in ("weight", "bias")}
    # the two epoch checkpoints differ: training happened between them
    first = load_checkpoint(ck / "epoch001.mt")
    assert not np.array_equal(first["model_state"]["fc3.weight"].numpy(),
                              last["model_state"]["fc3.weight"].numpy())


# ----------------------------------------------------------------------------- benchmark
def _run_benchmark(script: str, args: List[str], cwd: Path) -> str:
    """Run ``benchmarks/<script>`` with a hard timeout; assert it succeeded; return stdout."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(), cwd=cwd, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill(proc)
        pytest.fail(f"{script} {' '.join(args)} hung (> {TIMEOUT:.0f} s)")
    assert proc.returncode == 0, str(Run(proc.returncode, stdout, stderr))
    return stdout


def test_conv_bands_benchmark_smoke(tmp_path: Path) -> None:
    """``benchmarks/conv_bands.py`` runs both settings in 2-rank jobs and prints their rows."""
    stdout = _run_benchmark("conv_bands.py", ["--rounds", "1", "--reps", "2", "--steps", "2",
                                              "--batch", "8"], tmp_path)
    rows = [line.split("|")[1:-1] for line in stdout.splitlines()
            if line.startswith("| whole matrix") or line.startswith("| bands of 1 MiB")]
    assert [r[0].strip() for r in rows] == ["whole matrix", "bands of 1 MiB"], stdout
    for r in rows:
        solo, together, ceiling = (float(v) for v in r[1:])
        assert solo > 0 and together > 0
        assert ceiling == pytest.approx(2 * solo / together, abs=0.05)  # printed rounded
    assert "1 jobs x 2 repetitions of 2 steps per setting" in stdout


def test_throughput_benchmark_smoke(tmp_path: Path) -> None:
    """``benchmarks/train_throughput.py --quick`` runs every phase and reports every row."""
    import json

    out = tmp_path / "bench.json"
    stdout = _run_benchmark("train_throughput.py", ["--quick", "--json", str(out), "--md",
                                                    str(tmp_path / "bench.md")], tmp_path)
    res = json.loads(out.read_text())
    torch_there = not res["single"]["torch_missing"]
    for phase in ("single", "ddp"):
        for batch in ("64", "256"):
            row = res[phase]["throughput"][batch]
            assert row["mpitensor"]["samples_per_s"] > 0
            assert ("torch" in row) == torch_there
            if phase == "ddp":
                assert row["mpitensor no sync"]["samples_per_s"] > 0
                assert row["mpitensor 1 process"]["samples_per_s"] > 0
                assert ("torch no sync" in row) == torch_there
    assert res["ddp"]["world_size"] == 2
    sweep = {(r["bucket_cap_mb"], r["overlap"]): r for r in res["ddp"]["sweep"]}
    assert set(sweep) == {(mb, ov) for mb in (0.0, 0.1, 1.0, 5.0, 25.0) for ov in (True, False)}
    assert sweep[(0.0, True)]["buckets"] == 10  # one bucket per LeNet parameter
    assert sweep[(25.0, True)]["buckets"] == 1  # LeNet's 247 KB fit in one
    assert all(r["overlapped_buckets_last_step"] == 0 for r in sweep.values()
               if not r["overlap"])
    prof = res["ddp"]["profile"]["mpitensor DDP"]
    for phase in ("forward", "backward compute", "launch", "wait", "optimizer", "total"):
        assert prof[phase] >= 0
    assert "| DDP scaling (2 ranks ÷ 1 process, same job) | 64 |" in stdout
    assert "| DDP efficiency (DDP ÷ no sync, same run) | 256 |" in stdout
    default = res["single"]["default_threads"]
    for batch in ("64", "256"):
        assert default["throughput"][batch]["mpitensor"]["samples_per_s"] > 0
    # the default-threads phase really ran the libraries' defaults (a pool per core), not the
    # pinned environment of the phases before it
    assert default["threads"]["mpitensor"] >= min(2, len(os.sched_getaffinity(0)))
    assert res["single"]["threads"]["mpitensor"] == 1  # the pinned phase really ran 1 thread
    assert "| 1 process, default threads (mpitensor " in stdout
    typed = res["as_typed"]
    assert typed["ranks"] == [1, 2] and typed["configs"][:2] == ["as typed", "1 thread"]
    for n in ("1", "2"):
        for config, runs in typed["samples_per_s"][n].items():
            assert len(runs) == 1 and runs[0] > 0, (n, config)
    assert "The README's command as typed: `mpiexec -n N python examples/train.py" in stdout
    assert "| as typed / best hand-set |" in stdout


def test_cuda_without_cupy_or_gpu_is_one_line_error(tmp_path: Path) -> None:
    """--device cuda never falls back to the CPU silently: no CuPy/GPU -> one line, exit 1."""
    from mpitensor import backend

    if not backend.cupy_unavailable_reason():
        pytest.skip("CuPy and a GPU are present here: --device cuda would train")
    run = train(0, "--device", "cuda", "--dataset", "digits", "--no-plot", "--checkpoint-dir",
                str(tmp_path), cwd=tmp_path, timeout=120)
    assert run.returncode == 1, str(run)
    assert len(run.err_lines) == 1, str(run)
    assert run.err_lines[0].startswith("train.py: error: --device cuda needs CuPy and a CUDA GPU")
    assert run.stdout == ""


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a POSIX pseudo-terminal")
def test_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    """Rank 0 draws a tqdm bar per epoch when stderr is a terminal (and not otherwise)."""
    import pty
    import shlex

    args = [sys.executable, str(TRAIN), "--dataset", "digits", "--epochs", "1",
            "--train-size", "320", "--no-plot", "--checkpoint-dir", str(tmp_path / "ck")]
    chunks: List[bytes] = []

    def read(fd: int) -> bytes:
        data = os.read(fd, 65536)
        chunks.append(data)
        return data

    env_before = dict(os.environ)
    os.environ.update(_env())
    try:  # a terminal of a real size: tqdm draws nothing on a 0-column pty
        status = pty.spawn(["sh", "-c", f"stty cols 120 rows 40; exec {shlex.join(args)}"],
                           read)
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    shown = b"".join(chunks).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, shown
    assert re.search(r"epoch 1/1: +\d+%\|.*\| \d+/5 \[", shown), shown
    assert "final held-out accuracy" in shown

    plain = train(0, *args[2:], cwd=tmp_path, timeout=300)  # (train() adds --no-progress)
    assert plain.returncode == 0 and plain.err_lines == [], str(plain)
    piped = subprocess.run(args, capture_output=True, text=True, env=_env(), cwd=tmp_path,
                           timeout=300)
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
