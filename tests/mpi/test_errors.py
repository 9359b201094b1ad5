"""Bad inputs: every one raises a clear ValueError/TypeError (or MpiTensorError) with a message
that names the problem, before any message is sent.

Errors every rank makes are raised on every rank, and the group stays usable. Errors that only
one rank can see (a wrong ``scatter_list`` on the source, a wrong ``gather_list`` on the
destination, a read-only buffer on one rank) are raised there before any traffic; the others,
who made the same call correctly, raise PeerFailedError instead of ever completing it against
a later call, and the group refuses every later call. They run on fresh groups.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.errors import (
    CollectiveMismatchError,
    DistributedTimeoutError,
    MessageMismatchError,
    MessageTruncatedError,
    MpiTensorError,
    NotAGroupMemberError,
    PeerFailedError,
)

from . import arrayimpl as ai

R = dist.ReduceOp


def world():
    return dist.get_world_size(), dist.get_rank()


# ---------------------------------------------------------------------------- p2p peers and tags
def test_send_recv_bad_peer():
    n, me = world()
    x = np.zeros(2)
    for fn, what in ((dist.send, "dst"), (dist.isend, "dst"), (dist.recv, "src"),
                     (dist.irecv, "src")):
        for bad in (n, n + 5, -1):
            with pytest.raises(ValueError, match=rf"{what}={bad} is out of range; valid global "
                                                 rf"ranks are 0\.\.{n - 1}"):
                fn(x, bad)
        with pytest.raises(ValueError, match=rf"invalid {what} rank {me}: .*same as the rank "
                                             "of the current process"):
            fn(x, me)
        with pytest.raises(TypeError, match=f"{what} must be an int"):
            fn(x, "1")
    with pytest.raises(ValueError, match="dst is required"):
        dist.send(x)
    with pytest.raises(ValueError, match=r"tag=-1 is out of range; MPI tags run from 0 to"):
        dist.recv(x, None, tag=-1)
    with pytest.raises(TypeError, match="tag must be an int"):
        dist.recv(x, None, tag="x")
    with pytest.raises(ValueError, match="not both"):
        dist.send(x, dst=0, group_dst=0)


def test_bad_p2pop_and_batch():
    x = np.zeros(1)
    with pytest.raises(ValueError, match="op must be mpitensor.distributed.isend or .irecv"):
        dist.P2POp(dist.send, x, 0)
    with pytest.raises(ValueError, match="peer .* is required"):
        dist.P2POp(dist.isend, x)
    with pytest.raises(ValueError, match="list of P2POp is empty"):
        dist.batch_isend_irecv([])
    with pytest.raises(TypeError, match="expects a list of P2POp"):
        dist.batch_isend_irecv([x])


@pytest.mark.mpi(min_size=2)
def test_recv_buffer_too_small():
    """MessageTruncatedError names the sender, the tag and both sizes; the link still works.

    The sender's size is named where MPI reports it (MPICH does; Open MPI 4.1 does not).
    """
    n, me = world()
    from mpi4py import MPI

    size = " of 80 bytes" if MPI.get_vendor()[0] == "MPICH" else "( of 80 bytes)?"
    if me == 0:
        for tag in (0, 1, 2):
            dist.send(np.arange(10, dtype=np.float64), 1, tag=tag)
        dist.send(np.arange(3, dtype=np.float64), 1, tag=3)
    elif me == 1:
        with pytest.raises(MessageTruncatedError,
                           match=r"rank 1: recv .*from rank 0 \(tag 0\)" + size + " is larger "
                                 r"than the receive buffer \(float64\[4\], 32 bytes\)"):
            dist.recv(np.zeros(4), 0, tag=0)
        work = dist.irecv(np.zeros(4), 0, tag=1)
        with pytest.raises(MessageTruncatedError,
                           match=r"irecv .*" + size + " is larger .*32 bytes"):
            work.wait()
        assert work.is_completed() and not work.is_success()
        assert isinstance(work.exception(), MessageTruncatedError)
        with pytest.raises(MessageTruncatedError):  # a second wait reports the same error
            work.wait()
        with pytest.raises(MessageTruncatedError, match=r"float64\[2\], 16 bytes"):
            dist.recv(np.zeros(4)[::2], 0, tag=2)  # staged receive buffer
        y = np.zeros(3)
        assert dist.recv(y, 0, tag=3) == 0
        np.testing.assert_array_equal(y, np.arange(3.0))
    assert issubclass(MessageTruncatedError, MpiTensorError)


@pytest.mark.mpi(min_size=2)
def test_recv_buffer_larger_than_the_message():
    """A message smaller than the receive buffer is never unnoticed (issue 11 §1): recv, irecv
    and a staged buffer raise MessageMismatchError naming the sender, the tag and both sizes,
    always (no debug mode); the link still works afterwards."""
    n, me = world()
    if me == 0:
        for tag in (0, 1, 2, 3):
            dist.send(np.arange(3, dtype=np.float64), 1, tag=tag)
        dist.send(np.arange(3, dtype=np.float64), 1, tag=4)
    elif me == 1:
        msg = (r"rank 1: {op} .*: the message from rank 0 \(tag {tag}\) has 24 bytes but the "
               r"receive buffer is float64\[5\] \(40 bytes\): only the first 24 bytes were "
               r"written.*same dtype and number of elements")
        with pytest.raises(MessageMismatchError, match=msg.format(op="recv", tag=0)):
            dist.recv(np.zeros(5), 0, tag=0)  # the fast path
        with pytest.raises(MessageMismatchError, match=msg.format(op="recv", tag=1)):
            dist.recv(mt.zeros(5, dtype=mt.float64), 0, tag=1)  # a Tensor: the general path
        work = dist.irecv(np.zeros(5), 0, tag=2)
        with pytest.raises(MessageMismatchError, match=msg.format(op="irecv", tag=2)):
            work.wait()
        assert work.is_completed() and not work.is_success()
        with pytest.raises(MessageMismatchError, match="has 24 bytes"):
            dist.recv(np.zeros(10)[::2], 0, tag=3)  # staged (non-contiguous) buffer
        y = np.zeros(3)
        assert dist.recv(y, 0, tag=4) == 0
        np.testing.assert_array_equal(y, np.arange(3.0))

@pytest.mark.mpi(min_size=2)
def test_recv_of_another_element_size_is_explained_not_aborted():
    """float32 x 3 (12 bytes) received into float64 x 3, int16 x 3 into float32 x 1: a byte
    count that is no whole number of the receive buffer's elements. A receive typed with the
    element type made MPICH abort the whole job ('Assertion failed ... typerep_yaksa_pack.c');
    messages now move as bytes, and the receiver gets the size errors above, on every path."""
    n, me = world()
    if me == 0:
        for tag in (0, 1, 2):
            dist.send(np.arange(3, dtype=np.float32), 1, tag=tag)
        dist.send(mt.ones(3, dtype=mt.int16), 1, tag=3)
        dist.send(np.arange(3, dtype=np.float32), 1, tag=4)
    elif me == 1:
        msg = (r"rank 1: {op} .*\(tag {tag}\) has 12 bytes but the receive buffer is "
               r"float64\[3\] \(24 bytes\)")
        with pytest.raises(MessageMismatchError, match=msg.format(op="recv", tag=0)):
            dist.recv(np.zeros(3), 0, tag=0)
        with pytest.raises(MessageMismatchError, match=msg.format(op="irecv", tag=1)):
            dist.irecv(mt.zeros(3, dtype=mt.float64), 0, tag=1).wait()
        with pytest.raises(MessageMismatchError, match=msg.format(op="recv", tag=2)):
            dist.recv(np.zeros(6)[::2], 0, tag=2)
        with pytest.raises(MessageTruncatedError, match=r"of 6 bytes is larger .*float32\[1\]"):
            dist.recv(np.zeros(1, np.float32), 0, tag=3)
        y = np.zeros(3, np.float32)
        assert dist.recv(y, 0, tag=4) == 0
        np.testing.assert_array_equal(y, np.arange(3.0))



@pytest.mark.mpi(min_size=2)
def test_wait_timeout_then_completion():
    """Work.wait(timeout) raises DistributedTimeoutError; the work can still complete later."""
    n, me = world()
    y = np.zeros(2)
    if me == 1:
        work = dist.irecv(y, 0, tag=77)
        with pytest.raises(DistributedTimeoutError, match=r"did not complete within 0\.05 s"):
            work.wait(timeout=0.05)
        assert not work.is_completed()
    dist.barrier()
    if me == 0:
        dist.send(np.array([7.0, 8.0]), 1, tag=77)
    elif me == 1:
        assert work.wait(timeout=60)
        np.testing.assert_array_equal(y, [7.0, 8.0])


# ---------------------------------------------------------------------------- list lengths
def test_list_lengths_used_on_every_rank():
    n, me = world()
    x = np.zeros(2, np.float32)
    short = [np.zeros(2, np.float32) for _ in range(n + 1)]
    msg = rf"has {n + 1} entries but WORLD has {n} ranks"
    with pytest.raises(ValueError, match="tensor_list " + msg):
        dist.all_gather(short, x)
    with pytest.raises(ValueError, match="input_list " + msg):
        dist.reduce_scatter(x, short)
    with pytest.raises(ValueError, match="input_tensor_list " + msg):
        dist.all_to_all([np.zeros(2, np.float32)] * n, short)
    with pytest.raises(ValueError, match="output_tensor_list " + msg):
        dist.all_to_all(short, [np.zeros(2, np.float32)] * n)
    with pytest.raises(TypeError, match="tensor_list must be a list"):
        dist.all_gather(np.zeros((n, 2), np.float32), x)
    with pytest.raises(ValueError, match=r"tensor_list\[0\] is float32\[3\] but tensor is "
                                         r"float32\[2\]; every entry of tensor_list must have"):
        dist.all_gather([np.zeros(3, np.float32) for _ in range(n)], x)
    with pytest.raises(ValueError, match=r"tensor_list\[0\] is float32\[2, 1\] but tensor is "
                                         r"float32\[2\]"):
        dist.all_gather([np.zeros((2, 1), np.float32) for _ in range(n)], x)


def _one_rank_fails(name, root, fail_call, other_call, expect, match, completes=False):
    """Every rank makes the same call on a fresh group; only ``root``'s fails its local checks.

    The root raises ``expect`` (before any traffic); the others must never complete the call
    against a later one: they raise PeerFailedError naming the root, the operation and its
    number (where their part could complete locally, ``completes``, their next call raises).
    From then on every call on that group raises PeerFailedError on every rank.
    """
    n, me = world()
    g = dist.new_group(list(range(n)), group_desc=f"faults_{name}")
    story = rf"rank {root}( \(this rank\))? failed in {name} \(#1 on faults_{name}\)"
    if me == root:
        with pytest.raises(expect, match=match) as info:
            fail_call(g)
        if n > 1:
            assert any(f"the other members of faults_{name} were told" in note
                       for note in info.value.__notes__)
    elif completes:
        try:
            other_call(g)
        except PeerFailedError as exc:
            assert re.search(story, str(exc)), str(exc)
    else:
        with pytest.raises(PeerFailedError, match=story + ".*" + match) as info:
            other_call(g)
        err = info.value
        assert (err.rank, err.op, err.seq, err.group) == (root, name, 1, f"faults_{name}")
    if n > 1:
        for _ in range(2):  # at once, and again: the same story every time
            with pytest.raises(PeerFailedError, match=story):
                dist.all_reduce(np.zeros(1), group=g)
        with pytest.raises(PeerFailedError, match=story):
            dist.send(np.zeros(1), (me + 1) % n, group=g)
    else:
        dist.all_reduce(np.zeros(1), group=g)  # alone: nothing was left waiting
    dist.destroy_process_group(g)
    dist.barrier()  # the world group is untouched


def test_list_lengths_on_the_root():
    """scatter_list is used on src, gather_list on dst: a bad one there, fine lists elsewhere."""
    n, me = world()
    x = np.zeros(2, np.int32)
    wrong = [np.zeros(2, np.int32) for _ in range(n + 1)]
    root = n - 1
    cases = [
        ("scatter", lambda g: dist.scatter(x, wrong, src=root, group=g),
         lambda g: dist.scatter(x, None, src=root, group=g),
         rf"scatter_list has {n + 1} entries but faults_scatter has {n} ranks", False),
        ("scatter", lambda g: dist.scatter(x, None, src=root, group=g),
         lambda g: dist.scatter(x, None, src=root, group=g),
         "scatter_list is required on the source rank", False),
        ("scatter", lambda g: dist.scatter(x, [np.zeros(3, np.int32)] * n, src=root, group=g),
         lambda g: dist.scatter(x, None, src=root, group=g),
         r"scatter_list\[0\] is int32\[3\] but tensor is int32\[2\]", False),
        ("gather", lambda g: dist.gather(x, wrong, dst=root, group=g),
         lambda g: dist.gather(x, None, dst=root, group=g),
         rf"gather_list has {n + 1} entries", True),
        ("gather", lambda g: dist.gather(x, None, dst=root, group=g),
         lambda g: dist.gather(x, None, dst=root, group=g),
         "gather_list is required on the destination", True),
        ("gather_object", lambda g: dist.gather_object(1, [None] * (n + 1), dst=root, group=g),
         lambda g: dist.gather_object(1, None, dst=root, group=g),
         rf"object_gather_list must be a list of {n} ", True),
        ("scatter_object_list",
         lambda g: dist.scatter_object_list([None], [1] * (n + 1), src=root, group=g),
         lambda g: dist.scatter_object_list([None], None, src=root, group=g),
         rf"scatter_object_input_list must be a list of {n} ", False),
    ]
    for name, bad, good, match, completes in cases:
        _one_rank_fails(name, root, bad, good, ValueError, match, completes)


def test_error_on_one_rank_never_matches_the_next_call():
    """The issue's reproducer: one rank's buffer is read-only, it catches the error and goes
    on to its next all_reduce; the others, still in the first call, must not complete it
    against that next call (they would add the wrong values without a word)."""
    n, me = world()
    ro = np.ones(3)
    ro.flags.writeable = False
    _one_rank_fails("all_reduce", 0, lambda g: dist.all_reduce(ro, group=g),
                    lambda g: dist.all_reduce(np.ones(3), group=g), ValueError, "read-only")
    src = n - 1
    ro0 = np.zeros(2, np.int64)
    ro0.flags.writeable = False
    if n > 1:  # a read-only buffer on a receiving rank (the source may pass one)
        _one_rank_fails("broadcast", 0, lambda g: dist.broadcast(ro0, src=src, group=g),
                        lambda g: dist.broadcast(np.zeros(2, np.int64), src=src, group=g),
                        ValueError, "read-only", completes=True)
    # an unpicklable object on the source of an object broadcast
    _one_rank_fails("broadcast_object_list", 0,
                    lambda g: dist.broadcast_object_list([lambda: 0], src=0, group=g),
                    lambda g: dist.broadcast_object_list([None], src=0, group=g),
                    Exception, r"[Pp]ickle")


def test_every_rank_failing_the_same_call_keeps_the_group():
    """A bad argument on every rank: nobody posted anything, the group stays usable and the
    call numbers stay equal (debug mode would notice otherwise)."""
    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="faults_all")
    for _ in range(3):
        with pytest.raises(ValueError, match="read-only"):
            ro = np.zeros(2)
            ro.flags.writeable = False
            dist.all_reduce(ro, group=g)
    x = np.full(2, float(me))
    dist.all_reduce(x, group=g)
    np.testing.assert_array_equal(x, np.full(2, n * (n - 1) / 2))
    objs, seq = [None] * n, g.seq
    dist.all_gather_object(objs, seq, group=g)
    assert objs == [seq] * n
    dist.destroy_process_group(g)


# ---------------------------------------------------------------------------- dtypes
def test_mismatched_dtypes():
    n, me = world()
    f32, f64 = np.float32, np.float64
    pat = r"dtype mismatch: {} is {} but {} is {}"
    with pytest.raises(ValueError, match=r"dtype mismatch: tensor is float32 but "
                                         r"tensor_list\[0\] is float64"):
        dist.all_gather([np.zeros(2, f64) for _ in range(n)], np.zeros(2, f32))
    with pytest.raises(TypeError, match=pat.format("input_tensor", "float32", "output_tensor",
                                                   "float64")):
        dist.all_gather_into_tensor(np.zeros(2 * n, f64), np.zeros(2, f32))
    with pytest.raises(TypeError, match=pat.format("input", "int64", "output", "int32")):
        dist.reduce_scatter_tensor(np.zeros(2, np.int32), np.zeros(2 * n, np.int64))
    with pytest.raises(TypeError, match=pat.format("input", "float32", "output", "float64")):
        dist.all_to_all_single(np.zeros(n, f64), np.zeros(n, f32))
    with pytest.raises(TypeError, match=r"output is float32 but input_list\[\d\] is float64"):
        dist.reduce_scatter(np.zeros(2, f32), [np.zeros(2, f64) for _ in range(n)])
    with pytest.raises(TypeError, match=r"output_tensor_list\[0\] is complex64"):
        dist.all_to_all([np.zeros(2, np.complex64)] * n, [np.zeros(2, f32)] * n)


def test_mismatched_dtypes_on_the_root():
    n, me = world()
    x = np.zeros(1, np.uint8)
    _one_rank_fails("gather", 0, lambda g: dist.gather(x, [np.zeros(1, np.int8)] * n, group=g),
                    lambda g: dist.gather(x, None, group=g), TypeError,
                    r"gather_list\[0\] is int8", completes=True)
    _one_rank_fails("scatter", 0,
                    lambda g: dist.scatter(x, [np.zeros(1, bool)] * n, group=g),
                    lambda g: dist.scatter(x, None, group=g), TypeError,
                    r"scatter_list\[0\] is bool")


@pytest.mark.parametrize("dtype", [np.longdouble, "datetime64[s]", object, "U3", "V8"],
                         ids=["longdouble", "datetime64", "object", "str", "void"])
def test_unsupported_dtypes(dtype):
    n, me = world()
    a = np.zeros(2, dtype=dtype)
    if a.dtype == np.float64:  # longdouble is float64 on some platforms
        pytest.skip("longdouble is float64 here")
    msg = rf"has unsupported dtype {re.escape(str(a.dtype))}; supported dtypes are bool, int8"
    with pytest.raises(TypeError, match="tensor " + msg):
        dist.all_reduce(a)
    with pytest.raises(TypeError, match="tensor " + msg):
        dist.broadcast(a, src=0)
    with pytest.raises(TypeError, match="tensor " + msg):
        dist.all_gather([a] * n, a)
    with pytest.raises(TypeError, match="input_tensor " + msg):
        dist.all_gather_into_tensor(np.zeros(2 * n, dtype=dtype), a)
    if n > 1:
        with pytest.raises(TypeError, match="tensor " + msg):
            dist.send(a, (me + 1) % n)
        with pytest.raises(TypeError, match="tensor " + msg):
            dist.irecv(a, (me + 1) % n)


def test_not_an_array():
    with pytest.raises(TypeError, match="tensor must be an mpitensor.Tensor, a NumPy array "
                                        "or a CuPy array, got list"):
        dist.all_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match="got float"):
        dist.broadcast(1.0, src=0)


# ---------------------------------------------------------------------------- ops
@pytest.mark.parametrize("op", ["median", None, 3, "SUMM"])
def test_unsupported_op(op):
    x = np.ones(2)
    with pytest.raises(ValueError, match=r"unsupported reduce op .*; use one of ReduceOp.SUM"):
        dist.all_reduce(x, op=op)
    with pytest.raises(ValueError, match="unsupported reduce op"):
        dist.reduce(x, dst=0, op=op)
    with pytest.raises(ValueError, match="unsupported reduce op"):
        dist.reduce_scatter_tensor(x[:1], np.ones(dist.get_world_size()), op=op)
    np.testing.assert_array_equal(x, [1.0, 1.0])


def test_invalid_op_dtype_pairs():
    """Every invalid pair raises ValueError on every rank, on every reducing collective."""
    n, me = world()
    for dt in ai.ALL_DTYPES:
        for op in ai.OPS:
            if ai.valid(dt, op):
                continue
            match = ai.invalid_match(dt, op)
            x = np.zeros(2, dt)
            with pytest.raises(ValueError, match=match):
                dist.all_reduce(x, op=op, async_op=True)
            with pytest.raises(ValueError, match=match):
                dist.reduce(x, dst=n - 1, op=op)
            with pytest.raises(ValueError, match=match):
                dist.reduce_scatter(x, [x.copy() for _ in range(n)], op=op)
            with pytest.raises(ValueError, match=match):
                dist.reduce_scatter_tensor(x, np.zeros(2 * n, dt), op=op)


# ---------------------------------------------------------------------------- read-only outputs
def test_read_only_outputs():
    n, me = world()
    ro = np.zeros(2 * n, np.float32)
    ro.setflags(write=False)
    two = ro[:2]
    rw = np.zeros(2, np.float32)
    msg = "is read-only, but this operation writes its result into it"
    with pytest.raises(ValueError, match="tensor " + msg):
        dist.all_reduce(two)
    with pytest.raises(ValueError, match="tensor " + msg):
        dist.all_reduce(two, op=R.AVG, async_op=True)
    with pytest.raises(ValueError, match=r"tensor_list\[\d\] " + msg):
        dist.all_gather([two] * n, rw)
    with pytest.raises(ValueError, match="output_tensor " + msg):
        dist.all_gather_into_tensor(ro, rw)
    with pytest.raises(ValueError, match="output " + msg):
        dist.reduce_scatter_tensor(two, np.zeros(2 * n, np.float32))
    with pytest.raises(ValueError, match="output " + msg):
        dist.all_to_all_single(ro, np.zeros(2 * n, np.float32))
    with pytest.raises(ValueError, match="tensor " + msg):
        dist.scatter(two, [rw] * n if me == 0 else None, src=0)
    with pytest.raises(ValueError, match="tensor " + msg):
        dist.recv(two, None)
    with pytest.raises(ValueError, match="tensor " + msg):
        dist.irecv(two, None)


def test_read_only_inputs_are_fine():
    """Buffers that are only read (broadcast source, send, all_gather input) may be read-only."""
    n, me = world()
    src = np.full(3, 5.0)
    src.setflags(write=False)
    x = src if me == 0 else np.zeros(3)
    dist.broadcast(x, src=0)
    np.testing.assert_array_equal(x, [5.0, 5.0, 5.0])
    ro = np.full(2, float(me))
    ro.setflags(write=False)
    out = [np.zeros(2) for _ in range(n)]
    dist.all_gather(out, ro)
    assert [o[0] for o in out] == list(range(n))
    y = ro.copy()
    dist.reduce(ro if me != 0 else y, dst=0)
    if me == 0:
        assert y[0] == sum(range(n))


def test_read_only_outputs_on_the_root():
    n, me = world()
    ro = np.zeros(1)
    ro.setflags(write=False)
    _one_rank_fails("reduce", 0, lambda g: dist.reduce(ro, dst=0, group=g),
                    lambda g: dist.reduce(np.zeros(1), dst=0, group=g), ValueError,
                    "tensor is read-only", completes=True)
    _one_rank_fails("gather", 0, lambda g: dist.gather(np.zeros(1), [ro] * n, dst=0, group=g),
                    lambda g: dist.gather(np.zeros(1), None, dst=0, group=g), ValueError,
                    r"gather_list\[0\] is read-only", completes=True)


# ---------------------------------------------------------------------------- sizes and roots
def test_sizes_and_roots():
    n, me = world()
    x = np.zeros(3)
    with pytest.raises(ValueError, match=rf"output_tensor has 5 elements but needs group size "
                                         rf"× input size = {n} × 3 = {3 * n}"):
        dist.all_gather_into_tensor(np.zeros(5), x)
    with pytest.raises(ValueError, match=rf"input has 5 elements but needs group size × output "
                                         rf"size = {n} × 3"):
        dist.reduce_scatter_tensor(x, np.zeros(5))
    with pytest.raises(ValueError, match=rf"input_split_sizes has {n + 1} entries"):
        dist.all_to_all_single(np.zeros(n), np.zeros(n), input_split_sizes=[1] * (n + 1))
    with pytest.raises(ValueError, match=r"output_split_sizes=\[.*\] must be non-negative and "
                                         r"sum to dimension 0"):
        dist.all_to_all_single(np.zeros(n), np.zeros(n), output_split_sizes=[2] * n)
    with pytest.raises(ValueError, match=r"differ beyond dimension 0"):
        dist.all_to_all_single(np.zeros((n, 2)), np.zeros((n, 3)))
    # no split sizes and a larger (or smaller) output: refused before any traffic, on the fast
    # path too (MPI_Alltoall would have filled half of the bigger output and left the rest)
    big = np.full(2 * n, -1.0)
    with pytest.raises(ValueError, match=rf"without split sizes, output and input must have "
                                         rf"the same number of elements.*output \({2 * n},\) "
                                         rf"and input \({n},\)"):
        dist.all_to_all_single(big, np.zeros(n))
    assert (big == -1.0).all()
    with pytest.raises(ValueError, match=r"same number of elements"):
        dist.all_to_all_single(mt.zeros(n), mt.zeros(2 * n))
    if n > 1:
        with pytest.raises(ValueError, match=rf"dimension 0 \({n + 1}\) must divide evenly "
                                             rf"among {n} ranks"):
            dist.all_to_all_single(np.zeros(n + 1), np.zeros(n + 1))
    with pytest.raises(ValueError, match="src is required"):
        dist.broadcast(x)
    with pytest.raises(ValueError, match=rf"src={n} is out of range"):
        dist.broadcast(x, src=n)
    with pytest.raises(ValueError, match=rf"group_dst={n} is out of range for WORLD of size "
                                         rf"{n}"):
        dist.reduce(x, group_dst=n)


@pytest.mark.mpi(min_size=2)
def test_non_member_errors():
    n, me = world()
    tail = ai._groups()["tail"]
    if me == 0:
        with pytest.raises(NotAGroupMemberError, match=r"rank 0: all_reduce on .* but rank 0 "
                                                        "is not a member of that group"):
            dist.all_reduce(np.zeros(1), group=tail)
        with pytest.raises(NotAGroupMemberError, match=r"rank 0: send on "):
            dist.send(np.zeros(1), dst=1, group=tail)


def test_one_rank_error_is_raised_at_once():
    """The failing rank raises its own error at once (the peers are told; nothing waits for
    them), even while the others are still busy elsewhere; the settling happens at the
    group's next call."""
    import time

    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="faults_at_once")
    if me == 0:
        ro = np.zeros(2)
        ro.flags.writeable = False
        t0 = time.monotonic()
        with pytest.raises(ValueError, match="read-only"):
            dist.all_reduce(ro, group=g)
        assert time.monotonic() - t0 < 0.5
        if n > 1:
            with pytest.raises(PeerFailedError, match=r"rank 0 \(this rank\) failed in "
                                                      r"all_reduce \(#1 on faults_at_once\)"):
                dist.barrier(group=g)
    else:
        time.sleep(1.0)  # busy: not in any call on g yet
        with pytest.raises(PeerFailedError, match=r"rank 0 failed in all_reduce "
                                                  r"\(#1 on faults_at_once\): ValueError"):
            dist.all_reduce(np.zeros(2), group=g)
    dist.destroy_process_group(g)
    dist.barrier()


