"""A transient fault during the firmware download does not strand the stick.

The simulated bootloader keeps a DFU 1.1 error state as a real one does (a
stalled request leaves it in dfuERROR until CLRSTATUS or a port reset), and the
driver brings it back to dfuIDLE before every download (CLRSTATUS, ABORT or a
port reset, as the state asks) and tries the download again, a bounded number
of times.  Every fault at every transfer of an open ends in success or a typed
error, in bounded time, and the next open succeeds without a replug.
"""

from __future__ import annotations

import errno
import hashlib
import time

import pytest
import usb.core

from coralrt.errors import DeviceError, DeviceLostError, FirmwareError
from coralrt.testing import SimulatedBackend
from coralrt._usb import constants as C
from coralrt import open_device

IMAGE = bytes(range(256)) * 3 + b"\x5a" * 100     # four DNLOAD blocks, the last one short
SHA = hashlib.sha256(IMAGE).hexdigest()
TIMEOUT = 0.3
MAX_WAIT = 0.05       # what a simulated timeout really waits
BOUND = 3.0           # no open, faults and recovery included, may take longer


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))


def bootloader(**kwargs) -> SimulatedBackend:
    return SimulatedBackend(max_wait=MAX_WAIT, transcript_limit=None, **kwargs)


def _open(b: SimulatedBackend):
    return open_device(backend=b, firmware=IMAGE, timeout=TIMEOUT)


def _boot_device(b: SimulatedBackend):
    return usb.core.find(backend=b, idVendor=C.BOOTLOADER_ID[0], idProduct=C.BOOTLOADER_ID[1])


def _status(dev) -> tuple[int, int, int]:
    s = bytes(dev.ctrl_transfer(C.DFU_IN, C.DFU_GETSTATUS, 0, 0, 6))
    return s[0], int.from_bytes(s[1:4], "little"), s[4]


def _state(dev) -> int:
    return bytes(dev.ctrl_transfer(C.DFU_IN, C.DFU_GETSTATE, 0, 0, 1))[0]


def _clean_open_transfers() -> tuple[list[str], int]:
    """The DFU requests of a fault-free open (one counted transfer each) and the number
    of transfers the whole open makes (bring-up included)."""
    b = bootloader()
    with _open(b):
        total = b.devices[0].transfers
    ops = [e for e in b.transcript if e["op"].startswith("dfu_")]
    return [e["op"] + (f" {e['block']}" if "block" in e else "") for e in ops], total


def _open_then_reopen(b: SimulatedBackend) -> Exception | None:
    """Open (success or a typed error, in bounded time), then open again: that must work."""
    start = time.monotonic()
    first = None
    try:
        with _open(b):
            pass
    except DeviceError as e:
        first = e
    assert time.monotonic() - start < BOUND
    start = time.monotonic()
    with _open(b) as dev:
        assert dev.is_open
    assert time.monotonic() - start < BOUND
    assert b.devices[0].mode == "running" and b.devices[0].firmware_sha256 == SHA
    return first


# -- the simulated bootloader keeps its error state ---------------------------------------


