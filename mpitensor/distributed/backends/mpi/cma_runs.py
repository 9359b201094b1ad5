"""Cross-memory attach over many runs: a strided block read from, or written into, a peer.

:mod:`cma` reads one contiguous range of a peer's memory. A redistribution that moves a block
of a tensor moves equal contiguous runs (a row's chunk, say), which need not lie end to end on
either side. ``process_vm_readv(2)``/``process_vm_writev(2)`` take a list of ranges on each
side (at most ``IOV_MAX`` a call), so the whole block crosses memory once, straight from the
peer's array into this one's (or back), in one system call per ``IOV_MAX`` runs.

The kernel pins the *peer's* pages once per range of its list, and walks this process's list
at no such cost: a caller does best to put the runs that lie end to end on the peer's side
(read when the peer's block is contiguous, write when this one's is). Runs that lie end to end
are merged into one range on each side. The same permission as :mod:`cma` applies (this
process may ptrace the peer); :class:`cma.CmaError` says why a transfer failed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as _errno
import os
import sys
from typing import Optional, Tuple

import numpy as np

from .cma import CmaError

__all__ = ["available", "transfer"]

_IOV_MAX = 1024
_CALL_BYTES = 1 << 30


def _syscalls() -> Optional[Tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]]:
    """(process_vm_readv, process_vm_writev) from the C library, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        calls = (libc.process_vm_readv, libc.process_vm_writev)
    except (OSError, AttributeError):
        return None
    for fn in calls:
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                       ctypes.c_ulong, ctypes.c_ulong]
        fn.restype = ctypes.c_ssize_t
    return calls


_calls = _syscalls()
try:
    _IOV_MAX = max(1, min(_IOV_MAX, os.sysconf("SC_IOV_MAX")))
except (ValueError, OSError):
    pass


def available() -> bool:
    """Whether both system calls exist here (not whether the kernel lets us use them)."""
    return _calls is not None


def _ranges(base: int, offs: np.ndarray, run: int) -> np.ndarray:
    """The iovec array ``(n, 2)`` (address, length) of runs at ``base + offs``, those that lie
    end to end merged."""
    if len(offs) == 0:
        return np.zeros((0, 2), np.uint64)
    starts = np.flatnonzero(np.diff(offs) != run) + 1
    first = np.concatenate(([0], starts))
    counts = np.diff(np.concatenate((first, [len(offs)])))
    iov = np.empty((len(first), 2), np.uint64)
    iov[:, 0] = offs[first] + base
    iov[:, 1] = counts * run
    return iov


def transfer(pid: int, write: bool, local: int, local_offs: np.ndarray, remote: int,
             remote_offs: np.ndarray, run: int) -> None:
    """Move ``len(local_offs)`` runs of ``run`` bytes between this process and ``pid``.

    Run ``r`` lies at ``local + local_offs[r]`` here and ``remote + remote_offs[r]`` in the
    peer (byte offsets, int64, the same count on both sides). ``write`` copies from here into
    the peer (``process_vm_writev``), otherwise from the peer into here.

    Raises:
        CmaError: the kernel refused, the peer is gone (``errno`` ESRCH), or fewer bytes moved
            than asked (a range outside the peer's mapped memory).
    """
    if _calls is None:
        raise CmaError(_errno.ENOSYS, "process_vm_readv/writev are not available here")
    call = _calls[1] if write else _calls[0]
    per = max(1, min(_IOV_MAX, _CALL_BYTES // max(run, 1)))  # the kernel moves < 2 GiB a call
    for lo in range(0, len(local_offs), per):
        hi = min(len(local_offs), lo + per)
        mine = _ranges(local, local_offs[lo:hi], run)
        theirs = _ranges(remote, remote_offs[lo:hi], run)
        want = (hi - lo) * run
        got = call(pid, mine.ctypes.data, len(mine), theirs.ctypes.data, len(theirs), 0)
        if got != want:
            err = ctypes.get_errno() if got < 0 else _errno.EFAULT
            raise CmaError(err, f"process_vm_{'writev' if write else 'readv'} with process "
                           f"{pid} moved {got} of {want} bytes: "
                           f"{_errno.errorcode.get(err, err)}")
