"""Build TFLite models in code: the demo model, single-operator test models,
and the models coralrt's compilers emit.

    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 3), np.uint8, scale=0.02, zero_point=128)
    w = b.constant("w", weights_uint8, scale=0.01, zero_point=120)
    y = b.tensor("y", (1, 8, 8, 4), np.uint8, scale=0.05, zero_point=0)
    b.op("CONV_2D", [x, w, bias], [y], stride_w=1, stride_h=1, padding="SAME")
    b.output(y)
    model = b.build()

Options are checked against the schema: a misspelled option name raises.
Enum-valued options accept their names (``padding="SAME"``,
``fused_activation_function="RELU6"``).
"""

from __future__ import annotations

import numpy as np

from coralrt._model._schema import ENUMS, TABLES, UNIONS
from coralrt._model.types import (
    BUILTIN_CODES, CUSTOM, Buffer, Model, Operator, OperatorCode, Quantization, Subgraph,
    Tensor, tensor_type,
)

__all__ = ["ModelBuilder", "make_operator", "make_tensor", "options_type_for"]

_OPTIONS_BY_KEY = {name.lower(): name for name in UNIONS["BuiltinOptions"].values()}
# Operators whose options table is not named after the operator.
_OPTIONS_EXCEPTIONS = {
    "AVERAGE_POOL_2D": "Pool2DOptions", "MAX_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions", "L2_NORMALIZATION": "L2NormOptions",
    "MEAN": "ReducerOptions", "SUM": "ReducerOptions", "REDUCE_PROD": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions", "REDUCE_MIN": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions", "REDUCE_ALL": "ReducerOptions",
    "MAXIMUM": "MaximumMinimumOptions", "MINIMUM": "MaximumMinimumOptions",
    "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
}
_ENUM_OPTIONS = {
    "padding": ENUMS["Padding"],
    "fused_activation_function": ENUMS["ActivationFunctionType"],
}


def options_type_for(op_name: str) -> str | None:
    """The BuiltinOptions table a builtin operator uses, or None if it has none."""
    if op_name in _OPTIONS_EXCEPTIONS:
        return _OPTIONS_EXCEPTIONS[op_name]
    return _OPTIONS_BY_KEY.get(op_name.replace("_", "").lower() + "options")


def _quant(scale, zero_point, axis: int) -> Quantization | None:
    if scale is None:
        return None
    s = np.atleast_1d(np.asarray(scale, np.float32))
    zp = np.atleast_1d(np.asarray(0 if zero_point is None else zero_point, np.int64))
    if zp.size == 1 and s.size > 1:
        zp = np.repeat(zp, s.size)
    return Quantization(scale=s, zero_point=zp, quantized_dimension=axis)


def make_tensor(name: str, shape, dtype, *, scale=None, zero_point=None, axis: int = 0,
                data: np.ndarray | None = None, shape_signature=None) -> Tensor:
    """A tensor (a constant with its own read-only buffer when ``data`` is given);
    ``scale``/``zero_point`` scalars or per-channel arrays along ``axis``."""
    buf = None
    if data is not None:
        arr = np.asarray(data, dtype=np.dtype(dtype).newbyteorder("<"), order="C")
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"data of shape {arr.shape} for tensor {name!r} of shape "
                             f"{tuple(shape)}")
        raw = np.frombuffer(arr.tobytes(), np.uint8)
        raw.flags.writeable = False
        buf = Buffer(raw)
    return Tensor(name=name, shape=tuple(int(d) for d in shape), type=tensor_type(dtype),
                  buffer=buf, quantization=_quant(scale, zero_point, axis),
                  shape_signature=None if shape_signature is None else tuple(shape_signature))


class ModelBuilder:
    """Accumulates tensors and operators of one subgraph and builds a Model."""

    def __init__(self, name: str = "main", description: str = "coralrt"):
        self._sg = Subgraph(tensors=[], operators=[], inputs=[], outputs=[], name=name)
        self._description = description
        self._buffers: list[Buffer] = []

    # -- tensors -------------------------------------------------------------

    def tensor(self, name: str, shape, dtype, *, scale=None, zero_point=None, axis: int = 0,
               data: np.ndarray | None = None, shape_signature=None) -> int:
        """Add a tensor and return its index.  ``data`` makes it a constant."""
        t = make_tensor(name, shape, dtype, scale=scale, zero_point=zero_point, axis=axis,
                        data=data, shape_signature=shape_signature)
        if t.buffer is not None:
            self._buffers.append(t.buffer)
        self._sg.tensors.append(t)
        return len(self._sg.tensors) - 1

    def constant(self, name: str, data, dtype=None, **quant) -> int:
        arr = np.asarray(data, dtype=dtype)
        return self.tensor(name, arr.shape, arr.dtype, data=arr, **quant)

    def input(self, name: str, shape, dtype, **quant) -> int:
        t = self.tensor(name, shape, dtype, **quant)
        self._sg.inputs.append(t)
        return t

    def output(self, *tensors: int) -> None:
        self._sg.outputs.extend(tensors)

    # -- operators -----------------------------------------------------------

    def op(self, name: str, inputs, outputs, *, version: int = 1,
           custom_options: bytes | None = None, options_type: str | None = None,
           **options) -> int:
        """Add an operator (builtin name like ``"CONV_2D"`` or a custom code)."""
        self._sg.operators.append(make_operator(
            name, inputs, outputs, version=version, custom_options=custom_options,
            options_type=options_type, **options))
        return len(self._sg.operators) - 1

    def build(self) -> Model:
        return Model(subgraphs=[self._sg], buffers=list(self._buffers),
                     description=self._description)


def make_operator(name: str, inputs, outputs, *, version: int = 1,
                  custom_options: bytes | None = None, options_type: str | None = None,
                  **options) -> Operator:
    """An operator (builtin name like ``"CONV_2D"`` or a custom code) with its options
    checked against the schema and defaults filled in."""
    if name in BUILTIN_CODES and name != "CUSTOM":
        code = OperatorCode(BUILTIN_CODES[name], None, version)
        options_type = options_type or options_type_for(name)
    else:
        code = OperatorCode(CUSTOM, name, version)
    if options and options_type is None:
        raise ValueError(f"operator {name} takes no builtin options, got {sorted(options)}")
    full = {}
    if options_type is not None:
        fields = {f[0]: f for f in TABLES[options_type]}
        unknown = sorted(set(options) - set(fields))
        if unknown:
            raise ValueError(f"{options_type} has no option(s) {unknown}; known: "
                             f"{sorted(fields)}")
        for key, (_, _, kind, default) in fields.items():
            value = options.get(key, default)
            if isinstance(value, str) and key in _ENUM_OPTIONS:
                value = _ENUM_OPTIONS[key][value]
            if value is not None:
                full[key] = value
    return Operator(opcode=code, inputs=list(inputs), outputs=list(outputs), options=full,
                    options_type=options_type,
                    custom_options=None if custom_options is None else bytes(custom_options))
