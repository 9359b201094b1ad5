"""The agreement slots' reading rules (``_fingerprint.NodeCheck``), one process, no MPI.

Two members share an anonymous mapping as two ranks share the group's /dev/shm segment. The
interleavings that a two-rank job meets only once in a few hundred thousand calls (a member
that posts and goes on between two of the reader's loads) are played here step by step.
"""

from __future__ import annotations

import mmap
import types

import numpy as np
import pytest

from mpitensor.distributed import _fingerprint
from mpitensor.distributed._fingerprint import NodeCheck


class Mismatch(Exception):
    pass


@pytest.fixture
def pair(monkeypatch):
    """Members 0 and 1 of one segment; a mismatch raises ``Mismatch`` with the reason."""
    def report(g, tok, reason):
        raise Mismatch(reason)

    monkeypatch.setattr(_fingerprint, "_mismatch", report)
    mm = mmap.mmap(-1, NodeCheck.segment_bytes(2))
    a, b = NodeCheck(mm, 0, 2), NodeCheck(mm, 1, 2)
    g = types.SimpleNamespace(ranks=[0, 1], check_bytes=65536)
    views = (a.q, b.q)
    yield a, b, g
    for v in views:
        v.release()
    mm.close()


def post(m, s, arr=None):
    arr = np.zeros(16384, np.float32) if arr is None else arr
    return m.post(s, "all_reduce", arr, None, -1, arr)


class Racing:
    """Member ``a``'s view of the segment in which member ``b`` acts right after ``a``'s first
    load of ``b``'s slot for the call: the load returns what the slot held before."""

    def __init__(self, q, index, act):
        self.q, self.index, self.act = q, index, act

    def __getitem__(self, i):
        v = self.q[i]
        if i == self.index and self.act is not None:
            act, self.act = self.act, None
            act()
        return v

    def __setitem__(self, i, v):
        self.q[i] = v


def test_a_member_posting_and_going_on_between_two_loads_agrees(pair):
    a, b, g = pair
    for s in (1, 2):  # both agree on calls 1 and 2
        tok = post(a, s)
        post(b, s)
        assert a.settle(tok, g)
    tok = post(a, 3)
    slot = b.mine + ((3 % _fingerprint.RING) << 3)
    # b posts call 3 and goes on to call 4 exactly between a's load of b's slot for call 3
    # (which then held nothing for it) and a's load of b's header
    a.q = Racing(a.q, slot, lambda: (post(b, 3), post(b, 4)))
    assert a.settle(tok, g)


def test_a_member_that_posted_a_different_fingerprint_in_between_is_a_mismatch(pair):
    a, b, g = pair
    tok = post(a, 1)
    slot = b.mine + (1 << 3)
    a.q = Racing(a.q, slot, lambda: (post(b, 1, np.zeros(16384, np.int32)), post(b, 2)))
    with pytest.raises(Mismatch, match="dtype"):
        a.settle(tok, g)


@pytest.mark.parametrize("threshold", [65536, 0])
def test_a_member_that_skipped_the_call_is_a_mismatch(pair, threshold):
    a, b, g = pair
    g.check_bytes = threshold
    tok = post(a, 1)
    post(a, 2)
    post(b, 2)  # b made call 1 unchecked (smaller than the threshold) and posted call 2
    with pytest.raises(Mismatch, match="one call more or fewer") as info:
        a.settle(tok, g)
    # at threshold 0 every call is checked: no talk of calls under it
    assert ("fewer than 65536 bytes (unchecked)" in str(info.value)) == (threshold > 0)
    assert "fewer than 0 bytes" not in str(info.value)


def test_a_member_not_there_yet_is_waited_for(pair):
    a, b, g = pair
    tok = post(a, 1)
    assert not a.settle(tok, g)
    post(b, 1)
    assert a.settle(tok, g)
