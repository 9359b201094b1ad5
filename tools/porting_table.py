"""Generate ``docs/porting.md``: which torch names mpitensor has, which differ, which are missing.

Two steps, so that the page can be rebuilt (and checked by a test) where torch is not installed:

``python tools/porting_table.py --snapshot``
    Needs torch. Writes ``mpitensor/_torch_names.json``: for each namespace in :data:`NAMESPACES`,
    torch's public names with their kind, after the noise filter below. Committed; rerun it only
    to move to a new torch version.
``python tools/porting_table.py``
    Needs no torch. Imports mpitensor, looks every snapshot name up at the same path
    (``torch.nn.functional.relu`` -> ``mpitensor.nn.functional.relu``) and writes
    ``docs/porting.md``. ``--check`` compares instead of writing (exit status 1 when stale).

A name is *supported* when its path resolves in mpitensor, *different* when it resolves and
:data:`NOTES` says how it behaves otherwise (or when :data:`ELSEWHERE` names where mpitensor
has it), and *missing* otherwise. A note whose name is not in the snapshot, or no longer
resolves, makes generation fail: a note is never silently dropped or left stale.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import textwrap
import types
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "mpitensor" / "_torch_names.json"  # in the package: the checker reads it
DOC = ROOT / "docs" / "porting.md"
COMMAND = "python tools/porting_table.py"
SNAPSHOT_COMMAND = "python tools/porting_table.py --snapshot"

#: The torch namespaces the page covers, in the page's order. ``torch.Tensor`` lists the
#: class's methods and properties; the others list a module's names.
NAMESPACES: Tuple[str, ...] = (
    "torch",
    "torch.Tensor",
    "torch.autograd",
    "torch.nn",
    "torch.nn.functional",
    "torch.nn.init",
    "torch.nn.utils",
    "torch.nn.parallel",
    "torch.optim",
    "torch.optim.lr_scheduler",
    "torch.utils.data",
    "torch.distributed",
    "torch.multiprocessing",
    "torch.cuda",
    "torch.accelerator",
    "torch.backends.cudnn",
    "torch.amp",
    "torch.sparse",
    "torch.linalg",
    "torch.fft",
    "torch.special",
    "torch.signal.windows",
    "torch.func",
    "torch.autograd.functional",
    "torch.distributions",
    "torch.utils.checkpoint",
    "torch.profiler",
    "torch.fx",
    "torch.distributed.nn",
    "torch.distributed.device_mesh",
    "torch.distributed.tensor",
    "torch.distributed.tensor.parallel",
    "torch.distributed.fsdp",
    "torch.distributed.optim",
    "torch.distributed.checkpoint",
)

# ---------------------------------------------------------------------------------------------
# Curated notes. Keys are torch paths from the snapshot; generation fails if one is not there,
# or (NOTES) does not resolve in mpitensor, or (ELSEWHERE) resolves at torch's path after all.
# Sources: docs/*.md and the docstrings they quote.
# ---------------------------------------------------------------------------------------------

from mpitensor._porting_notes import ELSEWHERE, NOTES  # noqa: E402 - the notes live in the package

#: Notes that hold for a whole namespace; shown under its heading, they change no counts.
NAMESPACE_NOTES: Dict[str, str] = {
    "torch": (
        "Tensors hold a NumPy array (CPU) or a CuPy array (`cuda`); dtypes are NumPy's, "
        "`bfloat16` included where NumPy has it ([devices.md](devices.md))."
    ),
    "torch.cuda": (
        "Backed by CuPy. Without CuPy or a visible GPU, calls that need one raise "
        "`CudaUnavailableError` (a `RuntimeError` and an `AssertionError`), and the others "
        "answer as a CPU-only build of torch does ([devices.md](devices.md))."
    ),
    "torch.accelerator": "The accelerator is CUDA through CuPy; answers agree with `cuda`.",
    "torch.distributed": (
        "Runs on MPI (`mpi4py`) and, for CuPy arrays, NCCL; every collective also takes NumPy "
        "and CuPy arrays ([distributed.md](distributed.md))."
    ),
    "torch.multiprocessing": (
        "`spawn` and `start_processes` start MPI ranks with `mpiexec`; Python's own "
        "`multiprocessing` names, re-exported as torch does, are not part of this list."
    ),
}

# ---------------------------------------------------------------------------------------------
# Step 1: the snapshot of torch's names (needs torch).
# ---------------------------------------------------------------------------------------------

#: Modules whose functions torch re-exports as helpers, not as API (dispatch, TorchScript,
#: build internals; ``torch._linalg_utils`` holds removed functions that only raise).
_NOT_API_MODULES = ("torch._jit_internal", "torch.overrides", "torch._utils",
                    "torch._utils_internal", "torch._linalg_utils")

#: Namespaces whose ``__all__`` is not their API: torch's misses ``set_grad_enabled``,
#: ``unique``, ``nn``, ``cuda``, ...; torch.multiprocessing's is Python's multiprocessing
#: re-exported, without ``spawn``.
_IGNORE_ALL = ("torch", "torch.multiprocessing")

#: Top-level torch functions that are backend kernels or compiler internals, not user API.
_TORCH_KERNEL_PREFIXES = (
    "cudnn_", "miopen_", "mkldnn_", "fbgemm_", "native_", "sym_", "batch_norm_", "rnn_",
    "autocast_", "get_autocast_", "set_autocast_", "is_autocast_", "clear_autocast_",
)

#: Names dropped by hand.
_DROPPED: Dict[str, Tuple[str, ...]] = {
    # build flags, the JIT logger's aggregation values, TorchScript's IR and futures
    "torch": ("TYPE_CHECKING", "USE_GLOBAL_DEPS", "USE_RTLD_GLOBAL_WITH_LIBTORCH", "AVG",
              "SUM", "import_ir_module", "import_ir_module_from_buffer", "parse_ir",
              "parse_schema", "parse_type_comment", "merge_type_from_type_comment",
              "unify_type_list", "fork", "wait"),
    # deprecated re-exports of torch.ao.nn (quantization); a helper of the module constructors
    "torch.nn": ("intrinsic", "qat", "quantizable", "quantized", "factory_kwargs"),
}

#: Names a namespace's filter would drop but a program uses.
_KEPT: Dict[str, Tuple[str, ...]] = {
    "torch": ("newaxis",),
    "torch.distributed": ("default_pg_timeout",),
}


def _quantization(name: str) -> bool:
    """Names of torch's quantized tensors, left out: NumPy has no quantized arrays."""
    return ("quant" in name or name.startswith(("q_", "qint", "quint"))
            or name in ("int_repr", "qscheme", "choose_qparams_optimized"))


