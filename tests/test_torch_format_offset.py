"""A torch-format record written into an open file after other bytes: its zip offsets count from
the record's first byte, so torch's own reader (not only Python's zipfile) accepts it."""

from __future__ import annotations

import io

import numpy as np
import pytest

import mpitensor as mt
from mpitensor.checkpoint import load, save


def _torch():
    try:
        import torch
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"torch is not importable here ({type(exc).__name__}: {exc}): "
                    f"no oracle to read the record")
    return torch


def _state():
    return {"w": mt.tensor(np.arange(12, dtype=np.float32).reshape(3, 4)),
            "b": mt.tensor(np.array([-1.5, 2.25], dtype=np.float64)),
            "step": 7}


@pytest.mark.parametrize("offset", [0, 1, 63, 64, 100, 4097])
def test_torch_reads_a_record_written_at_any_offset(offset):
    torch = _torch()
    buf = io.BytesIO()
    buf.write(b"\xa5" * offset)
    save(_state(), buf, format="torch")
    buf.seek(offset)
    got = torch.load(buf, weights_only=True)
    assert got["step"] == 7
    assert got["w"].dtype == torch.float32 and got["b"].dtype == torch.float64
    np.testing.assert_array_equal(got["w"].numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(got["b"].numpy(), [-1.5, 2.25])


def test_a_record_after_another_record_is_read_by_torch_and_by_us(tmp_path):
    """Two records in one file: the second, read from its own start, by torch and by us."""
    path = tmp_path / "two.bin"
    with open(path, "wb") as f:
        f.write(b"head")
        save({"x": mt.tensor(np.array([1, 2, 3], dtype=np.int64))}, f, format="torch")
        second = f.tell()
        save({"y": mt.tensor(np.array([4.5], dtype=np.float32))}, f, format="torch")
    with open(path, "rb") as f:
        f.seek(second)
        np.testing.assert_array_equal(load(f, weights_only=True)["y"].numpy(), [4.5])
    torch = _torch()
    with open(path, "rb") as f:
        f.seek(second)
        np.testing.assert_array_equal(torch.load(f, weights_only=True)["y"].numpy(), [4.5])


def test_storage_records_are_aligned_from_the_record_start():
    """torch aligns each storage's bytes to 64 from its archive's start; so do we, wherever the
    archive begins in the file."""
    import zipfile

    buf = io.BytesIO()
    buf.write(b"z" * 37)
    save({"w": mt.zeros(5)}, buf, format="torch")
    record = io.BytesIO(buf.getvalue()[37:])
    with zipfile.ZipFile(record) as zf:
        data = [i for i in zf.infolist() if "/data/" in i.filename]
        assert data
        for info in data:
            head = 30 + len(info.filename.encode()) + len(info.extra)
            assert (info.header_offset + head) % 64 == 0, info.filename
