"""The simulated Coral USB Accelerator, driven through real pyusb calls only."""

from __future__ import annotations

import errno
import hashlib
import struct
import threading
import time
import zlib

import numpy as np
import pytest
import usb.core
import usb.util
from conftest import REPO_ROOT, shared_model
from support.sim import accept_dwn1

from coralrt._formats.segment import build_segment
from coralrt._formats.segment_codec import HEADER_SIZE, encode
from coralrt._sim.runner import SegmentRunner
from coralrt.testing import LatencyModel, Fault, FaultPlan, SimulatedBackend
from coralrt._selftest.open_trace import OPEN_TRACE, parse_trace
from coralrt._sim.stick.chip import RESET_VALUES
from coralrt._usb import bringup
from coralrt._usb import constants as C
from coralrt._usb.transport import Transport

BOOT, APP = (0x1A6E, 0x089A), (0x18D1, 0x9302)
TRACE_TSV = REPO_ROOT.parent / "shared" / "reference" / "libedgetpu-open-trace.tsv"
RUN = struct.Struct("<8sII")
EVENT = struct.Struct("<QIB3x")


# -- helpers (raw pyusb, the way a host driver talks to the stick) ------------------------


def find(backend, ids=None) -> list:
    kw = {} if ids is None else {"idVendor": ids[0], "idProduct": ids[1]}
    return list(usb.core.find(find_all=True, backend=backend, **kw))


def running(*, dwn1: bool = False, **kw):
    kw.setdefault("transcript_limit", None)      # tests read the transcript from its start
    backend = SimulatedBackend(firmware_loaded=True, **kw)
    if dwn1:                    # test mode: the shared compiled models' DWN1 programs known
        accept_dwn1(backend)
    dev = find(backend, APP)[0]
    dev.set_configuration(1)
    usb.util.claim_interface(dev, 0)
    return backend, dev


def reg_read(dev, register, width):
    data = dev.ctrl_transfer(0xC0, 1 if width == 4 else 0, register & 0xFFFF, register >> 16,
                             width)
    return int.from_bytes(bytes(data), "little")


def reg_write(dev, register, width, value):
    dev.ctrl_transfer(0x40, 1 if width == 4 else 0, register & 0xFFFF, register >> 16,
                      value.to_bytes(width, "little"))


def bring_up(dev) -> dict:
    """The driver's bring-up register sequence (libedgetpu's), over these pyusb calls."""
    return bringup.bring_up(Transport(dev, timeout=1.0))


def bring_up_ops() -> list[str]:
    """The transcript ops ("read"/"write") of one bring-up of a fresh stick."""
    backend, dev = running()
    start = len(backend.transcript)
    bring_up(dev)
    return [t["op"] for t in backend.transcript[start:] if t["op"] in ("read", "write")]


def send(dev, tag: int, payload: bytes, chunk: int = 1 << 20, joined: bool = False) -> None:
    header = struct.pack("<II", len(payload), tag)
    if joined:
        dev.write(0x01, header + payload[:chunk])
        start = chunk
    else:
        dev.write(0x01, header)
        start = 0
    for i in range(start, len(payload), chunk):
        dev.write(0x01, payload[i:i + chunk])


def read_exact(dev, ep: int, n: int, piece: int = 1 << 20) -> bytes:
    out = bytearray()
    while len(out) < n:
        out += bytes(dev.read(ep, min(piece, n - len(out)), timeout=2000))
    return bytes(out)


def event(dev, timeout=2000):
    return EVENT.unpack(bytes(dev.read(0x82, 16, timeout=timeout)))


def small_segment():
    from support.models import conv_relu
    return build_segment(conv_relu(seed=3, name="small"))


