"""The compiled board of small collectives (``backends/mpi/_tiny.c``), in one process: its
two copies of a post's data and the timing ``shm_tiny._copy_choice`` runs on a spare board."""

from __future__ import annotations

import mmap
import threading
import time

import numpy as np
import pytest

from mpitensor.distributed.backends.mpi import shm_tiny

_tiny = shm_tiny._tiny
pytestmark = pytest.mark.skipif(_tiny is None, reason="the board's compiled module was not "
                                "built (no C compiler at install)")
GATHER = shm_tiny.GATHER


def board(size, rank=0):
    mm = mmap.mmap(-1, shm_tiny.segment_bytes(size))
    return mm, _tiny.Board(mm, rank, size, shm_tiny.SLOTS, shm_tiny.CAP)


@pytest.mark.parametrize("nt_min", [shm_tiny.NEVER, 0, _tiny.NT_MIN if _tiny else 0])
def test_a_post_gives_its_bytes_whichever_copy_it_takes(nt_min):
    """Every size around the 64-byte step and the threshold, from an address one byte past
    alignment, read back by a one-member gather."""
    mm, b = board(1)
    b.nt_min = nt_min
    rng = np.random.default_rng(5)
    for s, nb in enumerate((1, 15, 63, 64, 65, 127, 2047, 2048, 2049, 4031, 4095, 4096), 1):
        src = rng.integers(0, 256, nb + 1, dtype=np.uint8)[1:]
        out = np.zeros(nb, np.uint8)
        assert b.run(s, 0, nb, src, out, GATHER, 0, 15, 15, 0) == 1
        np.testing.assert_array_equal(out, src)
    b.release()
    mm.close()


def test_timed_calls_of_one_member_and_their_bad_arguments():
    mm, b = board(1)
    for nt in (shm_tiny.NEVER, 0):
        assert 0 < b.time_calls(1 if nt else 100, 8, shm_tiny.CAP, nt, 5.0) < 5.0
    for bad in ((0, 8, 64, 0, 1.0), (1, 0, 64, 0, 1.0), (1, 8, 0, 0, 1.0),
                (1, 8, shm_tiny.CAP + 1, 0, 1.0)):
        with pytest.raises(ValueError, match="time_calls"):
            b.time_calls(*bad)
    assert b.nt_min == _tiny.NT_MIN  # (time_calls puts the board's own back)
    b.release()
    mm.close()


def test_timed_reduce_scatters_of_one_member_and_their_bad_sizes():
    """``msg_choice`` times float32 reduce-scatters (REDUCE_PART): whole float32 elements a
    member, at most an entry."""
    mm, b = board(1)
    part = shm_tiny.REDUCE_PART
    assert 0 < b.time_calls(1, 8, shm_tiny.CAP, shm_tiny.NEVER, 5.0, part) < 5.0
    for nbytes in (6, shm_tiny.CAP + 4):
        with pytest.raises(ValueError, match="time_calls"):
            b.time_calls(100, 8, nbytes, shm_tiny.NEVER, 5.0, part)
    with pytest.raises(ValueError, match="time_calls"):
        b.time_calls(100, 8, 64, shm_tiny.NEVER, 5.0, shm_tiny.ROOTED)
    b.release()
    mm.close()


def test_a_member_that_never_comes_ends_the_timing_within_its_limit():
    mm, b = board(2)
    t0 = time.monotonic()
    assert b.time_calls(1, 64, shm_tiny.CAP, 0, 0.05) == -1.0
    assert time.monotonic() - t0 < 2.0
    b.release()
    mm.close()


