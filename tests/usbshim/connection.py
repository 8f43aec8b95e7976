"""One client of the :class:`~usbshim.server.StickServer` (one libusb context of
one process): its socket, its reader thread, and the synchronous requests it
makes (device list, open and close, configuration, interfaces, reset, control
transfers).  Its transfers are in :mod:`usbshim.transfers`."""

from __future__ import annotations

import array
import errno
import itertools
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import usb.core

from usbshim.descriptors import raw_configuration, raw_device
from usbshim.transfers import Transfers
from usbshim.wire import (CALLS, ERROR_NAMES, KIND_REPLY, OP_ATTACH_KERNEL_DRIVER, OP_CANCEL,
                          OP_CLAIM, OP_CLEAR_HALT, OP_CLOSE, OP_CONTROL, OP_DETACH_KERNEL_DRIVER,
                          OP_DEVICE_LIST, OP_GET_CONFIGURATION, OP_HELLO, OP_KERNEL_DRIVER_ACTIVE,
                          OP_OPEN, OP_RELEASE, OP_RESET, OP_SET_ALT, OP_SET_CONFIGURATION,
                          OP_SUBMIT, REPLY, REQUEST, expected, libusb_error)

if TYPE_CHECKING:
    from usbshim.server import StickServer


class Device:
    __slots__ = ("dev", "bus", "address")

    def __init__(self, dev, bus: int, address: int):
        self.dev, self.bus, self.address = dev, bus, address


class Open:
    """A handle the client opened."""

    __slots__ = ("key", "handle", "device")

    def __init__(self, key: int, handle, device: Device):
        self.key, self.handle, self.device = key, handle, device


