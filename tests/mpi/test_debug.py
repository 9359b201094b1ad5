"""Debug mode (``set_debug(True)`` / ``MPITENSOR_DEBUG=1``): ranks that disagree on a collective's
arguments all raise CollectiveMismatchError, naming each rank's values, instead of hanging or
silently computing garbage; the next matching collective still works.

Disagreements need two members, so a group of one only checks that agreeing calls still work.
Every outcome is recorded with :func:`outcome` rather than ``pytest.raises``, so that a rank
whose check fails still makes the same collective calls as the others.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor.distributed as dist
from mpitensor.errors import CollectiveMismatchError

from . import arrayimpl as ai

R = dist.ReduceOp


def outcome(fn, *args, **kwargs):
    """The exception ``fn`` raised, or None."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the test inspects whatever was raised
        return exc
    return None


class BaseTestDebug(ai.GroupCase):

    @pytest.fixture(autouse=True)
    def _debug_mode(self, _bind_group):
        # every rank, members or not: it is a process-wide switch
        with ai.debug_mode(True):
            assert dist.get_debug()
            yield

    def expect_mismatch(self, exc, *needles):
        """Check ``exc`` is a CollectiveMismatchError listing every rank and the needles."""
        ai.expect(isinstance(exc, CollectiveMismatchError),
                  f"rank {self.me}: expected CollectiveMismatchError, got {exc!r}")
        if not isinstance(exc, CollectiveMismatchError):
            return
        text = str(exc)
        for r in self.ranks:
            ai.expect(f"rank {r}: " in text, f"rank {r} not listed in: {text}")
        for needle in needles:
            ai.expect(needle in text, f"{needle!r} not in: {text}")
        ai.expect("ranks disagree" in text and "same collective calls" in text, text)

    def still_works(self):
        """A matching collective after a mismatch gives the right answer."""
        x = np.full(2, self.rank + 1.0)
        exc = outcome(dist.all_reduce, x, group=self.group)
        ai.expect(exc is None, f"all_reduce after a mismatch raised {exc!r}")
        ai.check(x, np.full(2, self.size * (self.size + 1) / 2), "all_reduce after mismatch")

    def skip_alone(self) -> bool:
        if self.nonmember():
            return True
        if self.size < 2:
            self.still_works()
            return True
        return False

    def test_matching_calls_pass(self):
        if self.nonmember():
            return
        for kind in ai.kinds():
            x = ai.wrap(kind, np.arange(4, dtype=np.float32) + self.rank)
            dist.all_reduce(x, op=R.MAX, group=self.group)
            ai.check(x, np.arange(4, dtype=np.float32) + self.size - 1, "debug all_reduce")
            out = [ai.wrap(kind, np.zeros(3, np.int8)) for j in range(self.size)]
            dist.all_gather(out, ai.wrap(kind, np.full(3, self.rank, np.int8)),
                            group=self.group)
            for j, o in enumerate(out):
                ai.check(o, np.full(3, j, np.int8), "debug all_gather")
            y = ai.wrap(kind, np.zeros(2 * self.size))
            dist.all_to_all_single(y, ai.wrap(kind, np.full(2 * self.size, self.rank * 1.0)),
                                   group=self.group)
            ai.check(y, np.repeat(np.arange(self.size, dtype=np.float64), 2), "debug a2a")
            dist.barrier(group=self.group)
            dist.all_reduce(x, group=self.group, async_op=True).wait()

    def test_mismatched_shapes(self):
        if self.skip_alone():
            return
        x = np.ones(17 + self.rank, np.float32)
        exc = outcome(dist.all_reduce, x, group=self.group)
        self.expect_mismatch(exc, "different shape", "shape=(17,)", "shape=(18,)")
        ai.check(x, np.ones(17 + self.rank, np.float32), "untouched after the mismatch")
        self.still_works()

    def test_same_count_other_dimensions(self):
        """(2, 3) against (3, 2): the element counts agree, the shapes do not."""
        if self.skip_alone():
            return
        shape = (2, 3) if self.rank % 2 == 0 else (3, 2)
        exc = outcome(dist.all_reduce, np.ones(shape), group=self.group)
        self.expect_mismatch(exc, "different shape", "shape=(2, 3)", "shape=(3, 2)")
        exc = outcome(dist.all_gather_into_tensor, np.zeros((self.size, *shape)),
                      np.ones(shape), group=self.group)
        self.expect_mismatch(exc, "different shape")
        self.still_works()

    def test_mismatched_dtypes(self):
        if self.skip_alone():
            return
        dt = np.float32 if self.rank % 2 == 0 else np.float64
        exc = outcome(dist.broadcast, np.zeros(3, dt), src=self.ranks[0], group=self.group)
        self.expect_mismatch(exc, "different dtype", "dtype=float32", "dtype=float64")
        self.still_works()

    def test_mismatched_ops(self):
        if self.skip_alone():
            return
        op = R.SUM if self.rank == 0 else R.MAX
        exc = outcome(dist.all_reduce, np.ones(2), op=op, group=self.group)
        self.expect_mismatch(exc, "different reduce", "reduce=<ReduceOp.SUM>",
                             "reduce=<ReduceOp.MAX>")
        exc = outcome(dist.reduce_scatter_tensor, np.ones(1), np.ones(self.size), op=op,
                      group=self.group)
        self.expect_mismatch(exc, "different reduce")
        self.still_works()

    def test_mismatched_roots(self):
        if self.skip_alone():
            return
        mine = self.ranks[self.rank]  # every rank names itself as the source
        exc = outcome(dist.broadcast, np.zeros(2), src=mine, group=self.group)
        self.expect_mismatch(exc, "different root", f"root={self.ranks[0]}",
                             f"root={self.ranks[1]}")
        exc = outcome(dist.reduce, np.zeros(2), group_dst=self.rank, group=self.group)
        self.expect_mismatch(exc, "different root")
        self.still_works()

    def test_object_collectives_are_checked(self):
        """Debug mode covers the object collectives too: roots and operations are compared,
        and a bad list on one rank raises on every rank instead of leaving them waiting."""
        if self.skip_alone():
            return
        mine = self.ranks[self.rank]
        exc = outcome(dist.broadcast_object_list, [self.rank], src=mine, group=self.group)
        self.expect_mismatch(exc, "different root")
        exc = outcome(dist.gather_object, self.rank, [None] * self.size,
                      dst=mine, group=self.group)
        self.expect_mismatch(exc, "different root")
        # a wrong-length list on the destination only: its own ValueError there, a mismatch
        # naming the argument error everywhere else
        bad = [None] * (self.size + (1 if self.rank == 0 else 0))
        exc = outcome(dist.gather_object, self.rank, bad, group_dst=0, group=self.group)
        if self.rank == 0:
            ai.expect(isinstance(exc, ValueError) and "object_gather_list" in str(exc),
                      f"rank 0: {exc!r}")
        else:
            self.expect_mismatch(exc, "argument errors")
        if self.rank % 2 == 0:
            exc = outcome(dist.all_gather_object, [None] * self.size, self.rank,
                          group=self.group)
        else:
            exc = outcome(dist.broadcast_object_list, [None], group_src=0, group=self.group)
        self.expect_mismatch(exc, "different op")
        got = [None] * self.size
        exc = outcome(dist.all_gather_object, got, self.rank * 10, group=self.group)
        ai.expect(exc is None and got == [10 * r for r in range(self.size)],
                  f"matching all_gather_object after mismatches: {exc!r} {got}")
        self.still_works()

    def test_different_collectives(self):
        if self.skip_alone():
            return
        x = np.ones(4)
        if self.rank == 0:
            exc = outcome(dist.all_reduce, x, group=self.group)
        else:
            exc = outcome(dist.broadcast, x, src=self.ranks[0], group=self.group)
        self.expect_mismatch(exc, "different op", "op=all_reduce", "op=broadcast")
        self.still_works()

    def test_mismatched_list_sizes(self):
        """All-gather where the last rank contributes (and expects) 3 elements, the others 2:
        each rank's arguments agree locally, so only the exchanged signatures show it."""
        if self.skip_alone():
            return
        last = self.size - 1
        n = 3 if self.rank == last else 2
        out = [np.zeros(n, np.int32) for _ in range(self.size)]
        exc = outcome(dist.all_gather, out, np.zeros(n, np.int32), group=self.group)
        self.expect_mismatch(exc, f"rank {self.ranks[0]} sends 2 elements to rank "
                                  f"{self.ranks[last]}, which expects 3")
        self.still_works()

    def test_all_to_all_single_splits_given_on_some_ranks(self):
        """No split sizes on rank 0 (MPI_Alltoall there), equal ones given elsewhere
        (MPI_Alltoallv): the counts agree, but the calls would not match."""
        if self.skip_alone():
            return
        n = self.size
        x = np.arange(2.0 * n) + 10 * self.rank
        out = np.zeros(2 * n)
        kw = {} if self.rank == 0 else {"input_split_sizes": [2] * n,
                                        "output_split_sizes": [2] * n}
        exc = outcome(dist.all_to_all_single, out, x, group=self.group, **kw)
        self.expect_mismatch(exc, "different splits", "splits=none", "splits=given")
        self.still_works()
        dist.all_to_all_single(out, x, group=self.group)   # alike on every rank: works
        want = np.concatenate([10 * j + np.arange(2.0 * self.rank, 2.0 * self.rank + 2)
                               for j in range(n)])
        np.testing.assert_array_equal(out, want)

    def test_local_error_on_one_rank(self):
        """The erroring rank raises its own ValueError; the others a mismatch naming it."""
        if self.skip_alone():
            return
        root = self.size - 1
        out = np.zeros(2)
        if self.rank == root:
            lst = [np.zeros(2) for _ in range(self.size + 1)]  # one too many
        else:
            lst = None
        exc = outcome(dist.scatter, out, lst, src=self.ranks[root], group=self.group)
        if self.rank == root:
            ai.expect(type(exc) is ValueError and "scatter_list has" in str(exc),
                      f"the source should raise its ValueError, got {exc!r}")
        else:
            self.expect_mismatch(exc, "argument errors",
                                 f"rank {self.ranks[root]}: op=scatter",
                                 "error=ValueError", "scatter_list has")
        self.still_works()

    def test_local_type_error_on_one_rank(self):
        if self.skip_alone():
            return
        dt = np.float64 if self.rank == 0 else np.float32
        out = np.zeros(2 * self.size, dt)
        exc = outcome(dist.all_gather_into_tensor, out, np.zeros(2, np.float32),
                      group=self.group)
        if self.rank == 0:
            ai.expect(isinstance(exc, TypeError) and "dtype mismatch" in str(exc), repr(exc))
        else:
            self.expect_mismatch(exc, f"rank {self.ranks[0]}: ", "error=DtypeMismatchError")
        self.still_works()


class TestDebugWorld(BaseTestDebug):
    GROUP = "world"


class TestDebugEvens(BaseTestDebug):
    GROUP = "evens"


class TestDebugTail(BaseTestDebug):
    GROUP = "tail"
