"""Collectives and point-to-point messages on half precision (float16, bfloat16).

MPI has no bfloat16 type, so these dtypes travel as 16-bit words; reductions widen them to
float32, reduce, and round once. Expected results are computed here, on every rank, from every
rank's values: the float32 reduction rounded once to the half dtype. The values have 8-bit
significands in a narrow exponent range, so every float32 sum and product is exact and the
order MPI combines the ranks in cannot change a bit. Data movement is checked bit for bit, NaN
payloads, infinities, -0 and subnormals included.

Run as ``mpiexec -n N python -m pytest --with-mpi tests/mpi/test_half_mpi.py`` (N = 2, 3, 4).
"""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed as dist
from mpitensor.distributed.backends.mpi import buffers as _buffers
from mpitensor.errors import DtypeMismatchError

R = dist.ReduceOp
HALVES = (mt.bfloat16, mt.float16)
KINDS = ("numpy", "tensor")
N = 12  # elements per rank (per slot, for the scattering collectives)

pytestmark = pytest.mark.mpi(min_size=2)

#: 16-bit patterns that must survive any move: quiet and signalling NaNs with payloads,
#: infinities, zeros of both signs, subnormals, the largest finite numbers
_BF16_SPECIAL = [0x7FC1, 0xFFC0, 0x7F81, 0xFF85, 0x7F80, 0xFF80, 0x0000, 0x8000, 0x0001, 0x807F,
                 0x7F7F, 0x3F80]
_F16_SPECIAL = [0x7E01, 0xFE00, 0x7C01, 0xFC05, 0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001, 0x83FF,
                0x7BFF, 0x3C00]


@pytest.fixture(scope="module", params=["world", "copy"])
def group(request):
    """The default group, or a new group of every rank (its own communicator)."""
    if request.param == "world":
        return None
    return dist.new_group(list(range(dist.get_world_size())))


def _name(dt: np.dtype) -> str:
    return mt.dtypes.dtype_name(dt)


def _values(dt: np.dtype, rank: int, n: int = N, product: bool = False) -> np.ndarray:
    """Rank ``rank``'s values: exact in ``dt``, and in float32 sums of up to 4 of them."""
    rng = np.random.default_rng(1000 + rank)
    if product:  # at most 3 significant bits each: products of 4 ranks stay exact
        return rng.choice([-2.0, -1.5, -1.0, 1.0, 1.25, 1.5, 2.0], n).astype(dt)
    k = rng.integers(-127, 128, n).astype(np.float32)
    e = rng.integers(-3, 4, n).astype(np.float32)
    return (k * np.float32(2.0) ** e).astype(dt)


def _reduced(dt: np.dtype, op: R, arrays: list) -> np.ndarray:
    """The float32 reduction of ``arrays``, rounded once to ``dt``."""
    wide = np.stack([a.astype(np.float32) for a in arrays])
    if op in (R.SUM, R.AVG):
        out = wide.sum(0)
        if op is R.AVG:
            out = out / np.float32(len(arrays))
    elif op is R.PRODUCT:
        out = wide.prod(0)
    elif op is R.MAX:
        out = wide.max(0)
    else:
        out = wide.min(0)
    return out.astype(np.float32).astype(dt)


def _bits(a) -> np.ndarray:
    a = a._data if isinstance(a, mt.Tensor) else a
    return np.ascontiguousarray(a).view(np.uint16)


def _wrap(kind: str, a: np.ndarray):
    return mt.Tensor(a) if kind == "tensor" else a


def _patterns(dt: np.dtype, rank: int, n: int = 2 * N) -> np.ndarray:
    """Rank ``rank``'s bit patterns: the special ones, then random words."""
    special = _BF16_SPECIAL if dt == mt.bfloat16 else _F16_SPECIAL
    rng = np.random.default_rng(2000 + rank)
    words = np.concatenate([special, rng.integers(0, 1 << 16, n - len(special))])
    return np.roll(words.astype(np.uint16), rank).view(dt)


def _assert_bits(got, want: np.ndarray, what: str) -> None:
    np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"rank {dist.get_rank()}: "
                                                                   f"{what}")


# --------------------------------------------------------------------------------------------
# reductions


@pytest.mark.parametrize("dt", HALVES, ids=_name)
@pytest.mark.parametrize("op", [R.SUM, R.AVG, R.PRODUCT, R.MAX, R.MIN], ids=lambda o: o.name)
def test_all_reduce_is_the_float32_result_rounded_once(group, dt, op):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    product = op is R.PRODUCT
    for kind in KINDS:
        x = _values(dt, rank, product=product)
        dist.all_reduce(_wrap(kind, x), op=op, group=group)
        want = _reduced(dt, op, [_values(dt, r, product=product) for r in range(size)])
        _assert_bits(x, want, f"all_reduce {op.name} {kind}")
        assert x.dtype == dt