def inputs_for(seg, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for tid in seg.inputs:
        t = seg.tensors[tid]
        dt = np.dtype(np.int8) if t.type_name == "INT8" else np.dtype(np.uint8)
        info = np.iinfo(dt)
        out.append(rng.integers(info.min, info.max, t.shape, endpoint=True).astype(dt))
    return out


def run_segment(dev, program: bytes, arrays, *, load=True, piece=1 << 20):
    if load:
        send(dev, 2, program)
        assert event(dev) == (0, len(program), 4)
    send(dev, 0, RUN.pack(b"CRTSRUN\0", zlib.crc32(program[:HEADER_SIZE]), len(arrays)))
    for a in arrays:
        send(dev, 1, np.ascontiguousarray(a).tobytes())
    return piece


# -- enumeration --------------------------------------------------------------------------


def test_enumerates_bootloader_then_running_mode_through_pyusb():
    backend = SimulatedBackend(n_devices=2)
    devs = find(backend)
    assert [(d.idVendor, d.idProduct) for d in devs] == [BOOT, BOOT]
    assert len({(d.bus, d.address) for d in devs}) == 2
    assert [d.port_numbers for d in devs] == [(1,), (2,)]
    d = devs[0]
    assert d.bcdUSB == 0x0300 and d.speed == usb.util.SPEED_SUPER
    intf = d[0][(0, 0)]
    assert (intf.bInterfaceClass, intf.bInterfaceSubClass, intf.bNumEndpoints) == (0xFE, 1, 0)
    extra = bytes(intf.extra_descriptors)
    length, kind, attrs, _, transfer, version = struct.unpack("<BBBHHH", extra)
    assert (length, kind, transfer, version) == (9, 0x21, 256, 0x0110) and attrs & 3 == 3
    # The functional descriptor is also in the raw configuration (512-byte read, as libedgetpu).
    raw = bytes(d.ctrl_transfer(0x80, 6, 0x0200, 0, 512))
    assert extra in raw and len(raw) == d[0].wTotalLength

    backend = SimulatedBackend(firmware_loaded=True, usb_speed="usb2")
    d = find(backend)[0]
    assert (d.idVendor, d.idProduct, d.bcdUSB, d.speed) == (*APP, 0x0210, usb.util.SPEED_HIGH)
    eps = {(e.bEndpointAddress, usb.util.endpoint_type(e.bmAttributes))
           for e in d[0][(0, 0)]}
    assert {(0x01, 2), (0x81, 2), (0x82, 2), (0x83, 3)} <= eps
    assert d.serial_number == "SIM0000"


def test_usb3_running_descriptor_matches_the_capture():
    d = find(SimulatedBackend(firmware_loaded=True))[0]
    assert (d.bcdUSB, d.bMaxPacketSize0, d.bcdDevice) == (0x0310, 9, 0x0100)
    assert all(e.wMaxPacketSize == 1024 for e in d[0][(0, 0)] if e.bEndpointAddress != 0x83)


# -- DFU ----------------------------------------------------------------------------------


def dfu_status(dev):
    s = bytes(dev.ctrl_transfer(0xA1, 3, 0, 0, 6))
    return s[0], int.from_bytes(s[1:4], "little"), s[4]


def test_dfu_download_verify_and_reenumeration():
    backend = SimulatedBackend(transcript_limit=None)
    dev = find(backend, BOOT)[0]
    port, old_address = dev.port_numbers, dev.address
    image = bytes(np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8))
    for block, i in enumerate(range(0, len(image), 256)):
        dev.ctrl_transfer(0x21, 1, block, 0, image[i:i + 256])
        assert dfu_status(dev) == (0, 0, 5)            # OK, dfuDNLOAD-IDLE
    dev.ctrl_transfer(0x21, 1, 4, 0, b"")
    assert dfu_status(dev) == (0, 0, 2)                # manifested, back to dfuIDLE
    uploaded = bytearray()
    while True:
        chunk = bytes(dev.ctrl_transfer(0xA1, 2, 0, 0, 256))
        uploaded += chunk
        if len(chunk) < 256:
            break
    assert bytes(uploaded) == image
    assert bytes(dev.ctrl_transfer(0xA1, 5, 0, 0, 1)) == b"\x02"
    assert find(backend, APP) == []
    dev.reset()
    with pytest.raises(usb.core.USBError) as e:        # the old attachment is gone
        dev.ctrl_transfer(0xA1, 5, 0, 0, 1)
    assert e.value.errno == errno.ENODEV
    assert find(backend, BOOT) == []
    new = find(backend, APP)[0]
    assert new.address != old_address and new.port_numbers == port
    assert backend.devices[0].firmware_sha256 == hashlib.sha256(image).hexdigest()
    ops = [t["op"] for t in backend.transcript if t["op"].startswith("dfu_")]
    assert ops[:2] == ["dfu_dnload", "dfu_getstatus"] and "dfu_upload" in ops
    assert any(t["op"] == "reenumerate" for t in backend.transcript)


