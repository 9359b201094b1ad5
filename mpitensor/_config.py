"""Environment switches, read in one place.

``MPITENSOR_DEBUG``   1/true/yes/on: check, before every collective, that all ranks passed the same
                      op, dtype and shape (one extra small all-gather per call).
``MPITENSOR_TIMEOUT`` default timeout in seconds for process groups (``init_process_group``):
                      a blocking operation or ``wait()`` waiting longer raises
                      ``DistributedTimeoutError`` (``inf`` disables the bound).
``MPITENSOR_STALL_WARN`` seconds a blocking operation may wait before each stuck rank logs a
                      stall report (default: the smaller of 60 s and half the timeout).
``MPITENSOR_ABORT_ON_EXCEPTION`` 1/0 (default 1): whether ``init_process_group`` under
                      ``mpiexec`` (world size > 1) installs the abort-on-unhandled-exception hook.
``MPITENSOR_NUM_THREADS`` BLAS/OpenMP threads per rank: ``auto`` (default: a fair share of the
                      node's cores, applied by ``init_process_group``), a positive integer, or
                      ``off``; read at ``init_process_group`` by ``mpitensor._threads``.
``MPITENSOR_LOG``     logging level name for the ``mpitensor`` logger (default WARNING); when set,
                      the logger gets a handler of its own that prints each line on stderr as
                      ``[rank N] mpitensor.module LEVEL: message`` (and no longer passes it on
                      to the root logger's handlers).
``MPITENSOR_CHECK_BYTES`` collectives whose buffer has at least this many bytes (default 65536)
                      check, beside the data, that every rank made the same call (one tiny
                      reduction; see ``distributed/_fingerprint.py``); ``0`` checks every call,
                      ``off`` none. Set it alike on every rank (``mpiexec`` passes it on).
``MPITENSOR_NODE_REDUCE`` ``auto`` (default), ``on`` or ``off``: whether DDP's gradient buckets
                      meet in shared memory where the ranks outnumber the node's cores (see
                      ``distributed/_node_reduce.py``); read when a DDP is made.
``MPITENSOR_RENDEZVOUS`` ``auto`` (default), ``pmi`` or ``connect``: how processes that no MPI
                      launcher started are joined into one MPI job in ``init_process_group``
                      (see ``distributed/_rendezvous.py``); read there, at that call.
``MPITENSOR_JOB_ID``   the identity of the job this process belongs to (any text; set on every
                      process of a job by ``mpitensor-run`` and ``spawn`` where it is not set
                      already): a rendezvous refuses a process whose job differs from the
                      job of the first process there, so two jobs given one port do not merge
                      (torchrun's ``TORCHELASTIC_RUN_ID`` comes first, unless it is ``none``);
                      read at that call by :func:`job_id`.
``MPITENSOR_LOAD_MAX_BYTES`` the most memory ``mpitensor.load`` may allocate for one file's
                      tensors (a byte count, or ``off``); default: the memory available at each
                      call. ``load(..., max_bytes=N)`` overrides it (see docs/checkpoints.md).
``MPITENSOR_SECRET``  a shared secret (any text; unset or empty: none): every TCPStore
                      connection then proves it in both directions (HMAC challenge and
                      response, see ``distributed/_auth.py``; the secret never goes on the
                      wire). ``mpitensor-run`` makes a random one for the processes it starts
                      where none is set. Read at each connection (``env_secret``).
``MPITENSOR_STORE_MAX_BYTES`` the most bytes (keys and values together) a TCPStore master holds
                      (default 2 GiB, ``off``: no bound); a write past it gets ValueError.
"""

from __future__ import annotations

import os
from typing import Optional

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def env_flag(name: str, default: bool = False) -> bool:
    """Read a boolean environment switch; reject values that are neither true nor false."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no or on/off")


def env_float(name: str, default: float) -> float:
    """Read a positive number of seconds from the environment."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{name}={raw!r} must be a positive number of seconds")
    return value


DEBUG: bool = env_flag("MPITENSOR_DEBUG")
DEFAULT_TIMEOUT_S: float = env_float("MPITENSOR_TIMEOUT", 1800.0)
STALL_WARN_S: Optional[float] = (env_float("MPITENSOR_STALL_WARN", 60.0)
                                 if os.environ.get("MPITENSOR_STALL_WARN", "").strip() else None)
ABORT_ON_EXCEPTION: bool = env_flag("MPITENSOR_ABORT_ON_EXCEPTION", True)
#: the compiled parts where they were built (mpitensor/_cpu_kernels.c, the CPU loops;
#: mpitensor/distributed/_slots.c, the agreement slots); off: their pure-Python paths
NATIVE: bool = env_flag("MPITENSOR_NATIVE", True)
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def env_choice(name: str, choices: "tuple[str, ...]", default: str) -> str:
    """Read an environment switch that takes one of ``choices`` (case-insensitive)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().upper()
    if value not in choices:
        raise ValueError(f"{name}={raw!r} is not one of {', '.join(choices)} (case does not "
                         "matter)")
    return value


LOG_LEVEL: str = env_choice("MPITENSOR_LOG", _LEVELS, "WARNING")
LOG_SET: bool = bool(os.environ.get("MPITENSOR_LOG", "").strip())


def job_id() -> str:
    """``MPITENSOR_JOB_ID`` as set now, stripped (``""`` where unset): read at each rendezvous,
    since launchers and tests set it per job in the processes they start."""
    return os.environ.get("MPITENSOR_JOB_ID", "").strip()


def env_bytes(name: str, default: int) -> int:
    """Read a byte count (a non-negative integer, or ``off`` for "never") from the environment."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in ("off", "never", "none"):
        return OFF_BYTES
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a byte count; use a non-negative integer "
                         "(0: every call) or off") from None
    if n < 0:
        raise ValueError(f"{name}={raw!r} must be a non-negative integer (0: every call) or off")
    return n


OFF_BYTES = 1 << 62  # larger than any buffer
CHECK_BYTES: int = env_bytes("MPITENSOR_CHECK_BYTES", 64 * 1024)
STORE_MAX_BYTES: int = env_bytes("MPITENSOR_STORE_MAX_BYTES", 2 << 30)


def env_secret() -> Optional[bytes]:
    """``MPITENSOR_SECRET`` as UTF-8 bytes, or None where it is unset or empty (read now)."""
    raw = os.environ.get("MPITENSOR_SECRET")
    if not raw:
        return None
    return raw.encode("utf-8", "surrogateescape")


def env_limit(name: str) -> Optional[int]:
    """Read a memory bound: a byte count, ``off`` (no bound: OFF_BYTES), or unset (None)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip().lower()
    if value in ("off", "never", "none"):
        return OFF_BYTES
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{name}={raw!r} is not a byte count; use a non-negative integer "
                         "(e.g. 8000000000) or off")
    return n


LOAD_MAX_BYTES: Optional[int] = env_limit("MPITENSOR_LOAD_MAX_BYTES")
