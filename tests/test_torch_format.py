"""Files of torch.save read by mpitensor.load (no torch needed), files for torch.load written by
mpitensor.save(format="torch"), safetensors both ways, and hostile files refused cleanly.

Tests that need torch as the oracle use ``pytest.importorskip("torch")``; the hostile files are
built by hand (zipfile + pickle opcodes), so those tests run without torch.
"""

from __future__ import annotations

import collections
import copyreg
import io
import logging
import os
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import checkpoint as ck
from mpitensor.checkpoint import CheckpointError, load, save
from mpitensor.nn import Parameter


# ------------------------------------------------------------------------- pickles by hand
def _str(s: str) -> bytes:
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def _int(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    raw = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def _glob(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _tup(*parts: bytes) -> bytes:
    return b"(" + b"".join(parts) + b"t"


def _tensor(key: str, numel: int, offset: int, size, stride, storage: str = "FloatStorage",
            location: str = "cpu") -> bytes:
    """The opcodes torch writes for one tensor: _rebuild_tensor_v2(storage pid, ...)."""
    pid = _tup(_str("storage"), _glob("torch", storage), _str(key), _str(location), _int(numel))
    return (_glob("torch._utils", "_rebuild_tensor_v2")
            + _tup(pid + b"Q", _int(offset), _tup(*map(_int, size)), _tup(*map(_int, stride)),
                   b"\x89", _glob("collections", "OrderedDict") + b")R")
            + b"R")


def _dict_pickle(**items: bytes) -> bytes:
    body = b"".join(_str(k) + v for k, v in items.items())
    return b"\x80\x02}(" + body + b"u."


def _torch_zip(path, pkl: bytes, records=None, byteorder: bytes = b"little",
               name: str = "archive") -> None:
    """A file laid out as torch.save lays it out (without the alignment padding)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr(f"{name}/data.pkl", pkl)
        zf.writestr(f"{name}/byteorder", byteorder)
        for key, data in (records or {}).items():
            zf.writestr(f"{name}/data/{key}", data)
        zf.writestr(f"{name}/version", b"3\n")


def _call(module: str, name: str, *args: bytes) -> bytes:
    return _glob(module, name) + _tup(*args) + b"R"


def _rewrite(path, changes) -> None:
    """Rewrite a zip with some records replaced (value bytes) or removed (value None)."""
    with zipfile.ZipFile(path) as zf:
        records = {i.filename: zf.read(i) for i in zf.infolist()}
    for k, v in changes.items():
        if v is None:
            records.pop(k)
        else:
            records[k] = v
    with zipfile.ZipFile(path, "w") as zf:
        for k, v in records.items():
            zf.writestr(k, v)


def _pkl_name(path) -> str:
    with zipfile.ZipFile(path) as zf:
        return next(n for n in zf.namelist() if n.endswith("/data.pkl"))


# ------------------------------------------------------------------------- reading, by hand
def test_hand_built_file_shares_storage_between_views(tmp_path):
    data = np.arange(12, dtype=np.float32)
    pkl = _dict_pickle(base=_tensor("0", 12, 0, (3, 4), (4, 1)),
                       col=_tensor("0", 12, 1, (3,), (4,)),
                       tail=_tensor("0", 12, 6, (2, 3), (3, 1)),
                       bcast=_tensor("0", 12, 2, (2, 3), (0, 1)))
    p = tmp_path / "m.pt"
    _torch_zip(p, pkl, {"0": data.tobytes()})
    out = load(p)
    np.testing.assert_array_equal(out["base"]._data, data.reshape(3, 4))
    np.testing.assert_array_equal(out["col"]._data, [1, 5, 9])
    np.testing.assert_array_equal(out["tail"]._data, data[6:].reshape(2, 3))
    np.testing.assert_array_equal(out["bcast"]._data, [[2, 3, 4], [2, 3, 4]])
    assert out["col"].stride() == (4,) and out["base"].dtype == mt.float32
    out["base"]._data[1, 1] = 100.0  # one storage: every view sees the write
    assert out["col"]._data[1] == 100.0 and out["tail"]._data[0, 0] == 6.0


def test_hand_built_legacy_storage_names_and_python_2_names(tmp_path):
    """Protocol 2 files name builtins as __builtin__; sets, bytes and complex come that way."""
    pkl = _dict_pickle(
        s=_call("__builtin__", "set", b"](" + _int(1) + _int(2) + b"e"),
        e=_call("__builtin__", "bytes"),
        b=_call("_codecs", "encode", _str("\xff\x00"), _str("latin1")),
        c=_glob("__builtin__", "complex") + _tup(b"G" + struct.pack(">d", 1.0),
                                                 b"G" + struct.pack(">d", -2.0)) + b"R",
        n=b"N",
    )
    p = tmp_path / "py2.pt"
    _torch_zip(p, pkl)
    out = load(p)
    assert out == {"s": {1, 2}, "e": b"", "b": b"\xff\x00", "c": 1 - 2j, "n": None}


MARKER_CALLS = [("os", "system"), ("posix", "system"), ("builtins", "eval"),
                ("__builtin__", "eval"), ("builtins", "exec"), ("subprocess", "check_call"),
                ("subprocess", "Popen"), ("builtins", "getattr"), ("torch", "load"),
                ("numpy", "load"), ("collections", "deque")]


@pytest.mark.parametrize("module, name", MARKER_CALLS, ids=lambda x: str(x))
def test_hostile_globals_are_refused_and_never_called(tmp_path, module, name):
    marker = tmp_path / "pwned"
    cmd = f"open({str(marker)!r}, 'w').close()" if name in ("eval", "exec") else \
        f"touch {marker}"
    arg = _str(cmd) if name != "Popen" else b"](" + _str("touch") + _str(str(marker)) + b"e"
    evil = _dict_pickle(x=_call(module, name, arg))
    p = tmp_path / "evil.pt"
    _torch_zip(p, evil)
    with pytest.raises(CheckpointError, match=rf"evil\.pt: it references .*{name}"):
        load(p)
    assert not marker.exists()


def test_hostile_opcodes_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    cases = {
        # protocol 4's STACK_GLOBAL names the global through the stack
        "stack_global": (b"\x80\x04\x8c\x02os\x8c\x06system\x93" + _str(f"touch {marker}")
                         + b"\x85R.", r"global os\.system, which weights_only=True refuses"),
        # protocol 0's INST looks the class up and calls it at once
        "inst": (b"(" + _str(f"touch {marker}") + b"ios\nsystem\n.", r"global os\.system"),
        # BUILD that would set __class__ through the slot state
        "build_slots": (b"\x80\x02" + _call("collections", "OrderedDict") + b"N}"
                        + _str("__class__") + _glob("collections", "Counter") + b"s\x86b.",
                        r"BUILD on OrderedDict with tuple state is refused"),
        # BUILD on something other than an OrderedDict
        "build_set": (b"\x80\x02" + _call("builtins", "set", b"]") + b"}" + _str("a")
                      + _int(1) + b"sb.", r"BUILD on set with dict state is refused"),
        # bytearray(2**40) would allocate a terabyte from one number in the file
        "bytearray_size": (b"\x80\x02" + _call("builtins", "bytearray", _int(2**40)) + b".",
                           r"bytearray\(<size>\) is refused"),
        # _codecs.encode with a codec other than latin1
        "codec": (b"\x80\x02" + _call("_codecs", "encode", _str("x"), _str("rot13")) + b".",
                  r"_codecs\.encode is only accepted for bytes"),
        # a persistent id that is not a storage
        "pid": (b"\x80\x02" + _str("junk") + b"Q.", r"unexpected persistent id 'junk'"),
        # a storage type that is not a storage type
        "pid_type": (b"\x80\x02" + _tup(_str("storage"), _call("builtins", "set", b"]"),
                                        _str("0"), _str("cpu"), _int(1)) + b"Q.",
                     r"storage type set\(\)"),
        # a whole torch module: refused unless weights_only=False (then mpitensor's layer)
        "module": (b"\x80\x02" + _call("torch.nn.modules.linear", "Linear") + b".",
                   r"torch\.nn\.modules\.linear\.Linear, which weights_only=True refuses"),
        # a torch global mpitensor has no counterpart of
        "no_counterpart": (b"\x80\x02" + _call("torch.nn.modules.fancy", "Nothing") + b".",
                           r"torch\.nn\.modules\.fancy\.Nothing, which weights_only=True"),
        "not_a_pickle": (b"\x00\x01garbage", r"truncated or corrupt torch file"),
        "truncated_pickle": (_dict_pickle(a=_int(1))[:-3], r"truncated or corrupt torch file"),
    }
    for what, (pkl, msg) in cases.items():
        p = tmp_path / f"{what}.pt"
        _torch_zip(p, pkl)
        with pytest.raises(CheckpointError, match=rf"{what}\.pt: .*{msg}"):
            load(p)
    with pytest.raises(CheckpointError, match="no counterpart"):
        load(tmp_path / "no_counterpart.pt", weights_only=False)
    assert not marker.exists()


def test_copyreg_extension_codes_are_refused(tmp_path):
    """The extension registry is process state: an EXT opcode must not reach os.system."""
    marker = tmp_path / "pwned"
    copyreg.add_extension("os", "system", 0x7F01)
    try:
        p = tmp_path / "ext.pt"
        _torch_zip(p, b"\x80\x02\x83\x01\x7f" + _str(f"touch {marker}") + b"\x85R.")
        with pytest.raises(CheckpointError, match="extension"):
            load(p)
    finally:
        copyreg.remove_extension("os", "system", 0x7F01)
    assert not marker.exists()


def _legacy(main: bytes, keys=(), data: bytes = b"") -> bytes:
    """A legacy-layout file: magic, protocol, system info, the tree, the keys, the storages."""
    import pickle

    head = b"".join(pickle.dumps(x, protocol=2) for x in (
        0x1950A86A20F9469CFC6C, 1001,
        {"protocol_version": 1001, "little_endian": True, "type_sizes": {"long": 8}}))
    return head + main + pickle.dumps(list(keys), protocol=2) + data


def test_hand_built_legacy_files(tmp_path):
    good = tmp_path / "legacy.pt"
    pkl = _dict_pickle(a=_tensor("k", 3, 0, (3,), (1,)), b=_tensor("k", 3, 1, (2,), (1,)))
    data = struct.pack("<q", 3) + np.array([1, 2, 3], np.float32).tobytes()
    good.write_bytes(_legacy(pkl, ["k"], data))
    out = load(good)
    np.testing.assert_array_equal(out["b"]._data, [2.0, 3.0])
    assert np.shares_memory(out["a"]._data, out["b"]._data)
    whole = good.read_bytes()
    for cut in (5, 30, 60, len(whole) - 40, len(whole) - 5):
        bad = tmp_path / "cut.pt"
        bad.write_bytes(whole[:cut])
        with pytest.raises(CheckpointError, match=r"cut\.pt: .*(legacy|truncated|corrupt)"):
            load(bad)
    bad.write_bytes(_legacy(pkl, ["k"], struct.pack("<q", 9) + bytes(36)))
    with pytest.raises(CheckpointError, match="holds 9 elements, the pickle claims 3"):
        load(bad)
    bad.write_bytes(_legacy(pkl, [], b""))
    with pytest.raises(CheckpointError, match="lacks the data"):
        load(bad)
    marker = tmp_path / "pwned"
    bad.write_bytes(_legacy(_dict_pickle(x=_call("os", "system", _str(f"touch {marker}")))))
    with pytest.raises(CheckpointError, match=r"global os\.system"):
        load(bad)
    assert not marker.exists()


def test_weights_only_false_imports_other_globals(tmp_path):
    from fractions import Fraction

    p = tmp_path / "frac.pt"
    _torch_zip(p, _dict_pickle(f=_call("fractions", "Fraction", _int(1), _int(3))))
    with pytest.raises(CheckpointError, match=r"fractions\.Fraction.*weights_only=False"):
        load(p)
    assert load(p, weights_only=False) == {"f": Fraction(1, 3)}


@pytest.mark.parametrize("numel, offset, size, stride, record, msg", [
    (10, 0, (10,), (1,), 8, r"should hold 40 bytes .* record holds 8"),  # short storage
    (2, 0, (10,), (1,), 8, r"needs 40 bytes but its storage '0' holds 8"),  # shape > storage
    (2, 1, (2,), (1,), 8, r"needs 12 bytes"),  # offset past the end
    (2, 0, (2**40, 2**40), (2**40, 1), 8, r"needs \d+ bytes"),  # absurd shape
    (2**62, 0, (2,), (1,), 8, r"should hold \d+ bytes"),  # absurd storage
    (2, 0, (2**62,), (0,), 8, r"malformed tensor of size"),  # broadcast beyond any memory
    (2, 0, (-2,), (1,), 8, r"negative entry in size"),
    (2, 0, (2,), (-1,), 8, r"negative entry in stride"),
    (2, 0, (2, 1), (1,), 8, r"malformed tensor"),
])
def test_forged_tensors_are_checkpoint_errors_not_memory_errors(tmp_path, numel, offset, size,
                                                                stride, record, msg):
    p = tmp_path / "forged.pt"
    _torch_zip(p, _dict_pickle(t=_tensor("0", numel, offset, size, stride)),
               {"0": bytes(record)})
    with pytest.raises(CheckpointError, match=rf"forged\.pt: .*{msg}"):
        load(p)


def test_missing_and_inconsistent_storages(tmp_path):
    p = tmp_path / "missing.pt"
    _torch_zip(p, _dict_pickle(t=_tensor("7", 2, 0, (2,), (1,))))
    with pytest.raises(CheckpointError, match=r"storage '7' has no record archive/data/7"):
        load(p)
    p = tmp_path / "twice.pt"
    _torch_zip(p, _dict_pickle(a=_tensor("0", 2, 0, (2,), (1,)),
                               b=_tensor("0", 4, 0, (2,), (1,))), {"0": bytes(8)})
    with pytest.raises(CheckpointError, match=r"claimed with 8 and 16 bytes"):
        load(p)


def _good_torch_file(tmp_path):
    p = tmp_path / "good.pt"
    save({"w": mt.tensor(np.arange(100, dtype=np.float32)), "e": 3}, p)
    return p, p.read_bytes()


@pytest.mark.parametrize("cut", [3, 30, 100, 500, -200, -22, -1])
def test_truncated_torch_files(tmp_path, cut):
    _, data = _good_torch_file(tmp_path)
    bad = tmp_path / "trunc.pt"
    bad.write_bytes(data[:cut])
    with pytest.raises(CheckpointError, match=r"trunc\.pt: .*(truncated|corrupt|not an)"):
        load(bad)


def test_corrupt_record_fails_its_crc(tmp_path):
    p, data = _good_torch_file(tmp_path)
    with zipfile.ZipFile(p) as zf:
        info = zf.getinfo("archive/data/0")
    header = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + sum(header)
    b = bytearray(data)
    b[start + 17] ^= 0x40
    p.write_bytes(bytes(b))
    with pytest.raises(CheckpointError, match=r"good\.pt: .*CRC"):
        load(p)


def test_other_zip_files_and_old_formats(tmp_path):
    p = tmp_path / "other.zip"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("readme.txt", "hi")
    with pytest.raises(CheckpointError, match="zip file without a <archive>/data.pkl"):
        load(p)
    p = tmp_path / "script.pt"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("m/constants.pkl", b"")
        zf.writestr("m/code/__torch__.py", "")
    with pytest.raises(CheckpointError, match="TorchScript"):
        load(p)
    p = tmp_path / "old.tar"
    p.write_bytes(b"sys_info" + bytes(600))
    with pytest.raises(CheckpointError, match="torch < 0.4"):
        load(p)


def test_streams_and_offsets(tmp_path):
    """A non-seekable stream and a file object that does not start at 0 both load."""
    buf = io.BytesIO()
    save({"w": mt.arange(4)}, buf, format="torch")
    data = buf.getvalue()

    class Pipe(io.RawIOBase):
        def __init__(self, payload):
            self.buf = io.BytesIO(payload)

        def readable(self):
            return True

        def readinto(self, b):
            chunk = self.buf.read(min(len(b), 7))
            b[:len(chunk)] = chunk
            return len(chunk)

    np.testing.assert_array_equal(load(io.BufferedReader(Pipe(data)))["w"]._data, np.arange(4))
    shifted = io.BytesIO(b"junk" + data)
    shifted.seek(4)
    np.testing.assert_array_equal(load(shifted)["w"]._data, np.arange(4))

    class Sink(io.RawIOBase):  # a write-only, non-seekable target
        def __init__(self):
            self.parts = []

        def writable(self):
            return True

        def write(self, b):
            self.parts.append(bytes(b))
            return len(b)

    sink = Sink()
    save({"w": mt.arange(3)}, sink, format="torch")
    np.testing.assert_array_equal(load(io.BytesIO(b"".join(sink.parts)))["w"]._data,
                                  np.arange(3))


# ------------------------------------------------------------------------- our writer, our reader
def test_round_trip_in_torch_format_keeps_types_views_and_flags(tmp_path):
    w = Parameter(mt.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3)))
    frozen = Parameter(mt.tensor([1.0, 2.0]), requires_grad=False)
    base = mt.tensor(np.arange(12, dtype=np.int64))
    obj = collections.OrderedDict(
        w=w, tied=w, frozen=frozen, base=base, view=base[2:8].reshape(2, 3),
        step=base[::3], T=mt.tensor(np.arange(6.0).reshape(2, 3)).t(),
        rg=mt.ones(2, requires_grad=True), u16=mt.tensor(np.array([1, 65535], np.uint16)),
        u64=mt.tensor(np.array([2**63 + 5], np.uint64)), flag=mt.tensor([True, False]),
        z=mt.tensor(np.array([1 + 2j], np.complex64)), h=mt.tensor(np.array([0.5], np.float16)),
        scalar=mt.tensor(3.5), empty=mt.zeros(0, 3),
        meta={"size": mt.Size([2, 3]), "dev": mt.device("cpu"), "dt": mt.float16,
              "nums": [1, 2.5, 1 - 1j, True, None, 2**80], "text": ("a", b"", b"\xff"),
              "set": {1, 2}, "count": collections.Counter("aab"), "ba": bytearray(b"q")})
    p = tmp_path / "rt.pt"
    save(obj, p)
    out = load(p)
    assert type(out) is collections.OrderedDict and list(out) == list(obj)
    assert type(out["w"]) is Parameter and out["w"].requires_grad
    assert out["tied"] is out["w"]
    assert type(out["frozen"]) is Parameter and not out["frozen"].requires_grad
    assert type(out["rg"]) is mt.Tensor and out["rg"].requires_grad
    for k in ("w", "base", "view", "step", "T", "u16", "u64", "flag", "z", "h", "scalar",
              "empty"):
        assert out[k].dtype == obj[k].dtype and out[k].shape == obj[k].shape, k
        np.testing.assert_array_equal(out[k]._data, obj[k]._data)
    assert out["T"].stride() == (1, 3) and out["step"].stride() == (3,)
    assert np.shares_memory(out["view"]._data, out["base"]._data)
    out["base"]._data[3] = -1
    assert out["view"]._data[0, 1] == -1 and out["step"]._data[1] == -1
    assert out["meta"] == obj["meta"]
    assert type(out["meta"]["size"]) is mt.Size and type(out["meta"]["dev"]) is mt.device


def test_torch_format_pickles_what_torch_pickles_and_refuses_it_on_request(tmp_path):
    p = tmp_path / "np.pt"
    # allow_pickle=False: what torch.load(weights_only=True) would refuse is refused at once
    with pytest.raises(TypeError, match=r"obj\['a'\].*numpy\.ndarray.*format='mpitensor'"):
        save({"a": np.arange(3)}, p, allow_pickle=False)
    with pytest.raises(TypeError, match=r"obj\['s'\]\[0\].*\.item\(\)"):
        save({"s": [np.float64(1.0)]}, p, allow_pickle=False)
    assert not p.exists()
    # the default pickles it, as torch.save does; loading it then needs weights_only=False
    save({"a": np.arange(3)}, p)
    with pytest.raises(CheckpointError, match=r"np\.pt: it references the global numpy"):
        load(p)
    np.testing.assert_array_equal(load(p, weights_only=False)["a"], np.arange(3))


def test_records_are_aligned_like_torch(tmp_path):
    p = tmp_path / "al.pt"
    save({f"t{i}": mt.ones(i + 1) for i in range(5)}, p)
    data = p.read_bytes()
    with zipfile.ZipFile(p) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names[:4] == ["archive/data.pkl", "archive/.format_version",
                         "archive/.storage_alignment", "archive/byteorder"]
    assert "archive/version" in names and all(i.compress_type == 0 for i in infos)
    for i in infos:
        nl, el = struct.unpack("<HH", data[i.header_offset + 26:i.header_offset + 30])
        assert (i.header_offset + 30 + nl + el) % 64 == 0, i.filename


def test_saved_on_gpu_needs_map_location_without_one(tmp_path):
    """A file whose storages say cuda:0: an error naming map_location where no GPU is usable,
    and host memory with "cpu", a dict or a callable (torch's three forms)."""
    p = tmp_path / "gpu.pt"
    a = mt.arange(4.0)
    save({"a": a, "v": a[1:]}, p)
    name = _pkl_name(p)
    with zipfile.ZipFile(p) as zf:
        pkl = zf.read(name)
    _rewrite(p, {name: pkl.replace(_str("cpu"), _str("cuda:0"))})
    if mt.backend.cupy_unavailable_reason():
        with pytest.raises(CheckpointError, match=r"gpu\.pt: .*cuda:0.*map_location='cpu'"):
            load(p)
        with pytest.raises(CheckpointError, match=r"map_location puts data saved on cuda:0 on "
                                                  r"cuda:1, but CuPy"):
            load(p, map_location={"cuda:0": "cuda:1"})
    seen = []

    def on_host(storage, location):
        seen.append(location)
        return storage.cpu()

    for ml in ("cpu", mt.device("cpu"), {"cuda:0": "cpu"}, on_host):
        out = load(p, map_location=ml)
        assert out["a"].device == mt.device("cpu")
        np.testing.assert_array_equal(out["v"]._data, [1.0, 2.0, 3.0])
        assert np.shares_memory(out["a"]._data, out["v"]._data)
    assert seen == ["cuda:0"]  # one storage, placed once
    with pytest.raises(CheckpointError, match=r"'mps'.*map_location='cpu'"):
        _rewrite(p, {name: pkl.replace(_str("cpu"), _str("mps"))})
        load(p)


@pytest.mark.gpu
def test_gpu_placement_keeps_views_shared(tmp_path):
    cp = mt.backend.get_cupy()
    base = mt.Tensor(cp.arange(12, dtype=cp.float32))
    p = tmp_path / "dev.pt"
    save({"base": base, "view": mt.Tensor(base._data[2:8].reshape(2, 3))}, p)
    out = load(p)
    assert mt.backend.is_cupy_array(out["base"]._data)
    out["base"]._data[3] = 99
    assert float(out["view"]._data[0, 1]) == 99
    host = load(p, map_location="cpu")
    assert isinstance(host["view"]._data, np.ndarray)
    moved = load(tmp_path / "dev.pt", map_location=lambda s, loc: s.cuda(0))
    assert moved["base"].device == mt.device("cuda:0")


# ------------------------------------------------------------------------- torch as the oracle
def _torch():
    return pytest.importorskip("torch")


def _same_as_torch(ours, theirs):
    """Deep equality between an mpitensor tree and a torch tree, dtypes and shapes exactly."""
    torch = _torch()
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, mt.Tensor), type(ours)
        assert isinstance(ours, Parameter) == isinstance(theirs, torch.nn.Parameter)
        assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
        assert tuple(ours.shape) == tuple(theirs.shape)
        assert ours.requires_grad == theirs.requires_grad
        np.testing.assert_array_equal(ours._data, theirs.detach().numpy())
    elif isinstance(theirs, dict):
        assert type(ours) is type(theirs) and list(ours) == list(theirs)
        for k in theirs:
            _same_as_torch(ours[k], theirs[k])
    elif isinstance(theirs, (list, tuple)) and not isinstance(theirs, torch.Size):
        assert type(ours) is type(theirs) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _same_as_torch(a, b)
    elif isinstance(theirs, torch.Size):
        assert type(ours) is mt.Size and tuple(ours) == tuple(theirs)
    elif isinstance(theirs, torch.dtype):
        assert ours == getattr(mt, str(theirs).split(".")[-1])
    elif isinstance(theirs, torch.device):
        assert ours == mt.device(str(theirs))
    else:
        assert type(ours) is type(theirs) and ours == theirs


def _models():
    torch = _torch()
    torch.manual_seed(0)
    bn = torch.nn.BatchNorm2d(3)
    bn.train()
    bn(torch.randn(4, 3, 5, 5))  # running stats and num_batches_tracked move off their init
    return {"linear": torch.nn.Linear(4, 3), "conv": torch.nn.Conv2d(2, 3, 3, padding=1),
            "bn": bn, "seq": torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(),
                                                 torch.nn.Linear(5, 2))}


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
@pytest.mark.parametrize("model", ["linear", "conv", "bn", "seq"])
def test_torch_state_dicts_load_identically(tmp_path, model, legacy):
    torch = _torch()
    sd = _models()[model].state_dict()
    p = tmp_path / "sd.pt"
    torch.save(sd, p, _use_new_zipfile_serialization=not legacy)
    out = load(p)
    _same_as_torch(out, sd)
    if model == "bn":
        assert out["num_batches_tracked"].dtype == mt.int64
        assert int(out["num_batches_tracked"].item()) == 1


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_torch_files_of_every_pickle_protocol(tmp_path, protocol):
    torch = _torch()
    base = torch.arange(6.0).reshape(2, 3)
    obj = {"w": base, "v": base[:, 1:], "b": b"xy", "e": b"", "ba": bytearray(b"z"),
           "s": {1, 2}, "c": 1j, "sz": torch.Size([1]), "big": 2**100, "t": (1, "a", None)}
    p = tmp_path / "proto.pt"
    torch.save(obj, p, pickle_protocol=protocol)
    out = load(p)
    _same_as_torch(out, obj)
    assert np.shares_memory(out["w"]._data, out["v"]._data)


def test_torch_optimizer_state_dicts_load_identically(tmp_path):
    torch = _torch()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opts = [torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9)),
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)]
    for opt in opts:
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(5, 3)).pow(2).sum().backward()
            opt.step()
    ckpt = {"model": model.state_dict(), "adam": opts[0].state_dict(),
            "sgd": opts[1].state_dict(), "epoch": 7, "loss": 0.25, "params":
            list(model.parameters()), "rng": torch.get_rng_state(), "size": torch.Size([2, 3]),
            "device": torch.device("cpu"), "dtype": torch.float16, "blob": b"\x00\xff",
            "empty": b"", "tags": {"a", "b"}, "z": 1 + 2j}
    p = tmp_path / "ckpt.pt"
    torch.save(ckpt, p)
    out = load(p)
    _same_as_torch(out, ckpt)
    assert out["adam"]["param_groups"][0]["betas"] == (0.8, 0.9)
    assert out["adam"]["state"][0]["step"].dtype == mt.float32
    opt = mt.optim.Adam([Parameter(mt.tensor(p_.detach().numpy())) for p_ in model.parameters()],
                        lr=0.5)
    opt.load_state_dict(out["adam"])  # torch's optimizer state drives ours
    assert opt.param_groups[0]["lr"] == 0.01