def test_dfu_busy_polls_and_errors():
    backend = SimulatedBackend(dfu_busy_polls=1)
    dev = find(backend, BOOT)[0]
    dev.ctrl_transfer(0x21, 1, 0, 0, b"\x02" * 16)
    status, poll, state = dfu_status(dev)
    assert (status, state) == (0, 4) and poll > 0       # dfuDNBUSY with a poll timeout
    with pytest.raises(usb.core.USBError) as e:         # asking again too early stalls
        dfu_status(dev)
    assert e.value.errno == errno.EPIPE
    assert dfu_status(dev)[2] == 10                     # dfuERROR
    dev.ctrl_transfer(0x21, 4, 0, 0, None)              # CLRSTATUS
    dev.ctrl_transfer(0x21, 1, 7, 0, b"\x02" * 16)
    time.sleep(0.01)
    dfu_status(dev)
    time.sleep(0.01)
    assert dfu_status(dev)[2] == 5
    dev.ctrl_transfer(0x21, 1, 9, 0, b"\x00" * 16)      # block 9 after 7: out of sequence
    time.sleep(0.01)
    assert dfu_status(dev) == (8, 0, 10)                # errADDRESS, dfuERROR
    dev.ctrl_transfer(0x21, 4, 0, 0, None)
    with pytest.raises(usb.core.USBError):              # zero-length DNLOAD with no image
        dev.ctrl_transfer(0x21, 1, 0, 0, b"")
    dev.ctrl_transfer(0x21, 4, 0, 0, None)
    with pytest.raises(usb.core.USBError):              # block larger than wTransferSize
        dev.ctrl_transfer(0x21, 1, 0, 0, bytes(300))


def test_slow_reenumeration_after_dfu():
    backend = SimulatedBackend(faults=FaultPlan().add("slow_reenumeration", seconds=0.3))
    dev = find(backend, BOOT)[0]
    dev.ctrl_transfer(0x21, 1, 0, 0, b"\x02\x00\x10")
    dfu_status(dev)
    dev.ctrl_transfer(0x21, 1, 1, 0, b"")
    dfu_status(dev)
    dev.reset()
    start = time.monotonic()
    assert find(backend) == []
    while not find(backend, APP):
        assert time.monotonic() - start < 2
        time.sleep(0.02)
    assert time.monotonic() - start >= 0.25


# -- registers ----------------------------------------------------------------------------


def test_registers_start_at_their_reset_values_and_a_port_reset_restores_them():
    backend, dev = running()
    for register, value in RESET_VALUES.items():
        assert reg_read(dev, register, 4) == value
    assert reg_read(dev, 0x4C0B8, 8) == 0                    # never touched
    assert reg_read(dev, C.SCALAR_CORE_RUN_CONTROL, 8) == 0
    bring_up(dev)
    reg_write(dev, 0x4C0B8, 8, 0x1234_5678_9ABC)
    assert reg_read(dev, 0x4C0B8, 8) == 0x1234_5678_9ABC
    assert reg_read(dev, C.SCU_CTRL_0, 4) == 0x000F0059     # inactive PHY modes cleared
    dev.reset()
    dev = find(backend, APP)[0]
    assert reg_read(dev, C.SCU_CTRL_0, 4) == RESET_VALUES[C.SCU_CTRL_0]
    assert reg_read(dev, 0x4C0B8, 8) == 0
    with pytest.raises(usb.core.USBError):                  # 64-bit request, 4-byte length
        dev.ctrl_transfer(0xC0, 0, 0x8788, 0x4, 4)


def _pwr(dev) -> int:
    return C.field(reg_read(dev, C.SCU_CTRL_3, 4), C.SCU3_CUR_PWR_STATE)


