"""The parent side of spawning: :func:`start_processes` and :func:`spawn` start and watch ranks.

torch's ``multiprocessing`` spawning on MPI ranks: ``mpiexec -n N`` starts fresh interpreters
that run :func:`~.bootstrap._spawn_worker`; the parent holds a :class:`ProcessContext` (one
:class:`RankProcess` per rank), which watches the order in which ranks end, so that a failure
names the rank that took the job down, and turns what the ranks left behind into results or
a :class:`ProcessRaisedException` / :class:`ProcessExitedException`. The one implementation
behind :func:`mpitensor.multiprocessing.spawn` and :func:`mpitensor.distributed.spawn`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import pickle
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..._base import procfs
from ...errors import DistributedTimeoutError, MpiTensorError
from .bootstrap import _INDEX, _RANK_AND_SIZE
from .job import _JOB_ID_VAR, _job_env, _kill_group, _kill_job, build_command
from .mpiexec import MPICH, find_mpiexec, mpi_flavor

__all__ = ["start_processes", "spawn", "ProcessContext", "SpawnContext", "RankProcess",
           "ProcessException", "ProcessRaisedException", "ProcessExitedException"]

# the public path of the classes a user sees in a traceback or catches (as before the split)
_PUBLIC_MODULE = "mpitensor.distributed.launch"


class ProcessException(MpiTensorError):
    """A process started by :func:`start_processes` (or a ``spawn``) failed.

    Attributes:
        error_index: the failing process's index, which is its MPI rank (``None`` where it
            could not be told, e.g. several ranks vanished at once).
        rank: the same, under mpitensor's name.
        error_pid: that process's id (``None`` when unknown); also ``pid``.
    """

    def __init__(self, msg: str, error_index: Optional[int], error_pid: Optional[int]) -> None:
        super().__init__(msg)
        self._carry(msg=msg, error_index=error_index, rank=error_index, error_pid=error_pid,
                    pid=error_pid)

    def _extra(self) -> Tuple[Any, ...]:
        """A subclass's own constructor arguments, after the three above."""
        return ()

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return type(self), (self.msg, self.error_index, self.error_pid, *self._extra())


class ProcessRaisedException(ProcessException):
    """A rank raised; the message names the rank and holds its traceback.

    Attributes:
        error_index: the rank that raised (the earliest, where several did); also ``rank``.
        error_pid: its process id; also ``pid``.
        exc_type: the name of the exception class raised on that rank.
        traceback_text: the rank's formatted traceback.
    """

    def __init__(self, msg: str, error_index: Optional[int], error_pid: Optional[int],
                 exc_type: str = "", traceback_text: str = "") -> None:
        super().__init__(msg, error_index, error_pid)
        self.exc_type = exc_type
        self.traceback_text = traceback_text

    def _extra(self) -> Tuple[Any, ...]:
        return self.exc_type, self.traceback_text


class ProcessExitedException(ProcessException):
    """A rank ended with a non-zero exit code or a signal, without a Python exception.

    Attributes:
        error_index: the rank (``None`` where it cannot be told: a failure of ``mpiexec`` itself,
            or several ranks gone at the same instant); also ``rank``.
        error_pid: its process id, where known; also ``pid``.
        exit_code: the exit code; negative (``-signum``) for a rank killed by a signal, as
            :attr:`multiprocessing.Process.exitcode` and torch have it.
        signal_name: ``"SIGKILL"`` and the like for a rank killed by a signal, else ``None``.
    """

    def __init__(self, msg: str, error_index: Optional[int], error_pid: Optional[int],
                 exit_code: int, signal_name: Optional[str] = None) -> None:
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def _extra(self) -> Tuple[Any, ...]:
        return self.exit_code, self.signal_name


