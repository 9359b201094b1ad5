"""The smaller members of ``torch.distributed`` (its ``distributed_c10d`` module): the debug
level, backend queries, the collectives' option records, coalesced collectives, group
splitting, rendezvous handlers and a rank-filtered breakpoint.

Imported by the package ``__init__`` at its end, which then hands this module the package
(``_package``) for the functions that call its collectives.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import os
import urllib.parse
from typing import Any, Callable, Dict, Iterator, List, NewType, Optional, Sequence, Tuple

from .._base.config import DEFAULT_TIMEOUT_S
from ._store import DistError, DistStoreError
from .process_group import ProcessGroup, ReduceOp, Work

__all__ = [
    "AllToAllOptions", "AllreduceCoalescedOptions", "AllreduceOptions", "BackendConfig",
    "BarrierOptions", "BroadcastOptions", "DebugLevel", "DistBackendError", "GatherOptions",
    "GroupName", "ProcessGroupGloo", "QueueEmptyError", "ReduceOptions", "ReduceScatterOptions",
    "ScatterOptions", "all_gather_coalesced", "all_gather_single", "all_reduce_coalesced",
    "breakpoint", "default_pg_timeout", "get_backend_config", "get_debug_level", "get_pg_count",
    "is_backend_available", "is_ucc_available", "is_xccl_available", "record_comm",
    "register_rendezvous_handler", "rendezvous", "reduce_scatter_single", "set_debug_level",
    "set_debug_level_from_env", "split_group", "supports_complex",
]

#: The default timeout of process groups (``MPITENSOR_TIMEOUT``, 30 minutes unless set;
#: ``timedelta.max`` for ``MPITENSOR_TIMEOUT=inf``, no timeout).
default_pg_timeout = (datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)
                      if DEFAULT_TIMEOUT_S < datetime.timedelta.max.total_seconds()
                      else datetime.timedelta.max)

#: A process group's name, as torch types it (a ``str`` at run time).
GroupName = NewType("GroupName", str)


#: the ``mpitensor.distributed`` package, set by the package once it has imported this module
#: (the package depends on this module, not the other way round)
_package: Any = None


def _dist() -> Any:
    if _package is None:
        raise RuntimeError("mpitensor.distributed._c10d is used through mpitensor.distributed; "
                           "import that package")
    return _package


# ------------------------------------------------------------------------------ errors
class DistBackendError(DistError):
    """A failure inside a communication backend (``DistError``'s subclass, as torch's)."""


class QueueEmptyError(DistStoreError):
    """A store queue had nothing to pop (``DistStoreError``'s subclass, as torch's)."""


# ------------------------------------------------------------------------- debug level
class DebugLevel(enum.Enum):
    """``TORCH_DISTRIBUTED_DEBUG``'s levels. ``DETAIL`` turns on mpitensor's debug mode: every
    collective's arguments (op, dtype, shape, root) are checked against the other ranks'
    (:func:`~mpitensor.distributed.set_debug`); ``INFO`` and ``OFF`` leave it off."""

    OFF = 0
    INFO = 1
    DETAIL = 2


_level = {"value": DebugLevel.OFF}


def get_debug_level() -> DebugLevel:
    """The current :class:`DebugLevel` (``DETAIL`` whenever debug mode is on)."""
    if _dist().get_debug():
        return DebugLevel.DETAIL
    return DebugLevel.INFO if _level["value"] is DebugLevel.INFO else DebugLevel.OFF


def set_debug_level(level: DebugLevel) -> None:
    """Set the :class:`DebugLevel`; every rank must make the same call (``DETAIL`` changes
    what collectives send).

    Raises:
        TypeError: ``level`` is not a DebugLevel.
    """
    if not isinstance(level, DebugLevel):
        raise TypeError(f"set_debug_level: expected a DebugLevel, got {level!r}")
    _level["value"] = level
    _dist().set_debug(level is DebugLevel.DETAIL)


def set_debug_level_from_env() -> None:
    """Set the debug level from ``TORCH_DISTRIBUTED_DEBUG`` (``OFF``, ``INFO`` or ``DETAIL``,
    any case; unset means ``OFF``).

    Raises:
        ValueError: another value.
    """
    text = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF").strip().upper() or "OFF"
    if text not in DebugLevel.__members__:
        raise ValueError(f"TORCH_DISTRIBUTED_DEBUG={text!r}: the value must be OFF, INFO or "
                         "DETAIL")
    set_debug_level(DebugLevel[text])


# ------------------------------------------------------------------------ backend queries
def is_backend_available(backend: str) -> bool:
    """Whether :func:`~mpitensor.distributed.init_process_group` accepts ``backend`` here:
    ``mpi`` and ``gloo`` (MPI), ``nccl`` (with CuPy's NCCL); ``ucc``, ``xccl`` and others
    never."""
    d = _dist()
    name = str(backend).lower()
    checks = {"mpi": d.is_mpi_available, "gloo": d.is_gloo_available,
              "nccl": d.is_nccl_available}
    return name in checks and bool(checks[name]())


def is_ucc_available() -> bool:
    """False: there is no UCC backend (use ``mpi`` or ``nccl``)."""
    return False


def is_xccl_available() -> bool:
    """False: there is no XCCL (Intel GPU) backend."""
    return False


def supports_complex(reduceOp: Any) -> bool:  # noqa: N803 - torch's argument name
    """Whether ``reduceOp`` is defined on complex tensors here: ``SUM``, ``AVG`` and (unlike
    torch's backends, as MPI multiplies complex numbers) ``PRODUCT``; not ``MAX``, ``MIN`` or
    the bitwise ops."""
    return reduceOp not in (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.BAND, ReduceOp.BOR,
                            ReduceOp.BXOR)


def get_pg_count() -> int:
    """How many process groups exist: the default group and those made from it."""
    d = _dist()
    if d._state.world is None:
        return 0
    return 1 + sum(1 for g in list(d._state.groups) if g is not d._state.world)


class BackendConfig:
    """Which backend serves which device type, parsed from a backend string: ``"gloo"``
    (every device), ``"cpu:gloo,cuda:nccl"``, or ``"undefined"`` (the defaults: ``gloo`` on
    CPU, ``nccl`` on CUDA).

    Raises:
        ValueError: a malformed string, or a backend that is not known.
    """

    #: the device types each backend serves
    _DEVICES = {"mpi": ("cpu", "cuda"), "gloo": ("cpu", "cuda"), "nccl": ("cuda",)}

    def __init__(self, backend: Any) -> None:
        text = str(backend).strip().lower()
        mapping: Dict[str, str] = {}
        if text in ("undefined", ""):
            mapping = {"cpu": "gloo", "cuda": "nccl"}
        elif ":" not in text:
            self._check(text, backend)
            mapping = {d: text for d in self._DEVICES[text]}
        else:
            for item in text.split(","):
                dev, sep, name = item.strip().partition(":")
                if not sep or not dev or not name:
                    raise ValueError(f"BackendConfig: {backend!r} is not 'backend' or "
                                     "'device:backend,device:backend'")
                self._check(name, backend)
                mapping[dev] = name
        self._map = mapping

    def _check(self, name: str, given: Any) -> None:
        if name not in self._DEVICES:
            raise ValueError(f"BackendConfig: unknown backend {name!r} in {given!r}; known: "
                             f"{', '.join(self._DEVICES)}")

    def get_device_backend_map(self) -> Dict[str, str]:
        """``{device type: backend name}``."""
        return dict(self._map)

    def __repr__(self) -> str:
        return ",".join(f"{d}:{b}" for d, b in self._map.items())

    __str__ = __repr__


def get_backend_config(group: Optional[ProcessGroup] = None) -> str:
    """The backend configuration of ``group`` (default group), ``"cpu:gloo,cuda:gloo"``
    style."""
    return str(BackendConfig(_dist().get_backend(group)))


# --------------------------------------------------------------------- option records
class _Options:
    """An option record of a process-group call; fields and defaults as torch's."""

    __slots__ = ("timeout", "asyncOp")
    _FIELDS: Tuple[Tuple[str, Any], ...] = ()

    def __init__(self) -> None:
        self.timeout = datetime.timedelta(milliseconds=-1)  # -1 ms: the group's own timeout
        self.asyncOp = True
        for name, default in self._FIELDS:
            setattr(self, name, default() if callable(default) else default)

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}(timeout={self.timeout!r}, asyncOp={self.asyncOp}" + (
            f", {fields})" if fields else ")")


def _options(name: str, what: str, *fields: Tuple[str, Any], base: type = _Options) -> type:
    """An option record ``name`` of ``what``: ``fields`` (name, default) beside the base's; a
    callable default is called for each record."""
    every = base._FIELDS + fields  # type: ignore[attr-defined]
    listed = ", ".join(f"``{n}``" for n, _ in every) or "``timeout``, ``asyncOp``"
    return type(name, (base,), {"__doc__": f"Options of {what}: {listed}.", "__module__": __name__,
                                "__slots__": tuple(n for n, _ in fields), "_FIELDS": every})


_SUM, _ROOT = ("reduceOp", ReduceOp.SUM), ("rootRank", 0)
AllreduceOptions = _options("AllreduceOptions", "an all-reduce", _SUM)
AllreduceCoalescedOptions = _options("AllreduceCoalescedOptions", "a coalesced all-reduce",
                                     base=AllreduceOptions)
ReduceOptions = _options("ReduceOptions", "a reduce", _SUM, _ROOT, ("rootTensor", 0))
BroadcastOptions = _options("BroadcastOptions", "a broadcast", _ROOT, ("rootTensor", 0))
GatherOptions = _options("GatherOptions", "a gather", _ROOT)
ScatterOptions = _options("ScatterOptions", "a scatter", _ROOT)
ReduceScatterOptions = _options("ReduceScatterOptions", "a reduce-scatter", _SUM)
AllToAllOptions = _options("AllToAllOptions", "an all-to-all")
BarrierOptions = _options("BarrierOptions", "a barrier", ("device_ids", list), ("device", None))


# ----------------------------------------------------------------- coalesced collectives
class _AllWork(Work):
    """One handle over several works: waits for each, in order."""

    __slots__ = ("_parts",)

    def __init__(self, parts: List[Work], result: Any) -> None:
        super().__init__(None, None, result)
        self._parts = parts

    def _await(self, timeout: Optional[float]) -> None:
        for w in self._parts:
            w.wait(timeout)

    def is_completed(self) -> bool:
        if not self._done and all(w.is_completed() for w in self._parts):
            self._complete()
        return self._done


def _gather_works(works: List[Any], result: Any, async_op: bool) -> Optional[Work]:
    if not async_op:
        return None
    return _AllWork([w for w in works if w is not None], result)


def all_reduce_coalesced(tensors: Sequence[Any], op: Any = ReduceOp.SUM,
                         group: Optional[ProcessGroup] = None,
                         async_op: bool = False) -> Optional[Work]:
    """All-reduce each tensor of ``tensors`` (a list, or one tensor) in place, as
    :func:`all_reduce` on each, one after the other on every rank.

    Raises:
        TypeError: ``tensors`` is not a tensor or a list or tuple of tensors.
        ValueError: the tensors' dtypes differ (checked before any traffic).
        RuntimeError: the list is empty.
    """
    from ..tensor import Tensor

    d = _dist()
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = _tensor_list(tensors, "all_reduce_coalesced", "tensors")
    if not tensors:
        raise RuntimeError("all_reduce_coalesced: no tensor to reduce (an empty list)")
    dtypes = sorted({str(t.dtype) for t in tensors})
    if len(dtypes) > 1:
        raise ValueError(f"all_reduce_coalesced: the tensors must share one dtype, got "
                         f"{', '.join(dtypes)}")
    works = [d.all_reduce(t, op=op, group=group, async_op=True) for t in tensors]
    if not async_op:
        for w in works:
            w.wait()
    return _gather_works(works, list(tensors), async_op)


def all_gather_coalesced(output_tensor_lists: Sequence[Sequence[Any]],
                         input_tensor_list: Sequence[Any], group: Optional[ProcessGroup] = None,
                         async_op: bool = False) -> Optional[Work]:
    """Gather every rank's ``input_tensor_list``: ``output_tensor_lists[r][i]`` receives rank
    ``r``'s ``input_tensor_list[i]`` (one list per rank, each shaped like the inputs).

    Raises:
        TypeError: the arguments are not lists of tensors.
        RuntimeError: ``output_tensor_lists`` does not hold one list per rank of the inputs'
            length (as torch's error).
    """
    d = _dist()
    inputs = _tensor_list(input_tensor_list, "all_gather_coalesced", "input_tensor_list")
    if not isinstance(output_tensor_lists, (list, tuple)):
        raise TypeError("all_gather_coalesced: output_tensor_lists must be a list of lists "
                        f"of tensors, got {type(output_tensor_lists).__name__}")
    outs = [_tensor_list(o, "all_gather_coalesced", "output_tensor_lists[r]")
            for o in output_tensor_lists]
    n = d.get_world_size(group)
    if len(outs) != n or any(len(o) != len(inputs) for o in outs):
        raise RuntimeError(f"all_gather_coalesced: output_tensor_lists must hold {n} lists "
                           f"(one per rank) of {len(inputs)} tensors each, got "
                           f"{[len(o) for o in outs]}")
    works = [d.all_gather([outs[r][i] for r in range(n)], t, group=group, async_op=True)
             for i, t in enumerate(inputs)]
    if not async_op:
        for w in works:
            w.wait()
    return _gather_works(works, outs, async_op)


def all_gather_single(output_tensor: Any, input_tensor: Any,
                      group: Optional[ProcessGroup] = None,
                      async_op: bool = False) -> Optional[Work]:
    """Gather every rank's ``input_tensor`` into ``output_tensor`` (rank order, dim 0): the
    same as :func:`~mpitensor.distributed.all_gather_into_tensor`."""
    return _dist().all_gather_into_tensor(output_tensor, input_tensor, group=group,
                                          async_op=async_op)


def reduce_scatter_single(output: Any, input: Any, op: Any = ReduceOp.SUM,
                          group: Optional[ProcessGroup] = None,
                          async_op: bool = False) -> Optional[Work]:
    """Reduce ``input`` over the ranks and give rank ``r`` block ``r``: the same as
    :func:`~mpitensor.distributed.reduce_scatter_tensor`."""
    return _dist().reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)


