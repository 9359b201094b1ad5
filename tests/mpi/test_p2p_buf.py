"""Point-to-point on buffers: send/recv, isend/irecv, tags, any-source, batch_isend_irecv.

As in mpi4py's ``test_p2p_buf.py``: one base class bound by subclasses to the world and to
sub-groups; peers are named by global rank (``dst``/``src``) or by group rank
(``group_dst``/``group_src``), and every rank checks what it received.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import mpitensor.distributed as dist

from . import arrayimpl as ai


def vals(shape, dt, r, salt=0):
    return ai.values(shape, dt, r, salt)


def zeros(kind, shape, dt):
    return ai.wrap(kind, np.zeros(shape, dtype=dt))


class BaseTestP2P(ai.GroupCase):
    """Point-to-point inside one communicator (``GROUP``); rings need two members or more."""

    def peers(self):
        """(next, previous) group ranks around the ring of the group."""
        return (self.rank + 1) % self.size, (self.rank - 1) % self.size

    def lonely(self) -> bool:
        """True where there is no peer to talk to (a non-member, or a group of one)."""
        return self.nonmember() or self.size < 2

    def test_send_recv_ring(self):
        """Every dtype and kind around the ring; even ranks send first, odd ranks receive."""
        if self.lonely():
            return
        nxt, prv = self.peers()
        for kind in ai.kinds():
            for dt in ai.ALL_DTYPES:
                for by_group_rank in (False, True):
                    what = f"send/recv {kind} {dt} to {self.ranks[nxt]}"
                    x = ai.wrap(kind, vals((2, 3), dt, self.rank))
                    y = zeros(kind, (2, 3), dt)
                    if by_group_rank:
                        skw, rkw = {"group_dst": nxt}, {"group_src": prv}
                    else:
                        skw, rkw = {"dst": self.ranks[nxt]}, {"src": self.ranks[prv]}
                    if self.rank % 2 == 0:
                        assert dist.send(x, group=self.group, **skw) is None
                        sender = dist.recv(y, group=self.group, **rkw)
                    else:
                        sender = dist.recv(y, group=self.group, **rkw)
                        dist.send(x, group=self.group, **skw)
                    ai.expect(sender == self.ranks[prv], f"{what}: recv returned {sender}")
                    ai.check(y, vals((2, 3), dt, prv), what)
                    ai.check(x, vals((2, 3), dt, self.rank), what + " (send buffer kept)")

    def test_send_recv_shapes_and_layouts(self):
        if self.lonely():
            return
        nxt, prv = self.peers()
        for kind in ai.kinds():
            for dt in (np.dtype(np.float16), np.dtype(np.int32), np.dtype(np.complex128)):
                for shape in ((), (0,), (7,), (3, 4), (2, 2, 3)):
                    for layout in ai.layouts(shape):
                        what = f"send/recv {kind} {dt} {shape} {layout}"
                        x = ai.Laid(kind, vals(shape, dt, self.rank, salt=1), layout)
                        y = ai.Laid(kind, np.zeros(shape, dt), layout)
                        works = [dist.irecv(y.x, self.ranks[prv], group=self.group),
                                 dist.isend(x.x, self.ranks[nxt], group=self.group)]
                        for w in works:
                            w.wait()
                        ai.check(y.x, vals(shape, dt, prv, salt=1), what)
                        y.check_gaps(what)

    @pytest.mark.parametrize("mode", ("wait", "poll"))
    def test_isend_irecv(self, mode):
        if self.lonely():
            return
        nxt, prv = self.peers()
        for kind in ai.kinds():
            for dt in ai.SOME_DTYPES:
                what = f"isend/irecv {kind} {dt} {mode}"
                x = ai.wrap(kind, vals(5, dt, self.rank, salt=2))
                y = zeros(kind, 5, dt)
                rw = dist.irecv(y, src=self.ranks[prv], group=self.group)
                sw = dist.isend(x, dst=self.ranks[nxt], group=self.group)
                assert isinstance(rw, dist.Work) and isinstance(sw, dist.Work)
                for w in (rw, sw):
                    if mode == "wait":
                        assert w.wait() is True
                    else:
                        deadline = time.monotonic() + 60
                        while not w.is_completed():
                            assert time.monotonic() < deadline, f"{what}: never completed"
                            time.sleep(1e-5)
                    assert w.is_completed() and w.is_success()
                ai.check(y, vals(5, dt, prv, salt=2), what)
                ai.expect(rw.source_rank() == self.ranks[prv], f"{what}: source_rank")
                ai.expect(rw.result() == [y], f"{what}: result() {rw.result()!r}")

    def test_irecv_any_source(self):
        """irecv(src=None): work.source_rank() names the sender after wait()."""
        if self.lonely():
            return
        nxt, prv = self.peers()
        dt = np.dtype(np.int64)
        y = np.zeros(3, dt)
        rw = dist.irecv(y, group=self.group)
        with pytest.raises(RuntimeError, match="wait"):
            rw.source_rank()  # not complete yet: nobody has sent
        dist.isend(vals(3, dt, self.rank), group_dst=nxt, group=self.group).wait()
        rw.wait()
        ai.expect(rw.source_rank() == self.ranks[prv], f"source_rank {rw.source_rank()}")
        ai.check(y, vals(3, dt, prv), "irecv from any source")
        z = np.zeros(3, dt)
        sw = dist.isend(y, dst=self.ranks[nxt], group=self.group)
        dist.recv(z, src=self.ranks[prv], group=self.group)
        sw.wait()
        with pytest.raises(RuntimeError, match="irecv"):
            sw.source_rank()  # only an irecv has a source

    def test_recv_any_source_returns_sender(self):
        """Group rank 0 receives from everyone with src=None; each sender exactly once."""
        if self.lonely():
            return
        kind_dt = np.dtype(np.float32)
        if self.rank == 0:
            seen = []
            for _ in range(self.size - 1):
                y = np.zeros(4, kind_dt)
                sender = dist.recv(y, group=self.group)
                seen.append(sender)
                r = self.ranks.index(sender)
                ai.check(y, vals(4, kind_dt, r), f"message from {sender}")
            ai.expect(sorted(seen) == self.ranks[1:], f"senders {seen}")
        else:
            dist.send(vals(4, kind_dt, self.rank), dst=self.ranks[0], group=self.group)

    def test_tags(self):
        """Messages are matched by tag, whatever order they were sent in."""
        if self.lonely():
            return
        nxt, prv = self.peers()
        dt = np.dtype(np.int16)
        tags = (3, 1, 7)
        sends = [dist.isend(vals(4, dt, self.rank, salt=t), dst=self.ranks[nxt],
                            group=self.group, tag=t) for t in tags]
        for t in sorted(tags, reverse=True):
            y = np.zeros(4, dt)
            sender = dist.recv(y, src=self.ranks[prv], group=self.group, tag=t)
            ai.expect(sender == self.ranks[prv], f"tag {t}: sender {sender}")
            ai.check(y, vals(4, dt, prv, salt=t), f"message with tag {t}")
        for w in sends:
            w.wait()

    def test_batch_isend_irecv_ring(self):
        """A two-way ring shift with P2POp lists (receives posted before sends)."""
        if self.lonely():
            return
        nxt, prv = self.peers()
        for kind in ai.kinds():
            for dt in (np.dtype(np.bool_), np.dtype(np.float64), np.dtype(np.uint8)):
                what = f"batch_isend_irecv {kind} {dt}"
                x = ai.wrap(kind, vals(6, dt, self.rank))
                from_prv, from_nxt = zeros(kind, 6, dt), zeros(kind, 6, dt)
                ops = [
                    dist.P2POp(dist.isend, x, self.ranks[nxt], group=self.group, tag=1),
                    dist.P2POp(dist.isend, x, group=self.group, group_peer=prv, tag=2),
                    dist.P2POp(dist.irecv, from_prv, self.ranks[prv], group=self.group, tag=1),
                    dist.P2POp(dist.irecv, from_nxt, group=self.group, group_peer=nxt, tag=2),
                ]
                works = dist.batch_isend_irecv(ops)
                assert len(works) == len(ops)
                for w in works:
                    w.wait()
                ai.check(from_prv, vals(6, dt, prv), what + " from previous")
                ai.check(from_nxt, vals(6, dt, nxt), what + " from next")

    def test_contiguous_buffers_are_not_copied(self):
        if self.lonely():
            return
        nxt, prv = self.peers()
        pg = ai.process_group(self.group)
        for kind in ("numpy", "tensor"):
            x = ai.wrap(kind, vals(8, np.dtype(np.float64), self.rank))
            y = zeros(kind, 8, np.float64)
            spy = ai.CommSpy(pg.comm)
            pg.comm = spy
            try:
                if self.rank % 2 == 0:
                    dist.send(x, self.ranks[nxt], group=self.group)
                    dist.recv(y, self.ranks[prv], group=self.group)
                else:
                    dist.recv(y, self.ranks[prv], group=self.group)
                    dist.send(x, self.ranks[nxt], group=self.group)
            finally:
                pg.comm = spy._comm
            passed = [a for c in spy.calls for a in ai.arrays_in(c[1])]
            for b in (x, y):
                ai.expect(any(np.shares_memory(ai.raw(b), a) for a in passed),
                          f"send/recv ({kind}): MPI got a copy of a contiguous buffer")
            ai.check(y, vals(8, np.dtype(np.float64), prv), "send/recv zero-copy")


class TestP2PWorld(BaseTestP2P):
    GROUP = "world"


class TestP2PFull(BaseTestP2P):
    GROUP = "full"


class TestP2PEvens(BaseTestP2P):
    GROUP = "evens"


class TestP2PTail(BaseTestP2P):
    GROUP = "tail"


class TestP2PEnds(BaseTestP2P):
    GROUP = "ends"


@pytest.mark.mpi(min_size=2)
def test_send_recv_large_buffer():
    """A 64 MiB+ message (MPI's rendezvous protocol) from rank 0 to rank 1, without copies."""
    me = dist.get_rank()
    count = 8_400_000  # float64: 67.2 MB > 64 MiB
    if me == 0:
        x = np.arange(count, dtype=np.float64)
        dist.send(x, 1)
    elif me == 1:
        y = np.zeros(count, np.float64)
        assert dist.recv(y, 0) == 0
        assert y[0] == 0 and y[-1] == count - 1
        np.testing.assert_array_equal(y, np.arange(count, dtype=np.float64))
