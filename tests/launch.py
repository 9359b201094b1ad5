"""Test helper: run a command under ``mpiexec`` with a hard timeout, leaving nothing behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest

from mpitensor.distributed.launch import job as launch_job

ROOT = Path(__file__).resolve().parent.parent


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


def _outer_job_var(name: str) -> bool:
    # An enclosing MPI job's variables must not leak into a child job; the user's Open MPI
    # settings (OMPI_MCA_*, OMPI_ALLOW_RUN_AS_ROOT*) stay.
    if name.startswith(("OMPI_MCA_", "OMPI_ALLOW_RUN_AS_ROOT")):
        return False
    return name.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCAL"))


def clean_env(extra: Optional[dict] = None) -> dict:
    """This environment minus any outer MPI job's variables, with the repo importable.

    Thread pools are left to ``init_process_group``'s per-rank budget, as a user's are. In
    ``extra``, a value of None removes the variable.
    """
    env = {k: v for k, v in os.environ.items() if not _outer_job_var(k)}
    path = env.get("PYTHONPATH", "")
    # tests/_site: its sitecustomize makes every launched process write each line whole
    head = f"{ROOT}{os.pathsep}{ROOT / 'tests' / '_site'}"
    env["PYTHONPATH"] = f"{head}{os.pathsep}{path}" if path else head
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def leftovers(job_id: str, wait: float = 5.0) -> List[int]:
    """Processes of a job (found by the job id in their environment) still alive after ``wait``."""
    deadline = time.monotonic() + wait
    while launch_job._job_pids(job_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    return launch_job._job_pids(job_id)


def _start(cmd: Sequence[str], env: Optional[dict], cwd: Optional[Path], stdin: Optional[str],
           merge: bool) -> Tuple[subprocess.Popen, str]:
    # hydra starts its proxies and the ranks in sessions of their own, out of reach of a
    # process-group kill: every process of the job carries this id in its environment instead.
    job_id = f"test-{uuid.uuid4().hex}"
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True,
                            env=clean_env({**(env or {}), "MPITENSOR_JOB_ID": job_id}), cwd=cwd,
                            start_new_session=True,
                            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
    return proc, job_id


def _kill(proc: subprocess.Popen, job_id: str) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    launch_job._kill_job(job_id, wait=0)


def mpiexec_run(nprocs: int, args: Sequence[str], timeout: float, env: Optional[dict] = None,
                cwd: Optional[Path] = None, stdin: Optional[str] = None) -> Result:
    """Run ``mpiexec -n nprocs args...``; on timeout kill every process of the job."""
    proc, job_id = _start([find_mpiexec(), "-n", str(nprocs), *args], env, cwd, stdin, True)
    try:
        out, _ = proc.communicate(stdin, timeout=timeout)
        return Result(proc.returncode, out, False)
    except subprocess.TimeoutExpired:
        _kill(proc, job_id)
        out, _ = proc.communicate()
        return Result(proc.returncode, out, True)
    finally:
        launch_job._kill_job(job_id, wait=0)


def run_job(args: Sequence[str], timeout: float, cwd: Optional[Path] = None,
            env: Optional[dict] = None) -> Tuple[int, str, str, float]:
    """Run a command (a launcher, mpiexec, ...) with a hard timeout; fail the test on a hang.

    Returns ``(returncode, stdout, stderr, seconds)`` and asserts that no process of the job
    is left behind.
    """
    start = time.monotonic()
    proc, job_id = _start(args, env, cwd, None, False)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc, job_id)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(args)} hung (> {timeout} s):\n{out[-4000:]}\n{err[-4000:]}")
    elapsed = time.monotonic() - start
    left = leftovers(job_id)
    launch_job._kill_job(job_id, wait=0)
    assert not left, f"processes left behind by {' '.join(args)}: {left}"
    return proc.returncode, out, err, elapsed


# ------------------------------------------------------------------ MPICH's shared memory
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "mpich_shm_"


def mpich_segments() -> set:
    """Names of MPICH's shared-memory segments in /dev/shm (empty where there is none)."""
    try:
        return {p.name for p in SHM_DIR.glob(SHM_PREFIX + "*")}
    except OSError:
        return set()


def _mapped_segments() -> set:
    """The segments some live process has mapped (``/proc/*/maps``)."""
    names = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # gone, or not ours to read
            continue
        for line in text.splitlines():
            at = line.find(str(SHM_DIR / SHM_PREFIX))
            if at >= 0:
                names.add(Path(line[at:].split()[0]).name)
    return names


def sweep_mpich_segments(before: set) -> List[str]:
    """Remove the segments made since ``before`` that no live process maps; return them.

    MPICH unlinks a job's segment in ``MPI_Finalize``; a job whose ranks were killed or
    aborted (the fault tests make many) leaves its 2 MB behind in RAM-backed /dev/shm. A
    segment still mapped belongs to a job that is running, and stays.
    """
    stale = sorted(mpich_segments() - set(before) - _mapped_segments())
    removed = []
    for name in stale:
        try:
            (SHM_DIR / name).unlink()
            removed.append(name)
        except OSError:
            pass
    return removed


#: set by the test session (conftest.py) in its environment, which every process it starts
#: inherits: what tells this session's processes, and so its segments, from other runs'
SESSION_VAR = "MPITENSOR_TEST_SESSION"


