"""``mpitensor-run``: launch a script or module on N MPI ranks, failing fast when any rank fails.

Usage::

    mpitensor-run [-n N] [--hostfile FILE] [options] script.py [args...]
    mpitensor-run [-n N] [--hostfile FILE] [options] -m module [args...]
    python -m mpitensor.run ...            (the same)

It finds the ``mpiexec`` of the installed MPI (the one next to the Python interpreter, which the
``mpich`` wheel installs, else the first on ``PATH``), translates the options MPICH and Open MPI
spell differently, and runs the target on every rank inside a small bootstrap: an unhandled
exception on any rank prints that rank's traceback with each line prefixed ``[rank N]`` and calls
``MPI_Abort``, so the whole job ends at once with a non-zero exit code instead of the other ranks
waiting forever. ``sys.exit(code)`` passes ``code`` through as the job's exit code.

Every rank sees torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_RESTART_COUNT``, ...) from its first line on: the bootstrap sets them from the MPI
launcher's per-rank variables before the script starts. torchrun's options are accepted where
they mean something (``--nproc-per-node``, ``--nnodes``, ``--node-rank``, ``--master-addr``,
``--master-port``, ``--standalone``, ``--rdzv-endpoint``, ``--rdzv-backend``, ``--rdzv-id``,
``--max-restarts``), so a torchrun command line runs with the name changed::

    mpitensor-run --nproc-per-node 2 train.py --lr 0.1

``--max-restarts N``: when a rank fails, the whole job is stopped and every rank started again,
up to N times, with ``TORCHELASTIC_RESTART_COUNT`` counting the restarts; a program that saves
checkpoints and resumes from them continues where it was. A signal to the launcher (SIGINT,
SIGTERM, SIGHUP) ends the job and is never followed by a restart.

Where ``MPITENSOR_SECRET`` is not set, a random one is made for the job's processes (through
their environment), so the stores they open accept only each other (``docs/launching.md``);
set it yourself to let another process in, or set it empty for none. ``MPITENSOR_JOB_ID``,
where not set, is made the same way: one id for every process of the job.

Bad input (an unknown option, ``-n 0``, a missing script, a missing or malformed hostfile,
``--node-rank 1``) is reported in one line on stderr with exit code 2, before anything is
launched.
"""

from __future__ import annotations

import os
import secrets
import select
import shlex
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from .._base import config as _config
from ..distributed.launch.hostpool import (
    JOIN_TIMEOUT_S,
    KEEP_ALIVE_INTERVAL_S,
    KEEP_ALIVE_MAX_ATTEMPT,
    HostPool,
    NotEnoughHosts,
)
from ..distributed.launch import (
    _DEATH_SIGNALS,
    MPICH,
    OPENMPI,
    Command,
    HostEntry,
    HostfileError,
    _kill_job,
    _signal_name,
    build_command,
    find_mpiexec,
    launcher_option_values,
    mpi_flavor,
    parse_hostfile,
    rank_env,
    run_target,
)

__all__ = ["main"]

PROG = "mpitensor-run"