def _tensor_list(obj: Any, fname: str, what: str) -> List[Any]:
    from ..tensor import Tensor

    if not isinstance(obj, (list, tuple)) or not all(isinstance(t, Tensor) for t in obj):
        raise TypeError(f"{fname}: {what} must be a list of tensors, got {obj!r:.80}")
    return list(obj)


# ------------------------------------------------------------------------- split_group
def split_group(parent_pg: Optional[ProcessGroup] = None,
                split_ranks: Optional[Sequence[Sequence[int]]] = None, timeout: Any = None,
                pg_options: Any = None, group_desc: Optional[str] = None,
                backend: Any = None) -> Optional[ProcessGroup]:
    """Split ``parent_pg`` (default group) into disjoint groups; return this rank's (or
    ``None`` when no split holds it).

    ``split_ranks`` lists the splits as ranks *of the parent group*; every member of the
    parent calls with the same lists. Only the members of each split communicate.

    Raises:
        ValueError: no ``split_ranks``, ranks outside the parent, or splits that overlap.
        TypeError: ``split_ranks`` is not a list of lists of ints.
    """
    d = _dist()
    parent = d._pg(parent_pg)
    if not split_ranks:
        raise ValueError("split_group: split_ranks must list at least one split")
    try:
        splits = [[r.__index__() for r in s] for s in split_ranks]
    except (AttributeError, TypeError):
        raise TypeError(f"split_group: split_ranks must be a list of lists of ints, got "
                        f"{split_ranks!r}") from None
    n = parent.size_
    flat = [r for s in splits for r in s]
    bad = [r for r in flat if not 0 <= r < n]
    if bad:
        raise ValueError(f"split_group: ranks {bad} are outside the parent group (size {n}); "
                         "split_ranks holds ranks of the parent group")
    if len(set(flat)) != len(flat):
        raise ValueError(f"split_group: the splits {splits} overlap")
    me = parent.rank_
    mine = next((s for s in splits if me in s), None)
    if mine is None:
        return None
    ranks = [parent.ranks[r] for r in mine]
    return d.new_group(ranks, timeout=timeout, backend=backend, pg_options=pg_options,
                       group_desc=group_desc)