def test_torch_views_and_strides_are_kept(tmp_path):
    torch = _torch()
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    obj = {"base": base, "T": base.t(), "step": base[::2, 1::3], "row": base[2],
           "expand": torch.arange(3.0).expand(4, 3),
           "strided": base.as_strided((2, 2), (7, 1), 3),
           "conj": torch.tensor([1 + 2j, 3 - 1j]).conj(),  # saved with torch's lazy conj bit
           "neg": torch.tensor([1.0, 2.0])._neg_view()}
    p = tmp_path / "views.pt"
    torch.save(obj, p)
    out = load(p)
    for k, v in obj.items():
        np.testing.assert_array_equal(out[k]._data, v.resolve_conj().resolve_neg().numpy(), k)
    for k in ("T", "step", "row", "strided"):
        assert out[k].stride() == obj[k].stride(), k
        assert np.shares_memory(out[k]._data, out["base"]._data), k
    out["base"]._data[2, 1] = -5.0
    assert out["T"]._data[1, 2] == -5.0 and out["row"]._data[1] == -5.0


def test_torch_dtypes(tmp_path):
    torch = _torch()
    names = ["float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
             "complex64", "complex128", "uint16", "uint32", "uint64"]
    obj = {n: torch.tensor([0, 1, 3]).to(getattr(torch, n)) for n in names}
    p = tmp_path / "dt.pt"
    torch.save(obj, p)
    _same_as_torch(load(p), obj)
    for n in ("float8_e4m3fn", "complex32"):
        torch.save({"x": torch.ones(2, dtype=getattr(torch, n))}, p)
        with pytest.raises(CheckpointError, match=rf"dt\.pt: .*torch\.{n}, which mpitensor "
                                                  rf"does not support"):
            load(p)


