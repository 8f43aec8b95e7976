"""Quantization parameters that make a LiteRT kernel kill the process.

Each check reproduces, in Python, the arithmetic a LiteRT kernel does on an
operator's scales and zero points while it prepares or first runs, and
raises :class:`~coralrt.errors.ModelError` exactly when that arithmetic ends
in an abort (a failed ``TFLITE_CHECK``: SIGABRT) or a null dereference
(SIGSEGV).  Scales that are merely extreme are not refused: LiteRT runs an
operator whose rescaling multiplier is 1e-30 or 1e30 (``QuantizeMultiplier``
flushes tiny multipliers to zero and keeps huge ones), and so does coralrt.

Sources (LiteRT, ``tflite/kernels``; the conditions were measured with
ai-edge-litert 2.3 on single-operator models on each side of each boundary,
see tests/test_validation_bounds.py):

- ``internal/quantization_util.cc``: ``QuantizeMultiplierSmallerThanOneExp``
  aborts unless 0 < m < 1 and the rounded exponent is <= 0;
  ``QuantizeMultiplierGreaterThanOne`` aborts unless m > 1.
- ``add.cc`` / ``sub.cc`` / ``squared_difference.cc`` (Prepare), the
  quantized comparisons in ``comparisons.cc`` (Eval) and the reference
  SOFTMAX / LOG_SOFTMAX (``activations.cc``, ``PreprocessSoftmaxScaling``)
  call those two with multipliers built from the scales.
- ``delegates/xnnpack/xnnpack_delegate.cc`` (the rules are in
  :mod:`coralrt._model.xnnpack_checks`): while choosing the operators it
  takes, the XNNPACK delegate (applied by the default, optimized kernels)
  logs an unusable scale or zero point of a QUANTIZE operand or of
  BATCH_MATMUL's first input through a null context (``GetXNNPackDatatype``
  -> ``TF_LITE_KERNEL_LOG``): SIGSEGV.
- ``elementwise.cc``: SQRT and LOG on an INT16 tensor without quantization
  read quantization parameters (or a lookup table) that were never made.

Each check takes the subgraph, the operator, a place name and the types
LiteRT has given the tensors so far; the operator specs (:mod:`coralrt._ops`,
their ``quant_check`` field) say which check guards which operator.

Kernels see a tensor's quantization the way ``InterpreterBuilder`` and
``GetLegacyQuantization`` (``core/subgraph.cc``) leave it: a tensor without
scales has scale 0 and zero point 0, a per-channel tensor has them 0 too,
and zero points are truncated to 32 bits.
"""

from __future__ import annotations

import math

import numpy as np

from coralrt.errors import ModelError
from coralrt._model.kernel_view import (
    EIGHT_BIT, F32, TYPE_RANGE, fail, legacy, operands, quantized, typed,
)
from coralrt._model.types import Operator, Subgraph, Tensor
from coralrt._ops import operator_table

__all__ = ["check_kernel_quantization", "quantize_multiplier_shift", "add", "sub",
           "squared_difference", "comparison", "softmax", "log_softmax",
           "int16_needs_quantization", "convolution_multiplier",
           "convolution_bias", "convolution_quantization"]


# -- QuantizeMultiplier and its two checked wrappers ---------------------------------------

def quantize_multiplier_shift(m: float) -> int:
    """The exponent ``QuantizeMultiplier`` gives ``m`` (quantization_util.cc).

    The significand is rounded to 31 bits (half away from zero); a carry into
    bit 31 bumps the exponent; exponents below -31 are flushed to 0 (the
    multiplier then becomes 0).  ``frexp`` of inf or NaN leaves 0.
    """
    if m == 0.0 or not math.isfinite(m):
        return 0
    q, shift = math.frexp(m)
    if math.floor(abs(q) * 2.0**31 + 0.5) == 2**31 and q > 0:
        shift += 1
    return 0 if shift < -31 else shift