def test_the_power_state_follows_force_sleep_after_a_read_and_sleep_resets_the_gcb():
    backend, dev = running()
    bring_up(dev)
    assert _pwr(dev) == C.PWR_STATE_RUN
    assert reg_read(dev, C.SCALAR_CORE_RUN_CONTROL, 8) == C.RUN_CONTROL_RUN
    value = reg_read(dev, C.SCU_CTRL_3, 4)
    reg_write(dev, C.SCU_CTRL_3, 4, C.with_field(value, C.SCU3_FORCE_SLEEP, 3))
    assert _pwr(dev) == C.PWR_STATE_RUN                     # the first read: not yet
    assert _pwr(dev) == C.PWR_STATE_SLEEP
    # Asleep, the GCB is in reset: its registers read 0 and writes are dropped.
    assert reg_read(dev, C.SCALAR_CORE_RUN_CONTROL, 8) == 0
    reg_write(dev, C.SCALAR_CORE_RUN_CONTROL, 8, 1)
    assert backend.transcript[-1]["dropped"].startswith("the GCB is in reset")
    with pytest.raises(usb.core.USBTimeoutError):           # bulk out needs a running core
        dev.write(0x01, struct.pack("<II", 4, 0) + b"abcd", timeout=100)
    value = reg_read(dev, C.SCU_CTRL_3, 4)
    reg_write(dev, C.SCU_CTRL_3, 4, C.with_field(value, C.SCU3_FORCE_SLEEP, 2))
    assert [_pwr(dev), _pwr(dev)] == [C.PWR_STATE_SLEEP, C.PWR_STATE_RUN]
    assert reg_read(dev, C.SCALAR_CORE_RUN_CONTROL, 8) == 0  # out of reset: reset value


def test_tile_config_reads_back_late_and_status_bits_clear_on_zero():
    backend, dev = running()
    bring_up(dev)
    reg_write(dev, C.TILECONFIG0, 8, 0x15)
    assert [reg_read(dev, C.TILECONFIG0, 8) for _ in range(2)] == [0x7F, 0x15]
    backend.inject("fatal")
    with pytest.raises(usb.core.USBTimeoutError):
        dev.write(0x01, struct.pack("<II", 4, 0) + b"abcd", timeout=100)
    assert reg_read(dev, C.FATAL_ERR_INT_STATUS, 8) == 1
    reg_write(dev, C.FATAL_ERR_INT_STATUS, 8, 0)            # libedgetpu: all ones but bit 0
    assert reg_read(dev, C.FATAL_ERR_INT_STATUS, 8) == 0


def test_a_fatal_error_interrupts_only_while_the_host_enabled_it():
    backend, dev = running()
    backend.inject("fatal")                                  # before the bring-up
    reg_read(dev, C.SCU_CTRL_0, 4)
    entry = [t for t in backend.transcript if t["op"] == "fatal"][-1]
    assert entry["interrupt"] is False
    with pytest.raises(usb.core.USBTimeoutError):
        dev.read(0x83, 4, timeout=50)


def test_builtin_trace_equals_the_reference_tsv():
    if not TRACE_TSV.is_file():
        pytest.skip(f"{TRACE_TSV} is absent")
    assert parse_trace(TRACE_TSV.read_text()) == OPEN_TRACE
    with pytest.raises(ValueError, match="line 1"):
        parse_trace("1\tpeek\t0xc0\t1\t0x1\t4\t0x0")


def test_bootloader_refuses_register_access():
    dev = find(SimulatedBackend(), BOOT)[0]
    with pytest.raises(usb.core.USBError) as e:
        reg_read(dev, 0x1A30C, 4)
    assert e.value.errno == errno.EPIPE


# -- bulk framing -------------------------------------------------------------------------


def expect_fatal(backend, dev):
    word = bytes(dev.read(0x83, 4, timeout=500))
    assert int.from_bytes(word, "little") & 1
    with pytest.raises(usb.core.USBTimeoutError):        # bulk stops until a reset
        dev.read(0x82, 16, timeout=50)
    assert any(t["op"] == "fatal" for t in backend.transcript)