def test_torch_tensor_attributes_are_dropped_with_a_warning(tmp_path, caplog):
    torch = _torch()
    t = torch.ones(2)
    t.note = "x"
    p = tmp_path / "attr.pt"
    torch.save({"t": t}, p)
    with caplog.at_level(logging.WARNING, logger="mpitensor.checkpoint"):
        out = load(p)
    np.testing.assert_array_equal(out["t"]._data, [1.0, 1.0])
    assert "note" in caplog.text


def test_big_endian_file(tmp_path):
    """A file from a big-endian machine: byteorder "big", data records swapped."""
    torch = _torch()
    obj = {"f": torch.arange(6.0).reshape(2, 3), "i": torch.tensor([1, -2], dtype=torch.int64),
           "v": None}
    obj["v"] = obj["f"][:, 1:]
    p = tmp_path / "be.pt"
    torch.save(obj, p)
    prefix = _pkl_name(p)[:-len("data.pkl")]
    changes = {prefix + "byteorder": b"big"}
    with zipfile.ZipFile(p) as zf:
        for name in zf.namelist():
            if name.startswith(prefix + "data/"):
                raw = zf.read(name)
                item = 4 if len(raw) == 24 else 8
                changes[name] = np.frombuffer(raw, f"<u{item}").astype(f">u{item}").tobytes()
    _rewrite(p, changes)
    _same_as_torch(load(p), obj)


