"""Fusion IR: values, ops, dtypes, the builder, and the text and JSON front ends."""

# The op families register their ops in ``opspec``'s registry when imported: first, so that
# every op is known before any module of the package looks one up.
from fusecut.optimizer.ir import ops_library, ops_misc, ops_pointwise, ops_shape  # noqa: F401, I001
from fusecut.optimizer.ir.builder import FusionBuilder, ScalarHandle, TensorHandle
from fusecut.optimizer.ir.dtypes import DType
from fusecut.optimizer.ir.fusion import Fusion, Op, Ref, ScalarValue, TensorValue
from fusecut.optimizer.ir.inputs import InputMeta, ScalarMeta, TensorMeta, tensor_meta
from fusecut.optimizer.ir.nvtext import ParsedDefinition, parse_text
from fusecut.optimizer.ir.printer import print_fusion
from fusecut.optimizer.ir.wire import fusion_from_json, fusion_id, fusion_to_json

__all__ = [
    "DType", "Fusion", "FusionBuilder", "InputMeta", "Op", "ParsedDefinition", "Ref",
    "ScalarHandle", "ScalarMeta", "ScalarValue", "TensorHandle", "TensorMeta", "TensorValue",
    "fusion_from_json", "fusion_id", "fusion_to_json", "parse_text", "print_fusion", "tensor_meta",
]
