"""mpitensor.checkpoint: round trips, RNG streams, atomic writes, and clear errors on bad files."""

from __future__ import annotations

import collections
import io
import os
import random
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import checkpoint as ck
from mpitensor.checkpoint import CheckpointError, load, save
from mpitensor.errors import MpiTensorError
from mpitensor.nn import Parameter
from mpitensor.optim import SGD


def _same(a, b):
    """Deep equality that checks types, dtypes and shapes exactly."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, mt.Tensor):
        assert a.requires_grad == b.requires_grad
        _same(a._data, b._data)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and (a == b or (a != a and b != b))
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys())
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


def _round_trip(obj, tmp_path, **kw):
    p = tmp_path / "x.mt"
    save(obj, p, **kw)
    return load(p)


DTYPES = [np.float16, np.float32, np.float64, np.bool_, np.int8, np.uint8, np.int16, np.int32,
          np.int64, np.uint64, np.complex64, np.complex128]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_array_dtypes_round_trip(dtype, tmp_path):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 5)) * 50).astype(dtype)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal((3, 5)).astype(dtype)
    obj = {"arr": a, "t": mt.tensor(a.copy()), "zero_d": a[1, 2].copy().reshape(()),
           "scalar": a[0, 0], "empty": np.empty((0, 4), dtype=dtype)}
    out = _round_trip(obj, tmp_path)
    _same(obj["arr"], out["arr"])
    _same(obj["t"], out["t"])
    assert out["zero_d"].shape == () and out["zero_d"].dtype == dtype
    _same(obj["scalar"], out["scalar"])
    assert out["empty"].shape == (0, 4) and out["empty"].dtype == dtype


def test_non_contiguous_views_and_byte_order(tmp_path):
    base = np.arange(60, dtype=np.float64).reshape(3, 4, 5)
    views = {"T": base.T, "step": base[:, ::2, 1::2], "neg": base[::-1, :, ::-1],
             "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
             "fortran": np.asfortranarray(base[0])}
    out = _round_trip(views, tmp_path)
    for k, v in views.items():
        _same(v, out[k])
        assert out[k].flags.c_contiguous
    assert out["step"].ctypes.data % 64 == 0 or out["step"].nbytes == 0


def test_scalars_containers_and_keys(tmp_path):
    obj = collections.OrderedDict([
        ("none", None), ("t", True), ("f", False), ("i", -7), ("big", 2**127 + 12345),
        ("neg_big", -(2**200)), ("x", 0.1), ("nan", float("nan")), ("inf", float("-inf")),
        ("c", complex(1.5, -2.25)), ("s", "héllo\n\x00"), ("b", b"\x00\xffbytes"),
        ("ba", bytearray(b"ab")), ("empty_b", b""), ("list", [1, [2, [3, ()]]]),
        ("tuple", (1, "a", None)), ("size", mt.Size([2, 3])), ("dtype", np.dtype("float16")),
        ("np", [np.float32(1.5), np.int64(-3), np.bool_(True), np.complex128(1 - 2j)]),
        (3, "int key"), ((1, 2), "tuple key"), (None, "none key"), (2.5, "float key"),
        ("nested", {"a": {"b": {"c": [np.ones(2), {}]}}, "": []}),
    ])
    out = _round_trip(obj, tmp_path)
    _same(obj, out)
    assert isinstance(out, collections.OrderedDict) and type(out["nested"]) is dict
    assert isinstance(out["size"], mt.Size)


def test_tensors_parameters_and_sharing(tmp_path):
    w = Parameter(mt.tensor(np.arange(6.0).reshape(2, 3)))
    frozen = mt.tensor([1.0, 2.0])
    arr = np.arange(4)
    out = _round_trip({"w": w, "tied": w, "frozen": frozen, "a": arr, "a2": arr}, tmp_path)
    assert type(out["w"]) is mt.Tensor and out["w"].requires_grad
    assert not out["frozen"].requires_grad
    np.testing.assert_array_equal(out["w"]._data, w._data)
    assert out["tied"] is out["w"] and out["a2"] is out["a"]
    out["a"][0] = 99  # loaded arrays are writable
    assert arr[0] == 0


def test_model_like_and_optimizer_state_dict(tmp_path):
    params = [Parameter(mt.tensor(np.random.default_rng(1).standard_normal(s)))
              for s in [(4, 3), (4,)]]
    opt = SGD(params, lr=0.1, momentum=0.9, nesterov=True)
    for p in params:
        p.grad = mt.tensor(np.ones(p.shape))
    opt.step()
    ckpt = {"model": collections.OrderedDict([("fc.weight", params[0].detach()),
                                              ("fc.bias", params[1].detach())]),
            "optimizer": opt.state_dict(), "epoch": 4,
            "sampler": {"epoch": 4, "position": 1280, "seed": 0}}
    out = _round_trip(ckpt, tmp_path)
    _same(ckpt["model"], out["model"])
    assert out["optimizer"]["param_groups"] == ckpt["optimizer"]["param_groups"]
    opt2 = SGD([Parameter(mt.tensor(p._data.copy())) for p in params], lr=0.5)
    opt2.load_state_dict(out["optimizer"])
    assert opt2.param_groups[0]["nesterov"] is True
    for k in (0, 1):
        np.testing.assert_array_equal(opt2.state[opt2.param_groups[0]["params"][k]]
                                      ["momentum_buffer"]._data,
                                      opt.state[params[k]]["momentum_buffer"]._data)


def test_rng_states_restore_the_exact_stream(tmp_path):
    mt.manual_seed(1234)
    mt.rand(5)
    gen = np.random.default_rng(99)
    gen.standard_normal(3)
    legacy = np.random.RandomState(7)
    legacy.rand(2)
    random.seed(5)
    random.random()
    state = {"mt": mt.get_rng_state(), "np_gen": gen.bit_generator.state,
             "legacy": legacy.get_state(), "legacy_dict": legacy.get_state(legacy=False),
             "py": random.getstate()}
    out = _round_trip(state, tmp_path)
    _same(state, out)
    want = (mt.rand(4)._data.copy(), gen.standard_normal(4), legacy.rand(4), random.random())
    mt.manual_seed(0)
    mt.set_rng_state(out["mt"])
    gen2 = np.random.default_rng()
    gen2.bit_generator.state = out["np_gen"]
    legacy2 = np.random.RandomState()
    legacy2.set_state(out["legacy"])
    random.seed(0)
    random.setstate(out["py"])
    got = (mt.rand(4)._data, gen2.standard_normal(4), legacy2.rand(4), random.random())
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_file_objects_and_path_types(tmp_path):
    buf = io.BytesIO()
    save({"a": np.arange(3)}, buf)
    buf.seek(0)
    _same({"a": np.arange(3)}, load(buf))
    save([1, 2], str(tmp_path / "s.mt"))
    assert load(str(tmp_path / "s.mt")) == [1, 2]


def test_map_location_cpu_and_bad(tmp_path):
    p = tmp_path / "m.mt"
    save({"t": mt.ones(2)}, p)
    assert load(p, map_location="cpu")["t"].device == mt.device("cpu")
    assert load(p, map_location=mt.device("cpu"))["t"].device == mt.device("cpu")
    with pytest.raises(TypeError, match="map_location"):
        load(p, map_location=3)
    with pytest.raises(ValueError, match="gpu"):
        load(p, map_location="gpu")


def test_map_location_dict_and_callable(tmp_path):
    """torch's other two forms: a dict of saved location -> device, and a callable."""
    p = tmp_path / "m.mt"
    save({"t": mt.tensor([1.0, 2.0]), "a": np.arange(3), "big": np.arange(4, dtype=">i4")}, p)
    out = load(p, map_location={"cpu": "cpu"})
    np.testing.assert_array_equal(out["t"]._data, [1.0, 2.0])
    seen = []

    def keep(storage, location):
        seen.append((location, storage.nbytes(), storage.device))
        return storage

    out = load(p, map_location=keep)
    assert sorted(seen, key=lambda s: s[1]) == [("cpu", 8, mt.device("cpu")),
                                               ("cpu", 16, mt.device("cpu")),
                                               ("cpu", 24, mt.device("cpu"))]
    assert out["big"].dtype == np.dtype(">i4") and out["big"].tolist() == [0, 1, 2, 3]
    out = load(p, map_location=lambda storage, location: None)  # None: the default placement
    np.testing.assert_array_equal(out["a"], np.arange(3))
    with pytest.raises(CheckpointError, match=r"m\.mt: map_location sends .*'cpu'.*'tpu:0'"):
        load(p, map_location={"cpu": "tpu:0"})

    def broken(storage, location):
        raise KeyError("the caller's own bug")

    with pytest.raises(KeyError, match="own bug"):  # not disguised as a corrupt file
        load(p, map_location=broken)
    with pytest.raises(TypeError, match="map_location returned int"):
        load(p, map_location=lambda storage, location: 5)


