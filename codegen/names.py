"""What generated code calls things: a tensor's value by its IR name, declared names unique per
kernel source, the scalars a kernel takes by name as parameters (the others are literals), and
ops as the comments beside their statements describe them."""

from __future__ import annotations

from fusecut.codegen.memo import last_call
from fusecut.optimizer.analysis.shapes import Bound
from fusecut.optimizer.ir.fusion import Op


@last_call  # asked again by every region of a kernel
def dynamic_scalars(bound: Bound) -> frozenset[str]:
    """Scalars whose value comes from a scalar input at run time (kernel parameters); the
    others (constants, sizes, and arithmetic on them) are compiled in as literals."""
    fusion = bound.fusion
    dyn = set(fusion.scalar_inputs())
    for op in fusion.ops:
        if any(o in fusion.scalars for o in op.outputs) and any(n in dyn for n in op.refs()):
            dyn.update(o for o in op.outputs if o in fusion.scalars)
    return frozenset(dyn)


def value_name(tensor: str) -> str:
    """The C name of a tensor's value: the IR name where it cannot clash with a C or kernel
    name (nvFuser's T7, S3), else prefixed."""
    nvfuser_style = len(tensor) > 1 and tensor[0] in _CAPITALS and tensor[1:].isdecimal()
    return tensor if nvfuser_style else f"t_{tensor}"


_CAPITALS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


class Names:
    """The declared names of one kernel source, each unique (a value evaluated again gets
    ``T7_1``, ``T7_2``...), and the ops the segment recomputes (their values are marked)."""

    def __init__(self, recomputed: frozenset[int] | tuple[int, ...] = frozenset()):
        self.used: set[str] = set()
        self.recomputed = frozenset(recomputed)

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name


def describe_op(op: Op) -> str:
    """An op over IR names, as in the comments of generated code: ``sub(T3, T6)``,
    ``cast(T18, bfloat16)``, ``sum(T4, dims=[1])``."""
    args = list(op.inputs)
    if op.name == "cast":
        args.append(op.attrs["dtype"].value)
    dims = op.attrs.get("dims")
    if dims is not None and op.name in ("sum", "max", "min", "prod", "var", "var_mean"):
        args.append(f"dims={list(dims)}")
    return f"{op.name}({', '.join(args)})"
