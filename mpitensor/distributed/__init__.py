"""``mpitensor.distributed``: the torch.distributed API on MPI.

Port a torch.distributed program by changing its imports::

    import mpitensor as torch
    import mpitensor.distributed as dist

    dist.init_process_group(backend="mpi")          # rank and size come from mpiexec
    t = torch.ones(4)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)         # in place: every rank now holds 4s

Rules shared by every function here:

* Tensors may be ``mpitensor.Tensor``, NumPy arrays or CuPy arrays, of any shape and of the
  dtypes bool, int8-int64, uint8-uint64, float16, bfloat16, float32, float64, complex64,
  complex128 (float16 and bfloat16 are reduced in float32 and rounded once).
  Outputs are written in place; contiguous buffers are never copied, non-contiguous ones are
  staged and written back.
* ``src``/``dst`` are *global* ranks, also when ``group=`` is given (as in torch); use
  ``group_src``/``group_dst`` for ranks inside the group.
* ``async_op=True`` returns a :class:`Work` handle (``wait()``, ``is_completed()``) backed by
  MPI's non-blocking operation; otherwise the call blocks and returns ``None``.
* Bad arguments raise ``ValueError``/``TypeError`` before any message is sent. Cross-rank
  agreement (same op, dtype, shape on every rank) is checked always for buffers of
  ``MPITENSOR_CHECK_BYTES`` (64 KiB) and more, and for every call when debug mode is on
  (``MPITENSOR_DEBUG=1`` or :func:`set_debug`), raising :class:`CollectiveMismatchError`.

Where each part lives: this module sets up the default group and makes groups; the functions
are in ``_collectives.py``, ``_p2p.py`` and ``_objects.py`` (each calls the public operations
of the group's backend, declared in ``process_group.py``), the default group in ``_world.py``.
"""

from __future__ import annotations

import logging
import os
import sys
import weakref
from typing import Any, List, Optional, Sequence, Tuple

from .._base import config as _config
from .._base import threads as _threads
from ..errors import (
    CollectiveMismatchError,
    DistributedTimeoutError,
    DtypeMismatchError,
    MessageMismatchError,
    MessageTruncatedError,
    MpiTensorError,
    NotAGroupMemberError,
    NotInitializedError,
    PeerFailedError,
)
from ._collectives import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    monitored_barrier,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
)
from ._objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    scatter_object_list,
)
from ._p2p import (
    P2POp,
    batch_isend_irecv,
    irecv,
    isend,
    recv,
    recv_object,
    recv_object_list,
    send,
    send_object,
    send_object_list,
)
from ._store import (
    DistError,
    DistNetworkError,
    DistStoreError,
    FileStore,
    HashStore,
    PrefixStore,
    Store,
    StoreTimeoutError,
    TCPStore,
)
from ._world import (
    Backend,
    _default,
    _pg,
    _state,
    _timeout_seconds,
    get_backend,
    get_rank,
    get_world_size,
    group,
)
from .backends.mpi import node_reduce as _node_reduce
from .health import watchdog as _watchdog
from .health.abort import (
    abort_handler_installed,
    abort_job,
    install_abort_handler,
    uninstall_abort_handler,
)
from .launch import (
    ProcessExitedException,
    ProcessRaisedException,
    SpawnContext,
    export_rank_env,
    launcher_rank,
    layout_from_env,
    spawn,
)
from .model_sync import average_gradients, broadcast_parameters
from .process_group import GroupMember, ProcessGroup, ReduceOp, Work, reduce_op

