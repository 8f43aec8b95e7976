"""The native segment format and its memory plan (docs/segment-format.md)."""

from __future__ import annotations

import dataclasses
import itertools
import struct
import zlib

import numpy as np
import pytest
from conftest import shared_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coralrt._formats.memplan import (
    EDGETPU_ONCHIP_BYTES, check_plan, plan_memory, split_parameters,
)
from coralrt._formats.segment import Segment, build_segment, check_segment
from coralrt._formats.segment_codec import HEADER_SIZE, MAGIC, decode, encode
from coralrt.errors import ModelError, SegmentFormatError, SegmentTooLargeError
from coralrt import load_model
from coralrt.testing import ModelBuilder
from coralrt._model.extract import extract
from coralrt._model.types import BUILTIN_CODES

MOBILENET = "mobilenet_v1_0.25_128_quant.tflite"
_HEADER = struct.Struct("<8sHHIQI5I")
_SECTIONS = struct.Struct("<14Q")
_models: dict[str, object] = {}


def _model(name: str):
    if name not in _models:
        _models[name] = load_model(shared_model(name))
    return _models[name]


def per_channel_model():
    """int8 per-channel conv / depthwise / FC, an omitted bias, list and float
    options, a custom operator and an output that is also read inside."""
    rng = np.random.default_rng(7)
    b = ModelBuilder(name="per_channel")

    def q(zp):
        return dict(scale=0.05, zero_point=zp)

    x = b.input("x", (1, 8, 8, 3), np.int8, **q(-3))
    w = b.constant("conv/w", rng.integers(-127, 128, (4, 3, 3, 3), dtype=np.int8),
                   scale=[0.01, 0.02, 0.03, 0.04], zero_point=0, axis=0)
    bias = b.constant("conv/b", rng.integers(-999, 999, 4, dtype=np.int32),
                      scale=[2e-4, 4e-4, 6e-4, 8e-4], zero_point=0, axis=0)
    y = b.tensor("conv/y", (1, 8, 8, 4), np.int8, **q(1))
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1,
         fused_activation_function="RELU")
    dw = b.constant("dw/w", rng.integers(-127, 128, (1, 3, 3, 4), dtype=np.int8),
                    scale=[0.1, 0.2, 0.3, 0.4], zero_point=0, axis=3)
    dwb = b.constant("dw/b", rng.integers(-99, 99, 4, dtype=np.int32),
                     scale=[5e-3, 1e-2, 1.5e-2, 2e-2], zero_point=0, axis=0)
    z = b.tensor("dw/y", (1, 8, 8, 4), np.int8, **q(-2))
    b.op("DEPTHWISE_CONV_2D", [y, dw, dwb], [z], padding="SAME", stride_w=1, stride_h=1,
         depth_multiplier=1)
    shape = b.constant("flat/shape", np.array([1, 256], np.int32))
    r = b.tensor("flat", (1, 256), np.int8, **q(-2))
    b.op("RESHAPE", [z, shape], [r], new_shape=[1, 256])
    fw = b.constant("fc/w", rng.integers(-127, 128, (10, 256), dtype=np.int8),
                    scale=np.linspace(0.01, 0.1, 10), zero_point=0, axis=0)
    o = b.tensor("fc/y", (1, 10), np.int8, **q(4))
    b.op("FULLY_CONNECTED", [r, fw, -1], [o])
    leaky = b.tensor("leaky", (1, 10), np.int8, **q(4))
    b.op("LEAKY_RELU", [o], [leaky], alpha=0.125)
    c = b.tensor("custom/y", (1, 10), np.int8, **q(0))
    b.op("coralrt-test-scale", [leaky], [c], custom_options=b"\x01\x02\x03")
    b.output(c, y)
    return b.build()


