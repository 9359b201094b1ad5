"""DDP and ``fully_shard`` training steps through MPI and through node-local shared memory,
in one run (issue 29's "step times at 2 and 4 ranks, before and after").

Usage (from the repository root)::

    python benchmarks/step_times.py                  # 2 and 4 ranks; docs/benchmarks-steps.md
    python benchmarks/step_times.py --ranks 2 --quick --out-md ''   # a small model, seconds
    python benchmarks/step_times.py --at HEAD        # mpitensor/ as committed, not as edited
    mpiexec -n 4 python benchmarks/step_times.py     # one job: its table on stdout

Without a launcher the script is a driver: for each ``--ranks`` count it starts one
``mpiexec -n N`` job of itself (bounded by ``--timeout`` seconds), then writes the Markdown
report (``--out-md``, default ``docs/benchmarks-steps.md``; ``''`` prints it only) and, with
``--json PATH``, every figure. Under ``mpiexec`` (or with ``--worker``) it is that job.
``--at REV`` times mpitensor/ as committed at REV: the driver writes that revision's
``mpitensor/`` (``git archive``) to a temporary directory, with the working tree's built
extensions whose C source REV has unchanged, and the jobs import it from there (each job
reports which ``mpitensor`` it imported, and the driver checks it).

The model is ``benchmarks/sharded.py``'s (imported, not copied): a 4-layer MLP of ``--width``
units (2240: 20.1M float32 parameters), Adam, ``--batch`` random samples per rank and step;
each rank runs one BLAS/OpenMP thread. In one job, for DDP and then for ``fully_shard``, three
configurations are built side by side and timed in turn:

* **MPI** ("before"): the group made with ``MPITENSOR_SHM_COLLECTIVES=off`` and DDP with
  ``MPITENSOR_NODE_REDUCE=off``: every collective is MPI's;
* **shm** ("after"): both switches ``auto``, the default: calls the group's measured cost model
  sends to the shared-memory engine (``mpitensor/distributed/backends/mpi/shm_coll.py``) go
  there, and DDP's buckets meet in shared memory where the ranks outnumber the cores and the
  buckets are small (docs/ddp.md);
* **local**: the same model, unwrapped, on the same batch, on every rank at once: the step
  with no communication at all;
* **forced** (with ``--forced``): both switches ``on``: the engine for every call it can take,
  whatever the cost model would choose (which, measured under load, may keep calls on MPI).

Both switches are read when a group (a DDP) is made, so each configuration gets its own group
(``new_group`` for DDP, ``init_device_mesh`` for ``fully_shard``), made with the switches set
for it. After ``--warmup`` untimed steps each (the shm group's cost model is measured at its
first large call, in the warm-up), ``--reps`` repetitions of ``--steps`` steps follow, the
three configurations in turn, the order rotated every repetition; a repetition's step time is
the slowest rank's mean. Reported: the median step of each, the **paired ratio** shm / MPI (the
median over repetitions of the ratio of the two times taken in that repetition, which cancels
most of the load that comes and goes; with its quartiles), and the **communication share** of
each step,
``1 - local / step`` paired the same way: the time the step spends beyond its own arithmetic
(for ``fully_shard`` the local step also runs Adam over the whole model, N times the sharded
step's optimizer work, so its share is a lower bound). DDP rows add ``comm_stats``' own
figure: the wait at the end of backward, per step.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Dict, List  # noqa: E402
from unittest import mock  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SWITCHES = ("MPITENSOR_SHM_COLLECTIVES", "MPITENSOR_NODE_REDUCE")
CONFIGS = ("local", "MPI", "shm")  # the timed configurations, in their first order
SETTING = {"MPI": "off", "shm": "auto", "forced": "on"}
LAUNCHED = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def _args(argv: "List[str] | None" = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,4", help="driver: the rank counts, comma-separated")
    p.add_argument("--width", type=int, default=2240)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=2, help="steps per repetition")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="width 512, 2 reps of 1 step")
    p.add_argument("--forced", action="store_true", help="also time a group made with both "
                   "switches on: the engine for every call it can take, whatever the cost "
                   "model would choose")
    p.add_argument("--timeout", type=float, default=600.0, help="driver: seconds per job")
    p.add_argument("--out-md", default=str(ROOT / "docs" / "benchmarks-steps.md"),
                   help="driver: the report ('' prints it only)")
    p.add_argument("--json", help="write every figure to this file")
    p.add_argument("--at", default="", help="driver: time mpitensor/ as committed at this "
                   "revision (a snapshot; default: the working tree as it is)")
    p.add_argument("--note", default="", help="driver: a line for the report's setup (say, "
                   "what else ran on the machine)")
    p.add_argument("--worker", action="store_true", help="be one job (implied under mpiexec)")
    a = p.parse_args(argv)
    if a.quick:
        a.width, a.reps, a.steps, a.warmup = 512, 2, 1, 1
    a.worker = a.worker or any(k in os.environ for k in LAUNCHED)
    return a


# ---------------------------------------------------------------- one job (every rank)

def _switched(setting: str) -> Any:
    """Both switches set to ``setting`` while a group and its model are made, then restored."""
    return mock.patch.dict(os.environ, {k: setting for k in SWITCHES})


def _segment(group: Any, buckets: "List[int] | None" = None) -> str:
    """What the group's shared-memory engine took, as far as the group shows it (with DDP's
    bucket sizes: how many of them reach the reductions' threshold)."""
    eng = getattr(group, "shm", None)
    th = getattr(eng, "thresholds", None)
    if not isinstance(th, dict):
        return "no segment" if eng is False else "not made"
    red = max(th.get("reduce", 1 << 62), getattr(group, "shm_ar_min", 0))

    def size(n: int) -> str:
        return "never" if n >= 1 << 60 else f"≥ {n / 2**20:.2f} MiB"

    took = (f" ({sum(b >= red for b in buckets)} of {len(buckets)} buckets)"
            if buckets else "")
    return f"reductions {size(red)}{took}, gathers {size(th.get('move', 1 << 62))}"


