"""The rank side of a launch: what each rank runs around its script or spawned function.

:func:`run_target` runs a script or module as the rank's ``__main__`` (``mpitensor-run``);
:func:`_spawn_worker` imports and calls a spawned function (:func:`~.processes.start_processes`)
and leaves its result, its exit or its traceback in the job's directory for the parent. On an
unhandled exception either prints the traceback with every line prefixed ``[rank N]`` and calls
``MPI_Abort``, so the whole job ends at once instead of the other ranks waiting in their next
collective; a non-zero ``sys.exit`` that every rank reaches within a grace ends the job quietly.
"""

from __future__ import annotations

import importlib
import os
import pickle
import runpy
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

from ..._base import config as _config
from ..health.abort import flush_streams
from .rank_vars import _world_rank

__all__ = ["run_target", "exit_grace"]

# how fn is called on rank r of n: torch's fn(r, *args), or dist.spawn's fn(r, n, *args)
_INDEX, _RANK_AND_SIZE = "index", "rank_and_size"

# the launcher's own frames, dropped from the top of a rank's traceback
_HERE = os.path.dirname(os.path.abspath(__file__))


def _abort(code: int) -> None:
    """End the whole MPI job now with ``code``; the last resort is ``os._exit``."""
    flush_streams()
    try:
        from ..health.abort import abort_job

        abort_job(code)
    except BaseException:  # noqa: BLE001 - fall through to the hard exit
        pass
    os._exit(code)


