"""The self-test sequence, on a real stick or on a simulated one.

1. enumeration: the stick as 1a6e:089a (bootloader) or 18d1:9302 (running),
   with its port path;
2. the driver's open, seen through :class:`RecordingBackend`: firmware
   download (bootloader mode only), re-enumeration as 18d1:9302 at the same
   port path, and the bring-up, whose register writes must be those of
   libedgetpu's open trace (plus EnableReset's, which that open skipped);
3. register read-back: the values the driver's read path returned during that
   open for registers it had not written yet, beside the reset values the
   simulated chip assumes (information: a difference is the model's error);
4. the USB link: speed and packet sizes from the running device's descriptors;
5. Coral's compiled test models on the stick (first-run and warm latency) and
   the parameter-caching program they carry;
6. libedgetpu, probed in a child process, and the same models through LiteRT
   with its delegate, compared bit for bit.

On a simulated stick (``simulated=True``) steps 1 to 4 run for real against
:mod:`coralrt._sim.stick`; every check whose answer needs the chip to execute
Google's instructions is skipped with :data:`CHIP_REASON`, never passed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from coralrt.errors import ConfigError, CoralRTError, DeviceError, DeviceNotFoundError, \
    FirmwareError
from coralrt._selftest import libedgetpu as L
from coralrt._selftest import models as M
from coralrt._selftest.checks import CHIP_REASON, fail, ok, skipped
from coralrt._selftest.programs import compare_with_libedgetpu, run_models, short_name
from coralrt._selftest.recorder import RecordingBackend, compare_with_trace
from coralrt._selftest.report import Report, environment
from coralrt._usb import constants as C
from coralrt._usb import firmware as fw
from coralrt._usb.discovery import default_backend, find_at_port, list_devices, select
from coralrt._usb.driver import UsbEdgeTpu

__all__ = ["run_selftest", "NO_STICK", "STAND_IN_FIRMWARE", "simulated_backend",
           "simulated_firmware"]

log = logging.getLogger("coralrt.selftest")

NO_STICK = "no Coral USB Accelerator found (looked for 1a6e:089a and 18d1:9302)"
_IDS = {"bootloader": "1a6e:089a", "running": "18d1:9302"}
_SPEED_TEXT = {"usb3": "SuperSpeed (USB 3)", "usb2": "High Speed (USB 2)",
               "usb1": "Full/Low Speed (USB 1)", "unknown": "unknown speed"}
_BULK_PACKET = {"usb3": 1024, "usb2": 512}

#: What ``--simulated`` downloads when Google's image is not installed: the
#: simulated bootloader accepts any image.  It is NOT the stick's firmware.
STAND_IN_FIRMWARE = (b"\x02\x00\x03" + b"coralrt stand-in image for the simulated stick; "
                     b"not Google's firmware\n" * 128)


def simulated_backend(n: int = 1):
    """``n`` simulated sticks in bootloader mode, as real sticks are after power-up."""
    from coralrt._sim.stick import SimulatedBackend
    return SimulatedBackend(n_devices=n, firmware_loaded=False, lock_scope="process")


def simulated_firmware() -> tuple[bytes, bool]:
    """The installed firmware when it is there and valid, else the stand-in image;
    and whether it is the stand-in."""
    try:
        return fw.load_installed(), False
    except FirmwareError:
        return STAND_IN_FIRMWARE, True


class _NotPinned(logging.Filter):
    # The driver warns that an image is not Google's; for the stand-in we say so ourselves.
    def filter(self, record: logging.LogRecord) -> bool:
        return "is not the pinned" not in record.getMessage()


def run_selftest(*, device: str | None = None, backend=None, simulated: bool = False,
                 models_dir=None, download: bool = False, repeat: int = 10, firmware=None,
                 trace=None, models=M.MODELS, base_url: str = M.BASE_URL,
                 probe=L.probe) -> Report:
    """Run every check and return the :class:`Report`.

    ``backend``: the pyusb backend (None: libusb, or with ``simulated`` one
    simulated stick in bootloader mode); ``firmware``: the image for a
    bootloader-mode stick (None: the installed one; with ``simulated``, the
    installed one or :data:`STAND_IN_FIRMWARE`); ``trace``: the reference
    open trace (TraceStep rows; default the recorded libedgetpu trace).
    Raises :class:`DeviceNotFoundError` when there is no stick (or not the
    one ``device`` names).
    """
    if repeat < 1:
        raise ConfigError(f"--repeat must be 1 or more, not {repeat}")
    if trace is None:
        from coralrt._selftest.open_trace import OPEN_TRACE   # the trace, re-encoded as data
        trace = OPEN_TRACE
    stand_in = False
    if simulated:
        backend = simulated_backend() if backend is None else backend
        if firmware is None:
            firmware, stand_in = simulated_firmware()
    if backend is None:
        try:
            backend = default_backend()
        except DeviceNotFoundError as e:
            raise DeviceNotFoundError(f"{NO_STICK}: {e}") from e
    rec = RecordingBackend(backend)
    before = list_devices(rec)
    if not before:
        raise DeviceNotFoundError(NO_STICK + "; plug it in (a data cable, not a charging "
                                  "one) and check `lsusb`", path=device)
    _, mode, info = select(rec, device)
    report = Report(simulated, env=environment(backend, simulated=simulated))
    report.usb = {"path": info.path, "bus": info.bus, "port_path": info.port_path,
                  "sticks": [d.to_dict() for d in before],
                  "before_open": {"ids": _IDS[mode], "mode": mode, "address": info.address,
                                  "speed": info.usb_speed}}
    port = info.port_path or "(port path unknown)"
    report.add(ok("enumeration", f"{info.path} seen as {_IDS[mode]} ({mode} mode) at {port}",
                  ids=_IDS[mode], mode=mode, port_path=info.port_path, bus=info.bus,
                  address=info.address, sticks=len(before)))

    dev, opened = _open(report, rec, info, mode, firmware, stand_in, trace)
    try:
        if simulated:
            _chip_skipped(report, models_dir, download, models, base_url)
        elif opened:
            results = run_models(report, dev, models_dir, download, models, base_url, repeat)
        else:
            for m in models:
                report.add(skipped(f"model:{short_name(m.compiled)}",
                                   "the stick was not brought up", needs_chip=True))
    finally:
        dev.close()
    compare_with_libedgetpu(report, probe, None if simulated or not opened else results)
    return report


@dataclass
class _OpenAttempt:
    """What the driver's open did, as the recording backend and the clock saw it."""
    error: DeviceError | None   # what the open raised, if it failed
    start: int                  # the recorder's marks before and after the open
    stop: int
    t0: float                   # time.perf_counter() before and after the open
    t1: float
    vendor: list                # the register reads and writes during the open
    t_chip: float               # when the first register access began (t1 if none did)


