"""Chip bring-up over register control transfers, and the halt on close.

:func:`bring_up` does what libedgetpu HEAD's ``UsbDriver::DoOpen`` does to the
registers, function by function and in the same order (the names below are
libedgetpu's; docs/usb.md, "Bring-up", lists every step and where it differs
from the recorded open trace):

* ``BeagleTopLevelHandler::Open``: clear the inactive PHY modes of scu_ctrl_0,
  read the GCB clock gating of scu_ctrl_2 (and ``DisableHardwareClockGate`` if
  it is on);
* ``EnableReset``: unless the chip already sleeps, set rg_force_sleep 0b11 and
  poll until cur_pwr_state reads 2, then pulse ``gcbb_credit0``;
* ``QuitReset``: rg_force_sleep 0b10 with the clocks of the chosen variant,
  poll until cur_pwr_state reads 0, poll ``scalarCoreRunControl`` until it
  reads its reset value 0, idle register, tile config broadcast polled until
  it reads back, deep-sleep delays;
* ``EnableHardwareClockGate``, ``InitializeChip`` (e-fuse revision, single
  endpoint, outfeed chunk length of the link speed), ``RunControl(kMoveToRun)``
  and ``RegisterAndEnableAllInterrupts``.

Registers that libedgetpu reads and writes back are read and written back here
with the same fields changed, so the values written follow what the stick
answers.  libedgetpu's polls spin without a time limit; these give up after the
transfer timeout with :class:`~coralrt.errors.DeviceTimeoutError`.  The clock
variant is a parameter: "std" (the throttled build's
``PerformanceExpectation_High``, coralrt's default: Coral's own install
instructions start with the standard-frequency runtime, and the maximum one
makes the stick hot) or "max" (the direct build's ``PerformanceExpectation_Max``).

Close (:func:`halt`) does the register side of libedgetpu's ``DoClose``:
disable the interrupts, ``RunControl(kMoveToHalt)``, ``EnableReset``.

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

from coralrt.errors import (
    DeviceBusyError, DeviceError, DeviceLostError, DeviceNotFoundError, DeviceNotReadyError,
    DevicePermissionError, DeviceTimeoutError,
)
from coralrt._usb import constants as C
from coralrt._usb.transport import Transport

__all__ = ["bring_up", "halt", "poll", "enable_reset", "quit_reset", "run_control",
           "enable_interrupts", "disable_interrupts", "read_fatal_status", "pending_fatal",
           "describe_fatal", "wait_ready", "answers", "what_failed", "REPLUG_ADVICE"]

#: The advice of every error about a stick that stopped answering for good.
REPLUG_ADVICE = ("unplug and replug the stick (a port reset does not bring such a stick "
                 "back; public reports say only a power cycle does), then open it again or "
                 "call reset()")

# Errors that retrying cannot fix: the stick left the bus, or access is refused.
_FINAL = (DeviceLostError, DevicePermissionError, DeviceBusyError, DeviceNotFoundError)

log = logging.getLogger("coralrt.usb")


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


def _rmw(t: Transport, register: int, *fields: tuple[tuple[int, int], int]) -> int:
    """Read ``register``, replace ``fields`` ((shift, width), bits), write it back; the
    value read."""
    value = t.read_register(register)
    new = value
    for f, bits in fields:
        new = C.with_field(new, f, bits)
    t.write_register(register, new)
    return value


def _poll_field(t: Transport, register: int, f: tuple[int, int], expected: int,
                what: str, timeout: float | None = None) -> int:
    return poll(t, register, C.field_mask(f), expected << f[0], what=what, timeout=timeout)


def enable_reset(t: Transport, *, timeout: float | None = None) -> None:
    """libedgetpu's ``BeagleTopLevelHandler::EnableReset``: unless rg_force_sleep is
    already 0b11, set it, wait for cur_pwr_state 2 (the GCB is then in reset), and
    pulse ``gcbb_credit0`` to clear the bulk credits."""
    value = t.read_register(C.SCU_CTRL_3)
    if C.field(value, C.SCU3_FORCE_SLEEP) == C.FORCE_SLEEP_ON:
        return
    t.write_register(C.SCU_CTRL_3, C.with_field(value, C.SCU3_FORCE_SLEEP, C.FORCE_SLEEP_ON))
    _poll_field(t, C.SCU_CTRL_3, C.SCU3_CUR_PWR_STATE, C.PWR_STATE_SLEEP,
                "scu_ctrl_3 cur_pwr_state (sleep)", timeout)
    t.write_register(C.GCBB_CREDIT0, 0xF)
    t.write_register(C.GCBB_CREDIT0, 0x0)


def quit_reset(t: Transport, clock: str) -> None:
    """libedgetpu's ``QuitReset``: rg_force_sleep 0b10 with the clocks of ``clock``,
    wait for cur_pwr_state 0, check that the scalar core's run control reads its reset
    value 0, enable the idle register, broadcast the tile config (and wait until it
    reads back) and set the tiles' sleep and wake delays."""
    gcb, axi, i8051 = C.CLOCKS[clock]
    _rmw(t, C.SCU_CTRL_3, (C.SCU3_FORCE_SLEEP, C.FORCE_SLEEP_OFF), (C.SCU3_GCB_CLKDIV, gcb),
         (C.SCU3_AXI_CLK_125M, axi), (C.SCU3_8051_CLK_250M, i8051))
    _poll_field(t, C.SCU_CTRL_3, C.SCU3_CUR_PWR_STATE, C.PWR_STATE_RUN,
                "scu_ctrl_3 cur_pwr_state (run)")
    poll(t, C.SCALAR_CORE_RUN_CONTROL, ~0, 0, what="scalarCoreRunControl after reset")
    t.write_register(C.IDLE_REGISTER, C.IDLE_REGISTER_ENABLE_COUNTER_1)
    _broadcast_tile_config(t)
    t.write_register(C.DEEP_SLEEP, C.DEEP_SLEEP_DELAYS)