def _piece(case: str):
    """(standalone extracted model, its segment) for a named case."""
    if case == "per_channel":
        m = per_channel_model()
        ops = range(len(m.main.operators))
    elif case == "mobilenet_head":
        m, ops = _model(MOBILENET), range(0, 5)
    elif case == "mobilenet_full":
        m = _model(MOBILENET)
        ops = range(len(m.main.operators))
    elif case == "mobilenet_v2":
        m = _model("mobilenet_v2_1.0_224_quant.tflite")
        ops = range(len(m.main.operators))
    elif case == "deeplab":
        m = _model("deeplabv3_mnv2_dm05_pascal_quant.tflite")
        ops = range(len(m.main.operators))
    elif case == "lstm":
        m, ops = _model("keras_lstm_mnist_ptq.tflite"), range(1, 5)
    else:
        raise AssertionError(case)
    piece = extract(m, ops).model
    return piece, build_segment(piece, compiler_version="test-1")


CASES = ["per_channel", "mobilenet_head", "mobilenet_full", "lstm"]
_encoded: dict[str, bytes] = {}


def _bytes(case: str) -> bytes:
    if case not in _encoded:
        _encoded[case] = encode(_piece(case)[1])
    return _encoded[case]


def _fix_header(data: bytearray) -> bytes:
    """Make the total size and CRC agree with the body, to reach the deeper checks."""
    if len(data) >= HEADER_SIZE:
        struct.pack_into("<Q", data, 16, len(data))
        struct.pack_into("<I", data, 24, zlib.crc32(data[HEADER_SIZE:]))
    return bytes(data)


def _sections(data: bytes) -> list[tuple[int, int]]:
    t = _SECTIONS.unpack_from(data, _HEADER.size)
    return [(t[2 * i], t[2 * i + 1]) for i in range(7)]


def _decode_or_error(data) -> None:
    """Only SegmentFormatError, or a valid segment that encodes back to the same bytes."""
    try:
        seg = decode(data)
    except SegmentFormatError:
        return
    assert encode(seg) == bytes(data)


def assert_matches_model(seg: Segment, piece) -> None:
    sg = piece.main
    assert seg.name == sg.name
    assert seg.inputs == tuple(sg.inputs) and seg.outputs == tuple(sg.outputs)
    assert len(seg.tensors) == len(sg.tensors) and len(seg.ops) == len(sg.operators)
    for i, (t, src) in enumerate(zip(seg.tensors, sg.tensors)):
        assert (t.id, t.name, t.shape, t.dtype) == (i, src.name, src.shape, src.type)
        assert t.variable == src.is_variable
        q = src.quantization
        if q is None or q.scale.size == 0:
            assert t.scales.size == 0 and t.zero_points.size == 0
        else:
            assert t.scales.dtype == np.float32 and t.zero_points.dtype == np.int64
            np.testing.assert_array_equal(t.scales, q.scale)
            np.testing.assert_array_equal(t.zero_points, q.zero_point)
            if q.scale.size > 1:
                assert t.quantized_dimension == q.quantized_dimension
        assert t.nbytes == src.nbytes
        if src.is_constant:
            assert t.kind == "parameter"
            raw = src.buffer.data.tobytes()
            assert seg.parameters[t.offset:t.offset + t.nbytes].tobytes() == raw
            assert t.data.tobytes() == raw and t.data.shape == src.shape
            np.testing.assert_array_equal(t.data, src.data)
            assert not t.data.flags.writeable
        else:
            assert t.kind == ("input" if i in sg.inputs else "output" if i in sg.outputs
                              else "activation")
            assert t.data is None
    for op, src in zip(seg.ops, sg.operators):
        assert (op.opcode, op.version, op.name) == (
            src.opcode.builtin_code, src.opcode.version, src.name)
        assert (op.inputs, op.outputs, op.intermediates) == (
            tuple(src.inputs), tuple(src.outputs), tuple(src.intermediates))
        assert op.params == src.options
        assert op.custom_code == (src.opcode.custom_code or "")
        assert op.custom_options == bytes(src.custom_options or b"")


