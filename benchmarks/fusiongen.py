"""Synthetic fusions for planner scale tests, in nvFuser's repro format.

``generate(n_ops, seed)`` writes a definition over two [rows, cols] bf16 inputs and a [cols]
float input: random elementwise ops over recent values, and every ``reduce_every`` ops a reduction
broadcast back (mostly over rows, sometimes over columns, so that the fusion cannot be one kernel),
like the corpus's generated stress cases. Deterministic for a seed. ``scale_case()`` is the
planner-scale case the planner's limits are measured on.
"""

from __future__ import annotations

import random

_BF16_2D = ("fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, "
            "is_cpu=False)")
HEADER = f"""import torch
from nvfuser import FusionDefinition, DataType

def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = {_BF16_2D}
    T1 = {_BF16_2D}
    T2 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float, is_cpu=False)
    T3 = fd.ops.cast(T0, dtype=DataType.Float)
    T4 = fd.ops.cast(T1, dtype=DataType.Float)
    T5 = fd.ops.broadcast_in_dim(T2, shape=T0.shape(), broadcast_dims=[1])
    T6 = fd.ops.add(T3, T5)
"""


def generate(n_ops: int, seed: int = 0, reduce_every: int = 12, rows: int = 4096,
             cols: int = 4096, column_share: float = 0.3, outputs: int = 4) -> str:
    rng = random.Random(seed)
    lines = [HEADER.rstrip("\n")]
    full = ["T3", "T4", "T6"]  # values that vary over all of [rows, cols]
    n = 7
    count = 4
    while count < n_ops:
        name = f"T{n}"
        if count % reduce_every == reduce_every - 1:
            src = rng.choice(full[-6:])
            axis = 0 if rng.random() < column_share else 1
            lines.append(f"    T{n} = fd.ops.sum({src}, dims=[{axis}], keepdim=False, "
                         f"dtype=DataType.Null)")
            kept = 1 - axis
            lines.append(f"    T{n + 1} = fd.ops.broadcast_in_dim(T{n}, shape=T0.shape(), "
                         f"broadcast_dims=[{kept}])")
            other = rng.choice(full[-4:])
            lines.append(f"    T{n + 2} = fd.ops.sub({other}, T{n + 1})")
            full.append(f"T{n + 2}")
            n += 3
            count += 3
            continue
        kind = rng.random()
        a = rng.choice(full[-8:])
        if kind < 0.45:
            b = rng.choice(full[-8:])
            op = rng.choice(["add", "sub", "mul"])
            lines.append(f"    {name} = fd.ops.{op}({a}, {b})")
        elif kind < 0.75:
            op = rng.choice(["tanh", "neg", "abs"])
            lines.append(f"    {name} = fd.ops.{op}({a})")
        else:
            c = round(rng.uniform(0.1, 0.9), 3)
            lines.append(f"    {name} = fd.ops.mul({a}, fd.define_scalar({c}, "
                         f"dtype=DataType.Double))")
        full.append(name)
        n += 1
        count += 1
    picks = [full[-1]] + rng.sample(full[3:-1], min(outputs - 1, max(len(full) - 4, 0)))
    for t in picks:
        lines.append(f"    fd.add_output(fd.ops.cast({t}, dtype=DataType.BFloat16))")
    lines += ["", "with FusionDefinition() as fd:", "    nvfuser_fusion_id0(fd)", "",
              "inputs = [",
              f"    torch.randn(({rows}, {cols}), dtype=torch.bfloat16, device='cuda:0'),",
              f"    torch.randn(({rows}, {cols}), dtype=torch.bfloat16, device='cuda:0'),",
              f"    torch.randn(({cols},), dtype=torch.float32, device='cuda:0'),",
              "]", "fd.execute(inputs)", ""]
    return "\n".join(lines)


def scale_case() -> str:
    """1,458 ops over bf16 2048x2048 inputs, 5 outputs, a reduction every 6 ops: the fusion the
    planner must segment and solve within its default limit (and within 2 s)."""
    return generate(1451, seed=1, rows=2048, cols=2048, outputs=5, reduce_every=6)
