"""Decoding cost is bounded by the file's size ("never a crash", bombs).

A flatbuffer may point many offsets at one table, so a few kilobytes can
describe millions of operators.  Each bomb here is built by hand, small (8-16
KB) but describing about 10^6 tables, and must be refused with the loader's
typed error in well under a second.  The load runs in a subprocess with a
timeout, so a regression fails the test instead of hanging the suite or
eating the machine's memory.  Sharing that valid writers do (one operator
code, buffer or string for many entries) still loads, and so does every
shared real model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import flatbuffers
import numpy as np
import pytest
from conftest import REPO_ROOT, model_params, shared_model, shared_model_names
from flatbuffers import flexbuffers

from coralrt.errors import ExecutableError, ModelError
from coralrt._formats import dwn1
from coralrt._formats.flexreader import FlexReader
from coralrt._model import flatbuf, load_model
from coralrt.testing import ModelBuilder

CHILD_TIMEOUT = 20.0   # a regression takes minutes and gigabytes; fail instead
# CPU seconds of the call (wall time swings with whatever else the machine
# runs): the bombs below are refused in a tenth to a third of that.
FAST = 1.0


# -- flatbuffer helpers --------------------------------------------------------------

def offsets(b: flatbuffers.Builder, offs) -> int:
    b.StartVector(4, len(offs), 4)
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def ints(b: flatbuffers.Builder, values) -> int:
    b.StartVector(4, len(values), 4)
    for v in reversed(values):
        b.PrependInt32(v)
    return b.EndVector()


def table(b: flatbuffers.Builder, slots: int, offs=(), scalars=()) -> int:
    """A table with ``offs`` = [(slot, offset)] and ``scalars`` = [(slot, kind, value)]."""
    b.StartObject(slots)
    for slot, kind, value in scalars:
        getattr(b, f"Prepend{kind}Slot")(slot, value, 0)
    for slot, off in offs:
        b.PrependUOffsetTRelativeSlot(slot, off, 0)
    return b.EndObject()


# -- TFLite bombs ----------------------------------------------------------------------

def tflite_bomb(n_subgraphs: int, n_operators: int) -> bytes:
    """A Model whose subgraph vector repeats one subgraph offset ``n_subgraphs`` times,
    whose operator vector repeats one operator offset ``n_operators`` times."""
    b = flatbuffers.Builder(1024)
    op = table(b, 3, [(1, ints(b, [0])), (2, ints(b, [1]))])
    ops = offsets(b, [op] * n_operators)
    tensors = offsets(b, [table(b, 3, [(0, ints(b, [1]))]) for _ in range(2)])
    sg = table(b, 4, [(0, tensors), (1, ints(b, [0])), (2, ints(b, [1])), (3, ops)])
    subgraphs = offsets(b, [sg] * n_subgraphs)
    codes = offsets(b, [table(b, 4)])                     # ADD
    buffers = offsets(b, [table(b, 1)])
    root = table(b, 5, [(1, codes), (2, subgraphs), (4, buffers)], [(0, "Uint32", 3)])
    b.Finish(root, file_identifier=b"TFL3")
    return bytes(b.Output())


def run_isolated(data: bytes, call: str, tmp_path) -> dict:
    """Run ``call`` (``load_model`` or ``parse_package``) on ``data`` in a child process.

    Returns the child's report: the error type and message, and the CPU
    seconds the call took (interpreter start-up and imports excluded).
    """
    path = tmp_path / "bomb.bin"
    path.write_bytes(data)
    code = textwrap.dedent(f"""
        import json, sys, time
        from coralrt import load_model
        from coralrt._formats.dwn1 import parse_package
        from coralrt._model.custom_options import decode_flexbuffer_map
        data = open({str(path)!r}, "rb").read()
        t, wall = time.process_time(), time.perf_counter()
        try:
            {call}(data)
            report = {{"error": None, "message": ""}}
        except Exception as e:
            report = {{"error": type(e).__name__, "message": str(e)[:400]}}
        report["seconds"] = time.process_time() - t
        report["wall"] = time.perf_counter() - wall
        print(json.dumps(report))
    """)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{call} of a {len(data)}-byte bomb ran past {CHILD_TIMEOUT:.0f} s")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("n_subgraphs, n_operators", [(1000, 1000), (1900, 1900),
                                                      (250, 4000), (4000, 250)])
def test_shared_subgraphs_and_operators_are_refused_fast(n_subgraphs, n_operators, tmp_path):
    data = tflite_bomb(n_subgraphs, n_operators)
    assert 8_000 <= len(data) <= 32_000 and n_subgraphs * n_operators >= 10**6
    report = run_isolated(data, "load_model", tmp_path)
    assert report["error"] == "ModelError", report
    assert "decoding would take more than" in report["message"]
    assert report["seconds"] < FAST, report


def test_bomb_error_is_typed_in_process():
    with pytest.raises(ModelError, match="decoding would take more than") as e:
        load_model(tflite_bomb(1000, 1000))
    assert isinstance(e.value, ValueError)


def test_small_sharing_loads_until_validation():
    # 30 x 30 shared operators fit in the budget: decoding is not what refuses them.
    with pytest.raises(ModelError) as e:
        load_model(tflite_bomb(30, 30))
    assert "decoding would take" not in str(e.value)


def test_budget_is_linear_in_the_size():
    for n in (0, 100, 10**6):
        assert flatbuf.DecodeBudget(n).limit == 4 * n + 4096


# -- DWN1 bombs ------------------------------------------------------------------------

def custom_options(package: bytes) -> bytes:
    return flexbuffers.Dumps({"1": 1, "4": package, "5": 0})


def package(executables: list[bytes] | None = None, *, multi: bytes | None = None) -> bytes:
    if multi is None:
        b = flatbuffers.Builder(1024)
        blobs = [b.CreateByteVector(e) for e in executables]
        b.Finish(table(b, 1, [(0, offsets(b, blobs))]))
        multi = bytes(b.Output())
    b = flatbuffers.Builder(1024)
    m = b.CreateByteVector(multi)
    b.Finish(table(b, 8, [(1, m)], [(0, "Int32", 13)]), file_identifier=b"DWN1")
    return bytes(b.Output())


def executable_bomb(n_chunks: int, n_offsets: int) -> bytes:
    """An Executable whose instruction chunk vector repeats one chunk ``n_chunks``
    times, whose field-offset vector repeats one field offset ``n_offsets`` times."""
    b = flatbuffers.Builder(1024)
    meta = table(b, 4, scalars=[(0, "Int16", 1)])
    fo = table(b, 2, [(0, meta)], [(1, "Int32", 8)])
    fos = offsets(b, [fo] * n_offsets)
    chunk = table(b, 2, [(0, b.CreateByteVector(bytes(64))), (1, fos)])
    chunks = offsets(b, [chunk] * n_chunks)
    b.Finish(table(b, 14, [(5, chunks)], [(3, "Int32", 1)]))
    return bytes(b.Output())


def flex_bomb(n_keys: int, n_outer: int, n_inner: int) -> bytes:
    """A FlexBuffer map with ``n_keys`` entries that all name one vector of
    ``n_outer`` offsets that all name one vector of ``n_inner`` ints."""
    buf = bytearray(b"a\0\0\0")                       # the only key string, at 0
    buf += n_inner.to_bytes(4, "little")
    inner = len(buf)
    buf += bytes(4 * n_inner)
    buf += n_outer.to_bytes(4, "little")
    outer = len(buf)
    for i in range(n_outer):
        buf += (outer + 4 * i - inner).to_bytes(4, "little")
    buf += bytes([11 << 2 | 2]) * n_outer             # VECTOR_INT, 4-byte elements
    buf += bytes(-len(buf) % 4)
    buf += n_keys.to_bytes(4, "little")
    keys = len(buf)
    for i in range(n_keys):
        buf += (keys + 4 * i).to_bytes(4, "little")
    buf += (len(buf) - keys).to_bytes(4, "little") + (4).to_bytes(4, "little")
    buf += n_keys.to_bytes(4, "little")
    m = len(buf)
    for i in range(n_keys):
        buf += (m + 4 * i - outer).to_bytes(4, "little")
    buf += bytes([10 << 2 | 2]) * n_keys              # VECTOR, 4-byte elements
    buf += bytes(-len(buf) % 4)
    buf += (len(buf) - m).to_bytes(4, "little") + bytes([9 << 2 | 2, 4])   # root: MAP
    return bytes(buf)


def test_executable_bomb_is_refused_fast(tmp_path):
    data = custom_options(package([executable_bomb(1000, 1000)]))
    assert 8_000 <= len(data) <= 16_000
    report = run_isolated(data, "parse_package", tmp_path)
    assert report["error"] == "ExecutableError", report
    assert "decoding would take more than" in report["message"]
    assert report["seconds"] < FAST, report


def test_oldest_layout_executable_bomb_is_refused_fast(tmp_path):
    # No Package: key "4" is a bare Executable (and "2"/"3" mark the layout).
    exe = executable_bomb(1000, 1000)
    data = flexbuffers.Dumps({"1": 0, "2": "beagle", "3": exe, "4": exe})
    report = run_isolated(data, "parse_package", tmp_path)
    assert report["error"] == "ExecutableError", report
    assert report["seconds"] < FAST, report


def test_repeated_executable_is_refused_fast(tmp_path):
    # A MultiExecutable naming one (moderately shared) executable 2000 times.
    b = flatbuffers.Builder(1024)
    exe = b.CreateByteVector(executable_bomb(30, 30))
    b.Finish(table(b, 1, [(0, offsets(b, [exe] * 2000))]))
    data = custom_options(package(multi=bytes(b.Output())))
    report = run_isolated(data, "parse_package", tmp_path)
    assert report["error"] == "ExecutableError", report
    assert report["seconds"] < FAST, report


def test_flexbuffer_bomb_is_refused_fast(tmp_path):
    data = flex_bomb(800, 1000, 800)
    assert 8_000 <= len(data) <= 16_000
    report = run_isolated(data, "parse_package", tmp_path)
    assert report["error"] == "ExecutableError", report
    assert report["seconds"] < FAST, report


def test_flexbuffer_bomb_in_custom_options_is_refused_fast(tmp_path):
    # Custom options of TFLite_Detection_PostProcess (checked at validation) and of
    # plugin operators (OpInfo.flex_options) go through decode_flexbuffer_map.
    data = flex_bomb(800, 1000, 800)
    report = run_isolated(data, "decode_flexbuffer_map", tmp_path)
    assert report["error"] == "ModelError", report
    assert "decode budget" in report["message"]
    assert report["seconds"] < FAST, report


def test_custom_options_of_a_well_formed_map_decode_as_flexbuffers_does():
    from coralrt._model.custom_options import decode_flexbuffer_map
    small = flex_bomb(3, 2, 5)
    assert decode_flexbuffer_map(small) == flexbuffers.Loads(small)
    opts = {"num_classes": 90, "nested": [1, [2.5, "x"], {"k": True}], "blob": b"\x00\x01"}
    assert decode_flexbuffer_map(flexbuffers.Dumps(opts)) == opts


def test_flex_bomb_is_a_well_formed_map():
    # The generator is right: a small instance reads back as the shared values.
    opts = FlexReader(memoryview(flex_bomb(3, 2, 5))).root_map()
    assert opts == {"a": [[0] * 5] * 2}


def layout_executable(n_layers: int, y: int, x: int, tile_rows: int) -> bytes:
    """An Executable whose output layer vector repeats one y*x output layer
    ``n_layers`` times; its layout spreads the rows over ``tile_rows`` tile ids
    and places element (y, x) at y * x_dim + x, inside the output buffer."""
    b = flatbuffers.Builder(1024)

    def vec(values):
        return b.CreateNumpyVector(np.asarray(values, np.int32))

    layout = table(b, 6, [(0, vec(np.arange(y) % tile_rows)), (1, vec(np.zeros(x))),
                          (2, vec(np.zeros(tile_rows))), (3, vec(np.arange(x))),
                          (4, vec(np.arange(y))), (5, vec(np.full(x, x)))])
    out = table(b, 3, [(0, layout)])
    layer = table(b, 12, [(0, b.CreateString("out")), (8, out)],
                  [(1, "Int32", y * x), (2, "Int32", y), (3, "Int32", x), (4, "Int32", 1),
                   (7, "Uint8", 1)])
    layers = offsets(b, [layer] * n_layers)
    chunk = table(b, 2, [(0, b.CreateByteVector(bytes(64)))])
    b.Finish(table(b, 14, [(5, offsets(b, [chunk])), (9, layers)], [(3, "Int32", 1)]))
    return bytes(b.Output())


def test_layout_of_a_shared_output_layer_is_checked_once_per_tile_row(tmp_path):
    # 150 outputs of 1000 x 1000 positions: checking every position took 8 s.
    data = custom_options(package([layout_executable(150, 1000, 1000, 4)]))
    report = run_isolated(data, "parse_package", tmp_path)
    assert report["error"] is None, report
    assert report["seconds"] < FAST, report


def test_layout_with_many_tile_rows_is_charged_to_the_budget(tmp_path):
    # No Edge TPU has 1000 tile rows; each check costs a million positions.
    data = custom_options(package([layout_executable(200, 1000, 1000, 1000)]))
    report = run_isolated(data, "parse_package", tmp_path)
    assert report["error"] == "ExecutableError", report
    assert "exceeds the decoding budget" in report["message"]
    assert report["seconds"] < FAST, report
    # One such output on its own still fits.
    pkg = dwn1.parse_package(custom_options(package([layout_executable(1, 1000, 1000,
                                                                       1000)])))
    (out,) = pkg.executables[0].outputs
    assert out.layout.index(999, 999) == 999_999


def test_dwn1_bomb_error_is_typed_in_process():
    with pytest.raises(ExecutableError, match="decoding would take more than"):
        dwn1.parse_package(custom_options(package([executable_bomb(1000, 1000)])))


# -- valid sharing still loads ------------------------------------------------------------

def chain_with_shared_tables(n: int, weight_bytes: int) -> bytes:
    """n ADD operators in a chain, written the way a deduplicating writer would:
    every operator_codes entry names one OperatorCode table, every buffers entry
    one Buffer table (``weight_bytes`` of float32 zeros), every tensor one shape
    vector and one name string, every operator one options table."""
    size = weight_bytes // 4
    b = flatbuffers.Builder(1024)
    data = b.CreateNumpyVector(np.zeros(weight_bytes, np.uint8))
    shape, name = ints(b, [size]), b.CreateString("t" * 256)
    options = table(b, 1)                                 # AddOptions
    ops = [table(b, 5, [(1, ints(b, [i, n + 1 + i])), (2, ints(b, [i + 1])), (4, options)],
                 [(0, "Uint32", i), (3, "Uint8", 11)]) for i in range(n)]
    # Tensors 0..n: the chain (0 is the input); n+1..2n: the constants, buffers 1..n.
    tensors = [table(b, 4, [(0, shape), (3, name)]) for _ in range(n + 1)]
    tensors += [table(b, 4, [(0, shape), (3, name)], [(2, "Uint32", 1 + i)]) for i in range(n)]
    sg = table(b, 4, [(0, offsets(b, tensors)), (1, ints(b, [0])), (2, ints(b, [n])),
                      (3, offsets(b, ops))])
    code = table(b, 4)                                    # ADD, version 1 (default)
    weights = table(b, 1, [(0, data)])
    empty = table(b, 1)
    root = table(b, 5, [(1, offsets(b, [code] * n)), (2, offsets(b, [sg])),
                        (4, offsets(b, [empty] + [weights] * n))], [(0, "Uint32", 3)])
    b.Finish(root, file_identifier=b"TFL3")
    return bytes(b.Output())


def test_tables_shared_like_a_deduplicating_writer_load():
    data = chain_with_shared_tables(1000, 64 * 1024)
    model = load_model(data)
    sg = model.main
    assert len(sg.operators) == 1000 and len(model.operator_codes) == 1
    assert all(t.name == "t" * 256 for t in sg.tensors)
    assert sum(t.nbytes for t in sg.tensors if t.is_constant) == 1000 * 64 * 1024
    # 64 MB of constants out of a file of about 100 KB, as zero-copy views.
    assert len(data) < 200_000
    assert np.shares_memory(sg.tensors[-1].data, np.frombuffer(data, np.uint8))
    # A shared string is decoded once, however many tables name it.
    assert len({id(t.name) for t in sg.tensors}) == 1


def test_writer_output_with_shared_operands_loads():
    b = ModelBuilder()
    x = b.input("x", (1, 16), np.float32)
    c = b.constant("c", np.ones((1, 16), np.float32))
    for i in range(3000):
        y = b.tensor(f"y{i}", (1, 16), np.float32)
        b.op("ADD", [x, c], [y])
        x = y
    b.output(x)
    data = b.build().to_bytes()
    budget = flatbuf.DecodeBudget(len(data))
    flatbuf.decode(data, budget)
    assert budget.spent <= len(data) // 4          # what an unshared file can spend
    assert len(load_model(data).main.operators) == 3000


@pytest.mark.parametrize("name", shared_model_names())
def test_real_models_spend_a_sliver_of_the_budget(name):
    data = shared_model(name).read_bytes()
    budget = flatbuf.DecodeBudget(len(data))
    flatbuf.decode(data, budget)
    assert budget.spent <= len(data) // 4 + 64, (budget.spent, len(data))
    load_model(data)


@pytest.mark.parametrize("name", shared_model_names(compiled=True))
def test_real_packages_spend_a_sliver_of_the_budget(name, monkeypatch):
    budgets = []

    class Spy(flatbuf.DecodeBudget):
        __slots__ = ()

        def __init__(self, nbytes):
            super().__init__(nbytes)
            budgets.append(self)

    monkeypatch.setattr(dwn1, "DecodeBudget", Spy)
    model = load_model(shared_model(name))
    ops = [op for sg in model.subgraphs for op in sg.operators
           if op.name == "edgetpu-custom-op"]
    assert ops
    for op in ops:
        budgets.clear()
        dwn1.parse_package(op.custom_options)
        (budget,) = budgets
        assert budget.spent <= budget.nbytes // 4, (budget.spent, budget.nbytes)


@pytest.mark.parametrize("name", model_params(["mobilenet_v1_0.25_128_quant.tflite"]))
def test_round_trip_through_the_writer_stays_in_budget(name):
    model = load_model(shared_model(name))
    data = model.to_bytes()
    budget = flatbuf.DecodeBudget(len(data))
    flatbuf.decode(data, budget)
    assert budget.spent <= len(data) // 4
    assert len(load_model(data).main.operators) == len(model.main.operators)
