"""Launching MPI jobs from Python: the ``mpiexec`` finder, hostfiles, rank bootstrap and spawning.

Four pieces live here, shared by the ``mpitensor-run`` command (:mod:`mpitensor.run`),
:mod:`mpitensor.multiprocessing` and ``mpitensor.distributed.spawn``:

* finding the ``mpiexec`` of the installed MPI (the one next to ``sys.executable`` first, the
  mpich wheel's, then ``PATH``), telling MPICH/hydra from Open MPI, and building a command line
  with the flags each of them spells differently (:func:`find_mpiexec`, :func:`mpi_flavor`,
  :func:`build_command`, :func:`parse_hostfile`);
* the rank side: each rank runs its target inside :func:`run_target`, which prints an unhandled
  exception's traceback with every line prefixed ``[rank N]`` and calls ``MPI_Abort`` so the
  whole job dies at once instead of the other ranks hanging in their next collective;
* torchrun's per-rank variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...) from the MPI
  launcher's own (:func:`layout_from_env`, :func:`rank_env`) or from MPI
  (:func:`layout_from_mpi`, :func:`export_rank_env`);
* :func:`start_processes`, torch's ``multiprocessing`` spawning on MPI ranks, the one
  implementation behind :func:`mpitensor.multiprocessing.spawn` and :func:`spawn`.

Nothing here imports ``mpi4py`` at module level: the launching process never initializes MPI.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import os
import pickle
import re
import runpy
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..._base import config as _config
from ...errors import DistributedTimeoutError, MpiTensorError

__all__ = [
    "launcher_rank",
    "spawn",
    "start_processes",
    "ProcessContext",
    "SpawnContext",
    "RankProcess",
    "ProcessException",
    "ProcessRaisedException",
    "ProcessExitedException",
    "HostfileError",
    "find_mpiexec",
    "mpi_flavor",
    "launcher_option_values",
    "parse_hostfile",
    "build_command",
    "run_target",
    "RANK_ENV_VARS",
    "RUN_ONLY_ENV_VARS",
    "RankLayout",
    "layout_from_env",
    "layout_from_mpi",
    "rank_env",
    "export_rank_env",
]

MPICH = "mpich"
OPENMPI = "openmpi"

# Variables through which an MPI job tells its processes who they are; a job started from inside
# another (a test under mpiexec, a spawn from a rank) must not inherit the outer job's.
_JOB_ENV_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                     "PRTE_", "ORTE_")


class ProcessException(MpiTensorError):
    """A process started by :func:`start_processes` (or a ``spawn``) failed.

    Attributes:
        error_index: the failing process's index, which is its MPI rank (``None`` where it
            could not be told, e.g. several ranks vanished at once).
        rank: the same, under mpitensor's name.
        error_pid: that process's id (``None`` when unknown); also ``pid``.
    """

    def __init__(self, msg: str, error_index: Optional[int], error_pid: Optional[int]) -> None:
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.rank = error_index
        self.error_pid = error_pid
        self.pid = error_pid

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return type(self), (self.msg, self.error_index, self.error_pid)


class ProcessRaisedException(ProcessException):
    """A rank raised; the message names the rank and holds its traceback.

    Attributes:
        error_index: the rank that raised (the earliest, where several did); also ``rank``.
        error_pid: its process id; also ``pid``.
        exc_type: the name of the exception class raised on that rank.
        traceback_text: the rank's formatted traceback.
    """

    def __init__(self, msg: str, error_index: Optional[int], error_pid: Optional[int],
                 exc_type: str = "", traceback_text: str = "") -> None:
        super().__init__(msg, error_index, error_pid)
        self.exc_type = exc_type
        self.traceback_text = traceback_text

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return type(self), (self.msg, self.error_index, self.error_pid, self.exc_type,
                            self.traceback_text)


class ProcessExitedException(ProcessException):
    """A rank ended with a non-zero exit code or a signal, without a Python exception.

    Attributes:
        error_index: the rank (``None`` where it cannot be told: a failure of ``mpiexec`` itself,
            or several ranks gone at the same instant); also ``rank``.
        error_pid: its process id, where known; also ``pid``.
        exit_code: the exit code; negative (``-signum``) for a rank killed by a signal, as
            :attr:`multiprocessing.Process.exitcode` and torch have it.
        signal_name: ``"SIGKILL"`` and the like for a rank killed by a signal, else ``None``.
    """

    def __init__(self, msg: str, error_index: Optional[int], error_pid: Optional[int],
                 exit_code: int, signal_name: Optional[str] = None) -> None:
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return type(self), (self.msg, self.error_index, self.error_pid, self.exit_code,
                            self.signal_name)


class HostfileError(ValueError):
    """A hostfile does not exist or a line is neither ``host[:slots]`` nor ``host slots=N``."""


# Set on every process of a job started by spawn (a unique value per job), to find them all.
_JOB_ID_VAR = _config.ENV_JOB_ID


# --------------------------------------------------------------------------- finding mpiexec


def find_mpiexec(explicit: Optional[str] = None) -> str:
    """Return the ``mpiexec`` to launch with.

    Args:
        explicit: a path or command name chosen by the user; used as given when set.

    Returns:
        The path of the ``mpiexec`` next to ``sys.executable`` (the one the ``mpich`` wheel
        installs into a virtual environment) if there is one, else the first on ``PATH``.

    Raises:
        FileNotFoundError: no ``mpiexec`` was found.

    Example:
        >>> find_mpiexec()  # doctest: +SKIP
        '/home/me/venv/bin/mpiexec'
    """
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise FileNotFoundError(f"mpiexec {explicit!r} not found or not executable")
        return found
    local = Path(sys.executable).parent / "mpiexec"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise FileNotFoundError("no mpiexec found next to the Python interpreter or on PATH: "
                                "`pip install mpich` (or load your cluster's MPI module)")
    return found


@functools.lru_cache(maxsize=16)
def mpi_flavor(mpiexec: str) -> str:
    """Tell which MPI an ``mpiexec`` belongs to, from its ``--version`` output.

    Args:
        mpiexec: path of the launcher.

    Returns:
        ``"mpich"`` for MPICH's hydra and hydra-based MPIs (Intel MPI, MVAPICH), ``"openmpi"`` for
        Open MPI.

    Raises:
        RuntimeError: the launcher could not be run or its output names neither.

    Example:
        >>> mpi_flavor(find_mpiexec())  # doctest: +SKIP
        'mpich'
    """
    try:
        out = subprocess.run([mpiexec, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not run `{mpiexec} --version`: {exc}") from None
    if re.search(r"Open MPI|OpenRTE|Open RTE|PRRTE", out):
        return OPENMPI
    if re.search(r"HYDRA|MPICH|Intel\(R\) MPI|MVAPICH", out, re.IGNORECASE):
        return MPICH
    first = out.strip().splitlines()[0] if out.strip() else "(nothing)"
    raise RuntimeError(f"cannot tell which MPI {mpiexec} belongs to (`--version` printed "
                       f"{first!r}); point --mpiexec at an MPICH or Open MPI mpiexec")


# --------------------------------------------------------------------------- launcher options

# The options each launcher accepts, by name without leading dashes, with the number of values
# that follow them (MPICH's hydra from `mpiexec -h` and its option table; Open MPI from
# `mpirun --help all` of 4.1 and 5.0). Both launchers accept one or two leading dashes and an
# inline `=value`. mpitensor-run passes these through unchanged and rejects anything else.
_HYDRA_OPTIONS: Dict[str, int] = {
    **dict.fromkeys(["genv", "env"], 2),
    **dict.fromkeys([
        "genvlist", "envlist", "f", "hostfile", "machinefile", "hosts", "host", "rankmap",
        "wdir", "configfile", "launcher", "launcher-exec", "rmk", "topolib", "bind-to",
        "binding", "map-by", "membind", "demux", "errfile-pattern", "outfile-pattern",
        "prepend-pattern", "gpus-per-proc", "iface", "localhost", "nameserver", "order-nodes",
        "ppn", "usize", "memory-alloc-kinds"], 1),
    **dict.fromkeys([
        "genvnone", "genvall", "envnone", "envall", "enable-x", "disable-x",
        "disable-auto-cleanup", "disable-hostname-propagation", "hybrid-hosts", "info",
        "pmi-port", "prepend-rank", "l", "print-all-exitcodes", "profile", "skip-launch-node",
        "verbose", "v", "debug"], 0),
}
_OPENMPI_OPTIONS: Dict[str, int] = {
    **dict.fromkeys(["mca", "gmca", "prtemca", "pmixmca"], 2),
    **dict.fromkeys([
        "host", "H", "hostfile", "machinefile", "default-hostfile", "map-by", "rank-by",
        "bind-to", "npernode", "N", "npersocket", "cpus-per-proc", "cpus-per-rank", "cpu-set",
        "rankfile", "wdir", "wd", "path", "prefix", "x", "output-filename", "timeout",
        "report-uri", "stdin", "tune", "am", "preload-files", "personality", "output",
        "display", "runtime-options", "max-vm-size"], 1),
    **dict.fromkeys([
        "oversubscribe", "no-oversubscribe", "allow-run-as-root", "report-bindings",
        "display-map", "display-devel-map", "display-allocation", "tag-output",
        "timestamp-output", "merge-stderr-to-stdout", "nolocal", "noprefix",
        "use-hwthread-cpus", "quiet", "q", "verbose", "v", "report-state-on-timeout",
        "get-stack-traces", "enable-recovery", "disable-recovery", "show-progress",
        "do-not-resolve", "xml", "continuous"], 0),
}


def launcher_option_values(flavor: str, option: str) -> Optional[int]:
    """How many values follow ``option`` on the command line of ``flavor``'s ``mpiexec``.

    Args:
        flavor: ``"mpich"`` or ``"openmpi"`` (see :func:`mpi_flavor`).
        option: the option as typed, e.g. ``"--bind-to"``, ``"-genv"`` or ``"-map-by=core"``
            (an inline ``=value`` counts as given: 0 values follow).

    Returns:
        The number of values that follow, or ``None`` where that launcher has no such option.

    Example:
        >>> launcher_option_values("openmpi", "--mca")
        2
        >>> launcher_option_values("mpich", "--mca") is None
        True
    """
    table = _HYDRA_OPTIONS if flavor == MPICH else _OPENMPI_OPTIONS
    name, eq, _ = option.lstrip("-").partition("=")
    if not option.startswith("-") or name not in table:
        return None
    return 0 if eq else table[name]


# --------------------------------------------------------------------------- hostfiles


@dataclass(frozen=True)
class HostEntry:
    """One host of a hostfile: its name and its slot count (``None``: not given)."""

    host: str
    slots: Optional[int]


MAX_SLOTS = 4096  # per host: far above any node's cores or GPUs
_HOST_RE = r"[A-Za-z0-9_.\-\[\]]+|\[[0-9A-Fa-f:.]+\]"


def parse_hostfile(path: str) -> Tuple[List[HostEntry], str]:
    """Read and check a hostfile written for MPICH or for Open MPI.

    MPICH lines are ``host`` or ``host:slots``; Open MPI lines are ``host``, ``host slots=N`` and
    optionally ``max_slots=M``. ``#`` starts a comment; blank lines are allowed. One file must use
    one syntax.

    Args:
        path: the hostfile.

    Returns:
        ``(entries, syntax)`` where ``syntax`` is ``"mpich"``, ``"openmpi"`` or ``"plain"`` (only
        bare host names, valid for both).

    Raises:
        HostfileError: the file is missing, unreadable, empty, mixes syntaxes, or has a line of
            neither syntax (the message names the file and line).

    Example:
        >>> parse_hostfile("hostfiles/mpich.hostfile")  # doctest: +SKIP
        ([HostEntry(host='node1', slots=4), HostEntry(host='node2', slots=4)], 'mpich')
    """
    p = Path(path)
    if not p.is_file():
        raise HostfileError(f"hostfile {path} does not exist")
    try:
        lines = p.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise HostfileError(f"hostfile {path} cannot be read: {exc}") from None
    entries: List[HostEntry] = []
    syntaxes = set()
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = line.split()
        m = re.fullmatch(rf"({_HOST_RE})(?::(\d+))?", tokens[0])
        bad = (f"hostfile {path} line {number}: {raw.strip()!r} is neither `host[:slots]` "
               "(MPICH) nor `host slots=N` (Open MPI)")
        if m is None:
            raise HostfileError(bad)
        host, colon_slots = m.group(1), m.group(2)
        slots: Optional[int] = None
        if colon_slots is not None:
            if len(tokens) > 1 and any(t.startswith(("slots=", "max_slots=")) for t in tokens):
                raise HostfileError(bad)
            slots = int(colon_slots)
            syntaxes.add(MPICH)
        for tok in tokens[1:]:
            kv = re.fullmatch(r"(slots|max_slots|max-slots)=(\d+)", tok)
            if kv is not None:
                if kv.group(1) == "slots":
                    slots = int(kv.group(2))
                syntaxes.add(OPENMPI)
            elif colon_slots is not None and re.fullmatch(r"ifhn=\S+", tok):
                continue  # hydra's per-host interface hostname
            else:
                raise HostfileError(bad)
        if slots is not None and not 1 <= slots <= MAX_SLOTS:
            raise HostfileError(f"hostfile {path} line {number}: {raw.strip()!r} gives "
                                f"{slots} slots; slots must be between 1 and {MAX_SLOTS} (the "
                                "ranks one host runs; a huge count makes mpiexec spin)")
        entries.append(HostEntry(host, slots))
    if not entries:
        raise HostfileError(f"hostfile {path} names no host (only blank lines and comments)")
    if len(syntaxes) > 1:
        raise HostfileError(f"hostfile {path} mixes MPICH `host:slots` and Open MPI `host "
                            "slots=N` lines; use one syntax")
    return entries, (syntaxes.pop() if syntaxes else "plain")


def inline_comment_lines(path: str, text: Optional[str] = None) -> List[int]:
    """Line numbers of ``path`` with a comment after a host: MPICH's hydra rejects those.

    ``text``, when given, is the file's content already read.
    """
    out = []
    lines = (Path(path).read_text() if text is None else text).splitlines()
    for number, raw in enumerate(lines, 1):
        head, hash_, _ = raw.partition("#")
        if hash_ and head.strip():
            out.append(number)
    return out


def _hosts_option(entries: Sequence[HostEntry]) -> str:
    return ",".join(e.host if e.slots is None else f"{e.host}:{e.slots}" for e in entries)


# --------------------------------------------------------------------------- command lines


@dataclass
class Command:
    """An ``mpiexec`` command line and the environment additions it needs."""

    argv: List[str]
    env: Dict[str, str]

    def shell(self) -> str:
        """The command as one shell line, environment additions first."""
        pre = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join(pre + [shlex.quote(a) for a in self.argv])


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def build_command(
    rank_argv: Sequence[str],
    nprocs: Optional[int] = None,
    hostfile: Optional[str] = None,
    mpiexec: Optional[str] = None,
    flavor: Optional[str] = None,
    iface: Optional[str] = None,
    env: Sequence[Tuple[str, str]] = (),
    tag_output: bool = False,
    ppn: Optional[int] = None,
    extra: Sequence[str] = (),
) -> Command:
    """Build the ``mpiexec`` command that runs ``rank_argv`` on every rank.

    The flags MPICH and Open MPI spell differently are translated: hostfile (``-f`` /
    ``--hostfile``; a hostfile in the other MPI's syntax is passed inline as ``-hosts`` /
    ``--host``), per-rank environment (``-genv`` / ``-x``), network interface (``-iface`` plus
    ``UCX_NET_DEVICES`` and ``FI_TCP_IFACE`` / ``--mca btl_tcp_if_include``), output tags
    (``-prepend-rank`` / ``--tag-output``), ranks per node (``-ppn`` / ``--map-by
    ppr:N:node``). For Open MPI, ``--oversubscribe`` is added where more ranks than slots are
    asked for, and ``--allow-run-as-root`` (with its two environment
    variables) when running as root.

    Args:
        rank_argv: what each rank runs, e.g. ``[sys.executable, "script.py"]``.
        nprocs: number of ranks (``None``: let the MPI decide, e.g. from the hostfile).
        hostfile: a hostfile in either syntax (checked by :func:`parse_hostfile`).
        mpiexec: launcher path (default :func:`find_mpiexec`).
        flavor: ``"mpich"`` or ``"openmpi"`` (default: detected from the launcher).
        iface: network interface for MPI traffic, e.g. ``"eth0"``.
        env: ``(name, value)`` pairs set on every rank.
        tag_output: prefix each output line with its rank.
        ppn: ranks per node.
        extra: further options passed to ``mpiexec`` unchanged, before the program.

    Returns:
        A :class:`Command`; ``Command.shell()`` is its printable form.

    Raises:
        HostfileError: the hostfile is missing or malformed.
        ValueError: ``nprocs`` or ``ppn`` is not a positive integer.

    Example:
        >>> build_command([sys.executable, "train.py"], 4).argv  # doctest: +SKIP
        ['/venv/bin/mpiexec', '-n', '4', '/venv/bin/python', 'train.py']
    """
    for name, value in (("nprocs", nprocs), ("ppn", ppn)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    launcher = find_mpiexec(mpiexec)
    kind = flavor or mpi_flavor(launcher)
    if kind not in (MPICH, OPENMPI):
        raise ValueError(f"flavor must be 'mpich' or 'openmpi', got {kind!r}")
    argv: List[str] = [launcher]
    extra_env: Dict[str, str] = {}
    entries: List[HostEntry] = []
    if hostfile is not None:
        entries, syntax = parse_hostfile(hostfile)
        # hydra cannot read a comment after a host: such a file's hosts go on the command line
        text = Path(hostfile).read_text()  # parse_hostfile has checked it is readable
        commented = inline_comment_lines(hostfile, text) if kind == MPICH else []
        if commented and "ifhn=" in text:
            raise HostfileError(
                f"hostfile {hostfile} lines {commented}: MPICH's hydra rejects a comment after a "
                "host, and this file's ifhn= settings cannot be passed another way; move the "
                "comments to lines of their own")
        direct = syntax in ("plain", kind) and not commented
        if direct:
            argv += ["-f", hostfile] if kind == MPICH else ["--hostfile", hostfile]
        else:
            argv += ["-hosts" if kind == MPICH else "--host", _hosts_option(entries)]
    if nprocs is not None:
        argv += ["-n", str(nprocs)]
    if kind == MPICH:
        if ppn is not None:
            argv += ["-ppn", str(ppn)]
        if iface is not None:
            argv += ["-iface", iface]
            # hydra's -iface covers its own connections; the ch4 netmods (UCX, libfabric)
            # choose their devices themselves, so name the interface to them too
            env = list(env) + [("UCX_NET_DEVICES", iface), ("FI_TCP_IFACE", iface)]
        for k, v in env:
            argv += ["-genv", k, v]
        if tag_output:
            argv += ["-prepend-rank"]
    else:
        if _is_root():
            argv += ["--allow-run-as-root"]
            extra_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        known = [e.slots for e in entries]
        if nprocs is not None and (
                (not entries and nprocs > (os.cpu_count() or 1))
                or (entries and None not in known and nprocs > sum(known))):  # type: ignore
            argv += ["--oversubscribe"]
        if ppn is not None:
            argv += ["--map-by", f"ppr:{ppn}:node"]
        if iface is not None:
            argv += ["--mca", "btl_tcp_if_include", iface, "--mca", "oob_tcp_if_include", iface]
        for k, v in env:
            argv += ["-x", f"{k}={v}"]
        if tag_output:
            argv += ["--tag-output"]
    argv += list(extra)
    argv += list(rank_argv)
    return Command(argv, extra_env)


def _job_env(additions: Dict[str, str]) -> Dict[str, str]:
    nested = launcher_rank(None) is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(_JOB_ENV_PREFIXES)
           and not (nested and k in _PER_RANK_VARS)}
    env.update(additions)
    return env


def _job_pids(job_id: str, var: str = _JOB_ID_VAR) -> List[int]:
    """Processes (other than this one) whose environment carries ``MPITENSOR_JOB_ID=job_id``.

    Hydra starts its proxies and the ranks in sessions of their own, so a process group does not
    reach them; the job id, which every process of the job inherits, does. Linux only (``/proc``);
    elsewhere the list is empty. ``var`` names another variable to look for (``mpitensor-run``
    tags each attempt of a restarting job with one of its own).
    """
    needle = f"{var}={job_id}".encode()
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue  # a zombie is already dead
        except OSError:
            continue
        pids.append(int(entry))
    return pids


def _kill_job(job_id: str, wait: float = 3.0, var: str = _JOB_ID_VAR) -> List[int]:
    """Wait up to ``wait`` s for the job's processes to end, then SIGKILL any left.

    Returns:
        The processes that were still there after ``wait`` and got the SIGKILL.
    """
    deadline = time.monotonic() + wait
    while _job_pids(job_id, var) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _job_pids(job_id, var)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return left


def _kill_group(proc: subprocess.Popen, grace: float = 2.0) -> None:
    """SIGTERM the job's process group, then SIGKILL what is left after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGKILL:
            break
        # mpiexec exited on SIGTERM; make sure no rank outlived it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        break


