"""Serve a simulated Coral stick to native programs through the libusb shim.

``build_shim()`` compiles ``shim.c`` into a ``libusb-1.0.so.0``; a program that
finds it first (``LD_LIBRARY_PATH``, or pyusb's ``find_library``) sends every
libusb call over a Unix socket to a :class:`StickServer` running in a
background thread of the test process, which answers it with the pyusb-backend
methods of the backend it was given (a ``SimulatedBackend``)::

    backend = SimulatedBackend(firmware_loaded=False, transcript_limit=None)
    with StickServer(backend, log_path=tmp_path / "usb.jsonl") as server:
        subprocess.run([...], env=server.env(), timeout=60)
    backend.transcript  # what the stick saw

Bulk and interrupt transfers wait in one FIFO per (handle, endpoint), served by
one worker thread, so transfers on an endpoint complete in the order they were
submitted.  An IN transfer waits for data quietly (the stick's
``wait_for_in_data``: no transcript entry, no fault counted) until data is
there, it is cancelled, its timeout passes or the server stops; then, unless it
was cancelled, it makes exactly one real ``bulk_read``/``intr_read``, so the
stick records one transfer per libusb transfer.  README.md in this folder
describes the wire format and the log.
"""

from __future__ import annotations

import array
import errno
import hashlib
import itertools
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import usb.core

__all__ = ["StickServer", "build_shim", "find_compiler", "ShimBuildError", "LIBRARY"]

HERE = Path(__file__).resolve().parent
LIBRARY = "libusb-1.0.so.0"
_SOURCES = ("shim.c", "shim_abi.h")

# -- wire format (README.md) ----------------------------------------------------------------

_REQUEST = struct.Struct("<IQ8q")       # after the u32 length: op, id, args[8]
_REPLY = struct.Struct("<IIQiiii")      # length, kind, id, result, actual, error, spare
_KIND_REPLY, _KIND_COMPLETION = 1, 2

(OP_HELLO, OP_DEVICE_LIST, OP_OPEN, OP_CLOSE, OP_SET_CONFIGURATION, OP_GET_CONFIGURATION,
 OP_CLAIM, OP_RELEASE, OP_SET_ALT, OP_CLEAR_HALT, OP_RESET, OP_KERNEL_DRIVER_ACTIVE,
 OP_DETACH_KERNEL_DRIVER, OP_ATTACH_KERNEL_DRIVER, OP_CONTROL, OP_SUBMIT,
 OP_CANCEL) = range(1, 18)

#: The libusb function each request serves (the "call" of the server's log lines).
CALLS = {
    OP_HELLO: "libusb_init", OP_DEVICE_LIST: "libusb_get_device_list",
    OP_OPEN: "libusb_open", OP_CLOSE: "libusb_close",
    OP_SET_CONFIGURATION: "libusb_set_configuration",
    OP_GET_CONFIGURATION: "libusb_get_configuration",
    OP_CLAIM: "libusb_claim_interface", OP_RELEASE: "libusb_release_interface",
    OP_SET_ALT: "libusb_set_interface_alt_setting", OP_CLEAR_HALT: "libusb_clear_halt",
    OP_RESET: "libusb_reset_device", OP_KERNEL_DRIVER_ACTIVE: "libusb_kernel_driver_active",
    OP_DETACH_KERNEL_DRIVER: "libusb_detach_kernel_driver",
    OP_ATTACH_KERNEL_DRIVER: "libusb_attach_kernel_driver",
    OP_CONTROL: "libusb_control_transfer", OP_SUBMIT: "libusb_submit_transfer",
    OP_CANCEL: "libusb_cancel_transfer",
}

# -- libusb codes ------------------------------------------------------------------------------

