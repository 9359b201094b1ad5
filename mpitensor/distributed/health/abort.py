"""Abort the whole MPI job when any rank dies of an unhandled exception.

Without this, one rank that raises leaves the others waiting forever in their next collective.
:func:`install_abort_handler` chains ``sys.excepthook`` and ``threading.excepthook``: the
traceback is printed with every line prefixed ``[rank N] ``, stdout and stderr are flushed, and
``MPI.COMM_WORLD.Abort(1)`` ends every rank of the job at once (mpiexec exits non-zero).

``init_process_group`` installs it under ``mpiexec`` when the world has more than one rank
(opt out with ``init_process_group(..., abort_on_exception=False)`` or
``MPITENSOR_ABORT_ON_EXCEPTION=0``). Test runners such as pytest catch test exceptions
themselves, so the hook only fires for exceptions nothing caught (module level included).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from types import TracebackType
from typing import Any, Callable, Optional, Type

__all__ = ["install_abort_handler", "uninstall_abort_handler", "abort_handler_installed",
           "abort_job"]

_saved: "dict[str, Any]" = {}


def _rank() -> int:
    try:
        from mpi4py import MPI

        return MPI.COMM_WORLD.Get_rank()
    except Exception:  # MPI gone (finalized) or broken: still print something useful
        return -1


def prefixed(text: str, rank: Optional[int]) -> str:
    """``text`` with every line prefixed ``[rank N] `` (``[rank ?] `` where it is unknown)."""
    tag = f"[rank {rank if rank is not None else '?'}] "
    return "".join(tag + line + "\n" for line in text.rstrip("\n").splitlines())


def flush_streams() -> None:
    """Flush stdout and stderr, passing over a closed one."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not stop a report or an abort
            pass


def report_traceback(rank: Optional[int], exc_type: Type[BaseException], exc: BaseException,
                     tb: Optional[TracebackType], head: str = "") -> str:
    """Print ``head`` and the traceback on stderr, every line prefixed ``[rank N] ``, with
    stdout and stderr flushed before and after; return the traceback's text (unprefixed).

    The one printer of a rank's traceback: the abort handler's hooks and ``mpitensor-run``'s
    bootstrap (``launch.run_target``) both use it. Writing never raises.
    """
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    flush_streams()
    try:
        sys.stderr.write(prefixed(head + text, rank))
    except Exception:  # noqa: BLE001 - a closed stderr must not stop the abort
        pass
    flush_streams()
    return text


def _report(rank: int, exc_type: Type[BaseException], exc: BaseException,
            tb: Optional[TracebackType], thread: str = "") -> None:
    head = (f"unhandled exception in thread {thread!r}; aborting the MPI job\n" if thread
            else "unhandled exception; aborting the MPI job (MPI_Abort)\n")
    report_traceback(rank, exc_type, exc, tb, head)


_OUTPUT_GRACE_S = 0.2  # time for the launcher to forward what this rank has just printed
_DRAIN_TIMEOUT_S = 3.0  # at most this long for the launcher to read this rank's output pipes


def _unread_bytes(fd: int) -> int:
    """Bytes written to pipe ``fd`` that its reader has not read yet (0 if not a pipe)."""
    import fcntl
    import stat
    import struct
    import termios

    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return 0
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
    except (OSError, ValueError, struct.error):
        return 0


def _wait_output_read(timeout: float = _DRAIN_TIMEOUT_S) -> None:
    """Wait until the launcher has read what this rank wrote to stdout and stderr.

    Under mpiexec both are pipes to the launcher's proxy; on Linux ``FIONREAD`` on the write
    end tells how much of a pipe is still unread. An abort before the proxy has read the
    traceback can lose it (the proxy is killed with the job), and a fixed pause is not enough
    when the machine is loaded.
    """
    deadline = time.monotonic() + timeout
    while any(_unread_bytes(fd) for fd in (1, 2)) and time.monotonic() < deadline:
        time.sleep(0.005)


def abort_job(code: int = 1) -> None:
    """End the whole MPI job from this rank, after its last output has reached the launcher.

    Flushes stdout and stderr, waits until the launcher has read them (at most 3 s; see
    ``_wait_output_read``) and 0.2 s more for it to pass them on, then calls
    ``MPI_Abort(MPI_COMM_WORLD, code)``. Without the wait the launcher could end the job before
    forwarding the traceback just written (seen with hydra on two busy cores). This is what the
    abort handler calls; call it yourself after reporting an error that must stop every rank.

    Args:
        code: the exit code the launcher reports.

    Never returns while MPI is running; returns at once if it is not (not initialised, or
    finalised).

    Example:
        >>> import mpitensor.distributed as dist
        >>> dist.abort_job(3)  # doctest: +SKIP
    """
    flush_streams()
    try:
        from mpi4py import MPI

        running = MPI.Is_initialized() and not MPI.Is_finalized()
    except Exception:
        return
    if running:
        try:
            _wait_output_read()
            time.sleep(_OUTPUT_GRACE_S)  # and for the proxy to pass it on
            MPI.COMM_WORLD.Abort(code)
        finally:
            os._exit(code)  # MPICH's Abort may return after telling the launcher: stop here


def _excepthook(exc_type: Type[BaseException], exc: BaseException,
                tb: Optional[TracebackType]) -> None:
    _report(_rank(), exc_type, exc, tb)
    abort_job(1)
    # Abort returned (MPI not running): behave like the hook we replaced
    previous: Callable = _saved.get("sys", sys.__excepthook__)
    previous(exc_type, exc, tb)


def _thread_excepthook(args: Any) -> None:
    if args.exc_type is SystemExit:
        return  # threading ignores SystemExit silently; so do we
    name = args.thread.name if args.thread is not None else "?"
    _report(_rank(), args.exc_type, args.exc_value, args.exc_traceback, thread=name)
    abort_job(1)
    previous: Callable = _saved.get("threading", threading.__excepthook__)
    previous(args)


def install_abort_handler() -> None:
    """Make an unhandled exception on this rank abort the whole MPI job (idempotent).

    Chains the current ``sys.excepthook`` and ``threading.excepthook``.

    Example:
        >>> from mpitensor.distributed import install_abort_handler
        >>> install_abort_handler()    # init_process_group does this under mpiexec
    """
    if _saved:
        return
    _saved["sys"] = sys.excepthook
    _saved["threading"] = threading.excepthook
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook


def uninstall_abort_handler() -> None:
    """Restore the exception hooks that :func:`install_abort_handler` replaced.

    A hook someone installed on top of ours is left in place.
    """
    if not _saved:
        return
    if sys.excepthook is _excepthook:
        sys.excepthook = _saved["sys"]
    if threading.excepthook is _thread_excepthook:
        threading.excepthook = _saved["threading"]
    _saved.clear()


def abort_handler_installed() -> bool:
    """Return True while the abort handler is installed."""
    return bool(_saved)
