"""torch's process-wide switches, small top-level functions and the strided-view family,
each checked against torch 2.13 as the oracle (values, dtypes, errors)."""

from __future__ import annotations

import array
import subprocess
import sys
import warnings

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import errors
from mpitensor._base import determinism

torch = pytest.importorskip("torch")

LIBS = (mt, torch)


def np_of(t):
    return np.asarray(t.detach().tolist() if hasattr(t, "detach") else t)


def same(a, b, rtol=0.0, atol=0.0):
    """``a`` (mpitensor) equals ``b`` (torch) in shape, dtype name and values."""
    assert tuple(a.shape) == tuple(b.shape)
    assert str(a.dtype).split(".")[-1] == str(b.dtype).split(".")[-1]
    np.testing.assert_allclose(np_of(a), np_of(b), rtol=rtol, atol=atol)


@pytest.fixture(autouse=True)
def _switches_restored():
    yield
    mt.use_deterministic_algorithms(False)
    torch.use_deterministic_algorithms(False)
    mt.set_warn_always(False)
    mt.set_anomaly_enabled(False)
    torch.set_anomaly_enabled(False)


# ---------------------------------------------------------------------------- determinism
def test_deterministic_switch_api_matches_torch():
    for lib in LIBS:
        assert lib.are_deterministic_algorithms_enabled() is False
        lib.use_deterministic_algorithms(True)
        assert lib.are_deterministic_algorithms_enabled() is True
        assert lib.is_deterministic_algorithms_warn_only_enabled() is False
        assert lib.get_deterministic_debug_mode() == 2
        lib.use_deterministic_algorithms(True, warn_only=True)
        assert lib.is_deterministic_algorithms_warn_only_enabled() is True
        assert lib.get_deterministic_debug_mode() == 1
        lib.use_deterministic_algorithms(False)
    for mode in ("default", "warn", "error", 0, 1, 2):
        results = []
        for lib in LIBS:
            lib.set_deterministic_debug_mode(mode)
            results.append((lib.get_deterministic_debug_mode(),
                            lib.are_deterministic_algorithms_enabled(),
                            lib.is_deterministic_algorithms_warn_only_enabled()))
        assert results[0] == results[1]
    for bad, exc in (("x", RuntimeError), (3, RuntimeError), (1.0, TypeError), (None, TypeError)):
        for lib in LIBS:
            with pytest.raises(exc):
                lib.set_deterministic_debug_mode(bad)
    for lib in LIBS:
        with pytest.raises(TypeError):
            lib.use_deterministic_algorithms(1)
        with pytest.raises(TypeError):
            lib.use_deterministic_algorithms(True, warn_only=1)


