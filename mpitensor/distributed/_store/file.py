"""``FileStore``: a store kept in one file, shared by the processes that open it.

The file is an append-only log of records behind an 8-byte header::

    header = b"MPTFS1\\n\\0"
    record = u8 kind | u32 key length | u64 value length | key | value     (little-endian)

with kinds ``S`` (set ``key`` to ``value``), ``D`` (delete ``key``), ``J`` (a user opened the
store) and ``L`` (a user closed it). Every operation opens the file, takes an ``flock`` (shared
to read, exclusive to write), reads the records appended since its last visit, and appends its
own; so readers never see half a record, and ``add``/``compare_set`` are atomic across
processes. A record cut short by a writer that died is ignored, and cut off by the next writer.
``get``/``wait`` poll the file's size (a file offers nothing to sleep on), backing off to 50 ms
between looks.

Who is still using the file is proved by the kernel, not by the records: each handle holds, for
its whole life, a shared open-file-description lock (``F_OFD_SETLK``) on one byte far past the
file's end (a range no data reaches; ``flock`` serves the operations). The kernel drops it when
the handle closes or its process dies, however it dies, so "no live user" is one ``F_OFD_GETLK``
away. Joining and leaving happen under the exclusive ``flock``, so that answer cannot change
while a user joins or leaves. Hence:

* the file is removed only by the last *live* user to close it, and only once ``world_size``
  users have closed it (torch's rule: its reference count at 0 and its count of finished users
  at ``world_size``); a handle with a smaller ``world_size`` never removes it under another;
* a file whose users all died without closing (more ``J`` than ``L`` records, and no live user)
  was left by a crashed job: the next user to open it empties it, with a warning naming it,
  instead of reading the dead job's values. A file whose users all closed it cleanly (fewer
  than ``world_size`` of them, or ``world_size`` -1) keeps its keys, as torch's does.

Where open-file-description locks are missing (not Linux), liveness falls back to the records:
users are those with a ``J`` and no ``L``, and a crashed job's file cannot be told apart.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import multiprocessing.util
import os
import struct
import sys
import threading
import time
import weakref
from typing import Any, Iterator, List, Optional, Tuple

from .common import (
    DistStoreError,
    Store,
    StoreTimeoutError,
    _Table,
    show_key,
    timeout_message,
)

__all__ = ["FileStore"]

_HEADER = b"MPTFS1\n\0"
_RECORD = struct.Struct("<BIQ")
_SET, _DELETE, _JOIN, _LEAVE = b"S"[0], b"D"[0], b"J"[0], b"L"[0]
_KINDS = {_SET, _DELETE, _JOIN, _LEAVE}
_POLL_FIRST = 0.001
_POLL_MAX = 0.05
_log = logging.getLogger("mpitensor.distributed")

# struct flock of 64-bit Linux (short type, short whence, off_t start, off_t len, pid_t pid)
_FLOCK = struct.Struct("hhqqi4x")
_OFD = (sys.platform.startswith("linux") and hasattr(fcntl, "F_OFD_SETLK")
        and struct.calcsize("P") == 8)
_LIVE_BYTE = 1 << 62  # the byte whose shared lock marks a live user: far past any data


def _live_lock(fd: int, cmd: int, kind: int) -> int:
    """Apply (or, with F_OFD_GETLK, test) an OFD lock on the live byte; return the lock type."""
    arg = _FLOCK.pack(kind, os.SEEK_SET, _LIVE_BYTE, 1, 0)
    return _FLOCK.unpack(fcntl.fcntl(fd, cmd, arg))[0]


def _others_alive(fd: int) -> bool:
    """Whether any open file description other than ``fd``'s holds a user's live lock."""
    return _live_lock(fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK) != fcntl.F_UNLCK


# the descriptors holding live locks: a forked child closes its copies at once, so that a
# child never keeps its parent's handle looking alive (closing a copy leaves the parent's lock)
_LIVE_FDS: "weakref.WeakSet[_Log]" = weakref.WeakSet()


def _close_inherited() -> None:
    for log in list(_LIVE_FDS):
        if log.live_fd is not None:
            with contextlib.suppress(OSError):
                os.close(log.live_fd)
            log.live_fd = None


if _OFD:
    os.register_at_fork(after_in_child=_close_inherited)


def _record(kind: int, key: bytes = b"", value: bytes = b"") -> bytes:
    return _RECORD.pack(kind, len(key), len(value)) + key + value


class _Log:
    """One handle's view of the file: the table rebuilt from the records read so far.

    Kept apart from the FileStore object so that the finalizer (which appends the ``L``
    record) can use it without keeping the store alive.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.table = _Table()
        self.joins = 0
        self.leaves = 0
        self.offset = 0
        self.ident: Optional[Tuple[int, int]] = None
        self.size = 0
        self.live_fd: Optional[int] = None  # holds this handle's live lock (see the docstring)

    @contextlib.contextmanager
    def locked(self, exclusive: bool, create: bool = True) -> Iterator[int]:
        """Open the file, lock it, bring the table up to date; yield the descriptor."""
        with self.lock:
            fd = self._open_locked(exclusive, create)
            try:
                self._catch_up(fd)
                yield fd
            finally:
                os.close(fd)  # releases the lock

    def _open_locked(self, exclusive: bool, create: bool) -> int:
        """A descriptor of the file now at ``path``, flocked.

        The last user removes the file under the exclusive lock; a process that opened it just
        before would lock a file no one else sees any more, so it looks again.
        """
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
            except FileNotFoundError:
                if not create:
                    raise
                raise DistStoreError(f"FileStore cannot create {self.path!r}: its directory "
                                     "does not exist; create it first") from None
            except OSError as exc:
                raise DistStoreError(f"FileStore cannot open {self.path!r}: {exc}; check that "
                                     "its directory exists and is writable") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                st = os.fstat(fd)
                try:
                    now = os.stat(self.path)
                    same = (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
                except FileNotFoundError:
                    same = False
            except BaseException:
                os.close(fd)
                raise
            if same:
                return fd
            os.close(fd)
            if not create:
                raise FileNotFoundError(self.path)

    def join(self) -> None:
        """Count this handle in: empty a file its users left by dying, then hold the live lock."""
        with self.locked(exclusive=True) as fd:
            live = os.open(self.path, os.O_RDWR)  # the same file: it cannot change under flock
            try:
                if _OFD:
                    try:
                        stale = self.offset and self.joins > self.leaves and \
                            not _others_alive(fd)
                        _live_lock(live, fcntl.F_OFD_SETLK, fcntl.F_RDLCK)
                    except OSError as exc:
                        raise DistStoreError(
                            f"FileStore cannot lock {self.path!r} ({exc.strerror or exc}): its "
                            "filesystem lacks the locks that tell its live users apart; put the "
                            "file on a local filesystem (or NFS)") from None
                    if stale:
                        self._reset(fd)
                self.append(fd, [_record(_JOIN)])
            except BaseException:
                os.close(live)
                raise
            self.live_fd = live
            _LIVE_FDS.add(self)

    def _reset(self, fd: int) -> None:
        _log.warning(
            "FileStore %r was left by a job whose %d user(s) ended without closing it and none "
            "of whom is alive (a crash or a kill): its keys are dropped and the store starts "
            "empty. Give each job its own file to keep this from happening",
            self.path, self.joins - self.leaves)
        os.ftruncate(fd, 0)
        self.table = _Table()
        self.joins = self.leaves = self.offset = self.size = 0

    def leave(self, world_size: int) -> None:
        """Count this handle out; remove the file when no user is left and ``world_size``
        users have closed it."""
        live, self.live_fd = self.live_fd, None
        _LIVE_FDS.discard(self)
        try:
            with self.locked(exclusive=True, create=False) as fd:
                if live is not None and os.fstat(live)[1:3] != os.fstat(fd)[1:3]:
                    return  # the file was replaced by hand: its records are not ours to count
                self.append(fd, [_record(_LEAVE)])
                if live is not None and _OFD:
                    # unlock first: a forked child's copy of the descriptor would keep it
                    _live_lock(live, fcntl.F_OFD_SETLK, fcntl.F_UNLCK)
                    alone = not _others_alive(fd)
                else:
                    alone = self.leaves >= self.joins
                if alone and world_size > 0 and self.leaves >= world_size:
                    os.unlink(self.path)
        finally:
            if live is not None:
                os.close(live)

    def _catch_up(self, fd: int) -> None:
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        if ident != self.ident or st.st_size < self.offset:
            # a new file (the old one was removed after its users left): start over
            self.table = _Table()
            self.joins = self.leaves = self.offset = 0
            self.ident = ident
        self.size = st.st_size
        if st.st_size == self.offset:
            return
        data = os.pread(fd, st.st_size - self.offset, self.offset)
        pos = 0
        if self.offset == 0:
            if len(data) < len(_HEADER):
                if _HEADER.startswith(data):
                    return  # empty, or a header cut short: the next writer rewrites it
                self._not_ours()
            if data[:len(_HEADER)] != _HEADER:
                self._not_ours()
            pos = len(_HEADER)
        while pos + _RECORD.size <= len(data):
            kind, klen, vlen = _RECORD.unpack_from(data, pos)
            end = pos + _RECORD.size + klen + vlen
            if kind not in _KINDS:
                raise DistStoreError(f"FileStore {self.path!r} is damaged (a record of kind "
                                     f"{kind} at byte {self.offset + pos}); delete the file "
                                     "and start again")
            if end > len(data):
                break  # cut short: its writer died mid-record
            key = data[pos + _RECORD.size:pos + _RECORD.size + klen]
            if kind == _SET:
                self.table.set(key, data[end - vlen:end])
            elif kind == _DELETE:
                self.table.delete(key)
            elif kind == _JOIN:
                self.joins += 1
            else:
                self.leaves += 1
            pos = end
        self.offset += pos

    def _not_ours(self) -> None:
        raise DistStoreError(f"{self.path!r} is not an mpitensor FileStore file (perhaps one "
                             "written by torch, or another file); use a new path")

    def append(self, fd: int, records: List[bytes]) -> None:
        """Append records under the exclusive lock, and apply them to the table."""
        start = self.offset
        if start == 0:
            records = [_HEADER] + records
        if self.size != start:
            # drop the tail a dead writer left half-written
            os.ftruncate(fd, start)
        data = b"".join(records)
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], start + written)
        self.size = start + len(data)
        self._catch_up(fd)


