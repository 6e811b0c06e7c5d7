"""The torch.compile backend's own behaviour: found by name, a region that fails runs on ATen
without breaking the step, and the partitioner's cut (issue 42)."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import fusecut.dynamo
import fusecut.engine
from fusecut.dynamo.partition import choose_saved, partition_reports
from fusecut.optimizer.errors import PlanError
from tests.dynamo.regions_made import last_serial, regions_since


class Block(torch.nn.Module):
    """Linear -> LayerNorm -> GELU -> Linear -> cross-entropy: fusible ops around two matmuls."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.down = torch.nn.Linear(64, 10)

    def forward(self, x, target):
        return F.cross_entropy(self.down(F.gelu(self.norm(self.up(x)))), target)


def _step(model, backend, x, target):
    torch._dynamo.reset()
    loss = torch.compile(model, backend=backend)(x, target)
    loss.backward()
    return loss, [p.grad.clone() for p in model.parameters()]


def _eager_step(x, target):
    torch.manual_seed(0)
    model = Block()
    loss = model(x, target)
    loss.backward()
    return loss, [p.grad for p in model.parameters()]


def test_the_backend_is_registered_by_name():
    # the torch_dynamo_backends entry point: no import of fusecut needed
    assert "fusecut" in torch._dynamo.list_backends()


