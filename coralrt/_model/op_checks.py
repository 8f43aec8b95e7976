"""Per-operator structural checks for builtin operators whose native kernels
trust their operands (found by fuzzing LiteRT with damaged real models).

Each check takes the subgraph, the operator and a place name, and raises
:class:`~coralrt.errors.ModelError` when the operator cannot be prepared
safely.  The operator specs (:mod:`coralrt._ops`, their ``validate`` field,
filled from :mod:`coralrt._ops.litert`) say which check guards which
operator, and broadcast_rank reads their ``padded_rank_aborts``.  As in
validate.py, each comment says whether LiteRT crashes on what the check
refuses (and where), refuses it too, or would run it without a right answer
(or coralrt depends on it).
"""

from __future__ import annotations

import math

import numpy as np

from coralrt.errors import ModelError
from coralrt._model.types import Operator, Subgraph, Tensor
from coralrt._ops import builtin_specs

__all__ = ["MAX_RANK", "reshape", "fully_connected", "concatenation", "integer_lstm",
           "sequence_lstm", "broadcast_rank", "same_shape", "broadcast", "declared_agrees"]

# The most dimensions a NumPy array holds (NPY_MAXDIMS: 32 before NumPy 2,
# 64 since); coralrt and LiteRT's Python API hold tensors in NumPy arrays.
MAX_RANK = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32


class _BadSparsity(Exception):
    pass


