"""Distributed checkpoints (``torch.distributed.checkpoint``): sharded, parallel, resharding.

``save(state_dict, checkpoint_id=dir)`` writes one file per rank, in parallel, and a
``.metadata`` file (every entry's global shape and dtype, every chunk's offsets and sizes, and
which file and byte range holds it); ``load(state_dict, checkpoint_id=dir)`` fills the state
dict in place, each rank reading only the byte ranges that overlap its own shards, whatever
the world size or sharding at save time. A save is atomic: the directory appears complete or
not at all (see :mod:`.filesystem`).

The on-disk layout is torch's (``__<rank>_0.distcp`` files of ``torch.save`` records, a
pickled ``Metadata``), so ``torch.distributed.checkpoint.load`` reads our checkpoints and we
read torch's. Where it cannot be: torch reads only the dtypes it has (all of ours); a value
that is neither a tensor nor one of the types ``torch.load(weights_only=True)`` reads is
pickled as is, so torch reads it only if the pickled class is importable there; and on our
side, loading an object torch pickled whole (a non-tensor value) accepts only those same
weights-only types (numbers, strings, containers, tensors).

Example:
    >>> import mpitensor.distributed.checkpoint as dcp  # doctest: +SKIP
    >>> dcp.save({"model": model.state_dict(), "step": 10}, checkpoint_id="ckpt")
    >>> sd = {"model": model.state_dict(), "step": 0}
    >>> dcp.load(sd, checkpoint_id="ckpt")

Also: :class:`~.stateful.Stateful` values (saved and loaded through their ``state_dict`` and
``load_state_dict``), :func:`async_save` (written in the background), and
:mod:`.format_utils` (to and from ``torch.save`` files).
"""

from . import format_utils, state_dict, stateful
from ._planning import LocalShard
from .default_planner import DefaultLoadPlanner, DefaultSavePlanner
from .filesystem import CheckpointError, FileSystemReader, FileSystemWriter
from .metadata import BytesStorageMetadata, ChunkStorageMetadata, Metadata, MetadataIndex
from .metadata import TensorProperties as TensorProperties  # re-exported, as in torch
from .metadata import TensorStorageMetadata as TensorStorageMetadata
from .state_dict_loader import load, load_state_dict
from .state_dict_saver import AsyncCheckpointerType, async_save, save, save_state_dict
from .stateful import Stateful

__all__ = [
    "save", "load", "FileSystemWriter", "FileSystemReader", "DefaultSavePlanner",
    "DefaultLoadPlanner", "LocalShard", "CheckpointError", "Metadata", "MetadataIndex",
    "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
    "state_dict", "stateful", "Stateful", "async_save", "AsyncCheckpointerType", "format_utils",
    "save_state_dict", "load_state_dict",
]