ERROR_NAMES = {0: "LIBUSB_SUCCESS", -1: "LIBUSB_ERROR_IO", -2: "LIBUSB_ERROR_INVALID_PARAM",
               -3: "LIBUSB_ERROR_ACCESS", -4: "LIBUSB_ERROR_NO_DEVICE",
               -5: "LIBUSB_ERROR_NOT_FOUND", -6: "LIBUSB_ERROR_BUSY",
               -7: "LIBUSB_ERROR_TIMEOUT", -8: "LIBUSB_ERROR_OVERFLOW",
               -9: "LIBUSB_ERROR_PIPE", -10: "LIBUSB_ERROR_INTERRUPTED",
               -11: "LIBUSB_ERROR_NO_MEM", -12: "LIBUSB_ERROR_NOT_SUPPORTED",
               -99: "LIBUSB_ERROR_OTHER"}
COMPLETED, ERROR, TIMED_OUT, CANCELLED, STALL, NO_DEVICE, OVERFLOW = range(7)
STATUS_NAMES = {COMPLETED: "LIBUSB_TRANSFER_COMPLETED", ERROR: "LIBUSB_TRANSFER_ERROR",
                TIMED_OUT: "LIBUSB_TRANSFER_TIMED_OUT", CANCELLED: "LIBUSB_TRANSFER_CANCELLED",
                STALL: "LIBUSB_TRANSFER_STALL", NO_DEVICE: "LIBUSB_TRANSFER_NO_DEVICE",
                OVERFLOW: "LIBUSB_TRANSFER_OVERFLOW"}
_CONTROL, _ISOCHRONOUS, _BULK, _INTERRUPT = range(4)

#: errno value -> libusb error code (what libusb's Linux backend gives for it).
ERRNO_TO_LIBUSB = {errno.EIO: -1, errno.EINVAL: -2, errno.EACCES: -3, errno.EPERM: -3,
                   errno.ENODEV: -4, errno.ENXIO: -4, errno.ESHUTDOWN: -4, errno.ENOENT: -5,
                   errno.EBUSY: -6, errno.ETIMEDOUT: -7, errno.EOVERFLOW: -8,
                   errno.EPIPE: -9, errno.EINTR: -10, errno.ENOMEM: -11, errno.ENOSYS: -12}
#: libusb error code -> the status of a transfer that failed with it.
_STATUS_OF_ERROR = {-7: TIMED_OUT, -9: STALL, -4: NO_DEVICE, -8: OVERFLOW}


def libusb_error(exc: BaseException) -> int:
    """The libusb error code for an exception a pyusb backend raised."""
    if isinstance(exc, usb.core.USBTimeoutError):
        return -7
    if isinstance(exc, NotImplementedError):
        return -12
    if isinstance(exc, IndexError):       # a descriptor that does not exist
        return -5
    if isinstance(exc, OSError):
        code = ERRNO_TO_LIBUSB.get(exc.errno)
        if code is None:
            lib = getattr(exc, "backend_error_code", None)
            code = lib if isinstance(lib, int) and lib in ERROR_NAMES else None
        return code if code is not None else -99
    return -99


def _expected(exc: BaseException) -> bool:
    """Whether ``exc`` is one a USB backend raises on purpose (not a bug in it)."""
    return isinstance(exc, (OSError, NotImplementedError, IndexError))


# -- building the shim ----------------------------------------------------------------------

class ShimBuildError(RuntimeError):
    """The shim could not be compiled (no compiler, or the compiler failed)."""