__all__ = [
    "Backend", "GroupMember", "P2POp", "ProcessGroup", "ReduceOp", "Work", "group", "reduce_op",
    "init_process_group", "destroy_process_group", "is_initialized", "is_available",
    "is_mpi_available", "is_nccl_available", "is_gloo_available", "get_backend", "get_rank",
    "get_default_backend_for_device",
    "get_world_size", "new_group", "get_global_rank", "get_group_rank",
    "get_process_group_ranks", "set_debug", "get_debug", "install_abort_handler", "abort_job",
    "uninstall_abort_handler", "spawn", "SpawnContext", "ProcessRaisedException",
    "ProcessExitedException", "average_gradients", "broadcast_parameters",
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object", "recv_object",
    "send_object_list", "recv_object_list",
    "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "gather",
    "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
    "barrier", "monitored_barrier", "new_subgroups", "new_subgroups_by_enumeration",
    "get_node_local_rank", "is_torchelastic_launched", "broadcast_object_list",
    "all_gather_object", "gather_object",
    "scatter_object_list",
    "MpiTensorError", "NotInitializedError", "NotAGroupMemberError", "CollectiveMismatchError",
    "MessageTruncatedError", "MessageMismatchError", "DistributedTimeoutError",
    "PeerFailedError", "DtypeMismatchError",
    "Store", "TCPStore", "FileStore", "HashStore", "PrefixStore", "DistError", "DistStoreError",
    "DistNetworkError", "StoreTimeoutError",
]

logger = logging.getLogger("mpitensor.distributed")


# ---------------------------------------------------------------------------- setup
def is_available() -> bool:
    """Return True: the distributed package is always available (MPI via mpi4py)."""
    return True


def is_mpi_available() -> bool:
    """Return True: mpi4py is a required dependency."""
    return True


def is_gloo_available() -> bool:
    """Return True: ``backend="gloo"`` is accepted as an alias of the CPU MPI path."""
    return True


def is_nccl_available() -> bool:
    """Return True when CuPy with NCCL support and a CUDA device are present."""
    from ..backend import nccl_unavailable_reason

    return nccl_unavailable_reason() == ""


def get_default_backend_for_device(device: Any) -> str:
    """Return the backend that serves tensors on ``device``: ``"mpi"`` for cpu, ``"nccl"`` for cuda.

    torch answers ``"gloo"`` for the CPU; mpitensor's CPU backend is ``"mpi"`` (``"gloo"`` is
    accepted as its alias), and this name is the one :func:`get_backend` reports.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a :class:`mpitensor.device`.

    Raises:
        TypeError: ``device`` is neither a string nor a device.
        ValueError: an unknown device type such as ``"tpu"`` (also a RuntimeError, as in torch).

    Example:
        >>> import mpitensor as torch, mpitensor.distributed as dist
        >>> dist.get_default_backend_for_device(torch.device("cuda:1"))
        'nccl'
    """
    from ..backend import device as _device

    if not isinstance(device, (str, _device)):
        raise TypeError(f"get_default_backend_for_device() takes a device or a string such as "
                        f"'cpu' or 'cuda', got {device!r}")
    return Backend.NCCL if _device(device).type == "cuda" else Backend.MPI


def is_initialized() -> bool:
    """Return True once :func:`init_process_group` has run (and not been destroyed)."""
    return _state.world is not None


