"""mpitensor.profiler: op counts equal to the calls made, nested record_function ranges,
the table's columns, Chrome traces, the schedule (against torch's on_trace_ready calls), and
the instrumentation gone once the profile ends."""

import collections
import gzip
import json
import os

import pytest

import mpitensor as mt
from mpitensor.profiler import (
    ProfilerAction,
    ProfilerActivity,
    profile,
    record_function,
    schedule,
    tensorboard_trace_handler,
)


def _model():
    mt.manual_seed(0)
    return mt.nn.Sequential(mt.nn.Linear(6, 8), mt.nn.ReLU(), mt.nn.Linear(8, 3))


def _graph_nodes(t):
    """The backward nodes under ``t``, counted by name (each node once)."""
    counts, seen, todo = collections.Counter(), set(), [t.grad_fn]
    while todo:
        n = todo.pop()
        if n is None or id(n) in seen or not hasattr(n, "name"):
            continue
        seen.add(id(n))
        counts[n.name()] += 1
        todo += [f for f, _ in n.next_functions]
    return counts


def test_forward_backward_counts_equal_calls():
    model, x = _model(), mt.randn(4, 6)
    steps = 3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            loss = mt.nn.functional.mse_loss(model(x), mt.zeros(4, 3))
            loss.backward()
    counts = {e.key: e.count for e in prof.key_averages()}
    assert counts["linear"] == 2 * steps
    assert counts["relu"] == steps
    assert counts["mse_loss"] == steps
    assert counts["zeros"] == steps
    for name, n in _graph_nodes(loss).items():  # one graph per step, the same each time
        assert counts[name] == n * steps, name
    assert prof.events().self_cpu_time_total > 0


def test_operators_and_function_forms_counted_once_each():
    a = mt.ones(3)
    with profile() as prof:
        b = a + 1
        b = b * a
        b = mt.exp(b)  # mpitensor.exp calls Tensor.exp: one call, counted once
        b += 2
        _ = b[0]
    counts = {e.key: e.count for e in prof.key_averages()}
    assert counts == {"add": 1, "mul": 1, "exp": 1, "add_": 1, "__getitem__": 1}


def test_record_function_ranges_nest_and_cover_children():
    with profile() as prof:
        with record_function("outer"):
            with record_function("inner"):
                mt.ones(50, 50) @ mt.ones(50, 50)
            mt.zeros(3).sum()

    @record_function("decorated")
    def f():
        return mt.ones(2)

    with profile() as prof2:
        f()
    by_name = {e.name: e for e in prof.events()}
    outer, inner = by_name["outer"], by_name["inner"]
    assert inner.cpu_parent is outer and by_name["matmul"].cpu_parent is inner
    assert by_name["sum"].cpu_parent is outer
    assert outer.start_ns <= inner.start_ns <= inner.end_ns <= outer.end_ns
    assert outer.cpu_time_total >= inner.cpu_time_total + by_name["sum"].cpu_time_total
    assert outer.self_cpu_time_total == pytest.approx(
        outer.cpu_time_total - sum(c.cpu_time_total for c in outer.cpu_children))
    assert [e.name for e in prof2.events()] == ["decorated", "ones"]
    assert prof2.events()[1].cpu_parent is prof2.events()[0]


def test_table_columns_sorting_and_limit():
    with profile(record_shapes=True, profile_memory=True) as prof:
        for _ in range(3):
            mt.ones(4, 5).sum()
        mt.zeros(2)
    table = prof.key_averages().table(sort_by="count", row_limit=1)
    lines = table.splitlines()
    for col in ("Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg",
                "CPU Mem", "Self CPU Mem", "# of Calls"):
        assert col in lines[1]
    rows = [ln for ln in lines[3:] if ln.strip() and not ln.startswith("-")]
    assert rows[0].split()[0] in ("ones", "sum") and rows[0].split()[-1] == "3"
    assert rows[1].startswith("Self CPU time total:")
    avg = {e.key: e for e in prof.key_averages()}
    assert avg["ones"].self_cpu_memory_usage == 3 * 4 * 5 * 4  # float32 outputs
    shaped = prof.key_averages(group_by_input_shape=True)
    assert "Input Shapes" in shaped.table().splitlines()[1]
    assert {str(e.input_shapes) for e in shaped if e.key == "sum"} == {"[[4, 5]]"}