def _describe_callable(fn: Callable) -> Dict[str, Any]:
    """How a rank finds ``fn`` again: by module and qualified name, never by value."""
    if not callable(fn):
        raise TypeError(f"spawn: fn must be callable, got {type(fn).__name__}")
    if isinstance(fn, functools.partial):
        raise TypeError("spawn: fn must be a function defined at the top level of a module; "
                        "for a functools.partial, pass the bound values through args=")
    qualname = getattr(fn, "__qualname__", None)
    modname = getattr(fn, "__module__", None)
    if qualname is None or modname is None:
        raise TypeError(f"spawn: cannot locate {fn!r} by module and name; pass a function "
                        "defined with `def` at the top level of a module")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(f"spawn: fn {qualname!r} is a lambda or a nested function, which the "
                        "ranks (separate processes) cannot import; define it with `def` at the "
                        f"top level of module {modname!r}")
    desc: Dict[str, Any] = {"qualname": qualname, "module": modname, "main_path": None}
    if modname in ("__main__", "__mp_main__"):
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and getattr(spec, "name", None):
            desc["module"] = spec.name  # started as `python -m pkg.mod`
        else:
            path = getattr(main, "__file__", None)
            if not path:
                raise TypeError("spawn: fn is defined in an interactive session, which the "
                                "ranks cannot import; put it in a .py file")
            desc["main_path"] = os.path.abspath(path)
    obj: Any = sys.modules.get(modname) if desc["main_path"] is None else sys.modules["__main__"]
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is not fn and not (isinstance(fn, types.MethodType) and obj is not None):
        raise TypeError(f"spawn: {modname}.{qualname} does not name fn (it was redefined or "
                        "decorated); pass a function reachable by its module and name")
    return desc