def _open(report: Report, rec: RecordingBackend, info, mode: str, firmware, stand_in: bool,
          trace) -> tuple[UsbEdgeTpu, bool]:
    """Open the stick with the driver and report what the open did: the firmware
    download, the re-enumeration and the bring-up, then (when the stick came up)
    the register read-back and the USB speed.  Returns the device and whether it
    was brought up; the caller closes it either way."""
    image = _firmware_image(mode, firmware)
    dev = UsbEdgeTpu(info.port_path or info.path, rec, firmware=firmware)
    attempt = _attempt_open(dev, rec, stand_in)
    after, running_here = _devices_after_open(rec, info)
    dl_failed = _report_download(report, rec, mode, image, stand_in, attempt, running_here)
    _report_reenumeration(report, info, mode, after, running_here, dl_failed)
    if attempt.error is not None:
        _report_not_brought_up(report, attempt.error, dl_failed)
        return dev, False
    _report_bring_up(report, dev, attempt, trace)
    report.add(_readback(attempt.vendor))
    report.add(_speed(report, rec, info, dev.usb_speed))
    return dev, True


def _firmware_image(mode: str, firmware) -> bytes | None:
    """The image the driver downloads to a bootloader-mode stick, for the report:
    ``firmware`` itself when it is bytes, the installed image when it is None.
    None for a running stick, for any other ``firmware``, or when the installed
    image is missing or invalid (the driver's open then says how to install it)."""
    if mode != "bootloader":
        return None
    try:
        return bytes(firmware) if isinstance(firmware, (bytes, bytearray)) else \
            fw.load_installed() if firmware is None else None
    except FirmwareError:
        return None


def _attempt_open(dev: UsbEdgeTpu, rec: RecordingBackend, stand_in: bool) -> _OpenAttempt:
    """Run the driver's open, timing it and marking its transfers; a
    :class:`DeviceError` is kept in the result rather than raised.  With the
    stand-in image the driver's warning that it is not Google's is silenced
    (the report says so itself)."""
    start = rec.mark()
    quiet = _NotPinned() if stand_in else None
    usb_log = logging.getLogger("coralrt.usb")
    if quiet is not None:
        usb_log.addFilter(quiet)
    t0 = time.perf_counter()
    error: DeviceError | None = None
    try:
        dev.open()
    except DeviceError as e:
        error = e
    finally:
        if quiet is not None:
            usb_log.removeFilter(quiet)
    t1 = time.perf_counter()
    stop = rec.mark()
    vendor = rec.vendor(start, stop)
    t_chip = vendor[0].seconds if vendor else t1
    return _OpenAttempt(error, start, stop, t0, t1, vendor, t_chip)


