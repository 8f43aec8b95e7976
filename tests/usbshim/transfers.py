"""The transfers of one connection: one FIFO per (handle, endpoint), served by
one worker thread, so transfers on an endpoint complete in the order they were
submitted (README.md: "How calls are served").

An IN transfer waits for data quietly (the stick's ``wait_for_in_data``: no
transcript entry, no fault counted) until data is there, it is cancelled, its
timeout passes or the server stops; then, unless it was cancelled, it makes
exactly one real ``bulk_read``/``intr_read``, so the stick records one transfer
per libusb transfer.
"""

from __future__ import annotations

import array
import struct
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from usbshim.wire import (BULK, CANCELLED, COMPLETED, CONTROL, ERROR, ERROR_NAMES, INTERRUPT,
                          KIND_COMPLETION, KIND_REPLY, NO_DEVICE, STATUS_NAMES, STATUS_OF_ERROR,
                          TIMED_OUT, expected, libusb_error)

if TYPE_CHECKING:
    from usbshim.connection import Connection


class Transfer:
    __slots__ = ("id", "open", "ep", "type", "length", "timeout", "flags", "sync", "payload",
                 "submitted", "cancelled", "running", "endpoint")

    def __init__(self, tid, open_, ep, type_, length, timeout, flags, sync, payload):
        self.id, self.open, self.ep, self.type = tid, open_, ep, type_
        self.length, self.timeout, self.flags, self.sync = length, timeout, flags, sync
        self.payload = payload
        self.submitted = time.monotonic()
        self.cancelled = False
        self.running = False
        self.endpoint: Endpoint | None = None

    @property
    def deadline(self) -> float | None:
        return self.submitted + self.timeout / 1000.0 if self.timeout else None