def test_our_torch_files_load_in_torch_with_weights_only(tmp_path):
    torch = _torch()
    w = Parameter(mt.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3)))
    base = mt.tensor(np.arange(12, dtype=np.int64))
    obj = {"w": w, "base": base, "view": base[2:8].reshape(2, 3), "T": w.detach().t(),
           "u16": mt.tensor(np.array([1, 65535], np.uint16)),
           "h": mt.tensor(np.array([0.5], np.float16)),
           "size": mt.Size([2, 3]), "dev": mt.device("cpu"), "dt": mt.float16,
           "misc": [b"", b"ab", bytearray(b"q"), {1, 2}, 1 + 2j, None, 2**70,
                    collections.OrderedDict(a=1), collections.Counter("aab")]}
    p = tmp_path / "ours.pt"
    save(obj, p)
    theirs = torch.load(p, weights_only=True)
    assert isinstance(theirs["w"], torch.nn.Parameter) and theirs["w"].requires_grad
    assert theirs["view"].untyped_storage().data_ptr() == \
        theirs["base"].untyped_storage().data_ptr()
    assert theirs["T"].stride() == (1, 3)
    assert theirs["size"] == torch.Size([2, 3]) and theirs["dt"] is torch.float16
    assert theirs["dev"] == torch.device("cpu") and theirs["misc"] == obj["misc"]
    for k in ("w", "base", "view", "T", "u16", "h"):
        assert str(theirs[k].dtype).split(".")[-1] == str(obj[k].dtype).split(".")[-1]
        np.testing.assert_array_equal(theirs[k].detach().numpy(), obj[k]._data)
    assert torch.load(p, weights_only=True, mmap=True)["view"].tolist() == [[2, 3, 4], [5, 6, 7]]