def _densify(t: Tensor, limit: int) -> list[int]:
    """The dense value of the sparse constant ``t`` as TFLite defines it
    (``FormatConverter::SparseToDense`` in sparsity_format_converter.cc),
    reading at most ``limit`` stored values.  Raises _BadSparsity when the
    parameters do not describe a tensor of its shape."""
    sp = t.extra["sparsity"]
    stored = np.frombuffer(t.buffer.data, np.dtype(t.dtype).newbyteorder("<"),
                           count=t.buffer.nbytes // t.dtype.itemsize)
    shape, rank = [int(d) for d in t.shape], len(t.shape)
    order = [int(i) for i in sp.get("traversal_order", ())]
    block_map = [int(i) for i in sp.get("block_map", ())]
    meta = list(sp.get("dim_metadata") or ())
    if (len(order) != len(meta) or len(order) != rank + len(block_map)
            or sorted(order) != list(range(len(order)))
            or len(set(block_map)) != len(block_map) or any(not 0 <= b < rank for b in block_map)
            or any(not 0 <= int(m.get("dense_size", 0)) <= math.prod(shape) for m in meta)):
        raise _BadSparsity("traversal order, block map and dimension metadata disagree")
    block = [max(int(meta[order[rank + j]].get("dense_size", 0)), 1)
             for j in range(len(block_map))]
    dense = [0] * math.prod(shape)
    taken = 0

    def leaf(idx: list[int]) -> None:
        nonlocal taken
        orig = [0] * rank
        for level in range(rank):
            orig[order[level]] = idx[level]
        for level in range(rank, len(idx)):
            b = order[level] - rank
            orig[block_map[b]] = orig[block_map[b]] * block[b] + idx[level]
        if taken >= min(limit, stored.size) or any(
                not 0 <= i < d for i, d in zip(orig, shape)):
            raise _BadSparsity("it addresses values outside the tensor or its data")
        flat = 0
        for i, d in zip(orig, shape):
            flat = flat * d + i
        dense[flat] = int(stored[taken])
        taken += 1

    def walk(level: int, prev: int, idx: list[int]) -> None:
        if level == len(meta):
            leaf(idx)
            return
        m = meta[level]
        if m.get("format", 0) == 0:  # DENSE
            size = int(m.get("dense_size", 0))
            for i in range(size):
                walk(level + 1, prev * size + i, idx + [i])
            return
        segments = (m.get("array_segments") or {}).get("values", ())
        indices = (m.get("array_indices") or {}).get("values", ())
        if prev + 1 < len(segments):
            for i in range(max(int(segments[prev]), 0), min(int(segments[prev + 1]),
                                                             len(indices))):
                walk(level + 1, i, idx + [int(indices[i])])

    walk(0, 0, [])
    return dense


def _sparse_shape(t: Tensor, where: str) -> list[int]:
    # TFLite's RESHAPE never densifies its shape operand: it reads the stored
    # values as if they were dense.  That is right only when the encoding keeps
    # every value in order; otherwise the kernel reads past the data (crash:
    # an out-of-bounds read) or reshapes to a shape the model does not mean
    # (coralrt: a wrong answer).
    n = t.shape[0] if t.shape else 1
    if n > MAX_RANK:
        raise ModelError(f"RESHAPE to rank {n} exceeds {MAX_RANK}, the most dimensions a "
                         f"NumPy array holds", where=where)
    kept = t.buffer.nbytes // t.dtype.itemsize
    if kept < n:
        raise ModelError(f"RESHAPE shape operand is sparse and stores {kept} of its {n} "
                         f"values; TFLite's RESHAPE reads it as dense and would read past "
                         f"its data", where=where)
    try:
        dense = _densify(t, n)
    except _BadSparsity as e:
        raise ModelError(f"RESHAPE shape operand has invalid sparsity parameters: {e}",
                         where=where) from None
    read = [int(d) for d in np.frombuffer(t.buffer.data, np.dtype(t.dtype).newbyteorder("<"),
                                          count=n)]
    if read != dense:
        raise ModelError(f"RESHAPE shape operand is sparse with value {dense}, but TFLite's "
                         f"RESHAPE reads its stored values {read} as dense", where=where)
    return dense


def _reshape_target(sg: Subgraph, op: Operator, where: str) -> list[int] | None:
    """The shape LiteRT's RESHAPE (reshape.cc, GetOutputShape) reshapes to, when
    it is known before the model runs: its shape operand if that is a 1-D INT32
    tensor, else the new_shape option.  None when it is computed at run time,
    or when neither names one and the shape operand is constant or absent (the
    builtin kernel then makes a scalar, the XNNPACK delegate uses the declared
    output shape); a scalar when neither names one and the shape operand is
    computed at run time (the output is then dynamic and no delegate takes it)."""
    shape_t = sg.tensors[op.inputs[1]] if len(op.inputs) == 2 and op.inputs[1] >= 0 else None
    if shape_t is not None and len(shape_t.shape) == 1 and shape_t.type_name == "INT32":
        if not shape_t.is_constant:
            return None  # computed at run time; the kernel checks it then
        if shape_t.extra.get("sparsity"):
            return _sparse_shape(shape_t, where)
        return [int(d) for d in shape_t.data.reshape(-1)]
    new_shape = [int(d) for d in op.options.get("new_shape") or []]
    if not new_shape:
        # A shape operand computed at run time makes the output dynamic, which
        # the XNNPACK delegate never takes: the builtin kernel makes a scalar.
        dynamic = shape_t is not None and not shape_t.is_constant
        return [] if dynamic else None
    # A new_shape of [0] means a scalar in old files (reshape.cc, GetOutputShapeFromParam).
    return [] if new_shape == [0] else new_shape


def _reshape_resolves(in_shape, target: list[int]) -> bool:
    # reshape_utils.h, ResolveOutputShape: at most one -1, no other negative
    # dimension; the -1 takes the quotient of the non-zero element counts (0
    # when the input is empty and the rest is not); the counts must agree.
    if target.count(-1) > 1 or any(d < -1 for d in target):
        return False
    n_in = math.prod(in_shape)
    n_out = math.prod(d for d in target if d != -1)
    if -1 in target:
        nonzero_out = math.prod(d for d in target if d not in (0, -1))
        inferred = 0 if n_in == 0 and n_out != 0 else \
            math.prod(d for d in in_shape if d != 0) // nonzero_out
        if inferred > 2**31 - 1:
            return False
        n_out *= inferred
    return n_out == n_in


def reshape(sg: Subgraph, op: Operator, where: str) -> None:
    # LiteRT refuses too: reshape.cc takes one or two inputs.
    if not op.inputs or op.inputs[0] < 0 or not op.outputs or len(op.inputs) > 2:
        raise ModelError("RESHAPE needs an input (and at most a shape operand) and an "
                         "output", where=where)
    target = _reshape_target(sg, op, where)
    if target is None:
        return
    # coralrt: the output tensor has this many dimensions.
    if len(target) > MAX_RANK:
        raise ModelError(f"RESHAPE to rank {len(target)} exceeds {MAX_RANK}, the most "
                         f"dimensions a NumPy array holds", where=where)
    # LiteRT refuses too ("num_input_elements != num_output_elements" and the
    # other ResolveOutputShape errors).  The XNNPACK delegate reads a 0 in the
    # target as "keep the input's dimension" and runs some of these; TFLite's
    # definition (a dimension of size 0) is the builtin kernel's.
    in_shape = sg.tensors[op.inputs[0]].shape
    if not _reshape_resolves(in_shape, target):
        raise ModelError(f"RESHAPE of {math.prod(in_shape)} elements to {target}",
                         where=where)


def fully_connected(sg: Subgraph, op: Operator, where: str) -> None:
    if len(op.inputs) < 2 or min(op.inputs[:2]) < 0 or not op.outputs:
        raise ModelError("FULLY_CONNECTED needs an input, weights and an output", where=where)
    x, w = sg.tensors[op.inputs[0]], sg.tensors[op.inputs[1]]
    # LiteRT refuses too: fully_connected.cc, TF_LITE_ENSURE_EQ(NumDimensions(filter), 2).
    if len(w.shape) != 2:
        raise ModelError(f"FULLY_CONNECTED weights of shape {list(w.shape)} are not 2-D",
                         where=where)
    n_in, (units, depth) = math.prod(x.shape), w.shape
    if depth == 0:
        # fully_connected.cc sizes the output from the input's outer
        # dimensions when the weights have no columns, and runs.
        batch = math.prod(x.shape[:-1])
    else:
        # coralrt: XNNPACK refuses an input that is not a whole number of rows
        # and the reference kernel drops the remainder; the simulator and the
        # partitioner take the input as rows of the weights' depth.
        if n_in % depth:
            raise ModelError(f"FULLY_CONNECTED input of {n_in} elements is not a multiple of "
                             f"the weights' depth {depth}", where=where)
        batch = n_in // depth
    # coralrt: LiteRT sizes the output itself (from the input batch); the
    # simulator and the partitioner plan from the declared shape, which must agree.
    out_t = sg.tensors[op.outputs[0]]
    n_out = math.prod(out_t.shape)
    dynamic = bool(out_t.shape_signature) and -1 in out_t.shape_signature
    if n_out != batch * units and not dynamic:
        raise ModelError(f"FULLY_CONNECTED output of {n_out} elements, but {n_in} inputs and "
                         f"{units}x{depth} weights give {batch * units}", where=where)


def sequence_lstm(sg: Subgraph, op: Operator, where: str) -> None:
    if len(op.inputs) < 20 or op.inputs[0] < 0 or op.inputs[18] < 0 or not op.outputs:
        raise ModelError("UNIDIRECTIONAL_SEQUENCE_LSTM needs 20+ inputs with an input and an "
                         "output state", where=where)
    x, state = sg.tensors[op.inputs[0]], sg.tensors[op.inputs[18]]
    out = sg.tensors[op.outputs[0]]
    # LiteRT refuses an input that is not 3-D and a state of the wrong size;
    # it sizes the output itself, which coralrt (declared shapes) must agree with.
    if len(x.shape) != 3 or len(out.shape) != 3 or out.shape[:2] != x.shape[:2] \
            or not state.shape or out.shape[2] != state.shape[-1]:
        raise ModelError(f"UNIDIRECTIONAL_SEQUENCE_LSTM input {list(x.shape)}, output "
                         f"{list(out.shape)} and state {list(state.shape)} disagree", where=where)
    # Crash (fewer rows) and coralrt (more rows): unidirectional_sequence_lstm.cc
    # checks only the columns of the recurrent-to-forget and recurrent-to-cell
    # weights, then reads n_cell rows of them (n_cell: the rows of the
    # input-to-output weights): past the end of a smaller tensor (garbage or
    # SIGSEGV); of a larger one it ignores the rest, which the simulator's
    # LSTM (one matrix of all gates) cannot do.
    cells = sg.tensors[op.inputs[4]].shape
    for k, role in ((6, "recurrent-to-forget"), (7, "recurrent-to-cell")):
        rows = sg.tensors[op.inputs[k]].shape
        if len(cells) == 2 and rows and rows[0] != cells[0]:
            raise ModelError(f"UNIDIRECTIONAL_SEQUENCE_LSTM {role} weights of shape "
                             f"{list(rows)} do not have the {cells[0]} rows (cells) of the "
                             f"input-to-output weights", where=where)
    # coralrt: the integer kernel (lstm_eval.cc) writes the output with the
    # output state's scale and zero point and never reads the output's own, so
    # an output declaring others would be mislabelled (a wrong answer).
    qs, qo = state.quantization, out.quantization
    if x.type_name == "INT8" and qs is not None and qo is not None and (
            qs.params != qo.params):
        raise ModelError("UNIDIRECTIONAL_SEQUENCE_LSTM output state and output must share "
                         "their quantization", where=where)
    integer_lstm(sg, op, where)


def _zero_point(sg: Subgraph, i: int) -> int:
    q = sg.tensors[i].quantization
    return int(q.zero_point[0]) if q is not None and q.zero_point.size else 0


def integer_lstm(sg: Subgraph, op: Operator, where: str) -> None:
    # With INT8 activations the kernel precomputes zero_point * weights + bias
    # at prepare time (PopulatePrecomputedZPTimesWeightsWithBias), before any
    # tensor but a constant has memory: a non-constant operand it reads there
    # crashes it (SIGSEGV).  It reads a weight matrix when the matching zero
    # point is not 0, and the bias paired with a present weight matrix (gate
    # biases only without layer normalization).
    ins = op.inputs
    if len(ins) < 20 or ins[0] < 0 or sg.tensors[ins[0]].type_name != "INT8":
        return
    layer_norm = len(ins) == 24 and ins[21] >= 0
    hidden = (_zero_point(sg, op.intermediates[4]) if len(op.intermediates) == 5 else 0)
    gate_biases = (None,) * 4 if layer_norm else (12, 13, 14, 15)
    for weights, point, biases in (((1, 2, 3, 4), _zero_point(sg, ins[0]), gate_biases),
                                   ((5, 6, 7, 8), _zero_point(sg, ins[18]), (None,) * 4),
                                   ((16,), hidden, (17,))):
        for w, b in zip(weights, biases):
            if ins[w] < 0:
                continue
            read = ([w] if point else []) + ([b] if b is not None and ins[b] >= 0 else [])
            for k in read:
                if not sg.tensors[ins[k]].is_constant:
                    raise ModelError(f"input {k} of the INT8 {op.name} is not a constant; the "
                                     f"kernel reads it before the model runs", where=where)


def declared_agrees(t, want) -> bool:
    """Whether tensor ``t`` as the file declares it agrees with ``want``, the shape
    the kernel computes, the way LiteRT sees it: a dimension that is -1 in
    ``t.shape_signature`` is not compared (LiteRT resizes the tensor to the
    computed shape while preparing, whatever the file wrote there; such a
    tensor never maps to the Edge TPU, whose rules ask for static shapes)."""
    shape, want = tuple(t.shape), tuple(want)
    if shape == want:
        return True
    sig = t.shape_signature
    if not sig or -1 not in sig or not len(sig) == len(shape) == len(want):
        return False
    return all(s == -1 or d == w for d, s, w in zip(shape, sig, want))


def same_shape(sg: Subgraph, op: Operator, where: str) -> None:
    # coralrt: LiteRT's kernels size their output from the input at prepare
    # time (so LiteRT itself runs a file whose declared shape disagrees), but
    # coralrt's partitioner and simulator plan every later operator from the
    # declared sizes, which the kernels will not produce.
    if not op.inputs or op.inputs[0] < 0 or not op.outputs:
        raise ModelError(f"{op.name} needs an input and an output", where=where)
    a, b = sg.tensors[op.inputs[0]].shape, sg.tensors[op.outputs[0]].shape
    if not declared_agrees(sg.tensors[op.outputs[0]], a):
        raise ModelError(f"{op.name} output shape {list(b)} differs from its input shape "
                         f"{list(a)}", where=where)


# The binary operators that broadcast are those whose spec names broadcast_rank
# or broadcast (coralrt/_ops/litert.py); those of them whose kernels compare
# the shapes padded to one rank first (and find no broadcast when the shapes
# differ only by leading 1s) set padded_rank_aborts in their spec: the input
# types for which they abort all the same.
_MAX_BROADCAST_RANK = 8


def broadcast_rank(sg: Subgraph, op: Operator, where: str) -> None:
    # Crash: the broadcasting loops (internal/reference/broadcast_loop.h,
    # BroadcastBinaryOpSimple, and the kernels built on it) abort with
    # TFLITE_CHECK_LE(dims_count, kMaxRank = 8) when the inputs' shapes differ
    # and the larger rank exceeds 8 (SIGABRT; measured for each operator and
    # type with the default and the reference kernels).  Equal shapes of
    # any rank run; so do shapes equal up to leading 1s for the operators
    # whose spec sets padded_rank_aborts, but for the input types it lists.
    if len(op.inputs) < 2 or min(op.inputs[:2]) < 0:
        return
    a, b = (sg.tensors[i] for i in op.inputs[:2])
    rank = max(len(a.shape), len(b.shape))
    if a.shape == b.shape or rank <= _MAX_BROADCAST_RANK:
        return
    pad = lambda s: (1,) * (rank - len(s)) + tuple(s)  # noqa: E731
    spec = builtin_specs().get(op.name)
    aborting = spec.padded_rank_aborts if spec is not None else None
    if aborting is not None and pad(a.shape) == pad(b.shape) and a.type_name not in aborting:
        return
    raise ModelError(f"{op.name} broadcasts inputs of shapes {list(a.shape)} and "
                     f"{list(b.shape)} at rank {rank}; LiteRT's broadcasting kernels abort "
                     f"above rank {_MAX_BROADCAST_RANK}", where=where)


def broadcast(sg: Subgraph, op: Operator, where: str) -> None:
    if len(op.inputs) != 2 or min(op.inputs) < 0 or not op.outputs:
        raise ModelError(f"{op.name} needs two inputs and an output", where=where)
    broadcast_rank(sg, op, where)
    a, b = (sg.tensors[i].shape for i in op.inputs)
    # LiteRT refuses too ("Given shapes ... are not broadcastable").
    try:
        want = tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError:
        raise ModelError(f"{op.name} input shapes {list(a)} and {list(b)} do not broadcast",
                         where=where) from None
    # coralrt: as for same_shape, the declared output must be what the kernel makes.
    out = sg.tensors[op.outputs[0]].shape
    if not declared_agrees(sg.tensors[op.outputs[0]], want):
        raise ModelError(f"{op.name} output shape {list(out)} is not the broadcast shape "
                         f"{list(want)} of its inputs", where=where)


def concatenation(sg: Subgraph, op: Operator, where: str) -> None:
    # coralrt, like same_shape: the kernel sizes its output from the inputs,
    # so a declared output of another size misplans every later operator (the
    # simulated Edge TPU ran a segment built on the declared sizes and never
    # answered; found by fuzzing).
    if not op.inputs or min(op.inputs) < 0 or not op.outputs:
        return  # check_omitted_inputs has rejected these
    shapes = [sg.tensors[i].shape for i in op.inputs]
    rank = len(shapes[0])
    axis = op.options.get("axis", 0)
    axis = axis + rank if axis < 0 else axis
    # LiteRT refuses these too while preparing (concatenation.cc: the axis
    # within the first input's rank, every input of that rank and equal to it
    # outside the axis), a clean error the numpy backend and the simulator
    # would only meet when they run.
    if not rank or not 0 <= axis < rank:
        raise ModelError(f"CONCATENATION axis {op.options.get('axis', 0)} is outside the "
                         f"first input's rank {rank}", where=where)
    for k, s in enumerate(shapes):
        if len(s) != rank or s[:axis] + s[axis + 1:] != shapes[0][:axis] + shapes[0][axis + 1:]:
            raise ModelError(f"CONCATENATION input {k} has shape {list(s)}, which does not "
                             f"match input 0's {list(shapes[0])} outside axis {axis}",
                             where=where)
    want = shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]
    out = sg.tensors[op.outputs[0]].shape
    if not declared_agrees(sg.tensors[op.outputs[0]], want):
        raise ModelError(f"CONCATENATION output shape {list(out)} is not {list(want)}, the "
                         f"concatenation of its inputs along axis {axis}", where=where)
