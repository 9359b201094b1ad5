"""Processes no MPI launcher started meet through a Store and become one MPI world.

``init_process_group(backend, init_method=..., rank=r, world_size=n)`` in a process started by
``multiprocessing``, by hand in several shells, or by a scheduler: the processes find each
other through a :class:`~._store.Store` (``env://`` and ``tcp://host:port``: a
:class:`~._store.TCPStore` served by rank 0; ``file:///path``: a
:class:`~._store.FileStore`; or the ``store=`` given), agree on the world (every rank claims
its number once, all name the same ``world_size``), and are then joined into one MPI
communicator whose rank is the ``rank`` each passed:

* **pmi** (the default, when MPI is not yet initialized in any of them): rank 0 starts a
  small PMI-1 server (:mod:`.pmi`) and every rank calls ``MPI_Init`` against it, as ranks
  started by ``mpiexec`` do against hydra. The result is a real ``MPI_COMM_WORLD`` of ``n``
  ranks, with shared memory between the ranks of a host; ``MPI_Abort`` and a rank that dies
  end every rank, as under ``mpiexec``. Works with MPICH 4.x and 5.x (measured: 4.3.2, 5.0.2).
* **connect** (when some process had initialized MPI already, as a world of one): MPI's
  dynamic-process calls: rank 0 opens a port, publishes its name in the store, and the members
  accept each newcomer together (``MPI_Comm_accept`` / ``MPI_Comm_connect``, then
  ``MPI_Intercomm_merge``); a final ``MPI_Comm_split`` orders the ranks. ``MPI_COMM_WORLD``
  stays a world of one in each process. MPICH 5.0.x cannot connect singletons
  (pmodels/mpich#7805): there every rank fails at once with an error that says what to do.

``MPITENSOR_RENDEZVOUS=connect`` forces the second scheme where both would work (to measure
or test it); ``pmi`` refuses to fall back.

One rendezvous is one job: the first process there names it (torchrun's run id, else
``MPITENSOR_JOB_ID``, else where it started), and a process of another job given the same
address is refused at once with an error naming the port (:func:`_claim_job`).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import sys
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..._base import config as _config
from ...errors import MpiTensorError
from .._store import (
    DistNetworkError,
    DistStoreError,
    FileStore,
    PrefixStore,
    Store,
    StoreTimeoutError,
    TCPStore,
    wire,
)
from .._store.common import base_and_head
from . import pmi as _pmi

__all__ = ["Plan", "plan", "join", "previous"]

logger = logging.getLogger("mpitensor.distributed")

_PREFIX = "mpitensor/init"
_POLL_S = 0.25  # how long a failing rank 0 keeps its store up for the others to read why
# The keys that ranks wait for (_wait). A rank that posts an error also sets each of them that
# is still unset, to _WOKEN, so that every waiter wakes at once and finds the error: no rank
# polls the store while it waits (N ranks polling every 0.25 s cost the master O(N) requests
# per 0.25 s of waiting: 16 requests a rank with arrivals spread over 5 s; 4 now, each wait
# one get).
_WAKE_KEYS = ("arrived/all", "mode", "dpm/port")
_WOKEN = b"mpitensor: an error was posted"
_MODES = ("AUTO", "PMI", "CONNECT")
# MPI libraries whose singletons cannot MPI_Comm_connect/accept (pmodels/mpich#7805)
_BROKEN_DPM = ("MPICH Version:      5.0.", "MPICH Version: 5.0.")

# The communicator a rendezvous made (for a later init_process_group after
# destroy_process_group), with its rank and size; and rank 0's helper process.
_joined: Dict[str, Any] = {}


@dataclass
class Plan:
    """What one process brings to the rendezvous, checked before any traffic.

    Attributes:
        rank: this process's rank, ``0 <= rank < world_size``.
        world_size: the number of processes that meet, at least 2.
        scheme: ``"env"``, ``"tcp"``, ``"file"`` or ``"store"``.
        where: the rendezvous as messages name it (``tcp://10.0.0.1:29500``, ...).
        host, port: the TCPStore's master (``env``, ``tcp``).
        path: the FileStore's file (``file``).
        store: the store passed to ``init_process_group`` (``store``).
    """

    rank: int
    world_size: int
    scheme: str
    where: str
    host: str = ""
    port: int = 0
    path: str = ""
    store: Optional[Store] = None


def _given_int(value: Any) -> Optional[int]:
    """A world size as an int, or ``None`` when not given (torch's -1 and 0) or not an int
    (the check against MPI's world then names it)."""
    if value is None or isinstance(value, bool) or not hasattr(value, "__index__"):
        return None
    value = value.__index__()
    return None if value in (-1, 0) else value


def _from_text(text: str, what: str, source: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"init_process_group: {what} from {source} is {text!r}, not a "
                         "whole number") from None


def plan(init_method: Optional[str], rank: Any, world_size: Any,
         store: Optional[Store]) -> Optional[Plan]:
    """Read ``init_method``, ``rank``, ``world_size`` and ``store`` as torch does.

    ``env://`` (the default without ``store``) takes ``MASTER_ADDR``, ``MASTER_PORT`` and,
    where the arguments do not give them, ``WORLD_SIZE`` and ``RANK`` from the environment
    (under torchrun, whose agent holds ``MASTER_PORT``, the port after it);
    ``tcp://host:port`` and ``file:///path`` take them from the arguments or from the URL's
    query (``?rank=0&world_size=2``). ``world_size`` -1 or 0 and ``rank`` -1 mean "not given".

    Returns:
        ``None`` when there is no world of several to meet (no world size above 1: the
        caller checks the arguments against MPI's world of one); else a :class:`Plan`.

    Raises:
        ValueError: an unknown scheme, a missing or malformed address, port, rank or world
            size, a rank outside ``0..world_size-1``, or both ``init_method`` and ``store``.
        TypeError: a ``rank`` that is not an int, a ``store`` that is not a Store.

    Example:
        >>> plan("tcp://10.0.0.1:29500", rank=1, world_size=2, store=None).where
        'tcp://10.0.0.1:29500'
    """
    url = init_method if init_method is not None else ("env://" if store is None else "")
    parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    query = ({k: v[-1] for k, v in urllib.parse.parse_qs(parts.query).items()}
             if parts is not None else {})
    from_env = store is None and parts is not None and parts.scheme.lower() == "env"
    n = _given(_given_int(world_size), "world_size", query, url, from_env)
    if n is None or n <= 1:
        return None  # a world of one (or a value MPI's world of one will contradict)
    if store is not None and init_method is not None:
        raise ValueError("init_process_group: pass init_method or store, not both (torch "
                         "refuses both too)")
    if store is not None and not isinstance(store, Store):
        raise TypeError(f"init_process_group: store must be a mpitensor.distributed Store "
                        f"(TCPStore, FileStore, HashStore, PrefixStore), got {store!r}")
    if parts is None:
        raise TypeError(f"init_process_group: init_method must be a string such as "
                        f"'env://', got {init_method!r}")
    scheme = "store" if store is not None else parts.scheme.lower()
    if scheme not in ("env", "tcp", "file", "store"):
        raise ValueError(f"init_process_group: unknown init_method {url!r}: use 'env://', "
                         "'tcp://host:port' or 'file:///path'")
    if rank is not None and (isinstance(rank, bool) or not hasattr(rank, "__index__")):
        raise TypeError(f"init_process_group: rank must be an int, got {rank!r}")
    r = None if rank is None or rank.__index__() == -1 else rank.__index__()
    r = _given(r, "rank", query, url, from_env)
    if r is None:
        raise ValueError(f"init_process_group: world_size={n} but no rank for this process: "
                         f"pass rank= (0..{n - 1}), set RANK, or add ?rank= to init_method")
    if not 0 <= r < n:
        raise ValueError(f"init_process_group: rank={r} is out of range for world_size={n}; "
                         f"ranks are 0..{n - 1}")
    if scheme == "store":
        return Plan(r, n, "store", f"the store {type(store).__name__}", store=store)
    if scheme == "file":
        path = urllib.parse.unquote(parts.path)
        if not path:
            raise ValueError(f"init_process_group: init_method {url!r} names no file; use "
                             "'file:///absolute/path'")
        return Plan(r, n, "file", f"file://{path}", path=path)
    host, port = _env_master(n) if scheme == "env" else _url_master(parts, url)
    if not 0 < port < 65536:
        raise ValueError(f"init_process_group: port {port} is out of range (1..65535)")
    shown = f"[{host}]" if ":" in host else host
    return Plan(r, n, scheme, f"{scheme}://{shown}:{port}", host=host, port=port)


def _given(value: Optional[int], name: str, query: Dict[str, str], url: str,
           from_env: bool) -> Optional[int]:
    """``rank`` or ``world_size``: the argument's value, else the URL query's, else (for
    ``env://``) the environment's (``RANK``, ``WORLD_SIZE``)."""
    if value is None and name in query:
        value = _from_text(query[name], name, f"init_method {url!r}")
    var = name.upper()
    if value is None and from_env and os.environ.get(var, "").strip():
        value = _from_text(os.environ[var], name, var)
    return value


def _env_master(n: int) -> Tuple[str, int]:
    """``env://``'s master: ``MASTER_ADDR`` and ``MASTER_PORT`` (the port after it under
    torchrun, whose agent serves its own store there)."""
    host = os.environ.get("MASTER_ADDR", "").strip()
    port_text = os.environ.get("MASTER_PORT", "").strip()
    for name, value in (("MASTER_ADDR", host), ("MASTER_PORT", port_text)):
        if not value:
            raise ValueError(
                f"init_process_group: init_method='env://' with world_size={n}: "
                f"environment variable {name} expected, but not set. Set MASTER_ADDR and "
                "MASTER_PORT to rank 0's host and a free port in every process (or start "
                "the processes with mpiexec, mpitensor-run or "
                "mpitensor.multiprocessing.spawn, which need neither)")
    port = _from_text(port_text, "the port", "MASTER_PORT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").strip().lower() == "true":
        # torchrun's agent serves its own store (torch's wire protocol) on MASTER_PORT:
        # ours takes the next port on the same host, which every node can work out alike
        port = port + 1 if port < 65535 else port - 1
    return host, port


def _url_master(parts: urllib.parse.SplitResult, url: str) -> Tuple[str, int]:
    """``tcp://host:port``'s master."""
    try:
        host, port = parts.hostname or "", parts.port or 0
    except ValueError as exc:
        raise ValueError(f"init_process_group: init_method {url!r}: {exc}") from None
    if not host or not port:
        raise ValueError(f"init_process_group: init_method {url!r} needs a host and a "
                         "port: 'tcp://10.0.0.1:29500'")
    return host, port


def previous(p: Plan) -> Any:
    """The communicator an earlier rendezvous of this process made for the same rank and
    size (after ``destroy_process_group``), or ``None``."""
    comm = _joined.get("comm")
    if comm is not None and (_joined["rank"], _joined["size"]) == (p.rank, p.world_size):
        return comm
    return None


# ---------------------------------------------------------------------- the store side
def _open_store(p: Plan, seconds: float) -> Tuple[Store, bool]:
    """The rendezvous store and whether this process owns (and so closes) it."""
    if p.store is not None:
        return p.store, False
    if p.scheme == "file":
        try:
            return FileStore(p.path, p.world_size), True
        except DistStoreError as exc:
            raise DistStoreError(f"init_process_group: rank {p.rank} cannot use {p.where}: "
                                 f"{exc}") from exc
    try:
        return TCPStore(p.host, p.port, None, is_master=(p.rank == 0), timeout=seconds,
                        wait_for_workers=False), True
    except DistNetworkError as exc:
        if p.rank == 0 and "already in use" in str(exc):
            _tell_the_job_there(p)
            raise DistNetworkError(
                f"init_process_group: rank 0 cannot serve the rendezvous at {p.where}: port "
                f"{p.port} is already in use (another job, another program, or an earlier run "
                "that is still exiting holds it); choose a free port (MASTER_PORT, or the port "
                "in init_method) and give the same one to every process") from exc
        raise DistNetworkError(f"init_process_group: rank {p.rank} cannot "
                               f"{'serve' if p.rank == 0 else 'reach'} the rendezvous at "
                               f"{p.where}: {exc}") from exc


def _tell_the_job_there(p: Plan) -> None:
    """Rank 0 found its port taken: where a rendezvous of a job it cannot be told apart
    from (neither has an id, or both the same) is gathering there, its ranks may include
    this job's: fail that rendezvous too, on every side, rather than let the two merge."""
    me = _my_job(0, p.world_size)
    try:
        other = TCPStore(p.host, p.port, None, is_master=False, timeout=0.5,
                         wait_for_workers=False)
    except Exception:  # noqa: BLE001 - not a store (another program), or unreachable
        return
    try:
        s = PrefixStore(_PREFIX, other)
        if not s.check(["job"]):
            return
        job = json.loads(s.get("job").decode("utf-8", "replace"))
        if _same_job(me, job) is False:
            return  # another job, told apart: it refuses this job's ranks itself
        msg = (f"init_process_group: a second rank 0 (pid {os.getpid()} on "
               f"{socket.gethostname()}) found port {p.port} of the rendezvous at {p.where} "
               f"taken by {_job_text(job)}: two jobs were given the same address, and ranks "
               "of one may have joined the other. Give each job its own port (MASTER_PORT, or "
               "the port in init_method), or a job id (MPITENSOR_JOB_ID, torchrun's "
               "--rdzv-id) of its own")
        _post_error(s, Plan(0, p.world_size, p.scheme, p.where), "ValueError", msg)
    except Exception:  # noqa: BLE001 - best effort: this rank fails in any case
        pass
    finally:
        other.close()


def _post_error(s: Store, p: Plan, kind: str, message: str) -> None:
    """Tell the other ranks why this one stops, so that they stop too (best effort)."""
    try:
        s.set("error", json.dumps({"kind": kind, "message": message, "rank": p.rank}))
        for key in _WAKE_KEYS:  # wake the waiters (a key already set keeps its value)
            s.compare_set(key, "", _WOKEN)
    except Exception:  # noqa: BLE001 - the store itself may be what failed
        pass


def _has_error(s: Store) -> bool:
    try:
        return s.check(["error"])
    except Exception:  # noqa: BLE001 - the store itself may be what failed
        return False


def _raise_posted(raw: bytes) -> None:
    info = json.loads(raw.decode())
    kind = {"ValueError": ValueError, "timeout": StoreTimeoutError}.get(info["kind"],
                                                                         MpiTensorError)
    exc = kind(info["message"])
    exc.posted = True  # type: ignore[attr-defined]  # told by another rank: pass it on as is
    raise exc


def _wait(s: Store, key: str, deadline: float) -> bytes:
    """Wait until ``key`` (one of :data:`_WAKE_KEYS`) is set and return its value, raising
    another rank's posted error as soon as it appears (posting one sets the key:
    :func:`_post_error`); ``StoreTimeoutError`` (with ``.keys``) at the deadline.

    One request (a get that waits) however long the wait; a wait and then a get before: the
    master's CPU at scale is mostly its requests: 4 a rank now (5 on rank 0), 8 then."""
    try:
        value = s._get_within(key.encode(), max(0.0, deadline - time.monotonic()))
    except StoreTimeoutError as exc:
        if s.check(["error"]):
            _raise_posted(s.get("error"))
        exc.keys = [] if s.check([key]) else [key]  # type: ignore[attr-defined]
        raise exc
    return _not_woken(s, value)


def _not_woken(s: Store, value: bytes) -> bytes:
    """``value`` of a key that ranks wait for, raising the posted error where it is the mark
    of one (:func:`_post_error`)."""
    if value == _WOKEN:
        _raise_posted(s.get("error"))
    return value


def _job_identity() -> Tuple[str, str]:
    """This process's job: ``(id, where it came from)``, or ``("", "")`` where none is known.

    torchrun's ``--rdzv-id`` (``TORCHELASTIC_RUN_ID``), unless it is torchrun's default
    ``none``, which every torchrun job has; else ``MPITENSOR_JOB_ID`` (``mpitensor-run``
    makes one for its ranks; a user or a scheduler may set one). Processes started by
    ``multiprocessing`` or by hand usually have neither: their rendezvous takes the identity
    of the first rank that reaches it, and its parent process where it has one (see
    :func:`_claim_job`, :func:`_parent`).
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id.lower() != "none":
        return run_id, "TORCHELASTIC_RUN_ID"
    job = _config.job_id()
    if job:
        return job, _config.ENV_JOB_ID
    return "", ""


def _parent() -> str:
    """For a process started by ``multiprocessing`` (``mp.Process``, a spawn of one's own),
    the process that started it, as ``"PID@START"`` (its start time in clock ticks since
    boot, so that a reused pid is not taken for it); ``""`` for any other process.

    The ranks of one such job on one host share it, and two jobs started from two programs
    do not: where neither has a job id, this still tells them apart on a host. (Processes
    started by hand, or by torchrun, have no common parent to go by.)"""
    import multiprocessing

    parent = multiprocessing.parent_process()
    pid = getattr(parent, "pid", None) if parent is not None else None
    if not pid:
        return ""
    try:
        with open(f"/proc/{pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "?"
    return f"{pid}@{start}"


def _job_text(job: Dict[str, Any]) -> str:
    if job.get("id"):
        return f"job {job['id']!r} ({job.get('source', '?')})"
    started = (f", started by process {str(job['parent']).split('@')[0]}"
               if job.get("parent") else "")
    return (f"a job without an id (begun by rank {job.get('rank', '?')}, pid "
            f"{job.get('pid', '?')} on {job.get('host', '?')}{started})")


def _same_job(mine: Dict[str, Any], job: Dict[str, Any]) -> Optional[bool]:
    """Whether two job records are one job: ``False`` when told apart (by their ids, or,
    without ids, by the multiprocessing parents of two processes on one host), ``None`` when
    they cannot be told apart, ``True`` when the ids agree."""
    if str(job.get("id", "")) != mine["id"]:
        return False
    if mine["id"]:
        return True
    if (mine["parent"] and job.get("parent") and job.get("host") == mine["host"]
            and job.get("parent") != mine["parent"]):
        return False
    return None


def _my_job(rank: int, world_size: int) -> Dict[str, Any]:
    ident, source = _job_identity()
    return {"id": ident, "source": source, "rank": rank, "pid": os.getpid(),
            "host": socket.gethostname(), "parent": "" if ident else _parent(),
            "start": time.time(), "world_size": world_size}


def _claim_job(s: Store, p: Plan) -> Dict[str, Any]:
    """Name this rendezvous's job, or check that this process belongs to the job named; the
    job's record (its first process's: the world size it was given is the job's).

    The first process to arrive writes its job (its id, or, without one, where it started);
    a process whose id differs, or that has an id where the job has none or the other way
    round, or, without ids, that ``multiprocessing`` started from another program on the
    same host (:func:`_parent`), belongs to another job that was given the same address: it
    is refused at once, before it claims a rank, with an error naming the port (its own
    job's rank 0 fails on the port in use). Jobs with nothing to tell them apart (started by
    hand): there a second rank 0 (:func:`_open_store`) or a rank claimed twice
    (:func:`_arrive`) fails the rendezvous on every side instead.

    The world size rides in the record, so that one request both names the job and tells a
    rank the size the others were given (the master's CPU at scale is its requests).

    Raises:
        ValueError: this process belongs to another job (marked ``foreign``: not posted to
            the job it was refused by).
    """
    me = _my_job(p.rank, p.world_size)
    mine = json.dumps(me)
    first = s.compare_set("job", "", mine).decode("utf-8", "replace")
    if first == mine:
        return me
    try:
        job = json.loads(first)
        if not isinstance(job, dict):
            raise ValueError(first)
    except ValueError:
        job = {"id": "?"}
    if _same_job(me, job) is not False:
        return job
    port = f"port {p.port}" if p.port else p.where
    msg = (f"init_process_group: rank {p.rank} of {_job_text(me)} was refused by the "
           f"rendezvous at {p.where}: {port} serves {_job_text(job)}. Two jobs were given "
           f"the same rendezvous address; give each job its own (MASTER_PORT, or the port "
           "in init_method), or the same job id to every process of one job")
    if p.scheme == "file":
        msg += " (a rendezvous file left by an earlier run causes this too: delete it)"
    try:  # the other job's rank 0 logs it (its rendezvous goes on: its ranks differ)
        s.set("refused", msg)
    except Exception:  # noqa: BLE001 - the refusal stands whatever the store does
        pass
    exc = ValueError(msg)
    exc.foreign = True  # type: ignore[attr-defined]  # not posted: the job there is not ours
    raise exc


def _arrive(s: Store, p: Plan, seconds: float, deadline: float, wait_all: bool = True,
            extra: Optional[Dict[str, Any]] = None) -> Tuple[List[Dict[str, Any]],
                                                             Optional[bytes]]:
    """Claim this rank, check that everyone names the same world size, and wait for all
    (``wait_all``), or ask for rank 0's ``mode`` with the claim (see :func:`_claim`).

    ``extra``: more fields for this rank's claim (the others read them from it).

    Returns:
        Every rank's claim, by rank, where ``wait_all`` (what rank 0 decides the joining
        from), else ``[]``; and the value of ``mode`` where it came with the claim, else
        ``None`` (then :func:`_wait_mode` waits for it).
    """
    job = _claim_job(s, p)
    me = {"rank": p.rank, "world_size": p.world_size, "host": socket.gethostname(),
          "netns": _netns(), "pidns": _netns("pid"), "pid": os.getpid(),
          "mpi": _mpi_state(), **(extra or {})}
    mine = json.dumps(me)
    if job.get("world_size", p.world_size) != p.world_size:
        msg = (f"init_process_group: rank {p.rank} was given world_size={p.world_size}, but "
               f"rank {job.get('rank', '?')} was given world_size={job['world_size']} "
               f"(rendezvous at {p.where}); pass the same world_size to every process")
        _post_error(s, p, "ValueError", msg)
        raise ValueError(msg)
    waited = "arrived/all" if wait_all else "mode"
    claimed, count, got = _claim(s, p, mine, waited, deadline)
    if claimed != mine:
        other = json.loads(claimed)
        msg = (f"init_process_group: rank {p.rank} was claimed twice at {p.where}: by pid "
               f"{other['pid']} on {other['host']} and by pid {me['pid']} on {me['host']}; give "
               "every process its own rank (a FileStore file left by an earlier run causes "
               "this too: delete it)")
        _post_error(s, p, "ValueError", msg)
        raise ValueError(msg)
    # one counter and one key that the last to arrive sets: each rank waits for one key, not
    # for all N (N^2 key checks in the store for the whole job)
    if count >= p.world_size:
        s.set("arrived/all", "1")
    if not wait_all:
        return [], got
    try:
        if got is None:
            _wait(s, "arrived/all", deadline)
        else:
            _not_woken(s, got)
    except StoreTimeoutError as exc:
        if getattr(exc, "posted", False):
            raise
        raise _not_all_came(s, p, seconds) from None
    return _gather(s, p, seconds, deadline), None


def _claim(s: Store, p: Plan, mine: str, waited: str,
           deadline: float) -> Tuple[str, int, Optional[bytes]]:
    """Claim ``rank/<rank>`` with ``mine``, count the arrival (``arrived``), and get
    ``waited`` (``arrived/all`` or ``mode``), waiting for it until ``deadline``.

    On our TCPStore the three go in one segment, one exchange: the master's loop wakes once
    for them, not three times (its CPU at scale is mostly wake-ups). The claim is counted
    there even where it did not take (see :func:`_gather`); and where it did not, or this
    rank's count completes the world (it has ``arrived/all`` to set first), the get's reply
    is not read: the connection is dropped (the store's next request makes a new one),
    since the get may wait for what this rank has yet to do. Elsewhere a compare_set, then
    an add where the claim took (the wait is left to the caller).

    Returns:
        What ``rank/<rank>`` holds, the count (0 where not counted), and the value got
        (``None`` where not read, or where the get timed out: the caller waits again).
    """
    key = f"rank/{p.rank}"
    base, head = base_and_head(s)
    if not isinstance(base, TCPStore):
        claimed = s.compare_set(key, "", mine).decode()
        return claimed, s.add("arrived", 1) if claimed == mine else 0, None
    want = mine.encode()
    wait_s = max(0.0, deadline - time.monotonic())
    replies = base._requests(
        [(wire.CAS, [head + key.encode(), b"", want]),
         (wire.ADD, [head + b"arrived", wire.i64(1)]),
         (wire.GET, [base._ms(wait_s), head + waited.encode()])],
        wait_s, until=lambda r: len(r) == 2 and (
            r[0][1][0] != want or wire.as_i64(r[1][1][0]) >= p.world_size))
    got = replies[2] if len(replies) == 3 else None
    return (replies[0][1][0].decode(), wire.as_i64(replies[1][1][0]),
            got[1][0] if got is not None and got[0] == wire.OK else None)


def _gather(s: Store, p: Plan, seconds: float, deadline: float) -> List[Dict[str, Any]]:
    """Every rank's claim, once the count reached the world size.

    Each rank's claim is made before it is counted, so all are in by then, except where a
    process was counted with a claim that did not take (a rank claimed twice, on our
    TCPStore: :func:`_claim`): the rank nobody has is missing, and that process posts its
    error: this waits for it and raises it.
    """
    keys = [f"rank/{i}" for i in range(p.world_size)]
    if not s.check(keys):
        try:
            posted = s._get_within(b"error", max(0.0, deadline - time.monotonic()))
        except StoreTimeoutError:
            raise _not_all_came(s, p, seconds) from None
        _raise_posted(posted)
    return [json.loads(v) for v in s.multi_get(keys)]


def _not_all_came(s: Store, p: Plan, seconds: float) -> StoreTimeoutError:
    """The error of a rendezvous that not every rank reached in time: who came, who not."""
    missing = [i for i in range(p.world_size) if not s.check([f"rank/{i}"])]
    came = [i for i in range(p.world_size) if i not in missing]
    return StoreTimeoutError(
        f"init_process_group: only {len(came)} of world_size={p.world_size} processes "
        f"arrived at the rendezvous ({p.where}) within {seconds:g} s: rank(s) {came} came, "
        f"rank(s) {missing} did not. Start {p.world_size} processes with ranks "
        f"0..{p.world_size - 1}, or pass the number of processes you start as world_size")


def _wait_mode(s: Store, p: Plan, seconds: float, deadline: float,
               got: Optional[bytes] = None) -> Dict[str, Any]:
    """How rank 0 decided to join the ranks (``mode``; ``got``: its value where it came with
    the claim). A rank other than 0 waits for it straight after arriving (not for all and
    then for it): where it times out before all came, its error names who came, as rank
    0's does."""
    try:
        return json.loads(_wait(s, "mode", deadline) if got is None else _not_woken(s, got))
    except StoreTimeoutError as exc:
        if getattr(exc, "posted", False) or p.rank == 0 or s.check(["arrived/all"]):
            raise
        raise _not_all_came(s, p, seconds) from None


def _netns(kind: str = "net") -> str:
    """This process's network (or ``kind``) namespace (``""`` where unknown): ranks that share
    a host name may still not share a loopback interface (``ip netns``, containers), nor
    process ids."""
    try:
        st = os.stat(f"/proc/self/ns/{kind}")
    except OSError:
        return ""
    return f"{st.st_dev}:{st.st_ino}"


def _helper_address(p: Plan, members: List[Dict[str, Any]]) -> Tuple[str, str]:
    """Where rank 0's PMI helper listens, and the address the ranks connect to.

    Loopback when every rank shares this host and its network namespace; else the master's
    address (``MASTER_ADDR``, the host of ``tcp://``), which every rank reached already;
    with neither (``file://``, ``store=``), the address this host's name resolves to, or
    every interface where that is a loopback address (the ranks then still need the token
    from the store, and ``MPITENSOR_SECRET`` where set)."""
    here, ns = socket.gethostname(), _netns()
    if all(m.get("host") == here and m.get("netns", "") == ns for m in members):
        return "127.0.0.1", "127.0.0.1"
    for name in ([p.host] if p.host else []) + [here]:
        try:
            infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except OSError:
            continue
        for family, _type, _proto, _name, sockaddr in infos:
            addr = str(sockaddr[0])
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if name == p.host or not (addr.startswith("127.") or addr == "::1"):
                return addr, addr
    return "", p.host or here


def _mpi_state() -> str:
    """``"initialized"`` if this process already initialized MPI (a world of one), else
    ``"fresh"`` (importing ``mpi4py.MPI`` initializes it: nothing here imports it)."""
    mod = sys.modules.get("mpi4py.MPI")
    if mod is not None and mod.Is_initialized():
        return "initialized"
    return "fresh"


def _mode_wanted() -> str:
    return _config.rendezvous_mode(_MODES)


# ---------------------------------------------------------------------- joining
def join(p: Plan, seconds: float) -> Any:
    """Meet the other ranks of ``p`` and return the MPI communicator of all of them.

    Collective over the ``p.world_size`` processes; every failure raises on every rank that
    is still waiting, within ``seconds``.

    Raises:
        DistNetworkError: the store's master cannot serve (port taken) or cannot be reached.
        StoreTimeoutError: not every rank arrived within ``seconds`` (the message names which
            came and which did not).
        ValueError: the ranks disagree on ``world_size``, two claim one rank, or this process
            belongs to another job than the one gathering at the address.
        MpiTensorError: the MPI library cannot join them (what to do is in the message).
    """
    want = _mode_wanted()  # a malformed MPITENSOR_RENDEZVOUS fails before any traffic
    t0 = time.monotonic()
    deadline = t0 + seconds
    store, owned = _open_store(p, seconds)
    s = PrefixStore(_PREFIX, store)
    helper = None
    try:
        members, got = _arrive(s, p, seconds, deadline, wait_all=p.rank == 0)
        if p.rank == 0:
            helper = _choose_mode(s, p, members, want, deadline)
        mode = _wait_mode(s, p, seconds, deadline, got)
        t1 = time.monotonic()
        comm, scheme = None, mode["kind"]
        if scheme == "pmi":
            comm = _join_pmi(p, mode, deadline)
            if comm is None:  # this MPI ignored PMI_FD: not an MPICH-family library
                _stop_helper(helper)
                helper = None
                logger.info("rank %d: the MPI library did not join through PMI; joining with "
                            "MPI_Comm_connect/accept instead", p.rank)
        if comm is None:
            late = mode.get("late", [])
            why = (f"rank(s) {late} had initialized MPI before init_process_group, so each "
                   "is an MPI job of its own" if late else
                   "MPITENSOR_RENDEZVOUS=connect asks for them" if want == "CONNECT" else
                   "this MPI library does not take MPICH's PMI protocol")
            comm, scheme = _join_connect(s, p, deadline, why), "connect"
        t2 = time.monotonic()
        comm.Barrier()  # nobody needs the store past this point
        _after_join(s, p, owned, f"{p.world_size} ranks arrived in {t1 - t0:.3f} s, joined "
                    f"({scheme}) in {t2 - t1:.3f} s")
    except BaseException as exc:
        _join_failed(exc, s, p, helper, linger=owned and p.rank == 0
                     and isinstance(store, TCPStore))
        raise
    finally:
        if owned:
            store.close()
    _joined.update(comm=comm, rank=p.rank, size=p.world_size)
    if helper is not None:
        _joined["helper"] = helper  # reaped at exit; it ends when every rank has finalized
    return comm


def _choose_mode(s: Store, p: Plan, members: List[Dict[str, Any]], want: str,
                 deadline: float) -> Any:
    """Rank 0's decision, posted as ``mode``: every rank fresh, the PMI helper (started here,
    returned) unless ``connect`` is asked for; else MPI_Comm_connect/accept (None returned)."""
    fresh = all(m["mpi"] == "fresh" for m in members)
    if want == "PMI" and not fresh:
        late = [m["rank"] for m in members if m["mpi"] != "fresh"]
        msg = (f"init_process_group: MPITENSOR_RENDEZVOUS=pmi, but rank(s) {late} had "
               "initialized MPI before init_process_group; call it before anything "
               "imports mpi4py.MPI")
        _post_error(s, p, "ValueError", msg)
        raise ValueError(msg)
    if not fresh or want == "CONNECT":
        s.set("mode", json.dumps({"kind": "connect", "late": [
            m["rank"] for m in members if m["mpi"] != "fresh"]}))
        return None
    bind, addr = _helper_address(p, members)
    here, ns, pidns = socket.gethostname(), _netns(), _netns("pid")
    started = _pmi.start_helper(
        p.world_size, max(1.0, deadline - time.monotonic()), bind=bind,
        mapping=_pmi.process_mapping([m["host"] for m in members]),
        # a rank of this host (and of its namespaces) is bound to its process
        local_pids={m["rank"]: m["pid"] for m in members
                    if m["host"] == here and m.get("netns", "") == ns
                    and m.get("pidns", "") == pidns})
    s.set("mode", json.dumps({"kind": "pmi", "port": started.port,
                              "token": started.token, "unix": started.unix,
                              "host": socket.gethostname(), "addr": addr}))
    return started.proc


def _stop_helper(helper: Any) -> None:
    """End rank 0's PMI helper process, if it has one."""
    if helper is not None:
        helper.kill()
        helper.wait()


def _after_join(s: Store, p: Plan, owned: bool, how: str) -> None:
    """Report a refused stranger and the times; rank 0 clears the keys from a store that
    outlives the rendezvous (one passed in), so that a later one starts from nothing."""
    if p.rank == 0 and s.check(["refused"]):
        logger.warning("rank 0: a process of another job came to the rendezvous at %s "
                       "and was refused: %s", p.where, s.get("refused").decode("utf-8",
                                                                            "replace"))
    logger.debug("rank %d: rendezvous at %s: %s", p.rank, p.where, how)
    if not owned and p.rank == 0:
        for key in ["job", "refused", "arrived", "arrived/all", "mode",
                    "dpm/port", "error"] + [f"rank/{i}" for i in range(p.world_size)]:
            s.delete_key(key)


def _join_failed(exc: BaseException, s: Store, p: Plan, helper: Any, linger: bool) -> None:
    """Post this rank's failure for the others (unless one is posted already or it came from
    a stranger), end the helper where MPI did not start, and keep an owned master up a moment
    (``linger``) so that the others can read why."""
    if not getattr(exc, "foreign", False) and not _has_error(s):
        if isinstance(exc, (ValueError, StoreTimeoutError)):  # the same words everywhere
            _post_error(s, p, "ValueError" if isinstance(exc, ValueError) else "timeout",
                        str(exc))
        else:
            _post_error(s, p, "error", f"init_process_group: rank {p.rank} failed during "
                        f"the rendezvous at {p.where}: {type(exc).__name__}: {exc}")
    if not _mpi_running():
        _stop_helper(helper)
    if linger:
        # the others read the error from this process's store: give them a moment
        time.sleep(2 * _POLL_S)


def _mpi_running() -> bool:
    mod = sys.modules.get("mpi4py.MPI")
    return mod is not None and mod.Is_initialized() and not mod.Is_finalized()


def _init_mpi() -> Any:
    """Import mpi4py's MPI, which initializes it (or initialize it where ``mpi4py.rc``
    said not to), and make sure it is finalized at exit, also in multiprocessing children."""
    import mpi4py
    from mpi4py import MPI

    if not MPI.Is_initialized():
        levels = {"single": MPI.THREAD_SINGLE, "funneled": MPI.THREAD_FUNNELED,
                  "serialized": MPI.THREAD_SERIALIZED, "multiple": MPI.THREAD_MULTIPLE}
        MPI.Init_thread(levels.get(str(mpi4py.rc.thread_level).lower(), MPI.THREAD_MULTIPLE))
        atexit.register(_finalize_mpi)
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        # a forked multiprocessing child leaves with os._exit(), past every atexit hook
        # (mpi4py's MPI_Finalize included); its own exit steps still run these finalizers
        from multiprocessing import util

        util.Finalize(None, _finalize_mpi, exitpriority=-100)
    return MPI


def _finalize_mpi() -> None:
    mod = sys.modules.get("mpi4py.MPI")
    if mod is not None and mod.Is_initialized() and not mod.Is_finalized():
        watch = _joined.get("watch")
        if watch is not None:  # (a job of init_process_group's own PMI helper)
            watch.finalizing()
        mod.Finalize()


def _join_pmi(p: Plan, mode: Dict[str, Any], deadline: float) -> Any:
    """``MPI_Init`` against rank 0's PMI helper; ``MPI_COMM_WORLD``, or ``None`` if this MPI
    library ignored the helper (it then initialized as a world of one)."""
    host, unix = mode["addr"], mode.get("unix", "")
    try:
        fd = _pmi.connect_pmi(host, mode["port"], p.rank, mode["token"], deadline, unix)
    except OSError as exc:
        raise DistNetworkError(f"init_process_group: rank {p.rank} cannot reach rank 0's PMI "
                               f"helper at {host}:{mode['port']}: {exc}") from exc
    names = {"PMI_FD": str(fd), "PMI_RANK": str(p.rank), "PMI_SIZE": str(p.world_size)}
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        MPI = _init_mpi()
    finally:
        # children of this process must not find a PMI connection to use
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    comm = MPI.COMM_WORLD
    if comm.Get_size() != p.world_size:
        os.close(fd)
        return None
    if comm.Get_rank() != p.rank:
        raise MpiTensorError(f"init_process_group: MPI made rank {p.rank} rank "
                             f"{comm.Get_rank()} of {comm.Get_size()}; this is a bug")
    _joined["watch"] = _pmi.Watch(host, mode["port"], p.rank, mode["token"], deadline, unix)
    return comm


def _library() -> str:
    from mpi4py import MPI

    return MPI.Get_library_version().strip().splitlines()[0].strip()


def _join_connect(s: Store, p: Plan, deadline: float, why: str) -> Any:
    """Join with ``MPI_Comm_accept``/``MPI_Comm_connect`` and ``MPI_Intercomm_merge``: the
    members accept each newcomer together; ``MPI_Comm_split`` then orders the ranks."""
    MPI = _init_mpi()
    lib = _library()
    if lib.startswith(_BROKEN_DPM):
        raise MpiTensorError(
            f"init_process_group: cannot join these processes with MPI_Comm_accept/"
            f"MPI_Comm_connect: {why}, and MPICH 5.0.x (here {lib!r}) fails those calls "
            "between such jobs of one (\"Local and remote groups in MPI_Intercomm_create must "
            "not overlap\", pmodels/mpich#7805). Call init_process_group before anything "
            "imports mpi4py.MPI, in every process (it then starts MPI itself through "
            "mpitensor's PMI helper, which works with this MPICH), or install mpich 4.3 "
            "(pip install 'mpich==4.3.2'), or start the processes with mpiexec or "
            "mpitensor-run")
    if p.rank == 0:
        port = MPI.Open_port()
        s.set("dpm/port", port)
    else:
        port = _wait(s, "dpm/port", deadline).decode()
    try:
        if p.rank == 0:
            group = MPI.COMM_SELF.Dup()
        else:
            inter = MPI.COMM_SELF.Connect(port)
            group = inter.Merge(high=True)
            inter.Free()
        while group.Get_size() < p.world_size:
            inter = group.Accept(port, root=0)
            merged = inter.Merge(high=False)
            inter.Free()
            group.Free()
            group = merged
        world = group.Split(0, p.rank)
        group.Free()
    finally:
        if p.rank == 0:
            MPI.Close_port(port)
    return world


@atexit.register
def _reap_helper() -> None:
    helper = _joined.get("helper")
    if helper is not None:
        helper.poll()  # collect it if it has ended; a live one ends by itself