@pytest.mark.parametrize("dt", HALVES, ids=_name)
def test_all_reduce_rounds_once_not_per_rank(group, dt):
    """256 + 1 + 1 is 258 in bfloat16 (2048 + 1 + 1 = 2050 in float16): adding the ranks in
    the half dtype would give 256 (2048), as each 257 (2049) ties to even."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    big = 256.0 if dt == mt.bfloat16 else 2048.0
    x = mt.tensor([big if rank == 0 else 1.0, 1.0]).to(dt)
    dist.all_reduce(x, group=group)
    once = float(np.float32(big + size - 1).astype(dt))  # 256 + 1 + 1 = 258, exact in float32
    assert x.tolist() == [once, float(size)]
    if size >= 3:
        assert once != big


@pytest.mark.parametrize("dt", HALVES, ids=_name)
@pytest.mark.parametrize("op", [R.SUM, R.AVG, R.MAX], ids=lambda o: o.name)
def test_reduce(group, dt, op):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    dst = dist.get_global_rank(group, size - 1) if group is not None else size - 1
    for kind in KINDS:
        x = _values(dt, rank)
        mine = x.copy()
        dist.reduce(_wrap(kind, x), dst=dst, op=op, group=group)
        if rank == size - 1:
            want = _reduced(dt, op, [_values(dt, r) for r in range(size)])
            _assert_bits(x, want, f"reduce {op.name} {kind} at dst")
        else:
            _assert_bits(x, mine, f"reduce {op.name} {kind} off dst (unchanged)")


@pytest.mark.parametrize("dt", HALVES, ids=_name)
@pytest.mark.parametrize("op", [R.SUM, R.AVG, R.MIN], ids=lambda o: o.name)
def test_reduce_scatter_tensor_and_list(group, dt, op):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    full = [_values(dt, r, n=N * size) for r in range(size)]
    want = _reduced(dt, op, full)[rank * N:(rank + 1) * N]
    for kind in KINDS:
        out = np.zeros(N, dtype=dt)
        dist.reduce_scatter_tensor(_wrap(kind, out), _wrap(kind, full[rank].copy()), op=op,
                                   group=group)
        _assert_bits(out, want, f"reduce_scatter_tensor {op.name} {kind}")
        out = np.zeros(N, dtype=dt)
        chunks = [_wrap(kind, c.copy()) for c in np.split(full[rank], size)]
        dist.reduce_scatter(_wrap(kind, out), chunks, op=op, group=group)
        _assert_bits(out, want, f"reduce_scatter {op.name} {kind}")


@pytest.mark.parametrize("dt", HALVES, ids=_name)
def test_all_reduce_async_and_non_contiguous(group, dt):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    want = _reduced(dt, R.AVG, [_values(dt, r, n=2 * N) for r in range(size)])
    base = _values(dt, rank, n=2 * N)
    x = mt.Tensor(base.copy())
    work = dist.all_reduce(x, op=R.AVG, group=group, async_op=True)
    work.wait()
    _assert_bits(x, want, "async all_reduce AVG")
    strided = base.reshape(N, 2).copy()
    view = mt.Tensor(strided)[:, 0]  # every other element: staged, reduced, written back
    dist.all_reduce(view, op=R.AVG, group=group)
    _assert_bits(strided[:, 0], want.reshape(N, 2)[:, 0], "strided all_reduce AVG")
    _assert_bits(strided[:, 1], base.reshape(N, 2)[:, 1], "strided all_reduce: gaps untouched")


# --------------------------------------------------------------------------------------------
# data movement, bit for bit


@pytest.mark.parametrize("dt", HALVES, ids=_name)
def test_broadcast_moves_bits(group, dt):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    for src in range(size):
        for kind in KINDS:
            x = _patterns(dt, rank)
            gsrc = dist.get_global_rank(group, src) if group is not None else src
            dist.broadcast(_wrap(kind, x), src=gsrc, group=group)
            _assert_bits(x, _patterns(dt, src), f"broadcast from {src} {kind}")


@pytest.mark.parametrize("dt", HALVES, ids=_name)
def test_gathers_move_bits(group, dt):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    mine = _patterns(dt, rank)
    for kind in KINDS:
        outs = [np.zeros_like(mine) for _ in range(size)]
        dist.all_gather([_wrap(kind, o) for o in outs], _wrap(kind, mine.copy()), group=group)
        for r in range(size):
            _assert_bits(outs[r], _patterns(dt, r), f"all_gather slot {r} {kind}")
        flat = np.zeros(size * mine.size, dtype=dt)
        dist.all_gather_into_tensor(_wrap(kind, flat), _wrap(kind, mine.copy()), group=group)
        _assert_bits(flat, np.concatenate([_patterns(dt, r) for r in range(size)]),
                     f"all_gather_into_tensor {kind}")
        outs = [np.zeros_like(mine) for _ in range(size)] if rank == 0 else None
        dist.gather(_wrap(kind, mine.copy()),
                    [_wrap(kind, o) for o in outs] if outs is not None else None,
                    dst=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        if rank == 0:
            for r in range(size):
                _assert_bits(outs[r], _patterns(dt, r), f"gather slot {r} {kind}")


@pytest.mark.parametrize("dt", HALVES, ids=_name)
def test_scatter_and_all_to_all_move_bits(group, dt):
    rank, size = dist.get_rank(group), dist.get_world_size(group)

    def piece(src: int, dst: int) -> np.ndarray:
        return _patterns(dt, 10 * src + dst, n=N)

    for kind in KINDS:
        out = np.zeros(N, dtype=dt)
        parts = [_wrap(kind, piece(0, d)) for d in range(size)] if rank == 0 else None
        dist.scatter(_wrap(kind, out), parts,
                     src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        _assert_bits(out, piece(0, rank), f"scatter {kind}")
        outs = [np.zeros(N, dtype=dt) for _ in range(size)]
        dist.all_to_all([_wrap(kind, o) for o in outs],
                        [_wrap(kind, piece(rank, d)) for d in range(size)], group=group)
        for s in range(size):
            _assert_bits(outs[s], piece(s, rank), f"all_to_all from {s} {kind}")
        flat = np.zeros(N * size, dtype=dt)
        dist.all_to_all_single(_wrap(kind, flat),
                               _wrap(kind, np.concatenate([piece(rank, d) for d in range(size)])),
                               group=group)
        _assert_bits(flat, np.concatenate([piece(s, rank) for s in range(size)]),
                     f"all_to_all_single {kind}")


@pytest.mark.parametrize("dt", HALVES, ids=_name)
def test_point_to_point_moves_bits(group, dt):
    """A ring (each rank sends its patterns to the next and receives the previous one's, through
    batch_isend_irecv, which also runs in debug mode), then isend/irecv and send/recv between
    the first two ranks."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
    nxt, prev = to_global((rank + 1) % size), to_global((rank - 1) % size)
    for kind in KINDS:
        out = np.zeros(2 * N, dtype=dt)
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.irecv, _wrap(kind, out), prev, group=group, tag=5),
            dist.P2POp(dist.isend, _wrap(kind, _patterns(dt, rank)), nxt, group=group, tag=5)])
        for w in works:
            w.wait()
        _assert_bits(out, _patterns(dt, (rank - 1) % size), f"ring {kind}")
        if rank > 1:
            continue
        peer = to_global(1 - rank)
        if rank == 0:
            dist.isend(_wrap(kind, _patterns(dt, 7)), dst=peer, group=group).wait()
            got = np.zeros(2 * N, dtype=dt)
            assert dist.recv(_wrap(kind, got), src=peer, group=group) == peer
            _assert_bits(got, _patterns(dt, 8), f"send/recv {kind}")
        else:
            got = mt.zeros(2 * N, dtype=dt) if kind == "tensor" else np.zeros(2 * N, dtype=dt)
            work = dist.irecv(got, src=peer, group=group)
            work.wait()
            _assert_bits(got, _patterns(dt, 7), f"isend/irecv {kind}")
            dist.send(_wrap(kind, _patterns(dt, 8)), dst=peer, group=group)


def test_half_dtypes_do_not_mix(group):
    """bfloat16 and float16 (and uint16, their wire type) are different dtypes to every call:
    refused on every rank before any message is sent."""
    size = dist.get_world_size(group)
    x = np.zeros(N, dtype=mt.bfloat16)
    for other in (np.float16, np.uint16):
        outs = [np.zeros(N, dtype=other) for _ in range(size)]
        with pytest.raises(DtypeMismatchError, match="dtype mismatch"):
            dist.all_gather(outs, x, group=group)
    with pytest.raises(ValueError, match="bitwise"):
        dist.all_reduce(x, op=R.BAND, group=group)
    assert mt.bfloat16 in _buffers.supported_dtypes()
