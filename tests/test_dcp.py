"""Distributed checkpoints in one process: format, torch interoperability, atomicity, errors.

The multi-rank behaviour (parallel writes, resharding across world sizes, a rank killed
mid-save) is in tests/mpi/test_dcp.py and tests/test_dcp_reshard.py.
"""

from __future__ import annotations

import fcntl
import os
import pickle
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.distributed.checkpoint as dcp
from mpitensor import nn, optim
from mpitensor.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

try:
    import torch
    import torch.distributed.checkpoint as tdcp
except ImportError:  # pragma: no cover - torch is the oracle where installed
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (the oracle)")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _bits(x: Any) -> bytes:
    a = x.detach().cpu().numpy() if isinstance(x, mt.Tensor) else x.detach().numpy() \
        if torch is not None and isinstance(x, torch.Tensor) and x.dtype != torch.bfloat16 \
        else x.detach().view(torch.int16).numpy()
    return np.ascontiguousarray(a).tobytes()


def _sample() -> Dict[str, Any]:
    gen = np.random.default_rng(0)
    return {
        "w": mt.from_numpy(gen.standard_normal((5, 7)).astype(np.float32)),
        "d": mt.from_numpy(gen.standard_normal(3)),
        "h": mt.from_numpy(gen.standard_normal((2, 3)).astype(np.float16)),
        "bf": mt.ones(4, dtype=mt.bfloat16) * 1.5,
        "i": mt.arange(6, dtype=mt.int64).reshape(2, 3),
        "mask": mt.tensor([True, False, True]),
        "u8": mt.arange(5, dtype=mt.uint8),
        "c": mt.from_numpy(np.array([1 + 2j, 3 - 1j], dtype=np.complex64)),
        "scalar": mt.tensor(2.5),
        "empty": mt.zeros(0, 3),
        "nan": mt.tensor([float("nan"), float("inf"), -0.0]),
        "step": 7,
        "nested": {"lr": 0.1, "betas": (0.9, 0.99), "t": mt.tensor(3), "name": "adam"},
        "lst": [1, mt.zeros(2) + 4],
        "ints": [1, 2, 3],
        "none": None,
    }


def _blank(sd: Dict[str, Any]) -> Dict[str, Any]:
    """The same structure with every tensor zeroed and every other value replaced."""
    def blank(v: Any) -> Any:
        if isinstance(v, mt.Tensor):
            return mt.zeros(*v.shape, dtype=v.dtype)
        if isinstance(v, dict):
            return {k: blank(x) for k, x in v.items()}
        if isinstance(v, list) and any(isinstance(x, (mt.Tensor, dict)) for x in v):
            return [blank(x) for x in v]
        return "replaced"
    return blank(sd)


def _assert_same(got: Any, want: Any) -> None:
    if isinstance(want, mt.Tensor):
        assert isinstance(got, mt.Tensor) and got.dtype == want.dtype
        assert tuple(got.shape) == tuple(want.shape)
        assert got.numpy().tobytes() == want.numpy().tobytes()
    elif isinstance(want, dict):
        assert set(got) == set(want)
        for k in want:
            _assert_same(got[k], want[k])
    elif isinstance(want, list) and any(isinstance(x, mt.Tensor) for x in want):
        for g, w in zip(got, want):
            _assert_same(g, w)
    else:
        assert got == want


# ------------------------------------------------------------------ round trip and layout
def test_round_trip_is_bit_exact(tmp_path: Path) -> None:
    sd = _sample()
    meta = dcp.save(sd, checkpoint_id=tmp_path / "ck")
    assert sorted(os.listdir(tmp_path / "ck")) == [".metadata", "__0_0.distcp"]
    assert sorted(os.listdir(tmp_path)) == ["ck"]  # no staging directory left
    target = _blank(sd)
    dcp.load(target, checkpoint_id=tmp_path / "ck")
    _assert_same(target, sd)
    assert isinstance(meta.state_dict_metadata["w"], dcp.TensorStorageMetadata)
    assert meta.state_dict_metadata["w"].size == (5, 7)
    assert meta.state_dict_metadata["w"].chunks == [dcp.ChunkStorageMetadata((0, 0), (5, 7))]
    assert isinstance(meta.state_dict_metadata["step"], dcp.BytesStorageMetadata)
    assert meta.planner_data["nested.t"] == ("nested", "t")
    assert meta.planner_data["lst.1"] == ("lst", 1)


