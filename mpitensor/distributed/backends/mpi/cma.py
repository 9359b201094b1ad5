"""Linux cross-memory attach: read a peer process's memory straight into this one's.

``process_vm_readv(2)`` copies from another process's address space into this one's in one
pass through the kernel: a byte that a collective moves from a peer's buffer into this rank's
crosses memory once (read there, written here), where a shared segment takes two copies (into
the segment, out of it). The kernel allows it where this process may ptrace the peer (same
user, and Yama's ``ptrace_scope`` 0 or no Yama; a container's seccomp profile may refuse the
call): :func:`available` says whether the call exists, and the engine (``shm_coll``) probes
every pair of members once per group, agreeing on the answer collectively, before it uses it.
Nothing here changes the process's ptrace settings. The writes the engine's all_reduce makes
into its peers' buffers (``process_vm_writev``, the same permission) are ``_tiny.put``'s,
guarded against a peer that left the call, and probed apart (``shm_direct.probe_write``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno as _errno
import sys
from typing import Optional

_IOV = ctypes.c_size_t * 2  # one iovec: (base, length)


class CmaError(OSError):
    """A read from a peer's memory failed (``errno``: ESRCH where the peer is gone)."""


def _load() -> Optional[ctypes._CFuncPtr]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                   ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return fn


_readv = _load()


def available() -> bool:
    """Whether ``process_vm_readv`` exists here (not whether the kernel lets us use it)."""
    return _readv is not None


class Reader:
    """Reads of peers' memory with two preallocated iovecs (no allocation per call)."""

    __slots__ = ("local", "remote", "pl", "pr")

    def __init__(self) -> None:
        self.local, self.remote = _IOV(), _IOV()
        self.pl, self.pr = ctypes.addressof(self.local), ctypes.addressof(self.remote)

    def read(self, pid: int, dst: int, src: int, nbytes: int) -> None:
        """Copy ``nbytes`` from address ``src`` of process ``pid`` to address ``dst`` here.

        Raises:
            CmaError: the kernel refused or the peer's memory is gone (``errno`` says which).
        """
        local, remote = self.local, self.remote
        while nbytes > 0:
            local[0], local[1] = dst, nbytes
            remote[0], remote[1] = src, nbytes
            got = _readv(pid, self.pl, 1, self.pr, 1, 0)
            if got <= 0:
                err = ctypes.get_errno() if got < 0 else _errno.EFAULT
                raise CmaError(err, f"process_vm_readv from process {pid} failed: "
                               f"{_errno.errorcode.get(err, err)}")
            dst, src, nbytes = dst + got, src + got, nbytes - got