@pytest.mark.parametrize("way_out", ["clrstatus", "port reset"])
def test_a_stalled_getstatus_leaves_the_simulated_bootloader_in_dfu_error_until_cleared(way_out):
    b = bootloader()
    dev = _boot_device(b)
    dev.ctrl_transfer(C.DFU_OUT, C.DFU_DNLOAD, 0, 0, IMAGE[:256])
    b.inject("stall", after=0)
    with pytest.raises(usb.core.USBError) as info:      # the GETSTATUS after block 0
        _status(dev)
    assert info.value.errno == errno.EPIPE
    assert _state(dev) == C.DFU_STATE_ERROR             # DFU 1.1: a stalled request
    for request, value, data in [(C.DFU_DNLOAD, 0, IMAGE[:256]),     # a new download
                                 (C.DFU_DNLOAD, 1, IMAGE[256:512]),  # the next block
                                 (C.DFU_ABORT, 0, None)]:            # not a way out
        with pytest.raises(usb.core.USBError) as info:
            dev.ctrl_transfer(C.DFU_OUT, request, value, 0, data)
        assert info.value.errno == errno.EPIPE
        assert _state(dev) == C.DFU_STATE_ERROR
    with pytest.raises(usb.core.USBError):
        dev.ctrl_transfer(C.DFU_IN, C.DFU_UPLOAD, 0, 0, 256)
    assert _status(dev) == (C.DFU_STATUS_ERR_STALLEDPKT, 0, C.DFU_STATE_ERROR)
    assert _status(dev)[2] == C.DFU_STATE_ERROR         # reading it does not clear it
    if way_out == "clrstatus":
        dev.ctrl_transfer(C.DFU_OUT, C.DFU_CLRSTATUS, 0, 0, None)
    else:   # nothing was manifested: the bootloader restarts, still in bootloader mode
        dev.reset()
        assert b.devices[0].mode == "bootloader"
    assert _status(dev) == (C.DFU_STATUS_OK, 0, C.DFU_STATE_IDLE)
    dev.ctrl_transfer(C.DFU_OUT, C.DFU_DNLOAD, 0, 0, IMAGE[:256])   # a download starts again
    assert _status(dev)[2] == C.DFU_STATE_DNLOAD_IDLE


# -- the driver recovers -------------------------------------------------------------------


def test_open_recovers_from_a_stall_on_the_getstatus_after_block_0():
    ops, _ = _clean_open_transfers()
    after = ops.index("dfu_getstatus", ops.index("dfu_dnload 0"))
    b = bootloader()
    b.inject("stall", after=after)
    with _open(b) as dev:                               # recovered within this open
        assert dev.is_open
    assert b.devices[0].firmware_sha256 == SHA
    names = [e["op"] for e in b.transcript]
    fault = names.index("fault")
    assert "dfu_clrstatus" in names[fault:]             # dfuERROR cleared, not replugged
    assert "replug" not in names
    assert _open_then_reopen(b) is None


@pytest.mark.parametrize("kind", ["stall", "timeout"])
def test_a_fault_at_any_transfer_of_an_open_never_strands_the_stick(kind):
    ops, total = _clean_open_transfers()
    failures = []
    for after in range(total + 1):
        b = bootloader()
        b.inject(kind, after=after)
        first = _open_then_reopen(b)                    # no replug in between
        if first is not None:
            failures.append(after)
    # A fault in the download is recovered within the same open; one in the
    # bring-up that follows fails that open with a typed error, the next one works.
    assert all(after >= len(ops) for after in failures), failures
    assert ops[:3] == ["dfu_getstatus", "dfu_dnload 0", "dfu_getstatus"]   # state read first


def test_a_disconnect_during_the_download_fails_at_once_and_a_replug_recovers():
    ops, _ = _clean_open_transfers()
    for after in range(len(ops)):
        b = bootloader()
        b.inject("disconnect", after=after)
        start = time.monotonic()
        with pytest.raises(DeviceLostError, match="replug"):
            _open(b)
        assert time.monotonic() - start < BOUND
        b.replug(0, mode="bootloader")                  # a real stick comes back unloaded
        with _open(b):
            pass
        assert b.devices[0].firmware_sha256 == SHA


def _set_state(machine, state: str) -> str:
    """Put the simulated bootloader where an interrupted host leaves it; the request
    that should bring it back to dfuIDLE."""
    if state == "dfuERROR":
        machine.state, machine.status = C.DFU_STATE_ERROR, C.DFU_STATUS_ERR_ADDRESS
        return "dfu_clrstatus"
    if state == "dfuDNLOAD-IDLE":
        machine.state, machine._next_block, machine._image = (
            C.DFU_STATE_DNLOAD_IDLE, 2, bytearray(IMAGE[:512]))
        return "dfu_abort"
    if state == "dfuDNLOAD-SYNC":       # GETSTATUS finishes the block, then ABORT
        machine.state, machine._next_block, machine._image = (
            C.DFU_STATE_DNLOAD_SYNC, 1, bytearray(IMAGE[:256]))
        return "dfu_abort"
    if state == "dfuDNBUSY":            # wait its poll timeout, then as above
        machine.state, machine._busy_until, machine._busy_left = (
            C.DFU_STATE_DNBUSY, time.monotonic(), 1)
        machine._next_block, machine._image = 1, bytearray(IMAGE[:256])
        return "dfu_abort"
    if state == "dfuUPLOAD-IDLE":
        machine.state, machine._upload_at = C.DFU_STATE_UPLOAD_IDLE, 0
        return "dfu_abort"
    if state == "dfuMANIFEST-WAIT-RESET":   # only a reset gets it out
        machine.state = C.DFU_STATE_MANIFEST_WAIT_RESET
        return "reset"
    raise AssertionError(state)


