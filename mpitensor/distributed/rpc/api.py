"""The public RPC calls: ``init_rpc``, ``shutdown``, ``rpc_sync``, ``rpc_async``, ``remote``.

``to`` is always a worker name, a worker id (its MPI rank) or a :class:`WorkerInfo`.
``timeout`` is seconds: -1 (the default) uses ``rpc_timeout`` given to ``init_rpc`` (60 s
unless set), 0 means no deadline.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from mpitensor.futures import Future

from ..._base import threads as _threads
from ...errors import DistributedTimeoutError
from . import _state, _wire
from ._agent import Agent, WorkerInfo
from ._rref import RRef, make_remote
from .constants import DEFAULT_SHUTDOWN_TIMEOUT, UNSET_RPC_TIMEOUT
from .errors import RpcNotInitializedError
from .options import BackendType, RpcBackendOptions, TensorPipeRpcBackendOptions

__all__ = ["init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info"]

logger = logging.getLogger("mpitensor.distributed.rpc")
_atexit_hooked = False
_INIT_TIMEOUT_S = 600.0  # how long init_rpc waits for every rank to make the call


def _checked_init_args(name: Any, backend: Any, rpc_backend_options: Any) -> Any:
    """``init_rpc``'s arguments checked before any traffic; returns the backend options."""
    if _state.agent is not None and _state.agent.running:
        raise RuntimeError("init_rpc: RPC is already initialized in this process; call "
                           "rpc.shutdown() before initializing it again")
    if not isinstance(name, str) or not name:
        raise TypeError(f"init_rpc: name must be a non-empty string, got {name!r}")
    if len(name) > 128 or not all(c.isalnum() or c in "_-:." for c in name):
        raise ValueError(f"init_rpc: worker name {name!r} must be at most 128 characters of "
                         "letters, digits, '_', '-', ':' or '.'")
    if backend is not None and not isinstance(backend, BackendType):
        raise TypeError(f"init_rpc: backend must be an rpc.BackendType (or None), got "
                        f"{backend!r}")
    opts = rpc_backend_options if rpc_backend_options is not None \
        else TensorPipeRpcBackendOptions()
    if not isinstance(opts, RpcBackendOptions):
        raise TypeError(f"init_rpc: rpc_backend_options must be a TensorPipeRpcBackendOptions, "
                        f"got {type(opts).__name__}")
    return opts


def _check_thread_level(MPI: Any) -> None:  # noqa: N803 - the mpi4py module
    """RPC serves requests on threads of its own: MPI must run at ``THREAD_MULTIPLE``."""
    level = MPI.Query_thread()
    if level < MPI.THREAD_MULTIPLE:
        names = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                 MPI.THREAD_SERIALIZED: "serialized"}
        raise RuntimeError(
            f"init_rpc: MPI was initialized with thread level '{names.get(level, level)}', "
            "but RPC serves requests on threads of its own and needs 'multiple'. mpi4py asks "
            "for 'multiple' unless told otherwise: remove the `mpi4py.rc.thread_level = ...` "
            "setting (or set it to 'multiple') before mpi4py.MPI is first imported")


