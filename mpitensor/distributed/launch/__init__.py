"""Launching MPI jobs from Python, and what a rank does to join one.

One module a step, each named for it:

* :mod:`.mpiexec` -- finding the installed MPI's ``mpiexec``, telling MPICH from Open MPI, each
  launcher's options (:func:`find_mpiexec`, :func:`mpi_flavor`, :func:`launcher_option_values`);
* :mod:`.hostfile` -- hostfiles in either MPI's syntax (:func:`parse_hostfile`);
* :mod:`.job` -- one ``mpiexec`` job: its command line with the flags each MPI spells
  differently (:func:`build_command`), its environment, finding and ending its processes;
* :mod:`.rank_vars` -- the launchers' per-rank variables and torchrun's (``RANK``,
  ``LOCAL_RANK``, ...): :func:`launcher_rank`, :func:`layout_from_env`, :func:`rank_env`;
* :mod:`.bootstrap` -- the rank side: :func:`run_target` runs a rank's script and, on an
  unhandled exception, prints its ``[rank N]`` traceback and aborts the whole job;
* :mod:`.processes` -- the parent side of spawning: :func:`start_processes` and :func:`spawn`
  (torch's ``multiprocessing`` spawning on MPI ranks, behind
  :func:`mpitensor.multiprocessing.spawn` and ``mpitensor.distributed.spawn``);
* :mod:`.rendezvous`, :mod:`.pmi`, :mod:`.auth`, :mod:`.subjob` -- processes that no launcher
  started meet through a Store, and rank 0's PMI-1 helper lets them call ``MPI_Init`` as one
  job; connections prove a shared secret; a group over part of a job;
* :mod:`.hostpool` -- the hosts an elastic ``mpitensor-run`` job may use, probed before each
  start.

Used by the ``mpitensor-run`` command (:mod:`mpitensor.run`), :mod:`mpitensor.multiprocessing`
and ``init_process_group``. Nothing here imports ``mpi4py`` at module level: the launching
process never initializes MPI.
"""

from __future__ import annotations

from .bootstrap import exit_grace as exit_grace  # also importable from here, beside __all__
from .bootstrap import run_target
from .hostfile import HostEntry as HostEntry
from .hostfile import HostfileError, parse_hostfile
from .hostfile import inline_comment_lines as inline_comment_lines
from .job import build_command
from .mpiexec import find_mpiexec, launcher_option_values, mpi_flavor
from .processes import (
    ProcessContext,
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
    RankProcess,
    SpawnContext,
    spawn,
    start_processes,
)
from .rank_vars import LAUNCHER_RANK_VARS as LAUNCHER_RANK_VARS
from .rank_vars import (
    RANK_ENV_VARS,
    RUN_ONLY_ENV_VARS,
    RankLayout,
    export_rank_env,
    launcher_rank,
    layout_from_env,
    layout_from_mpi,
    rank_env,
)

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

