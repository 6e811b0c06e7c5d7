"""``fusecut_ex``: a Lightning Thunder fusion executor that plans and runs regions with fusecut.

    import thunder
    from thunder.executor import fusecut_ex

    jitted = thunder.jit(model, executors=[fusecut_ex])

Thunder groups the prims fusecut claims into regions (and keeps its own rematerialization, which
decides what crosses between regions and from forward to backward); fusecut turns each region
into a definition, plans its kernels and runs them. Anything fusecut cannot take (random numbers,
an unsupported dtype, a region the translation or the planner rejects) stays with the next
executor in the list, never an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from fusecut.thunder.compat import before_thunder  # noqa: E402

before_thunder()

import thunder  # noqa: E402
from thunder.core import prims, utils  # noqa: E402
from thunder.core.proxies import Proxy, TensorProxy, unvariableify  # noqa: E402
from thunder.core.rematerialization import rematerialize, replace_uniform  # noqa: E402
from thunder.core.symbol import BoundSymbol  # noqa: E402
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace  # noqa: E402
from thunder.core.transform_common import dce  # noqa: E402
from thunder.executors.passes import update_fusion_call_ctx  # noqa: E402
from thunder.executors.utils import Region  # noqa: E402
from thunder.extend import FusionExecutor, register_executor  # noqa: E402

from fusecut.runtime.lru import BoundedCache  # noqa: E402
from fusecut.thunder.attention import guard_thunder_sdpa, sdpa_in_4d  # noqa: E402
from fusecut.thunder.compile_ahead import compile_region_ahead  # noqa: E402
from fusecut.thunder.epilogues import (  # noqa: E402
    EPILOGUE_MIN_BYTES,
    fuse_gemm_epilogues,
    register_epilogue_ops,
)
from fusecut.thunder.fast_tracing import install as install_fast_tracing  # noqa: E402
from fusecut.thunder.layout import is_layout_only, split_region  # noqa: E402
from fusecut.thunder.missing_sums import sum_mislabelled_gradients  # noqa: E402
from fusecut.version import __version__  # noqa: E402

__all__ = ["FusecutExecutor", "executors", "fusecut_ex", "thunder", "transforms"]

# Thunder's first step is mostly its interpreter: two shortcuts in it, the same traces
install_fast_tracing()

from fusecut.thunder.claims import (  # noqa: E402
    FACTORIES,
    LIBRARY,
    POINTWISE,
    REDUCTIONS,
    SHAPES,
    checker,
)
from fusecut.thunder.regions import (  # noqa: E402
    Fallback,
    FusecutRegion,
    fast_path_off,
    fusecut_regions,
    region_key,
    torch_callable,
)
from fusecut.thunder.translation import Translation, TranslationError, translate  # noqa: E402

# ---- the executor -------------------------------------------------------------------------------


class FusecutExecutor(FusionExecutor):
    """Thunder fusion executor backed by fusecut.

    Args:
        name: the executor's name (unique among registered executors).
        claim_matmul: also claim ``matmul`` and ``linear``; they then run as library segments
            inside fusecut's plan instead of on the next executor.
        plan_remote: a fusecut service URL: plan there (metadata only), run here.
        gemm_epilogues: a tanh GELU after a ``linear`` and its derivative after the backward's
            matmul, and a residual added to a ``linear``, run in those GEMMs' epilogues (see
            ``thunder_epilogues``) where the GEMM's output has at least ``epilogue_min_bytes``.
    """

    def __init__(self, name: str = "fusecut", *, claim_matmul: bool = False,
                 plan_remote: str | None = None, gemm_epilogues: bool = True,
                 epilogue_min_bytes: int = EPILOGUE_MIN_BYTES):
        super().__init__(name, version=__version__)
        self.plan_remote = plan_remote
        self.epilogues = (register_epilogue_ops(self, name, epilogue_min_bytes)
                          if gemm_epilogues else None)
        self.claimed: dict[Any, str] = {**POINTWISE, **REDUCTIONS, **SHAPES, **FACTORIES}
        if claim_matmul:
            self.claimed.update(LIBRARY)
        for prim_id in self.claimed:
            self.register_supported(prim_id, checker(prim_id))
        # the regions fused lately, by region_key: their bound symbols (kept, so that no other
        # object takes their ids), prepared bound symbols, inputs, outputs and translation
        self._fused: BoundedCache[tuple, tuple] = BoundedCache(4096)
        # PyTorch's fused inference paths of nn.MultiheadAttention and nn.TransformerEncoderLayer
        # (torch._native_multi_head_attention, torch._transformer_encoder_layer_fwd) are opaque
        # calls Thunder cannot trace: with fusecut in the list, Thunder traces these modules with
        # the fast path off, as the ops it fuses (the same values)
        self._lookasides[torch.backends.mha.get_fastpath_enabled] = fast_path_off
        # Thunder's sdpa executor claims attention whose kernels then refuse a 2-d or 3-d mask
        # (or a mask broadcast over the batch), failing the step: traced in the 4-d form they
        # take instead (``attention.sdpa_in_4d``)
        self._lookasides[torch.nn.functional.scaled_dot_product_attention] = sdpa_in_4d

    def flatten(self, bsym: BoundSymbol) -> list[BoundSymbol]:
        if self.can_execute(bsym):
            return [bsym]
        if not bsym.subsymbols:
            raise TranslationError(f"{bsym.sym.name} is neither claimed nor decomposable")
        return [leaf for sub in bsym.subsymbols for leaf in self.flatten(sub)]

    def _prepare(self, region: Region) -> tuple[list[BoundSymbol], list[Proxy], list[Proxy]]:
        inputs = [unvariableify(x) for x in region.inputs]
        outputs = [unvariableify(x) for x in region.outputs]
        flat = [leaf for bsym in region.bound_symbols for leaf in self.flatten(bsym)]
        # Drop what the outputs do not need (and the inputs only that needed).
        trace = TraceCtx(None)
        trace.bound_symbols = flat + [prims.python_return.bind(outputs, output=None)]
        needed: set = set()
        trace = dce(trace, needed)
        flat = [b for b in trace.bound_symbols if b.sym.id != prims.python_return.id]
        from thunder.core.proxies import variableify

        inputs = [x for x in inputs if variableify(x) in needed]
        return flat, inputs, outputs

    def fuse(self, region: Region, fusion_counter: int) -> BoundSymbol:
        # Thunder fuses every region again after its passes (update_fusion_call_ctx), most of
        # them unchanged: a region made of the bound symbols and proxies of one fused before
        # takes that one's translation (a 12-layer nanoGPT: 137 of 495 translations)
        made = self._fused.get(region_key(region.bound_symbols, region.inputs, region.outputs))
        if made is not None:
            _, bsyms, inputs, outputs, translation = made
            return self._fusion(f"fusecut{fusion_counter}", bsyms, inputs, outputs, translation)
        bsyms, inputs, outputs = self._prepare(region)
        return self._fusion(f"fusecut{fusion_counter}", bsyms, inputs, outputs)

    def _fusion(self, name: str, bsyms: list[BoundSymbol], inputs: list[Proxy],
                outputs: list[Proxy], translation: Translation | None = None) -> BoundSymbol:
        """The fusion symbol that runs ``bsyms`` (claimed prims) as fusecut region ``name``
        (``translation``: theirs, where the caller has it already)."""

        def fallback() -> Callable:
            return torch_callable(bsyms, inputs, outputs)

        def retranslate(in_orders: tuple, out_orders: tuple) -> Translation:
            return translate(bsyms, inputs, outputs, self.claimed, in_orders, out_orders)

        try:
            if translation is None:
                translation = translate(bsyms, inputs, outputs, self.claimed)
            self._fused.put(region_key(bsyms, inputs, outputs),
                            (tuple(bsyms), bsyms, inputs, outputs, translation))
            out_ranks = [len(p.shape) if isinstance(p, TensorProxy) else 0 for p in outputs]
            fn: Callable = FusecutRegion(name, translation, self.plan_remote, fallback,
                                         retranslate, out_ranks)
        except TranslationError as e:
            # Only reachable when Thunder re-fuses a region it moved ops into; the first
            # fusion_pass already left untranslatable regions to other executors.
            fn = Fallback(name, str(e), fallback)
        return self.register_temporary_operation(name, fn, inputs=inputs, outputs=outputs,
                                                 bsyms=bsyms)

    def kernel_of(self, region: Region) -> tuple[list[BoundSymbol], list[Proxy], list[Proxy],
                                                 Translation] | None:
        """The region prepared and translated, where it is worth a kernel: it translates and
        computes something (a region of layout prims only would just copy: torch's views do it
        for nothing); else None. The fusion pass hands both to ``_fusion``, so each region is
        prepared and translated once (a 12-layer nanoGPT's fusion passes: 6.0 s of its first
        step on a 2-core CPU, then 4.9 s)."""
        try:
            bsyms, inputs, outputs = self._prepare(region)
            translation = translate(bsyms, inputs, outputs, self.claimed)
        except TranslationError:
            return None
        return None if is_layout_only(bsyms) else (bsyms, inputs, outputs, translation)

    def fusion_pass(self, trace: TraceCtx) -> TraceCtx:
        start = time.perf_counter_ns()
        from thunder.executors.data_dependent_partition import Node, fuse_bound_symbols

        # Thunder may label a broadcast-shaped gradient 0-d; fusecut plans from labels, so the
        # sum Thunder left out goes in first (``missing_sums``)
        trace = sum_mislabelled_gradients(trace, POINTWISE)
        if self.epilogues is not None:
            trace = fuse_gemm_epilogues(trace, self.epilogues)
        if _uniform_on_cuda_only(trace):
            # As Thunder's nvFuser pass: stateless draws from the generator's seed and offset,
            # which rematerialization may recompute in the backward instead of saving a mask.
            trace = replace_uniform(trace)
        fused = from_trace(trace)
        producers, consumers = utils.producers_and_consumers(trace)

        def fusible(n: Node) -> bool:
            return len(n.group_bsyms) > 1 or self.can_fuse(n.group_bsyms[0])

        groups = fuse_bound_symbols(trace, lambda a, b: fusible(a) and fusible(b))
        bsyms_out: list[BoundSymbol] = []
        counter = 0
        for bsyms in groups:
            if len(bsyms) == 1 and not self.can_fuse(bsyms[0]):
                bsyms_out.append(bsyms[0])
                continue
            kernel = self.kernel_of(Region(producers, consumers, bsyms))
            if kernel is None:
                bsyms_out.extend(bsyms)
                continue
            bsyms_out.append(self._fusion(f"fusecut{counter}", *kernel))
            counter += 1
        fused.bound_symbols = bsyms_out
        fused = rematerialize(fused)
        fused = dce(fused)
        fused = self._views_out_of_kernels(fused)
        fused = update_fusion_call_ctx(fused)
        self._compile_ahead(fused)
        ms = (time.perf_counter_ns() - start) // 1_000_000
        fused.set_provenance(TraceProvenance(f"Fusion by fusecut (took {ms} milliseconds)"))
        return fused

    def _compile_ahead(self, trace: TraceCtx) -> None:
        """Each region on CUDA tensors planned and its kernels compiled in background threads
        while Thunder finishes the step's traces (``compile_ahead``): its first launch then
        finds them compiled."""
        for bsym, fn in fusecut_regions(trace):
            if isinstance(fn, FusecutRegion) and fn.plan_remote is None:
                compile_region_ahead(fn.definition, bsym.flat_args)

    def _views_out_of_kernels(self, trace: TraceCtx) -> TraceCtx:
        """Each region's outputs that torch can return as views leave its kernel (see
        ``thunder_layout``); a region left with nothing to compute dissolves into torch prims."""
        out = from_trace(trace)
        bsyms: list[BoundSymbol] = []
        for bsym in trace.bound_symbols:
            if not (bsym.sym.is_fusion and bsym.sym.executor is self):
                bsyms.append(bsym)
                continue
            inputs = [a for a in bsym.flat_args if isinstance(a, Proxy)]
            split = split_region(bsym.subsymbols, inputs, list(bsym.flat_outs))
            if not split.changed:
                bsyms.append(bsym)
                continue
            bsyms.extend(split.before)
            if split.kernel:
                bsyms.append(self._fusion(bsym.sym.name, split.kernel, split.kernel_inputs,
                                          split.kernel_outputs))
            bsyms.extend(split.after)
        out.bound_symbols = bsyms
        return dce(out)


def _uniform_on_cuda_only(trace: TraceCtx) -> bool:
    """Some ``uniform`` draws, all on CUDA (Thunder's generator-state prim reads CUDA's)."""
    draws = [b for b in trace.bound_symbols if b.sym.id == prims.PrimIDs.UNIFORM]
    return bool(draws) and all(b.kwargs["device"].type == "cuda" for b in draws)


fusecut_ex = FusecutExecutor()
register_executor(fusecut_ex)


# Thunder 0.2.6's cudnn executor computes wrong attention gradients in 16-bit: measured on the
# H100 (cuDNN 9.19, frontend 1.16), a bf16 nanoGPT step's gradients were 1.27-1.52 of their own
# size off the fp32 step where SDPA's were 0.012 (head size 32 and 64, sequences 24 to 128).
# Its forward is right, but a step that trains on it does not train: left out unless asked for.
CUDNN_ATTENTION_WRONG = ("Thunder's cudnn executor computes wrong bf16 attention gradients "
                         "(measured on the H100, cuDNN 9.19, frontend 1.16)")


def executors(executor: FusecutExecutor | None = None, *, cudnn: bool = False,
              attention: bool = True, cross_entropy: bool = True) -> list[Any]:
    """Thunder's default executors with fusecut (``executor``, ``fusecut_ex`` by default) in
    nvFuser's place, or last where nvFuser is absent: just before the executors Thunder always
    appends (torch, python).

    Attention runs on cuDNN through torch's own cuDNN SDPA kernels where they apply
    (``fusecut.thunder.attention``, listed first; ``attention=False`` leaves it out), else on
    Thunder's SDPA executor. Thunder lists its own cudnn executor first where the cuDNN frontend
    is installed; it is left out (``CUDNN_ATTENTION_WRONG``) unless ``cudnn=True``.

    ``cross_entropy`` is differentiated by ``fusecut.thunder.cross_entropy`` (listed first;
    ``cross_entropy=False`` leaves it to Thunder's Inductor executor): its backward recomputes
    the softmax from the logits in fusecut's kernels instead of saving it.

        jitted = thunder.jit(model, executors=fusecut.thunder.executors())
    """
    fusecut = executor if executor is not None else fusecut_ex
    chosen = [e for e in thunder.get_default_executors()
              if e is not fusecut and (cudnn or e.name != "cudnn")]
    names = [e.name for e in chosen]
    for e in chosen:
        if e.name == "sdpa":  # it claims no call its kernels refuse later (``attention``)
            guard_thunder_sdpa(e)
    if "nvfuser" in names:
        chosen[names.index("nvfuser")] = fusecut
    elif "torch" in names:
        chosen.insert(names.index("torch"), fusecut)
    else:
        chosen.append(fusecut)
    if cross_entropy:
        from fusecut.thunder.cross_entropy import cross_entropy_ex

        chosen.insert(0, cross_entropy_ex)
    if attention:
        from fusecut.thunder.attention import cudnn_attention_available, cudnn_attention_ex

        if cudnn_attention_available():
            chosen.insert(0, cudnn_attention_ex)
    return chosen


def transforms(*, cuda_graphs: bool = False) -> list[Any]:
    """The transforms to jit a module with, beside ``executors()``: ``nn.MultiheadAttention`` in
    ops Thunder can differentiate (``fusecut.thunder.multihead_attention``), tied parameters
    traced as one value (``fusecut.thunder.tied_parameters``), and with ``cuda_graphs`` fusecut's
    CUDA-graph transform (``fusecut.thunder.cudagraphs``).

        jitted = thunder.jit(model, executors=fusecut.thunder.executors(),
                             transforms=fusecut.thunder.transforms())
    """
    from fusecut.thunder.multihead_attention import MultiheadAttentionTransform
    from fusecut.thunder.tied_parameters import TiedParametersTransform

    chosen: list[Any] = [MultiheadAttentionTransform(), TiedParametersTransform()]
    if cuda_graphs:
        from fusecut.thunder.cudagraphs import CUDAGraphTransform

        chosen.append(CUDAGraphTransform())
    return chosen