def test_chrome_trace_is_valid_json_with_events(tmp_path):
    with profile(with_stack=True) as prof:
        with record_function("region"):
            mt.ones(3).relu()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    assert [(e["name"], e["ph"]) for e in events] == [("region", "X"), ("ones", "X"),
                                                     ("relu", "X")]
    region = events[0]
    for e in events[1:]:
        assert region["ts"] <= e["ts"] and e["ts"] + e["dur"] <= region["ts"] + region["dur"]
    assert events[0]["cat"] == "user_annotation" and events[1]["cat"] == "cpu_op"
    prof.export_stacks(str(tmp_path / "stacks.txt"))
    assert "relu" in (tmp_path / "stacks.txt").read_text()


def _drive(lib, sched, steps):
    calls = []
    with lib.profiler.profile(schedule=sched, on_trace_ready=lambda p: calls.append(
            sorted({e.key for e in p.key_averages()}))) as prof:
        for _ in range(steps):
            lib.ones(2).sum()
            prof.step()
    return calls


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns of warm-up-less schedules
@pytest.mark.parametrize("kw, steps", [
    (dict(wait=1, warmup=1, active=2, repeat=2), 10),
    (dict(wait=0, warmup=0, active=1, repeat=3), 5),
    (dict(wait=2, warmup=1, active=3, repeat=0, skip_first=1), 14),
    (dict(wait=1, warmup=0, active=2, repeat=1), 2),  # stops inside the active cycle
])
def test_schedule_calls_on_trace_ready_as_torch(kw, steps):
    torch = pytest.importorskip("torch")
    ours = _drive(mt, schedule(**kw), steps)
    theirs = _drive(torch, torch.profiler.schedule(**kw), steps)
    assert len(ours) == len(theirs)
    for keys in ours:
        assert "ones" in keys and "sum" in keys
        assert all(k.startswith("ProfilerStep#") or k in ("ones", "sum") for k in keys)
    s = schedule(**kw)
    ts = torch.profiler.schedule(**kw)
    assert [s(i).name for i in range(steps + 5)] == [ts(i).name for i in range(steps + 5)]


def test_recorded_steps_are_the_active_ones():
    sched = schedule(wait=1, warmup=1, active=2)
    seen = []
    with profile(schedule=sched, on_trace_ready=lambda p: seen.append(
            sorted(e.key for e in p.key_averages() if e.key.startswith("Profiler")))) as prof:
        for _ in range(4):
            prof.step()
    assert seen == [["ProfilerStep#2", "ProfilerStep#3"]]
    assert sched(3) == ProfilerAction.RECORD_AND_SAVE


def test_tensorboard_handler_writes_one_file_per_cycle(tmp_path):
    for gz in (False, True):
        out = tmp_path / f"tb{int(gz)}"
        with profile(schedule=schedule(wait=0, warmup=1, active=1, repeat=2),
                     on_trace_ready=tensorboard_trace_handler(str(out), "w0", gz)) as prof:
            for _ in range(5):
                mt.ones(1)
                prof.step()
        files = sorted(os.listdir(out))
        assert len(files) == 2 and all(f.startswith("w0.") for f in files)
        opener = gzip.open if gz else open
        with opener(out / files[0], "rt") as f:
            assert any(e["name"] == "ones" for e in json.load(f)["traceEvents"])


def test_instrumentation_is_removed_and_no_nesting():
    add, linear = mt.Tensor.__add__, mt.nn.functional.linear
    fn = mt.nn.functional.relu(mt.ones(1, requires_grad=True)).grad_fn.fn
    backward = vars(fn)["backward"]
    with profile():
        assert mt.Tensor.__add__ is not add and vars(fn)["backward"] is not backward
        with pytest.raises(RuntimeError, match="nest"):
            profile().start()
    assert mt.Tensor.__add__ is add and mt.nn.functional.linear is linear
    assert vars(fn)["backward"] is backward
    with record_function("idle"):  # no profile: records nothing, raises nothing
        pass


def test_autograd_profiler_alias_and_cuda_note():
    with mt.autograd.profiler.profile(use_cuda=True) as prof:
        mt.ones(2) + 1
    assert [e.key for e in prof.key_averages()] == ["ones", "add"]
    if not mt.cuda.is_available():
        assert "no device times" in prof.key_averages().table()
    with mt.autograd.profiler.profile(enabled=False) as off:
        mt.ones(2)
    assert len(off.events()) == 0
    with mt.autograd.profiler.record_function("x"):
        pass