def test_a_torch_program_ported_to_mpitensor(tmp_path):
    """torch.save(model.state_dict(), "m.pt") / torch.load("m.pt") under mpitensor, and the
    file going back to real torch: the outputs match."""
    torch = _torch()
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 3)
    ours = mt.nn.Linear(4, 3)
    torch.save(ref.state_dict(), tmp_path / "from_torch.pt")
    ours.load_state_dict(mt.load(tmp_path / "from_torch.pt"))
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(ours(mt.tensor(x))._data, ref(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-6)
    mt.save(ours.state_dict(), tmp_path / "m.pt")  # as a ported program would
    back = torch.nn.Linear(4, 3)
    back.load_state_dict(torch.load(tmp_path / "m.pt"))
    np.testing.assert_allclose(back(torch.from_numpy(x)).detach().numpy(),
                               ours(mt.tensor(x))._data, rtol=1e-6)
    again = mt.nn.Linear(4, 3)
    again.load_state_dict(mt.load(tmp_path / "m.pt"))
    np.testing.assert_array_equal(again.weight._data, ours.weight._data)


# ------------------------------------------------------------------------- safetensors
def test_safetensors_round_trip_and_load_recognises_it(tmp_path):
    pytest.importorskip("safetensors")
    tensors = {"w": mt.tensor(np.arange(6.0).reshape(2, 3)).t(), "i": mt.tensor([1, 2]),
               "b": mt.tensor([True]), "a": np.arange(3, dtype=np.uint16), "s": mt.tensor(2.0)}
    p = tmp_path / "m.safetensors"
    ck.save_safetensors(tensors, p, metadata={"format": "pt"})
    for out in (ck.load_safetensors(p), load(p), load(io.BytesIO(p.read_bytes()))):
        assert sorted(out) == ["a", "b", "i", "s", "w"]
        for k, v in tensors.items():
            want = v._data if isinstance(v, mt.Tensor) else v
            assert type(out[k]) is mt.Tensor and out[k].dtype == want.dtype
            assert out[k].shape == want.shape
            np.testing.assert_array_equal(out[k]._data, want)
    out["w"]._data[0, 0] = 7.0  # writable, owned memory
    save(tensors, tmp_path / "n.safetensors")  # the suffix picks the format
    assert sorted(load(tmp_path / "n.safetensors")) == ["a", "b", "i", "s", "w"]
    with pytest.raises(TypeError, match="flat dict"):
        ck.save_safetensors([mt.ones(1)], tmp_path / "x.safetensors")
    with pytest.raises(TypeError, match=r"'n'.*not a tensor"):
        ck.save_safetensors({"n": {"nested": 1}}, tmp_path / "x.safetensors")


def test_safetensors_interop_with_torch(tmp_path):
    torch = _torch()
    pytest.importorskip("safetensors")
    st = pytest.importorskip("safetensors.torch")
    sd = _models()["bn"].state_dict()
    st.save_file(dict(sd), tmp_path / "t.safetensors")
    out = load(tmp_path / "t.safetensors")
    assert sorted(out) == sorted(sd)
    _same_as_torch(out, {k: sd[k] for k in out})  # safetensors keeps its own key order
    ck.save_safetensors(load(tmp_path / "t.safetensors"), tmp_path / "o.safetensors")
    back = st.load_file(tmp_path / "o.safetensors")
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)
    st.save_file({"x": torch.ones(2, dtype=torch.bfloat16)}, tmp_path / "bf.safetensors")
    with pytest.raises(CheckpointError, match=r"'x' has dtype BF16.*bfloat16"):
        load(tmp_path / "bf.safetensors")


