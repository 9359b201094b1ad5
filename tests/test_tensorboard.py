"""``mpitensor.utils.tensorboard.SummaryWriter``: event files TensorBoard reads, written from
mpitensor tensors (through tensorboardX), read back record by record here."""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import List

import numpy as np
import pytest

import mpitensor as mt

pytest.importorskip("tensorboardX")

from mpitensor.utils.tensorboard import SummaryWriter  # noqa: E402


def _events(folder: Path) -> List:
    from tensorboardX.proto import event_pb2

    out = []
    for f in sorted(folder.rglob("events.out.tfevents.*")):
        data = f.read_bytes()
        at = 0
        while at < len(data):
            (n,) = struct.unpack_from("<Q", data, at)
            out.append(event_pb2.Event.FromString(data[at + 12:at + 12 + n]))
            at += 12 + n + 4  # length, its CRC, the record, its CRC
    return out


def test_scalars_histograms_and_images_from_tensors(tmp_path: Path) -> None:
    with SummaryWriter(str(tmp_path)) as w:
        assert w.log_dir == str(tmp_path)
        for step in range(3):
            w.add_scalar("loss", mt.tensor(1.0 / (step + 1)), global_step=step)
        w.add_histogram("weights", mt.randn(200), 5)
        w.add_image("img", mt.rand(3, 8, 8), 5)
        w.add_text("note", "hello", 5)
    scalars = [(e.step, v.tag, v.simple_value) for e in _events(tmp_path)
               for v in e.summary.value if v.HasField("simple_value")]
    assert scalars == [(0, "loss", 1.0), (1, "loss", 0.5), (2, "loss", np.float32(1 / 3))]
    kinds = {v.tag: v.WhichOneof("value") for e in _events(tmp_path) for v in e.summary.value}
    assert kinds["weights"] == "histo" and kinds["img"] == "image"


def test_add_graph_says_why_it_is_not_there(tmp_path: Path) -> None:
    with SummaryWriter(str(tmp_path)) as w:
        with pytest.raises(NotImplementedError, match="torch.jit"):
            w.add_graph(mt.nn.Linear(2, 2), mt.zeros(1, 2))


def test_without_tensorboardx_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ImportError, match=r"mpitensor\[tensorboard\]"):
        SummaryWriter(str(tmp_path))