# -- building and round trip -------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_round_trip_keeps_every_field(case):
    piece, seg = _piece(case)
    assert_matches_model(seg, piece)
    data = encode(seg)
    back = decode(data)
    assert_matches_model(back, piece)
    assert back == seg
    assert back.memory == seg.memory and back.memory.slots
    assert (back.compiler_id, back.compiler_version) == ("coralrt-native", "test-1")
    assert back.parameters.tobytes() == seg.parameters.tobytes()
    assert encode(back) == data


def test_per_channel_details_survive():
    seg = decode(_bytes("per_channel"))
    by_name = {t.name: t for t in seg.tensors}
    assert by_name["dw/w"].quantized_dimension == 3 and by_name["dw/w"].scales.size == 4
    assert by_name["fc/w"].scales.size == 10 and by_name["conv/b"].dtype == 2   # INT32
    fc = next(op for op in seg.ops if op.name == "FULLY_CONNECTED")
    assert fc.inputs[2] == -1
    assert next(op for op in seg.ops if op.name == "RESHAPE").params["new_shape"] == [1, 256]
    assert next(op for op in seg.ops if op.name == "LEAKY_RELU").params["alpha"] == 0.125
    custom = seg.ops[-1]
    assert (custom.opcode, custom.name, custom.custom_options) == (
        BUILTIN_CODES["CUSTOM"], "coralrt-test-scale", b"\x01\x02\x03")
    # conv/y is a segment output that the depthwise conv also reads.
    assert by_name["conv/y"].kind == "output"


def test_every_option_value_type_round_trips():
    _, seg = _piece("per_channel")
    values = {"flag": True, "off": False, "n": -2**63, "x": -1.5e-45, "s": "SAME \u00e9",
              "ints": [1, -2, 2**40], "empty": [], "floats": [0.5, -3.25], "raw": b"\0\xff"}
    seg.ops[0].params.update(values)
    back = decode(encode(seg))
    assert back.ops[0].params == seg.ops[0].params
    for key, value in values.items():
        assert type(back.ops[0].params[key]) is type(value)
    assert back == seg


def test_lstm_state_and_intermediates():
    seg = decode(_bytes("lstm"))
    lstm = seg.ops[0]
    assert lstm.name == "UNIDIRECTIONAL_SEQUENCE_LSTM" and len(lstm.intermediates) == 5
    state = [t for t in seg.tensors if t.variable]
    assert len(state) == 2
    slots = {s.tensor: s for s in seg.memory.slots}
    for t in state:   # state lives through the whole segment
        assert (slots[t.id].first_op, slots[t.id].last_op) == (0, len(seg.ops) - 1)


def test_equality_sees_changes():
    seg = decode(_bytes("per_channel"))
    other = decode(_bytes("per_channel"))
    assert seg == other
    other.tensors[1].scales = other.tensors[1].scales.copy()
    other.tensors[1].scales[0] += 1e-6
    assert seg != other
    other = decode(_bytes("per_channel"))
    other.ops[0].params["stride_w"] = 2
    assert seg != other
    other = decode(_bytes("per_channel"))
    p = other.parameters.copy()
    p[-1] ^= 1
    other.parameters = p
    assert seg != other


def test_decoded_parameters_are_zero_copy():
    for source in (_bytes("per_channel"), bytearray(_bytes("per_channel"))):
        seg = decode(source)
        whole = np.frombuffer(source, np.uint8)
        assert np.shares_memory(seg.parameters, whole)
        for t in seg.tensors:
            if t.kind == "parameter":
                assert np.shares_memory(t.data, whole) and not t.data.flags.writeable


