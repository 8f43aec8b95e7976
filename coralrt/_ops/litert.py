"""LiteRT's facts about the inputs of every builtin operator, the type its
kernel gives its output, and which structural check guards which one
(validation, ``coralrt._model.validate``).

These describe LiteRT's kernels for all of its ~200 builtins, most of which
coralrt has no kernel or rule for; :func:`validation_facts` hands them to the
registry (``coralrt/_ops/__init__.py``), which puts them into each operator's
spec (a family file may set a field itself; its value wins).

Optional inputs: the native crash they prevent is LiteRT handing an omitted
input (tensor index -1) to a kernel as a null tensor, which every access
but ``GetOptionalInputTensor`` dereferences (see
:mod:`coralrt._model.optional_inputs`, which applies them, for the sources).
The structural checks are :mod:`coralrt._model.op_checks`', named by
``"module:name"`` (that module reads the specs, so this one does not import it).
"""

from __future__ import annotations

__all__ = ["validation_facts"]

# The LSTM input positions (lstm_shared.h) that may be omitted: the input gate
# of a CIFG LSTM (1, 5, 12), peepholes (9, 10, 11), projection (16, 17) and the
# layer-norm coefficients (20-23).  18 and 19 are the state, always present.
_LSTM = frozenset({1, 5, 9, 10, 11, 12, 16, 17, 20, 21, 22, 23})

# Builtin operators whose kernels read every input they are given.
_ALL_REQUIRED = """
    ABS ADD ADD_N ARG_MAX ARG_MIN ASSIGN_VARIABLE ATAN2 AVERAGE_POOL_2D BATCH_MATMUL
    BATCH_TO_SPACE_ND BITCAST BITWISE_XOR BROADCAST_ARGS BROADCAST_TO BUCKETIZE CALL_ONCE
    CAST CEIL COMPLEX_ABS CONCATENATION COS CUMSUM DENSIFY DEPTH_TO_SPACE DEQUANTIZE DILATE
    DIV DYNAMIC_UPDATE_SLICE ELU EMBEDDING_LOOKUP EMBEDDING_LOOKUP_SPARSE EQUAL EXP
    EXPAND_DIMS FAKE_QUANT FILL FLOOR FLOOR_DIV FLOOR_MOD GATHER GATHER_ND GELU GREATER
    GREATER_EQUAL HARD_SWISH HASHTABLE HASHTABLE_FIND HASHTABLE_IMPORT HASHTABLE_LOOKUP
    HASHTABLE_SIZE IMAG L2_NORMALIZATION L2_POOL_2D LEAKY_RELU LESS LESS_EQUAL
    LOCAL_RESPONSE_NORMALIZATION LOG LOGICAL_AND LOGICAL_NOT LOGICAL_OR LOGISTIC
    LOG_SOFTMAX LSH_PROJECTION MATRIX_DIAG MATRIX_SET_DIAG MAXIMUM MAX_POOL_2D MEAN MINIMUM
    MIRROR_PAD MUL MULTINOMIAL NEG NON_MAX_SUPPRESSION_V4 NON_MAX_SUPPRESSION_V5 NOT_EQUAL
    ONE_HOT PACK POW PRELU QUANTIZE RANDOM_STANDARD_NORMAL RANDOM_UNIFORM RANGE RANK
    READ_VARIABLE REAL REDUCE_ALL REDUCE_ANY REDUCE_MAX REDUCE_MIN REDUCE_PROD
    REDUCE_WINDOW RELU RELU6 RELU_0_TO_1 RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR
    RESIZE_NEAREST_NEIGHBOR REVERSE_SEQUENCE REVERSE_V2 RFFT2D RIGHT_SHIFT RNN ROUND RSQRT
    SCATTER_ND SEGMENT_SUM SELECT SELECT_V2 SHAPE SIGN SIN SKIP_GRAM SLICE SOFTMAX
    SPACE_TO_BATCH_ND SPACE_TO_DEPTH SPARSE_TO_DENSE SPLIT SPLIT_V SQRT SQUARE
    SQUARED_DIFFERENCE SQUEEZE STABLEHLO_ADD STABLEHLO_AND STABLEHLO_GATHER
    STABLEHLO_MAXIMUM STABLEHLO_MINIMUM STABLEHLO_MULTIPLY STABLEHLO_PAD
    STABLEHLO_REDUCE_WINDOW STABLEHLO_RNG_BIT_GENERATOR STABLEHLO_SCATTER
    STABLEHLO_SHIFT_LEFT STRIDED_SLICE SUB SUM TANH TILE TOPK_V2 TRANSPOSE
    UNIDIRECTIONAL_SEQUENCE_RNN UNIQUE UNPACK UNSORTED_SEGMENT_MAX UNSORTED_SEGMENT_MIN
    UNSORTED_SEGMENT_PROD UNSORTED_SEGMENT_SUM VAR_HANDLE WHERE WHILE ZEROS_LIKE
""".split()

