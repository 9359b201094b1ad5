"""The agreement slots' reading rules (``_fingerprint.NodeCheck``), one process, no MPI.

Two members share an anonymous mapping as two ranks share the group's /dev/shm segment. The
interleavings that a two-rank job meets only once in a few hundred thousand calls (a member
that posts and goes on between two of the reader's loads) are played here step by step, on the
Python reading (``_settle_py``) that the compiled ``settle`` hands every such case to.

Every test runs on both implementations of ``post``/``settle`` (Python, and ``_slots.c`` where
it was built), and on a pair that mixes them: they must write and read the same words.
"""

from __future__ import annotations

import mmap
import types

import numpy as np
import pytest

from mpitensor.distributed.health import fingerprint as _fingerprint
from mpitensor.distributed.health.fingerprint import NodeCheck


class Mismatch(Exception):
    pass


PY = _fingerprint._PyNodeCheck
C = getattr(_fingerprint, "_CNodeCheck", None)
needs_c = pytest.mark.skipif(C is None, reason="mpitensor.distributed.health._slots was not built "
                                               "(no C compiler at install time)")
KINDS = [pytest.param((PY, PY), id="python"),
         pytest.param((C, C), id="compiled", marks=needs_c),
         pytest.param((C, PY), id="compiled-python", marks=needs_c),
         pytest.param((PY, C), id="python-compiled", marks=needs_c)]


@pytest.fixture(params=KINDS)
def pair(request, monkeypatch):
    """Members 0 and 1 of one segment; a mismatch raises ``Mismatch`` with the reason."""
    def report(g, tok, reason, advice=""):
        raise Mismatch(reason)

    monkeypatch.setattr(_fingerprint, "_mismatch", report)
    mm = mmap.mmap(-1, NodeCheck.segment_bytes(2))
    ka, kb = request.param
    a, b = ka(mm, 0, 2), kb(mm, 1, 2)
    g = types.SimpleNamespace(ranks=[0, 1], check_bytes=65536)
    views = (a.q, b.q)
    yield a, b, g
    a.q, b.q = views  # (a test may have put a Racing view in)
    release(mm, a, b)


def release(mm, *members):
    """Let go of one mapping that several members share (``close`` is one member's own)."""
    for m in members:
        if hasattr(m, "release"):
            m.release()
        m.q.release()
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
    assert a._settle_py(tok, g)


def test_a_member_that_posted_a_different_fingerprint_in_between_is_a_mismatch(pair):
    a, b, g = pair
    tok = post(a, 1)
    slot = b.mine + (1 << 3)
    a.q = Racing(a.q, slot, lambda: (post(b, 1, np.zeros(16384, np.int32)), post(b, 2)))
    with pytest.raises(Mismatch, match="dtype"):
        a._settle_py(tok, g)


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


def test_a_member_that_posted_another_shape_is_a_mismatch(pair):
    a, b, g = pair
    tok = post(a, 1, np.zeros((128, 128), np.float32))
    post(b, 1, np.zeros((256, 64), np.float32))  # same bytes, another shape
    with pytest.raises(Mismatch, match="disagree on the shape"):
        a.settle(tok, g)


def test_a_member_that_went_on_agrees_and_one_left_behind_is_waited_for(pair):
    a, b, g = pair
    for s in range(1, 4):
        post(b, s)
    tok = post(a, 1)
    assert a.settle(tok, g)  # b posted call 1 and went on to 3: it agreed on 1
    tok = post(a, 4)
    assert not a.settle(tok, g)
    a.peek(tok, g)  # while waiting: nothing to say yet
    post(b, 4)
    assert a.settle(tok, g)


ARRAYS = [np.zeros(3, t) for t in (np.bool_, np.int8, np.uint8, np.int16, np.uint16,
                                    np.int32, np.uint32, np.int64, np.uint64, np.float16,
                                    np.float32, np.float64, np.complex64, np.complex128)]
ARRAYS += [np.zeros((), np.float32), np.zeros((0,), np.float32), np.zeros((0, 5), np.float32),
           np.zeros((2, 3, 4, 5), np.float64), np.zeros((3, 1), np.float32),
           np.zeros((1, 3), np.float32), np.zeros(3, np.dtype("q")), np.zeros(3, np.dtype("l")),
           np.zeros(3, np.dtype(">f4")), np.zeros(4, "V2")]
try:
    import ml_dtypes
    ARRAYS += [np.zeros(3, ml_dtypes.bfloat16), np.zeros(3, ml_dtypes.float8_e4m3fn)]
except ImportError:  # (an optional dependency)
    pass


