"""Chip bring-up over register control transfers, and the halt on close.

:data:`OPEN_SEQUENCE` is the register sequence libedgetpu runs when it opens
a stick whose firmware is running, as recorded in
``libedgetpu-open-trace.tsv`` (a libusb trace published with
geohot/edgetpuxray): the same registers are written with the same values in
the same order (the outfeed chunk length is the USB 2 value on a USB 2 link,
as libedgetpu does).  Reads are made where the trace makes them:

* plain reads: the value is logged (and decoded where the reference says what
  it means: the e-fuse revision in ``omc0_00``, the GCB clock gating in
  ``scu_ctrl_2``); the write after a read uses the recorded value, as the
  replays of XRAY and LibrEdgeTPU do;
* polls: the register is read until the masked bits hold the expected value,
  bounded by the transfer timeout.  The trace reads ``scu_ctrl_3`` twice,
  0 then 1, before the power-state write, so the driver polls it until bit 0
  is set.  The reference does not document that bit; the poll reproduces the
  recorded exchange and fails with a timeout on a stick that never sets it.

Close halts the run controls (libedgetpu's ``RunControl(kMoveToHalt)``) and
puts the chip back in reset (``EnableReset``) before the port reset.

After the sequence, :func:`pending_fatal` reads ``fatal_err_int_status``: a
fatal error raised while the chip was brought up would otherwise surface only
as the first run's timeout.

An enumerated stick is not necessarily ready to answer (public reports:
libedgetpu sleeps 1 s before every open attempt because it "seems to reduce
chances of transfer errors"; coral-usb-oxidized's *Enumerated-But-Unusable*
state).  With ``ready_timeout``, :func:`bring_up` makes its first read (the
sequence's ``scu_ctrl_0`` read, so a ready stick sees the very same
transfers) through :func:`wait_ready`, which retries it with a short timeout
and a growing pause (10 ms to 100 ms) until it answers, and past
``ready_timeout`` raises :class:`~coralrt.errors.DeviceNotReadyError` saying
to unplug and replug the stick.  A stick that has left the bus, or that the
operating system refuses, fails at once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from coralrt.errors import (
    DeviceBusyError, DeviceError, DeviceLostError, DeviceNotFoundError, DeviceNotReadyError,
    DevicePermissionError, DeviceTimeoutError,
)
from coralrt.usb import constants as C
from coralrt.usb.transport import Transport

__all__ = ["Step", "OPEN_SEQUENCE", "open_sequence", "bring_up", "halt", "poll",
           "read_fatal_status", "pending_fatal", "describe_fatal", "wait_ready", "answers",
           "what_failed", "REPLUG_ADVICE"]

#: The advice of every error about a stick that stopped answering for good.
REPLUG_ADVICE = ("unplug and replug the stick (a port reset does not bring such a stick "
                 "back; public reports say only a power cycle does), then open it again or "
                 "call reset()")

# Errors that retrying cannot fix: the stick left the bus, or access is refused.
_FINAL = (DeviceLostError, DevicePermissionError, DeviceBusyError, DeviceNotFoundError)

log = logging.getLogger("coralrt.usb")


@dataclass(frozen=True)
class Step:
    op: str                 # "read" | "poll" | "write"
    register: int
    value: int = 0          # write: the value; poll: the expected bits
    mask: int = 0           # poll only
    name: str = ""


def _w(reg: int, value: int, name: str = "") -> Step:
    return Step("write", reg, value, 0, name)


def _r(reg: int, name: str) -> Step:
    return Step("read", reg, 0, 0, name)


_OUTFEED = "outfeed_chunk_length"

OPEN_SEQUENCE: tuple[Step, ...] = (
    # Open: clear the inactive PHY modes of scu_ctrl_0, read the GCB clock gating.
    _r(C.SCU_CTRL_0, "scu_ctrl_0"),
    _w(C.SCU_CTRL_0, 0x000F0059, "scu_ctrl_0"),
    _r(C.SCU_CTRL_2, "scu_ctrl_2 (rg_gated_gcb)"),
    Step("poll", C.SCU_CTRL_3, 0x1, 0x1, "scu_ctrl_3 bit 0"),
    # QuitReset: force_sleep 0b10, "High" clocks (GCB 250 MHz, AXI 125 MHz).
    _w(C.SCU_CTRL_3, 0x5085025C, "scu_ctrl_3"),
    _r(C.SCU_CTRL_3, "scu_ctrl_3 (cur_pwr_state)"),
    _r(C.SCALAR_CORE_RUN_CONTROL, "scalarCoreRunControl"),
    _w(C.IDLE_REGISTER, 0x1, "idleRegister"),
    _w(C.TILECONFIG0, 0x7F, "tileconfig0"),
    _r(C.TILECONFIG0, "tileconfig0"),
    _w(C.DEEP_SLEEP, 0x1E02, "deepSleep"),
    # EnableHardwareClockGate.
    _r(C.SCU_CTRL_2, "scu_ctrl_2"),
    _w(C.SCU_CTRL_2, 0x00150000, "scu_ctrl_2"),
    # InitializeChip.
    _r(C.OMC0_00, "omc0_00 (e-fuse revision)"),
    _w(C.DESCR_EP, 0xF0, "descr_ep"),
    _w(C.MULTI_BO_EP, 0x0, "multi_bo_ep"),
    _w(C.OUTFEED_CHUNK_LENGTH_REG, C.OUTFEED_CHUNK_LENGTH["usb3"], _OUTFEED),
    # RunControl(kMoveToRun).
    *(_w(reg, C.RUN_CONTROL_RUN) for reg in C.SCALAR_RUN_CONTROLS),
    _w(C.TILECONFIG0, 0x7F, "tileconfig0"),
    _r(C.TILECONFIG0, "tileconfig0"),
    *(_w(reg, C.RUN_CONTROL_RUN) for reg in C.TILE_RUN_CONTROLS),
    # RegisterAndEnableAllInterrupts.
    _w(C.FATAL_ERR_INT_CONTROL, 0x1, "fatal_err_int_control"),
    *(_w(reg, 0x1) for reg in C.TOP_LEVEL_INT_CONTROLS),
    _r(C.OMC0_D4, "omc0_d4"),
    _w(C.OMC0_D4, 0x80000001, "omc0_d4 (thm_warn_en)"),
    _r(C.RAMBIST_CTRL_1, "rambist_ctrl_1"),
    _w(C.RAMBIST_CTRL_1, 0x7F, "rambist_ctrl_1"),
    _r(C.SCU_CTR_7, "scu_ctr_7"),
    _w(C.SCU_CTR_7, 0x3F, "scu_ctr_7"),
    _w(C.SLV_ABM_EN, 0x1), _w(C.MST_ABM_EN, 0x1),
    _w(C.SLV_ERR_RESP_ISR_MASK, 0x3), _w(C.MST_ERR_RESP_ISR_MASK, 0x3),
    _r(C.OMC0_D8, "omc0_d8"),
    _w(C.OMC0_D8, 0x80000000, "omc0_d8 (sd_en)"),
)


def open_sequence(usb_speed: str = "usb3") -> tuple[Step, ...]:
    """:data:`OPEN_SEQUENCE` with the outfeed chunk length of ``usb_speed``."""
    chunk = C.OUTFEED_CHUNK_LENGTH["usb2" if usb_speed in ("usb2", "usb1") else "usb3"]
    return tuple(Step(s.op, s.register, chunk, 0, s.name) if s.name == _OUTFEED else s
                 for s in OPEN_SEQUENCE)


def poll(t: Transport, register: int, mask: int, expected: int, *,
         timeout: float | None = None, what: str = "") -> int:
    """Read ``register`` until ``value & mask == expected``; DeviceTimeoutError past ``timeout``."""
    limit = t.timeout if timeout is None else timeout
    deadline = time.monotonic() + limit
    delay = 0.0005
    while True:
        value = t.read_register(register)
        if value & mask == expected:
            return value
        if time.monotonic() >= deadline:
            raise DeviceTimeoutError(
                f"{t.path or 'device'}: register {register:#x} ({what or 'poll'}) read "
                f"{value:#x}; bits {mask:#x} did not become {expected:#x} within {limit:g} s",
                path=t.path, timeout=limit)
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def what_failed(e: BaseException) -> str:
    """``e``'s message without its advice (coralrt's device errors give it after the
    first "; ") and without the device name, for a message that gives its own."""
    text = str(e).split("; ", 1)[0]
    head, sep, rest = text.partition(": ")
    return rest if sep and (head.startswith("usb") or head.startswith("/")) else text


def _probe(t: Transport) -> Transport:
    """``t``'s device with a short timeout, for reads that only ask "do you answer?"."""
    return Transport(t.dev, timeout=min(t.timeout, C.READY_PROBE_TIMEOUT), path=t.path)


