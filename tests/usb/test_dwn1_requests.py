"""The simulated stick's DWN1 test mode answers request by request.

A backend in test mode knows the DWN1 packages a test gave it
(``SimulatedBackend.know_dwn1``); its sticks recognise a request by its
instructions (the bits a host links at ``FieldOffset`` positions ignored),
follow the executable's DMA hints, make each output readable only once the
inputs before it arrived, queue one event per request, and raise the fatal
error for any stream the program does not expect.  Output bytes are
placeholders computed from the inputs (coralrt/_sim/stick/dwn1_requests.py);
here they are recomputed from the documented formula, independently.

The raw tests talk to the stick with plain pyusb calls, as libedgetpu does:
several requests sent back to back before anything is read, outputs read in
1024-byte (USB 3) or 256-byte (USB 2) transfers.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import usb.core
import usb.util
from conftest import random_inputs, shared_model, shared_model_names
from support.sim import accept_dwn1, dwn1_backend, isolated_dirs, packages_of  # noqa: F401

from coralrt.errors import DeviceLostError, ExecutableError
from coralrt._formats.dwn1 import parse_package, select_executables
from coralrt.testing import SimulatedBackend
from coralrt._sim.stick.dwn1_requests import instruction_mask
from coralrt._usb import bringup, open_device
from coralrt._usb import constants as C
from coralrt._usb.transport import Transport

V1 = "edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite"
V2 = "edgetpu/mobilenet_v2_1.0_224_quant_edgetpu.tflite"
DEEPLAB = "edgetpu/deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite"
LSTM = "edgetpu/keras_lstm_mnist_ptq_edgetpu.tflite"
EVENT = struct.Struct("<QIB3x")
SHORT = 30            # ms: a read that must find nothing


def package(name: str) -> bytes:
    (pkg,) = packages_of(shared_model(name))
    return pkg


def executables(name: str):
    return select_executables(parse_package(package(name)))


# -- the placeholder formula, written out again from the docstring ----------------------------

def crc_of_inputs(payloads) -> int:
    crc = 0
    for p in payloads:
        crc = zlib.crc32(zlib.crc32(p).to_bytes(4, "little"), crc)
    return crc


def expected_bytes(inputs_crc: int, hint_index: int, offset: int, size: int) -> bytes:
    seed = zlib.crc32(hint_index.to_bytes(4, "little"), inputs_crc)
    x = (np.arange(offset, offset + size, dtype=np.uint64) * 0x9E3779B1) & 0xFFFFFFFF
    x ^= seed
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    return (x >> 24).astype(np.uint8).tobytes()


def expected_outputs(exe, input_payloads) -> list[bytes]:
    """The placeholder bytes of each output hint of one request of ``exe``."""
    crc = crc_of_inputs(input_payloads)
    return [expected_bytes(crc, j, h.offset, h.size) for j, h in enumerate(exe.dma_hints)
            if h.kind == "output" and h.size]


def test_the_formula_by_hand_for_a_few_bytes():
    # Byte 0 of hint 2 at offset 0, inputs CRC 0: x = seed, mixed; by plain integers.
    seed = zlib.crc32((2).to_bytes(4, "little"), 0)
    x = seed ^ (seed >> 16)
    x = (x * 0x85EBCA6B) % 2**32
    x ^= x >> 13
    assert expected_bytes(0, 2, 0, 3)[0] == x >> 24
    assert len(set(expected_bytes(0, 2, 0, 4096))) > 200       # not a constant


# -- raw pyusb helpers --------------------------------------------------------------------------

def raw_stick(programs, **kw):
    kw.setdefault("transcript_limit", None)
    backend = accept_dwn1(SimulatedBackend(firmware_loaded=True, **kw), programs)
    dev = usb.core.find(backend=backend, idVendor=0x18D1, idProduct=0x9302)
    dev.set_configuration(1)
    usb.util.claim_interface(dev, 0)
    bringup.bring_up(Transport(dev, timeout=1.0))
    return backend, dev


def send(dev, tag: int, payload, piece: int = 1 << 20) -> None:
    payload = bytes(payload)
    dev.write(0x01, struct.pack("<II", len(payload), tag))
    for i in range(0, len(payload), piece):
        dev.write(0x01, payload[i:i + piece])


def event(dev, timeout=1000) -> tuple:
    return EVENT.unpack(bytes(dev.read(0x82, 16, timeout=timeout)))


def nothing_on(dev, ep: int, size: int = 1024) -> bool:
    try:
        dev.read(ep, size, timeout=SHORT)
    except usb.core.USBTimeoutError:
        return True
    return False


def read_all(dev, total: int, size: int) -> list[bytes]:
    """EP 0x81 reads of ``size`` until ``total`` bytes came (each transfer kept apart)."""
    got, n = [], 0
    while n < total:
        got.append(bytes(dev.read(0x81, size, timeout=1000)))
        assert 0 < len(got[-1]) <= size
        n += len(got[-1])
    assert n == total
    return got


def send_caching(dev, pc) -> None:
    send(dev, 0, pc.instructions[0])
    send(dev, 2, pc.parameters, piece=100_000)


def fatal_detail(backend) -> str:
    (entry,) = [e for e in backend.transcript if e["op"] == "fatal"]
    return entry["detail"]


def is_fatal(dev, backend) -> bool:
    """The stick raised its fatal error: recorded, and bulk out times out from then on."""
    with pytest.raises(usb.core.USBTimeoutError):
        send(dev, 0, b"\0" * 8)
    return backend.devices[0].engine.fatal is not None and \
        [e["value"] for e in backend.transcript if e["op"] == "fatal"] == [C.FATAL_INTERRUPT_BIT]


# -- one event per request; outputs only after the inputs ---------------------------------------

def test_a_request_gets_exactly_one_event_after_its_last_stream():
    pc, eo = executables(V1)
    backend, dev = raw_stick([package(V1)])
    send(dev, 0, pc.instructions[0])
    assert nothing_on(dev, 0x82, 16)                 # instructions alone: no event yet
    send(dev, 2, pc.parameters, piece=65536)
    assert event(dev) == (0, 0, 4)
    assert nothing_on(dev, 0x82, 16)                 # one event per request, not per stream
    x = bytes(range(256)) * 192
    send(dev, 0, eo.instructions[0])
    send(dev, 1, x)
    assert b"".join(read_all(dev, 1008, 1024)) == expected_outputs(eo, [x])[0]
    assert event(dev) == (0, 0, 4)
    assert nothing_on(dev, 0x82, 16) and nothing_on(dev, 0x81)
    done = [e for e in backend.transcript if e["op"] == "dwn1_request"]
    assert [(e["type"], e["tag"], e["length"]) for e in done] == [
        ("PARAMETER_CACHING", 4, 0), ("EXECUTION_ONLY", 4, 1008)]
    assert done[1]["value"] == crc_of_inputs([x])


def test_outputs_are_not_readable_before_the_inputs_arrive():
    pc, eo = executables(V1)
    backend, dev = raw_stick([package(V1)])
    send_caching(dev, pc)
    assert event(dev)[2] == 4
    send(dev, 0, eo.instructions[0])
    assert nothing_on(dev, 0x81)                     # the input has not arrived
    x = np.random.default_rng(1).integers(0, 256, 49152, np.uint8).tobytes()
    dev.write(0x01, struct.pack("<II", len(x), 1))
    dev.write(0x01, x[:49000])
    assert nothing_on(dev, 0x81)                     # ... nor all of it
    dev.write(0x01, x[49000:])
    assert bytes(dev.read(0x81, 4096, timeout=1000)) == expected_outputs(eo, [x])[0]
    assert event(dev)[2] == 4


def test_caching_and_execution_requests_sent_back_to_back_then_read():
    # As libedgetpu does: the parameter-caching request and two execution requests go
    # out before anything is read; events and outputs wait, in order.
    pc, eo = executables(V1)
    backend, dev = raw_stick([package(V1)])
    xs = [bytes(49152), bytes([7]) * 49152]
    send_caching(dev, pc)
    for x in xs:
        send(dev, 0, eo.instructions[0])
        send(dev, 1, x)
    assert [event(dev)[2] for _ in range(3)] == [4, 4, 4]
    assert nothing_on(dev, 0x82, 16)
    outs = [b"".join(read_all(dev, 1008, 1024)) for _ in xs]
    assert outs == [expected_outputs(eo, [x])[0] for x in xs]
    assert outs[0] != outs[1]                        # the inputs show in the bytes
    assert nothing_on(dev, 0x81)


@pytest.mark.parametrize("usb_speed, size", [("usb3", 1024), ("usb2", 256)])
def test_queued_small_reads_reassemble_outputs_without_crossing_them(usb_speed, size):
    # deeplab: outputs of 278,784 and 256 bytes.  A transfer ends where an output's
    # DMA ends (a short transfer), so the first output's last read is short.
    pc, eo = executables(DEEPLAB)
    backend, dev = raw_stick([package(DEEPLAB)], usb_speed=usb_speed)
    x = np.random.default_rng(2).integers(0, 256, 789512, np.uint8).tobytes()
    send_caching(dev, pc)
    send(dev, 0, eo.instructions[0])
    send(dev, 1, x)
    want = expected_outputs(eo, [x])
    assert [len(w) for w in want] == [278784, 256]
    first = read_all(dev, 278784, size)
    assert len(first[-1]) == (278784 % size or size)
    assert b"".join(first) == want[0]
    assert b"".join(read_all(dev, 256, size)) == want[1]
    assert [event(dev)[2] for _ in range(2)] == [4, 4]
    # Glued in the wrong order, the bytes differ: a host's mistake shows.
    assert b"".join(first[1:] + first[:1]) != want[0]


# -- what the stick refuses: the fatal error, with the reason ----------------------------------

def test_a_stream_of_the_wrong_size_is_fatal():
    pc, eo = executables(V1)
    backend, dev = raw_stick([package(V1)])
    send_caching(dev, pc)
    send(dev, 0, eo.instructions[0])
    dev.write(0x01, struct.pack("<II", 49151, 1))    # refused at its header
    assert is_fatal(dev, backend)
    assert "DMA hint 1 expects a tag 1 (input) stream of 49152 bytes; got a tag 1 stream " \
           "of 49151 bytes" in fatal_detail(backend)
    assert nothing_on(dev, 0x81)
    assert not [e for e in backend.transcript if e["op"] == "bulk_in" and e["ep"] == 0x81
                and e["length"]]


def test_a_stream_of_the_wrong_tag_is_fatal():
    pc, _ = executables(V1)
    backend, dev = raw_stick([package(V1)])
    send(dev, 0, pc.instructions[0])
    dev.write(0x01, struct.pack("<II", len(pc.parameters), 1))   # parameters as an input
    assert is_fatal(dev, backend)
    assert "expects a tag 2 (parameters) stream of 566912 bytes; got a tag 1" in \
        fatal_detail(backend)


def test_an_input_with_no_request_in_progress_is_fatal():
    backend, dev = raw_stick([package(V1)])
    dev.write(0x01, struct.pack("<II", 49152, 1))
    assert is_fatal(dev, backend)
    assert "no request in progress" in fatal_detail(backend)


@pytest.mark.parametrize("case", ["unknown bytes", "unknown size", "nothing known"])
def test_unknown_instructions_are_fatal(case):
    pc, _ = executables(V1)
    backend, dev = raw_stick([] if case == "nothing known" else [package(V1)])
    if case == "unknown bytes":
        send(dev, 0, np.random.default_rng(3).integers(0, 256, len(pc.instructions[0]),
                                                       np.uint8).tobytes())
    else:
        dev.write(0x01, struct.pack("<II", 12, 0))
    assert is_fatal(dev, backend)
    want = {"unknown bytes": "match no known executable",
            "unknown size": "no known executable starts with 12 bytes of instructions",
            "nothing known": "no DWN1 executable is known"}[case]
    assert want in fatal_detail(backend)
    assert nothing_on(dev, 0x82, 16)                 # no made-up event, no outputs


def test_a_reset_drops_a_half_walked_request():
    pc, eo = executables(V1)
    backend, dev = raw_stick([package(V1)])
    send_caching(dev, pc)
    send(dev, 0, eo.instructions[0])                 # its input never comes
    dev.reset()
    bringup.bring_up(Transport(dev, timeout=1.0))
    send_caching(dev, pc)                            # a new request, not an "input"
    assert event(dev)[2] == 4


# -- FieldOffset bits ----------------------------------------------------------------------------

def copy_uint32(buf: bytearray, offset_bit: int, value: int) -> None:
    """libedgetpu's ExecutableUtil::CopyUint32: bit k of value -> bit offset_bit + k."""
    for k in range(32):
        bit = offset_bit + k
        if value >> k & 1:
            buf[bit >> 3] |= 1 << (bit & 7)
        else:
            buf[bit >> 3] &= ~(1 << (bit & 7)) & 0xFF


