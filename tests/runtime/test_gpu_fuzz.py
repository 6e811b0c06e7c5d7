"""The GPU differential fuzzer (``benchmarks.gpu_fuzz``, issue 41): random definitions with
permuted, strided and broadcast inputs, column and row sums, normalizations and op soups.

On the CPU: a seed always builds the same definition, every case of the seeded set plans and
generates its kernels, the comparison catches what it must (a wrong element, a lost output) and
passes what it must (NaN where the reference has NaN), and a failing case's repro file runs as
a definition. On the GPU (marked gpu): a seeded part of the fuzzer, 0 mismatches.
"""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks.fuzz_fusions import case
from benchmarks.gpu_fuzz import _repro, mismatch, run
from fusecut.optimizer.ir import parse_text
from fusecut.optimizer.ir.printer import print_fusion


def test_a_seed_builds_the_same_case():
    for seed in (0, 1, 7, 1153):
        a, b = case(seed), case(seed)
        assert print_fusion(a.fusion, inputs=a.inputs) == print_fusion(b.fusion, inputs=b.inputs)
        assert a.inputs == b.inputs
    assert print_fusion(case(1).fusion) != print_fusion(case(2).fusion)


def test_a_value_too_large_to_pair_draws_another_op():
    # seed 6970 draws a binary op on a value that no partner broadcasts with under the size
    # cap (the generator raised "Cannot choose from an empty sequence" and stopped a GPU run)
    built = case(6970)
    assert built.fusion.ops and built.inputs


def test_the_cases_cover_layouts_families_and_kinds():
    outcomes = run(list(range(300)), "cpu", workers=1)
    assert [o.status for o in outcomes] == ["ok"] * 300, [o.detail for o in outcomes
                                                          if o.status != "ok"][:5]
    assert {o.family for o in outcomes} == {"column_sum", "normalization", "soup"}
    kinds = {k for o in outcomes for k in o.kinds}
    assert {"pointwise", "reduction", "normalization", "inner_outer"} <= kinds
    strides = [m.strides for s in range(300) for m in case(s).inputs]
    assert any(0 in st and max(st) > 0 for st in strides), "no broadcast input"
    assert any(list(st) != sorted(st, reverse=True) for st in strides), "no permuted input"


def test_the_comparison_catches_a_wrong_element_and_passes_nan_for_nan():
    want = torch.tensor([1.0, float("nan"), float("inf"), 3.0])
    assert mismatch([want.clone()], [want]) == ""
    wrong = want.clone()
    wrong[3] = 3.01
    assert "output 0: 1 of 4 elements off" in mismatch([wrong], [want])
    assert "outputs" in mismatch([], [want])
    assert "differ" in mismatch([torch.tensor([1, 2])], [torch.tensor([1, 3])])
    rounded = want.to(torch.bfloat16)
    assert mismatch([rounded], [rounded.clone()]) == ""


def test_a_repro_file_parses_as_a_definition():
    c = case(1153)
    text = _repro(c, "why", "# narrowed")
    parsed = parse_text(text)
    assert len(parsed.fusion.ops) == len(c.fusion.ops)
    assert [m.strides for m in parsed.inputs] == [m.strides for m in c.inputs]


@pytest.mark.gpu
def test_a_seeded_part_of_the_fuzzer_matches_the_reference_on_the_gpu():
    seeds = list(range(int(os.environ.get("FUSECUT_GPU_FUZZ_CASES", "1500"))))
    workers = max(1, min(8, (os.cpu_count() or 2) - 2))
    bad = [o for o in run(seeds, "cuda", workers) if o.status != "ok"]
    assert not bad, "\n\n".join(o.repro for o in bad[:3])
