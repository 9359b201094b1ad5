"""The ``mpiexec`` of the installed MPI: where it is, which MPI it belongs to, what it accepts.

:func:`find_mpiexec` looks next to ``sys.executable`` first (the ``mpich`` wheel's), then on
``PATH``; :func:`mpi_flavor` tells MPICH's hydra (and the MPIs built on it) from Open MPI;
:func:`launcher_option_values` knows each launcher's options, which ``mpitensor-run`` passes
through unchanged. Nothing here starts a process other than ``mpiexec --version``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

__all__ = ["MPICH", "OPENMPI", "find_mpiexec", "mpi_flavor", "launcher_option_values"]

MPICH = "mpich"
OPENMPI = "openmpi"


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