def _kind(obj: Any) -> str:
    """The kind the page shows for an object: module, class, function, dtype or attribute."""
    if isinstance(obj, types.ModuleType):
        return "module"
    if isinstance(obj, type):
        return "class"
    if type(obj).__name__ == "dtype" and type(obj).__module__ in ("torch", "mpitensor.dtypes"):
        return "dtype"
    if callable(obj):
        return "function"
    return "attribute"


def _owned(name: str, obj: Any, namespace: str, root: str) -> bool:
    """Whether ``obj`` belongs in ``namespace``'s list rather than being an import it uses.

    Modules count when they are the namespace's children; classes when defined under the
    namespace (or in the C extension); functions when defined anywhere in the package (torch's
    C functions report ``torch`` as their module), minus dispatch helpers; other values when
    they are numbers or of the package's own types.
    """
    if isinstance(obj, types.ModuleType):
        return obj.__name__ == f"{namespace}.{name}"
    if isinstance(obj, type):
        module = obj.__module__ or ""
        return (module == namespace or module.startswith(namespace + ".")
                or module.startswith(root + "._C"))
    if callable(obj):
        module = getattr(obj, "__module__", None) or ""
        if module in _NOT_API_MODULES or name.startswith("has_torch_function"):
            return False
        return module == root or module.startswith(root + ".")
    if isinstance(obj, bool):
        return False  # build flags (torch.has_mkl, TYPE_CHECKING)
    if isinstance(obj, (int, float)):
        return True  # torch.pi, torch.inf
    module = type(obj).__module__ or ""
    return (module == root or module.startswith(root + ".")) and module not in _NOT_API_MODULES