class Thing:
    """A custom class a checkpoint may hold (module level: picklable by reference)."""

    def __init__(self, v=0):
        self.v = v


def test_other_types_pickle_as_torch_save_does_and_load_only_when_allowed(tmp_path):
    p = tmp_path / "u.mt"
    # allow_pickle=False: the strict format, every leaf named when it is refused
    with pytest.raises(TypeError, match=r"obj\['x'\]\[1\].*Thing.*allow_pickle"):
        save({"x": [1, Thing()]}, p, allow_pickle=False)
    with pytest.raises(TypeError, match="defaultdict"):
        save(collections.defaultdict(int), p, allow_pickle=False)
    assert not p.exists()
    # the default pickles what torch.save would
    save({"x": [1, Thing(5)], "c": collections.Counter("aab"), "w": np.ones(2)}, p)
    with pytest.raises(CheckpointError, match=r"u\.mt.*Thing.*weights_only=False.*"
                                              r"add_safe_globals.*safe_globals"):
        load(p)
    assert load(p, weights_only=False)["x"][1].v == 5
    with mt.serialization.safe_globals([Thing]):
        out = load(p)
    assert out["x"][1].v == 5 and out["c"] == collections.Counter("aab")
    with pytest.raises(CheckpointError, match="Thing"):
        load(p)  # only inside the block
    mt.serialization.add_safe_globals([Thing])
    try:
        assert Thing in mt.serialization.get_safe_globals()
        assert load(p)["x"][1].v == 5
    finally:
        mt.serialization.clear_safe_globals()
    with pytest.raises(TypeError, match="object"):
        save(np.array([1, "a"], dtype=object), p, allow_pickle=False)