def _broadcast_tile_config(t: Transport) -> None:
    t.write_register(C.TILECONFIG0, C.TILE_CONFIG_BROADCAST)
    poll(t, C.TILECONFIG0, ~0, C.TILE_CONFIG_BROADCAST, what="tileconfig0 read-back")


def run_control(t: Transport, state: int) -> None:
    """libedgetpu's ``RunController::DoRunControl``: the scalar core's run controls,
    the tile config broadcast (and its read-back), then the tiles' run controls."""
    for reg in C.SCALAR_RUN_CONTROLS:
        t.write_register(reg, state)
    _broadcast_tile_config(t)
    for reg in C.TILE_RUN_CONTROLS:
        t.write_register(reg, state)


def enable_interrupts(t: Transport) -> None:
    """libedgetpu's ``RegisterAndEnableAllInterrupts``: the fatal-error interrupt, the
    four top-level interrupts, then (``BeagleTopLevelInterruptManager``) thermal
    warning, MBIST, PCIe error and thermal shutdown."""
    t.write_register(C.FATAL_ERR_INT_CONTROL, C.FATAL_ERR_INT_CONTROL_ALL)
    for reg in C.TOP_LEVEL_INT_CONTROLS:
        t.write_register(reg, 0x1)
    _rmw(t, C.OMC0_D4, (C.OMC_THM_WARN_EN, 1))
    _rmw(t, C.RAMBIST_CTRL_1, (C.RAMBIST_INT_STATUS, 0), (C.RAMBIST_INT_MASK, 0))
    _rmw(t, C.SCU_CTR_7, (C.SCU7_PLL_LOCK_FAILURE, 0), (C.SCU7_USB_SEL_FAILURE, 0),
         (C.SCU7_BOOT_FAILURE_MASK, 0))
    t.write_register(C.SLV_ABM_EN, 1)
    t.write_register(C.MST_ABM_EN, 1)
    t.write_register(C.SLV_ERR_RESP_ISR_MASK, 0x3)
    t.write_register(C.MST_ERR_RESP_ISR_MASK, 0x3)
    _rmw(t, C.OMC0_D8, (C.OMC_SD_EN, 1))


