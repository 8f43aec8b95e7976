"""USB DFU 1.1 firmware download to a stick in bootloader mode (1a6e:089a).

The sequence is libedgetpu's (``usb_dfu_commands.cc``, ``usb_dfu_util.cc``):
DNLOAD each 256-byte block and check GETSTATUS (status OK, state
dfuDNLOAD-IDLE; while the device says dfuDNBUSY, wait the poll timeout it
gives and ask again), a zero-length DNLOAD to end, GETSTATUS until dfuIDLE,
UPLOAD the image back and compare it, then reset the port and wait, within a
bounded time, for the stick to come back as 18d1:9302 on the same port.
"""

from __future__ import annotations

import logging
import time

import usb.core
import usb.util

from coralrt.errors import DeviceError, DeviceTimeoutError, FirmwareError
from coralrt.usb import constants as C
from coralrt.usb.discovery import DeviceInfo, find_at_port
from coralrt.usb.transport import Transport, translate_error

__all__ = ["download", "upload", "get_status", "reset_device", "wait_for_app", "update"]

log = logging.getLogger("coralrt.usb")

_MAX_POLL_SLEEP = 1.0   # seconds: never trust a huge bwPollTimeout blindly


def get_status(t: Transport) -> tuple[int, int, int]:
    """(bStatus, bwPollTimeout in ms, bState) from DFU_GETSTATUS."""
    data = t.ctrl_in(C.DFU_IN, C.DFU_GETSTATUS, 0, C.ML_INTERFACE, C.DFU_STATUS.size,
                     "DFU GETSTATUS")
    if len(data) != C.DFU_STATUS.size:
        raise FirmwareError(f"DFU GETSTATUS returned {len(data)} bytes, not "
                            f"{C.DFU_STATUS.size}", path=t.path)
    status, poll_ms, state, _ = C.DFU_STATUS.unpack(bytes(data))
    return status, int.from_bytes(poll_ms, "little"), state


def _state_name(state: int) -> str:
    return C.DFU_STATES[state] if state < len(C.DFU_STATES) else f"state {state}"


def _wait_state(t: Transport, wanted: tuple[int, ...], what: str) -> int:
    """Poll GETSTATUS until the state is one of ``wanted``; bounded by the timeout."""
    deadline = time.monotonic() + t.timeout
    while True:
        status, poll_ms, state = get_status(t)
        if status != 0:
            name = C.DFU_STATUS_NAMES[status] if status < 16 else f"status {status}"
            try:
                t.ctrl_out(C.DFU_OUT, C.DFU_CLRSTATUS, 0, C.ML_INTERFACE, b"", "DFU CLRSTATUS")
            except DeviceError:
                pass
            raise FirmwareError(f"firmware download failed during {what}: the bootloader "
                                f"reports {name} in {_state_name(state)}", path=t.path)
        if state in wanted:
            return state
        if state not in (C.DFU_STATE_DNLOAD_SYNC, C.DFU_STATE_DNBUSY,
                         C.DFU_STATE_MANIFEST_SYNC, C.DFU_STATE_MANIFEST):
            raise FirmwareError(f"firmware download failed during {what}: the bootloader is "
                                f"in {_state_name(state)}, expected "
                                f"{' or '.join(_state_name(s) for s in wanted)}", path=t.path)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeviceTimeoutError(f"firmware download: the bootloader stayed busy "
                                     f"({_state_name(state)}) for more than {t.timeout:g} s "
                                     f"during {what}", path=t.path, timeout=t.timeout)
        time.sleep(min(poll_ms / 1000.0, _MAX_POLL_SLEEP, remaining))


def download(t: Transport, image: bytes, *, block_size: int = C.DFU_BLOCK_SIZE) -> int:
    """DNLOAD ``image`` block by block, then the zero-length end; the number of blocks."""
    if not image:
        raise FirmwareError("the firmware image is empty", path=t.path)
    block = 0
    for start in range(0, len(image), block_size):
        t.ctrl_out(C.DFU_OUT, C.DFU_DNLOAD, block & 0xFFFF, C.ML_INTERFACE,
                   image[start:start + block_size], f"DFU DNLOAD block {block}")
        _wait_state(t, (C.DFU_STATE_DNLOAD_IDLE,), f"block {block}")
        block += 1
    t.ctrl_out(C.DFU_OUT, C.DFU_DNLOAD, block & 0xFFFF, C.ML_INTERFACE, b"",
               "DFU DNLOAD (zero-length end)")
    _wait_state(t, (C.DFU_STATE_IDLE, C.DFU_STATE_MANIFEST_WAIT_RESET), "the end of the download")
    log.debug("%s: firmware downloaded (%d bytes, %d blocks)", t.path, len(image), block)
    return block


def upload(t: Transport, size: int, *, block_size: int = C.DFU_BLOCK_SIZE) -> bytes:
    """UPLOAD blocks until a short one (at most ``size`` + one block)."""
    out = bytearray()
    block = 0
    while len(out) <= size:
        data = t.ctrl_in(C.DFU_IN, C.DFU_UPLOAD, block & 0xFFFF, C.ML_INTERFACE, block_size,
                         f"DFU UPLOAD block {block}")
        out += data
        block += 1
        if len(data) < block_size:
            break
    return bytes(out)


def reset_device(dev, *, path: str | None = None) -> None:
    """Port reset; the device leaving the bus during it is expected."""
    try:
        dev.reset()
    except (usb.core.USBError, OSError) as e:
        err = translate_error(e, "resetting the stick", path=path)
        if err.errno not in (None, 2, 19, 6):   # ENOENT, ENODEV, ENXIO: it re-enumerates
            raise err from e
        log.debug("%s: reset: %s (expected while the stick re-enumerates)", path, e)
    finally:
        try:
            usb.util.dispose_resources(dev)
        except Exception:  # noqa: BLE001 - the device may be gone already
            pass


def wait_for_app(backend, info: DeviceInfo, timeout: float):
    """The 18d1:9302 device at ``info``'s port, polled until ``timeout`` seconds pass."""
    start = time.monotonic()
    delay = 0.01
    while True:
        dev = find_at_port(backend, info, C.APP_ID)
        elapsed = time.monotonic() - start
        if dev is not None:
            log.debug("%s: running firmware found after %.2f s", info.path, elapsed)
            return dev
        if elapsed >= timeout:
            raise DeviceTimeoutError(
                f"{info.path}: after the firmware download the stick did not come back as "
                f"18d1:9302 within {timeout:g} s (waited {elapsed:.2f} s); unplug and replug "
                f"it and try again", path=info.path, timeout=timeout)
        time.sleep(min(delay, max(0.0, timeout - elapsed)))
        delay = min(delay * 2, 0.1)


def update(dev, backend, info: DeviceInfo, image: bytes, *, timeout: float,
           reenumeration_timeout: float = C.REENUMERATION_TIMEOUT):
    """Download ``image``, verify it, reset, and return the running (18d1:9302) device."""
    t = Transport(dev, timeout=timeout, path=info.path)
    download(t, image)
    back = upload(t, len(image))
    if back[:len(image)] != image:
        raise FirmwareError(f"{info.path}: firmware verification failed: the image read back "
                            f"({len(back)} bytes) differs from the one downloaded", path=info.path)
    reset_device(dev, path=info.path)
    return wait_for_app(backend, info, reenumeration_timeout)