def init_rpc(name: str, backend: Optional[BackendType] = None, rank: int = -1,
             world_size: Optional[int] = None,
             rpc_backend_options: Optional[RpcBackendOptions] = None) -> None:
    """Start this process's RPC agent; every rank of the MPI job must call it.

    Rank and world size come from MPI (``mpiexec -n N``), whether or not
    ``init_process_group`` was called; the names are exchanged among all ranks. Processes
    started without an MPI launcher (two commands, torchrun, ``multiprocessing``) pass
    ``rank`` and ``world_size`` and meet through ``rpc_backend_options.init_method``
    (``env://``, the default: ``MASTER_ADDR``/``MASTER_PORT``), as ``init_process_group``'s
    do; they then form one MPI job. As
    ``init_process_group`` does, it limits this rank's BLAS/OpenMP thread pools to its share
    of the node's cores (``MPITENSOR_NUM_THREADS``, the user's ``OMP_NUM_THREADS`` & co. and
    ``set_num_threads`` win; see ``mpitensor._base.threads``).

    Args:
        name: this worker's name, unique in the job (e.g. ``f"worker{rank}"``).
        backend: ``None`` or ``BackendType.TENSORPIPE`` (torch's name for the default
            backend: here, the MPI agent).
        rank, world_size: optional; if given they must equal MPI's rank and size.
        rpc_backend_options: ``TensorPipeRpcBackendOptions``; ``num_worker_threads`` (default
            16) and ``rpc_timeout`` (default 60 s; 0: none) are honoured.

    Raises:
        RuntimeError: RPC is already initialized here, or MPI runs below
            ``MPI_THREAD_MULTIPLE``.
        ValueError: ``rank``/``world_size`` contradict MPI, two ranks chose one name, or
            ``MPITENSOR_NUM_THREADS`` is malformed.
        DistributedTimeoutError: some rank did not call ``init_rpc`` within 600 s.

    Example:
        >>> import mpitensor.distributed.rpc as rpc
        >>> rpc.init_rpc(f"worker{rank}")       # under mpiexec -n 2: worker0, worker1
        >>> rpc.shutdown()
    """
    global _atexit_hooked
    opts = _checked_init_args(name, backend, rpc_backend_options)
    threads = getattr(opts, "num_worker_threads", 16)
    # processes started without an MPI launcher (by hand, torchrun, multiprocessing) meet
    # through init_method (MASTER_ADDR/MASTER_PORT for env://), as init_process_group's do
    from .. import _meet

    joined = _meet(getattr(opts, "init_method", None), None if rank == -1 else rank,
                   world_size, None, float(_INIT_TIMEOUT_S))
    from mpi4py import MPI

    _check_thread_level(MPI)
    comm = MPI.COMM_WORLD if joined is None else joined
    if joined is None:
        _check_rank(rank, world_size, comm.Get_rank(), comm.Get_size())
    _threads.parse_env(os.environ)  # a malformed MPITENSOR_NUM_THREADS fails before any traffic
    agent = Agent(name, threads, opts.rpc_timeout, comm, _INIT_TIMEOUT_S)
    try:
        # as init_process_group does (an RPC program may have no process group): each rank's
        # BLAS/OpenMP pools get its share of the node's cores. Left at one thread per core,
        # 3 ranks on 2 cores ran an RPC pipeline's steps 5-10x slower.
        from .. import _share_node

        _share_node(agent.comm, agent.rank, agent.size)
    except BaseException:
        agent.comm.Free()
        raise
    _state.agent = agent  # before it serves: a request may come before init_rpc returns here
    agent.start()
    if not _atexit_hooked:
        _atexit_hooked = True
        atexit.register(_at_exit)  # after mpi4py's own hook: runs while MPI is still up


def _check_rank(rank: Any, world_size: Any, mpi_rank: int, mpi_size: int) -> None:
    for what, given, actual in (("rank", rank, mpi_rank), ("world_size", world_size, mpi_size)):
        if given is None or (what == "rank" and given == -1):
            continue
        if isinstance(given, bool) or not isinstance(given, int) or given != actual:
            raise ValueError(
                f"init_rpc: {what}={given!r} contradicts MPI, which says {what} is {actual} "
                f"(rank {mpi_rank} of {mpi_size}); drop the argument (mpiexec sets it) or pass "
                f"{what}={actual}")


def shutdown(graceful: bool = True, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Stop this worker's agent.

    ``graceful=True`` (every worker must call it) first waits until every worker has called
    ``shutdown`` and no worker has work left: calls awaiting replies, requests being served,
    nested calls they make, RRef notices. ``graceful=False`` stops at once: this worker's
    pending calls fail, and the other workers' calls to it fail with ``PeerFailedError``.

    Args:
        graceful: wait for all outstanding work on every worker.
        timeout: seconds to wait for it (0: no bound); past it, ``DistributedTimeoutError``
            (and the agent stops as with ``graceful=False``).
    """
    agent = _state.agent
    if agent is None or not agent.running:
        raise RpcNotInitializedError("shutdown: RPC has not been initialized (or has already "
                                     "been shut down); call rpc.init_rpc(name) first")
    try:
        if graceful:
            try:
                agent.shutdown_graceful(float(timeout))
            except DistributedTimeoutError:
                agent.stop(leave=True)
                raise
        else:
            agent.stop(leave=True)
    finally:
        if not agent.running:
            _state.agent = None


def _at_exit() -> None:
    """A process leaving with its agent running tells the others (their calls fail fast)."""
    agent = _state.agent
    if agent is None or not agent.running:
        return
    try:
        from mpi4py import MPI

        if MPI.Is_finalized():
            return
        logger.warning("%s exits without rpc.shutdown(): leaving without waiting for the other "
                       "workers (call rpc.shutdown() at the end of the program)", agent.where)
        agent.stop(leave=True)
    except Exception:  # noqa: BLE001 - exiting anyway
        pass
    _state.agent = None


def get_worker_info(worker_name: Optional[str] = None) -> WorkerInfo:
    """The WorkerInfo of ``worker_name`` (default: this worker).

    Raises:
        UnknownWorkerError: no worker has that name.
    """
    agent = _state.current("get_worker_info")
    if worker_name is None:
        return agent.info(agent.rank)
    return agent.info(agent.resolve(worker_name, "get_worker_info"))


def _get_worker_infos() -> List[WorkerInfo]:
    """Every worker's WorkerInfo, by id."""
    return list(_state.current("_get_worker_infos").infos)


_NO_KWARGS: Dict[str, Any] = {}  # sent for a call without keyword arguments (never changed)


def _call_args(func: Any, args: Any, kwargs: Any, what: str) -> Tuple[tuple, dict]:
    if not callable(func):
        raise TypeError(f"{what}: func must be callable, got {type(func).__name__} {func!r}")
    if args is None:
        args = ()
    if kwargs is None:
        kwargs = {}
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"{what}: args must be a tuple (or list), got {type(args).__name__}")
    if not isinstance(kwargs, dict):
        raise TypeError(f"{what}: kwargs must be a dict, got {type(kwargs).__name__}")
    return tuple(args), kwargs


