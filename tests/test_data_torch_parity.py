"""mpitensor.data against torch.utils.data: the same indices, batches and collated values.

Each test builds the mpitensor object and the torch one with the same arguments, as a torch
user would, and compares what they give: index sequences and shard contents exactly, batches
by shape, dtype and value. Shuffled orders are not compared element by element (mpitensor
draws them from its own NumPy-based generator); only what both guarantee is (a permutation,
the lengths).
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import data as mdata

torch = pytest.importorskip("torch", reason="torch is the oracle these tests compare with")
tdata = pytest.importorskip("torch.utils.data", reason="torch.utils.data is the oracle")

LENGTHS = [0, 1, 2, 5, 7, 8, 13, 64, 101]
Pair = collections.namedtuple("Pair", "left right")


def _same(ours, theirs, where: str = "batch") -> None:
    """Assert that a collated mpitensor structure equals torch's: types, shapes, dtypes, values."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, mt.Tensor), f"{where}: {type(ours).__name__} is not a Tensor"
        assert tuple(ours.shape) == tuple(theirs.shape), where
        assert np.dtype(ours.dtype).name == str(theirs.dtype).removeprefix("torch."), where
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=where)
    elif isinstance(theirs, dict):
        assert type(ours) is type(theirs) and list(ours) == list(theirs), where
        for key in theirs:
            _same(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), \
            f"{where}: {type(ours).__name__} vs {type(theirs).__name__}"
        for k, (o, t) in enumerate(zip(ours, theirs)):
            _same(o, t, f"{where}[{k}]")
    else:
        assert ours == theirs, where


# ------------------------------------------------------------------------------- samplers
@pytest.mark.parametrize("n", LENGTHS)
def test_sequential_sampler(n):
    ours, theirs = mdata.SequentialSampler(range(n)), tdata.SequentialSampler(range(n))
    assert list(ours) == list(theirs) and len(ours) == len(theirs)


@pytest.mark.parametrize("n", [1, 5, 7, 13, 64])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 5, 64, 100])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler(n, batch_size, drop_last):
    cases = [
        (mdata.SequentialSampler(range(n)), tdata.SequentialSampler(range(n))),
        (list(range(n - 1, -1, -1)), list(range(n - 1, -1, -1))),  # any iterable of indices
        (range(0, 2 * n, 2), range(0, 2 * n, 2)),
    ]
    for ours_src, theirs_src in cases:
        ours = mdata.BatchSampler(ours_src, batch_size, drop_last)
        theirs = tdata.BatchSampler(theirs_src, batch_size, drop_last)
        assert list(ours) == list(theirs), (type(ours_src).__name__, n, batch_size, drop_last)
        assert len(ours) == len(theirs)
        assert all(type(i) is int for batch in ours for i in batch)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_batch_sampler_rejects_what_torch_rejects(bad):
    with pytest.raises(ValueError):
        tdata.BatchSampler(range(4), bad, False)
    with pytest.raises(ValueError):
        mdata.BatchSampler(range(4), bad, False)


@pytest.mark.parametrize("n", [0, 1, 7, 16, 101])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_shards_unshuffled(n, replicas, drop_last):
    for rank in range(replicas):
        ours = mdata.DistributedSampler(range(n), replicas, rank, shuffle=False,
                                        drop_last=drop_last)
        theirs = tdata.DistributedSampler(range(n), replicas, rank, shuffle=False,
                                          drop_last=drop_last)
        for epoch in (0, 5):  # without shuffling the epoch changes nothing, in both
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs), (n, replicas, rank, drop_last, epoch)
        assert len(ours) == len(theirs) == ours.num_samples == theirs.num_samples
        assert ours.total_size == theirs.total_size


@pytest.mark.parametrize("n", [1, 10, 33])
@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_shuffled_shapes(n, replicas, drop_last):
    """Shuffled: other permutations than torch's, but the same shard lengths and coverage."""
    ours = [mdata.DistributedSampler(range(n), replicas, r, seed=4, drop_last=drop_last)
            for r in range(replicas)]
    theirs = [tdata.DistributedSampler(range(n), replicas, r, seed=4, drop_last=drop_last)
              for r in range(replicas)]
    assert [len(list(s)) for s in ours] == [len(list(s)) for s in theirs]
    union = sorted(sum((list(s) for s in ours), []))
    assert set(union) == set(sum((list(s) for s in theirs), [])) or drop_last
    assert len(union) == sum(len(list(s)) for s in theirs)


def test_distributed_sampler_rejects_bad_rank_like_torch():
    for rank in (-1, 3):
        with pytest.raises(ValueError):
            tdata.DistributedSampler(range(6), num_replicas=3, rank=rank)
        with pytest.raises(ValueError, match=str(rank)):
            mdata.DistributedSampler(range(6), num_replicas=3, rank=rank)


