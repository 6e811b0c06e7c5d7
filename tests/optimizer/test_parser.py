"""The nvFuser-text parser: the corpus, nvFuser's grammar beyond it, and hostile input."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusecut.optimizer.errors import DefinitionError
from fusecut.optimizer.ir import fusion_from_json, fusion_to_json, parse_text, print_fusion
from fusecut.optimizer.ir.dtypes import DType
from tests.conftest import CORPUS_FILES

HEADER = "from nvfuser import FusionDefinition, DataType, ParallelType\n"


def parse_body(body: str):
    lines = "".join(f"    {line}\n" for line in body.strip().splitlines())
    return parse_text(f"{HEADER}def f(fd : FusionDefinition) -> None :\n{lines}").fusion


def test_every_corpus_file_parses_and_round_trips(corpus_file):
    parsed = parse_text(corpus_file.read_text())
    assert parsed.inputs is not None and len(parsed.inputs) == len(parsed.fusion.inputs)
    text = print_fusion(parsed.fusion, inputs=parsed.inputs)
    again = parse_text(text)
    assert fusion_to_json(again.fusion) == fusion_to_json(parsed.fusion)
    assert again.inputs == parsed.inputs
    assert fusion_to_json(fusion_from_json(fusion_to_json(parsed.fusion))) == \
        fusion_to_json(parsed.fusion)


def test_corpus_is_present():
    assert len(CORPUS_FILES) >= 17


def test_repro_inputs_list_gives_shapes_strides_dtypes():
    text = (HEADER + "def f(fd):\n    T0 = fd.define_tensor(shape=[-1, -1, -1], contiguity=[None,"
            " None, True], dtype=DataType.BFloat16)\n    fd.add_output(fd.ops.neg(T0))\n"
            "inputs = [torch.randn((1024,), dtype=torch.bfloat16, device='cuda:0')"
            ".as_strided((56, 1024, 1024), (0, 0, 1))]\n")
    parsed = parse_text("import torch\n" + text)
    (meta,) = parsed.inputs
    assert meta.shape == (56, 1024, 1024) and meta.strides == (0, 0, 1)
    assert meta.dtype is DType.bfloat16 and meta.stored_numel == 1024


def test_repro_with_module_constants_and_expand_permute_inputs_runs():
    # issue 31's newcomer: module-level constants, and inputs built with .expand()/.permute(),
    # were refused; the file is still parsed (ast), never run
    import torch

    from fusecut.optimizer.planner import make_plan
    from fusecut.runtime.run import run_plan
    from fusecut.runtime.tensors import make_input

    text = """import torch
from nvfuser import FusionDefinition, DataType

LOW_VAL = -2
HIGH_VAL = 3.5
ROWS = 4

def nvfuser_fusion_id0(fd : FusionDefinition) -> None :
    T0 = fd.define_tensor(shape=[-1, -1], contiguity=[None, True], dtype=DataType.Float, \
stride_order=[1, 0])
    T1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float, \
stride_order=[0, 1])
    T2 = fd.ops.add(T0, T1)
    T3 = fd.ops.clamp(T2, LOW_VAL, HIGH_VAL)
    fd.add_output(T3)

with FusionDefinition() as fd:
    nvfuser_fusion_id0(fd)