# -- layout --------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_header_sections_and_parameter_alignment(case):
    data = _bytes(case)
    seg = decode(data)
    magic, version, flags, hsize, total, crc, n_ops, n_t, n_in, n_out, res = \
        _HEADER.unpack_from(data)
    assert (magic, version, flags, hsize, total, res) == (MAGIC, 1, 0, HEADER_SIZE, len(data), 0)
    assert crc == zlib.crc32(data[HEADER_SIZE:])
    assert (n_ops, n_t, n_in, n_out) == (len(seg.ops), len(seg.tensors), len(seg.inputs),
                                         len(seg.outputs))
    sections = _sections(data)
    assert sections[0][0] == HEADER_SIZE
    for (off, _), (prev, size) in zip(sections[1:], sections):
        assert off >= prev + size and off % 8 == 0
    p_off, p_size = sections[6]
    assert p_off % 64 == 0 and p_off + p_size == len(data)
    assert data[p_off:] == seg.parameters.tobytes()
    params = sorted((t.offset, t.nbytes, len(t.shape)) for t in seg.tensors
                    if t.kind == "parameter")
    assert params
    for off, size, rank in params:
        assert off % (64 if rank >= 2 else 4) == 0
    for (a, size, _), (b, _, _) in zip(params, params[1:]):
        assert a + size <= b


@pytest.mark.parametrize("case", CASES)
def test_offset_table_points_at_each_record(case):
    data = _bytes(case)
    seg = decode(data)
    sections = _sections(data)
    t_off, t_size = sections[4]
    table = struct.unpack_from(f"<{t_size // 8}Q", data, t_off)
    assert len(table) == len(seg.ops) + len(seg.tensors)
    op_starts, tensor_starts = table[:len(seg.ops)], table[len(seg.ops):]
    assert op_starts[0] == sections[2][0] and tensor_starts[0] == sections[3][0]
    for start, op in zip(op_starts, seg.ops):
        assert start % 8 == 0
        assert struct.unpack_from("<6I", data, start) == (
            op.opcode, op.version, len(op.inputs), len(op.outputs), len(op.intermediates),
            len(op.params))
        assert struct.unpack_from(f"<{len(op.inputs)}i", data, start + 24) == op.inputs
    kinds = ("input", "output", "activation", "parameter")
    for start, t in zip(tensor_starts, seg.tensors):
        tid, kind, dtype, _, rank = struct.unpack_from("<IBBHI", data, start)
        assert (tid, kinds[kind], dtype, rank) == (t.id, t.kind, t.dtype, len(t.shape))
        offset, nbytes = struct.unpack_from("<QQ", data, start + 24)
        assert (offset, nbytes) == (t.offset, t.nbytes)


# -- corruption ----------------------------------------------------------------------------


def test_checksum_detects_a_flipped_byte():
    data = bytearray(_bytes("mobilenet_head"))
    p_off = _sections(bytes(data))[6][0]
    data[p_off + 100] ^= 0x01
    with pytest.raises(SegmentFormatError, match="checksum mismatch"):
        decode(bytes(data))


def test_every_single_byte_flip_is_detected():
    data = _bytes("per_channel")
    buf = bytearray(data)
    for i in range(len(buf)):
        buf[i] ^= 0x20
        with pytest.raises(SegmentFormatError):
            decode(buf)
        buf[i] ^= 0x20
    decode(buf)


def test_truncation_and_trailing_bytes_are_detected():
    data = _bytes("per_channel")
    for n in range(len(data)):
        with pytest.raises(SegmentFormatError) as err:
            decode(data[:n])
        if n >= 8:
            assert "truncated" in str(err.value)
    with pytest.raises(SegmentFormatError, match="total size"):
        decode(data + b"\0")


def test_header_errors_say_what_is_wrong():
    data = bytearray(_bytes("per_channel"))
    with pytest.raises(SegmentFormatError, match="not a coralrt segment"):
        decode(b"TFL3" + bytes(data[4:]))
    bad = bytearray(data)
    struct.pack_into("<H", bad, 8, 2)
    with pytest.raises(SegmentFormatError, match="format version 2 is not supported"):
        decode(bytes(bad))
    with pytest.raises(SegmentFormatError, match="expected contiguous bytes"):
        decode(12345)
    assert issubclass(SegmentFormatError, ModelError) and issubclass(SegmentFormatError,
                                                                     ValueError)