def _devices_after_open(rec: RecordingBackend, info) -> tuple[list, list]:
    """The sticks enumerated after the open (none when listing fails), and those
    of them running their firmware at the opened stick's port path."""
    try:
        after = list_devices(rec)
    except DeviceError:
        after = []
    here = [d for d in after if info.port_path and d.port_path == info.port_path]
    return after, [d for d in here if d.mode == "running"]


def _report_download(report: Report, rec: RecordingBackend, mode: str, image, stand_in: bool,
                     attempt: _OpenAttempt, running_here: list) -> bool:
    """Report the firmware download (skipped for a stick already running its
    firmware) and return whether it failed: the open raised a FirmwareError, or
    it raised anything and no running stick came back at the same port."""
    error = attempt.error
    dl_failed = isinstance(error, FirmwareError)
    if mode == "running":
        report.add(skipped("firmware-download", "the stick already runs its firmware "
                           "(18d1:9302): nothing to download; unplug and replug it to test "
                           "the download too"))
        return dl_failed
    blocks = rec.count(C.DFU_OUT, C.DFU_DNLOAD, attempt.start, attempt.stop)
    uploads = rec.count(C.DFU_IN, C.DFU_UPLOAD, attempt.start, attempt.stop)
    seconds = attempt.t_chip - attempt.t0
    m = {"bytes": len(image) if image else None,
         "sha256": fw.sha256(image) if image else None,
         "google_image": bool(image) and fw.sha256(image) == fw.FIRMWARE_SHA256,
         "stand_in_image": stand_in, "dnload_requests": blocks,
         "upload_requests": uploads, "seconds": round(seconds, 4)}
    what = " (the simulated stick's stand-in image, not Google's)" if stand_in else ""
    if dl_failed or (error is not None and not running_here):
        report.add(fail("firmware-download", str(error), **m))
        return True
    report.add(ok("firmware-download",
                  f"{m['bytes']:,} bytes{what} in {blocks} DFU requests, read back "
                  f"and compared, in {seconds:.2f} s", **m))
    return False


def _report_reenumeration(report: Report, info, mode: str, after: list, running_here: list,
                          dl_failed: bool) -> None:
    """Report whether the stick came back as 18d1:9302 at the same port path, after
    the firmware download or after the port reset of a running stick."""
    cause = "the firmware download" if mode == "bootloader" else "the port reset"
    if not info.port_path:
        report.add(skipped("re-enumeration", "the USB backend reports no port numbers, so "
                           "the port path cannot be compared"))
    elif running_here:
        d = running_here[0]
        report.usb["after_open"] = {"ids": _IDS["running"], "mode": "running",
                                    "address": d.address, "speed": d.usb_speed}
        report.add(ok("re-enumeration", f"after {cause}, seen as 18d1:9302 at the same "
                      f"port path {info.port_path}", port_path=d.port_path,
                      address_before=info.address, address_after=d.address))
    elif dl_failed:
        report.add(skipped("re-enumeration", "the firmware download failed"))
    else:
        elsewhere = [d.port_path for d in after if d.mode == "running"]
        report.add(fail("re-enumeration", f"after {cause} no 18d1:9302 device at "
                        f"{info.port_path}" + (f" (running sticks at {', '.join(elsewhere)})"
                                               if elsewhere else ""),
                        running_elsewhere=elsewhere))


def _report_not_brought_up(report: Report, error: DeviceError, dl_failed: bool) -> None:
    """Report a failed open: the bring-up fails (or is skipped when the download
    already failed), and the checks that need a running stick are skipped."""
    if dl_failed:
        report.add(skipped("bring-up", "the firmware download failed"))
    else:
        report.add(fail("bring-up", str(error)))
    report.add(skipped("register-readback", "the stick was not brought up"))
    report.add(skipped("usb-speed", "the stick was not brought up"))


