"""Defaults shared by the RPC API (torch.distributed.rpc.constants' names)."""

from __future__ import annotations

from datetime import timedelta

DEFAULT_RPC_TIMEOUT_SEC: float = 60.0  # a call's deadline unless its timeout says otherwise
UNSET_RPC_TIMEOUT: float = -1.0  # "use the agent's rpc_timeout"
DEFAULT_INIT_METHOD: str = "env://"  # accepted and unused: mpiexec did the rendezvous
DEFAULT_NUM_WORKER_THREADS: int = 16
DEFAULT_SHUTDOWN_TIMEOUT: float = 0.0  # graceful shutdown waits for every worker: no bound
DEFAULT_PROCESS_GROUP_TIMEOUT: timedelta = timedelta(milliseconds=DEFAULT_RPC_TIMEOUT_SEC * 1000)
