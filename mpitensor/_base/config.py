"""Environment switches: every ``MPITENSOR_*`` variable the package reads, declared here.

:data:`SWITCHES` holds one :class:`Switch` per variable (its name, how its text is parsed, its
default, when it is read, one line of meaning), read from one table (``_DECLARED``, an entry a
switch); docs/architecture.md's "Switches" table is
:func:`markdown_table`'s output, and ``tests/test_config_switches.py`` checks that no other
module reads an ``MPITENSOR_*`` variable from the environment, that every name used in the
package is declared here, and that the table matches. Switches read once are this module's
constants (``DEBUG``, ``DEFAULT_TIMEOUT_S``, ...), read at import: a malformed value stops
``import mpitensor`` with one line naming the variable and the values it takes. Switches read
at each use have a function here (:func:`job_id`, :func:`env_secret`, :func:`num_threads`,
...). Every parser rejects a malformed value with ``ValueError`` (``MPITENSOR_EXIT_GRACE``,
read while ranks exit, is reported on stderr instead, by its caller).
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, NamedTuple, Optional, Union

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}
OFF_BYTES = 1 << 62  # larger than any buffer


class Switch(NamedTuple):
    """One environment switch: what the docs' table and the tests know of it."""

    name: str
    kind: str     # how its text is parsed: bool, seconds, bytes, limit, choice, threads, text...
    default: str  # as the docs show it
    read: str     # "import" (once) or when it is read at each use
    doc: str      # one line of meaning


# One switch an entry: its name | how its text is parsed | its default | when it is read | its
# meaning. An indented line continues the entry above it.
_DECLARED = """\
MPITENSOR_DEBUG | bool | 0 | import |
    cross-rank argument checks before every collective, send/recv dtype and size checks, and
    fully_shard refusing parameter values that differ across ranks
MPITENSOR_TIMEOUT | seconds | 1800 | import |
    default timeout of process groups: a blocking operation or `wait()` waiting longer raises
    `DistributedTimeoutError` (`inf`: no bound)
MPITENSOR_STALL_WARN | seconds | min(60, timeout / 2) | import |
    seconds a blocking operation may wait before each stuck rank logs a stall report
MPITENSOR_ABORT_ON_EXCEPTION | bool | 1 | import |
    whether `init_process_group` under `mpiexec` (world size > 1) installs the
    abort-on-unhandled-exception hook
MPITENSOR_NATIVE | bool | 1 | import |
    the compiled parts where they were built (`_cpu_kernels.c`, `distributed/health/_slots.c`);
    `0`: their pure-Python paths
MPITENSOR_LOG | choice: DEBUG, INFO, WARNING, ERROR, CRITICAL | WARNING | import |
    level of the `mpitensor` logger (any case); when set, its lines go to stderr as `[rank N]
    mpitensor.module LEVEL: message` through a handler of its own
MPITENSOR_CHECK_BYTES | bytes | 65536 | import |
    collectives whose buffer has at least this many bytes check, beside the data, that every rank
    made the same call (`0`: every call, `off`: none; set alike on every rank)
MPITENSOR_STORE_MAX_BYTES | bytes | 2147483648 | import |
    the most bytes (keys and values) a TCPStore master holds; a write past it gets `ValueError`
    (`off`: no bound)
MPITENSOR_LOAD_MAX_BYTES | limit | the memory available | import |
    the most memory `mpitensor.load` may allocate for one file's tensors (bytes, or `off`);
    `load(..., max_bytes=N)` overrides it
MPITENSOR_CONV_BAND_BYTES | bytes (at least 1) | 1048576 | import (mpitensor.nn) |
    im2col matrices larger than this are built band by band (`off`: never); a size near the
    per-core L2 cache is best
MPITENSOR_NUM_THREADS | threads: auto, N or off | auto | each `init_process_group` |
    BLAS/OpenMP threads per rank: `auto` a fair share of the node's cores, `N` that many, `off`
    leave the pools alone
MPITENSOR_NODE_REDUCE | choice: auto, on, off | auto | each DDP made |
    DDP's gradient buckets meet in shared memory where the ranks outnumber the node's cores (`on`:
    on one node always, `off`: never)
MPITENSOR_SHM_COLLECTIVES | choice: auto, on, off | auto | each group made |
    collectives of NumPy arrays on a group whose ranks share one node go through one shared segment
    where the group's measured cost model says it pays (`on`: whenever possible, `off`: always MPI)
MPITENSOR_HIERARCHICAL | choice: auto, on, off | auto | each group's first all_reduce,
    all_gather_into_tensor or reduce_scatter_tensor |
    all_reduce, all_gather_into_tensor and reduce_scatter_tensor on a group that spans nodes:
    within each node and across nodes on 1/ranks-per-node of the data, where a cost model measured
    then says it pays (`on`: always there, `off`: flat MPI; set alike on every rank)
MPITENSOR_RENDEZVOUS | choice: auto, pmi, connect | auto | each `init_process_group` |
    how processes that no MPI launcher started are joined into one MPI job
MPITENSOR_JOB_ID | text | unset (`mpitensor-run` makes one) | each rendezvous |
    the job a process belongs to: a rendezvous refuses processes of another job (torchrun's
    `TORCHELASTIC_RUN_ID` comes first unless it is `none`)
MPITENSOR_SECRET | text | unset (`mpitensor-run` makes one) | each connection |
    a shared secret every store and PMI-helper connection proves in both directions (HMAC challenge
    and response; never sent); empty: none
MPITENSOR_CUDA_AWARE | auto or bool | auto | each detection |
    whether MPI may read device memory directly (`auto`: ask the MPI library)
MPITENSOR_MNIST_MIRRORS | text: URLs | the built-in mirrors | each download |
    base URLs (separated by commas or spaces) where `datasets.MNIST(download=True)` looks, in order
MPITENSOR_EXIT_GRACE | seconds | 2 | each exit under `mpitensor-run` |
    how long ranks exiting non-zero wait for each other before aborting (a malformed value is
    reported on stderr and the default used)
MPITENSOR_RUN_WATCH | text | unset | each rank's start under `mpitensor-run` |
    internal, set by `mpitensor-run --max-restarts` for one attempt: the launcher's socket each
    rank connects to (removed from the rank's environment at once)
MPITENSOR_RUN_ATTEMPT | text | unset | by the launcher, in its job's processes |
    internal, set by `mpitensor-run --max-restarts` on every process of one attempt, so that the
    launcher finds and ends any left before the next attempt
MPITENSOR_MPI_ALGORITHMS | choice: auto, off | auto | the first import of `mpi4py.MPI` after
    `import mpitensor` |
    MPICH's algorithm for the non-blocking collectives our blocking ones run on, chosen by
    measurement (docs/distributed.md), set where the environment names none (`off`: MPICH's own)
"""