@pytest.fixture(params=["board", "exchange"])
def split_check(request, monkeypatch):
    """How the groups made in the test check split sizes (every rank runs the same parameter):
    on the shared board of a one-machine group (``NodeCheck.post_splits``), or by the exchange
    of counts beside the data that groups across machines use (``_fingerprint.Splits``)."""
    from mpitensor.distributed.health import fingerprint as _fingerprint

    if request.param == "exchange":
        monkeypatch.setattr(_fingerprint, "BOARD_MAX", 0)
    return request.param


def _split_sizes_case(tag, call, check=None):
    """``call(g, n, me)`` on a fresh group. A rank that sees a count it does not expect raises
    CollectiveMismatchError naming the peer and both counts; a rank whose own pieces all
    matched may complete (then ``check(result)`` holds: its output is right) or raise
    PeerFailedError; no rank returns an output partly filled from the wrong pieces. Every
    later call on the group raises, on every rank, with the story."""
    n, me = world()
    g = dist.new_group(list(range(n)), group_desc=f"splits_{tag}")
    err = None
    try:
        result = call(g, n, me)
    except (CollectiveMismatchError, PeerFailedError) as exc:
        err = exc
    else:
        assert check is not None and check(result), result
    with pytest.raises(PeerFailedError, match="disagree on the split sizes"):
        dist.all_reduce(np.ones(1), group=g)  # the story, refused at once or at the notice
    return err