@needs_c
def test_compiled_and_python_words_are_the_same():
    """A rank whose words come from ``_slots.c`` and one whose words come from Python agree
    exactly when their calls do: the same words for the same dtype (however it is spelled) and
    shape, and a different word for every different one."""
    mm = mmap.mmap(-1, NodeCheck.segment_bytes(2))
    c, p = C(mm, 0, 2), PY(mm, 1, 2)
    try:
        words = []
        for i, arr in enumerate(ARRAYS):
            for op, red, root in (("all_reduce", _fingerprint.ReduceOp.SUM, -1),
                                  ("broadcast", None, 3), ("reduce", _fingerprint.ReduceOp.MAX, 0)):
                tc = tuple(c.post(i, op, arr, red, root, arr))
                tp = p.post(i, op, arr, red, root, arr)
                assert tc[:4] == tp[:4], (arr.dtype, arr.shape, op)
                assert tc[4] == op and tc[5] is arr
                words.append((str(arr.dtype), arr.shape, op, tc[1:4]))
        # int64 spelled 'l' and 'q' are one dtype; every other pair of rows differs
        distinct = {(d.replace("int64", "i8"), sh, op): w for d, sh, op, w in words}
        assert len(set(distinct.values())) == len(distinct)
    finally:
        release(mm, c, p)


@needs_c
def test_compiled_post_takes_other_arrays_through_python():
    """Arrays that are not plain ``np.ndarray`` (a subclass here, CuPy arrays in use) get
    their words from the Python method: the same as the plain array's."""
    class Sub(np.ndarray):
        pass

    mm = mmap.mmap(-1, NodeCheck.segment_bytes(2))
    c = C(mm, 0, 2)
    try:
        arr = np.zeros((4, 5), np.float32)
        sub = tuple(c.post(1, "all_gather", arr.view(Sub), None, -1, None))
        plain = tuple(c.post(2, "all_gather", arr, None, -1, None))
        assert sub[1:4] == plain[1:4]
    finally:
        c.close()


@needs_c
def test_compiled_slots_refuse_what_does_not_fit():
    mm = mmap.mmap(-1, NodeCheck.segment_bytes(2))
    try:
        with pytest.raises(ValueError, match="too small"):
            _fingerprint._CSlots(mm, 0, 3, _fingerprint.RING, _fingerprint._LINE, -1, {}, {})
        with pytest.raises(ValueError, match="bad rank"):
            _fingerprint._CSlots(mm, 2, 2, _fingerprint.RING, _fingerprint._LINE, -1, {}, {})
        with pytest.raises(BufferError):
            _fingerprint._CSlots(b"read-only", 0, 1, 1, 4, -1, {}, {})
        c = C(mm, 0, 2)
        arr = np.zeros(4, np.float32)
        tok = c.post(1, "all_reduce", arr, None, -1, arr)
        with pytest.raises(TypeError):
            c.post(1, "all_reduce", arr)
        c.close()  # the segment is let go: later use raises instead of touching it
        with pytest.raises(ValueError, match="released"):
            c.post(1, "all_reduce", arr, None, -1, arr)
        with pytest.raises(ValueError, match="released"):
            c.settle(tok, None)
    finally:
        mm.close()