class ProcessContext:
    """The ranks started by one :func:`start_processes` call, under one ``mpiexec``.

    torch's ``ProcessContext`` interface (``join(timeout)``, ``pids()``, ``processes``) on MPI
    ranks, plus :meth:`kill`, ``results`` and ``job_id``. ``spawn(..., join=False)`` returns one.

    Attributes:
        nprocs: the number of ranks.
        processes: one :class:`RankProcess` per rank, by rank.
        daemon: whether the job is killed when this process exits (else waited for).
        job_id: the value of ``MPITENSOR_JOB_ID`` in the environment of every process of the job.
        results: after a successful :meth:`join`, each rank's return value, by rank (``None``
            for a rank that left through ``sys.exit(0)`` or whose value could not be pickled).
    """

    def __init__(self, proc: subprocess.Popen, workdir: str, nprocs: int,
                 deadline: Optional[float], timeout: Optional[float], job_id: str,
                 daemon: bool = False, flavor: Optional[str] = None) -> None:
        self._proc = proc
        self.job_id = job_id
        self._workdir = workdir
        self.nprocs = nprocs
        self.daemon = daemon
        self._deadline = deadline
        self._timeout = timeout
        self._flavor = flavor
        self.results: Optional[List[Any]] = None
        self._finished = False
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._pid_of: Dict[int, int] = {}
        self._exitcodes: Dict[int, int] = {}
        # each rank's process start time (with its pid: a name no later process reuses) and
        # its wait status where the watch read one while the rank was exiting (``_look``)
        self._start: Dict[int, bytes] = {}
        self._status: Dict[int, int] = {}
        # ranks seen to end, in batches, earliest first, each with whether every rank was
        # watched when it was seen (else a rank not yet watched may have ended before it)
        self._ended: List[Tuple[List[int], bool]] = []
        self.processes = [RankProcess(self, r) for r in range(nprocs)]
        self._watcher = threading.Thread(target=self._watch, name=f"{job_id}-watch",
                                         daemon=True)
        self._watcher.start()
        atexit.register(self._at_exit)

    # ------------------------------------------------------------------ the ranks' processes

    def _read_pids(self) -> Dict[int, int]:
        """Ranks that registered since the last call, with their process ids."""
        new: Dict[int, int] = {}
        if len(self._pid_of) >= self.nprocs:
            return new
        for f in Path(self._workdir).glob("pid.*"):
            try:
                rank = int(f.name.split(".", 1)[1])
                if rank in self._pid_of:
                    continue
                pid = pickle.loads(f.read_bytes())
            except Exception:  # noqa: BLE001 - gone with the directory, or half-written
                continue
            with self._lock:
                if rank not in self._pid_of:
                    self._pid_of[rank] = new[rank] = pid
        return new

    def _watch(self) -> None:
        """Note the order in which ranks end, to name the one that took the job down."""
        use_fd = hasattr(os, "pidfd_open")
        fds: Dict[int, int] = {}  # pidfd -> rank
        polled: Dict[int, int] = {}  # rank -> pid, where there is no pidfd

        def register(ended: List[int]) -> None:
            """Watch the ranks registered since the last call; one already gone ends now."""
            for rank, pid in self._read_pids().items():
                start = procfs.start_time(pid)
                if start is not None:
                    self._start[rank] = start
                if not _alive(pid):
                    ended.append(rank)
                    continue
                if use_fd:
                    try:
                        fds[os.pidfd_open(pid)] = rank
                        continue
                    except ProcessLookupError:
                        ended.append(rank)
                        continue
                    except OSError:
                        pass
                polled[rank] = pid

        try:
            while self._proc.poll() is None and not self._finished:
                ended: List[int] = []
                register(ended)
                if fds:
                    # wakes the moment a rank ends, before mpiexec kills the others
                    ready, _, _ = select.select(list(fds), [], [], 0.05)
                    for fd in ready:
                        ended.append(fds.pop(fd))
                        os.close(fd)
                else:
                    time.sleep(0.02)
                for rank, pid in list(polled.items()):
                    if not _alive(pid):
                        ended.append(rank)
                        del polled[rank]
                if ended:
                    # a rank registered since the last turn may be gone already: when, is not
                    # known, so it joins this batch (which then names nobody rather than the
                    # wrong rank), and a rank not registered at all makes the order unknown
                    register(ended)
                    for rank in ended:
                        self._look(rank)
                    # exiting already, not yet seen to end: it may have begun first (a rank's
                    # status shows in /proc before its last thread is done), so it joins this
                    # look; _culprit then names one only if its code is its own
                    for fd, rank in list(fds.items()):
                        if self._look(rank):
                            ended.append(fds.pop(fd))
                            os.close(fd)
                    for rank in list(polled):
                        if self._look(rank):
                            ended.append(rank)
                            del polled[rank]
                    with self._lock:
                        self._ended.append((sorted(ended), len(self._pid_of) >= self.nprocs))
        except Exception:  # noqa: BLE001 - the watch only improves error messages
            pass
        finally:
            for fd in fds:
                os.close(fd)

    def _look(self, rank: int) -> bool:
        """Whether rank ``rank``'s process is ending with a non-zero wait status (exiting, or
        ended and not yet reaped), from the process table; that status is kept in
        ``_status``.

        A rank's pidfd wakes the watch only once its last thread is gone, and that may wait
        for a core: a rank that called ``os._exit(1)`` had already closed its descriptors,
        and mpiexec had SIGKILLed the other rank, whose pidfd woke first. The kernel sets the
        exit status before it closes the descriptors, so every rank is looked up when any
        ends: one found exiting (by itself or by a signal) ends in the same instant."""
        pid, start = self._pid_of.get(rank), self._start.get(rank)
        if pid is None or start is None:
            return False
        status = procfs.exit_status(pid, start)
        if not status:  # running (0), or reaped already (None)
            return False
        self._status[rank] = status
        return True

    def _own_code(self, rank: int) -> Optional[int]:
        """The non-zero code rank ``rank`` was seen exiting with by itself (not by a signal),
        else None."""
        return procfs.own_code(self._status.get(rank))

    def pids(self) -> List[Optional[int]]:
        """The ranks' process ids, by rank (waits until every rank has started or the job ended;
        ``None`` for a rank that never started)."""
        while (len(self._pid_of) < self.nprocs and not self._finished
               and self._proc.poll() is None):
            self._read_pids()
            time.sleep(0.01)
        self._read_pids()
        return [self._pid_of.get(r) for r in range(self.nprocs)]

    # ------------------------------------------------------------------ waiting and ending

    def join(self, timeout: Optional[float] = None, grace_period: Optional[float] = None) -> bool:
        """Wait for the job.

        Args:
            timeout: seconds to wait in this call (``None``: until the job ends or the hard
                timeout given to :func:`start_processes` passes).
            grace_period: accepted for torch's signature; a failing rank ends the others at once
                (``MPI_Abort``), so there is nothing to wait for.

        Returns:
            True when every rank has finished (``results`` is then set), False when ``timeout``
            passed first.

        Raises:
            ProcessRaisedException: a rank raised (raised again by later calls).
            ProcessExitedException: a rank exited with a non-zero code or was killed.
            DistributedTimeoutError: the hard timeout passed; the job was killed.
        """
        del grace_period
        if self._finished:
            if self._error is not None:
                raise self._error
            return True
        limit = timeout
        if self._deadline is not None:
            left = max(0.0, self._deadline - time.monotonic())
            limit = left if limit is None else min(limit, left)
        try:
            with _signals_raise():
                code = self._proc.wait(timeout=limit)
        except _Signalled as sig:
            self.kill()  # the ranks live in a session of their own: end them, remove files
            os.kill(os.getpid(), sig.signum)  # then die of the signal, as without us
            raise
        except subprocess.TimeoutExpired:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                self.kill()
                self._error = DistributedTimeoutError(
                    f"spawn: the {self.nprocs} rank(s) did not finish within the timeout of "
                    f"{self._timeout} s; the job was killed. Raise timeout= or look for a rank "
                    "waiting in a collective the others never entered")
                raise self._error from None
            return False
        except BaseException:
            self.kill()  # Ctrl-C in the parent: the ranks, in their own session, must go too
            raise
        self._watcher.join(timeout=2.0)
        try:
            self._collect(code)
        except ProcessException as exc:
            self._error = exc
            raise
        finally:
            self._finish()
        return True

    def kill(self) -> None:
        """Kill the whole job (``mpiexec`` and every rank) and remove its files."""
        if self._proc.poll() is None:
            _kill_group(self._proc)
        else:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _kill_job(self.job_id)  # ranks live in sessions of their own
        self._finish()

    def _finish(self) -> None:
        self._finished = True
        shutil.rmtree(self._workdir, ignore_errors=True)
        atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        """At interpreter exit, as :mod:`multiprocessing` does with its children: a daemonic
        job is killed, another one waited for; either way its files go."""
        if self._finished:
            return
        if self._proc.poll() is None and not self.daemon:
            left = None if self._deadline is None else max(0.0,
                                                           self._deadline - time.monotonic())
            try:
                self._proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                pass
        if self._proc.poll() is None:
            # at once and quietly (SIGTERM would have mpiexec report every rank's end)
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            _kill_job(self.job_id, wait=0)
        self._finish()

    # ------------------------------------------------------------------ outcome

    def _records(self) -> Dict[str, Dict[int, Any]]:
        out: Dict[str, Dict[int, Any]] = {"result": {}, "exit": {}, "error": {}}
        for kind, by_rank in out.items():
            for f in Path(self._workdir).glob(f"{kind}.*"):
                try:
                    by_rank[int(f.name.split(".", 1)[1])] = pickle.loads(f.read_bytes())
                except Exception:  # noqa: BLE001 - a half-written record: the abort cut it short
                    continue
        return out

    def _culprit(self, explained: set) -> Optional[int]:
        """The rank that ended first without saying why, if the watch saw it end alone while
        it watched every rank (else None: better no name than a wrong one)."""
        with self._lock:
            batches = [(list(b), complete) for b, complete in self._ended]
        for batch, complete in batches:
            silent = [r for r in batch if r not in explained]
            if len(silent) > 1:
                # one of them seen exiting with a code of its own: the others, dead by a
                # signal or reaped unseen, are taken for mpiexec's cleanup (it SIGKILLs every
                # rank the moment one ends unfinalized)
                own = [r for r in silent if self._own_code(r) is not None]
                silent = own if len(own) == 1 else silent
            if silent:
                return silent[0] if len(silent) == 1 and complete else None
        return None

    def _collect(self, code: int) -> None:
        recs = self._records()
        self._read_pids()
        for rank in recs["result"]:
            self._exitcodes[rank] = 0
        for rank, e in recs["exit"].items():
            self._exitcodes[rank] = e["code"]
        for rank in recs["error"]:
            self._exitcodes[rank] = 1
        n = self.nprocs
        if recs["error"]:
            errors = list(recs["error"].values())
            first = min(errors, key=lambda e: (e["time"], e["rank"]))
            also = sorted(e["rank"] for e in errors if e is not first)
            more = f" (rank(s) {also} raised too)" if also else ""
            pid = first.get("pid")
            raise ProcessRaisedException(
                f"rank {first['rank']} of {n} raised {first['type']}: {first['message']}{more}"
                f"\n\n-- traceback of rank {first['rank']} (pid {pid}):\n{first['traceback']}",
                first["rank"], pid, first["type"], first["traceback"])
        if recs["exit"]:
            first = min(recs["exit"].values(), key=lambda e: (e["time"], e["rank"]))
            raise ProcessExitedException(
                f"rank {first['rank']} of {n} exited with code {first['code']}",
                first["rank"], first.get("pid"), first["code"])
        if code != 0:
            explained = set(recs["result"])
            rank = self._culprit(explained)
            signal_name: Optional[str] = None
            exit_code = code
            if code < 0:
                signal_name = _signal_name(-code)  # mpiexec itself was killed
            elif self._flavor == MPICH and code in _DEATH_SIGNALS:
                # hydra exits with the signal number of a rank a signal killed
                signal_name, exit_code = _signal_name(code), -code
            own = self._own_code(rank) if rank is not None and code > 0 else None
            if own is not None:  # (mpiexec's code may be a cleanup SIGKILL's: its own is known)
                signal_name, exit_code = None, own
            who = (f"rank {rank} of {n}" if rank is not None and code > 0
                   else f"the MPI job of {n} rank(s)")
            how = (f"was killed by signal {signal_name}" if signal_name
                   else f"exited with code {exit_code}")
            if rank is not None and code > 0:
                self._exitcodes[rank] = exit_code
            raise ProcessExitedException(
                f"spawn: {who} {how} without a Python exception (see the MPI launcher's "
                "message above)", rank if code > 0 else None,
                self._pid_of.get(rank) if rank is not None else None, exit_code, signal_name)
        self.results = [recs["result"].get(r) for r in range(n)]
        for r in range(n):
            self._exitcodes.setdefault(r, 0)


