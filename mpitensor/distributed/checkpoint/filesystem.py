"""Checkpoint directories on a file system shared by the ranks: writing atomically, reading parts.

A save never writes into the checkpoint directory itself. The coordinator (rank 0 of the group)
creates a temporary directory beside it, ``.<name>.dcp_<random>.tmp``, and holds an ``flock``
on it while the save runs (the proof that its save is alive). Every rank writes its file
there and fsyncs it; once all ranks report success, the coordinator writes ``.metadata``,
fsyncs the directory and puts it in place with one rename: where a previous checkpoint
exists, the two directories are swapped in one step (Linux ``renameat2(RENAME_EXCHANGE)``)
and the old one removed. A save that dies on the way leaves the previous checkpoint as it was,
and a temporary directory nobody holds a lock on; the next save beside it removes it.

Where the file system cannot swap directories, the old one is first renamed aside: a crash in
that instant leaves the checkpoint under its temporary name (``.<name>.dcp_<random>.old``)
instead of under its own, and the next save puts it back before it starts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import errno
import fcntl
import logging
import mmap
import os
import re
import secrets
import shutil
from typing import Any, BinaryIO, Dict, List, Optional, Tuple, Union

from mpitensor.distributed.checkpoint import _format
from mpitensor.distributed.checkpoint import metadata as md
from mpitensor.tensor import Tensor

__all__ = ["FileSystemWriter", "FileSystemReader", "CheckpointError"]

_log = logging.getLogger(__name__)

METADATA_FILE = ".metadata"
_DATA_FILE = re.compile(r"__\d+_\d+\.distcp")
_RENAME_EXCHANGE = 2
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


class CheckpointError(RuntimeError):
    """A distributed checkpoint could not be saved or loaded (the message says why and where)."""


def _path(checkpoint_id: Any) -> str:
    if not isinstance(checkpoint_id, (str, os.PathLike)):
        raise TypeError(f"checkpoint_id must be a path (str or os.PathLike), got "
                        f"{type(checkpoint_id).__name__}")
    path = os.path.abspath(os.fsdecode(os.fspath(checkpoint_id)))
    if os.path.basename(path) in ("", ".", ".."):
        raise ValueError(f"checkpoint_id {checkpoint_id!r} names no directory of its own")
    return path


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: str, b: str) -> bool:
    """Swap two directories in one step; False where the system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def storage(what: str, state_dict: Any, planner: Any, planner_cls: type, checkpoint_id: Any,
            given: Any, cls: type) -> Any:
    """Check ``save``/``load``'s state dict and planner; the storage they use: ``given``
    pointed at ``checkpoint_id``, or a new one."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"{what}() takes a state_dict that is a dict, got "
                        f"{type(state_dict).__name__}")
    if planner is not None and not isinstance(planner, planner_cls):
        raise TypeError(f"planner must be a {planner_cls.__name__}, got {type(planner).__name__}")
    if given is None:
        if checkpoint_id is None:
            raise ValueError(f"{what}() needs checkpoint_id (a directory) or a storage_"
                             f"{'writer' if what == 'save' else 'reader'}")
        return cls(checkpoint_id)
    if not isinstance(given, cls):
        raise TypeError(f"{what}(): the storage must be a {cls.__name__}, got "
                        f"{type(given).__name__}")
    given.reset(checkpoint_id)
    return given


class FileSystemWriter:
    """Writes a checkpoint into a directory, atomically (see the module docstring).

    Args:
        path: the checkpoint directory (created with its parents; replaced whole if it holds a
            previous checkpoint).
        single_file_per_rank: each rank writes its records into one file (``thread_count``
            files with several threads); False: one file per record.
        sync_files: fsync every file before the checkpoint is put in place.
        thread_count: threads (and files) per rank writing its records.
        per_thread_copy_ahead: accepted for torch's signature; it paces torch's copies out of
            GPU memory and changes nothing that is written.
        cache_staged_state_dict: ``async_save`` keeps its host copies on this writer and
            copies into them at the next ``async_save`` with it (no new allocation for tensors
            of the same shape and dtype), at the cost of holding them between saves.
        overwrite: False refuses a ``path`` that exists instead of replacing it.

    Each rank appends its records to ``__<rank>_<i>.distcp`` through :meth:`write_item`;
    subclasses may wrap it (to count bytes, or to inject faults in tests).

    Example:
        >>> writer = FileSystemWriter("/tmp/ckpt")  # doctest: +SKIP
        >>> dcp.save(state_dict, storage_writer=writer)  # doctest: +SKIP
    """

    def __init__(self, path: Union[str, os.PathLike], single_file_per_rank: bool = True,
                 sync_files: bool = True, thread_count: int = 1,
                 per_thread_copy_ahead: int = 10_000_000, cache_staged_state_dict: bool = False,
                 overwrite: bool = True) -> None:
        # per_thread_copy_ahead paces torch's copies from GPU memory: a speed knob only
        if isinstance(thread_count, bool) or not isinstance(thread_count, int) or \
                thread_count < 1:
            raise ValueError(f"thread_count must be a positive int, got {thread_count!r}")
        self.path = _path(path)
        self.single_file_per_rank = bool(single_file_per_rank)
        self.sync_files = bool(sync_files)
        self.thread_count = thread_count
        self.overwrite = bool(overwrite)
        # async_save's host copies, by (entry, box), kept between saves when asked to
        self.staged_cache: Optional[Dict[Any, Any]] = {} if cache_staged_state_dict else None
        self.staging: Optional[str] = None
        self._lock_fd: Optional[int] = None

    def reset(self, checkpoint_id: Any = None) -> None:
        """Point the writer at another directory (``save(checkpoint_id=...)`` calls this)."""
        if checkpoint_id is not None:
            self.path = _path(checkpoint_id)
        self.staging = None

    # ---------------------------------------------------------------- coordinator
    def check_target(self) -> None:
        """Refuse a target that is a file, or a directory holding other things than a checkpoint."""
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise CheckpointError(f"checkpoint_id {self.path} exists and is not a directory; "
                                  f"give a directory path")
        if not self.overwrite and os.path.lexists(self.path):
            raise CheckpointError(f"checkpoint_id {self.path} exists and overwrite=False")
        if os.path.isdir(self.path):
            foreign = sorted(n for n in os.listdir(self.path)
                             if n != METADATA_FILE and not _DATA_FILE.fullmatch(n))
            if foreign:
                raise CheckpointError(
                    f"checkpoint_id {self.path} holds files that are not a checkpoint's "
                    f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); a save "
                    f"replaces the whole directory, so give an empty or checkpoint directory")

    def prepare(self) -> str:
        """On the coordinator: clean up after dead saves, create and lock the staging directory."""
        self.check_target()
        parent = os.path.dirname(self.path)
        os.makedirs(parent, exist_ok=True)
        remove_dead_saves(self.path)
        while True:  # mkdir (not mkdtemp, which makes it 0o700) so that the umask applies
            name = f".{os.path.basename(self.path)}.dcp_{secrets.token_hex(4)}.tmp"
            try:
                os.mkdir(os.path.join(parent, name))
                break
            except FileExistsError:
                continue
        self.staging = os.path.join(parent, name)
        self._lock_fd = os.open(self.staging, os.O_RDONLY)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise
        return self.staging

    def commit(self, metadata: md.Metadata) -> None:
        """On the coordinator, once every rank wrote: write ``.metadata`` and put it in place."""
        assert self.staging is not None
        meta_path = os.path.join(self.staging, METADATA_FILE)
        with open(meta_path, "wb") as fh:
            fh.write(_format.dump_metadata(metadata))
            fh.flush()
            if self.sync_files:
                os.fsync(fh.fileno())
        if self.sync_files:
            _fsync_dir(self.staging)
        if os.path.isdir(self.path):
            if not _exchange(self.staging, self.path):
                aside = self.staging[: -len(".tmp")] + ".old"
                os.rename(self.path, aside)
                os.rename(self.staging, self.path)
                os.rename(aside, self.staging)
            shutil.rmtree(self.staging, ignore_errors=True)  # now the previous checkpoint
        else:
            os.rename(self.staging, self.path)
        if self.sync_files:
            _fsync_dir(os.path.dirname(self.path))
        self._unlock()

    def abort(self) -> None:
        """On the coordinator, after a failed save: remove the staging directory."""
        if self.staging is not None and os.path.isdir(self.staging):
            shutil.rmtree(self.staging, ignore_errors=True)
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.staging = None

    # ---------------------------------------------------------------- every rank
    def write_items(self, staging: str, rank: int,
                    items: List[Tuple[md.MetadataIndex, Any]]) -> Dict[md.MetadataIndex,
                                                                        md.StorageInfo]:
        """Write this rank's records into ``staging``; return where each one lies.

        The records go to ``__<rank>_<i>.distcp``: one file (``thread_count`` files of about
        equal size, written by as many threads), or one file per record where
        ``single_file_per_rank`` is False.
        """
        where: Dict[md.MetadataIndex, md.StorageInfo] = {}
        buckets = self._buckets(items)  # a rank with nothing to write leaves no empty file
        files = [(os.path.join(staging, f"__{rank}_{i}.distcp"), b) for i, b in enumerate(buckets)]
        workers = min(self.thread_count, len(files))
        if workers > 1:
            with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                for part in pool.map(lambda f: self._write_file(*f), files):
                    where.update(part)
        else:
            for f in files:
                where.update(self._write_file(*f))
        return where

    def _buckets(self, items: List[Tuple[md.MetadataIndex, Any]]
                 ) -> List[List[Tuple[md.MetadataIndex, Any]]]:
        if not self.single_file_per_rank:
            return [[item] for item in items]
        count = min(self.thread_count, len(items))
        buckets: List[List[Tuple[md.MetadataIndex, Any]]] = [[] for _ in range(count)]
        sizes = [0] * count

        def nbytes(item: Tuple[md.MetadataIndex, Any]) -> int:
            value = item[1]
            return int(value.numel()) * value.element_size() if isinstance(value, Tensor) else 0

        for item in sorted(items, key=nbytes, reverse=True):  # biggest into the emptiest
            i = min(range(count), key=lambda b: (sizes[b], len(buckets[b])))
            buckets[i].append(item)
            sizes[i] += nbytes(item)
        return buckets

    def _write_file(self, path: str, items: List[Tuple[md.MetadataIndex, Any]]
                    ) -> Dict[md.MetadataIndex, md.StorageInfo]:
        name = os.path.basename(path)
        where: Dict[md.MetadataIndex, md.StorageInfo] = {}
        with open(path, "wb") as fh:
            for index, obj in items:
                start, length = self.write_item(fh, index.fqn, obj)
                where[index] = md.StorageInfo(name, start, length)
            fh.flush()
            if self.sync_files:
                os.fsync(fh.fileno())
        return where

    def write_item(self, fh: BinaryIO, fqn: str, obj: Any) -> Tuple[int, int]:
        """Append one chunk (a tensor) or object to ``fh``; return its (offset, length)."""
        return _format.write_record(obj, fh)


def _dead_saves(path: str) -> List[str]:
    parent, name = os.path.split(path)
    pattern = re.compile(re.escape(f".{name}.dcp_") + r"[A-Za-z0-9_]{8}\.(tmp|old)")
    try:
        return [os.path.join(parent, n) for n in os.listdir(parent) if pattern.fullmatch(n)]
    except OSError:
        return []


def remove_dead_saves(path: str) -> None:
    """Remove the staging directories of saves into ``path`` whose writer died."""
    for d in _dead_saves(path):
        if d.endswith(".old"):
            if not os.path.exists(path):  # a crash between the two renames: put it back
                os.rename(d, path)
                continue
        try:
            fd = os.open(d, os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live save holds it
        try:
            shutil.rmtree(d, ignore_errors=True)
            _log.info("removed %s, left by a save that did not finish", d)
        finally:
            os.close(fd)


class FileSystemReader:
    """Reads a checkpoint directory: its metadata, and byte ranges of its files by memory map.

    Args:
        path: the checkpoint directory.

    Example:
        >>> dcp.load(state_dict, storage_reader=FileSystemReader("/tmp/ckpt"))  # doctest: +SKIP
    """

    def __init__(self, path: Union[str, os.PathLike]) -> None:
        self.path = _path(path)
        self._maps: Dict[str, mmap.mmap] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        """Point the reader at another directory (``load(checkpoint_id=...)`` calls this)."""
        self.close()
        if checkpoint_id is not None:
            self.path = _path(checkpoint_id)

    def read_metadata(self) -> md.Metadata:
        """Parse ``.metadata``; CheckpointError naming the directory if it is missing or bad."""
        if not os.path.isdir(self.path):
            what = "is not a directory" if os.path.exists(self.path) else "does not exist"
            raise CheckpointError(f"checkpoint_id {self.path} {what}; give the directory a "
                                  f"save wrote")
        meta_path = os.path.join(self.path, METADATA_FILE)
        try:
            with open(meta_path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise CheckpointError(f"cannot read {meta_path} ({exc.strerror or exc}): "
                                  f"{self.path} is not a complete checkpoint") from None
        try:
            return _format.load_metadata(data)
        except _format.FormatError as exc:
            raise CheckpointError(f"{meta_path} is not checkpoint metadata: {exc}") from None

    def check_ranges(self, infos: List[md.StorageInfo]) -> List[str]:
        """Which of ``infos`` lie outside their files (missing or short files)."""
        sizes: Dict[str, Optional[int]] = {}
        problems = []
        for info in infos:
            if info.relative_path not in sizes:
                with contextlib.suppress(OSError):
                    sizes[info.relative_path] = os.path.getsize(self._file(info))
            size = sizes.get(info.relative_path)
            if size is None:
                problems.append(f"{self._file(info)} is missing")
            elif info.offset + info.length > size:
                problems.append(f"{self._file(info)} has {size} bytes, the metadata needs "
                                f"{info.offset + info.length}")
        return problems

    def _file(self, info: md.StorageInfo) -> str:
        name = info.relative_path
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise CheckpointError(f"the metadata of {self.path} names a file outside it: "
                                  f"{name!r}")
        return os.path.join(self.path, name)

    def _map(self, info: md.StorageInfo) -> mmap.mmap:
        if info.relative_path not in self._maps:
            with open(self._file(info), "rb") as fh:
                self._maps[info.relative_path] = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        return self._maps[info.relative_path]

    def tensor_view(self, info: md.StorageInfo) -> Any:
        """A lazy read-only array over the chunk at ``info`` (pages are read when touched)."""
        return _format.tensor_view(self._map(info), info.offset, info.length)

    def read_object(self, info: md.StorageInfo) -> Any:
        """The object recorded at ``info``."""
        return _format.read_object(self._map(info), info.offset, info.length)

    def close(self) -> None:
        """Unmap the files."""
        for mm in self._maps.values():
            with contextlib.suppress(BufferError):
                mm.close()
        self._maps.clear()
