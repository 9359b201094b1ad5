"""``RRef``: a reference to a value that lives on one worker (its owner).

An RRef is either the owner's own (``is_owner()``; made by ``RRef(value)``, or by
``remote()`` to this worker, or received back by the owner) or a *user* RRef on another
worker. Every user RRef is one *fork*, counted by the owner; the owner keeps the value while
any fork is counted or any owner RRef object is alive, and frees it when the last goes.

* ``remote()`` makes the creator's fork; the owner counts it when the request arrives.
* Pickling an RRef into an RPC message makes a new fork for the receiver and tells the owner
  (a fork notice, or a local count when the sender is the owner) before the message leaves.
  The receiver keeps the fork as a user RRef, or, if it is the owner, drops it at once for an
  owner RRef.
* Deleting a user RRef (garbage collection) queues a delete notice for the owner.

Notices travel on different links and so arrive in any order; the owner's per-fork counts
tolerate that (a count may dip below zero for a while), and a value is freed only when every
count is back to zero.
"""

from __future__ import annotations

import functools
from typing import Any, Generic, Optional, Tuple, TypeVar

from mpitensor.futures import Future

from ...errors import DistributedTimeoutError
from . import _state, _wire
from ._agent import Agent, WorkerInfo
from ._serving import OwnerEntry, _AsyncResult, is_async

__all__ = ["RRef"]

T = TypeVar("T")


class RRef(Generic[T]):
    """A remote reference (torch.distributed.rpc.RRef's API).

    ``RRef(value)`` wraps a local value in an owner RRef, to be passed to other workers.

    Example:
        >>> rref = rpc.remote("worker1", torch.add, args=(torch.ones(2), 3))
        >>> rref.to_here()
        tensor([4., 4.])
        >>> rref.rpc_sync().sum()          # runs value.sum() on worker1
        tensor(8.)
    """

    __slots__ = ("_agent", "_owner", "_id", "_fork", "_entry", "_created", "_confirmed",
                 "__weakref__")

    def __init__(self, value: T, type_hint: Any = None) -> None:
        del type_hint
        agent = _state.current("RRef(value)")
        entry = agent.owner_new()
        entry.future.set_result(value)
        _init_owner(self, agent, entry)

    # ---- identity
    def owner(self) -> WorkerInfo:
        """The WorkerInfo of the worker that holds the value."""
        return self._agent.info(self._owner)

    def owner_name(self) -> str:
        """The name of the worker that holds the value."""
        return self._agent.info(self._owner).name

    def is_owner(self) -> bool:
        """Whether this worker holds the value."""
        return self._entry is not None

    def confirmed_by_owner(self) -> bool:
        """Whether the owner has acknowledged this RRef (always True on the owner).

        For the creator of ``remote()`` it turns True when the owner has registered the value;
        an RRef received from another worker reports its sender's state at sending.
        """
        if self._entry is not None:
            return True
        if self._confirmed:
            return True
        c = self._created
        return c is not None and c.done() and c.exception() is None

    # ---- values
    def local_value(self) -> T:
        """The value itself (waits until it is computed); only on the owner.

        Raises:
            RuntimeError: called on a user RRef (use ``to_here()``), or the function that
                ``remote()`` ran raised (its exception).
        """
        if self._entry is None:
            raise RuntimeError(
                f"local_value() called on a user RRef owned by {self.owner()!r}; only the owner "
                "holds the value: call to_here() to copy it here")
        return self._entry.future.wait()

    def to_here(self, timeout: float = -1) -> T:
        """Copy the value to this worker (blocking); on the owner, return it.

        Args:
            timeout: seconds (-1: the default set by ``init_rpc``; 0: no deadline).

        Raises:
            DistributedTimeoutError: no answer within ``timeout``.
            the exception raised by the function ``remote()`` ran, with the remote traceback.
        """
        if self._entry is not None:
            fut = self._entry.future
            if not fut.done():
                agent = _state.current("RRef.to_here")
                seconds, _ = agent.deadline_of(timeout, "RRef.to_here")
                if not fut._wait_for(seconds):
                    raise DistributedTimeoutError(
                        f"to_here() on the owner {self.owner()!r}: the value was not computed "
                        f"within {seconds:g} s; pass a larger timeout (0: none)",
                        op="to_here", elapsed=seconds)
            return fut.wait()
        created = self._created
        if created is not None and created.done() and created.exception() is not None:
            raise created.exception()
        agent = _state.current("RRef.to_here")
        fut = agent.call(self._owner, _wire.FETCH, self._id, timeout,
                         f"to_here() of an RRef owned by {self.owner()!r}")
        return fut.wait()

    # ---- proxies
    def rpc_sync(self, timeout: float = -1) -> Any:
        """A proxy: ``rref.rpc_sync().f(*args)`` runs ``value.f(*args)`` on the owner and waits."""
        return _Proxy(self, "rpc_sync", timeout)

    def rpc_async(self, timeout: float = -1) -> Any:
        """A proxy: ``rref.rpc_async().f(*args)`` returns a Future of ``value.f(*args)``."""
        return _Proxy(self, "rpc_async", timeout)

    def remote(self, timeout: float = -1) -> Any:
        """A proxy: ``rref.remote().f(*args)`` returns an RRef (on the owner) to the result."""
        return _Proxy(self, "remote", timeout)

    # ---- lifetime
    def __reduce__(self) -> tuple:
        dest = _wire.pickling_for()
        if dest is None:
            raise RuntimeError("an RRef can only be pickled by RPC calls (as an argument or a "
                               "result of rpc_sync/rpc_async/remote); to save a value, save "
                               "rref.to_here()")
        agent = self._agent
        fork_id = agent.fork(self._owner, self._id)
        return (_rebuild, (self._owner, self._id, fork_id, self.confirmed_by_owner()))

    def __del__(self) -> None:
        try:
            if self._entry is None and self._fork is not None:
                self._agent.drop_fork(self._owner, self._id, self._fork)
        except Exception:  # noqa: BLE001 - interpreter exit: nothing left to tell
            pass

    def __repr__(self) -> str:
        kind = "OwnerRRef" if self._entry is not None else "UserRRef"
        fork = "" if self._fork is None else f", ForkId = {self._fork}"
        return f"{kind}(RRefId = {self._id}{fork}, owner = {self.owner()!r})"