def test_in_place_into_parameters_keeps_identity(tmp_path: Path) -> None:
    model = nn.Linear(4, 3)
    dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "m")
    other = nn.Linear(4, 3)
    weight = other.weight
    sd = {"model": other.state_dict()}
    dcp.load(sd, checkpoint_id=tmp_path / "m")
    assert other.weight is weight and weight.requires_grad
    assert np.array_equal(other.weight.detach().numpy(), model.weight.detach().numpy())
    assert np.array_equal(other.bias.detach().numpy(), model.bias.detach().numpy())


def test_flattening_matches_torch(tmp_path: Path) -> None:
    """The entry names and paths are torch's for dicts, lists of tensors and leaves."""
    if torch is None:
        pytest.skip("torch is not installed (the oracle)")
    tsd = {"opt": {"state": {0: {"step": torch.tensor(3.0), "m": torch.ones(2)}},
                   "param_groups": [{"lr": 0.1, "params": [0]}]},
           "tup": (1, torch.ones(1)), "e": {}, "el": [], "lstd": [{"a": torch.ones(1)}],
           "ll": [[1, 2]], "lt": [[torch.ones(1)]]}
    tdcp.save(tsd, checkpoint_id=tmp_path / "t", no_dist=True)
    theirs = pickle.loads((tmp_path / "t" / ".metadata").read_bytes())
    msd = {"opt": {"state": {0: {"step": mt.tensor(3.0), "m": mt.ones(2)}},
                   "param_groups": [{"lr": 0.1, "params": [0]}]},
           "tup": (1, 2), "e": {}, "el": [], "lstd": [{"a": mt.ones(1)}],
           "ll": [[1, 2]], "lt": [[mt.ones(1)]]}
    ours = dcp.save(msd, checkpoint_id=tmp_path / "o")
    assert ours.planner_data == theirs.planner_data
    kinds = {k: type(v).__name__ for k, v in theirs.state_dict_metadata.items()}
    assert {k: type(v).__name__ for k, v in ours.state_dict_metadata.items()} == kinds


# ------------------------------------------------------------------ torch interoperability
def _torch_like(sd: Dict[str, Any], fill: bool) -> Dict[str, Any]:
    def conv(v: Any) -> Any:
        if isinstance(v, mt.Tensor):
            if v.dtype == mt.bfloat16:
                t = torch.from_numpy(v.numpy().view(np.int16).copy()).view(torch.bfloat16)
            else:
                t = torch.from_numpy(v.numpy().copy())
            return t if fill else torch.zeros_like(t)
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, list) and any(isinstance(x, mt.Tensor) for x in v):
            return [conv(x) for x in v]
        return v if fill else "replaced"
    return conv(sd)


@needs_torch
def test_torch_reads_our_checkpoint(tmp_path: Path) -> None:
    sd = _sample()
    dcp.save(sd, checkpoint_id=tmp_path / "ck")
    meta = pickle.loads((tmp_path / "ck" / ".metadata").read_bytes())
    assert type(meta).__module__ == "torch.distributed.checkpoint.metadata"
    target = _torch_like(sd, fill=False)
    tdcp.load(target, checkpoint_id=tmp_path / "ck", no_dist=True)
    want = _torch_like(sd, fill=True)
    for k in ("w", "d", "h", "bf", "i", "mask", "u8", "c", "scalar", "empty", "nan"):
        assert target[k].dtype == want[k].dtype and _bits(target[k]) == _bits(want[k]), k
    assert target["step"] == 7 and target["nested"]["betas"] == (0.9, 0.99)
    assert target["nested"]["name"] == "adam" and target["ints"] == [1, 2, 3]
    assert torch.equal(target["lst"][1], torch.full((2,), 4.0)) and target["none"] is None


@needs_torch
def test_we_read_torchs_checkpoint(tmp_path: Path) -> None:
    sd = _sample()
    tsd = _torch_like(sd, fill=True)
    tsd["wt"] = torch.arange(12.0).reshape(3, 4).t()  # a transposed chunk: strides differ
    tdcp.save(tsd, checkpoint_id=tmp_path / "ck", no_dist=True)
    target = _blank(sd)
    target["wt"] = mt.zeros(4, 3)
    dcp.load(target, checkpoint_id=tmp_path / "ck")
    want = dict(sd, wt=mt.arange(12.0).reshape(3, 4).t().contiguous())
    _assert_same(target, want)