def linked(chunk, offsets, rng) -> bytes:
    buf = bytearray(chunk)
    for f in offsets:
        copy_uint32(buf, f.offset_bit, int(rng.integers(0, 2**32)))
    return bytes(buf)


def test_the_mask_covers_exactly_what_copy_uint32_writes():
    for start in (0, 5, 582, 710, 1339590):
        ones, zeros = bytearray(b"\0" * 170032), bytearray(b"\xff" * 170032)
        copy_uint32(ones, start, 0xFFFFFFFF)
        copy_uint32(zeros, start, 0)
        written = {i: b ^ 0xFF for i, b in enumerate(zeros) if b != 0xFF}
        assert written == {i: b for i, b in enumerate(ones) if b}
        assert instruction_mask(170032, [start]) == written


def test_instructions_differing_only_in_field_offset_bits_are_recognised():
    # libedgetpu links host addresses there: the parameter base in the caching
    # program, the input/output/parameter/scratch bases in the execution program.
    pc, eo = executables(V1)
    assert {str(f.target) for f in pc.field_offsets[0]} == {"parameter"}
    assert {str(f.target) for f in eo.field_offsets[0]} == {"input", "output", "parameter",
                                                             "scratch"}
    rng = np.random.default_rng(4)
    backend, dev = raw_stick([package(V1)])
    pc_linked = linked(pc.instructions[0], pc.field_offsets[0], rng)
    eo_linked = linked(eo.instructions[0], eo.field_offsets[0], rng)
    assert pc_linked != bytes(pc.instructions[0]) and eo_linked != bytes(eo.instructions[0])
    send(dev, 0, pc_linked)
    send(dev, 2, pc.parameters)
    send(dev, 0, eo_linked)
    send(dev, 1, bytes(49152))
    assert b"".join(read_all(dev, 1008, 1024)) == expected_outputs(eo, [bytes(49152)])[0]
    assert [event(dev)[2] for _ in range(2)] == [4, 4]


