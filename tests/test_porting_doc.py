"""docs/porting.md is generated from the code: the committed page must be what
tools/porting_table.py writes now, and writing it must need no torch.

When the first test fails, mpitensor's API changed (or a note did): regenerate the page with
``python tools/porting_table.py`` from the repository root and commit it.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "porting_table.py"
DOC = ROOT / "docs" / "porting.md"


@pytest.fixture(scope="module")
def porting_table() -> types.ModuleType:
    """tools/porting_table.py, loaded as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("_porting_table", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def snapshot(porting_table: types.ModuleType) -> dict:
    return json.loads(porting_table.SNAPSHOT.read_text(encoding="utf-8"))


def test_porting_doc_is_current(porting_table: types.ModuleType) -> None:
    expected = porting_table.generate()
    actual = DOC.read_text(encoding="utf-8")
    if actual != expected:
        diff = list(difflib.unified_diff(actual.splitlines(), expected.splitlines(),
                                         "docs/porting.md (committed)",
                                         "docs/porting.md (generated now)", lineterm="", n=1))
        shown = "\n".join(diff[:60]) + ("\n..." if len(diff) > 60 else "")
        pytest.fail(f"docs/porting.md is stale: mpitensor's API or the notes in "
                    f"tools/porting_table.py changed. Regenerate it from the repository root "
                    f"with\n\n    {porting_table.COMMAND}\n\nand commit the result.\n\n{shown}",
                    pytrace=False)


def test_generation_needs_no_torch() -> None:
    """The check mode runs with ``import torch`` made impossible."""
    code = ("import runpy, sys\n"
            "sys.modules['torch'] = None\n"
            f"sys.argv = [{str(SCRIPT)!r}, '--check']\n"
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr


def test_a_note_for_a_name_torch_lacks_fails(porting_table: types.ModuleType,
                                             snapshot: dict,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(porting_table.NOTES, "torch.nn.NoSuchLayer", "a stale note")
    with pytest.raises(ValueError, match="NoSuchLayer"):
        porting_table.classify(snapshot)


def test_a_note_for_a_name_mpitensor_lacks_fails(porting_table: types.ModuleType,
                                                 snapshot: dict,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    missing = next((f"{ns}.{name}" for ns in ("torch.nn", "torch") for name in
                    snapshot["namespaces"][ns]["names"]
                    if porting_table.resolve(f"mpitensor{ns[5:]}.{name}")
                    is porting_table.MISSING), None)
    if missing is None:
        pytest.skip("mpitensor has every name of torch.nn and torch")
    monkeypatch.setitem(porting_table.NOTES, missing, "a stale note")
    with pytest.raises(ValueError, match=f"mpitensor{missing[5:]} does not exist"):
        porting_table.classify(snapshot)


def test_elsewhere_must_point_at_a_name_that_exists(porting_table: types.ModuleType,
                                                    snapshot: dict,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(porting_table.ELSEWHERE, "torch.multiprocessing.init_reductions",
                        ("mpitensor.distributed.no_such_spawn", "a stale note"))
    with pytest.raises(ValueError, match="no_such_spawn"):
        porting_table.classify(snapshot)


def test_statuses_follow_the_paths(porting_table: types.ModuleType, snapshot: dict) -> None:
    """Spot checks of the classification against names whose status is settled."""
    table = porting_table.classify(snapshot)
    assert "Linear" in table["torch.nn"]["supported"]
    assert "get_default_backend_for_device" in table["torch.distributed"]["different"]
    assert "spawn" in table["torch.multiprocessing"]["different"]
    assert "shape" in table["torch.Tensor"]["supported"]
    assert table["torch.Tensor"]["supported"]["shape"] == "property"
    for ns, row in table.items():
        names = set(snapshot["namespaces"][ns]["names"])
        parts = [set(row[k]) for k in ("supported", "different", "missing")]
        assert set().union(*parts) == names, ns
        assert sum(map(len, parts)) == len(names), ns
        assert not set(row["extras"]) & names, ns