@needs_torch
def test_torch_sharded_checkpoint_loads_resharded(tmp_path: Path) -> None:
    """Our LocalShard reads one part of a tensor torch saved whole, and the other way."""
    full = torch.arange(60.0).reshape(6, 10)
    tdcp.save({"x": full}, checkpoint_id=tmp_path / "t", no_dist=True)
    part = mt.zeros(2, 4)
    dcp.load({"x": dcp.LocalShard(part, (6, 10), (3, 5))}, checkpoint_id=tmp_path / "t")
    assert np.array_equal(part.numpy(), full[3:5, 5:9].numpy())


# ------------------------------------------------------------------ LocalShard
def test_local_shard_saves_its_box_and_loads_any_box(tmp_path: Path) -> None:
    full = np.arange(48, dtype=np.float64).reshape(6, 8)
    meta = dcp.save({"x": dcp.LocalShard(mt.from_numpy(full.copy()), (6, 8), (0, 0))},
                    checkpoint_id=tmp_path / "ck")
    assert meta.state_dict_metadata["x"].chunks == [dcp.ChunkStorageMetadata((0, 0), (6, 8))]
    dest = mt.zeros(3, 2, dtype=mt.float64)
    dcp.load({"x": dcp.LocalShard(dest, (6, 8), (2, 5))}, checkpoint_id=tmp_path / "ck")
    assert np.array_equal(dest.numpy(), full[2:5, 5:7])


def test_a_view_writes_only_its_own_elements(tmp_path: Path) -> None:
    big = mt.arange(100_000.0)
    meta = dcp.save({"v": big[10:12]}, checkpoint_id=tmp_path / "ck")
    info = meta.storage_data[dcp.MetadataIndex("v", (0,))]
    assert info.length < 4096  # the record, not the 800 kB storage under the view
    back = mt.zeros(2)
    dcp.load({"v": back}, checkpoint_id=tmp_path / "ck")
    assert back.tolist() == [10.0, 11.0]


def test_local_shard_rejects_a_box_outside_the_tensor() -> None:
    with pytest.raises(ValueError, match=r"\(3, 2\) at offsets \(4, 0\)"):
        dcp.LocalShard(mt.zeros(3, 2), (6, 2), (4, 0))


def test_a_lone_local_shard_that_does_not_tile_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cover 6 of its 12 elements"):
        dcp.save({"x": dcp.LocalShard(mt.zeros(3, 2), (6, 2), (0, 0))},
                 checkpoint_id=tmp_path / "ck")
    assert not (tmp_path / "ck").exists() and os.listdir(tmp_path) == []


# ------------------------------------------------------------------ bad input
def _saved(tmp_path: Path) -> Path:
    dcp.save({"a": mt.ones(2, 3), "b": mt.arange(4), "n": 3}, checkpoint_id=tmp_path / "ck")
    return tmp_path / "ck"


