"""``mpitensor.multiprocessing``: torch.multiprocessing, with MPI ranks as the spawned processes.

Port a program by changing its imports::

    import mpitensor.distributed as dist
    import mpitensor.multiprocessing as mp

    def demo(rank, world_size):                 # a top-level def: the processes import it
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        ...

    if __name__ == "__main__":
        mp.spawn(demo, args=(4,), nprocs=4, join=True)

:func:`spawn` and :func:`start_processes` start the processes with ``mpiexec -n nprocs``: they
are one MPI job, process ``i`` is rank ``i``, and ``init_process_group`` in ``fn`` needs no
``MASTER_ADDR``/``MASTER_PORT`` rendezvous (setting them does no harm). ``fn(i, *args)`` is called
as in torch. Everything else is Python's :mod:`multiprocessing`, re-exported as torch does
(``Process``, ``Queue``, ``SimpleQueue``, ``Pool``, ``get_context``, ``set_start_method``, ...);
a process started with ``Process`` is a plain process, outside any MPI job.

Differences from torch: every spawned process is a fresh interpreter (as with
``start_method="spawn"``; other start methods are accepted with a warning), so ``fn`` must be
importable by module and name and ``args`` picklable, both checked before anything starts;
``nprocs < 1`` is a ``ValueError`` (torch starts nothing); ``timeout=`` bounds the whole job.

Tensors in shared memory (``Tensor.share_memory_``, ``Module.share_memory``) are shared with
``Process`` children, whatever their start method, and through ``Queue`` and ``Pipe``: several
processes can train one model (Hogwild!). See :mod:`mpitensor._core.shared`.
"""

from __future__ import annotations

import multiprocessing as _multiprocessing
import warnings
from multiprocessing import (
    Array,
    AuthenticationError,
    Barrier,
    BoundedSemaphore,
    BufferTooShort,
    Condition,
    Event,
    JoinableQueue,
    Lock,
    Manager,
    Pipe,
    Pool,
    Process,
    ProcessError,
    Queue,
    RawArray,
    RawValue,
    RLock,
    Semaphore,
    SimpleQueue,
    TimeoutError,  # noqa: A004 - multiprocessing's name, re-exported as torch does
    Value,
    active_children,
    cpu_count,
    current_process,
    freeze_support,
    get_all_start_methods,
    get_context,
    get_logger,
    get_start_method,
    log_to_stderr,
    parent_process,
    set_executable,
    set_forkserver_preload,
    set_start_method,
)
from typing import Any, Callable, Optional, Set, Tuple

from ._core import shared as _shared
from .distributed.launch import processes as _processes
from .distributed.launch import start_processes as _start_processes
from .distributed.launch.processes import *  # noqa: F403 - its classes; spawn and start_processes are torch's below
from .tensor import Tensor

__all__ = [
    *_processes.__all__,  # spawn, start_processes and the process classes
    "get_all_sharing_strategies", "get_sharing_strategy", "set_sharing_strategy",
    # Python's multiprocessing
    "Array", "AuthenticationError", "Barrier", "BoundedSemaphore", "BufferTooShort",
    "Condition", "Event", "JoinableQueue", "Lock", "Manager", "Pipe", "Pool", "Process",
    "ProcessError", "Queue", "RawArray", "RawValue", "RLock", "Semaphore", "SimpleQueue",
    "TimeoutError", "Value", "active_children", "cpu_count", "current_process",
    "freeze_support", "get_all_start_methods", "get_context", "get_logger", "get_start_method",
    "log_to_stderr", "parent_process", "set_executable", "set_forkserver_preload",
    "set_start_method",
]

# shared tensors cross Process, Queue and Pipe as shared memory
_shared.register_reductions(Tensor)

#: older torch's flag for multiprocessing contexts (always true on Python 3), which programs read
_supports_context = True

_SHARING_STRATEGIES = frozenset({"file_descriptor", "file_system"})
_sharing = {"strategy": "file_descriptor"}


def _warn_start_method(start_method: str) -> None:
    if start_method != "spawn" and start_method in _multiprocessing.get_all_start_methods():
        warnings.warn(f"start_method={start_method!r} is accepted but has no effect: the "
                      "processes are MPI ranks that mpiexec starts as fresh interpreters, as "
                      "with 'spawn' (fn is imported by name, globals set in the parent are not "
                      "inherited)", UserWarning, stacklevel=3)