def test_safetensors_corrupt_and_missing_package(tmp_path, monkeypatch):
    pytest.importorskip("safetensors")
    p = tmp_path / "c.safetensors"
    ck.save_safetensors({"w": mt.ones(100)}, p)
    data = p.read_bytes()
    p.write_bytes(data[:-10])
    with pytest.raises(CheckpointError, match=r"c\.safetensors: .*"):
        load(p)
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        ck.load_safetensors(io.BytesIO(b"MPITCKPT" + bytes(100)))
    p.write_bytes(data)
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(ImportError, match="pip install safetensors"):
        load(p)
    with pytest.raises(ImportError, match="pip install safetensors"):
        ck.save_safetensors({"w": mt.ones(1)}, tmp_path / "d.safetensors")
    assert not os.path.exists(tmp_path / "d.safetensors")


# ------------------------------------------------------------- lazy flags and the memory limit
def _flagged_tensor(key: str, numel: int, size, stride, flags: str, storage: str) -> bytes:
    """_rebuild_tensor_v2 with torch's 7th argument, the metadata dict ({"neg": True}...)."""
    pid = _tup(_str("storage"), _glob("torch", storage), _str(key), _str("cpu"), _int(numel))
    meta = b"}(" + b"".join(_str(f) + b"\x88" for f in flags.split(",")) + b"u"
    return (_glob("torch._utils", "_rebuild_tensor_v2")
            + _tup(pid + b"Q", _int(0), _tup(*map(_int, size)), _tup(*map(_int, stride)),
                   b"\x89", _glob("collections", "OrderedDict") + b")R", meta)
            + b"R")


