"""The PMI helper's words and key-value space: what a line says and what a ``get`` answers.

Standard library only: the helper (:mod:`.pmi`) runs as ``python -I -S pmi.py`` and loads this
file beside it without the package's ``__init__``.

Why ``vallen_max`` is :data:`VAL_MAX` (32 KiB) and not hydra's 1024: MPICH puts a binary value
longer than ``(vallen_max - 2) / 2`` bytes as several keys (``KEY`` = ``segments=S``, then
``KEY-seg-i/S``), and gets them one request each. Each host's first rank puts its network
address this way, and every first rank gets every host's address: with 1024, MPICH 5.0.2's
address (about 4.5 KB) took 10 keys, so ``10 * H**2`` requests for ``H`` hosts; with 32 KiB it
takes one (``H**2``), and the bytes sent are the same. MPICH 4.0-4.1's client shortens the
value length it uses to fit its own 1024-byte lines, so an older rank still works.

Each ``get`` is answered from a reply made once, when its key was put: a request costs one
dictionary look-up, whatever the size of the value.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence

__all__ = ["Kvs", "process_mapping"]

KVSNAME_MAX = 256
KEY_MAX = 64
VAL_MAX = 32768  # see the module's docstring
MAPPING_MAX = 1024  # PMI_process_mapping is kept to what hydra may give
LINE_MAX = 1 << 16  # a client that sends a longer line is not an MPICH rank
# all puts together: a fixed part and a share per rank (about 6 KB is put per host now)
KVS_BYTES_MAX = 64 << 20
KVS_BYTES_PER_RANK = 32 << 10

_UINT = re.compile(r"[0-9]{1,9}\Z")
_INT = re.compile(r"-?[0-9]{1,9}\Z")
WORD = re.compile(r"[!-~]*\Z")  # printable ASCII without space: keys, values, names
_BWORD = re.compile(rb"[!-~]*\Z")

NOT_FOUND = b"cmd=get_result rc=-1 msg=key_not_found\n"
_FOUND = b"cmd=get_result rc=0 msg=success value="
PUT_OK = b"cmd=put_result rc=0 msg=success\n"
PUT_BAD = b"cmd=put_result rc=-1 msg=bad_key_or_value\n"
PUT_FULL = b"cmd=put_result rc=-1 msg=kvs_full\n"


def uint(text: Optional[str]) -> Optional[int]:
    """``text`` as a non-negative int if it is 1-9 ASCII digits, else ``None``.

    ``str.isdigit`` and ``int`` take other scripts' digits (``"²".isdigit()`` is true and
    ``int("²")`` raises; ``int("٣")`` is 3): what a client sends is read by this alone."""
    return int(text) if text is not None and _UINT.match(text) else None


def sint(text: Optional[str]) -> Optional[int]:
    """Like :func:`uint`, with an optional leading ``-``."""
    return int(text) if text is not None and _INT.match(text) else None


def words(line: str) -> Dict[str, str]:
    """``cmd=put key=a value=b`` -> ``{"cmd": "put", "key": "a", "value": "b"}``."""
    out: Dict[str, str] = {}
    for word in line.split(" "):
        key, sep, value = word.partition("=")
        if sep:
            out[key] = value
    return out


def bwords(line: bytes) -> Dict[bytes, bytes]:
    """:func:`words` of an ASCII line kept as bytes (a rank's requests: no decoding)."""
    out: Dict[bytes, bytes] = {}
    for word in line.split(b" "):
        key, sep, value = word.partition(b"=")
        if sep:
            out[key] = value
    return out


def process_mapping(hosts: Sequence[str]) -> Optional[str]:
    """MPICH's ``PMI_process_mapping`` for ranks on ``hosts`` (one name per rank, in order).

    The value is ``(vector,(start_node,num_nodes,ppn),...)``: each block places ``ppn``
    consecutive ranks on each of ``num_nodes`` nodes counted from ``start_node``; nodes are
    numbered by first appearance. ``["a", "a", "b", "b"]`` -> ``(vector,(0,2,2))``,
    ``["a", "b", "a", "b"]`` -> ``(vector,(0,2,1),(0,2,1))``. ``None`` where the value would
    be longer than hydra's values (MPICH then exchanges host names itself).
    """
    ids: Dict[str, int] = {}
    runs: List[List[int]] = []  # [node, ranks in a row]
    for host in hosts:
        node = ids.setdefault(host, len(ids))
        if runs and runs[-1][0] == node:
            runs[-1][1] += 1
        else:
            runs.append([node, 1])
    blocks: List[List[int]] = []  # [start_node, num_nodes, ppn]
    for node, count in runs:
        last = blocks[-1] if blocks else None
        if last is not None and last[2] == count and last[0] + last[1] == node:
            last[1] += 1
        else:
            blocks.append([node, 1, count])
    text = "(vector," + ",".join(f"({a},{b},{c})" for a, b, c in blocks) + ")"
    return text if blocks and len(text) <= MAPPING_MAX else None


class Kvs:
    """The one key-value space of a world of ``size`` ranks, holding each value as the whole
    reply line that a ``get`` of its key returns.

    ``mapping`` (:func:`process_mapping`) answers ``PMI_process_mapping`` unless a rank put
    that key itself."""

    def __init__(self, size: int, mapping: Optional[str] = None) -> None:
        self.replies: Dict[bytes, bytes] = {}
        self.bytes = 0
        self.max_bytes = KVS_BYTES_MAX + size * KVS_BYTES_PER_RANK
        self.preset: Dict[bytes, bytes] = {}
        if mapping is not None:
            self.preset[b"PMI_process_mapping"] = _FOUND + mapping.encode("ascii") + b"\n"

    def get(self, key: bytes) -> bytes:
        """The reply line to ``cmd=get ... key=KEY``."""
        reply = self.replies.get(key)
        if reply is None:
            reply = self.preset.get(key, NOT_FOUND)
        return reply

    def put(self, key: bytes, value: bytes) -> bytes:
        """Store ``value`` under ``key``; the reply line to the ``put``."""
        if not (0 < len(key) <= KEY_MAX and len(value) <= VAL_MAX
                and _BWORD.match(key) and _BWORD.match(value)):
            return PUT_BAD
        old = self.replies.get(key)
        freed = len(key) + len(old) - len(_FOUND) - 1 if old is not None else 0
        if self.bytes - freed + len(key) + len(value) > self.max_bytes:
            return PUT_FULL
        self.replies[key] = _FOUND + value + b"\n"
        self.bytes += len(key) + len(value) - freed
        return PUT_OK
