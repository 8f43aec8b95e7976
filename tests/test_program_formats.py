"""The table of program formats (coralrt._formats.opnames): each format's custom
operator, magic and handle class agree with the code that writes and reads them,
the executor chooses by operator name and the USB driver by format id."""

from __future__ import annotations

import importlib

import numpy as np
from conftest import shared_model

from coralrt._formats import segment_codec
from coralrt._formats.opnames import (
    BY_ID, BY_OP, DEVICE_OPS, DWN1, EDGETPU_OP, FORMATS, SEGMENT, SEGMENT_OP, identify,
)
from coralrt import load_model
from coralrt._model.compiled import compiled_by
from coralrt._runtime.device import EdgeTpuDevice, RunStats
from coralrt._runtime.executor import build_program
from coralrt.testing import SimulatedBackend
from coralrt._usb import handles, open_device
from coralrt._usb.extension import PROGRAM_KINDS

EDGETPU_MODEL = "edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite"


def _segment_bytes() -> bytes:
    from coralrt._formats.segment import build_segment
    from coralrt.testing import ModelBuilder
    b = ModelBuilder(name="relu")
    x = b.input("x", (1, 4, 4, 2), np.int8, scale=0.1, zero_point=0)
    y = b.tensor("y", (1, 4, 4, 2), np.int8, scale=0.1, zero_point=0)
    b.op("RELU", [x], [y])
    b.output(y)
    return segment_codec.encode(build_segment(b.build()))


def _package() -> bytes:
    model = load_model(shared_model(EDGETPU_MODEL))
    return bytes(next(op for op in model.main.operators if op.name == EDGETPU_OP).custom_options)


def test_the_table_indexes_every_format_by_id_and_operator():
    assert FORMATS == (SEGMENT, DWN1)
    assert DEVICE_OPS == (SEGMENT_OP, EDGETPU_OP)
    for fmt in FORMATS:
        assert BY_ID[fmt.id] is fmt and BY_OP[fmt.op_name] is fmt
    # The kinds a pyusb backend may refuse are the formats' ids.
    assert PROGRAM_KINDS == tuple(BY_ID)


def test_each_format_round_trips_its_magic_operator_and_handle():
    segment, package = _segment_bytes(), _package()
    # Magic: the segment codec writes the table's; DWN1 has none, and is what is left.
    assert segment_codec.MAGIC == SEGMENT.magic and segment.startswith(SEGMENT.magic)
    assert DWN1.magic is None and not DWN1.matches(package)
    assert identify(segment) is SEGMENT and identify(memoryview(segment)) is SEGMENT
    assert identify(package) is DWN1 and identify(b"") is DWN1
    # Operator: a compiled model's operator names its format and its compiler.
    model = load_model(shared_model(EDGETPU_MODEL))
    assert compiled_by(model) == BY_OP[EDGETPU_OP].compiler == "edgetpu_compiler"
    assert SEGMENT.compiler == "coralrt"
    # Handle: the class the table names is the one registered under the format's id.
    for fmt in FORMATS:
        module, name = fmt.handle.split(":")
        cls = getattr(importlib.import_module(module), name)
        assert handles.HANDLES[fmt.id] is cls and cls.kind == fmt.id
    assert set(handles.HANDLES) == set(BY_ID)


def test_the_driver_takes_the_handle_class_from_the_table(monkeypatch):
    made = []

    class Recording(handles.SegmentHandle):
        def __init__(self, data):
            made.append(bytes(data[:8]))
            super().__init__(data)

    monkeypatch.setitem(handles.HANDLES, "segment", Recording)
    segment = _segment_bytes()
    with open_device(backend=SimulatedBackend(firmware_loaded=True, lock_scope="process")) as dev:
        h = dev.load_as(segment, "segment")
        assert type(h) is Recording and made == [SEGMENT.magic]
        assert dev.load(segment) is h                  # the same program: the same handle
        out = dev.run(h, [np.full((1, 4, 4, 2), -3, np.int8)])
        assert (out[0] == 0).all()
    assert len(made) == 1


class _FakeDevice(EdgeTpuDevice):
    """Records what the executor loads; outputs lack the batch dimension, as DWN1's do."""

    kind, path = "fake", "fake:0"

    def __init__(self, model):
        self.loads = []
        sg = model.main
        self.shapes = [sg.tensors[t].shape[1:] for t in sg.outputs]

    def load_as(self, program, format_id, *, output_dtypes=None):
        self.loads.append((format_id, output_dtypes))
        return object()

    def run(self, handle, inputs):
        return [np.zeros(shape, np.uint8) for shape in self.shapes]

    @property
    def last_stats(self):
        return RunStats()


def test_the_executor_chooses_by_operator_name_and_applies_the_output_fixups():
    model = load_model(shared_model(EDGETPU_MODEL))
    sg = model.main
    device = _FakeDevice(model)
    program = build_program(model, device=device, backend=None)
    tpu = [i for i, op in enumerate(sg.operators) if op.name == EDGETPU_OP]
    assert device.loads == [("dwn1", [sg.tensors[t].dtype for t in sg.operators[i].outputs])
                            for i in tpu]
    inputs = [np.zeros(sg.tensors[t].shape, np.uint8) for t in sg.inputs]
    outputs = program.run(inputs)
    assert [o.shape for o in outputs] == [tuple(sg.tensors[t].shape) for t in sg.outputs]


def test_a_device_with_load_only_gets_the_bytes(monkeypatch):
    """A device written before ``load_as`` (a plugin's) is still handed the program."""
    seen = []
    monkeypatch.setattr(_FakeDevice, "load_as", EdgeTpuDevice.load_as)
    monkeypatch.setattr(_FakeDevice, "load", lambda self, program: seen.append(program),
                        raising=False)
    model = load_model(shared_model(EDGETPU_MODEL))
    build_program(model, device=_FakeDevice(model), backend=None)
    assert [bytes(p) for p in seen] == [_package()]