def _smaller_than_one_aborts(m: float) -> bool:
    # QuantizeMultiplierSmallerThanOneExp: CHECK_LT(m, 1), CHECK_GT(m, 0),
    # CHECK_LE(shift, 0).  NaN fails the comparisons.
    return not (0.0 < m < 1.0) or quantize_multiplier_shift(m) > 0


def _greater_than_one_aborts(m: float) -> bool:
    # QuantizeMultiplierGreaterThanOne: CHECK_GT(m, 1), CHECK_GE(shift, 0).
    return not m > 1.0 or quantize_multiplier_shift(m) < 0


def _twice_max(s1: np.float32, s2: np.float32) -> float:
    # 2 * std::max(float, float) is float arithmetic (inf past FLT_MAX).
    with np.errstate(over="ignore"):
        return float(F32(2.0) * (s2 if s1 < s2 else s1))


def _ratio(num: float, den: np.float32) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(num) / np.float64(den))


def _scaled(shift: int, s: np.float32) -> np.float32:
    # (1 << left_shift) * scale: int times float, in float.
    with np.errstate(over="ignore"):
        return F32(1 << shift) * s


# -- element-wise arithmetic ------------------------------------------------------------

def _int16_general(op: Operator, a: Tensor, b: Tensor, out: Tensor, option_table: str) -> bool:
    """add.cc / sub.cc: whether INT16 operands take the general rescaling path
    (the same multipliers as 8-bit, shifted by 15) instead of the power-of-two one."""
    # Without an options table the kernel's params are zero: pot_scale_int16 false.
    pot = bool(op.options.get("pot_scale_int16", True)) if op.options_type == option_table \
        else False
    if not pot:
        return True
    return not all(_checked_log2(legacy(t)[0]) for t in (a, b, out))


def _checked_log2(x: np.float32) -> bool:
    # CheckedLog2: float log2, rounded; a power of two if within 1e-3.
    with np.errstate(divide="ignore", invalid="ignore"):
        v = F32(np.log(x)) * (F32(1.0) / F32(np.log(F32(2.0))))
        return bool(np.abs(v - np.round(v)) < F32(1e-3))


