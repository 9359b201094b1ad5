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

The launcher in parts: :mod:`.options` (the command line, torchrun's options), this module
(``main`` and the bootstrap each rank runs), :mod:`.supervise` (running, stopping and
restarting the job) and :mod:`.watch` (each rank's report of how it ended, to the launcher).
"""

from __future__ import annotations

import os
import secrets
import sys
import uuid
from typing import Dict, Optional, Sequence

from .._base import config as _config
from ..distributed.launch import (
    HostfileError,
    build_command,
    find_mpiexec,
    mpi_flavor,
    rank_env,
    run_target,
)
from ..distributed.launch.job import Command
from .options import (
    PROG,
    UsageError,
    _apply_torchrun_options,
    _explicit_mpiexec,
    parse_args,
)
from .supervise import _host_pool, _run_job
from .watch import _WATCH_VAR, _WatchLink

__all__ = ["main"]

# (a rank's bootstrap, under torch's older launcher) give the script --local-rank=N
_LOCAL_RANK_ARG = "--_local-rank-arg"


def _worker(args: Sequence[str]) -> int:
    """The bootstrap each rank runs: torchrun's variables first, then the target."""
    settings: Dict[str, str] = {}
    rest = list(args)
    local_rank_arg = rest[:1] == [_LOCAL_RANK_ARG]
    rest = rest[local_rank_arg:]
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
    target = rest[1:] if module else rest
    if local_rank_arg:  # torch's older launcher: the first argument after the script
        target.insert(1, f"--local-rank={os.environ['LOCAL_RANK']}")
    return run_target(target, module=module, on_end=link.ended if link is not None else None)


def _error(msg: str) -> int:
    sys.stderr.write(f"{PROG}: error: {msg}\n")
    return 2


def _set_job_identity() -> None:
    """The job's secret and id, in the environment its processes inherit, where not set."""
    if _config.raw(_config.ENV_SECRET) is None:  # set but empty: the user's "no secret"
        # the job's stores then accept only its own processes (docs/launching.md); through the
        # environment, never the command line, where `ps` would show it to every user
        os.environ[_config.ENV_SECRET] = secrets.token_hex(32)
    # one identity for the whole job (kept where one is set: a scheduler's, a test's): a
    # rendezvous its processes hold refuses processes of another job (docs/launching.md)
    if _config.raw(_config.ENV_JOB_ID) is None:
        os.environ[_config.ENV_JOB_ID] = f"mpitensor-run-{uuid.uuid4().hex}"


def main(argv: Optional[Sequence[str]] = None, legacy: bool = False) -> int:
    """Entry point of ``mpitensor-run`` and ``python -m mpitensor.run``.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).
        legacy: the command line of ``python -m mpitensor.distributed.launch``: torch's older
            launcher, whose script gets ``--local-rank=N`` unless ``--use-env`` is given.

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
        from ..distributed.launch.bootstrap import _spawn_worker

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
        opts = parse_args(args, lambda: flavor_of(guess), legacy)
        if opts.mpiexec != guess:
            explicit = opts.mpiexec
            opts = parse_args(args, lambda: flavor_of(explicit), legacy)
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
            rank_argv += [] if opts.use_env else [_LOCAL_RANK_ARG]
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
    _set_job_identity()
    try:
        return _run_job(command, opts, flavor, pool)
    finally:
        if pool is not None:
            pool.close()