def init_process_group(
    backend: Optional[str] = None,
    init_method: Optional[str] = None,
    timeout: Any = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
    abort_on_exception: Optional[bool] = None,
) -> None:
    """Initialize the default process group: MPI's world, or the processes that meet here.

    Under an MPI launcher (``mpiexec``, ``mpitensor-run``, ``srun``, ``spawn``) rank and size
    come from MPI, torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...) are set
    from MPI where absent, and ``init_method``/``store`` are unused. Processes no launcher
    started, given a ``world_size`` above 1, meet as torch's do, through ``init_method``
    (``"env://"`` by default, ``"tcp://host:port"``, ``"file:///path"``) or ``store``, and
    become one MPI world (``launch/rendezvous.py``, docs/launching.md).

    Args:
        backend: ``"mpi"`` (default), ``"nccl"`` (CuPy arrays through NCCL, CPU through MPI;
            without a GPU it means ``"mpi"``, with one info log line) or ``"gloo"`` (alias of
            ``"mpi"``, with one info log line). torch's ``"cpu:gloo,cuda:nccl"`` form is
            accepted too.
        init_method: where processes started without a launcher meet (above).
        timeout: bound on the rendezvous, on every blocking operation and ``Work.wait()`` of
            the group's operations, seconds or ``timedelta`` (default ``MPITENSOR_TIMEOUT`` or
            1800 s; ``float('inf')`` for none). Past it, ``DistributedTimeoutError`` names the
            operation, the group, the sequence number and the ranks that had not arrived; past
            ``MPITENSOR_STALL_WARN`` (default min(60 s, timeout / 2)) each waiting rank logs a
            stall report. After a timeout the group is unusable.
        world_size: under a launcher, if given, must equal MPI's world size (-1 and 0,
            torch's MPI placeholders, mean "not given"); without one, the number of
            processes that meet.
        rank: under a launcher, if given, must equal MPI's rank of this process (-1, and 0
            without a ``world_size``, mean "not given"); without one, this process's rank
            among those that meet.
        store: a Store to meet through instead of ``init_method`` (with ``rank`` and
            ``world_size``, as in torch).
        abort_on_exception: install the abort handler (an unhandled exception on any rank
            prints its traceback prefixed ``[rank N]`` and ends the whole job with
            ``MPI_Abort``, instead of leaving the other ranks waiting). Default: on when the
            world has more than one rank, unless ``MPITENSOR_ABORT_ON_EXCEPTION=0``.

    Raises:
        RuntimeError: the default group already exists.
        ValueError: ``rank``/``world_size`` contradict MPI, an unknown backend, or (without a
            launcher) a missing or malformed rendezvous setting, or ranks that disagree.
        StoreTimeoutError: without a launcher, not all ``world_size`` processes arrived within
            ``timeout`` (the message names which came).
        DistNetworkError: without a launcher, rank 0 cannot serve the rendezvous port (it is
            taken) or another rank cannot reach it.

    Example:
        >>> dist.init_process_group("mpi")
        >>> dist.get_rank(), dist.get_world_size()
        (0, 1)
    """
    if _state.world is not None:
        raise RuntimeError("trying to initialize the default process group twice; call "
                           "destroy_process_group() first")
    del group_name, pg_options
    name = _parse_backend(backend)
    seconds = _timeout_seconds(timeout)
    _threads.parse_env(os.environ)  # a malformed MPITENSOR_NUM_THREADS fails before MPI starts
    comm, joined = _world_comm(init_method, rank, world_size, store, seconds)
    mpi_rank, mpi_size = comm.Get_rank(), comm.Get_size()
    if not joined:
        _check_against_mpi(rank, world_size, mpi_rank, mpi_size)
    world = _make_world(comm, _backend_notice(name, mpi_rank), seconds, device_id)
    _adopt_world(world, comm, abort_on_exception)


def _adopt_world(world: ProcessGroup, comm: Any, abort_on_exception: Optional[bool]) -> None:
    """Make ``world`` the default group: torchrun's variables for its processes, and the
    abort handler (see :func:`init_process_group`)."""
    size = comm.Get_size()
    if size > 1 or launcher_rank(None) is not None:
        # torchrun's RANK, LOCAL_RANK, ... where the launcher did not set them (a plain python
        # process, a job of its own, is left alone, so its children inherit nothing stale)
        try:
            export_rank_env(comm)
        except BaseException:
            world.free()
            raise
    _state.world = world
    _state.groups.add(world)
    GroupMember.WORLD = world
    if abort_on_exception is None:
        abort_on_exception = _config.ABORT_ON_EXCEPTION and size > 1
    if abort_on_exception and not abort_handler_installed():
        install_abort_handler()
        _state.installed_abort_handler = True


def _world_comm(init_method: Any, rank: Any, world_size: Any, store: Any,
                seconds: float) -> "tuple[Any, bool]":
    """The communicator the default group is made on, and whether processes joined to make
    it: some processes of a larger job (RPC over all, DDP over k trainers, ``launch/subjob``),
    the processes that met here (:func:`_meet`), or else MPI's world."""
    from .launch import subjob as _subjob

    joined = _subjob.within(init_method, rank, world_size, store, seconds)
    if joined is None:
        joined = _meet(init_method, rank, world_size, store, seconds)
    if joined is not None:
        return joined, True
    from mpi4py import MPI

    return MPI.COMM_WORLD, False


