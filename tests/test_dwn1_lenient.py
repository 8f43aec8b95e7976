"""DWN1 packages with enum values coralrt does not know, and packages of early compilers.

A value outside the schema's enums (a newer compiler, or one flipped byte) is
kept as a number and warned about once per field and value; every other field
is still decoded and shown; loading refuses only the values a run needs.
The packages are re-encoded from the executables of a real compiled model by
a small writer driven by ``dwn1_schema.TABLES``, with one field changed.
"""

from __future__ import annotations

import json
import logging

import flatbuffers
import numpy as np
import pytest
from conftest import extra_model_paths, shared_model, shared_model_names
from flatbuffers import flexbuffers
from support.sim import dwn1_backend

from coralrt._cli.main import main
from coralrt.errors import ExecutableError, ModelError
from coralrt._formats.dwn1 import (
    UnknownEnum, check_runnable, describe, parse_package, select_executables,
)
from coralrt._formats.dwn1_schema import LAYOUT, TABLES, UNIONS, binary_strings
from coralrt._formats.flexreader import FlexReader
from coralrt import load_model
from coralrt._model.flatbuf import decode_root
from coralrt._model.writer import write_model
from coralrt import open_device

V1 = "edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite"
EARLY = "mobilenet_quant_v1_224_feature_layers-custom_op.tflite"

# -- a DWN1 writer ------------------------------------------------------------------------

_SCALARS = {"bool": "Bool", "int16": "Int16", "int32": "Int32", "int64": "Int64",
            "uint64": "Uint64", "float32": "Float32", "utype": "Uint8"}
_VECTORS = {"uint8": np.uint8, "int32": np.int32, "int64": np.int64}


def _offsets(b: flatbuffers.Builder, offs: list[int]) -> int:
    b.StartVector(4, len(offs), 4)
    for off in reversed(offs):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _table(b: flatbuffers.Builder, tname: str, obj: dict) -> int:
    fields = TABLES[tname]
    children = []
    for name, slot, kind, _ in fields:
        value = obj.get(name)
        if value is None or kind in _SCALARS:
            continue
        if kind == "string":
            off = b.CreateString(value)
        elif kind == "[string]":        # MultiExecutable: binary strings
            off = _offsets(b, [b.CreateByteVector(bytes(v)) for v in value])
        elif kind.startswith("[") and kind[1:-1] in _VECTORS:
            off = b.CreateNumpyVector(np.asarray(value, _VECTORS[kind[1:-1]]))
        elif kind.startswith("["):
            off = _offsets(b, [_table(b, kind[1:-1], t) for t in value])
        elif kind.startswith("union:"):
            # A member the schema does not name gets an empty table.
            member = UNIONS[kind[6:]].get(obj.get(name + "_type"), "InputLayer")
            off = _table(b, member, value)
        else:
            off = _table(b, kind, value)
        children.append((slot, off))
    b.StartObject(len(fields))
    for name, slot, kind, _ in fields:
        value = obj.get(name)
        if value is not None and kind in _SCALARS:    # every value written, defaults too
            getattr(b, f"Prepend{_SCALARS[kind]}Slot")(slot, value, None)
    for slot, off in children:
        b.PrependUOffsetTRelativeSlot(slot, off, 0)
    return b.EndObject()


def _finish(tname: str, obj: dict, identifier: bytes | None = None) -> bytes:
    b = flatbuffers.Builder(1 << 16)
    b.Finish(_table(b, tname, obj), file_identifier=identifier)
    return bytes(b.Output())


def custom_options(executables: list[dict]) -> bytes:
    """An "older"-layout custom_options map (keys 1 and 4) around these executables."""
    multi = _finish("MultiExecutable", {"serialized_executables": [
        _finish("Executable", e) for e in executables]})
    package = _finish("Package", {"min_runtime_version": 13, "compiler_version": "test",
                                  "serialized_multi_executable": np.frombuffer(multi, np.uint8)},
                      b"DWN1")
    return flexbuffers.Dumps({"1": 0, "4": package})


