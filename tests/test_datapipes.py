"""DataPipes (``mpitensor.utils.data.datapipes``) against torch's: the items each built-in pipe
yields, its length, its errors (type), the functional registry, shuffling with a fixed seed
(the same orders as torch), the graph settings a DataLoader applies, and the type-checking and
determinism decorators (their documented behaviour: torch 2.13's typing of DataPipes no
longer works, so those are tested on their own).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, List, Tuple, Union

import pytest

import mpitensor as mt
from mpitensor.utils import data as mdata
from mpitensor.utils.data import datapipes as mdp


def _torch():
    return pytest.importorskip("torch")


def _libs():
    torch = _torch()
    from torch.utils.data import datapipes as tdp

    return [(mdp, mdata), (tdp, torch.utils.data)]


def _plain(x):
    """Items made comparable across libraries: tensors to lists, DataChunks to lists."""
    if hasattr(x, "tolist") and not isinstance(x, (list, tuple, dict)):
        return x.tolist()
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _same(build):
    """``build(dp_module)`` under both libraries gives the same items (or the same error type)."""
    got = []
    for dp, _ in _libs():
        try:
            got.append(("ok", _plain(build(dp))))
        except Exception as exc:  # noqa: BLE001 - the error type is what is compared
            got.append(("err", type(exc).__name__))
    assert got[0] == got[1], got
    return got[0]


def W(dp, items):  # noqa: N802 - short for IterableWrapper in the cases below
    return dp.iter.IterableWrapper(items)


ITER_CASES = {
    "map": lambda dp: list(W(dp, range(5)).map(lambda x: x * 3)),
    "map_col": lambda dp: list(W(dp, [(1, 2), (3, 4)]).map(lambda x: x * 10, input_col=1)),
    "map_col_append": lambda dp: list(W(dp, [(1, 2)]).map(lambda x: -x, input_col=0,
                                                          output_col=-1)),
    "map_cols": lambda dp: list(W(dp, [[1, 2, 3]]).map(lambda a, b: a + b, input_col=[0, 2])),
    "map_cols_out": lambda dp: list(W(dp, [(1, 2), (3, 4)]).map(lambda a, b: a * b,
                                                                input_col=[0, 1], output_col=0)),
    "map_dict": lambda dp: list(W(dp, [{"a": 1}]).map(lambda x: x + 1, input_col="a",
                                                      output_col="b")),
    "map_bad_cols": lambda dp: W(dp, [1]).map(lambda x: x, output_col=1),
    "map_bad_out": lambda dp: W(dp, [1]).map(lambda x: x, input_col=0, output_col=[0, 1]),
    "filter": lambda dp: list(W(dp, range(8)).filter(lambda x: x % 3 == 0)),
    "filter_col": lambda dp: list(W(dp, [(1, 0), (3, 4)]).filter(bool, input_col=1)),
    "filter_cols": lambda dp: list(W(dp, [(1, 2), (0, 0)]).filter(lambda a, b: a + b > 0,
                                                                   input_col=[0, 1])),
    "filter_not_bool": lambda dp: list(W(dp, [1, 2]).filter(lambda x: x)),
    "batch": lambda dp: list(W(dp, range(7)).batch(3)),
    "batch_drop": lambda dp: list(W(dp, range(7)).batch(3, drop_last=True)),
    "batch_len": lambda dp: (len(W(dp, range(7)).batch(3)),
                             len(W(dp, range(7)).batch(3, drop_last=True))),
    "batch_nested": lambda dp: list(W(dp, range(5)).batch(2).batch(2)),
    "unbatch": lambda dp: list(W(dp, [[1, [2]], [3]]).unbatch()),
    "unbatch2": lambda dp: list(W(dp, [[[1], [2]], [[3]]]).unbatch(2)),
    "unbatch_all": lambda dp: list(W(dp, [[[1], [2]], [[3]]]).unbatch(-1)),
    "unbatch_too_deep": lambda dp: list(W(dp, [[1], [2]]).unbatch(3)),
    "collate": lambda dp: list(W(dp, [[1, 2], [3, 4]]).collate()),
    "collate_fn": lambda dp: list(W(dp, [[1, 2]]).collate(collate_fn=sum)),
    "zip": lambda dp: list(W(dp, [1, 2, 3]).zip(W(dp, "ab"))),
    "zip_len": lambda dp: len(W(dp, [1, 2, 3]).zip(W(dp, [1, 2]))),
    "zip_not_pipe": lambda dp: W(dp, [1]).zip([1]),
    "concat": lambda dp: list(W(dp, [1]).concat(W(dp, [2, 3]))),
    "concat_len": lambda dp: len(W(dp, [1, 2]).concat(W(dp, [3]))),
    "concat_none": lambda dp: dp.iter.Concater(),
    "mux": lambda dp: list(W(dp, [1, 2, 3]).mux(W(dp, "ab"))),
    "mux_uneven": lambda dp: list(W(dp, [1]).mux(W(dp, "abc"), W(dp, [7, 8]))),
    "mux_len": lambda dp: len(W(dp, [1, 2, 3]).mux(W(dp, "ab"))),
    "fork": lambda dp: [list(c) for c in W(dp, [1, 2]).fork(2)],
    "fork_interleaved": lambda dp: (lambda a, b: [(x, y) for x, y in zip(a, b)])(
        *W(dp, range(4)).fork(2, buffer_size=1)),
    "fork_overflow": lambda dp: [list(c) for c in W(dp, range(5)).fork(2, buffer_size=2)],
    "fork_zero": lambda dp: W(dp, [1]).fork(0),
    "fork_len": lambda dp: [len(c) for c in W(dp, [1, 2]).fork(3)],
    "demux": lambda dp: [list(c) for c in W(dp, range(7)).demux(3, lambda x: x % 3)],
    "demux_drop_none": lambda dp: [list(c) for c in W(dp, range(5)).demux(
        2, lambda x: None if x == 2 else x % 2, drop_none=True)],
    "demux_bad_index": lambda dp: [list(c) for c in W(dp, range(5)).demux(2, lambda x: 5)],
    "groupby": lambda dp: list(W(dp, range(7)).groupby(lambda x: x % 3, group_size=2)),
    "groupby_keep_key": lambda dp: list(W(dp, range(7)).groupby(lambda x: x % 3,
                                                                 keep_key=True)),
    "groupby_guaranteed": lambda dp: list(W(dp, range(7)).groupby(
        lambda x: x % 3, group_size=3, guaranteed_group_size=2)),
    "groupby_buffer": lambda dp: list(W(dp, range(10)).groupby(lambda x: x % 3,
                                                                buffer_size=3)),
    "groupby_buffer_drop": lambda dp: list(W(dp, range(10)).groupby(
        lambda x: x % 3, buffer_size=3, group_size=3, guaranteed_group_size=3,
        drop_remaining=True)),
    "sharding_filter": lambda dp: list(W(dp, range(7)).sharding_filter()),
    "sampler": lambda dp: list(dp.iter.Sampler(W(dp, range(4)))),
    "shuffle_len": lambda dp: len(W(dp, range(4)).shuffle()),
    "shuffle_off": lambda dp: list(W(dp, range(5)).shuffle().set_shuffle(False)),
    "shuffle_seeded": lambda dp: list(W(dp, range(10)).shuffle(buffer_size=4).set_seed(3)),
    "shuffle_seeded_big": lambda dp: list(W(dp, range(30)).shuffle().set_seed(11)),
    "shuffle_unbatch": lambda dp: list(W(dp, [[1, 2], [3, 4]]).shuffle(unbatch_level=1)
                                       .set_seed(1)),
    "wrapper_len": lambda dp: len(W(dp, [1, 2, 3])),
    "wrapper_no_len": lambda dp: len(W(dp, iter([1]))),
    "wrapper_deepcopy": lambda dp: (lambda src: (lambda w: (src.append(3), list(w))[1])(
        W(dp, src)))([1, 2]),
    "map_len": lambda dp: len(W(dp, [1, 2]).map(str)),
    "filter_no_len": lambda dp: len(W(dp, [1, 2]).filter(bool)),
    "twice": lambda dp: (lambda d: (list(d), list(d)))(W(dp, [1, 2]).map(str)),
}


@pytest.mark.parametrize("case", sorted(ITER_CASES))
def test_iter_pipes_match_torch(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same(ITER_CASES[case])


def S(dp, items):  # noqa: N802 - short for SequenceWrapper
    return dp.map.SequenceWrapper(items)


MAP_CASES = {
    "map": lambda dp: (lambda m: (m[1], len(m), list(m)))(S(dp, [5, 6]).map(lambda x: x + 1)),
    "batch": lambda dp: list(S(dp, list(range(5))).batch(2)),
    "batch_drop": lambda dp: (lambda b: (list(b), len(b)))(S(dp, list(range(5))).batch(
        2, drop_last=True)),
    "batch_out_of_range": lambda dp: S(dp, list(range(5))).batch(2)[3],
    "concat": lambda dp: (lambda d: (d[2], d[4], len(d), list(d)))(S(dp, [1, 2]).concat(
        S(dp, [3, 4, 5]))),
    "concat_out_of_range": lambda dp: S(dp, [1, 2]).concat(S(dp, [3]))[5],
    "zip": lambda dp: (lambda z: (z[1], len(z), list(z)))(S(dp, [1, 2]).zip(S(dp, [3, 4, 5]))),
    "zip_not_pipe": lambda dp: S(dp, [1]).zip([1]),
    "shuffle_seeded": lambda dp: list(S(dp, list(range(6))).shuffle().set_seed(5)),
    "shuffle_indices": lambda dp: list(S(dp, list(range(5))).shuffle(indices=[4, 3, 2])
                                       .set_seed(2)),
    "shuffle_off": lambda dp: list(S(dp, list(range(4))).shuffle().set_shuffle(False)),
    "dict_get": lambda dp: S(dp, {"a": 1, "b": 2})["b"],
    "len": lambda dp: len(S(dp, [1, 2, 3])),
}


@pytest.mark.parametrize("case", sorted(MAP_CASES))
def test_map_pipes_match_torch(case):
    _same(MAP_CASES[case])


def test_files_match_torch(tmp_path):
    for rel, text in (("b.txt", "bee"), ("a.txt", "ay"), ("c.csv", "1,2"),
                      ("sub/d.txt", "dee")):
        p = tmp_path / rel
        p.parent.mkdir(exist_ok=True)
        p.write_text(text)
    root = str(tmp_path)
    _same(lambda dp: list(dp.iter.FileLister(root, "*.txt")))
    _same(lambda dp: list(dp.iter.FileLister(root, ["*.txt", "*.csv"], recursive=True)))
    _same(lambda dp: list(dp.iter.FileLister([os.path.join(root, "a.txt"), root], "*.csv")))
    _same(lambda dp: [(os.path.basename(p), d) for p, d in dp.iter.FileLister(
        root, "*.txt").open_files().read_from_stream()])
    _same(lambda dp: [(os.path.basename(p), d) for p, d in dp.iter.FileLister(
        root, "b.txt").open_files(mode="b").read_from_stream(chunk=2)])
    _same(lambda dp: dp.iter.FileOpener(dp.iter.FileLister(root), mode="w"))
    _same(lambda dp: len(dp.iter.FileLister(root)))


def test_public_names_match_torch():
    _torch()
    from torch.utils import data as tdata
    from torch.utils.data import datapipes as tdp

    assert set(tdp.iter.__all__) - {"RoutedDecoder"} <= set(mdp.iter.__all__)
    assert set(tdp.map.__all__) <= set(mdp.map.__all__)
    assert set(tdata.__all__) - {"_DatasetKind"} <= set(mdata.__all__)
    assert set(tdata.IterDataPipe.functions) - {n for n in tdata.IterDataPipe.functions
                                                if "dataframe" in n or n in (
                                                    "routed_decode", "trace_as_dataframe")} \
        <= set(mdata.IterDataPipe.functions)
    assert set(tdata.MapDataPipe.functions) <= set(mdata.MapDataPipe.functions)


def test_repr_is_torch_class_name():
    _same(lambda dp: repr(W(dp, [1]).map(str)))
    _same(lambda dp: str(dp.iter.IterableWrapper([1])))


def test_datachunk():
    for _, data in _libs():
        c = data.DataChunk([1, 2])
        assert c == [1, 2] and str(c) == "[1, 2]" and list(c.raw_iterator()) == [1, 2]
        assert isinstance(next(iter(data.datapipes.iter.IterableWrapper(range(3)).batch(2))),
                          data.DataChunk)


def test_functional_registry():
    @mdata.functional_datapipe("times_k_for_test")
    class TimesK(mdata.IterDataPipe):
        def __init__(self, dp, k=2):
            self.dp, self.k = dp, k

        def __iter__(self):
            return (x * self.k for x in self.dp)

    assert list(mdp.iter.IterableWrapper([1, 2]).times_k_for_test(k=3)) == [3, 6]
    assert "times_k_for_test" in dir(mdp.iter.IterableWrapper([1]))
    with pytest.raises(RuntimeError):
        mdata.functional_datapipe("times_k_for_test")(TimesK)
    with pytest.raises(TypeError):
        mdata.functional_datapipe("not_a_pipe")(int)
    with pytest.raises(AttributeError):
        mdp.iter.IterableWrapper([1]).nope  # noqa: B018

    @mdata.functional_datapipe("pick_for_test")
    class Pick(mdata.MapDataPipe):
        def __init__(self, dp, i):
            self.dp, self.i = dp, i

        def __getitem__(self, k):
            return self.dp[k][self.i]

        def __len__(self):
            return len(self.dp)

    assert list(mdp.map.SequenceWrapper([(1, 2), (3, 4)]).pick_for_test(1)) == [2, 4]
    assert not hasattr(mdp.iter.IterableWrapper([1]), "pick_for_test")


def test_dataloader_takes_datapipes():
    torch = _torch()
    for dp, data in _libs():
        pipe = dp.iter.IterableWrapper(range(7)).map(lambda x: x * 2)
        got = [_plain(b) for b in data.DataLoader(pipe, batch_size=3)]
        assert got == [[0, 2, 4], [6, 8, 10], [12]]
        shuffled = dp.iter.IterableWrapper(range(7)).shuffle()
        assert [_plain(b) for b in data.DataLoader(shuffled, batch_size=3, shuffle=False)] \
            == [[0, 1, 2], [3, 4, 5], [6]]
        mt.manual_seed(0)
        torch.manual_seed(0)
        out = sum((_plain(b) for b in data.DataLoader(shuffled, batch_size=3, shuffle=True)),
                  [])
        assert sorted(out) == list(range(7))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = sum((_plain(b) for b in data.DataLoader(
                dp.iter.IterableWrapper(range(5)), batch_size=2, shuffle=True)), [])
        assert sorted(out) == list(range(5)) and w  # a shuffler is added, with a warning


def test_graph_settings_match_torch():
    torch = _torch()
    import torch.utils.data.graph_settings as tgs

    import mpitensor.utils.data.graph_settings as mgs

    for (dp, _), gs in zip(_libs(), (mgs, tgs)):
        pipe = dp.iter.IterableWrapper(range(9)).sharding_filter().map(str)
        gs.apply_sharding(pipe, 3, 1)
        assert list(pipe) == ["1", "4", "7"] and len(pipe) == 3
        names = [type(p).__name__ for p in gs.get_all_graph_pipes(
            (mdata.graph if dp is mdp else torch.utils.data.graph).traverse_dps(pipe))]
        assert names == ["MapperIterDataPipe", "ShardingFilterIterDataPipe",
                         "IterableWrapperIterDataPipe"]
        twice = dp.iter.IterableWrapper(range(4)).sharding_filter().sharding_filter()
        with pytest.raises(RuntimeError):
            gs.apply_sharding(twice, 2, 0)
        with pytest.raises(ValueError):
            dp.iter.IterableWrapper(range(4)).sharding_filter().apply_sharding(2, 2)


def test_apply_random_seed_reproducible():
    import mpitensor.utils.data.graph_settings as mgs

    orders = []
    for _ in range(2):
        pipe = mdp.iter.IterableWrapper(range(20)).shuffle()
        mgs.apply_random_seed(pipe, mt.Generator().manual_seed(4))
        orders.append(list(pipe))
    assert orders[0] == orders[1] and sorted(orders[0]) == list(range(20))


def test_unseeded_shuffle_follows_manual_seed():
    pipe = mdp.iter.IterableWrapper(range(20)).shuffle()
    mt.manual_seed(3)
    a = list(pipe)
    b = list(pipe)
    mt.manual_seed(3)
    assert list(pipe) == a and a != b and sorted(a) == list(range(20))


# ---- typing and determinism (documented behaviour; torch 2.13's typing of DataPipes is gone)


class _Ints(mdata.IterDataPipe[int]):
    def __init__(self, src):
        self.src = src

    @mdata.runtime_validation
    def __iter__(self):
        yield from self.src


class _Strs(mdata.IterDataPipe[str]):
    def __iter__(self):
        yield "a"


def test_element_types():
    assert repr(_Ints.type) == "int" and _Ints([1]).type == _Ints.type
    assert repr(mdp.iter.IterableWrapper([1]).type) == "typing.Any"
    assert mdata.IterDataPipe[int] is mdata.IterDataPipe[int]
    t = mdata.IterDataPipe[List[int]].type
    assert t.issubtype(List[Any]) and not t.issubtype(List[str])
    assert mdata.IterDataPipe[int].type.issubtype(Union[int, str])
    assert not mdata.IterDataPipe[Union[int, str]].type.issubtype(int)
    assert mdata.IterDataPipe[Tuple[int, str]].type.issubtype_of_instance((1, "x"))
    assert not mdata.IterDataPipe[Tuple[int, str]].type.issubtype_of_instance((1, 2))


def test_runtime_validation():
    assert list(_Ints([1, 2])) == [1, 2]
    with pytest.raises(RuntimeError):
        list(_Ints([1, "a"]))
    with mdata.runtime_validation_disabled():
        assert list(_Ints([1, "a"])) == [1, "a"]
    with pytest.raises(RuntimeError):
        list(_Ints([True, 2.5]))
    with pytest.raises(TypeError):
        mdata.runtime_validation(lambda self: 1)


def test_argument_validation():
    class Takes(mdata.IterDataPipe[int]):
        @mdata.argument_validation
        def __init__(self, dp: mdata.IterDataPipe[int], n: int = 0):
            self.dp = dp

        def __iter__(self):
            yield from self.dp

    assert list(Takes(_Ints([1]))) == [1]
    with pytest.raises(TypeError):
        Takes([1])
    with pytest.raises(TypeError):
        Takes(_Strs())
    with pytest.raises(TypeError):
        Takes(mdp.iter.IterableWrapper([1]))  # Any is not known to be int


def test_non_deterministic():
    @mdata.non_deterministic
    class Always(mdata.IterDataPipe):
        def __iter__(self):
            yield 1

    @mdata.non_deterministic(lambda flag: bool(flag))
    class Sometimes(mdata.IterDataPipe):
        def __init__(self, flag):
            self.flag = flag

        def __iter__(self):
            yield 1

    assert list(Always()) == [1] and list(Sometimes(True)) == [1]
    with mdata.guaranteed_datapipes_determinism():
        with pytest.raises(TypeError):
            Always()
        assert list(Sometimes(False)) == [1]
        with pytest.raises(TypeError):
            Sometimes(True)
    assert list(Always()) == [1]
    with pytest.raises(TypeError):
        mdata.non_deterministic(int)
    with pytest.raises(TypeError):
        mdata.non_deterministic(3)


def test_dfiterdatapipe_is_an_iterdatapipe():
    class Frames(mdata.DFIterDataPipe):
        def __iter__(self):
            yield {"a": [1]}

    assert isinstance(Frames(), mdata.IterDataPipe) and Frames()._is_dfpipe()
    assert list(Frames().map(len)) == [1]
    with pytest.raises(NotImplementedError):
        mdata.functional_datapipe("traced_for_test", enable_df_api_tracing=True)(Frames)