def _report_bring_up(report: Report, dev: UsbEdgeTpu, attempt: _OpenAttempt, trace) -> None:
    """Report the bring-up of an opened stick: its register writes beside those of
    libedgetpu's recorded open ``trace``."""
    vendor, t_chip, t1 = attempt.vendor, attempt.t_chip, attempt.t1
    cmp = compare_with_trace(vendor, trace)
    writes = sum(1 for t in vendor if t.request_type == C.REQ_TYPE_WRITE)
    m = {"seconds": round(t1 - t_chip, 4), "register_writes": writes,
         "writes_as_in_trace": cmp["writes_as_in_trace"],
         "write_differences": cmp["write_differences"],
         "explained_writes": cmp["explained_writes"], "chip_info": dict(dev.chip_info)}
    if cmp["writes_as_in_trace"]:
        report.add(ok("bring-up", f"chip brought up in {t1 - t_chip:.3f} s: {writes} register "
                      f"writes, those of libedgetpu's recorded open (plus "
                      f"{cmp['explained_writes']} of its EnableReset)", **m))
    else:
        report.add(fail("bring-up", "the open wrote registers differently from libedgetpu's "
                        "open: " + "; ".join(cmp["write_differences"][:3]), **m))


def _readback(vendor) -> dict:
    """The registers the open read before writing them, beside the reset values the
    simulated chip assumes (:mod:`coralrt._sim.stick.chip`).  The check is ``ok`` when
    the reads answered (the open would have failed otherwise); a difference says the
    simulated chip's model is wrong about a real stick, which is worth reporting,
    not that this stick is broken."""
    from coralrt._sim.stick.chip import RESET_VALUES

    first: dict[int, int] = {}
    written: set[int] = set()
    for t in vendor:
        if t.request_type == C.REQ_TYPE_WRITE:
            written.add(t.register)
        elif t.register not in written:
            first.setdefault(t.register, t.number)
    rows = [{"register": f"{reg:#x}", "model": f"{want:#x}", "read": f"{first[reg]:#x}",
             "equal": first[reg] == want}
            for reg, want in sorted(RESET_VALUES.items()) if reg in first]
    bad = [r for r in rows if not r["equal"]]
    if not bad:
        return ok("register-readback", f"{len(first)} registers read during the open; the "
                  f"{len(rows)} with a modelled reset value hold it", registers=rows)
    shown = "; ".join(f"{r['register']} read {r['read']}, model {r['model']}" for r in bad[:3])
    return ok("register-readback", f"{len(first)} registers read during the open; "
              f"{len(bad)} of {len(rows)} differ from the simulated chip's reset values "
              f"({shown}): please send this report", registers=rows, model_differences=bad)


def _speed(report: Report, rec, info, speed: str):
    m: dict = {"speed": speed}
    try:
        d = find_at_port(rec, info, C.APP_ID)
        if d is not None:
            cfg = d[0]
            eps = [{"address": f"{e.bEndpointAddress:#04x}", "max_packet": e.wMaxPacketSize,
                    "type": ("control", "isochronous", "bulk", "interrupt")[e.bmAttributes & 3]}
                   for e in cfg[(0, 0)]]
            # From USB 3 on, bMaxPacketSize0 is an exponent (9: 512 bytes).
            ep0 = 1 << d.bMaxPacketSize0 if d.bcdUSB >= 0x0300 else d.bMaxPacketSize0
            m.update(bcdUSB=f"{d.bcdUSB:#06x}", max_packet_ep0=ep0, endpoints=eps)
    except (CoralRTError, OSError, IndexError, KeyError, NotImplementedError) as e:
        m["descriptor_error"] = str(e)
    report.usb.update({k: m[k] for k in ("speed", "bcdUSB", "max_packet_ep0", "endpoints")
                       if k in m})
    bulk = sorted({e["max_packet"] for e in m.get("endpoints", []) if e["type"] == "bulk"})
    m["bulk_max_packet"] = bulk
    text = _SPEED_TEXT.get(speed, speed)
    want = _BULK_PACKET.get(speed)
    if speed in ("usb1", "unknown"):
        return fail("usb-speed", f"{text}: libedgetpu needs USB 2 or USB 3", **m)
    if want is not None and bulk and bulk != [want]:
        return fail("usb-speed", f"{text} but bulk endpoints of {bulk} bytes (expected {want})",
                    **m)
    note = "" if speed == "usb3" else "; works, but inference is several times slower than " \
                                      "on a USB 3 port"
    packets = f", bulk packets of {bulk[0]} bytes" if bulk else ""
    ep0 = m.get("max_packet_ep0", "?")
    return ok("usb-speed", f"{text}{packets}, control packets of {ep0} bytes{note}", **m)


def _chip_skipped(report: Report, models_dir, download, models, base_url) -> None:
    found = M.resolve_models(models_dir, download=download, models=models, base_url=base_url) \
        if (models_dir is not None or download) else [
            {"model": m, "compiled": None} for m in models]
    report.add(skipped("parameter-caching", CHIP_REASON, needs_chip=True))
    for e in found:
        report.add(skipped(f"model:{short_name(e['model'].compiled)}", CHIP_REASON,
                           needs_chip=True,
                           file=None if e["compiled"] is None else str(e["compiled"])))


