"""``python -m mpitensor.porting PATH...``: what a torch program needs that mpitensor lacks.

It reads each program without running it (its syntax tree), follows its imports and their
aliases (``import torch.nn as nn``, ``from torch import optim``, ``from torch.nn import
functional as F``, ``from torch.utils.data import DataLoader``), and looks every ``torch``
name the program uses up at the same path in mpitensor (``nn.LSTM`` -> ``mpitensor.nn.LSTM``).
Names follow Python's scopes: after ``from torch.utils import data``, a function whose parameter
or variable is also called ``data`` uses its own ``data``, not torch's.
It prints, with ``file:line``:

- ``missing``: a name mpitensor lacks (the exit status is then 1);
- ``different``: a name mpitensor has but treats otherwise, with the note of docs/porting.md;
- ``tensor method?``: an attribute called on some value, named like a method torch's Tensor has
  and mpitensor's lacks. Which values are tensors cannot be known without running the program,
  so these are reported apart; ``--strict`` counts them as missing.

Directories are searched for ``*.py`` files. ``--summary`` prints, over all the files, how many
use no missing name and the most-missed names.

Example::

    $ python -m mpitensor.porting train.py
    train.py:14: missing torch.nn.CTCLoss
    train.py:40: tensor method? .stft (torch.Tensor.stft)
    train.py: 1 missing name, 1 possible tensor method
"""

from __future__ import annotations

import argparse
import ast
import collections
import functools
import importlib
import json
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["Finding", "check_source", "check_paths", "main"]

_SNAPSHOT = Path(__file__).with_name("_torch_names.json")
_MISSING = object()


class Finding(collections.namedtuple("Finding", "path line kind name note")):
    """One report: ``kind`` is ``"missing"``, ``"different"`` or ``"tensor method?"``."""

    def __str__(self) -> str:
        if self.kind == "tensor method?":
            text = (f"{self.path}:{self.line}: tensor method? .{self.name} "
                    f"(torch.Tensor.{self.name})")
        else:
            text = f"{self.path}:{self.line}: {self.kind} {self.name}"
        return text + (f": {self.note}" if self.note else "")


def _tensor_only_methods() -> frozenset:
    """Methods and properties of torch's Tensor (the snapshot) that mpitensor's Tensor lacks."""
    from mpitensor.tensor import Tensor  # noqa: PLC0415 - the package's tensor, once loaded

    names = _torch_snapshot()["torch.Tensor"]
    return frozenset(n for n in names["names"] if not hasattr(Tensor, n))


def resolve(torch_path: str) -> Any:
    """The mpitensor object at ``torch_path``'s place (``torch.nn.LSTM`` ->
    ``mpitensor.nn.LSTM``), or the sentinel ``_MISSING``."""
    parts = ["mpitensor", *torch_path.split(".")[1:]]
    obj: Any = None
    for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        except Exception:  # a module that fails to import is missing to the program
            return _MISSING
        for attr in parts[i:]:
            obj = getattr(obj, attr, _MISSING)
            if obj is _MISSING:
                return _MISSING
        return obj
    return _MISSING


def _notes() -> Dict[str, str]:
    from mpitensor._porting_notes import ELSEWHERE, NOTES  # noqa: PLC0415

    out = dict(NOTES)
    out.update({k: f"at {where}: {how}" for k, (where, how) in ELSEWHERE.items()})
    return out


class _Scope:
    """One Python scope (module, class, function, lambda or comprehension) and what it binds.

    ``torch`` maps a name to the torch paths imports bind it to (with their lines); ``other``
    holds the names bound to anything else (parameters, assignments, loop and ``with``
    targets, ``except ... as``, ``def``/``class`` names, other imports).
    """

    def __init__(self, kind: str, parent: Optional["_Scope"]) -> None:
        self.kind = kind
        self.parent = parent
        self.torch: Dict[str, List[Tuple[int, str]]] = {}
        self.other: set = set()
        self.declared_global: set = set()
        self.declared_nonlocal: set = set()

    def target(self, name: str) -> "_Scope":
        """The scope a binding of ``name`` made here lands in (``global``/``nonlocal``)."""
        if name in self.declared_global:
            s = self
            while s.parent is not None:
                s = s.parent
            return s
        if name in self.declared_nonlocal:
            s = self.parent
            while s is not None and s.kind in ("class", "comprehension"):
                s = s.parent
            return s or self
        return self


_FUNCTION_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _is_torch(module: str) -> bool:
    return module == "torch" or module.startswith("torch.")


