"""A node's shared-memory segments: made by one rank, mapped by name by the others.

(The collectives' engine makes its segment without a name where Linux can,
:func:`create_anonymous`, so that no rank's death ever leaves one in ``/dev/shm``.)

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
from typing import Any, Callable, Optional, Tuple

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


def create_anonymous(nbytes: int) -> Optional[Tuple[int, str]]:
    """Make a segment of ``nbytes`` that has no name (``memfd_create``, Linux): ``(fd, path)``,
    the path its peers open it by (``/proc/<pid>/fd/<fd>``, valid while this process keeps
    ``fd`` open), or None where it cannot be made. Nothing of it outlives the last process
    that maps it, however each ends. Every page is reserved now, as :func:`create` does."""
    make = getattr(os, "memfd_create", None)
    if make is None:
        return None
    try:
        fd = make("mpitensor-coll", getattr(os, "MFD_CLOEXEC", 1))
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError:
        os.close(fd)
        return None
    return fd, f"/proc/{os.getpid()}/fd/{fd}"


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


def map_everywhere(path: Optional[str], nbytes: int, made: Optional[str],
                   everyone: Callable[[bool], bool]) -> Optional[mmap.mmap]:
    """Map the segment at ``path`` on this member (None: it has no name to map) and learn from
    ``everyone(mapped)`` (a collective of the caller's) whether every member mapped it; then
    unlink ``made``, the name this member created, if any (every member has mapped it or given
    up). The mapping where every member has one, else None on every member."""
    mm = attach(path, nbytes) if path is not None else None
    try:
        ok = everyone(mm is not None)
    finally:
        if made is not None:
            remove(made)
    if not ok:
        if mm is not None:
            mm.close()
        return None
    return mm


def shared(comm: Any, prefix: str, nbytes: int) -> Optional[mmap.mmap]:
    """Collective over the mpi4py communicator ``comm``: a segment of ``nbytes`` that every
    member maps, made by its rank 0 and passed on by name; None on every member where they do
    not share a machine (or there is no /dev/shm, or the CPU is not x86-64)."""
    from mpi4py import MPI  # imported where used: importing mpitensor must not start MPI

    ok = usable()
    made = create(prefix, nbytes) if comm.Get_rank() == 0 and ok else None
    path = comm.bcast(made, root=0)
    return map_everywhere(path if ok else None, nbytes, made,
                          lambda mapped: bool(comm.allreduce(int(mapped), op=MPI.MIN)))
