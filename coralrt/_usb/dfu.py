"""USB DFU 1.1 firmware download to a stick in bootloader mode (1a6e:089a).

The sequence is libedgetpu's (``usb_dfu_commands.cc``, ``usb_dfu_util.cc``):
DNLOAD each 256-byte block and check GETSTATUS (status OK, state
dfuDNLOAD-IDLE; while the device says dfuDNBUSY, wait the poll timeout it
gives and ask again), a zero-length DNLOAD to end, GETSTATUS until dfuIDLE,
UPLOAD the image back and compare it, then reset the port and wait, within a
bounded time, for the stick to come back as 18d1:9302 on the same port.

A download interrupted by a transient fault (a stalled or timed-out request)
can leave the bootloader outside dfuIDLE, typically in dfuERROR: DFU 1.1 puts
a device that stalled a request there, and there it refuses every DNLOAD until
the host clears it.  So before each download :func:`recover` reads the state
with GETSTATUS and brings the bootloader back to dfuIDLE the way DFU 1.1 says
(dfuERROR: CLRSTATUS; dfuDNLOAD-IDLE, dfuDNLOAD-SYNC, dfuUPLOAD-IDLE,
dfuMANIFEST-SYNC: ABORT; dfuDNBUSY, dfuMANIFEST: wait the poll timeout; any
other state, or a request that fails: a port reset, then read again), and
:func:`update` tries the download up to ``C.DFU_ATTEMPTS`` times.  What cannot
be recovered that way raises :class:`~coralrt.errors.FirmwareError` saying to
unplug and replug the stick.
"""

from __future__ import annotations

import logging
import time

import usb.core
import usb.util

from coralrt.errors import (
    DeviceError, DeviceLostError, DeviceNotFoundError, DevicePermissionError,
    DeviceTimeoutError, FirmwareError,
)
from coralrt._usb import constants as C
from coralrt._usb.discovery import DeviceInfo, find_at_port
from coralrt._usb.transport import Transport, translate_error

__all__ = ["download", "upload", "get_status", "recover", "reset_device", "wait_for_app",
           "update"]

log = logging.getLogger("coralrt.usb")

_MAX_POLL_SLEEP = 1.0   # seconds: never trust a huge bwPollTimeout blindly
_REPLUG = "unplug and replug the stick, then open it again"
# States an ABORT returns to dfuIDLE.  The two sync states are there for a device that
# reports them: the GETSTATUS read itself normally moves a device on from them.
_ABORTABLE = (C.DFU_STATE_DNLOAD_IDLE, C.DFU_STATE_DNLOAD_SYNC, C.DFU_STATE_UPLOAD_IDLE,
              C.DFU_STATE_MANIFEST_SYNC)
_BUSY = (C.DFU_STATE_DNBUSY, C.DFU_STATE_MANIFEST)


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
            name = _status_name(status)
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


def _reattach(backend, info: DeviceInfo, timeout: float):
    """(device, mode) of the stick back on ``info``'s port after a reset, polled for at
    most ``timeout`` seconds: "bootloader" (1a6e:089a) or "running" (18d1:9302)."""
    start = time.monotonic()
    delay = 0.01
    while True:
        for ids, mode in ((C.BOOTLOADER_ID, "bootloader"), (C.APP_ID, "running")):
            dev = find_at_port(backend, info, ids)
            if dev is not None:
                return dev, mode
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            raise DeviceTimeoutError(
                f"{info.path}: after a port reset the stick did not come back on its port "
                f"within {timeout:g} s; {_REPLUG}", path=info.path, timeout=timeout)
        time.sleep(min(delay, max(0.0, timeout - elapsed)))
        delay = min(delay * 2, 0.1)