def public_names(obj: Any, namespace: str, root: str, use_all: bool = True) -> Dict[str, str]:
    """A module's or class's public names with their kinds: the module's ``__all__`` where it
    has one (and ``use_all``), else what :func:`_owned` keeps of ``dir()``; every public
    attribute of a class.

    Args:
        obj: the module or class.
        namespace: its dotted path (``torch.nn``, ``mpitensor.nn``).
        root: the package, ``torch`` or ``mpitensor``.
        use_all: whether to trust ``__all__``.

    Returns:
        ``{name: kind}``, sorted by name.
    """
    if isinstance(obj, type):
        return {n: _member_kind(obj, n) for n in sorted(dir(obj)) if not n.startswith("_")}
    listed = getattr(obj, "__all__", None) if use_all else None
    out: Dict[str, str] = {}
    for name in sorted(set(listed if listed is not None else dir(obj))):
        if name.startswith("_"):
            continue
        try:
            value = getattr(obj, name)
        except AttributeError:
            continue
        if listed is None and not _owned(name, value, namespace, root):
            continue
        out[name] = _kind(value)
    return out


def _member_kind(cls: type, name: str) -> str:
    """``method`` for a function of a class, ``property`` for a data attribute (descriptor or
    plain value)."""
    static = inspect.getattr_static(cls, name)
    if isinstance(static, (staticmethod, classmethod)) or inspect.isroutine(static):
        return "method"
    return "property"


def _all_public(obj: Any) -> List[str]:
    """Every public name ``dir()`` shows, filtered or not."""
    return sorted(n for n in dir(obj) if not n.startswith("_"))


def _torch_filter(namespace: str, names: Dict[str, str], obj: Any) -> Dict[str, str]:
    """Drop the namespace-specific noise from torch's names (see the constants above)."""
    dropped = set(_DROPPED.get(namespace, ()))
    out = {}
    for name, kind in names.items():
        if name in dropped or name.endswith(("Storage", "StorageBase")) or _quantization(name):
            continue  # storages: torch's memory internals, not touched by programs
        if namespace == "torch":
            value = getattr(obj, name)
            if kind == "class" and type(value).__name__ == "pybind11_type":
                continue  # TorchScript IR and other C++ bindings
            if kind == "function" and (name.startswith(_TORCH_KERNEL_PREFIXES)
                                       or name.endswith("_copy")):
                continue  # kernels; the *_copy variants of views are for compilers
            if kind == "function" and name.endswith("_") and name[:-1] in names:
                continue  # torch.abs_: undocumented in-place twin of torch.abs
            if type(value).__name__ == "qscheme":
                continue  # quantization schemes (torch.per_tensor_affine, ...)
        out[name] = kind
    for name in _KEPT.get(namespace, ()):
        out[name] = _kind(getattr(obj, name))
    return dict(sorted(out.items()))


def _cudnn_names(module: Any) -> Dict[str, str]:
    """torch.backends.cudnn is a module object whose flags are properties of its class and
    whose functions live in the module it wraps (``.m``)."""
    names = {n: "attribute" for n, v in vars(type(module)).items()
             if not n.startswith("_") and not callable(v)}
    inner = module.m
    names.update({n: "function" for n, v in vars(inner).items()
                  if not n.startswith("_") and inspect.isfunction(v)
                  and v.__module__ == inner.__name__})
    return dict(sorted(names.items()))


