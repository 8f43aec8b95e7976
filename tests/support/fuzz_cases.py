"""The model fuzzer's cases: seed models and the mutations applied to them.

A case is fully named by ``(seed, index, model, kind)``: :func:`make_case`
draws the model and the kind from the lists it is given and the mutation from
a generator seeded by ``seed`` and ``index`` alone, so re-running one case
with only its model and kind listed (``tools/fuzz_models.py --case``) gives
the same bytes.

Mutation kinds:

- ``bytes``: truncation at a random length (30 %), then 1 to 8 random bytes
  overwritten;
- ``minus_one`` / ``swap``: one input of one operator set to -1 ("omitted"),
  or rewired to another tensor of its subgraph (half the time one with as
  many elements);
- ``zero_point``: one quantized tensor's zero point(s) set to a value outside
  (or at the edge of) its type's range;
- ``scale``: one quantized tensor's scale(s) set to 0, a negative, infinite,
  NaN, denormal or huge value;
- ``type``: one tensor's type field changed to another type, of the same or
  another byte width;
- ``int32_value``: one element of a constant int32 tensor (a bias, a shape,
  axes) set to an extreme value (INT32_MIN, INT32_MAX, +-2^30, -1), where
  accumulators overflow.

The structural kinds decode the model, change one field and write it back
with coralrt's own flatbuffer writer.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from coralrt._model import flatbuf
from coralrt._model.types import BUILTIN_NAMES, TENSOR_TYPES, TYPE_NAMES

#: Real models the short run in ``make test`` draws from (small and quick on every leg).
SEEDS = ("add_quantized_uint8.tflite", "hello_world_int8.tflite", "split_concat.tflite",
         "keras_lstm_mnist_ptq.tflite", "add_float.tflite",
         "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite")
#: Models built in code: quantized operators the seeds above lack or keep on the CPU.
BUILT = ("built:conv_uint8", "built:conv_relu_int8", "built:mean_fc_uint8")
#: A larger real model a campaign adds (``--models all``).
EXTRA = ("mobilenet_v1_0.25_128_quant.tflite",)
#: A much slower one (seconds per case on the reference kernels; ``--models slow``).
SLOW = ("deeplabv3_mnv2_dm05_pascal_quant.tflite",)

INPUT_MUTATIONS = ("minus_one", "swap")
QUANT_MUTATIONS = ("zero_point", "scale", "type")
KINDS = ("bytes", *INPUT_MUTATIONS, *QUANT_MUTATIONS, "int32_value")

# Zero points at and beyond the edges of the 8-, 16- and 32-bit ranges (LiteRT
# keeps 32 bits of the file's int64).
ZERO_POINTS = (36192, 352, 256, 128, -129, -200, 65536, -32769, 2**31 - 1, -2**31,
               2**32 + 7, -(2**40))
# Scales: multiplied into the old one ("x") or set outright.
SCALES = (("set", 0.0), ("set", -0.0), ("x", -1.0), ("set", float("inf")),
          ("set", float("-inf")), ("set", float("nan")), ("set", 1e-45), ("set", 1e-39),
          ("set", 3e38), ("x", 1e-6), ("x", 1e6))
INT32_VALUES = (-2**31, 2**31 - 1, -2**31 + 1, 2**30, -2**30, -1)
TYPES = ("FLOAT32", "FLOAT16", "INT32", "UINT8", "INT64", "BOOL", "INT16", "INT8",
         "FLOAT64", "UINT32", "UINT16", "INT4", "UINT64", "STRING")


@dataclass(frozen=True)
class Mutation:
    data: bytes
    what: str                 # what was changed, in words
    ops: tuple[str, ...] = ()  # the operators that read or write what was changed


@dataclass(frozen=True)
class Case:
    seed: int
    index: int
    model: str
    kind: str
    mutation: Mutation

    @property
    def input_seed(self) -> int:
        """Seeds the random inputs, the same on every leg."""
        return zlib.crc32(f"{self.seed}:{self.index}".encode())

    def reproduce(self) -> str:
        return (f"python tools/fuzz_models.py --seed {self.seed} --case {self.index} "
                f"--models {self.model} --kinds {self.kind}")


# -- seed models ----------------------------------------------------------------------------


def _built(name: str) -> bytes:
    from coralrt.testing import ModelBuilder
    from support.models import conv_chain, conv_relu

    if name == "built:conv_uint8":
        return conv_chain(segments=2, hw=8, c=8).to_bytes()
    if name == "built:conv_relu_int8":
        return conv_relu(4).to_bytes()
    # Two branches, each its own output: a MEAN and a RESHAPE of it, and a
    # FULLY_CONNECTED whose result an ADD offsets by a constant (so that a
    # rounding difference of LiteRT's optimized kernels does not grow through
    # later operators).
    rng = np.random.default_rng(3)
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8), np.uint8, scale=0.05, zero_point=120)
    axes = b.constant("axes", np.array([1, 2], np.int32))
    m = b.tensor("m", (1, 8), np.uint8, scale=0.04, zero_point=110)
    b.op("MEAN", [x, axes], [m], keep_dims=False)
    r = b.tensor("r", (2, 4), np.uint8, scale=0.04, zero_point=110)
    b.op("RESHAPE", [m, b.constant("shape", np.array([2, 4], np.int32))], [r])
    v = b.input("v", (1, 8), np.uint8, scale=0.04, zero_point=110)
    w = b.constant("w", rng.integers(0, 256, (8, 8), dtype=np.uint8), scale=0.01,
                   zero_point=127)
    bias = b.constant("b", rng.integers(-300, 300, 8).astype(np.int32), scale=0.0004,
                      zero_point=0)
    y = b.tensor("y", (1, 8), np.uint8, scale=0.03, zero_point=100)
    b.op("FULLY_CONNECTED", [v, w, bias], [y], fused_activation_function="RELU6")
    c = b.constant("c", rng.integers(0, 256, (1, 8), dtype=np.uint8), scale=0.02,
                   zero_point=128)
    z = b.tensor("z", (1, 8), np.uint8, scale=0.05, zero_point=90)
    b.op("ADD", [y, c], [z])
    b.output(r, z)
    return b.build().to_bytes()


@lru_cache(maxsize=None)
def seed_bytes(name: str) -> bytes:
    if name.startswith("built:"):
        return _built(name)
    from conftest import shared_model
    return shared_model(name).read_bytes()


# -- mutations ------------------------------------------------------------------------------


def _op_name(tree: dict, op: dict) -> str:
    codes = tree.get("operator_codes") or ()
    k = int(op.get("opcode_index") or 0)
    if not 0 <= k < len(codes):
        return f"opcode {k}"
    code = codes[k]
    if code.get("custom_code"):
        return str(code["custom_code"])
    n = max(int(code.get("builtin_code") or 0), int(code.get("deprecated_builtin_code") or 0))
    return BUILTIN_NAMES.get(n, f"builtin {n}")


def _users(tree: dict, sg: dict, ti: int) -> tuple[str, ...]:
    """The operators of ``sg`` that read or write tensor ``ti``."""
    return tuple(sorted({_op_name(tree, op) for op in sg.get("operators") or ()
                         if ti in [int(i) for i in op.get("inputs", ())]
                         or ti in [int(i) for i in op.get("outputs", ())]}))


def _tensor_words(sg: dict, ti: int) -> str:
    if not 0 <= ti < len(sg.get("tensors") or ()):
        return f"tensor {ti}"
    t = sg["tensors"][ti]
    shape = [int(d) for d in t.get("shape", ())]
    return f"tensor {ti} {TYPE_NAMES.get(int(t.get('type') or 0), '?')} {shape}"


def _elements(t: dict) -> int:
    return int(np.prod([int(d) for d in t.get("shape", ())], dtype=np.int64))


def flip_bytes(data: bytes, rnd: random.Random) -> Mutation:
    out = bytearray(data)
    what = []
    if rnd.random() < 0.3:
        out = out[: rnd.randrange(len(out))]
        what.append(f"truncated to {len(out)} bytes")
    offsets = []
    for _ in range(rnd.randint(1, 8)):
        if out:
            k = rnd.randrange(len(out))
            out[k] = rnd.randrange(256)
            offsets.append(k)
    if offsets:
        what.append(f"bytes at {offsets} overwritten")
    return Mutation(bytes(out), ", ".join(what))


def mutate_operator_input(data: bytes, kind: str, pick) -> Mutation | None:
    """``data`` with one operator input rewired: set to -1 (``"minus_one"``) or
    to another tensor index of its subgraph (``"swap"``).  ``pick(n)`` chooses
    an int in ``range(n)``; None when the model has no input to rewire."""
    tree = flatbuf.decode(data)
    ops = [(si, oi, sg, op) for si, sg in enumerate(tree.get("subgraphs") or ())
           for oi, op in enumerate(sg.get("operators") or ())
           if len(op.get("inputs", ())) and sg.get("tensors")]
    if not ops:
        return None
    si, oi, sg, op = ops[pick(len(ops))]
    inputs = [int(i) for i in op["inputs"]]
    k = pick(len(inputs))
    old = inputs[k]
    if kind == "minus_one":
        inputs[k] = -1
    else:
        # Half the time a tensor of as many elements (of another type, often):
        # the rewirings most likely to pass validation and reach a kernel.
        tensors = sg["tensors"]
        n = len(tensors)
        size = _elements(tensors[old]) if 0 <= old < n else None
        alike = [j for j in range(n) if j != old and _elements(tensors[j]) == size]
        if alike and pick(2):
            inputs[k] = alike[pick(len(alike))]
        else:
            inputs[k] = (old + 1 + pick(n - 1)) % n if n > 1 else 0
    op["inputs"] = np.array(inputs, np.int32)
    name = _op_name(tree, op)
    what = (f"subgraph {si} operator {oi} ({name}) input {k}: {_tensor_words(sg, old)} -> "
            f"{_tensor_words(sg, inputs[k]) if inputs[k] >= 0 else '-1'}")
    return Mutation(flatbuf.encode(tree), what, (name,))


def mutate_tensor(data: bytes, kind: str, rnd: random.Random) -> Mutation | None:
    """``data`` with one tensor's zero point, scale or type changed (``kind``);
    None when the model has no tensor to change (no quantized one for the first two)."""
    tree = flatbuf.decode(data)
    candidates = []
    for si, sg in enumerate(tree.get("subgraphs") or ()):
        for ti, t in enumerate(sg.get("tensors") or ()):
            q = t.get("quantization") or {}
            if kind == "type" or len(q.get("scale") if q.get("scale") is not None else ()):
                candidates.append((si, ti, sg, t))
    if not candidates:
        return None
    si, ti, sg, t = candidates[rnd.randrange(len(candidates))]
    where = f"subgraph {si} {_tensor_words(sg, ti)} {t.get('name', '')!r}"
    if kind == "type":
        old = TYPE_NAMES.get(int(t.get("type") or 0), str(t.get("type")))
        new = rnd.choice([n for n in TYPES if n != old])
        t["type"] = TENSOR_TYPES[new]
        what = f"{where}: type {old} -> {new}"
    else:
        q = t["quantization"]
        scale = np.array(q["scale"], np.float32)
        zp = np.array(q.get("zero_point") if q.get("zero_point") is not None else (), np.int64)
        if zp.size == 0:
            zp = np.zeros(scale.size, np.int64)
        k = rnd.randrange(scale.size) if rnd.random() < 0.5 else None   # None: all of them
        sl = slice(None) if k is None else slice(k, k + 1)
        if kind == "zero_point":
            value = rnd.choice(ZERO_POINTS)
            old = zp[sl].tolist()
            zp[sl] = value
            what = f"{where}: zero point{'' if k is None else f' {k}'} {old[:4]} -> {value}"
        else:
            how, value = rnd.choice(SCALES)
            old = scale[sl].tolist()
            with np.errstate(over="ignore", under="ignore"):
                scale[sl] = scale[sl] * np.float32(value) if how == "x" else np.float32(value)
            what = f"{where}: scale{'' if k is None else f' {k}'} {old[:4]} -> {scale[sl][:4].tolist()}"
        q["scale"], q["zero_point"] = scale, zp
    return Mutation(flatbuf.encode(tree), what, _users(tree, sg, ti))


def mutate_int32_constant(data: bytes, rnd: random.Random) -> Mutation | None:
    """``data`` with one element of a constant int32 tensor set to an extreme
    value; None when the model has no such tensor."""
    tree = flatbuf.decode(data)
    buffers = tree.get("buffers") or ()
    candidates = []
    for si, sg in enumerate(tree.get("subgraphs") or ()):
        for ti, t in enumerate(sg.get("tensors") or ()):
            b = int(t.get("buffer") or 0)
            raw = buffers[b].get("data") if 0 < b < len(buffers) else None
            n = _elements(t)
            if int(t.get("type") or 0) == TENSOR_TYPES["INT32"] and n and raw is not None \
                    and len(raw) == 4 * n:
                candidates.append((si, ti, sg, t, b))
    if not candidates:
        return None
    si, ti, sg, t, b = candidates[rnd.randrange(len(candidates))]
    values = np.frombuffer(bytes(buffers[b]["data"]), "<i4").copy()
    k = rnd.randrange(values.size)
    old, values[k] = int(values[k]), rnd.choice(INT32_VALUES)
    buffers[b]["data"] = np.frombuffer(values.tobytes(), np.uint8)
    what = (f"subgraph {si} {_tensor_words(sg, ti)} {t.get('name', '')!r}: element {k} "
            f"{old} -> {int(values[k])}")
    return Mutation(flatbuf.encode(tree), what, _users(tree, sg, ti))


def mutate(data: bytes, kind: str, rnd: random.Random) -> Mutation | None:
    if kind == "int32_value":
        return mutate_int32_constant(data, rnd)
    if kind == "bytes":
        return flip_bytes(data, rnd)
    if kind in INPUT_MUTATIONS:
        return mutate_operator_input(data, kind, rnd.randrange)
    if kind in QUANT_MUTATIONS:
        return mutate_tensor(data, kind, rnd)
    raise ValueError(f"unknown mutation kind {kind!r}; known: {', '.join(KINDS)}")


def make_case(seed: int, index: int, models, kinds) -> Case | None:
    """Case ``index`` of the run seeded ``seed``: a model and a kind drawn from
    ``models`` and ``kinds``; None when that model has nothing the kind changes."""
    pick = random.Random(f"{seed}:{index}:pick")
    model = pick.choice(list(models))
    kind = pick.choice(list(kinds))
    mutation = mutate(seed_bytes(model), kind, random.Random(f"{seed}:{index}:mutation"))
    return None if mutation is None else Case(seed, index, model, kind, mutation)