#: Builtin operator name -> input positions that may be -1.  RESHAPE's shape
#: (input 1) may be left out by giving one input, but not set to -1.
OPTIONAL_INPUTS: dict[str, frozenset[int]] = {
    **dict.fromkeys(_ALL_REQUIRED, frozenset()),
    # CONV_2D and DEPTHWISE_CONV_2D may have two inputs, but a third set to -1
    # is refused by both of LiteRT's kernel sets, every type ("Tensor at index
    # 2 was optional but was expected", a clean error): refused here too, so
    # that the simulator and the numpy backend do not run what LiteRT refuses.
    "CONV_2D": frozenset(),
    "DEPTHWISE_CONV_2D": frozenset(),
    "FULLY_CONNECTED": frozenset({2}),        # bias
    "TRANSPOSE_CONV": frozenset({3}),         # bias
    "CONV_3D": frozenset({2}),                # bias
    "CONV_3D_TRANSPOSE": frozenset({3}),      # bias
    "SVDF": frozenset({3}),                   # bias
    "PAD": frozenset({2}),                    # constant_values
    "PADV2": frozenset({2}),                  # constant_values
    "LSTM": _LSTM,
    "UNIDIRECTIONAL_SEQUENCE_LSTM": _LSTM,
    # Forward LSTM 1-17, backward 18-34 (the same roles shifted by 17), states
    # 35-38, aux input 39 and aux weights 40-47.
    "BIDIRECTIONAL_SEQUENCE_LSTM": _LSTM.difference({20, 21, 22, 23}) | {
        i + 17 for i in _LSTM if i < 18} | set(range(39, 48)),
    "BIDIRECTIONAL_SEQUENCE_RNN": frozenset({9, 10, 11}),  # aux input and weights
    # IF: input 0 is the condition; input k feeds input k-1 of both branches and
    # may be -1 only when neither branch uses that input (see _if_branch_unused).
    "IF": frozenset(),
}

#: Operator -> {position: alternatives}: the input may be -1 only when, for one
#: alternative, every position it lists is -1 too.  The kernels dereference
#: these inputs when the gate they belong to is in use.
ONLY_WITH: dict[str, dict[int, tuple[tuple[int, ...], ...]]] = {
    # The input-gate bias of an LSTM with an input gate (input-to-input weights
    # present): CheckInputTensorDimensions reads its dims without a null check.
    "LSTM": {12: ((1,),)},
    "UNIDIRECTIONAL_SEQUENCE_LSTM": {12: ((1,),)},
    # The same per direction; the aux input-to-input weights are read when
    # there is an aux input (aux input-to-forget weights present) and an input gate.
    "BIDIRECTIONAL_SEQUENCE_LSTM": {12: ((1,),), 29: ((18,),), 40: ((1,), (41,)),
                                    44: ((18,), (41,))},
    # The aux input is read whenever the forward aux weights are present.
    "BIDIRECTIONAL_SEQUENCE_RNN": {9: ((10,),)},
}