USAGE = f"""\
usage: {PROG} [-n N] [--hostfile FILE] [options] script.py [args...]
       {PROG} [-n N] [--hostfile FILE] [options] -m module [args...]

Run a Python script or module on N MPI ranks. An unhandled exception on any rank prints
that rank's traceback (each line prefixed [rank N]) and aborts the whole job (MPI_Abort).

options:
  -h, --help            show this help and exit
  -n N, --np N          number of ranks (default: the MPI's own default, e.g. the hostfile's
                        slots)
  --hostfile FILE       hosts to run on: MPICH `host[:slots]` or Open MPI `host slots=N` lines
                        (either works with either MPI); -f is an alias
  --ppn N               ranks per host
  --iface IFACE         network interface for MPI traffic (e.g. eth0)
  --env NAME=VALUE      set an environment variable on every rank (repeatable)
  --tag-output          prefix every output line with its rank
  --mpi-args ARGS       further options for mpiexec, as one shell-quoted string (repeatable),
                        e.g. --mpi-args "-bind-to core"
  --mpiexec PATH        the MPI launcher to use (default: next to python, else on PATH)
  --dry-run             print the mpiexec command line and exit
  -m MODULE, --module MODULE
                        run a module as the program (like python -m)

torchrun's options (a torchrun command line works with the name changed):
  --nproc-per-node N    ranks per node: a number, or auto/cpu/gpu (also --nproc_per_node)
  --nnodes N            number of nodes (default 1, or the hostfile's hosts); more than one
                        needs --hostfile (or a SLURM/PBS allocation): every node is started
                        from this one command. MIN:MAX with --hostfile: before every start
                        (restarts too) each host is asked, and the job runs on those that
                        answer, at most MAX; a lost host is left out of the restart, one
                        back is taken again, so the world size may change; with fewer than
                        MIN it waits (see join_timeout). MIN:MAX from a SLURM allocation
                        takes its nodes, fixed for the run
  --node-rank 0         this node's index: mpitensor-run runs on node 0 only
  --master-addr ADDR    MASTER_ADDR on every rank (default 127.0.0.1; rank 0's host on
                        several nodes)
  --master-port PORT    MASTER_PORT on every rank (default 29500; 0: a free port)
  --standalone          one node, MASTER_ADDR 127.0.0.1 and a free MASTER_PORT
  --rdzv-endpoint HOST[:PORT]
                        MASTER_ADDR and MASTER_PORT, where --master-* are not given
  --rdzv-backend NAME   accepted and unused (mpiexec does the rendezvous)
  --rdzv-id ID          TORCHELASTIC_RUN_ID on every rank
  --rdzv-conf KEY=VALUE[,KEY=VALUE...]
                        for --nnodes MIN:MAX, as torchrun: join_timeout (how long to wait
                        for MIN hosts, default 600 s), keep_alive_interval (how often the
                        running job's hosts are asked, default 5 s), keep_alive_max_attempt
                        (failed asks in a row that end the attempt as a lost host, default
                        3); torchrun's other keys are accepted and unused
  --max-restarts N      when a rank fails (non-zero exit, signal), stop every rank and start
                        them all again, up to N times (default 0: the job ends with the
                        failing code); TORCHELASTIC_RESTART_COUNT counts the restarts. The
                        world size stays the same unless --nnodes MIN:MAX lets the hosts
                        change; a signal to mpitensor-run never restarts
Each rank sees RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
ROLE_RANK, ROLE_NAME, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID and TORCHELASTIC_USE_AGENT_STORE, as under
torchrun.

Any other option of the MPI launcher found (MPICH's or Open MPI's mpiexec, e.g. --bind-to core,
-genv NAME VALUE, --mca KEY VALUE) is passed to it unchanged; an option neither knows is an
error (exit code 2).
"""


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit code 2."""


@dataclass
class Options:
    nprocs: Optional[int] = None
    hostfile: Optional[str] = None
    ppn: Optional[int] = None
    iface: Optional[str] = None
    env: List[Tuple[str, str]] = field(default_factory=list)
    tag_output: bool = False
    mpi_args: List[str] = field(default_factory=list)
    mpiexec: Optional[str] = None
    dry_run: bool = False
    module: bool = False
    target: List[str] = field(default_factory=list)
    # torchrun's
    nproc_per_node: Optional[str] = None
    nnodes: Optional[int] = None
    nnodes_max: Optional[int] = None  # --nnodes MIN:MAX with MIN < MAX
    node_rank: Optional[int] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    standalone: bool = False
    rdzv_endpoint: Optional[Tuple[str, Optional[int]]] = None
    rdzv_backend: Optional[str] = None
    rdzv_id: Optional[str] = None
    max_restarts: Optional[int] = None
    join_timeout: Optional[float] = None  # --rdzv-conf join_timeout=S
    keep_alive_interval: Optional[float] = None  # --rdzv-conf keep_alive_interval=S
    keep_alive_max_attempt: Optional[int] = None  # --rdzv-conf keep_alive_max_attempt=N


_VALUED = {"-n": "nprocs", "--np": "nprocs", "-np": "nprocs", "--hostfile": "hostfile",
           "-f": "hostfile", "--ppn": "ppn", "--iface": "iface", "--env": "env",
           "--mpi-args": "mpi_args", "--mpiexec": "mpiexec", "-m": "module",
           "--module": "module"}
# torchrun's options, in both of its spellings (--nproc-per-node and --nproc_per_node)
for _name in ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port",
              "rdzv_endpoint", "rdzv_backend", "rdzv_id", "rdzv_conf", "max_restarts"):
    _VALUED["--" + _name] = _VALUED["--" + _name.replace("_", "-")] = _name
_FLAGS = {"--tag-output": "tag_output", "--dry-run": "dry_run", "--standalone": "standalone"}


def _positive_int(option: str, value: str, what: str = "ranks") -> int:
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"argument {option}: invalid int value: {value!r}") from None
    if n < 1:
        raise UsageError(f"argument {option}: must be a positive number of {what}, got {n}")
    return n


_FLAVOR_NAMES = {MPICH: "MPICH", OPENMPI: "Open MPI"}


def _int_in(option: str, value: str, low: int, high: Optional[int] = None) -> int:
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"argument {option}: invalid int value: {value!r}") from None
    if n < low or (high is not None and n > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise UsageError(f"argument {option}: must be {bound}, got {n}")
    return n


def _endpoint(option: str, value: str) -> Tuple[str, Optional[int]]:
    """``host``, ``host:port`` or ``[v6addr]:port``."""
    host, port = value, None
    if value.startswith("["):
        close = value.find("]")
        if close < 0 or value[close + 1:close + 2] not in ("", ":"):
            raise UsageError(f"argument {option}: expected HOST[:PORT], got {value!r}")
        host, rest = value[1:close], value[close + 2:]
        port = rest or None
    elif value.count(":") == 1:
        host, port = value.split(":")
    if not host:
        raise UsageError(f"argument {option}: expected HOST[:PORT], got {value!r}")
    return host, (None if port is None else _int_in(option, port, 0, 65535))


# torchrun's --rdzv-conf keys: join_timeout (how long --nnodes MIN:MAX waits for MIN hosts),
# keep_alive_interval and keep_alive_max_attempt (how a lost host is noticed) are used; the
# others configure torchrun's own rendezvous store and mean nothing here
_RDZV_CONF_UNUSED = ("timeout", "last_call_timeout", "read_timeout", "close_timeout",
                     "is_host", "use_libuv")


def _rdzv_conf(opts: Options, name: str, value: str) -> None:
    for item in value.split(","):
        if not item.strip():
            continue
        key, eq, v = item.partition("=")
        key = key.strip()
        if not eq:
            raise UsageError(f"argument {name}: expected KEY=VALUE[,KEY=VALUE...], got {item!r}")
        if key in ("join_timeout", "keep_alive_interval"):
            try:
                seconds = float(v)
            except ValueError:
                seconds = -1.0
            if not 0 < seconds < float("inf"):
                raise UsageError(f"argument {name}: {key} must be a positive number of "
                                 f"seconds, got {v!r}")
            setattr(opts, key, seconds)
        elif key == "keep_alive_max_attempt":
            opts.keep_alive_max_attempt = _positive_int(name, v, "attempts")
        elif key not in _RDZV_CONF_UNUSED:
            raise UsageError(f"argument {name}: unknown key {key!r} (known: join_timeout, "
                             "keep_alive_interval, keep_alive_max_attempt, and torchrun's "
                             f"{', '.join(_RDZV_CONF_UNUSED)}, accepted and unused)")


def _store(opts: Options, key: str, name: str, value: str) -> None:
    """Record the value of one of mpitensor-run's own options."""
    if key in ("nprocs", "ppn"):
        setattr(opts, key, _positive_int(name, value))
    elif key == "nproc_per_node":
        opts.nproc_per_node = value if value in ("auto", "cpu", "gpu") else str(
            _positive_int(name, value))
    elif key == "nnodes":
        low, colon, high = value.partition(":")
        n = _positive_int(name, low, "nodes")
        most = _positive_int(name, high, "nodes") if colon else n
        if most < n:
            raise UsageError(f"argument {name}: {value} gives MIN > MAX; write MIN:MAX with "
                             "MIN <= MAX")
        opts.nnodes, opts.nnodes_max = n, (most if most > n else None)
    elif key in ("node_rank", "max_restarts"):
        setattr(opts, key, _int_in(name, value, 0))
    elif key == "master_port":
        opts.master_port = _int_in(name, value, 0, 65535)
    elif key == "rdzv_endpoint":
        opts.rdzv_endpoint = _endpoint(name, value)
    elif key == "rdzv_conf":
        _rdzv_conf(opts, name, value)
    elif key in ("master_addr", "rdzv_backend", "rdzv_id") and not value:
        raise UsageError(f"argument {name}: expected a non-empty value")
    elif key == "env":
        k, sep, v = value.partition("=")
        if not sep or not k:
            raise UsageError(f"argument --env: expected NAME=VALUE, got {value!r}")
        opts.env.append((k, v))
    elif key == "mpi_args":
        try:
            opts.mpi_args += shlex.split(value)
        except ValueError as exc:
            raise UsageError(f"argument --mpi-args: {exc}") from None
    else:
        setattr(opts, key, value)


