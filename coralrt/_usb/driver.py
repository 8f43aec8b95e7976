"""The Coral USB Accelerator as an :class:`~coralrt._runtime.device.EdgeTpuDevice`.

``open`` finds the stick (bounded retries), takes its per-stick lock, downloads
the firmware if it is in bootloader mode, resets it, claims interface 0 and
runs the bring-up register sequence.  ``load_as`` accepts a program of a
format of :data:`coralrt._formats.opnames.FORMATS` (a coralrt segment, or a
DWN1 package from an ``edgetpu-custom-op``) as the handle class registered for
its id, unless the device cannot execute that kind of program
(``ProgramRefusedError``); programs are prepared and uploaded on their first run.  ``run`` checks the inputs and hands the request to the
open stick's :class:`~coralrt._usb.exchange.Exchange` (what goes on the wire,
and what the stick holds).  ``close`` halts the chip, releases the interface,
resets the port and drops the lock.  Any transfer failure leaves the device
unusable until it is closed and opened again (which resets the stick) or
``reset()``.  Any other exception that escapes a request mid-transfer (Ctrl-C,
a timeout raised in the caller's thread, ...) leaves host and stick out of
step: the device is marked so, and its next ``run`` resets the stick and brings
it up again first (``reset()``: the same path as a reopen), so no request ever
reads the answer of an earlier one.  A segment the simulated stick cannot load
or whose computation fails on the given inputs comes back as ``ModelError`` /
``InferenceError`` with the stick's reason, and the stick stays usable.

Two ways real sticks misbehave, after public reports (docs/usb.md, "Sticks
that misbehave"): a stick that is enumerated but not ready yet (the first
register read of the bring-up is retried for ``ready_timeout`` seconds, then
``DeviceNotReadyError``), and a wedged stick that answers nothing until it is
replugged (after a run's transfer times out, one short register read tells a
wedged stick from a slow one: ``DeviceWedgedError``, saying to replug it; the
device then refuses runs at once, without a transfer, until ``reset()`` or a
reopen, which after the replug brings it back).

The driver knows backends through pyusb's interface only, plus the optional
:class:`~coralrt._usb.extension.BackendExtension` (lock scope, device time,
which program kinds the device refuses), read once in ``open``; a backend
that does not implement it (libusb) is taken to drive real sticks.
"""

from __future__ import annotations

import logging
import threading
import time

import usb.core
import usb.util

from coralrt._formats.opnames import BY_ID, identify
from coralrt._runtime.device import EdgeTpuDevice, RunStats
from coralrt.errors import (
    ConfigError, DeviceBusyError, DeviceError, DeviceLostError, DeviceNotFoundError,
    DeviceNotReadyError, DeviceTimeoutError, DeviceWedgedError, ProgramRefusedError,
)
from coralrt._usb import bringup, dfu, firmware
from coralrt._usb import constants as C
from coralrt._usb.discovery import default_backend, select, speed_name
from coralrt._usb.exchange import Answered, Exchange, executable_inputs, segment_inputs
from coralrt._usb.extension import LOCK_SCOPES, BackendExtension
from coralrt._usb.framing import Framer
from coralrt._usb.lock import DeviceLock
from coralrt._usb.handles import HANDLES, ExecutableHandle, SegmentHandle
from coralrt._usb.transport import Transport, translate_error

__all__ = ["UsbEdgeTpu", "open_device", "SegmentHandle", "ExecutableHandle"]

log = logging.getLogger("coralrt.usb")

# What the driver assumes of a backend that is not a BackendExtension: real sticks.
_REAL_STICK = BackendExtension()


class _ResetPending:
    """``UsbEdgeTpu._failed`` while a reset is under way, or after one that did not
    finish: the next ``run`` starts it over."""

    def __repr__(self) -> str:
        return "a reset that did not finish"


_RESET_PENDING = _ResetPending()

# Failures that only a replug fixes: runs are refused at once until reset() or a reopen.
_NEEDS_REPLUG = (DeviceWedgedError, DeviceNotReadyError)


def _out_of_step(failed) -> bool:
    """Whether ``UsbEdgeTpu._failed`` asks the next run to reset the stick first: it
    holds an exception other than a DeviceError that escaped a request mid-transfer
    (the stick may still hold inputs, outputs or events of that request), or
    _RESET_PENDING."""
    return failed is not None and not isinstance(failed, DeviceError)