def recover(dev, backend, info: DeviceInfo, *, timeout: float,
            reenumeration_timeout: float = C.REENUMERATION_TIMEOUT):
    """Bring the bootloader at ``info``'s port back to dfuIDLE; (device, mode).

    Reads the state with GETSTATUS and acts as DFU 1.1 says: dfuERROR ->
    CLRSTATUS; dfuDNLOAD-IDLE, dfuDNLOAD-SYNC, dfuUPLOAD-IDLE, dfuMANIFEST-SYNC ->
    ABORT; dfuDNBUSY, dfuMANIFEST -> wait the poll timeout it asks for (at most
    ``timeout`` seconds in all); any other state (dfuMANIFEST-WAIT-RESET, an
    application state), or a request that stalls or times out -> a port reset
    (``C.DFU_RECOVERY_RESETS`` at most); then it reads again, ``C.DFU_RECOVERY_READS``
    times at most.  Mode is "bootloader" in dfuIDLE, or "running" when a reset
    started an image the bootloader had already manifested (the device returned
    is then the running one).  Raises FirmwareError (unplug and replug) when the
    bootloader does not come back to dfuIDLE, DeviceLostError when the stick left
    the bus; the device it holds then is released.
    """
    resets = 0
    why = "no answer"
    busy_until = time.monotonic() + timeout
    try:
        for _ in range(C.DFU_RECOVERY_READS):
            t = Transport(dev, timeout=timeout, path=info.path)
            try:
                status, poll_ms, state = get_status(t)
                if state == C.DFU_STATE_IDLE:
                    return dev, "bootloader"
                name = _state_name(state)
                if state == C.DFU_STATE_ERROR:
                    log.info("%s: the bootloader is in dfuERROR (%s); clearing it", info.path,
                             _status_name(status))
                    t.ctrl_out(C.DFU_OUT, C.DFU_CLRSTATUS, 0, C.ML_INTERFACE, b"",
                               "DFU CLRSTATUS")
                    continue
                if state in _ABORTABLE:
                    log.info("%s: the bootloader is in %s (an unfinished transfer); "
                             "aborting it", info.path, name)
                    t.ctrl_out(C.DFU_OUT, C.DFU_ABORT, 0, C.ML_INTERFACE, b"", "DFU ABORT")
                    continue
                remaining = busy_until - time.monotonic()
                if state in _BUSY and remaining > 0:
                    time.sleep(min(poll_ms / 1000.0, _MAX_POLL_SLEEP, remaining))
                    continue
                why = f"the bootloader is in {name}"
            except (DevicePermissionError, DeviceNotFoundError, DeviceLostError):
                raise
            except DeviceError as e:    # the request itself stalled, timed out, ...
                why = _what_failed(e)
            if resets >= C.DFU_RECOVERY_RESETS:
                break
            resets += 1
            log.info("%s: resetting the port to recover the bootloader (%s)", info.path, why)
            try:
                reset_device(dev, path=info.path)
                dev, mode = _reattach(backend, info, reenumeration_timeout)
            except DeviceError as e:
                raise FirmwareError(f"{info.path}: could not reset the stick's bootloader to "
                                    f"recover it ({_what_failed(e)}); {_REPLUG}",
                                    errno=e.errno, path=info.path) from e
            if mode == "running":
                log.info("%s: after the reset the stick runs the firmware it had received",
                         info.path)
                return dev, mode
        raise FirmwareError(f"{info.path}: the stick's bootloader did not return to dfuIDLE "
                            f"after {resets} port reset(s) ({why}); {_REPLUG}", path=info.path)
    except BaseException:
        _dispose(dev)               # the one held now (a reset may have replaced it)
        raise


def _dispose(dev) -> None:
    try:
        usb.util.dispose_resources(dev)     # releases what it claimed, closes the handle
    except Exception as e:  # noqa: BLE001 - the device may be gone already
        log.debug("dispose: %s", e)


def _what_failed(e: DeviceError) -> str:
    """``e``'s message without its advice (coralrt's device errors give it after the
    first "; "), for a message that gives its own."""
    return str(e).split("; ", 1)[0]


def _status_name(status: int) -> str:
    return C.DFU_STATUS_NAMES[status] if status < len(C.DFU_STATUS_NAMES) else f"status {status}"


def update(dev, backend, info: DeviceInfo, image: bytes, *, timeout: float,
           reenumeration_timeout: float = C.REENUMERATION_TIMEOUT,
           attempts: int = C.DFU_ATTEMPTS):
    """Download ``image``, verify it, reset, and return the running (18d1:9302) device.

    Each attempt first brings the bootloader back to dfuIDLE (:func:`recover`);
    a download that fails on a transient fault (a stalled or timed-out request,
    an error status, a verification mismatch) is tried again, ``attempts`` times
    in all.  A stick that leaves the bus or refuses access fails at once.
    """
    last: DeviceError | None = None
    try:
        for attempt in range(1, max(1, attempts) + 1):
            dev, mode = recover(dev, backend, info, timeout=timeout,
                                reenumeration_timeout=reenumeration_timeout)
            if mode == "running":
                return dev
            t = Transport(dev, timeout=timeout, path=info.path)
            try:
                download(t, image)
                back = upload(t, len(image))
                if back[:len(image)] != image:
                    raise FirmwareError(f"{info.path}: firmware verification failed: the image "
                                        f"read back ({len(back)} bytes) differs from the one "
                                        f"downloaded", path=info.path)
                break
            except (DevicePermissionError, DeviceLostError, DeviceNotFoundError):
                raise
            except DeviceError as e:
                last = e
                log.warning("%s: firmware download attempt %d of %d failed (%s)%s", info.path,
                            attempt, attempts, e, "; trying again" if attempt < attempts else "")
        else:
            raise FirmwareError(f"{info.path}: the firmware download failed {attempt} times "
                                f"(last: {_what_failed(last)}); {_REPLUG}", errno=last.errno,
                                path=info.path) from last
    except BaseException:
        _dispose(dev)       # release the bootloader: the next open must be able to claim it
        raise
    reset_device(dev, path=info.path)       # disposes it too
    return wait_for_app(backend, info, reenumeration_timeout)