#: torch's deprecated name for the same object.
SpawnContext = ProcessContext

for _cls in (ProcessException, ProcessRaisedException, ProcessExitedException):
    _cls.__module__ = _PUBLIC_MODULE

# exit codes of mpiexec (hydra) read as "a rank was killed by this signal": the signals that
# kill a process (crashes, the OOM killer, kill); low codes that programs exit with are not read
_DEATH_SIGNALS = frozenset(int(s) for s in (signal.SIGILL, signal.SIGABRT, signal.SIGBUS,
                                            signal.SIGFPE, signal.SIGKILL, signal.SIGSEGV,
                                            signal.SIGTERM))


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return True  # no /proc: kill(0) said it exists


class RankProcess:
    """One rank of a :class:`ProcessContext`, as a :class:`multiprocessing.Process` look-alike.

    ``mpiexec`` started the process, not this one, so only the parts that make sense for it are
    here: ``pid``, ``name``, ``daemon``, ``is_alive()``, ``exitcode``, ``join(timeout)``,
    ``terminate()``, ``kill()``. Ending one rank ends the job (MPI's launcher sees to that).
    """

    def __init__(self, ctx: ProcessContext, rank: int) -> None:
        self._ctx = ctx
        self.rank = rank
        self.name = f"rank-{rank}"
        self.daemon = ctx.daemon

    @property
    def pid(self) -> Optional[int]:
        """The process id (waits until the rank has started; ``None`` if it never did)."""
        if self.rank not in self._ctx._pid_of:
            self._ctx.pids()
        return self._ctx._pid_of.get(self.rank)

    def is_alive(self) -> bool:
        """True while the rank runs (or is still starting)."""
        if self._ctx._finished:
            return False
        self._ctx._read_pids()
        pid = self._ctx._pid_of.get(self.rank)
        if pid is None:
            return self._ctx._proc.poll() is None
        return _alive(pid)

    @property
    def exitcode(self) -> Optional[int]:
        """``None`` while the rank runs or before the job was joined; then 0 for a rank that
        returned, its code for ``sys.exit(code)``, 1 for an exception, ``-signum`` for a
        signal where one could be told, else the job's exit code."""
        if self.is_alive():
            return None
        if self.rank in self._ctx._exitcodes:
            return self._ctx._exitcodes[self.rank]
        return self._ctx._proc.returncode

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until the rank has ended, or ``timeout`` seconds passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.01)

    def terminate(self) -> None:
        """Send SIGTERM to the rank."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """Send SIGKILL to the rank."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        pid = self.pid
        if pid is not None and self.is_alive():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def __repr__(self) -> str:
        state = "alive" if self.is_alive() else f"exitcode={self.exitcode}"
        return f"<RankProcess {self.name} pid={self._ctx._pid_of.get(self.rank)} {state}>"