# --------------------------------------------------------------------------- the rank side


# what each launcher calls a process's world rank, in order of trust: MPICH/hydra and Intel
# MPI, Open MPI, MVAPICH, PMIx launchers, and SLURM's srun last (see _LAYOUT_VARS, which uses
# this tuple for "rank")
LAUNCHER_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK",
                      "SLURM_PROCID")


def launcher_rank(default: Optional[int] = 0) -> Optional[int]:
    """This process's world rank as its launcher announced it, without initialising MPI.

    For what must happen before ``init_process_group``: printing a usage error once per job,
    not once per rank, say. Returns ``default`` when no launcher variable is set (a plain
    ``python`` run).

    Example:
        >>> launcher_rank()   # under `mpiexec -n 4`: 0, 1, 2 or 3
        0
    """
    for name in LAUNCHER_RANK_VARS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return default


def _world_rank() -> Optional[int]:
    return launcher_rank(None)


# --------------------------------------------------------------------------- torchrun's variables

#: The variables torchrun gives every worker that programs read: ``mpitensor-run`` sets them on
#: every rank before the script starts, and ``init_process_group`` sets the ones that are absent
#: under any other MPI launcher.
RANK_ENV_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")
#: The rest of torchrun's set, which only ``mpitensor-run`` gives (they describe its launch).
RUN_ONLY_ENV_VARS = ("GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
                     "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                     "TORCHELASTIC_USE_AGENT_STORE")
# torchrun's per-rank variables: a job started from a rank of another job must not inherit that
# rank's (a job started from a plain process keeps what its user set, as torch's children do)
_PER_RANK_VARS = tuple(v for v in RANK_ENV_VARS + RUN_ONLY_ENV_VARS
                       if not v.startswith(("MASTER_", "TORCHELASTIC_")) and v != "ROLE_NAME")
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500  # torchrun's

# Per quantity, the launchers' variables in order of trust: MPICH's hydra (also Intel MPI),
# Open MPI, MVAPICH, PMIx, and SLURM last, because a job started inside an allocation inherits
# the allocation's SLURM_* values, which describe another launch.
_LAYOUT_VARS: Dict[str, Tuple[str, ...]] = {
    "rank": LAUNCHER_RANK_VARS,
    "size": ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_NTASKS",
             "SLURM_NPROCS"),
    "local_rank": ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK",
                   "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"),
    "local_size": ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                   "MV2_COMM_WORLD_LOCAL_SIZE"),
}


