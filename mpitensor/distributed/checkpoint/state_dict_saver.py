"""``save``: every rank writes its own chunks, in parallel, into one atomically placed directory."""

from __future__ import annotations

import concurrent.futures
import copy
import enum
import logging
import threading
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from mpitensor.distributed.checkpoint import _planning as plan_
from mpitensor.distributed.checkpoint import metadata as md
from mpitensor.distributed.checkpoint import stateful
from mpitensor.distributed.checkpoint._collective import (
    Group,
    fail,
    private,
    threads_may_communicate,
)
from mpitensor.distributed.checkpoint._format import torch_dtype_name
from mpitensor.distributed.checkpoint.default_planner import DefaultSavePlanner
from mpitensor.distributed.checkpoint.filesystem import CheckpointError, FileSystemWriter, storage

__all__ = ["save", "async_save", "AsyncCheckpointerType"]

_log = logging.getLogger(__name__)

Key = Tuple[str, Optional[plan_.Box]]


def _compact(t: Any, staged: bool = False, cached: Any = None) -> Any:
    """``t`` detached, contiguous, and with storage of its own size (a ``torch.save`` record
    holds a view's whole storage: a slice of a big tensor would write all of it); ``staged``:
    always a copy of its own, in host memory (into ``cached`` where it fits)."""
    t = t.detach().contiguous()
    if staged:
        host = t.cpu()
        if cached is not None and cached.shape == host.shape and cached.dtype == host.dtype:
            np.copyto(cached.numpy(), host.numpy())
            return cached
        return host.clone() if host is t or _shares(host, t) else host
    try:
        owns = t.numpy().flags.owndata
    except TypeError:  # a GPU tensor: copy rather than ask
        owns = False
    return t if owns else t.clone()


def _shares(a: Any, b: Any) -> bool:
    try:
        return bool(np.shares_memory(a.numpy(), b.numpy()))
    except TypeError:  # b is on a GPU: a is a copy
        return False


def _local_plan(state_dict: Any, staged: bool = False, cache: Optional[Dict[Key, Any]] = None
                ) -> Tuple[List[plan_.PlanItem], Dict[Key, Any], List[str]]:
    """This rank's plan items, what it would write for each, and what is wrong locally;
    ``staged``: the values written are copies, taken now (kept in ``cache`` if given)."""
    items: List[plan_.PlanItem] = []
    payload: Dict[Key, Any] = {}
    try:
        leaves = plan_.flatten(state_dict)
        for leaf in leaves:
            entry = plan_.tensor_entry(leaf.value)
            if entry is None:
                items.append(plan_.PlanItem(leaf.fqn, leaf.path, False))
                payload[(leaf.fqn, None)] = copy.deepcopy(leaf.value) if staged else leaf.value
                continue
            items.append(plan_.PlanItem(leaf.fqn, leaf.path, True, entry.shape,
                                        torch_dtype_name(entry.dtype), entry.box))
            if entry.box is not None:
                key = (leaf.fqn, entry.box)
                payload[key] = _compact(entry.local, staged, (cache or {}).get(key))
                if cache is not None:
                    cache[key] = payload[key]
    except (TypeError, ValueError) as exc:
        return [], {}, [str(exc)]
    except (copy.Error, AttributeError, RuntimeError) as exc:  # a value deepcopy cannot copy
        return [], {}, [f"cannot stage a copy of a value for async_save: {exc}"]
    if cache is not None:  # copies of entries this save no longer has are let go
        for gone in [k for k in cache if k not in payload]:
            del cache[gone]
    return items, payload, []


