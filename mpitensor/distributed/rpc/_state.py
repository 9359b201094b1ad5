"""The agent of this process (the one piece of global state of the RPC package)."""

from __future__ import annotations

from typing import Any, Optional

from .errors import RpcNotInitializedError

agent: Optional[Any] = None  # the running _agent.Agent, set by init_rpc, cleared by shutdown


def current(what: str) -> Any:
    """The running agent, or a clear error naming the call that needed it."""
    a = agent
    if a is None or not a.running:
        raise RpcNotInitializedError(
            f"{what}: RPC has not been initialized (or has been shut down); call "
            "rpc.init_rpc(name) on every worker first")
    return a
