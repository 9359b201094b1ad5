"""``mpitensor-run``'s command line: its usage text, its options and torchrun's, checked.

:func:`parse_args` reads the launcher's own options, torchrun's (``--nproc-per-node``,
``--nnodes``, ``--rdzv-endpoint``, ...) and the options of the MPI's ``mpiexec``, which pass
through unchanged; :func:`_apply_torchrun_options` turns torchrun's into ranks, hosts and the
variables every rank gets. Bad input raises :class:`UsageError` before anything is launched.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
import uuid
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..distributed.launch import (
    launcher_option_values,
    parse_hostfile,
)
from ..distributed.launch.mpiexec import MPICH, OPENMPI

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
    """A parsed command line: a field per option of :data:`USAGE`, named for it (``-f`` fills
    ``hostfile``), ``None`` (or empty) where the option is not given."""

    nprocs: Optional[int] = None  # None: the MPI's own default (e.g. the hostfile's slots)
    hostfile: Optional[str] = None
    ppn: Optional[int] = None
    iface: Optional[str] = None
    env: List[Tuple[str, str]] = field(default_factory=list)  # (NAME, VALUE) per --env, in order
    tag_output: bool = False
    # --mpi-args split as a shell would, and the MPI launcher's own options found, with values
    mpi_args: List[str] = field(default_factory=list)
    mpiexec: Optional[str] = None
    dry_run: bool = False
    module: bool = False  # -m: target[0] names a module, not a script
    target: List[str] = field(default_factory=list)  # the script (or module), then its args
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
    # torchrun's (and mpitensor-run's) way: LOCAL_RANK in the environment only; False under
    # `python -m mpitensor.distributed.launch` without --use-env: the script also gets
    # --local-rank=N, as under torch's older launcher
    use_env: bool = True


_VALUED = {"-n": "nprocs", "--np": "nprocs", "-np": "nprocs", "--hostfile": "hostfile",
           "-f": "hostfile", "--ppn": "ppn", "--iface": "iface", "--env": "env",
           "--mpi-args": "mpi_args", "--mpiexec": "mpiexec", "-m": "module",
           "--module": "module"}
# torchrun's options, in both of its spellings (--nproc-per-node and --nproc_per_node)
for _name in ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port",
              "rdzv_endpoint", "rdzv_backend", "rdzv_id", "rdzv_conf", "max_restarts"):
    _VALUED["--" + _name] = _VALUED["--" + _name.replace("_", "-")] = _name
_FLAGS = {"--tag-output": "tag_output", "--dry-run": "dry_run", "--standalone": "standalone"}
# torch.distributed.launch's flag (not torchrun's, which always uses the environment)
_LEGACY_FLAGS = {**_FLAGS, "--use-env": "use_env", "--use_env": "use_env"}


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


def parse_args(argv: Sequence[str], flavor: Optional[Callable[[], str]] = None,
               legacy: bool = False) -> Options:
    """Parse the command line; everything from the target on belongs to the target.

    Options of mpitensor-run come first; any other option the MPI launcher accepts (its kind
    asked of ``flavor()``, called only when such an option appears) is kept, with its values,
    in ``Options.mpi_args``; an option neither knows is a :class:`UsageError`. ``legacy``:
    the command line of ``python -m mpitensor.distributed.launch`` (torch's older launcher),
    which also takes ``--use-env`` and otherwise gives the script ``--local-rank=N``.
    """
    opts = Options(use_env=not legacy)
    flags = _LEGACY_FLAGS if legacy else _FLAGS
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
        if name in flags and not eq:
            setattr(opts, flags[name], True)
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
