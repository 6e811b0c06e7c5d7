"""Tied parameters as one value in the trace: one gradient, summed inside the backward.

A module whose head shares its weight with the embedding (``head.weight = embed.weight``) reaches
Thunder's trace as two inputs, one per name, and the backward returns a gradient for each.
Autograd, seeing one leaf twice, sums the two outside the trace: a new tensor and an add kernel
over the whole weight (the Llama-3 LM's 0.4 GB of traffic a step), outside any CUDA graph too.
torch.compile sees one parameter and sums inside its backward.

The idea, as Thunder's own DDP transform does for shared parameters: every use of a tied name's
input is rewritten to the first name's input, so the trace sees one value. Thunder's autodiff then
sums the contributions inside the backward (where fusecut's regions and the GEMMs' epilogues can
take the add), and returns no gradient for the second input.

The rewrite is right only while the names share one tensor. The groups are read from the module
when the trace is built (not when it was jitted), and the prologue checks, on every call, that the
names still give one tensor: a module re-tied or untied since misses Thunder's cache and is traced
again with the groups it has then.
"""

from __future__ import annotations

import weakref
from collections import defaultdict

from thunder.core import prims
from thunder.core.proxies import TensorProxy, variableify
from thunder.core.trace import TraceCtx, TraceProvenance, from_trace, tracectx
from thunder.core.transform_common import Transform
from thunder.executors.pythonex import ex as pythonex


def _same_tensor_impl(first, other, names: str) -> None:
    if first is not other:
        raise RuntimeError(f"tied parameters {names} are no longer one tensor")


def _same_tensor_meta(first, other, names: str) -> None:
    return None


# A prologue check, run by Thunder's Python executor (the only one the prologue has): a failing
# check makes Thunder's cache miss this entry and trace again.
check_same_tensor = pythonex.register_operator(
    "fusecut_check_same_tensor", meta=_same_tensor_meta, fn=_same_tensor_impl,
    tags=(prims.OpTags.DONT_DCE,))  # it returns nothing: dead-code elimination would drop it
pythonex.register_implementation(check_same_tensor, check_same_tensor)


def tied_groups(module) -> list[list[str]]:
    """Names of the parameters that are one tensor, in ``named_parameters`` order; groups of two
    or more only."""
    by_tensor: dict[int, list[str]] = defaultdict(list)
    for name, p in module.named_parameters(remove_duplicate=False):
        by_tensor[id(p)].append(name)
    return [names for names in by_tensor.values() if len(names) > 1]


class TiedParametersTransform(Transform):
    """Rewrites the uses of tied parameters to one input (see the module's docstring)."""

    def __init__(self) -> None:
        self._module = None

    def transform_module(self, model) -> None:
        self._module = weakref.ref(model)

    def transform_traces_pre_prologue(self, prologue_trace: TraceCtx,
                                      computation_trace: TraceCtx, epilogue_trace, **kwargs):
        module = self._module() if self._module is not None else None
        groups = tied_groups(module) if module is not None else []
        if not groups:
            return prologue_trace, computation_trace, epilogue_trace

        # the parameter each prologue output unpacks, and the computation input it becomes
        by_name: dict[str, tuple] = {}
        producers = {variableify(o): bsym for bsym in prologue_trace.bound_symbols
                     for o in bsym.flat_proxy_outs}
        for unpacked, computation_input in zip(prologue_trace.output[0], computation_trace.args):
            bsym = producers.get(variableify(unpacked))
            if bsym is not None and bsym.sym is prims.unpack_parameter:
                by_name[bsym.args[1]] = (unpacked, computation_input)

        replace, checks = {}, []
        for names in groups:
            present = [n for n in names if n in by_name]
            if len(present) < 2:
                continue
            first_unpacked, first_input = by_name[present[0]]
            for other in present[1:]:
                unpacked, computation_input = by_name[other]
                if not (isinstance(first_input, TensorProxy)
                        and isinstance(computation_input, TensorProxy)):
                    continue
                replace[variableify(computation_input)] = first_input
                checks.append((first_unpacked, unpacked, f"{present[0]!r} and {other!r}"))
        if not replace:
            return prologue_trace, computation_trace, epilogue_trace

        new_prologue = from_trace(prologue_trace)
        *body, returned = prologue_trace.bound_symbols
        assert returned.sym is prims.python_return, returned.sym
        new_prologue.push_scope([])
        with tracectx(new_prologue):
            for first, other, names in checks:
                check_same_tensor(first, other, names)
        new_prologue.bound_symbols = [*body, *new_prologue.pop_scope(), returned]
        new_prologue.set_provenance(TraceProvenance("fusecut: tied parameters checked"))

        new_computation = from_trace(computation_trace)
        for bsym in computation_trace.bound_symbols:
            if bsym.sym is prims.unpack_trivial or bsym.sym is prims.python_return:
                # the inputs stay (the prologue passes every one); the uses change
                new_computation.bound_symbols.append(bsym.from_bsym())
            else:
                new_computation.bound_symbols.append(bsym.from_bsym_swap_proxies(replace))
        new_computation.set_provenance(TraceProvenance("fusecut: tied parameters as one"))
        return new_prologue, new_computation, epilogue_trace