class Connection:
    """One client (one libusb context of one process)."""

    def __init__(self, server: StickServer, sock: socket.socket):
        self.server, self.sock = server, sock
        self.backend = server.backend
        self.pid: int | None = None
        self._send_lock = threading.Lock()
        self.lock = threading.Lock()
        self._keys = itertools.count(1)
        self.devices: dict[int, Device] = {}
        self._device_keys: dict[tuple[int, int], int] = {}
        self.handles: dict[int, Open] = {}
        self.transfers = Transfers(self)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="usbshim-call")
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True, name="usbshim-conn")

    def start(self) -> None:
        self._thread.start()

    def shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._closed.is_set() or self.server._stopping.is_set()

    def log(self, call, **fields) -> None:
        self.server.log(call, pid=self.pid, **fields)

    # -- socket ------------------------------------------------------------------------------

    def _recv(self, n: int) -> bytes | None:
        chunks, left = [], n
        while left:
            try:
                chunk = self.sock.recv(min(left, 1 << 20))
            except OSError:
                return None
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def send(self, kind: int, rid: int, result: int, actual: int = 0, error: int = 0,
             payload: bytes = b"") -> None:
        head = REPLY.pack(REPLY.size - 4 + len(payload), kind, rid, result, actual, error, 0)
        try:
            with self._send_lock:
                self.sock.sendall(head + payload if len(payload) < 65536 else head)
                if len(payload) >= 65536:
                    self.sock.sendall(payload)
        except OSError:
            pass            # the client is gone; its reader cleans up

    def _read(self) -> None:
        try:
            while True:
                head = self._recv(4)
                if head is None:
                    break
                (length,) = struct.unpack("<I", head)
                if length < REQUEST.size:
                    self.log("protocol_error", detail=f"request of {length} bytes")
                    break
                body = self._recv(length)
                if body is None:
                    break
                op, rid, *args = REQUEST.unpack_from(body)
                self._dispatch(op, rid, args, body[REQUEST.size:])
        finally:
            self._teardown()

    def _dispatch(self, op: int, rid: int, args: list[int], payload: bytes) -> None:
        if op == OP_HELLO:
            self.pid = args[0]
            self.send(KIND_REPLY, rid, 0)
            self.log("libusb_init", id=rid, status="LIBUSB_SUCCESS", detail="connected")
        elif op == OP_SUBMIT:
            self.transfers.submit(rid, args, payload)
        elif op == OP_CANCEL:
            self.transfers.cancel(rid, args[0])
        elif op in CALLS:
            try:
                self._pool.submit(self._call, op, rid, args, payload)
            except RuntimeError:        # shutting down
                self.send(KIND_REPLY, rid, -4)
        else:
            self.send(KIND_REPLY, rid, -12)
            self.log("unknown_request", id=rid, status=ERROR_NAMES[-12], detail=f"op {op}")

    def _teardown(self) -> None:
        self._closed.set()
        with self.lock:
            endpoints = self.transfers.take_endpoints()
            handles = list(self.handles.values())
            self.handles.clear()
        for ep in endpoints:
            ep.close()
        for ep in endpoints:
            ep.thread.join(timeout=2)
        for o in handles:
            try:
                self.backend.close_device(o.handle)
            except Exception as e:  # noqa: BLE001 - a backend that fails on close
                if not expected(e):
                    self.server._failure("close_device at disconnect", e)
        self._pool.shutdown(wait=False)
        try:
            self.sock.close()
        except OSError:
            pass
        self.log("disconnect", detail=f"{len(handles)} handle(s) left open were closed")
        self.server._forget(self)

    # -- synchronous requests ----------------------------------------------------------------

    def _call(self, op: int, rid: int, args: list[int], payload: bytes) -> None:
        name = CALLS[op]
        fields: dict = {}
        data = b""
        try:
            result, data, fields = self._answer(op, args, payload)
            status = ERROR_NAMES.get(result, "LIBUSB_ERROR_OTHER") if result < 0 \
                else "LIBUSB_SUCCESS"
        except Exception as e:  # noqa: BLE001 - every failure becomes a libusb error
            result = libusb_error(e)
            status = ERROR_NAMES[result]
            fields["detail"] = f"{type(e).__name__}: {e}"
            if not expected(e):
                self.server._failure(name, e)
        self.send(KIND_REPLY, rid, result, 0, 0, data)
        self.log(name, id=rid, status=status, **fields)

    def _open(self, key: int) -> Open:
        o = self.handles.get(key)
        if o is None:
            raise usb.core.USBError("unknown or closed handle", -4, errno.ENODEV)
        return o

    def _answer(self, op: int, args: list[int], payload: bytes) -> tuple[int, bytes, dict]:
        b = self.backend
        if op == OP_DEVICE_LIST:
            return self._device_list()
        if op == OP_OPEN:
            device = self.devices.get(args[1])
            if device is None:
                return -4, b"", {"detail": f"unknown device {args[1]}"}
            handle = b.open_device(device.dev)
            with self.lock:
                key = next(self._keys)
                self.handles[key] = Open(key, handle, device)
            return key, b"", {"handle": key,
                              "detail": f"bus {device.bus} address {device.address}"}
        o = self._open(args[0])
        h, fields = o.handle, {"handle": o.key}
        if op == OP_CLOSE:
            self._close(o)
            return 0, b"", fields
        if op == OP_SET_CONFIGURATION:
            b.set_configuration(h, args[1])
        elif op == OP_GET_CONFIGURATION:
            return int(b.get_configuration(h)), b"", fields
        elif op == OP_CLAIM:
            b.claim_interface(h, args[1])
        elif op == OP_RELEASE:
            b.release_interface(h, args[1])
        elif op == OP_SET_ALT:
            b.set_interface_altsetting(h, args[1], args[2])
        elif op == OP_CLEAR_HALT:
            b.clear_halt(h, args[1])
            fields["ep"] = args[1]
        elif op == OP_KERNEL_DRIVER_ACTIVE:
            return int(bool(b.is_kernel_driver_active(h, args[1]))), b"", fields
        elif op == OP_DETACH_KERNEL_DRIVER:
            b.detach_kernel_driver(h, args[1])
        elif op == OP_ATTACH_KERNEL_DRIVER:
            b.attach_kernel_driver(h, args[1])
        elif op == OP_RESET:
            return self._reset(o), b"", fields
        elif op == OP_CONTROL:
            return self._control(o, args, payload)
        return 0, b"", fields

    def _device_list(self) -> tuple[int, bytes, dict]:
        b = self.backend
        records = []
        for dev in b.enumerate_devices():
            try:
                d = b.get_device_descriptor(dev)
            except usb.core.USBError:
                continue        # left while being listed
            bus, address = int(d.bus), int(d.address)
            with self.lock:
                key = self._device_keys.get((bus, address))
                if key is None:
                    key = self._device_keys[(bus, address)] = next(self._keys)
                self.devices[key] = Device(dev, bus, address)
            configs = []
            for i in range(d.bNumConfigurations):
                try:
                    configs.append(raw_configuration(b, dev, i))
                except (IndexError, usb.core.USBError):
                    break
            ports = tuple(getattr(d, "port_numbers", None) or ())
            if not ports and getattr(d, "port_number", None):
                ports = (d.port_number,)
            record = struct.pack("<qBBBB7s18sB", key, bus, address, int(d.speed or 0),
                                 len(ports[:7]), bytes(ports[:7]), raw_device(d), len(configs))
            records.append(record + b"".join(struct.pack("<H", len(c)) + c for c in configs))
        detail = ", ".join(f"{r[8]}-{r[12]}@{r[9]}" for r in records) or "none"
        return len(records), b"".join(records), {"actual": len(records),
                                                 "detail": f"bus-port@address: {detail}"}

    def _close(self, o: Open) -> None:
        with self.lock:
            self.handles.pop(o.key, None)
            endpoints = self.transfers.take_endpoints(o.key)
        for ep in endpoints:
            ep.close()
        self.backend.close_device(o.handle)

    def _reset(self, o: Open) -> int:
        """Port reset; NOT_FOUND when the device came back as another one (it
        re-enumerated at a new address, or has not come back yet), as libusb says."""
        b = self.backend
        b.reset_device(o.handle)
        for dev in b.enumerate_devices():
            try:
                d = b.get_device_descriptor(dev)
            except usb.core.USBError:
                continue
            if (int(d.bus), int(d.address)) == (o.device.bus, o.device.address):
                return 0
        return -5

    def _control(self, o: Open, args: list[int], payload: bytes) -> tuple[int, bytes, dict]:
        rtype, request, value, index, length, timeout = args[1:7]
        fields = {"handle": o.key, "ep": 0, "length": length,
                  "detail": f"bmRequestType={rtype:#04x} bRequest={request} "
                            f"wValue={value:#06x} wIndex={index:#06x}"}
        if rtype & 0x80:
            buf = array.array("B", bytes(length))
            n = self.backend.ctrl_transfer(o.handle, rtype, request, value, index, buf, timeout)
            data = bytes(buf[:n])
        else:
            buf = array.array("B", payload[:length])
            n = self.backend.ctrl_transfer(o.handle, rtype, request, value, index, buf, timeout)
            data = b""
        fields["actual"] = int(n)
        return int(n), data, fields