@pytest.mark.parametrize("where", ["bit before a field", "bit after a field", "far away"])
def test_instructions_differing_elsewhere_are_not(where):
    pc, eo = executables(V1)
    offsets = sorted(f.offset_bit for f in eo.field_offsets[0])
    first = offsets[0]
    bit = {"bit before a field": first - 1, "bit after a field": first + 32,
           "far away": 8 * 100_000 + 3}[where]
    assert not any(o <= bit < o + 32 for o in offsets)
    backend, dev = raw_stick([package(V1)])
    send_caching(dev, pc)
    assert event(dev)[2] == 4
    buf = bytearray(eo.instructions[0])
    buf[bit >> 3] ^= 1 << (bit & 7)
    send(dev, 0, buf)
    assert is_fatal(dev, backend)
    assert "match no known executable" in fatal_detail(backend)


# -- coralrt's driver against the test mode -----------------------------------------------------

def infeed_tags(exe) -> list[tuple[int, int]]:
    tags = {"instruction": 0, "input": 1, "parameter": 2}
    return [(tags[h.kind], h.size) for h in exe.dma_hints if h.kind in tags]


@pytest.mark.parametrize("name", shared_model_names(compiled=True))
def test_every_shared_compiled_model_runs_through_the_driver(name):
    packages = packages_of(shared_model(name))
    backend = dwn1_backend(programs=packages)
    backend.record_payloads = True
    with open_device(backend=backend) as dev:
        for pkg in packages:
            cache, exe = select_executables(parse_package(pkg))
            if not all(e.fully_deterministic for e in (cache, exe) if e is not None):
                assert name == LSTM                  # coralrt refuses it, as libedgetpu
                with pytest.raises(ExecutableError, match="fully deterministic"):
                    dev.load(pkg)
                continue
            h = dev.load(pkg)
            for run, requests in ((0, [cache, exe] if cache else [exe]), (1, [exe])):
                mark = len(backend.transcript)
                dev.run(h, random_inputs(h.exe.inputs, seed=run))
                new = backend.transcript[mark:]
                sent = [e for e in new if e["op"] == "bulk_out"]
                assert [(e["tag"], e["length"]) for e in sent] == \
                    [t for r in requests for t in infeed_tags(r)]
                assert all(e["kind"] == "raw" and e["complete"] for e in sent)
                done = [e for e in new if e["op"] == "dwn1_request"]
                assert [e["type"] for e in done] == [r.type for r in requests]
                events = [e for e in new if e["op"] == "bulk_in" and e["ep"] == 0x82]
                assert len(events) == len(requests) and not backend.devices[0].engine.events
                # The driver put each output hint's bytes where the hint says.
                inputs = [e["data"] for e in sent[-len(infeed_tags(exe)):] if e["tag"] == 1]
                want = iter(expected_outputs(exe, inputs))
                for hint in exe.dma_hints:
                    if hint.kind == "output" and hint.size:
                        got = h.raw[hint.name][hint.offset:hint.offset + hint.size]
                        assert got.tobytes() == next(want), hint.name


