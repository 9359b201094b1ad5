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
``--max-restarts 0``), so a torchrun command line runs with the name changed::

    mpitensor-run --nproc-per-node 2 train.py --lr 0.1

Bad input (an unknown option, ``-n 0``, a missing script, a missing or malformed hostfile,
``--max-restarts 2``) is reported in one line on stderr with exit code 2, before anything is
launched.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .distributed.launch import (
    MPICH,
    OPENMPI,
    HostfileError,
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
  --nnodes N            number of nodes (N or N:N; default 1, or the hostfile's hosts); more
                        than one needs --hostfile (or a SLURM/PBS allocation): every node is
                        started from this one command
  --node-rank 0         this node's index: mpitensor-run runs on node 0 only
  --master-addr ADDR    MASTER_ADDR on every rank (default 127.0.0.1; rank 0's host on
                        several nodes)
  --master-port PORT    MASTER_PORT on every rank (default 29500; 0: a free port)
  --standalone          one node, MASTER_ADDR 127.0.0.1 and a free MASTER_PORT
  --rdzv-endpoint HOST[:PORT]
                        MASTER_ADDR and MASTER_PORT, where --master-* are not given
  --rdzv-backend NAME   accepted and unused (mpiexec does the rendezvous)
  --rdzv-id ID          TORCHELASTIC_RUN_ID on every rank
  --max-restarts 0      restarting failed ranks is not supported yet: only 0 is accepted
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
    node_rank: Optional[int] = None
    master_addr: Optional[str] = None
    master_port: Optional[int] = None
    standalone: bool = False
    rdzv_endpoint: Optional[Tuple[str, Optional[int]]] = None
    rdzv_backend: Optional[str] = None
    rdzv_id: Optional[str] = None
    max_restarts: Optional[int] = None


_VALUED = {"-n": "nprocs", "--np": "nprocs", "-np": "nprocs", "--hostfile": "hostfile",
           "-f": "hostfile", "--ppn": "ppn", "--iface": "iface", "--env": "env",
           "--mpi-args": "mpi_args", "--mpiexec": "mpiexec", "-m": "module",
           "--module": "module"}
# torchrun's options, in both of its spellings (--nproc-per-node and --nproc_per_node)
for _name in ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port",
              "rdzv_endpoint", "rdzv_backend", "rdzv_id", "max_restarts"):
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
        if colon and _positive_int(name, high, "nodes") != n:
            raise UsageError(f"argument {name}: {value} asks for an elastic number of nodes, "
                             "which is not supported; give one number")
        opts.nnodes = n
    elif key in ("node_rank", "max_restarts"):
        setattr(opts, key, _int_in(name, value, 0))
    elif key == "master_port":
        opts.master_port = _int_in(name, value, 0, 65535)
    elif key == "rdzv_endpoint":
        opts.rdzv_endpoint = _endpoint(name, value)
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
            from .cuda import device_count

            gpus = device_count()
            if gpus:
                return gpus
        return os.cpu_count() or 1
    if value == "gpu":
        from .cuda import device_count

        gpus = device_count()
        if not gpus:
            raise UsageError("argument --nproc-per-node: 'gpu' asks for one rank per GPU, and "
                             "no GPU is visible (CuPy missing or no CUDA device); give a number")
        return gpus
    return int(value)


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
    if opts.max_restarts:
        raise UsageError(f"argument --max-restarts: restarting failed ranks is not supported "
                         f"yet (got {opts.max_restarts}); use 0 (the default): a failing rank "
                         "ends the whole job with its traceback and a non-zero exit code")
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
    module = rest[:1] == ["-m"]
    return run_target(rest[1:] if module else rest, module=module)


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
        from .distributed.launch import _spawn_worker

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
        settings = _apply_torchrun_options(opts)
        mpiexec = find_mpiexec(opts.mpiexec)
        flavor = flavor_of(opts.mpiexec)
        rank_argv = [sys.executable, "-m", "mpitensor.run", "--_worker"]
        for name, value in settings.items():  # on the command line: it reaches every node
            rank_argv += ["--_env", f"{name}={value}"]
        rank_argv += ["-m", *opts.target] if opts.module else opts.target
        cmd = build_command(rank_argv, opts.nprocs, opts.hostfile, mpiexec, flavor, opts.iface,
                            opts.env, opts.tag_output, opts.ppn, opts.mpi_args)
    except (UsageError, HostfileError, FileNotFoundError, RuntimeError, ValueError) as exc:
        return _error(str(exc))
    if opts.dry_run:
        sys.stdout.write(cmd.shell() + "\n")
        return 0
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


if __name__ == "__main__":
    sys.exit(main())
