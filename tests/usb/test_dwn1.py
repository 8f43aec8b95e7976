"""DWN1 executable packages in the compiled models of ``shared/models/edgetpu``.

Facts are checked against the models themselves (the custom op's TFLite
tensors and the plain, uncompiled models) and against the manifest; damaged
packages are made by patching real ones, so every error path is reached from
bytes edgetpu_compiler wrote.
"""

from __future__ import annotations

import json
import logging
import struct

import numpy as np
import pytest
from conftest import model_params, shared_model, shared_model_names
from flatbuffers import flexbuffers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coralrt._cli.main import main
from coralrt.errors import ExecutableError, ModelError
from coralrt import load_model
from coralrt._model.flatbuf import decode_root
from coralrt._formats.dwn1 import check_runnable, describe, parse_package, select_executables
from coralrt._formats.dwn1_schema import LAYOUT, UNIONS, binary_strings
from coralrt._formats.flexreader import FlexReader

V1 = "edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite"
V2 = "edgetpu/mobilenet_v2_1.0_224_quant_edgetpu.tflite"
SPLIT = "edgetpu/split_concat_edgetpu.tflite"
LSTM = "edgetpu/keras_lstm_mnist_ptq_edgetpu.tflite"
DEEPLAB = "edgetpu/deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite"
# Compiled file -> plain model whose every operator edgetpu_compiler mapped.
FULLY_MAPPED = {V1: "mobilenet_v1_0.25_128_quant.tflite",
                V2: "mobilenet_v2_1.0_224_quant.tflite", SPLIT: "split_concat.tflite"}


def custom_ops(name: str):
    """(subgraph, operator) of every edgetpu-custom-op of a shared model."""
    model = load_model(shared_model(name))
    ops = [(g, op) for g in model.subgraphs for op in g.operators
           if op.name == "edgetpu-custom-op"]
    assert ops, f"{name} has no edgetpu-custom-op"
    return ops


def options(name: str) -> bytes:
    return bytes(custom_ops(name)[0][1].custom_options)


def squeeze(shape) -> tuple:
    return tuple(int(d) for d in shape if d != 1)


def offset_in(view: memoryview, base) -> int:
    """Where ``view`` starts inside the buffer ``base`` (both share memory)."""
    a = np.frombuffer(view, np.uint8).__array_interface__["data"][0]
    return a - np.frombuffer(base, np.uint8).__array_interface__["data"][0]


# -- every compiled model -------------------------------------------------------

@pytest.mark.parametrize("name", shared_model_names(compiled=True))
def test_every_compiled_model_parses(name):
    for _, op in custom_ops(name):
        pkg = parse_package(op.custom_options)
        assert pkg.layout in ("current", "older")
        assert 10 <= pkg.min_runtime_version <= 14
        pc, main_exe = select_executables(pkg)
        assert main_exe in pkg.executables and main_exe.instruction_bytes > 0
        assert pc is None or (pc.type == "PARAMETER_CACHING" and pc.caching_token != 0)
        for e in pkg.executables:
            assert e.chip == "beagle" and e.batch_size == 1
            assert all(isinstance(c, memoryview) and len(c) for c in e.instructions)
        json.dumps(describe(pkg))


@pytest.mark.parametrize("name", shared_model_names(compiled=True))
def test_layers_match_the_custom_op_tensors(name):
    for g, op in custom_ops(name):
        _, exe = select_executables(parse_package(op.custom_options))
        outputs = [x for x in exe.outputs if not x.is_variable_output]
        for layers, tensors in ((exe.inputs, op.inputs), (outputs, op.outputs)):
            assert [x.name for x in layers] == [g.tensors[i].name for i in tensors]
            for layer, i in zip(layers, tensors):
                t = g.tensors[i]
                assert squeeze(layer.shape) == squeeze(t.shape)
                assert layer.dtype == t.dtype.name
                assert layer.zero_point == int(t.quantization.zero_point[0])
                assert layer.scale == pytest.approx(float(t.quantization.scale[0]), rel=1e-6)
                assert layer.padded_size_bytes >= layer.actual_size_bytes == t.nbytes


@pytest.mark.parametrize("name", model_params(sorted(FULLY_MAPPED)))
def test_layers_match_the_plain_model(name):
    plain = load_model(shared_model(FULLY_MAPPED[name])).main
    _, exe = select_executables(parse_package(options(name)))
    for layers, tensors in ((exe.inputs, plain.inputs), (exe.outputs, plain.outputs)):
        by_name = {x.name: x for x in layers}
        assert sorted(by_name) == sorted(plain.tensors[i].name for i in tensors)
        for i in tensors:
            t, layer = plain.tensors[i], by_name[plain.tensors[i].name]
            assert squeeze(layer.shape) == squeeze(t.shape) and layer.dtype == t.dtype.name
            assert layer.zero_point == int(t.quantization.zero_point[0])
            assert layer.scale == pytest.approx(float(t.quantization.scale[0]), rel=1e-6)


