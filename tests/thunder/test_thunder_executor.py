"""fusecut as a Thunder executor: Thunder's own nanoGPT block, forward and backward, through
``thunder.jit(..., executors=[fusecut_ex])`` (CPU here; the same test runs on CUDA on the GPU box).
"""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys

import pytest
import torch
from thunder.core.proxies import Proxy  # noqa: E402

import fusecut.engine
from benchmarks.models import blocks, place  # noqa: E402
from fusecut.runtime import ahead
from fusecut.thunder.claims import POINTWISE, REDUCTIONS
from fusecut.thunder.executor import (
    FusecutExecutor,
    fusecut_ex,
    thunder,  # imported through fusecut, which first patches torch 2.13 for Thunder 0.2.6
)
from fusecut.thunder.layout import is_layout_only, split_region  # noqa: E402
from fusecut.thunder.regions import fusecut_regions
from fusecut.thunder.reports import region_reports
from tests.thunder.thunder_steps import assert_same_step, step

nanogpt_model = importlib.import_module("thunder.tests.nanogpt_model")
llama2_model = importlib.import_module("thunder.tests.llama2_model")

# fp32 everywhere; bf16 on CUDA (the CPU path runs fusecut's torch reference interpreter).
CASES = [("cpu", torch.float32)] + ([("cuda", torch.float32), ("cuda", torch.bfloat16)]
                                     if torch.cuda.is_available() else [])


def block(dropout: float = 0.0, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = nanogpt_model.GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16,
                                     dropout=dropout, bias=True, vocab_size=64)
    return nanogpt_model.Block(config)


def leaves(bsym):
    """The prims a bound symbol runs."""
    if not bsym.subsymbols:
        return [bsym]
    return [leaf for sub in bsym.subsymbols for leaf in leaves(sub)]


def final_traces(jitted):
    return [thunder.last_traces(jitted)[-1], thunder.last_backward_traces(jitted)[-1]]


def assert_all_fused_by_fusecut(jitted) -> None:
    """Every fusion is fusecut's, and no elementwise or reduction prim runs outside one (a cast
    to the dtype a tensor already has computes nothing: torch returns the tensor)."""
    fused_ops = set(POINTWISE) | set(REDUCTIONS)
    for trace in final_traces(jitted):
        assert fusecut_regions(trace), "no fusecut region in a trace"
        for bsym in trace.bound_symbols:
            if bsym.sym.is_fusion:
                assert bsym.sym.executor is fusecut_ex, bsym.sym.name
                continue
            outside = [leaf.sym.name for leaf in leaves(bsym)
                       if leaf.sym.id in fused_ops and not is_layout_only([leaf])]
            assert not outside, f"{bsym.sym.name} runs {outside} outside a fusion"


@pytest.fixture
def planner_calls(monkeypatch):
    calls = []
    real = fusecut.engine.make_plan

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(fusecut.engine, "make_plan", counting)
    return calls


@pytest.mark.parametrize(("device", "dtype"), CASES, ids=[f"{d}-{str(t)[6:]}" for d, t in CASES])
def test_nanogpt_block_matches_torch_executor(device, dtype, planner_calls):
    model = block().to(device=device, dtype=dtype)
    ours = thunder.jit(model, executors=[fusecut_ex])
    x = torch.randn(2, 8, 32, device=device, dtype=dtype)
    y = assert_same_step(ours, model, x)

    assert_all_fused_by_fusecut(ours)

    # Both directions planned, every region ran once; a second step plans nothing new.
    reports = region_reports(ours)
    assert {r.direction for r in reports} == {"forward", "backward"}
    assert all(r.fallback is None and r.calls == 1 for r in reports)
    assert all(r.lower_bound_bytes <= r.planned_bytes <= r.greedy_bytes for r in reports)
    assert any(len(r.segments) > 1 for r in reports)  # the backward needs more than one kernel
    # what each region cost the first step, by stage: planning always, kernels on the GPU
    stages = {"plan", "codegen"} if device == "cuda" else {"plan"}
    assert all(stages <= set(r.setup_seconds) and r.setup_seconds["plan"] > 0 for r in reports)
    assert all("set up in" in r.summary() for r in reports)
    ahead.wait()  # on CUDA, plans made ahead for row-major guesses count too
    planned = len(planner_calls)
    y2, grads2 = step(ours, model, x)
    assert len(planner_calls) == planned
    torch.testing.assert_close(y2, y)
    assert all(r.calls == 2 for r in region_reports(ours))