# ------------------------------------------------------------------------- rendezvous
_handlers: Dict[str, Callable[..., Iterator[Tuple[Any, int, int]]]] = {}


def register_rendezvous_handler(scheme: str, handler: Callable[..., Any]) -> None:
    """Make :func:`rendezvous` use ``handler(url, **kwargs)`` (an iterator of ``(store,
    rank, world_size)``) for URLs ``scheme://...``. ``init_process_group`` keeps its own
    rendezvous (``env``, ``tcp``, ``file``): handlers serve :func:`rendezvous` callers.

    Raises:
        RuntimeError: ``scheme`` already has a handler.
    """
    if scheme in _handlers:
        raise RuntimeError(f"register_rendezvous_handler: {scheme}:// already has a handler")
    _handlers[scheme] = handler


def rendezvous(url: str, rank: int = -1, world_size: int = -1,
               **kwargs: Any) -> Iterator[Tuple[Any, int, int]]:
    """Iterate over ``(store, rank, world_size)`` for the rendezvous ``url``: ``env://``
    (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``), ``tcp://host:port`` and
    ``file:///path`` give a TCPStore / FileStore shared by the ``world_size`` processes
    (rank 0 serves the TCPStore); other schemes go to their registered handler.

    Raises:
        RuntimeError: no handler for the URL's scheme.
        ValueError: a missing or malformed rank, world size or address.
    """
    if not isinstance(url, str):
        raise TypeError(f"rendezvous: url must be a string, got {url!r}")
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in _handlers:
        raise RuntimeError(f"rendezvous: no handler for {scheme or url!r}:// URLs; known: "
                           f"{', '.join(sorted(_handlers))}")
    if rank != -1 or world_size != -1:
        parts = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(parts.query))
        if rank != -1:
            query["rank"] = str(rank)
        if world_size != -1:
            query["world_size"] = str(world_size)
        url = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    return _handlers[scheme](url, **kwargs)