def test_put_without_accumulate_raises_or_warns_as_torch():
    for lib in LIBS:
        x = lib.zeros(5)
        idx, src = lib.tensor([0, 1]), lib.tensor([1.0, 2.0])
        lib.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="put_"):
            x.put_(idx, src)
        # accumulate=True has a deterministic way: it runs, with the sums torch gives
        y = lib.zeros(3).put_(lib.tensor([0, 0, 2]), lib.tensor([1.0, 2.0, 4.0]),
                              accumulate=True)
        assert y.tolist() == [3.0, 0.0, 4.0]
        lib.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="put_"):
            x.put_(idx, src)
        assert x.tolist() == [1.0, 2.0, 0.0, 0.0, 0.0]
        lib.use_deterministic_algorithms(False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            x.put_(idx, src)


class _DeviceLike:
    """Stands for a CuPy array in the decision: an array object with a ``device``."""

    device = "cuda:0"


def test_decision_of_the_deterministic_check():
    cpu, gpu = np.zeros(3), _DeviceLike()
    assert determinism.nondeterministic_on(cpu) is False
    assert determinism.nondeterministic_on(gpu) is True
    assert determinism.decision("op", gpu) == "run"  # switch off
    mt.use_deterministic_algorithms(True)
    assert determinism.decision("op", cpu) == "run"  # NumPy adds in index order
    assert determinism.decision("op", gpu) == "raise"
    with pytest.raises(RuntimeError, match="bincount"):
        determinism.alert("bincount() with weights on a GPU", gpu)
    determinism.alert("bincount() with weights on a GPU", cpu)  # nothing to say on the CPU
    assert determinism.add_at(cpu, np.array([0, 0]), np.ones(2)) is False  # caller's way
    mt.use_deterministic_algorithms(True, warn_only=True)
    assert determinism.decision("op", gpu) == "warn"
    with pytest.warns(UserWarning, match="my_op"):
        determinism.alert("my_op", gpu)


def test_cpu_scatter_adds_under_the_switch_match_torch():
    for lib in LIBS:
        lib.use_deterministic_algorithms(True)
    r = []
    for lib in LIBS:
        idx = lib.tensor([0, 2, 0, 2, 2])
        src = lib.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
        a = lib.zeros(3).index_add_(0, idx, src)
        b = lib.zeros(3).scatter_add_(0, idx, src)
        c = lib.bincount(idx, weights=src)
        w = lib.ones(3, 2, requires_grad=True)
        w[idx].sum().backward()
        r.append((a, b, c, w.grad))
    for a, b in zip(*r):
        same(a, b)


# ---------------------------------------------------------------------- warnings, modes
def test_set_warn_always_and_the_once_per_process_warning():
    for lib in LIBS:
        assert lib.is_warn_always_enabled() is False
        lib.set_warn_always(True)
        assert lib.is_warn_always_enabled() is True
        lib.set_warn_always(False)
        with pytest.raises(RuntimeError):
            lib.set_warn_always(1)
    data = b"\x01\x02\x03\x04"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mt.frombuffer(data, dtype=mt.uint8)  # the first read-only buffer warns (or did before)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mt.frombuffer(data, dtype=mt.uint8)
    assert not seen
    mt.set_warn_always(True)
    with pytest.warns(UserWarning, match="read-only"):
        mt.frombuffer(data, dtype=mt.uint8)


def test_is_inference_mode_enabled_follows_the_context_as_torch():
    def states(lib):
        out = [lib.is_inference_mode_enabled()]
        with lib.inference_mode():
            out.append((lib.is_inference_mode_enabled(), lib.is_grad_enabled()))
            with lib.inference_mode(False):
                out.append((lib.is_inference_mode_enabled(), lib.is_grad_enabled()))
            out.append(lib.is_inference_mode_enabled())
        out.append(lib.is_inference_mode_enabled())

        @lib.inference_mode()
        def f():
            return lib.is_inference_mode_enabled()

        out.append(f())
        out.append(lib.is_inference_mode_enabled())

        @lib.inference_mode  # bare, as torch allows
        def g(a, b=1):
            return lib.is_inference_mode_enabled(), lib.is_grad_enabled(), a + b

        @lib.no_grad
        def h():
            return lib.is_grad_enabled()

        out.extend([g(1, b=2), h(), lib.is_grad_enabled(), g.__name__])
        return out

    assert states(mt) == states(torch)
    x = mt.ones(2)
    assert mt.is_inference(x) is False and torch.is_inference(torch.ones(2)) is False
    with pytest.raises(TypeError):
        mt.is_inference(3)


def test_anomaly_switches_drive_autograd_anomaly_mode():
    for lib in LIBS:
        lib.set_anomaly_enabled(True, False)
        assert lib.is_anomaly_enabled() is True
        assert lib.is_anomaly_check_nan_enabled() is False
        lib.set_anomaly_enabled(True)
        assert lib.is_anomaly_check_nan_enabled() is True
        x = lib.zeros(1, requires_grad=True)
        with pytest.raises(RuntimeError, match="nan"):
            (lib.sqrt(x) * 0).sum().backward()
        lib.set_anomaly_enabled(False)
        assert lib.is_anomaly_enabled() is False
        assert lib.is_anomaly_check_nan_enabled() is True  # the flag kept, as torch
        (lib.sqrt(lib.zeros(1, requires_grad=True)) * 0).sum().backward()
    assert mt.autograd.is_anomaly_enabled() is False


_INTEROP = r"""
import sys
import {lib} as t
first = t.get_num_interop_threads()
assert first >= 1, first
for bad, exc in ((0, RuntimeError), (-1, RuntimeError), (2.0, RuntimeError)):
    try:
        t.set_num_interop_threads(bad)
    except exc:
        pass
    else:
        sys.exit("no error for %r" % (bad,))
t.set_num_interop_threads(3)
assert t.get_num_interop_threads() == 3
try:
    t.set_num_interop_threads(2)
except RuntimeError:
    print("ok")
"""


@pytest.mark.parametrize("lib", ["mpitensor", "torch"])
def test_interop_threads_set_once_per_process(lib):
    r = subprocess.run([sys.executable, "-c", _INTEROP.format(lib=lib)], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# --------------------------------------------------------------------------- small queries
def test_typename_is_storage_get_device():
    for make in (lambda lib: lib.zeros(1), lambda lib: lib.zeros(1, dtype=lib.int64),
                 lambda lib: lib.zeros(1, dtype=lib.float16),
                 lambda lib: lib.zeros(1, dtype=lib.bool),
                 lambda lib: lib.zeros(1, dtype=lib.bfloat16),
                 lambda lib: lib.zeros(1, dtype=lib.complex64)):
        ours, theirs = mt.typename(make(mt)), torch.typename(make(torch))
        assert ours.replace("mpitensor.", "torch.") == theirs
    for obj in (3, "s", 2.5, None, int, len, type, [1], _DeviceLike, _DeviceLike(),
                same, warnings.catch_warnings()):
        assert mt.typename(obj) == torch.typename(obj)
    assert mt.typename(mt.nn.Linear(1, 1)) == "mpitensor.nn.modules.linear.Linear"
    assert mt.typename(mt.nn.Linear) == "mpitensor.nn.modules.linear.Linear"
    assert torch.typename(torch.nn.Linear) == "torch.nn.modules.linear.Linear"
    for obj in (mt.zeros(2), np.zeros(2), 3, b"ab"):
        assert mt.is_storage(obj) is False
    assert mt.get_device(mt.zeros(2)) == torch.get_device(torch.zeros(2)) == -1
    with pytest.raises(TypeError):
        mt.get_device(3)


def test_error_classes():
    for name in ("OutOfMemoryError", "AcceleratorError"):
        ours, theirs = getattr(mt, name), getattr(torch, name)
        assert issubclass(ours, RuntimeError) and issubclass(theirs, RuntimeError)
        assert issubclass(ours, mt.MpiTensorError)

    class LibraryOOM(MemoryError):
        def __init__(self, size, total, limit=0):
            super().__init__(f"out of memory allocating {size} bytes")

    err = errors.device_out_of_memory(LibraryOOM(1024, 0), LibraryOOM)
    assert isinstance(err, mt.OutOfMemoryError) and isinstance(err, LibraryOOM)
    assert "1024 bytes" in str(err) and "smaller batch" in str(err)
    assert type(errors.device_out_of_memory(err, LibraryOOM)) is type(err)  # one class


# -------------------------------------------------------------------------------- creation
def test_frombuffer_matches_torch():
    raw = b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kw in ({}, {"offset": 4}, {"count": 2}, {"count": 2, "offset": 4},
                   {"count": -1, "offset": 8}):
            same(mt.frombuffer(bytearray(raw), dtype=mt.int32, **kw),
                 torch.frombuffer(bytearray(raw), dtype=torch.int32, **kw))
            same(mt.frombuffer(raw, dtype=mt.int32, **kw),
                 torch.frombuffer(raw, dtype=torch.int32, **kw))
        for kw in ({"count": 4}, {"offset": 12}, {"offset": 13}, {"offset": 2},
                   {"count": 0}, {"offset": -1}):
            for lib in LIBS:
                with pytest.raises(ValueError):
                    lib.frombuffer(bytearray(raw), dtype=lib.int32, **kw)
        for lib in LIBS:
            with pytest.raises(ValueError):
                lib.frombuffer(bytearray(), dtype=lib.int32)
    buf = bytearray(raw)
    t = mt.frombuffer(buf, dtype=mt.int32, count=2, offset=4)
    t[0] = 9
    assert buf[4:8] == b"\x09\x00\x00\x00"
    buf[8] = 7
    assert t.tolist() == [9, 7]
    arr = array.array("d", [1.5, 2.5, 3.5])
    same(mt.frombuffer(arr, dtype=mt.float64, offset=8),
         torch.frombuffer(arr, dtype=torch.float64, offset=8))
    g = mt.frombuffer(bytearray(8), dtype=mt.float32, requires_grad=True)
    assert g.requires_grad and g.is_leaf


def test_dlpack_round_trips_share_memory():
    a = np.arange(4.0)
    t = mt.from_dlpack(a)
    t[0] = 7.0
    assert a[0] == 7.0 and t.dtype == mt.float64
    tt = torch.arange(3, dtype=torch.int32)
    m = mt.from_dlpack(tt)
    m[1] = 9
    assert tt.tolist() == [0, 9, 2] and m.dtype == mt.int32
    m2 = mt.from_dlpack(torch.to_dlpack(tt))  # a raw capsule
    m2[2] = 5
    assert tt.tolist() == [0, 9, 5]
    x = mt.arange(3.0)
    back = torch.from_dlpack(mt.to_dlpack(x))
    back[0] = -1.0
    assert x.tolist() == [-1.0, 1.0, 2.0]
    assert np.from_dlpack(x)[0] == -1.0
    y = mt.from_dlpack(mt.to_dlpack(x))
    y[1] = 4.0
    assert x.tolist() == [-1.0, 4.0, 2.0]
    cap = mt.to_dlpack(x)
    mt.from_dlpack(cap)
    with pytest.raises(RuntimeError, match="consumed once"):
        mt.from_dlpack(cap)
    with pytest.raises(TypeError):
        mt.to_dlpack(np.zeros(2))


def test_fill_matches_torch():
    for args in (((2, 3), "float32", 2.5), ((2,), "int64", 2.7), ((3,), "bool", 1),
                 ((2, 2), "float64", -1)):
        shape, dt, v = args
        a = mt.fill(mt.zeros(*shape, dtype=getattr(mt, dt)), v)
        b = torch.fill(torch.zeros(*shape, dtype=getattr(torch, dt)), v)
        same(a, b)
    x = mt.zeros(2, 3)
    mt.fill(x, 4.0)
    assert x.tolist() == [[0.0] * 3] * 2  # the input is left alone
    same(mt.fill(mt.zeros(2), mt.tensor(3.0)), torch.fill(torch.zeros(2), torch.tensor(3.0)))
    for lib in LIBS:
        with pytest.raises(RuntimeError):
            lib.fill(lib.zeros(2), lib.tensor([1.0, 2.0]))
    grads = []
    for lib in LIBS:
        x = lib.ones(2, 3, requires_grad=True)
        v = lib.tensor(2.0, requires_grad=True)
        y = lib.fill(x, v)
        assert y.requires_grad
        (y * lib.arange(6.0).reshape(2, 3)).sum().backward()
        grads.append((x.grad, v.grad))
    same(grads[0][0], grads[1][0])
    same(grads[0][1], grads[1][1])
    assert mt.fill(mt.ones(2, requires_grad=True), 1.0).requires_grad


def test_empty_permuted_matches_torch():
    for size, layout in (((2, 3, 4), (0, 2, 1)), ((2, 3, 4), (2, 0, 1)), ((5,), (0,)),
                         ((2, 3), (1, 0))):
        a = mt.empty_permuted(size, layout)
        b = torch.empty_permuted(size, layout)
        assert tuple(a.shape) == tuple(b.shape) and a.stride() == b.stride()
        assert a.dtype == mt.float32
    c = mt.empty_permuted((2, 3), (1, 0), dtype=mt.int64, requires_grad=False)
    assert c.dtype == mt.int64
    for lib in LIBS:
        with pytest.raises(RuntimeError):
            lib.empty_permuted((2, 3), (0, 0))


def test_range_is_inclusive_and_deprecated():
    for args, kw in (((1, 4), {}), ((0, 1, 0.3), {}), ((1, 4), {"dtype": "int64"}),
                     ((0, -3, -1), {}), ((0.5, 2.5, 0.5), {"dtype": "float64"})):
        kwm = {k: getattr(mt, v) for k, v in kw.items()}
        kwt = {k: getattr(torch, v) for k, v in kw.items()}
        with pytest.warns(UserWarning, match="deprecated"):
            a = mt.range(*args, **kwm)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b = torch.range(*args, **kwt)
        same(a, b, rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args, exc in (((0, 1, 0), RuntimeError), ((0, 1, -1), RuntimeError),
                          ((5,), TypeError)):
            for lib in LIBS:
                with pytest.raises(exc):
                    lib.range(*args)


# ------------------------------------------------------------------- gradient, histogramdd
_GRAD_CASES = [
    ([1.0, 4.0, 9.0, 16.0, 25.0], {}),
    ([1.0, 4.0, 9.0, 16.0, 25.0], {"spacing": 2.0}),
    ([1.0, 4.0, 9.0, 16.0, 25.0], {"edge_order": 2}),
    ([1.0, 4.0, 9.0, 16.0, 25.0], {"spacing": ("coords",)}),
    ([1.0, 4.0, 9.0, 16.0, 25.0], {"spacing": ("coords",), "edge_order": 2}),
    ([[0.0, 1.0, 4.0, 9.0], [16.0, 25.0, 36.0, 49.0], [64.0, 81.0, 100.0, 121.0]],
     {"dim": 1}),
    ([[0.0, 1.0, 4.0, 9.0], [16.0, 25.0, 36.0, 49.0], [64.0, 81.0, 100.0, 121.0]],
     {"spacing": [1.0, 2.0]}),
    ([[0.0, 1.0, 4.0, 9.0], [16.0, 25.0, 36.0, 49.0], [64.0, 81.0, 100.0, 121.0]],
     {"dim": [0, 1], "spacing": 2, "edge_order": 2}),
    ([[0.0, 1.0, 4.0, 9.0], [16.0, 25.0, 36.0, 49.0], [64.0, 81.0, 100.0, 121.0]],
     {"dim": -2, "spacing": ("rows",)}),
    ([1, 4, 9, 16], {}),
    ([1, 4, 9, 16], {"spacing": 2}),
]


def _grad_kwargs(lib, kw):
    coords = {"coords": [0.0, 1.0, 1.5, 3.5, 4.0], "rows": [0.0, 1.0, 3.0]}
    out = dict(kw)
    if isinstance(kw.get("spacing"), tuple):
        out["spacing"] = tuple(lib.tensor(coords[c]) for c in kw["spacing"])
    return out


@pytest.mark.parametrize("data,kw", _GRAD_CASES)
def test_gradient_matches_torch(data, kw):
    a = mt.gradient(mt.tensor(data), **_grad_kwargs(mt, kw))
    b = torch.gradient(torch.tensor(data), **_grad_kwargs(torch, kw))
    assert isinstance(a, tuple) and len(a) == len(b)
    for x, y in zip(a, b):
        same(x, y, rtol=1e-6, atol=1e-5)  # float32 differences of values up to ~100


def test_gradient_backward_and_errors_match_torch():
    grads = []
    for lib in LIBS:
        x = lib.tensor([1.0, 3.0, 2.0, 5.0, 4.0], dtype=lib.float64, requires_grad=True)
        c = lib.tensor([0.0, 0.5, 2.0, 2.5, 4.0], dtype=lib.float64)
        (g1,) = lib.gradient(x, spacing=(c,), edge_order=2)
        (g2,) = lib.gradient(x, edge_order=1)
        (g1 * lib.arange(5.0, dtype=lib.float64) + g2 ** 2).sum().backward()
        grads.append(x.grad)
    same(*grads, rtol=1e-12)
    f = [1.0, 4.0, 9.0]
    for kw in ({"edge_order": 3}, {"spacing": [1.0, 2.0]}, {"dim": (0, 0)}):
        for lib in LIBS:
            with pytest.raises(RuntimeError):
                lib.gradient(lib.tensor(f), **kw)
    for lib in LIBS:
        with pytest.raises(RuntimeError):
            lib.gradient(lib.tensor([1.0, 2.0]), edge_order=2)
        with pytest.raises(RuntimeError):
            lib.gradient(lib.tensor(f), spacing=[lib.tensor(2.0)])


def test_histogramdd_matches_torch():
    pts = [[0.0, 1.0], [1.0, 0.0], [2.0, 0.0], [2.0, 2.0], [0.5, 1.5]]
    cases = [
        ({"bins": [3, 3]}, None),
        ({"bins": 2, "range": [0.0, 1.0, 0.0, 1.0], "density": True}, None),
        ({"bins": [3, 2]}, [1.0, 2.0, 4.0, 8.0, 0.5]),
        ({"bins": "edges"}, None),
    ]
    for kw, w in cases:
        res = []
        for lib in LIBS:
            k = dict(kw)
            if k["bins"] == "edges":
                k["bins"] = [lib.tensor([0.0, 1.0, 2.0]), lib.tensor([0.0, 0.5, 2.0])]
            res.append(lib.histogramdd(lib.tensor(pts), weight=None if w is None else
                                       lib.tensor(w), **k))
        a, b = res
        same(a.hist, b.hist, rtol=1e-6)
        assert isinstance(a.bin_edges, tuple) and len(a.bin_edges) == len(b.bin_edges)
        for e, f in zip(a.bin_edges, b.bin_edges):
            same(e, f, rtol=1e-6)
        assert a[0] is a.hist
    same(mt.histogramdd(mt.tensor([[1.0], [2.0]]), bins=2).hist,
         torch.histogramdd(torch.tensor([[1.0], [2.0]]), bins=2).hist)
    for lib in LIBS:
        with pytest.raises(RuntimeError):
            lib.histogramdd(lib.tensor([1.0, 2.0]), bins=2)
        with pytest.raises(RuntimeError):
            lib.histogramdd(lib.tensor([[1, 2]]), bins=2)


# ------------------------------------------------------------------------------ as_strided
def test_as_strided_windows_forward_and_backward_match_torch():
    out = []
    for lib in LIBS:
        x = lib.arange(10.0, requires_grad=True)
        w = lib.as_strided(x, (4, 3), (2, 1), 1)  # overlapping windows
        (w * lib.arange(12.0).reshape(4, 3)).sum().backward()
        out.append((w.detach(), x.grad))
    same(*[o[0] for o in out])
    same(*[o[1] for o in out])
    out = []
    for lib in LIBS:
        x = lib.arange(6.0, requires_grad=True)
        v = x.as_strided((3, 2), (1, 1))  # unfold-like, every middle element read twice
        w = v.as_strided((2, 2), (2, 1), 1)  # a view of a view
        (v.sum() + (w ** 2).sum()).backward()
        out.append((v.detach(), w.detach(), x.grad))
    for a, b in zip(*out):
        same(a, b)


def test_as_strided_is_a_view_of_the_storage():
    for lib in LIBS:
        x = lib.arange(10.0)
        v = x[2:]
        w = v.as_strided((2, 2), (3, 1))  # from v's storage offset, 2
        w2 = v.as_strided((2, 2), (3, 1), 5)
        assert w.storage_offset() == 2 and w2.storage_offset() == 5
        assert w.tolist() == [[2.0, 3.0], [5.0, 6.0]]
        assert w2.tolist() == [[5.0, 6.0], [8.0, 9.0]]
        w[0, 0] = 100.0  # a write through the view shows in the base
        assert x[2].item() == 100.0
        x[8] = -1.0  # and the other way round
        assert w2[1, 0].item() == -1.0
        e = lib.as_strided(x, (0, 3), (100, 1), 100)  # no element: no bound to check
        assert tuple(e.shape) == (0, 3) and e.numel() == 0
        t = x.view(2, 5).t()
        assert lib.as_strided(t, (2,), (5,), 1).tolist() == x[1::5].tolist()


def test_as_strided_errors_match_torch():
    bad = [((2, 2), (1, -1), None), ((2, 2), (1,), None), ((2, 2), (3, 1), 3),
           ((2, 2), (1, 1), -1), ((2,), (1,), 6)]
    for size, stride, off in bad:
        for lib in LIBS:
            with pytest.raises(RuntimeError):
                lib.as_strided(lib.arange(6.0), size, stride, off)
    with pytest.raises(RuntimeError, match="storage"):
        mt.as_strided(mt.arange(6.0), (2,), (1,), 5)


def test_as_strided_after_in_place_writes_matches_torch():
    results = []
    for lib in LIBS:
        x = lib.arange(6.0, requires_grad=True)
        z = x * 1
        w = z.as_strided((2,), (3,), 1)
        w.mul_(10)  # into the view: the base's graph is rewired
        (z * lib.arange(6.0)).sum().backward()
        g1 = x.grad.clone()
        x2 = lib.arange(6.0, requires_grad=True)
        z2 = x2 * 2
        w2 = z2.as_strided((3,), (2,), 0)
        z2.add_(1)  # into the base: the view reads the new values
        (w2 * w2).sum().backward()
        results.append((z.detach(), g1, w2.detach(), x2.grad))
    for a, b in zip(*results):
        same(a, b)


def test_as_strided_of_an_expanded_input_matches_torch():
    grads = []
    for lib in LIBS:
        x = lib.tensor([1.0, 2.0], requires_grad=True)
        w = x.expand(3, 2).as_strided((2,), (1,), 0)
        (w * lib.tensor([3.0, 5.0])).sum().backward()
        grads.append(x.grad)
    same(*grads)


def test_as_strided_in_place_matches_torch():
    res = []
    for lib in LIBS:
        y = lib.arange(6.0)
        r = y.as_strided_((2, 2), (1, 2), 1)
        assert r is y
        res.append((y.clone(), y.storage_offset(), y.stride()))
        with pytest.raises(RuntimeError):
            lib.zeros(4, requires_grad=True).as_strided_((2,), (1,))
    same(res[0][0], res[1][0])
    assert res[0][1:] == res[1][1:]


def test_as_strided_scatter_matches_torch():
    out = []
    for lib in LIBS:
        a = lib.arange(6.0)
        s = lib.tensor([10.0, 20.0])
        out.append(lib.as_strided_scatter(a, s, (2,), (2,), 1))
        out.append(lib.as_strided_scatter(a[1:], s, (2,), (2,)))
        out.append(lib.as_strided_scatter(a[1:], s, (2,), (2,), 0))
        out.append(lib.as_strided_scatter(a.view(2, 3).t(), s, (2,), (2,)))
        out.append(a.view(2, 3).as_strided_scatter(lib.ones(2, 2), (2, 2), (3, 1)))
        assert a.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    half = len(out) // 2
    for a, b in zip(out[:half], out[half:]):
        same(a, b)


def test_as_strided_scatter_gradient():
    """The gradient is torch's for the same function written as clone + as_strided + copy_:
    the input gets the output's gradient except where src was written, src gets it there.
    (torch 2.13's own AsStridedScatterBackward gives the input the complement of that.)"""
    x = mt.arange(6.0, requires_grad=True)
    src = mt.tensor([10.0, 20.0], requires_grad=True)
    y = mt.as_strided_scatter(x, src, (2,), (3,), 1)
    (y * mt.arange(1.0, 7.0)).sum().backward()
    xt = torch.arange(6.0, requires_grad=True)
    st = torch.tensor([10.0, 20.0], requires_grad=True)
    yt = xt.clone()
    yt.as_strided((2,), (3,), 1).copy_(st)
    (yt * torch.arange(1.0, 7.0)).sum().backward()
    same(y.detach(), yt.detach())
    same(x.grad, xt.grad)
    same(src.grad, st.grad)
    assert x.grad.tolist() == [1.0, 0.0, 3.0, 4.0, 0.0, 6.0]


# --------------------------------------------------------------------- new, resize_
def test_new_matches_torch():
    cases = [(), ([1, 2],), ((1, 2),), ([[1, 2], [3, 4]],), ([2],)]
    for args in cases:
        a = mt.arange(6.0).reshape(2, 3).new(*args)
        b = torch.arange(6.0).reshape(2, 3).new(*args)
        same(a, b)
    same(mt.arange(3).new([1.5, 2]), torch.arange(3).new([1.5, 2]))
    for args in ((2, 3), (3, 0), (mt.Size([2, 4]),)):
        targs = tuple(torch.Size(a) if isinstance(a, mt.Size) else a for a in args)
        a, b = mt.zeros(1).new(*args), torch.zeros(1).new(*targs)
        assert tuple(a.shape) == tuple(b.shape) and a.dtype == mt.float32
    t = mt.tensor([1.0, 2.0])
    n = mt.zeros(1).new(t)
    n[0] = 5.0
    assert t[0].item() == 5.0  # shares the memory, as torch
    assert mt.zeros(1, dtype=mt.int64).new(2).dtype == mt.int64
    for lib in LIBS:
        with pytest.raises(TypeError):
            lib.zeros(1).new(2.5)
        with pytest.raises(TypeError):
            lib.zeros(1).new(True)
        with pytest.raises(TypeError):
            lib.zeros(1).new(lib.zeros(2, dtype=lib.int32))
        with pytest.raises(TypeError):
            lib.zeros(1).new(2, dtype=lib.int64)


def test_resize_matches_torch():
    def steps(lib):
        out = []
        y = lib.arange(6.0).reshape(2, 3)
        out.append(y.resize_(3, 2).clone())
        y = lib.arange(6.0)
        out.append(y.resize_(2, 2).clone())
        y = lib.arange(6.0)
        v = y[1:4]
        out.append(v.resize_(5).clone())  # fits the storage: a view of it
        v = lib.arange(6.0)[::2]
        out.append(v.resize_(2, 2).clone())
        t = lib.arange(6.0).view(2, 3).t()
        out.append(t.resize_(3, 2).clone())  # the same shape: unchanged
        out.append(lib.tensor(t.stride()))
        g = lib.arange(6.0)
        r = g.resize_((2, 4))  # grows: the old values first
        assert r is g
        out.append(g[0].clone())
        q = lib.zeros(2, 3)
        q.resize_as_(lib.zeros(3, 4, dtype=lib.int64))
        out.append(lib.tensor(list(q.shape)))
        return out

    for a, b in zip(steps(mt), steps(torch)):
        same(a, b)
    y = mt.arange(6.0)
    v = y[1:4]
    v.resize_(5)
    v[4] = -1.0
    assert y[5].item() == -1.0  # still the same storage
    for lib in LIBS:
        with pytest.raises(RuntimeError):
            lib.zeros(2, requires_grad=True).resize_(3)
        with pytest.raises(RuntimeError):
            (lib.zeros(2, requires_grad=True) * 2).resize_(3)
    with pytest.raises(RuntimeError, match="share"):
        mt.arange(4.0)[1:].resize_(10)


def test_strided_views_on_meta_and_fortran_ordered_memory():
    m = mt.empty(4, device="meta")
    v = m.as_strided((2,), (2,))
    assert tuple(v.shape) == (2,) and v.device.type == "meta"
    # no memory to reach past: torch's meta tensors take any geometry, and so do these
    assert tuple(m.as_strided((3,), (2,)).shape) == tuple(
        torch.empty(4, device="meta").as_strided((3,), (2,)).shape)
    with pytest.raises(RuntimeError):
        m.as_strided((3,), (-2,))
    r = mt.empty(2, 3, device="meta")
    r.resize_(10)
    assert tuple(r.shape) == (10,) and r.device.type == "meta"
    a = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    same(mt.from_numpy(a).as_strided((3,), (2,), 1), torch.from_numpy(a).as_strided((3,), (2,), 1))


def test_keyword_calls_as_torch_takes_them():
    for lib in LIBS:
        x = lib.zeros(2)
        assert lib.as_strided(input=x, size=(1,), stride=(1,), storage_offset=1).tolist() == [0.0]
        assert x.as_strided(size=(1,), stride=(1,), storage_offset=0).tolist() == [0.0]
        assert lib.fill(input=x, value=1.0).tolist() == [1.0, 1.0]
        lib.set_anomaly_enabled(enabled=False, check_nan=True)
        assert tuple(lib.empty_permuted(size=(2,), physical_layout=(0,)).shape) == (2,)
        y = lib.as_strided_scatter(input=x, src=lib.ones(1), size=(1,), stride=(1,),
                                   storage_offset=0)
        assert y.tolist() == [1.0, 0.0]
        assert lib.from_dlpack(ext_tensor=lib.to_dlpack(data=x)).tolist() == [0.0, 0.0]
        assert lib.get_device(input=x) == -1 and lib.is_inference(input=x) is False
        x.resize_as_(the_template=lib.zeros(3))
        assert tuple(x.shape) == (3,)
        assert lib.gradient(lib.zeros(3), spacing=1, dim=0, edge_order=1)[0].tolist() == [0.0] * 3
        h = lib.histogramdd(lib.zeros(2, 1), bins=2, range=[0.0, 1.0], weight=None,
                            density=False)
        assert h.hist.tolist() == [2.0, 0.0]


def test_deprecated_out_of_place_resize_matches_torch():
    out = []
    for lib in LIBS:
        x = lib.arange(6.0, requires_grad=True)
        with pytest.warns(UserWarning, match="deprecated"):
            y = x.resize(2, 3)
        with pytest.warns(UserWarning, match="deprecated"):
            z = x.resize_as(lib.zeros(3, 2))
        (y * lib.arange(6.0).reshape(2, 3)).sum().backward()
        out.extend([y.detach(), z.detach(), x.grad])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(RuntimeError):
                x.resize(4)
            with pytest.raises(RuntimeError):
                x.resize_as(lib.zeros(3))
    for a, b in zip(out[:3], out[3:]):
        same(a, b)


class _FakeDeviceArray:
    """A device array as the deterministic path sees one: it has a ``device``, and the fake
    ``cupy`` below copies it to and from the host."""

    device = "cuda:0"

    def __init__(self, a):
        self.a = np.asarray(a)

    def __setitem__(self, key, value):
        self.a[key] = value


def test_deterministic_add_at_on_a_device_array(monkeypatch):
    fake = type(sys)("cupy")
    fake.ndarray = _FakeDeviceArray
    fake.asnumpy = lambda d: d.a.copy()
    fake.asarray = np.asarray
    monkeypatch.setitem(sys.modules, "cupy", fake)
    target = _FakeDeviceArray(np.zeros((3, 2)))
    rows = _FakeDeviceArray([0, 2, 0])
    values = _FakeDeviceArray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert determinism.add_at(target, rows.a, values.a) is False  # switch off: caller's way
    mt.use_deterministic_algorithms(True)
    assert determinism.add_at(target, rows, values) is True
    np.testing.assert_array_equal(target.a, [[6.0, 8.0], [0.0, 0.0], [3.0, 4.0]])
    assert determinism.add_at(target, (rows, slice(None)), values) is True  # tuple keys
    np.testing.assert_array_equal(target.a, [[12.0, 16.0], [0.0, 0.0], [6.0, 8.0]])


@pytest.mark.gpu
def test_gpu_strided_views_and_deterministic_scatter_adds():
    x = mt.arange(10.0, device="cuda", requires_grad=True)
    w = mt.as_strided(x, (4, 3), (2, 1), 1)
    (w * mt.arange(12.0, device="cuda").reshape(4, 3)).sum().backward()
    xc = mt.arange(10.0, requires_grad=True)
    (mt.as_strided(xc, (4, 3), (2, 1), 1) * mt.arange(12.0).reshape(4, 3)).sum().backward()
    assert w.is_cuda and w.storage_offset() == 1
    assert w.tolist() == xc.as_strided((4, 3), (2, 1), 1).tolist()
    assert x.grad.tolist() == xc.grad.tolist()
    idx = mt.tensor([0, 2, 0, 2, 2], device="cuda")
    src = mt.rand(5, dtype=mt.float64, device="cuda")
    runs = []
    mt.use_deterministic_algorithms(True)
    for _ in range(3):
        runs.append(mt.zeros(3, dtype=mt.float64, device="cuda").index_add_(0, idx, src).tolist())
    assert runs[0] == runs[1] == runs[2]
    np.testing.assert_allclose(runs[0], mt.zeros(3, dtype=mt.float64).index_add_(
        0, idx.cpu(), src.cpu()).tolist(), rtol=1e-15)
    with pytest.raises(RuntimeError, match="bincount"):
        mt.bincount(idx, weights=src)