def test_native_off_takes_the_python_slots():
    """``MPITENSOR_NATIVE=0`` is the switch to every pure-Python path, these slots included."""
    import os
    import subprocess
    import sys

    code = ("from mpitensor.distributed.health import fingerprint as f; "
            "print(f.NodeCheck.__name__)")
    env = dict(os.environ, MPITENSOR_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["_PyNodeCheck"]


@needs_c
def test_compiled_token_reads_like_the_python_tuple():
    """The error paths read a compiled token as they read the Python slots' tuple."""
    mm = mmap.mmap(-1, NodeCheck.segment_bytes(2))
    c, p = C(mm, 0, 2), PY(mm, 1, 2)
    try:
        arr = np.zeros((3, 4), np.float64)
        tc = c.post(7, "broadcast", arr, None, 1, arr)
        tp = p.post(7, "broadcast", arr, None, 1, arr)
        assert len(tc) == 6 and tuple(tc) == tp
        assert tc[0] == 7 and tc[4] == "broadcast" and tc[5] is arr
        with pytest.raises(IndexError):
            tc[6]
        # settle takes either kind of token
        assert c.settle(tc, None) and c.settle(tp, None) and p.settle(tc, None)
    finally:
        release(mm, c, p)


def splits(m, s, send, expect, dtype=np.float32):
    return m.post_splits(s, "all_to_all_single", send, expect, "output_split_sizes", 1, dtype,
                         None)


def test_split_sizes_that_agree_settle(pair):
    a, b, g = pair
    # a sends [1, 2] (to itself, to b), b sends [3, 4]: a expects [1, 3], b expects [2, 4]
    tok = splits(a, 1, [1, 2], [1, 3])
    assert not a.settle(tok, g)  # b not there yet
    splits(b, 1, [3, 4], [2, 4])
    assert a.settle(tok, g)


def test_split_sizes_that_disagree_name_the_peer_and_both_counts(pair):
    a, b, g = pair
    tok = splits(a, 1, [1, 2], [1, 5])
    tok_b = splits(b, 1, [3, 4], [2, 4])
    with pytest.raises(Mismatch, match=r"rank 1 sends 3 elements to this rank, which expects "
                                       r"5 elements from it \(output_split_sizes\[1\]\)"):
        a.settle(tok, g)
    # b's own pieces matched: it completes (its output is right); a tells it of the break
    assert b.settle(tok_b, g)


def test_split_sizes_to_itself_are_checked_too(pair):
    a, b, g = pair
    tok = splits(a, 1, [2, 2], [1, 3])  # sends itself 2, expects 1 from itself
    splits(b, 1, [3, 1], [2, 1])
    with pytest.raises(Mismatch, match=r"rank 0 sends 2 elements to this rank, which expects 1"):
        a.settle(tok, g)


def test_split_sizes_in_another_dtype_are_a_mismatch(pair):
    a, b, g = pair
    tok = splits(a, 1, [1, 2], [1, 3])
    splits(b, 1, [3, 4], [2, 4], np.float64)
    with pytest.raises(Mismatch, match="dtype"):
        a.settle(tok, g)


def test_split_sizes_against_another_call_are_a_mismatch(pair):
    a, b, g = pair
    tok = splits(a, 1, [1, 2], [1, 3])
    post(b, 1)
    with pytest.raises(Mismatch, match="operation"):
        a.settle(tok, g)
    tok = post(a, 2)
    splits(b, 2, [3, 4], [2, 4])
    with pytest.raises(Mismatch, match="operation"):
        a.settle(tok, g)


def test_split_sizes_of_a_member_posting_between_two_loads_are_read(pair):
    """The member posts call 3 (with a count this rank does not expect) and goes on to call 4
    between the reader's load of its slot and of its header: the count is still compared."""
    a, b, g = pair
    for s in (1, 2):
        tok = splits(a, s, [1, 2], [1, 3])
        splits(b, s, [3, 4], [2, 4])
        assert a.settle(tok, g)
    tok = splits(a, 3, [1, 2], [1, 3])
    slot = b.mine + ((3 % _fingerprint.RING) << 3)
    a.q = Racing(a.q, slot, lambda: (splits(b, 3, [9, 4], [2, 4]), post(b, 4)))
    with pytest.raises(Mismatch, match="rank 1 sends 9 elements"):
        a._settle_py(tok, g)


def test_groups_past_the_board_size_have_no_board():
    n = _fingerprint.BOARD_MAX + 1
    mm = mmap.mmap(-1, NodeCheck.segment_bytes(n))
    m = PY(mm, 0, n)
    try:
        assert m.board == -1
        assert NodeCheck.segment_bytes(n) == 8 * n * (_fingerprint.RING + 1) * _fingerprint._LINE
        small = NodeCheck.segment_bytes(2) - 8 * 2 * (_fingerprint.RING + 1) * _fingerprint._LINE
        assert small == 8 * 2 * _fingerprint.RING * 2
    finally:
        release(mm, m)


@needs_c
def test_compiled_post_splits_writes_what_python_writes_and_refuses_misfits():
    mm = mmap.mmap(-1, NodeCheck.segment_bytes(2))
    c, p = C(mm, 0, 2), PY(mm, 1, 2)
    try:
        for op in ("all_to_all", "all_to_all_single"):
            for dt in (np.float32, np.dtype("q"), np.complex128):
                tc = tuple(c.post_splits(5, op, [3, 4], [3, 1], "w", 2, dt, None))
                tp = p.post_splits(5, op, [3, 4], [3, 1], "w", 2, dt, None)
                assert tc[:4] == tp[:4] and tc[4:] == tp[4:]
                # each wrote its row of the board: what it sends each member
                board, n = c.board, 2
                assert [c.q[board + (r * _fingerprint.RING + 5) * n + j]
                        for r in (0, 1) for j in (0, 1)] == [3, 4, 3, 4]
        with pytest.raises(ValueError, match="lists of 2 ints"):
            c.post_splits(1, "all_to_all", [1, 2, 3], [1, 2], "w", 1, np.float32, None)
        with pytest.raises(ValueError, match="lists of 2 ints"):
            c.post_splits(1, "all_to_all", [1, 2], "12", "w", 1, np.float32, None)
        with pytest.raises(TypeError):
            c.post_splits(1, "all_to_all", [1, 2], [1, 2], "w", 1, "no such dtype", None)
    finally:
        release(mm, c, p)
    n = _fingerprint.BOARD_MAX + 1
    mm = mmap.mmap(-1, NodeCheck.segment_bytes(n))
    c = C(mm, 0, n)
    try:
        with pytest.raises(ValueError, match="no split sizes board"):
            c.post_splits(1, "all_to_all", [1] * n, [1] * n, "w", 1, np.float32, None)
    finally:
        release(mm, c)