def take_snapshot() -> Dict[str, Any]:
    """torch's names for every namespace in :data:`NAMESPACES` (imports torch).

    Returns:
        ``{"torch_version": ..., "namespaces": {ns: {"names": {name: kind}, "other": [...]}}}``
        where ``other`` holds the public names the filter left out (kept so that mpitensor's
        own extras are told apart from names torch has too).
    """
    import warnings

    import torch

    spaces: Dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated aliases warn when touched
        for namespace in NAMESPACES:
            if namespace == "torch.Tensor":
                obj: Any = torch.Tensor
            else:
                obj = importlib.import_module(namespace)
            if namespace == "torch.backends.cudnn":
                names = _cudnn_names(obj)
                seen = _all_public(obj.m) + _all_public(type(obj))
            else:
                found = public_names(obj, namespace, "torch", namespace not in _IGNORE_ALL)
                names = _torch_filter(namespace, found, obj)
                seen = _all_public(obj)
            other = sorted(set(n for n in seen if n not in names))
            spaces[namespace] = {"names": names, "other": other}
    return {"torch_version": torch.__version__.split("+")[0], "namespaces": spaces}


# ---------------------------------------------------------------------------------------------
# Step 2: the page (needs mpitensor only).
# ---------------------------------------------------------------------------------------------

#: What :func:`resolve` returns for a path that does not exist.
MISSING = object()


def resolve(path: str) -> Any:
    """The object at a dotted path such as ``mpitensor.nn.functional.relu``, importing
    submodules on the way, or :data:`MISSING` when some part does not exist.

    A module counts only when it is the package's own (``mpitensor.nn``, not a ``math`` that
    some module imported).

    Example:
        >>> resolve("mpitensor.nn.Linear") is not MISSING
        True
    """
    parts = path.split(".")
    obj: Any = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            if not isinstance(obj, types.ModuleType):
                return MISSING
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except ImportError:
                return MISSING
        if isinstance(obj, types.ModuleType) and not obj.__name__.startswith(parts[0]):
            return MISSING
    return obj


def _to_mpitensor(torch_path: str) -> str:
    return "mpitensor" + torch_path[len("torch"):]