def _metadata(plans: List[List[plan_.PlanItem]], where: Dict[md.MetadataIndex, md.StorageInfo],
              path: str, save_id: str) -> md.Metadata:
    entries: Dict[str, md.STORAGE_TYPES] = {}
    paths: Dict[str, Tuple[Any, ...]] = {}
    chunks: Dict[str, List[plan_.Box]] = {}
    for fqn, box in plan_.unique_chunks(plans):
        if box is not None:
            chunks.setdefault(fqn, []).append(box)
    for plan in plans:
        for item in plan:
            if item.fqn in entries:
                continue
            paths[item.fqn] = item.path
            if not item.tensor:
                entries[item.fqn] = md.BytesStorageMetadata()
                continue
            props = md.TensorProperties(plan_._format._BY_TORCH_NAME[item.dtype])
            boxes = sorted(chunks.get(item.fqn, []))
            entries[item.fqn] = md.TensorStorageMetadata(
                props, item.shape, [md.ChunkStorageMetadata(o, s) for o, s in boxes])
    return md.Metadata(entries, paths, where, md.StorageMeta(path, save_id), "1.0.0")


def _indexed(plans: List[List[plan_.PlanItem]], mine: List[Key]) -> List[md.MetadataIndex]:
    order: Dict[str, List[plan_.Box]] = {}
    for fqn, box in plan_.unique_chunks(plans):
        if box is not None:
            order.setdefault(fqn, []).append(box)
    out = []
    for fqn, box in mine:
        if box is None:
            out.append(md.MetadataIndex(fqn))
        else:
            out.append(md.MetadataIndex(fqn, box[0], sorted(order[fqn]).index(box)))
    return out


def save(state_dict: Dict[str, Any], *, checkpoint_id: Any = None,
         storage_writer: Optional[FileSystemWriter] = None,
         planner: Optional[DefaultSavePlanner] = None, process_group: Any = None,
         no_dist: bool = False) -> md.Metadata:
    """Save a state dict as a distributed checkpoint: one file per rank plus ``.metadata``.

    Call it on every rank of ``process_group`` with that rank's state dict. Plain tensors are
    taken to be the same on every rank holding them and written once (the ranks share that
    work); a ``DTensor`` or :class:`LocalShard` is written by the rank that holds it (a chunk
    replicated over several ranks once). A top-level value that is
    :class:`~.stateful.Stateful` is saved as its ``state_dict()``. Other values are pickled
    whole. The directory appears complete or not at all, replacing any previous checkpoint
    there (see ``filesystem``). The layout is torch's: ``torch.distributed.checkpoint.load``
    reads it. Without an initialised process group (or with ``no_dist``) this process saves
    alone.

    Args:
        state_dict: nested dicts (and lists) of tensors, DTensors, LocalShards and objects.
        checkpoint_id: the checkpoint directory (a str or os.PathLike).
        storage_writer: a :class:`FileSystemWriter` (``checkpoint_id``, if given, overrides its
            path).
        planner: a :class:`DefaultSavePlanner` (or None).
        process_group: the ranks that save together (default: the whole job).
        no_dist: save from this process alone, even inside a job.

    Returns:
        The checkpoint's :class:`Metadata`, the same on every rank.

    Raises:
        CheckpointError: the directory cannot be written, or a rank failed (raised on every
            rank; the previous checkpoint, if any, is unchanged).
        ValueError, TypeError: the state dicts are inconsistent across ranks (shapes, dtypes,
            sharding), hold an unsupported value, or a Stateful's ``state_dict()`` failed or
            returned no dict (raised on every rank before any write).

    Example:
        >>> import mpitensor.distributed.checkpoint as dcp  # doctest: +SKIP
        >>> dcp.save({"model": model.state_dict()}, checkpoint_id="ckpt/step100")
    """
    job = _prepare(state_dict, checkpoint_id, storage_writer, planner, process_group, no_dist,
                  staged=False)
    staging, save_id = _begin(job)
    return _finish(job, job.group, staging, save_id)


@dataclass
class _SaveJob:
    """A save, planned and agreed on by every rank: what this rank writes, and where."""

    group: Group
    writer: FileSystemWriter
    plans: List[List[plan_.PlanItem]]
    writers: Dict[Key, int]
    payload: Dict[Key, Any]