def _init_owner(r: RRef, agent: Agent, entry: OwnerEntry) -> None:
    r._agent, r._owner, r._id, r._fork = agent, agent.rank, entry.id, None
    r._entry, r._created, r._confirmed = entry, None, True


def owner_rref(agent: Agent, entry: OwnerEntry) -> RRef:
    r = RRef.__new__(RRef)
    _init_owner(r, agent, entry)
    return r


def user_rref(agent: Agent, owner: int, rref_id: Tuple[int, int], fork_id: Tuple[int, int],
              created: Optional[Future], confirmed: bool) -> RRef:
    r = RRef.__new__(RRef)
    r._agent, r._owner, r._id, r._fork = agent, owner, rref_id, fork_id
    r._entry, r._created, r._confirmed = None, created, confirmed
    return r


def _rebuild(owner: int, rref_id: Tuple[int, int], fork_id: Tuple[int, int],
             confirmed: bool) -> RRef:
    agent = _state.current("unpickling an RRef")
    if owner == agent.rank:
        entry = agent.owner_get(rref_id)
        r = owner_rref(agent, entry)
        agent.drop_fork(owner, rref_id, fork_id)  # the owner RRef object holds it from now
        return r
    return user_rref(agent, owner, rref_id, fork_id, None, confirmed)


class _Proxy:
    """``rref.rpc_sync()`` & co: attribute access builds a call of that method on the owner."""

    __slots__ = ("_rref", "_how", "_timeout")

    def __init__(self, rref: RRef, how: str, timeout: float) -> None:
        self._rref, self._how, self._timeout = rref, how, timeout

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return functools.partial(_call_proxy, self._rref, self._how, self._timeout, name)

    def __repr__(self) -> str:
        return f"<RRef {self._how}() proxy of {self._rref!r}>"


def _call_proxy(rref: RRef, how: str, timeout: float, name: str, *args: Any,
                **kwargs: Any) -> Any:
    what = f"RRef.{how}().{name} on {rref.owner()!r}"
    agent = _state.current(what)
    fargs = (rref, name, args, kwargs)
    if how == "remote":
        return make_remote(agent, rref._owner, _invoke_rref_method, fargs, {}, timeout, what)
    fut = agent.call(rref._owner, _wire.CALL, (_invoke_rref_method, fargs, {}), timeout, what)
    return fut.wait() if how == "rpc_sync" else fut


def make_remote(agent: Agent, dest: int, func: Any, args: tuple, kwargs: dict, timeout: Any,
                what: Any) -> RRef:
    """``remote()`` once its arguments are checked: the RRef, the request on its way."""
    if dest == agent.rank:
        entry = agent.owner_new()
        agent.remote_self(entry, (func, args, kwargs), what)
        return owner_rref(agent, entry)
    reqid = next(agent.reqids)
    created = agent.call(dest, _wire.REMOTE, (func, args, kwargs), timeout, what, reqid=reqid)
    return user_rref(agent, dest, (agent.rank, reqid), (agent.rank, reqid), created, False)


def _invoke_rref_method(rref: RRef, name: str, args: tuple, kwargs: dict) -> Any:
    """Runs on the owner: ``value.name(*args, **kwargs)`` (async_execution methods too)."""
    method = getattr(rref.local_value(), name)
    result = method(*args, **kwargs)
    if is_async(method):
        return _AsyncResult(result)
    return result