def classify(snapshot: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Sort every snapshot name into supported / different / missing, and find extras.

    Raises:
        ValueError: a note in :data:`NOTES`, :data:`ELSEWHERE` or :data:`NAMESPACE_NOTES`
            names something the snapshot lacks, or no longer describes mpitensor.
    """
    spaces = snapshot["namespaces"]
    absent = [ns for ns in NAMESPACES if ns not in spaces]
    if absent:
        raise ValueError(f"namespaces not in {SNAPSHOT.name}: {absent}; take a new snapshot "
                         f"with torch installed: {SNAPSHOT_COMMAND}")
    known = {f"{ns}.{n}" for ns, space in spaces.items() for n in space["names"]}
    stale = [k for k in (*NOTES, *ELSEWHERE) if k not in known]
    stale += [k for k in NAMESPACE_NOTES if k not in spaces]
    if stale:
        raise ValueError(f"notes for names that are not in {SNAPSHOT.name}: {sorted(stale)}; "
                         f"fix the note dicts in tools/porting_table.py")
    out: Dict[str, Dict[str, Any]] = {}
    problems: List[str] = []
    for ns in NAMESPACES:
        space = spaces[ns]
        mt_ns = resolve(_to_mpitensor(ns))
        status: Dict[str, Dict[str, str]] = {"supported": {}, "different": {}, "missing": {}}
        notes: Dict[str, str] = {}
        for name, kind in space["names"].items():
            full = f"{ns}.{name}"
            here = mt_ns is not MISSING and resolve(f"{_to_mpitensor(ns)}.{name}") is not MISSING
            if full in ELSEWHERE:
                target, note = ELSEWHERE[full]
                if here:
                    problems.append(f"{full} now resolves at torch's path: move its "
                                    f"ELSEWHERE entry to NOTES (or drop it)")
                elif resolve(target) is MISSING:
                    problems.append(f"ELSEWHERE[{full!r}] names {target}, which does not exist")
                status["different"][name] = kind
                notes[name] = f"at `{target}`: {note}"
            elif full in NOTES:
                if not here:
                    problems.append(f"NOTES[{full!r}]: {_to_mpitensor(full)} does not exist")
                status["different"][name] = kind
                notes[name] = NOTES[full]
            else:
                status["supported" if here else "missing"][name] = kind
        extras: Dict[str, str] = {}
        if mt_ns is not MISSING:
            theirs = set(space["names"]) | set(space["other"])
            mine = public_names(mt_ns, _to_mpitensor(ns), "mpitensor")
            extras = {n: k for n, k in mine.items() if n not in theirs}
        out[ns] = {**status, "notes": notes, "extras": extras,
                   "present": mt_ns is not MISSING}
    if problems:
        raise ValueError("stale notes in tools/porting_table.py:\n  " + "\n  ".join(problems))
    return out


_KIND_ORDER = ("module", "class", "function", "method", "property", "dtype", "attribute")
_KIND_PLURAL = {"class": "classes", "property": "properties"}


def _name_list(names: Dict[str, str]) -> List[str]:
    """A compact markdown list: one bullet per kind, the names comma-separated and wrapped."""
    lines: List[str] = []
    by_kind: Dict[str, List[str]] = {}
    for name, kind in names.items():
        by_kind.setdefault(kind, []).append(name)
    for kind in sorted(by_kind, key=_KIND_ORDER.index):
        items = sorted(by_kind[kind])
        label = _KIND_PLURAL.get(kind, kind + "s")
        text = f"- {label} ({len(items)}): " + ", ".join(f"`{n}`" for n in items)
        lines += textwrap.wrap(text, width=100, subsequent_indent="  ",
                               break_long_words=False, break_on_hyphens=False)
    return lines


def _anchor(ns: str) -> str:
    return ns.replace(".", "").lower()


def render(snapshot: Dict[str, Any], table: Dict[str, Dict[str, Any]]) -> str:
    """The markdown page, deterministic (sorted, no dates) so that a test can compare it."""
    version = snapshot["torch_version"]
    out = [
        "# Porting from PyTorch: which torch names mpitensor has",
        "",
        "<!-- Generated by tools/porting_table.py; do not edit by hand. -->",
        "",
        f"Every public name of the torch {version} namespaces below, looked up at the same path",
        "in mpitensor (`torch.nn.functional.relu` → `mpitensor.nn.functional.relu`), so that",
        "`import mpitensor as torch` finds it:",
        "",
        "- **supported**: the name exists at the same path. It says nothing about every argument:",
        "  the other pages and the docstrings say what each function accepts;",
        "- **different**: it exists, and behaves otherwise in a way worth knowing before porting",
        "  (the note says how), or mpitensor has it at another path;",
        "- **missing**: mpitensor has no such name (yet).",
        "",
        "To see what one program needs before porting it, run `python -m mpitensor.porting",
        "train.py` (files or folders): it reads the program without running it, follows its",
        "torch imports and aliases, and lists each torch name it uses that is missing here or",
        "different (with the note below), by file and line; its exit status is 1 when a name is",
        "missing. Methods called on tensors cannot be resolved without running the program: it",
        "lists apart the attribute names that torch's Tensor has and mpitensor's lacks.",
        "",
        "Generated, never edited by hand: after a change to mpitensor's API, run",
        "",
        "```",
        COMMAND,
        "```",
        "",
        "and commit the result; `tests/test_porting_doc.py` fails while this page is stale. The",
        "lists of torch's names come from `mpitensor/_torch_names.json`, taken with torch",
        "installed by",
        f"`{SNAPSHOT_COMMAND}`: a module's `__all__` where it has one, else what",
        "`dir()` shows minus imports, typing helpers, storages, TorchScript bindings, backend",
        "kernels (`cudnn_*`, `mkldnn_*`, ...), quantization and undocumented in-place twins",
        "(`torch.abs_`). The notes are kept in `tools/porting_table.py`; a note whose name",
        "disappears makes the generator fail.",
        "",
        "## Summary",
        "",
        "| namespace | torch names | supported | different | missing | covered | mpitensor only |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    totals = [0, 0, 0, 0, 0]
    for ns in NAMESPACES:
        row = table[ns]
        counts = [len(row["supported"]), len(row["different"]), len(row["missing"]),
                  len(row["extras"])]
        total = counts[0] + counts[1] + counts[2]
        covered = f"{100 * (counts[0] + counts[1]) // total} %" if total else "–"
        out.append(f"| [`{ns}`](#{_anchor(ns)}) | {total} | {counts[0]} | {counts[1]} | "
                   f"{counts[2]} | {covered} | {counts[3]} |")
        for i, value in enumerate([total, *counts]):
            totals[i] += value
    covered = f"{100 * (totals[1] + totals[2]) // totals[0]} %"
    out.append(f"| all | {totals[0]} | {totals[1]} | {totals[2]} | {totals[3]} | {covered} | "
               f"{totals[4]} |")
    out.append("")
    out.append("\"covered\" is supported + different, rounded down.")
    for ns in NAMESPACES:
        row = table[ns]
        out += ["", f"## `{ns}`", ""]
        if not row["present"]:
            out += [f"mpitensor has no `{_to_mpitensor(ns)}`.", ""]
        if ns in NAMESPACE_NOTES:
            out += textwrap.wrap(NAMESPACE_NOTES[ns], width=100, break_long_words=False,
                                 break_on_hyphens=False)
            out.append("")
        if row["different"]:
            out += [f"**Different** ({len(row['different'])})", "", "| name | how |", "|---|---|"]
            out += [f"| `{name}` | {row['notes'][name]} |" for name in sorted(row["different"])]
            out.append("")
        for title, key in (("Missing", "missing"), ("Supported", "supported"),
                           ("mpitensor only", "extras")):
            if row[key]:
                out += [f"**{title}** ({len(row[key])})", ""]
                out += _name_list(row[key])
                out.append("")
        while out[-1] == "":
            out.pop()
    out += ["", *CORPUS.strip("\n").splitlines()]
    return "\n".join(out) + "\n"


#: What the checker found in public programs: a measurement, written here by hand from the
#: run it names (the corpus lives outside the repository, so no test can redo it).
CORPUS = """
## Public programs checked

Measured 2026-11-28 at commit af97f0b with `python -m mpitensor.porting FILES... --summary
--quiet` over 216 public programs that import torch (files with `import torch` or `from torch`,
tests and setup files left out), kept outside the repository (the first measurement, at
65f1b6c: 157 of 216, 73 %):

| source | kind | programs | no missing name |
|---|---|---:|---:|
| pytorch/examples | official examples | 81 | 63 |
| yunjey/pytorch-tutorial | tutorial repository | 6 | 6 |
| rasbt/LLMs-from-scratch | book code | 65 | 65 |
| pytorch/ignite `examples/` | another library's examples | 49 | 49 |
| horovod/horovod `examples/` | another library's examples | 13 | 13 |
| d2l-ai/d2l-en | book code | 2 | 2 |
| all | | 216 | 198 (91.7 %) |

The 18 programs still missing a name, by cause: tensor parallelism, FSDP and DTensor
(`torch.distributed.tensor.parallel`, `torch.distributed.fsdp`, `torch.distributed._tensor`,
`torch.distributed.checkpoint.state_dict`: 14 programs of pytorch/examples' `distributed/FSDP`,
`FSDP2` and `tensor_parallelism`: then still to come, built since, see
[sharding.md](sharding.md) and [fsdp.md](fsdp.md)), `torch.profiler` /
`torch.autograd.profiler` (1), `torch.classes` with a C++ extension (1), and
`torch.hub.download_url_to_file` / `torch.onnx._export` (fast_neural_style's downloader and
exporter, 2). The names most often missing, with the number of programs that use each: `torch.distributed.tensor.parallel.ColwiseParallel` 3,
`torch.distributed.tensor.parallel.RowwiseParallel` 3,
`torch.distributed.tensor.parallel.parallelize_module` 3, `torch.distributed.fsdp.FSDPModule` 2,
`torch.distributed.fsdp.fully_shard` 2, `torch.distributed._tensor.Shard` 2,
`torch.distributed._tensor.device_mesh.init_device_mesh` 2, `torch.distributed.fsdp.MixedPrecision`
2, `torch.distributed.fsdp.ShardingStrategy` 2, `torch.distributed.fsdp.FullyShardedDataParallel`
2, `torch.distributed.fsdp.FullStateDictConfig` 2, `torch.distributed.fsdp.StateDictType` 2,
`torch.profiler.record_function` 1, `torch.autograd.profiler.profile` 1,
`torch.classes.load_library` 1, `torch.distributed.tensor.DTensor` 1.

## Public programs run

45 programs of the corpus (pytorch/examples 20, yunjey/pytorch-tutorial 5,
rasbt/LLMs-from-scratch 10, d2l-ai/d2l-en 10) were run end to end on 2026-11-28 at commit
5f2da4c, under torch and under `import mpitensor as torch` (the only changes: data made in
memory, sizes and epochs cut, the import lines), on the CPU, one thread, in a scratch folder
outside the repository. **44 of 45 ran to the end under mpitensor.** The 45th
(LLMs-from-scratch `01_opt_single_gpu.py`) ran under mpitensor in 31 s; torch's
`torch.compile` of it did not finish within 240 s on 2 cores, so it has no comparison.

- 11 printed the same result as torch (fx examples, `mnist_forward_forward`, the GPT models
  and their KV caches, d2l's parameter and autograd chapters); 5 more fx examples print no
  result and exit 0 under both.
- 21 trained to within 25 % of torch's final loss or accuracy (MNIST, Hogwild!, DCGAN, VAE,
  actor-critic, GCN, GAT, GPT training, d2l's chapters, yunjey's regressions and CNN).
- 7 trained to other numbers (`mnist_rnn`, `time_sequence_prediction`, `regression`,
  `super_resolution`, `reinforce`, yunjey's bidirectional RNN, d2l's weight decay and batch
  norm): torch and mpitensor draw other random numbers from one seed, so short trainings start
  from other weights. With torch's weights copied in, the LSTM, bidirectional LSTM + Adam and
  super-resolution steps agree with torch to float32 rounding (relative 5e-6).
- First run, at 3b67cdb/b2ee04b: 37 of 45; the 7 d2l failures were NumPy's `axis=` keyword
  (`x.argmax(axis=1)`, 5 programs) and `.data` of a lazy parameter before its first forward
  (2), both fixed in this round.

Not runnable here, so not counted: programs that need a package built on real torch (ignite,
horovod, transformers), downloaded pretrained weights or torchvision's model zoo, CUDA/NCCL only
paths (the DDP tutorial series), torchtext/spacy, and two files missing from the snapshot.
"""


def generate(snapshot_path: Path = SNAPSHOT) -> str:
    """The page for the committed snapshot and the mpitensor that imports here (no torch)."""
    snapshot = json.loads(snapshot_path.read_text(encoding="utf-8"))
    return render(snapshot, classify(snapshot))


def main(argv: Optional[Iterable[str]] = None) -> int:
    """Command line: ``--snapshot`` (needs torch), default (writes the page), ``--check``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--snapshot", action="store_true",
                      help=f"write {SNAPSHOT.relative_to(ROOT)} from the installed torch")
    mode.add_argument("--check", action="store_true",
                      help=f"exit 1 if {DOC.relative_to(ROOT)} is not what would be written")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.snapshot:
        data = take_snapshot()
        SNAPSHOT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {SNAPSHOT.relative_to(ROOT)} (torch {data['torch_version']})")
        return 0
    try:
        page = generate()
    except ValueError as exc:
        print(f"porting_table: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if DOC.read_text(encoding="utf-8") == page:
            return 0
        print(f"{DOC.relative_to(ROOT)} is stale: run {COMMAND}", file=sys.stderr)
        return 1
    DOC.write_text(page, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
