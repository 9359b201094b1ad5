"""IterDataPipes over files: ``list_files``, ``open_files``, ``read_from_stream``."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from typing import Any, Optional, Sequence, Union

from .._decorator import functional_datapipe
from ..datapipe import IterDataPipe
from ._basic import IterableWrapperIterDataPipe

__all__ = ["FileLister", "FileOpener", "StreamReader"]


def _declared_length(self: Any) -> int:
    """The ``length=`` a file pipe was given; -1 (the default) is no length."""
    if self.length == -1:
        raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
    return self.length


def _matches(name: str, masks: Sequence[str]) -> bool:
    return not masks or any(fnmatch.fnmatch(name, m) for m in masks)


def _walk(root: str, masks: Sequence[str], recursive: bool, abspath: bool,
          non_deterministic: bool) -> Iterator[str]:
    if os.path.isfile(root):
        path = os.path.abspath(root) if abspath else root
        if _matches(os.path.basename(root), masks):
            yield path
        return
    for here, dirs, files in os.walk(root):
        if not non_deterministic:
            files.sort()
            dirs.sort()
        for f in files:
            if _matches(f, masks):
                path = os.path.join(here, f)
                yield os.path.abspath(path) if abspath else path
        if not recursive:
            break


@functional_datapipe("list_files")
class FileListerIterDataPipe(IterDataPipe):
    """The paths of the files under ``root`` (a directory, a file, a list of them or a
    DataPipe of them) whose names match ``masks`` (shell patterns), sorted (functional name
    ``list_files``)."""

    def __init__(self, root: Union[str, Sequence[str], IterDataPipe] = ".",
                 masks: Union[str, list] = "", *, recursive: bool = False,
                 abspath: bool = False, non_deterministic: bool = False,
                 length: int = -1) -> None:
        if isinstance(root, str):
            root = (root,)
        if not isinstance(root, IterDataPipe):
            root = IterableWrapperIterDataPipe(root)
        self.datapipe = root
        self.masks = [m for m in ([masks] if isinstance(masks, str) else masks) if m]
        self.recursive, self.abspath = recursive, abspath
        self.non_deterministic, self.length = non_deterministic, length

    def __iter__(self) -> Iterator[str]:
        for root in self.datapipe:
            yield from _walk(root, self.masks, self.recursive, self.abspath,
                             self.non_deterministic)

    __len__ = _declared_length


@functional_datapipe("open_files")
class FileOpenerIterDataPipe(IterDataPipe):
    """``(path, open file)`` for each path (functional name ``open_files``); ``mode`` is
    ``'r'``/``'t'``/``'rt'`` (text) or ``'b'``/``'rb'`` (bytes)."""

    def __init__(self, datapipe: Any, mode: str = "r", encoding: Optional[str] = None,
                 length: int = -1) -> None:
        if mode not in ("b", "t", "rb", "rt", "r"):
            raise ValueError(f"open_files: invalid mode {mode!r}; use 'r', 'rt', 't', 'rb' "
                             f"or 'b'")
        mode = "r" + mode.lstrip("r") if mode != "r" else "r"
        if "b" in mode and encoding is not None:
            raise ValueError("open_files: binary mode doesn't take an encoding argument")
        self.datapipe, self.mode, self.encoding, self.length = datapipe, mode, encoding, length

    def __iter__(self) -> Iterator[tuple]:
        for path in self.datapipe:
            yield path, open(path, self.mode, encoding=self.encoding)  # noqa: SIM115

    __len__ = _declared_length


@functional_datapipe("read_from_stream")
class StreamReaderIterDataPipe(IterDataPipe):
    """``(path, data)`` read from each ``(path, stream)``: the whole stream, or chunks of
    ``chunk`` bytes/characters; each stream is closed once read (functional name
    ``read_from_stream``)."""

    def __init__(self, datapipe: IterDataPipe, chunk: Optional[int] = None) -> None:
        self.datapipe, self.chunk = datapipe, chunk

    def __iter__(self) -> Iterator[tuple]:
        for path, stream in self.datapipe:
            try:
                while True:
                    data = stream.read() if self.chunk is None else stream.read(self.chunk)
                    if not data:
                        break
                    yield path, data
                    if self.chunk is None:
                        break
            finally:
                stream.close()


# torch's classes are named <Name>IterDataPipe; these are their public names
FileLister = FileListerIterDataPipe
FileOpener = FileOpenerIterDataPipe
StreamReader = StreamReaderIterDataPipe
