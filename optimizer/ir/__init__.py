"""Fusion IR: values, ops, dtypes, the builder, and the text and JSON front ends."""

# The op families register their ops in ``opspec``'s registry when imported: first, so that
# every op is known before any module of the package looks one up.
from optimizer.ir import ops_library, ops_misc, ops_pointwise, ops_shape  # noqa: F401, I001
from optimizer.ir.builder import FusionBuilder, ScalarHandle, TensorHandle
from optimizer.ir.dtypes import DType
from optimizer.ir.fusion import Fusion, Op, Ref, ScalarValue, TensorValue
from optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta, tensor_meta
from optimizer.ir.nvtext import ParsedDefinition, parse_text
from optimizer.ir.printer import print_fusion
from optimizer.ir.wire import fusion_from_json, fusion_id, fusion_to_json

__all__ = [
    "DType", "Fusion", "FusionBuilder", "InputMeta", "Op", "ParsedDefinition", "Ref",
    "ScalarHandle", "ScalarMeta", "ScalarValue", "TensorHandle", "TensorMeta", "TensorValue",
    "fusion_from_json", "fusion_id", "fusion_to_json", "parse_text", "print_fusion", "tensor_meta",
]