@pytest.mark.parametrize("partitioner", ["fusecut", "min_cut", "default"])
def test_every_partitioner_steps_as_eager(partitioner):
    x, target = torch.randn(8, 32), torch.arange(8) % 10
    want_loss, want = _eager_step(x, target)
    torch.manual_seed(0)
    loss, grads = _step(Block(), fusecut.dynamo.backend(partitioner=partitioner), x, target)
    torch.testing.assert_close(loss, want_loss)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_a_region_that_fails_to_plan_runs_on_aten_and_the_step_holds(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise PlanError("injected plan failure")

    monkeypatch.setattr(fusecut.engine, "make_plan", broken)
    x, target = torch.randn(24, 32), torch.arange(24) % 10  # shapes no other test plans
    want_loss, want = _eager_step(x, target)
    torch.manual_seed(0)
    model = Block()
    last = last_serial()
    with caplog.at_level(logging.WARNING, logger="fusecut.dynamo"):
        loss, grads = _step(model, "fusecut", x, target)
    torch.testing.assert_close(loss, want_loss)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    reports = [r.report() for r in regions_since(last)]
    assert reports and all(r.fallback_stage == "plan" for r in reports), reports
    assert all("injected plan failure" in r.fallback for r in reports)
    assert sum("runs on ATen from now on" in m for m in caplog.messages) == len(reports)


def test_reports_say_what_each_region_planned():
    torch.manual_seed(0)
    last = last_serial()
    _step(Block(), "fusecut", torch.randn(8, 32), torch.arange(8) % 10)
    regions = regions_since(last)
    reports = [r.report() for r in regions]
    assert {r.direction for r in reports} == {"forward", "backward"}
    for r in reports:
        assert r.fallback is None and r.calls == 1 and r.planned_bytes > 0 and r.segments
        assert "def nvfuser_fusion" in r.definition and "fd.ops." in r.definition
        assert r.lower_bound_bytes <= r.planned_bytes <= r.greedy_bytes
    assert [r.summary() for r in fusecut.dynamo.region_reports()[-len(reports):]] == \
        [r.summary() for r in reports]


def _joint_graph(fn, *args):
    """AOTAutograd's joint graph of ``fn`` (forward and backward, before partitioning)."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    found = {}

    def keep(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        from torch._functorch.partitioners import default_partition

        found["graph"] = joint.graph
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    def boxed(gm, _):
        return make_boxed_func(gm.forward)

    compiled = aot_function(fn, fw_compiler=boxed, bw_compiler=boxed, partition_fn=keep,
                            decompositions=fusecut.dynamo.compiler.DECOMPOSITIONS)
    compiled(*args).backward()
    return found["graph"]


def test_the_cut_saves_the_matmul_and_recomputes_the_activation():
    # gelu(x @ w).sum(): the backward needs gelu's input; the forward's cheapest offer is the
    # matmul's output (which cannot be recomputed), with gelu's pieces recomputed from it
    x = torch.randn(16, 32, requires_grad=True)
    w = torch.randn(32, 64, requires_grad=True)
    graph = _joint_graph(lambda x, w: F.gelu(x @ w).sum(), x, w)
    saved, recomputed = choose_saved(graph)
    targets = {str(n.target) for n in saved}
    assert any("mm" in t for t in targets), targets
    assert not any("erf" in t for t in targets), targets
    assert any("erf" in str(n.target) for n in recomputed)


def test_the_cut_never_saves_more_bytes_than_the_min_cut_partitioner():
    x, target = torch.randn(64, 32), torch.arange(64) % 10
    saved = {}
    for partitioner in ("min_cut", "fusecut"):
        torch.manual_seed(0)
        before = len(partition_reports())
        _step(Block(), fusecut.dynamo.backend(partitioner=partitioner), x, target)
        (report,) = partition_reports()[before:]
        saved[partitioner] = report.saved_bytes
    assert saved["fusecut"] <= saved["min_cut"], saved


def test_options_are_checked():
    with pytest.raises(ValueError, match="partitioner must be"):
        fusecut.dynamo.backend(partitioner="greedy")
    with pytest.raises(ValueError, match="cuda_graphs must be True or False"):
        fusecut.dynamo.backend(cuda_graphs="yes")
    with pytest.raises(ValueError, match="emulate_precision_casts must be True or False"):
        fusecut.dynamo.backend(emulate_precision_casts=1)
    with pytest.raises(ValueError, match="unknown option 'cudagraphs'.*cuda_graphs"):
        fusecut.dynamo.backend(cudagraphs=True)
    x, target = torch.randn(8, 32), torch.arange(8) % 10
    torch._dynamo.reset()
    with pytest.raises(Exception, match="mode must be one of default, reduce-overhead"):
        torch.compile(Block(), backend="fusecut", mode="fast")(x, target)


def test_torch_compiles_mode_and_options_reach_the_backend():
    from fusecut.dynamo.compiler import options_of

    assert options_of("reduce-overhead", None) == {"cuda_graphs": True}
    assert options_of(None, {"partitioner": "min_cut"}) == {"partitioner": "min_cut"}
    assert options_of("reduce-overhead", {"cuda_graphs": False}) == {"cuda_graphs": False}
    assert fusecut.dynamo.backend(cuda_graphs=True).options.cuda_graphs is True


def test_cuda_graphs_on_the_cpu_step_as_eager_and_say_why_they_were_not_recorded():
    # a CPU graph cannot be recorded: it runs as it is, counted as torch's own backend counts
    from torch._dynamo.utils import counters

    x, target = torch.randn(8, 32), torch.arange(8) % 10
    want_loss, want = _eager_step(x, target)
    counters.clear()
    torch.manual_seed(0)
    model = Block()
    torch._dynamo.reset()
    loss = torch.compile(model, backend="fusecut", mode="reduce-overhead")(x, target)
    loss.backward()
    torch.testing.assert_close(loss, want_loss)
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-5, atol=1e-6)
    assert counters["inductor"]["cudagraph_skips"] >= 1


def test_dynamic_shapes_run_on_fusecut_one_definition_per_shape():
    # dynamic=True: the trace's extents are symbolic; each region writes its definition at
    # each concrete shape it meets (until one plan serves every shape, issue 44)
    torch.manual_seed(0)
    model = Block()
    reference = Block()
    reference.load_state_dict(model.state_dict())
    last = last_serial()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fusecut", dynamic=True)
    batches = (8, 12, 20)
    for batch in batches:
        x, target = torch.randn(batch, 32), torch.arange(batch) % 10
        for m in (model, reference):
            for p in m.parameters():
                p.grad = None
        loss = compiled(x, target)
        loss.backward()
        want = reference(x, target)
        want.backward()
        torch.testing.assert_close(loss, want)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    regions = regions_since(last)
    assert regions and all(r.symbolic for r in regions)
    assert all(r.fallback_reason is None and r.calls == len(batches) for r in regions)
    assert all(len(r.variants) == len(batches) for r in regions)


def test_dynamic_shapes_of_one_range_search_once_per_region():
    # issue 44: batches 33, 40, 64 and 50 round to one representative (64): each region's
    # first call searches there (unless an earlier test's did), every other shape is rebound
    # to its own definition
    torch.manual_seed(0)
    model = Block()
    last = last_serial()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="fusecut", dynamic=True)
    stats = fusecut.engine.default_engine().stats
    searched, rebound = [], []
    for batch in (33, 40, 64, 50):
        made, bound = stats.plans_made, stats.plans_rebound
        compiled(torch.randn(batch, 32), torch.arange(batch) % 10).backward()
        searched.append(stats.plans_made - made)
        rebound.append(stats.plans_rebound - bound)
    regions = regions_since(last)
    assert len(regions) >= 2 and all(len(r.variants) == 4 for r in regions)
    assert searched[0] <= len(regions) and searched[1:] == [0, 0, 0]
    assert rebound == [len(regions), len(regions), 0, len(regions)]  # 64 is the representative


def test_a_cross_entropy_with_padded_labels_runs_whole_on_fusecut():
    # Hugging Face's causal-LM loss: labels padded with the ignore index and shifted, the
    # targets' log-probabilities picked with gather, the backward's one-hot a scatter. All of
    # it is in regions (the pick inside the row's reduction kernel); only the matmul is ATen's.
    def loss_of(x, w, labels):
        logits = (x @ w).float()
        labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=-100)

    torch.manual_seed(0)
    x, w = torch.randn(2, 6, 8), torch.randn(8, 11, requires_grad=True)
    labels = torch.randint(0, 11, (2, 6))
    labels[0, 2] = -100
    torch._dynamo.reset()
    serial = last_serial()
    loss = torch.compile(loss_of, backend="fusecut")(x, w, labels)
    (grad,) = torch.autograd.grad(loss, w)
    w_eager = w.detach().clone().requires_grad_()
    want = loss_of(x, w_eager, labels)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, w_eager.grad, rtol=1e-5, atol=1e-6)
    regions = regions_since(serial)
    ops = {op for r in regions for op in r.ops}
    assert {"gather.default", "scatter.value", "constant_pad_nd.default"} <= ops, ops
    assert not [r.name for r in regions if r.fallback_reason], "a region ran on ATen"


def _regions_of(fn, *args):
    before = last_serial()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(fn, backend="fusecut")(*args)
    for g, w in zip(got, fn(*args)):
        torch.testing.assert_close(g, w)
    return regions_since(before)


def test_groups_that_share_nothing_are_regions_of_their_own():
    # torch's partitioner put every layer's bias-gradient column sum in one region, run at the
    # end of the backward: each layer's gradient lived until then (GPT-2's peak memory)
    x, y = torch.randn(64, 32), torch.randn(64, 32)
    apart = _regions_of(lambda x, y: ((x * 2).sum(0), (y.exp() * 3).sum(0)), x, y)
    assert len(apart) == 2, [r.report().summary() for r in apart]
    # two reductions of one input stay together: one read of it can serve both
    together = _regions_of(lambda x, y: ((x * 2).sum(0), (x * 3).sum(0)), x, y)
    assert len(together) == 1, [r.report().summary() for r in together]


class _Residuals(torch.nn.Module):
    """Pre-norm residual blocks: x + Linear(LayerNorm(x)), three times."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 64))
             for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x.sum()


def test_a_layernorms_backward_and_its_weight_gradients_are_one_kernel():
    # the weight gradients' column sums sat in torch's partition of every layer's, apart from
    # the statistics they read: each LayerNorm backward was three regions that wrote float32
    # values between them (2.9x the bytes); joined, it is one inner-outer kernel
    torch.manual_seed(0)
    model, reference = _Residuals(), _Residuals()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(256, 64)
    before = last_serial()
    torch._dynamo.reset()
    torch.compile(model, backend="fusecut")(x).backward()
    reference(x).backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    backward = [r for r in regions_since(before) if r.direction == "backward"]
    norms = [r.report() for r in backward if "var_mean.correction" in r.ops]
    assert len(norms) == 3, [r.report().summary() for r in backward]
    for report in norms:
        assert report.segments == ["inner_outer"], report.summary()


def _tanh_gelu(x):
    """GPT-2's GELU (Hugging Face's NewGELUActivation): six ops, each rounded to bf16 in eager."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


def _tanh_gelu_rounding_each_op(x):
    """``_tanh_gelu`` with each op computed in float32 and rounded to bf16, as eager on a GPU."""
    r = lambda t: t.bfloat16().float()  # noqa: E731
    x = x.float()
    inner = r(r(x + r(r(x * x * x) * 0.044715)) * 0.7978845608028654)
    return r(r(x * 0.5) * r(r(torch.tanh(inner)) + 1.0)).bfloat16()


@pytest.mark.parametrize("emulate", [False, True])
def test_a_bf16_region_rounds_its_outputs_only_unless_asked_to_round_every_op(emulate):
    """By default a region computes 16-bit values in float32 and rounds what it hands back, as
    Inductor's kernels do; ``emulate_precision_casts`` rounds every op's result, as eager."""
    from fusecut.optimizer.ir import parse_text
    from fusecut.optimizer.ir.dtypes import DType

    x = torch.randn(64, 96, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    first = last_serial()
    torch._dynamo.reset()
    compiled = torch.compile(_tanh_gelu,
                             backend=fusecut.dynamo.backend(emulate_precision_casts=emulate))
    got = compiled(x)
    (region,) = regions_since(first)
    fusion = parse_text(region.report().definition).fusion
    rounded = [t for op in fusion.ops for t in op.outputs
               if t in fusion.tensors and fusion.tensors[t].dtype is DType.bfloat16]
    if emulate:  # every op's result: mul, pow, mul, add, mul, tanh, add, mul
        assert len(rounded) == 8
        assert torch.equal(got, _tanh_gelu_rounding_each_op(x))
    else:  # the output's one cast
        assert rounded == [fusion.outputs[0]]
        assert torch.equal(got, _tanh_gelu(x.float()).bfloat16())
        assert not torch.equal(got, _tanh_gelu(x))  # eager's roundings do show here


def _rotate_half_loss(x, w):
    """RoPE's rotate-half and a slice's sum: their backward scatters each slice's gradient
    into a full-size tensor (slice_scatter), one at the end of the row, one in the middle."""
    h = x.shape[-1] // 2
    return (torch.cat([-x[..., h:], x[..., :h]], -1) * w
            + x[..., 1:5].sum(-1, keepdim=True)).sum()


def test_a_slices_gradient_is_scattered_inside_the_backwards_region():
    x = torch.randn(2, 3, 8, 16, requires_grad=True)
    w = torch.randn(16)
    _rotate_half_loss(x, w).backward()
    want, x.grad = x.grad, None
    first = last_serial()
    torch._dynamo.reset()
    torch.compile(_rotate_half_loss, backend="fusecut")(x, w).backward()
    backward = [r for r in regions_since(first) if r.direction == "backward"]
    assert sum(r.ops.count("slice_scatter.default") for r in backward) == 3
    assert all(r.report().fallback is None for r in backward)
    torch.testing.assert_close(x.grad, want, rtol=0, atol=0)


def _compared_wide_and_plain(x, w):
    y = x * w  # compared below (a max's backward does this against the saved maximum)
    top = y == y.amax(-1, keepdim=True)
    return top, (x + 1).float() * 3, torch.tanh(x) * 2  # x + 1 leaves as float32


def test_a_bf16_value_whose_rounding_can_be_seen_keeps_it():
    """In float32 regions, a 16-bit result stays rounded where a comparison reads a value
    computed from it, or where it reaches a float32 output: there eager's rounding shows."""
    from fusecut.optimizer.ir import parse_text
    from fusecut.optimizer.ir.dtypes import DType

    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 32, generator=g).bfloat16()
    w = torch.randn(32, generator=g).bfloat16()
    first = last_serial()
    torch._dynamo.reset()
    top, wide, plain = torch.compile(_compared_wide_and_plain, backend="fusecut")(x, w)
    (region,) = regions_since(first)
    fusion = parse_text(region.report().definition).fusion
    producer = {t: op for op in fusion.ops for t in op.outputs}
    rounded = {producer[producer[t].inputs[0]].name for t in fusion.tensors
               if fusion.tensors[t].dtype is DType.bfloat16 and t in producer
               and t not in fusion.outputs}  # each a cast of the op's float32 result
    assert rounded == {"mul", "max", "add"}  # y, its maximum, x + 1; not tanh(x) nor its product
    want_top, want_wide, _ = _compared_wide_and_plain(x, w)
    assert torch.equal(top, want_top) and torch.equal(wide, want_wide)
    assert torch.equal(plain, (torch.tanh(x.float()) * 2).bfloat16())