def parse_args(argv: Sequence[str], flavor: Optional[Callable[[], str]] = None) -> Options:
    """Parse the command line; everything from the target on belongs to the target.

    Options of mpitensor-run come first; any other option the MPI launcher accepts (its kind
    asked of ``flavor()``, called only when such an option appears) is kept, with its values,
    in ``Options.mpi_args``; an option neither knows is a :class:`UsageError`.
    """
    opts = Options()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-h", "--help"):
            sys.stdout.write(USAGE)
            raise SystemExit(0)
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        name, eq, inline = arg.partition("=")
        if name in _FLAGS and not eq:
            setattr(opts, _FLAGS[name], True)
            i += 1
            continue
        if name not in _VALUED or (eq and name == "-m"):
            kind = flavor() if flavor is not None else None
            values = launcher_option_values(kind, arg) if kind else None
            if values is not None:
                # an option of the launcher found (e.g. --bind-to core): passed through as is
                if i + values >= len(args):
                    raise UsageError(f"argument {arg}: expected {values} value"
                                     f"{'s' if values > 1 else ''} (an option of "
                                     f"{_FLAVOR_NAMES[kind]}'s mpiexec)")
                opts.mpi_args += args[i:i + 1 + values]
                i += 1 + values
                continue
            # -n4 / -mpkg (attached values), as argparse accepts them
            if arg[:2] in ("-n", "-m", "-f") and len(arg) > 2 and not arg.startswith("--"):
                name, inline, eq = arg[:2], arg[2:], "="
            else:
                which = f" or of {_FLAVOR_NAMES[kind]}'s mpiexec" if kind else ""
                raise UsageError(f"unrecognized argument: {arg} (not an option of {PROG}{which}; "
                                 'other launcher options go in --mpi-args "...", and the '
                                 "script comes last)")
        if eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(args):
                raise UsageError(f"argument {name}: expected one argument")
            value = args[i + 1]
            i += 2
        if _VALUED[name] == "module":  # -m: the module and everything after it are the target
            if not value:
                raise UsageError("argument -m: expected a module name")
            opts.module = True
            opts.target = [value, *args[i:]]
            _check_module(value)
            return opts
        _store(opts, _VALUED[name], name, value)
    opts.target = args[i:]
    if not opts.target:
        raise UsageError("no script given: mpitensor-run [options] script.py [args...] or "
                         "-m module [args...]")
    if not os.path.isfile(opts.target[0]):
        raise UsageError(f"script {opts.target[0]} does not exist")
    return opts