N_BIG = 16384  # zeros(1).expand(N, N): 1 GiB as a float32 array, 4 bytes of storage


def _lazy_flag_file(path) -> None:
    """The hostile 1.7 KB file: zeros(1).expand(16384, 16384)._neg_view(), and a complex
    storage behind a lazy conjugation; with torch where it is installed, by hand otherwise."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        c = (torch.arange(3).to(torch.complex64) * (1 + 2j)).expand(N_BIG, 3).conj()
        torch.save({"x": torch.zeros(1).expand(N_BIG, N_BIG)._neg_view(), "c": c,
                    "plain": torch.arange(3.0)}, path)
        return
    pkl = _dict_pickle(
        x=_flagged_tensor("0", 1, (N_BIG, N_BIG), (0, 0), "neg", "FloatStorage"),
        c=_flagged_tensor("1", 3, (N_BIG, 3), (0, 1), "conj", "ComplexFloatStorage"),
        plain=_tensor("2", 3, 0, (3,), (1,)))
    _torch_zip(path, pkl, {"0": np.zeros(1, np.float32).tobytes(),
                           "1": (np.arange(3) * (1 + 2j)).astype(np.complex64).tobytes(),
                           "2": np.arange(3, dtype=np.float32).tobytes()})


def _peak_of(code: str, tmp_path, env=None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that prints the growth of its peak RSS (bytes)."""
    # VmHWM, this process's own peak: ru_maxrss starts at the parent's peak after fork + exec
    # (Linux keeps it in the signal struct), so under a big pytest process it hid the growth
    prog = ("import sys\n"
            "import mpitensor as mt\n"
            "def hwm():\n"
            "    with open('/proc/self/status') as f:\n"
            "        return next(int(l.split()[1]) for l in f if l.startswith('VmHWM:'))\n"
            "before = hwm()\n"
            + code +
            "\nafter = hwm()\n"
            "print('peak-growth', (after - before) * 1024)\n")
    full = dict(os.environ)
    full.pop("MPITENSOR_LOAD_MAX_BYTES", None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=full)


def _growth(r: subprocess.CompletedProcess) -> int:
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split("peak-growth")[-1])


def test_lazy_negation_and_conjugation_load_without_materialising(tmp_path):
    """mpitensor.load spent 850 MB on a 1.7 KB file (a negated 16384 x 16384 expand);
    torch.load spends nothing: the flags go on the storage, before the view."""
    p = tmp_path / "lazy.pt"
    _lazy_flag_file(p)
    assert p.stat().st_size < 4096
    r = _peak_of(f"""
d = mt.load({str(p)!r})
x, c = d["x"], d["c"]
assert tuple(x.shape) == ({N_BIG}, {N_BIG}) and x.stride() == (0, 0), (x.shape, x.stride())
assert x._data[123, 4567] == 0 and str(x._data[0, 0]) == "-0.0"
assert c._data.shape == ({N_BIG}, 3) and c.stride() == (0, 1)
assert list(c._data[9]) == [0, 1 - 2j, 2 - 4j], c._data[9]
assert list(d["plain"]._data) == [0, 1, 2]
""", tmp_path)
    assert _growth(r) < 32 << 20, r.stdout  # it was ~1 GiB
    torch = sys.modules.get("torch") or _try_torch()
    if torch is not None:  # the oracle agrees on the values, at a point of each
        theirs = torch.load(p, weights_only=True)
        ours = load(p)
        assert theirs["x"].is_neg() and theirs["c"].is_conj()
        assert ours["x"]._data[7, 9] == theirs["x"][7, 9].item()
        np.testing.assert_array_equal(ours["c"]._data[:4], theirs["c"][:4].resolve_conj())


