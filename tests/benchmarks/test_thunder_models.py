"""The whole-model benchmark's pure parts, on the CPU: its table from the rows its processes
report, how a process that ended badly is reported, and the models it builds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from benchmarks import thunder_models as bench
from benchmarks.whole_models import IGNORE_INDEX, MODEL_NAMES, whole_model


def measured(model, step, system, seconds, **extra):
    return {"model": model, "step": step, "system": system, "batch": "8x1024",
            "sync_s": seconds, "pipelined_ms": 1.5, "peak_gib": 2.0, "first_s": 30.0,
            "busy_ms": 1.2, "top": "gemm 1 ms x1", "note": "", **extra}


def test_rows_give_each_system_its_ratio_to_torch_compile_with_an_interval():
    results = [measured("nanogpt", "train", "torch.compile", [0.020] * 8 + [0.021] * 8),
               measured("nanogpt", "train", "thunder+fusecut", [0.018] * 8 + [0.019] * 8),
               {"model": "nanogpt", "step": "train", "system": "thunder+nvfuser",
                "error": "RuntimeError: an illegal memory access"}]
    rows = bench.table_rows(results)
    by_system = {row[2]: row for row in rows}
    assert [row[2] for row in rows] == ["thunder+nvfuser", "thunder+fusecut", "torch.compile"]
    ratio = by_system["thunder+fusecut"][4]
    assert ratio.startswith("0.90") and "(" in ratio  # 18.5 / 20.5 ms, and its interval
    assert by_system["torch.compile"][4] == "-"
    assert by_system["thunder+nvfuser"][-1].startswith("RuntimeError")
    assert all(len(row) == len(bench.HEADERS) for row in rows)
    table, notes = bench.report(results, iters=16)
    assert "Top GPU ops" in table and "gemm 1 ms" in table and "no optimizer" in notes


def test_paired_rows_take_their_ratios_from_the_paired_baseline_pipelined_included():
    alone = measured("llama3", "train", "torch.compile", [0.010] * 8, pipelined_s=[0.010] * 6)
    paired_base = measured("llama3", "train", "torch.compile", [0.020] * 8,
                           pipelined_s=[0.020] * 6, paired=True)
    ours = measured("llama3", "train", "thunder+fusecut", [0.019] * 8,
                    pipelined_s=[0.018] * 3 + [0.019] * 3, paired=True, peak_gib=None,
                    first_s=None)
    rows = bench.table_rows([alone, paired_base, ours])
    row = next(r for r in rows if r[2] == "thunder+fusecut")
    assert row[4].startswith("0.950x")  # 19 / 20 ms: the paired baseline, not the 10 ms one
    assert row[6].startswith("0.925x")  # pipelined: median 18.5 / 20 ms, with its interval
    assert row[7] == "-" and row[8] == "-"  # peak and first step: left to one-system rows
    assert [r[2] for r in rows] == ["torch.compile", "thunder+fusecut", "torch.compile"]


def test_a_paired_process_that_dies_leaves_a_row_per_system_and_step(monkeypatch):
    def dying(command, **kwargs):
        return subprocess.CompletedProcess(command, -6, stdout="Segmentation fault\n", stderr="")

    monkeypatch.setattr(bench.subprocess, "run", dying)
    rows = bench.child_results("llama3", "thunder+fusecut,torch.compile", ["train"], 4, None, 60,
                               lambda line: None)
    assert sorted(r["system"] for r in rows) == ["thunder+fusecut", "torch.compile"]
    assert all(r["paired"] and r["error"].startswith("not run") for r in rows)


def test_warm_takes_the_first_step_again_in_a_second_process_over_the_first_ones_caches(
        monkeypatch):
    # the second process is the first's command with --first-only, in the same environment
    # (its cache folders): what a script's rerun pays
    calls = []

    def child(command, env, **kwargs):
        calls.append((command, env["FUSECUT_CACHE_DIR"], env["TORCHINDUCTOR_CACHE_DIR"]))
        row = measured("llama3", "train", "torch.compile", [0.01] * 4)
        if "--first-only" in command:
            row = {"model": "llama3", "step": "train", "system": "torch.compile", "warm_s": 2.5}
        return subprocess.CompletedProcess(command, 0, stdout=bench.ROW_MARK + json.dumps(row),
                                           stderr="")

    monkeypatch.setattr(bench.subprocess, "run", child)
    rows = bench.child_results("llama3", "torch.compile", ["train"], 4, None, 60,
                               lambda line: None, warm=True)
    assert len(calls) == 2 and calls[0][1:] == calls[1][1:]
    assert "--first-only" not in calls[0][0] and calls[1][0][-1] == "--first-only"
    assert rows[0]["warm_s"] == 2.5 and rows[0]["first_s"] == 30.0
    row = bench.table_rows(rows)[0]
    assert row[bench.HEADERS.index("warm first step s")] == "2.5"
    assert row[bench.HEADERS.index("first step s")] == "30.0"


def test_a_row_without_its_baseline_has_no_ratio():
    rows = bench.table_rows([measured("llama3", "infer1", "eager", [0.01, 0.011])])
    assert rows[0][4] == "-"


def test_a_process_that_dies_leaves_a_row_for_every_step_it_did_not_report(monkeypatch):
    reported = {"model": "nanogpt", "step": "train", "system": "thunder+nvfuser",
                "error": "x"}

    def dying(command, **kwargs):
        out = bench.ROW_MARK + json.dumps(reported) + "\nCUDA error: an illegal memory access\n"
        return subprocess.CompletedProcess(command, -6, stdout=out, stderr="")

    monkeypatch.setattr(bench.subprocess, "run", dying)
    rows = bench.child_results("nanogpt", "thunder+nvfuser", ["train", "infer1"], 4, None, 60,
                               lambda line: None)
    assert [r["step"] for r in rows] == ["train", "infer1"]
    assert rows[1]["error"].startswith("not run: the process ended (-6)")
    assert "illegal memory access" in rows[1]["error"]


def test_batches_follow_the_issue_and_the_models_positions():
    assert bench.batch_of("nanogpt", "train", 1024) == (8, 1024)
    assert bench.batch_of("llama3", "train", 2048) == (2, 2048)
    assert bench.batch_of("llama3", "infer1", 2048) == (1, 128)
    assert bench.batch_of("nanogpt", "infer8", 1024) == (8, 1024)  # GPT-2 has 1024 positions
    assert bench.batch_of("llama3", "infer8", 2048) == (8, 2048)


def test_help_and_the_refusals():
    run = [sys.executable, "-m", "benchmarks.thunder_models"]
    assert "whole" in subprocess.run(run + ["--help"], capture_output=True, text=True,
                                     timeout=120).stdout.lower()
    bad = subprocess.run(run + ["--systems", "nvfuser"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "unknown systems ['nvfuser']" in bad.stderr
    if not torch.cuda.is_available():
        done = subprocess.run(run, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "needs a CUDA GPU" in done.stderr


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_whole_models_give_a_loss_that_skips_padding_and_tie_their_head(name):
    model, make_batch = whole_model(name, "tiny")
    tokens, targets = make_batch(2, 8)
    assert (targets[:, -2:] == (IGNORE_INDEX if name == "llama3" else -1)).all()
    loss = model(tokens, targets)
    assert loss.dim() == 0 and torch.isfinite(loss)
    if name == "llama3":
        logits = model(tokens)
    else:  # LossOf wraps Thunder's models, whose logits given targets cover every position
        logits = model.model(tokens, targets)
        logits = logits[0] if isinstance(logits, tuple) else logits
    assert logits.shape == (2, 8, 200)
    assert model(tokens).shape[-1] == 200  # inference: the logits (llama2: the last position's)
    # the loss is the mean over the positions that are not padding
    kept = logits[:, :-2].reshape(-1, 200).float()
    torch.testing.assert_close(loss, F.cross_entropy(kept, targets[:, :-2].reshape(-1)))
    embeddings = [p for n, p in model.named_parameters() if "emb" in n or "wte" in n]
    heads = [m.weight for n, m in model.named_modules() if n.endswith(("head", "output"))]
    assert heads and any(h is e for h in heads for e in embeddings), "the head is not tied"
    again, _ = whole_model(name, "tiny")  # the same weights from the same seed
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))


def test_thunder_without_a_fusion_executor_and_fusecuts_note_of_its_setup():
    # thunder+torch: the row that tells Thunder's own first-step cost from fusecut's
    model, make_batch = whole_model("nanogpt", "tiny")
    tokens, targets = make_batch(2, 16)
    plain = bench.build("thunder+torch", model)
    torch.testing.assert_close(plain(tokens, targets), model(tokens, targets))
    from fusecut.thunder.reports import region_reports

    assert region_reports(plain) == []
    ours = bench.build("thunder+fusecut", model)
    ours(tokens, targets).backward()
    note = bench.fusecut_note(ours)
    regions = len(region_reports(ours))
    assert note.startswith(f"{regions} fusecut regions, set up in ") and "plan " in note

    class Info:  # thunderfx keeps one Thunder function per Dynamo subgraph
        thunder_compiled_fns = [ours, ours]

    class FX:
        _backend = type("Backend", (), {"subgraph_infos": [Info()]})()

    assert bench.fusecut_note(FX()).startswith(f"{2 * regions} fusecut regions")


@pytest.mark.parametrize("system", ["torch.compile+fusecut", "torch.compile+fusecut+cudagraphs"])
@pytest.mark.parametrize("name", ["hf_llama", "hf_gpt2"])
def test_hugging_face_models_under_the_fusecut_backend_as_the_benchmark_builds_them(name, system):
    # issue 42: the torch.compile+fusecut system on transformers' Llama and GPT-2; their loss
    # is the model's own (labels shifted by one), padding skipped
    pytest.importorskip("transformers", minversion="5.0")
    model, make_batch = whole_model(name, "tiny")
    tokens, targets = make_batch(2, 8)
    loss = model(tokens, targets)
    logits = model(tokens)
    shifted = F.cross_entropy(logits[:, :-1].reshape(-1, 200).float(),
                              targets[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(loss, shifted)
    torch._dynamo.reset()
    compiled = bench.build(system, model)
    torch.testing.assert_close(compiled(tokens, targets), loss, rtol=1e-5, atol=1e-5)
    note = bench.fusecut_note(compiled)
    assert re.match(r"[1-9]\d* fusecut regions", note), note
    assert "on torch" not in note, note


def test_the_dynamo_profile_marks_each_region_call_and_leaves_regions_as_they_were():
    # benchmarks.dynamo_profile splits a step's time by region through these markers
    import fusecut.dynamo
    from benchmarks import dynamo_profile
    from fusecut.dynamo.regions import Region

    forward = Region.forward
    torch._dynamo.reset()
    fn = torch.compile(lambda x: torch.tanh(x * 2) + 1, backend=fusecut.dynamo.backend())
    with dynamo_profile.labelled_regions():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn(torch.randn(8, 16))
    marks = [e.key for e in prof.key_averages() if e.key.startswith(dynamo_profile.MARK)]
    assert marks and all(m.startswith(dynamo_profile.MARK + "inference:") for m in marks), marks
    assert Region.forward is forward
    done = subprocess.run([sys.executable, "-m", "benchmarks.dynamo_profile"], text=True,
                          capture_output=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode != 0 and "needs a CUDA GPU" in done.stderr
