"""``torch.utils.data.datapipes.iter``: the built-in iterable-style DataPipes.

Each is also a method of every IterDataPipe under its functional name: ``Mapper`` is
``dp.map``, ``Filter`` ``dp.filter``, ``Batcher`` ``dp.batch``, ``UnBatcher`` ``dp.unbatch``,
``Collator`` ``dp.collate``, ``Grouper`` ``dp.groupby``, ``Shuffler`` ``dp.shuffle``,
``ShardingFilter`` ``dp.sharding_filter``, ``Concater`` ``dp.concat``, ``Zipper`` ``dp.zip``,
``Multiplexer`` ``dp.mux``, ``Forker`` ``dp.fork``, ``Demultiplexer`` ``dp.demux``,
``FileLister`` ``dp.list_files``, ``FileOpener`` ``dp.open_files`` and ``StreamReader``
``dp.read_from_stream``.
"""

from __future__ import annotations

from ._basic import (
    Batcher,
    Collator,
    Filter,
    Grouper,
    IterableWrapper,
    Mapper,
    Sampler,
    ShardingFilter,
    Shuffler,
    UnBatcher,
)
from ._combining import Concater, Demultiplexer, Forker, Multiplexer, Zipper
from ._files import FileLister, FileOpener, StreamReader

__all__ = ["Batcher", "Collator", "Concater", "Demultiplexer", "FileLister", "FileOpener",
           "Filter", "Forker", "Grouper", "IterableWrapper", "Mapper", "Multiplexer", "Sampler",
           "ShardingFilter", "Shuffler", "StreamReader", "UnBatcher", "Zipper"]