def test_llama2_block_matches_torch_executor():
    # RoPE (slices, cat, negation), grouped-query attention, RMSNorm and SwiGLU.
    torch.manual_seed(4)
    args = llama2_model.ModelArgs(dim=32, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=64,
                                  multiple_of=16, max_seq_len=16, dropout=0.0)
    model = llama2_model.TransformerBlock(0, args)
    cos, sin = llama2_model.precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len)
    ours = thunder.jit(model, executors=[fusecut_ex])
    assert_same_step(ours, model, torch.randn(2, 8, 32), cos[:8], sin[:8])
    assert_all_fused_by_fusecut(ours)
    assert all(r.fallback is None for r in region_reports(ours))


def assert_no_layout_only_region(jitted) -> None:
    """No fusecut region only re-lays data, none writes an output that torch could return
    as a view of an input or of another output, and none keeps a repeat or a float cast round
    trip (``split_region`` would find nothing to move or drop)."""
    for trace in final_traces(jitted):
        for bsym, _ in fusecut_regions(trace):
            assert not is_layout_only(bsym.subsymbols), f"{bsym.sym.name} only re-lays data"
            inputs = [a for a in bsym.flat_args if isinstance(a, Proxy)]
            split = split_region(bsym.subsymbols, inputs, list(bsym.flat_outs))
            assert not split.changed, (f"{bsym.sym.name} writes {[p.name for p in split.after]}"
                                       f" that views could return, or repeats work"
                                       f" (cleaned: {split.cleaned})")