def test_deep_checks_behind_a_valid_checksum():
    data = _bytes("per_channel")
    seg = decode(data)
    sections = _sections(data)
    table = struct.unpack_from(f"<{sections[4][1] // 8}Q", data, sections[4][0])

    def patched(offset, fmt, value):
        buf = bytearray(data)
        struct.pack_into(fmt, buf, offset, value)
        return _fix_header(buf)

    cases = [
        (patched(table[0] + 24, "<i", 999), "out of range"),         # op 0, input 0
        (patched(table[0] + 24, "<i", -2), "out of range"),
        (patched(table[len(seg.ops)] + 1, "<B", 7), "kind"),          # tensor 0's kind
        (patched(sections[4][0], "<Q", table[0] + 8), "offset table entry 0"),
        (patched(_HEADER.size + 8, "<Q", sections[0][1] + 8), "io section at byte"),
    ]
    w = next(t for t in seg.tensors if t.name == "fc/w")
    cases.append((patched(table[len(seg.ops) + w.id] + 24, "<Q", w.offset + 4), "aligned"))
    a_slot = seg.memory.slots[0]
    plan_off = sections[5][0] + 48
    cases.append((patched(plan_off + 16, "<Q", a_slot.offset + 64), "differs"))
    for blob, message in cases:
        with pytest.raises(SegmentFormatError, match=message):
            decode(blob)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600), st.booleans())
def test_fuzz_random_bytes(data, with_magic):
    if with_magic:
        data = _fix_header(bytearray(MAGIC + struct.pack("<HHI", 1, 0, HEADER_SIZE) + data))
    _decode_or_error(data)


_U32_VALUES = st.sampled_from([0, 1, 2, 3, 7, 8, 64, 160, 255, 0x7FFFFFFF, 0xFFFFFFFF])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["per_channel", "lstm"]), st.data())
def test_fuzz_mutated_segments(case, draw):
    buf = bytearray(_bytes(case))
    for _ in range(draw.draw(st.integers(1, 4))):
        kind = draw.draw(st.sampled_from(["flip", "u32", "u64", "delete", "insert", "cut"]))
        pos = draw.draw(st.integers(0, len(buf) - 1)) if buf else 0
        if kind == "flip" and buf:
            buf[pos] ^= 1 << draw.draw(st.integers(0, 7))
        elif kind == "u32" and len(buf) >= 4:
            pos = min(pos - pos % 4, len(buf) - 4)
            struct.pack_into("<I", buf, pos, draw.draw(_U32_VALUES))
        elif kind == "u64" and len(buf) >= 8:
            pos = min(pos - pos % 8, len(buf) - 8)
            struct.pack_into("<Q", buf, pos, draw.draw(st.integers(0, 2**64 - 1)))
        elif kind == "delete":
            del buf[pos:pos + draw.draw(st.integers(1, 16))]
        elif kind == "insert":
            buf[pos:pos] = draw.draw(st.binary(min_size=1, max_size=16))
        elif kind == "cut":
            del buf[pos:]
    data = _fix_header(buf) if draw.draw(st.booleans()) else bytes(buf)
    _decode_or_error(data)


# -- memory plan ---------------------------------------------------------------------------


def _expected_lifetimes(seg):
    n = len(seg.ops)
    life = {}
    for t in seg.tensors:
        if t.kind == "parameter":
            continue
        writers = [i for i, op in enumerate(seg.ops) if t.id in op.outputs + op.intermediates]
        readers = [i for i, op in enumerate(seg.ops) if t.id in op.inputs]
        first = 0 if t.id in seg.inputs or t.variable else writers[0]
        last = n - 1 if t.id in seg.outputs or t.variable else max([first, *readers])
        life[t.id] = (first, last)
    return life