@dataclass
class RankLayout:
    """Where one rank sits: its rank and the world's size, on its node, and its node's index."""

    rank: Optional[int] = None
    size: Optional[int] = None
    local_rank: Optional[int] = None
    local_size: Optional[int] = None
    node_rank: Optional[int] = None
    nnodes: Optional[int] = None

    def complete(self) -> bool:
        """True when every field is known."""
        return None not in (self.rank, self.size, self.local_rank, self.local_size,
                            self.node_rank, self.nnodes)


def _slurm_tasks_on_node(spec: str, node: int) -> Optional[int]:
    """The task count of node ``node`` in SLURM's ``2(x3),1`` notation."""
    counts: List[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node] if 0 <= node < len(counts) else None


def layout_from_env(environ: Optional[Dict[str, str]] = None) -> RankLayout:
    """What the MPI launcher's per-rank variables say about this rank, without starting MPI.

    Reads MPICH/hydra's ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``,
    Open MPI's ``OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}``, MVAPICH's
    ``MV2_COMM_WORLD_*`` and SLURM's ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
    ``SLURM_NODEID``, ``SLURM_STEP_TASKS_PER_NODE``. The node index is known on one node
    (every rank local) and under ``srun``; elsewhere it stays ``None``.

    Args:
        environ: the variables to read (default ``os.environ``).

    Returns:
        A :class:`RankLayout`; fields no variable gives are ``None``.

    Example:
        >>> layout_from_env({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1",
        ...                  "MPI_LOCALNRANKS": "2"})
        RankLayout(rank=1, size=2, local_rank=1, local_size=2, node_rank=0, nnodes=1)
    """
    env = os.environ if environ is None else environ
    found: Dict[str, Optional[int]] = {}
    source: Dict[str, str] = {}
    for key, names in _LAYOUT_VARS.items():
        found[key] = None
        for name in names:
            value = env.get(name, "").strip()
            if value.isdigit():
                found[key], source[key] = int(value), name
                break
    lay = RankLayout(**found)
    if source.get("rank") == "SLURM_PROCID":  # srun started the ranks: its node ids hold
        node = env.get("SLURM_NODEID", "").strip()
        nnodes = (env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or "").strip()
        if node.isdigit() and nnodes.isdigit():
            lay.node_rank, lay.nnodes = int(node), int(nnodes)
            spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
            if lay.local_size is None and spec:
                lay.local_size = _slurm_tasks_on_node(spec, int(node))
    if lay.size is not None and lay.local_size == lay.size:
        lay.node_rank, lay.nnodes = 0, 1
    return lay