class _Uses(ast.NodeVisitor):
    """The torch paths a module uses (with their lines), and its other attribute names.

    Names follow Python's scoping: an alias imported at module level is not the import inside
    a function (or lambda, comprehension, class body) that binds the same name otherwise. When
    one scope binds a name both to a torch import and to something else, which one a use sees
    depends on the run; such a use counts as torch only where the attribute is one of torch's
    names (the snapshot), so ``data.mean`` after ``from torch.utils import data`` and
    ``for data in loader`` is not reported while ``data.DataLoader`` is.
    """

    def __init__(self, torch_names: Optional[Dict[str, Any]] = None) -> None:
        self.scope = _Scope("module", None)
        self.paths: List[Tuple[int, str]] = []
        self.attributes: List[Tuple[int, str]] = []
        self._chains: List[Tuple[int, str, List[str], _Scope]] = []
        self._torch_names = torch_names

    # -- bindings ---------------------------------------------------------------------------
    def _bind(self, name: str, torch_path: Optional[str] = None, line: int = 0,
              scope: Optional[_Scope] = None) -> None:
        s = (scope or self.scope).target(name)
        if torch_path is None:
            s.other.add(name)
        else:
            s.torch.setdefault(name, []).append((line, torch_path))

    def visit_Import(self, node: ast.Import) -> None:  # noqa: N802 - ast's name
        for a in node.names:
            bound = a.asname or a.name.split(".")[0]
            if not _is_torch(a.name):
                self._bind(bound)
                continue
            self.paths.append((node.lineno, a.name))
            # `import torch.nn` binds `torch`; `import torch.nn as nn` binds the submodule
            self._bind(bound, a.name if a.asname else "torch", node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:  # noqa: N802
        mod = node.module or ""
        torch = not node.level and _is_torch(mod)
        for a in node.names:
            if a.name == "*":
                if torch:
                    self.paths.append((node.lineno, mod))
                continue
            if not torch:
                self._bind(a.asname or a.name)
                continue
            path = f"{mod}.{a.name}"
            self._bind(a.asname or a.name, path, node.lineno)
            self.paths.append((node.lineno, path))

    def visit_Global(self, node: ast.Global) -> None:  # noqa: N802
        self.scope.declared_global.update(node.names)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:  # noqa: N802
        self.scope.declared_nonlocal.update(node.names)

    def visit_Name(self, node: ast.Name) -> None:  # noqa: N802
        # a bare use of `from torch... import X` is checked at the import itself
        if not isinstance(node.ctx, ast.Load):
            self._bind(node.id)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:  # noqa: N802
        self.visit(node.value)
        s = self.scope  # `:=` in a comprehension binds in the enclosing function or module
        while s.kind == "comprehension" and s.parent is not None:
            s = s.parent
        if isinstance(node.target, ast.Name):
            self._bind(node.target.id, scope=s)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:  # noqa: N802
        if node.name:
            self._bind(node.name)
        self.generic_visit(node)

    def _bind_pattern_names(self, node: ast.AST) -> None:
        for sub in ast.walk(node):
            for field in ("name", "rest"):  # MatchAs, MatchStar, MatchMapping
                name = getattr(sub, field, None)
                if isinstance(name, str) and sub.__class__.__name__.startswith("Match"):
                    self._bind(name)

    def visit_match_case(self, node: Any) -> None:
        self._bind_pattern_names(node.pattern)
        self.generic_visit(node)

    # -- scopes -----------------------------------------------------------------------------
    def _enter(self, kind: str, body: Iterable[ast.AST]) -> None:
        outer, self.scope = self.scope, _Scope(kind, self.scope)
        try:
            for item in body:
                self.visit(item)
        finally:
            self.scope = outer

    def _visit_function(self, node: Any) -> None:
        args = node.args
        for default in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]:
            self.visit(default)
        if not isinstance(node, ast.Lambda):
            self._bind(node.name)
            for item in [*node.decorator_list, node.returns]:
                if item is not None:
                    self.visit(item)
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs,
                 *(a for a in (args.vararg, args.kwarg) if a is not None)]
        for a in every:
            if a.annotation is not None:
                self.visit(a.annotation)
        body = node.body if isinstance(node.body, list) else [node.body]
        outer, self.scope = self.scope, _Scope("function", self.scope)
        try:
            for a in every:
                self._bind(a.arg)
            for item in body:
                self.visit(item)
        finally:
            self.scope = outer

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function  # noqa: N815

    def visit_ClassDef(self, node: ast.ClassDef) -> None:  # noqa: N802
        for item in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(item)
        self._bind(node.name)
        self._enter("class", node.body)

    def _visit_comprehension(self, node: Any) -> None:
        gens = node.generators
        self.visit(gens[0].iter)  # the first iterable is evaluated outside
        outer, self.scope = self.scope, _Scope("comprehension", self.scope)
        try:
            for i, g in enumerate(gens):
                self.visit(g.target)
                if i:
                    self.visit(g.iter)
                for cond in g.ifs:
                    self.visit(cond)
            for part in ("elt", "key", "value"):
                if getattr(node, part, None) is not None:
                    self.visit(getattr(node, part))
        finally:
            self.scope = outer

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = (  # noqa: N815
        _visit_comprehension)

    # -- uses -------------------------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:  # noqa: N802
        chain = []
        cur: Any = node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        if isinstance(cur, ast.Name) and isinstance(cur.ctx, ast.Load):
            # resolved once every binding is known (a function's later assignment counts)
            self._chains.append((node.lineno, cur.id, chain[::-1], self.scope))
            return
        self.attributes.append((node.lineno, node.attr))
        self.generic_visit(node)

    def _lookup(self, scope: _Scope, name: str, line: int, first: str) -> Optional[str]:
        """The torch path ``name`` stands for in ``scope`` (None: not torch there)."""
        s: Optional[_Scope] = scope
        here = True
        while s is not None:
            if name in s.declared_global:
                while s.parent is not None:
                    s = s.parent
            skip = s.kind == "class" and not here  # a class body is not seen by its methods
            here = False
            if not skip and (name in s.torch or name in s.other):
                if name not in s.torch:
                    return None
                binds = s.torch[name]
                before = [p for ln, p in binds if ln <= line]
                path = before[-1] if before else binds[0][1]
                if name in s.other and not self._torch_has(path, first):
                    return None
                return path
            s = s.parent
        return None

    def _torch_has(self, namespace: str, attr: str) -> bool:
        entry = (self._torch_names or {}).get(namespace)
        if entry is None:  # a namespace the snapshot lacks: count it only where mpitensor has it
            return resolve(f"{namespace}.{attr}") is not _MISSING
        return attr in entry["names"] or attr in entry.get("other", ())

    def finish(self) -> None:
        """Resolve the attribute chains seen, once the whole module has been read."""
        for line, root, chain, scope in self._chains:
            path = self._lookup(scope, root, line, chain[0])
            if path is not None:
                self.paths.append((line, ".".join([path, *chain])))
            else:
                self.attributes.extend((line, attr) for attr in chain)
        self._chains = []
        self.paths.sort(key=lambda item: item[0])
        self.attributes.sort(key=lambda item: item[0])


