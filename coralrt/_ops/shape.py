"""Operators that move values without arithmetic: RESHAPE, SQUEEZE, EXPAND_DIMS,
CONCATENATION, PACK, UNPACK, SPLIT, SPLIT_V, SLICE, STRIDED_SLICE, PAD,
SPACE_TO_DEPTH, DEPTH_TO_SPACE, TRANSPOSE, TILE, GATHER, GATHER_ND, EMBEDDING_LOOKUP."""

from __future__ import annotations

from coralrt._ops.checks import (
    concat_constants, constant_operands, not_on_batch, pad_not_on_batch, table_lookup_refusal,
    unit_strides,
)
from coralrt._ops.spec import NO_ACTIVATION, OpSpec, OpSupport

_SIM = "coralrt._sim.kernels.shape:"
_INDEX = "coralrt._backends.numpy_index:"
_RESHAPE = "coralrt._backends.numpy_kernels:reshape"

SPECS = (
    OpSpec("RESHAPE", tpu=OpSupport(3), sim=_SIM + "reshape", numpy_float=_RESHAPE,
           gelu_path=True),
    OpSpec("SQUEEZE", tpu=OpSupport(3), sim=_SIM + "reshape", numpy_float=_RESHAPE,
           gelu_path=True),
    OpSpec("EXPAND_DIMS", tpu=OpSupport(3), sim=_SIM + "reshape", numpy_float=_RESHAPE,
           gelu_path=True),
    OpSpec("CONCATENATION", tpu=OpSupport(3, (concat_constants,), activations=NO_ACTIVATION),
           sim=_SIM + "concatenation",
           numpy_float="coralrt._backends.numpy_kernels:concatenation"),
    OpSpec("PACK", tpu=OpSupport(3, (not_on_batch(option="axis"),)), sim=_SIM + "pack"),
    OpSpec("SPLIT", tpu=OpSupport(4, (not_on_batch(axis_input=0),)), sim=_SIM + "split"),
    OpSpec("SLICE", tpu=OpSupport(5, (constant_operands(1, 2),)), sim=_SIM + "slice_"),
    OpSpec("STRIDED_SLICE", tpu=OpSupport(6, (constant_operands(1, 2, 3), unit_strides)),
           sim=_SIM + "strided_slice"),
    OpSpec("PAD", tpu=OpSupport(4, (pad_not_on_batch,)), sim=_SIM + "pad"),
    OpSpec("SPACE_TO_DEPTH", tpu=OpSupport(3), sim=_SIM + "space_to_depth"),
    OpSpec("TRANSPOSE", tpu=OpSupport(3), sim=_SIM + "transpose"),
    # Not in the published table; edgetpu_compiler maps it (compat mode): version
    # 1 for uint8, 3 as TFLite's converter writes it for int8.  The generic checks
    # already keep the multiples constant (a non-constant operand must be 8-bit;
    # multiples are int32) and the batch untiled (batch size 1).
    OpSpec("TILE", compat=OpSupport(max_version=3), sim=_SIM + "tile"),
    OpSpec("UNPACK", numpy_any=_INDEX + "unpack"),
    OpSpec("SPLIT_V", numpy_any=_INDEX + "split_v"),
    OpSpec("DEPTH_TO_SPACE", numpy_any=_INDEX + "depth_to_space"),
    OpSpec("GATHER", tpu_refusal=table_lookup_refusal, numpy_any=_INDEX + "gather"),
    OpSpec("EMBEDDING_LOOKUP", tpu_refusal=table_lookup_refusal),
    OpSpec("GATHER_ND", numpy_any=_INDEX + "gather_nd"),
)