def add(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    ops = operands(sg, op, 2, types)
    if ops is None or ops[0].type_name != ops[1].type_name:
        return  # TF_LITE_ENSURE_TYPES_EQ refuses mixed inputs cleanly
    a, b, out = ops
    kind = a.type_name  # the kernel makes the output's type the inputs'
    general16 = False
    if kind == "INT16" and quantized(a):
        if any(legacy(t)[1] != 0 for t in ops):
            return  # TF_LITE_ENSURE_EQ(zero_point, 0): a clean error
        general16 = _int16_general(op, a, b, out, "AddOptions")
    if kind not in EIGHT_BIT and not general16:
        return
    (s1, _), (s2, _), (so, _) = (legacy(t) for t in ops)
    twice = _twice_max(s1, s2)
    for m, what in ((_ratio(s1, twice), "input 0"), (_ratio(s2, twice), "input 1"),
                    (_ratio(twice, _scaled(15 if general16 else 20, so)), "output")):
        if _smaller_than_one_aborts(m):
            fail(op, where, f"the {what} rescaling multiplier {m:g} (from scales {s1:g}, "
                             f"{s2:g} -> {so:g}) is not in (0, 1)")


def sub(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    ops = operands(sg, op, 2, types)
    if ops is None or ops[0].type_name != ops[1].type_name:
        return
    a, b, out = ops
    kind = a.type_name
    general16 = False
    if kind == "INT16":
        if any(legacy(t)[1] != 0 for t in ops):
            return  # TF_LITE_ENSURE_EQ(zero_point, 0)
        general16 = _int16_general(op, a, b, out, "SubOptions")
    if kind not in EIGHT_BIT and not general16:
        return
    lo, hi = TYPE_RANGE[kind]
    if any(not lo <= legacy(t)[1] <= hi for t in ops):
        return  # PrepareGeneralSubOp checks the zero points first (a clean error)
    (s1, _), (s2, _), (so, _) = (legacy(t) for t in ops)
    twice = _twice_max(s1, s2)
    for m, what in ((_ratio(s1, twice), "input 0"), (_ratio(s2, twice), "input 1")):
        if _smaller_than_one_aborts(m):
            fail(op, where, f"the {what} rescaling multiplier {m:g} is not in (0, 1)")
    m = _ratio(twice, _scaled(15 if kind == "INT16" else 20, so))
    # 1 itself, 0, negatives and NaN go to QuantizeMultiplierSmallerThanOneExp
    # and abort.  A multiplier above 1 passes QuantizeMultiplierGreaterThanOne,
    # but the (double-rounding) reference SUB then applies it with
    # MultiplyByQuantizedMultiplierSmallerThanOneExp, whose RoundingDivideByPOT
    # shifts by a negative amount: undefined, and measured to give results that
    # depend on each element's position (vectorized and scalar code disagree),
    # never the real difference.  No answer LiteRT gives is right, so it is
    # refused too (coralrt, not a crash).
    if m > 1.0:
        raise ModelError(f"the output rescaling multiplier {m:g} (from scales {s1:g}, "
                         f"{s2:g} -> {so:g}) is above 1, which LiteRT's SUB kernel applies "
                         f"with an undefined negative shift (its results are garbage)",
                         where=where)
    if _smaller_than_one_aborts(m):
        fail(op, where, f"the output rescaling multiplier {m:g} (from scales {s1:g}, "
                         f"{s2:g} -> {so:g}) is not in (0, 1)")


def squared_difference(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    ops = operands(sg, op, 2, types)
    if ops is None or ops[0].type_name != ops[1].type_name or ops[0].type_name != "INT8":
        return
    if any(not -128 <= legacy(t)[1] <= 127 for t in ops):
        return  # zero points are checked first (a clean error)
    (s1, _), (s2, _), (so, _) = (legacy(t) for t in ops)
    twice = _twice_max(s1, s2)
    out_m = _ratio(twice * twice, _scaled(14, so))
    for m, what in ((_ratio(s1, twice), "input 0"), (_ratio(s2, twice), "input 1"),
                    (out_m, "output")):
        if _smaller_than_one_aborts(m):
            fail(op, where, f"the {what} rescaling multiplier {m:g} is not in (0, 1)")


def comparison(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    # comparisons.cc, ComparisonQuantized (at the first run): each input's
    # scale goes to QuantizeMultiplierSmallerThanOneExp when below 1, else
    # to QuantizeMultiplierGreaterThanOne, so a scale of exactly 1, 0 (no
    # quantization) or below 0 aborts.  UINT8 and INT8 always take this
    # path; INT16 only for EQUAL and NOT_EQUAL with a quantized first input.
    ops = operands(sg, op, 2, types)
    if ops is None or ops[0].type_name != ops[1].type_name:
        return
    kind = ops[0].type_name
    scaled = kind in EIGHT_BIT or (kind == "INT16" and op.name in ("EQUAL", "NOT_EQUAL")
                                    and quantized(ops[0]))
    if not scaled:
        return
    for k in (0, 1):
        s = float(legacy(ops[k])[0])
        aborts = _smaller_than_one_aborts(s) if s < 1.0 else _greater_than_one_aborts(s)
        if aborts:
            fail(op, where, f"input {k} has scale {s:g} (it must be positive and not "
                             f"exactly 1)")


# -- softmax (reference kernels) -------------------------------------------------------------

def _softmax_input_multiplier_aborts(beta: float, scale: np.float32) -> bool:
    # PreprocessSoftmaxScaling: min(beta * scale * 2^26, 2^31 - 1) must be
    # above 1 for QuantizeMultiplierGreaterThanOne.  std::min keeps a NaN.
    m = float(beta) * float(scale) * float(1 << 26)
    m = m if not (2.0**31 - 1 < m) else 2.0**31 - 1
    return _greater_than_one_aborts(m)


def softmax(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    ops = operands(sg, op, 1, types)
    if ops is None or ops[0].type_name not in EIGHT_BIT or not ops[0].shape:
        return
    x, out = ops
    if x.type_name == "INT8" and out.type_name == "INT8":
        so, zo = legacy(out)
        delta = so - F32(1 / 256) if so > F32(1 / 256) else F32(1 / 256) - so
        if zo != -128 or delta > F32(0.001) * F32(1 / 256):
            return  # the output must be the fixed 1/256, -128: a clean error
    beta = F32(op.options.get("beta", 0.0)) if op.options_type == "SoftmaxOptions" \
        else F32(0.0)
    if _softmax_input_multiplier_aborts(float(beta), legacy(x)[0]):
        fail(op, where, f"beta {beta:g} times input scale {legacy(x)[0]:g} is at most "
                         f"2^-26", "LiteRT's reference")


def log_softmax(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    ops = operands(sg, op, 1, types)
    if ops is None or ops[0].type_name != ops[1].type_name or ops[0].type_name not in EIGHT_BIT:
        return
    x, out = ops
    so, zo = legacy(out)
    if float(so) != 16.0 / 256 or zo != (255 if x.type_name == "UINT8" else 127):
        return  # the output must be the fixed 16/256 and 255 / 127: a clean error
    if _softmax_input_multiplier_aborts(1.0, legacy(x)[0]):
        fail(op, where, f"input scale {legacy(x)[0]:g} is at most 2^-26",
              "LiteRT's reference")


# -- the convolution multiplier (kernel_util.cc) ------------------------------------------

# Operator -> (input, weights, bias) positions.
_CONV_OPERANDS = {"CONV_2D": (0, 1, 2), "DEPTHWISE_CONV_2D": (0, 1, 2),
                  "TRANSPOSE_CONV": (2, 1, 3), "FULLY_CONNECTED": (0, 1, 2)}


def convolution_multiplier(sg: Subgraph, op: Operator, where: str,
                           types: dict[int, str]) -> None:
    """LiteRT's ``GetQuantizedConvolutionMultipler`` (kernel_util.cc), which the
    uint8 convolutions (``PopulateConvolutionQuantizationParams``) and the
    per-tensor 8/16-bit FULLY_CONNECTED call while preparing, refuses the
    model (a clean error, not a crash) unless the float product of the input
    and weight scales is >= 0 and, with a bias, ``|s_in * s_w - s_bias| / s_out
    <= 0.02`` in double.  The default kernels skip the check where the XNNPACK
    delegate takes the operator, the reference kernels never do; coralrt
    refuses on every target what LiteRT's builtin kernels refuse."""
    i_in, i_w, i_b = _CONV_OPERANDS[op.name]
    ins = op.inputs
    if len(ins) <= i_w or min(ins[i_in], ins[i_w]) < 0 or not op.outputs or op.outputs[0] < 0:
        return
    x, w = typed(sg, ins[i_in], types), typed(sg, ins[i_w], types)
    if op.name == "FULLY_CONNECTED":
        if x.type_name not in TYPE_RANGE or w.quantization is None \
                or w.quantization.scale.size > 1:
            return   # float or hybrid inputs, per-channel weights: not this check
    elif x.type_name != "UINT8":
        return
    out = sg.tensors[op.outputs[0]]
    s_in, s_w, s_out = legacy(x)[0], legacy(w)[0], legacy(out)[0]
    has_bias = len(ins) > i_b and ins[i_b] >= 0
    if has_bias:
        s_b = legacy(sg.tensors[ins[i_b]])[0]
        diff = abs(float(s_in) * float(s_w) - float(s_b))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.float64(diff) / np.float64(s_out)
        if not ratio <= 0.02:
            raise ModelError(f"the bias scale {float(s_b):g} is not the input scale times the "
                             f"weight scale ({float(s_in):g} x {float(s_w):g}) within 2% of the "
                             f"output scale {float(s_out):g}: LiteRT's {op.name} kernel refuses "
                             f"such a model", where=where)
    if not float(F32(s_in) * F32(s_w)) >= 0:
        raise ModelError(f"the input scale {float(s_in):g} times the weight scale "
                         f"{float(s_w):g} is negative: LiteRT's {op.name} kernel refuses such "
                         f"a model", where=where)


def convolution_bias(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    """CONV_2D and DEPTHWISE_CONV_2D check their bias while preparing (conv.cc,
    depthwise_conv.cc; a clean error): for 8-bit inputs an INT32 bias, for
    INT16 inputs an INT64 one (CONV_2D also takes INT32), each with zero point
    0, and for other inputs a bias of the input's type.  Refused here on every
    target, so that no target runs what LiteRT refuses."""
    ins = op.inputs
    if len(ins) < 3 or ins[0] < 0 or ins[2] < 0:
        return
    x, b = typed(sg, ins[0], types), typed(sg, ins[2], types)
    if x.type_name in EIGHT_BIT:
        allowed = ("INT32",)
    elif x.type_name == "INT16":
        allowed = ("INT32", "INT64") if op.name == "CONV_2D" else ("INT64",)
    else:
        allowed = (x.type_name,)
    if b.type_name not in allowed:
        raise ModelError(f"the bias is {b.type_name} but a {x.type_name} input takes "
                         f"{' or '.join(allowed)}: LiteRT's {op.name} kernel refuses such a "
                         f"model", where=where)
    if x.type_name in (*EIGHT_BIT, "INT16") and legacy(b)[1] != 0:
        raise ModelError(f"the bias has zero point {legacy(b)[1]}, not 0: LiteRT's {op.name} "
                         f"kernel refuses such a model", where=where)
    if ins[1] < 0:
        return
    w_shape, b_shape = tuple(sg.tensors[ins[1]].shape), tuple(b.shape)
    if op.name == "CONV_2D":
        ok = len(w_shape) >= 1 and math.prod(b_shape) == w_shape[0]
    else:   # DEPTHWISE_CONV_2D
        ok = len(w_shape) == 4 and len(b_shape) == 1 and b_shape[0] == w_shape[3]
    if not ok:
        raise ModelError(f"the bias has shape {list(b_shape)} for weights of shape "
                         f"{list(w_shape)}: LiteRT's {op.name} kernel refuses such a model "
                         f"(one bias per output channel)", where=where)


def convolution_quantization(sg: Subgraph, op: Operator, where: str,
                             types: dict[int, str]) -> None:
    """CONV_2D and DEPTHWISE_CONV_2D: the bias, then the multiplier."""
    convolution_bias(sg, op, where, types)
    convolution_multiplier(sg, op, where, types)


# -- INT16 element-wise operators ----------------------------------------------------------

def int16_needs_quantization(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    ops = operands(sg, op, 1, types)
    if ops is None or ops[0].type_name != "INT16" or ops[1].type_name != "INT16":
        return
    if not quantized(ops[0]):
        raise ModelError(f"INT16 {op.name} input has no quantization parameters; LiteRT's "
                         f"{op.name} kernel reads them anyway (SIGSEGV)", where=where)


def check_kernel_quantization(sg: Subgraph, op: Operator, where: str,
                              types: dict[int, str]) -> None:
    """Raise ModelError when a builtin operator's quantization parameters make
    one of LiteRT's kernels for it abort or crash: the check its spec names
    (``quant_check``, one of the checks above or of
    :mod:`coralrt._model.xnnpack_checks`).

    ``types`` maps tensor indices of ``sg`` to the type LiteRT has given them
    by the time this operator prepares (operators are checked in file order);
    it is updated with the type this operator's kernel gives its output (its
    spec's ``output_type_from``).
    """
    if op.opcode.is_custom:
        return
    check = operator_table("quant_check").get(op.name)
    if check is not None:
        check(sg, op, where, types)
    source = operator_table("output_type_from").get(op.name)
    if source is None or not op.outputs or op.outputs[0] < 0:
        return
    if isinstance(source, str):
        types[op.outputs[0]] = source
    elif source < len(op.inputs) and op.inputs[source] >= 0:
        types[op.outputs[0]] = typed(sg, op.inputs[source], types).type_name
