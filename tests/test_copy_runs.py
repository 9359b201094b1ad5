"""``_cpu_kernels.copy_runs`` (the compiled copy of a redistribution's own block): every run
lands where its offsets say, above and below the size where the stores bypass the cache, and
a run outside either buffer is refused before any byte moves."""

from __future__ import annotations

import numpy as np
import pytest

kernels = pytest.importorskip("mpitensor._cpu_kernels", reason="the compiled loops were not built")


@pytest.mark.parametrize("stream", [-1, 0, 1])
@pytest.mark.parametrize("rows, cols, width", [(7, 5, 3), (4096, 1024, 512), (3, 4099, 1)])
def test_runs_land_where_the_offsets_say(rows, cols, width, stream):
    # 4096 x 512 float32 runs are 8 MiB: past the 4 MiB where stream=-1 bypasses the cache
    src = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    dst = np.full((rows, width + 2), -1.0, np.float32)  # a column on each side stays
    isz = src.itemsize
    soffs = np.arange(rows, dtype=np.int64) * cols * isz + (cols - width) * isz
    doffs = np.arange(rows, dtype=np.int64) * (width + 2) * isz + isz
    kernels.copy_runs(dst.reshape(-1).view(np.uint8), doffs, src.reshape(-1).view(np.uint8),
                      soffs, width * isz, stream)
    assert dst[:, 1:-1].tobytes() == np.ascontiguousarray(src[:, cols - width:]).tobytes()
    assert (dst[:, 0] == -1).all() and (dst[:, -1] == -1).all()


def test_unaligned_runs_of_odd_lengths():
    src = np.arange(10_000, dtype=np.uint8)
    dst = np.zeros(10_000, np.uint8)
    soffs = np.array([1, 3001, 7003], np.int64)
    doffs = np.array([5, 2000, 6001], np.int64)
    for stream in (0, 1):
        dst[:] = 0
        kernels.copy_runs(dst, doffs, src, soffs, 999, stream)
        want = np.zeros(10_000, np.uint8)
        for d, s in zip(doffs, soffs):
            want[d:d + 999] = src[s:s + 999]
        assert dst.tobytes() == want.tobytes()


def test_a_run_outside_a_buffer_is_refused_before_any_byte_moves():
    src, dst = np.arange(64, dtype=np.uint8), np.zeros(32, np.uint8)
    with pytest.raises(ValueError, match="leaves its buffer"):
        kernels.copy_runs(dst, np.array([0, 30], np.int64), src, np.array([0, 8], np.int64), 4)
    assert not dst.any()
    with pytest.raises(ValueError, match="int64 of one length"):
        kernels.copy_runs(dst, np.array([0], np.int64), src, np.array([0, 8], np.int64), 4)
    with pytest.raises(TypeError):
        kernels.copy_runs(src.tobytes(), np.array([0], np.int64), src, np.array([0], np.int64), 4)
