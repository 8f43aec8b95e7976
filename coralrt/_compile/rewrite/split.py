"""The ``split_wide`` and ``split_embedding`` rewrites: cut layers and embedding
outputs too wide for the Edge TPU along their last axis, and concatenate.

``split_wide``
--------------
When: a CONV_2D or FULLY_CONNECTED with 8-bit activations and constant 8-bit
weights (bias constant or absent; FC weights in the default format) whose
output width, the last dimension k, exceeds
:func:`coralrt._ops.width.width_limit` (5376, or 2728 when the layer feeds a
GELU); the Edge TPU compiler does not fit such layers on chip
(``layer_width``).  What: p = ceil(k / limit) copies of the operator, each with
its slice of the output channels: the rows of the weights (axis 0 in both
layouts), of the bias, and of any per-channel scales (per-tensor quantization
stays as it is), every part writing the original output quantization; then a
CONCATENATION along the last axis into the original output tensor.  The parts
are equal when p divides k, otherwise as equal as possible (the first k mod p
parts one channel wider).

GELU: when the layer's output is read by one builtin GELU operator and by
nothing else (and is not a model output), the GELU is applied per part as
well: one GELU per part (output quantized as the GELU's output) and the
concatenation joins the GELU outputs, so each part's activation (and the
I-GELU a later approximation would build from it) stays small.  When the GELU
is already an I-GELU chain (MUL/TANH/... built by the ``gelu`` rewrite, or a
tanh-form GELU from a converter) the layer is split and concatenated in front
of the chain, which is left as it is.  The limit is then the GELU one all the
same (``width_limit``), as the chain still follows the layer.

Exact: every output channel of a convolution or FC depends only on its own
row of weights, its own bias and its own scale, so a part computes exactly
the channels it is given; GELU acts on each value alone; and CONCATENATION of
inputs quantized like its output copies bytes.

``split_embedding``
-------------------
When: a GATHER (axis 0, no batch dimensions) or EMBEDDING_LOOKUP with a
constant 8-bit table and an 8-bit output whose last dimension w exceeds
:data:`coralrt._ops.width.INPUT_WIDTH_LIMIT` (512), and read by at least one
operator the Edge TPU maps.  The lookup itself stays on the CPU, so its output
is an Edge TPU input, and inputs that wide did not compile in the
Transformers-on-Edge-TPU study (BERT-Base's 768 had to be split).  What: p =
ceil(w / 512) lookups, each on a slice of the table's columns (equal parts,
as equal as possible when p does not divide w), with the same indices, and a
CONCATENATION along the last axis into the original output tensor; the
CONCATENATION maps, so the CPU hands the Edge TPU p narrower inputs.

Exact: a lookup copies table rows; copying the column slices and
concatenating them copies the same bytes.

CONCATENATION is version 2 for int8 and 1 for uint8 (the Edge TPU takes up to
3) and has no constant inputs, so ``concat_constants`` never applies.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from coralrt._ops.checks import OpView
from coralrt._ops.width import INPUT_WIDTH_LIMIT, width_limit
from coralrt._compile.rewrite.base import RewriteRecord
from coralrt._compile.rewrite.fc_conv import is_eight_bit, quant_kwargs
from coralrt._compile.rules import default_rules

__all__ = ["SplitWide", "SplitEmbedding", "SPLIT_WIDE", "SPLIT_EMBEDDING", "part_sizes"]


def part_sizes(width: int, parts: int) -> list[int]:
    """``width`` cut into ``parts`` sizes, equal or the first ones one wider."""
    base, extra = divmod(width, parts)
    return [base + (1 if j < extra else 0) for j in range(parts)]


def _sizes_text(sizes: list[int]) -> str:
    if len(set(sizes)) == 1:
        return f"{len(sizes)} parts of {sizes[0]}"
    return f"{len(sizes)} parts of {max(sizes)}/{min(sizes)} (as equal as possible)"


def _shape_text(shape) -> str:
    dims = [d for d in shape[:-1] if d != 1] + [shape[-1]]
    return "x".join(str(d) for d in dims)


def _concat(editor, parts: list[int], out: int):
    rank = len(editor.tensor(out).shape)
    version = 2 if editor.tensor(out).type_name == "INT8" else 1
    return editor.make_op("CONCATENATION", parts, [out], version=version, axis=rank - 1,
                          fused_activation_function="NONE")


def _copy_op(op, inputs, outputs):
    """``op`` (code, version, options) on other tensors."""
    new = copy.copy(op)
    new.inputs, new.outputs, new.intermediates = list(inputs), list(outputs), []
    new.options, new.extra = dict(op.options), dict(op.extra)
    return new


def _slice_const(editor, t: int, axis: int, lo: int, hi: int, suffix: str) -> int:
    """A new constant: columns ``lo:hi`` of constant ``t`` along ``axis``, with its
    per-channel quantization cut the same way."""
    src = editor.tensor(t)
    data = np.take(editor.const(t), np.arange(lo, hi), axis=axis)
    return editor.add_tensor(f"{src.name}/{suffix}", data.shape, src.dtype, data=data,
                             **quant_kwargs(src.quantization, axis=axis, lo=lo, hi=hi))


class SplitWide:
    name = "split_wide"
    version = 1
    exact = True
    order = 300
    description = ("CONV_2D/FULLY_CONNECTED wider than the Edge TPU fits -> equal parts "
                   "and a CONCATENATION (GELU applied per part)")

    def _takes(self, editor, op) -> bool:
        if len(op.inputs) < 2 or min(op.inputs[:2]) < 0 or len(op.outputs) != 1:
            return False
        x, w, y = (editor.tensor(t) for t in (op.inputs[0], op.inputs[1], op.outputs[0]))
        if not (is_eight_bit(x) and is_eight_bit(y) and is_eight_bit(w)):
            return False
        if y.quantization.scale.size != 1 or not y.shape:
            return False
        data = editor.const(op.inputs[1])
        if data is None or data.shape[0] != y.shape[-1]:
            return False
        if w.quantization.scale.size > 1 and w.quantization.quantized_dimension != 0:
            return False
        b = op.inputs[2] if len(op.inputs) > 2 else -1
        if b >= 0 and (editor.const(b) is None or editor.const(b).shape != (y.shape[-1],)):
            return False
        if op.name == "FULLY_CONNECTED" and op.options.get("weights_format", 0) != 0:
            return False
        return y.shape[-1] > width_limit(editor.sg, op)

    def _gelu(self, editor, y: int) -> int | None:
        """The builtin GELU that alone reads ``y``, if any."""
        readers = editor.consumers(y)
        if len(readers) == 1 and not editor.is_output(y) and \
                editor.ops[readers[0]].name == "GELU" and editor.ops[readers[0]].inputs[0] == y:
            return readers[0]
        return None

    def apply(self, editor) -> list[RewriteRecord]:
        records = []
        for i, op in list(editor.each("CONV_2D", "FULLY_CONNECTED")):
            if not self._takes(editor, op):
                continue
            y = op.outputs[0]
            yt = editor.tensor(y)
            k, limit = yt.shape[-1], width_limit(editor.sg, op)
            sizes = part_sizes(k, math.ceil(k / limit))
            g = self._gelu(editor, y)
            gelu = editor.ops[g] if g is not None else None
            layers, gelus, outs = [], [], []
            lo = 0
            for j, size in enumerate(sizes):
                hi = lo + size
                tag = f"part{j}"
                ins = list(op.inputs)
                ins[1] = _slice_const(editor, op.inputs[1], 0, lo, hi, tag)
                if len(ins) > 2 and ins[2] >= 0:
                    ins[2] = _slice_const(editor, op.inputs[2], 0, lo, hi, tag)
                part = editor.like(y, f"{yt.name}/{tag}", yt.shape[:-1] + (size,))
                layers.append(_copy_op(op, ins, [part]))
                if gelu is not None:
                    go = gelu.outputs[0]
                    gpart = editor.like(go, f"{editor.tensor(go).name}/{tag}",
                                        editor.tensor(go).shape[:-1] + (size,))
                    gelus.append(_copy_op(gelu, [part], [gpart]))
                    outs.append(gpart)
                else:
                    outs.append(part)
                lo = hi
            new = layers + gelus + [_concat(editor, outs, gelu.outputs[0] if gelu else y)]
            before = [i] if g is None else [i, g]
            editor.replace(before, new)
            detail = f"{_shape_text(yt.shape)} output split into {_sizes_text(sizes)}"
            detail += f" (limit {limit}"
            detail += ", GELU applied per part)" if gelu is not None else ")"
            records.append(RewriteRecord(self.name, tuple(editor.label(j) for j in before),
                                         tuple(o.name for o in new), detail))
        return records


class SplitEmbedding:
    name = "split_embedding"
    version = 1
    exact = True
    order = 310
    description = ("embedding lookup wider than an Edge TPU input -> lookups on column "
                   "slices and a CONCATENATION")

    def _table(self, editor, op) -> tuple[int, int] | None:
        """(table input position, indices input position) if the rewrite takes ``op``."""
        if op.name == "GATHER":
            table, ids = 0, 1
            rank = len(editor.tensor(op.inputs[0]).shape) if op.inputs[0] >= 0 else 0
            axis = op.options.get("axis", 0)
            if rank < 2 or axis % rank != 0 or op.options.get("batch_dims", 0) != 0:
                return None
        else:
            table, ids = 1, 0
        if len(op.inputs) < 2 or min(op.inputs[:2]) < 0 or len(op.outputs) != 1:
            return None
        t, y = editor.tensor(op.inputs[table]), editor.tensor(op.outputs[0])
        data = editor.const(op.inputs[table])
        if data is None or data.ndim < 2 or not (is_eight_bit(t) and is_eight_bit(y)):
            return None
        if t.type != y.type or not y.shape or y.shape[-1] != data.shape[-1]:
            return None
        if y.shape[-1] <= INPUT_WIDTH_LIMIT:
            return None
        return table, ids

    def _feeds_tpu(self, editor, t: int) -> bool:
        rules = editor.rules if editor.rules is not None else default_rules()
        return any(rules.check(OpView(editor.sg, editor.ops[j], j)) is None
                   for j in editor.consumers(t))

    def apply(self, editor) -> list[RewriteRecord]:
        records = []
        for i, op in list(editor.each("GATHER", "EMBEDDING_LOOKUP")):
            found = self._table(editor, op)
            if found is None or not self._feeds_tpu(editor, op.outputs[0]):
                continue
            table, _ = found
            y = op.outputs[0]
            yt = editor.tensor(y)
            w = yt.shape[-1]
            tab = op.inputs[table]
            axis = len(editor.tensor(tab).shape) - 1
            sizes = part_sizes(w, math.ceil(w / INPUT_WIDTH_LIMIT))
            lookups, outs, lo = [], [], 0
            for j, size in enumerate(sizes):
                hi = lo + size
                ins = list(op.inputs)
                ins[table] = _slice_const(editor, tab, axis, lo, hi, f"part{j}")
                part = editor.like(y, f"{yt.name}/part{j}", yt.shape[:-1] + (size,))
                lookups.append(_copy_op(op, ins, [part]))
                outs.append(part)
                lo = hi
            new = lookups + [_concat(editor, outs, y)]
            editor.replace([i], new)
            records.append(RewriteRecord(
                self.name, (editor.label(i),), tuple(o.name for o in new),
                f"{_shape_text(yt.shape)} lookup split into {_sizes_text(sizes)} "
                f"(Edge TPU inputs up to {INPUT_WIDTH_LIMIT} wide)"))
        return records


SPLIT_WIDE = SplitWide()
SPLIT_EMBEDDING = SplitEmbedding()
