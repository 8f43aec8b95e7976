"""A simulated Coral USB Accelerator behind pyusb's backend interface.

``usb.core.find(find_all=True, backend=SimulatedBackend())`` lists simulated
sticks; the host driver then talks to them with ordinary pyusb calls
(``ctrl_transfer``, ``write``, ``read``, ``reset``), so the same driver code
runs against this backend and against libusb.  No real stick was used to
build it: the behaviour follows the Edge TPU stack reference (§1: IDs,
descriptors, DFU, register access, framing, events) and libedgetpu's source
(the chip's registers), and everything not recorded there (the coralrt
segment protocol, fault behaviour) is this project's own design.

What a stick does is described in :mod:`coralrt._sim.stick.stick` (modes,
resets, endpoints), :mod:`coralrt._sim.stick.control` (control requests),
:mod:`coralrt._sim.stick.dfu` (DFU 1.1), :mod:`coralrt._selftest.open_trace`
(the recorded open trace, an expectation), :mod:`coralrt._sim.stick.chip` (the
chip's registers, a model after libedgetpu's source) and :mod:`coralrt._sim.stick.bulk`
(bulk framing, segments, DWN1 streams).

Every transfer is appended to ``backend.transcript`` as a dict with at least
``op``, ``device``, ``register``, ``value``, ``tag`` and ``length``; by default
only the last 10,000 entries are kept (``transcript_limit``).  Ops:
"read"/"write" (registers), "bulk_out" (one per 8-byte header; ``kind``
"load"/"run"/"input"/"raw"/"drop", raw ones get ``crc32`` when complete and
``refused`` unless the test-only switch below is on, in which case DWN1
streams get ``executable`` and ``hint``, the known executable and the DMA hint
they answer; ``data``, the payload, with ``record_payloads``), "bulk_in",
"intr_in", "ctrl" (standard requests), "dfu_<request>", and the events
"load", "run", "run_unknown", "load_failed", "raw_refused", "dwn1_request"
(test mode: a DWN1 request walked to its end), "fatal", "fault", "timeout",
"reset", "reenumerate", "disconnect", "replug".

Beyond pyusb, the backend answers the driver through
:class:`coralrt._usb.extension.BackendExtension`: ``lock_scope`` (as given),
``device_seconds`` (the latency model's estimate of the last segment run on a
stick, parameter upload included) and ``refusal``: the simulated Edge TPU
executes coralrt's native segments and refuses edgetpu_compiler programs
(DWN1), whose instructions are Google's closed instruction set.

Faults (``inject`` or a :class:`FaultPlan`) are described in
:mod:`coralrt._sim.stick.faults`.
"""

from __future__ import annotations

import errno
import itertools
from collections import deque
import logging
import threading

import usb.backend

from coralrt._sim.stick.dwn1_requests import Dwn1Catalog, Switches
from coralrt._sim.stick.faults import FAULT_KINDS, NOT_READY_ERRORS, Fault, FaultPlan
from coralrt._sim.stick.stick import SimulatedStick
from coralrt._sim.stick.usb_errors import usb_error
from coralrt._usb.extension import LOCK_SCOPES, PROGRAM_KINDS, BackendExtension

__all__ = ["SimulatedBackend", "FaultPlan", "Fault", "FAULT_KINDS", "NOT_READY_ERRORS",
           "REFUSES_DWN1"]

log = logging.getLogger("coralrt.usb")

REFUSES_DWN1 = (
    "the simulated Edge TPU cannot execute edgetpu_compiler programs (their instructions are "
    "Google's closed Edge TPU instruction set, which nobody outside Google can execute); run "
    "the plain, uncompiled .tflite with target='sim' (coralrt compiles it for the simulated "
    "Edge TPU), or use target='coral' with a Coral USB Accelerator attached")


class _DevId:
    """What ``enumerate_devices`` yields: one attachment of a stick."""

    __slots__ = ("stick", "generation")

    def __init__(self, stick: SimulatedStick):
        self.stick, self.generation = stick, stick.generation

    def __repr__(self):
        return f"<simulated stick {self.stick.index} attachment {self.generation}>"


class _Handle:
    __slots__ = ("stick", "generation", "closed")

    def __init__(self, devid: _DevId):
        self.stick, self.generation, self.closed = devid.stick, devid.generation, False