def _explicit_mpiexec(args: Sequence[str]) -> Optional[str]:
    """The first ``--mpiexec PATH`` on the command line (a guess: it may be the target's)."""
    for i, arg in enumerate(args):
        if arg.startswith("--mpiexec="):
            return arg.split("=", 1)[1]
        if arg == "--mpiexec" and i + 1 < len(args):
            return args[i + 1]
    return None


def _check_module(name: str) -> None:
    import importlib.util

    sys.path.insert(0, os.getcwd())  # the ranks run modules from the current directory too
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"module {name} cannot be found: {exc}") from None
    finally:
        sys.path.pop(0)
    if spec is None:
        raise UsageError(f"no module named {name}")


_ALLOCATION_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "COBALT_JOBID", "PE_HOSTFILE")


def _per_node_count(value: str) -> int:
    """torchrun's ``--nproc-per-node`` value as a number of ranks."""
    if value == "cpu" or value == "auto":
        if value == "auto":
            from ..cuda import device_count

            gpus = device_count()
            if gpus:
                return gpus
        return os.cpu_count() or 1
    if value == "gpu":
        from ..cuda import device_count

        gpus = device_count()
        if not gpus:
            raise UsageError("argument --nproc-per-node: 'gpu' asks for one rank per GPU, and "
                             "no GPU is visible (CuPy missing or no CUDA device); give a number")
        return gpus
    return int(value)


_NODE_COUNT_VARS = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
PROBE_TIMEOUT_S = 20.0  # a host that has not run `python -c ""` by then is taken as lost


def _nodes_in_range(opts: Options) -> int:
    """The number of nodes ``--nnodes MIN:MAX`` gives at most, decided before the first start.

    The hostfile's hosts (or a SLURM allocation's nodes) when there are at least MIN of them,
    at most MAX of them; MIN where nothing says how many nodes there are. With a hostfile,
    :class:`~mpitensor.distributed.launch.hostpool.HostPool` then takes, before every start, those
    of them that answer; an allocation's count stays fixed.
    """
    low, high = opts.nnodes or 1, opts.nnodes_max or 1
    if opts.hostfile:
        have, where = len(parse_hostfile(opts.hostfile)[0]), f"hostfile {opts.hostfile} names"
    else:
        counts = [os.environ.get(v, "").strip() for v in _NODE_COUNT_VARS]
        known = [int(c) for c in counts if c.isdigit()]
        if not known:
            return low
        have, where = known[0], "the SLURM allocation has"
    if have < low:
        raise UsageError(f"argument --nnodes: {low}:{high} needs at least {low} nodes, but "
                         f"{where} {have}; mpitensor-run starts every node at once and cannot "
                         "wait for more to join")
    return min(have, high)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _apply_torchrun_options(opts: Options) -> Dict[str, str]:
    """Turn torchrun's options into ranks (``opts.nprocs``, ``opts.ppn``) and job settings.

    Returns:
        The job-wide values the bootstrap gives every rank (``MASTER_ADDR``, ``MASTER_PORT``,
        ``TORCHELASTIC_RUN_ID``), for those the command line decides.

    Raises:
        UsageError: options that contradict each other or ask for what is not supported.
    """
    if opts.nnodes_max is not None:
        opts.nnodes = _nodes_in_range(opts)
    if opts.node_rank:
        raise UsageError(f"argument --node-rank: got {opts.node_rank}, but mpitensor-run starts "
                         "the ranks of every node from one command (mpiexec reaches the other "
                         "nodes): run it once, on one node, without --node-rank, with "
                         "--hostfile FILE listing the nodes")
    if opts.standalone and opts.nnodes not in (None, 1):
        raise UsageError(f"argument --standalone: runs on one node, but --nnodes is "
                         f"{opts.nnodes}; drop one of them")
    per_node = None if opts.nproc_per_node is None else _per_node_count(opts.nproc_per_node)
    if per_node is not None or opts.nnodes is not None:
        hosts = len(parse_hostfile(opts.hostfile)[0]) if opts.hostfile else None
        nnodes = opts.nnodes or (hosts if hosts and per_node is not None else 1)
        per_node = per_node or 1
        if nnodes > 1 and hosts is None and not any(os.environ.get(v)
                                                    for v in _ALLOCATION_VARS):
            raise UsageError(f"argument --nnodes: {nnodes} nodes need --hostfile FILE naming "
                             "them (or a SLURM/PBS allocation): mpitensor-run starts every "
                             "node from this one command")
        if hosts is not None and hosts < nnodes:
            raise UsageError(f"argument --nnodes: {nnodes} nodes, but hostfile "
                             f"{opts.hostfile} names {hosts} host(s)")
        total = nnodes * per_node
        if opts.nprocs is not None and opts.nprocs != total:
            raise UsageError(f"argument -n: {opts.nprocs} ranks contradicts --nnodes {nnodes} "
                             f"x --nproc-per-node {per_node} = {total}; give one or the other")
        if nnodes > 1 or hosts is not None:
            if opts.ppn is not None and opts.ppn != per_node:
                raise UsageError(f"argument --ppn: {opts.ppn} contradicts --nproc-per-node "
                                 f"{per_node}; give one or the other")
            opts.ppn = per_node
        opts.nprocs = total
    addr, port = opts.master_addr, opts.master_port
    if opts.rdzv_endpoint is not None:
        host, endpoint_port = opts.rdzv_endpoint
        addr = addr or host
        port = endpoint_port if port is None else port
    if opts.standalone:
        addr = addr or "127.0.0.1"
        port = 0 if port is None else port
    settings: Dict[str, str] = {}
    if addr:
        settings["MASTER_ADDR"] = addr
    if port is not None:
        settings["MASTER_PORT"] = str(port or _free_port())
    run_id = opts.rdzv_id or (uuid.uuid4().hex if opts.standalone else None)
    if run_id:
        settings["TORCHELASTIC_RUN_ID"] = run_id
    return settings


