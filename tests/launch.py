"""Test helper: run a command under ``mpiexec`` with a hard timeout, leaving nothing behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence


def find_mpiexec() -> str:
    """The ``mpiexec`` of the MPI mpi4py runs on: the venv's (mpich wheel) first, then PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("mpiexec not found: pip install mpich, or put your MPI on PATH")
    return found


@dataclass
class Result:
    returncode: int
    output: str
    timed_out: bool


def mpiexec_run(nprocs: int, args: Sequence[str], timeout: float, env: Optional[dict] = None,
                cwd: Optional[Path] = None, stdin: Optional[str] = None) -> Result:
    """Run ``mpiexec -n nprocs args...``; kill the whole process group on timeout."""
    full_env = dict(os.environ)
    full_env.pop("PMI_RANK", None)  # an outer MPI job must not leak into the child job
    full_env.pop("PMI_SIZE", None)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    # Ranks oversubscribe the cores already: a multi-threaded BLAS per rank makes them fight
    # (LeNet DDP at 2 ranks: 58 s with default threads, 1.3 s with one).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        full_env.setdefault(var, "1")
    cmd = [find_mpiexec(), "-n", str(nprocs), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, cwd=cwd, start_new_session=True,
                            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(stdin, timeout=timeout)
        return Result(proc.returncode, out, False)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return Result(proc.returncode, out, True)