def _configs(S: Any, kind: str, width: int, names: "tuple[str, ...]") -> Dict[str, Dict[str, Any]]:
    """The configurations ``names`` of ``kind``: model, optimizer and (but local) group."""
    from functools import partial

    import mpitensor.distributed as dist
    from mpitensor.distributed.device_mesh import init_device_mesh

    n = dist.get_world_size()
    out: Dict[str, Dict[str, Any]] = {}
    api = S._api()
    model, opt, _ = S._build(dict(api, DDP=lambda m: m), "DDP", width)  # unwrapped
    out["local"] = {"model": model, "opt": opt, "group": None}
    for name in names[1:]:
        with _switched(SETTING[name]):
            if kind == "DDP":
                group = dist.new_group(list(range(n)))
                kw = dict(api, DDP=partial(api["DDP"], process_group=group))
            else:
                mesh = init_device_mesh("cpu", (n,))
                group = mesh.get_group()
                kw = dict(api, fully_shard=partial(api["fully_shard"], mesh=mesh))
            model, opt, _ = S._build(kw, kind, width)
        out[name] = {"model": model, "opt": opt, "group": group}
    return out


def _stepper(model: Any, opt: Any, x: Any, y: Any) -> Callable[[], None]:
    def step() -> None:
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
    return step


def _paired(num: List[float], den: List[float], f: Callable[[float, float], float]) -> float:
    return statistics.median(f(a, b) for a, b in zip(num, den))


def _ratio(num: List[float], den: List[float]) -> List[float]:
    """The paired ratio ``num / den``: its median and quartiles over the repetitions."""
    r = [a / b for a, b in zip(num, den)]
    q = statistics.quantiles(r, n=4, method="inclusive") if len(r) > 1 else [r[0]] * 3
    return [statistics.median(r), q[0], q[2]]