def test_the_driver_sends_the_file_s_instruction_bytes_and_payloads_are_recorded_on_demand():
    pc, eo = executables(V1)
    for record in (False, True):
        backend = dwn1_backend(programs=[package(V1)])
        backend.record_payloads = record
        with open_device(backend=backend) as dev:
            h = dev.load(package(V1))
            dev.run(h, random_inputs(h.exe.inputs))
        sent = [e for e in backend.transcript if e["op"] == "bulk_out"]
        if not record:
            assert not [e for e in sent if "data" in e]
            continue
        assert sent[0]["data"] == bytes(pc.instructions[0])     # coralrt links nothing
        assert sent[1]["data"] == bytes(pc.parameters)
        assert sent[2]["data"] == bytes(eo.instructions[0])
        assert [e["crc32"] for e in sent] == [zlib.crc32(e["data"]) for e in sent]
        assert [(e["executable"], e["hint"]) for e in sent] == [(1, 0), (1, 1), (0, 0), (0, 1)]


def test_a_program_the_stick_was_not_told_about_is_a_fatal_error_for_the_driver():
    backend = dwn1_backend(programs=[package(V2)])
    with open_device(backend=backend, timeout=0.5) as dev:
        h = dev.load(package(V1))
        with pytest.raises(DeviceLostError, match="fatal"):
            dev.run(h, random_inputs(h.exe.inputs))
    assert "no known executable starts with 12624 bytes" in fatal_detail(backend)


