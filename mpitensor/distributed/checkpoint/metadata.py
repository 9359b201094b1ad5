"""What a distributed checkpoint's ``.metadata`` file describes, with torch's field names.

A checkpoint directory holds one ``.metadata`` file and the ranks' data files
(``__<rank>_0.distcp``). The metadata lists every entry of the flattened state dict: a tensor's
global size, dtype and chunks (each chunk's offsets and sizes in the global tensor), or a
``BytesStorageMetadata`` for any other object; and, for every chunk and object, which file and
which byte range hold it (:class:`StorageInfo`). These classes carry the same names and fields
as ``torch.distributed.checkpoint.metadata``'s, so that code reading ``dcp`` metadata ports
unchanged; on disk they are pickled under torch's class names (see ``_format.py``).

Dtypes are NumPy dtypes here (mpitensor's dtypes), written as torch's dtype names on disk.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

__all__ = ["ChunkStorageMetadata", "TensorProperties", "TensorStorageMetadata",
           "BytesStorageMetadata", "MetadataIndex", "StorageInfo", "StorageMeta", "Metadata",
           "STORAGE_TYPES"]


@dataclass
class ChunkStorageMetadata:
    """One stored piece of a tensor: where it starts (``offsets``) and its extent (``sizes``)."""

    offsets: Tuple[int, ...]
    sizes: Tuple[int, ...]


@dataclass
class TensorProperties:
    """A stored tensor's dtype (a NumPy dtype) and the flags torch records beside it."""

    dtype: Any = np.dtype(np.float32)
    layout: str = "strided"
    requires_grad: bool = False
    memory_format: str = "contiguous_format"
    pin_memory: bool = False

    def __setstate__(self, state: Any) -> None:
        # torch pickles this class's fields as a tuple, in this order; Python pickles a dict
        if isinstance(state, tuple):
            names = [f.name for f in dataclasses.fields(self)]
            state = dict(zip(names, state))
        self.__dict__.update(state)


@dataclass
class TensorStorageMetadata:
    """A tensor entry: its properties, global ``size`` and the chunks that together tile it."""

    properties: TensorProperties
    size: Tuple[int, ...]
    chunks: List[ChunkStorageMetadata]


@dataclass
class BytesStorageMetadata:
    """An entry that is not a tensor: a pickled object (step counts, hyper-parameters, ...)."""


STORAGE_TYPES = Union[TensorStorageMetadata, BytesStorageMetadata]


@dataclass(frozen=True)
class MetadataIndex:
    """The key of one stored chunk (or object): entry name and the chunk's offsets.

    ``index`` is a hint for finding the chunk in its entry's list faster; it takes no part in
    equality or hashing, as in torch.
    """

    fqn: str
    offset: Optional[Tuple[int, ...]] = None
    index: Optional[int] = field(hash=False, compare=False, default=None)


@dataclass
class StorageInfo:
    """Where one chunk or object lies: a file of the checkpoint directory and a byte range.

    The bytes are a ``torch.save`` record (zip layout) of the chunk or object. torch calls this
    class ``torch.distributed.checkpoint.filesystem._StorageInfo``.
    """

    relative_path: str
    offset: int
    length: int
    transform_descriptors: Optional[Any] = None


@dataclass
class StorageMeta:
    """Which checkpoint and which save wrote the metadata."""

    checkpoint_id: Optional[str] = None
    save_id: Optional[str] = None
    load_id: Optional[str] = None
    modules: List[str] = field(default_factory=list)


@dataclass
class Metadata:
    """The whole ``.metadata`` file.

    Attributes:
        state_dict_metadata: every flattened entry name -> its tensor or bytes description.
        planner_data: every flattened entry name -> its path in the nested state dict.
        storage_data: every chunk's or object's :class:`MetadataIndex` -> :class:`StorageInfo`.
        storage_meta: the checkpoint id and save id.
        version: the format version torch writes (``"1.0.0"``).
    """

    state_dict_metadata: Dict[str, STORAGE_TYPES]
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: Optional[StorageMeta] = None
    version: Optional[str] = None