def test_whole_models_save_and_load_as_with_torch(tmp_path):
    """torch.save(model) of a whole module, and load(..., weights_only=False) of it, in both
    formats; a whole torch model saved by torch loads as mpitensor's layers."""
    model = mt.nn.Sequential(mt.nn.Linear(3, 4), mt.nn.ReLU(), mt.nn.BatchNorm1d(4))
    x = mt.randn(5, 3)
    model.eval()
    for name in ("model.pt", "model.ckpt"):
        save(model, tmp_path / name)
        with pytest.raises(CheckpointError, match="weights_only=False.*add_safe_globals"):
            load(tmp_path / name)
        back = load(tmp_path / name, weights_only=False)
        assert type(back) is type(model) and not back.training
        assert np.array_equal(back(x).detach().numpy(), model(x).detach().numpy())
    torch = pytest.importorskip("torch")
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(),
                                 torch.nn.BatchNorm1d(4)).eval()
    torch.save(theirs, tmp_path / "torch_model.pt")
    with pytest.raises(CheckpointError, match="torch.nn.modules.container.Sequential"):
        load(tmp_path / "torch_model.pt")
    ours = load(tmp_path / "torch_model.pt", weights_only=False)
    assert isinstance(ours, mt.nn.Sequential) and isinstance(ours[0], mt.nn.Linear)
    got = ours(mt.tensor(x.numpy())).detach().numpy()
    want = theirs(torch.tensor(x.numpy())).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=4 * 2.0 ** -24 * np.abs(want).max() * 4)
    # and torch reads mpitensor's whole-model file when told where the classes are
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert type(loaded).__module__.startswith("mpitensor")


def test_load_refuses_a_pickle_file(tmp_path):
    import pickle

    p = tmp_path / "evil.pt"
    p.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(CheckpointError, match=r"evil\.pt.*not an mpitensor checkpoint.*plain "
                                              r"pickle"):
        load(p)


def test_save_chooses_the_format_by_suffix(tmp_path):
    """.pt/.pth: torch's zip layout; .safetensors: safetensors; anything else: ours."""
    obj = {"w": mt.ones(2)}
    save(obj, tmp_path / "a.mt")
    assert (tmp_path / "a.mt").read_bytes()[:8] == b"MPITCKPT"
    for name in ("a.pt", "a.PTH"):
        save(obj, tmp_path / name)
        assert (tmp_path / name).read_bytes()[:4] == b"PK\x03\x04"
        _same(obj, load(tmp_path / name))
    save(obj, tmp_path / "b.pt", format="mpitensor")
    assert (tmp_path / "b.pt").read_bytes()[:8] == b"MPITCKPT"
    buf = io.BytesIO()
    save(obj, buf)
    assert buf.getvalue()[:8] == b"MPITCKPT"
    with pytest.raises(ValueError, match="format must be one of"):
        save(obj, tmp_path / "c.mt", format="pickle")
    assert sorted(os.listdir(tmp_path)) == ["a.PTH", "a.mt", "a.pt", "b.pt"]