def _meet(init_method: Any, rank: Any, world_size: Any, store: Any, seconds: float) -> Any:
    """The communicator of the processes that meet through ``init_method``/``store``, or
    ``None`` where MPI's world is the group (a launcher started this process, MPI already
    has a world of several, or there is no world of several to meet)."""
    if launcher_rank(None) is not None:
        return None  # the launcher did the rendezvous: init_method and store are unused
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and mpi.COMM_WORLD.Get_size() > 1:
        return None  # a world of several already (an earlier rendezvous, another launcher)
    from .launch import rendezvous as _rendezvous

    plan = _rendezvous.plan(init_method, rank, world_size, store)
    if plan is None:
        return None
    earlier = _rendezvous.previous(plan)
    if earlier is not None:
        return earlier
    try:
        return _rendezvous.join(plan, seconds)
    except MpiTensorError as exc:
        from .._base import mpi_import as _mpi_import

        site = _mpi_import.site()
        if site is None or "initialized MPI before init_process_group" not in str(exc):
            raise
        # say which line to move: the import that started MPI in this process
        raise type(exc)(f"{exc}. In this process (rank {plan.rank}) mpi4py.MPI, which starts "
                        f"MPI, was first imported at {site}: move that import below "
                        "init_process_group") from exc


def _gpu_present() -> bool:
    """Whether this host has a CUDA device (CuPy sees one, or a device node exists)."""
    from ..backend import cupy_unavailable_reason

    if cupy_unavailable_reason() == "":
        return True
    import glob

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible not in ("", "-1") and bool(glob.glob("/dev/nvidia[0-9]*"))


def _backend_notice(name: str, rank: int) -> str:
    """The label a group gets for backend ``name``: ``"gloo"`` and, without a GPU,
    ``"nccl"`` run on the MPI path, said once per process in one info line (rank 0)."""
    if name == Backend.GLOO or (name == Backend.NCCL and not _gpu_present()):
        if not _state.gloo_notice_given:
            _state.gloo_notice_given = True
            if rank == 0:
                logger.info("backend %r runs on mpitensor's MPI path (same API and results)%s",
                            str(name), "; no GPU here, so NCCL is not used"
                            if name == Backend.NCCL else "")
        return Backend.GLOO if name == Backend.GLOO else Backend.MPI
    return name


def _check_against_mpi(rank: Any, world_size: Any, mpi_rank: int, mpi_size: int) -> None:
    """``rank``/``world_size`` given to init_process_group must be MPI's.

    Not given: ``None`` or -1, and the placeholders of torch's MPI recipes (``world_size=0``;
    ``rank=0`` without a world size), which torch ignores for MPI too.
    """
    size_given = world_size is not None and (isinstance(world_size, bool)
                                             or world_size not in (-1, 0))
    rank_given = rank not in (None, -1) and (rank != 0 or size_given or rank is False)
    launched = launcher_rank(None) is not None
    for what, given, actual in (("world_size", world_size, mpi_size), ("rank", rank, mpi_rank)):
        if not (size_given if what == "world_size" else rank_given):
            continue
        if isinstance(given, bool) or not isinstance(given, int) or given != actual:
            msg = (f"init_process_group: {what}={given!r} contradicts MPI, which says {what} is "
                   f"{actual} (rank {mpi_rank} of {mpi_size})")
            if mpi_size == 1 and not launched:
                raise ValueError(
                    f"{msg}: this process was started without an MPI launcher and given no "
                    "world_size above 1, so it is a world of its own. For processes started "
                    "by multiprocessing or by hand, pass world_size=N and each one's rank "
                    "(they meet through MASTER_ADDR/MASTER_PORT, or init_method); or start all "
                    "of them with `mpiexec -n N python script.py`, `mpitensor-run "
                    "--nproc-per-node N script.py`, or mpitensor.multiprocessing.spawn")
            raise ValueError(f"{msg}; drop the argument and let mpiexec set it, or launch with "
                             "`mpiexec -n N`")
    env_rank = os.environ.get("RANK")
    if env_rank not in (None, "") and env_rank.isdigit() and int(env_rank) != mpi_rank:
        logger.warning("RANK=%s in the environment is ignored: MPI says this is rank %d",
                       env_rank, mpi_rank)


def _make_world(comm: Any, name: str, seconds: float, device_id: Any) -> ProcessGroup:
    """The default group on a duplicate of ``comm``, fitted to its node (and NCCL if asked)."""
    from .backends.mpi.group import MPIGroup

    rank, size = comm.Get_rank(), comm.Get_size()
    own = _watchdog.timed_dup(comm, seconds, "init_process_group")
    _share_node(comm, rank, size)  # (first: the group's board times calls as the node allows)
    world: ProcessGroup = MPIGroup(own, list(range(size)), rank, "WORLD", seconds,
                                   _state.debug, size)
    if name == Backend.NCCL:
        from .backends.nccl import NCCLGroup

        try:
            world = NCCLGroup(world, device_id)
        except BaseException:
            world.free()  # leave nothing half-made: release the duplicated communicator
            raise
    world.backend_label = name
    return world