def real_options(name: str = V1) -> bytes:
    model = load_model(shared_model(name))
    return bytes(next(op for op in model.main.operators
                      if op.name == "edgetpu-custom-op").custom_options)


def real_executables(name: str = V1) -> list[dict]:
    """The decoded Executable tables of a shared model: [EXECUTION_ONLY, PARAMETER_CACHING]."""
    pkg = decode_root(FlexReader(memoryview(real_options(name))).root_map()["4"], "Package",
                      LAYOUT, UNIONS)
    return [decode_root(e, "Executable", LAYOUT, UNIONS) for e in
            binary_strings(memoryview(pkg["serialized_multi_executable"]), "test")]


def with_change(change) -> bytes:
    exes = real_executables()
    change(exes[0])
    return custom_options(exes)


def _hint(exe: dict, kind: int) -> dict:
    """The first DMA hint of union tag ``kind`` (1 descriptor, 2 instruction, 3 interrupt)."""
    return next(h for h in exe["dma_hints"]["hints"] if h["any_hint_type"] == kind)


def _set(path_value):
    """A change that sets ``exe[k1][k2]...`` (ints index lists) to a value."""
    *path, value = path_value

    def change(exe):
        node = exe
        for k in path[:-1]:
            node = k(node) if callable(k) else node[k]
        node[path[-1]] = value
    return change


# (id, change to executable 0, field, value, what loading says: None = it loads)
CASES = [
    ("input data type", _set(("input_layers", 0, "data_type", 17)), "data type", 17,
     r"executable 0, input layer 'input': data type 17 is not one coralrt knows"),
    ("output data type", _set(("output_layers", 0, "data_type", 250)), "data type", 250,
     r"executable 0, output layer 'MobilenetV1/Predictions/Reshape_1': data type 250 is not"),
    ("executable type", _set(("type", 7)), "executable type", 7,
     r"executable 0: executable type 7 is not one coralrt knows"),
    ("output layer kind", _set(("output_layers", 0, "any_layer_type", 7)), "output layer kind",
     7, r"output layer 'MobilenetV1/Predictions/Reshape_1': layer kind 7 is not one"),
    ("input layer kind", _set(("input_layers", 0, "any_layer_type", 9)), "input layer kind", 9,
     None),
    ("DMA hint type", _set((lambda e: _hint(e, 3), "any_hint_type", 9)), "DMA hint type", 9,
     r"executable 0, dma hint 3: DMA hint type 9 is not one coralrt knows"),
    ("DMA direction", _set((lambda e: _hint(e, 2), "direction", 5)), "DMA direction", 5,
     r"executable 0, dma hint 0: DMA direction 5 is not one coralrt knows"),
    ("DMA target", _set((lambda e: _hint(e, 1), "any_hint", "meta", "desc", 9)),
     "DMA descriptor target", 9, r"dma hint 1: DMA descriptor target 9 is not one"),
    ("interrupt type", _set((lambda e: _hint(e, 3), "any_hint", "type", 6)), "interrupt type",
     6, r"dma hint 3: interrupt type 6 is not one coralrt knows"),
]


def _fix_unknown_member(exe: dict) -> None:
    # The decoder drops a member it cannot name; the writer needs a table for it.
    for layer in exe.get("input_layers", []) + exe.get("output_layers", []):
        if layer.get("any_layer_type") not in (0, 1, 2) and layer.get("any_layer") is None:
            layer["any_layer"] = {}
    for h in exe["dma_hints"]["hints"]:
        if h["any_hint_type"] not in UNIONS["AnyHint"]:
            h["any_hint"] = {}


@pytest.fixture(scope="module")
def packages() -> dict:
    out = {}
    for case_id, change, *_ in CASES:
        def both(exe, change=change):
            change(exe)
            _fix_unknown_member(exe)
        out[case_id] = with_change(both)
    return out