def find_compiler() -> str | None:
    """The C compiler to use: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name:
            path = shutil.which(name)
            if path:
                return path
    return None


def _source_hash(compiler: str) -> str:
    h = hashlib.sha256(compiler.encode())
    for name in _SOURCES:
        h.update((HERE / name).read_bytes())
    return h.hexdigest()


def build_shim(dest_dir: str | os.PathLike | None = None) -> Path:
    """Compile the shim into ``dest_dir/libusb-1.0.so.0`` and return that path.

    Without ``dest_dir``: into a folder of the system's temporary directory named
    after the sources' hash, reused while the sources do not change (so a test
    session compiles once).  Raises :class:`ShimBuildError` naming what is missing
    when no C compiler is found, and with the compiler's messages when it fails.
    """
    cc = find_compiler()
    if cc is None:
        raise ShimBuildError(
            "cannot build the libusb shim: no C compiler found on PATH (looked for $CC, "
            "cc, gcc and clang); install one (Debian: apt-get install gcc)")
    digest = _source_hash(cc)
    if dest_dir is None:
        dest_dir = Path(tempfile.gettempdir()) / f"coralrt-usbshim-{os.getuid()}-{digest[:16]}"
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    out, stamp = dest / LIBRARY, dest / "sources.sha256"
    if out.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return out
    partial = dest / f".{LIBRARY}.{os.getpid()}.tmp"
    cmd = [cc, "-std=gnu11", "-shared", "-fPIC", "-O1", "-pthread", "-Wall",
           "-fvisibility=hidden", f"-Wl,-soname,{LIBRARY}", "-o", str(partial),
           str(HERE / "shim.c")]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ShimBuildError(f"cannot build the libusb shim: {' '.join(cmd)}: {e}") from e
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise ShimBuildError(f"cannot build the libusb shim: {' '.join(cmd)} exited with "
                             f"{done.returncode}:\n{done.stderr.strip()}")
    os.replace(partial, out)            # atomic: parallel test sessions may build too
    stamp.write_text(digest + "\n")
    return out


# -- descriptors as bytes ---------------------------------------------------------------------

def _raw_device(d) -> bytes:
    return struct.pack("<BBHBBBBHHHBBBB", 18, 1, d.bcdUSB, d.bDeviceClass, d.bDeviceSubClass,
                       d.bDeviceProtocol, d.bMaxPacketSize0, d.idVendor, d.idProduct,
                       d.bcdDevice, d.iManufacturer, d.iProduct, d.iSerialNumber,
                       d.bNumConfigurations)


def _raw_configuration(backend, dev, index: int) -> bytes:
    """Configuration ``index`` of ``dev`` as the bytes GET_DESCRIPTOR would return,
    built from the backend's descriptor objects (pyusb's attribute names)."""
    cfg = backend.get_configuration_descriptor(dev, index)
    body = bytes(getattr(cfg, "extra_descriptors", None) or b"")
    for number in range(cfg.bNumInterfaces):
        for alt in itertools.count():
            try:
                intf = backend.get_interface_descriptor(dev, number, alt, index)
            except (IndexError, usb.core.USBError):
                break
            body += struct.pack("<9B", 9, 4, intf.bInterfaceNumber, intf.bAlternateSetting,
                                intf.bNumEndpoints, intf.bInterfaceClass,
                                intf.bInterfaceSubClass, intf.bInterfaceProtocol,
                                intf.iInterface)
            body += bytes(getattr(intf, "extra_descriptors", None) or b"")
            for i in range(intf.bNumEndpoints):
                ep = backend.get_endpoint_descriptor(dev, i, number, alt, index)
                body += struct.pack("<BBBBHB", 7, 5, ep.bEndpointAddress, ep.bmAttributes,
                                    ep.wMaxPacketSize, ep.bInterval)
                body += bytes(getattr(ep, "extra_descriptors", None) or b"")
    power = getattr(cfg, "bMaxPower", getattr(cfg, "MaxPower", 0))
    head = struct.pack("<BBHBBBBB", 9, 2, 9 + len(body), cfg.bNumInterfaces,
                       cfg.bConfigurationValue, cfg.iConfiguration, cfg.bmAttributes, power)
    return head + body


# -- the server -------------------------------------------------------------------------------

class StickServer:
    """Serves ``backend`` (a pyusb backend, e.g. ``SimulatedBackend``) on a Unix socket.

    ``log_path``: the JSON-lines log both sides append to (README.md).
    ``socket_path``: where to listen (default: a new temporary folder).
    ``shim``: the built ``libusb-1.0.so.0`` (default: :func:`build_shim`'s, built
    when :meth:`env` first needs it).  ``max_wait``: CORALRT_USBSHIM_MAX_WAIT
    for the child (the shim's longest wait for an answer; None: its default, 30 s).
    ``poll``: how often a waiting IN transfer looks for a cancel, in seconds.

    :meth:`stop` (also at the end of ``with``) closes every connection: the
    clients' calls then fail with LIBUSB_ERROR_NO_DEVICE.  ``failures`` lists
    the unexpected exceptions (not USB errors) the backend raised, with their
    tracebacks, so that a test can assert there were none.
    """

    def __init__(self, backend, *, log_path: str | os.PathLike | None = None,
                 socket_path: str | os.PathLike | None = None,
                 shim: str | os.PathLike | None = None, max_wait: float | None = None,
                 poll: float = 0.05):
        self.backend = backend
        self.log_path = Path(log_path) if log_path is not None else None
        self.socket_path = Path(socket_path) if socket_path is not None else None
        self.shim = Path(shim) if shim is not None else None
        self.max_wait = max_wait
        self.poll = poll
        self.failures: list[str] = []
        self._tmp: str | None = None
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._stop_lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._log_fd: int | None = None

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> StickServer:
        if self._thread is not None:
            return self
        if self.socket_path is None:
            self._tmp = tempfile.mkdtemp(prefix="usbshim-")
            self.socket_path = Path(self._tmp) / "stick.sock"
        if self.log_path is not None:
            self._log_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._stopping.clear()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        listener.listen(16)
        listener.settimeout(0.1)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, name="usbshim-accept", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listening socket and every connection; wait for the threads.
        From the first moment, new clients cannot connect and connected ones see
        their connection closed (their calls fail with LIBUSB_ERROR_NO_DEVICE)."""
        with self._stop_lock:
            self._stop()

    def _stop(self) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        if self.socket_path is not None:
            try:
                self.socket_path.unlink()       # new connects fail at once
            except FileNotFoundError:
                pass
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.shutdown()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._thread = None
        self._listener.close()
        self._listener = None
        with self._lock:
            connections += [c for c in self._connections if c not in connections]
        for conn in connections:
            conn.shutdown()
            conn.join(timeout=5)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp, self.socket_path = None, None
        fd, self._log_fd = self._log_fd, None      # late log lines are dropped
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> StickServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def connections(self) -> int:
        """How many clients (libusb contexts) are connected now."""
        with self._lock:
            return len(self._connections)

    def env(self, base: dict | None = None) -> dict[str, str]:
        """Environment for a child that should use the shim: ``base`` (default
        ``os.environ``) without CORALRT_COMPAT* and USB_* variables, plus the socket
        (CORALRT_USBSHIM_SOCKET), the log (CORALRT_USBSHIM_LOG), the longest wait
        (CORALRT_USBSHIM_MAX_WAIT), the shim's path (CORALRT_USBSHIM_LIBRARY, for
        pyusb's ``find_library``) and LD_LIBRARY_PATH with the shim's folder first."""
        if not self.running:
            raise RuntimeError("start the server first (or use it as a context manager)")
        if self.shim is None:
            self.shim = build_shim()
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if not k.startswith(("USB_", "CORALRT_COMPAT", "CORALRT_USBSHIM_"))}
        env["CORALRT_USBSHIM_SOCKET"] = str(self.socket_path)
        env["CORALRT_USBSHIM_LIBRARY"] = str(self.shim)      # for pyusb's find_library
        if self.log_path is not None:
            env["CORALRT_USBSHIM_LOG"] = str(self.log_path)
        if self.max_wait is not None:
            env["CORALRT_USBSHIM_MAX_WAIT"] = str(self.max_wait)
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = str(self.shim.parent) + (f":{old}" if old else "")
        return env

    # -- internals ---------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            if self._stopping.is_set():
                sock.close()
                break
            sock.settimeout(None)
            conn = _Connection(self, sock)
            with self._lock:
                self._connections.add(conn)
            conn.start()

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _failure(self, where: str, exc: BaseException) -> None:
        text = f"{where}: {''.join(traceback.format_exception(exc)).rstrip()}"
        self.failures.append(text)
        self.log("server_failure", detail=text)

    def log(self, call: str, *, pid=None, id=None, handle=None, ep=None, length=None,
            actual=None, status=None, detail=None) -> None:
        """Append one line to the log (the same keys as the shim's lines)."""
        fd = self._log_fd
        if fd is None:
            return
        line = json.dumps({"t": round(time.monotonic(), 6), "side": "server", "pid": pid,
                           "call": call, "id": id, "handle": handle, "ep": ep,
                           "length": length, "actual": actual, "status": status,
                           "detail": detail})
        try:
            os.write(fd, (line + "\n").encode())     # one write per line (O_APPEND)
        except OSError:
            pass


