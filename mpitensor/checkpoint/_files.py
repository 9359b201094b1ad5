"""Checkpoint files: their errors, their names, and writing them atomically.

A path is written through a temporary file in the target's directory (``flock``-ed from its
creation to the rename), flushed, fsynced, renamed over the target with ``os.replace``, and the
directory fsynced, so a crash leaves either the old file or the new one. A temporary file left
by a writer that died is removed by the next save into its directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import stat
import tempfile
from typing import Any, BinaryIO, Callable, Optional, Tuple, Union

from mpitensor.errors import MpiTensorError

_log = logging.getLogger("mpitensor.checkpoint")

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO]

SNIFF = 16  # bytes read to tell the formats apart
STREAM_CHUNK = 1 << 26  # a stream of unknown size is read in pieces of this many bytes


class CheckpointError(MpiTensorError, ValueError):
    """A checkpoint file is missing pieces, corrupt, not a checkpoint, or could not be written."""


def file_name(f: Any) -> str:
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(os.fspath(f))
    return str(getattr(f, "name", None) or f"<{type(f).__name__} object>")


class BadFile(Exception):
    """Internal: what is wrong with a file; turned into a CheckpointError naming the file."""


def _umask() -> int:
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    return 0o022


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # e.g. platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# a save's temporary file: ".<target>.mpitensor_<8 of mkstemp's characters>.tmp"
_TMP_MARK = "mpitensor_"
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_TMP_NAME = re.compile(r"\..+\." + _TMP_MARK + r"[a-z0-9_]{8}\.tmp")


def _locked_temp(path: str) -> Tuple[int, str]:
    """Create the temporary file for ``path`` and lock it (the proof its writer lives)."""
    directory = os.path.dirname(path)
    while True:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + "." + _TMP_MARK,
                                   suffix=".tmp", dir=directory)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as exc:
                if exc.errno not in _NO_FLOCK:
                    raise
                # a filesystem without flock: nobody can prove this writer dead, so no save
                # removes its file (the cleaner's lock fails there too); it still works
            if os.fstat(fd).st_nlink:
                return fd, tmp
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        # another save found it unlocked in the instant before the lock and removed it
        os.close(fd)


def _remove_dead_temps(directory: str) -> None:
    """Remove the temporary files of saves whose writer died (nobody holds their lock)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if not _TMP_NAME.fullmatch(entry.name):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone already, a link, or not ours to open
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its writer is alive (or the lock cannot be had: leave it)
            now = os.lstat(entry.path)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                os.unlink(entry.path)
                _log.info("removed %s, left by a save that did not finish (%d bytes)",
                          entry.path, st.st_size)
        except OSError:
            continue
        finally:
            os.close(fd)


def write_to(f: PathOrFile, write: Callable[[BinaryIO], None]) -> None:
    """Run ``write`` on a file object, or atomically on a path (temporary file and rename)."""
    if not isinstance(f, (str, bytes, os.PathLike)):
        if not hasattr(f, "write"):
            raise TypeError(f"save() takes a path or a binary file object, got "
                            f"{type(f).__name__}")
        write(f)
        return
    path = os.path.abspath(os.fsdecode(os.fspath(f)))
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        raise CheckpointError(f"cannot save checkpoint to {path}: it is a directory; give a file "
                              f"name inside it")
    _remove_dead_temps(directory)
    try:
        fd, tmp = _locked_temp(path)
    except OSError as exc:
        raise CheckpointError(f"cannot save checkpoint to {path}: cannot create a file in "
                              f"{directory} ({exc.strerror or exc}); check that the directory "
                              f"exists and is writable") from exc
    try:
        try:
            mode = os.stat(path).st_mode & 0o7777  # keep an existing file's permissions
        except OSError:
            mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:  # closing it drops the lock: after the rename
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
            os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise CheckpointError(f"cannot save checkpoint to {path}: {exc.strerror or exc}; "
                                  f"the previous file (if any) is unchanged") from exc
        raise
    _fsync_dir(directory)


def read_rest(fh: BinaryIO, size: Optional[int]) -> bytes:
    if size is not None:
        return fh.read()
    parts = []
    while True:  # a stream: read what is there, in pieces, so a pipe works too
        chunk = fh.read(STREAM_CHUNK)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
