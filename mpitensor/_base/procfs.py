"""What Linux's process table says about a process: its ``/proc/PID/stat`` fields, the code
it is exiting with, its ancestry. Used by the launchers' watches (``run/watch.py``, the
``spawn`` jobs of ``distributed/launch/processes.py``) to name the rank that ended a job."""

from __future__ import annotations

from typing import List, Optional


def stat(pid: int) -> List[bytes]:
    """Fields 3 on of /proc/PID/stat (``fields[k - 3]`` is field k), or [] if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read()
        return text[text.rindex(b")") + 2:].split()  # comm may hold spaces and parentheses
    except (OSError, ValueError):
        return []


def start_time(pid: int) -> Optional[bytes]:
    """When process ``pid`` started (field 22, clock ticks since boot): with the pid, a name
    for the process that no later process reuses. None where it cannot be read."""
    fields = stat(pid)
    return fields[19] if len(fields) >= 20 else None


def exit_status(pid: int, start: bytes) -> Optional[int]:
    """The wait status process ``pid`` (started at ``start``) is exiting with: 0 while it runs,
    else as ``os.waitpid`` will give it. None once it is reaped (or the pid is another
    process's now).

    The kernel sets a dying process's ``exit_code`` (field 52) before it closes the process's
    descriptors, and it can be read until the process is reaped: a process whose last thread
    waits for a core is seen exiting before its pipes and sockets close."""
    fields = stat(pid)
    if len(fields) < 50 or fields[19] != start:
        return None
    return int(fields[49])


def own_code(status: Optional[int]) -> Optional[int]:
    """The non-zero code of the wait status ``status`` where the process exited by itself;
    else None (no status, a zero code, or a death by a signal: a SIGKILL may be a launcher's
    own, ending the rank because another failed)."""
    if status is None or status & 0x7F:
        return None
    return status >> 8 or None


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor`` or one of its descendants."""
    for _ in range(256):  # a chain longer than this is no job's
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        fields = stat(pid)
        if len(fields) < 2:
            return False  # gone already: nothing it said can be trusted to be the job's
        pid = int(fields[1])
    return False