def test_torch_format_round_trip_and_atomic_write(tmp_path, monkeypatch):
    """save(format="torch") goes through the same atomic write: a failure keeps the old file."""
    p = tmp_path / "ckpt.pt"
    save({"version": 1}, p)
    old = p.read_bytes()

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    import zipfile

    monkeypatch.setattr(zipfile.ZipFile, "open", fail)
    with pytest.raises(CheckpointError, match=r"ckpt\.pt: No space left.*unchanged"):
        save({"version": 2}, p)
    monkeypatch.undo()
    assert p.read_bytes() == old and sorted(os.listdir(tmp_path)) == ["ckpt.pt"]
    assert load(p) == {"version": 1}


def _good_file(tmp_path):
    p = tmp_path / "good.mt"
    save({"w": np.arange(100, dtype=np.float32), "e": 3}, p)
    return p, p.read_bytes()


@pytest.mark.parametrize("cut", [0, 3, 8, 40, 64, 70, -400, -1])
def test_truncated_files(tmp_path, cut):
    p, data = _good_file(tmp_path)
    bad = tmp_path / f"trunc{cut}.mt"
    bad.write_bytes(data[:cut] if cut >= 0 else data[:len(data) + cut])
    with pytest.raises(CheckpointError, match=rf"trunc{cut}\.mt: .*(truncated|empty)") as ei:
        load(bad)
    assert isinstance(ei.value, MpiTensorError) and isinstance(ei.value, ValueError)
    assert ei.value.__cause__ is None and ei.value.__suppress_context__


@pytest.mark.parametrize("where, what", [(70, "header"), (-3, "payload"), (9, "version"),
                                         (0, "not an mpitensor checkpoint")])
def test_corrupt_files(tmp_path, where, what):
    p, data = _good_file(tmp_path)
    b = bytearray(data)
    b[where] ^= 0x5A
    bad = tmp_path / "corrupt.mt"
    bad.write_bytes(bytes(b))
    with pytest.raises(CheckpointError, match=rf"corrupt\.mt: .*{what}"):
        load(bad)


def test_garbage_and_trailing_bytes(tmp_path):
    g = tmp_path / "garbage.bin"
    g.write_bytes(os.urandom(1000))
    with pytest.raises(CheckpointError, match=r"garbage\.bin: not an mpitensor checkpoint"):
        load(g)
    p, data = _good_file(tmp_path)
    t = tmp_path / "trailing.mt"
    t.write_bytes(data + b"xx")
    with pytest.raises(CheckpointError, match=r"trailing\.mt: corrupt: 2 unexpected bytes"):
        load(t)
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.mt")


def test_forged_header_is_rejected_cleanly(tmp_path):
    """A header with a valid checksum but nonsense content still gives a CheckpointError."""
    import hashlib
    import json
    import struct

    for header in [b"not json", json.dumps({"tree": {"k": "mystery"}, "arrays": [],
                                            "payload_sha256": hashlib.sha256(b"").hexdigest()}
                                           ).encode(),
                   json.dumps({"tree": {"k": "ndarray", "i": 0},
                               "arrays": [{"dtype": "|O", "shape": [1], "offset": 0,
                                           "nbytes": 8}],
                               "payload_sha256": hashlib.sha256(b"").hexdigest()}).encode()]:
        prefix = struct.pack("<8sIIQQ32s", b"MPITCKPT", 1, 0, len(header), 0,
                             hashlib.sha256(header).digest())
        pad = (-(len(prefix) + len(header))) % 64
        f = tmp_path / "forged.mt"
        f.write_bytes(prefix + header + bytes(pad))
        with pytest.raises(CheckpointError, match=r"forged\.mt: .*(malformed|unknown|dtype)"):
            load(f)


