"""``fusecut.FusionDefinition``: nvFuser's frontend API, backed by fusecut.

An existing ``def nvfuser_fusion_idN(fd: FusionDefinition)`` runs unchanged with
``from fusecut import FusionDefinition, DataType``; ``fd.execute(inputs)`` runs the fusion.
Programs written against nvFuser's Python frontend (legacy ``nvfuser`` and ``nvfuser_direct``)
find the same API: ``from_pytorch``, ``FusionCache``/``LRUCache`` (``fusecut.fusion_cache``),
``execute``'s keyword options (``fusecut.execute_options``), ``validate``, ``clone``, the printed
definition (which runs again, as nvFuser's does), and class-style definitions (a subclass with
``definition()``). Manual scheduling is refused: fusecut schedules automatically.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from fusecut.engine import FusionHandle
from fusecut.execute_options import ExecuteOptions, parse_execute_options
from fusecut.fusion_cache import CacheEntry, CompiledFusion, FusionCache
from fusecut.optimizer.errors import DefinitionError, ManualSchedulingError
from fusecut.optimizer.ir.builder import FusionBuilder, ScalarHandle, TensorHandle, VectorHandle
from fusecut.optimizer.ir.dtypes import NVFUSER_DTYPES
from fusecut.optimizer.ir.fusion import Fusion
from fusecut.optimizer.ir.opspec import all_specs, unknown_op_message
from fusecut.optimizer.ir.printer import print_definition, print_math
from fusecut.plan import PlanView


class _DataTypeMeta(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):  # copy, pickle and inspect probe for dunders
            raise AttributeError(name)
        members = [k for k, v in vars(cls).items() if not k.startswith("_")]
        same = [k for k in members if k.lower() == name.lower()]
        close = same or difflib.get_close_matches(name, members, n=1, cutoff=0.8)
        hint = f"; did you mean DataType.{close[0]}?" if close else ""
        raise AttributeError(f"DataType has no member {name!r}{hint} (nvFuser's DataType "
                             f"has: {', '.join(members)})")

    def __iter__(cls):
        return iter(v for k, v in vars(cls).items() if not k.startswith("_") and v is not None)


DataType = _DataTypeMeta("DataType", (), {
    "__doc__": "nvFuser's DataType names (all of them: complex, Float8, Float4, UInt64 ...), "
               "mapped to fusecut's dtypes (``Null`` is None).",
    **NVFUSER_DTYPES})


class ParallelType:
    stream = "stream"


class _Ops:
    def __init__(self, fd: FusionDefinition):
        self._fd = fd

    def shape(self, tensor: TensorHandle) -> VectorHandle:
        """``fd.ops.shape(t)``: the vector of ``t``'s extents (host scalars)."""
        self._fd._live()
        return VectorHandle(tensor.shape())

    def at(self, vector: list[Any], index: int) -> ScalarHandle:
        """``fd.ops.at(vector, i)``: entry ``i`` of a shape vector."""
        self._fd._live()
        if isinstance(index, bool) or not isinstance(index, int):
            raise DefinitionError(f"at(): the index must be an integer, got {index!r}")
        if not -len(vector) <= index < len(vector):
            raise DefinitionError(f"Tried to access out of boundary index {index}. total index: "
                                  f"{len(vector)}")
        return vector[index]

    def size(self, tensor: TensorHandle, dim: int) -> ScalarHandle:
        return self._fd._live().size(tensor, dim)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in all_specs():
            raise AttributeError(unknown_op_message(name, "fusecut has no op"))

        def call(*args: Any, **kwargs: Any):
            outs = self._fd._live().op(name, list(args), kwargs)
            return outs[0] if len(outs) == 1 else tuple(outs)

        call.__name__ = name
        return call