def _builtin_handler(url: str, timeout: Any = None, **kwargs: Any) -> Iterator[Tuple[Any, int,
                                                                                    int]]:
    from .launch import rendezvous as _rendezvous

    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    base = urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(query=""))
    n = query.get("world_size")
    # plan() reads a world of one as "nothing to meet": read it as a world of two, then one
    want = int(n) if n is not None and n.strip().lstrip("-").isdigit() else None
    p = _rendezvous.plan(base, int(query.get("rank", -1)),
                         2 if want == 1 else (want if want is not None else -1), None)
    if p is None:
        raise ValueError(f"rendezvous: {url!r} gives no world_size (pass world_size=, set "
                         "WORLD_SIZE, or add ?world_size= to the URL)")
    if want == 1:
        p.world_size = 1
    seconds = (timeout.total_seconds() if hasattr(timeout, "total_seconds")
               else float(timeout) if timeout is not None else DEFAULT_TIMEOUT_S)
    store, _ = _rendezvous._open_store(p, seconds)
    yield store, p.rank, p.world_size
    raise RuntimeError(f"rendezvous: {url!r} cannot be used again (a rendezvous happens once)")


for _scheme in ("env", "tcp", "file"):
    register_rendezvous_handler(_scheme, _builtin_handler)


# ------------------------------------------------------------------------ record_comm
@contextlib.contextmanager
def record_comm(name: str) -> Iterator[None]:
    """Name the collectives called inside, in the messages of the errors their argument
    checks raise: ``rank 0: all_reduce [layer1 grads] (#4 on WORLD): ...`` (torch uses the
    name as the profiling title; there is no collective profiler here). Nests; the outer
    name comes back on exit.

    Raises:
        TypeError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"record_comm: name must be a string, got {name!r}")
    from .process_group import COMM_NAME

    outer = COMM_NAME[0]
    COMM_NAME[0] = name
    try:
        yield
    finally:
        COMM_NAME[0] = outer


# ----------------------------------------------------------------- the gloo group class
class _GlooType(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, ProcessGroup) and getattr(obj, "backend_label", None) == "gloo"


class ProcessGroupGloo(metaclass=_GlooType):
    """The class of the groups a ``"gloo"`` backend makes, for ``isinstance`` checks: here a
    gloo group is an MPI group (``isinstance(g, ProcessGroupGloo)`` holds for groups whose
    :func:`get_backend` is ``"gloo"``). Groups are made with ``init_process_group("gloo")``
    or ``new_group(backend="gloo")``, not by calling this class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("ProcessGroupGloo cannot be constructed directly here: gloo groups "
                           "are MPI groups; make one with init_process_group('gloo') or "
                           "new_group(ranks, backend='gloo')")


