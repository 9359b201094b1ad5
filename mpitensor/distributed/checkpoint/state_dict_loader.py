"""``load``: every rank fills its own tensors in place, reading only the overlapping chunks."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from mpitensor.autograd import no_grad
from mpitensor.distributed.checkpoint import _planning as plan_
from mpitensor.distributed.checkpoint import metadata as md
from mpitensor.distributed.checkpoint import stateful
from mpitensor.distributed.checkpoint._collective import Group, fail
from mpitensor.distributed.checkpoint.default_planner import DefaultLoadPlanner
from mpitensor.distributed.checkpoint.filesystem import CheckpointError, FileSystemReader, storage

__all__ = ["load"]


@dataclass
class _Read:
    """Copy ``part`` (a global box) of the chunk at ``info`` into ``dest`` (at ``box``)."""

    dest: Any
    box: plan_.Box
    chunk: plan_.Box
    part: plan_.Box
    info: md.StorageInfo


def _info(meta: md.Metadata, fqn: str, offsets: Optional[Tuple[int, ...]]) -> md.StorageInfo:
    info = meta.storage_data.get(md.MetadataIndex(fqn, offsets))
    if info is None:
        raise KeyError(f"the metadata has no storage for {fqn!r} at offsets {offsets}")
    return info


def _tensor_reads(leaf: plan_.Leaf, entry: plan_.TensorEntry, stored: Any,
                  meta: md.Metadata) -> List[_Read]:
    if not isinstance(stored, md.TensorStorageMetadata):
        raise ValueError(f"{leaf.fqn!r} is a tensor here but an object in the checkpoint")
    if tuple(stored.size) != entry.shape:
        raise ValueError(f"{leaf.fqn!r} has shape {entry.shape} here but "
                         f"{tuple(stored.size)} in the checkpoint")
    if np.dtype(stored.properties.dtype) != entry.dtype:
        raise ValueError(f"{leaf.fqn!r} is {entry.dtype} here but {stored.properties.dtype} in "
                         f"the checkpoint; cast after loading into a tensor of the saved dtype")
    if entry.box is None:
        return []
    reads, covered = [], 0
    for c in stored.chunks:
        chunk = (tuple(c.offsets), tuple(c.sizes))
        part = plan_.overlap(entry.box, chunk)
        if part is None or not plan_.volume(part[1]):
            continue
        covered += plan_.volume(part[1])
        reads.append(_Read(entry.local, entry.box, chunk, part, _info(meta, leaf.fqn, chunk[0])))
    if covered != plan_.volume(entry.box[1]):
        raise ValueError(f"the checkpoint's chunks of {leaf.fqn!r} cover {covered} of the "
                         f"{plan_.volume(entry.box[1])} elements this rank needs")
    return reads


def _plan(state_dict: Any, meta: md.Metadata, partial: bool
          ) -> Tuple[List[_Read], List[Tuple[plan_.Leaf, md.StorageInfo]], List[str]]:
    """What this rank reads, and every reason it cannot (checked before anything is written)."""
    reads: List[_Read] = []
    objects: List[Tuple[plan_.Leaf, md.StorageInfo]] = []
    problems: List[str] = []
    try:
        leaves = plan_.flatten(state_dict)
    except (TypeError, ValueError) as exc:
        return [], [], [str(exc)]
    for leaf in leaves:
        stored = meta.state_dict_metadata.get(leaf.fqn)
        if stored is None:
            if not partial:
                problems.append(f"{leaf.fqn!r} is missing from the checkpoint")
            continue
        try:
            entry = plan_.tensor_entry(leaf.value, for_load=True)
            if entry is not None:
                reads.extend(_tensor_reads(leaf, entry, stored, meta))
            elif isinstance(stored, md.TensorStorageMetadata):
                problems.append(f"{leaf.fqn!r} is {type(leaf.value).__name__} here but a "
                                f"tensor in the checkpoint; put a tensor of shape "
                                f"{tuple(stored.size)} there to load it")
            else:
                objects.append((leaf, _info(meta, leaf.fqn, None)))
        except (KeyError, ValueError, TypeError) as exc:
            problems.append(str(exc).strip('"'))
    return reads, objects, problems


def load(state_dict: Dict[str, Any], *, checkpoint_id: Any = None,
         storage_reader: Optional[FileSystemReader] = None,
         planner: Optional[DefaultLoadPlanner] = None, process_group: Any = None,
         no_dist: bool = False) -> None:
    """Load a distributed checkpoint into ``state_dict``, in place, resharding as needed.

    Call it on every rank with a state dict of the same structure as the saved one: tensors
    (and DTensors, LocalShards) are filled in place, each rank reading only the byte ranges
    of the chunks that overlap its own part, so a checkpoint saved at one world size or
    sharding loads at another. Other values are replaced by the saved ones. Entries the
    checkpoint holds but ``state_dict`` lacks are not read. A top-level value that is
    :class:`~.stateful.Stateful` is loaded through it: its ``state_dict()`` gives the tensors
    to fill, and its ``load_state_dict()`` gets them once loaded. Without an initialised
    process group (or with ``no_dist``) this process loads alone, whatever world size saved
    the checkpoint. Reads checkpoints written by ``torch.distributed.checkpoint.save`` too.

    Args:
        state_dict: the nested dict to fill.
        checkpoint_id: the checkpoint directory (a str or os.PathLike).
        storage_reader: a :class:`FileSystemReader` (``checkpoint_id``, if given, overrides
            its path).
        planner: a :class:`DefaultLoadPlanner` (``allow_partial_load=True`` leaves entries the
            checkpoint lacks untouched).
        process_group: the ranks that load together (default: the whole job).
        no_dist: load in this process alone, even inside a job.

    Raises:
        CheckpointError: ``checkpoint_id`` is not a checkpoint directory, or its files are
            missing or short.
        ValueError: the checkpoint does not fit ``state_dict`` (a missing entry, another shape
            or dtype): raised on every rank, naming each rank's problems, before any tensor
            is written. The same when a Stateful's ``state_dict()`` fails or returns no
            dict.

    Example:
        >>> sd = {"model": model.state_dict()}  # doctest: +SKIP
        >>> dcp.load(sd, checkpoint_id="ckpt/step100"); model.load_state_dict(sd["model"])
    """
    reader = storage("load", state_dict, planner, DefaultLoadPlanner, checkpoint_id,
                     storage_reader, FileSystemReader)
    group = Group(process_group, no_dist)
    working, stateful_keys, problems = stateful._expand(state_dict)
    meta = _read_metadata(group, reader, problems)
    reads, objects, problems = _plan(working, meta, bool(planner and
                                                         planner.allow_partial_load))
    infos = [r.info for r in reads] + [info for _, info in objects]
    if not problems:
        problems = reader.check_ranges(infos)
    group.agree(problems, f"load(): the checkpoint {reader.path} does not fit the state_dict "
                          f"(nothing was loaded)", ValueError)
    problem = ""
    try:
        _execute(reader, reads, objects)
    except (OSError, ValueError) as exc:
        problem = str(exc)
    finally:
        reader.close()
    group.agree([problem] if problem else [], f"load() from {reader.path} failed while "
                                              f"reading", CheckpointError)
    for key, value in working.items():
        if key in stateful_keys:
            state_dict[key].load_state_dict(value)
        else:
            state_dict[key] = value  # a top-level object the checkpoint replaced


def _read_metadata(group: Group, reader: FileSystemReader, problems: List[str]) -> md.Metadata:
    """The checkpoint's metadata on every rank, once the ranks agree on the directory and none
    has a problem with its state dict (``problems``) or the directory."""
    gathered = group.all_gather((reader.path, problems))
    paths = {g[0] for g in gathered}
    if len(paths) > 1:
        raise ValueError(f"load(): the ranks name different checkpoint directories "
                         f"({', '.join(sorted(paths))}); every rank must pass the same one")
    fail([g[1] for g in gathered], "load(): cannot load into this state_dict (nothing was "
                                   "loaded)", ValueError)
    found: Tuple[Optional[md.Metadata], str] = (None, "")
    if group.rank == 0:
        try:
            found = (reader.read_metadata(), "")
        except CheckpointError as exc:
            found = (None, str(exc))
    meta, error = group.broadcast(found)
    if meta is None:
        raise CheckpointError(f"load(): {error}")
    return meta


def _execute(reader: FileSystemReader, reads: List[_Read],
             objects: List[Tuple[plan_.Leaf, md.StorageInfo]]) -> None:
    values = [(leaf, reader.read_object(info)) for leaf, info in objects]
    views: Dict[Tuple[str, int], Any] = {}
    with no_grad():
        for r in reads:
            key = (r.info.relative_path, r.info.offset)
            if key not in views:
                views[key] = reader.tensor_view(r.info)
            r.dest[plan_.within(r.part, r.box[0])].copy_(
                views[key][plan_.within(r.part, r.chunk[0])])
    views.clear()
    for leaf, value in values:
        leaf.parent[leaf.key] = value


def load_state_dict(state_dict: Dict[str, Any], storage_reader: FileSystemReader,
                    process_group: Any = None, coordinator_rank: int = 0, no_dist: bool = False,
                    planner: Optional[DefaultLoadPlanner] = None) -> None:
    """torch's older name for :func:`load` (the reader given positionally; deprecated there
    too: it warns)."""
    warnings.warn("load_state_dict is deprecated: use dcp.load(state_dict, storage_reader=...)",
                  FutureWarning, stacklevel=2)
    load(state_dict, storage_reader=storage_reader, process_group=process_group,
         no_dist=no_dist, planner=planner)
