"""tests/programs/amp_cnn.py, a mixed-precision training program written as public programs
write it (autocast by device type, GradScaler, unscale_ + clip_grad_norm_, CUDA timing and
memory guarded by is_available), run under mpitensor and under torch from the same weights."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .test_ported_programs import assert_losses_match, steps
from .test_programs_families import _initial_weights, _run

# the logits are rounded to bfloat16 (u = 2**-8) and the loss computed from them in float32;
# the weights stay float32, so the two libraries' losses stay within two bfloat16 ulps
BF16_RTOL = 2 * 2.0**-8


@pytest.mark.parametrize("amp", [True, False])
def test_amp_program_matches_torch(amp: bool, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    weights = tmp_path / "init.npz"
    _initial_weights("amp_cnn.py", "Net", weights, monkeypatch)
    args = ["--init-from", str(weights), "--steps", "10"] + ([] if amp else ["--no-amp"])
    ours, theirs = _run("amp_cnn.py", args, tmp_path), _run("amp_cnn.py", args, tmp_path,
                                                            torch_lib=True)
    assert_losses_match(steps(ours), steps(theirs), "amp_cnn.py",
                        BF16_RTOL if amp else None)
    rest = r"step \d+ loss \S+ (scale .*)"  # the scale's course and the logits' dtype
    assert re.findall(rest, ours) == re.findall(rest, theirs)
    assert re.findall(r"state .*", ours) == re.findall(r"state .*", theirs)
    assert ("dtype bfloat16" in ours) == amp