# ------------------------------------------------------------------------- breakpoint
def breakpoint(rank: int = 0, skip: int = 0, timeout_s: float = 3600) -> None:  # noqa: A001
    """Stop rank ``rank`` in the debugger (``pdb``), reading from the terminal even when the
    launcher has closed standard input; the other ranks wait in a barrier (up to
    ``timeout_s`` seconds) until it continues. ``skip`` > 0 ignores the first ``skip`` calls.
    """
    if skip > 0:
        count = _skips.get(id(breakpoint), 0) + 1
        _skips[id(breakpoint)] = count
        if count <= skip:
            return
    d = _dist()
    if d.get_rank() == rank:
        import pdb
        import sys

        tty = None
        try:
            tty = open("/dev/tty")  # stdin of an mpiexec rank is usually not the terminal
        except OSError:
            pass
        debugger = pdb.Pdb(stdin=tty) if tty is not None else pdb.Pdb()
        debugger.message(f"rank {rank}: distributed breakpoint (the other ranks wait); 'c' to "
                         "continue")
        debugger.set_trace(sys._getframe(1))
    world = d._pg(None)
    old = world.timeout
    world.set_timeout(float(timeout_s))
    try:
        d.barrier()
    finally:
        world.set_timeout(old)


_skips: Dict[int, int] = {}