@functools.cache
def _torch_snapshot() -> Dict[str, Any]:
    """torch's names per namespace, as ``tools/porting_table.py`` recorded them."""
    return json.loads(_SNAPSHOT.read_text(encoding="utf-8"))["namespaces"]


def check_source(source: str, path: str = "<string>", *, tensor_methods: Optional[frozenset]
                 = None) -> List[Finding]:
    """The findings for one program's source text (see the module's description)."""
    tree = ast.parse(source, filename=path)
    uses = _Uses(_torch_snapshot())
    uses.visit(tree)
    uses.finish()
    notes = _notes()
    findings: List[Finding] = []
    seen: set = set()
    for line, p in uses.paths:
        if p in seen:
            continue
        seen.add(p)
        obj = resolve(p)
        if obj is _MISSING:
            findings.append(Finding(path, line, "missing", p, ""))
        elif p in notes:
            findings.append(Finding(path, line, "different", p, notes[p]))
    if tensor_methods is None:
        tensor_methods = _tensor_only_methods()
    named = set()
    for line, attr in uses.attributes:
        if attr in tensor_methods and attr not in named:
            named.add(attr)
            findings.append(Finding(path, line, "tensor method?", attr, ""))
    findings.sort(key=lambda f: (f.line, f.kind, f.name))
    return findings


def _files(paths: Iterable[str]) -> List[Path]:
    out: List[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*.py") if q.is_file()))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    return out


def check_paths(paths: Sequence[str]) -> Dict[str, List[Finding]]:
    """Findings per file for files and directories (searched for ``*.py``)."""
    methods = _tensor_only_methods()
    out: Dict[str, List[Finding]] = {}
    for f in _files(paths):
        try:
            source = f.read_text(encoding="utf-8", errors="replace")
            out[str(f)] = check_source(source, str(f), tensor_methods=methods)
        except SyntaxError as exc:
            out[str(f)] = [Finding(str(f), exc.lineno or 0, "unreadable", "",
                                   f"not Python 3 ({exc.msg})")]
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m mpitensor.porting",
        description="List the torch names a program uses that mpitensor lacks or treats "
                    "differently (read from the source; nothing is run).")
    ap.add_argument("paths", nargs="+", help="Python files or directories")
    ap.add_argument("--strict", action="store_true",
                    help="count possible tensor methods as missing names")
    ap.add_argument("--summary", action="store_true",
                    help="print the share of files with no missing name and the most missed")
    ap.add_argument("--quiet", action="store_true", help="print only the per-file totals")
    args = ap.parse_args(argv)
    try:
        results = check_paths(args.paths)
    except FileNotFoundError as exc:
        ap.error(str(exc))
    bad = 0
    counter: collections.Counter = collections.Counter()
    for path, findings in results.items():
        missing = [f for f in findings if f.kind in ("missing", "unreadable")
                   or (args.strict and f.kind == "tensor method?")]
        maybe = [f for f in findings if f.kind == "tensor method?"]
        if not args.quiet:
            for f in findings:
                print(f)
        if missing:
            bad += 1
        counter.update({f.name or f.note for f in missing})
        print(f"{path}: {len(missing)} missing name{'s' * (len(missing) != 1)}, "
              f"{len(maybe)} possible tensor method{'s' * (len(maybe) != 1)}")
    if args.summary and results:
        total = len(results)
        print(f"\n{total - bad} of {total} files ({100 * (total - bad) / total:.0f} %) use no "
              f"missing name")
        for name, n in counter.most_common(30):
            print(f"{n:5d}  {name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