def disable_interrupts(t: Transport) -> None:
    """libedgetpu's ``DisableAllInterrupts``: the top-level interrupts (controls, then
    the four sources), then the fatal-error interrupt."""
    for reg in C.TOP_LEVEL_INT_CONTROLS:
        t.write_register(reg, 0x0)
    _rmw(t, C.OMC0_D4, (C.OMC_THM_WARN_EN, 0))
    _rmw(t, C.RAMBIST_CTRL_1, (C.RAMBIST_INT_MASK, 0x7))
    _rmw(t, C.SCU_CTR_7, (C.SCU7_BOOT_FAILURE_MASK, 0x3))
    t.write_register(C.SLV_ABM_EN, 0)
    t.write_register(C.MST_ABM_EN, 0)
    t.write_register(C.SLV_ERR_RESP_ISR_MASK, 0)
    t.write_register(C.MST_ERR_RESP_ISR_MASK, 0)
    _rmw(t, C.OMC0_D8, (C.OMC_SD_EN, 0))
    t.write_register(C.FATAL_ERR_INT_CONTROL, 0x0)


def bring_up(t: Transport, *, usb_speed: str = "usb3", clock: str = C.DEFAULT_CLOCK,
             ready_timeout: float | None = None) -> dict:
    """Bring the chip up as libedgetpu's ``UsbDriver::DoOpen`` does; what the reads
    said (``efuse_revision``, ``gcb_gating``).

    ``clock``: "std" (libedgetpu's throttled build, the default) or "max" (its direct
    build), see ``C.CLOCKS``.  ``ready_timeout``: make the first read through
    :func:`wait_ready` (None: once, like every other transfer)."""
    if clock not in C.CLOCKS:
        raise ValueError(f"clock must be one of {sorted(C.CLOCKS)}, not {clock!r}")
    info: dict = {"clock": clock}
    # BeagleTopLevelHandler::Open: leave the inactive PHY modes, look at the GCB gating.
    if ready_timeout is not None:
        scu0 = wait_ready(t, C.SCU_CTRL_0, ready_timeout)
    else:
        scu0 = t.read_register(C.SCU_CTRL_0)
    t.write_register(C.SCU_CTRL_0, C.with_field(C.with_field(
        scu0, C.SCU0_PCIE_INACT_PHY_MODE, 0), C.SCU0_USB_INACT_PHY_MODE, 0))
    gating = C.field(t.read_register(C.SCU_CTRL_2), C.SCU2_GATED_GCB)
    info["gcb_gating"] = gating
    hardware_gated = gating == C.GATED_GCB_HARDWARE
    if hardware_gated:          # DisableHardwareClockGate
        _rmw(t, C.SCU_CTRL_2, (C.SCU2_GATED_GCB, C.GATED_GCB_NONE))
    # A clean GCB: into reset, and out of it with the chosen clocks.
    enable_reset(t)
    quit_reset(t, clock)
    _rmw(t, C.SCU_CTRL_2, (C.SCU2_GATED_GCB, C.GATED_GCB_HARDWARE))  # EnableHardwareClockGate
    # UsbDriver::InitializeChip.
    info["efuse_revision"] = C.field(t.read_register(C.OMC0_00), C.EFUSE_REVISION)
    t.write_register(C.DESCR_EP, 0xF0)        # only the scalar core's host interrupts
    t.write_register(C.MULTI_BO_EP, 0x0)      # single-endpoint mode
    chunk = C.OUTFEED_CHUNK_LENGTH["usb2" if usb_speed in ("usb2", "usb1") else "usb3"]
    t.write_register(C.OUTFEED_CHUNK_LENGTH_REG, chunk)
    run_control(t, C.RUN_CONTROL_RUN)
    enable_interrupts(t)
    log.debug("%s: chip brought up (%s)", t.path, info)
    return info


def halt(t: Transport, *, timeout: float = 0.5) -> None:
    """The register side of libedgetpu's ``UsbDriver::DoClose``: disable the interrupts,
    ``RunControl(kMoveToHalt)``, then ``EnableReset`` (the chip goes to sleep, the GCB
    into reset).  Raises DeviceError if the stick does not answer."""
    disable_interrupts(t)
    run_control(t, C.RUN_CONTROL_HALT)
    enable_reset(t, timeout=timeout)


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