def assert_plan_valid(seg):
    plan = seg.memory
    slots = {s.tensor: s for s in plan.slots}
    assert slots.keys() == {t.id for t in seg.tensors if t.kind != "parameter"}
    life = _expected_lifetimes(seg)
    for s in plan.slots:
        assert (s.first_op, s.last_op) == life[s.tensor]
        assert s.offset % 64 == 0 and s.nbytes == seg.tensors[s.tensor].nbytes
        assert seg.tensors[s.tensor].offset == s.offset
    for a, b in itertools.combinations(plan.slots, 2):
        if a.first_op <= b.last_op and b.first_op <= a.last_op and a.nbytes and b.nbytes:
            assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, (a, b)
    sizes = [s.nbytes for s in plan.slots]
    assert plan.activation_bytes >= max(sizes)
    assert plan.activation_bytes == max(s.offset + s.nbytes for s in plan.slots)
    for i in range(len(seg.ops)):   # whatever is live at one operator must fit side by side
        live = sum(s.nbytes for s in plan.slots if s.first_op <= i <= s.last_op)
        assert plan.activation_bytes >= live
    assert plan.activation_bytes <= EDGETPU_ONCHIP_BYTES
    assert plan.parameter_bytes == len(seg.parameters)
    assert plan.on_chip_parameter_bytes + plan.off_chip_parameter_bytes == plan.parameter_bytes
    assert plan.on_chip_parameter_bytes == min(plan.parameter_bytes,
                                               EDGETPU_ONCHIP_BYTES - plan.activation_bytes)


@pytest.mark.parametrize("case", [*CASES, "mobilenet_v2", "deeplab"])
def test_memory_plan_is_valid(case):
    _, seg = _piece(case)
    assert_plan_valid(seg)
    assert_plan_valid(decode(encode(seg)))


def test_memory_plan_reuses_memory():
    _, seg = _piece("mobilenet_full")
    total = sum(s.nbytes for s in seg.memory.slots)
    assert seg.memory.activation_bytes < total / 2


def test_overlapping_live_tensors_are_rejected():
    seg = decode(_bytes("per_channel"))
    op = seg.ops[0]
    a, b = op.inputs[0], op.outputs[0]           # both live at operator 0
    slots = list(seg.memory.slots)
    for i, s in enumerate(slots):
        if s.tensor == b:
            slots[i] = dataclasses.replace(s, offset=seg.tensors[a].offset)
    seg.tensors[b].offset = seg.tensors[a].offset
    seg.memory = dataclasses.replace(seg.memory, slots=tuple(slots))
    with pytest.raises(SegmentFormatError, match="live at the same time"):
        check_plan(seg)
    with pytest.raises(SegmentFormatError):
        encode(seg)


def _unary_model(shape, *, constant=None):
    b = ModelBuilder(name="big")
    x = b.input("x", shape, np.uint8, scale=0.1, zero_point=0)
    y = b.tensor("y", shape, np.uint8, scale=0.1, zero_point=0)
    if constant is None:
        b.op("RELU", [x], [y])
    else:
        c = b.constant("c", constant, scale=0.1, zero_point=0)
        b.op("ADD", [x, c], [y])
    b.output(y)
    return b.build()


def test_activations_beyond_on_chip_memory_raise():
    b = ModelBuilder(name="too_big")
    shape = (1, 1024, 1024, 3)                   # 3 MiB each, three live at once
    x = b.input("x", shape, np.uint8, scale=0.1, zero_point=0)
    y = b.input("y", shape, np.uint8, scale=0.1, zero_point=0)
    z = b.tensor("z", shape, np.uint8, scale=0.1, zero_point=0)
    b.op("ADD", [x, y], [z])
    b.output(z)
    with pytest.raises(SegmentTooLargeError) as err:
        build_segment(b.build())
    assert err.value.required_bytes == 9 * 2**20 and err.value.limit_bytes == 8 * 2**20
    assert "9437184" in str(err.value) and "8388608" in str(err.value)
    assert isinstance(err.value, ModelError)