def _worker(args: Sequence[str]) -> int:
    """The bootstrap each rank runs: torchrun's variables first, then the target."""
    settings: Dict[str, str] = {}
    rest = list(args)
    while rest[:1] == ["--_env"] and len(rest) > 1:
        name, _, value = rest[1].partition("=")
        settings[name] = value
        rest = rest[2:]
    os.environ.update(rank_env(settings))
    # the launcher's, for this attempt only: the program's own children must not connect
    rank = os.environ["RANK"]
    link = _WatchLink.open(_config.take(_WATCH_VAR),
                           int(rank) if rank.isdigit() else None)
    module = rest[:1] == ["-m"]
    return run_target(rest[1:] if module else rest, module=module,
                      on_end=link.ended if link is not None else None)


def _error(msg: str) -> int:
    sys.stderr.write(f"{PROG}: error: {msg}\n")
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``mpitensor-run`` and ``python -m mpitensor.run``.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        The job's exit code: 0 when every rank succeeded, the code of a failing rank otherwise,
        2 for bad command-line input.

    Example:
        >>> main(["-n", "2", "--dry-run", "train.py"])  # doctest: +SKIP
        /venv/bin/mpiexec -n 2 /venv/bin/python -m mpitensor.run --_worker train.py
        0
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--_worker"]:
        return _worker(args[1:])
    if args[:1] == ["--_spawn"]:
        from ..distributed.launch import _spawn_worker

        return _spawn_worker(args[1])
    try:
        found: dict = {}

        def flavor_of(explicit: Optional[str]) -> str:
            if explicit not in found:
                found[explicit] = mpi_flavor(find_mpiexec(explicit))
            return found[explicit]

        # the launcher decides which options pass through, and --mpiexec may come after them:
        # parse with the first --mpiexec seen, again if that one was the target's argument
        guess = _explicit_mpiexec(args)
        opts = parse_args(args, lambda: flavor_of(guess))
        if opts.mpiexec != guess:
            explicit = opts.mpiexec
            opts = parse_args(args, lambda: flavor_of(explicit))
        low = opts.nnodes
        settings = _apply_torchrun_options(opts)
        mpiexec = find_mpiexec(opts.mpiexec)
        flavor = flavor_of(opts.mpiexec)
        pool = None
        if opts.nnodes_max is not None and opts.hostfile and not opts.dry_run:
            pool = _host_pool(opts, low or 1, mpiexec, flavor)

        def command(attempt: int, probe: bool = True) -> Command:
            hostfile, nprocs = opts.hostfile, opts.nprocs
            if pool is not None and probe:
                hostfile, nprocs = pool.pick(attempt)
            job = dict(settings)
            if opts.max_restarts:
                job.update(TORCHELASTIC_RESTART_COUNT=str(attempt),
                           TORCHELASTIC_MAX_RESTARTS=str(opts.max_restarts))
            rank_argv = [sys.executable, "-m", "mpitensor.run", "--_worker"]
            for name, value in job.items():  # on the command line: it reaches every node
                rank_argv += ["--_env", f"{name}={value}"]
            rank_argv += ["-m", *opts.target] if opts.module else opts.target
            return build_command(rank_argv, nprocs, hostfile, mpiexec, flavor,
                                 opts.iface, opts.env, opts.tag_output, opts.ppn, opts.mpi_args)

        cmd = command(0, probe=False)
    except (UsageError, HostfileError, FileNotFoundError, RuntimeError, ValueError) as exc:
        return _error(str(exc))
    if opts.dry_run:
        sys.stdout.write(cmd.shell() + "\n")
        return 0
    if _config.raw(_config.ENV_SECRET) is None:  # set but empty: the user's "no secret"
        # the job's stores then accept only its own processes (docs/launching.md); through the
        # environment, never the command line, where `ps` would show it to every user
        os.environ[_config.ENV_SECRET] = secrets.token_hex(32)
    # one identity for the whole job (kept where one is set: a scheduler's, a test's): a
    # rendezvous its processes hold refuses processes of another job (docs/launching.md)
    if _config.raw(_config.ENV_JOB_ID) is None:
        os.environ[_config.ENV_JOB_ID] = f"mpitensor-run-{uuid.uuid4().hex}"
    try:
        return _run_job(command, opts, flavor, pool)
    finally:
        if pool is not None:
            pool.close()