def test_layouts_of_the_shared_files():
    assert parse_package(options(V1)).layout == "current"
    assert parse_package(options(V2)).layout == "older"  # keys 1, 4, 5 only
    pkg = parse_package(options(SPLIT))
    assert pkg.layout == "older" and pkg.chip_ids is None
    assert (pkg.min_runtime_version, pkg.compiler_version) == (13, "cl/343520747")
    assert parse_package(options(V1)).chip_ids == [18]


def raw_executables(opts) -> list[memoryview]:
    """The serialized Executables of a package, as views into ``opts``."""
    pkg = decode_root(package_view(opts), "Package", LAYOUT, UNIONS)
    return binary_strings(memoryview(pkg["serialized_multi_executable"]), "test")


def test_oldest_layout_with_bare_executables():
    eo, pc = (bytes(e) for e in raw_executables(options(V1)))
    old = flexbuffers.Dumps({"1": 0, "2": "beagle", "3": pc, "4": eo})
    pkg = parse_package(old)
    assert pkg.layout == "oldest" and pkg.min_runtime_version == 0
    cache, run = select_executables(pkg)
    assert (run.type, cache.type) == ("EXECUTION_ONLY", "PARAMETER_CACHING")
    assert cache.parameters_bytes == 566912 and run.inputs[0].name == "input"
    single = parse_package(flexbuffers.Dumps({"1": 0, "2": "beagle", "4": eo}))
    assert single.layout == "oldest" and select_executables(single) == (None,
                                                                        single.executables[0])


# -- facts from the manifest and the reference ----------------------------------

def test_parameter_caching_pair_shares_a_token():
    pkg = parse_package(options(V1))
    pc, eo = select_executables(pkg)
    assert (pc.type, eo.type) == ("PARAMETER_CACHING", "EXECUTION_ONLY")
    assert pc.caching_token == eo.caching_token == 0x6D146C3F97D6648C
    assert pc.parameters_bytes == 566912 and eo.parameters_bytes == 0
    assert pc.inputs == [] and pc.outputs == [] and [x.name for x in eo.inputs] == ["input"]


def test_mobilenet_v2_caches_about_3_9_mb():
    pc, eo = select_executables(parse_package(options(V2)))
    assert pc.parameters_bytes == 3900864
    assert pc.parameters_bytes / 1e6 == pytest.approx(3.9, abs=0.05)
    assert eo.estimated_cycles == 458040


def test_dma_hints_in_order():
    pc, eo = select_executables(parse_package(options(V1)))
    assert [(h.kind, h.chunk, h.name, h.offset, h.size, h.interrupt, h.direction)
            for h in eo.dma_hints] == [
        ("instruction", 0, None, 0, 170032, None, "infeed"),
        ("input", None, "input", 0, 49152, None, "infeed"),
        ("output", None, "MobilenetV1/Predictions/Reshape_1", 0, 1008, None, "outfeed"),
        ("interrupt", None, None, 0, 0, 0, "outfeed")]
    assert [(h.kind, h.offset, h.size) for h in pc.dma_hints] == [
        ("instruction", 0, 12624), ("parameter", 0, 566912), ("interrupt", 0, 0)]
    _, deeplab = select_executables(parse_package(options(DEEPLAB)))
    assert [h.kind for h in deeplab.dma_hints] == ["instruction", "input", "output", "output",
                                                   "interrupt"]
    assert [h.size for h in deeplab.dma_hints[1:4]] == [789512, 278784, 256]


def test_views_are_zero_copy():
    source = bytearray(options(V1))
    pc, eo = select_executables(parse_package(source))
    at = offset_in(pc.parameters, source)
    assert 0 < at and source[at:at + 16] == bytes(pc.parameters[:16])
    source[at] ^= 0xFF
    assert pc.parameters[0] == source[at]  # a view, not a copy
    assert np.shares_memory(np.frombuffer(eo.instructions[0], np.uint8),
                            np.frombuffer(source, np.uint8))