def test_what_each_kind_of_call_puts_on_the_board():
    """Every kind of call posts at most one entry's bytes a member: an all_gather's entry holds
    one member's input, so a crowded group's (entries of CROWDED_CAP) takes outputs NARROW
    times larger; the others take what fits one entry. A pair of ranks with cores of their own
    gets PAIR_CAP (an all_reduce PAIR_REDUCE_CAP: the engine takes larger ones), a crowded
    group of up to NARROW members CROWDED_CAP, larger groups the small caps whatever the
    load."""
    K = shm_tiny
    kinds = (K.GATHER, K.BCAST, K.REDUCE, K.REDUCE_PART, K.ROOTED)
    assert K.cap(2) == K.PAIR_CAP and K.cap(3) == K.cap(4) == K.NARROW_CAP
    for n in range(2, K.NARROW + 1):
        assert K.cap(n, True) == K.CROWDED_CAP
        most = K.limits(n, K.CROWDED_CAP, True)
        assert most[K.GATHER] == n * K.CROWDED_CAP
        assert all(most[k] == K.CROWDED_CAP for k in kinds[1:])
        alone = K.limits(n, K.cap(n), False)
        if n == 2:
            assert K.PAIR_REDUCE_CAP < K.PAIR_CAP and alone.pop(K.REDUCE) == K.PAIR_REDUCE_CAP
        assert all(v == K.cap(n) for v in alone.values())
    for n in (5, 8, 9, 64):
        assert K.cap(n, True) == K.cap(n) == (K.CAP if n <= K.WIDE else K.SMALL_CAP)
        assert set(K.limits(n, K.cap(n), True).values()) == {K.cap(n)}


def test_segments_stay_small():
    """At most about 4 MiB a group, 16 MiB where up to NARROW crowded members have 1 MiB
    entries (a smaller board where /dev/shm cannot hold that: tests/mpi/test_shm_tiny.py)."""
    K = shm_tiny
    assert all(K.segment_bytes(n) <= 4.5 * 2**20 for n in range(1, K.WIDE + 1))
    assert all(K.segment_bytes(n, K.cap(n, True)) <= 16.5 * 2**20
               for n in range(1, K.WIDE + 1))
    assert K.segment_bytes(4, K.CAP) < K.segment_bytes(4)


def test_a_reduce_to_one_root_reads_on_the_root_only():
    """kind ROOTED on a two-member board in one process (both members' views): each posts;
    the root's take reduces both entries in rank order into its output, the other's take
    (no output) reads nothing but still compares the words, and a root that differs is a
    mismatch named at once."""
    K = shm_tiny
    mm = mmap.mmap(-1, K.segment_bytes(2))
    b0, b1 = (_tiny.Board(mm, r, 2, K.SLOTS, K.CAP) for r in (0, 1))
    dt, op = K.DTYPES["INT32_T"], K.OPS["SUM"]
    for s, root in ((1, 0), (2, 1)):
        word = K._word(K.ROOTED, dt, op, root)
        x0, x1 = np.arange(5, dtype=np.int32), np.arange(5, dtype=np.int32) * 10
        assert b0.post(s, word, 20, x0) and b1.post(s, word, 20, x1)
        out = np.zeros(5, np.int32)
        boards = (b0, b1)
        assert boards[root].take(s, word, 20, out, K.ROOTED, root, dt, op, 0) == 1
        np.testing.assert_array_equal(out, x0 + x1)
        assert boards[1 - root].take(s, word, 20, None, K.ROOTED, root, dt, op, 0) == 1
    # call 3: member 1 names itself the root where member 0 names member 0
    w0, w1 = K._word(K.ROOTED, dt, op, 0), K._word(K.ROOTED, dt, op, 1)
    assert b0.post(3, w0, 20, np.zeros(5, np.int32)) and b1.post(3, w1, 20, np.zeros(5, np.int32))
    assert b0.take(3, w0, 20, np.zeros(5, np.int32), K.ROOTED, 0, dt, op, 0) == -1 - 1
    assert b1.take(3, w1, 20, np.zeros(5, np.int32), K.ROOTED, 1, dt, op, 0) == -1 - 0
    for b in (b0, b1):
        b.release()
    mm.close()