def _timed(steps: Dict[str, Callable[[], None]], a: argparse.Namespace) -> Dict[str, List[float]]:
    """Per configuration, each repetition's step time (the slowest rank's mean), the
    configurations in turn, their order rotated every repetition."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    names = list(steps)
    times: Dict[str, List[float]] = {c: [] for c in names}
    for r in range(a.reps):
        k = r % len(names)
        for c in names[k:] + names[:k]:
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                steps[c]()
            times[c].append(comm.allreduce((time.perf_counter() - t0) / a.steps, op=MPI.MAX))
    return times


def _time_kind(S: Any, kind: str, a: argparse.Namespace, x: Any, y: Any) -> Dict[str, Any]:
    """Build ``kind``'s configurations, time them in turn, and summarise."""
    from mpi4py import MPI

    names = CONFIGS + ("forced",) * a.forced
    cfg = _configs(S, kind, a.width, names)
    steps = {c: _stepper(cfg[c]["model"], cfg[c]["opt"], x, y) for c in names}
    for c in names:
        with _switched(SETTING.get(c, "auto")):
            for _ in range(a.warmup):
                steps[c]()
    ddp = {c: cfg[c]["model"] for c in names[1:] if hasattr(cfg[c]["model"], "comm_stats")}
    for m in ddp.values():
        m.comm_stats.reset()
    times = _timed(steps, a)
    row: Dict[str, Any] = {"times_s": times,
                           "median_s": {c: statistics.median(times[c]) for c in names},
                           "over_mpi": {c: _ratio(times[c], times["MPI"]) for c in names[2:]}}
    row["comm_share"] = {c: _paired(times["local"], times[c], lambda lo, t: 1 - lo / t)
                         for c in names[1:]}
    buckets = None
    if ddp:
        row["ddp_wait_s"] = {c: MPI.COMM_WORLD.allreduce(
            m.comm_stats.total_wait_s / (a.reps * a.steps), op=MPI.MAX) for c, m in ddp.items()}
        row["node_reduce"] = {c: m.reducer.node is not None for c, m in ddp.items()}
        # buckets that meet in the DDP's own segment never call the group's all_reduce
        buckets = None if row["node_reduce"]["shm"] else ddp["shm"].comm_stats.bucket_bytes
    row["segment"] = _segment(cfg["shm"]["group"], buckets)
    return row


def _job(a: argparse.Namespace) -> Dict[str, Any]:
    """One job: DDP, then fully_shard (the previous configurations freed in between)."""
    import gc

    sys.path.insert(0, str(HERE))
    import numpy as np
    import sharded as S  # noqa: N812 - the model's module

    import mpitensor as mt
    import mpitensor.distributed as dist

    dist.init_process_group("mpi")
    n, rank = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(rank)
    x = mt.from_numpy(rng.standard_normal((a.batch, a.width)).astype(np.float32))
    y = mt.from_numpy(rng.standard_normal((a.batch, a.width)).astype(np.float32))
    out: Dict[str, Any] = {"ranks": n, "width": a.width, "batch": a.batch,
                           "params": 4 * (a.width * a.width + a.width), "reps": a.reps,
                           "steps": a.steps, "warmup": a.warmup, "kinds": {},
                           "mpitensor": str(Path(mt.__file__).resolve().parent)}
    for kind in ("DDP", "fully_shard"):
        out["kinds"][kind] = _time_kind(S, kind, a, x, y)
        gc.collect()
    dist.destroy_process_group()
    return out


# ---------------------------------------------------------------- the report

def _head(names: List[str]) -> str:
    cols = ["ranks", "training", "local step (ms)", "MPI step (ms)"]
    for c in names:
        cols += [f"{c} step (ms)", f"{c} / MPI (paired; quartiles)"]
    cols += [f"comm. share {c}" for c in ["MPI"] + names]
    cols += ["DDP wait/step " + ", ".join(["MPI"] + names) + " (ms)", "shm group's segment"]
    return "| " + " | ".join(cols) + " |"


