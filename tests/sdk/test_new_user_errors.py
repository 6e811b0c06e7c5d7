"""Errors a new user met, each now saying what is wrong and what to write (issue 45, new-user
item 7): a tensor instead of a list of inputs, an option's name slightly wrong, a DataType
nvFuser does not have, input metadata without a shape, a wrong dtype (nvFuser's words, then
torch's names), a dtype written as "half" or "fp16"."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fusecut import DataType, FusionDefinition
from fusecut.optimizer.errors import InputError
from tests.conftest import CORPUS


def two_inputs() -> FusionDefinition:
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        t1 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.add(t0, t1))
    return fd


def test_a_tensor_instead_of_a_list_of_inputs():
    # was "the definition has 2 inputs (T0, T1) but 4 were given": the tensor's rows
    fd = two_inputs()
    for call in (fd.execute, fd.plan):
        with pytest.raises(TypeError, match=r"must be a list.*fd\.execute\(\[x\]\).*got a "
                                            r"tensor of shape \[4, 8\]"):
            call(torch.rand(4, 8))


@pytest.mark.parametrize("method", ["plan", "execute"])
def test_an_unknown_option_is_named_with_the_one_meant(method):
    # was "PlanOptions.__init__() got an unexpected keyword argument 'time_limit'"
    fd, x = two_inputs(), torch.rand(4, 8)
    with pytest.raises(TypeError) as caught:
        getattr(fd, method)([x, x], time_limit=3)
    message = str(caught.value)
    assert f"fd.{method}() got an unknown option 'time_limit'" in message
    assert "did you mean 'time_limit_s'" in message and "PlanOptions" not in message
    with pytest.raises(TypeError, match="unknown option 'frobnicate' \\(plan options: "):
        getattr(fd, method)([x, x], frobnicate=1)
    assert getattr(fd, method)([x, x], time_limit_s=3) is not None


def test_a_datatype_nvfuser_lacks_lists_those_it_has():
    with pytest.raises(AttributeError) as caught:
        _ = DataType.UInt8
    assert "has no member 'UInt8'" in str(caught.value)
    assert "Int32" in str(caught.value) and "UInt64" in str(caught.value)
    with pytest.raises(AttributeError, match="did you mean DataType.Float\\?"):
        _ = DataType.float
    with pytest.raises(AttributeError, match="did you mean DataType.BFloat16\\?"):
        _ = DataType.Bfloat16


def test_metadata_without_a_shape_says_so():
    # was "Expected input 0, T0, to be an at::Tensor but got scalar None"
    fd = two_inputs()
    with pytest.raises(InputError, match=r"input 0 \(T0\) is a tensor, but its metadata has no "
                                         r"shape: give \{\"shape\": \[\.\.\.\], \"dtype\": "
                                         r"\"float32\"\}"):
        fd.plan([{"dtype": "float32"}, {"shape": [4, 8], "dtype": "float32"}])


def test_a_wrong_dtype_is_one_sentence_with_torch_names():
    fd, x = two_inputs(), torch.rand(4, 8)
    with pytest.raises(InputError) as caught:
        fd.execute([x.half(), x])
    message = str(caught.value)
    assert message.startswith("Expected input 0, T0, to be bound to a tensor of dtype float, "
                              "but got a tensor of dtype __half")  # nvFuser's words, kept
    assert message.endswith("(in torch's names, input 0 (T0): expected dtype float32, got "
                            "float16)")  # one sentence, its torch names in parentheses
    assert message.count("input 0") == 2 and "__half: input 0" not in message


@pytest.mark.parametrize("written, meant", [("half", "float16"), ("fp16", "float16"),
                                            ("torch.bfloat16", "bfloat16"), ("bf16", "bfloat16"),
                                            ("double", "float64"), ("Float32", "float32")])
def test_a_dtype_by_another_name_gets_a_suggestion(written, meant):
    fd = two_inputs()
    with pytest.raises(InputError, match=f"unknown dtype '{written}'; did you mean {meant}\\?"):
        fd.plan([{"shape": [4, 8], "dtype": written}, {"shape": [4, 8], "dtype": "float32"}])
    r = subprocess.run([sys.executable, "-m", "fusecut.cli", "plan",
                        str(CORPUS / "softmax_fwd.py"), "--inputs",
                        f'[{{"shape": [4, 8], "dtype": "{written}"}}]'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"did you mean {meant}?" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_generated_cuda_is_pointed_to_where_nvfuser_would_show_it():
    # item 8: fd.cuda_code_for() was refused without saying where fusecut's CUDA is
    fd = two_inputs()
    from fusecut.optimizer.errors import ManualSchedulingError

    for name in ("cuda_code_for", "last_cuda_code", "scheduled_fusion_ir_for"):
        with pytest.raises(ManualSchedulingError, match="`fusecut codegen FILE --out DIR`"):
            getattr(fd, name)()
    assert "from nvfuser import" in fd.repro_script_for([torch.rand(4, 8)] * 2)


def test_a_repro_says_how_fusecut_runs_it_and_fusecut_execute_does(tmp_path):
    # item 1: a repro imports nvfuser; `python repro.py` failed with no word on what to do
    fd = two_inputs()
    text = fd.repro_script_for([torch.rand(4, 8), torch.rand(4, 8)])
    assert "fusecut runs it with `fusecut execute FILE`" in text
    assert "`from fusecut import` in place of `from nvfuser import`" in text
    repro = tmp_path / "repro.py"
    repro.write_text(text)
    r = subprocess.run([sys.executable, "-m", "fusecut.cli", "execute", str(repro)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    swapped = tmp_path / "swapped.py"
    swapped.write_text(text.replace("from nvfuser import", "from fusecut import"))
    r = subprocess.run([sys.executable, str(swapped)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr


def test_codegen_compile_says_what_it_compiled_and_where_the_cubins_go(tmp_path):
    # item 8: `codegen --compile` said nothing about the compile or where cubins go
    pytest.importorskip("cuda.bindings", reason="NVRTC comes with the gpu extra")
    import json
    import os

    env = dict(os.environ, FUSECUT_CACHE_DIR=str(tmp_path / "kernels"))
    command = [sys.executable, "-m", "fusecut.cli", "codegen", str(CORPUS / "softmax_fwd.py"),
               "--out", str(tmp_path / "cu"), "--compile"]
    r = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())
    assert f"compiled 1 segment with NVRTC for sm_90: the cubins are in the kernel cache, " \
           f"{tmp_path / 'kernels'} (FUSECUT_CACHE_DIR), not in {tmp_path / 'cu'}" in said, said
    assert list((tmp_path / "kernels").glob("*.cubin"))
    r = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300,
                       env=env)
    data = json.loads(r.stdout)
    assert data["compiled"] == {"arch": "sm_90", "segments": 1,
                                "cubin_cache": str(tmp_path / "kernels")}
    assert data["segments"][0]["cubin_bytes"] > 0
