"""Wire format v1: JSON round trips, canonical form, fusion ids and strict validation."""

from __future__ import annotations

import copy
import json

import pytest
from pydantic import ValidationError

from fusecut.optimizer.errors import DefinitionError, FusecutError, InputError
from fusecut.optimizer.ir import fusion_from_json, fusion_id, fusion_to_json, parse_text
from fusecut.optimizer.ir.wire import FusionJSON, canonical_json, meta_from_json, meta_to_json


def _seed_json(name="seed_4269_forward_full"):
    from tests.conftest import CORPUS

    return fusion_to_json(parse_text((CORPUS / f"{name}.py").read_text()).fusion)


def test_canonical_form_is_sorted_compact_and_stable():
    data = _seed_json()
    text = canonical_json(data)
    assert ": " not in text and ", " not in text
    shuffled = json.loads(json.dumps(data))
    shuffled = dict(reversed(list(shuffled.items())))
    assert canonical_json(shuffled) == text


def test_fusion_id_is_content_hash():
    a = parse_text((__import__("tests.conftest").conftest.CORPUS / "softmax_fwd.py").read_text())
    data = fusion_to_json(a.fusion)
    assert fusion_id(a.fusion) == fusion_id(fusion_from_json(data))
    changed = copy.deepcopy(data)
    (index,) = [i for i, op in enumerate(changed["ops"]) if op["name"] == "max"]
    changed["ops"][index]["name"] = "min"
    assert fusion_id(fusion_from_json(changed)) != fusion_id(a.fusion)
    assert len(fusion_id(a.fusion)) == 64


def test_non_finite_scalars_survive_json():
    f = parse_text("from nvfuser import FusionDefinition, DataType\ndef f(fd):\n"
                   "    T0 = fd.define_tensor(shape=[-1], contiguity=[True],"
                   " dtype=DataType.Float)\n"
                   "    S1 = fd.define_scalar(float('-inf'), dtype=DataType.Double)\n"
                   "    fd.add_output(fd.ops.maximum(T0, S1))\n").fusion
    data = fusion_to_json(f)
    assert {"id": "S1", "dtype": "float64", "value": "-inf"} in data["scalars"]
    canonical_json(data)  # strict JSON: no NaN/Infinity tokens
    assert fusion_from_json(data).scalars["S1"].value == float("-inf")


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["ops"][0].update(name="nope"), "unknown op"),
    (lambda d: d["ops"][2].update(inputs=["T0", "T99"]), "not defined"),
    (lambda d: d["ops"][1]["attrs"].update(bogus=1), "unknown attributes"),
    (lambda d: d["ops"][1].update(outputs=["T0"]), "fresh identifier"),
    (lambda d: d.update(outputs=["S1"]), "not a tensor"),
    (lambda d: d["tensors"][0].update(shape=[-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                             -1, -1, -1, -1]), "rank"),
    (lambda d: d["ops"][1]["attrs"].update(shape=[{"scalar": "S42"}]), "not a defined scalar"),
])
def test_bad_json_is_a_definition_error_naming_the_problem(mutate, needle):
    data = _seed_json()
    mutate(data)
    with pytest.raises(DefinitionError) as info:
        fusion_from_json(data)
    assert needle in str(info.value)


def test_schema_rejects_unknown_fields_and_versions():
    data = _seed_json()
    data["version"] = 2
    with pytest.raises(ValidationError):
        fusion_from_json(data)
    data = _seed_json()
    data["extra"] = True
    with pytest.raises(ValidationError):
        FusionJSON.model_validate(data)


def test_input_metadata_json():
    meta = meta_from_json({"shape": [4, 8], "dtype": "bfloat16"})
    assert meta.strides == (8, 1)
    assert meta_from_json(meta_to_json(meta)) == meta
    scalar = meta_from_json({"dtype": "float64", "value": "inf"})
    assert scalar.value == float("inf")
    for bad in ({"shape": [4], "strides": [1, 1], "dtype": "float32"},
                {"shape": [-4], "dtype": "float32"}, {"shape": [4], "dtype": "float32",
                                                      "value": 1}):
        with pytest.raises(FusecutError):
            meta_from_json(bad)
    # one line naming the field (issue 45), not pydantic's report
    with pytest.raises(InputError, match="dtype: unknown dtype 'int8' \\(dtypes: bool, "):
        meta_from_json({"shape": [4], "dtype": "int8"})
    assert issubclass(InputError, FusecutError)