@pytest.mark.mpi(min_size=2)
def test_all_to_all_single_split_sizes_that_disagree_across_ranks(split_check):
    """Every rank passes [1, n, ..., n] as both its input and its output splits: each list is
    valid on its own (it sums to its tensor's rows), but rank 0 sends rank 1 n rows where rank
    1 expects 1 from rank 0, and rank 1 sends rank 0 1 row where rank 0 expects n. MPI completed
    such an exchange without a word: the bigger piece was cut, the smaller one left the rest of
    its place as it was (seen: [1, 2, -7, -7])."""
    n, me = world()

    def call(g, n, me):
        split = [1] + [n] * (n - 1)
        rows = sum(split)
        out = np.full((rows, 2), -7.0)
        dist.all_to_all_single(out, np.full((rows, 2), float(me)), output_split_sizes=split,
                               input_split_sizes=split, group=g)
        return out

    err = _split_sizes_case("single", call)
    if me == 1:
        assert isinstance(err, CollectiveMismatchError)
        assert re.search(rf"rank 0 sends {n} rows \({2 * n} elements\) to this rank, which "
                         r"expects 1 row \(2 elements\) from it \(output_split_sizes\[0\]\)",
                         str(err)), str(err)
    if me == 0:
        assert isinstance(err, CollectiveMismatchError)
        assert f"rank 1 sends 1 row (2 elements) to this rank, which expects {n} rows" in str(err)