def _share_node(comm: Any, rank: int, size: int) -> None:
    """Fit this rank to the node it shares: polling (``_watchdog``) and BLAS/OpenMP threads."""
    mine = _threads.affinity()
    everyone: list = [mine]
    if size > 1:
        from mpi4py import MPI

        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            everyone = [frozenset(s) for s in node.allgather(sorted(mine))]
        finally:
            node.Free()
        cpus = len(frozenset().union(*everyone))  # the CPUs the node's ranks may use
        _watchdog.set_node_load(len(everyone), cpus)
        _node_reduce.note_node(len(everyone), cpus)
    _threads.apply_node_budget(mine, everyone, rank)


def _parse_backend(backend: Optional[str]) -> str:
    if backend is None:
        return Backend.MPI
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a string such as 'mpi', got {backend!r}")
    b = backend.strip().lower()
    if ":" in b:  # torch's "cpu:gloo,cuda:nccl" form
        parts = dict(p.split(":", 1) for p in b.split(",") if ":" in p)
        unknown = set(parts.values()) - {"mpi", "gloo", "nccl"}
        if unknown:
            raise ValueError(f"unknown backend(s) {sorted(unknown)} in {backend!r}")
        return Backend.NCCL if parts.get("cuda") == "nccl" else Backend.MPI
    if b in (Backend.MPI, Backend.GLOO, Backend.NCCL):
        return Backend(b)
    raise ValueError(f"unknown backend {backend!r}: use 'mpi', 'nccl' or 'gloo' (an alias of "
                     "'mpi'); 'ucc' and custom backends are not provided by mpitensor")


def destroy_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Free a group's communicator; with no argument, the default group and every sub-group."""
    if group is None or group is _state.world:
        if _state.world is None:
            raise NotInitializedError("destroy_process_group: the default process group is not "
                                      "initialized")
        for g in list(_state.groups):
            g.free()
        _state.groups = weakref.WeakSet()
        _state.world = None
        GroupMember.WORLD = None
        if _state.installed_abort_handler:
            uninstall_abort_handler()
            _state.installed_abort_handler = False
        return
    group.free()
    _state.groups.discard(group)


def set_debug(enabled: bool = True) -> None:
    """Turn cross-rank argument checks on or off for every group (same as MPITENSOR_DEBUG=1).

    Every rank must make the same call: the setting changes what each collective sends.
    """
    _state.debug = bool(enabled)
    for g in list(_state.groups):
        g.debug = _state.debug


def get_debug() -> bool:
    """Return True when debug-mode checks are on."""
    return _state.debug