def test_exactly_full_on_chip_memory_fits_and_streams_parameters():
    seg = build_segment(_unary_model((1, 1024, 1024, 4),
                                     constant=np.arange(4, dtype=np.uint8)))
    assert seg.memory.activation_bytes == EDGETPU_ONCHIP_BYTES
    assert (seg.memory.parameter_bytes, seg.memory.on_chip_parameter_bytes,
            seg.memory.off_chip_parameter_bytes) == (4, 0, 4)
    with pytest.raises(SegmentTooLargeError):
        plan_memory(seg, on_chip_bytes=EDGETPU_ONCHIP_BYTES - 64)
    assert_plan_valid(decode(encode(seg)))


def test_segment_without_parameters():
    seg = build_segment(_unary_model((1, 4, 4, 3)))
    data = encode(seg)
    assert seg.parameters.size == 0 and _sections(data)[6][1] == 0
    back = decode(data)
    assert back == seg and encode(back) == data
    assert (back.memory.activation_bytes, back.memory.parameter_bytes) == (64 + 48, 0)


def test_parameters_split_between_on_chip_and_streamed():
    rng = np.random.default_rng(3)
    b = ModelBuilder(name="wide_fc")
    x = b.input("x", (1, 4096), np.int8, scale=0.1, zero_point=0)
    w = b.constant("w", rng.integers(-127, 128, (2048, 4096), dtype=np.int8), scale=0.01,
                   zero_point=0)
    bias = b.constant("b", np.zeros(2048, np.int32), scale=0.001, zero_point=0)
    y = b.tensor("y", (1, 2048), np.int8, scale=0.1, zero_point=0)
    b.op("FULLY_CONNECTED", [x, w, bias], [y])
    b.output(y)
    seg = build_segment(b.build())
    plan = seg.memory
    assert plan.parameter_bytes == 2048 * 4096 + 2048 * 4
    assert plan.on_chip_parameter_bytes == EDGETPU_ONCHIP_BYTES - plan.activation_bytes
    assert plan.off_chip_parameter_bytes == plan.parameter_bytes - plan.on_chip_parameter_bytes
    assert plan.off_chip_parameter_bytes > 0
    assert split_parameters(10, 0) == (10, 0)
    assert split_parameters(10, EDGETPU_ONCHIP_BYTES - 4) == (4, 6)
    assert decode(encode(seg)).memory == plan


# -- what the format refuses -------------------------------------------------------------


def test_unencodable_inputs_raise_segment_format_error():
    b = ModelBuilder()
    x = b.input("x", (2,), np.int8, scale=0.1, zero_point=0)
    y = b.tensor("y", (2,), np.int8, scale=0.1, zero_point=0)
    b.op("RELU", [x], [y])
    b.output(y)
    model = b.build()
    model.main.tensors[y].type = 9 + 100          # no such TFLite type
    with pytest.raises(SegmentFormatError, match="no fixed size"):
        build_segment(model)
    seg = decode(_bytes("per_channel"))
    seg.ops[0].params["bad"] = {"a": 1}
    with pytest.raises(SegmentFormatError, match="option 'bad'"):
        encode(seg)
    seg = decode(_bytes("per_channel"))
    seg.tensors[0].offset = 3                     # an input, off the 64-byte grid
    with pytest.raises(SegmentFormatError):
        check_segment(seg)


def test_reads_before_writes_are_rejected():
    seg = decode(_bytes("per_channel"))
    seg.ops[0], seg.ops[1] = seg.ops[1], seg.ops[0]
    with pytest.raises(SegmentFormatError, match="before any operator writes it"):
        check_segment(seg)