def _prepare(state_dict: Dict[str, Any], checkpoint_id: Any, storage_writer: Any, planner: Any,
            process_group: Any, no_dist: bool, staged: bool) -> _SaveJob:
    """Plan a save on every rank (collective); ``staged``: copy what is written, so that the
    caller may change its tensors while the copies are written."""
    writer = storage("save", state_dict, planner, DefaultSavePlanner, checkpoint_id,
                     storage_writer, FileSystemWriter)
    group = Group(process_group, no_dist)
    state_dict, _, problems = stateful._expand(state_dict)
    cache = writer.staged_cache if staged else None
    items, payload, local = (_local_plan(state_dict, staged, cache) if not problems
                             else ([], {}, []))
    gathered = group.all_gather((items, problems + local, writer.path))
    paths = {g[2] for g in gathered}
    if len(paths) > 1:
        raise ValueError(f"save(): the ranks name different checkpoint directories "
                         f"({', '.join(sorted(paths))}); every rank must pass the same one")
    fail([g[1] for g in gathered], "save(): cannot save this state_dict", ValueError)
    plans = [g[0] for g in gathered]
    # every rank holds the same plans, so every rank finds the same problems
    fail([plan_.check_plans(plans)], "save(): the ranks' state_dicts do not fit together",
         ValueError)
    writers = plan_.assign(plans)
    if planner is not None and planner.dedup_save_to_lowest_rank:
        writers = {k: holders[0] for k, holders in plan_.unique_chunks(plans).items()}
    return _SaveJob(group, writer, plans, writers, payload)


def _begin(job: _SaveJob) -> Tuple[str, str]:
    """The coordinator makes the staging directory (collective): its path and the save's id."""
    group, writer = job.group, job.writer
    start: Tuple[Optional[str], str, str] = (None, "", "")
    if group.rank == 0:
        try:
            start = (writer.prepare(), uuid.uuid4().hex, "")
        except (OSError, CheckpointError) as exc:
            start = (None, "", str(exc))
    staging, save_id, error = group.broadcast(start)
    if staging is None:
        raise CheckpointError(f"save() to {writer.path}: {error}")
    return staging, save_id


def _finish(job: _SaveJob, group: Group, staging: str, save_id: str) -> md.Metadata:
    """Write this rank's files, then agree over ``group`` and put the checkpoint in place."""
    writer, plans, writers, payload = job.writer, job.plans, job.writers, job.payload
    mine = [k for k, r in writers.items() if r == group.rank]
    where: Dict[md.MetadataIndex, md.StorageInfo] = {}
    problem = ""
    try:
        where = writer.write_items(staging, group.rank,
                                   list(zip(_indexed(plans, mine), (payload[k] for k in mine))))
    except Exception as exc:  # noqa: BLE001 - every rank must still reach the agreement below
        problem = f"rank {group.rank} could not write its file: {type(exc).__name__}: {exc}"
    try:
        results = group.all_gather((where, problem))
    except BaseException:  # a peer is gone or timed out: drop the staging dir and its lock
        if group.rank == 0:
            writer.abort()
        raise
    failed = [p for _, p in results if p]
    merged: Dict[md.MetadataIndex, md.StorageInfo] = {}
    for w, _ in results:
        merged.update(w)
    meta = _metadata(plans, merged, writer.path, save_id)
    outcome = ""
    if group.rank == 0:
        try:
            if failed:
                writer.abort()
            else:
                writer.commit(meta)
        except OSError as exc:
            writer.abort()
            outcome = f"cannot put the checkpoint in place: {exc}"
    outcome = group.broadcast(outcome)
    if failed or outcome:
        raise CheckpointError(f"save() to {writer.path} failed; the previous checkpoint there "
                              f"(if any) is unchanged: " + "; ".join(failed or [outcome]))
    return meta


class AsyncCheckpointerType(enum.Enum):
    """Where ``async_save`` writes: a thread of this process (the only kind here)."""

    THREAD = "thread"
    PROCESS = "process"


class _InFlight:
    """The one ``async_save`` of this process still writing, if any (saves run one at a time)."""

    lock = threading.Lock()
    future: Optional[concurrent.futures.Future] = None

    @classmethod
    def wait(cls) -> None:
        with cls.lock:
            previous = cls.future
        if previous is not None:
            concurrent.futures.wait([previous])  # its failure stays in its own future