def test_bulk_out_before_bring_up_times_out():
    backend, dev = running(max_wait=0.05)
    with pytest.raises(usb.core.USBTimeoutError):
        dev.write(0x01, struct.pack("<II", 4, 0), timeout=1000)
    bring_up(dev)
    dev.write(0x01, struct.pack("<II", 4, 0) + b"abcd")


@pytest.mark.parametrize("header", [struct.pack("<II", 4, 3), struct.pack("<II", 4, 5),
                                   struct.pack("<IBBBB", 4, 0, 0, 1, 0)],
                         ids=["output-tag", "interrupt-tag", "reserved-byte"])
def test_bad_header_raises_fatal_interrupt_until_reset(header):
    backend, dev = running()
    bring_up(dev)
    dev.write(0x01, header + b"abcd")
    expect_fatal(backend, dev)
    assert reg_read(dev, 0x486F0, 8) != 0                    # hib_error_status says why
    dev.reset()
    dev = find(backend, APP)[0]
    bring_up(dev)
    seg = small_segment()
    check_run(dev, seg, encode(seg))                         # the stick works again


def test_dwn1_streams_are_refused_with_an_error_event():
    backend, dev = running()
    bring_up(dev)
    send(dev, 0, b"EO-bitstream")
    send(dev, 1, bytes(100))
    assert len(dev.read(0x81, 1001, timeout=100)) == 0      # a zero-length packet, no zeros
    assert event(dev)[2] == 0xF
    with pytest.raises(usb.core.USBTimeoutError):            # one error event per request
        dev.read(0x82, 16, timeout=20)
    outs = [(t["tag"], t["length"], t.get("crc32"), t.get("refused")) for t in backend.transcript
            if t["op"] == "bulk_out"]
    assert outs == [(0, 12, zlib.crc32(b"EO-bitstream"), True),
                    (1, 100, zlib.crc32(bytes(100)), True)]
    assert [t["op"] for t in backend.transcript].count("raw_refused") == 1
    check_run(dev, small_segment(), encode(small_segment()))  # segments still run


def test_dwn1_streams_with_the_test_switch_are_answered_request_by_request():
    # Test mode (details in test_dwn1_requests.py): the stick knows the programs of the
    # shared compiled models and answers each request, once, with placeholder bytes.
    from coralrt._formats.dwn1 import parse_package, select_executables
    from support.sim import packages_of
    (program,) = packages_of(shared_model("edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite"))
    pc, eo = select_executables(parse_package(program))
    backend, dev = running(dwn1=True)
    bring_up(dev)
    with pytest.raises(usb.core.USBTimeoutError):            # nothing sent yet
        dev.read(0x82, 16, timeout=20)
    send(dev, 0, pc.instructions[0])
    send(dev, 2, pc.parameters, chunk=1000, joined=True)
    assert event(dev) == (0, 0, 4)
    send(dev, 0, eo.instructions[0])
    with pytest.raises(usb.core.USBTimeoutError):            # no output before the input
        dev.read(0x81, 2048, timeout=20)
    send(dev, 1, bytes(49152))
    out = bytes(dev.read(0x81, 2048))
    assert len(out) == 1008 and out != bytes(1008)           # placeholders, not zeros
    assert event(dev)[2] == 4
    with pytest.raises(usb.core.USBTimeoutError):            # one event per request
        dev.read(0x82, 16, timeout=20)
    outs = [(t["tag"], t["length"], t.get("crc32"), t["kind"]) for t in backend.transcript
            if t["op"] == "bulk_out"]
    assert outs == [(0, 12624, zlib.crc32(pc.instructions[0]), "raw"),
                    (2, 566912, zlib.crc32(pc.parameters), "raw"),
                    (0, 170032, zlib.crc32(eo.instructions[0]), "raw"),
                    (1, 49152, zlib.crc32(bytes(49152)), "raw")]
    assert not [t for t in backend.transcript if t.get("refused")]


# -- coralrt segments ---------------------------------------------------------------------


