"""Running the job: waiting for ``mpiexec``, passing signals on, stopping it, restarting it.

:func:`_run_job` runs one ``mpiexec`` (or, with ``--max-restarts``, an :class:`_ElasticJob`
that starts every rank again after a failure, on the hosts that answer when ``--nnodes
MIN:MAX`` names a range: :func:`_host_pool`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from typing import Callable, List, Optional, Tuple

from ..distributed.launch import (
    build_command,
    parse_hostfile,
)
from ..distributed.launch.hostfile import HostEntry
from ..distributed.launch.hostpool import (
    JOIN_TIMEOUT_S,
    KEEP_ALIVE_INTERVAL_S,
    KEEP_ALIVE_MAX_ATTEMPT,
    HostPool,
    NotEnoughHosts,
)
from ..distributed.launch.job import Command, _kill_job
from ..distributed.launch.mpiexec import MPICH
from ..distributed.launch.processes import _DEATH_SIGNALS, _signal_name
from .options import Options
from .watch import _ATTEMPT_VAR, _WATCH_VAR, _RankWatch, _say

PROBE_TIMEOUT_S = 20.0  # a host that has not run `python -c ""` by then is taken as lost


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
            if code != 0 and keeper is not None and not lost and not self._pool.all_answer():
                # MPI may end the job itself once a host is gone (its ranks' peers see their
                # connections reset, and MPICH aborts, at times in a segfault of its own)
                # before the keep-alive asked often enough: a host that does not answer now
                # gets the keep-alive's window to be found lost, and the failure is its
                p = self._pool
                keeper.join(p.keep_alive_interval * (p.keep_alive_max_attempt + 1))
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
        if lost:
            return ((code if code >= 0 else 128 - code) or 1), lost[0]
        return self._diagnose(proc.returncode, watch)

    def _diagnose(self, code: int, watch: Optional[_RankWatch]) -> Tuple[int, str]:
        """The attempt's exit code, and which rank failed and how, in words.

        The code is that of the rank named, where it is known (it said so, or was found
        exiting with it): mpiexec's may be the SIGKILL it ended another rank with."""
        if code < 0:
            return 128 - code, f"mpiexec was killed by signal {_signal_name(-code)}"
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
                return rc, f"rank {rank}{of} {how} (exit code {rc})"
            return rc, f"rank {rank}{of} exited with code {rc}"
        if len(first) == 1:
            who = f"rank {first[0]}{of}"
        elif first:
            who = (f"one of ranks {', '.join(map(str, first))}{of} (they ended in the same "
                   "instant)")
        else:
            who = "a rank"
        if self._flavor == MPICH and code in _DEATH_SIGNALS:
            # hydra exits with the signal number of a rank a signal killed
            return code, f"{who} was killed by signal {_signal_name(code)} (exit code {code})"
        return code, f"{who} exited with code {code}"