def test_a_take_yields_the_core_with_the_gil_let_go_and_notices_a_release():
    """A take whose peer has not posted spins, then yields the core ``yields`` times, then
    answers 0; while it yields, the process's other threads run Python; a board released by
    another thread meanwhile ends the take with an error, not a read of unmapped memory."""
    K = shm_tiny
    mm = mmap.mmap(-1, K.segment_bytes(2))
    b = _tiny.Board(mm, 0, 2, K.SLOTS, K.CAP)
    word = K._word(K.GATHER)
    out = np.zeros(8, np.uint8)
    assert b.post(1, word, 4, np.ones(4, np.uint8))
    b.yields = 200
    assert b.yields == 200 and b.take(1, word, 4, out, K.GATHER, -1, 15, 15, 0) == 0
    ran = []

    def other() -> None:
        end = time.perf_counter() + 0.2
        while time.perf_counter() < end:
            ran.append(1)
        b.release()

    b.yields = 1 << 40  # (until the release)
    t = threading.Thread(target=other)
    t.start()
    with pytest.raises(ValueError, match="released"):
        b.take(1, word, 4, out, K.GATHER, -1, 15, 15, 0)
    t.join()
    assert len(ran) > 1000  # the other thread ran while the take yielded
    mm.close()


def test_a_guarded_write_into_a_process_and_its_refusals():
    """``put``, the engine's write into a peer's buffer (here this process's own): it writes
    unless the owner closed the call's step, leaves the busy word clear after, and answers
    the errno of a write the kernel refuses."""
    import errno
    import os

    words = np.zeros(8, np.int64)
    src = np.arange(1000, dtype=np.float64)
    dst = np.zeros_like(src)
    me = os.getpid()
    assert _tiny.put(words, 0, 1, 5, me, dst.ctypes.data, src.ctypes.data, src.nbytes) == 0
    assert dst.tobytes() == src.tobytes() and words[0] == 0
    assert _tiny.put(words, 0, 1, 5, me, dst.ctypes.data, src.ctypes.data, 0) == 0
    _tiny.close(words, 1, 6)
    assert words[1] == 6
    dst[:] = 0
    assert _tiny.put(words, 0, 1, 6, me, dst.ctypes.data, src.ctypes.data, src.nbytes) == -1
    assert not dst.any() and words[0] == 0  # closed for step 6: nothing written
    assert _tiny.put(words, 0, 1, 7, me, dst.ctypes.data, src.ctypes.data + 8, 8) == 0
    assert dst[0] == 1 and not dst[1:].any()  # another step: written (eight bytes)
    assert _tiny.put(words, 0, 1, 8, me, 8, src.ctypes.data, 8) == errno.EFAULT
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)  # a process that is gone
    assert _tiny.put(words, 0, 1, 8, child, dst.ctypes.data, src.ctypes.data, 8) == errno.ESRCH
    with pytest.raises(ValueError, match="outside the control words"):
        _tiny.put(words, 0, 8, 8, me, dst.ctypes.data, src.ctypes.data, 8)
    with pytest.raises(ValueError, match="outside the control words"):
        _tiny.close(words, -1, 8)
    with pytest.raises(TypeError):
        _tiny.put(words.tobytes(), 0, 1, 8, me, dst.ctypes.data, src.ctypes.data, 8)  # read-only


class _Health:
    slow, fp_tok, check_bytes = False, None, 1 << 20


class _Group:
    seq = 0


class _Call:
    active = False

    def __init__(self, fast):
        self.fast = fast


class _Wrapper:  # a tensor type: its arrays are its _data
    def __init__(self, a):
        self._data = a


_NAMES = ("all_gather_into_tensor", "broadcast", "all_reduce", "reduce_scatter_tensor", "reduce")


def lane_on_one_member():
    """A one-member board, its lane, and what the lane reads: the group's count, its health,
    its history, its fault word (a word of a segment, as a group's is)."""
    mm, b = board(1)
    fm = mmap.mmap(-1, 8)
    fault = memoryview(fm).cast("q")
    g, h, history = _Group(), _Health(), [None] * 16
    lane = b.lane(h, history, _Wrapper, np.ndarray, fault, _NAMES, True)
    return mm, b, fm, fault, g, h, history, lane


