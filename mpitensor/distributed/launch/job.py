"""One ``mpiexec`` job: its command line, the environment its processes get, and ending it.

:func:`build_command` spells a launch for MPICH's hydra or for Open MPI (the flags they name
differently are translated); :func:`_job_env` keeps an outer job's variables out of a job
started from inside it; every process of a job carries ``MPITENSOR_JOB_ID``, by which
:func:`_job_pids` finds them and :func:`_kill_job` ends them (hydra starts its ranks in
sessions of their own, out of reach of a process group).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..._base import config as _config
from .hostfile import (
    HostEntry,
    HostfileError,
    _hosts_option,
    inline_comment_lines,
    parse_hostfile,
)
from .mpiexec import MPICH, OPENMPI, find_mpiexec, mpi_flavor
from .rank_vars import _PER_RANK_VARS, launcher_rank

__all__ = ["Command", "build_command"]

# Variables through which an MPI job tells its processes who they are; a job started from inside
# another (a test under mpiexec, a spawn from a rank) must not inherit the outer job's.
_JOB_ENV_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                     "PRTE_", "ORTE_")

# Set on every process of a job started by spawn (a unique value per job), to find them all.
_JOB_ID_VAR = _config.ENV_JOB_ID


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
    entries: List[HostEntry] = []
    argv: List[str] = [launcher]
    if hostfile is not None:
        entries, hosts_args = _hostfile_args(hostfile, kind)
        argv += hosts_args
    if nprocs is not None:
        argv += ["-n", str(nprocs)]
    extra_env: Dict[str, str] = {}
    if kind == MPICH:
        argv += _hydra_args(ppn, iface, env, tag_output)
    else:
        argv += _openmpi_args(nprocs, entries, ppn, iface, env, tag_output, extra_env)
    return Command(argv + list(extra) + list(rank_argv), extra_env)


def _hostfile_args(hostfile: str, kind: str) -> Tuple[List[HostEntry], List[str]]:
    """The hostfile's hosts, and how ``kind``'s launcher is told them: the file itself where
    it reads the file's syntax, else the hosts inline."""
    entries, syntax = parse_hostfile(hostfile)
    # hydra cannot read a comment after a host: such a file's hosts go on the command line
    text = Path(hostfile).read_text()  # parse_hostfile has checked it is readable
    commented = inline_comment_lines(hostfile, text) if kind == MPICH else []
    if commented and "ifhn=" in text:
        raise HostfileError(
            f"hostfile {hostfile} lines {commented}: MPICH's hydra rejects a comment after a "
            "host, and this file's ifhn= settings cannot be passed another way; move the "
            "comments to lines of their own")
    if syntax in ("plain", kind) and not commented:
        return entries, ["-f", hostfile] if kind == MPICH else ["--hostfile", hostfile]
    return entries, ["-hosts" if kind == MPICH else "--host", _hosts_option(entries)]


def _hydra_args(ppn: Optional[int], iface: Optional[str], env: Sequence[Tuple[str, str]],
                tag_output: bool) -> List[str]:
    """MPICH's hydra spelling of ranks per node, interface, environment and output tags."""
    argv: List[str] = []
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
    return argv


def _openmpi_args(nprocs: Optional[int], entries: List[HostEntry], ppn: Optional[int],
                  iface: Optional[str], env: Sequence[Tuple[str, str]], tag_output: bool,
                  extra_env: Dict[str, str]) -> List[str]:
    """Open MPI's spelling of the same, plus the permissions it asks for: running as root
    (with its two variables, added to ``extra_env``) and more ranks than slots."""
    argv: List[str] = []
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
    return argv


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

