"""Thread budget: how many BLAS and OpenMP threads each process may run.

NumPy's BLAS (OpenBLAS, MKL, BLIS) and any OpenMP runtime loaded beside it start one thread per
core they can see. That suits one process per machine and ruins several: four ranks on two cores
run eight busy threads, and a LeNet epoch measured here ran 18x slower on four ranks than on one
(issue 9). So :func:`mpitensor.distributed.init_process_group` gives each rank its *fair share*
of the cores it may run on and limits every loaded pool to it with ``threadpoolctl``.

The fair share is computed from every node-local rank's CPU affinity: each core this process may
use counts ``1/k`` when ``k`` local ranks may use it. Unbound ranks (MPICH's and Open MPI's
default here) share all cores, so the share is ``cores // local_ranks``; ranks bound to disjoint
core sets (``--bind-to core``, SLURM's ``--cpu-bind``) each own their set, and get all of it
instead of ``len(set) // local_ranks``. A cgroup CPU quota (``cpu.max``, a container's
``--cpus``) caps the cores the node has. Never fewer than one thread.

Who wins, most specific first:

1. an explicit :func:`set_num_threads` call (before or after ``init_process_group``);
2. ``MPITENSOR_NUM_THREADS``: a positive integer (that many threads per rank) or ``off``
   (leave every pool as the libraries set it);
3. the user's own ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``,
   ``BLIS_NUM_THREADS``, ``GOTO_NUM_THREADS``: a pool whose library reads one of them that is
   set is left alone (OpenMP reads ``OMP_NUM_THREADS``; OpenBLAS its own, then ``GOTO_``, then
   ``OMP_``; MKL and BLIS theirs, then ``OMP_``);
4. the fair share.

The choice is logged once per process at DEBUG level on the ``mpitensor`` logger.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any, Iterable, Mapping, Optional, Sequence

from . import config as _config

logger = logging.getLogger("mpitensor")

__all__ = ["set_num_threads", "get_num_threads"]

# which environment variables each kind of pool reads at load time (threadpoolctl's
# ``internal_api`` names); a pool governed by a variable the user set keeps its setting
USER_VARS: Mapping[str, tuple] = {
    "openmp": ("OMP_NUM_THREADS",),
    "openblas": ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"),
    "mkl": ("MKL_NUM_THREADS", "OMP_NUM_THREADS"),
    "blis": ("BLIS_NUM_THREADS", "OMP_NUM_THREADS"),
    "flexiblas": ("FLEXIBLAS_NUM_THREADS", "OMP_NUM_THREADS"),
}
ENV = _config.ENV_NUM_THREADS


class _Budget:
    """What this process decided (the module's only state; guarded by ``lock``)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.explicit: Optional[int] = None  # set_num_threads was called with this
        self.applied: Optional[int] = None  # what init_process_group applied, if anything
        self.logged = False


_budget = _Budget()


# ---------------------------------------------------------------------------- arithmetic
def affinity() -> frozenset:
    """The CPUs this process may run on (all of ``os.cpu_count()`` where affinity is unknown)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def cgroup_cpu_limit(path: str = "/sys/fs/cgroup/cpu.max") -> Optional[float]:
    """CPUs allowed by a cgroup v2 quota (``cpu.max`` = ``quota period``), None where unlimited."""
    try:
        with open(path, encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota == "max":
            return None
        q, p = float(quota), float(period)
        return q / p if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


def fair_share(mine: Iterable[int], everyone: Sequence[Iterable[int]],
               cpu_limit: Optional[float] = None) -> int:
    """Threads for a process that may run on ``mine``, sharing the node with ``everyone``.

    Args:
        mine: the CPUs this process may run on.
        everyone: every node-local process's CPUs, this one's included.
        cpu_limit: a quota on the CPUs of the whole node (cgroup), or None.

    Returns:
        The sum over ``mine`` of 1/(processes that may use that CPU), rounded down (with a
        tolerance for float sums), scaled down by the quota if it is tighter, at least 1.

    Example:
        >>> fair_share({0, 1}, [{0, 1}] * 4)     # 4 unbound ranks on 2 cores
        1
        >>> fair_share({0, 1}, [{0, 1}, {2, 3}])  # 2 ranks bound to 2 cores each
        2
    """
    mine = set(mine)
    sets = [set(s) for s in everyone]
    users = {c: sum(1 for s in sets if c in s) for c in mine}
    share = sum(1.0 / max(1, k) for k in users.values())
    if cpu_limit is not None and sets:
        share = min(share, cpu_limit / len(sets))
    return max(1, int(math.floor(share + 1e-9)))


def user_vars(environ: Mapping[str, str], internal_api: str) -> list:
    """The variables the user set that govern a pool of this kind (empty: ours to set)."""
    names = USER_VARS.get(internal_api, ("OMP_NUM_THREADS",))
    return [n for n in names if environ.get(n, "").strip() != ""]


def parse_env(environ: Mapping[str, str]) -> "Optional[int | str]":
    """``MPITENSOR_NUM_THREADS`` in ``environ``: None (unset/auto), ``"off"``, or a positive
    integer (the parser is :func:`mpitensor._base.config.num_threads`)."""
    return _config.num_threads(environ)


# ---------------------------------------------------------------------------- the pools
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _set_pools(n: int, environ: Optional[Mapping[str, str]]) -> list:
    """Limit every loaded pool to ``n`` threads; with ``environ``, skip user-governed ones.

    Returns ``(internal_api, before, after or None, reason)`` per pool, for the log line.
    """
    done = []
    for lib in _controller().lib_controllers:
        api = lib.internal_api
        before = lib.num_threads
        owned = user_vars(environ, api) if environ is not None else []
        if owned:
            done.append((api, before, None, "user's " + "/".join(owned)))
            continue
        lib.set_num_threads(n)
        done.append((api, before, lib.num_threads, ""))
    return done


def apply_node_budget(mine: frozenset, everyone: Sequence[frozenset], rank: int,
                      environ: Mapping[str, str] = os.environ) -> Optional[int]:
    """Limit the BLAS/OpenMP pools to this rank's fair share (see the module docstring).

    Called by ``init_process_group`` with every node-local rank's affinity. Returns the limit
    applied, or None when an explicit call or ``MPITENSOR_NUM_THREADS=off`` leaves the pools.
    """
    setting = parse_env(environ)
    with _budget.lock:
        if _budget.explicit is not None or setting == "off":
            why = (f"set_num_threads({_budget.explicit}) was called"
                   if _budget.explicit is not None else f"{ENV}=off")
            _log_once(rank, f"thread pools left as they are: {why}")
            return None
        if isinstance(setting, int):  # above the user's OMP_NUM_THREADS & co: every pool
            n, how, governed = setting, f"{ENV}={setting}", None
        else:
            n = fair_share(mine, everyone, cgroup_cpu_limit())
            how = (f"fair share of {len(mine)} usable core(s) among {len(everyone)} rank(s) "
                   "on this node")
            governed = environ
        pools = _set_pools(n, governed)
        _budget.applied = n
    parts = [f"{api} {b}->{a}" if a is not None else f"{api} {b} (kept: {why})"
             for api, b, a, why in pools]
    _log_once(rank, f"BLAS/OpenMP threads per rank: {n} ({how}); pools: "
              f"{', '.join(parts) or 'none loaded'}; {ENV}=off or OMP_NUM_THREADS etc. "
              "override it")
    return n


def _log_once(rank: int, text: str) -> None:
    if not _budget.logged:
        _budget.logged = True
        logger.debug("rank %d: %s", rank, text)


# ---------------------------------------------------------------------------- public API
def set_num_threads(n: int) -> None:
    """Set the number of threads of NumPy's BLAS and of every loaded OpenMP pool.

    As ``torch.set_num_threads``: it wins over the automatic per-rank budget of
    ``init_process_group`` and over the environment variables, whether called before or after.

    Args:
        n: threads, at least 1.

    Raises:
        TypeError: ``n`` is not an integer.
        ValueError: ``n`` < 1.

    Example:
        >>> import mpitensor as torch
        >>> torch.set_num_threads(1)
        >>> torch.get_num_threads()
        1
    """
    if isinstance(n, bool) or not isinstance(n, int) and not hasattr(n, "__index__"):
        raise TypeError(f"set_num_threads: n must be an integer, got {n!r}")
    n = int(n.__index__())
    if n < 1:
        raise ValueError(f"set_num_threads: n must be at least 1, got {n}")
    with _budget.lock:
        _budget.explicit = n
        _set_pools(n, None)


def get_num_threads() -> int:
    """The number of threads NumPy's BLAS uses (the largest BLAS pool; OpenMP's if no BLAS).

    Example:
        >>> import mpitensor as torch
        >>> torch.get_num_threads() >= 1
        True
    """
    libs = _controller().lib_controllers
    blas = [lib.num_threads for lib in libs if lib.user_api == "blas"]
    other = [lib.num_threads for lib in libs if lib.user_api != "blas"]
    counts = blas or other
    return max(counts) if counts else 1
