"""Thunder + fusecut on the GPU against Thunder alone, in fp32 (issue 41): a wrong kernel must
not reach a user's gradients silently.

For every model of the zoo and the bias-gradient blocks (``tests.thunder.bias_grad_blocks``):

- a training step's loss and every gradient equal Thunder alone's (its torch executor; eager
  torch where Thunder alone cannot trace the model) at the zoo's tolerance; so does inference;
- every region fusecut ran is run again on the arguments it really got, through its kernels and
  through the torch reference: each output matches. A gradient can hide a wrong kernel (a zero
  in exact arithmetic, a value that cancels); a region's outputs cannot.

On the CPU regions run on the reference, so the CPU checks the blocks' steps against eager and
compiles every region (as the zoo does); everything else here needs the GPU (marked gpu).
"""

from __future__ import annotations

import copy

import pytest
import torch

import fusecut.thunder
from benchmarks.gpu_fuzz import mismatch
from fusecut.engine import as_metadata
from fusecut.optimizer.planner import make_plan
from fusecut.runtime.reference import run_reference
from fusecut.runtime.run import run_plan
from fusecut.thunder.executor import thunder
from fusecut.thunder.regions import FusecutRegion
from tests.thunder.bias_grad_blocks import BLOCKS
from tests.thunder.model_zoo import ZOO
from tests.thunder.test_model_zoo import assert_every_region_runs_on_fusecut_and_compiles

MODELS = {**ZOO, **BLOCKS}
# Thunder alone cannot differentiate nn.MultiheadAttention's function (its automatic vjp
# registration fails on a None output); fusecut's executor traces it as ops. Eager is the
# reference there.
THUNDER_ALONE_FAILS = {"vit", "bert"}


def jitted(model):
    return thunder.jit(model, executors=fusecut.thunder.executors(),
                       transforms=fusecut.thunder.transforms())


def reference(name: str, model):
    if name in THUNDER_ALONE_FAILS:
        return model
    return thunder.jit(model, executors=[thunder.pytorch_executor])


def training_step(fn, model, args) -> list[torch.Tensor]:
    loss = fn(*args)
    loss.backward()
    return [loss.detach()] + [p.grad for p in model.parameters()]


def on_gpu(name: str):
    torch.manual_seed(0)
    model, args = MODELS[name]()
    return model.cuda(), tuple(a.cuda() for a in args)


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_a_block_trains_like_eager_and_every_region_compiles(name):
    torch.manual_seed(0)
    model, args = BLOCKS[name]()
    eager = copy.deepcopy(model)
    want = training_step(eager, eager, args)
    ours = jitted(model)
    got = training_step(ours, model, args)
    names = ["loss"] + [n for n, _ in model.named_parameters()]
    for n, g, w in zip(names, got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    assert_every_region_runs_on_fusecut_and_compiles(ours)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODELS))
def test_an_fp32_step_on_the_gpu_matches_thunder_alone(name):
    model, args = on_gpu(name)
    alone = copy.deepcopy(model)
    want = training_step(reference(name, alone), alone, args)
    got = training_step(jitted(model), model, args)
    names = ["loss"] + [n for n, _ in model.named_parameters()]
    for n, g, w in zip(names, got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fp32_inference_on_the_gpu_matches_thunder_alone(name):
    model, args = on_gpu(name)
    model.eval()
    with torch.no_grad():
        want = reference(name, copy.deepcopy(model))(*args)
        got = jitted(model)(*args)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_region_on_the_gpu_matches_the_reference_on_its_real_arguments(name, monkeypatch):
    first_args: dict[FusecutRegion, list] = {}
    run = FusecutRegion._run

    def recording(region, args):
        first_args.setdefault(region, [a.detach().clone() if isinstance(a, torch.Tensor) else a
                                       for a in args])
        return run(region, args)

    monkeypatch.setattr(FusecutRegion, "_run", recording)
    model, args = on_gpu(name)
    training_step(jitted(model), model, args)
    assert first_args, "Thunder handed fusecut no region"
    wrong = []
    for region, region_args in first_args.items():
        variant = region._variant(list(region_args))
        kernel_args = variant.inputs(list(region_args))
        fusion = variant.definition.fusion
        plan = make_plan(fusion, as_metadata(kernel_args))
        why = mismatch(run_plan(plan, kernel_args).outputs, run_reference(fusion, kernel_args))
        if why:
            wrong.append(f"{region.name}: {why}\n{variant.definition!r}")
    assert not wrong, "\n\n".join(wrong)