def _host_pool(opts: Options, low: int, mpiexec: str, flavor: str) -> HostPool:
    """The hosts of ``--hostfile`` under ``--nnodes MIN:MAX``, asked before every start."""
    entries, syntax = parse_hostfile(opts.hostfile or "")

    def probe(entry: HostEntry, scratch: str) -> Tuple[bool, str]:
        # one rank of `python -c ""` on this host alone, through the job's launcher options
        path = os.path.join(scratch, "hostfile")
        with open(path, "w") as f:
            f.write(entry.host + "\n")
        cmd = build_command([sys.executable, "-c", ""], 1, path, mpiexec, flavor, opts.iface,
                            (), False, None, opts.mpi_args)
        env = dict(os.environ)
        env.update(cmd.env)
        for var in (_ATTEMPT_VAR, _WATCH_VAR):
            env.pop(var, None)
        proc = subprocess.Popen(cmd.argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            _, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            return False, f"no answer within {PROBE_TIMEOUT_S:g} s"
        if proc.returncode == 0:
            return True, ""
        lines = [ln.strip() for ln in err.decode(errors="replace").splitlines() if ln.strip()]
        return False, f"exit code {proc.returncode}" + (f": {lines[0][:200]}" if lines else "")

    join = opts.join_timeout if opts.join_timeout is not None else JOIN_TIMEOUT_S
    high = opts.nnodes_max or opts.nnodes or low  # the command line's MAX (for messages)
    return HostPool(entries, syntax, low, high, opts.ppn or 1, probe, join, _say,
                    opts.keep_alive_interval or KEEP_ALIVE_INTERVAL_S,
                    opts.keep_alive_max_attempt or KEEP_ALIVE_MAX_ATTEMPT)


def _run_job(command: Callable[..., Command], opts: Options, flavor: str,
             pool: Optional[HostPool]) -> int:
    if opts.max_restarts or pool is not None:  # (the hosts are watched while it runs)
        return _ElasticJob(command, opts.max_restarts or 0, opts.nprocs, flavor, pool).run()
    cmd = command(0, probe=False)
    env = dict(os.environ)
    env.update(cmd.env)
    proc = subprocess.Popen(cmd.argv, env=env)
    try:
        return _wait(proc)
    except KeyboardInterrupt:
        return 130


def _stop(proc: subprocess.Popen) -> None:
    """End mpiexec (and so its ranks): SIGINT, then SIGTERM, then SIGKILL, 2 s apart."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=2)
            return
        except subprocess.TimeoutExpired:
            continue


def _wait(proc: subprocess.Popen) -> int:
    """Wait for mpiexec; forward SIGTERM/SIGHUP to it so a killed launcher takes the job along."""
    def forward(signum: int, frame: object) -> None:
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                # a Ctrl-C at the terminal reached mpiexec too, but a SIGINT sent to this
                # process alone (kill -INT, a scheduler) did not: pass it on, then insist
                _stop(proc)
                raise
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return code if code >= 0 else 128 - code


# --------------------------------------------------------------------------- --max-restarts

# the launcher's socket for one attempt (a Linux abstract socket name): each rank's bootstrap
# connects, says its rank, reports how it ends, and the connection's end tells when it ended
_WATCH_VAR = _config.ENV_RUN_WATCH
# carried by every process of one attempt (mpiexec, its proxies, the ranks, their children), so
# that the launcher can find and end any of them still running before the next attempt starts
_ATTEMPT_VAR = _config.ENV_RUN_ATTEMPT


def _say(msg: str) -> None:
    sys.stderr.write(f"{PROG}: {msg}\n")
    sys.stderr.flush()


class _WatchLink:
    """A rank's connection to the launcher's :class:`_RankWatch` (the rank side).

    Open for the rank's whole life: the kernel closes it when the process ends, however it
    ends, in the same instant as it closes the rank's connections to mpiexec. Children forked
    by the rank close their copy at once, so that it never outlives the rank.
    """

    def __init__(self, name: str, rank: int) -> None:
        self._sock: Optional[socket.socket] = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(5.0)
        self._sock.connect("\0" + name)
        self._sock.sendall(f"rank {rank}\n".encode())
        os.register_at_fork(after_in_child=self._drop)

    @classmethod
    def open(cls, name: Optional[str], rank: Optional[int]) -> Optional[_WatchLink]:
        """Connect, or None where the launcher cannot be reached (another host, not Linux)."""
        if not name or rank is None:
            return None
        try:
            return cls(name, rank)
        except OSError:
            return None

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def ended(self, code: int, how: str) -> None:
        """Tell the launcher how this rank ends (``run_target``'s ``on_end``); never raises."""
        if self._sock is None:
            return
        try:
            self._sock.sendall(f"end {code} {time.time():.6f} {how}\n".encode())
        except OSError:
            pass


_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _descends_from(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor`` or one of its descendants (Linux /proc)."""
    for _ in range(256):  # a chain longer than this is no job's
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                stat = fh.read()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            pid = int(stat[stat.rindex(b")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            return False  # gone already: nothing it said can be trusted to be the job's
    return False


def _peer_is_ours(conn: socket.socket) -> bool:
    """Whether the process at the other end of ``conn`` is this launcher's descendant.

    An abstract socket has no permissions: any local process can find its name (in
    /proc/net/unix) and connect. The kernel's record of who connected (SO_PEERCRED) cannot be
    forged; only the ranks (the launcher's descendants, through mpiexec) pass.
    """
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except (OSError, AttributeError):
        return False
    pid, uid, _ = _PEERCRED.unpack(raw)
    return uid == os.getuid() and pid > 0 and _descends_from(pid, os.getpid())


class _RankWatch(threading.Thread):
    """The launcher's side of the ranks' :class:`_WatchLink`: how and in what order they end.

    A rank that raises or calls ``sys.exit`` says so (``end CODE TIME HOW``) before it goes; a
    rank killed by a signal or ended by ``os._exit`` says nothing, and its connection just
    closes. The kernel closes it as it closes the rank's connections to mpiexec, before mpiexec
    can end the other ranks, so the rank that took the job down is always among the first seen
    to end (with ``select``); when this thread looks late, on a busy machine, it may see others
    end in the same instant, and then it cannot tell which one came first. Ranks on other hosts
    cannot connect and are not seen. A connection from any other process (checked with the
    kernel's peer credentials) is closed unread.
    """

    def __init__(self, nprocs: Optional[int]) -> None:
        super().__init__(name="mpitensor-run-watch", daemon=True)
        self.address = f"mpitensor-run-{uuid.uuid4().hex}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.address)  # abstract: no file to remove, no path limit
        self._listener.listen(max(nprocs or 0, 64))
        self._listener.setblocking(False)
        self._halt = threading.Event()
        self.connected: Set[int] = set()
        self.ends: Dict[int, Tuple[int, float, str]] = {}  # rank -> (code, time, how)
        self.batches: List[List[int]] = []  # ranks seen to fail (or end), a batch per look

    def run(self) -> None:
        conns: Dict[socket.socket, List[Any]] = {}  # connection -> [rank or None, bytes so far]
        try:
            while not self._halt.is_set():
                ready, _, _ = select.select([self._listener, *conns], [], [], 0.05)
                batch: List[int] = []
                for sock in ready:
                    if sock is self._listener:
                        try:
                            conn, _ = self._listener.accept()
                        except OSError:
                            continue
                        if not _peer_is_ours(conn):
                            conn.close()  # a stranger: not a word of it reaches the report
                            continue
                        conn.setblocking(False)
                        conns[conn] = [None, b""]
                        continue
                    state = conns[sock]
                    try:
                        data = sock.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if data:
                        state[1] += data
                        *lines, state[1] = state[1].split(b"\n")
                        for line in lines:
                            self._message(state, line.decode(errors="replace"), batch)
                    else:  # the rank is gone
                        if state[0] is not None:
                            batch.append(state[0])
                        del conns[sock]
                        sock.close()
                if batch:
                    self.batches.append(sorted(set(batch)))
        except Exception:  # noqa: BLE001 - the watch only improves the messages
            pass
        finally:
            for sock in conns:
                sock.close()
            self._listener.close()

    def _message(self, state: List[Any], line: str, batch: List[int]) -> None:
        words = line.split(" ", 4)
        if words[0] == "rank" and len(words) == 2 and words[1].isdigit():
            state[0] = int(words[1])
            self.connected.add(state[0])
        elif words[0] == "end" and state[0] is not None and len(words) >= 3:
            try:
                code, when = int(words[1]), float(words[2])
            except ValueError:
                return
            self.ends[state[0]] = (code, when, " ".join(words[3:]) or "exit")
            if code != 0:
                batch.append(state[0])

    def stop(self) -> None:
        """End the watch (after mpiexec has exited) and wait for it."""
        self._halt.set()
        self.join(timeout=2.0)

    def failed_first(self) -> List[int]:
        """The ranks of the first look that saw a rank fail: one rank, or several seen to fail
        in the same instant; a rank that said it ended well (code 0) is not a failure."""
        for batch in self.batches:
            failed = [r for r in batch if self.ends.get(r, (1,))[0] != 0]
            if failed:
                return failed
        return []


class _ElasticJob:
    """``mpitensor-run --max-restarts N``: run the job, and after a failure stop it and run it
    again, up to N times.

    Every attempt is a fresh ``mpiexec`` with the same command line but for
    ``TORCHELASTIC_RESTART_COUNT``. Between attempts nothing of the failed one may run on: after
    mpiexec has exited, any process still carrying the attempt's tag (a rank, a child of one) is
    given 3 s and then SIGKILLed. SIGTERM and SIGHUP are forwarded to mpiexec and SIGINT stops
    it, as without restarts; after any of them no attempt follows.
    """

    def __init__(self, command: Callable[[int], Command], max_restarts: int,
                 nprocs: Optional[int], flavor: str, pool: Optional[HostPool] = None) -> None:
        self._command = command
        self._max = max_restarts
        self._nprocs = nprocs
        self._flavor = flavor
        self._pool = pool
        self._run_id = uuid.uuid4().hex
        self._proc: Optional[subprocess.Popen] = None
        self._signalled: Optional[int] = None

    def _forward(self, signum: int, frame: object) -> None:
        self._signalled = signum
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

    def run(self) -> int:
        """Run the attempts; return the exit code of the last one (0 once one succeeded)."""
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGTERM, signal.SIGHUP)}
        attempt = 0
        try:
            while True:
                code, failure = self._attempt(attempt)
                if code == 0 or self._signalled is not None:
                    return code  # a signal to the launcher ends the run: never a restart
                if attempt == self._max:
                    if self._max:
                        _say(f"{failure}; restarts exhausted ({self._max} of --max-restarts "
                             f"{self._max} used): exiting with code {code}")
                    else:
                        _say(f"{failure}: exiting with code {code}")
                    return code
                if self._signalled is not None:  # arrived while the job was being stopped
                    return code
                attempt += 1
                _say(f"{failure}; every rank was stopped: restart {attempt} of {self._max} "
                     f"(TORCHELASTIC_RESTART_COUNT={attempt})")
        except NotEnoughHosts as exc:  # already waited for them: no restart can help
            _say(f"{exc}; exiting with code 1")
            return 1
        except KeyboardInterrupt:
            if self._proc is not None and self._proc.poll() is None:
                _stop(self._proc)
            return 130
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            if self._proc is not None:
                _kill_job(self._tag(attempt), wait=2.0, var=_ATTEMPT_VAR)

    def _tag(self, attempt: int) -> str:
        return f"{self._run_id}.{attempt}"

    def _attempt(self, attempt: int) -> Tuple[int, str]:
        """Run attempt ``attempt``; return its exit code and, for a failure, what failed."""
        cmd = self._command(attempt)  # NotEnoughHosts ends the run (see run)
        if self._pool is not None:
            self._nprocs = self._pool.nprocs
        env = dict(os.environ)
        env.update(cmd.env)
        env[_ATTEMPT_VAR] = self._tag(attempt)
        watch: Optional[_RankWatch] = None
        if sys.platform.startswith("linux"):  # abstract sockets; elsewhere no rank is named
            try:
                watch = _RankWatch(self._nprocs)
            except OSError:
                pass
        if watch is not None:
            env[_WATCH_VAR] = watch.address
            watch.start()
        stop = threading.Event()
        lost: List[str] = []
        keeper: Optional[threading.Thread] = None
        try:
            self._proc = proc = subprocess.Popen(cmd.argv, env=env)
            if self._signalled is not None:  # arrived while mpiexec was being started
                self._forward(self._signalled, None)
            if self._pool is not None:
                def on_lost(entry: HostEntry, why: str) -> None:
                    lost.append(f"host {entry.host} was lost ({why})")
                    _say(f"{lost[0]}: ending the job")
                    _stop(proc)

                keeper = threading.Thread(target=self._pool.keep_alive, args=(stop, on_lost),
                                          name="mpitensor-run keep-alive", daemon=True)
                keeper.start()
            code = proc.wait()
        finally:
            stop.set()
            if keeper is not None:
                keeper.join()
            if watch is not None:
                watch.stop()
        # hydra ends every rank before it exits; anything still there is ended now
        _kill_job(self._tag(attempt), wait=3.0, var=_ATTEMPT_VAR)
        if code == 0:
            return 0, ""
        code = code if code >= 0 else 128 - code
        if lost:
            return (code or 1), lost[0]
        return code, self._diagnose(proc.returncode, watch)

    def _diagnose(self, code: int, watch: Optional[_RankWatch]) -> str:
        """Which rank failed, and how, in words."""
        if code < 0:
            return f"mpiexec was killed by signal {_signal_name(-code)}"
        n = self._nprocs or (len(watch.connected) if watch is not None else 0) or None
        of = f" of {n}" if n else ""
        first = watch.failed_first() if watch is not None else []
        ends = watch.ends if watch is not None else {}
        if first and all(r in ends for r in first):
            # each of them said how it ends: the earliest to say so (their clocks are this
            # host's) took the job down, e.g. several ranks agreeing on sys.exit(2)
            rank = min(first, key=lambda r: (ends[r][1], r))
            rc, _, how = ends[rank]
            if how.startswith("raised"):
                return f"rank {rank}{of} {how} (exit code {rc})"
            return f"rank {rank}{of} exited with code {rc}"
        if len(first) == 1:
            who = f"rank {first[0]}{of}"
        elif first:
            who = (f"one of ranks {', '.join(map(str, first))}{of} (they ended in the same "
                   "instant)")
        else:
            who = "a rank"
        if self._flavor == MPICH and code in _DEATH_SIGNALS:
            # hydra exits with the signal number of a rank a signal killed
            return f"{who} was killed by signal {_signal_name(code)} (exit code {code})"
        return f"{who} exited with code {code}"


if __name__ == "__main__":
    sys.exit(main())
