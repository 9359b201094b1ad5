"""``init_process_group(world_size=k, rank=r)`` called by k processes of a larger job.

A job of N processes (one ``mpiexec -n N``, ``mpitensor.multiprocessing.spawn``, or N
separately started processes that met in ``rpc.init_rpc``) may give its default process group
to only k < N of them: torch's RPC + DDP programs run RPC over all N and DDP over the k
trainers, which call ``init_process_group(world_size=k, rank=r, init_method=...)`` at an
address of their own. Here those k meet through that address's Store as separately started
processes do (:mod:`.rendezvous`: every rank claimed once, everyone naming the same
``world_size``, a timeout naming who did not come), post their rank in the job's
communicator, and build their group with ``MPI_Comm_create_group``, which only the k members
call: the other N - k processes take no part, and RPC (on its own duplicate of the job's
communicator) goes on over all N.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

from .._store import PrefixStore
from . import launcher_rank
from . import rendezvous as _rendezvous

__all__ = ["parent_comm", "within"]

_PREFIX = "mpitensor/subjob"
_TAG = 0x5AB  # MPI_Comm_create_group's tag: the same on every member


def parent_comm() -> Any:
    """The communicator of the job this process belongs to, or ``None`` when it is a job of
    its own: MPI's world under a launcher (or after a PMI rendezvous), else the communicator
    an earlier rendezvous (``init_rpc`` of separately started processes) made."""
    mpi = sys.modules.get("mpi4py.MPI")
    if launcher_rank(None) is not None:
        from mpi4py import MPI

        return MPI.COMM_WORLD
    if mpi is not None and mpi.Is_initialized() and mpi.COMM_WORLD.Get_size() > 1:
        return mpi.COMM_WORLD
    return _rendezvous._joined.get("comm")


def _given_size(init_method: Any, world_size: Any) -> Optional[int]:
    """``world_size`` as the caller gave it (argument, else ``?world_size=`` in the URL);
    the environment's ``WORLD_SIZE`` does not count: a launcher sets it to the whole job's."""
    n = _rendezvous._given_int(world_size)
    if n is None and isinstance(init_method, str) and "world_size=" in init_method:
        import urllib.parse

        query = urllib.parse.parse_qs(urllib.parse.urlsplit(init_method).query)
        if "world_size" in query:
            n = _rendezvous._from_text(query["world_size"][-1], "world_size",
                                       f"init_method {init_method!r}")
    return n


def within(init_method: Any, rank: Any, world_size: Any, store: Any,
           seconds: float) -> Optional[Any]:
    """The communicator of a group of ``world_size`` processes inside this process's job, or
    ``None`` when this is not such a call (no job of several, or ``world_size`` not below the
    job's size: the caller then checks the arguments against the job as before).

    Collective over the ``world_size`` processes that call it with ranks ``0..k-1``.

    Raises:
        ValueError: a missing or malformed rank or address, a rank outside ``0..k-1``, two
            processes claiming one rank, or processes naming different world sizes.
        StoreTimeoutError: not all ``k`` processes came within ``seconds`` (the message
            names the ranks that came and those that did not).
        DistNetworkError: rank 0 cannot serve the address (port taken), or a rank cannot
            reach it.
    """
    n = _given_size(init_method, world_size)
    if n is None:
        return None
    parent = parent_comm()
    if parent is None or n >= parent.Get_size():
        return None
    if n == 1:
        if rank not in (None, -1, 0) or isinstance(rank, bool):
            raise ValueError(f"init_process_group: rank={rank!r} is out of range for "
                             "world_size=1; the only rank is 0")
        from mpi4py import MPI

        return MPI.COMM_SELF  # a group of its own: nobody to meet
    p = _rendezvous.plan(init_method, rank, n, store)
    assert p is not None  # n >= 2
    deadline = time.monotonic() + seconds
    raw, owned = _rendezvous._open_store(p, seconds)
    s = PrefixStore(_PREFIX, raw)
    try:
        # each rank's place in the job rides in its claim: read from the claims that took,
        # it is never a second claimer's
        claims, _ = _rendezvous._arrive(s, p, seconds, deadline,
                                        extra={"member": parent.Get_rank()})
        members = [int(c["member"]) for c in claims]
        group = parent.Get_group().Incl(members)
        try:
            comm = parent.Create_group(group, _TAG)
        finally:
            group.Free()
        comm.Barrier()  # every member holds the group: nobody needs the store past this
    except BaseException as exc:
        if not getattr(exc, "foreign", False) and not _rendezvous._has_error(s):
            kind = "ValueError" if isinstance(exc, ValueError) else (
                "timeout" if isinstance(exc, _rendezvous.StoreTimeoutError) else "error")
            _rendezvous._post_error(s, p, kind, str(exc) if kind != "error" else
                                    f"init_process_group: rank {p.rank} failed while the "
                                    f"group met at {p.where}: {type(exc).__name__}: {exc}")
        if owned and p.rank == 0:
            time.sleep(2 * _rendezvous._POLL_S)  # the others read the error from this store
        raise
    finally:
        if owned:
            raw.close()
    return comm