class _What:
    """A call's description for error messages, formatted only when one is written."""

    __slots__ = ("call", "to", "func")

    def __init__(self, call: str, to: Any, func: Any) -> None:
        self.call, self.to, self.func = call, to, func

    def __str__(self) -> str:
        f = self.func
        fname = getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or "func"
        return f"{self.call}(to={self.to!r}, {fname})"

    __repr__ = __str__


_what = _What


def rpc_async(to: Any, func: Callable, args: Optional[tuple] = None,
              kwargs: Optional[Dict[str, Any]] = None,
              timeout: float = UNSET_RPC_TIMEOUT) -> Future:
    """Run ``func(*args, **kwargs)`` on worker ``to``; return a Future of its result.

    ``func`` travels by reference (module and name: define it at module level), the arguments
    by pickle; NumPy arrays and tensors of 32 KiB or more travel as MPI messages of their own,
    never copied into the pickle.

    Raises (before anything is sent): ``UnknownWorkerError`` (unknown ``to``), ``TypeError``
    (an argument that cannot be pickled), ``PeerFailedError`` (``to`` has left).
    The future's ``wait()`` raises the remote exception (same type where possible, with the
    remote traceback in its message), ``DistributedTimeoutError`` past the deadline, or
    ``PeerFailedError`` if ``to`` leaves before replying.

    Example:
        >>> fut = rpc.rpc_async("worker1", torch.add, args=(torch.ones(2), 3))
        >>> fut.wait()
        tensor([4., 4.])
    """
    agent, dest, args, kwargs, what = _addressed("rpc_async", to, func, args, kwargs)
    return agent.call(dest, _wire.CALL, (func, args, kwargs), timeout, what)


def _addressed(name: str, to: Any, func: Callable, args: Optional[tuple],
               kwargs: Optional[Dict[str, Any]]) -> Tuple[Any, int, tuple, dict, Any]:
    """A call's agent, destination rank and checked arguments (and its description for
    messages), all before any traffic."""
    what = _what(name, to, func)
    agent = _state.current(what)
    args, kwargs = _call_args(func, args, kwargs, what)
    return agent, agent.resolve(to, what), args, kwargs, what


def rpc_sync(to: Any, func: Callable, args: Optional[tuple] = None,
             kwargs: Optional[Dict[str, Any]] = None,
             timeout: float = UNSET_RPC_TIMEOUT) -> Any:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result (blocking).

    Same arguments and errors as :func:`rpc_async`.

    Example:
        >>> rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 3))
        tensor([4., 4.])
    """
    what = _what("rpc_sync", to, func)
    agent = _state.agent
    if agent is None or not agent.running:
        agent = _state.current(what)
    if args.__class__ is tuple and kwargs is None and callable(func):
        kwargs = _NO_KWARGS  # (the common case: _call_args's checks, passed)
    else:
        args, kwargs = _call_args(func, args, kwargs, what)
    dest = agent.resolve(to, what)
    return agent.call_sync(dest, (func, args, kwargs), timeout, what)


def remote(to: Any, func: Callable, args: Optional[tuple] = None,
           kwargs: Optional[Dict[str, Any]] = None, timeout: float = UNSET_RPC_TIMEOUT) -> RRef:
    """Run ``func(*args, **kwargs)`` on worker ``to``, keep the result there; return an RRef.

    Returns at once. The value stays on ``to`` while any RRef to it exists anywhere.
    ``timeout`` bounds the creation (the owner's acknowledgement); a failed creation, or an
    exception raised by ``func``, is raised by ``to_here()``.

    Example:
        >>> rref = rpc.remote("worker1", torch.add, args=(torch.ones(2), 3))
        >>> rref.to_here()
        tensor([4., 4.])
    """
    agent, dest, args, kwargs, what = _addressed("remote", to, func, args, kwargs)
    return make_remote(agent, dest, func, args, kwargs, timeout, what)


def _set_rpc_timeout(rpc_timeout: float) -> None:
    """Set the default deadline of later calls (seconds; 0: none)."""
    agent = _state.current("_set_rpc_timeout")
    if not isinstance(rpc_timeout, (int, float)) or isinstance(rpc_timeout, bool) \
            or rpc_timeout < 0 or math.isnan(rpc_timeout):
        raise ValueError(f"rpc_timeout must be >= 0 seconds, got {rpc_timeout!r}")
    agent.rpc_timeout = float(rpc_timeout)


def _get_current_rpc_agent() -> Agent:
    """This process's agent (for tests and benchmarks)."""
    return _state.current("_get_current_rpc_agent")