def wait_ready(t: Transport, register: int, timeout: float) -> int:
    """Read ``register`` until the stick answers; its value.

    Each attempt waits at most ``C.READY_PROBE_TIMEOUT`` (or ``t.timeout`` if
    shorter); between attempts the pause grows from 10 ms to 100 ms.  A stalled,
    failed or timed-out read is tried again until ``timeout`` seconds have
    passed, then :class:`DeviceNotReadyError`; a stick that left the bus or that
    the operating system refuses fails at once.
    """
    probe = _probe(t)
    start = time.monotonic()
    delay = 0.01
    attempts = 0
    while True:
        attempts += 1
        try:
            value = probe.read_register(register)
        except _FINAL:
            raise
        except DeviceError as e:
            last = e
        else:
            if attempts > 1:
                log.info("%s: the stick answered after %d attempts (%.2f s)", t.path,
                         attempts, time.monotonic() - start)
            return value
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            why = what_failed(last)
            raise DeviceNotReadyError(
                f"{t.path or 'device'}: the stick is enumerated as 18d1:9302 but did not "
                f"answer a register read for {elapsed:.2f} s ({attempts} attempts; last: "
                f"{why}): it is not ready, or it has stopped answering; "
                f"{REPLUG_ADVICE}", errno=last.errno, path=t.path, timeout=timeout)
        log.debug("%s: not ready yet (%s); trying again", t.path, last)
        time.sleep(min(delay, max(0.0, timeout - elapsed)))
        delay = min(delay * 2, 0.1)