def layout_from_mpi(comm: Any) -> Tuple[RankLayout, str]:
    """This rank's layout as MPI sees it: collective over ``comm`` (every rank must call it).

    The node is the set of ranks sharing memory (``MPI_Comm_split_type(COMM_TYPE_SHARED)``);
    nodes are numbered in the order of their lowest rank.

    Returns:
        ``(layout, host)``: the :class:`RankLayout` and the host name of rank 0.
    """
    import socket

    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return RankLayout(0, 1, 0, 1, 0, 1), socket.gethostname()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    try:
        local_rank, local_size = node.Get_rank(), node.Get_size()
        leader = node.bcast(rank, root=0)
    finally:
        node.Free()
    info = comm.allgather((local_rank == 0, socket.gethostname() if rank == 0 else None))
    node_rank = sum(1 for lead, _ in info[:leader] if lead)
    nnodes = sum(1 for lead, _ in info if lead)
    return RankLayout(rank, size, local_rank, local_size, node_rank, nnodes), info[0][1]


def _layout_env(lay: RankLayout, master_addr: str, master_port: str) -> Dict[str, str]:
    return {"RANK": str(lay.rank), "LOCAL_RANK": str(lay.local_rank),
            "WORLD_SIZE": str(lay.size), "LOCAL_WORLD_SIZE": str(lay.local_size),
            "GROUP_RANK": str(lay.node_rank), "MASTER_ADDR": master_addr,
            "MASTER_PORT": master_port, "TORCHELASTIC_RESTART_COUNT": "0"}