# Fewest inputs each LiteRT kernel takes (its NumInputs check), by count.
_MIN_BY_COUNT = {
    1: """ABS AVERAGE_POOL_2D BITCAST BUCKETIZE CAST CEIL COMPLEX_ABS CONCATENATION COS DENSIFY
          DEPTH_TO_SPACE DEQUANTIZE ELU EXP FAKE_QUANT FLOOR GELU HARD_SWISH HASHTABLE_SIZE IF
          IMAG L2_NORMALIZATION L2_POOL_2D LEAKY_RELU LOCAL_RESPONSE_NORMALIZATION LOG
          LOGICAL_NOT LOGISTIC LOG_SOFTMAX MATRIX_DIAG MAX_POOL_2D NEG PACK QUANTIZE
          RANDOM_STANDARD_NORMAL RANDOM_UNIFORM RANK READ_VARIABLE REAL RELU RELU6 RELU_0_TO_1
          RELU_N1_TO_1 RESHAPE ROUND RSQRT SHAPE SIGN SIN SKIP_GRAM SOFTMAX SPACE_TO_DEPTH SQRT
          SQUARE SQUEEZE STABLEHLO_RNG_BIT_GENERATOR TANH UNIQUE UNPACK WHERE ZEROS_LIKE""",
    2: """ADD ADD_N ARG_MAX ARG_MIN ASSIGN_VARIABLE ATAN2 BATCH_MATMUL BITWISE_XOR BROADCAST_ARGS
          BROADCAST_TO CONV_2D CONV_3D CUMSUM DEPTHWISE_CONV_2D DIV EMBEDDING_LOOKUP EQUAL
          EXPAND_DIMS FILL
          FLOOR_DIV FLOOR_MOD FULLY_CONNECTED GATHER GATHER_ND GREATER GREATER_EQUAL LESS
          LESS_EQUAL LOGICAL_AND LOGICAL_OR LSH_PROJECTION MATRIX_SET_DIAG MAXIMUM MEAN MINIMUM
          MIRROR_PAD MUL MULTINOMIAL NOT_EQUAL PAD PADV2 POW PRELU REDUCE_ALL REDUCE_ANY
          REDUCE_MAX REDUCE_MIN REDUCE_PROD RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR
          REVERSE_SEQUENCE REVERSE_V2 RFFT2D RIGHT_SHIFT SEGMENT_SUM SPLIT SQUARED_DIFFERENCE
          STABLEHLO_ADD STABLEHLO_AND STABLEHLO_GATHER STABLEHLO_MAXIMUM STABLEHLO_MINIMUM
          STABLEHLO_MULTIPLY STABLEHLO_PAD STABLEHLO_REDUCE_WINDOW STABLEHLO_SHIFT_LEFT SUB SUM
          TILE TOPK_V2 TRANSPOSE""",
    3: """BATCH_TO_SPACE_ND CONV_3D_TRANSPOSE DILATE DYNAMIC_UPDATE_SLICE
          HASHTABLE_FIND HASHTABLE_IMPORT HASHTABLE_LOOKUP RANGE SCATTER_ND SELECT SELECT_V2
          SLICE SPACE_TO_BATCH_ND SPLIT_V STABLEHLO_SCATTER TRANSPOSE_CONV UNSORTED_SEGMENT_MAX
          UNSORTED_SEGMENT_MIN UNSORTED_SEGMENT_PROD UNSORTED_SEGMENT_SUM""",
    4: "ONE_HOT SPARSE_TO_DENSE STRIDED_SLICE",
    5: """EMBEDDING_LOOKUP_SPARSE LSTM NON_MAX_SUPPRESSION_V4 REDUCE_WINDOW RNN SVDF
          UNIDIRECTIONAL_SEQUENCE_RNN""",
    6: "NON_MAX_SUPPRESSION_V5",
    12: "BIDIRECTIONAL_SEQUENCE_RNN",
    20: "UNIDIRECTIONAL_SEQUENCE_LSTM",
    48: "BIDIRECTIONAL_SEQUENCE_LSTM",
}

#: Operator -> fewest inputs it may have.  The kernels check their input
#: count and refuse too few with an error; coralrt refuses them here, before
#: its own partitioner and simulator index the missing inputs.
#: DEPTHWISE_CONV_2D may leave out its bias: LiteRT's reference kernels and the
#: simulated Edge TPU run it, so rejecting it here would be a false rejection,
#: although the optimized kernels (XNNPACK for float, the built-in optimized
#: ones for uint8/int8) crash on it with SIGSEGV; that guard belongs where the
#: kernel set is known (the CPU backend's load).
MIN_INPUTS: dict[str, int] = {
    name: n for n, names in _MIN_BY_COUNT.items() for name in names.split()}


#: Operator -> (option, "inputs" or "outputs"): options that must equal a count
#: of the operator's tensors.  SPLIT: crash (the XNNPACK delegate visits
#: num_splits outputs, SIGSEGV); the others: LiteRT refuses too (pack.cc,
#: unpack.cc, split_v.cc check the count).
COUNT_OPTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "SPLIT": (("num_splits", "outputs"),), "SPLIT_V": (("num_splits", "outputs"),),
    "PACK": (("values_count", "inputs"),), "UNPACK": (("num", "outputs"),),
}


# Broadcasting binary operators, and those of them (per input type) that run
# a broadcast of any rank when the shapes differ only by leading 1s (their
# kernels compare the shapes padded to one rank first and find no broadcast).
BROADCASTING = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE",
                 "FLOOR_DIV", "FLOOR_MOD", "POW", "EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL",
                 "GREATER", "GREATER_EQUAL", "PRELU", "LOGICAL_AND", "LOGICAL_OR",
                 "RIGHT_SHIFT", "BITWISE_XOR")
_SAME_SHAPE = ("QUANTIZE", "DEQUANTIZE", "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1",
               "LOGISTIC", "TANH", "HARD_SWISH", "SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION",
               "ABS", "NEG", "RSQRT", "SQRT", "EXP", "LOG", "ELU", "LEAKY_RELU", "GELU",
               "FLOOR", "CEIL", "ROUND", "SIN", "COS", "SQUARE", "SIGN", "CAST")