def _rows(job: Dict[str, Any], names: List[str]) -> List[str]:
    lines = []
    for kind, r in job["kinds"].items():
        med, share = r["median_s"], r["comm_share"]
        cells = [str(job["ranks"]), kind, f"{med['local'] * 1e3:.1f}", f"{med['MPI'] * 1e3:.1f}"]
        for c in names:
            m, q1, q3 = r["over_mpi"][c]
            cells += [f"{med[c] * 1e3:.1f}", f"{m:.3f} ({q1:.2f}–{q3:.2f})"]
        cells += [f"{share[c]:.0%}" for c in ["MPI"] + names]
        cells.append(", ".join(f"{r['ddp_wait_s'][c] * 1e3:.1f}" for c in ["MPI"] + names)
                     if "ddp_wait_s" in r else "")
        cells.append(r["segment"] + ("; DDP's buckets meet in its own segment"
                                     if r.get("node_reduce", {}).get("shm") else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _table(jobs: List[Dict[str, Any]]) -> str:
    names = list(next(iter(jobs[0]["kinds"].values()))["over_mpi"])
    head = _head(names)
    return "\n".join([head, "|" + "---|" * (head.count(" | ") + 1)]
                      + [line for job in jobs for line in _rows(job, names)])


def _sh(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                              timeout=30).stdout.rstrip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _machine() -> Dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                     "")
    dirty = _sh("git", "status", "--porcelain", "--", "mpitensor").splitlines()
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": _sh("git", "rev-parse", "--short", "HEAD"),
            "uncommitted": [ln[3:] for ln in dirty], "cores": os.cpu_count(), "cpu": model,
            "python": platform.python_version(), "load_before": os.getloadavg()}


def _markdown(jobs: List[Dict[str, Any]], meta: Dict[str, Any], argv: List[str],
              note: str) -> str:
    j = jobs[0]
    dirty = (f"; uncommitted changes under mpitensor/ in the tree at the time: "
             f"{', '.join(meta['uncommitted'])}" if meta["uncommitted"] else "")
    load = " / ".join(" ".join(f"{v:.2f}" for v in meta[k]) for k in ("load_before", "load_after"))
    cores = meta["cores"] or 1
    over = [str(job["ranks"]) for job in jobs if job["ranks"] > cores]
    caveat = [f"> The load average was {meta['load_before'][0]:.1f} on {cores} cores before "
              "the run: other jobs shared the machine, so every absolute number here is noisy "
              "and single repetitions swing widely; the paired ratios are the meaningful part, "
              "and only roughly.", ""] if meta["load_before"][0] >= 0.5 * cores else []
    return "\n".join([
        "# Training steps through MPI and through shared memory (issue 29)", "",
        "Generated by `benchmarks/step_times.py`; do not edit by hand (rerun it). Each job "
        "times DDP and `fully_shard` steps of one model three ways, in turn, repetition by "
        "repetition: **MPI** (`MPITENSOR_SHM_COLLECTIVES=off`, `MPITENSOR_NODE_REDUCE=off`: "
        "the plain MPI path, *before*), **shm** (both `auto`, the default, *after*), "
        "**local** (the same model unwrapped: no communication) and, with `--forced`, "
        "**forced** (both `on`: the segment wherever it can be used). The ratios and the "
        "communication shares are paired: the median over repetitions of figures taken within "
        "one repetition. See the script's docstring for the method.", ""] + caveat + [
        "## Setup", "",
        f"- Date: {meta['date']}; commit `{meta['commit']}`{dirty}" + (
            f" (mpitensor/ as committed there, from a snapshot; built extensions copied: "
            f"{', '.join(meta['extensions']) or 'none'})" if "extensions" in meta else ""),
        f"- Command: `{shlex.join(['python', 'benchmarks/step_times.py'] + argv)}`",
        f"- Machine: {meta['cores']} cores (`os.cpu_count()`), {meta['cpu']}; load average "
        f"{load} (before / after); Python {meta['python']}"
        + (f"; {', '.join(over)} ranks oversubscribe the cores" if over else ""),
        f"- Model: `benchmarks/sharded.py`'s 4-layer MLP, width {j['width']} "
        f"({j['params'] / 1e6:.1f}M float32 parameters; a layer's weight "
        f"{j['width'] ** 2 * 4 / 2**20:.1f} MiB), Adam, batch {j['batch']} per rank; "
        f"one BLAS thread per rank",
        f"- Timing: {j['warmup']} warm-up steps, then {j['reps']} repetitions of {j['steps']} "
        f"steps per configuration (the slowest rank's mean step; medians); total "
        f"{meta['total_s']:.0f} s"] + ([f"- Note: {note}"] if note else []) + ["",
        "## Results", "",
        _table(jobs), "",
        "*comm. share*: `1 - local / step`, paired (for `fully_shard` a lower bound: its local "
        "step runs Adam over the whole model). *DDP wait/step*: `comm_stats.total_wait_s` per "
        "step, the slowest rank's (the wait at the end of backward; a bucket whose all-reduce "
        "completes as it is launched, as a call through the segment may, spends its time "
        "inside backward instead, so a small wait alone says little). *segment*: the sizes from "
        "which the shm group's cost model, measured at its first large call, sends calls "
        "through the shared segment (DDP: how many of its gradient buckets reach it).", ""])


