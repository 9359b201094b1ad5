"""Every ``MPITENSOR_*`` switch is declared in ``mpitensor/_base/config.py``, read only there, and
listed in docs/architecture.md's "Switches" table (see issue 26)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from mpitensor._base import config as _config

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mpitensor"
NAME = re.compile(r"\bMPITENSOR_[A-Z0-9_]*[A-Z0-9]\b")
# calls on a mapping that read a key (os.environ.get, .pop, .setdefault, os.getenv, ...)
READS = {"get", "pop", "setdefault", "getenv", "getenvb"}


def _sources():
    for p in sorted(PKG.rglob("*.py")):
        yield p, p.read_text(encoding="utf-8")


def test_every_name_used_is_declared():
    used = {}
    for p, text in _sources():
        for name in NAME.findall(text):
            used.setdefault(name, p.relative_to(ROOT).as_posix())
    undeclared = {n: where for n, where in used.items() if n not in _config.SWITCHES}
    assert undeclared == {}, "declare these in mpitensor/_base/config.py"


def _switch_names(tree: ast.Module) -> dict:
    """Module-level ``NAME = "MPITENSOR_..."`` (or ``= _config.ENV_...``) constants."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            key = _key(node.value, {})
            if key:
                out[node.targets[0].id] = key
    return out


def _key(node: ast.AST, consts: dict):
    """The switch name that ``node`` stands for, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) \
            and NAME.fullmatch(node.value):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.Attribute):
        value = getattr(_config, node.attr, None) if node.attr.startswith("ENV") else None
        if isinstance(value, str) and value in _config.SWITCHES:
            return value
        return consts.get(node.attr)
    return None


def _reads(tree: ast.Module) -> list:
    consts = _switch_names(tree)
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            fn = node.func
            attr = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if attr in READS:
                key = _key(node.args[0], consts)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = _key(node.slice, consts)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn))
                                                   for op in node.ops):
            key = _key(node.left, consts)
        if key:
            found.append(f"line {node.lineno}: {key}")
    return found


def test_only_config_reads_switches():
    readers = {}
    for p, text in _sources():
        if p == PKG / "_base" / "config.py":
            continue
        found = _reads(ast.parse(text))
        if found:
            readers[p.relative_to(ROOT).as_posix()] = found
    assert readers == {}, "read MPITENSOR_* switches through mpitensor._base.config"


def test_the_scan_finds_reads():
    code = ('import os\nfrom mpitensor._base import config as _config\nX = "MPITENSOR_DEBUG"\n'
            'a = os.environ.get("MPITENSOR_DEBUG")\nb = os.environ[X]\n'
            'c = X in os.environ\nd = os.getenv(_config.ENV_SECRET)\n'
            'os.environ[X] = "1"\ne = {X: 1}\n')
    assert [r.split(": ")[0] for r in _reads(ast.parse(code))] == \
        ["line 4", "line 5", "line 6", "line 7"]


def _docs_table() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    m = re.search(r"^## Switches\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, "docs/architecture.md has no '## Switches' section"
    rows = [line for line in m.group(1).splitlines() if line.startswith("|")]
    return "\n".join(rows) + "\n"


def test_docs_table_is_the_declarations():
    """docs/architecture.md's table is ``_config.markdown_table()``: exactly the declared
    switches, each with its default (regenerate it with that function)."""
    assert _docs_table() == _config.markdown_table()
    names = re.findall(r"^\| `(MPITENSOR_\w+)` \| ([^|]*) \|", _docs_table(), re.M)
    assert [n for n, _ in names] == list(_config.SWITCHES)
    assert {n: d.strip() for n, d in names} == {n: s.default for n, s in
                                                _config.SWITCHES.items()}


def test_declare_reads_the_table():
    """An indented line continues its entry; an entry without five fields, or a name declared
    twice, stops the import."""
    table = ("MPITENSOR_A | bool | 0 | import |\n    one\n    two\n"
             "MPITENSOR_B | text | unset | now | x\n")
    assert _config._declare(table) == {
        "MPITENSOR_A": _config.Switch("MPITENSOR_A", "bool", "0", "import", "one two"),
        "MPITENSOR_B": _config.Switch("MPITENSOR_B", "text", "unset", "now", "x")}
    for bad in ("MPITENSOR_A | bool | 0 | import\n", table + "MPITENSOR_A | bool | 0 | now | y\n"):
        with pytest.raises(ValueError, match="malformed or repeated switch declaration"):
            _config._declare(bad)


def test_raw_refuses_undeclared_names():
    with pytest.raises(KeyError, match="MPITENSOR_NOPE is not a declared switch"):
        _config.raw("MPITENSOR_NOPE")


@pytest.mark.parametrize("value, expected", [("65536", 65536), ("1", 1), ("off", _config.OFF_BYTES),
                                             ("", 1 << 20), (None, 1 << 20)])
def test_conv_band_bytes(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("MPITENSOR_CONV_BAND_BYTES", raising=False)
    else:
        monkeypatch.setenv("MPITENSOR_CONV_BAND_BYTES", value)
    assert _config.conv_band_bytes() == expected


@pytest.mark.parametrize("value", ["abc", "0", "-5"])
def test_conv_band_bytes_rejects(monkeypatch, value):
    """A malformed value raises, as every import-time switch does (it used to warn and use
    the default)."""
    monkeypatch.setenv("MPITENSOR_CONV_BAND_BYTES", value)
    with pytest.raises(ValueError, match=r"MPITENSOR_CONV_BAND_BYTES=.* an integer of at least "
                                         r"1 or off"):
        _config.conv_band_bytes()


@pytest.mark.parametrize("value, expected", [(None, None), ("auto", None), (" AUTO ", None),
                                             ("1", True), ("0", False), ("", False)])
def test_cuda_aware(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("MPITENSOR_CUDA_AWARE", raising=False)
    else:
        monkeypatch.setenv("MPITENSOR_CUDA_AWARE", value)
    assert _config.cuda_aware() is expected


def test_mnist_mirrors(monkeypatch):
    monkeypatch.setenv("MPITENSOR_MNIST_MIRRORS", "http://a/, http://b/ http://c/")
    assert _config.mnist_mirrors() == ["http://a/", "http://b/", "http://c/"]
    monkeypatch.delenv("MPITENSOR_MNIST_MIRRORS")
    assert _config.mnist_mirrors() == []