_BROADCAST = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE",
              "FLOOR_DIV", "FLOOR_MOD", "POW")


_CHECKS = "coralrt._model.op_checks:"
_CHECK_GROUPS = (
    (BROADCASTING, _CHECKS + "broadcast_rank"),
    (_SAME_SHAPE, _CHECKS + "same_shape"),
    (_BROADCAST, _CHECKS + "broadcast"),       # later groups win: ADD gets broadcast
    (("RESHAPE",), _CHECKS + "reshape"),
    (("FULLY_CONNECTED",), _CHECKS + "fully_connected"),
    (("CONCATENATION",), _CHECKS + "concatenation"),
    (("LSTM",), _CHECKS + "integer_lstm"),
    (("UNIDIRECTIONAL_SEQUENCE_LSTM",), _CHECKS + "sequence_lstm"),
)

#: Operators whose kernel writes output 0 with an input's type (or, for the
#: LSTM, its arithmetic's) into a buffer sized by the output's own type (see
#: coralrt._model.io_checks for what each mismatch does: buffer overflow,
#: unwritten bytes or reinterpreted bits).
_IO = "coralrt._model.io_checks:"
IO_CHECKS: dict[str, str] = {
    **dict.fromkeys(("RESHAPE", "SQUEEZE", "SUM", "MEAN", "REDUCE_MAX", "REDUCE_MIN",
                     "REDUCE_PROD", "CUMSUM", "SEGMENT_SUM", "UNSORTED_SEGMENT_SUM",
                     "UNSORTED_SEGMENT_MAX", "UNSORTED_SEGMENT_MIN", "UNSORTED_SEGMENT_PROD"),
                    _IO + "output_has_input_type"),
    "EMBEDDING_LOOKUP": _IO + "embedding_lookup",
    "UNIDIRECTIONAL_SEQUENCE_LSTM": _IO + "sequence_lstm",
    # These check their types themselves; the same check refuses the model on
    # every target (coralrt's kernels would run it).
    **dict.fromkeys(("CONV_2D", "DEPTHWISE_CONV_2D"), _IO + "convolution"),
    "FULLY_CONNECTED": _IO + "weights",
    "CONCATENATION": _IO + "concatenation",
}


#: Operator -> the type its kernel gives output 0 while it prepares, whatever
#: the file declares: the type of one input (an input position) or a type
#: name.  add.cc, sub.cc, div.cc, squared_difference.cc (input 1),
#: maximum_minimum.cc, activations.cc (PRELU), add_n.cc, bitwise_xor.cc,
#: right_shift.cc, ceil.cc, floor.cc, round.cc, exp.cc, neg.cc,
#: expand_dims.cc, gather.cc, resize_bilinear.cc, resize_nearest_neighbor.cc,
#: zeros_like.cc (input 0), select.cc (input 1), comparisons.cc (BOOL).  The
#: quantization checks (coralrt._model.quant_checks) see later operators'
#: inputs with these types.
OUTPUT_TYPE_FROM: dict[str, int | str] = {
    **dict.fromkeys(("ADD", "SUB", "DIV", "SQUARED_DIFFERENCE", "SELECT", "SELECT_V2"), 1),
    **dict.fromkeys(("MAXIMUM", "MINIMUM", "PRELU", "ADD_N", "BITWISE_XOR", "RIGHT_SHIFT",
                     "CEIL", "FLOOR", "ROUND", "EXP", "NEG", "EXPAND_DIMS", "GATHER",
                     "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "ZEROS_LIKE"), 0),
    **dict.fromkeys(("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL"),
                    "BOOL"),
}


def validation_facts() -> dict[str, dict]:
    """Operator name -> the validation fields of its spec (``min_inputs``,
    ``optional_inputs``, ``only_with``, ``count_options``, ``validate``,
    ``output_type_from``, ``io_check``), for every operator LiteRT's facts cover."""
    facts: dict[str, dict] = {}
    for name, optional in OPTIONAL_INPUTS.items():
        facts.setdefault(name, {})["optional_inputs"] = optional
    for name, rules in ONLY_WITH.items():
        facts.setdefault(name, {})["only_with"] = rules
    for name, n in MIN_INPUTS.items():
        facts.setdefault(name, {})["min_inputs"] = n
    for name, rules in COUNT_OPTIONS.items():
        facts.setdefault(name, {})["count_options"] = rules
    for names, check in _CHECK_GROUPS:
        for name in names:
            facts.setdefault(name, {})["validate"] = check
    for name, source in OUTPUT_TYPE_FROM.items():
        facts.setdefault(name, {})["output_type_from"] = source
    for name, check in IO_CHECKS.items():
        facts.setdefault(name, {})["io_check"] = check
    return facts
