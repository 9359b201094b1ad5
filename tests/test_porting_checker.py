"""``python -m mpitensor.porting``: run as a user runs it, on programs written here."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from mpitensor import porting

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = textwrap.dedent("""\
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch import optim
    from torch.nn import functional as G
    from torch.utils.data import DataLoader
    from torch.nn.modules.loss import _Loss

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(3, 4)
            self.ctc = nn.CTCLoss()

        def forward(self, x):
            y = x.stft(4)
            z = G.no_such_function(x)
            return F.relu(y) + x.sum()

    opt = optim.SGD([torch.zeros(1)], lr=0.1)
    torch.save(Net(), "m.pt")
    torch.cuda.no_such_thing()
    """)


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpitensor.porting", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_findings_follow_the_aliases(tmp_path: Path) -> None:
    found = porting.check_source(PROGRAM, "p.py")
    missing = {(f.line, f.name) for f in found if f.kind == "missing"}
    assert missing == {(13, "torch.nn.CTCLoss"), (17, "torch.nn.functional.no_such_function"),
                       (22, "torch.cuda.no_such_thing")}
    assert [(f.line, f.name) for f in found if f.kind == "tensor method?"] == [(16, "stft")]
    different = {f.name for f in found if f.kind == "different"}
    assert "torch.save" in different
    # what mpitensor has is not reported: LSTM, relu, SGD, DataLoader, _Loss, Module
    reported = {f.name for f in found}
    assert not reported & {"torch.nn.LSTM", "torch.nn.functional.relu", "torch.optim.SGD",
                           "torch.utils.data.DataLoader", "torch.nn.modules.loss._Loss",
                           "torch.nn.Module"}


def test_command_line_exit_status_and_summary(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(PROGRAM)
    (tmp_path / "good.py").write_text("import torch\nx = torch.ones(2).sum()\n")
    sub = tmp_path / "pkg"
    sub.mkdir()
    (sub / "also_good.py").write_text("from torch import nn\nm = nn.Linear(2, 2)\n")
    r = _run("bad.py", cwd=tmp_path)
    assert r.returncode == 1
    assert "bad.py:13: missing torch.nn.CTCLoss" in r.stdout
    assert "bad.py: 3 missing names, 1 possible tensor method" in r.stdout
    r = _run("good.py", "pkg", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "good.py: 0 missing names" in r.stdout
    r = _run(".", "--summary", "--quiet", cwd=tmp_path)
    assert r.returncode == 1
    assert "2 of 3 files (67 %) use no missing name" in r.stdout
    assert "    1  torch.nn.CTCLoss" in r.stdout
    r = _run("good.py", "--strict", cwd=tmp_path)
    assert r.returncode == 0
    (tmp_path / "meth.py").write_text("def f(t):\n    return t.stft(4)\n")
    assert _run("meth.py", cwd=tmp_path).returncode == 0
    assert _run("meth.py", "--strict", cwd=tmp_path).returncode == 1


def test_bad_input(tmp_path: Path) -> None:
    (tmp_path / "py2.py").write_text("print 'hello'\n")
    r = _run("py2.py", cwd=tmp_path)
    assert r.returncode == 1 and "unreadable" in r.stdout and "not Python 3" in r.stdout
    r = _run("no_such_file.py", cwd=tmp_path)
    assert r.returncode == 2 and "no such file or directory: no_such_file.py" in r.stderr


def test_the_ported_examples_need_nothing_missing() -> None:
    r = _run(str(ROOT / "examples" / "ported"), "--quiet", cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