def test_the_lane_takes_what_it_holds_and_counts_it():
    mm, b, fm, fault, g, h, history, lane = lane_on_one_member()
    op, f32 = object(), np.dtype(np.float32)
    calls = {k: _Call(b.spec(None, 100 + k, 16, k, 0, 0, 0)) for k in range(5)}
    for k, c in calls.items():
        assert lane.add(k, 16, 0, f32, None if k in (0, 1) else op, c) is True
    assert lane.used == 5
    x = np.arange(4, dtype=np.float32)
    assert lane.all_reduce(g, x, op) == 1 and g.seq == 1
    assert history[1] == (1, "all_reduce", f32, (4,))
    assert lane.broadcast(g, _Wrapper(x), 0) == 1 and lane.reduce(g, x, None, op) == 1
    out = np.zeros(4, np.float32)
    assert lane.all_gather(g, out, x) == 1 and out.tolist() == x.tolist()
    part = np.zeros(4, np.float32)
    assert lane.reduce_scatter(g, part, x, op) == 1 and part.tolist() == x.tolist()
    assert g.seq == 5 and history[5] == (5, "reduce_scatter_tensor", f32, (4,))
    assert x.tolist() == [0, 1, 2, 3]  # (one member: every reduction is its own data)
    lane.close()
    fault.release()  # (the lane let go of the word: its segment may close)
    fm.close()
    b.release()
    mm.close()


def test_the_lane_leaves_what_it_must_not_take_as_it_found_it():
    """Every refusal answers None and counts nothing: the group's state, the fault word, a
    call still to read, the buffers' layout, writability, overlap and sizes, a dtype or op
    it has not seen, a root past the group; then an emptied lane, a closed one."""
    mm, b, fm, fault, g, h, history, lane = lane_on_one_member()
    op, f32 = object(), np.dtype(np.float32)
    c = _Call(b.spec(None, 7, 16, 2, 0, 0, 0))
    lane.add(2, 16, 0, f32, op, c)
    gather = _Call(b.spec(None, 8, 16, 0, 0, 0, 0))
    lane.add(0, 16, 0, f32, None, gather)
    x = np.arange(4, dtype=np.float32)

    def refused(call=lambda: lane.all_reduce(g, x, op)):
        return call() is None and g.seq == 0

    for name, bad, good in (("slow", True, False), ("fp_tok", (1,), None),
                            ("check_bytes", 16, 1 << 20)):
        setattr(h, name, bad)
        assert refused(), name
        setattr(h, name, good)
    c.active = True
    assert refused()
    c.active = False
    fault[0] = 1
    assert refused()
    fault[0] = 0
    b.pending = 1
    assert refused()
    b.pending = 0
    wide = np.arange(8, dtype=np.float32)
    ro = x.copy()
    ro.flags.writeable = False
    for arg in (wide[::2], ro, x.astype(np.int32), [0.0] * 4, _Wrapper(wide[::2])):
        assert refused(lambda a=arg: lane.all_reduce(g, a, op)), arg
    assert refused(lambda: lane.all_reduce(g, x, object()))  # an op it has not seen
    assert refused(lambda: lane.broadcast(g, x, 1))  # a root past the group
    assert refused(lambda: lane.broadcast(g, x, True))  # a bool, not a rank
    whole = np.zeros(4, np.float32)
    assert refused(lambda: lane.all_gather(g, whole, whole))  # the same array
    assert refused(lambda: lane.all_gather(g, whole, whole[:4]))  # overlapping
    assert refused(lambda: lane.all_gather(g, np.zeros(5, np.float32), x))  # sizes
    assert refused(lambda: lane.all_gather(g, np.zeros(4, np.int32), x))  # dtypes differ
    assert refused(lambda: lane.all_gather(g, np.zeros((), np.float32), x[:1]))  # 0-d
    assert lane.all_reduce(g, x, op) == 1 and g.seq == 1
    assert lane.add(2, 16, 1 << 16, f32, op, c) is False  # a root no key holds
    lane.empty()
    assert lane.used == 0 and lane.all_reduce(g, x, op) is None
    lane.add(2, 16, 0, f32, op, c)
    lane.close()
    assert lane.all_reduce(g, x, op) is None and lane.add(2, 16, 0, f32, op, c) is False
    fault.release()
    fm.close()
    b.release()
    mm.close()