def _in_session(pid: int, token: bytes) -> bool:
    try:
        return token in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def session_pids(session: str) -> List[int]:
    """The live processes that carry ``SESSION_VAR=session`` (this one left out)."""
    token = f"{SESSION_VAR}={session}".encode()
    me = os.getpid()
    return [int(p.name) for p in Path("/proc").glob("[0-9]*")
            if int(p.name) != me and _in_session(int(p.name), token)]


def _mappers(names: set) -> dict:
    """For each segment of ``names``, the pids of the live processes that map it."""
    found: dict = {name: set() for name in names}
    prefix = str(SHM_DIR / SHM_PREFIX)
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            at = line.find(prefix)
            if at >= 0:
                name = Path(line[at:].split()[0]).name
                if name in found:
                    found[name].add(int(maps.parent.name))
    return found


class SegmentWatch:
    """Notes which new MPICH segments this test session's processes make, as they appear.

    A segment's file says nothing of its job, and other runs (other checkouts, other
    users' tests) make segments in the same /dev/shm at the same time: a segment is this
    session's when a process carrying ``SESSION_VAR=session`` maps it. A rank maps its
    segment from ``MPI_Init`` to its exit, so a poll every ``interval`` seconds sees it.
    """

    def __init__(self, session: str, interval: float = 0.1) -> None:
        import threading

        self.session = session
        self.token = f"{SESSION_VAR}={session}".encode()
        self.interval = interval
        self.ours: set = set()
        self._seen = mpich_segments()  # there before: never ours
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="mpich-segment-watch",
                                        daemon=True)
        self._thread.start()

    def poll(self) -> None:
        """Look once at the segments that appeared since the last look."""
        with self._lock:
            new = mpich_segments() - self._seen
            if not new:
                return
            for name, pids in _mappers(new).items():
                if any(_in_session(pid, self.token) for pid in pids):
                    self.ours.add(name)
                    self._seen.add(name)
                elif pids:
                    self._seen.add(name)  # another run's
                # mapped by nobody (yet, or any more): looked at again next time

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - a failed look must not end the watch
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.poll()


def end_session(watch: SegmentWatch, patience: float = 3.0) -> List[str]:
    """Kill what this session started that still runs, then remove the segments it made.

    Returns the segments removed. Processes of an interrupted run's jobs run in sessions of
    their own, out of reach of the terminal's Ctrl-C: they carry the session's variable.
    """
    deadline = time.monotonic() + patience
    pids = session_pids(watch.session)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = session_pids(watch.session)
        if not pids:
            break
        deadline = time.monotonic() + 2.0
    watch.stop()
    mapped = _mapped_segments()
    removed = []
    for name in sorted(watch.ours - mapped):
        try:
            (SHM_DIR / name).unlink()
            removed.append(name)
        except OSError:
            pass
    return removed


HYDRA_XML_GLOB = "/tmp/hydra_hwloc_xmlfile_*"


def hydra_files() -> set:
    """MPICH hydra's topology files in /tmp (one per ``mpiexec``; it removes its own on a
    normal exit, and leaves it behind when the job calls ``MPI_Abort``)."""
    return {str(p) for p in Path("/tmp").glob(HYDRA_XML_GLOB.rsplit("/", 1)[1])}


def _hydra_starts() -> List[float]:
    """Start times (epoch seconds) of the live hydra processes (``mpiexec``, its proxies)."""
    try:
        boot = float(next(line.split()[1] for line in open("/proc/stat")
                          if line.startswith("btime")))
    except (OSError, StopIteration, ValueError):
        return [0.0]  # unknown: treat every file as possibly in use
    ticks = os.sysconf("SC_CLK_TCK")
    starts = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1:text.rfind(")")]
        if "hydra" in name or name.startswith("mpiexec"):
            fields = text[text.rfind(")") + 2:].split()
            starts.append(boot + int(fields[19]) / ticks)
    return starts


def sweep_hydra_files(before: set, patience: float = 3.0) -> List[str]:
    """Remove the hydra topology files made since ``before`` that no live hydra process can
    own (none started before the file was written); return them. The fault tests abort
    jobs on purpose, about 35 a run. A launcher of the last test may still be on its way
    out: files it could own are looked at again for up to ``patience`` seconds."""
    removed: List[str] = []
    left = sorted(hydra_files() - set(before))
    deadline = time.monotonic() + patience
    while left:
        starts = _hydra_starts()
        kept = []
        for path in left:
            try:
                made = os.stat(path).st_mtime
                if any(start <= made + 1.0 for start in starts):
                    kept.append(path)  # a running job may still read it
                    continue
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
        left = kept
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return removed


TORCH_LOG_GLOB = "torchelastic_*"


def torch_log_dirs() -> set:
    """torch's per-run log directories in /tmp (``torch.distributed.elastic`` makes one for
    every run of its launcher, and leaves it behind)."""
    return {str(p) for p in Path("/tmp").glob(TORCH_LOG_GLOB) if p.is_dir()}


def _open_paths() -> set:
    """The files live processes hold open (``/proc/*/fd``)."""
    paths = set()
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            paths.add(os.readlink(fd))
        except OSError:
            continue
    return paths


def sweep_torch_log_dirs(before: set) -> List[str]:
    """Remove the torch log directories made since ``before`` that no live process holds a
    file of (the torch oracles of the test suite make one a run); return them."""
    stale = sorted(torch_log_dirs() - set(before))
    if not stale:
        return []
    held = _open_paths()
    removed = []
    for path in stale:
        if any(p == path or p.startswith(path + "/") for p in held):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