def test_missing_key_fails_before_any_write(tmp_path: Path) -> None:
    ck = _saved(tmp_path)
    a = mt.zeros(2, 3)
    with pytest.raises(ValueError, match="'extra' is missing from the checkpoint"):
        dcp.load({"a": a, "extra": mt.zeros(1)}, checkpoint_id=ck)
    assert not a.numpy().any()  # "a" fits, but nothing was written
    sd = {"a": a, "extra": mt.zeros(1)}
    dcp.load(sd, checkpoint_id=ck, planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert a.numpy().all()


def test_shape_and_dtype_mismatches_are_named(tmp_path: Path) -> None:
    ck = _saved(tmp_path)
    b = mt.zeros(4, dtype=mt.int64)
    with pytest.raises(ValueError, match=r"'a' has shape \(3, 2\) here but \(2, 3\)"):
        dcp.load({"a": mt.zeros(3, 2), "b": b}, checkpoint_id=ck)
    with pytest.raises(ValueError, match="'b' is int32 here but int64 in the checkpoint"):
        dcp.load({"a": mt.zeros(2, 3), "b": mt.zeros(4, dtype=mt.int32)}, checkpoint_id=ck)
    with pytest.raises(ValueError, match="'n' is a tensor here but an object"):
        dcp.load({"n": mt.zeros(1)}, checkpoint_id=ck)
    with pytest.raises(ValueError, match="'a' is int here but a tensor"):
        dcp.load({"a": 5}, checkpoint_id=ck)
    assert not b.numpy().any()


def test_checkpoint_id_that_is_not_a_directory(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_bytes(b"x")
    with pytest.raises(dcp.CheckpointError, match="is not a directory"):
        dcp.load({"a": mt.zeros(1)}, checkpoint_id=f)
    with pytest.raises(dcp.CheckpointError, match="exists and is not a directory"):
        dcp.save({"a": mt.zeros(1)}, checkpoint_id=f)
    with pytest.raises(dcp.CheckpointError, match="does not exist"):
        dcp.load({"a": mt.zeros(1)}, checkpoint_id=tmp_path / "nowhere")
    (tmp_path / "plain").mkdir()
    with pytest.raises(dcp.CheckpointError, match=r"\.metadata"):
        dcp.load({"a": mt.zeros(1)}, checkpoint_id=tmp_path / "plain")
    with pytest.raises(TypeError, match="checkpoint_id must be a path"):
        dcp.save({}, checkpoint_id=3)
    with pytest.raises(TypeError, match="a state_dict that is a dict, got list"):
        dcp.save([mt.zeros(1)], checkpoint_id=tmp_path / "x")
    with pytest.raises(TypeError, match="a state_dict that is a dict, got Tensor"):
        dcp.load(mt.zeros(1), checkpoint_id=tmp_path / "x")
    assert f.read_bytes() == b"x"


def test_save_refuses_a_directory_with_other_files(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("keep me")
    with pytest.raises(dcp.CheckpointError, match="notes.txt"):
        dcp.save({"a": mt.zeros(1)}, checkpoint_id=tmp_path / "d")
    assert (tmp_path / "d" / "notes.txt").read_text() == "keep me"


def test_truncated_data_file_is_found_before_loading(tmp_path: Path) -> None:
    ck = _saved(tmp_path)
    data = ck / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:100])
    a = mt.zeros(2, 3)
    with pytest.raises(ValueError, match="has 100 bytes"):
        dcp.load({"a": a}, checkpoint_id=ck)
    assert not a.numpy().any()


def test_foreign_metadata_is_refused_without_running_it(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(os.getcwd))
    with pytest.raises(dcp.CheckpointError, match="posix.getcwd"):
        dcp.load({"a": mt.zeros(1)}, checkpoint_id=tmp_path / "ck")


# ------------------------------------------------------------------ atomicity
class _Failing(dcp.FileSystemWriter):
    """Writes half a record, then fails (as a full disk would)."""

    def write_item(self, fh: Any, fqn: str, obj: Any) -> Any:
        if fqn == "b":
            fh.write(b"half a record")
            raise OSError(28, "No space left on device")
        return super().write_item(fh, fqn, obj)


def test_failed_save_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    ck = _saved(tmp_path)
    before = {n: (ck / n).read_bytes() for n in os.listdir(ck)}
    with pytest.raises(dcp.CheckpointError, match="No space left on device"):
        dcp.save({"a": mt.zeros(2, 3), "b": mt.zeros(4)}, storage_writer=_Failing(ck))
    assert {n: (ck / n).read_bytes() for n in os.listdir(ck)} == before
    assert os.listdir(tmp_path) == ["ck"]
    a = mt.zeros(2, 3)
    dcp.load({"a": a}, checkpoint_id=ck)
    assert a.numpy().all()


def test_save_replaces_the_previous_checkpoint_whole(tmp_path: Path) -> None:
    ck = _saved(tmp_path)
    dcp.save({"z": mt.ones(1)}, checkpoint_id=ck)
    meta = dcp.FileSystemReader(ck).read_metadata()
    assert set(meta.state_dict_metadata) == {"z"}
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_dead_staging_directories_are_removed_live_ones_kept(tmp_path: Path) -> None:
    dead = tmp_path / ".ck.dcp_abcdefgh.tmp"
    live = tmp_path / ".ck.dcp_livelive.tmp"
    for d in (dead, live):
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"partial")
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _saved(tmp_path)
        assert not dead.exists() and live.exists()
    finally:
        os.close(fd)
    dcp.save({"a": mt.zeros(1)}, checkpoint_id=tmp_path / "ck")
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_overwrite_false_refuses_an_existing_checkpoint(tmp_path: Path) -> None:
    ck = _saved(tmp_path)
    with pytest.raises(dcp.CheckpointError, match="overwrite=False"):
        dcp.save({"a": mt.zeros(1)}, storage_writer=dcp.FileSystemWriter(ck, overwrite=False))