@pytest.mark.mpi(min_size=2)
def test_all_to_all_list_item_sizes_that_disagree_across_ranks(split_check):
    """Rank 0 sends rank 1 three elements where rank 1 expects two (async). Rank 1 raises;
    rank 0, whose own pieces all matched, may return them (right), then finds the group
    broken like everyone else."""
    def call(g, n, me):
        ins = [np.full(3 if (me == 0 and r == 1) else 2, float(me)) for r in range(n)]
        outs = [np.full(2, -7.0) for _ in range(n)]
        work = dist.all_to_all(outs, ins, group=g, async_op=True)
        work.wait()
        return outs

    n, me = world()
    err = _split_sizes_case("list", call, check=lambda outs: me != 1 and all(
        (o == float(r)).all() for r, o in enumerate(outs)))
    if me == 1:
        assert isinstance(err, CollectiveMismatchError)
        assert "rank 0 sends 3 elements to this rank, which expects 2 elements from it " \
               "(output_tensor_list[0])" in str(err)


@pytest.mark.mpi(min_size=2)
def test_uneven_all_to_all_that_agrees_gives_the_pieces(split_check):
    """The check's own traffic does not disturb matching calls, blocking or async."""
    n, me = world()
    send = [r + 1 + me for r in range(n)]  # rank me sends rank r (r + 1 + me) rows
    recv = [me + 1 + r for r in range(n)]  # so rank me gets (me + 1 + r) rows from rank r
    inp = np.concatenate([np.full(send[r], 100 * me + r, np.float32) for r in range(n)])
    for async_op in (False, True):
        out = np.full(sum(recv), -7.0, np.float32)
        work = dist.all_to_all_single(out, inp, output_split_sizes=recv,
                                      input_split_sizes=send, async_op=async_op)
        if async_op:
            work.wait()
        expect = np.concatenate([np.full(recv[r], 100 * r + me, np.float32) for r in range(n)])
        np.testing.assert_array_equal(out, expect)
    outs = [np.zeros(recv[r]) for r in range(n)]
    dist.all_to_all(outs, [np.full(send[r], 10.0 * me + r) for r in range(n)])
    for r in range(n):
        np.testing.assert_array_equal(outs[r], np.full(recv[r], 10.0 * r + me))


