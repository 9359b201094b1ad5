"""Hostfiles in MPICH's (``host:slots``) and Open MPI's (``host slots=N``) syntax, read and checked.

:func:`parse_hostfile` reads one and says which syntax it is written in, so that
:func:`~.job.build_command` can hand it to an ``mpiexec`` of either MPI (inline, where the file
is in the other MPI's syntax). The host pool of an elastic job (:mod:`.hostpool`) works on the
:class:`HostEntry` list it returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from .mpiexec import MPICH, OPENMPI

__all__ = ["HostEntry", "HostfileError", "MAX_SLOTS", "parse_hostfile", "inline_comment_lines"]


class HostfileError(ValueError):
    """A hostfile does not exist or a line is neither ``host[:slots]`` nor ``host slots=N``."""


@dataclass(frozen=True)
class HostEntry:
    """One host of a hostfile: its name and its slot count (``None``: not given)."""

    host: str
    slots: Optional[int]


MAX_SLOTS = 4096  # per host: far above any node's cores or GPUs
_HOST_RE = r"[A-Za-z0-9_.\-\[\]]+|\[[0-9A-Fa-f:.]+\]"


def parse_hostfile(path: str) -> Tuple[List[HostEntry], str]:
    """Read and check a hostfile written for MPICH or for Open MPI.

    MPICH lines are ``host`` or ``host:slots``; Open MPI lines are ``host``, ``host slots=N`` and
    optionally ``max_slots=M``. ``#`` starts a comment; blank lines are allowed. One file must use
    one syntax.

    Args:
        path: the hostfile.

    Returns:
        ``(entries, syntax)`` where ``syntax`` is ``"mpich"``, ``"openmpi"`` or ``"plain"`` (only
        bare host names, valid for both).

    Raises:
        HostfileError: the file is missing, unreadable, empty, mixes syntaxes, or has a line of
            neither syntax (the message names the file and line).

    Example:
        >>> parse_hostfile("hostfiles/mpich.hostfile")  # doctest: +SKIP
        ([HostEntry(host='node1', slots=4), HostEntry(host='node2', slots=4)], 'mpich')
    """
    p = Path(path)
    if not p.is_file():
        raise HostfileError(f"hostfile {path} does not exist")
    try:
        lines = p.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise HostfileError(f"hostfile {path} cannot be read: {exc}") from None
    entries: List[HostEntry] = []
    syntaxes = set()
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = line.split()
        m = re.fullmatch(rf"({_HOST_RE})(?::(\d+))?", tokens[0])
        bad = (f"hostfile {path} line {number}: {raw.strip()!r} is neither `host[:slots]` "
               "(MPICH) nor `host slots=N` (Open MPI)")
        if m is None:
            raise HostfileError(bad)
        host, colon_slots = m.group(1), m.group(2)
        slots: Optional[int] = None
        if colon_slots is not None:
            if len(tokens) > 1 and any(t.startswith(("slots=", "max_slots=")) for t in tokens):
                raise HostfileError(bad)
            slots = int(colon_slots)
            syntaxes.add(MPICH)
        for tok in tokens[1:]:
            kv = re.fullmatch(r"(slots|max_slots|max-slots)=(\d+)", tok)
            if kv is not None:
                if kv.group(1) == "slots":
                    slots = int(kv.group(2))
                syntaxes.add(OPENMPI)
            elif colon_slots is not None and re.fullmatch(r"ifhn=\S+", tok):
                continue  # hydra's per-host interface hostname
            else:
                raise HostfileError(bad)
        if slots is not None and not 1 <= slots <= MAX_SLOTS:
            raise HostfileError(f"hostfile {path} line {number}: {raw.strip()!r} gives "
                                f"{slots} slots; slots must be between 1 and {MAX_SLOTS} (the "
                                "ranks one host runs; a huge count makes mpiexec spin)")
        entries.append(HostEntry(host, slots))
    if not entries:
        raise HostfileError(f"hostfile {path} names no host (only blank lines and comments)")
    if len(syntaxes) > 1:
        raise HostfileError(f"hostfile {path} mixes MPICH `host:slots` and Open MPI `host "
                            "slots=N` lines; use one syntax")
    return entries, (syntaxes.pop() if syntaxes else "plain")


def inline_comment_lines(path: str, text: Optional[str] = None) -> List[int]:
    """Line numbers of ``path`` with a comment after a host: MPICH's hydra rejects those.

    ``text``, when given, is the file's content already read.
    """
    out = []
    lines = (Path(path).read_text() if text is None else text).splitlines()
    for number, raw in enumerate(lines, 1):
        head, hash_, _ = raw.partition("#")
        if hash_ and head.strip():
            out.append(number)
    return out


def _hosts_option(entries: Sequence[HostEntry]) -> str:
    return ",".join(e.host if e.slots is None else f"{e.host}:{e.slots}" for e in entries)
