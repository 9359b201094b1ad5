"""``mpitensor.distributed.rpc``: torch.distributed.rpc's API on MPI.

Port an RPC program by changing its imports::

    import mpitensor as torch
    import mpitensor.distributed.rpc as rpc

    rpc.init_rpc(f"worker{rank}")            # rank from mpiexec; every rank calls it
    if rank == 0:
        rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 3))    # tensor([4., 4.])
    rpc.shutdown()                           # waits for every worker's outstanding work

Each process runs one agent on a private duplicate of ``MPI.COMM_WORLD``: a progress thread
moves the messages and a pool of ``num_worker_threads`` runs the requests. Arrays and tensors
travel as MPI messages of their own (pickle protocol 5, out of band), never copied into a
pickle. See docs/rpc.md for the design and how it differs from torch.
"""

from __future__ import annotations

from mpitensor.futures import Future, collect_all, wait_all

from . import functions
from ._agent import WorkerInfo
from ._rref import RRef
from ._wire import RemoteTraceback
from .api import (
    _get_current_rpc_agent,
    _get_worker_infos,
    _set_rpc_timeout,
    get_worker_info,
    init_rpc,
    remote,
    rpc_async,
    rpc_sync,
    shutdown,
)
from .constants import DEFAULT_RPC_TIMEOUT_SEC, UNSET_RPC_TIMEOUT
from .errors import RemoteError, RpcNotInitializedError, UnknownWorkerError
from .options import BackendType, RpcBackendOptions, TensorPipeRpcBackendOptions

__all__ = [
    "init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info", "WorkerInfo",
    "RRef", "Future", "collect_all", "wait_all", "functions", "BackendType",
    "RpcBackendOptions", "TensorPipeRpcBackendOptions", "is_available",
    "DEFAULT_RPC_TIMEOUT_SEC", "UNSET_RPC_TIMEOUT", "RemoteError", "RemoteTraceback",
    "UnknownWorkerError", "RpcNotInitializedError",
    "_get_current_rpc_agent", "_get_worker_infos", "_set_rpc_timeout",
]


def is_available() -> bool:
    """Return True: RPC runs on MPI, which mpitensor always has."""
    return True
