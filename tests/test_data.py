"""mpitensor.data: datasets, samplers, DataLoader, MNIST (IDX + verified download), Digits."""

from __future__ import annotations

import collections
import functools
import gzip
import hashlib
import http.server
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

import mpitensor
import mpitensor.distributed as dist
from mpitensor.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    Dataset,
    DistributedEvalSampler,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    default_collate,
    random_split,
)
from mpitensor.data import mnist as mnist_mod
from mpitensor.data.datasets import (
    MNIST,
    DatasetCorruptError,
    DatasetError,
    DatasetNotFoundError,
    Digits,
    DownloadError,
    read_idx,
)
from mpitensor.data.digits import _bilinear_matrix
from mpitensor.errors import MpiTensorError, NotInitializedError

ROOT = Path(__file__).resolve().parent.parent
SHARED_MNIST = ROOT.parent / "shared" / "data" / "mnist"
needs_mnist = pytest.mark.skipif(
    not (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").is_file(),
    reason=f"the shared MNIST test set is not at {SHARED_MNIST}")


def _ds(n: int = 23, feat: int = 3) -> TensorDataset:
    x = np.arange(n * feat, dtype=np.float32).reshape(n, feat)
    return TensorDataset(mpitensor.from_numpy(x), mpitensor.arange(n))


def _batches(loader) -> list:
    return [[t.numpy().copy() for t in b] for b in loader]


class _Plain(Dataset):
    """A dataset without gather: forces the DataLoader's general path."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        return self.inner[i]


# ------------------------------------------------------------------------------- datasets
def test_tensor_dataset_items_and_length_check():
    ds = _ds(5)
    x, y = ds[2]
    np.testing.assert_array_equal(x.numpy(), [6, 7, 8])
    assert y.item() == 2 and len(ds) == 5
    with pytest.raises(ValueError, match="Size mismatch"):
        TensorDataset(mpitensor.zeros(3, 2), mpitensor.zeros(4))
    with pytest.raises(ValueError):
        TensorDataset()
    wrapped = TensorDataset(np.ones((2, 2)))
    assert isinstance(wrapped.tensors[0], mpitensor.Tensor)


def test_subset_concat_and_gather():
    ds = _ds(10)
    sub = Subset(ds, [9, 3, 5])
    assert len(sub) == 3 and sub[0][1].item() == 9
    x, y = sub.gather(np.array([2, 0]))
    np.testing.assert_array_equal(y.numpy(), [5, 9])
    np.testing.assert_array_equal(x.numpy(), ds.tensors[0].numpy()[[5, 9]])
    assert not hasattr(Subset(_Plain(ds), [1]), "gather")
    cat = ConcatDataset([_ds(2), _ds(3)])
    assert len(cat) == 5 and cat[2][1].item() == 0 and cat[-1][1].item() == 2
    assert len(_ds(2) + _ds(4)) == 6
    with pytest.raises(IndexError):
        cat[5]


def test_random_split_counts_fractions_and_determinism():
    ds = _ds(10)
    a, b = random_split(ds, [7, 3], generator=mpitensor.Generator().manual_seed(1))
    assert sorted(a.indices + b.indices) == list(range(10))
    a2, _ = random_split(ds, [7, 3], generator=mpitensor.Generator().manual_seed(1))
    assert a.indices == a2.indices
    mpitensor.manual_seed(5)
    c = random_split(ds, [0.5, 0.3, 0.2])
    mpitensor.manual_seed(5)
    d = random_split(ds, [0.5, 0.3, 0.2])
    assert [len(s) for s in c] == [5, 3, 2] and [s.indices for s in c] == [s.indices for s in d]
    assert [len(s) for s in random_split(_ds(11), [0.5, 0.5])] == [6, 5]  # remainder round-robin
    with pytest.raises(ValueError, match="does not equal"):
        random_split(ds, [3, 3])


# ------------------------------------------------------------------------------- collate
def test_default_collate_types():
    out = default_collate([(np.zeros(2, np.float32), 1, 0.5, "a"), (np.ones(2, np.float32), 2,
                                                                      1.5, "b")])
    assert out[0].shape == (2, 2) and out[0].dtype == np.float32
    assert out[1].dtype == np.int64 and out[1].tolist() == [1, 2]
    assert out[2].dtype == np.float64 and out[3] == ["a", "b"]
    d = default_collate([{"x": mpitensor.zeros(3), "y": 0}, {"x": mpitensor.ones(3), "y": 1}])
    assert d["x"].shape == (2, 3) and d["y"].tolist() == [0, 1]
    Point = collections.namedtuple("Point", "a b")
    p = default_collate([Point(1, 2), Point(3, 4)])
    assert isinstance(p, Point) and p.a.tolist() == [1, 3]
    with pytest.raises(TypeError):
        default_collate([object()])


# ------------------------------------------------------------------------------- DataLoader
def test_loader_shapes_dtypes_len_drop_last():
    ds = _ds(23)
    dl = DataLoader(ds, batch_size=5)
    bs = _batches(dl)
    assert len(dl) == 5 == len(bs)
    assert [b[0].shape for b in bs] == [(5, 3)] * 4 + [(3, 3)]
    assert bs[0][0].dtype == np.float32 and bs[0][1].dtype == np.int64
    np.testing.assert_array_equal(np.concatenate([b[1] for b in bs]), np.arange(23))
    dl = DataLoader(ds, batch_size=5, drop_last=True)
    assert len(dl) == 4 == len(list(dl))
    assert len(DataLoader(ds, batch_size=23, drop_last=True)) == 1
    one = next(iter(DataLoader(ds)))
    assert one[0].shape == (1, 3)


def test_loader_shuffle_reproducible_with_manual_seed_and_generator():
    ds = _ds(40)
    mpitensor.manual_seed(123)
    a = _batches(DataLoader(ds, batch_size=8, shuffle=True))
    mpitensor.manual_seed(123)
    b = _batches(DataLoader(ds, batch_size=8, shuffle=True))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u[1], v[1])
    order = np.concatenate([u[1] for u in a])
    assert sorted(order.tolist()) == list(range(40)) and order.tolist() != list(range(40))
    g1, g2 = mpitensor.Generator().manual_seed(7), mpitensor.Generator().manual_seed(7)
    dl1 = DataLoader(ds, batch_size=8, shuffle=True, generator=g1)
    dl2 = DataLoader(ds, batch_size=8, shuffle=True, generator=g2)
    e1 = [np.concatenate([u[1] for u in _batches(dl1)]) for _ in range(2)]
    e2 = [np.concatenate([u[1] for u in _batches(dl2)]) for _ in range(2)]
    np.testing.assert_array_equal(e1[0], e2[0])
    np.testing.assert_array_equal(e1[1], e2[1])
    assert e1[0].tolist() != e1[1].tolist()  # a new order every epoch


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_fast_path_equals_general_path(shuffle, drop_last):
    ds = _ds(29)
    runs = []
    for dataset in (ds, _Plain(ds)):
        dl = DataLoader(dataset, batch_size=6, shuffle=shuffle, drop_last=drop_last,
                        generator=mpitensor.Generator().manual_seed(3))
        runs.append(_batches(dl))
    assert len(runs[0]) == len(runs[1])
    for fast, slow in zip(*runs):
        for f, s in zip(fast, slow):
            assert f.dtype == s.dtype
            np.testing.assert_array_equal(f, s)


def test_fast_path_is_one_gather_per_batch():
    calls = []

    class Counting(TensorDataset):
        def __getitem__(self, i):
            raise AssertionError("per-sample access on the fast path")

        def gather(self, indices):
            calls.append(len(indices))
            return super().gather(indices)

    ds = Counting(mpitensor.zeros(10, 2), mpitensor.arange(10))
    assert len(list(DataLoader(ds, batch_size=4, shuffle=True))) == 3
    assert calls == [4, 4, 2]


def test_loader_argument_errors_and_options():
    ds = _ds(10)
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        DataLoader(ds, shuffle=True, sampler=SequentialSampler(ds))
    with pytest.raises(ValueError, match="batch_sampler"):
        DataLoader(ds, batch_size=2, batch_sampler=BatchSampler(SequentialSampler(ds), 2, False))
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(ds, batch_size=0)
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(ds, num_workers=-1)
    bsl = DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 4, True))
    assert [b[1].tolist() for b in bsl] == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(bsl) == 2
    # num_workers > 0 runs in-process with identical results
    seen = []
    w = DataLoader(ds, batch_size=3, num_workers=2, pin_memory=True, worker_init_fn=seen.append)
    assert [b[1].tolist() for b in w] == [b[1].tolist() for b in DataLoader(ds, batch_size=3)]
    assert seen == [0]
    # batch_size=None: samples, converted but not batched
    items = list(DataLoader(ds, batch_size=None))
    assert len(items) == 10 and items[3][1].item() == 3
    # custom collate_fn
    sums = list(DataLoader(ds, batch_size=5, collate_fn=lambda b: sum(int(s[1]) for s in b)))
    assert sums == [10, 35]


def test_iterable_dataset():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(7))

    assert [b.tolist() for b in DataLoader(Stream(), batch_size=3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert len(list(DataLoader(Stream(), batch_size=3, drop_last=True))) == 2
    with pytest.raises(ValueError):
        DataLoader(Stream(), shuffle=True)


# ------------------------------------------------------------------------------- samplers
def test_basic_samplers():
    assert list(SequentialSampler(range(4))) == [0, 1, 2, 3]
    g = mpitensor.Generator().manual_seed(0)
    r = list(RandomSampler(range(6), generator=g))
    assert sorted(r) == list(range(6))
    rr = list(RandomSampler(range(3), replacement=True, num_samples=20,
                            generator=mpitensor.Generator().manual_seed(0)))
    assert len(rr) == 20 and set(rr) <= {0, 1, 2}
    more = list(RandomSampler(range(3), num_samples=7, generator=g))
    assert len(more) == 7 and sorted(more[:3]) == [0, 1, 2]
    assert sorted(SubsetRandomSampler([4, 8, 9])) == [4, 8, 9]
    assert list(BatchSampler(range(5), 2, False)) == [[0, 1], [2, 3], [4]]
    assert list(BatchSampler(range(5), 2, True)) == [[0, 1], [2, 3]]
    assert len(BatchSampler(range(5), 2, False)) == 3
    with pytest.raises(ValueError):
        RandomSampler(range(3), num_samples=0)


SIZES = [1, 2, 5, 7, 10, 11, 13]


@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_matches_torch_without_shuffle(drop_last):
    tdata = pytest.importorskip("torch.utils.data")
    for n in SIZES:
        for world in range(1, 5):
            for rank in range(world):
                mine = DistributedSampler(range(n), world, rank, shuffle=False,
                                          drop_last=drop_last)
                ref = tdata.DistributedSampler(range(n), world, rank, shuffle=False,
                                               drop_last=drop_last)
                assert list(mine) == list(ref), (n, world, rank)
                assert len(mine) == len(ref) and mine.total_size == ref.total_size


def test_distributed_sampler_padding_arithmetic():
    # 7 samples on 3 ranks: padded to 9 by wrap-around, or truncated to 6 with drop_last
    shards = [list(DistributedSampler(range(7), 3, r, shuffle=False)) for r in range(3)]
    assert shards == [[0, 3, 6], [1, 4, 0], [2, 5, 1]]
    shards = [list(DistributedSampler(range(7), 3, r, shuffle=False, drop_last=True))
              for r in range(3)]
    assert shards == [[0, 3], [1, 4], [2, 5]]
    # padding longer than the dataset wraps repeatedly (2 samples, 4 ranks... 5 ranks)
    assert [list(DistributedSampler(range(2), 5, r, shuffle=False)) for r in range(5)] == \
        [[0], [1], [0], [1], [0]]
    for n in SIZES:
        for world in range(1, 5):
            s = DistributedSampler(range(n), world, 0, seed=3)
            union = sum((list(DistributedSampler(range(n), world, r, seed=3))
                         for r in range(world)), [])
            assert len(union) == s.total_size == -(-n // world) * world
            assert set(union) == set(range(n))


def test_distributed_sampler_shuffle_determinism_and_epochs():
    a = DistributedSampler(range(50), 2, 1, seed=9)
    b = DistributedSampler(range(50), 2, 1, seed=9)
    assert list(a) == list(b) and list(a) == list(a)  # same epoch -> same order
    e0 = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) and list(a) != e0
    assert list(DistributedSampler(range(50), 2, 1, seed=10)) != e0
    ranks = [list(DistributedSampler(range(50), 2, r, seed=9)) for r in range(2)]
    assert sorted(ranks[0] + ranks[1]) == list(range(50))
    # the permutation is seed + epoch: epoch 1 with seed 9 equals epoch 0 with seed 10
    c = DistributedSampler(range(50), 2, 1, seed=10)
    assert list(c) == list(a)


def test_distributed_sampler_errors():
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(range(4), num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="Invalid rank"):
        DistributedSampler(range(4), num_replicas=2, rank=-1)
    with pytest.raises(ValueError):
        DistributedSampler(range(4), 2, 0, even=False, drop_last=True)


def test_distributed_sampler_needs_process_group(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(NotInitializedError, match="init_process_group"):
        DistributedSampler(range(4))
    DistributedSampler(range(4), num_replicas=2, rank=1)  # explicit values need no group


@pytest.mark.parametrize("shuffle", [False, True])
def test_eval_mode_covers_each_index_once(shuffle):
    for n in SIZES + [0]:
        for world in range(1, 5):
            shards = [list(DistributedSampler(range(n), world, r, shuffle=shuffle, even=False))
                      for r in range(world)]
            assert sorted(sum(shards, [])) == list(range(n))
            assert max(map(len, shards)) - min(map(len, shards)) <= 1
            assert [len(DistributedEvalSampler(range(n), world, r)) for r in range(world)] == \
                [len(s) for s in shards]
    assert list(DistributedEvalSampler(range(7), 3, 1)) == [1, 4]


@pytest.mark.parametrize("loader_drop_last", [False, True])
def test_state_dict_resumes_mid_epoch(loader_drop_last):
    ds = _ds(37)

    def make():
        s = DistributedSampler(ds, num_replicas=2, rank=1, seed=4)
        return s, DataLoader(ds, batch_size=4, sampler=s, drop_last=loader_drop_last)

    s, dl = make()
    s.set_epoch(3)
    full = [b[1].numpy().tolist() for b in dl]
    s.set_epoch(4)
    next_epoch = [b[1].numpy().tolist() for b in dl]

    s, dl = make()
    s.set_epoch(3)
    seen, state = [], None
    for k, b in enumerate(dl):
        seen.append(b[1].numpy().tolist())
        if k == 1:
            state = s.state_dict()  # taken while the batch is in hand, as a checkpoint would be
            break
    assert state["epoch"] == 3 and state["position"] == 8

    s2, dl2 = make()
    s2.load_state_dict(state)
    s2.set_epoch(3)  # the usual loop head: same epoch keeps the resume point
    rest = [b[1].numpy().tolist() for b in dl2]
    assert seen + rest == full
    assert len(rest) == len(full) - 2
    s2.set_epoch(4)
    assert [b[1].numpy().tolist() for b in dl2] == next_epoch  # whole again
    # a plain `for i in sampler` counts too, and a finished epoch resumes to nothing
    s3 = DistributedSampler(ds, 2, 1, seed=4)
    it = iter(s3)
    first = [next(it) for _ in range(5)]
    s4 = DistributedSampler(ds, 2, 1, seed=4)
    s4.load_state_dict(s3.state_dict())
    assert first + list(s4) == list(DistributedSampler(ds, 2, 1, seed=4))
    s4.load_state_dict(s4.state_dict() | {"position": len(s4)})
    assert list(s4) == []


def _consume(world: int, n: int, steps: int, **kw) -> tuple:
    """``world`` ranks taking ``steps`` indices each (as DDP steps do); their samplers and the
    indices they took."""
    samplers = [DistributedSampler(range(n), world, r, **kw) for r in range(world)]
    taken = []
    for s in samplers:
        it = iter(s)
        taken += [next(it) for _ in range(steps)]
    return samplers, taken


@pytest.mark.parametrize("old,new", [(2, 3), (4, 2), (3, 1), (2, 5)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_mid_epoch_at_another_world_size_covers_the_rest_once(old, new, drop_last):
    """Saved by ``old`` ranks after 3 steps, loaded by ``new`` ranks: together the new ranks
    yield every index the old ones had not taken exactly once (plus torch's padding to an
    even split, taken from the epoch's start), in an even split; the next epoch is exactly
    what a run of ``new`` ranks would have."""
    n, kw = 23, {"shuffle": True, "seed": 7, "drop_last": drop_last}
    samplers, taken = _consume(old, n, 3, **kw)
    state = samplers[0].state_dict()
    assert state["position"] == 3 and state["num_replicas"] == old
    fresh = [DistributedSampler(range(n), new, r, **kw) for r in range(new)]
    for s in fresh:
        s.load_state_dict(state)
    remaining = [s.remaining() for s in fresh]
    rest = [list(s) for s in fresh]
    assert remaining == [len(r) for r in rest]  # what a training loop counts its steps by
    assert len({len(r) for r in rest}) == 1  # an even split: the ranks step together
    order = list(DistributedSampler(range(n), 1, 0, **kw))  # the epoch's order
    left = order[3 * old:]
    got = [i for r in rest for i in r]
    if drop_last:
        assert len(got) == len(left) // new * new and set(got) <= set(left)
        assert len(set(got)) == len(got)
    else:
        assert set(got) == set(left) and len(got) == -(-len(left) // new) * new
    assert not set(got) & set(taken[:3 * old])
    # the next epoch is the one a fresh run of the new size deals
    for r, s in enumerate(fresh):
        s.set_epoch(1)
        d = DistributedSampler(range(n), new, r, **kw)
        d.set_epoch(1)
        assert list(s) == list(d)


def test_remaining_counts_what_the_next_pass_hands_out():
    """remaining(): the whole shard for a fresh epoch, the rest after a same-size resume, the
    whole shard again in the next epoch; never negative."""
    s = DistributedSampler(range(10), 3, 1, shuffle=True, seed=2)
    assert s.remaining() == len(s) == 4
    it = iter(s)
    next(it), next(it)
    t = DistributedSampler(range(10), 3, 1, shuffle=True, seed=2)
    t.load_state_dict(s.state_dict())
    assert t.remaining() == 2 == len(list(t))
    t.set_epoch(1)
    assert t.remaining() == 4 == len(list(t))
    e = DistributedEvalSampler(range(10), num_replicas=3, rank=2)
    assert e.remaining() == 3 == len(list(e))


def test_reshard_twice_keeps_count_of_what_was_consumed():
    """2 ranks take 2 each, 3 ranks resume and take 2 each, 4 ranks resume: what is left is
    the epoch after its first 2*2 + 2*3 positions."""
    n, kw = 30, {"shuffle": True, "seed": 3}
    two, _ = _consume(2, n, 2, **kw)
    three = [DistributedSampler(range(n), 3, r, **kw) for r in range(3)]
    for s in three:
        s.load_state_dict(two[0].state_dict())
        it = iter(s)
        next(it), next(it)
    state = three[0].state_dict()
    assert state["offset"] == 4 and state["position"] == 2
    four = [DistributedSampler(range(n), 4, r, **kw) for r in range(4)]
    for s in four:
        s.load_state_dict(state)
    order = list(DistributedSampler(range(n), 1, 0, **kw))
    assert sorted(i for s in four for i in s) == sorted(order[10:])  # 20 left: 5 each


def test_state_dict_rejects_other_settings():
    s = DistributedSampler(range(10), 2, 0)
    with pytest.raises(ValueError, match="position 6 is outside"):
        DistributedSampler(range(10), 3, 0).load_state_dict({**s.state_dict(), "position": 6})
    with pytest.raises(ValueError, match="dataset_len"):
        DistributedSampler(range(11), 3, 0).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="seed"):
        DistributedSampler(range(10), 2, 0, seed=1).load_state_dict(s.state_dict())
    with pytest.raises(TypeError):
        s.load_state_dict({"foo": 1})


# ------------------------------------------------------------------------------- MNIST
def _write_idx(path: Path, arr: np.ndarray, magic: int, gz: bool = True, cut: int = 0) -> Path:
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    raw = header + arr.astype(np.uint8).tobytes()
    raw = raw[:len(raw) - cut]
    if gz:
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)
    return path


def _fake_split(root: Path, prefix: str, n: int, gz: bool = True, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    sfx = ".gz" if gz else ""
    _write_idx(root / f"{prefix}-images-idx3-ubyte{sfx}", images, 2051, gz)
    _write_idx(root / f"{prefix}-labels-idx1-ubyte{sfx}", labels, 2049, gz)
    return images, labels


@needs_mnist
def test_mnist_shared_test_set():
    ds = MNIST(SHARED_MNIST, train=False)
    assert len(ds) == 10000
    assert ds.data.shape == (10000, 28, 28) and ds.data.dtype == np.uint8
    assert ds.targets.dtype == np.int64
    hist = np.bincount(ds.targets.numpy(), minlength=10)
    assert hist.sum() == 10000 and hist.min() > 850 and hist.max() < 1200
    assert hist.tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    img, label = ds[0]
    assert img.shape == (1, 28, 28) and img.dtype == np.float32 and label == 7
    expect = (ds.data.numpy()[0].astype(np.float32) / 255 - 0.1307) / 0.3081
    np.testing.assert_allclose(img.numpy()[0], expect, rtol=1e-5, atol=1e-5)
    x, y = ds.arrays()
    assert x.shape == (10000, 1, 28, 28) and abs(float(x.mean())) < 0.05
    assert 0.9 < float(x.std()) < 1.1
    xb, yb = next(iter(DataLoader(ds, batch_size=64)))
    np.testing.assert_array_equal(xb.numpy(), x[:64])
    np.testing.assert_array_equal(yb.numpy(), y[:64])
    raw = MNIST(SHARED_MNIST, train=False, normalize=False)[0][0].numpy()
    assert raw.min() == 0.0 and raw.max() == 1.0


@needs_mnist
def test_mnist_sha256sums_match_files_and_constants():
    sums = {}
    for line in (SHARED_MNIST / "SHA256SUMS").read_text().splitlines():
        if line.strip():
            digest, name = line.split()
            sums[name.lstrip("*")] = digest
    known = {name: (size, sha) for name, size, sha in mnist_mod.MNIST_RESOURCES}
    for name, digest in sums.items():
        data = (SHARED_MNIST / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest
        assert known[name] == (len(data), digest)


def test_mnist_raw_and_torchvision_layout(tmp_path):
    images, labels = _fake_split(tmp_path, "t10k", 12, gz=False)
    ds = MNIST(tmp_path, train=False)
    np.testing.assert_array_equal(ds.data.numpy(), images)
    np.testing.assert_array_equal(ds.targets.numpy(), labels)
    tv = tmp_path / "tv"
    (tv / "MNIST" / "raw").mkdir(parents=True)
    images, _ = _fake_split(tv / "MNIST" / "raw", "train", 5)
    np.testing.assert_array_equal(MNIST(tv, train=True).data.numpy(), images)


def test_mnist_transforms_apply_on_both_paths(tmp_path):
    _fake_split(tmp_path, "t10k", 9)
    ds = MNIST(tmp_path, train=False, transform=lambda t: t * 2, target_transform=lambda y: y + 1)
    plain = MNIST(tmp_path, train=False)
    x, y = ds[3]
    np.testing.assert_allclose(x.numpy(), plain[3][0].numpy() * 2)
    assert y == plain[3][1] + 1
    xb, yb = next(iter(DataLoader(ds, batch_size=9)))
    np.testing.assert_allclose(xb.numpy(), plain.arrays()[0] * 2)
    np.testing.assert_array_equal(yb.numpy(), plain.arrays()[1] + 1)


def test_mnist_missing_files_message(tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        MNIST(tmp_path / "nowhere", train=True)
    msg = str(info.value)
    assert "train-images-idx3-ubyte.gz" in msg and "train-labels-idx1-ubyte.gz" in msg
    assert str((tmp_path / "nowhere").resolve()) in msg and "download=True" in msg
    assert isinstance(info.value, (MpiTensorError, OSError, FileNotFoundError))


@pytest.mark.parametrize("case", ["truncated", "garbage", "wrong_magic", "count_mismatch",
                                  "bad_gzip", "wrong_dims"])
def test_mnist_corrupt_files(tmp_path, case):
    images, labels = _fake_split(tmp_path, "t10k", 6)
    img = tmp_path / "t10k-images-idx3-ubyte.gz"
    lbl = tmp_path / "t10k-labels-idx1-ubyte.gz"
    if case == "truncated":
        _write_idx(img, images, 2051, cut=100)
        match = "truncated"
    elif case == "garbage":
        img.write_bytes(gzip.compress(b"hello, this is not an IDX file at all"))
        match = "magic"
    elif case == "wrong_magic":
        _write_idx(img, images, 2049)  # a labels magic on the images file
        match = "magic number 2049"
    elif case == "count_mismatch":
        _write_idx(lbl, labels[:5], 2049)
        match = "6 images but"
    elif case == "bad_gzip":
        img.write_bytes(gzip.compress(b"x" * 1000)[:-12])
        match = "gzip"
    else:
        _write_idx(img, np.zeros((6, 14, 14), np.uint8), 2051)
        match = "28, 28"
    with pytest.raises(DatasetCorruptError, match=match) as info:
        MNIST(tmp_path, train=False)
    assert isinstance(info.value, DatasetError) and isinstance(info.value, ValueError)


def test_read_idx_generic(tmp_path):
    p = tmp_path / "x.idx"
    arr = np.arange(24, dtype=">i2").reshape(2, 3, 4)
    p.write_bytes(bytes([0, 0, 0x0B, 3]) + b"".join(d.to_bytes(4, "big") for d in arr.shape)
                  + arr.tobytes())
    out = read_idx(p)
    np.testing.assert_array_equal(out, np.arange(24).reshape(2, 3, 4))
    assert out.dtype == np.int16
    with pytest.raises(DatasetNotFoundError):
        read_idx(tmp_path / "none")


# ------------------------------------------------------------------------------- download
class _Server:
    """A local HTTP server on a thread, serving one directory; counts requests."""

    def __init__(self, directory: Path) -> None:
        self.requests: list = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(directory)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A served directory holding the real t10k files and small synthetic train files."""
    if not (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"the shared MNIST test set is not at {SHARED_MNIST}")
    served = tmp_path / "served"
    served.mkdir()
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(SHARED_MNIST / name, served / name)
    _fake_split(served, "train", 20, seed=1)
    resources = []
    for name, size, sha in mnist_mod.MNIST_RESOURCES:
        if name.startswith("train"):  # the real train sums stay in MNIST_RESOURCES
            data = (served / name).read_bytes()
            size, sha = len(data), hashlib.sha256(data).hexdigest()
        resources.append((name, size, sha))
    monkeypatch.setattr(mnist_mod, "MNIST_RESOURCES", tuple(resources))
    server = _Server(served)
    yield server, served
    server.close()


def test_download_from_local_mirror(mirror, tmp_path, monkeypatch):
    server, served = mirror
    root = tmp_path / "root"
    dead = "http://127.0.0.1:9/"  # nothing listens: the next mirror must be tried
    ds = MNIST(root, train=False, download=True, mirrors=[dead, server.url])
    assert len(ds) == 10000
    assert sorted(p.name for p in root.iterdir()) == sorted(n for n, _, _ in
                                                            mnist_mod.MNIST_RESOURCES)
    assert len(MNIST(root, train=True).targets) == 20
    n = len(server.requests)
    assert n == 4
    monkeypatch.setenv("MPITENSOR_MNIST_MIRRORS", server.url)
    MNIST(root, train=True, download=True)  # verified files are kept, nothing fetched
    assert len(server.requests) == n
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    MNIST(root, train=False, download=True)  # env var names the mirror
    assert len(server.requests) == n + 1


def test_download_corrupt_file_leaves_nothing(mirror, tmp_path):
    server, served = mirror
    bad = served / "bad"
    bad.mkdir()
    for p in served.glob("*.gz"):
        shutil.copy(p, bad / p.name)
    blob = bytearray((bad / "t10k-labels-idx1-ubyte.gz").read_bytes())
    blob[100] ^= 0xFF
    (bad / "t10k-labels-idx1-ubyte.gz").write_bytes(bytes(blob))
    root = tmp_path / "root"
    with pytest.raises(DownloadError) as info:
        MNIST(root, train=False, download=True, mirrors=[server.url + "bad/"])
    msg = str(info.value)
    assert "t10k-labels-idx1-ubyte.gz" in msg and "SHA-256" in msg
    assert str(root.resolve()) in msg
    names = sorted(p.name for p in root.iterdir())
    assert "t10k-labels-idx1-ubyte.gz" not in names
    assert not [n for n in names if n.endswith(".part")]
    # a good mirror after the bad one repairs it
    MNIST(root, train=False, download=True, mirrors=[server.url + "bad/", server.url])
    assert (root / "t10k-labels-idx1-ubyte.gz").read_bytes() == \
        (served / "t10k-labels-idx1-ubyte.gz").read_bytes()


def test_download_needs_only_the_split_asked_for(mirror, tmp_path, caplog):
    server, served = mirror
    only_test = served / "only_test"
    only_test.mkdir()
    for p in served.glob("t10k-*.gz"):
        shutil.copy(p, only_test / p.name)
    root = tmp_path / "root"
    with caplog.at_level("WARNING", logger="mpitensor.data"):
        ds = MNIST(root, train=False, download=True, mirrors=[server.url + "only_test/"])
    assert len(ds) == 10000 and "train-images-idx3-ubyte.gz" in caplog.text
    with pytest.raises(DownloadError, match="train-labels"):
        MNIST(root, train=True, download=True, mirrors=[server.url + "only_test/"])
    # uncompressed files put there by hand count as present: nothing is fetched for them
    _fake_split(root, "train", 4, gz=False)
    n = len(server.requests)
    assert len(MNIST(root, train=True, download=True, mirrors=[server.url])) == 4
    assert len(server.requests) == n


def test_download_offline_error(tmp_path):
    with pytest.raises(DownloadError) as info:
        MNIST(tmp_path / "r", train=False, download=True, mirrors=["http://127.0.0.1:9/"],
              timeout=5)
    msg = str(info.value)
    for name, _, _ in mnist_mod.MNIST_RESOURCES:
        assert name in msg
    assert str((tmp_path / "r").resolve()) in msg and "Digits" in msg
    assert isinstance(info.value, MpiTensorError) and isinstance(info.value, OSError)
    assert not list((tmp_path / "r").iterdir())


# ------------------------------------------------------------------------------- Digits
def test_digits_offline_mnist_like():
    pytest.importorskip("sklearn")
    tr, te = Digits(train=True), Digits(train=False)
    assert len(tr) == 1438 and len(te) == 359
    assert tr.data.shape == (1438, 28, 28) and tr.data.dtype == np.uint8
    assert tr.targets.dtype == np.int64 and set(tr.targets.tolist()) == set(range(10))
    d = tr.data.numpy()
    assert d[:, :4].max() == 0 and d[:, -4:].max() == 0 and d.max() == 255  # MNIST-like frame
    img, label = te[0]
    assert img.shape == (1, 28, 28) and img.dtype == np.float32 and isinstance(label, int)
    np.testing.assert_allclose(img.numpy()[0], (te.data.numpy()[0] / 255 - 0.1307) / 0.3081,
                               rtol=1e-5, atol=1e-5)
    # fixed split: repeatable, disjoint and complete
    from sklearn.datasets import load_digits

    assert np.array_equal(Digits(train=True).data.numpy(), d)
    assert len(tr) + len(te) == len(load_digits().target)
    # the bilinear matrix keeps constants constant and matches torch's interpolate
    m = _bilinear_matrix(8, 20)
    np.testing.assert_allclose(m.sum(axis=1), 1.0)
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).random((1, 1, 8, 8))
    ref = torch.nn.functional.interpolate(torch.from_numpy(x), size=(20, 20), mode="bilinear",
                                          align_corners=False).numpy()[0, 0]
    np.testing.assert_allclose(m @ x[0, 0] @ m.T, ref, rtol=1e-10, atol=1e-12)
    xb, yb = next(iter(DataLoader(te, batch_size=50)))
    assert xb.shape == (50, 1, 28, 28) and yb.dtype == np.int64


def test_utils_data_alias():
    from mpitensor.utils.data import DataLoader as DL
    from mpitensor.utils.data import DistributedSampler as DS
    from mpitensor.utils.data import TensorDataset as TD

    assert DL is DataLoader and DS is DistributedSampler and TD is TensorDataset
    # torch's submodule path, as the official DDP examples import it
    import mpitensor.utils.data.distributed as dmod
    from mpitensor.utils.data.distributed import DistributedSampler as DS2

    assert DS2 is DistributedSampler and dmod.DistributedSampler is DistributedSampler