class _Sched:
    """``fd.sched``: only the stream-parallel mark means something to fusecut; every other
    scheduling call is refused (fusecut schedules automatically)."""

    def __init__(self, fd: FusionDefinition):
        self._fd = fd

    def parallelize(self, tensor: TensorHandle, axis: int, parallel_type: str) -> None:
        if parallel_type != ParallelType.stream:
            raise ManualSchedulingError(f"fd.sched.parallelize(..., {parallel_type}) is a "
                                        f"manual schedule; fusecut schedules automatically "
                                        f"(only ParallelType.stream is taken, as a hint to "
                                        f"lower the axis to a host loop)")
        self._fd._builder.parallelize(tensor, axis, parallel_type)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def refuse(*args: Any, **kwargs: Any):
            raise ManualSchedulingError(f"fd.sched.{name}() is a manual schedule; fusecut "
                                        f"schedules automatically and takes no manual "
                                        f"scheduling (drop the schedule() method to run the "
                                        f"fusion)")

        return refuse


@dataclass(frozen=True)
class KernelProfile:
    """One segment's run, as ``fd.profile().kernel_profiles`` lists them."""

    name: str
    scheduler: str  # the segment's kind (pointwise, reduction, ..., library, fallback)
    time_ms: float
    bytes: int
    backend: str  # "cuda" (generated kernel) or "reference" (torch)

    @property
    def effective_bandwidth_gbs(self) -> float:
        return self.bytes / (self.time_ms * 1e6) if self.time_ms > 0 else 0.0


@dataclass(frozen=True)
class FusionProfile:
    """``fd.profile()`` after ``fd.execute(inputs, profile=True)``: measured per segment."""

    fusion_id: int
    segments: int
    kernel_profiles: list[KernelProfile] = field(default_factory=list)

    @property
    def kernel_time_ms(self) -> float:
        return sum(k.time_ms for k in self.kernel_profiles)


