"""fusecut's CUDA-graph transform (issue 30): the backward graph's gradients are handed to
autograd, which takes them over as ``.grad`` instead of cloning them, and a gradient still held
(accumulation, a view kept) is never rewritten by the next replay.

Each check runs twice: on the CPU with a stand-in graph whose replay rewrites its outputs' memory
as a CUDA graph's does (the whole path through Thunder's transform and autograd), and on the GPU
with CUDA graphs. They check gradients against eager torch over steps and against Thunder's torch
executor for whole models, ``.grad`` over the graph's own memory, gradient accumulation over
three backwards, and a kept view that keeps its values. Also: when a graph instance counts as
free (CPU), and the forward's outputs as Thunder's transform gives them (GPU).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import fusecut.thunder
from benchmarks.whole_models import whole_model
from fusecut.thunder.cudagraphs import INSTANCES, GraphInstance, _use_count
from fusecut.thunder.executor import thunder
from fusecut.thunder.reports import region_reports
from tests.thunder.thunder_steps import assert_same_lm_step, torch_executor_lm_step


def test_an_instance_is_free_only_while_nothing_outside_holds_its_outputs():
    outputs = (torch.empty(16), torch.empty(8))
    instance = GraphInstance(None, (), outputs, {0: _use_count(outputs[0])})
    assert instance.free()
    handed = outputs[0].detach()  # what a replay returns: a tensor of its own over the memory
    assert not instance.free()
    view = handed[4:]
    del handed
    assert not instance.free(), "a view of a handed-out gradient still reads the memory"
    del view
    assert instance.free()
    kept = outputs[1].detach()  # not handed over: Thunder's static output, not checked
    assert instance.free() and kept is not None


def once(t: torch.Tensor) -> tuple:
    """An index that reaches each element of ``t`` once (an expanded axis at 0)."""
    return tuple(slice(0, 1) if st == 0 else slice(None) for st in t.stride())


class ReplayInPlace:
    """A CPU stand-in for a captured graph: a replay runs the region again and writes its results
    into the capture's output memory, as a CUDA graph's replay writes its static outputs. As in a
    capture, the outputs hold nothing until the first replay (here: a value no step computes)."""

    def __init__(self, fn, static_inputs):
        self.fn, self.static_inputs = fn, static_inputs
        self.static_outputs = fn(*static_inputs)
        inputs = {t.untyped_storage().data_ptr() for t in static_inputs
                  if isinstance(t, torch.Tensor)}
        for out in self.static_outputs:  # (an output over an input's memory is the input's)
            if isinstance(out, torch.Tensor) and out.untyped_storage().data_ptr() not in inputs:
                out[once(out)].fill_(float("nan") if out.is_floating_point() else -7)

    def replay(self):
        for out, new in zip(self.static_outputs, self.fn(*self.static_inputs), strict=True):
            if isinstance(out, torch.Tensor):
                out[once(out)].copy_(new[once(out)])


@pytest.fixture
def cpu_graphs(monkeypatch):
    """Regions "captured" on the CPU by ReplayInPlace."""
    from fusecut.thunder.cudagraphs import HandoverRunner

    def build(self, fn, args, static_args_mask):
        static_inputs = tuple(self.get_static_buffer(a) if not static else a
                              for a, static in zip(args, static_args_mask, strict=True))
        graph = ReplayInPlace(fn, static_inputs)
        return graph, static_inputs, graph.static_outputs

    monkeypatch.setattr(HandoverRunner, "build_cuda_graph", build)
    return "cpu"


@pytest.fixture
def cuda():
    return "cuda"


def mlp(device: str = "cuda", seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(),
                               torch.nn.Linear(512, 256)).to(device)


def jitted(module: torch.nn.Module):
    """``module`` jitted as users do (tied parameters as one value, then the CUDA graphs)."""
    transforms = fusecut.thunder.transforms(cuda_graphs=True)
    fn = thunder.jit(module, executors=fusecut.thunder.executors(), transforms=transforms)
    return fn, transforms[-1].cuda_graph_runner


def batch(device: str, seed: int = 0) -> torch.Tensor:
    return torch.randn(64, 256, generator=torch.Generator().manual_seed(seed)).to(device)


def eager_grads(x: torch.Tensor, times: int = 1) -> list[torch.Tensor]:
    module = mlp(x.device.type)
    for _ in range(times):
        module(x).square().mean().backward()
    return [p.grad for p in module.parameters()]


def assert_grads_match(module: torch.nn.Module, want: list[torch.Tensor]) -> None:
    """(A function, so that no loop variable outlives it holding a gradient: a reference left
    over would rightly keep the graph from rewriting that gradient's memory.)"""
    for got, expected in zip([p.grad for p in module.parameters()], want, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def graph_memory(runner) -> set[int]:
    return {out.data_ptr() for instances in runner.instances.values() for g in instances
            for i, out in enumerate(g.static_outputs) if i in g.idle_counts}


ON_EACH = pytest.mark.parametrize("device", [
    "cpu_graphs", pytest.param("cuda", marks=pytest.mark.gpu)])


@ON_EACH
def test_gradients_are_the_graphs_memory_without_a_copy_and_match_eager(device, request):
    device = request.getfixturevalue(device)
    module = mlp(device)
    fn, runner = jitted(module)
    for step in range(3):
        x = batch(device, step)
        for p in module.parameters():
            p.grad = None
        fn(x).square().mean().backward()
        assert_grads_match(module, eager_grads(x))
    # every parameter's gradient is the backward graph's output memory: autograd took it over
    assert {p.grad.data_ptr() for p in module.parameters()} <= graph_memory(runner)
    assert runner.eager_calls == 0
    assert [len(v) for v in runner.instances.values()] == [1], "one capture served every step"


@ON_EACH
def test_accumulated_gradients_are_never_rewritten_by_the_next_replay(device, request):
    device = request.getfixturevalue(device)
    module = mlp(device)
    fn, runner = jitted(module)
    x = batch(device)
    for _ in range(3):  # no zeroing: .grad holds the first replay's memory while the others run
        fn(x).square().mean().backward()
    assert_grads_match(module, eager_grads(x, 3))
    assert [len(v) for v in runner.instances.values()] == [INSTANCES]
    assert runner.eager_calls == 0, "the second instance serves every accumulation step"


@ON_EACH
def test_a_view_of_a_gradient_kept_across_steps_keeps_its_values(device, request):
    device = request.getfixturevalue(device)
    module = mlp(device)
    fn, runner = jitted(module)
    kept = []
    for step in range(INSTANCES + 2):  # more steps than instances: the rest run eagerly
        x = batch(device, step)
        for p in module.parameters():
            p.grad = None
        fn(x).square().mean().backward()
        weight_grad = next(module.parameters()).grad
        kept.append((weight_grad[:8], eager_grads(x)[0][:8]))
    for got, want in kept:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert runner.eager_calls == 2


@pytest.mark.gpu
def test_the_forward_returns_what_thunders_transform_returns():
    from thunder.transforms.cudagraph import CUDAGraphTransform as ThunderTransform

    x = batch("cuda")
    ours, _ = jitted(mlp())
    theirs = thunder.jit(mlp(), executors=fusecut.thunder.executors(),
                         transforms=[ThunderTransform()])
    for _ in range(2):
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["nanogpt", "llama3"])  # the benchmark's models
@ON_EACH
def test_whole_models_train_like_torch_with_their_gradients_handed_over(device, name, request):
    device = request.getfixturevalue(device)
    model, make_batch = whole_model(name, "tiny")
    model = model.to(device)
    tokens, targets = make_batch(2, 24, device)
    reference = torch_executor_lm_step(model, tokens, targets, torch.float32)
    ours, runner = jitted(model)
    for _ in range(3):  # the capture, then replays
        assert_same_lm_step(ours, model, tokens, targets, lambda dtype: reference)
    # every gradient is taken over, the tied weight's too: traced as one value, its two
    # contributions are summed inside the backward graph (without the tied-parameter transform,
    # autograd sums them outside, into a new tensor)
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    assert max(uses.values()) == 2, "the model ties its head to its embedding"
    copied = [n for n, p in model.named_parameters()
              if p.grad.data_ptr() not in graph_memory(runner)]
    assert not copied, f"copied instead of taken over: {copied}"
    assert runner.eager_calls == 0
    assert all(len(v) == 1 for v in runner.instances.values())
    # fusecut's regions inside the graphs are reported, as without graphs
    reports = region_reports(ours)
    assert {"forward", "backward"} <= {r.direction for r in reports}
    # (calls: the capture's (warm-up and recording on the GPU), and the stand-in's replays)
    assert all(r.fallback is None and r.calls >= 3 for r in reports), \
        [r.summary() for r in reports]