@pytest.mark.parametrize("n, num_samples", [(5, None), (5, 3), (4, 9), (3, 13)])
def test_random_sampler_lengths_and_coverage(n, num_samples):
    g = mt.Generator().manual_seed(0)
    ours = list(mdata.RandomSampler(range(n), num_samples=num_samples, generator=g))
    theirs = list(tdata.RandomSampler(range(n), num_samples=num_samples,
                                      generator=torch.Generator().manual_seed(0)))
    assert len(ours) == len(theirs)
    assert len(set(ours[:n])) == len(ours[:n])  # no repeats within a permutation
    # both hand out whole permutations first, the last one cut short
    for start in range(0, len(ours) - n + 1, n):
        assert sorted(ours[start:start + n]) == sorted(theirs[start:start + n]) == list(range(n))
    assert len(mdata.RandomSampler(range(n), num_samples=num_samples)) == \
        len(tdata.RandomSampler(range(n), num_samples=num_samples))


def test_subset_random_sampler_is_a_permutation_of_the_subset():
    idx = [9, 2, 40, 7, 7]
    ours = mdata.SubsetRandomSampler(idx, generator=mt.Generator().manual_seed(1))
    theirs = tdata.SubsetRandomSampler(idx)
    assert sorted(ours) == sorted(theirs) == sorted(idx) and len(ours) == len(theirs)


# ------------------------------------------------------------------------------- collate
def _samples(k: int) -> list:
    """Nested samples built from plain Python and NumPy, which both collates accept."""
    rng = np.random.default_rng(k)
    return [{
        "image": rng.standard_normal((2, 3)).astype(np.float32),
        "mask": rng.random(4) > 0.5,
        "label": int(rng.integers(10)),
        "weight": float(rng.random()),
        "flag": bool(k % 2),
        "np_int": np.int32(k),
        "np_float": np.float64(k / 3),
        "name": f"s{k}",
        "raw": b"xy",
        "pair": Pair(np.arange(3, dtype=np.int16) + k, k * 1.5),
        "tuple": (k, np.full((1, 2), k, dtype=np.uint8)),
        "list": [k, [k + 1.0, np.float32(k)]],
        "nested": {"a": {"b": np.eye(2)[k % 2]}},
    }]


@pytest.mark.parametrize("size", [1, 3])
def test_default_collate_nested_structures(size):
    samples = [_samples(k)[0] for k in range(size)]
    _same(mdata.default_collate(samples), tdata.default_collate(samples))


def test_default_collate_tensors_and_tensor_tuples():
    arrays = [np.arange(6, dtype=np.float64).reshape(2, 3) * k for k in range(4)]
    ours = mdata.default_collate([(mt.from_numpy(a), k) for k, a in enumerate(arrays)])
    theirs = tdata.default_collate([(torch.from_numpy(a), k) for k, a in enumerate(arrays)])
    _same(ours, theirs)
    zero_d = [np.array(k, dtype=np.int64) for k in range(3)]
    _same(mdata.default_collate(zero_d), tdata.default_collate(zero_d))


def test_default_collate_errors_match_torch():
    cases = [
        ([[1, 2], [3]], RuntimeError),  # sequences of different lengths
        ([np.zeros(2), np.zeros(3)], RuntimeError),  # arrays of different shapes
        ([object(), object()], TypeError),
        ([np.array(["a"]), np.array(["b"])], TypeError),  # strings are not stacked
    ]
    for batch, error in cases:
        with pytest.raises(error):
            tdata.default_collate(batch)
        with pytest.raises(error, match="default_collate"):
            mdata.default_collate(batch)


def test_default_convert_matches_torch():
    data = {"x": np.arange(3, dtype=np.int32), "y": (np.float32(2.5), "keep"),
            "p": Pair(np.ones(2), 3), "s": ["a", np.zeros((1, 1))]}
    _same(mdata.default_convert(data), tdata.default_convert(data), "convert")


# ------------------------------------------------------------------------------- DataLoader
def _pair_datasets(n: int):
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    y = np.arange(n, dtype=np.int64) % 3
    return (mdata.TensorDataset(mt.from_numpy(x), mt.from_numpy(y)),
            tdata.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)))


# batch_size=None with drop_last=True is refused by both: see the argument tests below
BATCHING = [(1, False), (1, True), (3, False), (3, True), (4, False), (4, True), (10, False),
            (10, True), (None, False)]