def _declare(table: str) -> Dict[str, Switch]:
    """The switches that ``table`` declares, by name, in its order."""
    entries: List[str] = []
    for line in table.splitlines():
        if line[:1].isspace():
            entries[-1] += " " + line.strip()
        elif line:
            entries.append(line)
    switches: Dict[str, Switch] = {}
    for entry in entries:
        fields = [field.strip() for field in entry.split(" | ")]
        if len(fields) != len(Switch._fields) or fields[0] in switches:
            raise ValueError(f"malformed or repeated switch declaration: {entry!r}")
        switches[fields[0]] = Switch(*fields)
    return switches


SWITCHES: Dict[str, Switch] = _declare(_DECLARED)


# ----------------------------------------------------------------------------- the parsers
def _set(name: str) -> Optional[str]:
    """The text of ``name`` in the environment, or None where it is unset or blank."""
    raw = os.environ.get(name)
    return None if raw is None or raw.strip() == "" else raw


def _byte_count(raw: str) -> Optional[int]:
    """``raw`` as a byte count: OFF_BYTES for ``off``/``never``/``none``, else its integer
    (None where it is not one)."""
    value = raw.strip().lower()
    if value in ("off", "never", "none"):
        return OFF_BYTES
    try:
        return int(value)
    except ValueError:
        return None


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
    raw = _set(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{name}={raw!r} must be a positive number of seconds")
    return value


def env_choice(name: str, choices: "tuple[str, ...]", default: str) -> str:
    """Read an environment switch that takes one of ``choices`` (case-insensitive)."""
    raw = _set(name)
    if raw is None:
        return default
    value = raw.strip().upper()
    if value not in choices:
        raise ValueError(f"{name}={raw!r} is not one of {', '.join(choices)} (case does not "
                         "matter)")
    return value


def env_bytes(name: str, default: int, minimum: int = 0) -> int:
    """Read a byte count (an integer of at least ``minimum``, or ``off`` for "never") from the
    environment."""
    raw = _set(name)
    if raw is None:
        return default
    n = _byte_count(raw)
    what = ("a non-negative integer (0: every call)" if minimum <= 0
            else f"an integer of at least {minimum}")
    if n is None:
        raise ValueError(f"{name}={raw!r} is not a byte count; use {what} or off")
    if n < minimum:
        raise ValueError(f"{name}={raw!r} must be {what} or off")
    return n


def env_limit(name: str) -> Optional[int]:
    """Read a memory bound: a byte count, ``off`` (no bound: OFF_BYTES), or unset (None)."""
    raw = _set(name)
    if raw is None:
        return None
    n = _byte_count(raw)
    if n is None or n < 0:
        raise ValueError(f"{name}={raw!r} is not a byte count; use a non-negative integer "
                         "(e.g. 8000000000) or off")
    return n


def raw(name: str, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The text of the declared switch ``name`` as set now (None where unset)."""
    if name not in SWITCHES:
        raise KeyError(f"{name} is not a declared switch (declare it in mpitensor/_base/config.py)")
    return (os.environ if environ is None else environ).get(name)


def take(name: str) -> Optional[str]:
    """Remove the declared switch ``name`` from this process's environment; return its text."""
    value = raw(name)
    os.environ.pop(name, None)
    return value


# ---------------------------------------------------------------------------- read at import
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# the names, declared in _DECLARED (tests/test_config_switches.py checks that every one is)
ENV_DEBUG = "MPITENSOR_DEBUG"
ENV_TIMEOUT = "MPITENSOR_TIMEOUT"
ENV_STALL_WARN = "MPITENSOR_STALL_WARN"
ENV_ABORT_ON_EXCEPTION = "MPITENSOR_ABORT_ON_EXCEPTION"
ENV_NATIVE = "MPITENSOR_NATIVE"
ENV_LOG = "MPITENSOR_LOG"
ENV_CHECK_BYTES = "MPITENSOR_CHECK_BYTES"
ENV_STORE_MAX_BYTES = "MPITENSOR_STORE_MAX_BYTES"
ENV_LOAD_MAX_BYTES = "MPITENSOR_LOAD_MAX_BYTES"
ENV_CONV_BAND_BYTES = "MPITENSOR_CONV_BAND_BYTES"

DEBUG: bool = env_flag(ENV_DEBUG)
DEFAULT_TIMEOUT_S: float = env_float(ENV_TIMEOUT, 1800.0)
STALL_WARN_S: Optional[float] = (env_float(ENV_STALL_WARN, 60.0)
                                 if os.environ.get(ENV_STALL_WARN, "").strip() else None)
ABORT_ON_EXCEPTION: bool = env_flag(ENV_ABORT_ON_EXCEPTION, True)
#: the compiled parts where they were built (mpitensor/_cpu_kernels.c, the CPU loops;
#: mpitensor/distributed/health/_slots.c, the agreement slots); off: their pure-Python paths
NATIVE: bool = env_flag(ENV_NATIVE, True)
LOG_LEVEL: str = env_choice(ENV_LOG, _LEVELS, "WARNING")
LOG_SET: bool = bool(os.environ.get(ENV_LOG, "").strip())
CHECK_BYTES: int = env_bytes(ENV_CHECK_BYTES, 64 * 1024)
STORE_MAX_BYTES: int = env_bytes(ENV_STORE_MAX_BYTES, 2 << 30)
LOAD_MAX_BYTES: Optional[int] = env_limit(ENV_LOAD_MAX_BYTES)


# ---------------------------------------------------------------------- read at each use
ENV_NUM_THREADS = "MPITENSOR_NUM_THREADS"
ENV_NODE_REDUCE = "MPITENSOR_NODE_REDUCE"
ENV_SHM_COLLECTIVES = "MPITENSOR_SHM_COLLECTIVES"
ENV_HIERARCHICAL = "MPITENSOR_HIERARCHICAL"
ENV_MPI_ALGORITHMS = "MPITENSOR_MPI_ALGORITHMS"
ENV_RENDEZVOUS = "MPITENSOR_RENDEZVOUS"
ENV_JOB_ID = "MPITENSOR_JOB_ID"
ENV_SECRET = "MPITENSOR_SECRET"
ENV_CUDA_AWARE = "MPITENSOR_CUDA_AWARE"
ENV_MNIST_MIRRORS = "MPITENSOR_MNIST_MIRRORS"
ENV_EXIT_GRACE = "MPITENSOR_EXIT_GRACE"
ENV_RUN_WATCH = "MPITENSOR_RUN_WATCH"
ENV_RUN_ATTEMPT = "MPITENSOR_RUN_ATTEMPT"


def conv_band_bytes() -> int:
    """``MPITENSOR_CONV_BAND_BYTES`` (read once, when ``mpitensor.nn._kernels`` is imported)."""
    return env_bytes(ENV_CONV_BAND_BYTES, 1 << 20, minimum=1)


def job_id() -> str:
    """``MPITENSOR_JOB_ID`` as set now, stripped (``""`` where unset): read at each rendezvous,
    since launchers and tests set it per job in the processes they start."""
    return os.environ.get(ENV_JOB_ID, "").strip()


def env_secret() -> Optional[bytes]:
    """``MPITENSOR_SECRET`` as UTF-8 bytes, or None where it is unset or empty (read now)."""
    value = os.environ.get(ENV_SECRET)
    if not value:
        return None
    return value.encode("utf-8", "surrogateescape")


def num_threads(environ: Optional[Mapping[str, str]] = None) -> "Optional[Union[int, str]]":
    """``MPITENSOR_NUM_THREADS``: None (unset/auto), ``"off"``, or a positive integer."""
    value = raw(ENV_NUM_THREADS, environ)
    if value is None or value.strip().lower() in ("", "auto"):
        return None
    text = value.strip().lower()
    if text in ("off", "0", "false", "no"):
        return "off"
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"{ENV_NUM_THREADS}={value!r} is not valid: use a positive integer "
                     "(threads per rank), 'auto' (a fair share of the cores, the default) or "
                     "'off' (leave the BLAS and OpenMP thread pools alone)")


def node_reduce() -> str:
    """``MPITENSOR_NODE_REDUCE`` as ``"auto"``, ``"on"`` or ``"off"`` (ValueError otherwise)."""
    return env_choice(ENV_NODE_REDUCE, ("AUTO", "ON", "OFF"), "AUTO").lower()


def shm_collectives() -> str:
    """``MPITENSOR_SHM_COLLECTIVES`` as ``"auto"``, ``"on"`` or ``"off"`` (ValueError
    otherwise)."""
    return env_choice(ENV_SHM_COLLECTIVES, ("AUTO", "ON", "OFF"), "AUTO").lower()


def hierarchical() -> str:
    """``MPITENSOR_HIERARCHICAL`` as ``"auto"``, ``"on"`` or ``"off"`` (ValueError otherwise)."""
    return env_choice(ENV_HIERARCHICAL, ("AUTO", "ON", "OFF"), "AUTO").lower()


def mpi_algorithms() -> str:
    """``MPITENSOR_MPI_ALGORITHMS`` as ``"auto"`` or ``"off"`` (ValueError otherwise)."""
    return env_choice(ENV_MPI_ALGORITHMS, ("AUTO", "OFF"), "AUTO").lower()


def rendezvous_mode(modes: "tuple[str, ...]" = ("AUTO", "PMI", "CONNECT")) -> str:
    """``MPITENSOR_RENDEZVOUS`` as one of ``modes`` (upper case; ValueError otherwise)."""
    return env_choice(ENV_RENDEZVOUS, modes, "AUTO")


def cuda_aware() -> Optional[bool]:
    """``MPITENSOR_CUDA_AWARE``: None for ``auto`` (the default: detect), else the boolean."""
    if (os.environ.get(ENV_CUDA_AWARE, "auto").strip().lower()) == "auto":
        return None
    return env_flag(ENV_CUDA_AWARE)


def mnist_mirrors() -> List[str]:
    """``MPITENSOR_MNIST_MIRRORS`` split at commas and spaces (empty where unset)."""
    return os.environ.get(ENV_MNIST_MIRRORS, "").replace(",", " ").split()


def exit_grace(default: float) -> float:
    """``MPITENSOR_EXIT_GRACE`` in seconds (ValueError where malformed)."""
    return env_float(ENV_EXIT_GRACE, default)


# --------------------------------------------------------------------------------- the docs
def markdown_table() -> str:
    """The "Switches" table of docs/architecture.md (tests/test_config_switches.py checks it)."""
    rows = ["| variable | default | read | meaning |", "|---|---|---|---|"]
    for s in SWITCHES.values():
        rows.append(f"| `{s.name}` | {s.default} | {s.read} | {s.doc} |")
    return "\n".join(rows) + "\n"