def test_know_dwn1():
    backend = SimulatedBackend()
    added = backend.know_dwn1(package(V1))
    assert sorted(e.type for e in added) == ["EXECUTION_ONLY", "PARAMETER_CACHING"]
    assert backend.know_dwn1(memoryview(package(V1))) == []   # known already
    with pytest.raises(ExecutableError):
        backend.know_dwn1(b"not a package")
    # Known, but test mode off: the stick still refuses raw streams with an error event.
    assert "closed" in backend.refusal(5, "dwn1")


# -- hints the shared models do not have: a second chunk, scratch, an interrupt midway ---------

def synthetic_package() -> bytes:
    """V1's pair, its execution program's hints rewritten: instructions, half the input,
    scratch in, a second instruction chunk (the caching program's), the other half, an
    output in two parts around an interrupt 1, scratch out, and no final interrupt."""
    from test_dwn1_lenient import custom_options, real_executables
    eo, pc = real_executables(V1)
    eo["instruction_bitstreams"] = [eo["instruction_bitstreams"][0],
                                    pc["instruction_bitstreams"][0]]
    out = "MobilenetV1/Predictions/Reshape_1"

    def data(desc, name, offset, size, direction):
        return {"any_hint_type": 1, "direction": direction, "any_hint": {
            "meta": {"desc": desc, "batch": 0, "name": name, "position": 0},
            "offset_in_bytes": offset, "size_in_bytes": size}}

    def chunk(i):
        return {"any_hint_type": 2, "any_hint": {"instruction_chunk_index": i}, "direction": 0}
    eo["scratch_size_bytes"] = 64
    eo["dma_hints"]["hints"] = [
        chunk(0), data(1, "input", 0, 24576, 0), data(3, "", 0, 64, 0), chunk(1),
        data(1, "input", 24576, 24576, 0), data(0, out, 0, 500, 1),
        {"any_hint_type": 3, "any_hint": {"type": 1}, "direction": 1},
        data(0, out, 500, 508, 1), data(3, "", 0, 32, 1)]
    return custom_options([eo, pc])


