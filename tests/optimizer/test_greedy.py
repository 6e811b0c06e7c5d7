"""The greedy segmenter's group graph: merges classified from the parts (the same answer as
classifying the merged group from scratch), a topological numbering that stays valid, no cycles,
and its speed on the 1,458-op scale case."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fusecut
from benchmarks.fusiongen import generate, scale_case
from fusecut.optimizer.analysis.axes import AxisMap
from fusecut.optimizer.analysis.shapes import bind
from fusecut.optimizer.errors import FusecutError
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.kinds.rules import Kind
from fusecut.optimizer.profiles import get_profile
from fusecut.optimizer.segmenters import groups as groups_module
from fusecut.optimizer.segmenters.graph import SegGraph
from fusecut.optimizer.segmenters.greedy import greedy_groups
from fusecut.optimizer.segmenters.parts import Part
from tests.conftest import CORPUS_FILES
from tests.helpers import graph as graph_of
from tests.strategies import fusions


def _graph(text: str, **overrides) -> SegGraph:
    parsed = parse_text(text)
    return SegGraph(bind(parsed.fusion, parsed.inputs), get_profile("H100", overrides),
                    frozenset(Kind))


def _checking(tried: list[bool]):
    """Part.classify, also classifying each merged group from scratch: both must say the same
    (the whole Schedule where it classifies)."""
    classify_from_parts = Part.classify

    def both(part: Part, graph: SegGraph):
        got = classify_from_parts(part, graph)
        if len(part.stages) <= 1:
            want = graph.classify(part.closure, part.written)
            assert bool(got) == bool(want), (sorted(part.ops), got, want)
            assert not got or got == want, (sorted(part.ops), got, want)
        tried.append(bool(got))
        return got
    return both


@pytest.fixture
def checked_merges(monkeypatch):
    tried: list[bool] = []
    monkeypatch.setattr(Part, "classify", _checking(tried))
    return tried


@pytest.mark.parametrize("reduce_every,column_share,cols", [
    (3, 0.3, 2048), (5, 0.0, 2048), (12, 0.6, 8192), (12, 0.3, 32768)])
def test_merges_from_parts_classify_as_from_scratch(checked_merges, reduce_every, column_share,
                                                    cols):
    # 8192 and 32768 columns: rows that barely fit, or do not fit, the on-chip budget
    for seed in range(2):
        graph = _graph(generate(300, seed=seed, rows=16, cols=cols, outputs=5,
                                reduce_every=reduce_every, column_share=column_share))
        greedy_groups(graph)
    assert sum(checked_merges) > 200 and not all(checked_merges)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(fusions(max_ops=25), st.sampled_from([64, 512, 96 * 1024]))
def test_random_merges_from_parts_classify_as_from_scratch(drawn, budget):
    from _pytest.monkeypatch import MonkeyPatch

    try:
        bound = bind(drawn.fusion, drawn.inputs)
    except FusecutError:  # the strategy's larger draws can disagree on extents
        return
    graph = SegGraph(bound, get_profile("H100", {"persistent_budget": budget}), frozenset(Kind))
    with MonkeyPatch.context() as mp:
        tried: list[bool] = []
        mp.setattr(Part, "classify", _checking(tried))
        greedy_groups(graph)


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.stem for p in CORPUS_FILES])
def test_corpus_merges_from_parts_classify_as_from_scratch(checked_merges, path):
    # group norm's and batch norm's rows are made of split axes (a reshape joins the segment)
    parsed = fusecut.load(path)
    if parsed.inputs is None:
        pytest.skip("no inputs list")
    graph = SegGraph(bind(parsed.fusion, parsed.inputs), get_profile("H100"), frozenset(Kind))
    groups = greedy_groups(graph)
    if path.stem == "group_norm_fwd":  # one kernel: the normalization reads through the views
        kinds = [graph.classify(g, graph.written(g)).kind for g in groups]
        assert kinds.count(Kind.NORMALIZATION) == 1, kinds


def test_absorbing_a_map_ties_the_parts_of_an_axis_split_alike_on_both_sides():
    # two views split T0's channels [N, 48, L] -> [N, 8, 6, L]; each is in its own group until a
    # merge: the merged map must tie the two views' groups and channels-per-group axes, as the
    # map of all the ops does (before: the fork kept only the larger map's split records)
    g = graph_of("""
T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[True, True, True], dtype=DataType.Float)
T1 = fd.ops.reshape(T0, new_shape=[4, 8, 6, 32])
T2 = fd.ops.reshape(T0, new_shape=[4, 8, 6, 32])
T3 = fd.ops.add(T1, T2)
fd.add_output(T3)""", (4, 48, 32))
    ops = g.fusion.ops
    whole = AxisMap(g.bound, ops)
    left, right = AxisMap(g.bound, ops[:1]), AxisMap(g.bound, ops[1:])
    merged = left.fork()
    merged.absorb(right)
    assert whole.ids("T1") == whole.ids("T2")
    for t in ("T0", "T1", "T2", "T3"):
        assert merged.ids(t) == whole.ids(t), t
    assert merged.parts(merged.root("T0", 1)) == whole.parts(whole.root("T0", 1))
    assert merged.commit().ids("T2") == whole.ids("T2")


def test_the_numbering_stays_topological_and_no_merge_closes_a_cycle(monkeypatch):
    # before: a group numbered (by its first op) after another could still reach it through a
    # group spanning both, so the cycle check missed paths: "segment graph has a cycle" on this
    # 20-op fusion (and on the 1,458-op fusion with a reduction every 5 or 6 ops)
    checks = []
    merge = groups_module.GroupGraph._merge

    def merge_and_check(self, g, h, part):
        merge(self, g, h, part)
        checks.append(all(self.rank[a] < self.rank[b] for a in self.succ for b in self.succ[a]))

    monkeypatch.setattr(groups_module.GroupGraph, "_merge", merge_and_check)
    for text in (generate(20, seed=0, rows=16, cols=32, reduce_every=5),
                 generate(1451, seed=0, rows=2048, cols=2048, outputs=5, reduce_every=6)):
        graph = _graph(text)
        groups = greedy_groups(graph)
        assert sorted(i for g in groups for i in g) == sorted(graph.placed)
        position = {i: k for k, g in enumerate(groups) for i in g}
        for i in graph.placed:  # every tensor flows forward between segments
            for o in graph.fusion.ops[i].outputs:
                assert all(position[c] >= position[i] for c in graph.consumers.get(o, ())
                           if c in position)
        assert all(graph.classify(g, graph.written(g)) for g in groups)
    assert checks and all(checks)


def test_the_scale_case_segments_in_well_under_a_second():
    # before: every merge classified the whole merged group again, 1.5-2.2 s of CPU here
    graph = _graph(scale_case())
    start = time.process_time()
    groups = greedy_groups(graph)
    assert time.process_time() - start < 1.0
    assert 5 < len(groups) < 100