def async_save(state_dict: Dict[str, Any], *, checkpoint_id: Any = None,
               storage_writer: Optional[FileSystemWriter] = None,
               planner: Optional[DefaultSavePlanner] = None, process_group: Any = None,
               async_checkpointer_type: Any = AsyncCheckpointerType.THREAD,
               async_stager: Any = None, no_dist: bool = False) -> concurrent.futures.Future:
    """Save as :func:`save` does, writing in the background: training goes on meanwhile.

    Before it returns, every rank copies what it will write into host memory (so the
    checkpoint holds the values at the call, whatever the program changes afterwards), the
    ranks agree on the plan and the coordinator makes the staging directory: bad input raises
    here, on every rank, as in :func:`save`. The files are then written by a thread, which
    agrees on the outcome with the other ranks over a communicator of its own (made at the
    first ``async_save`` on a process group), never over the program's group. The checkpoint
    appears complete or not at all, as with :func:`save`. An ``async_save`` called while
    another is still writing waits for it first.

    Args:
        state_dict, checkpoint_id, storage_writer, planner, process_group, no_dist: as
            :func:`save`.
        async_checkpointer_type: ``AsyncCheckpointerType.THREAD`` (a writer process is not
            supported).
        async_stager: must be None (the copies are made as described above).

    Returns:
        A ``concurrent.futures.Future``: ``result()`` waits for the write and returns the
        :class:`Metadata`, or raises the save's error (a failed save is also logged).

    Raises:
        ValueError, TypeError, CheckpointError: as :func:`save`, before anything is written.
        NotImplementedError: a writer process or a custom stager was asked for.

    Example:
        >>> fut = dcp.async_save({"model": model.state_dict()}, checkpoint_id="ck/step3")
        ... # doctest: +SKIP
        >>> train_more(); fut.result()  # doctest: +SKIP
    """
    kind = AsyncCheckpointerType(getattr(async_checkpointer_type, "value",
                                         async_checkpointer_type))
    if kind is not AsyncCheckpointerType.THREAD:
        raise NotImplementedError("async_save: only AsyncCheckpointerType.THREAD is supported; "
                                  "the checkpoint is written by a thread of this process")
    if async_stager is not None:
        raise NotImplementedError("async_save: async_stager is not supported; async_save "
                                  "copies the state into host memory itself before returning")
    _InFlight.wait()
    job = _prepare(state_dict, checkpoint_id, storage_writer, planner, process_group, no_dist,
                  staged=True)
    background = private(job.group)
    staging, save_id = _begin(job)
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_running_or_notify_cancel()
    if background is not job.group and not threads_may_communicate():
        _log.info("async_save: MPI runs below MPI_THREAD_MULTIPLE, so %s is written before "
                  "async_save returns", job.writer.path)
        _finish_into(future, job, background, staging, save_id)
        return future
    with _InFlight.lock:
        _InFlight.future = future
    threading.Thread(target=_finish_into, args=(future, job, background, staging, save_id),
                     name="mpitensor-async-save", daemon=False).start()
    return future


def _finish_into(future: concurrent.futures.Future, job: _SaveJob, group: Group, staging: str,
                 save_id: str) -> None:
    try:
        future.set_result(_finish(job, group, staging, save_id))
    except BaseException as exc:  # noqa: BLE001 - handed to the future's result()
        _log.error("async_save to %s failed: %s", job.writer.path, exc)
        future.set_exception(exc)


def save_state_dict(state_dict: Dict[str, Any], storage_writer: FileSystemWriter,
                    process_group: Any = None, coordinator_rank: int = 0, no_dist: bool = False,
                    planner: Optional[DefaultSavePlanner] = None) -> md.Metadata:
    """torch's older name for :func:`save` (the writer given positionally; deprecated there
    too: it warns). ``coordinator_rank`` is accepted; rank 0 of the group writes the metadata.
    """
    warnings.warn("save_state_dict is deprecated: use dcp.save(state_dict, storage_writer=...)",
                  FutureWarning, stacklevel=2)
    return save(state_dict, storage_writer=storage_writer, process_group=process_group,
                no_dist=no_dist, planner=planner)
