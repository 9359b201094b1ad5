"""Object collectives and object p2p (the pickle-based ``*_object`` functions).

One base class bound to the world and to sub-groups; the objects mix dicts, strings, tuples and
NumPy arrays, and every rank checks what it got.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor.distributed as dist

from . import arrayimpl as ai


def obj(r, salt=0):
    """A picklable object that names its maker."""
    return {"rank": r, "salt": salt, "name": f"rank-{r}" * (r + 1),
            "array": np.arange(r + 3, dtype=np.float32) * (salt + 1), "tuple": (r, [salt])}


def same(a, b) -> bool:
    if isinstance(a, dict):
        return (isinstance(b, dict) and a.keys() == b.keys()
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b))
    return a == b


class BaseTestObjects(ai.GroupCase):

    def test_broadcast_object_list(self):
        if self.nonmember():
            return
        for root in range(self.size):
            for by_group_rank in (False, True):
                if self.rank == root:
                    lst = [obj(root), "text", 42, None]
                else:
                    lst = [None] * 4
                kw = {"group_src": root} if by_group_rank else {"src": self.ranks[root]}
                assert dist.broadcast_object_list(lst, group=self.group, **kw) is None
                ai.expect(same(lst[0], obj(root)) and lst[1:] == ["text", 42, None],
                          f"broadcast_object_list from {root}: {lst}")

    def test_broadcast_object_list_default_src(self):
        if self.nonmember():
            return
        lst = [obj(self.rank)]
        dist.broadcast_object_list(lst, group=self.group)
        ai.expect(same(lst[0], obj(0)), f"default src: {lst}")

    def test_all_gather_object(self):
        if self.nonmember():
            return
        out = [None] * self.size
        assert dist.all_gather_object(out, obj(self.rank, 1), group=self.group) is None
        for j, o in enumerate(out):
            ai.expect(same(o, obj(j, 1)), f"all_gather_object [{j}]: {o}")

    def test_gather_object(self):
        if self.nonmember():
            return
        for root in range(self.size):
            out = [None] * self.size if self.rank == root else None
            kw = {"group_dst": root} if root % 2 else {"dst": self.ranks[root]}
            dist.gather_object(obj(self.rank, root), out, group=self.group, **kw)
            if self.rank == root:
                for j, o in enumerate(out):
                    ai.expect(same(o, obj(j, root)), f"gather_object to {root} [{j}]: {o}")

    def test_scatter_object_list(self):
        if self.nonmember():
            return
        for root in range(self.size):
            ins = [obj(j, root) for j in range(self.size)] if self.rank == root else None
            out = [None]
            kw = {"group_src": root} if root % 2 else {"src": self.ranks[root]}
            dist.scatter_object_list(out, ins, group=self.group, **kw)
            ai.expect(same(out[0], obj(self.rank, root)), f"scatter_object_list: {out}")

    def test_send_recv_object(self):
        if self.nonmember() or self.size < 2:
            return
        nxt, prv = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        if self.rank % 2 == 0:
            dist.send_object(obj(self.rank, 5), self.ranks[nxt], group=self.group, tag=5)
            got = dist.recv_object(self.ranks[prv], group=self.group, tag=5)
        else:
            got = dist.recv_object(None, group=self.group, tag=5)  # any source
            dist.send_object(obj(self.rank, 5), self.ranks[nxt], group=self.group, tag=5)
        ai.expect(same(got, obj(prv, 5)), f"recv_object: {got}")

    def test_send_recv_object_list(self):
        if self.nonmember() or self.size < 2:
            return
        nxt, prv = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        payload = [obj(self.rank, 6), f"from {self.ranks[self.rank]}", {"k": [1, 2]}]
        out = [None, None, None]
        if self.rank % 2 == 0:
            dist.send_object_list(payload, dst=self.ranks[nxt], group=self.group)
            sender = dist.recv_object_list(out, src=self.ranks[prv], group=self.group)
        else:
            sender = dist.recv_object_list(out, group_src=prv, group=self.group)
            dist.send_object_list(payload, group_dst=nxt, group=self.group)
        ai.expect(sender == self.ranks[prv], f"recv_object_list sender {sender}")
        ai.expect(same(out[0], obj(prv, 6)) and out[1:] == [f"from {self.ranks[prv]}",
                                                             {"k": [1, 2]}],
                  f"recv_object_list: {out}")

    def test_recv_object_list_any_source_and_bad_length(self):
        if self.nonmember() or self.size < 2:
            return
        if self.rank == 0:
            sender = dist.recv_object_list([None, None], group=self.group)
            ai.expect(sender == self.ranks[1], f"any-source sender {sender}")
            with pytest.raises(ValueError, match=r"received 2 objects .* has 3 slots"):
                dist.recv_object_list([None] * 3, src=self.ranks[1], group=self.group)
        elif self.rank == 1:
            dist.send_object_list(["a", "b"], dst=self.ranks[0], group=self.group)
            dist.send_object_list(["a", "b"], dst=self.ranks[0], group=self.group)

    def test_object_list_errors(self):
        if self.nonmember():
            return
        with pytest.raises(ValueError, match=f"object_list must be a list of {self.size} "):
            dist.all_gather_object([None] * (self.size + 1), 1, group=self.group)
        with pytest.raises(TypeError, match="object_list must be a list"):
            dist.broadcast_object_list((1,), group_src=0, group=self.group)
        with pytest.raises(ValueError, match="must be a non-empty list"):
            dist.scatter_object_list([], [1] * self.size, group_src=0, group=self.group)
        # the source sends 2 objects; a rank that expects 3 learns it after the broadcast
        lst = [1, 2] if self.rank == 0 else [None] * 3
        if self.rank == 0:
            dist.broadcast_object_list(lst, group_src=0, group=self.group)
        else:
            with pytest.raises(ValueError, match="broadcast 2 objects but .* has 3 slots"):
                dist.broadcast_object_list(lst, group_src=0, group=self.group)


class TestObjectsWorld(BaseTestObjects):
    GROUP = "world"


class TestObjectsEvens(BaseTestObjects):
    GROUP = "evens"


class TestObjectsTail(BaseTestObjects):
    GROUP = "tail"


def test_objects_use_pickle_not_buffers():
    """A tensor inside an object travels pickled (any dtype, even unsupported ones)."""
    n, me = dist.get_world_size(), dist.get_rank()
    out = [None] * n
    payload = {"longdouble": np.array([me], dtype=np.longdouble), "obj": np.array([me, "x"],
                                                                                  dtype=object)}
    dist.all_gather_object(out, payload)
    for j, o in enumerate(out):
        assert o["longdouble"].dtype == np.longdouble and o["longdouble"][0] == j
        assert list(o["obj"]) == [j, "x"]