def _user_frames(tb: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    """Drop the launcher's own frames (this package, runpy) from the top of a traceback."""
    start = tb
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if not (os.path.dirname(os.path.abspath(name)) == _HERE or "runpy" in name):
            return tb
        tb = tb.tb_next
    return start


def _report_exception(exc: BaseException, rank: Optional[int]) -> str:
    from ..health.abort import report_traceback

    return report_traceback(rank, type(exc), exc, _user_frames(exc.__traceback__))


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")  # sys.exit("message") prints the message and exits 1
    return 1


def run_target(target: Sequence[str], module: bool = False,
               on_end: Optional[Callable[[int, str], None]] = None) -> int:
    """Run a script or module as this rank's ``__main__``, aborting the job on failure.

    On an unhandled exception the traceback goes to stderr with each line prefixed
    ``[rank N]`` and ``MPI_Abort(MPI_COMM_WORLD, 1)`` ends every rank at once. ``sys.exit(0)`` or
    falling off the end returns 0; ``sys.exit(code)`` with a non-zero code returns that code when
    every rank exits non-zero within a grace of 2 s (``MPITENSOR_EXIT_GRACE``), and otherwise
    aborts the job with it, since the other ranks could wait for this one forever.

    Args:
        target: ``[script, *args]`` or, with ``module=True``, ``[module, *args]``.
        module: run ``target[0]`` as a module (``python -m``).
        on_end: called as ``on_end(code, how)`` just before this rank ends, with the exit
            code (0: a normal end) and ``"exit"`` or ``"raised <ExceptionName>"``; it must not
            raise (``mpitensor-run --max-restarts`` reports the ending to the launcher with it).

    Returns:
        0 when the target ended normally, or the exit code all ranks agreed on (a failure of
        one rank does not return).

    Example:
        >>> run_target(["train.py", "--epochs", "1"])  # doctest: +SKIP
        0
    """
    name, args = target[0], list(target[1:])
    _install_thread_abort()
    exit_comm = _exit_communicator()
    try:
        try:
            if module:
                sys.argv = [name, *args]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            else:
                sys.argv = [name, *args]
                sys.path.insert(0, os.path.dirname(os.path.abspath(name)))
                runpy.run_path(name, run_name="__main__")
        finally:
            flush_streams()
    except SystemExit as exc:
        code = _exit_code(exc.code)
        if code != 0:
            if on_end is not None:
                on_end(code, "exit")
            if _every_rank_exits(exit_comm):
                flush_streams()
                return code  # an agreed exit (argparse, checked errors): no abort, no noise
            rank = _rank_now()
            sys.stderr.write(f"[rank {rank}] exited with code {code}; ending the job\n")
            _abort(code)
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        if on_end is not None:
            on_end(1, f"raised {type(exc).__name__}")
        _report_exception(exc, _rank_now())
        _abort(1)
    if on_end is not None:
        on_end(0, "exit")
    return 0


def _exit_communicator() -> Any:
    """A private duplicate of the world on which exiting ranks meet (None without MPI)."""
    try:
        from mpi4py import MPI

        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            return MPI.COMM_WORLD.Dup()
    except Exception:  # noqa: BLE001 - without it every non-zero exit aborts, as before
        pass
    return None


def exit_grace(default: float = 2.0) -> float:
    """``MPITENSOR_EXIT_GRACE`` in seconds; a malformed value is reported (once, on stderr)
    and the default used: this runs while a rank exits, where raising would hide its own
    message."""
    try:
        return _config.exit_grace(default)
    except ValueError as exc:
        sys.stderr.write(f"mpitensor: {exc}; using {default:g} s\n")
        return default


def _every_rank_exits(comm: Any, grace: float = 2.0) -> bool:
    """True when every rank reaches a non-zero ``sys.exit`` within ``grace`` seconds.

    Then each rank exits with its own code and prints its own last line, instead of the first
    one to get there aborting the others mid-message.
    """
    if comm is None:
        return False
    request = comm.Ibarrier()
    deadline = time.monotonic() + exit_grace(grace)
    while time.monotonic() < deadline:
        if request.Test():
            return True
        time.sleep(0.002)
    return False


def _install_thread_abort() -> None:
    """Make an exception that kills a thread abort the job too (the main thread is ours)."""
    try:
        from ..health.abort import install_abort_handler
    except ImportError:  # pragma: no cover - an older tree without the handler
        return
    install_abort_handler()


def _rank_now() -> Optional[int]:
    rank = _world_rank()
    if rank is not None:
        return rank
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        try:
            if mpi.Is_initialized() and not mpi.Is_finalized():
                return mpi.COMM_WORLD.Get_rank()
        except Exception:  # noqa: BLE001
            pass
    return None


def _write_record(workdir: str, name: str, record: Any) -> None:
    tmp = Path(workdir) / f".{name}.tmp"
    tmp.write_bytes(pickle.dumps(record))
    os.replace(tmp, Path(workdir) / name)


def _load_main(desc: Dict[str, Any]) -> types.ModuleType:
    """Import the module that defines fn; a main script is loaded as ``__mp_main__``."""
    if desc["main_path"] is None:
        return importlib.import_module(desc["module"])
    path = desc["main_path"]
    mod = types.ModuleType("__mp_main__")
    mod.__file__ = path
    # pickles made in the parent say `__main__.Name`: both names must resolve to this module
    sys.modules["__mp_main__"] = sys.modules["__main__"] = mod
    code = compile(Path(path).read_bytes(), path, "exec")
    mod.__dict__["__builtins__"] = __builtins__
    exec(code, mod.__dict__)
    return mod


def _write_result(workdir: str, rank: int, result: Any, strict: bool) -> None:
    """Store fn's return value; torch ignores it, so where it cannot be pickled the torch-style
    spawn stores None instead of failing the rank."""
    try:
        _write_record(workdir, f"result.{rank}", result)
    except Exception:
        if strict:
            raise
        _write_record(workdir, f"result.{rank}", None)


def _spawn_worker(payload_path: str) -> int:
    """The rank side of :func:`start_processes` (``python -m mpitensor.run --_spawn PAYLOAD``)."""
    desc = pickle.loads(Path(payload_path).read_bytes())
    workdir = desc["workdir"]
    strict = desc.get("convention") == _RANK_AND_SIZE
    for entry in reversed(desc["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    rank: Optional[int] = _world_rank()
    if rank is not None:
        _write_record(workdir, f"pid.{rank}", os.getpid())
    _install_thread_abort()
    try:
        from mpi4py import MPI

        known = rank is not None
        rank = MPI.COMM_WORLD.Get_rank()
        size = MPI.COMM_WORLD.Get_size()
        if not known:
            _write_record(workdir, f"pid.{rank}", os.getpid())
        mod = _load_main(desc)
        fn: Any = mod
        for part in desc["qualname"].split("."):
            fn = getattr(fn, part)
        args = pickle.loads(desc["args"])
        result = fn(rank, size, *args) if strict else fn(rank, *args)
        _write_result(workdir, rank, result, strict)
    except SystemExit as exc:
        code = _exit_code(exc.code)
        if code != 0:
            _write_record(workdir, f"exit.{rank}", {"rank": rank, "code": code,
                                                     "pid": os.getpid(), "time": time.time()})
            sys.stderr.write(f"[rank {rank}] exited with code {code}; ending the job\n")
            _abort(code)
        _write_result(workdir, rank, None, strict)  # torch: sys.exit(0) ends a process cleanly
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        text = _report_exception(exc, rank)
        try:
            _write_record(workdir, f"error.{rank}", {
                "rank": rank, "type": type(exc).__name__, "message": str(exc),
                "traceback": text, "pid": os.getpid(), "time": time.time()})
        finally:
            _abort(1)
    return 0