def test_layer_conventions_for_signed_and_tiled_data():
    _, exe = select_executables(parse_package(options(LSTM)))
    x, q8, q16 = exe.inputs
    assert (x.signed, q8.signed, q16.signed) == (False, True, True)
    assert (q8.dtype, q8.raw_zero_point, q8.zero_point) == ("int8", 127, -1)
    assert (q16.dtype, q16.raw_zero_point, q16.zero_point) == ("int16", 32768, 0)
    assert (q8.actual_size_bytes, q8.padded_size_bytes) == (20, 24)  # input padding
    assert [o.name for o in exe.outputs if o.is_variable_output] == [
        "tfl.pseudo_qconst_variable_output", "tfl.pseudo_qconst1_variable_output"]
    assert not exe.fully_deterministic
    _, split = select_executables(parse_package(options(SPLIT)))
    for out in split.outputs:
        assert out.needs_relayout and out.padded_z == 4 and out.layout is not None
        # Every (y, x, z) lands on its own byte inside the padded buffer.
        starts = out.layout.row_starts(slice(0, out.y_dim), slice(0, out.x_dim))
        idx = (starts[:, :, None] + np.arange(out.z_dim)).ravel()
        assert len(set(idx.tolist())) == out.element_count
        assert 0 <= idx.min() and idx.max() < out.padded_size_bytes
    _, deeplab = select_executables(parse_package(options(DEEPLAB)))
    assert deeplab.inputs[0].padded_size_bytes - deeplab.inputs[0].actual_size_bytes == 5
    assert deeplab.hinted_bytes(deeplab.inputs[0].name) == 789512
    assert exe.hinted_bytes("tfl.pseudo_qconst") == 24 and exe.hinted_bytes("nope") == 0


# -- inspect ----------------------------------------------------------------------

