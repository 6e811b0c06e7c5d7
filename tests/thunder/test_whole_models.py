"""Whole language models through Thunder with fusecut in nvFuser's place: nanoGPT's ``GPT``,
Thunder's llama2 ``Transformer`` and a Llama-3-style LM (``benchmarks.whole_models``), training
(loss and backward) and inference (logits under no_grad), in fp32 and bf16.

For each: the step equals Thunder's torch executor's (loss and every gradient, or the logits);
no region fell back to torch; and every region Thunder handed fusecut plans, and every generated
segment's CUDA (vectorised and scalar) compiles with NVRTC, which needs no GPU. On the CPU the
regions run fusecut's torch reference; on the GPU (the device) the same steps run its kernels.
"""

from __future__ import annotations

import pytest
import torch

import fusecut.thunder
from benchmarks.whole_models import MODEL_NAMES, whole_model
from fusecut.thunder.executor import thunder
from fusecut.thunder.regions import fusecut_regions
from fusecut.thunder.reports import region_reports
from tests.helpers import compile_failures
from tests.thunder.thunder_steps import assert_same_lm_step, torch_executor_lm_step

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
BATCH, SEQ = 2, 24  # shorter than the models' 32 positions: slices of the rotary tables


def regions_of(jitted) -> dict[str, tuple]:
    """Each distinct region of the last forward (and backward) trace: its name, definition and
    the metadata of the inputs it first ran with."""
    traces = [thunder.last_traces(jitted)[-1]]
    try:
        traces.append(thunder.last_backward_traces(jitted)[-1])
    except Exception:  # inference: no backward was traced
        pass
    found = {}
    for trace in traces:
        for bsym, fn in fusecut_regions(trace):
            if getattr(fn, "first_args", None) is not None:
                found.setdefault(repr(fn.first_definition),
                                 (bsym.sym.name, fn.first_definition, fn.first_args))
    return found


_references: dict[tuple, list[torch.Tensor]] = {}


def bf16_weights(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every weight rounded to bf16 (kept in its dtype): the fp32 and bf16
    models then compute with the same weights."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16))
    return model


def reference_step(name: str, mode: str, device: str, model, tokens, targets):
    """Thunder's torch executor's step of the model, per dtype. The weights are bf16 values
    (``bf16_weights``), so the fp32 step of the fp32 test is the one the bf16 test measures
    against too: it is kept (a whole model's trace takes Thunder seconds)."""
    def reference(dtype: torch.dtype) -> list[torch.Tensor]:
        key = (name, mode, device, dtype)
        if key not in _references or dtype != torch.float32:
            _references[key] = torch_executor_lm_step(model, tokens, targets, dtype)
        return _references[key]
    return reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["train", "infer"])
@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("device", DEVICES)
def test_whole_model_steps_like_torch_and_every_region_compiles(device, name, mode, dtype):
    model, make_batch = whole_model(name, "tiny")
    model = bf16_weights(model).to(device=device, dtype=dtype)
    tokens, targets = make_batch(BATCH, SEQ, device)
    ours = thunder.jit(model, executors=fusecut.thunder.executors())
    targets = targets if mode == "train" else None
    assert_same_lm_step(ours, model, tokens, targets,
                        reference_step(name, mode, device, model, tokens, targets))

    reports = region_reports(ours)
    assert reports, "Thunder handed fusecut no region"
    fell_back = [r.summary() for r in reports if r.fallback is not None]
    assert not fell_back, fell_back
    regions = regions_of(ours)
    assert regions
    if device == "cpu":  # on the GPU the step itself compiled and ran every region
        failures = compile_failures(regions)
        assert not failures, "\n".join(failures)
