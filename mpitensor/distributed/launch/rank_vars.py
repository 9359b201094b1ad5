"""What a rank is told about itself: the MPI launchers' variables and torchrun's.

Every MPI launcher announces a process's rank in variables of its own (``PMI_RANK``,
``OMPI_COMM_WORLD_RANK``, ...); torch programs read torchrun's (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ...). :func:`launcher_rank` and :func:`layout_from_env` read the former without
starting MPI, :func:`layout_from_mpi` asks MPI where they fall short, and :func:`rank_env` /
:func:`export_rank_env` turn the answer into the latter.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["LAUNCHER_RANK_VARS", "launcher_rank", "RANK_ENV_VARS", "RUN_ONLY_ENV_VARS",
           "RankLayout", "layout_from_env", "layout_from_mpi", "rank_env", "export_rank_env"]

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