inputs = [
    torch.randn((1, 6), dtype=torch.float32, device='cuda:0').expand(ROWS, -1),
    torch.randn((6, ROWS), dtype=torch.float32, device='cuda:0').permute(1, 0),
]
fd.execute(inputs)
"""
    parsed = parse_text(text)
    a, b = parsed.inputs
    assert (a.shape, a.strides) == ((4, 6), (0, 1))
    assert (b.shape, b.strides) == ((4, 6), (1, 4))
    (op,) = [o for o in parsed.fusion.ops if o.name == "clamp"]
    assert [parsed.fusion.scalars[n].value for n in op.inputs[1:]] == [-2, 3.5]
    args = [make_input(m, "cpu") for m in parsed.inputs]
    (out,) = run_plan(make_plan(parsed.fusion, parsed.inputs), args).outputs
    torch.testing.assert_close(out, (args[0] + args[1]).clamp(-2, 3.5))
    with pytest.raises(DefinitionError, match="must be a number"):
        parse_text(text.replace("LOW_VAL = -2", "LOW_VAL = print('x')"))


def test_bool_and_int_inputs():
    text = ("import torch\n" + HEADER + "def f(fd):\n"
            "    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Bool)\n"
            "    T1 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Int)\n"
            "    fd.add_output(fd.ops.where(T0, T1, T1))\n"
            "inputs = [torch.rand((8,), device='cuda:0') > 0.1,"
            " torch.randint(0, 10, (8,), dtype=torch.int64, device='cuda:0'), ]\n")
    parsed = parse_text(text)
    assert [m.dtype for m in parsed.inputs] == [DType.bool, DType.int64]
    assert parsed.inputs[0].fill["threshold"] == 0.1


def test_keyword_positional_and_legacy_forms():
    f = parse_body("""
T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
T1 = fd.ops.sum(T0, [1], False, DataType.Float)
T2 = fd.ops.sum(T0, dims=[0], keepdim=True)
T3 = fd.ops.sum(T0, axes=[1])
T4 = fd.ops.reshape(T0, [2, 3], [6])
T5 = fd.ops.reshape(T0, new_shape=[-1])
T6 = fd.ops.broadcast_in_dim(T1, output_shape=T0.shape(), broadcast_dims=[0])
T7 = fd.ops.squeeze(T2, dims=[0])
S8 = fd.define_scalar(float("-inf"), dtype=DataType.Double)
T9 = fd.ops.maximum(T0, S8)
T10 = fd.ops.add(T0, 2.5)
fd.add_output(T4)
fd.add_output(T5)
fd.add_output(T6)
fd.add_output(T7)
fd.add_output(T9)
fd.add_output(T10)
fd.add_output(T3)
""")
    names = [op.name for op in f.ops]
    assert names.count("sum") == 3 and names.count("reshape") == 2
    assert f.ops[[op.outputs[0] for op in f.ops].index("T4")].attrs["new_shape"] == [6]
    assert f.scalars["S8"].value == float("-inf")
    assert f.tensors["T7"].rank == 1 and f.tensors["T2"].broadcast == (True, False)


def test_inline_with_block_and_nested_calls_and_vectors():
    text = HEADER + """
with FusionDefinition() as fd:
    T0 = fd.define_tensor(shape=[-1, 1], contiguity=[True, None], dtype=DataType.Float)
    S1 = fd.define_scalar(4, dtype=DataType.Int)
    V2 = fd.define_vector([T0.size(0), S1], dtype=DataType.Int)
    T3 = fd.ops.exp(fd.ops.neg(fd.ops.expand(T0, shape=V2)))
    T4, T5 = fd.ops.var_mean(T3, dims=[1], correction=0, keepdim=False)
    fd.add_output(T4)
    fd.add_output(T5)
    fd.sched.parallelize(T4, 0, ParallelType.stream)