def test_atomic_write_failure_keeps_old_file(tmp_path, monkeypatch):
    p = tmp_path / "ckpt.mt"
    save({"version": 1}, p)
    old = p.read_bytes()
    real_write = ck._write

    def half_then_fail(fh, head, arrays):
        fh.write(head[: len(head) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "_write", half_then_fail)
    with pytest.raises(CheckpointError, match=r"ckpt\.mt: No space left.*unchanged"):
        save({"version": 2, "w": np.ones(1000)}, p)
    assert p.read_bytes() == old and load(p) == {"version": 1}
    assert sorted(os.listdir(tmp_path)) == ["ckpt.mt"]

    def interrupted(fh, head, arrays):
        real_write(fh, head, arrays)
        raise KeyboardInterrupt

    monkeypatch.setattr(ck, "_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save({"version": 3}, p)
    assert p.read_bytes() == old and sorted(os.listdir(tmp_path)) == ["ckpt.mt"]
    monkeypatch.setattr(ck, "_write", real_write)
    save({"version": 4}, p)
    assert load(p) == {"version": 4} and sorted(os.listdir(tmp_path)) == ["ckpt.mt"]


def test_atomic_write_survives_a_crash(tmp_path):
    """A process killed in the middle of writing leaves the previous checkpoint intact."""
    p = tmp_path / "ckpt.mt"
    save({"version": 1}, p)
    old = p.read_bytes()
    code = textwrap.dedent(f"""
        import os, numpy as np
        from mpitensor import checkpoint as ck
        def crash(fh, head, arrays):
            fh.write(head)
            fh.flush()
            os._exit(3)
        ck._write = crash
        ck.save({{"version": 2, "w": np.ones(10000)}}, {str(p)!r})
    """)
    r = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert r.returncode == 3
    assert p.read_bytes() == old
    leftovers = [n for n in os.listdir(tmp_path) if n != "ckpt.mt"]
    assert all(n.startswith(".ckpt.mt.") and n.endswith(".tmp") for n in leftovers)


def test_save_keeps_permissions_and_errors_for_bad_targets(tmp_path):
    p = tmp_path / "perm.mt"
    save(1, p)
    os.chmod(p, 0o640)
    save(2, p)
    assert os.stat(p).st_mode & 0o777 == 0o640
    with pytest.raises(CheckpointError, match="is a directory"):
        save(1, tmp_path)
    with pytest.raises(CheckpointError, match="no_such_dir"):
        save(1, tmp_path / "no_such_dir" / "x.mt")


def test_distributed_helpers_without_process_group(tmp_path):
    import mpitensor.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    p = tmp_path / "solo.mt"
    ck.save_on_rank0({"a": np.arange(3)}, p)
    _same({"a": np.arange(3)}, ck.load_on_all_ranks(p))


@pytest.mark.gpu
def test_cupy_arrays_round_trip(tmp_path):
    cp = mt.backend.get_cupy()
    a = cp.arange(12, dtype=cp.float32).reshape(3, 4)[:, ::2]
    p = tmp_path / "gpu.mt"
    save({"a": a, "t": mt.Tensor(cp.ones(3))}, p)
    out = load(p)
    assert mt.backend.is_cupy_array(out["a"]) and mt.backend.is_cupy_array(out["t"]._data)
    np.testing.assert_array_equal(out["a"].get(), a.get())
    host = load(p, map_location="cpu")
    assert isinstance(host["a"], np.ndarray) and host["t"].device == mt.device("cpu")
    back = load(p, map_location="cuda:0")
    assert back["t"].device == mt.device("cuda:0")


@pytest.mark.parametrize("plen", [2**62, 10**12, 200 * 2**20])
def test_forged_payload_length_in_a_stream_is_a_checkpoint_error(plen):
    """A stream (no size to check against) whose valid header claims a huge payload: a clear
    CheckpointError ("truncated"), never a MemoryError or an attempt to allocate the claim."""
    import hashlib
    import io
    import json
    import struct

    header = json.dumps({"tree": {"k": "ndarray", "i": 0},
                         "arrays": [{"dtype": "<f8", "shape": [1], "offset": 0, "nbytes": 8}],
                         "payload_sha256": hashlib.sha256(b"").hexdigest()}).encode()
    prefix = struct.pack("<8sIIQQ32s", b"MPITCKPT", 1, 0, len(header), plen,
                         hashlib.sha256(header).digest())
    pad = (-(len(prefix) + len(header))) % 64
    data = prefix + header + bytes(pad) + bytes(64)

    class Pipe(io.RawIOBase):  # readable, not seekable: the size is unknown
        def __init__(self):
            self.buf = io.BytesIO(data)

        def readable(self):
            return True

        def read(self, n=-1):
            return self.buf.read(n)

    with pytest.raises(CheckpointError, match=r"truncated: the payload needs \d+ bytes .* but "
                                              r"the stream ends after \d+ bytes"):
        load(Pipe())


# A saver that stops in the middle of writing: says "writing" once half the payload is in its
# temporary file, then waits for a line on stdin (or to be killed) before finishing.
_SLOW_SAVER = """\
import sys
import numpy as np
from mpitensor import checkpoint as ck
real = ck._write
def slow(fh, head, arrays):
    fh.write(head[: len(head) // 2])
    fh.flush()
    print("writing", flush=True)
    sys.stdin.readline()
    fh.seek(0)
    fh.truncate()
    real(fh, head, arrays)
ck._write = slow
ck.save({"writer": sys.argv[2], "w": np.ones(1 << 16)}, sys.argv[1])
print("saved", flush=True)
"""


def _slow_saver(path, tag: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_SAVER, str(path), tag],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line != "writing\n":
        proc.kill()
        proc.wait(timeout=60)
        raise AssertionError(f"the saver did not start writing: {line!r}")
    return proc


def _temps(d):
    return sorted(n for n in os.listdir(d) if n.endswith(".tmp"))


def test_next_save_removes_temporaries_of_killed_savers_only(tmp_path):
    """12 SIGKILLed saves left 480 MB of hidden temporary files that nothing removed. The next
    save into the folder removes those whose writer is gone; a live writer's stays, and its
    save then completes."""
    p = tmp_path / "ckpt.mt"
    save({"writer": "first"}, p)
    procs = []
    try:
        live = _slow_saver(p, "live")  # a writer, alive, in the middle of its write
        procs.append(live)
        live_temp = _temps(tmp_path)
        assert len(live_temp) == 1 and re.fullmatch(r"\.ckpt\.mt\.\w+\.tmp", live_temp[0])
        dead = [_slow_saver(p, f"dead{i}") for i in range(3)]  # each is a save too
        procs.extend(dead)
        assert len(_temps(tmp_path)) == 4  # none of them took the live writer's file
        for proc in dead:  # killed mid-write
            proc.kill()
            assert proc.wait(timeout=60) == -9
        assert len(_temps(tmp_path)) == 4
        other = tmp_path / "other.mt"  # a save to another file of the folder cleans up too
        save({"writer": "other"}, other)
        assert _temps(tmp_path) == live_temp  # the dead ones' went, the live one's stayed
        assert load(p) == {"writer": "first"}
        out, _ = live.communicate("go\n", timeout=60)
        assert live.returncode == 0 and out == "saved\n"
        got = load(p)
        assert got["writer"] == "live" and got["w"].shape == (1 << 16,)
        assert _temps(tmp_path) == [] and sorted(os.listdir(tmp_path)) == ["ckpt.mt",
                                                                           "other.mt"]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=60)


def test_dead_temp_removal_leaves_other_files_alone(tmp_path):
    """Only this module's temporaries, only plain files, only unlocked ones."""
    import fcntl

    keep = [".notes.tmp", ".x.abcdefgh.tmp", ".x.mpitensor_abcdefgh.tmp.bak",
            "x.mpitensor_abcdefgh.tmp", ".x.mpitensor_abc.tmp"]
    for name in keep:
        (tmp_path / name).write_text("mine")
    os.symlink(tmp_path / ".notes.tmp", tmp_path / ".link.mpitensor_abcdefgh.tmp")
    os.mkdir(tmp_path / ".dir.mpitensor_abcdefgh.tmp")
    held = tmp_path / ".held.mpitensor_abcdefgh.tmp"
    held.write_text("a writer holds me")
    with open(held) as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        save(1, tmp_path / "c.mt")
        assert held.exists()
    assert sorted(os.listdir(tmp_path)) == sorted(
        keep + ["c.mt", ".link.mpitensor_abcdefgh.tmp", ".dir.mpitensor_abcdefgh.tmp",
                ".held.mpitensor_abcdefgh.tmp"])
    save(2, tmp_path / "c.mt")  # now unheld: a dead writer's
    assert not held.exists() and (tmp_path / ".notes.tmp").read_text() == "mine"


def test_save_works_where_flock_does_not(tmp_path, monkeypatch):
    """On a filesystem without flock the save still works; its file just is not proved live,
    and no save removes another's temporary file there."""
    import errno
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    other = tmp_path / ".c.mt.mpitensor_abcdefgh.tmp"
    other.write_text("another writer's, on this filesystem")
    monkeypatch.setattr(fcntl, "flock", no_flock)
    save({"v": 1}, tmp_path / "c.mt")
    assert load(tmp_path / "c.mt") == {"v": 1} and other.exists()
    assert sorted(os.listdir(tmp_path)) == [".c.mt.mpitensor_abcdefgh.tmp", "c.mt"]
