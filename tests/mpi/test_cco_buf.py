"""Collectives on buffers (NumPy arrays, Tensors, CuPy arrays) over a matrix of communicators.

As in mpi4py's ``test_cco_buf.py``: one base class, :class:`BaseTestCCO`, bound by subclasses to
the world, a full copy of it, and sub-groups (non-members only check that they are outside); every
test loops over the array kinds and a set of dtypes, and asserts the values on every rank,
computed from the group rank and size.
"""

from __future__ import annotations

import datetime
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor.distributed as dist

from . import arrayimpl as ai

R = dist.ReduceOp

#: the ops tested on the collectives other than all_reduce (which runs all of them)
SOME_OPS = (R.SUM, R.PRODUCT, R.MAX, R.MIN, R.AVG, R.BOR, R.BXOR)
SHAPES = ((), (0,), (5,), (3, 4), (2, 3, 2))


def vals(shape, dt, r, salt=0, op=None):
    """Per-rank values; factors in {-1, 1, 2} for PRODUCT so products stay exact."""
    return ai.values(shape, dt, r, salt, "product" if op is R.PRODUCT else "sum")


def zeros(kind, shape, dt):
    return ai.wrap(kind, np.zeros(shape, dtype=dt))


class BaseTestCCO(ai.GroupCase):
    """Every collective, bound by subclasses to one communicator (``GROUP``)."""

    # ------------------------------------------------------------------ all_reduce
    @pytest.mark.parametrize("op", ai.OPS, ids=ai.OP_IDS)
    def test_all_reduce(self, op):
        if self.nonmember():
            return
        for kind in ai.kinds():
            for dt in ai.ALL_DTYPES:
                what = f"all_reduce {kind} {dt} {op} on {self.ranks}"
                mine = vals(5, dt, self.rank, op=op)
                x = ai.wrap(kind, mine.copy())
                if not ai.valid(dt, op):
                    with pytest.raises(ValueError, match=ai.invalid_match(dt, op)):
                        dist.all_reduce(x, op=op, group=self.group)
                    ai.check(x, mine, what + " (left unchanged)")
                    continue
                assert dist.all_reduce(x, op=op, group=self.group) is None
                want = ai.reduced([vals(5, dt, r, op=op) for r in range(self.size)], op)
                ai.check(x, want, what, op)

    def test_all_reduce_legacy_reduce_op(self):
        if self.nonmember():
            return
        assert dist.reduce_op.SUM is R.SUM
        for legacy in (dist.reduce_op.SUM, dist.reduce_op.PRODUCT, dist.reduce_op.MAX,
                       dist.reduce_op.MIN):
            for dt in (np.dtype(np.int32), np.dtype(np.float64)):
                x = vals(4, dt, self.rank, op=legacy)
                dist.all_reduce(x, op=legacy, group=self.group)
                want = ai.reduced([vals(4, dt, r, op=legacy) for r in range(self.size)], legacy)
                ai.check(x, want, f"all_reduce reduce_op.{legacy.name} {dt}")

    @pytest.mark.parametrize("mode", ("wait", "poll"))
    def test_all_reduce_async(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            for dt, op in (("bool", R.SUM), ("bool", R.PRODUCT), ("int32", R.SUM),
                           ("uint8", R.BXOR), ("float16", R.SUM), ("float32", R.AVG),
                           ("float32", R.MAX), ("complex128", R.AVG)):
                dt = np.dtype(dt)
                x = ai.wrap(kind, vals((2, 3), dt, self.rank, op=op))
                work = ai.call(mode, dist.all_reduce, x, op=op, group=self.group)
                want = ai.reduced([vals((2, 3), dt, r, op=op) for r in range(self.size)], op)
                ai.check(x, want, f"all_reduce async {kind} {dt} {op}", op)
                assert work.result()[0] is x

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_all_reduce_layouts(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            combos = (("float16", R.AVG), ("bool", R.SUM), ("float32", R.SUM), ("int64", R.MIN))
            for dt, op in combos if mode == "sync" else combos[:2]:
                dt = np.dtype(dt)
                for shape in SHAPES:
                    for layout in ai.layouts(shape):
                        what = f"all_reduce {kind} {dt} {op} {shape} {layout}"
                        buf = ai.Laid(kind, vals(shape, dt, self.rank), layout)
                        ai.call(mode, dist.all_reduce, buf.x, op=op, group=self.group)
                        want = ai.reduced([vals(shape, dt, r) for r in range(self.size)], op)
                        ai.check(buf.x, want, what, op)
                        buf.check_gaps(what)

    # ------------------------------------------------------------------ broadcast
    @pytest.mark.parametrize("mode", ai.MODES)
    def test_broadcast(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            for dt in ai.dtypes_for(mode):
                for root in range(self.size):
                    for by_group_rank in (False, True):
                        what = f"broadcast {kind} {dt} root {self.ranks[root]}"
                        if self.rank == root:
                            x = ai.wrap(kind, vals(6, dt, root))
                        else:
                            x = zeros(kind, 6, dt)
                        kw = {"group_src": root} if by_group_rank else {"src": self.ranks[root]}
                        work = ai.call(mode, dist.broadcast, x, group=self.group, **kw)
                        ai.check(x, vals(6, dt, root), what)
                        if work is not None:
                            assert work.result() == [x]

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_broadcast_layouts(self, mode):
        if self.nonmember():
            return
        root = self.size - 1
        for kind in ai.kinds():
            for dt in (np.dtype(np.float64), np.dtype(np.int16), np.dtype(np.bool_)):
                for shape in SHAPES:
                    for layout in ai.layouts(shape):
                        what = f"broadcast {kind} {dt} {shape} {layout}"
                        src_vals = vals(shape, dt, root, salt=1)
                        init = src_vals if self.rank == root else vals(shape, dt, self.rank)
                        buf = ai.Laid(kind, init, layout)
                        ai.call(mode, dist.broadcast, buf.x, src=self.ranks[root],
                                group=self.group)
                        ai.check(buf.x, src_vals, what)
                        buf.check_gaps(what)

    # ------------------------------------------------------------------ reduce
    @pytest.mark.parametrize("mode", ai.MODES)
    def test_reduce(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            for dt in ai.dtypes_for(mode) + (np.dtype("float32"),):
                for op in SOME_OPS:
                    if not ai.valid(dt, op):
                        continue
                    for root in range(self.size):
                        what = f"reduce {kind} {dt} {op} dst {self.ranks[root]}"
                        mine = vals(4, dt, self.rank, op=op)
                        x = ai.wrap(kind, mine.copy())
                        kw = {"group_dst": root} if root % 2 else {"dst": self.ranks[root]}
                        work = ai.call(mode, dist.reduce, x, op=op, group=self.group, **kw)
                        if self.rank == root:
                            want = ai.reduced([vals(4, dt, r, op=op) for r in range(self.size)],
                                              op)
                            ai.check(x, want, what, op)
                        else:
                            ai.check(x, mine, what + " (non-destination unchanged)")
                        if work is not None:
                            assert work.result() == [x]

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_reduce_default_dst_and_layouts(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            for dt in (np.dtype(np.float16), np.dtype(np.int32)):
                for shape in SHAPES:
                    for layout in ai.layouts(shape):
                        what = f"reduce {kind} {dt} {shape} {layout}"
                        mine = vals(shape, dt, self.rank)
                        buf = ai.Laid(kind, mine, layout)
                        ai.call(mode, dist.reduce, buf.x, group=self.group)  # dst: rank 0
                        if self.rank == 0:
                            want = ai.reduced([vals(shape, dt, r) for r in range(self.size)],
                                              R.SUM)
                            ai.check(buf.x, want, what)
                        else:
                            ai.check(buf.x, mine, what)
                        buf.check_gaps(what)

    # ------------------------------------------------------------------ scatter / gather
    @pytest.mark.parametrize("mode", ai.MODES)
    def test_scatter(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            for dt in ai.dtypes_for(mode):
                for root in range(self.size):
                    what = f"scatter {kind} {dt} src {self.ranks[root]}"
                    out = zeros(kind, (2, 3), dt)
                    if self.rank == root:
                        lst = [ai.wrap(kind, vals((2, 3), dt, j, salt=root))
                               for j in range(self.size)]
                    else:
                        lst = None if root % 2 else []
                    kw = {"group_src": root} if root % 2 else {"src": self.ranks[root]}
                    work = ai.call(mode, dist.scatter, out, lst, group=self.group, **kw)
                    ai.check(out, vals((2, 3), dt, self.rank, salt=root), what)
                    if self.rank == root:
                        for j, t in enumerate(lst):
                            ai.check(t, vals((2, 3), dt, j, salt=root), what + " (input kept)")
                    if work is not None:
                        assert work.result() == [out]

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_scatter_layouts(self, mode):
        if self.nonmember():
            return
        root = self.size - 1
        for kind in ai.kinds():
            for dt in (np.dtype(np.complex128), np.dtype(np.uint8)):
                for shape in SHAPES:
                    for layout in ai.layouts(shape):
                        what = f"scatter {kind} {dt} {shape} {layout}"
                        out = ai.Laid(kind, np.zeros(shape, dt), layout)
                        ins = [ai.Laid(kind, vals(shape, dt, j, salt=2), layout)
                               for j in range(self.size)] if self.rank == root else None
                        ai.call(mode, dist.scatter, out.x, [b.x for b in ins] if ins else None,
                                src=self.ranks[root], group=self.group)
                        ai.check(out.x, vals(shape, dt, self.rank, salt=2), what)
                        out.check_gaps(what)

    def test_scatter_default_src(self):
        if self.nonmember():
            return
        out = np.zeros(3, np.int64)
        lst = [vals(3, np.int64, j) for j in range(self.size)] if self.rank == 0 else None
        dist.scatter(out, lst, group=self.group)  # default: group rank 0
        ai.check(out, vals(3, np.dtype(np.int64), self.rank), "scatter default src")

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_gather(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            for dt in ai.dtypes_for(mode):
                for root in range(self.size):
                    what = f"gather {kind} {dt} dst {self.ranks[root]}"
                    x = ai.wrap(kind, vals((3, 2), dt, self.rank, salt=root))
                    if self.rank == root:
                        lst = [zeros(kind, (3, 2), dt) for _ in range(self.size)]
                    else:
                        lst = None if root % 2 else []
                    kw = {"group_dst": root} if root % 2 else {"dst": self.ranks[root]}
                    work = ai.call(mode, dist.gather, x, lst, group=self.group, **kw)
                    if self.rank == root:
                        for j, t in enumerate(lst):
                            ai.check(t, vals((3, 2), dt, j, salt=root), f"{what} [{j}]")
                        if work is not None:
                            assert work.result() == lst
                    ai.check(x, vals((3, 2), dt, self.rank, salt=root), what + " (input kept)")

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_gather_layouts(self, mode):
        if self.nonmember():
            return
        root = self.size - 1
        for kind in ai.kinds():
            for dt in (np.dtype(np.float32), np.dtype(np.int8)):
                for shape in SHAPES:
                    for layout in ai.layouts(shape):
                        what = f"gather {kind} {dt} {shape} {layout}"
                        x = ai.Laid(kind, vals(shape, dt, self.rank, salt=3), layout)
                        outs = [ai.Laid(kind, np.zeros(shape, dt), layout)
                                for _ in range(self.size)] if self.rank == root else None
                        ai.call(mode, dist.gather, x.x, [b.x for b in outs] if outs else None,
                                dst=self.ranks[root], group=self.group)
                        for j, b in enumerate(outs or []):
                            ai.check(b.x, vals(shape, dt, j, salt=3), f"{what} [{j}]")
                            b.check_gaps(what)

    # ------------------------------------------------------------------ all_gather
    @pytest.mark.parametrize("mode", ai.MODES)
    def test_all_gather(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            for dt in ai.dtypes_for(mode):
                what = f"all_gather {kind} {dt}"
                x = ai.wrap(kind, vals((2, 2), dt, self.rank))
                lst = [zeros(kind, (2, 2), dt) for _ in range(self.size)]
                work = ai.call(mode, dist.all_gather, lst, x, group=self.group)
                for j, t in enumerate(lst):
                    ai.check(t, vals((2, 2), dt, j), f"{what} [{j}]")
                if work is not None:
                    assert work.result() == lst

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_all_gather_wrong_slots_and_layouts(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            for dt in (np.dtype(np.float64), np.dtype(np.bool_)):
                # slots of another size than the input: refused on every rank before any
                # traffic (a smaller slot was partly filled, a larger one overrun), and the
                # group stays usable because every rank refused the same call
                x = ai.wrap(kind, vals(self.rank + 1, dt, self.rank))
                lst = [zeros(kind, j + 1, dt) for j in range(self.size)]
                if self.size > 1:
                    with pytest.raises(ValueError, match=r"tensor_list\[\d\] is .* but tensor is"):
                        dist.all_gather(lst, x, group=self.group)
                    for t in lst:
                        ai.check(t, np.zeros(t.shape, dt), "untouched after the refusal")
                for shape in SHAPES:
                    for layout in ai.layouts(shape):
                        what = f"all_gather {kind} {dt} {shape} {layout}"
                        x = ai.Laid(kind, vals(shape, dt, self.rank, salt=4), layout)
                        outs = [ai.Laid(kind, np.zeros(shape, dt), layout)
                                for _ in range(self.size)]
                        ai.call(mode, dist.all_gather, [b.x for b in outs], x.x, group=self.group)
                        for j, b in enumerate(outs):
                            ai.check(b.x, vals(shape, dt, j, salt=4), f"{what} [{j}]")
                            b.check_gaps(what)

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_all_gather_into_tensor(self, mode):
        if self.nonmember():
            return
        n = self.size
        for kind in ai.kinds():
            for dt in ai.dtypes_for(mode):
                parts = [vals((3, 2), dt, j) for j in range(n)]
                for out_shape, want in (((n * 3, 2), np.concatenate(parts)),
                                        ((n, 3, 2), np.stack(parts)),
                                        ((n * 6,), np.concatenate(parts).reshape(-1))):
                    what = f"all_gather_into_tensor {kind} {dt} -> {out_shape}"
                    x = ai.wrap(kind, vals((3, 2), dt, self.rank))
                    out = zeros(kind, out_shape, dt)
                    work = ai.call(mode, dist.all_gather_into_tensor, out, x, group=self.group)
                    ai.check(out, want, what)
                    if work is not None:
                        assert work.result() == [out]

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_all_gather_into_tensor_layouts(self, mode):
        if self.nonmember():
            return
        n = self.size
        for kind in ai.kinds():
            dt = np.dtype(np.int16)
            for in_layout in ("contig", "strided"):
                for out_layout in ai.layouts((2 * n, 2)):
                    what = f"all_gather_into_tensor {kind} in {in_layout} out {out_layout}"
                    x = ai.Laid(kind, vals((2, 2), dt, self.rank), in_layout)
                    out = ai.Laid(kind, np.zeros((2 * n, 2), dt), out_layout)
                    ai.call(mode, dist.all_gather_into_tensor, out.x, x.x, group=self.group)
                    ai.check(out.x, np.concatenate([vals((2, 2), dt, j) for j in range(n)]),
                             what)
                    out.check_gaps(what)

    # ------------------------------------------------------------------ reduce_scatter
    @pytest.mark.parametrize("mode", ai.MODES)
    def test_reduce_scatter(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            for dt in ai.dtypes_for(mode) + (np.dtype("int64"),):
                for op in SOME_OPS:
                    if not ai.valid(dt, op):
                        continue
                    what = f"reduce_scatter {kind} {dt} {op}"
                    ins = [ai.wrap(kind, vals(4, dt, self.rank, salt=j, op=op))
                           for j in range(self.size)]
                    out = zeros(kind, 4, dt)
                    work = ai.call(mode, dist.reduce_scatter, out, ins, op=op, group=self.group)
                    want = ai.reduced([vals(4, dt, q, salt=self.rank, op=op)
                                       for q in range(self.size)], op)
                    ai.check(out, want, what, op)
                    if work is not None:
                        assert work.result() == [out]

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_reduce_scatter_layouts(self, mode):
        if self.nonmember():
            return
        for kind in ai.kinds():
            dt = np.dtype(np.float32)
            for shape in SHAPES:
                for layout in ai.layouts(shape):
                    what = f"reduce_scatter {kind} {shape} {layout}"
                    ins = [ai.Laid(kind, vals(shape, dt, self.rank, salt=j), layout)
                           for j in range(self.size)]
                    out = ai.Laid(kind, np.zeros(shape, dt), layout)
                    ai.call(mode, dist.reduce_scatter, out.x, [b.x for b in ins], group=self.group)
                    want = ai.reduced([vals(shape, dt, q, salt=self.rank)
                                       for q in range(self.size)], R.SUM)
                    ai.check(out.x, want, what)
                    out.check_gaps(what)

    def test_reduce_scatter_wrong_entries(self):
        """input_list[j] of another shape than output: ValueError on every rank, no traffic."""
        if self.nonmember() or self.size < 2:
            return
        for kind in ai.kinds():
            ins = [ai.wrap(kind, vals(j + 1, np.dtype("int32"), self.rank, salt=j))
                   for j in range(self.size)]
            out = zeros(kind, self.rank + 1, np.dtype("int32"))
            with pytest.raises(ValueError, match=r"input_list\[\d\] is int32\[\d\] but output is"):
                dist.reduce_scatter(out, ins, group=self.group)
            ai.check(out, np.zeros(self.rank + 1, np.int32), "untouched after the refusal")

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_reduce_scatter_tensor(self, mode):
        if self.nonmember():
            return
        n = self.size
        for kind in ai.kinds():
            for dt in ai.dtypes_for(mode) + (np.dtype("uint8"),):
                for op in SOME_OPS:
                    if not ai.valid(dt, op):
                        continue
                    for stacked in (False, True):
                        what = f"reduce_scatter_tensor {kind} {dt} {op} stacked={stacked}"
                        blocks = [vals((2, 3), dt, self.rank, salt=j, op=op) for j in range(n)]
                        inp = np.stack(blocks) if stacked else np.concatenate(blocks)
                        x = ai.wrap(kind, inp)
                        out = zeros(kind, (2, 3), dt)
                        work = ai.call(mode, dist.reduce_scatter_tensor, out, x, op=op,
                                       group=self.group)
                        want = ai.reduced([vals((2, 3), dt, q, salt=self.rank, op=op)
                                           for q in range(n)], op)
                        ai.check(out, want, what, op)
                        ai.check(x, inp, what + " (input kept)")
                        if work is not None:
                            assert work.result() == [out]

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_reduce_scatter_tensor_layouts(self, mode):
        if self.nonmember():
            return
        n = self.size
        for kind in ai.kinds():
            dt = np.dtype(np.int64)
            for in_layout in ai.layouts((2 * n, 3)):
                for out_layout in ai.layouts((2, 3)):
                    what = f"reduce_scatter_tensor {kind} in {in_layout} out {out_layout}"
                    inp = np.concatenate([vals((2, 3), dt, self.rank, salt=j) for j in range(n)])
                    x = ai.Laid(kind, inp, in_layout)
                    out = ai.Laid(kind, np.zeros((2, 3), dt), out_layout)
                    ai.call(mode, dist.reduce_scatter_tensor, out.x, x.x, op=R.MAX,
                            group=self.group)
                    want = ai.reduced([vals((2, 3), dt, q, salt=self.rank) for q in range(n)],
                                      R.MAX)
                    ai.check(out.x, want, what)
                    out.check_gaps(what)

    # ------------------------------------------------------------------ all_to_all
    @pytest.mark.parametrize("mode", ai.MODES)
    def test_all_to_all(self, mode):
        if self.nonmember():
            return
        me, n = self.rank, self.size
        for kind in ai.kinds():
            for dt in ai.dtypes_for(mode):
                for even in (True, False):
                    what = f"all_to_all {kind} {dt} even={even}"

                    def count(a, b, even=even):
                        return 3 if even else a + b + 1  # a sends count(a, b) elements to b

                    ins = [ai.wrap(kind, vals(count(me, j), dt, me, salt=j)) for j in range(n)]
                    outs = [zeros(kind, count(j, me), dt) for j in range(n)]
                    work = ai.call(mode, dist.all_to_all, outs, ins, group=self.group)
                    for j, t in enumerate(outs):
                        ai.check(t, vals(count(j, me), dt, j, salt=me), f"{what} from {j}")
                    if work is not None:
                        assert work.result() == outs

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_all_to_all_layouts(self, mode):
        if self.nonmember():
            return
        me, n = self.rank, self.size
        for kind in ai.kinds():
            dt = np.dtype(np.complex64)
            for layout in ai.layouts((3, 2)):
                what = f"all_to_all {kind} {layout}"
                ins = [ai.Laid(kind, vals((3, 2), dt, me, salt=j), layout) for j in range(n)]
                outs = [ai.Laid(kind, np.zeros((3, 2), dt), layout) for _ in range(n)]
                ai.call(mode, dist.all_to_all, [b.x for b in outs], [b.x for b in ins],
                        group=self.group)
                for j, b in enumerate(outs):
                    ai.check(b.x, vals((3, 2), dt, j, salt=me), f"{what} from {j}")
                    b.check_gaps(what)

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_all_to_all_single(self, mode):
        if self.nonmember():
            return
        me, n = self.rank, self.size
        for kind in ai.kinds():
            for dt in ai.dtypes_for(mode):
                # no split sizes (MPI_Alltoall), equal ones given, uneven ones (Alltoallv)
                for splits in ("none", "equal", "uneven"):
                    what = f"all_to_all_single {kind} {dt} splits={splits}"

                    def rows(a, b, even=splits != "uneven"):
                        return 2 if even else (a + b) % 3  # rows a sends to b (0 included)

                    inp = np.concatenate([vals((rows(me, j), 3), dt, me, salt=j)
                                          for j in range(n)])
                    want = np.concatenate([vals((rows(j, me), 3), dt, j, salt=me)
                                           for j in range(n)])
                    x = ai.wrap(kind, inp)
                    out = zeros(kind, want.shape, dt)
                    kw = {} if splits == "none" else {
                        "input_split_sizes": [rows(me, j) for j in range(n)],
                        "output_split_sizes": [rows(j, me) for j in range(n)]}
                    work = ai.call(mode, dist.all_to_all_single, out, x, group=self.group, **kw)
                    ai.check(out, want, what)
                    if work is not None:
                        assert work.result() == [out]

    @pytest.mark.parametrize("mode", ai.MODES)
    def test_all_to_all_single_layouts(self, mode):
        if self.nonmember():
            return
        me, n = self.rank, self.size
        for kind in ai.kinds():
            dt = np.dtype(np.float64)
            for layout in ("contig", "strided"):
                what = f"all_to_all_single {kind} {layout}"
                inp = np.concatenate([vals((2, 3), dt, me, salt=j) for j in range(n)])
                want = np.concatenate([vals((2, 3), dt, j, salt=me) for j in range(n)])
                x = ai.Laid(kind, inp, layout)
                out = ai.Laid(kind, np.zeros_like(want), layout)
                ai.call(mode, dist.all_to_all_single, out.x, x.x, group=self.group)
                ai.check(out.x, want, what)
                out.check_gaps(what)

    # ------------------------------------------------------------------ in-place idioms
    @pytest.mark.parametrize("mode", ai.MODES)
    def test_in_place_chunks(self, mode):
        """torch's in-place idioms: the input is this rank's chunk of the output (all-gather),
        the output this rank's chunk of the input (reduce-scatter), or both are one tensor."""
        if self.nonmember():
            return
        n, me = self.size, self.rank

        def chunk(kind, base, i):
            v = ai.raw(base)[2 * i:2 * i + 2]
            return ai.as_tensor(v) if kind == "tensor" else v

        for kind in ai.kinds():
            for dt, op in (("float32", R.SUM), ("bool", R.SUM), ("float16", R.AVG),
                           ("int64", R.MAX)):
                dt = np.dtype(dt)
                what = f"in place {kind} {dt} {op}"
                out = zeros(kind, (2 * n, 3), dt)
                mine = chunk(kind, out, me)
                ai.raw(mine)[...] = ai.device_array(kind, vals((2, 3), dt, me))
                ai.call(mode, dist.all_gather_into_tensor, out, mine, group=self.group)
                ai.check(out, np.concatenate([vals((2, 3), dt, j) for j in range(n)]),
                         what + " all_gather_into_tensor")

                inp = ai.wrap(kind, np.concatenate([vals((2, 3), dt, me, salt=j, op=op)
                                                    for j in range(n)]))
                ai.call(mode, dist.reduce_scatter_tensor, chunk(kind, inp, me), inp, op=op,
                        group=self.group)
                want = ai.reduced([vals((2, 3), dt, q, salt=me, op=op) for q in range(n)], op)
                ai.check(chunk(kind, inp, me), want, what + " reduce_scatter_tensor", op)

                x = ai.wrap(kind, np.concatenate([vals((2, 3), dt, me, salt=j)
                                                  for j in range(n)]))
                ai.call(mode, dist.all_to_all_single, x, x, group=self.group)
                ai.check(x, np.concatenate([vals((2, 3), dt, j, salt=me) for j in range(n)]),
                         what + " all_to_all_single")

                # list forms: this rank's tensor is its own entry of the list
                lst = [ai.wrap(kind, vals(3, dt, me, salt=j, op=op)) for j in range(n)]
                ai.call(mode, dist.reduce_scatter, lst[me], lst, op=op, group=self.group)
                want = ai.reduced([vals(3, dt, q, salt=me, op=op) for q in range(n)], op)
                ai.check(lst[me], want, what + " reduce_scatter", op)
                lst = [ai.wrap(kind, vals(3, dt, me, salt=j)) for j in range(n)]
                ai.call(mode, dist.all_to_all, lst, lst, group=self.group)
                for j in range(n):
                    ai.check(lst[j], vals(3, dt, j, salt=me), what + " all_to_all")
                lst = [ai.wrap(kind, vals(3, dt, j, salt=7)) for j in range(n)]
                ai.call(mode, dist.scatter, lst[me], lst if me == 0 else None, group=self.group)
                ai.check(lst[me], vals(3, dt, me, salt=7), what + " scatter")
                lst = [zeros(kind, 3, dt) for j in range(n)]
                ai.raw(lst[me])[...] = ai.device_array(kind, vals(3, dt, me, salt=8))
                ai.call(mode, dist.all_gather, lst, lst[me], group=self.group)
                for j in range(n):
                    ai.check(lst[j], vals(3, dt, j, salt=8), what + " all_gather")

    # ------------------------------------------------------------------ several in flight
    def test_many_outstanding_works(self):
        """Several async collectives in flight at once, completed in reverse order."""
        if self.nonmember():
            return
        n, me = self.size, self.rank
        for kind in ai.kinds():
            f16 = np.dtype(np.float16)
            a = ai.wrap(kind, vals(5, f16, me))  # upcast + narrow on completion
            b = ai.Laid(kind, vals((4, 3), np.dtype(np.int32), me), "strided")  # staged
            c = ai.wrap(kind, vals(3, np.dtype(np.bool_), me))  # viewed as uint8
            d = zeros(kind, (n, 2), np.float64)
            e = zeros(kind, 2, np.complex64)
            works = [
                dist.all_reduce(a, op=R.AVG, group=self.group, async_op=True),
                dist.all_reduce(b.x, op=R.MAX, group=self.group, async_op=True),
                dist.all_reduce(c, op=R.PRODUCT, group=self.group, async_op=True),
                dist.all_gather_into_tensor(d, ai.wrap(kind, np.full(2, me * 1.0)),
                                            group=self.group, async_op=True),
                dist.broadcast(e, src=self.ranks[-1], group=self.group, async_op=True)
                if me != n - 1 else
                dist.broadcast(ai.wrap(kind, np.full(2, 3 + 4j, np.complex64)),
                               src=self.ranks[-1], group=self.group, async_op=True),
                dist.barrier(group=self.group, async_op=True),
            ]
            if me == n - 1:
                e = works[4].result()[0]
            for i, w in enumerate(reversed(works)):
                # wait(), wait(seconds) and wait(timedelta) all complete the work
                assert w.wait(*[(), (60.0,), (datetime.timedelta(minutes=1),)][i % 3]) is True
            ai.check(a, ai.reduced([vals(5, f16, r) for r in range(n)], R.AVG), "a", R.AVG)
            ai.check(b.x, ai.reduced([vals((4, 3), np.dtype(np.int32), r) for r in range(n)],
                                     R.MAX), "b")
            b.check_gaps("b")
            ai.check(c, ai.reduced([vals(3, np.dtype(np.bool_), r) for r in range(n)],
                                   R.PRODUCT), "c")
            ai.check(d, np.repeat(np.arange(n, dtype=np.float64), 2).reshape(n, 2), "d")
            ai.check(e, np.full(2, 3 + 4j, np.complex64), "e")

    # ------------------------------------------------------------------ barrier
    @pytest.mark.parametrize("mode", ai.MODES)
    def test_barrier(self, mode):
        if self.nonmember():
            return
        if self.rank == self.size - 1:
            time.sleep(0.05)  # the last rank comes late
        arrived = time.time()  # one clock for every rank of the host
        ai.call(mode, dist.barrier, group=self.group)
        left = time.time()
        times = [None] * self.size
        dist.all_gather_object(times, (arrived, left), group=self.group)
        # nobody leaves before the last rank arrives (measured against the arrivals, not
        # against a delay: on an oversubscribed machine a rank may itself come 50 ms late)
        assert min(t[1] for t in times) >= max(t[0] for t in times), times

    # ------------------------------------------------------------------ no copies, no pickle
    def test_contiguous_buffers_are_not_copied(self):
        """MPI is handed the caller's own memory for contiguous inputs and outputs."""
        if self.nonmember():
            return
        pg = ai.process_group(self.group)
        n, me = self.size, self.rank
        for kind in ("numpy", "tensor"):
            f32 = np.dtype(np.float32)
            x = ai.wrap(kind, vals(8, f32, me))
            x16 = ai.wrap(kind, vals(8, np.dtype(np.int16), me))
            inp = ai.wrap(kind, vals(n * 4, f32, me))
            out4, out_n = zeros(kind, 4, f32), zeros(kind, n * 4, f32)
            g = self.group
            lst4 = [zeros(kind, 4, f32) for _ in range(n)] if me == 0 else None
            cases = [  # (name, function, args, keyword args, the caller's buffers)
                ("all_reduce SUM", dist.all_reduce, (x,), {}, [x]),
                ("all_reduce AVG", dist.all_reduce, (x,), {"op": R.AVG}, [x]),
                ("all_reduce BOR", dist.all_reduce, (x16,), {"op": R.BOR}, [x16]),
                ("all_reduce async", dist.all_reduce, (x,), {"async_op": True}, [x]),
                ("broadcast", dist.broadcast, (x,), {"src": self.ranks[0]}, [x]),
                ("reduce", dist.reduce, (x,), {"dst": self.ranks[-1]}, [x]),
                ("all_gather_into_tensor", dist.all_gather_into_tensor, (out_n, out4), {},
                 [out_n, out4]),
                ("reduce_scatter_tensor", dist.reduce_scatter_tensor, (out4, inp), {},
                 [out4, inp]),
                ("all_to_all_single", dist.all_to_all_single, (out_n, inp), {}, [out_n, inp]),
                ("scatter", dist.scatter, (out4, lst4), {}, [out4]),
                ("gather", dist.gather, (out4, lst4), {}, [out4]),
            ]
            for name, fn, args, kwargs, buffers in cases:
                spy = ai.CommSpy(pg.comm)
                pg.comm, gates, pers_max = spy, (pg.shm_min, pg.shm_ar_min), pg.pers_max
                # MPI's path (shared memory copies by design: shm_coll)
                pg.shm_min = pg.shm_ar_min = 1 << 62
                pg.pers_max = -1  # and no persistent request (copies small calls by design)
                try:
                    work = fn(*args, group=g, **kwargs)
                    if work is not None:
                        work.wait()
                finally:
                    pg.comm, pg.pers_max = spy._comm, pers_max
                    pg.shm_min, pg.shm_ar_min = gates
                mpi_calls = [c for c in spy.calls if c[0][0].isupper()]
                assert mpi_calls, f"{name}: no MPI buffer call recorded ({spy.calls})"
                passed = [a for c in mpi_calls for a in ai.arrays_in(c[1])]
                for b in buffers:
                    assert any(np.shares_memory(ai.raw(b), a) for a in passed), (
                        f"{name} ({kind}): MPI got a copy, not the caller's contiguous buffer")

    def test_tensor_collectives_do_not_pickle(self):
        """Only the *_object functions may use mpi4py's pickle-based methods."""
        if dist.get_debug():  # before the member check: a skip must be a skip on every rank
            pytest.skip("debug mode exchanges pickled signatures on purpose")
        if self.nonmember():
            return
        import pickle

        used = []

        def dumps(obj, protocol=None):
            used.append("dumps")
            return pickle.dumps(obj, protocol)

        def loads(data):
            used.append("loads")
            return pickle.loads(data)

        n, me, g = self.size, self.rank, self.group
        proto, threshold = MPI.pickle.PROTOCOL, MPI.pickle.THRESHOLD
        MPI.pickle.__init__(dumps, loads, proto, threshold)
        try:
            for kind in ("numpy", "tensor"):
                for async_op in (False, True):
                    x = ai.wrap(kind, vals((2, 2), np.dtype(np.float16), me))
                    y4 = zeros(kind, 4, np.float64)
                    yn = zeros(kind, 4 * n, np.float64)
                    lst = [zeros(kind, (2, 2), np.float16) for _ in range(n)]
                    ones = [ai.wrap(kind, np.ones((2, 2), np.float16)) for _ in range(n)]
                    r0 = self.ranks[0]
                    calls = [
                        (dist.all_reduce, (x,), {"op": R.AVG}),
                        (dist.all_reduce, (y4,), {}),
                        (dist.broadcast, (x, r0), {}),
                        (dist.reduce, (x, r0), {}),
                        (dist.all_gather, (lst, x), {}),
                        (dist.all_gather_into_tensor, (yn, y4), {}),
                        (dist.gather, (x, lst if me == 0 else None), {}),
                        (dist.scatter, (x, ones if me == 0 else None), {}),
                        (dist.reduce_scatter, (x, ones), {}),
                        (dist.reduce_scatter_tensor, (y4, yn), {}),
                        (dist.all_to_all, (lst, ones), {}),
                        (dist.all_to_all_single, (yn, ai.wrap(kind, np.ones(4 * n))), {}),
                        (dist.barrier, (), {}),
                    ]
                    for fn, args, kwargs in calls:
                        work = fn(*args, group=g, async_op=async_op, **kwargs)
                        if work is not None:
                            work.wait()
        finally:
            MPI.pickle.__init__()  # mpi4py's defaults
        assert used == [], f"a tensor collective used mpi4py's pickle path ({used})"


class TestCCOWorld(BaseTestCCO):
    GROUP = "world"


class TestCCOFull(BaseTestCCO):
    GROUP = "full"


class TestCCOEvens(BaseTestCCO):
    GROUP = "evens"


class TestCCOOdds(BaseTestCCO):
    GROUP = "odds"


class TestCCOTail(BaseTestCCO):
    GROUP = "tail"


class TestCCOEnds(BaseTestCCO):
    GROUP = "ends"


# ---------------------------------------------------------------------------- large buffers
def test_all_reduce_large_buffer():
    """A 64 MiB+ all_reduce (float32, 16.8 M elements), in place and without copies."""
    n, me = dist.get_world_size(), dist.get_rank()
    count = 16_800_000  # 67.2 MB > 64 MiB
    pattern = (np.arange(count, dtype=np.int64) % 7).astype(np.float32)
    x = pattern + np.float32(me)
    assert x.nbytes >= 64 * 2**20
    pg = ai.process_group(None)
    spy = ai.CommSpy(pg.comm)
    pg.comm, gates = spy, (pg.shm_min, pg.shm_ar_min)
    pg.shm_min = pg.shm_ar_min = 1 << 62  # MPI's path (shared memory copies by design: shm_coll)
    try:
        dist.all_reduce(x)
    finally:
        pg.comm, (pg.shm_min, pg.shm_ar_min) = spy._comm, gates
    assert any(np.shares_memory(x, a) for c in spy.calls for a in ai.arrays_in(c[1]))
    pattern *= n
    pattern += np.float32(n * (n - 1) // 2)
    np.testing.assert_array_equal(x, pattern)


# ---------------------------------------------------------------------------- each array kind
@pytest.mark.parametrize("kind", ai.KINDS)
def test_array_kind(kind):
    """One visible test per kind (the class matrix loops over the kinds usable here, so a
    missing GPU shows up as this test's skip, with its reason, on every rank)."""
    ai.require_kind(kind)
    n, me = dist.get_world_size(), dist.get_rank()
    x = ai.wrap(kind, np.full((2, 3), me + 1, dtype=np.float32))
    dist.all_reduce(x)
    ai.check(x, np.full((2, 3), n * (n + 1) / 2, dtype=np.float32), f"all_reduce {kind}")
    y = ai.wrap(kind, np.full(4, me, dtype=np.int64))
    dist.broadcast(y, src=n - 1)
    ai.check(y, np.full(4, n - 1, dtype=np.int64), f"broadcast {kind}")
    out = ai.wrap(kind, np.zeros((n, 2), np.float16))
    dist.all_gather_into_tensor(out, ai.wrap(kind, np.full(2, me, np.float16)))
    ai.check(out, np.repeat(np.arange(n, dtype=np.float16), 2).reshape(n, 2), kind)