class Endpoint:
    """The FIFO of one (handle, endpoint) and the one worker that serves it."""

    def __init__(self, transfers: Transfers, key: tuple[int, int]):
        self.transfers, self.key = transfers, key
        self.cond = threading.Condition()
        self.queue: deque[Transfer] = deque()
        self.closed = False
        self.thread = threading.Thread(target=self._serve, daemon=True,
                                       name=f"usbshim-ep-{key[0]}-{key[1]:#04x}")
        self.thread.start()

    def put(self, tr: Transfer) -> None:
        with self.cond:
            tr.endpoint = self
            self.queue.append(tr)
            self.cond.notify()

    def cancel(self, tr: Transfer) -> bool:
        """Cancel ``tr``: at once if it waits in the queue, else at the worker's next
        look.  False if it is no longer here."""
        with self.cond:
            if tr not in self.queue:
                return False
            tr.cancelled = True
            if tr.running:
                return True
            self.queue.remove(tr)
        self.transfers.complete(tr, CANCELLED, detail="cancelled while queued")
        return True

    def close(self) -> None:
        """Cancel everything queued (the transfer under way finishes as cancelled)."""
        with self.cond:
            self.closed = True
            waiting = [tr for tr in self.queue if not tr.running]
            for tr in self.queue:
                tr.cancelled = True
            for tr in waiting:
                self.queue.remove(tr)
            self.cond.notify_all()
        for tr in waiting:
            self.transfers.complete(tr, CANCELLED, detail="handle closed")

    def _serve(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait(0.5)
                if not self.queue:
                    return
                tr = self.queue[0]
                tr.running = True
            status, actual, error, data, detail = self.transfers.perform(tr)
            with self.cond:
                if self.queue and self.queue[0] is tr:
                    self.queue.popleft()
            self.transfers.complete(tr, status, actual, error, data, detail)


class Transfers:
    """The transfers of one connection, by id, and its endpoints' FIFOs.  They
    share the connection's ``lock`` (which also guards its handles)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.lock = conn.lock
        self.endpoints: dict[tuple[int, int], Endpoint] = {}
        self.by_id: dict[int, Transfer] = {}

    def take_endpoints(self, handle: int | None = None) -> list[Endpoint]:
        """Remove the endpoints of ``handle`` (all of them when None) and return them,
        for the caller to close.  The caller holds ``lock``."""
        taken = [ep for key, ep in self.endpoints.items() if handle is None or key[0] == handle]
        for ep in taken:
            del self.endpoints[ep.key]
        return taken

    def submit(self, rid: int, args: list[int], payload: bytes) -> None:
        conn = self.conn
        hkey, ep, type_, length, timeout, flags, sync = args[:7]
        ep &= 0xFF
        fields = {"id": rid, "handle": hkey, "ep": ep, "length": length,
                  "detail": f"type={type_} timeout={timeout}" + (" sync" if sync else "")}
        with self.lock:
            o = conn.handles.get(hkey)
        code = 0
        if o is None:
            code = -4
        elif type_ not in (CONTROL, BULK, INTERRUPT):
            code = -12
        if code:
            if sync:
                conn.send(KIND_COMPLETION, rid, STATUS_OF_ERROR.get(code, ERROR), 0, code)
            else:
                conn.send(KIND_REPLY, rid, code)
            conn.log("libusb_submit_transfer", status=ERROR_NAMES[code], **fields)
            return
        tr = Transfer(rid, o, ep if type_ != CONTROL else 0, type_, length, timeout, flags,
                      sync, payload)
        if not sync:
            conn.send(KIND_REPLY, rid, 0)       # the ack goes out before any completion
        key = (hkey, tr.ep)
        with self.lock:
            self.by_id[rid] = tr
            endpoint = self.endpoints.get(key)
            if endpoint is None:
                endpoint = self.endpoints[key] = Endpoint(self, key)
        endpoint.put(tr)
        conn.log("libusb_submit_transfer", status="LIBUSB_SUCCESS", **fields)

    def cancel(self, rid: int, tid: int) -> None:
        with self.lock:
            tr = self.by_id.get(tid)
        found = tr is not None and tr.endpoint is not None and tr.endpoint.cancel(tr)
        code = 0 if found else -5
        self.conn.send(KIND_REPLY, rid, code)
        self.conn.log("libusb_cancel_transfer", id=tid, status=ERROR_NAMES[code],
                      ep=tr.ep if tr else None, handle=tr.open.key if tr else None)

    def complete(self, tr: Transfer, status: int, actual: int = 0, error: int = 0,
                 data: bytes = b"", detail: str | None = None) -> None:
        with self.lock:
            if self.by_id.pop(tr.id, None) is None:
                return          # completed already
        self.conn.send(KIND_COMPLETION, tr.id, status, actual, error, data)
        self.conn.log("transfer_done", id=tr.id, handle=tr.open.key, ep=tr.ep,
                      length=tr.length, actual=actual,
                      status=STATUS_NAMES.get(status, str(status)), detail=detail)

    def perform(self, tr: Transfer):
        """Run ``tr`` on the backend: (status, actual, error, data, detail)."""
        if tr.cancelled:
            return CANCELLED, 0, 0, b"", None
        deadline = tr.deadline
        if deadline is not None and time.monotonic() >= deadline:
            return TIMED_OUT, 0, 0, b"", "timed out in the queue"
        b, h = self.conn.backend, tr.open.handle
        try:
            if tr.type == CONTROL:
                rtype, request, value, index, wlength = struct.unpack_from("<BBHHH", tr.payload)
                if rtype & 0x80:
                    buf = array.array("B", bytes(wlength))
                else:
                    buf = array.array("B", tr.payload[8:8 + wlength])
                n = b.ctrl_transfer(h, rtype, request, value, index, buf, tr.timeout)
                data = bytes(buf[:n]) if rtype & 0x80 else b""
                return COMPLETED, int(n), 0, data, None
            if tr.ep & 0x80:
                why = self._wait_in(tr, deadline)
                if why == "cancelled":
                    return CANCELLED, 0, 0, b"", None
                if why == "stopping":
                    return NO_DEVICE, 0, -4, b"", "the server is stopping"
                left = 0 if deadline is None else max(1, int((deadline - time.monotonic()) * 1000))
                buf = array.array("B", bytes(tr.length))
                read = b.intr_read if tr.type == INTERRUPT else b.bulk_read
                n = read(h, tr.ep, 0, buf, left)
                return COMPLETED, int(n), 0, bytes(buf[:n]), None
            write = b.intr_write if tr.type == INTERRUPT else b.bulk_write
            n = write(h, tr.ep, 0, array.array("B", tr.payload), tr.timeout)
            return COMPLETED, int(n), 0, b"", None
        except Exception as e:  # noqa: BLE001 - every failure becomes a transfer status
            code = libusb_error(e)
            if not expected(e):
                self.conn.server._failure(f"transfer on endpoint {tr.ep:#04x}", e)
            return (STATUS_OF_ERROR.get(code, ERROR), 0, code, b"",
                    f"{type(e).__name__}: {e}")

    def _wait_in(self, tr: Transfer, deadline: float | None) -> str:
        """Wait until the IN transfer should make its read: "ready" (data, an error,
        or the deadline came), "cancelled" or "stopping"."""
        stick = getattr(tr.open.handle, "stick", None)
        wait = getattr(stick, "wait_for_in_data", None)
        if wait is None:
            return "ready"      # another backend: its read waits by itself
        while True:
            if tr.cancelled:
                return "cancelled"
            if self.conn.stopping:
                return "stopping"
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return "ready"  # the one real read then times out, as the stick records
            poll = self.conn.server.poll
            step = poll if deadline is None else min(poll, deadline - now)
            if wait(tr.open.handle, tr.ep, tr.length, step):
                return "ready"
