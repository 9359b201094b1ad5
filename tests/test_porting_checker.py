"""``python -m mpitensor.porting``: run as a user runs it, on programs written here."""

from __future__ import annotations

import ast
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
            self.ctc = nn.NoSuchLayer()

        def forward(self, x):
            y = x.to_mkldnn()
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
    assert missing == {(13, "torch.nn.NoSuchLayer"), (17, "torch.nn.functional.no_such_function"),
                       (22, "torch.cuda.no_such_thing")}
    assert [(f.line, f.name) for f in found if f.kind == "tensor method?"] == [(16, "to_mkldnn")]
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
    assert "bad.py:13: missing torch.nn.NoSuchLayer" in r.stdout
    assert "bad.py: 3 missing names, 1 possible tensor method" in r.stdout
    r = _run("good.py", "pkg", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "good.py: 0 missing names" in r.stdout
    r = _run(".", "--summary", "--quiet", cwd=tmp_path)
    assert r.returncode == 1
    assert "2 of 3 files (67 %) use no missing name" in r.stdout
    assert "    1  torch.nn.NoSuchLayer" in r.stdout
    r = _run("good.py", "--strict", cwd=tmp_path)
    assert r.returncode == 0
    (tmp_path / "meth.py").write_text("def f(t):\n    return t.to_mkldnn()\n")
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


# -- scopes: a torch alias rebound to something else is not torch there ----------------------

def _reported(source: str) -> set:
    """The torch paths and attribute names reported for ``source`` (any kind)."""
    return {f.name for f in porting.check_source(textwrap.dedent(source), "s.py")}


def _torch_paths(source: str) -> set:
    """The torch paths ``source`` is read to use, whether or not mpitensor has them."""
    uses = porting._Uses(porting._torch_snapshot())
    uses.visit(ast.parse(textwrap.dedent(source)))
    uses.finish()
    return {p for _, p in uses.paths}


SHADOWED = {
    "parameter": """
        def f(data):
            return data.no_such_a
        """,
    "lambda parameter": "g = lambda data: data.no_such_a\n",
    "keyword-only, *args and **kwargs parameters": """
        def f(*data, nn=None, **F):
            return data.no_such_a, nn.no_such_b, F.no_such_c
        """,
    "assignment in the function, even after the use": """
        def f(x):
            y = data.no_such_a
            data = x
            return y
        """,
    "augmented and annotated assignment": """
        def f():
            data: int = 1
            nn += 1
            return data.no_such_a, nn.no_such_b
        """,
    "for target": """
        def f(xs):
            for i, (data, _) in enumerate(xs):
                data.no_such_a()
        """,
    "with-as": """
        def f(p):
            with open(p) as data:
                return data.no_such_a
        """,
    "except-as": """
        def f():
            try:
                pass
            except ValueError as data:
                return data.no_such_a
        """,
    "comprehension variable": "ys = [data.no_such_a for data in range(3)]\n",
    "nested comprehensions and generators": (
        "ys = {data: nn.no_such_b for nn in range(2) for data in (nn.no_such_c,)}\n"
        "zs = list(data.no_such_a for data in range(3))\n"),
    "walrus in a function": """
        def f(x):
            if (data := x):
                return data.no_such_a
        """,
    "nested def and class names": """
        def f():
            def data():
                pass
            class nn:
                pass
            return data.no_such_a, nn.no_such_b
        """,
    "local non-torch import": """
        def f():
            import numpy as data
            from os import path as nn
            return data.no_such_a, nn.no_such_b
        """,
    "nonlocal rebinding in an inner function of a shadowing one": """
        def f(data):
            def g():
                nonlocal data
                data = 1
                return data.no_such_a
            return g
        """,
    "enclosing function's parameter seen from an inner one": """
        def f(data):
            def g():
                return data.no_such_a
            return g
        """,
}


def test_each_shadowing_form_hides_the_import() -> None:
    header = "from torch.utils import data\nfrom torch import nn\nimport torch.nn.functional as F\n"
    for form, body in SHADOWED.items():
        reported = _reported(header + textwrap.dedent(body))
        wrong = {n for n in reported if "no_such" in n}
        assert not wrong, f"{form}: {sorted(wrong)}"


def test_the_import_is_still_seen_where_it_is_not_shadowed() -> None:
    reported = _reported("""\
        from torch.utils import data
        from torch import nn

        def f(x):
            return data.no_such_a(x)          # not rebound here: the import

        def g(nn):
            return data.no_such_b, nn.whatever

        class C:
            data = 1                          # a class attribute ...
            def m(self):
                return data.no_such_c         # ... is not seen by its methods

        h = lambda x: nn.no_such_d(x)
        """)
    assert {"torch.utils.data.no_such_a", "torch.utils.data.no_such_b",
            "torch.utils.data.no_such_c", "torch.nn.no_such_d"} <= reported


def test_global_rebinding_in_a_function_rebinds_the_modules_name() -> None:
    paths = _torch_paths("""\
        from torch.utils import data

        def k():
            global data
            data = 2
            return data.no_such_a

        loader = data.DataLoader([1])
        y = data.no_such_b
        """)
    # the module scope now binds `data` both ways: only torch's own names are torch's
    assert "torch.utils.data.DataLoader" in paths
    assert not {"torch.utils.data.no_such_a", "torch.utils.data.no_such_b"} & paths


def test_a_name_bound_both_ways_in_one_scope_counts_only_torchs_names() -> None:
    source = """\
        import torch
        from torch.utils import data
        from torch import nn
        loader = data.DataLoader([1, 2])
        for data in loader:
            print(data.mean(), data.CTCLossish)
        nn = nn.CTCLoss()
        y = nn.to_mkldnn
        """
    paths = _torch_paths(source)
    assert not {"torch.utils.data.mean", "torch.utils.data.CTCLossish", "torch.nn.to_mkldnn"} & paths
    # torch.nn has CTCLoss and torch.utils.data DataLoader: those uses are checked as torch's
    assert {"torch.nn.CTCLoss", "torch.utils.data.DataLoader"} <= paths
    names = {(f.kind, f.name) for f in porting.check_source(textwrap.dedent(source), "m.py")}
    # the attributes of a value that is not torch's go to the tensor-method check
    assert ("tensor method?", "to_mkldnn") in names


def test_class_body_and_its_comprehensions() -> None:
    reported = _reported("""\
        from torch import nn

        class A:
            nn = 1
            x = nn.no_such_a                  # the class's own `nn`
            ys = [nn.no_such_b for _ in (1,)] # a comprehension does not see the class's name

        class B(nn.Module):
            def forward(self, nn):
                return nn.no_such_c
        """)
    assert "torch.nn.no_such_a" not in reported and "torch.nn.no_such_c" not in reported
    assert "torch.nn.no_such_b" in reported
