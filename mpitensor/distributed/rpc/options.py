"""Backend choices and options of ``init_rpc``, with torch's names.

There is one backend, the MPI agent; ``BackendType.TENSORPIPE`` (torch's default) names it,
so programs that pass it run unchanged. Of the options, ``num_worker_threads``,
``rpc_timeout`` and ``init_method`` are honoured (the last where no MPI launcher started the
processes: they meet through it); ``device_maps``, ``devices`` and the transport and channel
lists are accepted and unused (arrays travel through host memory).
"""

from __future__ import annotations

import enum
from typing import Any, Dict, List, Optional

from .constants import DEFAULT_INIT_METHOD, DEFAULT_NUM_WORKER_THREADS, DEFAULT_RPC_TIMEOUT_SEC

__all__ = ["BackendType", "RpcBackendOptions", "TensorPipeRpcBackendOptions"]


class BackendType(enum.Enum):
    """RPC backends. ``TENSORPIPE`` (torch's name, kept for portability) is the MPI agent."""

    TENSORPIPE = "TENSORPIPE"
    MPI = "MPI"


class RpcBackendOptions:
    """Options every backend takes: ``rpc_timeout`` (seconds, 0: none) and ``init_method``."""

    def __init__(self, rpc_timeout: float = DEFAULT_RPC_TIMEOUT_SEC,
                 init_method: str = DEFAULT_INIT_METHOD) -> None:
        self.rpc_timeout = _check_timeout(rpc_timeout)
        self.init_method = init_method


class TensorPipeRpcBackendOptions(RpcBackendOptions):
    """torch's TensorPipe options, accepted by the MPI agent.

    Args:
        num_worker_threads: threads that run incoming requests (default 16, as torch).
        rpc_timeout: default deadline of every call in seconds (default 60; 0: no deadline).
        init_method: where processes started without an MPI launcher meet (default
            ``env://``: ``MASTER_ADDR``/``MASTER_PORT``); unused under ``mpiexec``.
        device_maps, devices: accepted, unused.

    Example:
        >>> opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=4, rpc_timeout=20)
        >>> rpc.init_rpc("worker0", rank=0, world_size=2, rpc_backend_options=opts)
    """

    def __init__(self, *, num_worker_threads: int = DEFAULT_NUM_WORKER_THREADS,
                 rpc_timeout: float = DEFAULT_RPC_TIMEOUT_SEC,
                 init_method: str = DEFAULT_INIT_METHOD,
                 device_maps: Optional[Dict[str, Any]] = None,
                 devices: Optional[List[Any]] = None,
                 _transports: Optional[List[str]] = None,
                 _channels: Optional[List[str]] = None) -> None:
        super().__init__(rpc_timeout, init_method)
        if (isinstance(num_worker_threads, bool) or not isinstance(num_worker_threads, int)
                or num_worker_threads < 1):
            raise ValueError(f"num_worker_threads must be a positive integer, got "
                             f"{num_worker_threads!r}")
        self.num_worker_threads = num_worker_threads
        self.device_maps: Dict[str, Any] = dict(device_maps or {})
        self.devices: List[Any] = list(devices or [])

    def set_device_map(self, to: str, device_map: Dict[Any, Any]) -> None:
        """Accepted for portability and recorded; arrays travel through host memory."""
        self.device_maps.setdefault(to, {}).update(device_map)

    def set_devices(self, devices: List[Any]) -> None:
        """Accepted for portability and recorded."""
        self.devices = list(devices)


def _check_timeout(seconds: Any) -> float:
    if hasattr(seconds, "total_seconds"):
        seconds = seconds.total_seconds()
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise ValueError(f"rpc_timeout must be a number of seconds >= 0 (0: no deadline), got "
                         f"{seconds!r}")
    return float(seconds)
