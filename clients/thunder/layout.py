"""Keep layout out of kernels: the outputs of a Thunder region that torch can return as views.

A region hands fusecut its prims and the proxies it must return. Some outputs only re-lay data: a
slice, reshape, transpose, squeeze or broadcast of a region input, of another output, or of a
value the kernel computes anyway. Written by a kernel, each one is a copy (the qkv split of an
attention block would copy three activations). Returned as a torch view of the value it re-lays,
it costs nothing: the kernel writes that value once, in the layout it computes it in, and torch
runs the view prims after the kernel. nvFuser gets the same effect from its allocation domain.

The idea, in one pass over the region in program order:

- Common subexpressions collapse first (the same prim on the same arguments), as Thunder's
  nvFuser pass does.
- Each value gets a *layout*: the value whose storage it lives in (its root) and the view prims
  that lead from the root to it. A prim that computes something is its own root.
- A cast to the dtype a value already has extends its layout by an alias (torch's
  ``shallow_copy``, no copy); float cast round trips through a wider dtype (bf16 -> f32 -> bf16,
  exact) were dropped before, and those through a narrower dtype (f32 -> bf16 -> f32) where
  nothing compares or returns the unrounded value (see ``_eliminate_redundant_work``).
- Whether torch can take a reshape as a view depends on strides, so each chain is replayed on a
  meta tensor (roots contiguous, as a kernel writes them); a reshape torch would have to copy
  ends the chain and becomes a computed value instead.

Each output then needs only its root from the kernel (nothing, when the root is a region input)
and its view prims after it. A kernel left with nothing but view prims is no kernel at all: the
region dissolves and torch runs its prims (views, or the one copy torch must make).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from thunder.core import dtypes, prims
from thunder.core.proxies import Proxy, TensorProxy, Variable, variableify
from thunder.core.symbol import BoundSymbol
from thunder.core.transform_common import cse_single_bsym, replace_redundant_inputs

__all__ = ["RegionSplit", "is_layout_only", "is_view_prim", "split_region"]

# Prims that only re-lay their first argument; torch runs each as a view (reshape when strides
# allow, which the replay below checks).
_VIEW_PRIMS = {prims.reshape.id, prims.transpose.id, prims.squeeze.id,
               prims.broadcast_in_dim.id, prims.shallow_copy.id, prims.slice_prim.id}

def _dtype(x: TensorProxy) -> dtypes.dtype:
    return dtypes.to_dtype(x.dtype, true_dtype=True)


def is_view_prim(bsym: BoundSymbol) -> bool:
    """True for a prim torch runs as a view of its first argument."""
    if bsym.sym.id == prims.slice_prim.id:
        steps = bsym.args[3] if len(bsym.args) > 3 else bsym.kwargs.get("strides")
        return steps is None or all(s > 0 for s in steps)
    return bsym.sym.id in _VIEW_PRIMS


def is_layout_only(bsyms: Sequence[BoundSymbol]) -> bool:
    """A region whose every prim a view expresses: as a kernel it would only copy."""
    return all(is_view_prim(b) or _is_same_dtype_cast(b) for b in bsyms)


def _is_same_dtype_cast(bsym: BoundSymbol) -> bool:
    return (bsym.sym.id == prims.convert_element_type.id and isinstance(bsym.args[0], TensorProxy)
            and _dtype(bsym.args[0]) == dtypes.to_dtype(bsym.args[1], true_dtype=True))


@dataclass(frozen=True)
class _Layout:
    root: TensorProxy  # the value whose storage this one lives in
    chain: tuple[BoundSymbol, ...]  # view prims from root to this value, in program order
    meta: torch.Tensor  # the chain replayed on the meta device: the view's real strides

    @property
    def value(self) -> TensorProxy:
        """The proxy the chain ends at (the root itself when there is no chain)."""
        return self.chain[-1].output if self.chain else self.root


def _contiguous_meta(p: TensorProxy) -> torch.Tensor:
    return torch.empty(tuple(p.shape), device="meta")


def _replay(bsym: BoundSymbol, t: torch.Tensor) -> torch.Tensor | None:
    """``bsym`` applied to meta tensor ``t`` as torch would run it: None where it would copy."""
    a = bsym.args
    sym = bsym.sym.id
    if sym == prims.reshape.id:
        try:
            return t.view(tuple(a[1]))
        except RuntimeError:  # torch.reshape would copy here
            return None
    if sym == prims.transpose.id:
        return t.permute(tuple(a[1]))
    if sym == prims.squeeze.id:
        return t.squeeze(tuple(a[1]))
    if sym == prims.slice_prim.id:
        steps = a[3] if len(a) > 3 else bsym.kwargs.get("strides") or [1] * t.ndim
        return t[tuple(slice(lo, hi, st) for lo, hi, st in zip(a[1], a[2], steps))]
    if sym == prims.broadcast_in_dim.id:
        shape, kept = list(a[1]), list(a[2])
        view = [1] * len(shape)
        for axis, size in zip(kept, t.shape):
            view[axis] = size
        return t.reshape(view).expand(shape)
    return t  # shallow_copy


def _is_float_cast(bsym: BoundSymbol) -> bool:
    return (bsym.sym.id == prims.convert_element_type.id and isinstance(bsym.args[0], TensorProxy)
            and dtypes.is_float_dtype(_dtype(bsym.args[0]))
            and dtypes.is_float_dtype(dtypes.to_dtype(bsym.args[1], true_dtype=True)))


# (narrow, wide) float dtypes where ``wide`` holds every value of ``narrow`` exactly (range,
# precision and subnormals): narrow -> wide -> narrow gives back the narrow value, bit for bit.
_EXACT_WIDENINGS = {(dtypes.bfloat16, dtypes.float32), (dtypes.bfloat16, dtypes.float64),
                    (dtypes.float16, dtypes.float32), (dtypes.float16, dtypes.float64),
                    (dtypes.float32, dtypes.float64)}


def _is_exact_round_trip(first: dtypes.dtype, middle: dtypes.dtype) -> bool:
    """A cast ``first -> middle -> first`` computes nothing: ``middle`` is exactly wider."""
    return (first, middle) in _EXACT_WIDENINGS


# Prims whose result depends on an exact comparison of their operands' values: a max the
# backward finds again by ``eq(x, saved_max)``, a mask, a selected element.
_COMPARING = {prims.eq.id, prims.ne.id, prims.lt.id, prims.le.id, prims.gt.id, prims.ge.id,
              prims.amax.id, prims.amin.id, prims.argmax.id, prims.argmin.id,
              prims.maximum.id, prims.minimum.id, prims.topk.id, prims.sort.id}


def _rounding_matters(start: Variable, consumers: dict[Variable, list[BoundSymbol]],
                      outputs: set[Variable], narrow: dtypes.dtype) -> bool:
    """Whether the rounding to ``narrow`` that a round trip's result ``start`` carries can be
    seen: some value computed from it is compared (``_COMPARING``: an equality sees a last bit,
    through later roundings too), or leaves the region wider than ``narrow``. A value that
    leaves rounded to ``narrow`` again (a norm's bf16 output) has its last bit changed at most:
    the rounding there is dropped, as Thunder's nvFuser pass drops it."""
    todo, done = [start], {start}
    while todo:
        v = todo.pop()
        for bsym in consumers.get(v, ()):
            if bsym.sym.id in _COMPARING:
                return True
            for o in bsym.flat_outs:
                if not isinstance(o, Proxy) or variableify(o) in done:
                    continue
                if variableify(o) in outputs and isinstance(o, TensorProxy) and \
                        dtypes.is_float_dtype(_dtype(o)) and _dtype(o).bytes > narrow.bytes:
                    return True
                done.add(variableify(o))
                todo.append(variableify(o))
    return start in outputs


def _eliminate_redundant_work(bsyms: Sequence[BoundSymbol], outputs: Sequence[Proxy] = ()
                              ) -> tuple[list[BoundSymbol], dict[Variable, Proxy]]:
    """The prims with repeats removed, and each removed result -> the proxy standing for it.

    Repeats are common subexpressions, and float casts back to the dtype a value had before a
    float cast: to an exactly wider dtype (bf16 -> f32 -> bf16 is the bf16 value, bit for bit),
    or through a narrower one (f32 -> bf16 -> f32) where the rounding cannot be seen.

    That rounding is part of what the user's program computes, and it can be seen (issue 41).
    The same value is often computed twice, by different regions: the forward keeps the bf16
    tensor for the backward (a region output, rounded when written), and the backward
    recomputes from it, with the rounding. A forward that dropped the rounding before a
    comparison computed something else: Thunder's amax backward finds the maximum by
    ``eq(x, saved_max)``, matched nothing, and divided 0 by 0 (every gradient of
    ``logsumexp(log_softmax(a) + b)`` in bf16 was NaN). So a narrowing round trip is kept where
    a value computed from it is compared, or leaves the region wider than the rounding
    (``_rounding_matters``); elsewhere it is dropped, as Thunder's nvFuser pass drops it: a
    decomposed bf16 GELU otherwise rounds ten times per element, and keeping every rounding put
    a Llama-2 block's bf16 norm-weight gradient 3.5 times as far from the fp32 step as torch's
    (H200, tests/thunder/test_whole_models.py)."""
    consumers: dict[Variable, list[BoundSymbol]] = {}
    for bsym in bsyms:
        for a in bsym.flat_proxy_args:
            consumers.setdefault(variableify(a), []).append(bsym)
    out_vars = {variableify(o) for o in outputs if isinstance(o, Proxy)}
    redundant: dict[Variable, Proxy] = {}
    seen: dict = {}
    producer: dict[Variable, BoundSymbol] = {}
    kept: list[BoundSymbol] = []
    for bsym in bsyms:
        original = variableify(bsym.output) if isinstance(bsym.output, Proxy) else None
        bsym = cse_single_bsym(redundant, seen, bsym)
        if bsym is None:
            continue
        if _is_float_cast(bsym):
            before = producer.get(variableify(bsym.args[0]))
            if (before is not None and _is_float_cast(before)
                    and _dtype(before.args[0]) == _dtype(bsym.output)
                    and (_is_exact_round_trip(_dtype(bsym.output), _dtype(before.output))
                         or not _rounding_matters(original, consumers, out_vars,
                                                  _dtype(before.output)))):
                redundant[variableify(bsym.output)] = before.args[0]
                seen.pop(bsym.rhs, None)  # a later repeat must not name the dropped result
                continue
        for o in bsym.flat_outs:
            if isinstance(o, Proxy):
                producer[variableify(o)] = bsym
        kept.append(bsym)
    return list(replace_redundant_inputs(redundant, kept)), redundant


@dataclass
class RegionSplit:
    """A region as a kernel plus the view prims torch runs after it."""

    kernel: list[BoundSymbol]  # what fusecut computes; empty when the region dissolves
    kernel_inputs: list[Proxy]
    kernel_outputs: list[TensorProxy]
    after: list[BoundSymbol]  # torch's views (and aliases) that make the region's outputs
    cleaned: bool = False  # repeats or exact cast round trips were dropped from the prims
    before: list[BoundSymbol] = field(default_factory=list)  # torch's reshapes of inputs

    @property
    def changed(self) -> bool:
        return bool(self.after) or bool(self.before) or not self.kernel or self.cleaned


def split_region(bsyms: Sequence[BoundSymbol], inputs: Sequence[Proxy],
                 outputs: Sequence[Proxy]) -> RegionSplit:
    """Split a region's prims into a kernel and the views that complete its outputs."""
    bsyms, redundant = _eliminate_redundant_work(bsyms, outputs)
    layouts: dict[Variable, _Layout] = {
        variableify(p): _Layout(p, (), _contiguous_meta(p))
        for p in inputs if isinstance(p, TensorProxy)}

    def passes_layout_through(bsym: BoundSymbol) -> TensorProxy | None:
        """The tensor a cast to its own dtype repeats (exact cast round trips are gone already)."""
        return bsym.args[0] if _is_same_dtype_cast(bsym) else None

    position: dict[int, int] = {}  # id(bsym) -> its place in program order
    for index, bsym in enumerate(bsyms):
        position[id(bsym)] = index
        out = bsym.output
        if not isinstance(out, TensorProxy):
            for o in bsym.flat_outs:
                if isinstance(o, TensorProxy):
                    layouts[variableify(o)] = _Layout(o, (), _contiguous_meta(o))
            continue
        same = passes_layout_through(bsym)
        if same is not None and variableify(same) in layouts:
            # Later views name ``out``, so torch must define it: as another name for ``same``.
            alias = prims.shallow_copy.bind(same, output=out)
            position[id(alias)] = index
            base = layouts[variableify(same)]
            layouts[variableify(out)] = _Layout(base.root, base.chain + (alias,), base.meta)
            continue
        src = bsym.args[0] if bsym.args else None
        if is_view_prim(bsym) and isinstance(src, TensorProxy) and variableify(src) in layouts:
            base = layouts[variableify(src)]
            meta = _replay(bsym, base.meta)
            if meta is not None:
                layouts[variableify(out)] = _Layout(base.root, base.chain + (bsym,), meta)
                continue
        layouts[variableify(out)] = _Layout(out, (), _contiguous_meta(out))

    input_names = {variableify(p) for p in inputs}
    kernel_outputs: list[TensorProxy] = []
    after: list[BoundSymbol] = []
    renames: list[BoundSymbol] = []  # outputs that repeat another value (CSE)
    for o in outputs:
        resolved = redundant.get(variableify(o), o)
        layout = layouts.get(variableify(resolved))
        if layout is None:  # not a tensor computed here: nothing to split
            continue
        root = layout.root
        if variableify(root) not in input_names and all(root is not k for k in kernel_outputs):
            kernel_outputs.append(root)
        for b in layout.chain:
            if all(b is not a for a in after):
                after.append(b)
        if layout.value.name != o.name:  # a repeat (CSE): the output is another name for it
            renames.append(prims.shallow_copy.bind(layout.value, output=o))

    kernel = _needed(bsyms, kernel_outputs)
    if is_layout_only(kernel):
        # Nothing to compute, or only a copy torch makes as well: no kernel; torch runs those
        # prims and the views (the round trip bf16 -> f32 -> bf16 runs as no cast at all).
        prims_and_views = sorted(kernel + after, key=lambda b: position[id(b)])
        return RegionSplit([], [], [], prims_and_views + renames)
    after.sort(key=lambda b: position[id(b)])
    before = _input_reshapes(kernel, inputs)
    kernel = [b for b in kernel if all(b is not h for h in before)]
    used = {variableify(a) for b in kernel for a in b.flat_proxy_args}
    kernel_inputs = [p for p in inputs if variableify(p) in used]
    kernel_inputs += [b.output for b in before if variableify(b.output) in used]
    return RegionSplit(kernel, kernel_inputs, kernel_outputs, after + renames,
                       cleaned=bool(redundant), before=before)


def _input_reshapes(kernel: Sequence[BoundSymbol], inputs: Sequence[Proxy]) -> list[BoundSymbol]:
    """The kernel's reshapes of region inputs that torch takes as views of a contiguous input
    (a merge or split of axes: ``logits.view(-1, vocab)``): torch runs them before the kernel,
    which then reads the input in the shape it uses it in. A reduction can iterate a merged
    axis, but not one made of an input's separate axes; the planner then copied the input
    into the reshaped layout first (a whole extra pass over the logits of a loss)."""
    metas = {variableify(p): _contiguous_meta(p) for p in inputs if isinstance(p, TensorProxy)}
    hoisted = []
    for b in kernel:  # in program order: a reshape of a hoisted reshape goes too
        if b.sym.id != prims.reshape.id or not isinstance(b.args[0], TensorProxy):
            continue
        source = metas.get(variableify(b.args[0]))
        view = _replay(b, source) if source is not None else None
        if view is not None:
            hoisted.append(b)
            metas[variableify(b.output)] = view
    return hoisted


def _needed(bsyms: Sequence[BoundSymbol], outputs: Sequence[Proxy]) -> list[BoundSymbol]:
    """The prims ``outputs`` need, in program order (the same objects: positions stay valid)."""
    wanted = {variableify(o) for o in outputs}
    kept: list[BoundSymbol] = []
    for bsym in reversed(bsyms):
        if any(variableify(o) in wanted for o in bsym.flat_outs if isinstance(o, Proxy)):
            kept.append(bsym)
            wanted.update(variableify(a) for a in bsym.flat_proxy_args)
    return kept[::-1]