def test_a_walk_through_scratch_a_second_chunk_and_an_interrupt_midway():
    pkg = synthetic_package()
    pc, eo = select_executables(parse_package(pkg))
    assert [h.kind for h in eo.dma_hints] == ["instruction", "input", "scratch", "instruction",
                                              "input", "output", "interrupt", "output",
                                              "scratch"]
    backend, dev = raw_stick([pkg])
    x = np.random.default_rng(5).integers(0, 256, 49152, np.uint8).tobytes()
    scratch = bytes(range(64))
    send_caching(dev, pc)
    assert event(dev)[2] == 4
    send(dev, 0, eo.instructions[0])
    send(dev, 1, x[:24576])
    send(dev, 1, scratch)
    assert nothing_on(dev, 0x81) and nothing_on(dev, 0x82, 16)
    send(dev, 0, linked(eo.instructions[1], eo.field_offsets[1], np.random.default_rng(6)))
    assert nothing_on(dev, 0x81)
    send(dev, 1, x[24576:])
    crc = crc_of_inputs([x[:24576], scratch, x[24576:]])
    assert read_all(dev, 500, 1024) == [expected_bytes(crc, 5, 0, 500)]
    assert read_all(dev, 508, 1024) == [expected_bytes(crc, 7, 500, 508)]
    assert read_all(dev, 32, 1024) == [expected_bytes(crc, 8, 0, 32)]
    assert [event(dev)[2] for _ in range(2)] == [5, 4]   # interrupt 1, then the end
    assert nothing_on(dev, 0x82, 16)


def test_a_second_chunk_that_differs_is_fatal():
    pkg = synthetic_package()
    pc, eo = select_executables(parse_package(pkg))
    backend, dev = raw_stick([pkg])
    send_caching(dev, pc)
    send(dev, 0, eo.instructions[0])
    send(dev, 1, bytes(24576))
    send(dev, 1, bytes(64))
    wrong = bytearray(eo.instructions[1])
    wrong[-1] ^= 0x10
    send(dev, 0, wrong)
    assert is_fatal(dev, backend)
    assert "DMA hint 3: the instructions differ from the chunk outside its FieldOffset bits" \
        in fatal_detail(backend)


def test_the_driver_follows_the_synthetic_walk():
    pkg = synthetic_package()
    backend = dwn1_backend(programs=[pkg])
    with open_device(backend=backend) as dev:
        h = dev.load(pkg)
        out = dev.run(h, random_inputs(h.exe.inputs))
        assert out[0].shape == tuple(h.exe.outputs[0].shape)
    assert [e["tag"] for e in backend.transcript if e["op"] == "dwn1_request"] == [4, 4]
    assert len([e for e in backend.transcript if e["op"] == "bulk_in" and e["ep"] == 0x82]) == 3


def test_executables_a_stick_could_not_tell_apart_are_refused():
    backend = SimulatedBackend()
    backend.know_dwn1(package(V1))
    with pytest.raises(ValueError, match="could not tell them apart"):
        backend.know_dwn1(synthetic_package())