def rank_env(settings: Optional[Dict[str, str]] = None,
             environ: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """torchrun's variables for this rank, as ``mpitensor-run``'s bootstrap sets them.

    The values come from the launcher's per-rank variables (:func:`layout_from_env`); where
    those leave something open (ranks on several nodes, outside ``srun``; an MPI whose launcher
    sets none), MPI is started here and asked (:func:`layout_from_mpi`), so that the script
    reads exact values from its first line on.

    Args:
        settings: the launch's own values: ``MASTER_ADDR``, ``MASTER_PORT``,
            ``TORCHELASTIC_RUN_ID``, ``ROLE_NAME``, ``TORCHELASTIC_RESTART_COUNT``,
            ``TORCHELASTIC_MAX_RESTARTS`` (defaults: ``127.0.0.1`` on one node, rank 0's host
            on several; ``29500``; ``none``; ``default``; ``0``; ``0``).
        environ: the launcher's variables (default ``os.environ``).

    Returns:
        ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
        ``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_NAME``, ``ROLE_WORLD_SIZE``,
        ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RESTART_COUNT``,
        ``TORCHELASTIC_MAX_RESTARTS``, ``TORCHELASTIC_RUN_ID``,
        ``TORCHELASTIC_USE_AGENT_STORE`` (``False``), as strings.

    Example:
        >>> rank_env({"MASTER_PORT": "29600"})["LOCAL_RANK"]  # doctest: +SKIP
        '1'
    """
    settings = dict(settings or {})
    lay = layout_from_env(environ)
    master = settings.get("MASTER_ADDR")
    if not lay.complete() or (master is None and lay.nnodes != 1):
        from mpi4py import MPI

        lay, host0 = layout_from_mpi(MPI.COMM_WORLD)
        if master is None and lay.nnodes != 1:
            master = host0
    env = _layout_env(lay, master or DEFAULT_MASTER_ADDR,
                      settings.get("MASTER_PORT", str(DEFAULT_MASTER_PORT)))
    env.update(GROUP_WORLD_SIZE=str(lay.nnodes), ROLE_RANK=str(lay.rank),
               ROLE_NAME=settings.get("ROLE_NAME", "default"), ROLE_WORLD_SIZE=str(lay.size),
               TORCHELASTIC_RESTART_COUNT=settings.get("TORCHELASTIC_RESTART_COUNT", "0"),
               TORCHELASTIC_MAX_RESTARTS=settings.get("TORCHELASTIC_MAX_RESTARTS", "0"),
               TORCHELASTIC_RUN_ID=settings.get("TORCHELASTIC_RUN_ID", "none"),
               TORCHELASTIC_USE_AGENT_STORE="False")
    return env


def export_rank_env(comm: Any) -> Dict[str, str]:
    """Set those of :data:`RANK_ENV_VARS` that are absent, from MPI; collective over ``comm``.

    What ``init_process_group`` does under a launcher other than ``mpitensor-run`` (plain
    ``mpiexec``, ``srun``), so that code after it may read ``os.environ["LOCAL_RANK"]`` as
    under torchrun. Values already set are left alone.

    Returns:
        The variables it set, with their values.
    """
    lay, host0 = layout_from_mpi(comm)
    values = _layout_env(lay, DEFAULT_MASTER_ADDR if lay.nnodes == 1 else host0,
                         str(DEFAULT_MASTER_PORT))
    added = {k: v for k, v in values.items() if os.environ.get(k, "") == ""}
    os.environ.update(added)
    return added


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not stop the abort
            pass


def _abort(code: int) -> None:
    """End the whole MPI job now with ``code``; the last resort is ``os._exit``."""
    _flush()
    try:
        from ..health.abort import abort_job

        abort_job(code)
    except BaseException:  # noqa: BLE001 - fall through to the hard exit
        pass
    os._exit(code)


def _user_frames(tb: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    """Drop the bootstrap's own frames (this module, runpy) from the top of a traceback."""
    here = os.path.abspath(__file__)
    start = tb
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (os.path.abspath(name) == here or "runpy" in name):
            return tb
        tb = tb.tb_next
    return start


def _report_exception(exc: BaseException, rank: Optional[int]) -> str:
    from ..health.abort import report_traceback

    return report_traceback(rank, type(exc), exc, _user_frames(exc.__traceback__))


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")  # sys.exit("message") prints the message and exits 1
    return 1


def run_target(target: Sequence[str], module: bool = False,
               on_end: Optional[Callable[[int, str], None]] = None) -> int:
    """Run a script or module as this rank's ``__main__``, aborting the job on failure.

    On an unhandled exception the traceback goes to stderr with each line prefixed
    ``[rank N]`` and ``MPI_Abort(MPI_COMM_WORLD, 1)`` ends every rank at once. ``sys.exit(0)`` or
    falling off the end returns 0; ``sys.exit(code)`` with a non-zero code returns that code when
    every rank exits non-zero within a grace of 2 s (``MPITENSOR_EXIT_GRACE``), and otherwise
    aborts the job with it, since the other ranks could wait for this one forever.

    Args:
        target: ``[script, *args]`` or, with ``module=True``, ``[module, *args]``.
        module: run ``target[0]`` as a module (``python -m``).
        on_end: called as ``on_end(code, how)`` just before this rank ends, with the exit
            code (0: a normal end) and ``"exit"`` or ``"raised <ExceptionName>"``; it must not
            raise (``mpitensor-run --max-restarts`` reports the ending to the launcher with it).

    Returns:
        0 when the target ended normally, or the exit code all ranks agreed on (a failure of
        one rank does not return).

    Example:
        >>> run_target(["train.py", "--epochs", "1"])  # doctest: +SKIP
        0
    """
    name, args = target[0], list(target[1:])
    _install_thread_abort()
    exit_comm = _exit_communicator()
    try:
        try:
            if module:
                sys.argv = [name, *args]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            else:
                sys.argv = [name, *args]
                sys.path.insert(0, os.path.dirname(os.path.abspath(name)))
                runpy.run_path(name, run_name="__main__")
        finally:
            _flush()
    except SystemExit as exc:
        code = _exit_code(exc.code)
        if code != 0:
            if on_end is not None:
                on_end(code, "exit")
            if _every_rank_exits(exit_comm):
                _flush()
                return code  # an agreed exit (argparse, checked errors): no abort, no noise
            rank = _rank_now()
            sys.stderr.write(f"[rank {rank}] exited with code {code}; ending the job\n")
            _abort(code)
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        if on_end is not None:
            on_end(1, f"raised {type(exc).__name__}")
        _report_exception(exc, _rank_now())
        _abort(1)
    if on_end is not None:
        on_end(0, "exit")
    return 0


def _exit_communicator() -> Any:
    """A private duplicate of the world on which exiting ranks meet (None without MPI)."""
    try:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            return MPI.COMM_WORLD.Dup()
    except Exception:  # noqa: BLE001 - without it every non-zero exit aborts, as before
        pass
    return None


def exit_grace(default: float = 2.0) -> float:
    """``MPITENSOR_EXIT_GRACE`` in seconds; a malformed value is reported (once, on stderr)
    and the default used: this runs while a rank exits, where raising would hide its own
    message."""
    try:
        return _config.exit_grace(default)
    except ValueError as exc:
        sys.stderr.write(f"mpitensor: {exc}; using {default:g} s\n")
        return default


def _every_rank_exits(comm: Any, grace: float = 2.0) -> bool:
    """True when every rank reaches a non-zero ``sys.exit`` within ``grace`` seconds.

    Then each rank exits with its own code and prints its own last line, instead of the first
    one to get there aborting the others mid-message.
    """
    if comm is None:
        return False
    request = comm.Ibarrier()
    deadline = time.monotonic() + exit_grace(grace)
    while time.monotonic() < deadline:
        if request.Test():
            return True
        time.sleep(0.002)
    return False


def _install_thread_abort() -> None:
    """Make an exception that kills a thread abort the job too (the main thread is ours)."""
    try:
        from ..health.abort import install_abort_handler
    except ImportError:  # pragma: no cover - an older tree without the handler
        return
    install_abort_handler()


def _rank_now() -> Optional[int]:
    rank = _world_rank()
    if rank is not None:
        return rank
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        try:
            if mpi.Is_initialized() and not mpi.Is_finalized():
                return mpi.COMM_WORLD.Get_rank()
        except Exception:  # noqa: BLE001
            pass
    return None


# --------------------------------------------------------------------------- spawn


def _describe_callable(fn: Callable) -> Dict[str, Any]:
    """How a rank finds ``fn`` again: by module and qualified name, never by value."""
    if not callable(fn):
        raise TypeError(f"spawn: fn must be callable, got {type(fn).__name__}")
    if isinstance(fn, functools.partial):
        raise TypeError("spawn: fn must be a function defined at the top level of a module; "
                        "for a functools.partial, pass the bound values through args=")
    qualname = getattr(fn, "__qualname__", None)
    modname = getattr(fn, "__module__", None)
    if qualname is None or modname is None:
        raise TypeError(f"spawn: cannot locate {fn!r} by module and name; pass a function "
                        "defined with `def` at the top level of a module")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(f"spawn: fn {qualname!r} is a lambda or a nested function, which the "
                        "ranks (separate processes) cannot import; define it with `def` at the "
                        f"top level of module {modname!r}")
    desc: Dict[str, Any] = {"qualname": qualname, "module": modname, "main_path": None}
    if modname in ("__main__", "__mp_main__"):
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and getattr(spec, "name", None):
            desc["module"] = spec.name  # started as `python -m pkg.mod`
        else:
            path = getattr(main, "__file__", None)
            if not path:
                raise TypeError("spawn: fn is defined in an interactive session, which the "
                                "ranks cannot import; put it in a .py file")
            desc["main_path"] = os.path.abspath(path)
    obj: Any = sys.modules.get(modname) if desc["main_path"] is None else sys.modules["__main__"]
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn and not (isinstance(fn, types.MethodType) and obj is not None):
        raise TypeError(f"spawn: {modname}.{qualname} does not name fn (it was redefined or "
                        "decorated); pass a function reachable by its module and name")
    return desc


class ProcessContext:
    """The ranks started by one :func:`start_processes` call, under one ``mpiexec``.

    torch's ``ProcessContext`` interface (``join(timeout)``, ``pids()``, ``processes``) on MPI
    ranks, plus :meth:`kill`, ``results`` and ``job_id``. ``spawn(..., join=False)`` returns one.

    Attributes:
        nprocs: the number of ranks.
        processes: one :class:`RankProcess` per rank, by rank.
        daemon: whether the job is killed when this process exits (else waited for).
        job_id: the value of ``MPITENSOR_JOB_ID`` in the environment of every process of the job.
        results: after a successful :meth:`join`, each rank's return value, by rank (``None``
            for a rank that left through ``sys.exit(0)`` or whose value could not be pickled).
    """

    def __init__(self, proc: subprocess.Popen, workdir: str, nprocs: int,
                 deadline: Optional[float], timeout: Optional[float], job_id: str,
                 daemon: bool = False, flavor: Optional[str] = None) -> None:
        self._proc = proc
        self.job_id = job_id
        self._workdir = workdir
        self.nprocs = nprocs
        self.daemon = daemon
        self._deadline = deadline
        self._timeout = timeout
        self._flavor = flavor
        self.results: Optional[List[Any]] = None
        self._finished = False
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._pid_of: Dict[int, int] = {}
        self._exitcodes: Dict[int, int] = {}
        # ranks seen to end, in batches, earliest first, each with whether every rank was
        # watched when it was seen (else a rank not yet watched may have ended before it)
        self._ended: List[Tuple[List[int], bool]] = []
        self.processes = [RankProcess(self, r) for r in range(nprocs)]
        self._watcher = threading.Thread(target=self._watch, name=f"{job_id}-watch",
                                         daemon=True)
        self._watcher.start()
        atexit.register(self._at_exit)

    # ------------------------------------------------------------------ the ranks' processes

    def _read_pids(self) -> Dict[int, int]:
        """Ranks that registered since the last call, with their process ids."""
        new: Dict[int, int] = {}
        if len(self._pid_of) >= self.nprocs:
            return new
        for f in Path(self._workdir).glob("pid.*"):
            try:
                rank = int(f.name.split(".", 1)[1])
                if rank in self._pid_of:
                    continue
                pid = pickle.loads(f.read_bytes())
            except Exception:  # noqa: BLE001 - gone with the directory, or half-written
                continue
            with self._lock:
                if rank not in self._pid_of:
                    self._pid_of[rank] = new[rank] = pid
        return new

    def _watch(self) -> None:
        """Note the order in which ranks end, to name the one that took the job down."""
        use_fd = hasattr(os, "pidfd_open")
        fds: Dict[int, int] = {}  # pidfd -> rank
        polled: Dict[int, int] = {}  # rank -> pid, where there is no pidfd

        def register(ended: List[int]) -> None:
            """Watch the ranks registered since the last call; one already gone ends now."""
            for rank, pid in self._read_pids().items():
                if not _alive(pid):
                    ended.append(rank)
                    continue
                if use_fd:
                    try:
                        fds[os.pidfd_open(pid)] = rank
                        continue
                    except ProcessLookupError:
                        ended.append(rank)
                        continue
                    except OSError:
                        pass
                polled[rank] = pid

        try:
            while self._proc.poll() is None and not self._finished:
                ended: List[int] = []
                register(ended)
                if fds:
                    # wakes the moment a rank ends, before mpiexec kills the others
                    ready, _, _ = select.select(list(fds), [], [], 0.05)
                    for fd in ready:
                        ended.append(fds.pop(fd))
                        os.close(fd)
                else:
                    time.sleep(0.02)
                for rank, pid in list(polled.items()):
                    if not _alive(pid):
                        ended.append(rank)
                        del polled[rank]
                if ended:
                    # a rank registered since the last turn may be gone already: when, is not
                    # known, so it joins this batch (which then names nobody rather than the
                    # wrong rank), and a rank not registered at all makes the order unknown
                    register(ended)
                    with self._lock:
                        self._ended.append((sorted(ended), len(self._pid_of) >= self.nprocs))
        except Exception:  # noqa: BLE001 - the watch only improves error messages
            pass
        finally:
            for fd in fds:
                os.close(fd)

    def pids(self) -> List[Optional[int]]:
        """The ranks' process ids, by rank (waits until every rank has started or the job ended;
        ``None`` for a rank that never started)."""
        while (len(self._pid_of) < self.nprocs and not self._finished
               and self._proc.poll() is None):
            self._read_pids()
            time.sleep(0.01)
        self._read_pids()
        return [self._pid_of.get(r) for r in range(self.nprocs)]

    # ------------------------------------------------------------------ waiting and ending

    def join(self, timeout: Optional[float] = None, grace_period: Optional[float] = None) -> bool:
        """Wait for the job.

        Args:
            timeout: seconds to wait in this call (``None``: until the job ends or the hard
                timeout given to :func:`start_processes` passes).
            grace_period: accepted for torch's signature; a failing rank ends the others at once
                (``MPI_Abort``), so there is nothing to wait for.

        Returns:
            True when every rank has finished (``results`` is then set), False when ``timeout``
            passed first.

        Raises:
            ProcessRaisedException: a rank raised (raised again by later calls).
            ProcessExitedException: a rank exited with a non-zero code or was killed.
            DistributedTimeoutError: the hard timeout passed; the job was killed.
        """
        del grace_period
        if self._finished:
            if self._error is not None:
                raise self._error
            return True
        limit = timeout
        if self._deadline is not None:
            left = max(0.0, self._deadline - time.monotonic())
            limit = left if limit is None else min(limit, left)
        try:
            with _signals_raise():
                code = self._proc.wait(timeout=limit)
        except _Signalled as sig:
            self.kill()  # the ranks live in a session of their own: end them, remove files
            os.kill(os.getpid(), sig.signum)  # then die of the signal, as without us
            raise
        except subprocess.TimeoutExpired:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self.kill()
                self._error = DistributedTimeoutError(
                    f"spawn: the {self.nprocs} rank(s) did not finish within the timeout of "
                    f"{self._timeout} s; the job was killed. Raise timeout= or look for a rank "
                    "waiting in a collective the others never entered")
                raise self._error from None
            return False
        except BaseException:
            self.kill()  # Ctrl-C in the parent: the ranks, in their own session, must go too
            raise
        self._watcher.join(timeout=2.0)
        try:
            self._collect(code)
        except ProcessException as exc:
            self._error = exc
            raise
        finally:
            self._finish()
        return True

    def kill(self) -> None:
        """Kill the whole job (``mpiexec`` and every rank) and remove its files."""
        if self._proc.poll() is None:
            _kill_group(self._proc)
        else:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _kill_job(self.job_id)  # ranks live in sessions of their own
        self._finish()

    def _finish(self) -> None:
        self._finished = True
        shutil.rmtree(self._workdir, ignore_errors=True)
        atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        """At interpreter exit, as :mod:`multiprocessing` does with its children: a daemonic
        job is killed, another one waited for; either way its files go."""
        if self._finished:
            return
        if self._proc.poll() is None and not self.daemon:
            left = None if self._deadline is None else max(0.0,
                                                           self._deadline - time.monotonic())
            try:
                self._proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                pass
        if self._proc.poll() is None:
            # at once and quietly (SIGTERM would have mpiexec report every rank's end)
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            _kill_job(self.job_id, wait=0)
        self._finish()

    # ------------------------------------------------------------------ outcome

    def _records(self) -> Dict[str, Dict[int, Any]]:
        out: Dict[str, Dict[int, Any]] = {"result": {}, "exit": {}, "error": {}}
        for kind, by_rank in out.items():
            for f in Path(self._workdir).glob(f"{kind}.*"):
                try:
                    by_rank[int(f.name.split(".", 1)[1])] = pickle.loads(f.read_bytes())
                except Exception:  # noqa: BLE001 - a half-written record: the abort cut it short
                    continue
        return out

    def _culprit(self, explained: set) -> Optional[int]:
        """The rank that ended first without saying why, if the watch saw it end alone while
        it watched every rank (else None: better no name than a wrong one)."""
        with self._lock:
            batches = [(list(b), complete) for b, complete in self._ended]
        for batch, complete in batches:
            silent = [r for r in batch if r not in explained]
            if silent:
                return silent[0] if len(silent) == 1 and complete else None
        return None

    def _collect(self, code: int) -> None:
        recs = self._records()
        self._read_pids()
        for rank in recs["result"]:
            self._exitcodes[rank] = 0
        for rank, e in recs["exit"].items():
            self._exitcodes[rank] = e["code"]
        for rank in recs["error"]:
            self._exitcodes[rank] = 1
        n = self.nprocs
        if recs["error"]:
            errors = list(recs["error"].values())
            first = min(errors, key=lambda e: (e["time"], e["rank"]))
            also = sorted(e["rank"] for e in errors if e is not first)
            more = f" (rank(s) {also} raised too)" if also else ""
            pid = first.get("pid")
            raise ProcessRaisedException(
                f"rank {first['rank']} of {n} raised {first['type']}: {first['message']}{more}"
                f"\n\n-- traceback of rank {first['rank']} (pid {pid}):\n{first['traceback']}",
                first["rank"], pid, first["type"], first["traceback"])
        if recs["exit"]:
            first = min(recs["exit"].values(), key=lambda e: (e["time"], e["rank"]))
            raise ProcessExitedException(
                f"rank {first['rank']} of {n} exited with code {first['code']}",
                first["rank"], first.get("pid"), first["code"])
        if code != 0:
            explained = set(recs["result"])
            rank = self._culprit(explained)
            signal_name: Optional[str] = None
            exit_code = code
            if code < 0:
                signal_name = _signal_name(-code)  # mpiexec itself was killed
            elif self._flavor == MPICH and code in _DEATH_SIGNALS:
                # hydra exits with the signal number of a rank a signal killed
                signal_name, exit_code = _signal_name(code), -code
            who = (f"rank {rank} of {n}" if rank is not None and code > 0
                   else f"the MPI job of {n} rank(s)")
            how = (f"was killed by signal {signal_name}" if signal_name
                   else f"exited with code {code}")
            if rank is not None and code > 0:
                self._exitcodes[rank] = exit_code
            raise ProcessExitedException(
                f"spawn: {who} {how} without a Python exception (see the MPI launcher's "
                "message above)", rank if code > 0 else None,
                self._pid_of.get(rank) if rank is not None else None, exit_code, signal_name)
        self.results = [recs["result"].get(r) for r in range(n)]
        for r in range(n):
            self._exitcodes.setdefault(r, 0)


#: torch's deprecated name for the same object.
SpawnContext = ProcessContext

# exit codes of mpiexec (hydra) read as "a rank was killed by this signal": the signals that
# kill a process (crashes, the OOM killer, kill); low codes that programs exit with are not read
_DEATH_SIGNALS = frozenset(int(s) for s in (signal.SIGILL, signal.SIGABRT, signal.SIGBUS,
                                            signal.SIGFPE, signal.SIGKILL, signal.SIGSEGV,
                                            signal.SIGTERM))


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return True  # no /proc: kill(0) said it exists


class RankProcess:
    """One rank of a :class:`ProcessContext`, as a :class:`multiprocessing.Process` look-alike.

    ``mpiexec`` started the process, not this one, so only the parts that make sense for it are
    here: ``pid``, ``name``, ``daemon``, ``is_alive()``, ``exitcode``, ``join(timeout)``,
    ``terminate()``, ``kill()``. Ending one rank ends the job (MPI's launcher sees to that).
    """

    def __init__(self, ctx: ProcessContext, rank: int) -> None:
        self._ctx = ctx
        self.rank = rank
        self.name = f"rank-{rank}"
        self.daemon = ctx.daemon

    @property
    def pid(self) -> Optional[int]:
        """The process id (waits until the rank has started; ``None`` if it never did)."""
        if self.rank not in self._ctx._pid_of:
            self._ctx.pids()
        return self._ctx._pid_of.get(self.rank)

    def is_alive(self) -> bool:
        """True while the rank runs (or is still starting)."""
        if self._ctx._finished:
            return False
        self._ctx._read_pids()
        pid = self._ctx._pid_of.get(self.rank)
        if pid is None:
            return self._ctx._proc.poll() is None
        return _alive(pid)

    @property
    def exitcode(self) -> Optional[int]:
        """``None`` while the rank runs or before the job was joined; then 0 for a rank that
        returned, its code for ``sys.exit(code)``, 1 for an exception, ``-signum`` for a
        signal where one could be told, else the job's exit code."""
        if self.is_alive():
            return None
        if self.rank in self._ctx._exitcodes:
            return self._ctx._exitcodes[self.rank]
        return self._ctx._proc.returncode

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until the rank has ended, or ``timeout`` seconds passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.01)

    def terminate(self) -> None:
        """Send SIGTERM to the rank."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """Send SIGKILL to the rank."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        pid = self.pid
        if pid is not None and self.is_alive():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def __repr__(self) -> str:
        state = "alive" if self.is_alive() else f"exitcode={self.exitcode}"
        return f"<RankProcess {self.name} pid={self._ctx._pid_of.get(self.rank)} {state}>"


class _Signalled(BaseException):
    """SIGTERM or SIGHUP arrived while the parent waited for its spawned job."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While waiting for a spawned job, SIGTERM and SIGHUP raise :class:`_Signalled` (whose
    handler ends the ranks and removes their files, then re-raises the signal with its
    default action restored); SIGINT already raises KeyboardInterrupt. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Signalled(signum)

    # only where the signal would kill this process outright (a handler the program set, or
    # an ignored signal, keeps its meaning)
    sigs = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) == signal.SIG_DFL]
    previous = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# how fn is called on rank r of n: torch's fn(r, *args), or dist.spawn's fn(r, n, *args)
_INDEX, _RANK_AND_SIZE = "index", "rank_and_size"


def _launch(fn: Callable[..., Any], args: Sequence[Any], nprocs: int, daemon: bool,
            start_method: str, timeout: Optional[float], mpiexec: Optional[str],
            convention: str) -> ProcessContext:
    """Check the arguments, start ``mpiexec -n nprocs`` on the spawn bootstrap, return the
    context (the one implementation behind every ``spawn`` and :func:`start_processes`)."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"spawn: nprocs must be a positive integer, got {nprocs!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"spawn: args must be a tuple, got {type(args).__name__}; for one "
                        "argument write args=(value,)")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"spawn: timeout must be a positive number of seconds, got {timeout!r}")
    if not isinstance(daemon, bool):
        raise TypeError(f"spawn: daemon must be True or False, got {daemon!r}")
    import multiprocessing

    if start_method not in multiprocessing.get_all_start_methods():
        raise ValueError(f"spawn: start_method must be one of "
                         f"{multiprocessing.get_all_start_methods()}, got {start_method!r}")
    desc = _describe_callable(fn)
    try:
        payload_args = pickle.dumps(tuple(args), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(f"spawn: args cannot be pickled for the ranks: {exc}") from exc
    launcher = find_mpiexec(mpiexec)
    flavor = mpi_flavor(launcher)
    workdir = tempfile.mkdtemp(prefix="mpitensor-spawn-")
    try:
        desc.update(args=payload_args, workdir=workdir, nprocs=nprocs, sys_path=list(sys.path),
                    convention=convention)
        (Path(workdir) / "payload").write_bytes(pickle.dumps(desc))
        cmd = build_command([sys.executable, "-m", "mpitensor.run", "--_spawn",
                             str(Path(workdir) / "payload")], nprocs, mpiexec=launcher,
                            flavor=flavor)
        job_id = os.path.basename(workdir)
        start = time.monotonic()
        proc = subprocess.Popen(cmd.argv, env=_job_env({**cmd.env, _JOB_ID_VAR: job_id}),
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return ProcessContext(proc, workdir, nprocs, None if timeout is None else start + timeout,
                          timeout, job_id, daemon, flavor)


def start_processes(
    fn: Callable[..., Any],
    args: Tuple[Any, ...] = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    *,
    timeout: Optional[float] = None,
    mpiexec: Optional[str] = None,
) -> Optional[ProcessContext]:
    """Run ``fn(i, *args)`` for ``i`` in ``range(nprocs)``, each in a new MPI rank ``i``.

    torch's ``torch.multiprocessing.start_processes`` on MPI: ``mpiexec -n nprocs`` starts the
    processes with this Python, so they form one MPI job and ``dist.init_process_group()`` in
    ``fn`` needs no rendezvous. Each process imports ``fn`` by module and name (a top-level
    ``def`` of a module or of the main script, whose ``if __name__ == "__main__":`` block does
    not run again) and unpickles ``args``. This is the one implementation behind
    :func:`mpitensor.multiprocessing.spawn` and :func:`mpitensor.distributed.spawn`.

    Args:
        fn: a function importable by module and name, called as ``fn(i, *args)``.
        args: further arguments, pickled to every process.
        nprocs: number of processes (at least 1).
        join: wait for them (default; returns ``None``) or return the :class:`ProcessContext`.
        daemon: kill the job when this process exits; otherwise it is waited for at exit.
        start_method: ``"spawn"``, ``"fork"`` or ``"forkserver"``, all accepted: every process
            is a fresh interpreter started by ``mpiexec``, as with ``"spawn"``.
        timeout: hard limit in seconds for the whole job (an mpitensor extension); past it
            every process is killed and ``DistributedTimeoutError`` raised.
        mpiexec: the launcher to use (default :func:`find_mpiexec`).

    Returns:
        ``None`` with ``join=True``; the :class:`ProcessContext` with ``join=False``.

    Raises:
        TypeError: ``fn`` is not importable by name (a lambda, a nested function), or ``args``
            is not a tuple or cannot be pickled.
        ValueError: ``nprocs`` is not a positive integer, or an unknown ``start_method``.
        ProcessRaisedException: a process raised; the message holds its traceback.
        ProcessExitedException: a process exited with a non-zero code or was killed.
        DistributedTimeoutError: ``timeout`` passed.

    Example:
        >>> def work(i, scale):  # at the top level of a module
        ...     print(i * scale)
        >>> start_processes(work, args=(10,), nprocs=2)  # doctest: +SKIP
        0
        10
    """
    ctx = _launch(fn, args, nprocs, daemon, start_method, timeout, mpiexec, _INDEX)
    if not join:
        return ctx
    ctx.join()
    return None


def spawn(
    fn: Callable[..., Any],
    nprocs: int = 1,
    args: Tuple[Any, ...] = (),
    join: bool = True,
    timeout: Optional[float] = None,
    *,
    mpiexec: Optional[str] = None,
) -> Any:
    """Run ``fn(rank, world_size, *args)`` on ``nprocs`` new MPI ranks; return their results.

    ``mpitensor.distributed.spawn``, the form mpitensor had before
    :mod:`mpitensor.multiprocessing`: a thin wrapper over :func:`start_processes` (the same
    launch, failures and timeout) that keeps its own calling convention: ``fn`` also receives
    the world size, the positional order is ``fn, nprocs, args``, and the ranks' return values
    come back. Code ported from torch should use :func:`mpitensor.multiprocessing.spawn`, which
    calls ``fn(rank, *args)`` as torch does.

    Args:
        fn: a function importable by module and name, ``fn(rank, world_size, *args)``.
        nprocs: number of ranks (at least 1).
        args: further arguments, pickled to every rank.
        join: wait for the ranks (default); ``False`` returns the :class:`ProcessContext`.
        timeout: hard limit in seconds for the whole job; past it every rank is killed and
            :class:`~mpitensor.errors.DistributedTimeoutError` raised.
        mpiexec: the launcher to use (default :func:`find_mpiexec`).

    Returns:
        With ``join=True``, the list of ``fn``'s return values by rank. With ``join=False``, a
        :class:`ProcessContext` (whose ``results`` holds them after ``join()``).

    Raises:
        TypeError: as :func:`start_processes`; also a tuple given as ``nprocs`` (torch's
            positional order).
        ValueError: ``nprocs`` is not a positive integer.
        ProcessRaisedException: a rank raised; the message names the rank and holds its
            traceback (every rank was ended by ``MPI_Abort``).
        ProcessExitedException: a rank exited with a non-zero code or was killed.
        DistributedTimeoutError: ``timeout`` passed.

    Example:
        >>> def work(rank, world_size, scale):  # at the top level of a module
        ...     dist.init_process_group("mpi")
        ...     t = torch.tensor([float(rank)]); dist.all_reduce(t)
        ...     return t.item() * scale
        >>> dist.spawn(work, 4, args=(10,))  # doctest: +SKIP
        [60.0, 60.0, 60.0, 60.0]
    """
    if isinstance(nprocs, (tuple, list)):
        raise TypeError("spawn: nprocs must be an int, got a tuple; the signature is "
                        "spawn(fn, nprocs, args=()) (torch's positional order is fn, args, "
                        "nprocs: pass nprocs= and args= by keyword, or use "
                        "mpitensor.multiprocessing.spawn)")
    ctx = _launch(fn, args, nprocs, False, "spawn", timeout, mpiexec, _RANK_AND_SIZE)
    if not join:
        return ctx
    ctx.join()
    return ctx.results


def _write_record(workdir: str, name: str, record: Any) -> None:
    tmp = Path(workdir) / f".{name}.tmp"
    tmp.write_bytes(pickle.dumps(record))
    os.replace(tmp, Path(workdir) / name)


def _load_main(desc: Dict[str, Any]) -> types.ModuleType:
    """Import the module that defines fn; a main script is loaded as ``__mp_main__``."""
    if desc["main_path"] is None:
        return importlib.import_module(desc["module"])
    path = desc["main_path"]
    mod = types.ModuleType("__mp_main__")
    mod.__file__ = path
    # pickles made in the parent say `__main__.Name`: both names must resolve to this module
    sys.modules["__mp_main__"] = sys.modules["__main__"] = mod
    code = compile(Path(path).read_bytes(), path, "exec")
    mod.__dict__["__builtins__"] = __builtins__
    exec(code, mod.__dict__)
    return mod


def _write_result(workdir: str, rank: int, result: Any, strict: bool) -> None:
    """Store fn's return value; torch ignores it, so where it cannot be pickled the torch-style
    spawn stores None instead of failing the rank."""
    try:
        _write_record(workdir, f"result.{rank}", result)
    except Exception:
        if strict:
            raise
        _write_record(workdir, f"result.{rank}", None)


def _spawn_worker(payload_path: str) -> int:
    """The rank side of :func:`start_processes` (``python -m mpitensor.run --_spawn PAYLOAD``)."""
    desc = pickle.loads(Path(payload_path).read_bytes())
    workdir = desc["workdir"]
    strict = desc.get("convention") == _RANK_AND_SIZE
    for entry in reversed(desc["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    rank: Optional[int] = _world_rank()
    if rank is not None:
        _write_record(workdir, f"pid.{rank}", os.getpid())
    _install_thread_abort()
    try:
        from mpi4py import MPI

        known = rank is not None
        rank = MPI.COMM_WORLD.Get_rank()
        size = MPI.COMM_WORLD.Get_size()
        if not known:
            _write_record(workdir, f"pid.{rank}", os.getpid())
        mod = _load_main(desc)
        fn: Any = mod
        for part in desc["qualname"].split("."):
            fn = getattr(fn, part)
        args = pickle.loads(desc["args"])
        result = fn(rank, size, *args) if strict else fn(rank, *args)
        _write_result(workdir, rank, result, strict)
    except SystemExit as exc:
        code = _exit_code(exc.code)
        if code != 0:
            _write_record(workdir, f"exit.{rank}", {"rank": rank, "code": code,
                                                     "pid": os.getpid(), "time": time.time()})
            sys.stderr.write(f"[rank {rank}] exited with code {code}; ending the job\n")
            _abort(code)
        _write_result(workdir, rank, None, strict)  # torch: sys.exit(0) ends a process cleanly
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        text = _report_exception(exc, rank)
        try:
            _write_record(workdir, f"error.{rank}", {
                "rank": rank, "type": type(exc).__name__, "message": str(exc),
                "traceback": text, "pid": os.getpid(), "time": time.time()})
        finally:
            _abort(1)
    return 0