def test_inspect_json_has_edgetpu_key(capsys):
    assert main(["inspect", str(shared_model(V1)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (entry,) = report["edgetpu"]
    assert (entry["subgraph"], entry["operator"], entry["layout"]) == (0, 0, "current")
    types = [e["type"] for e in entry["executables"]]
    assert types == ["EXECUTION_ONLY", "PARAMETER_CACHING"]
    for e in entry["executables"]:
        assert isinstance(e["caching_token"], int) and e["caching_token"] > 0
        assert isinstance(e["parameters_bytes"], int) and e["instruction_bytes"] > 0
    (inp,), (out,) = entry["executables"][0]["inputs"], entry["executables"][0]["outputs"]
    assert inp == {"name": "input", "shape": [128, 128, 3], "dtype": "uint8", "zero_point": 128,
                   "scale": 0.0078125, "size_bytes": 49152, "data_type": "FIXED_POINT8"}
    assert out["shape"] == [1, 1001] and out["size_bytes"] == 1008
    assert main(["inspect", str(shared_model(FULLY_MAPPED[V1])), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["edgetpu"] == []
    assert main(["inspect", str(shared_model(V1))]) == 0
    text = capsys.readouterr().out
    assert "Edge TPU executables (1 edgetpu-custom-op)" in text and "0x6d146c3f97d6648c" in text


# -- damaged packages ---------------------------------------------------------------

def field_at(buf, table: int, slot: int) -> int:
    """Absolute position of a present field of the flatbuffer table at ``table``."""
    vt = table - struct.unpack_from("<i", buf, table)[0]
    assert struct.unpack_from("<H", buf, vt)[0] > 4 + 2 * slot, f"slot {slot} is absent"
    off = struct.unpack_from("<H", buf, vt + 4 + 2 * slot)[0]
    assert off, f"slot {slot} is absent"
    return table + off


def deref(buf, pos: int) -> int:
    return pos + struct.unpack_from("<I", buf, pos)[0]


def package_view(buf) -> memoryview:
    """The Package bytes (key "4") as a view into ``buf``."""
    return FlexReader(memoryview(buf)).root_map()["4"]


def executable_tables(buf: bytearray) -> list[int]:
    """Positions in ``buf`` of each Executable's root table."""
    return [offset_in(e, buf) + struct.unpack_from("<I", e, 0)[0]
            for e in raw_executables(buf)]


def package_table(buf: bytearray) -> int:
    view = package_view(buf)
    return offset_in(view, buf) + struct.unpack_from("<I", view, 0)[0]


def patched(name: str, patch) -> bytearray:
    buf = bytearray(options(name))
    patch(buf)
    return buf


@pytest.mark.parametrize("version, ok", [(9, True), (14, True), (15, False), (99, False)])
def test_min_runtime_version(version, ok, caplog):
    buf = patched(V1, lambda b: struct.pack_into("<i", b, field_at(b, package_table(b), 0),
                                                 version))
    if ok:
        with caplog.at_level(logging.WARNING, logger="coralrt.usb"):
            assert parse_package(buf).min_runtime_version == version
        assert ("lower than expected" in caplog.text) == (version < 10)
    else:
        with pytest.raises(ExecutableError, match=f"requires runtime version {version}, "
                                                  f"which is newer than .* 14"):
            parse_package(buf)


@pytest.mark.parametrize("slot, fmt, value, message", [
    (3, "<i", 0, "invalid batch size 0"),
    (3, "<i", -2, "invalid batch size -2"),
    (13, "<h", 1, r"multiple executables of the same type"),
    (13, "<h", 0, r"invalid combination of executables .*STAND_ALONE"),
])
def test_executable_checks(slot, fmt, value, message):
    def patch(b):
        eo = executable_tables(b)[0]
        struct.pack_into(fmt, b, field_at(b, eo, slot), value)
    with pytest.raises(ExecutableError, match=message) as info:
        parse_package(patched(V1, patch))
    assert isinstance(info.value, ModelError)


def test_parameter_caching_token_zero():
    def patch(b):
        struct.pack_into("<Q", b, field_at(b, executable_tables(b)[1], 14), 0)
    with pytest.raises(ExecutableError, match="caching token 0"):
        parse_package(patched(V1, patch))


def hint(b: bytearray, exe: int, index: int) -> int:
    """Position of DmaHint ``index`` of the executable table at ``exe``."""
    hints = deref(b, field_at(b, deref(b, field_at(b, exe, 7)), 0))
    return deref(b, hints + 4 + 4 * index)


def test_unknown_executable_type_is_refused_when_choosing():
    # An unknown enum value decodes (tests/test_dwn1_lenient.py); it is refused
    # where it matters: choosing the executable to run.
    def patch(b):
        struct.pack_into("<h", b, field_at(b, executable_tables(b)[0], 13), 7)
    pkg = parse_package(patched(V1, patch))
    with pytest.raises(ExecutableError, match="executable 0: executable type 7 is not one "
                                              "coralrt knows"):
        select_executables(pkg)


def test_dma_hint_checks():
    def tag(b):
        b[field_at(b, hint(b, executable_tables(b)[0], 0), 0)] = 9
    pkg = parse_package(patched(V1, tag))   # decodes: the value is kept as a number
    with pytest.raises(ExecutableError, match=r"executable 0, dma hint 0: DMA hint type 9 is "
                                              r"not one"):
        check_runnable(pkg, select_executables(pkg))

    def size(b):
        desc = deref(b, field_at(b, hint(b, executable_tables(b)[1], 1), 1))
        struct.pack_into("<i", b, field_at(b, desc, 2), 566913)
    with pytest.raises(ExecutableError, match=r"outside the 566912-byte parameter blob"):
        parse_package(patched(V1, size))

    def name(b):
        desc = deref(b, field_at(b, hint(b, executable_tables(b)[0], 1), 1))
        text = deref(b, field_at(b, deref(b, field_at(b, desc, 0)), 2))
        assert b[text + 4:text + 9] == b"input"
        b[text + 8] = ord("X")
    with pytest.raises(ExecutableError, match=r"input hint names 'inpuX', which is not one"):
        parse_package(patched(V1, name))


def test_custom_options_checks():
    pkg = bytes(package_view(options(V1)))
    cases = [
        ({"1": 0, "4": pkg, "5": -1, "6": [18, 18], "7": [pkg]}, "carries 2 packages"),
        ({"1": 0, "4": pkg, "6": [18, 18], "7": []}, "lists 2 chips but there are 1"),
        ({"1": 0, "4": pkg, "6": []}, "not a non-empty list"),
        ({"1": 0, "5": -1}, 'no serialized executable under key "4"'),
    ]
    for opts, message in cases:
        with pytest.raises(ExecutableError, match=message):
            parse_package(flexbuffers.Dumps(opts))
    assert parse_package(flexbuffers.Dumps({"1": 0, "4": pkg})).layout == "older"
    for bad in (b"", b"\x01", flexbuffers.Dumps([1, 2]), bytes(100)):
        with pytest.raises(ExecutableError):
            parse_package(bad)


@pytest.mark.parametrize("cut", [1, 8, 100, 1000, 50000])
def test_truncated(cut):
    data = options(SPLIT)
    with pytest.raises(ExecutableError):
        parse_package(data[:-cut])
    with pytest.raises(ExecutableError):
        parse_package(data[cut:])


def _structure_positions(name: str) -> list[int]:
    """Byte positions outside the bulk data (bitstreams, parameters): tables and offsets."""
    data = options(name)
    pkg = parse_package(data)
    bulk = np.zeros(len(data), bool)
    for e in pkg.executables:
        for v in [e.parameters, *e.instructions]:
            if len(v):
                at = offset_in(v, data)
                bulk[at:at + len(v)] = True
    return np.flatnonzero(~bulk).tolist()


@pytest.fixture(scope="module")
def fuzz_inputs():
    return {n: (options(n), _structure_positions(n)) for n in (SPLIT, LSTM)}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_damaged_packages_raise_executable_error_only(fuzz_inputs, data):
    name = data.draw(st.sampled_from(sorted(fuzz_inputs)))
    original, positions = fuzz_inputs[name]
    buf = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.sampled_from(positions))
        buf[pos] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        buf = buf[:data.draw(st.integers(0, len(buf)))]
    try:
        pkg = parse_package(bytes(buf))
    except ExecutableError as e:
        assert str(e)
    else:
        select_executables(pkg)
        json.dumps(describe(pkg))
