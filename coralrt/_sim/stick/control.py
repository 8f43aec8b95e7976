"""A simulated stick's answers to control requests on endpoint 0.

:func:`answer_control` takes one request, after :meth:`SimulatedStick.control
<coralrt._sim.stick.stick.SimulatedStick.control>` has checked the handle and
fired any injected fault, and returns the data stage of an IN request (``b""``
for OUT requests).  Standard requests answer from the descriptors
(:mod:`coralrt._sim.stick.descriptors`); DFU class requests reach the
bootloader's :class:`~coralrt._sim.stick.dfu.DfuMachine`, apart from DETACH,
which a running stick accepts; vendor requests read and write the chip's
registers (:mod:`coralrt._sim.stick.chip`, reference §1.5), in running mode only.  Whatever a stick does not
support stalls (USBError EPIPE).  Each request is recorded in the transcript.
"""

from __future__ import annotations

import errno

from coralrt._sim.stick import descriptors as desc
from coralrt._sim.stick.dfu import REQUEST_NAMES, DfuStall
from coralrt._sim.stick.usb_errors import usb_error
from coralrt._usb.constants import (
    DFU_DETACH, DFU_DNLOAD, DFU_GETSTATE, DFU_GETSTATUS, DFU_OUT, DFU_UPLOAD, REQ_REG32,
    REQ_REG64,
)

__all__ = ["answer_control"]


def answer_control(stick, rtype: int, request: int, value: int, index: int,
                   mv: memoryview) -> bytes:
    """What ``stick`` answers to a control request (``mv``: its data stage)."""
    kind = (rtype >> 5) & 3
    if kind == 0:
        return _standard(stick, rtype, request, value, index, mv)
    if kind == 1:
        return _dfu(stick, rtype, request, value, index, mv)
    if kind == 2:
        return _register(stick, rtype, request, value, index, mv)
    raise usb_error(errno.EPIPE, f"reserved request type {rtype:#x}")


def _standard(stick, rtype, request, value, index, mv) -> bytes:
    stick._record("ctrl", request_type=rtype, request=request, value=value, index=index,
                  length=len(mv))
    if rtype == 0x80 and request == 6:           # GET_DESCRIPTOR
        kind, i = value >> 8, value & 0xFF
        if kind == 1:
            return desc.raw_device(stick.descriptor())
        if kind == 2 and i == 0:
            return desc.raw_configuration(stick.config())
        if kind == 3:
            serial = f"SIM{stick.index:04d}"
            text = desc.string_descriptor(stick.mode, i, serial)
            if text is not None:
                return text
    elif rtype == 0x80 and request == 0:         # GET_STATUS
        return b"\0\0"
    elif rtype == 0x80 and request == 8:         # GET_CONFIGURATION
        return bytes([stick.configuration])
    elif rtype == 0x00 and request == 9 and value in (0, 1):   # SET_CONFIGURATION
        stick.configuration = value
        return b""
    elif rtype in (0x01, 0x02) and request in (1, 11):   # CLEAR_FEATURE, SET_INTERFACE
        return b""
    raise usb_error(errno.EPIPE, f"standard request {rtype:#x}/{request} "
                                 f"wValue={value:#x} is not supported")


def _dfu(stick, rtype, request, value, index, mv) -> bytes:
    name = REQUEST_NAMES.get(request, str(request))
    if stick.mode == "running":
        if rtype == DFU_OUT and request == DFU_DETACH:   # from application mode
            stick.detach_pending = True
            stick._record("dfu_detach", value=value)
            return b""
        raise usb_error(errno.EPIPE, f"DFU {name} in running mode")
    data_in = request in (DFU_UPLOAD, DFU_GETSTATUS, DFU_GETSTATE)
    if (rtype & 0x80) != (0x80 if data_in else 0) or index != 0:
        stick._record(f"dfu_{name}", error="bad direction or interface")
        raise usb_error(errno.EPIPE, f"DFU {name} with bmRequestType {rtype:#x} "
                                     f"wIndex {index}")
    data = bytes(mv) if not rtype & 0x80 else b""
    machine = stick.dfu
    try:
        reply = machine.request(request, value, len(mv), data)
    except DfuStall as e:
        stick._record(f"dfu_{name}", value=value, length=len(mv), state=machine.state,
                      error=str(e))
        raise usb_error(errno.EPIPE, f"DFU: {e}") from None
    fields = dict(value=value, length=len(mv), state=machine.state, status=machine.status)
    if request == DFU_DNLOAD:
        fields["block"] = value
    elif request == DFU_UPLOAD:
        fields["length"] = len(reply)
    stick._record(f"dfu_{name}", **fields)
    return reply or b""


def _register(stick, rtype, request, value, index, mv) -> bytes:
    if stick.mode != "running":
        raise usb_error(errno.EPIPE, "register access in bootloader mode")
    width = {REQ_REG64: 8, REQ_REG32: 4}.get(request)
    register = (index << 16) | value
    if width is None or len(mv) != width:
        raise usb_error(errno.EPIPE, f"vendor request {request} with wLength {len(mv)} "
                                     f"(registers: bRequest 0 = 8 bytes, 1 = 4 bytes)")
    if rtype & 0x80:
        word = stick.registers.read(register) & ((1 << 8 * width) - 1)
        stick._record("read", register=register, value=word, length=width)
        return word.to_bytes(width, "little")
    word = int.from_bytes(mv, "little")
    dropped = stick.registers.write(register, word)      # why the chip ignored it, or None
    stick._record("write", register=register, value=word, length=width,
                  **({"dropped": dropped} if dropped else {}))
    return b""