@pytest.mark.mpi(min_size=1)
def test_uneven_all_to_all_single_takes_any_form_of_split_sizes(split_check):
    """Split sizes as lists of ints take the fast path; tuples, NumPy ints, a Tensor output,
    rows of several elements, a non-contiguous input and one side left even take the general
    path or the fast one: every form gives the same pieces."""
    n, me = world()
    send = [r + 1 + me for r in range(n)]  # rank me sends rank r (r + 1 + me) rows of 3
    recv = [me + 1 + r for r in range(n)]
    inp = np.concatenate([np.full((send[r], 3), 100 * me + r, np.float64) for r in range(n)])
    expect = np.concatenate([np.full((recv[r], 3), 100 * r + me, np.float64)
                             for r in range(n)])
    forms = [(recv, send), (tuple(recv), tuple(send)),
             ([np.int64(v) for v in recv], [np.int64(v) for v in send])]
    for rs, ss in forms:
        out = np.full((sum(recv), 3), -7.0)
        dist.all_to_all_single(out, inp, rs, ss)
        np.testing.assert_array_equal(out, expect)
    out = mt.full((sum(recv), 3), -7.0, dtype=mt.float64)
    dist.all_to_all_single(out, mt.from_numpy(inp), recv, send)
    np.testing.assert_array_equal(out.numpy(), expect)
    wide = np.zeros((inp.shape[0], 6))
    wide[:, ::2] = inp  # a strided view: staged by the general path
    out = np.full((sum(recv), 3), -7.0)
    dist.all_to_all_single(out, wide[:, ::2], recv, send)
    np.testing.assert_array_equal(out, expect)
    # one side even: every rank sends every rank 2 rows; each receives as the list says; and
    # both even, as None or as [] (torch's spellings: the same call on every rank)
    inp2 = np.repeat(np.arange(n, dtype=np.float32) + 10 * me, 2)
    mixed = None if me % 2 else []  # one rank says None where another says []: the same
    for rs, ss in (([2] * n, None), (None, []), ([], None), ([], []), (mixed, mixed)):
        out2 = np.full(2 * n, -7.0, np.float32)
        dist.all_to_all_single(out2, inp2, rs, ss)
        np.testing.assert_array_equal(out2,
                                      np.repeat(np.arange(n) * 10 + me, 2).astype(np.float32))