def test_the_writer_round_trips_a_real_package(caplog):
    with caplog.at_level(logging.WARNING, logger="coralrt"):
        mine = parse_package(custom_options(real_executables()))
    assert not caplog.records and mine.unknown_values == []
    theirs = parse_package(real_options())
    assert describe(mine)["executables"] == describe(theirs)["executables"]
    with open_device(backend=dwn1_backend()) as dev:
        h = dev.load(custom_options(real_executables()))
        out = dev.run(h, [np.zeros(x.shape, np.uint8) for x in h.exe.inputs])
        assert out[0].shape == tuple(h.exe.outputs[0].shape)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_an_unknown_value_is_kept_warned_about_and_refused_where_it_matters(case, packages,
                                                                              caplog):
    case_id, _, field, value, refusal = case
    with caplog.at_level(logging.WARNING, logger="coralrt"):
        pkg = parse_package(packages[case_id])
    # One warning, naming the field and the value; the value kept as a number.
    (record,) = caplog.records
    assert f"{field} {value} is not one coralrt knows" in record.getMessage()
    (unknown,) = pkg.unknown_values
    assert (unknown.field, unknown.value, unknown.count) == (field, value, 1)
    assert isinstance(unknown.value, UnknownEnum) and unknown.value == value
    assert repr(unknown.value).endswith(f"({value})")
    # Everything else is decoded as in the unchanged package.
    report = describe(pkg)
    plain = describe(parse_package(real_options()))
    assert json.loads(json.dumps(report["unknown_values"]))[0]["value"] == value
    for mine, theirs in zip(report["executables"], plain["executables"]):
        for key in ("batch_size", "chip", "caching_token", "parameters_bytes",
                    "instruction_chunks", "estimated_cycles", "fully_deterministic"):
            assert mine[key] == theirs[key], key
        assert [x["name"] for x in mine["inputs"] + mine["outputs"]] == \
            [x["name"] for x in theirs["inputs"] + theirs["outputs"]]
    # Loading: refused with the field and the value, or (not needed by a run) accepted.
    with open_device(backend=dwn1_backend()) as dev:
        if refusal is None:
            h = dev.load(packages[case_id])
            dev.run(h, [np.zeros(x.shape, np.uint8) for x in h.exe.inputs])
        else:
            with pytest.raises(ExecutableError, match=refusal) as info:
                dev.load(packages[case_id])
            assert isinstance(info.value, ModelError)


def test_one_warning_per_field_and_value(caplog):
    def change(exe):
        exe["input_layers"][0]["data_type"] = 17
        exe["output_layers"][0]["data_type"] = 17
        exe["type"] = 7
    with caplog.at_level(logging.WARNING, logger="coralrt"):
        pkg = parse_package(with_change(change))
    assert len(caplog.records) == 2
    by_field = {u.field: u for u in pkg.unknown_values}
    assert by_field["data type"].count == 2 and by_field["executable type"].count == 1
    assert "1 more place(s)" in str(by_field["data type"])
    # Two executables and one of unknown type: which one runs is not decided.
    with pytest.raises(ExecutableError, match="executable type 7 .* cannot be decided"):
        select_executables(pkg)
    assert [e["role"] for e in describe(pkg)["executables"]] == ["unknown", "unknown"]


def test_a_single_executable_of_unknown_type_is_refused_when_loaded():
    exe = real_executables()[0]
    exe["type"] = 5
    pkg = parse_package(custom_options([exe]))
    assert select_executables(pkg) == (None, pkg.executables[0])
    with pytest.raises(ExecutableError, match="executable 0: executable type 5 is not one"):
        check_runnable(pkg, select_executables(pkg))