"""
    f = parse_text(text).fusion
    assert f.outputs == ["T4", "T5"] and f.stream_axes == [("T4", 0)]
    assert f.tensors["T3"].broadcast == (False, True)  # an expanded broadcast stays broadcast


@pytest.mark.parametrize("body, needle", [
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
     "T1 = fd.ops.frobnicate(T0)\nfd.add_output(T1)", "unknown op 'frobnicate'"),
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
     "T1 = fd.ops.add(T0)\nfd.add_output(T1)", "missing required argument 'arg2'"),
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
     "T1 = fd.ops.add(T0, T0, T0)\nfd.add_output(T1)", "at most 2 positional"),
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
     "T1 = fd.ops.add(T0, T9)\nfd.add_output(T1)", "name 'T9' is not defined"),
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
     "T1 = fd.ops.sum(T0, dims=[3])\nfd.add_output(T1)", "out of range"),
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
     "T1 = fd.ops.where(T0, T0, T0)\nfd.add_output(T1)", "must be bool"),
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
     "T1 = fd.ops.cast(T0, dtype=DataType.Int8)\nfd.add_output(T1)", "not supported"),
    ("T0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)\n"
     "T1 = fd.ops.broadcast_in_dim(T0, shape=[2, 3, 4], broadcast_dims=[2, 0])\n"
     "fd.add_output(T1)", "increasing"),
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
     "fd.add_output(T0.size(0))", "scalar"),
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)", "no outputs"),
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
     "T1 = fd.ops.mul(T0, 99999999999999999999999)\nfd.add_output(T1)", "64 bits"),
    ("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
     "T1 = fd.ops.matmul(T0, fd.ops.cast(T0, dtype=DataType.Int))\nfd.add_output(T1)",
     "share a dtype"),
])
def test_malformed_definitions_name_the_problem(body, needle):
    with pytest.raises(DefinitionError) as info:
        parse_body(body)
    assert needle in str(info.value)
    assert info.value.line is not None


def test_an_op_name_typo_says_did_you_mean():
    # issue 32: the error listed every op (1,161 characters)
    with pytest.raises(DefinitionError) as info:
        parse_body("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
                   "T1 = fd.ops.sqrtt(T0)\nfd.add_output(T1)")
    message = str(info.value)
    assert "unknown op 'sqrtt'; did you mean 'sqrt'" in message and len(message) < 150
    with pytest.raises(DefinitionError) as info:
        parse_body("T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)\n"
                   "T1 = fd.ops.qqqqqqqq(T0)\nfd.add_output(T1)")
    assert "docs/ops.md" in str(info.value) and len(str(info.value)) < 150


HOSTILE = [
    "__import__('os').system('echo pwned > /tmp/fusecut_pwned')",
    "import os\nos.system('true')",
    "from subprocess import run",
    "def f(fd):\n    T0 = fd.define_tensor(shape=[-1], contiguity=[True], "
    "dtype=DataType.Float)\n    fd.__class__.__bases__\n",
    "def f(fd):\n    x = (lambda: 1)()\n",
    "def f(fd):\n    for i in range(3):\n        pass\n",
    "def f(fd):\n    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)"
    "\n    T1 = fd.ops.add(T0, 10**10**10)\n",
    "def f(fd):\n    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)"
    "\n    T1 = getattr(fd, 'ops')\n",
    "def f(fd):\n    T0 = open('/etc/passwd')\n",
    "inputs = [__import__('os')]",
    "def f(fd):\n    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)"
    "\n    fd.add_output(T0)\ninputs = [torch.load('x.pt')]",
    "def f(fd):\n    T0 = fd.define_tensor(shape=[" + "-1, " * 40 + "], dtype=DataType.Float)\n",
    "x = " + "(" * 200000 + ")" * 200000,
    "def f(fd:\n",
    "@decorator\ndef f(fd):\n    pass\n",
    "def f(fd):\n    T0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)"
    "\n    fd.add_output(T0)\nfd.execute(inputs)\nprint('x')",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_text_is_rejected_and_nothing_runs(text, tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(DefinitionError):
        parse_text(HEADER + text.replace("/tmp/fusecut_pwned", str(marker)))
    assert not marker.exists()


def test_unseen_nvfuser_printed_definition():
    # As nvFuser prints Thunder's fusions: positional dims, Index dtype, slice, pad, cat,
    # permute, take_along_axis, index_select, iota and full with symbolic sizes.
    text = (Path(__file__).parents[1] / "data" / "thunder_style.py").read_text()
    f = parse_text(text).fusion
    assert {"slice", "pad", "permute", "cat", "iota", "index_select", "full",
            "take_along_axis"} <= {op.name for op in f.ops}
