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

from . import _basic, _combining, _files
from ._basic import *  # noqa: F403 - the one-source pipes
from ._combining import *  # noqa: F403 - the pipes over several sources, and fork/demux
from ._files import *  # noqa: F403 - the file pipes

__all__ = sorted(_basic.__all__ + _combining.__all__ + _files.__all__)