class _Device:
    __slots__ = ("dev", "bus", "address")

    def __init__(self, dev, bus: int, address: int):
        self.dev, self.bus, self.address = dev, bus, address


class _Open:
    """A handle the client opened."""

    __slots__ = ("key", "handle", "device")

    def __init__(self, key: int, handle, device: _Device):
        self.key, self.handle, self.device = key, handle, device


class _Transfer:
    __slots__ = ("id", "open", "ep", "type", "length", "timeout", "flags", "sync", "payload",
                 "submitted", "cancelled", "running", "endpoint")

    def __init__(self, tid, open_, ep, type_, length, timeout, flags, sync, payload):
        self.id, self.open, self.ep, self.type = tid, open_, ep, type_
        self.length, self.timeout, self.flags, self.sync = length, timeout, flags, sync
        self.payload = payload
        self.submitted = time.monotonic()
        self.cancelled = False
        self.running = False
        self.endpoint: _Endpoint | None = None

    @property
    def deadline(self) -> float | None:
        return self.submitted + self.timeout / 1000.0 if self.timeout else None


class _Endpoint:
    """The FIFO of one (handle, endpoint) and the one worker that serves it."""

    def __init__(self, conn: _Connection, key: tuple[int, int]):
        self.conn, self.key = conn, key
        self.cond = threading.Condition()
        self.queue: deque[_Transfer] = deque()
        self.closed = False
        self.thread = threading.Thread(target=self._serve, daemon=True,
                                       name=f"usbshim-ep-{key[0]}-{key[1]:#04x}")
        self.thread.start()

    def put(self, tr: _Transfer) -> None:
        with self.cond:
            tr.endpoint = self
            self.queue.append(tr)
            self.cond.notify()

    def cancel(self, tr: _Transfer) -> bool:
        """Cancel ``tr``: at once if it waits in the queue, else at the worker's next
        look.  False if it is no longer here."""
        with self.cond:
            if tr not in self.queue:
                return False
            tr.cancelled = True
            if tr.running:
                return True
            self.queue.remove(tr)
        self.conn.complete(tr, CANCELLED, detail="cancelled while queued")
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
            self.conn.complete(tr, CANCELLED, detail="handle closed")

    def _serve(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait(0.5)
                if not self.queue:
                    return
                tr = self.queue[0]
                tr.running = True
            status, actual, error, data, detail = self.conn.perform(tr)
            with self.cond:
                if self.queue and self.queue[0] is tr:
                    self.queue.popleft()
            self.conn.complete(tr, status, actual, error, data, detail)


class _Connection:
    """One client (one libusb context of one process)."""

    def __init__(self, server: StickServer, sock: socket.socket):
        self.server, self.sock = server, sock
        self.backend = server.backend
        self.pid: int | None = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._keys = itertools.count(1)
        self.devices: dict[int, _Device] = {}
        self._device_keys: dict[tuple[int, int], int] = {}
        self.handles: dict[int, _Open] = {}
        self.endpoints: dict[tuple[int, int], _Endpoint] = {}
        self.transfers: dict[int, _Transfer] = {}
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
        head = _REPLY.pack(_REPLY.size - 4 + len(payload), kind, rid, result, actual, error, 0)
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
                if length < _REQUEST.size:
                    self.log("protocol_error", detail=f"request of {length} bytes")
                    break
                body = self._recv(length)
                if body is None:
                    break
                op, rid, *args = _REQUEST.unpack_from(body)
                self._dispatch(op, rid, args, body[_REQUEST.size:])
        finally:
            self._teardown()

    def _dispatch(self, op: int, rid: int, args: list[int], payload: bytes) -> None:
        if op == OP_HELLO:
            self.pid = args[0]
            self.send(_KIND_REPLY, rid, 0)
            self.log("libusb_init", id=rid, status="LIBUSB_SUCCESS", detail="connected")
        elif op == OP_SUBMIT:
            self._submit(rid, args, payload)
        elif op == OP_CANCEL:
            self._cancel(rid, args[0])
        elif op in CALLS:
            try:
                self._pool.submit(self._call, op, rid, args, payload)
            except RuntimeError:        # shutting down
                self.send(_KIND_REPLY, rid, -4)
        else:
            self.send(_KIND_REPLY, rid, -12)
            self.log("unknown_request", id=rid, status=ERROR_NAMES[-12], detail=f"op {op}")

    def _teardown(self) -> None:
        self._closed.set()
        with self._lock:
            endpoints = list(self.endpoints.values())
            handles = list(self.handles.values())
            self.endpoints.clear()
            self.handles.clear()
        for ep in endpoints:
            ep.close()
        for ep in endpoints:
            ep.thread.join(timeout=2)
        for o in handles:
            try:
                self.backend.close_device(o.handle)
            except Exception as e:  # noqa: BLE001 - a backend that fails on close
                if not _expected(e):
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
            if not _expected(e):
                self.server._failure(name, e)
        self.send(_KIND_REPLY, rid, result, 0, 0, data)
        self.log(name, id=rid, status=status, **fields)

    def _open(self, key: int) -> _Open:
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
            with self._lock:
                key = next(self._keys)
                self.handles[key] = _Open(key, handle, device)
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
            with self._lock:
                key = self._device_keys.get((bus, address))
                if key is None:
                    key = self._device_keys[(bus, address)] = next(self._keys)
                self.devices[key] = _Device(dev, bus, address)
            configs = []
            for i in range(d.bNumConfigurations):
                try:
                    configs.append(_raw_configuration(b, dev, i))
                except (IndexError, usb.core.USBError):
                    break
            ports = tuple(getattr(d, "port_numbers", None) or ())
            if not ports and getattr(d, "port_number", None):
                ports = (d.port_number,)
            record = struct.pack("<qBBBB7s18sB", key, bus, address, int(d.speed or 0),
                                 len(ports[:7]), bytes(ports[:7]), _raw_device(d), len(configs))
            records.append(record + b"".join(struct.pack("<H", len(c)) + c for c in configs))
        detail = ", ".join(f"{r[8]}-{r[12]}@{r[9]}" for r in records) or "none"
        return len(records), b"".join(records), {"actual": len(records),
                                                 "detail": f"bus-port@address: {detail}"}

    def _close(self, o: _Open) -> None:
        with self._lock:
            self.handles.pop(o.key, None)
            endpoints = [ep for key, ep in self.endpoints.items() if key[0] == o.key]
            for ep in endpoints:
                del self.endpoints[ep.key]
        for ep in endpoints:
            ep.close()
        self.backend.close_device(o.handle)

    def _reset(self, o: _Open) -> int:
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

    def _control(self, o: _Open, args: list[int], payload: bytes) -> tuple[int, bytes, dict]:
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

    # -- transfers ----------------------------------------------------------------------------

    def _submit(self, rid: int, args: list[int], payload: bytes) -> None:
        hkey, ep, type_, length, timeout, flags, sync = args[:7]
        ep &= 0xFF
        fields = {"id": rid, "handle": hkey, "ep": ep, "length": length,
                  "detail": f"type={type_} timeout={timeout}" + (" sync" if sync else "")}
        with self._lock:
            o = self.handles.get(hkey)
        code = 0
        if o is None:
            code = -4
        elif type_ not in (_CONTROL, _BULK, _INTERRUPT):
            code = -12
        if code:
            if sync:
                self.send(_KIND_COMPLETION, rid, _STATUS_OF_ERROR.get(code, ERROR), 0, code)
            else:
                self.send(_KIND_REPLY, rid, code)
            self.log("libusb_submit_transfer", status=ERROR_NAMES[code], **fields)
            return
        tr = _Transfer(rid, o, ep if type_ != _CONTROL else 0, type_, length, timeout, flags,
                       sync, payload)
        if not sync:
            self.send(_KIND_REPLY, rid, 0)      # the ack goes out before any completion
        key = (hkey, tr.ep)
        with self._lock:
            self.transfers[rid] = tr
            endpoint = self.endpoints.get(key)
            if endpoint is None:
                endpoint = self.endpoints[key] = _Endpoint(self, key)
        endpoint.put(tr)
        self.log("libusb_submit_transfer", status="LIBUSB_SUCCESS", **fields)

    def _cancel(self, rid: int, tid: int) -> None:
        with self._lock:
            tr = self.transfers.get(tid)
        found = tr is not None and tr.endpoint is not None and tr.endpoint.cancel(tr)
        code = 0 if found else -5
        self.send(_KIND_REPLY, rid, code)
        self.log("libusb_cancel_transfer", id=tid, status=ERROR_NAMES[code],
                 ep=tr.ep if tr else None, handle=tr.open.key if tr else None)

    def complete(self, tr: _Transfer, status: int, actual: int = 0, error: int = 0,
                 data: bytes = b"", detail: str | None = None) -> None:
        with self._lock:
            if self.transfers.pop(tr.id, None) is None:
                return          # completed already
        self.send(_KIND_COMPLETION, tr.id, status, actual, error, data)
        self.log("transfer_done", id=tr.id, handle=tr.open.key, ep=tr.ep, length=tr.length,
                 actual=actual, status=STATUS_NAMES.get(status, str(status)), detail=detail)

    def perform(self, tr: _Transfer):
        """Run ``tr`` on the backend: (status, actual, error, data, detail)."""
        if tr.cancelled:
            return CANCELLED, 0, 0, b"", None
        deadline = tr.deadline
        if deadline is not None and time.monotonic() >= deadline:
            return TIMED_OUT, 0, 0, b"", "timed out in the queue"
        b, h = self.backend, tr.open.handle
        try:
            if tr.type == _CONTROL:
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
                read = b.intr_read if tr.type == _INTERRUPT else b.bulk_read
                n = read(h, tr.ep, 0, buf, left)
                return COMPLETED, int(n), 0, bytes(buf[:n]), None
            write = b.intr_write if tr.type == _INTERRUPT else b.bulk_write
            n = write(h, tr.ep, 0, array.array("B", tr.payload), tr.timeout)
            return COMPLETED, int(n), 0, b"", None
        except Exception as e:  # noqa: BLE001 - every failure becomes a transfer status
            code = libusb_error(e)
            if not _expected(e):
                self.server._failure(f"transfer on endpoint {tr.ep:#04x}", e)
            return (_STATUS_OF_ERROR.get(code, ERROR), 0, code, b"",
                    f"{type(e).__name__}: {e}")

    def _wait_in(self, tr: _Transfer, deadline: float | None) -> str:
        """Wait until the IN transfer should make its read: "ready" (data, an error,
        or the deadline came), "cancelled" or "stopping"."""
        stick = getattr(tr.open.handle, "stick", None)
        wait = getattr(stick, "wait_for_in_data", None)
        if wait is None:
            return "ready"      # another backend: its read waits by itself
        while True:
            if tr.cancelled:
                return "cancelled"
            if self.stopping:
                return "stopping"
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return "ready"  # the one real read then times out, as the stick records
            step = self.server.poll if deadline is None else min(self.server.poll,
                                                                 deadline - now)
            if wait(tr.open.handle, tr.ep, tr.length, step):
                return "ready"