@pytest.mark.mpi(min_size=2)
def test_split_sizes_check_off_with_the_agreement_check(split_check, monkeypatch):
    """MPITENSOR_CHECK_BYTES=off (the group's threshold at OFF_BYTES) turns this check off too:
    one switch for every agreement check. Matching calls still work; nothing is posted."""
    from mpitensor._base.config import OFF_BYTES
    from mpitensor.distributed.health import fingerprint as _fingerprint

    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="splits_off")
    g.check_bytes = OFF_BYTES
    made = []
    if split_check == "board":
        real = type(g.fp_node).post_splits

        def spy(self, *a):
            made.append(1)
            return real(self, *a)

        monkeypatch.setattr(type(g.fp_node), "post_splits", spy)
    else:
        class Spy(_fingerprint.Splits):
            def __init__(self, *a):
                made.append(1)
                super().__init__(*a)

        monkeypatch.setattr(_fingerprint, "Splits", Spy)
    send = [1 + r for r in range(n)]
    recv = [1 + me] * n
    out = np.zeros(sum(recv))
    dist.all_to_all_single(out, np.full(sum(send), float(me)), recv, send, group=g)
    np.testing.assert_array_equal(out, np.repeat(np.arange(n, dtype=float), 1 + me))
    assert made == []
    g.check_bytes = 1 << 16
    dist.all_to_all_single(out, np.full(sum(send), float(me)), recv, send, group=g)
    assert made == [1]
    dist.destroy_process_group(g)


@pytest.mark.mpi(min_size=2)
def test_uneven_all_to_all_in_another_dtype_on_one_rank(split_check):
    """Rank 1 passes float64 where the others pass float32, with split sizes that match: the
    counts agree, the bytes do not (MPI fills half of each float64 place, or cuts, without a
    word). The dtype travels with the counts: raised, never returned."""
    def call(g, n, me):
        dt = np.float64 if me == 1 else np.float32
        out = np.full(2 * n, -7.0, dt)
        dist.all_to_all_single(out, np.full(2 * n, float(me), dt), [2] * n, [2] * n, group=g)
        return out

    n, me = world()
    g = dist.new_group(list(range(n)), group_desc="splits_dtype")
    with pytest.raises((CollectiveMismatchError, PeerFailedError)) as info:
        call(g, n, me)
    if isinstance(info.value, CollectiveMismatchError):
        assert "disagree on the dtype" in str(info.value), str(info.value)
    with pytest.raises(PeerFailedError, match="disagree on the dtype"):
        dist.all_reduce(np.ones(1), group=g)