def start_processes(fn: Callable[..., Any], args: Tuple[Any, ...] = (), nprocs: int = 1,
                    join: bool = True, daemon: bool = False, start_method: str = "spawn",
                    **options: Any) -> Optional[_processes.ProcessContext]:
    """Run ``fn(i, *args)`` for ``i`` in ``range(nprocs)``, process ``i`` being MPI rank ``i``.

    Args:
        fn: a top-level function of a module or of the main script, ``fn(i, *args)``.
        args: further arguments, pickled to every process.
        nprocs: number of processes (at least 1).
        join: wait for them (default) or return the :class:`ProcessContext` at once.
        daemon: kill the processes when this one exits; otherwise they are waited for at exit.
        start_method: ``"spawn"`` (default); ``"fork"``/``"forkserver"`` are accepted with a
            warning and act as ``"spawn"``.
        options: mpitensor's extensions, by keyword: ``timeout``, a hard limit in seconds
            for the whole job; ``mpiexec``, the MPI launcher to use (default: the one next to
            Python, else on ``PATH``).

    Returns:
        ``None`` with ``join=True``; the :class:`ProcessContext` otherwise.

    Raises:
        TypeError: ``fn`` is a lambda or nested function, ``args`` not a picklable tuple.
        ValueError: ``nprocs < 1`` or an unknown ``start_method``.
        ProcessRaisedException: a process raised (``error_index``, ``pid``, its traceback).
        ProcessExitedException: a process exited non-zero or was killed (``exit_code``,
            ``signal_name``).

    Example:
        >>> ctx = mp.start_processes(work, args=(10,), nprocs=2, join=False)  # doctest: +SKIP
        >>> while not ctx.join(): pass
    """
    _warn_start_method(start_method)
    return _start_processes(fn, args, nprocs, join, daemon, start_method, **options)


def spawn(fn: Callable[..., Any], args: Tuple[Any, ...] = (), nprocs: int = 1, join: bool = True,
          daemon: bool = False, start_method: str = "spawn",
          **options: Any) -> Optional[_processes.ProcessContext]:
    """Run ``fn(i, *args)`` on ``nprocs`` new MPI ranks, as ``torch.multiprocessing.spawn``.

    Arguments, return value and exceptions are :func:`start_processes`'s. When one process
    raises, its traceback is printed with every line prefixed ``[rank i]``, the others are ended
    at once (``MPI_Abort``), and :class:`ProcessRaisedException` is raised here.

    Example:
        >>> def work(rank, world_size):  # at the top level of the script
        ...     dist.init_process_group("gloo", rank=rank, world_size=world_size)
        ...     t = torch.ones(1); dist.all_reduce(t)
        >>> if __name__ == "__main__":
        ...     mp.spawn(work, args=(2,), nprocs=2)  # doctest: +SKIP
    """
    _warn_start_method(start_method)
    return _start_processes(fn, args, nprocs, join, daemon, start_method, **options)


def get_all_sharing_strategies() -> Set[str]:
    """The strategies :func:`set_sharing_strategy` accepts (torch's names)."""
    return set(_SHARING_STRATEGIES)


def get_sharing_strategy() -> str:
    """The strategy last set (default ``"file_descriptor"``)."""
    return _sharing["strategy"]


def set_sharing_strategy(new_strategy: str) -> None:
    """Set torch's sharing strategy, for programs that set it.

    Both strategies share the same way here: a tensor in shared memory (``share_memory_``,
    ``Module.share_memory``) crosses ``Process`` arguments, ``Queue`` and ``Pipe`` as a
    descriptor of its anonymous shared file (torch's ``file_descriptor``), which leaves nothing
    in ``/dev/shm`` when a process is killed, the reason programs pick ``file_system``. Other
    tensors are pickled with their data, as in torch.

    Raises:
        ValueError: ``new_strategy`` is not one of :func:`get_all_sharing_strategies`.
    """
    if new_strategy not in _SHARING_STRATEGIES:
        raise ValueError(f"set_sharing_strategy: {new_strategy!r} is not one of "
                         f"{sorted(_SHARING_STRATEGIES)}")
    _sharing["strategy"] = new_strategy