class FusionDefinition:
    """Build a fusion with nvFuser's API inside ``with FusionDefinition() as fd:``, or subclass
    it with a ``definition(self)`` method that ``execute`` calls."""

    def __init__(self, id: int | None = None, max_length: int = 100_000,
                 use_multidevice_executor: bool = False, backend_type: Any = None):
        if use_multidevice_executor:
            raise DefinitionError("use_multidevice_executor=True: fusecut runs a fusion on one "
                                  "GPU; it has no multi-device executor")
        self._builder = FusionBuilder(max_length)
        self._finished = False
        self._fusion = self._builder.fusion  # nvfuser_direct code deletes it after cache_compile
        self._entry: CacheEntry | None = None
        if id is not None:  # nvFuser's FusionDefinition(id): the cached definition of that id
            entry = FusionCache.get().entry(id)
            if entry is None:
                raise DefinitionError(f"FusionDefinition({id}): the FusionCache holds no "
                                      f"definition with id {id}")
            self._builder.fusion = self._fusion = entry.fusion
            self._builder.completed = True
            self._finished = True
            self._entry = entry
        self.ops = _Ops(self)
        self.sched = _Sched(self)
        self.fec: CompiledFusion | None = None
        self.profiled = False
        self._profile: FusionProfile | None = None
        self._debug_output: str | None = None
        self.fake_inputs: list[Any] | None = None

    # ---- definition -------------------------------------------------------------------------

    def __enter__(self) -> FusionDefinition:
        if self._finished:
            raise DefinitionError("this FusionDefinition is already defined; make a new one")
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self._finish()

    def _finish(self) -> None:
        self._finished = True
        self._builder.completed = True
        self._entry = FusionCache.get().register(self._builder.fusion)

    def _live(self) -> FusionBuilder:
        if self._finished:
            raise DefinitionError("Attempting to add to a completed definition! (define ops "
                                  "inside the FusionDefinition's with block)")
        return self._builder

    def id(self) -> int | None:
        """The definition's id in the FusionCache (None until it is complete)."""
        return self._entry.id if self._entry is not None else None

    def define_tensor(self, *args: Any, **kwargs: Any) -> TensorHandle:
        if len(args) >= 2 and _is_strides(args[1]):  # nvFuser's define_tensor(sizes, strides)
            names = ("sizes", "strides", "dtype", "static_sizes", "is_cpu")
            kwargs.update(zip(names, args))
            args = ()
        return self._live().define_tensor(*args, **kwargs)

    def from_pytorch(self, tensor: Any, static_sizes: bool = False) -> TensorHandle:
        """An input tensor like ``tensor``: its dtype, its layout (contiguity and stride order
        from its strides), symbolic extents (size-1 axes broadcast) unless ``static_sizes``."""
        import torch

        from fusecut.runtime.tensors import from_torch_dtype

        if not isinstance(tensor, torch.Tensor):
            raise DefinitionError(f"from_pytorch expects a torch.Tensor, got "
                                  f"{type(tensor).__name__}")
        return self.define_tensor(sizes=list(tensor.size()), strides=list(tensor.stride()),
                                  dtype=from_torch_dtype(tensor.dtype), static_sizes=static_sizes,
                                  is_cpu=tensor.device.type == "cpu" and tensor.dim() == 0)

    def define_scalar(self, *args: Any, **kwargs: Any) -> ScalarHandle:
        return self._live().define_scalar(*args, **kwargs)

    def define_constant(self, *args: Any, **kwargs: Any) -> ScalarHandle:
        return self._live().define_scalar(*args, **kwargs)

    def define_vector(self, *args: Any, **kwargs: Any) -> VectorHandle:
        return self._live().define_vector(*args, **kwargs)

    def add_output(self, tensor: TensorHandle, alias_input: TensorHandle | None = None,
                   stride_order: list[int] | None = None) -> None:
        """A fusion output; ``alias_input`` updates that input in place; ``stride_order`` asks
        for the output's memory layout (as ``ops.stride_order`` does)."""
        builder = self._live()
        if isinstance(alias_input, (list, tuple)):  # nvFuser's add_output(tensor, stride_order)
            alias_input, stride_order = None, alias_input
        if stride_order is not None:
            if alias_input is not None:
                raise DefinitionError("add_output: alias_input and stride_order cannot be "
                                      "combined")
            (tensor,) = builder.op("stride_order", [tensor, list(stride_order)], {})
        builder.add_output(tensor, alias_input)

    def definition(self) -> None:
        raise NotImplementedError("definition() should be implemented by child class!")

    @property
    def fusion(self) -> Fusion:
        if self.fec is not None:
            return self.fec.fusion()
        return self._builder.fusion

    def inputs(self) -> list[int]:
        """The inputs' indices among the definition's values (nvFuser's state indices: every
        tensor and scalar is numbered in the order it was defined)."""
        return [_state_index(n) for n in self.fusion.inputs]

    def outputs(self) -> list[int]:
        return [_state_index(n) for n in self.fusion.outputs]

    def __repr__(self) -> str:
        """The definition as nvFuser prints it: a function that defines it again (exec it and
        call it with a new FusionDefinition), named after its FusionCache id; the trailing alias
        is nvfuser_direct's name for the same function."""
        name = f"nvfuser_fusion_id{self.id()}" if self.id() is not None else \
            "nvfuser_incomplete_fusion"
        return (f"\n{print_definition(self.fusion, name)}\n"
                f"nvfuser_fusion = {name}\n")

    def print_math(self) -> str:
        """The fusion as math, one line per op (nvFuser's ``print_math``)."""
        return print_math(self.fusion)

    def fusion_ir(self) -> str:
        return print_math(self.fusion)

    # ---- running ----------------------------------------------------------------------------

    @classmethod
    def from_fusion(cls, fusion: Fusion) -> FusionDefinition:
        """A completed definition holding an existing fusion (e.g. one segment of a plan)."""
        fd = cls()
        fd._builder.fusion = fusion
        fd._fusion = fusion
        fd._finish()
        return fd

    def _ensure_defined(self) -> None:
        """A subclass's ``definition()`` (and ``schedule()``) run on first use, as nvFuser's."""
        if self._finished:
            return
        if type(self).definition is FusionDefinition.definition:
            raise NotImplementedError("Fusion does not exist! Use `with FusionDefinition() as "
                                      "fd: ...` to define a fusion. (Or subclass "
                                      "FusionDefinition with a definition() method.)")
        self.definition()
        self._finish()
        schedule = getattr(self, "schedule", None)
        if callable(schedule):
            schedule()  # ops here raise "Attempting to add to a completed definition"

    def plan(self, inputs: list[Any], **options: Any) -> PlanView:
        """Plan the fusion for these inputs (tensors, numbers or metadata); no tensors needed.

        Options are the plan options, each declared with its default and range in
        ``fusecut.optimizer.options`` (segmenter, time_limit_s, device, ...); a bad one is
        refused, named. ``remote=URL`` plans with a fusecut service instead.
        """
        self._ensure_defined()
        inputs = _flat_arguments(inputs)  # a define_vector(n)'s value comes as one list
        remote = options.pop("remote", None)
        _check_plan_options("plan", options)
        if remote is not None:
            from fusecut.client import Client

            with Client(remote) as client:
                return client.plan(self.fusion, inputs, **options)
        return PlanView(plan=self.handle.plan(inputs, **options))

    def segment(self, inputs: list[Any], **options: Any) -> list[SegmentDefinition]:
        """The plan's segments as standalone definitions with maps to this one."""
        planned = self.plan(inputs, **options)
        internal = planned.plan
        if internal is None:  # planned by a service: rebuild it here from its JSON
            from fusecut.engine import as_metadata
            from fusecut.optimizer.plan.restore import restore_plan

            internal = restore_plan(self.fusion, as_metadata(_flat_arguments(inputs)),
                                    planned.json)
        out = []
        for seg in internal.segments:
            out.append(SegmentDefinition(seg.index, seg.kind.value,
                                         FusionDefinition.from_fusion(seg.sub.fusion),
                                         dict(seg.sub.input_map), dict(seg.sub.output_map)))
        return out

    def execute(self, inputs: list[Any], **options: Any) -> list[Any]:
        """Plan (cached per input metadata), compile (cached) and run; return the outputs.

        nvFuser's keywords are taken as ``fusecut.execute_options`` describes (``device``,
        ``profile``, ``print_repro``, ``capture_debug_output``, ``save_repro_inputs``,
        ``_enable_options``/``_disable_options``, ``override_user_schedule``); the rest are
        fusecut's plan options. A repeated call with arguments like the last one's goes straight
        to the compiled kernels. ``return_execution=True`` returns the outputs with per-segment
        timings; ``remote=URL`` runs on a fusecut service instead.
        """
        from fusecut.runtime.tensors import with_cpu_scalars_on_device  # torch, imported late

        warm = self._entry.handle.warm if self._entry is not None else None
        inputs = with_cpu_scalars_on_device(_flat_arguments(inputs))
        if warm is not None and (not options or _only_defaults(options)):
            outputs = warm(inputs)
            if outputs is not None:
                return self._returned(outputs)
        self._ensure_defined()
        if not self.fusion.outputs:
            raise NotImplementedError("Fusion is empty! The definition adds no output "
                                      "(fd.add_output) to compute.")
        remote = options.pop("remote", None)
        return_execution = options.pop("return_execution", False)
        opts = parse_execute_options(options)
        _check_plan_options("execute", opts.planning)
        opts.check_fusion(self.fusion)
        if remote is not None:
            from fusecut.client import Client

            with Client(remote) as client:
                return client.execute(self.fusion, inputs, **opts.planning).outputs
        return self._run(inputs, opts, return_execution)

    def _run(self, inputs: list[Any], opts: ExecuteOptions, return_execution: bool) -> Any:
        import torch

        device = opts.device
        tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
        if device is None and not tensors and torch.cuda.is_available():
            # nvFuser runs a fusion without tensor inputs (a random or iota one) on the current
            # GPU: its kernels and its CUDA generator, its outputs there beside the tensors the
            # caller compares them with (computed on the CPU and moved, 2**29 uniform values
            # took minutes: test_uniform_range)
            device = torch.device("cuda", torch.cuda.current_device())
        if device is not None and any(t.device.type == "cuda" and t.device != device
                                      and device.index is not None for t in tensors):
            raise DefinitionError(f"device={device} was given, but input tensors are on "
                                  f"{sorted({str(t.device) for t in tensors})}")
        if opts.save_repro_inputs:
            from torch._subclasses.fake_tensor import FakeTensorMode

            fake_mode = FakeTensorMode()
            self.fake_inputs = [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                                for a in inputs]
        if opts.print_repro:
            print(self.repro_script_for(inputs))
        self.profiled = opts.profile
        timed = opts.profile or return_execution
        if self.fec is not None and not timed and not opts.planning:
            outputs = self.fec.execute(inputs, device=device if not tensors else None)
            return self._returned(_placed(outputs, device, tensors))
        result = self.handle.execute(inputs, return_execution=timed,
                                     device=device if not tensors else None,
                                     keep_warm=opts.plain, **opts.planning)
        if opts.capture_debug_output:
            self._debug_output = self._debug_text(inputs, opts.planning)
        if timed:
            self._profile = FusionProfile(
                self.id() if self.id() is not None else -1, len(result.timings),
                [KernelProfile(f"segment_{t.index}_{t.kind}", t.kind, t.seconds * 1e3, t.bytes,
                               t.backend) for t in result.timings])
            if return_execution:
                return result
            return self._returned(_placed(result.outputs, device, tensors))
        return self._returned(_placed(result, device, tensors))

    def _returned(self, outputs: list[Any]) -> list[Any]:
        """What nvFuser returns: every output except in-place updates (``add_output(t,
        alias_input=x)`` writes ``x`` and is not returned, unless ``t`` is also added as a plain
        output)."""
        ordered = self._ordered_outputs()
        if ordered:
            outputs = [_unit_strides(o, ordered[k]) if k in ordered else o
                       for k, o in enumerate(outputs)]
        aliases = self.fusion.aliases
        if not aliases:
            return outputs
        hidden = {self.fusion.outputs.index(name) for name in aliases}
        return [o for k, o in enumerate(outputs) if k not in hidden]

    def _ordered_outputs(self) -> dict[int, list[int]]:
        """Output position -> the stride order a ``stride_order`` op gave it."""
        fusion = self.fusion
        key = (id(fusion), len(fusion.ops), len(fusion.outputs))
        cached = getattr(self, "_ordered_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        producer = {o: op for op in fusion.ops for o in op.outputs}
        ordered = {k: list(producer[name].attrs["stride_order"])
                   for k, name in enumerate(fusion.outputs)
                   if name in producer and producer[name].name == "stride_order"}
        self._ordered_cache = (key, ordered)
        return ordered

    def _debug_text(self, inputs: list[Any], planning: dict[str, Any]) -> str:
        """What fusecut tells about a run: the plan's segments and bytes."""
        return str(PlanView(plan=self.handle.plan(inputs, **planning)).totals)

    def debug_output(self) -> str | None:
        """The plan summary of the last ``execute(..., capture_debug_output=True)``."""
        return self._debug_output

    def profile(self) -> FusionProfile:
        if not self.profiled or self._profile is None:
            raise ValueError("The execute() method was not previously called with profiling "
                             "enabled!")
        return self._profile

    def validate(self, inputs: list[Any], reference_outputs: list[Any] | None = None,
                 device: Any = None, **kwargs: Any) -> list[Any]:
        """Run the fusion and check its outputs against ``reference_outputs`` (fusecut's torch
        reference of the definition when not given) with nvFuser's tolerances
        (``fusecut.validation``); return the outputs."""
        from fusecut.validation import validate_outputs

        inputs = list(inputs)
        if device is not None:
            kwargs["device"] = device
        outputs = self.execute(inputs, return_execution=True, **kwargs).outputs
        validate_outputs(self.fusion, outputs, _flat_arguments(inputs), reference_outputs)
        return self._returned(outputs)

    def validate_with_auto_inferred_outputs(self, fusion_outputs: list[Any],
                                            inputs: list[Any]) -> None:
        """Check ``fusion_outputs`` against fusecut's torch reference run on ``inputs``."""
        from fusecut.validation import validate_outputs

        validate_outputs(self.fusion, list(fusion_outputs), list(inputs))

    def _repro_error_str(self, section: str, inputs: list[Any] | None = None) -> str:
        """What nvFuser's test helpers print when a step fails: the step and a script that
        defines and runs the fusion on inputs like these."""
        return (f"Error while {section} the fusion. A script that reproduces it:\n"
                + self.repro_script_for(inputs))

    def last_repro_script(self) -> str:
        assert self.fake_inputs is not None, (
            "fd.last_repro_script() cannot provide a repro because fd.execute(inputs, "
            "save_repro_inputs=True) was not executed!")
        return self.repro_script_for(self.fake_inputs)

    def repro_script_for(self, inputs: list[Any] | None = None) -> str:
        """A script that defines and runs this fusion (with ``inputs`` made like these)."""
        import torch

        from fusecut.version import __version__

        name = f"nvfuser_fusion_id{self.id()}" if self.id() is not None else \
            "nvfuser_incomplete_fusion"
        lines = [f"# fusecut version: {__version__}",
                 f"# torch version: {torch.__version__}",
                 "# nvFuser runs this file as it is; fusecut runs it with `fusecut execute FILE`",
                 "# (or under python with `from fusecut import` in place of `from nvfuser import`)",
                 "import torch",
                 "from nvfuser import FusionDefinition, DataType",
                 print_definition(self.fusion, name), "with FusionDefinition() as fd:",
                 f"    {name}(fd)"]
        if inputs is not None:
            lines += ["", "inputs = ["]
            lines += [f"    {_input_text(a)}," for a in inputs]
            lines += ["]", "fd.execute(inputs)"]
        return "\n".join(lines) + "\n"

    @property
    def handle(self) -> FusionHandle:
        """This definition's way into the process's engine (``fusecut.engine``): its plans and
        compiled programs, shared with every definition of the same structure, and the warm call
        of its last program. What a front that builds definitions (Thunder's regions) uses to
        plan, compile and launch a stage at a time."""
        self._ensure_defined()
        if self._entry is None:
            self._entry = FusionCache.get().register(self.fusion)
        return self._entry.handle

    # ---- nvFuser's scheduling and introspection API, which fusecut does not have -------------

    def __getattr__(self, name: str):
        if name in _SCHEDULING_METHODS:
            # the CUDA fusecut generates is there to read, from its CLI (issue 45, item 8)
            where = (" (the CUDA it generates for each segment of a plan: `fusecut codegen "
                     "FILE --out DIR`, FILE a repro such as fd.repro_script_for(inputs) "
                     "writes)") if "cuda" in name or "ir" in name else ""
            raise ManualSchedulingError(f"fd.{name}() belongs to nvFuser's manual scheduling "
                                        f"and kernel introspection; fusecut schedules "
                                        f"automatically and has no {name}{where}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_SCHEDULING_METHODS = frozenset({
    "manual_execute", "manual_validate", "cuda_code_for", "last_cuda_code",
    "scheduled_fusion_ir_for", "last_scheduled_fusion_ir", "_setup_schedule",
    "_finalize_schedule", "_exist_schedule", "schedule_pointwise", "user_schedule_ir",
    "sched_ir", "compile", "heuristic_params",
})