class FileStore(Store):
    """A store in a file, shared by processes on one host or on a shared filesystem (torch's).

    Args:
        file_name: the file's path; created where missing. Use a fresh path per job.
        world_size: the number of users. With a positive value, the file is removed when that
            many handles have been closed (or garbage collected) and no handle is open any more
            (in any process); with ``-1`` (the default) it is kept. A file whose users all died
            without closing it (a crashed job) is emptied by the next user that opens it.

    Raises:
        DistStoreError: the file cannot be opened or holds something else.

    Example:
        >>> store1 = FileStore("/tmp/filestore", 2)
        >>> store2 = FileStore("/tmp/filestore", 2)   # usually in another process
        >>> store1.set("first_key", "first_value")
        >>> store2.get("first_key")
        b'first_value'
    """

    def __init__(self, file_name: str, world_size: int = -1) -> None:
        super().__init__()
        if not isinstance(file_name, (str, os.PathLike)):
            raise TypeError(f"FileStore file_name must be a path, got {type(file_name).__name__}")
        if isinstance(world_size, bool) or not isinstance(world_size, int):
            raise TypeError(f"FileStore world_size must be an int, got {world_size!r}")
        self._path = os.fspath(file_name)
        self._world_size = world_size
        self._log = _Log(self._path)
        self._log.join()
        self._closer = weakref.finalize(self, _leave, self._log, world_size, os.getpid())
        # a multiprocessing child ends with os._exit, which skips the finalizer above: without
        # its L record, a user that simply returned would look like one that crashed
        multiprocessing.util.Finalize(self, self._closer, exitpriority=0)

    @property
    def path(self) -> str:
        """The file's path."""
        return self._path

    def clone(self) -> "FileStore":
        """Return another handle on the same file (it counts as one more user)."""
        other = FileStore(self._path, self._world_size)
        other._timeout_s = self._timeout_s
        return other

    def close(self) -> None:
        """Leave the store; the last of ``world_size`` users removes the file. Idempotent."""
        self._closer()

    def has_extended_api(self) -> bool:
        """Return False, as torch's FileStore does (``append``/``multi_*`` work all the same)."""
        return False

    # ---------------------------------------------------------------- primitives
    def _write(self, fn: Any) -> Any:
        """Run ``fn(table) -> (result, records)`` under the exclusive lock; append the records."""
        with self._log.locked(exclusive=True) as fd:
            result, records = fn(self._log.table)
            if records:
                self._log.append(fd, records)
            return result

    def _set(self, key: bytes, value: bytes) -> None:
        self._write(lambda t: (None, [_record(_SET, key, value)]))

    def _multi_set(self, keys: List[bytes], values: List[bytes]) -> None:
        self._write(lambda t: (None, [_record(_SET, k, v) for k, v in zip(keys, values)]))

    def _add(self, key: bytes, amount: int) -> int:
        def op(t: _Table) -> Tuple[int, List[bytes]]:
            scratch = _Table()
            if key in t.data:
                scratch.data[key] = t.data[key]
            total = scratch.add(key, amount)
            return total, [_record(_SET, key, scratch.data[key])]
        return self._write(op)

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        def op(t: _Table) -> Tuple[bytes, List[bytes]]:
            scratch = _Table()
            if key in t.data:
                scratch.data[key] = t.data[key]
            out = scratch.compare_set(key, expected, desired)
            changed = scratch.data.get(key) != t.data.get(key)
            return out, ([_record(_SET, key, desired)] if changed else [])
        return self._write(op)

    def _append(self, key: bytes, value: bytes) -> None:
        self._write(lambda t: (None, [_record(_SET, key, t.data.get(key, b"") + value)]))

    def _delete(self, key: bytes) -> bool:
        # torch's FileStore answers True whether or not the key existed
        self._write(lambda t: (True, [_record(_DELETE, key)] if key in t.data else []))
        return True

    def _snapshot(self, keys: List[bytes]) -> Optional[List[bytes]]:
        with self._log.locked(exclusive=False):
            data = self._log.table.data
            if all(k in data for k in keys):
                return [data[k] for k in keys]
            return None

    def _multi_get(self, keys: List[bytes], seconds: float, op: str) -> List[bytes]:
        start = time.monotonic()
        deadline = start + seconds
        delay = _POLL_FIRST
        seen: Optional[Tuple[int, int, int]] = None
        while True:
            try:
                st = os.stat(self._path)
                now_seen: Optional[Tuple[int, int, int]] = (st.st_dev, st.st_ino, st.st_size)
            except OSError:
                now_seen = None
            if now_seen is None or now_seen != seen:
                values = self._snapshot(keys)
                if values is not None:
                    return values
                seen = now_seen
            now = time.monotonic()
            if now >= deadline:
                with self._log.locked(exclusive=False):
                    missing = self._log.table.missing(keys)
                if not missing:
                    continue
                raise StoreTimeoutError(
                    timeout_message("FileStore", op, missing, seconds, f" in {self._path!r}"),
                    op=op, elapsed=now - start, keys=[show_key(k) for k in missing])
            time.sleep(delay if math.isinf(deadline) else min(delay, deadline - now))
            delay = min(delay * 2, _POLL_MAX)

    def _check(self, keys: List[bytes]) -> bool:
        with self._log.locked(exclusive=False):
            return not self._log.table.missing(keys)

    def _num_keys(self) -> int:
        with self._log.locked(exclusive=False):
            # torch's FileStore counts its user-count key among the keys
            return len(self._log.table.data) + 1

    def _list_keys(self) -> List[bytes]:
        with self._log.locked(exclusive=False):
            return list(self._log.table.data)

    def __repr__(self) -> str:
        return f"FileStore({self._path!r}, world_size={self._world_size})"


def _leave(log: _Log, world_size: int, pid: int) -> None:
    """Count the handle out (see :meth:`_Log.leave`); never raises."""
    if os.getpid() != pid:  # a forked child's copy: the parent still uses the store
        return
    try:
        log.leave(world_size)
    except (OSError, DistStoreError):
        pass  # the file is gone or unreadable: nothing left to clean up
