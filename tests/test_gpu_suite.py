"""benchmarks/gpu_suite.sh where there is no GPU: it says so, runs nothing and exits 0; and where
a GPU is listed but the Python environment cannot be made, every step is skipped with the reason
and the summary and the docs/gpu.md block still come out (exit 1)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_suite.sh"
STEPS = ("cupy-tests", "cupy-mpi-1", "cupy-mpi-2", "sharded", "nccl-allreduce", "train-compare",
         "train.py")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")


def _run(tmp_path, smi=None, **env):
    """Run the suite with only coreutils and, where given, a fake nvidia-smi on the PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text("#!/bin/sh\n" + smi)
        fake.chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    full = {"PATH": path, "HOME": str(tmp_path), "TMPDIR": str(tmp_path), **env}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          env=full, cwd=tmp_path)


def test_script_parses():
    got = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr


def test_help_lists_every_step():
    got = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert got.returncode == 0
    for name in STEPS:
        assert name in got.stdout
    bad = subprocess.run(["bash", str(SCRIPT), "--fast"], capture_output=True, text=True)
    assert bad.returncode == 2 and "'--fast'" in bad.stderr


@pytest.mark.parametrize("smi, why", [
    (None, "'nvidia-smi' is not on the PATH"),
    ("echo 'NVIDIA-SMI has failed because it could not reach the driver'; exit 9\n",
     "nvidia-smi -L failed: NVIDIA-SMI has failed"),
    ("echo 'No devices were found'\n", "lists no device: No devices were found"),
])
def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path, smi, why):
    out = tmp_path / "out"
    got = _run(tmp_path, smi, GPU_SUITE_OUT=str(out))
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith("gpu_suite: no GPU on this machine (")
    assert why in got.stdout
    assert "nothing GPU-related was run" in got.stdout
    assert got.stdout.count("\n") == 1 and got.stderr == ""
    assert not out.exists()  # no step started, not even the setup
    assert [p.name for p in tmp_path.iterdir()] == ["bin"]


def test_a_gpu_without_cupy_skips_every_step_and_still_reports(tmp_path):
    """A fake nvidia-smi lists a GPU; this interpreter lacks CuPy (or pytest-mpi) and the suite
    may not ask the registry: the setup fails with what to install, every step is skipped."""
    probe = subprocess.run([sys.executable, "-c", "import cupy, pytest_mpi, pytest_timeout"],
                           capture_output=True)
    if probe.returncode == 0:
        pytest.skip("this Python has CuPy: the setup would succeed and run the GPU steps")
    smi = ('case "$1" in -L) echo "GPU 0: Fake GPU (UUID: GPU-0)";; '
           '--query-gpu*) echo "Fake GPU, 1.0, 1 MiB";; *) echo "CUDA Version: 12.4";; esac\n')
    out = tmp_path / "out"
    got = _run(tmp_path, smi, GPU_SUITE_OUT=str(out), GPU_SUITE_OFFLINE="1",
               GPU_SUITE_WHEELS=str(tmp_path / "none"), PYTHON=sys.executable,
               GPU_SUITE_COMMIT="abc1234")
    assert got.returncode == 1, got.stdout + got.stderr
    assert "gpu_suite: 1 GPU(s): GPU 0: Fake GPU" in got.stdout
    assert "[setup] FAIL" in got.stdout and "lacks: " in got.stdout
    for name in STEPS:
        assert f"[{name}] SKIP in 0s" in got.stdout
    block = (out / "gpu_md_block.md").read_text()
    assert block.startswith("### GPU suite, ")
    assert "Fake GPU, 1.0, 1 MiB x 1" in block
    assert "| step | status | seconds | key figure |" in block
    for name in STEPS:
        assert f"| {name} | SKIP | 0 | setup failed |" in block
    assert block in got.stdout  # printed for pasting, between the markers
    assert "----- end -----" in got.stdout


def test_the_helper_scripts_refuse_bad_arguments():
    """The suite's Python steps check their arguments before any traffic."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for script, args, msg in (
            ("gpu_allreduce.py", ["--device", "cpu", "--min-bytes", "2M", "--max-bytes", "1M"],
             "need 1 <= --min-bytes <= --max-bytes, got 2097152 and 1048576"),
            ("gpu_train_compare.py", ["--device", "cpu", "--steps", "0"],
             "must be positive, got '64,256', 0"),
            ("gpu_sharded_check.py", ["--device", "cpu", "--steps", "0"],
             "--steps must be at least 1, got 0")):
        got = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                             capture_output=True, text=True, timeout=120, env=env)
        assert got.returncode == 2 and msg in got.stderr, (script, got.stderr)
