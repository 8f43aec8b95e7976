"""The TFLite model layer: read, validate, write and cut ``.tflite`` files."""

from coralrt.model.reader import load_model, read_bytes
from coralrt.model.types import (
    Buffer, Metadata, Model, Operator, OperatorCode, Quantization, SignatureDef, Subgraph,
    Tensor,
)

__all__ = [
    "load_model", "read_bytes", "Model", "Subgraph", "Tensor", "Operator", "OperatorCode",
    "Quantization", "Buffer", "Metadata", "SignatureDef",
]
