"""Debug mode for point-to-point: send/recv check that dtype and size agree.

With ``set_debug(True)`` (on every rank) a sender first sends a small header (dtype, shape,
bytes) on a private communicator; the receiver checks it against its buffer and answers, so a
disagreement raises on the receiving side (MessageMismatchError, or MessageTruncatedError for a
buffer that is too small) *and* on the sending side, each message naming both sides' values.
The link stays usable: the next matching exchange works.

Ranks 0 and 1 exchange; the others only take part in the barriers.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor
import mpitensor.distributed as dist
from mpitensor.errors import MessageMismatchError, MessageTruncatedError

from . import arrayimpl as ai

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture(autouse=True)
def _debug_on():
    with ai.debug_mode(True):
        yield
    dist.barrier()


def exchange(sent, recv_buf, tag, mode="sync", src=0):
    """Rank 0 sends ``sent`` to rank 1, which receives into ``recv_buf``; return what this rank
    raised (or None), after both are done."""
    me = dist.get_rank()
    try:
        if me == 0:
            if mode == "sync":
                dist.send(sent, 1, tag=tag)
            else:
                dist.isend(sent, 1, tag=tag).wait()
        elif me == 1:
            if mode == "sync":
                assert dist.recv(recv_buf, src, tag=tag) == 0
            else:
                work = dist.irecv(recv_buf, src, tag=tag)
                work.wait()
                assert work.source_rank() == 0
    except (MessageMismatchError, MessageTruncatedError) as exc:
        return exc
    return None


def still_works(tag):
    y = np.zeros(3)
    assert exchange(np.arange(3.0), y, tag) is None
    if dist.get_rank() == 1:
        np.testing.assert_array_equal(y, [0.0, 1.0, 2.0])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_matching_messages_pass(mode):
    me = dist.get_rank()
    y = np.zeros((3, 4), np.float32)
    assert exchange(np.arange(12, dtype=np.float32).reshape(3, 4), y, 1, mode) is None
    t = mpitensor.Tensor(np.zeros(5, np.int16)) if hasattr(mpitensor, "Tensor") else None
    assert exchange(np.arange(5, dtype=np.int16), t, 2, mode, src=None) is None
    z = np.zeros((4, 6))[:, ::2]  # non-contiguous: staged and written back
    assert exchange(np.ones((4, 3)), z, 3, mode) is None
    w = np.zeros((3, 2), np.float32)  # same dtype and count, other shape: allowed
    assert exchange(np.ones((2, 3), np.float32), w, 4, mode) is None
    if me == 1:
        np.testing.assert_array_equal(y, np.arange(12).reshape(3, 4))
        np.testing.assert_array_equal(t._data, np.arange(5))
        assert (z == 1).all() and (w == 1).all()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_dtype_mismatch_same_bytes(mode):
    me = dist.get_rank()
    exc = exchange(np.arange(4, dtype=np.int32), np.zeros(4, np.float32), 11, mode)
    both = "the sender sent int32[4] (16 bytes), but the receive buffer is float32[4] (16 bytes)"
    op = "recv" if mode == "sync" else "irecv"
    if me == 1:
        assert isinstance(exc, MessageMismatchError), exc
        assert f"rank 1: {op} (p2p #" in str(exc)
        assert "the message from rank 0 (tag 11) does not match the receive buffer" in str(exc)
        assert both in str(exc)
    elif me == 0:
        assert isinstance(exc, MessageMismatchError), exc
        assert "rank 1 received this message and reported: " + both in str(exc)
    still_works(12)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_count_mismatch_smaller_message(mode):
    """MPI itself would accept a shorter message silently; debug mode does not."""
    me = dist.get_rank()
    y = np.zeros(4)
    exc = exchange(np.ones(3), y, 21, mode)
    if me in (0, 1):
        assert isinstance(exc, MessageMismatchError), exc
        assert "sent float64[3] (24 bytes), but the receive buffer is float64[4] (32 bytes)" \
            in str(exc)
    still_works(22)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_buffer_too_small(mode):
    me = dist.get_rank()
    exc = exchange(np.arange(10.0).reshape(2, 5), np.zeros(4), 31, mode)
    if me == 1:
        assert isinstance(exc, MessageTruncatedError), exc
        assert "the sender sent float64[2, 5] (80 bytes), this rank receives into float64[4] " \
               "(32 bytes)" in str(exc)
    elif me == 0:
        assert isinstance(exc, MessageMismatchError), exc
        assert "reported: the sender sent float64[2, 5] (80 bytes), but the receive buffer is " \
               "float64[4] (32 bytes)" in str(exc)
    still_works(32)


def test_batch_isend_irecv_ring_in_debug_mode():
    """A ring shift through batch_isend_irecv: every rank sends and receives at once."""
    n, me = dist.get_world_size(), dist.get_rank()
    out = np.zeros(3, np.int64)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.irecv, out, (me - 1) % n, tag=41),
        dist.P2POp(dist.isend, np.full(3, me, np.int64), (me + 1) % n, tag=41)])
    for w in works:
        w.wait()
    np.testing.assert_array_equal(out, np.full(3, (me - 1) % n))