def _state_index(name: str) -> int | str:
    """``T5`` -> 5: the builder numbers every value it makes (tensors and scalars) from one
    counter, as nvFuser numbers its states; a name the text chose itself stays a name."""
    digits = name[1:]
    return int(digits) if name[:1] in "TSV" and digits.isdigit() else name


def _unit_strides(tensor: Any, order: list[int]) -> Any:
    """``tensor`` with each extent-1 axis given the stride it has in the allocation ``order``
    asks for (the product of the extents stored inside it), as nvFuser allocates it. Extent-1
    axes address no memory, so this is the same view of the same storage; fusecut drops them
    while computing and puts them back where torch would."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.dim() != len(order) or \
            1 not in tensor.shape or tensor.numel() == 0:
        return tensor
    axes = sorted(range(tensor.dim()), key=lambda i: order[i])  # innermost first
    strides = list(tensor.stride())
    inner = 1
    for i in axes:
        if tensor.shape[i] == 1:
            strides[i] = inner
        else:
            inner = strides[i] * tensor.shape[i]
    if strides == list(tensor.stride()):
        return tensor
    return tensor.as_strided(tensor.shape, strides)


def _check_plan_options(method: str, options: dict[str, Any]) -> None:
    """An unknown option is a TypeError naming it, and the option meant if one is close
    (``time_limit=3`` was PlanOptions.__init__'s "unexpected keyword argument")."""
    from fusecut.optimizer.options import BY_NAME

    for key in options:
        if key not in BY_NAME:
            close = difflib.get_close_matches(key, list(BY_NAME), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"fd.{method}() got an unknown option {key!r}{hint} (plan "
                            f"options: {', '.join(BY_NAME)})")


def _flat_arguments(inputs: Any) -> list[Any]:
    """Arguments in definition order: a list or tuple (the value of a ``define_vector(n)``)
    gives its entries, one scalar input each. A tensor (or another non-list) is refused, named:
    iterated, a tensor's rows were taken as the inputs ("1 input but 4 were given")."""
    if not isinstance(inputs, (list, tuple)):
        what = f"a tensor of shape {list(inputs.shape)}" if hasattr(inputs, "shape") and \
            hasattr(inputs, "dtype") else f"a {type(inputs).__name__}"
        raise TypeError(f"the inputs must be a list, one entry per input of the definition "
                        f"(like fd.execute([x])); got {what}")
    out: list[Any] = []
    for a in inputs:
        if isinstance(a, (list, tuple)):
            out.extend(a)
        else:
            out.append(a)
    return out


def _is_strides(value: Any) -> bool:
    """A positional second argument of define_tensor that holds strides (ints), not contiguity
    flags (bools and Nones)."""
    return isinstance(value, (list, tuple)) and any(
        isinstance(v, int) and not isinstance(v, bool) for v in value)


def _only_defaults(options: dict[str, Any]) -> bool:
    """nvFuser's helpers pass every keyword at its default: that is a plain call."""
    defaults = {"device": None, "_enable_options": (), "_disable_options": (), "profile": False,
                "override_user_schedule": False, "capture_debug_output": False,
                "print_repro": False, "save_repro_inputs": False}
    for key, value in options.items():
        if key not in defaults:
            return False
        default = defaults[key]
        if isinstance(default, tuple):
            if value not in (None, [], ()):
                return False
        elif value is not default and value != default:
            return False
    return True


def _placed(outputs: list[Any], device: Any, tensors: list[Any]) -> list[Any]:
    """Outputs of a fusion without tensor inputs go to ``device`` (nvFuser's hint for exactly
    that case); with tensor inputs they are where the inputs are already."""
    if device is None or tensors:
        return outputs
    return [o.to(device) if hasattr(o, "to") else o for o in outputs]


def _input_text(a: Any) -> str:
    import torch

    if isinstance(a, torch.Tensor):
        if a.is_contiguous():
            return (f"torch.testing.make_tensor({tuple(a.size())}, dtype={a.dtype}, "
                    f"device='{a.device}')")
        extent = 0 if 0 in a.size() else 1 + sum((e - 1) * s for e, s in zip(a.size(),
                                                                              a.stride()))
        return (f"torch.testing.make_tensor(({extent},), dtype={a.dtype}, device='{a.device}')"
                f".as_strided({tuple(a.size())}, {tuple(a.stride())})")
    from fusecut.optimizer.ir.printer import format_number

    return format_number(a)


def clone(source: FusionDefinition, target: FusionDefinition) -> None:
    """nvFuser's ``clone(from, to)``: ``target`` (not yet defined) becomes a definition of the
    same fusion, built again op by op from its wire form."""
    from fusecut.optimizer.ir.wire import fusion_from_json, fusion_to_json

    source._ensure_defined()
    if target._finished or target._builder.fusion.ops or target._builder.fusion.inputs:
        raise DefinitionError("Expected an incomplete definition before translation.")
    fusion = fusion_from_json(fusion_to_json(source.fusion))
    target._builder.fusion = fusion
    target._fusion = fusion
    target._finish()


@dataclass(frozen=True)
class SegmentDefinition:
    """One segment of a plan: its kind, its definition, and the maps from its inputs and
    outputs to the original definition's tensors."""

    index: int
    kind: str
    definition: FusionDefinition
    input_map: dict[str, str]
    output_map: dict[str, str]


# nvFuser's helpers import these from the frontend module itself
__all__ = ["DataType", "FusionDefinition", "ParallelType", "clone"]