def test_structural_damage_is_still_an_error():
    def change(exe):
        exe["input_layers"][0]["data_type"] = 17
        exe["output_layers"][0]["any_layer_type"] = 0     # no OutputLayer at all
    with pytest.raises(ExecutableError, match="carries no OutputLayer information"):
        parse_package(with_change(change))
    data = with_change(_set(("input_layers", 0, "data_type", 17)))
    with pytest.raises(ExecutableError):
        parse_package(data[:len(data) // 2])


@pytest.fixture
def unknown_model(tmp_path, packages):
    model = load_model(shared_model(V1))
    op = next(op for op in model.main.operators if op.name == "edgetpu-custom-op")
    op.custom_options = packages["input data type"]
    path = tmp_path / "unknown_data_type_edgetpu.tflite"
    path.write_bytes(write_model(model))
    return path


def test_inspect_shows_the_number_and_the_warning(unknown_model, capsys):
    assert main(["inspect", str(unknown_model)]) == 0
    out, err = capsys.readouterr()
    assert "unknown (17)" in out and "unreadable" not in out
    assert "warning: executable 0 (EXECUTION_ONLY), input 0 'input': data type 17 is not " \
           "one coralrt knows (kept as DataType(17))" in out
    assert "PARAMETER_CACHING  cache" in out and "0x6d146c3f97d6648c" in out
    assert "data type 17" in err      # the log warning
    assert main(["inspect", "--json", str(unknown_model)]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["edgetpu"]
    assert "error" not in entry
    run = entry["executables"][0]
    assert run["inputs"][0]["data_type"] == 17 and run["inputs"][0]["dtype"] is None
    assert run["outputs"][0]["data_type"] == "FIXED_POINT8"
    assert entry["unknown_values"][0]["value"] == 17
    assert entry["unknown_values"][0]["field"] == "data type"


def test_a_session_refuses_the_model_naming_field_and_value(unknown_model):
    from coralrt import InferenceSession
    with open_device(backend=dwn1_backend()) as dev:
        with pytest.raises(ExecutableError, match=r"input layer 'input': data type 17 is not"):
            InferenceSession(unknown_model, target="coral", device=dev)


# -- real packages: no unknown values ------------------------------------------------------

def _custom_ops(path):
    model = load_model(path)
    return [op for g in model.subgraphs for op in g.operators if op.name == "edgetpu-custom-op"]


@pytest.mark.parametrize("name", shared_model_names(compiled=True))
def test_compiled_models_decode_without_warnings(name, caplog):
    ops = _custom_ops(shared_model(name))
    with caplog.at_level(logging.WARNING, logger="coralrt"):
        for op in ops:
            pkg = parse_package(op.custom_options)
            assert pkg.unknown_values == []
            assert all(e.layer_format == "current" for e in pkg.executables)
            check_runnable(pkg, select_executables(pkg))
    assert ops and not caplog.records


@pytest.mark.parametrize("path", extra_model_paths())
def test_extra_models_decode_without_warnings(path, caplog):
    try:
        ops = _custom_ops(path)
    except ModelError:
        pytest.skip("not a valid model (an invalid-model test file)")
    if not ops:
        pytest.skip("no edgetpu-custom-op")
    with caplog.at_level(logging.WARNING, logger="coralrt"):
        for op in ops:
            pkg = parse_package(op.custom_options)
            assert pkg.unknown_values == []
            json.dumps(describe(pkg))
    assert not caplog.records


@pytest.mark.parametrize("path", [p for p in extra_model_paths()
                                  if p.values[0] is None or p.values[0].name == EARLY])
def test_an_early_compilers_layers_match_the_model(path, capsys):
    (op,) = _custom_ops(path)
    model = load_model(path)
    pkg = parse_package(op.custom_options)
    assert pkg.layout == "oldest" and pkg.unknown_values == []
    _, exe = select_executables(pkg)
    assert exe.layer_format == "early" and exe.chip == "beagle"
    for layers, tensors in ((exe.inputs, op.inputs), (exe.outputs, op.outputs)):
        for layer, i in zip(layers, tensors):
            t = model.main.tensors[i]
            assert layer.name == t.name and layer.data_type == "FIXED_POINT8"
            assert layer.dtype == t.dtype.name == "uint8"
            assert layer.zero_point == int(t.quantization.zero_point[0])
            assert layer.scale == pytest.approx(float(t.quantization.scale[0]), rel=1e-6)
            assert layer.actual_size_bytes == t.nbytes
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "unreadable" not in out and "early Layer tables" in out