def answers(t: Transport, register: int = C.SCU_CTRL_0) -> bool:
    """Whether the stick answers one register read within the probe timeout (False only
    when the read times out: a stick that answers anything at all is not wedged)."""
    try:
        _probe(t).read_register(register)
    except DeviceTimeoutError:
        return False
    except DeviceError:
        return True
    return True


def bring_up(t: Transport, *, usb_speed: str = "usb3",
             ready_timeout: float | None = None) -> dict:
    """Run the open sequence; what the reads said (``efuse_revision``, ``gcb_gating``).

    ``ready_timeout``: make the first read through :func:`wait_ready` (None: once,
    like every other transfer)."""
    info: dict = {}
    for i, step in enumerate(open_sequence(usb_speed)):
        if i == 0 and ready_timeout is not None and step.op == "read":
            value = wait_ready(t, step.register, ready_timeout)
            log.debug("%s: %s = %#x", t.path, step.name, value)
        elif step.op == "write":
            t.write_register(step.register, step.value)
        elif step.op == "poll":
            poll(t, step.register, step.mask, step.value, what=step.name)
        else:
            value = t.read_register(step.register)
            log.debug("%s: %s = %#x", t.path, step.name, value)
            if step.register == C.OMC0_00:
                info["efuse_revision"] = (value >> 24) & 0xFF
            elif step.register == C.SCU_CTRL_2 and "gated" in step.name:
                info["gcb_gating"] = (value >> 18) & 0x3
    log.debug("%s: chip brought up (%s)", t.path, info)
    return info


def halt(t: Transport, *, timeout: float = 0.5) -> None:
    """RunControl(kMoveToHalt) then EnableReset; raises DeviceError if the stick does not answer."""
    for reg in C.SCALAR_RUN_CONTROLS + C.TILE_RUN_CONTROLS:
        t.write_register(reg, C.RUN_CONTROL_HALT)
    value = t.read_register(C.SCU_CTRL_3)
    if (value >> 22) & 0x3 != 0x3:
        t.write_register(C.SCU_CTRL_3, value | (0x3 << 22))
        try:
            poll(t, C.SCU_CTRL_3, 0x3 << 8, 0x2 << 8, timeout=timeout, what="cur_pwr_state")
        except DeviceTimeoutError as e:
            log.debug("%s: %s", t.path, e)
        t.write_register(C.GCBB_CREDIT0, 0xF)
        t.write_register(C.GCBB_CREDIT0, 0x0)


def read_fatal_status(t: Transport) -> tuple[int, int] | None:
    """(hib_error_status, hib_first_error_status), or None when the stick does not answer."""
    try:
        return t.read_register(C.HIB_ERROR_STATUS), t.read_register(C.HIB_FIRST_ERROR_STATUS)
    except DeviceError:
        return None


def pending_fatal(t: Transport) -> int | None:
    """``fatal_err_int_status`` (0x4c068) when its fatal bit is set, else None.

    Read once at the end of open: a fatal error raised during bring-up would
    otherwise show only as the first run's timeout.  The register answers at
    once (one control transfer), where a read of the interrupt endpoint would
    wait out its polling period on every open of a healthy stick.
    """
    word = t.read_register(C.FATAL_ERR_INT_STATUS)
    return word if word & C.FATAL_INTERRUPT_BIT else None


def describe_fatal(t: Transport, word: int) -> str:
    """``word`` and the error status registers, for a message."""
    status = read_fatal_status(t)
    detail = (f"hib_error_status {status[0]:#x}, hib_first_error_status {status[1]:#x}"
              if status else "error status unreadable")
    return f"word {word:#x}; {detail}"
