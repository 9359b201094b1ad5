"""``save``: every rank writes its own chunks, in parallel, into one atomically placed directory."""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional, Tuple

from mpitensor.distributed.checkpoint import _planning as plan_
from mpitensor.distributed.checkpoint import metadata as md
from mpitensor.distributed.checkpoint._collective import Group, fail
from mpitensor.distributed.checkpoint._format import torch_dtype_name
from mpitensor.distributed.checkpoint.default_planner import DefaultSavePlanner
from mpitensor.distributed.checkpoint.filesystem import CheckpointError, FileSystemWriter, storage

__all__ = ["save"]

Key = Tuple[str, Optional[plan_.Box]]


def _compact(t: Any) -> Any:
    """``t`` detached, contiguous, and with storage of its own size (a ``torch.save`` record
    holds a view's whole storage: a slice of a big tensor would write all of it)."""
    t = t.detach().contiguous()
    try:
        owns = t.numpy().flags.owndata
    except TypeError:  # a GPU tensor: copy rather than ask
        owns = False
    return t if owns else t.clone()


def _local_plan(state_dict: Any) -> Tuple[List[plan_.PlanItem], Dict[Key, Any], List[str]]:
    """This rank's plan items, what it would write for each, and what is wrong locally."""
    items: List[plan_.PlanItem] = []
    payload: Dict[Key, Any] = {}
    try:
        leaves = plan_.flatten(state_dict)
        for leaf in leaves:
            entry = plan_.tensor_entry(leaf.value)
            if entry is None:
                items.append(plan_.PlanItem(leaf.fqn, leaf.path, False))
                payload[(leaf.fqn, None)] = leaf.value
                continue
            items.append(plan_.PlanItem(leaf.fqn, leaf.path, True, entry.shape,
                                        torch_dtype_name(entry.dtype), entry.box))
            if entry.box is not None:
                payload[(leaf.fqn, entry.box)] = _compact(entry.local)
    except (TypeError, ValueError) as exc:
        return [], {}, [str(exc)]
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
    replicated over several ranks once). Other values are pickled whole. The directory appears
    complete or not at all, replacing any previous checkpoint there (see ``filesystem``). The
    layout is torch's: ``torch.distributed.checkpoint.load`` reads it.

    Args:
        state_dict: nested dicts (and lists) of tensors, DTensors, LocalShards and objects.
        checkpoint_id: the checkpoint directory.
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
            sharding) or hold an unsupported value (raised on every rank before any write).

    Example:
        >>> import mpitensor.distributed.checkpoint as dcp  # doctest: +SKIP
        >>> dcp.save({"model": model.state_dict()}, checkpoint_id="ckpt/step100")
    """
    writer = storage("save", state_dict, planner, DefaultSavePlanner, checkpoint_id,
                     storage_writer, FileSystemWriter)
    group = Group(process_group, no_dist)
    items, payload, problems = _local_plan(state_dict)
    gathered = group.all_gather((items, problems, writer.path))
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
    return _write(group, writer, plans, writers, payload)


def _write(group: Group, writer: FileSystemWriter, plans: List[List[plan_.PlanItem]],
           writers: Dict[Key, int], payload: Dict[Key, Any]) -> md.Metadata:
    start: Tuple[Optional[str], str, str] = (None, "", "")
    if group.rank == 0:
        try:
            start = (writer.prepare(), uuid.uuid4().hex, "")
        except (OSError, CheckpointError) as exc:
            start = (None, "", str(exc))
    staging, save_id, error = group.broadcast(start)
    if staging is None:
        raise CheckpointError(f"save() to {writer.path}: {error}")
    mine = [k for k, r in writers.items() if r == group.rank]
    where: Dict[md.MetadataIndex, md.StorageInfo] = {}
    problem = ""
    try:
        where = writer.write_items(staging, group.rank,
                                   list(zip(_indexed(plans, mine), (payload[k] for k in mine))))
    except (OSError, TypeError, ValueError) as exc:
        problem = f"rank {group.rank} could not write its file: {exc}"
    results = group.all_gather((where, problem))
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
