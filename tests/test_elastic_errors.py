"""``@record`` (torch.distributed.elastic.multiprocessing.errors) as a torchrun program uses it:
exceptions pass through unchanged and land, as JSON, in the launcher's error file."""

from __future__ import annotations

import json

import pytest

from mpitensor.distributed.elastic.multiprocessing.errors import (
    ChildFailedError,
    ProcessFailure,
    record,
)


def test_record_passes_results_and_exceptions_through(tmp_path, monkeypatch):
    @record
    def ok(a, b=2):
        return a + b

    assert ok(1, b=3) == 4 and ok.__name__ == "ok"

    @record
    def boom():
        raise ValueError("rank 3 saw a bad batch")

    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    with pytest.raises(ValueError, match="bad batch"):
        boom()  # no error file asked for: nothing written, the exception as it was
    err = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(err))
    with pytest.raises(ValueError, match="bad batch"):
        boom()
    data = json.loads(err.read_text())["message"]
    assert data["message"] == "ValueError: rank 3 saw a bad batch"
    assert "in boom" in data["extraInfo"]["py_callstack"]
    assert int(data["extraInfo"]["timestamp"]) > 0
    assert list(tmp_path.iterdir()) == [err]  # written atomically: no temporary file left


def test_system_exit_zero_returns_and_others_raise():
    @record
    def done():
        raise SystemExit(0)

    @record
    def failed():
        raise SystemExit(3)

    assert done() is None
    with pytest.raises(SystemExit) as exc:
        failed()
    assert exc.value.code == 3


def test_child_failure_copies_the_child_error_file(tmp_path, monkeypatch):
    child = tmp_path / "child.json"
    child.write_text(json.dumps({"message": {"message": "RuntimeError: child died",
                                             "extraInfo": {"py_callstack": "...",
                                                           "timestamp": "1"}}}))
    failure = ProcessFailure(local_rank=1, pid=4242, exitcode=1, error_file=str(child))
    assert failure.message == "RuntimeError: child died"
    mine = tmp_path / "parent.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(mine))

    @record
    def launcher():
        raise ChildFailedError("train.py", {1: failure})

    with pytest.raises(ChildFailedError, match="rank 1 .pid 4242.: RuntimeError: child died"):
        launcher()
    assert json.loads(mine.read_text())["message"]["message"] == "RuntimeError: child died"
    with pytest.raises(ValueError):
        ChildFailedError("x", {})