class _Signalled(BaseException):
    """SIGTERM or SIGHUP arrived while the parent waited for its spawned job."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While waiting for a spawned job, SIGTERM and SIGHUP raise :class:`_Signalled` (whose
    handler ends the ranks and removes their files, then re-raises the signal with its
    default action restored); SIGINT already raises KeyboardInterrupt. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Signalled(signum)

    # only where the signal would kill this process outright (a handler the program set, or
    # an ignored signal, keeps its meaning)
    sigs = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) == signal.SIG_DFL]
    previous = {s: signal.signal(s, handler) for s in sigs}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)



def _launch(fn: Callable[..., Any], args: Sequence[Any], nprocs: int, daemon: bool,
            start_method: str, timeout: Optional[float], mpiexec: Optional[str],
            convention: str) -> ProcessContext:
    """Check the arguments, start ``mpiexec -n nprocs`` on the spawn bootstrap, return the
    context (the one implementation behind every ``spawn`` and :func:`start_processes`)."""
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"spawn: nprocs must be a positive integer, got {nprocs!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"spawn: args must be a tuple, got {type(args).__name__}; for one "
                        "argument write args=(value,)")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"spawn: timeout must be a positive number of seconds, got {timeout!r}")
    if not isinstance(daemon, bool):
        raise TypeError(f"spawn: daemon must be True or False, got {daemon!r}")
    import multiprocessing

    if start_method not in multiprocessing.get_all_start_methods():
        raise ValueError(f"spawn: start_method must be one of "
                         f"{multiprocessing.get_all_start_methods()}, got {start_method!r}")
    desc = _describe_callable(fn)
    try:
        payload_args = pickle.dumps(tuple(args), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(f"spawn: args cannot be pickled for the ranks: {exc}") from exc
    launcher = find_mpiexec(mpiexec)
    flavor = mpi_flavor(launcher)
    workdir = tempfile.mkdtemp(prefix="mpitensor-spawn-")
    try:
        desc.update(args=payload_args, workdir=workdir, nprocs=nprocs, sys_path=list(sys.path),
                    convention=convention)
        (Path(workdir) / "payload").write_bytes(pickle.dumps(desc))
        cmd = build_command([sys.executable, "-m", "mpitensor.run", "--_spawn",
                             str(Path(workdir) / "payload")], nprocs, mpiexec=launcher,
                            flavor=flavor)
        job_id = os.path.basename(workdir)
        start = time.monotonic()
        proc = subprocess.Popen(cmd.argv, env=_job_env({**cmd.env, _JOB_ID_VAR: job_id}),
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return ProcessContext(proc, workdir, nprocs, None if timeout is None else start + timeout,
                          timeout, job_id, daemon, flavor)


def start_processes(
    fn: Callable[..., Any],
    args: Tuple[Any, ...] = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    *,
    timeout: Optional[float] = None,
    mpiexec: Optional[str] = None,
) -> Optional[ProcessContext]:
    """Run ``fn(i, *args)`` for ``i`` in ``range(nprocs)``, each in a new MPI rank ``i``.

    torch's ``torch.multiprocessing.start_processes`` on MPI: ``mpiexec -n nprocs`` starts the
    processes with this Python, so they form one MPI job and ``dist.init_process_group()`` in
    ``fn`` needs no rendezvous. Each process imports ``fn`` by module and name (a top-level
    ``def`` of a module or of the main script, whose ``if __name__ == "__main__":`` block does
    not run again) and unpickles ``args``. This is the one implementation behind
    :func:`mpitensor.multiprocessing.spawn` and :func:`mpitensor.distributed.spawn`.

    Args:
        fn: a function importable by module and name, called as ``fn(i, *args)``.
        args: further arguments, pickled to every process.
        nprocs: number of processes (at least 1).
        join: wait for them (default; returns ``None``) or return the :class:`ProcessContext`.
        daemon: kill the job when this process exits; otherwise it is waited for at exit.
        start_method: ``"spawn"``, ``"fork"`` or ``"forkserver"``, all accepted: every process
            is a fresh interpreter started by ``mpiexec``, as with ``"spawn"``.
        timeout: hard limit in seconds for the whole job (an mpitensor extension); past it
            every process is killed and ``DistributedTimeoutError`` raised.
        mpiexec: the launcher to use (default :func:`find_mpiexec`).

    Returns:
        ``None`` with ``join=True``; the :class:`ProcessContext` with ``join=False``.

    Raises:
        TypeError: ``fn`` is not importable by name (a lambda, a nested function), or ``args``
            is not a tuple or cannot be pickled.
        ValueError: ``nprocs`` is not a positive integer, or an unknown ``start_method``.
        ProcessRaisedException: a process raised; the message holds its traceback.
        ProcessExitedException: a process exited with a non-zero code or was killed.
        DistributedTimeoutError: ``timeout`` passed.

    Example:
        >>> def work(i, scale):  # at the top level of a module
        ...     print(i * scale)
        >>> start_processes(work, args=(10,), nprocs=2)  # doctest: +SKIP
        0
        10
    """
    ctx = _launch(fn, args, nprocs, daemon, start_method, timeout, mpiexec, _INDEX)
    if not join:
        return ctx
    ctx.join()
    return None


def spawn(
    fn: Callable[..., Any],
    nprocs: int = 1,
    args: Tuple[Any, ...] = (),
    join: bool = True,
    timeout: Optional[float] = None,
    *,
    mpiexec: Optional[str] = None,
) -> Any:
    """Run ``fn(rank, world_size, *args)`` on ``nprocs`` new MPI ranks; return their results.

    ``mpitensor.distributed.spawn``, the form mpitensor had before
    :mod:`mpitensor.multiprocessing`: a thin wrapper over :func:`start_processes` (the same
    launch, failures and timeout) that keeps its own calling convention: ``fn`` also receives
    the world size, the positional order is ``fn, nprocs, args``, and the ranks' return values
    come back. Code ported from torch should use :func:`mpitensor.multiprocessing.spawn`, which
    calls ``fn(rank, *args)`` as torch does.

    Args:
        fn: a function importable by module and name, ``fn(rank, world_size, *args)``.
        nprocs: number of ranks (at least 1).
        args: further arguments, pickled to every rank.
        join: wait for the ranks (default); ``False`` returns the :class:`ProcessContext`.
        timeout: hard limit in seconds for the whole job; past it every rank is killed and
            :class:`~mpitensor.errors.DistributedTimeoutError` raised.
        mpiexec: the launcher to use (default :func:`find_mpiexec`).

    Returns:
        With ``join=True``, the list of ``fn``'s return values by rank. With ``join=False``, a
        :class:`ProcessContext` (whose ``results`` holds them after ``join()``).

    Raises:
        TypeError: as :func:`start_processes`; also a tuple given as ``nprocs`` (torch's
            positional order).
        ValueError: ``nprocs`` is not a positive integer.
        ProcessRaisedException: a rank raised; the message names the rank and holds its
            traceback (every rank was ended by ``MPI_Abort``).
        ProcessExitedException: a rank exited with a non-zero code or was killed.
        DistributedTimeoutError: ``timeout`` passed.

    Example:
        >>> def work(rank, world_size, scale):  # at the top level of a module
        ...     dist.init_process_group("mpi")
        ...     t = torch.tensor([float(rank)]); dist.all_reduce(t)
        ...     return t.item() * scale
        >>> dist.spawn(work, 4, args=(10,))  # doctest: +SKIP
        [60.0, 60.0, 60.0, 60.0]
    """
    if isinstance(nprocs, (tuple, list)):
        raise TypeError("spawn: nprocs must be an int, got a tuple; the signature is "
                        "spawn(fn, nprocs, args=()) (torch's positional order is fn, args, "
                        "nprocs: pass nprocs= and args= by keyword, or use "
                        "mpitensor.multiprocessing.spawn)")
    ctx = _launch(fn, args, nprocs, False, "spawn", timeout, mpiexec, _RANK_AND_SIZE)
    if not join:
        return ctx
    ctx.join()
    return ctx.results
