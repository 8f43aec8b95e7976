"""The USB driver against the simulated stick and small fakes: discovery, DFU,
bring-up (compared with the recorded libedgetpu trace), framing, the coralrt
segment protocol, the backend extension (lock scope, device time, programs a
device refuses), DWN1 execution by DMA hints with parameter caching (on a
simulated stick that lets DWN1 streams through for the test), host
transforms, firmware handling and the ``coralrt firmware`` command."""

from __future__ import annotations

import array
import errno
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import usb.backend
import usb.core

import coralrt
from conftest import REPO_ROOT, shared_model
from support.sim import accept_dwn1, dwn1_backend, isolated_dirs  # noqa: F401 (fixtures)

from coralrt._cli.main import main as cli_main
from coralrt.errors import (
    DeviceBusyError, DeviceError, DeviceLostError, DeviceNotFoundError, DevicePermissionError,
    DeviceTimeoutError, FirmwareError, ProgramRefusedError,
)
from coralrt.testing import LatencyModel, SimulatedBackend
from coralrt._usb import bringup, firmware, list_devices, open_device
from coralrt._usb import constants as C
from coralrt._usb.driver import UsbEdgeTpu
from coralrt._usb.extension import BackendExtension
from coralrt._usb.framing import Framer
from coralrt._usb.lock import DeviceLock, lock_dir
from coralrt._usb.transforms import InputStager, OutputDecoder, relayout_index, xor_sign
from coralrt._usb.transport import Transport, translate_error

TRACE = REPO_ROOT.parent / "shared" / "reference" / "libedgetpu-open-trace.tsv"
IMAGE = bytes(range(256)) * 42 + b"\x02\x00\x10"      # 10,755 bytes: a stand-in image


def trace_steps() -> list[tuple[str, int, int]]:
    if not TRACE.is_file():
        pytest.skip(f"{TRACE} is absent")
    rows = []
    for line in TRACE.read_text().splitlines():
        cols = line.split("\t")
        if line.startswith("#") or cols[0] == "step":
            continue
        rows.append((cols[1], int(cols[4], 16), int(cols[6], 16)))
    return rows


def custom_options(name: str):
    from coralrt import load_model
    model = load_model(shared_model(f"edgetpu/{name}"))
    return next(op for op in model.main.operators
                if op.name == "edgetpu-custom-op").custom_options


def bulk(entries):
    return [(e["op"], e["tag"], e["length"]) for e in entries
            if e["op"] in ("bulk_out", "bulk_in")]


# -- discovery and open --------------------------------------------------------------------

def test_list_devices_both_modes_sorted_with_port_paths():
    b = SimulatedBackend(n_devices=2)
    infos = list_devices(b)
    assert [i.path for i in infos] == ["usb:0", "usb:1"]
    assert [i.mode for i in infos] == ["bootloader", "bootloader"]
    assert infos[0].port_path.startswith("/sys/bus/usb/devices/")
    assert infos[0].port_path < infos[1].port_path
    with open_device("usb:1", b, firmware=IMAGE) as dev:
        assert dev.path == "usb:1"
        modes = {i.port_path: i.mode for i in list_devices(b)}
        assert modes[infos[1].port_path] == "running"
        assert modes[infos[0].port_path] == "bootloader"


def test_open_by_port_path_and_unknown_paths():
    b = SimulatedBackend(n_devices=2, firmware_loaded=True)
    port = list_devices(b)[1].port_path
    with open_device(port.rsplit("/", 1)[-1], b) as dev:
        assert dev.info.port_path == port
    with pytest.raises(DeviceNotFoundError, match="usb:5"):
        open_device("usb:5", b, open_retries=1)
    with pytest.raises(DeviceNotFoundError, match="no Coral USB Accelerator"):
        open_device(None, SimulatedBackend(n_devices=0), open_retries=1)