@pytest.mark.parametrize("batch_size, drop_last", BATCHING)
def test_dataloader_batches_unshuffled(batch_size, drop_last):
    ours_ds, theirs_ds = _pair_datasets(10)
    ours = mdata.DataLoader(ours_ds, batch_size=batch_size, drop_last=drop_last)
    theirs = tdata.DataLoader(theirs_ds, batch_size=batch_size, drop_last=drop_last)
    assert len(ours) == len(theirs)
    got, want = list(ours), list(theirs)
    assert len(got) == len(want)
    for k, (o, t) in enumerate(zip(got, want)):
        _same(o, t, f"batch {k}")


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_dataloader_with_unshuffled_distributed_sampler(replicas, drop_last):
    ours_ds, theirs_ds = _pair_datasets(11)
    for rank in range(replicas):
        ours = mdata.DataLoader(ours_ds, batch_size=2, sampler=mdata.DistributedSampler(
            ours_ds, replicas, rank, shuffle=False), drop_last=drop_last)
        theirs = tdata.DataLoader(theirs_ds, batch_size=2, sampler=tdata.DistributedSampler(
            theirs_ds, replicas, rank, shuffle=False), drop_last=drop_last)
        assert len(ours) == len(theirs)
        _same(list(ours), list(theirs), f"rank {rank}")


def test_dataloader_shuffled_covers_every_sample_once():
    ours_ds, _ = _pair_datasets(23)
    mt.manual_seed(0)
    labels = [b[1] for b in mdata.DataLoader(ours_ds, batch_size=5, shuffle=True)]
    assert [len(b) for b in labels] == [len(b) for b in tdata.DataLoader(range(23), 5)]
    xs = np.concatenate([b[0].numpy() for b in mdata.DataLoader(ours_ds, batch_size=5,
                                                                  shuffle=True)])
    assert sorted(xs[:, 0].tolist()) == list(range(0, 46, 2))


def test_dataloader_custom_collate_and_batch_sampler():
    ours_ds, theirs_ds = _pair_datasets(9)
    bs_o = mdata.BatchSampler(mdata.SequentialSampler(ours_ds), 4, drop_last=False)
    bs_t = tdata.BatchSampler(tdata.SequentialSampler(theirs_ds), 4, drop_last=False)
    ours = mdata.DataLoader(ours_ds, batch_sampler=bs_o,
                            collate_fn=lambda b: [int(s[1]) for s in b])
    theirs = tdata.DataLoader(theirs_ds, batch_sampler=bs_t,
                              collate_fn=lambda b: [int(s[1]) for s in b])
    assert list(ours) == list(theirs) and len(ours) == len(theirs)
    ours_plain = mdata.DataLoader(ours_ds, batch_sampler=[[3, 1], [0]])
    theirs_plain = tdata.DataLoader(theirs_ds, batch_sampler=[[3, 1], [0]])
    _same(list(ours_plain), list(theirs_plain))


@pytest.mark.parametrize("batch_size, drop_last", BATCHING)
def test_dataloader_iterable_dataset(batch_size, drop_last):
    class Ours(mdata.IterableDataset):
        def __iter__(self):
            return iter([np.full(2, k, dtype=np.int32) for k in range(8)])

    class Theirs(tdata.IterableDataset):
        def __iter__(self):
            return iter([np.full(2, k, dtype=np.int32) for k in range(8)])

    ours = list(mdata.DataLoader(Ours(), batch_size=batch_size, drop_last=drop_last))
    theirs = list(tdata.DataLoader(Theirs(), batch_size=batch_size, drop_last=drop_last))
    _same(ours, theirs)


def _ds_for(module):
    return module.TensorDataset(mt.zeros(6, 2) if module is mdata else torch.zeros(6, 2))


@pytest.mark.parametrize("kwargs", [
    dict(batch_size=0),
    dict(batch_size=-2),
    dict(batch_size=None, drop_last=True),
    dict(shuffle=True, sampler="seq"),
    dict(batch_size=2, batch_sampler="batches"),
    dict(shuffle=True, batch_sampler="batches"),
    dict(drop_last=True, batch_sampler="batches"),
    dict(num_workers=-1),
    dict(timeout=-1.0),
    dict(prefetch_factor=2),
    dict(persistent_workers=True),
])
def test_dataloader_rejects_what_torch_rejects(kwargs):
    for module in (tdata, mdata):
        ds = _ds_for(module)
        args = dict(kwargs)
        if args.get("sampler") == "seq":
            args["sampler"] = module.SequentialSampler(ds)
        if args.get("batch_sampler") == "batches":
            args["batch_sampler"] = module.BatchSampler(module.SequentialSampler(ds), 2, False)
        with pytest.raises(ValueError):
            module.DataLoader(ds, **args)


def test_dataloader_iterable_dataset_rejects_ordering_options():
    class Ours(mdata.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    class Theirs(tdata.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    for option in (dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0]])):
        with pytest.raises(ValueError):
            tdata.DataLoader(Theirs(), **option)
        with pytest.raises(ValueError, match=next(iter(option))):
            mdata.DataLoader(Ours(), **option)
    assert list(mdata.DataLoader(Ours(), shuffle=False, batch_size=2))[0].tolist() == \
        list(tdata.DataLoader(Theirs(), shuffle=False, batch_size=2))[0].tolist()