class UsbEdgeTpu(EdgeTpuDevice):
    """A Coral USB Accelerator over pyusb (``backend``: a pyusb backend, default libusb).

    ``clock``: the clock variant the bring-up sets, "std" (libedgetpu's throttled
    build, the default) or "max" (its direct build); docs/usb.md, "Bring-up"."""

    kind = "coral"

    def __init__(self, path: str | None = None, backend=None, *, timeout: float = C.DEFAULT_TIMEOUT,
                 firmware=None, reenumeration_timeout: float = C.REENUMERATION_TIMEOUT,
                 open_retries: int = C.OPEN_RETRIES, ready_timeout: float = C.READY_TIMEOUT,
                 clock: str = C.DEFAULT_CLOCK):
        if clock not in C.CLOCKS:
            raise ConfigError(f"clock={clock!r}: one of {', '.join(sorted(C.CLOCKS))} (the "
                              f"clock variants of libedgetpu's std and max builds, docs/usb.md)")
        self.clock = clock
        self.requested = path
        self.path = path or "usb"
        self.backend = backend
        self.timeout = float(timeout)
        self.firmware = firmware
        self.reenumeration_timeout = reenumeration_timeout
        self.open_retries = max(1, open_retries)
        self.ready_timeout = float(ready_timeout)
        self.info = None
        self.usb_speed = "unknown"
        self.chip_info: dict = {}
        self._dev = None
        self._t: Transport | None = None
        self._exchange: Exchange | None = None  # the requests of this open: what the stick holds
        self._lock: DeviceLock | None = None    # None: not open, or lock_scope "process"
        self._ext: BackendExtension | None = None   # the backend's answers, set by open()
        self._address: int | None = None
        # None while requests may go straight to the stick (the one check per run);
        # a DeviceError: failed, refused until reset() or a reopen; anything else
        # (see _out_of_step): the next run resets the stick first.
        self._failed: BaseException | _ResetPending | None = None
        self._programs: dict = {}
        self._stats = RunStats()
        self._io_lock = threading.RLock()

    # -- open / close -------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self._t is not None

    def open(self) -> None:
        if self._t is not None:
            return
        backend = default_backend() if self.backend is None else self.backend
        self.backend = backend
        ext = backend if isinstance(backend, BackendExtension) else _REAL_STICK
        if ext.lock_scope not in LOCK_SCOPES:
            raise ConfigError(f"{type(backend).__name__}.lock_scope is {ext.lock_scope!r}; "
                              f"it must be one of {', '.join(LOCK_SCOPES)}")
        dev, mode, info = self._find(backend)
        port = info.port_path or f"bus{info.bus}-{info.address}"
        # Sticks private to this process need no lock across processes.
        lock = None if ext.lock_scope == "process" else DeviceLock(port, path_name=info.path)
        if lock is not None:
            lock.acquire()
        try:
            if mode == "bootloader":
                image = firmware.load_image(self.firmware)
                log.info("%s: downloading firmware (%d bytes)", info.path, len(image))
                dev = dfu.update(dev, backend, info, image, timeout=self.timeout,
                                 reenumeration_timeout=self.reenumeration_timeout)
            else:   # firmware running: reset the port so the chip starts clean
                dfu.reset_device(dev, path=info.path)
                dev = dfu.wait_for_app(backend, info, self.reenumeration_timeout)
            self._claim(dev, info.path)
            self.usb_speed = speed_name(dev)
            if self.usb_speed == "usb1":
                raise DeviceError(f"{info.path}: the stick runs at USB 1 speed, which "
                                  f"libedgetpu rejects; use a USB 2 or USB 3 port", path=info.path)
            t = Transport(dev, timeout=self.timeout, path=info.path)
            self.chip_info = bringup.bring_up(t, usb_speed=self.usb_speed,
                                              ready_timeout=self.ready_timeout,
                                              clock=self.clock)
            # A fatal error raised during bring-up would otherwise show only as the
            # first run's timeout: read the fatal status before handing the stick out
            # (the interface and handle are let go below, as on every failure).
            word = bringup.pending_fatal(t)
            if word is not None:
                detail = bringup.describe_fatal(t, word)
                raise DeviceLostError(f"{info.path}: the stick raised a fatal error while it "
                                      f"was being opened ({detail}); open it again, which "
                                      f"resets it; if that fails too, unplug and replug it",
                                      path=info.path)
        except BaseException:
            # A claim left by an open cut short (Ctrl-C during a resync) would make
            # the next open find the interface busy.
            _dispose(dev)
            if lock is not None:
                lock.release()
            raise
        self._dev, self._t, self._lock, self.info = dev, t, lock, info
        self._ext, self._address = ext, dev.address
        self.path = info.path
        self._exchange = Exchange(Framer(t, self.usb_speed), info.path)  # holds nothing yet
        self._failed = None
        log.info("%s: open (%s, %s)", self.path, info.port_path or "port unknown", self.usb_speed)

    def _find(self, backend):
        last: DeviceError | None = None
        for attempt in range(self.open_retries):
            if attempt:
                time.sleep(C.RETRY_DELAY)
            try:
                return select(backend, self.requested)
            except (DeviceNotFoundError, DeviceLostError) as e:
                last = e
        raise last

    def _claim(self, dev, path: str) -> None:
        last: DeviceError | None = None
        for attempt in range(self.open_retries):
            if attempt:
                time.sleep(C.RETRY_DELAY)
            try:
                try:
                    if dev.is_kernel_driver_active(C.ML_INTERFACE):
                        dev.detach_kernel_driver(C.ML_INTERFACE)
                except (NotImplementedError, usb.core.USBError):
                    pass
                usb.util.claim_interface(dev, C.ML_INTERFACE)
                return
            except (usb.core.USBError, OSError) as e:
                last = translate_error(e, "claiming interface 0", path=path)
                if not isinstance(last, (DeviceBusyError, DeviceLostError)):
                    raise last from e
        raise last

    def close(self) -> None:
        self._release()
        if _out_of_step(self._failed):
            self._failed = None     # closed on purpose: run() must not open it again

    def _release(self) -> None:
        """Halt, release, reset the port, drop the lock; ``_failed`` stays as it is.
        Also finishes a close that an exception interrupted: ``_dev`` and ``_lock``
        are forgotten only once they are released."""
        t, dev = self._t, self._dev
        self._t = self._exchange = None
        self._ext = self._address = None
        if t is not None:
            try:
                if self._failed is None:
                    bringup.halt(t)
            except DeviceError as e:
                log.debug("%s: halt on close: %s", self.path, e)
        if dev is not None:
            try:
                usb.util.release_interface(dev, C.ML_INTERFACE)
            except (usb.core.USBError, OSError) as e:
                log.debug("%s: release: %s", self.path, e)
            try:
                dfu.reset_device(dev, path=self.path)
            except DeviceError as e:
                log.debug("%s: reset on close: %s", self.path, e)
            self._dev = None
            log.info("%s: closed", self.path)
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def reset(self) -> None:
        """Reset the stick and bring it up again, on the same port, as ``close()``
        then ``open()`` do: after an interrupted request (``run`` also does this
        by itself), after a transfer failure, or on request.  Loaded programs
        stay valid; their parameters are uploaded again on their next run.

        Raises what ``open()`` raises (a DeviceError) when the stick cannot be
        brought back; the device then stays marked, and its next ``run`` tries
        again.  A closed device raises DeviceError: open it instead.
        """
        with self._io_lock:
            if (self._t is None and not _out_of_step(self._failed)
                    and not isinstance(self._failed, _NEEDS_REPLUG)):
                raise DeviceError(f"device {self.path} is not open", path=self.path)
            log.info("%s: reset requested", self.path)
            self._resync()

    def _resync(self) -> None:
        # Whatever stops this half way (an error, another Ctrl-C) leaves the device
        # marked, so the next run starts over.
        self._failed = _RESET_PENDING
        requested = self.requested
        if self.info is not None and self.info.port_path:
            self.requested = self.info.port_path    # this stick, whatever its usb:N now
        try:
            self._release()
            self.open()                     # resets _failed and what the stick holds
        except _NEEDS_REPLUG as e:
            # Trying again on every run would cost ready_timeout each time and cannot
            # help: refuse runs at once until reset() or a reopen (after a replug).
            self._failed = e
            raise
        finally:
            self.requested = requested

    def __del__(self):
        try:
            if self._lock is not None:
                self._lock.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- programs -----------------------------------------------------------------------
    def load(self, program):
        """:meth:`load_as` with the format the table tells from the bytes (``identify``)."""
        data = memoryview(program).cast("B")
        return self.load_as(data, identify(data).id)

    def load_as(self, program, format_id: str, *, output_dtypes=None):
        """A handle for ``program`` of the format ``format_id``, of the class
        :data:`HANDLES` registers for it, one per program; ``output_dtypes`` is
        kept on it for formats that decode outputs with them.

        Raises :class:`~coralrt.errors.ProgramRefusedError` when the device
        cannot execute that kind of program (checked here when the device is
        open, else on the program's first run).
        """
        data = memoryview(program).cast("B")
        self._admit(format_id)
        handle = HANDLES[format_id].from_cache(data, self._programs)
        if output_dtypes is not None:
            handle.output_dtypes = list(output_dtypes)
        return handle

    def _admit(self, kind: str) -> None:
        """Raise ProgramRefusedError if the open device cannot execute programs of ``kind``
        (closed: nothing to ask yet; ``run`` asks before a program's first run)."""
        ext, address = self._ext, self._address
        if ext is None:
            return
        reason = ext.refusal(address, kind)
        if reason is not None:
            raise ProgramRefusedError(f"{self.path}: cannot load {BY_ID[kind].description}: "
                                      f"{reason}", kind=kind, reason=reason, path=self.path)

    def _usable(self) -> Exchange:
        failed = self._failed
        if failed is not None:
            if isinstance(failed, _NEEDS_REPLUG):
                raise DeviceLostError(f"{self.path}: the stick stopped answering earlier "
                                      f"({bringup.what_failed(failed)}); "
                                      f"{bringup.REPLUG_ADVICE}", path=self.path)
            if isinstance(failed, DeviceError):
                raise DeviceLostError(f"{self.path}: the stick failed earlier ({failed}); "
                                      f"close it and open it again", path=self.path)
            log.warning("%s: the previous request was interrupted mid-transfer (%s); "
                        "resetting the stick to bring it back in step", self.path,
                        failed if failed is _RESET_PENDING else type(failed).__name__)
            self._resync()
        if self._exchange is None:
            raise DeviceError(f"device {self.path} is not open", path=self.path)
        return self._exchange

    def run(self, handle, inputs):
        # Sessions may share a stick: one request at a time on the wire.
        with self._io_lock:
            return self._run(handle, inputs)

    def _run(self, handle, inputs):
        wire = self._usable()
        start = time.perf_counter()
        if not handle.prepared:     # loaded while the device was closed: ask now
            self._admit(handle.kind)
            handle.prepare()
        # The inputs are checked before anything goes on the wire: from the first
        # transfer on, whatever escapes leaves the device failed or out of step.
        if handle.kind == "segment":
            staged, exchange = segment_inputs(handle, inputs), wire.run_segment
        else:
            staged, exchange = executable_inputs(handle, inputs), wire.run_executable
        try:
            upload, outputs = exchange(handle, staged)
        except Answered as a:       # the stick answered in full: in step, still usable
            raise a.error from None
        except DeviceTimeoutError as e:
            self._failed = e
            fatal = wire.framer.poll_interrupt(timeout=0.05)
            if fatal is not None and fatal & C.FATAL_INTERRUPT_BIT:
                raise self._fatal(fatal) from e
            if not bringup.answers(self._t):
                # Not even a register read: the stick is wedged, and public reports
                # say no reset helps (edgetpu#70, edgetpu#237).  Say so now rather
                # than let the caller wait out a reset that cannot work.
                wedged = DeviceWedgedError(
                    f"{self.path}: {bringup.what_failed(e)}, and the stick no longer "
                    f"answers register reads either: it is wedged; "
                    f"{bringup.REPLUG_ADVICE}", errno=e.errno, path=self.path)
                self._failed = wedged
                raise wedged from e
            raise
        except DeviceError as e:
            self._failed = e
            raise
        except BaseException as e:  # Ctrl-C, SystemExit, a timeout raised in our thread ...
            # A plain store, before anything that runs Python code: a second Ctrl-C
            # cannot land between the exception and the mark.
            self._failed = e
            raise
        host = time.perf_counter() - start
        self._stats = RunStats(host_seconds=host,
                               device_seconds=self._ext.device_seconds(self._address),
                               parameter_upload_seconds=upload)
        return outputs

    def _fatal(self, word: int) -> DeviceLostError:
        status = bringup.read_fatal_status(self._t) if self._t is not None else None
        detail = (f"hib_error_status {status[0]:#x}, hib_first_error_status {status[1]:#x}"
                  if status else "error status unreadable")
        return DeviceLostError(f"{self.path}: the stick raised a fatal-error interrupt "
                               f"(word {word:#x}; {detail}); close it and open it again, which "
                               f"resets it", path=self.path)

    @property
    def last_stats(self) -> RunStats:
        return self._stats

    def __repr__(self) -> str:
        state = "open" if self.is_open else "closed"
        return f"<UsbEdgeTpu {self.path} {state}>"


def _dispose(dev) -> None:
    try:
        usb.util.dispose_resources(dev)     # releases what it claimed, closes the handle
    except Exception as e:  # noqa: BLE001 - the device may be gone already
        log.debug("dispose: %s", e)


def open_device(path: str | None = None, backend=None, *, timeout: float = C.DEFAULT_TIMEOUT,
                firmware=None, **options) -> UsbEdgeTpu:
    """An opened :class:`UsbEdgeTpu` (``path``: None, "usb:N" or a port path)."""
    device = UsbEdgeTpu(path, backend, timeout=timeout, firmware=firmware, **options)
    device.open()
    return device