def _launch(n: int, a: argparse.Namespace, argv: List[str],
            tree: "Path | None") -> Dict[str, Any]:
    """One ``mpiexec -n n`` job of this script (importing mpitensor from ``tree`` where
    given); its figures (rank 0's JSON)."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_"))}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="step-times-") as d:
        out = os.path.join(d, "job.json")
        cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(n), sys.executable,
               str(Path(__file__).resolve()), "--worker", "--json", out] + argv
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, start_new_session=True)
        try:
            rc = proc.wait(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise SystemExit(f"step_times: the {n}-rank job ran past --timeout {a.timeout:.0f} "
                             "s and was killed; raise --timeout or lower --reps/--width") from None
        if rc != 0:
            raise SystemExit(f"step_times: the {n}-rank job exited {rc}")
        with open(out) as f:
            job = json.load(f)
    want = (tree or ROOT) / "mpitensor"
    if Path(job["mpitensor"]) != want.resolve():
        raise SystemExit(f"step_times: the job imported {job['mpitensor']}, not {want}")
    return job


def _snapshot(rev: str, into: Path) -> "tuple[str, List[str]]":
    """``rev``'s mpitensor/ written into ``into``, with the working tree's built extensions
    whose C source ``rev`` has unchanged (the others are left out: their pure-Python paths
    run); the revision's short name and the extensions copied."""
    sha = _sh("git", "rev-parse", "--short", "--verify", f"{rev}^{{commit}}")
    if not sha:
        raise SystemExit(f"step_times: --at {rev!r} names no commit of {ROOT}")
    tar = subprocess.run(["git", "archive", sha, "mpitensor"], cwd=ROOT, capture_output=True,
                         check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        # git's own archive; the "data" filter where this Python has it (3.8.17+, 3.11.4+)
        tf.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    copied = []
    for so in sorted(ROOT.glob("mpitensor/**/*.so")):
        src = so.with_name(so.name.split(".", 1)[0] + ".c").relative_to(ROOT)
        same = subprocess.run(["git", "diff", "--quiet", sha, "--", str(src)],
                              cwd=ROOT).returncode == 0
        if same and (into / src).exists():
            shutil.copy2(so, into / so.relative_to(ROOT))
            copied.append(str(so.relative_to(ROOT)))
    return sha, copied


def _drive(a: argparse.Namespace, argv: List[str]) -> None:
    meta = _machine()
    t0 = time.perf_counter()
    passed = _job_args(argv)
    with tempfile.TemporaryDirectory(prefix="step-times-tree-") as d:
        tree = None
        if a.at:
            tree = Path(d)
            meta["commit"], meta["extensions"] = _snapshot(a.at, tree)
            meta["uncommitted"] = []
        jobs = [_launch(int(n), a, passed, tree) for n in a.ranks.split(",") if n.strip()]
    meta["total_s"] = time.perf_counter() - t0
    meta["load_after"] = os.getloadavg()
    md = _markdown(jobs, meta, argv, a.note)
    print(md)
    if a.out_md:
        Path(a.out_md).write_text(md)
    if a.json:
        Path(a.json).write_text(json.dumps({"meta": meta, "jobs": jobs}, indent=1))


def _job_args(argv: List[str]) -> List[str]:
    """The driver's arguments a job takes (its own options dropped, with their values)."""
    own = {"--ranks", "--out-md", "--json", "--timeout", "--note", "--at"}
    out, skip = [], False
    for s in argv:
        if skip:
            skip = False
        elif s in own:
            skip = True
        elif s.split("=", 1)[0] not in own:
            out.append(s)
    return out


def main() -> None:
    argv = sys.argv[1:]
    a = _args(argv)
    if not a.worker:
        _drive(a, argv)
        return
    job = _job(a)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(_table([job]), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(job, indent=1))


if __name__ == "__main__":
    main()