def _try_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def test_lazy_flags_on_a_shared_storage_leave_the_other_views_alone(tmp_path):
    pkl = _dict_pickle(a=_tensor("0", 4, 0, (4,), (1,)),
                       neg=_flagged_tensor("0", 4, (2, 4), (0, 1), "neg", "FloatStorage"),
                       neg2=_flagged_tensor("0", 4, (4,), (1,), "neg", "FloatStorage"))
    p = tmp_path / "shared.pt"
    _torch_zip(p, pkl, {"0": np.arange(1, 5, dtype=np.float32).tobytes()})
    out = load(p)
    np.testing.assert_array_equal(out["a"]._data, [1, 2, 3, 4])
    np.testing.assert_array_equal(out["neg"]._data, [[-1, -2, -3, -4]] * 2)
    np.testing.assert_array_equal(out["neg2"]._data, [-1, -2, -3, -4])
    # one negated copy of the storage serves both negated views
    assert np.shares_memory(out["neg"]._data, out["neg2"]._data)
    fits = len(pkl) + 16  # the pickle and the storage fit; the storage's negated copy not
    with pytest.raises(CheckpointError, match=rf"{len(pkl) + 32} bytes of memory \(a negated "
                                              rf"copy of storage '0'\).* limit of {fits} bytes "
                                              r"\(max_bytes\)"):
        load(p, max_bytes=fits)
    assert load(p, max_bytes=fits + 16)["neg2"]._data[0] == -1


def _stored_zip(path, nbytes: int, compress: bool) -> None:
    """A float32 storage of ``nbytes`` zeros, written 1 MiB at a time (stored or deflated)."""
    numel = nbytes // 4
    pkl = _dict_pickle(w=_tensor("0", numel, 0, (numel,), (1,)))
    kind = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=kind) as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/byteorder", b"little")
        info = zipfile.ZipInfo("archive/data/0")
        info.compress_type = kind
        with zf.open(info, "w", force_zip64=True) as w:
            chunk = bytes(1 << 20)
            for _ in range(nbytes >> 20):
                w.write(chunk)
        zf.writestr("archive/version", b"3\n")


def test_memory_limit_refuses_before_anything_is_allocated(tmp_path):
    """A 256 KB deflated file whose storage is 256 MiB of zeros: refused above the limit,
    with its peak memory unchanged; below the limit (or by default) it loads."""
    p = tmp_path / "bomb.pt"
    _stored_zip(p, 256 << 20, compress=True)
    assert p.stat().st_size < 1 << 20
    refused = _peak_of(f"""
try:
    mt.load({str(p)!r}, max_bytes=64 << 20)
except mt.checkpoint.CheckpointError as exc:
    print("refused:", exc)
""", tmp_path)
    assert "refused: cannot load checkpoint" in refused.stdout, refused.stdout + refused.stderr
    assert "268435456 bytes of storages" in refused.stdout
    assert "more than the limit of 67108864 bytes (max_bytes)" in refused.stdout
    assert _growth(refused) < 16 << 20, refused.stdout
    # the switch: the same refusal, named after it; "off" lifts it
    by_env = _peak_of(f"""
try:
    mt.load({str(p)!r})
except mt.checkpoint.CheckpointError as exc:
    print("refused:", exc)
""", tmp_path, env={"MPITENSOR_LOAD_MAX_BYTES": str(1 << 20)})
    assert "limit of 1048576 bytes (MPITENSOR_LOAD_MAX_BYTES)" in by_env.stdout, by_env
    assert _growth(by_env) < 16 << 20
    bad = _peak_of("pass", tmp_path, env={"MPITENSOR_LOAD_MAX_BYTES": "lots"})
    assert bad.returncode != 0 and "MPITENSOR_LOAD_MAX_BYTES='lots' is not a byte count" in \
        bad.stderr
    loaded = _peak_of(f"""
w = mt.load({str(p)!r}, max_bytes=512 << 20)["w"]
assert w.shape == ({(256 << 20) // 4},) and not w._data.any()
w2 = mt.load({str(p)!r})["w"]  # the default: the memory available
""", tmp_path, env={"MPITENSOR_LOAD_MAX_BYTES": "off"})
    assert _growth(loaded) > 200 << 20  # it really was read (the limit is not a no-op)
    with pytest.raises(TypeError, match="max_bytes must be an int"):
        load(p, max_bytes=1.5)
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        load(p, max_bytes=-1)


def test_memory_limit_covers_every_format(tmp_path):
    arr = np.ones(1 << 18, np.float32)  # 1 MiB
    for name, kwargs in (("a.mt", {}), ("a.pt", {}), ("a.safetensors", {})):
        if name.endswith(".safetensors"):
            pytest.importorskip("safetensors")
        p = tmp_path / name
        save({"w": mt.tensor(arr)} if name != "a.mt" else {"w": arr}, p, **kwargs)
        with pytest.raises(CheckpointError, match=r"limit of 500000 bytes \(max_bytes\)"):
            load(p, max_bytes=500_000)
        out = load(p, max_bytes=4 << 20)["w"]
        np.testing.assert_array_equal(out if isinstance(out, np.ndarray) else out._data, arr)
    # a stream of unknown size is cut where it passes the limit, not where it claims to end
    p = tmp_path / "a.mt"

    class Pipe(io.RawIOBase):
        def __init__(self):
            self.buf = io.BytesIO(p.read_bytes())

        def readable(self):
            return True

        def read(self, n=-1):
            return self.buf.read(n)

        def readinto(self, b):
            return self.buf.readinto(b)

    with pytest.raises(CheckpointError, match=r"the payload.*limit of 500000 bytes"):
        load(Pipe(), max_bytes=500_000)
    assert load(Pipe())["w"].shape == arr.shape


def test_memory_limit_on_legacy_files(tmp_path):
    torch = _torch()
    p = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(1 << 18), "n": torch.zeros(4)._neg_view()}, p,
               _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"2 storages of the legacy layout.*limit of "
                                              r"500000 bytes"):
        load(p, max_bytes=500_000)
    out = load(p, max_bytes=2 << 20)
    assert out["w"].shape == (1 << 18,) and str(out["n"]._data[0]) == "-0.0"