def check_run(dev, seg, program, *, load=True, seed=0, piece=1 << 20):
    arrays = inputs_for(seg, seed)
    want = SegmentRunner(seg).run(arrays)
    run_segment(dev, program, arrays, load=load)
    for w in want:
        got = read_exact(dev, 0x81, w.nbytes, piece)
        assert np.array_equal(np.frombuffer(got, w.dtype).reshape(w.shape), w)
    assert event(dev) == (0, sum(w.nbytes for w in want), 4)


def test_segment_runs_over_raw_pyusb_like_segment_runner():
    seg = small_segment()
    program = encode(seg)
    backend, dev = running()
    bring_up(dev)
    check_run(dev, seg, program, piece=100)                  # outputs over several reads
    check_run(dev, seg, program, load=False, seed=1)         # cached: no reload
    assert [t["op"] for t in backend.transcript].count("load") == 1
    # One large read never crosses into the next output.
    run_segment(dev, program, inputs_for(seg), load=False)
    sizes = [seg.tensors[t].nbytes for t in seg.outputs]
    assert [len(dev.read(0x81, 1 << 16)) for _ in sizes] == sizes


def test_mobilenet_segment_over_pyusb():
    from coralrt import load_model
    seg = build_segment(load_model(shared_model("mobilenet_v1_0.25_128_quant.tflite")))
    program = encode(seg)
    assert len(program) > 1 << 18
    backend, dev = running()
    bring_up(dev)
    send(dev, 2, program, chunk=1 << 18)
    assert event(dev) == (0, len(program), 4)
    check_run(dev, seg, program, load=False, piece=1024)


def test_unknown_segment_gets_error_event_and_reload_recovers():
    seg = small_segment()
    program = encode(seg)
    backend, dev = running()
    bring_up(dev)
    run_segment(dev, program, inputs_for(seg), load=False)
    assert len(dev.read(0x81, 4096, timeout=100)) == 0       # nothing computed
    assert event(dev)[2] == 0xF
    check_run(dev, seg, program)                             # reload once, then it runs
    dev.reset()                                              # a reset forgets segments
    dev = find(backend, APP)[0]
    bring_up(dev)
    run_segment(dev, program, inputs_for(seg), load=False)
    assert event(dev)[2] == 0xF
    check_run(dev, seg, program)


def test_bad_segment_load_and_wrong_input_size():
    seg = small_segment()
    program = bytearray(encode(seg))
    program[-1] ^= 0xFF                                      # checksum no longer matches
    backend, dev = running()
    bring_up(dev)
    send(dev, 2, bytes(program))
    assert event(dev)[2] == 0xF
    good = encode(seg)
    send(dev, 2, good)
    event(dev)
    send(dev, 0, RUN.pack(b"CRTSRUN\0", zlib.crc32(good[:HEADER_SIZE]), 1))
    send(dev, 1, bytes(5), joined=True)                      # the input has 108 bytes
    expect_fatal(backend, dev)


def test_latency_model_delays_outputs():
    seg = small_segment()
    program = encode(seg)
    slow = LatencyModel(invoke_seconds=0.15)
    backend, dev = running(latency=slow)
    bring_up(dev)
    send(dev, 2, program)
    event(dev)
    start = time.monotonic()
    check_run(dev, seg, program, load=False)
    assert time.monotonic() - start >= 0.14
    assert backend.devices[0].engine.last_run["device_seconds"] >= 0.15


def test_reader_thread_is_woken_by_the_writer():
    seg = small_segment()
    program = encode(seg)
    backend, dev = running(max_wait=2.0)
    bring_up(dev)
    got = []
    reader = threading.Thread(target=lambda: got.append(event(dev, timeout=2000)))
    reader.start()
    time.sleep(0.05)
    send(dev, 2, program)
    reader.join(3)
    assert got == [(0, len(program), 4)]


# -- faults -------------------------------------------------------------------------------


def test_timeout_fault_honours_the_timeout():
    backend, dev = running(max_wait=1.0)
    backend.inject("timeout", after=2)
    reg_read(dev, 0x1A30C, 4)
    reg_read(dev, 0x1A30C, 4)
    start = time.monotonic()
    with pytest.raises(usb.core.USBTimeoutError) as e:
        dev.ctrl_transfer(0xC0, 1, 0xA30C, 1, 4, timeout=150)
    assert 0.14 <= time.monotonic() - start < 0.5 and e.value.errno == errno.ETIMEDOUT
    reg_read(dev, 0x1A30C, 4)                                # transient


