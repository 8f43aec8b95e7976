"""Serve a simulated Coral stick to native programs through the libusb shim.

``build_shim()`` compiles the shim's C files into a ``libusb-1.0.so.0``; a
program that finds it first (``LD_LIBRARY_PATH``, or pyusb's ``find_library``)
sends every libusb call over a Unix socket to a :class:`StickServer` running in
a background thread of the test process, which answers it with the
pyusb-backend methods of the backend it was given (a ``SimulatedBackend``)::

    backend = SimulatedBackend(firmware_loaded=False, transcript_limit=None)
    with StickServer(backend, log_path=tmp_path / "usb.jsonl") as server:
        subprocess.run([...], env=server.env(), timeout=60)
    backend.transcript  # what the stick saw

Its parts: :mod:`usbshim.build` (compiling the shim), :mod:`usbshim.wire` (the
wire format; backend errors as libusb codes and transfer statuses),
:mod:`usbshim.connection` (one client and its synchronous requests),
:mod:`usbshim.transfers` (its transfers, one FIFO per endpoint) and
:mod:`usbshim.descriptors` (descriptors as bytes).  README.md in this folder
describes the wire format and the log.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
import traceback
from pathlib import Path

from usbshim.build import LIBRARY, ShimBuildError, build_shim, find_compiler
from usbshim.connection import Connection

__all__ = ["StickServer", "build_shim", "find_compiler", "ShimBuildError", "LIBRARY"]


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
        self._connections: set[Connection] = set()
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
            conn = Connection(self, sock)
            with self._lock:
                self._connections.add(conn)
            conn.start()

    def _forget(self, conn: Connection) -> None:
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
