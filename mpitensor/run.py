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

Bad input (an unknown option, ``-n 0``, a missing script, a missing or malformed hostfile) is
reported in one line on stderr with exit code 2, before anything is launched.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from .distributed.launch import (
    MPICH,
    OPENMPI,
    HostfileError,
    build_command,
    find_mpiexec,
    launcher_option_values,
    mpi_flavor,
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
  -m MODULE             run a module as the program (like python -m)

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


_VALUED = {"-n": "nprocs", "--np": "nprocs", "-np": "nprocs", "--hostfile": "hostfile",
           "-f": "hostfile", "--ppn": "ppn", "--iface": "iface", "--env": "env",
           "--mpi-args": "mpi_args", "--mpiexec": "mpiexec", "-m": "module"}
_FLAGS = {"--tag-output": "tag_output", "--dry-run": "dry_run"}


def _positive_int(option: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise UsageError(f"argument {option}: invalid int value: {value!r}") from None
    if n < 1:
        raise UsageError(f"argument {option}: must be a positive number of ranks, got {n}")
    return n


_FLAVOR_NAMES = {MPICH: "MPICH", OPENMPI: "Open MPI"}


def _store(opts: Options, key: str, name: str, value: str) -> None:
    """Record the value of one of mpitensor-run's own options."""
    if key in ("nprocs", "ppn"):
        setattr(opts, key, _positive_int(name, value))
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
        module = args[1:2] == ["-m"]
        return run_target(args[2:] if module else args[1:], module=module)
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
        mpiexec = find_mpiexec(opts.mpiexec)
        flavor = flavor_of(opts.mpiexec)
        rank_argv = [sys.executable, "-m", "mpitensor.run", "--_worker"]
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