class SimulatedBackend(usb.backend.IBackend, BackendExtension):
    """pyusb backend with ``n_devices`` simulated Coral USB Accelerators.

    ``firmware_loaded``: the sticks start in running mode (18d1:9302) instead of
    bootloader mode.  ``latency``: a :class:`coralrt._sim.latency.LatencyModel`;
    with it, outputs and events become readable only after the estimated device
    time (None: device time 0).  ``kernels``: extra kernel factories by
    operator name, as plugins register them (see coralrt/_sim/kernels/__init__.py).
    ``max_wait``: longest a simulated timeout or empty read really waits.
    ``dfu_busy_polls``: GETSTATUS answers of dfuDNBUSY before each block is done.
    ``lock_scope``: "machine" (the driver takes its cross-process per-stick
    lock, as for real sticks) or "process" (the sticks are private to this
    process: no lock).
    ``transcript_limit``: how many transcript entries are kept; ``transcript``
    is then a ``collections.deque`` of the last ``transcript_limit`` entries
    (default 10,000, so that a backend that runs for hours holds a bounded
    amount of memory).  ``None`` keeps every entry in a list; tests that
    count or slice entries from the start ask for it explicitly.

    The sticks refuse edgetpu_compiler (DWN1) programs: :meth:`refusal` says
    so, and should a raw (non-segment) stream arrive anyway, the stick answers
    it with an error event (tag 0xF), never with made-up outputs.

    TEST AND BENCHMARK ONLY: ``timing_only=True`` makes every segment run wait
    the latency model's estimate (the host's output read waits, GIL released)
    instead of computing, and answer zeros of the output sizes; loading,
    framing, transfers and events stay real, so a throughput benchmark
    measures the host side (driver, executor, session) and device time on a
    2-core machine where the simulator's own numpy work would otherwise be
    what is measured.  Give ``latency`` too (without it a run takes no time).
    The outputs are not the model's: nothing in coralrt turns this on, no
    ``target=`` name and no environment variable reaches it (``target="sim"``
    builds its sticks with :func:`coralrt._sim.stick.device.simulated_stick`,
    which has no such parameter); only code that builds a
    ``SimulatedBackend`` itself (tests, benchmarks) can.

    TEST-ONLY: ``backend._accept_dwn1_for_tests = True`` (set by
    ``tests/support/sim.py``, not a user option) lets the test suite exercise
    a host's DWN1 path (framing, DMA hints, parameter caching) on the
    executables it registered with :meth:`know_dwn1`.  Each stick then plays
    the transfers of those programs request by request
    (:mod:`coralrt._sim.stick.dwn1_requests`): it recognises an executable by
    its instructions, expects the streams its DMA hints name, makes each
    output readable once the inputs before it arrived, and queues one event
    per request; anything else raises the stick's fatal error.  The output
    bytes are placeholders computed from the request's inputs, NOT outputs of
    the program; nothing tells the host otherwise.  ``record_payloads = True``
    (also test-only) keeps every complete host -> device stream's payload in
    its "bulk_out" transcript entry (key "data"), for tests that compare what
    two hosts sent.
    """

    #: Test-only switches, see the class docstring.
    _accept_dwn1_for_tests = False
    record_payloads = False

    def know_dwn1(self, package) -> list:
        """TEST-ONLY: let the sticks recognise the executables of ``package``.

        ``package`` is an ``edgetpu-custom-op``'s ``custom_options`` (bytes-like).
        Returns the executables newly known (a package given twice adds nothing).
        Raises ExecutableError when it does not parse, ValueError when an
        executable's DMA hints cannot be followed.  It matters only in test
        mode (``_accept_dwn1_for_tests``).
        """
        return self._dwn1_known.add(package)


    def __init__(self, *, firmware_loaded: bool = False, n_devices: int = 1, latency=None,
                 usb_speed: str = "usb3", faults: FaultPlan | None = None,
                 kernels: dict | None = None, max_wait: float = 0.25,
                 dfu_busy_polls: int = 0, time_scale: float = 1.0,
                 transcript_limit: int | None = 10_000, lock_scope: str = "machine",
                 timing_only: bool = False):
        if usb_speed not in ("usb2", "usb3"):
            raise ValueError(f"usb_speed must be 'usb2' or 'usb3', not {usb_speed!r}")
        if n_devices < 0:
            raise ValueError("n_devices must be >= 0")
        if lock_scope not in LOCK_SCOPES:
            raise ValueError(f"lock_scope must be one of {LOCK_SCOPES}, not {lock_scope!r}")
        # Bounded unless a test asks for everything: a stick in a long-running
        # process must not keep every transfer it ever saw.
        self.transcript = [] if transcript_limit is None else deque(maxlen=transcript_limit)
        # "machine": the host's per-stick lock spans processes, as for real
        # sticks; "process": every process gets its own simulated sticks.
        self.lock_scope = lock_scope    # BackendExtension.lock_scope
        self.max_wait = max_wait
        self.dfu_busy_polls = dfu_busy_polls
        self.usb_speed = usb_speed
        self.timing_only = bool(timing_only)
        self._addresses = itertools.count(4)
        self._lock = threading.Lock()
        self._dwn1_known = Dwn1Catalog()     # test mode: the DWN1 executables known
        self.devices = [SimulatedStick(self, i, firmware_loaded=firmware_loaded,
                                       usb_speed=usb_speed, latency=latency, kernels=kernels,
                                       time_scale=time_scale,
                                       timing_only=self.timing_only)
                        for i in range(n_devices)]
        for f in (faults.faults if faults is not None else ()):
            self._stick(f.device).faults.append(f)

    # -- test controls -------------------------------------------------------------------

    def inject(self, kind: str, *, after: int = 0, device: int = 0,
               seconds: float = 0.0, error: str = "io") -> None:
        """Arm a fault on stick ``device`` (see the module docstring for the kinds)."""
        fault = Fault(kind, after, device, seconds, error)
        stick = self._stick(device)
        with stick.cond:
            stick.faults.append(fault)

    def replug(self, device: int = 0, *, mode: str | None = None) -> None:
        """Plug stick ``device`` in again (after a disconnect, or to power-cycle it).

        It enumerates at a new address in ``mode`` ("bootloader" or "running");
        None means the mode the backend started in, so that tests without a
        firmware image can recover.  A real stick always comes back in
        bootloader mode.  A replug is the one thing that ends a "wedge".
        """
        if mode not in (None, "bootloader", "running"):
            raise ValueError(f"mode must be 'bootloader' or 'running', not {mode!r}")
        self._stick(device).replug(mode)

    # -- what the driver learns beyond pyusb (BackendExtension) --------------------------

    def device_seconds(self, address: int) -> float:
        """The latency model's estimate of the last run of the stick at ``address``."""
        for stick in self.devices:
            if stick.address == address:
                last = stick.engine.last_run
                return float(last.get("device_seconds", 0.0) + last.get("upload_seconds", 0.0))
        return 0.0

    def refusal(self, address: int, kind: str) -> str | None:
        """None for coralrt segments; edgetpu_compiler programs are refused (see above)."""
        if kind == "segment":
            return None
        if kind == "dwn1":
            return None if self._accept_dwn1_for_tests else REFUSES_DWN1
        return (f"the simulated Edge TPU does not know programs of kind {kind!r} (it knows "
                f"{', '.join(PROGRAM_KINDS)})")

    def _test_switches(self) -> Switches | None:
        """The test-only switches, read by a stick at each bulk stream (bulk.py); None
        when both are off, as outside the test suite."""
        if not (self._accept_dwn1_for_tests or self.record_payloads):
            return None
        return Switches(self._accept_dwn1_for_tests, self.record_payloads, self._dwn1_known)

    def _stick(self, device: int) -> SimulatedStick:
        if not 0 <= device < len(self.devices):
            raise ValueError(f"no simulated stick {device} (there are {len(self.devices)})")
        return self.devices[device]

    def _next_address(self) -> int:
        with self._lock:
            return next(self._addresses)

    def _record(self, device: int, op: str, **fields) -> dict:
        entry = {"op": op, "device": device, "register": None, "value": None, "tag": None,
                 "length": None}
        entry.update(fields)
        self.transcript.append(entry)
        return entry

    # -- enumeration and descriptors -----------------------------------------------------

    def enumerate_devices(self):
        return [_DevId(s) for s in self.devices if s.visible]

    def get_parent(self, dev):
        return None

    def _live(self, dev: _DevId) -> SimulatedStick:
        dev.stick.check(dev.generation)
        return dev.stick

    def get_device_descriptor(self, dev):
        return self._live(dev).descriptor()

    def get_configuration_descriptor(self, dev, config):
        if config != 0:
            raise IndexError(f"invalid configuration index {config}")
        return self._live(dev).config()

    def get_interface_descriptor(self, dev, intf, alt, config):
        cfg = self.get_configuration_descriptor(dev, config)
        if intf != 0 or alt != 0:
            raise IndexError(f"invalid interface {intf} / alternate setting {alt}")
        return cfg.interface

    def get_endpoint_descriptor(self, dev, ep, intf, alt, config):
        cfg = self.get_configuration_descriptor(dev, config)
        if intf != 0 or alt != 0 or not 0 <= ep < len(cfg.endpoints):
            raise IndexError(f"invalid endpoint index {ep}")
        return cfg.endpoints[ep]

    # -- handles -------------------------------------------------------------------------

    def open_device(self, dev):
        stick = self._live(dev)
        if not stick.visible:
            raise usb_error(errno.ENODEV, "stick is re-enumerating")
        return _Handle(dev)

    def close_device(self, dev_handle):
        stick = dev_handle.stick
        with stick.cond:
            if stick.claimed_by is dev_handle:
                stick.claimed_by = None
            dev_handle.closed = True

    def _open(self, h: _Handle) -> SimulatedStick:
        if h.closed:
            raise usb_error(errno.EINVAL, "handle is closed")
        h.stick.check(h.generation)
        return h.stick

    def set_configuration(self, dev_handle, config_value):
        stick = self._open(dev_handle)
        if config_value not in (0, 1):
            raise usb_error(errno.EINVAL, f"configuration {config_value}")
        with stick.cond:
            stick.configuration = config_value
            stick._record("set_configuration", value=config_value)

    def get_configuration(self, dev_handle):
        return self._open(dev_handle).configuration

    def set_interface_altsetting(self, dev_handle, intf, altsetting):
        self._open(dev_handle)
        if intf != 0 or altsetting != 0:
            raise usb_error(errno.ENOENT, f"interface {intf} alternate setting {altsetting}")

    def claim_interface(self, dev_handle, intf):
        stick = self._open(dev_handle)
        if intf != 0:
            raise usb_error(errno.ENOENT, f"interface {intf}")
        with stick.cond:
            if stick.claimed_by is not None and stick.claimed_by is not dev_handle:
                raise usb_error(errno.EBUSY, "interface 0 is claimed by another handle")
            stick.claimed_by = dev_handle
            stick._record("claim_interface", value=intf)

    def release_interface(self, dev_handle, intf):
        stick = self._open(dev_handle)
        with stick.cond:
            if stick.claimed_by is dev_handle:
                stick.claimed_by = None

    def is_kernel_driver_active(self, dev_handle, intf):
        self._open(dev_handle)
        return False

    def detach_kernel_driver(self, dev_handle, intf):
        self._open(dev_handle)

    def attach_kernel_driver(self, dev_handle, intf):
        self._open(dev_handle)

    # -- transfers -----------------------------------------------------------------------

    def bulk_write(self, dev_handle, ep, intf, data, timeout):
        return self._open(dev_handle).bulk_write(dev_handle, ep, data, timeout)

    def bulk_read(self, dev_handle, ep, intf, buff, timeout):
        return self._open(dev_handle).bulk_read(dev_handle, ep, buff, timeout)

    def intr_read(self, dev_handle, ep, intf, buff, timeout):
        return self._open(dev_handle).intr_read(dev_handle, ep, buff, timeout)

    def ctrl_transfer(self, dev_handle, bmRequestType, bRequest, wValue, wIndex, data,
                      timeout):
        return self._open(dev_handle).control(dev_handle, bmRequestType, bRequest, wValue,
                                              wIndex, data, timeout)

    def clear_halt(self, dev_handle, ep):
        stick = self._open(dev_handle)
        with stick.cond:
            stick._record("clear_halt", ep=ep)

    def reset_device(self, dev_handle):
        """Port reset.  After a firmware download the stick re-enumerates as 18d1:9302.

        libusb answers a reset that makes the device re-enumerate with
        NOT_FOUND; this backend returns normally and lets the old handle fail
        with ENODEV afterwards, which is what a host sees on its next transfer.
        """
        self._open(dev_handle).usb_reset(dev_handle)