def test_dfu_download_blocks_status_zero_length_end_verify_and_reset():
    b = SimulatedBackend(transcript_limit=None)
    with open_device(backend=b, firmware=IMAGE):
        ops = [e for e in b.transcript if e["op"].startswith("dfu_")]
    dn = [e for e in ops if e["op"] == "dfu_dnload"]
    blocks = -(-len(IMAGE) // 256)
    assert [e["length"] for e in dn] == [256] * (blocks - 1) + [len(IMAGE) % 256, 0]
    assert [e["block"] for e in dn] == list(range(blocks + 1))
    names = [e["op"] for e in ops]
    for i, e in enumerate(names):          # every DNLOAD is followed by GETSTATUS
        if e == "dfu_dnload":
            assert names[i + 1] == "dfu_getstatus"
    assert "dfu_upload" in names and names.index("dfu_upload") > names.index("dfu_dnload")
    assert b.devices[0].firmware_sha256 == hashlib.sha256(IMAGE).hexdigest()
    assert any(e["op"] == "reenumerate" for e in b.transcript)


def test_bootloader_without_firmware_says_how_to_get_it():
    with pytest.raises(FirmwareError) as info:
        open_device(backend=SimulatedBackend())
    text = str(info.value)
    assert firmware.FIRMWARE_NAME in text and firmware.FIRMWARE_SHA256 in text
    assert "coralrt firmware install" in text and "google-coral/libedgetpu" in text


def test_installed_firmware_is_verified_and_used(tmp_path, monkeypatch):
    src = tmp_path / "fw.bin"
    src.write_bytes(IMAGE)
    with pytest.raises(FirmwareError, match="sha256"):
        firmware.install(src)
    monkeypatch.setattr(firmware, "FIRMWARE_SHA256", hashlib.sha256(IMAGE).hexdigest())
    path = firmware.install(src.as_uri())               # file:// goes through urllib
    assert path.read_bytes() == IMAGE and str(tmp_path / "data") in str(path)
    b = SimulatedBackend()
    with open_device(backend=b):
        pass
    assert b.devices[0].firmware_sha256 == hashlib.sha256(IMAGE).hexdigest()


# -- bring-up against the recorded trace ----------------------------------------------------

def _transfers(transcript) -> list:
    from coralrt._selftest.recorder import Transfer
    return [Transfer(0.0, 0x40 if e["op"] == "write" else 0xC0, 1 if e["length"] == 4 else 0,
                     e["register"] & 0xFFFF, e["register"] >> 16,
                     e["value"].to_bytes(e["length"], "little"))
            for e in transcript if e["op"] in ("read", "write")]


def test_bringup_writes_match_the_trace_on_the_simulated_stick():
    from coralrt._selftest.open_trace import OPEN_TRACE
    from coralrt._selftest.recorder import compare_with_trace
    b = SimulatedBackend(firmware_loaded=True, transcript_limit=None)
    with open_device(backend=b):
        opened = _transfers(b.transcript)
    result = compare_with_trace(opened, OPEN_TRACE)
    assert result["writes_as_in_trace"], result["write_differences"]
    assert result["explained_writes"] == 3          # EnableReset: the stick was awake


class AsleepFake:
    """Only ctrl_transfer: registers that hold what is written, starting from the values
    the recorded open implies (a stick already asleep, force_sleep 0b11), with
    cur_pwr_state following force_sleep at once."""

    START = {0x1A30C: 0x000F0959, 0x1A314: 0x00190000, 0x1A318: 0x80C5025C,
             0x1A33C: 0x000C003F, 0x1A0D4: 0x1, 0x1A704: 0x0070007F}

    def __init__(self, *, stuck: int | None = None):
        self.values = dict(self.START)
        self.writes: list[tuple[int, int]] = []
        self.stuck = stuck

    def ctrl_transfer(self, rtype, req, value, index, data_or_len, timeout):
        reg = (index << 16) | value
        width = 4 if req == 1 else 8
        assert timeout > 0
        if rtype == 0xC0:
            v = 0 if reg == self.stuck else self.values.get(reg, 0)
            if reg == C.SCU_CTRL_3 and reg != self.stuck:
                asleep = C.field(v, C.SCU3_FORCE_SLEEP) == 3
                v = C.with_field(v, C.SCU3_CUR_PWR_STATE, 2 if asleep else 0)
            return array.array("B", v.to_bytes(width, "little"))
        assert rtype == 0x40 and len(data_or_len) == width
        v = int.from_bytes(bytes(data_or_len), "little")
        self.values[reg] = v
        self.writes.append((reg, v))
        return width


@pytest.mark.parametrize("speed", ["usb3", "usb2"])
def test_bringup_of_an_asleep_stick_writes_exactly_the_trace(speed):
    """The recorded open's stick was asleep: EnableReset returned at once, and every
    other write follows from libedgetpu's read-modify-write of these values."""
    fake = AsleepFake()
    bringup.bring_up(Transport(fake, timeout=1.0), usb_speed=speed)
    want = [(reg, value) for op, reg, value in trace_steps() if op == "write"]
    if speed == "usb2":
        want = [(r, 0x20 if r == C.OUTFEED_CHUNK_LENGTH_REG else v) for r, v in want]
    assert fake.writes == want


def test_bringup_at_max_clock_writes_the_direct_builds_clock_bits():
    fake = AsleepFake()
    bringup.bring_up(Transport(fake, timeout=1.0), clock="max")
    scu3 = [v for r, v in fake.writes if r == C.SCU_CTRL_3]
    assert scu3 == [0x0085025C]                     # 500 MHz GCB, 250 MHz AXI, 500 MHz 8051
    with pytest.raises(ValueError, match="clock"):
        bringup.bring_up(Transport(AsleepFake(), timeout=1.0), clock="turbo")


def test_bringup_poll_is_bounded_by_the_timeout():
    import time
    fake = AsleepFake(stuck=C.SCU_CTRL_3)
    start = time.monotonic()
    with pytest.raises(DeviceTimeoutError, match="0x1a318"):
        bringup.bring_up(Transport(fake, timeout=0.2))
    assert time.monotonic() - start < 1.0


# -- transport, framing, lock ---------------------------------------------------------------

@pytest.mark.parametrize("exc, cls", [
    (usb.core.USBTimeoutError("t", -7, errno.ETIMEDOUT), DeviceTimeoutError),
    (usb.core.USBError("a", -3, errno.EACCES), DevicePermissionError),
    (usb.core.USBError("b", -6, errno.EBUSY), DeviceBusyError),
    (usb.core.USBError("n", -4, errno.ENODEV), DeviceLostError),
    (usb.core.USBError("p", -9, errno.EPIPE), DeviceError),
    (usb.core.USBError("t", -7, None), DeviceTimeoutError),
    (usb.core.NoBackendError("none"), DeviceNotFoundError),
])
def test_translate_error(exc, cls):
    err = translate_error(exc, "doing x", path="usb:0", timeout=6.0)
    assert type(err) is cls and "usb:0" in str(err)
    if cls is DevicePermissionError:
        assert "99-coralrt.rules" in str(err) and "plugdev" in str(err)
    if cls is DeviceTimeoutError:
        assert isinstance(err, TimeoutError) and err.timeout == 6.0


def test_framing_header_and_chunks():
    sent = []
    fake = SimpleNamespace(write=lambda ep, data, timeout: sent.append((ep, bytes(data),
                                                                        timeout)) or len(data))
    framer = Framer(Transport(fake, timeout=2.0), "usb3")
    framer.send(C.TAG_PARAMETERS, np.arange(C.MAX_BULK_OUT + 10, dtype=np.uint32)
                .astype(np.uint8))
    assert sent[0][1] == (C.MAX_BULK_OUT + 10).to_bytes(4, "little") + b"\x02\0\0\0"
    assert [len(s[1]) for s in sent] == [8, C.MAX_BULK_OUT, 10]
    assert {s[0] for s in sent} == {C.EP_OUT} and {s[2] for s in sent} == {2000}
    assert Framer(Transport(fake), "usb2").max_in < Framer(Transport(fake), "usb3").max_in


def test_lock_second_holder_gets_busy_with_pid():
    import os
    first = DeviceLock("/sys/bus/usb/devices/3-1.2")
    first.acquire()
    with pytest.raises(DeviceBusyError) as info:
        DeviceLock("/sys/bus/usb/devices/3-1.2").acquire()
    assert info.value.holder_pid == os.getpid() and str(os.getpid()) in str(info.value)
    first.release()
    with DeviceLock("/sys/bus/usb/devices/3-1.2"):
        pass


# -- coralrt segments through the session ----------------------------------------------------

def test_session_target_sim_runs_through_the_usb_driver():
    from coralrt import InferenceSession
    path = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    b = SimulatedBackend(firmware_loaded=True, transcript_limit=None)
    x = np.random.default_rng(1).integers(0, 256, (1, 128, 128, 3), dtype=np.uint8)
    with open_device(backend=b) as dev:
        s = InferenceSession(path, target="sim", device=dev)
        name = s.get_inputs()[0].name
        got = s.run({name: x})
        again = s.run({name: x})
        loads = [e for e in b.transcript if e["op"] == "bulk_out" and e.get("kind") == "load"]
        assert len(loads) == 1                          # the segment is loaded once
        b.devices[0].engine.reset()                     # the stick forgets the segment
        third = s.run({name: x})
        assert any(e["op"] == "run_unknown" for e in b.transcript)
    want = InferenceSession(path, target="sim").run({name: x})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
        np.testing.assert_array_equal(again[k], want[k])
        np.testing.assert_array_equal(third[k], want[k])


# -- DWN1 executables -------------------------------------------------------------------------

def _expected_stream(exe):
    out = []
    for h in exe.dma_hints:
        if h.kind == "instruction":
            out.append(("bulk_out", 0, h.size))
        elif h.kind == "input":
            out.append(("bulk_out", 1, h.size))
        elif h.kind == "parameter":
            out.append(("bulk_out", 2, h.size))
        elif h.kind == "output":
            out.append(("bulk_in", 3, h.size))
        elif h.kind == "interrupt":
            out.append(("bulk_in", 4, 16))
    return out


def test_dwn1_follows_hints_and_caches_parameters_by_token():
    b = dwn1_backend()
    with open_device(backend=b) as dev:
        v1 = dev.load(custom_options("mobilenet_v1_0.25_128_quant_edgetpu.tflite"))
        v2 = dev.load(custom_options("mobilenet_v2_1.0_224_quant_edgetpu.tflite"))
        xs = [np.full(layer.shape, 7, np.uint8) for layer in v1.exe.inputs]
        n0 = len(b.transcript)
        outs = dev.run(v1, xs)
        n1 = len(b.transcript)
        dev.run(v1, xs)
        n2 = len(b.transcript)
        assert dev.last_stats.device_seconds == 0.0    # no device time for DWN1 streams
        dev.run(v2, [np.zeros(layer.shape, np.uint8) for layer in v2.exe.inputs])
        n3 = len(b.transcript)
        dev.run(v1, xs)
        n4 = len(b.transcript)
    cold, warm = bulk(b.transcript[n0:n1]), bulk(b.transcript[n1:n2])
    assert cold == _expected_stream(v1.cache) + _expected_stream(v1.exe)
    assert warm == _expected_stream(v1.exe)
    assert not [e for e in warm if e[1] == 2]          # no parameter bytes when warm
    assert cold[0] == ("bulk_out", 0, len(v1.cache.instructions[0]))   # PC instructions first
    assert [e for e in bulk(b.transcript[n2:n3]) if e[1] == 2]        # other token: upload
    assert [e for e in bulk(b.transcript[n3:n4]) if e[1] == 2]        # and back: upload again
    assert outs[0].shape == tuple(v1.exe.outputs[0].shape)


# -- transforms --------------------------------------------------------------------------------

def _layer(**kw):
    base = dict(name="t", shape=(2, 3, 2), dtype="uint8", data_type="FIXED_POINT8",
                zero_point=0, scale=1.0, size_bytes=16, x_dim=3, y_dim=2, z_dim=2,
                execution_count=1, layout=None, slices=None)
    base.update(kw)
    return SimpleNamespace(**base)


def test_xor_sign_int8_and_int16():
    a = np.array([-128, -1, 0, 127], np.int8)
    raw = a.view(np.uint8).copy()
    xor_sign(raw, "SIGNED_FIXED_POINT8")
    assert raw.tolist() == [0, 127, 128, 255]
    b = np.array([-32768, 0, 32767], "<i2")
    raw = b.view(np.uint8).copy()
    xor_sign(raw, "SIGNED_FIXED_POINT16")
    assert raw.view("<u2").tolist() == [0, 32768, 65535]


def test_input_stager_pads_and_flips_sign():
    layer = _layer(shape=(2, 3), dtype="int8", data_type="SIGNED_FIXED_POINT8", size_bytes=8)
    st = InputStager(layer, 12)
    buf = st.stage(np.array([[-128, 0, 1], [2, 3, 127]], np.int8))
    assert buf.tolist() == [0, 128, 129, 130, 131, 255, 0, 0, 0, 0, 0, 0]
    with pytest.raises(Exception, match="expects 6"):
        st.stage(np.zeros(5, np.int8))


def test_output_relayout_from_tiles():
    # 2x3 (y, x) of z=2 elements in two tiles: x 0..1 in tile 0, x 2 in tile 1.
    layout = SimpleNamespace(row_starts=None)
    ymap, xmap = np.array([0, 0]), np.array([0, 0, 1])
    tile_off, xoff = np.array([0, 12]), np.array([0, 2, 0])
    yloc, rowsize = np.array([0, 1]), np.array([6, 6, 2])

    def row_starts(ys, xs):
        ty, tx = ymap[ys], xmap[xs]
        return (tile_off[ty[:, None] + tx[None, :]] + yloc[ys][:, None] * rowsize[xs][None, :]
                + xoff[xs][None, :])
    layout.row_starts = row_starts
    layer = _layer(layout=layout)
    idx = relayout_index(layer)
    # element (y, x, z) of a known tensor, scattered into the tiled buffer by hand
    want = np.arange(12, dtype=np.uint8).reshape(2, 3, 2) + 100
    raw = np.zeros(16, np.uint8)
    for y in range(2):
        for x in range(3):
            base = tile_off[ymap[y] + xmap[x]] + yloc[y] * rowsize[x] + xoff[x]
            raw[base:base + 2] = want[y, x]
    assert sorted(idx.tolist()) == sorted(set(idx.tolist()))
    np.testing.assert_array_equal(OutputDecoder(layer).decode(raw), want)


def test_output_slices_and_classifier_clamp():
    s0 = SimpleNamespace(ranges=((0, 0), (0, 2)), stride=(3, 1), offset=4, packed=True)
    s1 = SimpleNamespace(ranges=((1, 1), (0, 2)), stride=(3, 1), offset=0, packed=True)
    layer = _layer(shape=(2, 3), slices=(s0, s1), size_bytes=8)
    raw = np.array([4, 5, 6, 0, 1, 2, 3, 0], np.uint8)
    assert OutputDecoder(layer).decode(raw).tolist() == [[1, 2, 3], [4, 5, 6]]
    cls16 = _layer(shape=(3,), dtype="uint16", data_type="FIXED_POINT16", size_bytes=8)
    raw = np.array([5, 300, 65535, 0], "<u2").view(np.uint8)
    assert OutputDecoder(cls16, np.uint8).decode(raw).tolist() == [5, 255, 255]
    single = _layer(shape=(3,), dtype="float32", data_type="SINGLE", size_bytes=12, scale=0.5,
                    zero_point=10)
    raw = np.array([-20.0, 1.0, 200.0], "<f4").view(np.uint8)
    assert OutputDecoder(single, np.uint8).decode(raw).tolist() == [0, 12, 255]
    signed = _layer(shape=(2,), dtype="int8", data_type="SIGNED_FIXED_POINT8", size_bytes=8)
    assert OutputDecoder(signed).decode(np.array([0, 255, 9, 9], np.uint8)).tolist() == [-128,
                                                                                         127]


# -- command line -----------------------------------------------------------------------------

def test_cli_firmware_info_and_install(tmp_path, capsys, monkeypatch):
    assert cli_main(["firmware", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sha256"] == firmware.FIRMWARE_SHA256 and info["installed"] == "missing"
    src = tmp_path / "fw.bin"
    src.write_bytes(IMAGE)
    assert cli_main(["firmware", "install", str(src)]) == 1
    assert "sha256" in capsys.readouterr().err
    monkeypatch.setattr(firmware, "FIRMWARE_SHA256", hashlib.sha256(IMAGE).hexdigest())
    assert cli_main(["firmware", "install", str(src)]) == 0
    assert Path(firmware.installed_path()).read_bytes() == IMAGE


def test_simulated_stick_refuses_edgetpu_compiler_programs_at_session_creation():
    from coralrt import InferenceSession
    from conftest import random_inputs

    path = shared_model("edgetpu/deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite")
    backend = SimulatedBackend(firmware_loaded=True)
    with open_device(backend=backend) as dev:
        with pytest.raises(ProgramRefusedError) as info:
            InferenceSession(path, target="coral", device=dev)
        err = info.value
        assert isinstance(err, DeviceError) and isinstance(err, OSError)
        assert err.kind == "dwn1" and err.path == dev.path
        text = str(err)
        assert text.startswith(f"{dev.path}: cannot load an edgetpu_compiler program")
        assert "simulated Edge TPU cannot execute" in text
        assert "Google's closed Edge TPU instruction set" in text
        assert "target='sim'" in text and "target='coral'" in text
        assert not [e for e in backend.transcript if e["op"] == "bulk_out"]   # nothing sent
        # The refusal did not break the stick: native segments still run on it.
        sess = InferenceSession(shared_model("mobilenet_v1_0.25_128_quant.tflite"),
                                target="sim", device=dev)
        sess.run(random_inputs(sess.get_inputs()))
    # No stick attached (libusb finds none here): a clear error, never a CPU run.
    with pytest.raises(DeviceNotFoundError):
        InferenceSession(path, target="coral")


def test_session_drives_edgetpu_compiled_models_on_a_stick_that_accepts_them():
    # The driver's DWN1 path through a session (test mode: the stick plays the
    # program's transfers with placeholder bytes, which are not the model's outputs).
    from coralrt import InferenceSession
    from conftest import random_inputs

    path = shared_model("edgetpu/deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite")
    backend = dwn1_backend()
    with open_device(backend=backend) as dev:
        sess = InferenceSession(path, target="coral", device=dev)
        out = sess.run(random_inputs(sess.get_inputs()))
        (argmax,) = out.values()
        assert argmax.shape == (1, 513, 513) and argmax.dtype == np.int64
        assert [s["kind"] for s in sess.profile()] == ["tpu", "cpu"]  # the tail on the CPU
        assert any(e["op"] == "bulk_out" and e.get("kind") == "raw" for e in backend.transcript)
        assert not hasattr(dev.last_stats, "computed")


def test_stick_refuses_raw_streams_that_arrive_anyway():
    # Defence in depth: a DWN1 program prepared while the test switch was on, run after
    # it is off, gets an error event from the stick: a DeviceError, never zeros.
    backend = dwn1_backend(max_wait=0.5)
    with open_device(backend=backend, timeout=0.5) as dev:
        h = dev.load(custom_options("mobilenet_v1_0.25_128_quant_edgetpu.tflite"))
        xs = [np.zeros(layer.shape, np.uint8) for layer in h.exe.inputs]
        dev.run(h, xs)
        backend._accept_dwn1_for_tests = False
        with pytest.raises(DeviceError, match="refused"):
            dev.run(h, xs)
    assert [e for e in backend.transcript if e["op"] == "raw_refused"]


def test_refusal_of_a_program_loaded_while_closed_comes_at_its_first_run():
    dev = UsbEdgeTpu(None, SimulatedBackend(firmware_loaded=True))
    h = dev.load(custom_options("mobilenet_v1_0.25_128_quant_edgetpu.tflite"))
    dev.open()
    try:
        with pytest.raises(ProgramRefusedError, match="edgetpu_compiler"):
            dev.run(h, [np.zeros(layer.shape, np.uint8) for layer in h.exe.inputs])
        dev._usable()                   # the device is not marked as failed
    finally:
        dev.close()


# -- the backend extension ------------------------------------------------------------------

class PyusbOnly(usb.backend.IBackend):
    """A pyusb backend without the extension, as libusb is (it drives a simulated stick
    underneath, which the driver cannot tell): the driver must assume a real stick."""

    def __init__(self, inner):
        self.inner = inner


for _name in [n for n in vars(usb.backend.IBackend) if not n.startswith("_")]:
    setattr(PyusbOnly, _name,
            lambda self, *args, _name=_name: getattr(self.inner, _name)(*args))


def small_segment_bytes() -> bytes:
    from coralrt._formats.segment import build_segment
    from coralrt._formats.segment_codec import encode
    from coralrt.testing import ModelBuilder
    b = ModelBuilder(name="relu")
    x = b.input("x", (1, 4, 4, 2), np.int8, scale=0.1, zero_point=0)
    y = b.tensor("y", (1, 4, 4, 2), np.int8, scale=0.1, zero_point=0)
    b.op("RELU", [x], [y])
    b.output(y)
    return encode(build_segment(b.build()))


def test_backend_without_extension_is_a_real_stick_that_refuses_native_segments():
    from coralrt import InferenceSession

    plain = PyusbOnly(SimulatedBackend(firmware_loaded=True, lock_scope="process"))
    assert not isinstance(plain, BackendExtension)
    with open_device(backend=plain) as dev:
        assert list(lock_dir().glob("*.lock"))          # lock_scope "machine": the lock
        with pytest.raises(ProgramRefusedError) as info:
            dev.load(small_segment_bytes())
        text = str(info.value)
        assert info.value.kind == "segment"
        assert text.startswith(f"{dev.path}: cannot load a coralrt native segment: a real "
                               f"Edge TPU cannot execute coralrt's native segments")
        assert "target='sim'" in text and "edgetpu_compiler" in text
        with pytest.raises(ProgramRefusedError):        # at session creation
            InferenceSession(shared_model("mobilenet_v1_0.25_128_quant.tflite"),
                             target="sim", device=dev)
        # DWN1 programs are what a real stick runs; its device time is not measured.
        accept_dwn1(plain.inner)                        # (the stick underneath is simulated)
        h = dev.load(custom_options("mobilenet_v1_0.25_128_quant_edgetpu.tflite"))
        dev.run(h, [np.zeros(layer.shape, np.uint8) for layer in h.exe.inputs])
        assert dev.last_stats.device_seconds == 0.0 and dev.last_stats.host_seconds > 0


def test_a_stick_the_session_opened_is_closed_when_it_refuses_the_program():
    from coralrt import InferenceSession
    from coralrt._usb.driver import UsbEdgeTpu

    made = []

    def refusing_stick(kernels=None):
        made.append(UsbEdgeTpu(None, PyusbOnly(SimulatedBackend(firmware_loaded=True))))
        return made[-1]

    class Plugin:
        @coralrt.hookimpl
        def coralrt_register_devices(self, registry):
            registry.add("sim", refusing_stick)

    with pytest.raises(ProgramRefusedError):
        InferenceSession(shared_model("mobilenet_v1_0.25_128_quant.tflite"), target="sim",
                         plugins=[Plugin()])
    assert len(made) == 1 and not made[0].is_open
    assert not list(lock_dir().glob("*.pid"))           # the lock went with it


def test_default_extension_answers():
    ext = BackendExtension()
    assert ext.lock_scope == "machine" and ext.device_seconds(5) == 0.0
    assert ext.refusal(5, "dwn1") is None
    assert "native segments" in ext.refusal(5, "segment")
    sim = SimulatedBackend()
    assert isinstance(sim, BackendExtension) and isinstance(sim, usb.backend.IBackend)
    assert sim.refusal(5, "segment") is None and "closed" in sim.refusal(5, "dwn1")
    assert dwn1_backend().refusal(5, "dwn1") is None
    with pytest.raises(ValueError, match="lock_scope"):
        SimulatedBackend(lock_scope="galaxy")


def test_lock_scope_process_takes_no_lock():
    b = SimulatedBackend(firmware_loaded=True, lock_scope="process")
    with open_device(backend=b) as dev:
        assert dev._lock is None
        assert not lock_dir().exists() or not list(lock_dir().iterdir())
    with open_device(backend=SimulatedBackend(firmware_loaded=True)) as dev:
        assert dev._lock is not None and list(lock_dir().glob("*.lock"))
    assert dev._lock is None                           # released on close


def test_device_seconds_come_from_the_latency_model_through_the_extension():
    from coralrt import InferenceSession
    from conftest import random_inputs

    b = SimulatedBackend(firmware_loaded=True, latency=LatencyModel(), time_scale=0.0,
                         lock_scope="process")
    with open_device(backend=b) as dev:
        sess = InferenceSession(shared_model("mobilenet_v1_0.25_128_quant.tflite"),
                                target="sim", device=dev)
        x = random_inputs(sess.get_inputs())
        sess.run(x)
        last = b.devices[0].engine.last_run
        cold = dev.last_stats.device_seconds
        assert cold == pytest.approx(last["device_seconds"] + last["upload_seconds"])
        assert last["upload_seconds"] > 0
        sess.run(x)
        warm = dev.last_stats.device_seconds
        assert warm == pytest.approx(b.devices[0].engine.last_run["device_seconds"])
        assert cold > warm > 0
        assert sess.profile()[0]["device_seconds"] == pytest.approx(warm)
        assert b.device_seconds(dev._address) == pytest.approx(warm)
        assert b.device_seconds(9999) == 0.0             # no stick at that address


def test_auto_target_picks_coral_when_a_stick_is_given_and_cpu_otherwise(caplog):
    import logging

    from coralrt import InferenceSession

    compiled = shared_model("edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite")
    with open_device(backend=dwn1_backend()) as dev, \
            caplog.at_level(logging.INFO, logger="coralrt.session"):
        assert InferenceSession(compiled, target="auto", device=dev).target == "coral"
        assert InferenceSession(shared_model("mobilenet_v1_0.25_128_quant.tflite"),
                                target="auto").target == "cpu"
    messages = [r.getMessage() for r in caplog.records]
    assert any("Coral USB Accelerator given" in m for m in messages)
    assert any("running on the CPU (no Coral USB Accelerator found)" in m for m in messages)


# -- interrupted requests; defects of the program are not failures of the stick ---------------

def _segment_stick(**kw):
    b = SimulatedBackend(firmware_loaded=True, transcript_limit=None, time_scale=0.0, **kw)
    return b, open_device(backend=b)


def _conv_relu_segment(channels: int = 4) -> bytes:
    from coralrt._formats.segment import build_segment
    from coralrt._formats.segment_codec import encode
    from support.models import conv_relu
    return encode(build_segment(conv_relu(channels)))


def _expected(program: bytes, xs):
    from coralrt._formats.segment_codec import decode
    from coralrt._sim.runner import SegmentRunner
    return SegmentRunner(decode(program)).run(xs)


def _feed(seed: int):
    return [np.random.default_rng(seed).integers(-128, 128, (1, 6, 6, 3), dtype=np.int8)]


def _ops_since(b, mark: int) -> list[str]:
    return [e["op"] for e in b.transcript[mark:]]


def _same(got, want) -> bool:
    return len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("after", [False, True])
@pytest.mark.parametrize("where", ["bulk_write", "bulk_read"])
def test_an_exception_mid_transfer_makes_the_next_run_reset_the_stick_first(where, after):
    b, dev = _segment_stick()
    program = _conv_relu_segment()
    h = dev.load(program)
    assert _same(dev.run(h, _feed(0)), _expected(program, _feed(0)))
    real = getattr(b, where)

    def interrupted(*args):           # Ctrl-C at the first such transfer of the next run
        setattr(b, where, real)
        if after:
            real(*args)               # done on the stick, never seen by the host
        raise KeyboardInterrupt
    setattr(b, where, interrupted)
    with pytest.raises(KeyboardInterrupt):
        dev.run(h, _feed(1))
    mark = len(b.transcript)
    assert _same(dev.run(h, _feed(2)), _expected(program, _feed(2)))
    ops = _ops_since(b, mark)
    assert ops.index("reset") < ops.index("load") < ops.index("run")   # reset, uploaded again
    mark = len(b.transcript)
    assert _same(dev.run(h, _feed(3)), _expected(program, _feed(3)))
    assert "reset" not in _ops_since(b, mark)                 # in step again: no more resets
    dev.close()


def test_an_error_before_the_first_transfer_leaves_the_stick_in_step():
    from coralrt.errors import InputError
    b, dev = _segment_stick()
    program = _conv_relu_segment()
    h = dev.load(program)
    dev.run(h, _feed(0))
    mark = len(b.transcript)
    with pytest.raises(InputError):
        dev.run(h, _feed(1) * 2)
    assert _same(dev.run(h, _feed(1)), _expected(program, _feed(1)))
    assert "reset" not in _ops_since(b, mark)
    dev.close()


def test_a_closed_stick_is_not_reopened_by_run_and_reset_recovers_a_failed_one():
    b, dev = _segment_stick()
    program = _conv_relu_segment()
    h = dev.load(program)
    real = b.bulk_read

    def interrupted(*args):
        b.bulk_read = real
        raise KeyboardInterrupt
    b.bulk_read = interrupted
    with pytest.raises(KeyboardInterrupt):
        dev.run(h, _feed(0))
    dev.close()                                   # closed on purpose: stays closed
    with pytest.raises(DeviceError, match="not open"):
        dev.run(h, _feed(0))
    with pytest.raises(DeviceError, match="not open"):
        dev.reset()
    dev.open()
    assert _same(dev.run(h, _feed(1)), _expected(program, _feed(1)))
    b.inject("stall")                             # a transfer error: failed ...
    with pytest.raises(DeviceError):
        dev.run(h, _feed(2))
    with pytest.raises(DeviceLostError, match="close it and open it again"):
        dev.run(h, _feed(2))                      # ... refused at once, as before
    dev.reset()                                   # ... until reset (or close and open)
    assert _same(dev.run(h, _feed(2)), _expected(program, _feed(2)))
    dev.close()


def test_an_interrupted_dwn1_run_resets_and_uploads_the_parameters_again():
    b = dwn1_backend()
    with open_device(backend=b) as dev:
        h = dev.load(custom_options("mobilenet_v1_0.25_128_quant_edgetpu.tflite"))
        xs = [np.zeros(layer.shape, np.uint8) for layer in h.exe.inputs]
        dev.run(h, xs)
        real = b.bulk_read

        def interrupted(*args):
            b.bulk_read = real
            real(*args)
            raise KeyboardInterrupt
        b.bulk_read = interrupted
        with pytest.raises(KeyboardInterrupt):
            dev.run(h, xs)
        mark = len(b.transcript)
        dev.run(h, xs)
        new = b.transcript[mark:]
        assert [e["op"] for e in new].count("reset") >= 1
        assert [e["tag"] for e in new if e["op"] == "bulk_out"].count(2) > 0   # parameters


def test_a_segment_the_stick_cannot_load_is_a_model_error_and_the_stick_stays_usable():
    from coralrt.errors import ModelError

    def refusing(ctx):
        raise ModelError("this RELU is not for this stick", where="RELU operator")
    b, dev = _segment_stick(kernels={"RELU": refusing})
    bad = dev.load(_conv_relu_segment(4))
    for _ in range(2):                             # no DeviceError, no "failed earlier"
        with pytest.raises(ModelError, match="cannot load.*this RELU is not for this stick"):
            dev.run(bad, _feed(0))
    from coralrt._formats.segment import build_segment
    from coralrt._formats.segment_codec import encode
    from coralrt.testing import ModelBuilder
    mb = ModelBuilder()
    x = mb.input("x", (1, 6, 6, 3), np.int8, scale=0.05, zero_point=3)
    y = mb.tensor("y", (1, 6, 6, 3), np.int8, scale=0.1, zero_point=0)
    mb.op("ADD", [x, x], [y])
    mb.output(y)
    good = encode(build_segment(mb.build()))
    assert _same(dev.run(dev.load(good), _feed(1)), _expected(good, _feed(1)))
    ops = [e["op"] for e in b.transcript]
    assert ops.count("load_failed") == 2 and "fatal" not in ops
    dev.close()


def test_a_kernel_that_fails_on_the_stick_is_an_inference_error_and_the_stick_stays_usable():
    from coralrt.errors import InferenceError
    from coralrt._sim.kernels import kernel_for

    def flaky(ctx):
        relu = kernel_for("RELU")(ctx)

        def run(inputs):
            if int(inputs[0].reshape(-1)[0]) == 7:
                raise ValueError("seven is not allowed here")
            return relu(inputs)
        return run
    b, dev = _segment_stick(kernels={"RELU": flaky})
    program = _conv_relu_segment()
    h = dev.load(program)
    good = _feed(0)
    want = _expected(program, good)
    if int(want[0].reshape(-1)[0]) == 7:
        good = _feed(1)
        want = _expected(program, good)
    bad = next(f for f in (_feed(s) for s in range(2, 2000))
               if int(_expected(program, f)[0].reshape(-1)[0]) == 7)
    assert _same(dev.run(h, good), want)
    mark = len(b.transcript)
    with pytest.raises(InferenceError, match="failed while running.*seven is not allowed") as info:
        dev.run(h, bad)
    assert not isinstance(info.value, DeviceError)
    assert _same(dev.run(h, good), want)          # same stick, no reset, no reload
    ops = _ops_since(b, mark)
    assert ops.count("run_failed") == 1 and "fatal" not in ops and "reset" not in ops
    assert "load" not in ops
    dev.close()
