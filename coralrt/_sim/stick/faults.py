"""Faults a simulated stick can be made to show, and how it shows them.

Faults (``SimulatedBackend.inject`` or a :class:`FaultPlan`): "timeout" (USBTimeoutError after
the caller's timeout, capped at ``max_wait`` seconds), "stall" (USBError
EPIPE), "disconnect" (USBError ENODEV; the stick no longer enumerates until
``replug``), "fatal" (the fatal-error status bits, and an interrupt word with
bit 0 on EP 0x83 while the host has enabled that interrupt; bulk transfers
time out until a reset) fire on the bulk or control transfer that comes
after ``after`` more such transfers; "slow_reenumeration" delays the
running-mode device by ``seconds`` after the next DFU reset.

Two faults follow what public reports say real sticks do (docs/usb.md,
"Sticks that misbehave"; neither was observed on hardware by this project):

* "not_ready" (``seconds``, ``error``): the next time the stick comes up in
  running mode (the re-enumeration after a firmware download, a port reset
  of a running stick, a replug in running mode) it enumerates as 18d1:9302 at
  once, but for ``seconds`` every control and bulk transfer fails with
  ``error``: "io" (LIBUSB_ERROR_IO, the default), "pipe" (LIBUSB_ERROR_PIPE)
  or "timeout" (LIBUSB_ERROR_TIMEOUT after the caller's timeout, capped).
  Public facts: libedgetpu sleeps 1 s before every open attempt, 25 attempts
  at most, because the sleep "seems to reduce chances of transfer errors"
  (``usb_driver.cc``, CreateRawUsbDeviceWithRetry); RingCanary/
  coral-usb-oxidized names the state *Enumerated-But-Unusable* ("device
  presence (18d1:9302) is not equivalent to runtime readiness")
  (reference users-and-benchmarks.md §1.3-1.4; edgetpu-stack.md §1.10).
  Which libusb error such a stick gives is not in the public reports, so the
  error is a parameter.
* "wedge": fires like "timeout" on the transfer after ``after`` more, and
  from then on every transfer (control, bulk, interrupt) times out, port
  resets included, until ``replug``.  Public facts: "the LED keeps blinking
  and only a replug helps" (edgetpu#70, edgetpu#237); after a poisoned state
  "CSR reads time out ... software writes do not recover it. A physical
  replug (power cycle) brings it back" (OXI §8.1-8.2, LRE "Device recovery",
  in edgetpu-stack.md §1.10); resetting over CSRs did not recover the stick,
  it needed re-enumeration (coral-usb-oxidized, users-and-benchmarks.md §1.4).

A stick checks :func:`misbehave` and :func:`fire_due` on every control and bulk
transfer, with its lock held; :func:`start_not_ready` when it comes up in running mode.
"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass, field

from coralrt._sim.stick.usb_errors import usb_error

__all__ = ["FAULT_KINDS", "NOT_READY_ERRORS", "Fault", "FaultPlan", "misbehave",
           "start_not_ready", "fire_due", "due_now"]

FAULT_KINDS = ("timeout", "stall", "disconnect", "fatal", "slow_reenumeration", "not_ready",
               "wedge")
#: How a stick in the "not_ready" window fails a transfer (see the module docstring).
NOT_READY_ERRORS = ("io", "pipe", "timeout")


@dataclass
class Fault:
    kind: str
    after: int = 0
    device: int = 0
    seconds: float = 0.0
    error: str = "io"        # "not_ready" only: how transfers fail in the window

    def __post_init__(self):
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {FAULT_KINDS}")
        if self.after < 0 or self.seconds < 0:
            raise ValueError("fault 'after' and 'seconds' must be >= 0")
        if self.error not in NOT_READY_ERRORS:
            raise ValueError(f"unknown not_ready error {self.error!r}; one of "
                             f"{NOT_READY_ERRORS}")


@dataclass
class FaultPlan:
    """Faults to inject from the start, e.g. ``FaultPlan().add("stall", after=3)``."""

    faults: list[Fault] = field(default_factory=list)

    def add(self, kind: str, *, after: int = 0, device: int = 0,
            seconds: float = 0.0, error: str = "io") -> FaultPlan:
        self.faults.append(Fault(kind, after, device, seconds, error))
        return self


# Faults that fire on an event (a re-enumeration, coming up), not on a transfer count.
_NOT_COUNTED = ("slow_reenumeration", "not_ready")


def due_now(stick) -> bool:
    """Whether a counted fault fires on the stick's next transfer."""
    return any(f.after == 0 and f.kind not in _NOT_COUNTED for f in stick.faults)


def misbehave(stick, timeout_ms, generation: int) -> None:
    """Fail the transfer if the stick is wedged or not ready yet (before it is
    counted: such a stick does not see the request)."""
    if stick.wedged:
        raise stick._timeout(timeout_ms, generation, "the stick is wedged (replug it)")
    if stick.not_ready_until and time.monotonic() < stick.not_ready_until:
        kind = stick.not_ready_error
        stick._record("not_ready", detail=kind)
        if kind == "timeout":
            raise stick._timeout(timeout_ms, generation, "enumerated but not ready")
        raise usb_error(errno.EPIPE if kind == "pipe" else errno.EIO,
                        "enumerated but not ready")


def start_not_ready(stick) -> None:
    """Open the window of an armed "not_ready" fault: the stick just came up in
    running mode (it counts from when it becomes visible)."""
    if stick.mode != "running":
        return
    armed = [f for f in stick.faults if f.kind == "not_ready"]
    if not armed:
        return
    stick.faults.remove(armed[0])
    start = max(time.monotonic(), stick.appear_at)
    stick.not_ready_until = start + armed[0].seconds
    stick.not_ready_error = armed[0].error
    stick._record("fault", kind="not_ready", seconds=armed[0].seconds,
                  detail=armed[0].error)


def fire_due(stick, timeout_ms, generation: int, dfu_request: bool = False) -> None:
    """Count a bulk/control transfer and fire the injected fault that is due
    (``dfu_request``: a DFU class request to the bootloader, which a stall
    leaves in dfuERROR)."""
    misbehave(stick, timeout_ms, generation)
    due = None
    for f in stick.faults:
        if f.kind in _NOT_COUNTED:
            continue
        if f.after == 0 and due is None:
            due = f
        elif f.after > 0:
            f.after -= 1
    stick.transfers += 1
    if due is None:
        return
    stick.faults.remove(due)
    stick._record("fault", kind=due.kind)
    if due.kind == "timeout":
        raise stick._timeout(timeout_ms, generation, "injected timeout")
    if due.kind == "wedge":
        stick.wedged = True
        raise stick._timeout(timeout_ms, generation, "injected wedge")
    if due.kind == "stall":
        if dfu_request:
            stick.dfu.stalled()
        raise usb_error(errno.EPIPE, "injected stall")
    if due.kind == "disconnect":
        stick.disconnect()
        raise usb_error(errno.ENODEV, "injected disconnect")
    if due.kind == "fatal":
        stick._raise_fatal("injected fatal error")