# ------------------------------------------------------------------ state_dict helpers
def _model_and_optim(seed: int) -> Any:
    mt.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    return model, optim.Adam(model.parameters(), lr=0.01)


def _train(model: Any, opt: Any, steps: int) -> None:
    x = mt.from_numpy(np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32))
    for _ in range(steps):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def test_get_state_dict_keys_optimizer_state_by_parameter_name() -> None:
    model, opt = _model_and_optim(0)
    before = [p.detach().numpy().copy() for p in model.parameters()]
    msd, osd = get_state_dict(model, opt)
    assert list(msd) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert osd["param_groups"][0]["params"] == list(msd)
    assert set(osd["state"]["0.weight"]) == {"step", "exp_avg", "exp_avg_sq"}
    # the state was created by a step that changed nothing
    assert all(np.array_equal(b, p.detach().numpy()) for b, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
    flat = get_state_dict(model, opt, options=StateDictOptions(
        flatten_optimizer_state_dict=True))[1]
    assert flat["param_groups.0.bias.lr"] == 0.01 and "state.2.weight.exp_avg" in flat


@needs_torch
def test_state_dict_layout_matches_torch() -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict as torch_get

    model, opt = _model_and_optim(0)
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    topt = torch.optim.Adam(tmodel.parameters(), lr=0.01)
    tmsd, tosd = torch_get(tmodel, topt)
    msd, osd = get_state_dict(model, opt)
    assert list(msd) == list(tmsd)
    assert list(osd["state"]) == list(tosd["state"])
    assert {k: sorted(v) for k, v in osd["state"].items()} == \
        {k: sorted(v) for k, v in tosd["state"].items()}
    assert osd["param_groups"][0]["params"] == tosd["param_groups"][0]["params"]
    assert float(osd["state"]["0.bias"]["step"]) == float(tosd["state"]["0.bias"]["step"])


def test_resume_through_a_checkpoint_continues_identically(tmp_path: Path) -> None:
    model, opt = _model_and_optim(0)
    _train(model, opt, 3)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd, "epoch": 3}, checkpoint_id=tmp_path / "ck")
    _train(model, opt, 2)

    other, other_opt = _model_and_optim(5)
    msd2, osd2 = get_state_dict(other, other_opt)
    sd = {"model": msd2, "optim": osd2, "epoch": 0}
    dcp.load(sd, checkpoint_id=tmp_path / "ck")
    result = set_state_dict(other, other_opt, model_state_dict=sd["model"],
                            optim_state_dict=sd["optim"])
    assert not result.missing_keys and not result.unexpected_keys and sd["epoch"] == 3
    _train(other, other_opt, 2)
    for p, q in zip(model.parameters(), other.parameters()):
        assert p.detach().numpy().tobytes() == q.detach().numpy().tobytes()


def test_set_model_state_dict_strict_reports_missing_keys() -> None:
    model, _ = _model_and_optim(0)
    sd = dict(model.state_dict())
    del sd["2.bias"]
    with pytest.raises(RuntimeError, match="2.bias"):
        set_state_dict(model, [], model_state_dict=sd, optim_state_dict={})
    out = set_state_dict(model, [], model_state_dict=sd, optim_state_dict={},
                         options=StateDictOptions(strict=False))
    assert out.missing_keys == ["2.bias"]


def test_the_older_names_save_state_dict_and_load_state_dict(tmp_path: Path) -> None:
    """torch's deprecated save_state_dict / load_state_dict (the storage positional), which
    pytorch/examples' FSDP checkpoint handler still calls: they warn and do what save/load do."""
    model = nn.Linear(3, 2)
    with pytest.warns(FutureWarning, match="save_state_dict is deprecated"):
        dcp.save_state_dict({"model": model.state_dict()},
                            dcp.FileSystemWriter(str(tmp_path / "ck")))
    other = nn.Linear(3, 2)
    sd = {"model": other.state_dict()}
    with pytest.warns(FutureWarning, match="load_state_dict is deprecated"):
        dcp.load_state_dict(sd, dcp.FileSystemReader(str(tmp_path / "ck")))
    other.load_state_dict(sd["model"])
    assert mt.equal(other.weight, model.weight) and mt.equal(other.bias, model.bias)
