"""A node's shared-memory segments: made by one rank, mapped by name by the others.

Used by DDP's shared-memory buckets (``_node_reduce``) and by the agreement check's slots
(``_fingerprint``). Each passes the name to its peers its own way and unlinks it once every
peer has mapped the segment (or given up); a peer on another machine finds no such name, which
is how those callers learn that their ranks do not share one.
"""

from __future__ import annotations

import mmap
import os
import platform
import uuid
from typing import Optional

DIR = "/dev/shm"


def usable() -> bool:
    """Whether segments can be shared here: a ``/dev/shm``, and an x86-64 CPU (the callers'
    flags rely on stores being seen in the order they were made)."""
    return platform.machine().lower() in ("x86_64", "amd64") and os.path.isdir(DIR)


def create(prefix: str, nbytes: int) -> Optional[str]:
    """Make a new segment of ``nbytes`` named ``prefix`` + 32 hex digits; its path, or None.

    Every page is reserved now: a tmpfs that runs out (a container's 64 MiB ``/dev/shm``)
    then fails here, instead of with SIGBUS at a later write.
    """
    path = os.path.join(DIR, f"{prefix}{uuid.uuid4().hex}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, nbytes)
        finally:
            os.close(fd)
    except OSError:
        remove(path)
        return None
    return path


def attach(path: str, nbytes: int) -> Optional[mmap.mmap]:
    """Map the segment at ``path``; None where there is none (another machine)."""
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            return mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None


def remove(path: str) -> None:
    """Unlink the segment's name (mappings stay valid)."""
    try:
        os.unlink(path)
    except OSError:
        pass
