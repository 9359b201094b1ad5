"""Result arrays a group's peers write straight into: anonymous shared segments, recycled.

A redistribution along a later dim moves strided blocks from every rank's piece into every
rank's result. Through a collective each block takes a packing pass and the collective's own
move; through the kernel's cross-memory copy (:mod:`cma_runs`) it crosses memory once, but
the kernel reads strided source runs with no prefetch and writes the destination through the
cache (it reads every destination line first). Where the result itself lies in a segment the
peers have mapped, each rank writes its blocks into every peer's result with the compiled
copy (prefetched source runs, stores that bypass the cache), with no system call at all.

:data:`POOL` hands out such results: C-contiguous NumPy arrays over ``memfd_create``
segments, each reused once nothing but the pool refers to it (the way ``_base/workspace``
recycles its buffers), so a training step's redistributions map nothing new after the first.
A segment has no name: nothing of it outlives the processes that map it, however they end.
Its peers open it as ``/proc/<pid>/fd/<fd>`` (the kernel allows that where it allows
cross-memory attach: same user, ptrace permitted) and check that the file is the one
announced (its inode) before they map it; :data:`PEERS` keeps their mappings for the next
call, a bounded number of them.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
import threading
from collections import OrderedDict
from typing import Any, List, Optional, Tuple

import numpy as np

from . import shm

__all__ = ["POOL", "PEERS", "available"]


def available() -> bool:
    """Whether this platform makes such segments (Linux's ``memfd_create`` and ``/proc``)."""
    return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


class _Seg:
    __slots__ = ("arr", "fd", "ino")

    def __init__(self, arr: np.ndarray, fd: int, ino: int):
        self.arr, self.fd, self.ino = arr, fd, ino


class Pool:
    """This process's shared results, each handed out again once no view of it is alive.

    At most ``MAX_BUFFERS`` segments and ``MAX_BYTES`` in all: past that, free segments are
    closed oldest first, and where every one is in use :meth:`empty` gives None (the caller
    moves its blocks another way)."""

    MAX_BUFFERS = 16
    MAX_BYTES = 512 << 20  # as _base/workspace's cache

    def __init__(self) -> None:
        self._segs: List[_Seg] = []
        self._lock = threading.Lock()
        self._segs.append(_Seg(np.empty(1, np.uint8), -1, 0))
        self._free_refs = self._count(0)  # the count of an array only the pool holds
        self._segs.clear()

    def _count(self, i: int) -> int:
        return sys.getrefcount(self._segs[i].arr)

    def empty(self, shape: Tuple[int, ...], dtype: Any) -> Optional[Tuple[np.ndarray, int, int]]:
        """``(array, fd, inode)``: an uninitialised C-contiguous array of ``shape`` in a shared
        segment, with what a peer needs to map it; None where none can be had."""
        dtype = np.dtype(dtype)
        nbytes = max(1, math.prod(shape) * dtype.itemsize)
        with self._lock:
            segs = self._segs
            for i in range(len(segs)):
                if segs[i].arr.nbytes == nbytes and self._count(i) == self._free_refs:
                    seg = segs.pop(i)
                    segs.append(seg)  # most recently used last
                    return self._view(seg, shape, dtype)
            total = sum(s.arr.nbytes for s in segs) + nbytes
            i = 0
            while i < len(segs) and (len(segs) >= self.MAX_BUFFERS or total > self.MAX_BYTES):
                if self._count(i) == self._free_refs:
                    total -= segs[i].arr.nbytes
                    self._close(segs.pop(i))
                else:
                    i += 1
            if len(segs) >= self.MAX_BUFFERS or total > self.MAX_BYTES:
                return None
            seg = self._make(nbytes)
            if seg is None:
                return None
            segs.append(seg)
            return self._view(seg, shape, dtype)

    @staticmethod
    def _view(seg: _Seg, shape: Tuple[int, ...], dtype: np.dtype) -> Tuple[np.ndarray, int, int]:
        n = math.prod(shape) * dtype.itemsize
        return seg.arr[:n].view(dtype).reshape(shape), seg.fd, seg.ino

    @staticmethod
    def _make(nbytes: int) -> Optional[_Seg]:
        made = shm.create_anonymous(nbytes)  # every page reserved now: no SIGBUS later
        if made is None:
            return None
        fd = made[0]
        try:
            mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            ino = os.fstat(fd).st_ino
        except (OSError, ValueError):
            os.close(fd)
            return None
        return _Seg(np.frombuffer(mm, np.uint8), fd, ino)

    @staticmethod
    def _close(seg: _Seg) -> None:
        """Close the segment's descriptor (peers can no longer open it); its memory goes
        with the last mapping of it, here or in a peer."""
        try:
            os.close(seg.fd)
        except OSError:
            pass

    def clear(self) -> None:
        """Tests: close every free segment."""
        with self._lock:
            keep = []
            for i, seg in enumerate(self._segs):
                if self._count(i) == self._free_refs:
                    self._close(seg)
                else:
                    keep.append(seg)
            self._segs = keep

    def __len__(self) -> int:
        return len(self._segs)


class Peers:
    """The peers' segments mapped here, by ``(pid, fd)``, the least recently used dropped
    past ``MAX_MAPS`` mappings or ``MAX_BYTES`` in all. A mapping keeps the segment's memory
    alive after its owner has closed it, until it is dropped here, or replaced by the next
    segment the owner announces at that descriptor."""

    MAX_MAPS = 32
    MAX_BYTES = 1 << 30

    def __init__(self) -> None:
        self._maps: "OrderedDict[Tuple[int, int], Tuple[int, np.ndarray]]" = OrderedDict()
        self._lock = threading.Lock()

    def get(self, pid: int, fd: int, ino: int, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of segment ``fd`` of process ``pid``, writable, as uint8.

        Raises:
            OSError: it cannot be opened or mapped, or the file there is not the segment
                announced (another inode) or is smaller than ``nbytes``.
        """
        key = (int(pid), int(fd))
        with self._lock:
            got = self._maps.get(key)
            if got is not None and got[0] == ino and got[1].nbytes >= nbytes:
                self._maps.move_to_end(key)
                return got[1][:nbytes]
            self._maps.pop(key, None)
            arr = self._map(key, ino, nbytes)
            self._maps[key] = (ino, arr)
            total = sum(a.nbytes for _, a in self._maps.values())
            while len(self._maps) > self.MAX_MAPS or (total > self.MAX_BYTES
                                                     and len(self._maps) > 1):
                _, (_, old) = self._maps.popitem(last=False)
                total -= old.nbytes
            return arr[:nbytes]

    @staticmethod
    def _map(key: Tuple[int, int], ino: int, nbytes: int) -> np.ndarray:
        fd = os.open(f"/proc/{key[0]}/fd/{key[1]}", os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            if st.st_ino != ino or st.st_size < nbytes:
                raise OSError(f"process {key[0]}'s descriptor {key[1]} is not the segment it "
                              f"announced (inode {st.st_ino}, {st.st_size} bytes; expected "
                              f"inode {ino}, at least {nbytes} bytes)")
            mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return np.frombuffer(mm, np.uint8)

    def clear(self) -> None:
        with self._lock:
            self._maps.clear()

    def __len__(self) -> int:
        return len(self._maps)


POOL = Pool()
PEERS = Peers()