BLOCKS = {name: (module, extra) for name, module, extra in blocks(32, 8, dropout=False)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_blocks_have_no_layout_only_region_and_match_torch(name, dtype):
    # bf16 brings cast round trips (bf16 -> f32 -> bf16) whose aliases later views name.
    module, extra = BLOCKS[name]
    model, extra = place(copy.deepcopy(module), extra, "cpu", dtype)
    ours = thunder.jit(model, executors=[fusecut_ex])
    torch.manual_seed(0)
    x = torch.randn(2, 8, 32, dtype=dtype)
    assert_same_step(ours, model, x, *extra)
    if dtype == torch.float32:
        # (In bf16 Thunder's autograd casts the incoming cotangent f32 and back with
        # ``Tensor.to(copy=True)`` after the fusion passes ran: no executor sees those casts.)
        assert_all_fused_by_fusecut(ours)
    assert_no_layout_only_region(ours)
    assert all(r.fallback is None for r in region_reports(ours))


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_outputs_that_are_layouts_come_back_as_views(device):
    def f(x, w):
        y = torch.relu(x * w)
        q, k = x.split(4, dim=1)  # views of the input
        return y, y.t(), y.reshape(-1), q, k.unsqueeze(0), (x * w).to(torch.float32)

    x = torch.randn(6, 8, device=device)
    w = torch.randn(6, 8, device=device)
    jitted = thunder.jit(f, executors=[fusecut_ex])
    out = jitted(x, w)
    for got, want in zip(out, f(x, w)):
        torch.testing.assert_close(got, want)
    storage = lambda t: t.untyped_storage().data_ptr()  # noqa: E731
    assert storage(out[1]) == storage(out[2]) == storage(out[0])  # one buffer, three layouts
    assert storage(out[3]) == storage(out[4]) == storage(x)  # no copy of the input at all
    assert out[1].stride() == (1, 8)
    [region] = fusecut_regions(thunder.last_traces(jitted)[-1])
    # y and x * w, each written once: the layouts of y are views, the fp32 cast of fp32 x * w is
    # x * w again, and the second x * w repeats the first (CSE).
    assert len(region[0].flat_outs) == 2


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_outputs_follow_the_memory_order_of_permuted_inputs(device):
    # RoPE on heads split off by a view: q is [b, h, s, d] laid out as [b, s, h, d]. Written
    # row-major, q_rot would be a transpose of q, and the reshape back to [b, s, h * d] a copy.
    def f(q, cos):
        half = torch.cat([-q[..., 8:], q[..., :8]], dim=-1)
        q_rot = q * cos + half
        return q_rot, (q_rot * 2).sum(-1)

    x = torch.randn(2, 8, 64, device=device)
    q = x.view(2, 8, 4, 16).transpose(1, 2)
    cos = torch.randn(8, 16, device=device)
    jitted = thunder.jit(f, executors=[fusecut_ex])
    for _ in range(2):  # the second call reuses the variant the first one made
        got = jitted(q, cos)
        for g, want in zip(got, f(q, cos)):
            torch.testing.assert_close(g, want)
    q_rot = got[0]
    assert q_rot.transpose(1, 2).is_contiguous()  # written in q's memory order
    merged = q_rot.transpose(1, 2).reshape(2, 8, 64)
    assert merged.untyped_storage().data_ptr() == q_rot.untyped_storage().data_ptr()
    [(_, region)] = fusecut_regions(thunder.last_traces(jitted)[-1])
    assert region.calls == 2 and "permute" in repr(region.first_definition)
    # A row-major q gets the row-major definition and a row-major result.
    row_major = q.contiguous()
    got = jitted(row_major, cos)
    torch.testing.assert_close(got[0], f(row_major, cos)[0])
    assert got[0].is_contiguous() and "permute" not in repr(region.definition)


def test_a_region_of_layout_only_dissolves_into_views():
    def f(x):
        return x[1:].reshape(3, 2, 3).transpose(1, 2)[:, ::2].unsqueeze(0).expand(2, -1, -1, -1)

    x = torch.randn(4, 6)
    jitted = thunder.jit(f, executors=[fusecut_ex])
    out = jitted(x)
    torch.testing.assert_close(out, f(x))
    assert not fusecut_regions(thunder.last_traces(jitted)[-1])
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_thunder_imports_before_fusecut():
    # Thunder 0.2.6 needs torch's named-tensor methods at import; fusecut-thunder.pth installs
    # the stubs before Thunder's first import, whichever module comes first.
    code = "import thunder, torch; assert callable(torch.Tensor.align_as); print(thunder.jit)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_first_call_plans_each_region_once(planner_calls):
    model = block(seed=1)
    ours = thunder.jit(model, executors=[fusecut_ex])
    x = torch.randn(3, 5, 32)  # shapes no other test uses: the process-wide cache is cold
    step(ours, model, x)
    reports = region_reports(ours)
    assert 0 < len(planner_calls) <= len(reports)
    before = len(planner_calls)
    step(ours, model, x)
    assert len(planner_calls) == before


def test_a_retrace_for_a_new_shape_of_the_range_searches_nothing(planner_calls):
    # issue 44: Thunder writes each region's definition again for a new shape, its sizes in
    # it; a batch of the same range (5 and 7 round up to 8) rebinds every region's plan
    # instead of searching. A new sequence length searches again only where a reduction
    # reduces it (attention's softmax over the keys: whether the row stays on chip)
    model = block(seed=2)
    ours = thunder.jit(model, executors=[fusecut_ex])
    stats = fusecut.engine.default_engine().stats
    step(ours, model, torch.randn(5, 6, 32))
    regions = len(region_reports(ours))
    searched, rebound = len(planner_calls), stats.plans_rebound
    step(ours, model, torch.randn(7, 6, 32))  # a retrace: new definitions
    assert len(planner_calls) == searched
    assert stats.plans_rebound - rebound == regions
    step(ours, model, torch.randn(7, 7, 32))
    assert 0 < len(planner_calls) - searched < regions // 2


def test_the_fusion_pass_translates_each_region_once(monkeypatch):
    # kernel_of's translation is the one the region runs (it was made twice, 1 s of a
    # 12-layer nanoGPT's first step); only a region split again for its views is re-translated,
    # and Thunder's fusing every region again after its passes translates none that is unchanged
    import fusecut.thunder.executor as executor

    counts = {"translate": 0, "considered": 0, "refused": 0, "split": 0, "fused again": 0,
              "translated again": 0, "in fuse": 0}
    translate, worth, fusion, fuse = (executor.translate, FusecutExecutor.kernel_of,
                                      FusecutExecutor._fusion, FusecutExecutor.fuse)

    def counted_fuse(self, region, counter):
        counts["fused again"] += 1
        counts["in fuse"] = 1
        try:
            return fuse(self, region, counter)
        finally:
            counts["in fuse"] = 0

    def counted_translate(*args, **kwargs):
        counts["translate"] += 1
        counts["translated again"] += counts["in fuse"]
        return translate(*args, **kwargs)

    def counted_worth(self, region):
        counts["considered"] += 1
        kernel = worth(self, region)
        counts["refused"] += kernel is None
        return kernel

    def counted_fusion(self, name, bsyms, inputs, outputs, translation=None):
        counts["split"] += translation is None
        return fusion(self, name, bsyms, inputs, outputs, translation)

    monkeypatch.setattr(executor, "translate", counted_translate)
    monkeypatch.setattr(FusecutExecutor, "kernel_of", counted_worth)
    monkeypatch.setattr(FusecutExecutor, "_fusion", counted_fusion)
    monkeypatch.setattr(FusecutExecutor, "fuse", counted_fuse)
    model = block(seed=3)
    ours = thunder.jit(model, executors=[FusecutExecutor("fusecut_translations")])
    step(ours, model, torch.randn(2, 7, 32))
    assert counts["considered"] > counts["refused"]  # some regions were fused
    assert counts["translate"] == counts["considered"] + counts["split"], counts
    # Thunder fuses every region again after its passes; those rematerialization left as they
    # were are not translated again (1 of 12 here had changed; each was translated again before)
    assert counts["translated again"] < counts["fused again"] / 2, counts


def test_dropout_region_is_left_to_another_executor():
    model = block(dropout=0.25, seed=2)
    ours = thunder.jit(model, executors=[fusecut_ex])
    # The same random numbers, drawn by torch in the same order: the same results.
    assert_same_step(ours, model, torch.randn(2, 8, 32), seed=7)
    forward = thunder.last_traces(ours)[-1]
    assert fusecut_regions(forward)
    randoms = [leaf for bsym in forward.bound_symbols if not bsym.sym.is_fusion
               for leaf in leaves(bsym) if leaf.sym.name in ("uniform", "uniform_philox")]
    assert randoms, "dropout's random numbers should run outside fusecut"


@pytest.mark.gpu
def test_dropout_draws_run_in_fusecut_kernels_on_cuda(planner_calls):
    def f(x):
        return torch.nn.functional.dropout(x * 2.0, p=0.25, training=True)

    x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    jitted = thunder.jit(f, executors=[fusecut_ex])

    def run(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(seed)
        x.grad = None
        y = jitted(x)
        y.backward(torch.ones_like(y))
        return y.detach(), x.grad.clone()

    y, grad = run(3)
    # The backward's mask is the forward's (recomputed from the same seed and offset, or saved):
    # y = 2x * mask / 0.75 and dy/dx = 2 * mask / 0.75.
    torch.testing.assert_close(y, x.detach() * grad, atol=1e-6, rtol=1e-6)
    assert abs((grad == 0).float().mean().item() - 0.25) < 0.01
    ahead.wait()  # plans made ahead for row-major guesses count too
    planned = len(planner_calls)
    y_again, _ = run(3)
    assert torch.equal(y, y_again)  # the generator's seed decides the draw
    assert not torch.equal(y, run(4)[0])
    assert len(planner_calls) == planned  # seed and offset are run-time scalars: no new plan
    forward = thunder.last_traces(jitted)[-1]
    inside = {leaf.sym.name for bsym, _ in fusecut_regions(forward) for leaf in leaves(bsym)}
    assert "uniform_philox" in inside
    outside = {leaf.sym.name for bsym in forward.bound_symbols if not bsym.sym.is_fusion
               for leaf in leaves(bsym)}
    assert not outside & {"uniform", "uniform_philox"}


def test_region_whose_plan_fails_runs_on_torch(monkeypatch):
    from fusecut.optimizer.errors import PlanError

    def refuse(*args, **kwargs):
        raise PlanError("refused for this test")

    monkeypatch.setattr(fusecut.engine, "make_plan", refuse)

    def f(a, b):
        return torch.softmax(a * b + 0.5, dim=-1)

    a, b = torch.randn(3, 7), torch.randn(3, 7)  # shapes no other test plans
    jitted = thunder.jit(f, executors=[fusecut_ex])
    torch.testing.assert_close(jitted(a, b), f(a, b), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(jitted(a, b), f(a, b), atol=1e-6, rtol=1e-6)
    [report] = region_reports(jitted)
    assert "refused for this test" in report.fallback and report.calls == 2


def test_matmul_claimed_only_when_asked():
    def mlp(x, w1, w2):
        return torch.nn.functional.linear(torch.nn.functional.gelu(x @ w1), w2).sum(-1)

    args = [torch.randn(4, 16), torch.randn(16, 24), torch.randn(8, 24)]
    with_matmul = FusecutExecutor("fusecut_matmul_test", claim_matmul=True)
    for executor, claimed in ((fusecut_ex, False), (with_matmul, True)):
        jitted = thunder.jit(mlp, executors=[executor])
        torch.testing.assert_close(jitted(*args), mlp(*args), atol=2e-5, rtol=2e-5)
        inside = {leaf.sym.name for bsym, _ in fusecut_regions(thunder.last_traces(jitted)[-1])
                  for leaf in leaves(bsym)}
        assert {"linear", "matmul"} <= inside if claimed else not inside & {"linear", "matmul"}


def test_plan_remote_plans_on_the_service_and_runs_here(tmp_path, planner_calls):
    from tests.server import Server

    def f(a, b):
        return torch.nn.functional.gelu(a * b + 1.0).sum(-1)

    # 5 rows: not their range's representative; the service's plan runs all the same, not a
    # local search for the range (issue 44)
    a, b = torch.randn(5, 16), torch.randn(5, 16)
    with Server(tmp_path / "plans.sqlite") as server:
        remote_ex = FusecutExecutor("fusecut_remote_test", plan_remote=server.url)
        jitted = thunder.jit(f, executors=[remote_ex])
        torch.testing.assert_close(jitted(a, b), f(a, b), atol=1e-5, rtol=1e-5)
    # The service is gone: the plan it made is kept here.
    torch.testing.assert_close(jitted(a, b), f(a, b), atol=1e-5, rtol=1e-5)
    [report] = region_reports(jitted)
    assert report.planned_bytes is not None and report.calls == 2
    assert planner_calls == []  # planned by the service, not in this process