# ---------------------------------------------------------------------------- groups
def new_group(ranks: Optional[Sequence[int]] = None, timeout: Any = None,
              backend: Optional[str] = None, pg_options: Any = None,
              use_local_synchronization: bool = False, group_desc: Optional[str] = None,
              device_id: Any = None) -> ProcessGroup:
    """Create a sub-group of the given global ranks (sorted, as in torch).

    Every rank of the world should call it with the same ``ranks``, in the same order as its
    other ``new_group`` calls; only the members communicate. Non-members get a group object
    whose ``get_rank`` is -1 and whose operations raise :class:`NotAGroupMemberError`.

    Example:
        >>> evens = dist.new_group([0, 2])
        >>> if dist.get_rank(evens) >= 0:
        ...     dist.all_reduce(t, group=evens)
    """
    world = _default()
    n = world.world_size
    if ranks is None:
        ranks = list(range(n))
    try:
        ranks = [r.__index__() for r in ranks]
    except (AttributeError, TypeError):
        raise TypeError(f"new_group: ranks must be a list of ints, got {ranks!r}") from None
    bad = [r for r in ranks if not 0 <= r < n]
    if bad:
        raise ValueError(f"new_group: ranks {bad} are out of range for world size {n}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"new_group: ranks {ranks} contain duplicates")
    if not ranks:
        raise ValueError("new_group: ranks must not be empty")
    ranks = sorted(ranks)
    _state.group_count += 1
    name = group_desc or f"group{_state.group_count}{ranks}"
    seconds = _timeout_seconds(timeout) if timeout is not None else None
    sub = world.split(ranks, name, seconds)
    if seconds is not None:
        sub.set_timeout(seconds)
    label = (_backend_notice(_parse_backend(backend), world.rank_) if backend is not None
             else world.backend_label)
    if label == Backend.NCCL and sub.is_member:
        from .backends.nccl import NCCLGroup

        try:
            sub = NCCLGroup(sub, device_id)
        except BaseException:
            sub.free()  # leave nothing half-made: release the sub-group's communicator
            raise
    sub.backend_label = label
    _state.groups.add(sub)
    return sub


def get_process_group_ranks(group: Optional[ProcessGroup]) -> List[int]:
    """Return the global ranks of ``group``'s members, in group-rank order."""
    return list(_pg(group).ranks)


def get_global_rank(group: Optional[ProcessGroup], group_rank: int) -> int:
    """Translate a rank inside ``group`` to its global rank."""
    pg = _pg(group)
    r = pg.check_group_rank(group_rank, "group_rank", f"get_global_rank on {pg.name}")
    return pg.ranks[r]


def get_group_rank(group: Optional[ProcessGroup], global_rank: int) -> int:
    """Translate a global rank to its rank inside ``group`` (ValueError if not a member)."""
    pg = _pg(group)
    return pg.group_rank_of(global_rank, "global_rank", f"get_group_rank on {pg.name}")


# ------------------------------------------------------------------ barriers, subgroups, env


def is_torchelastic_launched() -> bool:
    """Whether torchrun (torch elastic) started this process: ``TORCHELASTIC_RUN_ID`` is set,
    as torch decides."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def get_node_local_rank(fallback_rank: Optional[int] = None) -> int:
    """This process's rank on its node: ``LOCAL_RANK`` (torchrun, ``mpitensor-run``, and
    ``init_process_group`` under an MPI launcher set it), else the MPI launcher's own variable
    (``MPI_LOCALRANKID``, ``OMPI_COMM_WORLD_LOCAL_RANK``, ...), else ``fallback_rank``.

    Raises:
        RuntimeError: none of these is known and no ``fallback_rank`` was given.
    """
    value = os.environ.get("LOCAL_RANK", "").strip()
    if value.isascii() and value.isdigit():
        return int(value)
    local = layout_from_env().local_rank
    if local is not None:
        return local
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("get_node_local_rank(): LOCAL_RANK is not set and no MPI launcher said "
                       "which rank this is on its node; launch with torchrun, mpitensor-run or "
                       "mpiexec, or pass fallback_rank")


def _check_ranks_lists(lists: Sequence[Sequence[int]], world: int, fname: str) -> List[List[int]]:
    out: List[List[int]] = []
    seen: set = set()
    for ranks in lists:
        try:
            ranks = [r.__index__() for r in ranks]
        except (AttributeError, TypeError):
            raise TypeError(f"{fname}: each subgroup must be a list of ints, got "
                            f"{ranks!r}") from None
        again = seen.intersection(ranks)
        if again:
            raise ValueError(f"{fname}: rank {min(again)} is in more than one subgroup")
        seen.update(ranks)
        out.append(ranks)
    return out


def new_subgroups_by_enumeration(ranks_per_subgroup_list: Sequence[Sequence[int]],
                                 timeout: Any = None, backend: Optional[str] = None,
                                 pg_options: Any = None, group_desc: Optional[str] = None
                                 ) -> Tuple[Any, List[Any]]:
    """Make one group per list of global ranks; return ``(this rank's group, all of them)``.

    Every rank calls it with the same lists (each ``new_group`` is collective). A rank in no
    list gets None as its group, as in torch.

    Raises:
        ValueError: an empty list of subgroups, or a rank in more than one subgroup.
    """
    world = _default()
    lists = _check_ranks_lists(ranks_per_subgroup_list, world.world_size,
                               "new_subgroups_by_enumeration")
    if not lists:
        raise ValueError("new_subgroups_by_enumeration: the list of subgroups is empty")
    mine, groups = None, []
    for i, ranks in enumerate(lists):
        desc = f"{group_desc}_{i}" if group_desc else None
        g = new_group(ranks, timeout=timeout, backend=backend, pg_options=pg_options,
                      group_desc=desc)
        groups.append(g)
        if world.rank_ in ranks:
            mine = g
    return mine, groups


def new_subgroups(group_size: Optional[int] = None, group: Any = None, timeout: Any = None,
                  backend: Optional[str] = None, pg_options: Any = None,
                  group_desc: Optional[str] = None) -> Tuple[Any, List[Any]]:
    """Cut the world into consecutive groups of ``group_size`` ranks (default: the ranks per
    node, as torch's default of one group per node's GPUs); return ``(this rank's group, all
    of them)``.

    Raises:
        ValueError: ``group_size`` not positive, larger than the world, or not dividing it.
    """
    world = _default()
    n = world.world_size
    if group is not None:
        raise ValueError("new_subgroups: group= is not supported here; cut the world, or "
                         "list the subgroups with new_subgroups_by_enumeration")
    if group_size is None:
        group_size = layout_from_env().local_size or int(
            os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or n
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ValueError(f"new_subgroups: group_size must be a positive int, got "
                         f"{group_size!r}")
    if group_size > n:
        raise ValueError(f"new_subgroups: group_size {group_size} exceeds the world size {n}")
    if n % group_size:
        raise ValueError(f"new_subgroups: the world size {n} is not divisible by group_size "
                         f"{group_size}")
    lists = [list(range(s, s + group_size)) for s in range(0, n, group_size)]
    return new_subgroups_by_enumeration(lists, timeout=timeout, backend=backend,
                                        pg_options=pg_options, group_desc=group_desc)


# ------------------------------------------------ torch.distributed's smaller members, DDP hooks
from . import _c10d  # noqa: E402
from ._c10d import (  # noqa: E402 - they look up this package's functions when called
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BackendConfig,
    BarrierOptions,
    BroadcastOptions,
    DebugLevel,
    DistBackendError,
    GatherOptions,
    GroupName,
    ProcessGroupGloo,
    QueueEmptyError,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    all_gather_coalesced,
    all_gather_single,
    all_reduce_coalesced,
    breakpoint,  # noqa: F401 - torch's dist.breakpoint (kept out of __all__)
    default_pg_timeout,
    get_backend_config,
    get_debug_level,
    get_pg_count,
    is_backend_available,
    is_ucc_available,
    is_xccl_available,
    record_comm,
    reduce_scatter_single,
    register_rendezvous_handler,
    rendezvous,
    set_debug_level,
    set_debug_level_from_env,
    split_group,
    supports_complex,
)

_c10d._package = sys.modules[__name__]
from ._grad_bucket import BuiltinCommHookType, GradBucket  # noqa: E402

__all__ += [
    "AllToAllOptions", "AllreduceCoalescedOptions", "AllreduceOptions", "BackendConfig",
    "BarrierOptions", "BroadcastOptions", "DebugLevel", "DistBackendError", "GatherOptions",
    "GroupName", "ProcessGroupGloo", "QueueEmptyError", "ReduceOptions", "ReduceScatterOptions",
    "ScatterOptions", "all_gather_coalesced", "all_gather_single", "all_reduce_coalesced",
    "default_pg_timeout", "get_backend_config", "get_debug_level", "get_pg_count",
    "is_backend_available", "is_ucc_available", "is_xccl_available",
    "register_rendezvous_handler", "rendezvous", "reduce_scatter_single", "set_debug_level",
    "set_debug_level_from_env", "split_group", "supports_complex", "BuiltinCommHookType",
    "GradBucket", "record_comm", "DeviceMesh", "init_device_mesh",
]
# breakpoint stays out of __all__: a star import must not hide the builtin


def __getattr__(name: str) -> Any:
    # torch.distributed.DeviceMesh and init_device_mesh: the device_mesh module's, loaded on
    # first use (that module imports this package, so importing it here would be a cycle)
    if name in ("DeviceMesh", "init_device_mesh"):
        import importlib

        return getattr(importlib.import_module(".device_mesh", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
