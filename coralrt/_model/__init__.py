"""The TFLite model layer: read, validate, write and cut ``.tflite`` files.

``_schema.py`` is the TFLite schema as a table and ``flatbuf.py`` the
bounds-checked flatbuffer codec driven by it; ``reader.py`` and
``writer.py`` turn bytes into a :class:`Model` and back; ``validate.py``,
``op_checks.py``, ``quant_checks.py`` and ``xnnpack_checks.py`` (over
``kernel_view.py``, how LiteRT's kernels see a tensor) and
``custom_options.py`` check a model before any native library sees it;
``extract.py`` cuts sub-models; ``builder.py`` builds models in code;
``shapes.py`` infers the output shapes of custom operators whose file
declares none; ``prepared_shapes.py`` sizes dynamic tensors as LiteRT's
Prepare does; ``compiled.py`` knows compiled models.  See
docs/model-layer.md.
"""

from coralrt._model.reader import load_model, read_bytes
from coralrt._model.types import (
    Buffer, Metadata, Model, Operator, OperatorCode, Quantization, SignatureDef, Subgraph,
    Tensor,
)

__all__ = [
    "load_model", "read_bytes", "Model", "Subgraph", "Tensor", "Operator", "OperatorCode",
    "Quantization", "Buffer", "Metadata", "SignatureDef",
]
