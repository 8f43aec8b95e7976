"""One simulated Coral USB Accelerator: modes, control requests, endpoints, faults.

A stick starts in bootloader mode (1a6e:089a) or, with firmware already
loaded, in running mode (18d1:9302).  Control transfers reach the DFU state
machine (bootloader) or the register file (running, vendor requests of the
reference §1.5) through :mod:`coralrt._sim.stick.control`; bulk transfers reach
the :class:`~coralrt._sim.stick.bulk.BulkEngine`.
A USB reset after a successful download re-enumerates the stick in running
mode at a new address (after a delay with the "slow_reenumeration" fault);
handles opened before then fail with ENODEV, as libusb's do.  A USB reset in
bootloader mode before any image was manifested restarts the bootloader in
dfuIDLE, whatever state it was in (dfuERROR included): libedgetpu resets the
port and then sends DNLOAD without clearing anything (reference §1.3), which
works only if the Coral bootloader comes back idle.  A DFU class request the
bootloader stalls (an injected "stall" included) leaves it in dfuERROR with
errSTALLEDPKT, as DFU 1.1 says of every stalled request; it stays there until
CLRSTATUS or a reset.

The chip accepts bulk-out data only once the bring-up has set
``scalarCoreRunControl`` (0x44018) to 1 (run); before that, or after a halt,
bulk writes time out like a stick that NAKs.  The registers are a model of
the chip (:mod:`coralrt._sim.stick.chip`): a port reset brings them back to
their reset values, and both a port reset and the chip going to sleep (the
GCB reset) forget loaded segments.  Every waiting call honours the caller's timeout, capped at the
backend's ``max_wait`` so tests stay fast.

"not_ready" opens a window, after the next time the stick comes up in
running mode, in which every control and bulk transfer fails (the stick is
enumerated but not ready); "wedge" makes every transfer time out, resets
included, until a replug.  See :mod:`coralrt._sim.stick.backend` for the public
reports they follow.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import deque

from coralrt._sim.stick import descriptors as desc
from coralrt._usb.constants import (
    EP_EVENT, EP_INTERRUPT, EP_OUT, EP_OUTPUT, EVENT_SIZE, FATAL_ERR_INT_CONTROL,
    FATAL_ERR_INT_STATUS,
    FATAL_INTERRUPT_BIT, HIB_ERROR_STATUS, HIB_FIRST_ERROR_STATUS, INTERRUPT_SIZE,
    RUN_CONTROL_RUN, SCALAR_CORE_RUN_CONTROL, TAG_OUTPUT,
)
from coralrt._sim.stick import faults
from coralrt._sim.stick.bulk import BulkEngine
from coralrt._sim.stick.control import answer_control
from coralrt._sim.stick.dfu import DfuMachine
from coralrt._sim.stick.chip import ChipRegisters
from coralrt._sim.stick.usb_errors import usb_error

__all__ = ["SimulatedStick", "usb_error"]

log = logging.getLogger("coralrt.usb")


class _Cond(threading.Condition):
    """A Condition whose ``with`` takes and drops its lock in C.

    ``threading.Condition.__enter__`` is Python code: a KeyboardInterrupt can
    land in it just after the lock was taken, and the ``with`` block, never
    entered, never releases it; every other thread using the stick would then
    hang.  Looked up through these properties, the lock's own C methods run.
    """

    __enter__ = property(lambda self: self._lock.__enter__)
    __exit__ = property(lambda self: self._lock.__exit__)


class SimulatedStick:
    def __init__(self, backend, index: int, *, firmware_loaded: bool, usb_speed: str,
                 latency=None, kernels=None, time_scale=1.0,
                 timing_only: bool = False):
        self.backend = backend
        self.index = index
        self.usb_speed = usb_speed
        self.bus = 2 if usb_speed == "usb3" else 1
        self.ports = (index + 1,)
        self.cond = _Cond(threading.RLock())
        self.registers = ChipRegisters(on_gcb_reset=self._gcb_reset)
        self.engine = BulkEngine(self._record, self._raise_fatal, latency=latency,
                                 kernels=kernels, time_scale=time_scale,
                                 test_switches=backend._test_switches,
                                 timing_only=timing_only)
        self.interrupts: deque[bytes] = deque()
        self.faults: list = []           # pending Fault objects, see sim.FaultPlan
        self.transfers = 0
        self.claimed_by = None
        self.configuration = 1
        self.initial_mode = "running" if firmware_loaded else "bootloader"
        self.generation = 0
        self.present = True
        self.appear_at = 0.0
        self.not_ready_until = 0.0       # "not_ready": transfers fail until then
        self.not_ready_error = "io"
        self.wedged = False              # "wedge": nothing answers until a replug
        self.firmware_sha256: str | None = None   # of the image running (after DFU)
        self._power_on(self.initial_mode)

    # -- identity ------------------------------------------------------------------------

    def _power_on(self, mode: str) -> None:
        self.mode = mode
        self.generation += 1
        self.address = self.backend._next_address()
        self.dfu = DfuMachine(busy_polls=self.backend.dfu_busy_polls)
        self._soft_reset()
        self.detach_pending = False
        self.claimed_by = None
        self.configuration = 1

    def _soft_reset(self) -> None:
        self.registers.power_on()
        self.engine.reset()
        self.interrupts.clear()
        self.dfu.usb_reset()

    @property
    def visible(self) -> bool:
        return self.present and time.monotonic() >= self.appear_at

    def descriptor(self):
        return desc.device_descriptor(self.mode, self.usb_speed, bus=self.bus,
                                      address=self.address, ports=self.ports)

    def config(self):
        return desc.configuration(self.mode, self.usb_speed)

    def _record(self, op: str, **fields) -> dict:
        return self.backend._record(self.index, op, **fields)

    # -- helpers -------------------------------------------------------------------------

    def check(self, generation: int) -> None:
        if not self.present or generation != self.generation:
            raise usb_error(errno.ENODEV, f"stick {self.index} is gone or re-enumerated")

    def _wait(self, seconds: float, ready, generation: int):
        """Wait (lock released) until ``ready()`` is not None or ``seconds`` pass."""
        end = time.monotonic() + seconds
        while True:
            self.check(generation)
            value = ready()
            if value is not None:
                return value
            now = time.monotonic()
            if now >= end:
                return None
            # Data delayed by the latency model becomes ready without a notify.
            pending = self.engine.ready_at - now
            try:
                self.cond.wait(min(end - now, pending + 0.0005) if pending > 0 else end - now)
            except BaseException:
                # A signal (Ctrl-C) can land inside Condition.wait after it let the
                # lock go and before it took it back; take it back, or the caller's
                # `with self.cond` fails to release it (RuntimeError).
                if not self.cond._is_owned():
                    self.cond.acquire()
                raise

    def _cap(self, timeout_ms) -> float:
        limit = self.backend.max_wait
        return limit if not timeout_ms else min(timeout_ms / 1000.0, limit)

    def _timeout(self, timeout_ms, generation: int, why: str):
        self._wait(self._cap(timeout_ms), lambda: None, generation)
        self._record("timeout", detail=why)
        return usb_error(errno.ETIMEDOUT, why)

    def _raise_fatal(self, reason: str) -> None:
        log.warning("simulated stick %d: fatal error: %s", self.index, reason)
        self.engine.fatal = reason
        self.registers.set_by_chip(FATAL_ERR_INT_STATUS, 1)
        self.registers.set_by_chip(HIB_ERROR_STATUS, 1)
        self.registers.set_by_chip(HIB_FIRST_ERROR_STATUS, 1)
        # The interrupt word goes out on EP 0x83 only while the host has enabled it
        # (fatal_err_int_control, written by the bring-up); the status stays readable.
        enabled = self.registers.interrupts_enabled(FATAL_ERR_INT_CONTROL)
        if enabled:
            self.interrupts.append(FATAL_INTERRUPT_BIT.to_bytes(INTERRUPT_SIZE, "little"))
        self._record("fatal", value=FATAL_INTERRUPT_BIT, detail=reason, interrupt=enabled)
        self.cond.notify_all()

    def _gcb_reset(self) -> None:
        """The chip went to sleep: the GCB, and whatever it held, is reset."""
        self.engine.reset()
        self._record("gcb_reset")

    def _misbehave(self, timeout_ms, generation: int) -> None:
        faults.misbehave(self, timeout_ms, generation)

    def _start_not_ready(self) -> None:
        faults.start_not_ready(self)

    def _faults(self, timeout_ms, generation: int, dfu_request: bool = False) -> None:
        faults.fire_due(self, timeout_ms, generation, dfu_request)

    # -- plug, unplug, reset -------------------------------------------------------------

    def disconnect(self) -> None:
        with self.cond:
            self.present = False
            self.generation += 1
            self.claimed_by = None
            self.cond.notify_all()
            self._record("disconnect")

    def replug(self, mode: str | None = None) -> None:
        with self.cond:
            self.present = True
            self.appear_at = 0.0
            self.wedged = False             # a power cycle is what ends a wedge
            self.not_ready_until = 0.0
            self._power_on(mode or self.initial_mode)
            self._record("replug", mode=self.mode, address=self.address)
            self._start_not_ready()
            self.cond.notify_all()

    def usb_reset(self, handle) -> None:
        with self.cond:
            self.check(handle.generation)
            if self.mode == "bootloader" and self.dfu.firmware is not None:
                self.firmware_sha256 = self.dfu.firmware_sha256
                self._reenumerate("running")
                slow = [f for f in self.faults if f.kind == "slow_reenumeration"]
                if slow:
                    self.faults.remove(slow[0])
                    self.appear_at = time.monotonic() + slow[0].seconds
            elif self.mode == "running" and self.detach_pending:
                self._reenumerate("bootloader")
            else:
                self._soft_reset()
                self._record("reset", mode=self.mode)
            # A wedged stick stays wedged: a port reset is software, and public
            # reports say only a replug (power cycle) brings it back.
            self.not_ready_until = 0.0
            self._start_not_ready()
            self.cond.notify_all()

    def _reenumerate(self, mode: str) -> None:
        old = self.address
        self._power_on(mode)
        self._record("reenumerate", mode=mode, address=self.address, old_address=old)

    # -- control transfers ---------------------------------------------------------------

    def control(self, handle, rtype: int, request: int, value: int, index: int, buff,
                timeout_ms) -> int:
        with self.cond:
            self.check(handle.generation)
            kind = (rtype >> 5) & 3
            self._faults(timeout_ms, handle.generation,
                         dfu_request=kind == 1 and self.mode == "bootloader")
            data_in = bool(rtype & 0x80)
            mv = memoryview(buff).cast("B")
            reply = answer_control(self, rtype, request, value, index, mv)
            if not data_in:
                return len(mv)
            n = min(len(reply), len(mv))
            mv[:n] = reply[:n]
            return n

    # -- bulk and interrupt --------------------------------------------------------------

    def _check_bulk(self, handle) -> None:
        self.check(handle.generation)
        if self.mode != "running":
            raise usb_error(errno.EPIPE, "bulk transfer in bootloader mode")
        if self.claimed_by is not handle:
            raise usb_error(errno.ENOENT, "interface 0 is not claimed by this handle")

    def bulk_write(self, handle, ep: int, data, timeout_ms) -> int:
        with self.cond:
            self._check_bulk(handle)
            self._faults(timeout_ms, handle.generation)
            if ep != EP_OUT:
                raise usb_error(errno.EPIPE, f"OUT endpoint {ep:#x}: only single-endpoint "
                                             f"mode (EP 0x01) is simulated")
            running = self.registers.peek(SCALAR_CORE_RUN_CONTROL) == RUN_CONTROL_RUN
            if self.engine.fatal is not None or not running:
                why = ("after a fatal error" if running else
                       "the scalar core is not running (bring-up not done or halted)")
                raise self._timeout(timeout_ms, handle.generation, f"bulk out refused: {why}")
            mv = memoryview(data).cast("B")
            self.engine.write(mv)
            self.cond.notify_all()
            return len(mv)

    def bulk_read(self, handle, ep: int, buff, timeout_ms) -> int:
        with self.cond:
            self._check_bulk(handle)
            self._faults(timeout_ms, handle.generation)
            mv = memoryview(buff).cast("B")
            if ep == EP_OUTPUT:
                got = self._wait(self._cap(timeout_ms),
                                 lambda: self.engine.read_output(len(mv)), handle.generation)
                tag, what = TAG_OUTPUT, "output"
            elif ep == EP_EVENT:
                if len(mv) < EVENT_SIZE:
                    raise usb_error(errno.EOVERFLOW, f"event read of {len(mv)} bytes < 16")
                got = self._wait(self._cap(timeout_ms), self.engine.read_event,
                                 handle.generation)
                tag, what = (got[12] if got else None), "event"
            else:
                raise usb_error(errno.EPIPE, f"bulk IN endpoint {ep:#x}")
            if got is None:
                self._record("bulk_in", ep=ep, length=0, error="timeout")
                raise usb_error(errno.ETIMEDOUT, f"no {what} data on {ep:#x}")
            mv[:len(got)] = got
            self._record("bulk_in", ep=ep, tag=tag, length=len(got))
            return len(got)

    def intr_read(self, handle, ep: int, buff, timeout_ms) -> int:
        with self.cond:
            self._check_bulk(handle)
            mv = memoryview(buff).cast("B")
            if ep != EP_INTERRUPT:
                raise usb_error(errno.EPIPE, f"interrupt endpoint {ep:#x}")
            if self.wedged:
                raise self._timeout(timeout_ms, handle.generation,
                                    "the stick is wedged (replug it)")
            if len(mv) < INTERRUPT_SIZE:
                raise usb_error(errno.EOVERFLOW, f"interrupt read of {len(mv)} bytes < 4")
            got = self._wait(self._cap(timeout_ms),
                             lambda: self.interrupts.popleft() if self.interrupts else None,
                             handle.generation)
            if got is None:
                raise usb_error(errno.ETIMEDOUT, "no interrupt pending")
            mv[:len(got)] = got
            self._record("intr_in", ep=ep, value=int.from_bytes(got, "little"),
                         length=len(got))
            return len(got)

    def wait_for_in_data(self, handle, ep: int, length: int, seconds: float) -> bool:
        """Wait up to ``seconds`` (not capped by ``max_wait``) until a read of ``length``
        bytes from IN endpoint ``ep`` through ``handle`` would answer at once, recording
        nothing and counting no transfer.

        True when it would: data is ready, an injected fault is due, or the read
        fails at once (the handle is gone, bootloader mode, interface not claimed,
        the "not_ready" window ...).  False when ``seconds`` passed first; a wedged
        stick's reads time out, so it never answers True.  For hosts that keep IN
        transfers queued longer than a simulated timeout lasts (the libusb shim's
        server in tests/usbshim waits here, then makes the one real read).  It
        mirrors the checks of ``bulk_read``/``intr_read``; whether data is there, the
        engine says (``output_ready``/``event_ready``).
        """
        def answers():
            if self.mode != "running" or self.claimed_by is not handle:
                return True
            if self.wedged:
                return None
            if ep == EP_INTERRUPT:
                return True if length < INTERRUPT_SIZE or self.interrupts else None
            if ep not in (EP_OUTPUT, EP_EVENT) or (ep == EP_EVENT and length < EVENT_SIZE):
                return True
            if self.not_ready_until and time.monotonic() < self.not_ready_until:
                return True
            if faults.due_now(self):
                return True
            ready = self.engine.event_ready() if ep == EP_EVENT else self.engine.output_ready()
            return True if ready else None

        with self.cond:
            try:
                return self._wait(seconds, answers, handle.generation) is not None
            except OSError:     # gone or re-enumerated (USBError): the read fails at once
                return True