@pytest.mark.parametrize("state", ["dfuERROR", "dfuDNLOAD-IDLE", "dfuDNLOAD-SYNC", "dfuDNBUSY",
                                   "dfuUPLOAD-IDLE", "dfuMANIFEST-WAIT-RESET"])
def test_open_brings_the_bootloader_back_to_dfu_idle_from(state):
    b = bootloader(dfu_busy_polls=1 if state == "dfuDNBUSY" else 0)
    expected = _set_state(b.devices[0].dfu, state)
    with _open(b):
        pass
    names = [e["op"] for e in b.transcript]
    first_block = names.index("dfu_dnload")
    assert expected in names[:first_block]
    assert b.devices[0].firmware_sha256 == SHA


@pytest.mark.parametrize("after_reset", ["dfuIDLE", "dfuERROR"])
def test_a_getstatus_that_times_out_leads_to_a_port_reset(monkeypatch, after_reset):
    # The Coral bootloader restarts in dfuIDLE after a reset (libedgetpu resets and
    # then sends DNLOAD); DFU 1.1 also lets a device without valid firmware come back
    # in dfuERROR with errFIRMWARE.  Both are recovered.
    b = bootloader()
    machine = b.devices[0].dfu
    if after_reset == "dfuERROR":
        reset = machine.usb_reset

        def spec_reset():
            reset()
            if machine.firmware is None:
                machine.state, machine.status = C.DFU_STATE_ERROR, C.DFU_STATUS_ERR_FIRMWARE

        monkeypatch.setattr(machine, "usb_reset", spec_reset)
    b.inject("timeout", after=0)                        # the first GETSTATUS
    with _open(b):
        pass
    names = [e["op"] for e in b.transcript]
    assert names.index("reset") < names.index("dfu_dnload")
    assert ("dfu_clrstatus" in names) == (after_reset == "dfuERROR")
    assert b.devices[0].firmware_sha256 == SHA


def test_a_bootloader_that_cannot_be_recovered_says_unplug_and_replug():
    b = bootloader()
    for _ in range(1 + C.DFU_RECOVERY_RESETS):          # every GETSTATUS stalls
        b.inject("stall", after=0)
    start = time.monotonic()
    with pytest.raises(FirmwareError, match="unplug and replug the stick") as info:
        _open(b)
    assert time.monotonic() - start < BOUND
    assert "dfuIDLE" in str(info.value)
    assert [e["op"] for e in b.transcript].count("reset") == C.DFU_RECOVERY_RESETS
    assert not b.devices[0].faults
    _open_then_reopen(b)                                # the stick itself was fine


def test_download_attempts_are_bounded_and_the_last_error_says_what_to_do(monkeypatch):
    b = bootloader()
    machine = b.devices[0].dfu
    upload = machine._upload

    def corrupt(block, length, data):                  # the image never reads back right
        return bytes(x ^ 0xFF for x in upload(block, length, data))

    monkeypatch.setattr(machine, "_upload", corrupt)
    with pytest.raises(FirmwareError) as info:
        _open(b)
    text = str(info.value)
    assert f"failed {C.DFU_ATTEMPTS} times" in text and "verification failed" in text
    assert "unplug and replug the stick" in text
    dn0 = [e for e in b.transcript if e["op"] == "dfu_dnload" and e["block"] == 0]
    assert len(dn0) == C.DFU_ATTEMPTS