def test_stall_fault():
    backend, dev = running()
    bring_up(dev)
    backend.inject("stall")
    with pytest.raises(usb.core.USBError) as e:
        dev.write(0x01, struct.pack("<II", 1, 0) + b"x")
    assert e.value.errno == errno.EPIPE and not isinstance(e.value, usb.core.USBTimeoutError)
    dev.clear_halt(0x01)
    dev.write(0x01, struct.pack("<II", 1, 0) + b"x")


def test_disconnect_fault_and_replug():
    backend, dev = running(n_devices=2)
    bring_up(dev)
    backend.inject("disconnect", after=2)
    send(dev, 0, b"abc")                                    # two transfers go through
    with pytest.raises(usb.core.USBError) as e:
        dev.write(0x01, b"abc")
    assert e.value.errno == errno.ENODEV
    with pytest.raises(usb.core.USBError):
        reg_read(dev, 0x1A30C, 4)
    assert [d.port_numbers for d in find(backend)] == [(2,)]  # gone, the other stays
    usb.util.dispose_resources(dev)                          # closing a lost stick is fine
    backend.replug(0)
    back = find(backend, APP)
    assert len(back) == 2 and back[0].address != dev.address
    assert reg_read(back[0], 0x1A30C, 4) == RESET_VALUES[0x1A30C]   # powered on afresh
    backend.replug(0, mode="bootloader")                     # a real power cycle
    assert (find(backend)[0].idVendor, find(backend)[0].idProduct) == BOOT


def test_fatal_fault_interrupt_and_reset_recovers():
    seg = small_segment()
    program = encode(seg)
    backend, dev = running(faults=FaultPlan([Fault("fatal", after=len(bring_up_ops()))]))
    bring_up(dev)
    with pytest.raises(usb.core.USBTimeoutError):
        dev.write(0x01, struct.pack("<II", 4, 0) + b"abcd", timeout=100)
    expect_fatal(backend, dev)
    dev.reset()
    dev = find(backend, APP)[0]
    bring_up(dev)
    check_run(dev, seg, program)


def test_second_handle_is_busy_and_faults_are_validated():
    backend, dev = running()
    other = usb.core.Device(backend.enumerate_devices()[0], backend)
    with pytest.raises(usb.core.USBError) as e:
        usb.util.claim_interface(other, 0)
    assert e.value.errno == errno.EBUSY
    with pytest.raises(ValueError):
        backend.inject("meteor")
    with pytest.raises(ValueError):
        backend.inject("stall", device=3)


# -- transcript ---------------------------------------------------------------------------


def test_default_transcript_keeps_only_the_last_10000_transfers():
    backend = SimulatedBackend(firmware_loaded=True)       # as docs/usb.md builds it
    dev = find(backend, APP)[0]
    dev.set_configuration(1)
    usb.util.claim_interface(dev, 0)
    bring_up(dev)
    for i in range(10_500):                                  # one "write" entry each
        reg_write(dev, 0x4C0B8, 8, i)
    assert len(backend.transcript) == 10_000
    assert backend.transcript[-1]["value"] == 10_499         # the newest are kept
    assert backend.transcript[0]["value"] == 500
    assert not [t for t in backend.transcript if t["op"] == "read"]   # bring-up dropped


def test_transcript_limit_none_keeps_every_transfer():
    backend, dev = running(transcript_limit=None)
    bring_up(dev)
    for i in range(10_500):
        reg_write(dev, 0x4C0B8, 8, i)
    opening = ["set_configuration", "claim_interface"] + bring_up_ops()
    ops = [t["op"] for t in backend.transcript if t["op"] != "gcb_reset"]
    assert len(ops) == len(opening) + 10_500
    assert ops[:len(opening)] == opening
    backend, dev = running(transcript_limit=3)
    bring_up(dev)
    assert [t["value"] for t in backend.transcript] == [0x3, 0x0, 0x80000000]   # the last 3
