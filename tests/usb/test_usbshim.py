"""The libusb shim (tests/usbshim): native programs talking to a simulated stick.

A child process loads the shim (``libusb-1.0.so.0`` compiled from
the tests/usbshim/shim_*.c files) and the test process serves a pyusb backend to it with
:class:`usbshim.server.StickServer`.  Checked here: the shim's structs match
libusb.h; transfers queued on one endpoint complete in the order submitted;
cancels; libusb_handle_events returns within its bound; backend errors become
the libusb codes and transfer statuses libusb gives; a server that goes away
or stops answering gives errors, never a hang; an IN transfer reads the stick
once; coralrt's own driver, through pyusb and the shim, downloads the
firmware, finds the re-enumerated stick and runs a native segment with the
results it gets in-process.  Google's libedgetpu over the shim (firmware
download, re-enumeration, asynchronous transfers on every endpoint, cancels
at close) is tested in test_libedgetpu_reference.py.

Without a C compiler the tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import usb.backend
import usb.core

from coralrt.testing import SimulatedBackend
from coralrt._sim.stick import descriptors as desc
from coralrt import open_device
from usbshim.server import ShimBuildError, StickServer, build_shim, find_compiler

TESTS = Path(__file__).resolve().parents[1]
SHIM_DIR = TESTS / "usbshim"
IMAGE = bytes(range(256)) * 42 + b"\x02\x00\x10"      # a stand-in firmware image
LOG_KEYS = ["t", "side", "pid", "call", "id", "handle", "ep", "length", "actual", "status",
            "detail"]
CANCELLED, TIMED_OUT, STALL, NO_DEVICE, OVERFLOW, ERROR = 3, 2, 4, 5, 6, 1


@pytest.fixture(scope="module")
def shim() -> Path:
    """The shim, built once per session (cached by source hash)."""
    if find_compiler() is None:
        why = "no C compiler on PATH ($CC, cc, gcc, clang): the libusb shim cannot be built"
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"{why} (CI=true: a CI machine must have one)")
        pytest.skip(why)
    try:
        return build_shim()
    except ShimBuildError as e:
        pytest.fail(str(e))


@pytest.fixture(autouse=True)
def _private_dirs(tmp_path, monkeypatch):
    # Locks and installed firmware of the children in this test's folders.
    monkeypatch.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def run_child(server: StickServer, code: str, *args, timeout: float = 30,
              env: dict | None = None) -> dict:
    """Run ``code`` in a child using the shim; the JSON object it prints last."""
    env = dict(server.env() if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          env=env, timeout=timeout, capture_output=True, text=True)
    assert done.returncode == 0, f"child failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- a scripted pyusb backend -----------------------------------------------------------------

class _Handle:
    def __init__(self, stick):
        self.stick = stick          # where the server finds wait_for_in_data


class ScriptedStick(usb.backend.IBackend):
    """One running-mode device whose answers the child scripts through its own requests.

    A 4-byte write n to EP 0x01 makes n packets [seq u32] appear on EP 0x81, one at a
    time after random short delays.  Control request 0xEE raises the errno in wValue,
    0xED sleeps wValue ms, 0xEC stops the server, 0xEF makes EP 0x82 reads raise the
    errno in wValue.  ``reads`` lists every read the server made.
    """

    def __init__(self):
        self.cond = threading.Condition()
        self.packets: deque[bytes] = deque()
        self.read_error = 0
        self.reads: list[int] = []
        self.server: StickServer | None = None
        self._dev = object()

    def enumerate_devices(self):
        return [self._dev]

    def get_device_descriptor(self, dev):
        return desc.device_descriptor("running", "usb3", bus=3, address=7, ports=(2,))

    def get_configuration_descriptor(self, dev, config):
        if config != 0:
            raise IndexError(config)
        return desc.configuration("running", "usb3")

    def get_interface_descriptor(self, dev, intf, alt, config):
        if intf or alt:
            raise IndexError(intf)
        return self.get_configuration_descriptor(dev, config).interface

    def get_endpoint_descriptor(self, dev, ep, intf, alt, config):
        return self.get_configuration_descriptor(dev, config).endpoints[ep]

    def open_device(self, dev):
        return _Handle(self)

    def close_device(self, handle):
        pass

    def claim_interface(self, handle, intf):
        pass

    def release_interface(self, handle, intf):
        pass

    def wait_for_in_data(self, handle, ep, length, seconds):
        with self.cond:
            return self.cond.wait_for(lambda: self.packets if ep == 0x81 else self.read_error,
                                      timeout=seconds)

    def bulk_write(self, handle, ep, intf, data, timeout):
        n = int.from_bytes(bytes(data[:4]), "little")

        def feed():
            for seq in range(n):
                time.sleep(random.uniform(0, 0.004))
                with self.cond:
                    self.packets.append(seq.to_bytes(4, "little") + bytes(12))
                    self.cond.notify_all()
        threading.Thread(target=feed, daemon=True).start()
        return len(data)

    def bulk_read(self, handle, ep, intf, buff, timeout):
        self.reads.append(ep)
        time.sleep(random.uniform(0, 0.002))     # slow reads would let racing ones overtake
        with self.cond:
            if ep == 0x82 and self.read_error:
                code = self.read_error
                raise (usb.core.USBTimeoutError if code == errno.ETIMEDOUT
                       else usb.core.USBError)(os.strerror(code), None, code)
            if ep == 0x81 and self.cond.wait_for(lambda: self.packets, timeout / 1000 or 5):
                packet = self.packets.popleft()
                memoryview(buff).cast("B")[:len(packet)] = packet
                return len(packet)
        raise usb.core.USBTimeoutError("Operation timed out", None, errno.ETIMEDOUT)

    def ctrl_transfer(self, handle, rtype, request, value, index, data, timeout):
        if request == 0xEE:
            raise (usb.core.USBTimeoutError if value == errno.ETIMEDOUT
                   else usb.core.USBError)(os.strerror(value), None, value)
        if request == 0xED:
            time.sleep(value / 1000)
        if request == 0xEC:
            threading.Thread(target=self.server.stop, daemon=True).start()
        if request == 0xEF:
            with self.cond:
                self.read_error = value
                self.cond.notify_all()
        return len(data)


def scripted(shim, tmp_path, **kw) -> tuple[ScriptedStick, StickServer]:
    stick = ScriptedStick()
    server = StickServer(stick, log_path=tmp_path / "usb.jsonl", shim=shim, **kw)
    stick.server = server
    return stick, server


PRELUDE = """
import ctypes, json, sys, time
from ctypes import byref, c_int, c_ubyte
from usbshim.libusb_ctypes import Async, init, load, open_first
lib = load()
ctx = init(lib)
h = open_first(lib, ctx)

def pump(until, limit=5.0):
    end = time.monotonic() + limit
    while not until() and time.monotonic() < end:
        lib.libusb_handle_events(ctx)

def ctrl(request, value, timeout=1000):
    return lib.libusb_control_transfer(h, 0x40, request, value, 0, None, 0, timeout)
"""


def with_prelude(code: str) -> str:
    """Child code that starts with a claimed handle ``h`` on the first device (``lib``,
    ``ctx``, ``pump(until)`` and ``ctrl(request, value)`` defined)."""
    return PRELUDE + textwrap.dedent(code)


# -- the shim's ABI -----------------------------------------------------------------------------

_LAYOUT = r"""
#include <stddef.h>
#include <stdio.h>
#include HEADER
#define F(s, f) printf(#s "." #f " %zu %zu\n", offsetof(struct s, f), sizeof(((struct s *)0)->f));
#define S(s) printf(#s " %zu\n", sizeof(struct s));
#define V(c) printf(#c " %d\n", (int)(c));
int main(void) {
    S(libusb_device_descriptor) F(libusb_device_descriptor, idVendor)
    F(libusb_device_descriptor, bcdDevice) F(libusb_device_descriptor, bNumConfigurations)
    S(libusb_endpoint_descriptor) F(libusb_endpoint_descriptor, wMaxPacketSize)
    F(libusb_endpoint_descriptor, extra) F(libusb_endpoint_descriptor, extra_length)
    S(libusb_interface_descriptor) F(libusb_interface_descriptor, endpoint)
    F(libusb_interface_descriptor, extra) F(libusb_interface_descriptor, extra_length)
    S(libusb_interface) F(libusb_interface, num_altsetting)
    S(libusb_config_descriptor) F(libusb_config_descriptor, wTotalLength)
    F(libusb_config_descriptor, MaxPower) F(libusb_config_descriptor, interface)
    F(libusb_config_descriptor, extra) F(libusb_config_descriptor, extra_length)
    S(libusb_iso_packet_descriptor) S(libusb_transfer) S(libusb_version)
    F(libusb_transfer, dev_handle) F(libusb_transfer, flags) F(libusb_transfer, endpoint)
    F(libusb_transfer, type) F(libusb_transfer, timeout) F(libusb_transfer, status)
    F(libusb_transfer, length) F(libusb_transfer, actual_length) F(libusb_transfer, callback)
    F(libusb_transfer, user_data) F(libusb_transfer, buffer)
    F(libusb_transfer, num_iso_packets)
    printf("iso_packet_desc %zu\n", offsetof(struct libusb_transfer, iso_packet_desc));
    V(LIBUSB_ERROR_IO) V(LIBUSB_ERROR_NO_DEVICE) V(LIBUSB_ERROR_NOT_FOUND)
    V(LIBUSB_ERROR_TIMEOUT) V(LIBUSB_ERROR_PIPE) V(LIBUSB_ERROR_NOT_SUPPORTED)
    V(LIBUSB_ERROR_OTHER) V(LIBUSB_TRANSFER_CANCELLED) V(LIBUSB_TRANSFER_STALL)
    V(LIBUSB_TRANSFER_NO_DEVICE) V(LIBUSB_TRANSFER_OVERFLOW) V(LIBUSB_TRANSFER_SHORT_NOT_OK)
    V(LIBUSB_TRANSFER_FREE_BUFFER) V(LIBUSB_TRANSFER_FREE_TRANSFER)
    V(LIBUSB_TRANSFER_ADD_ZERO_PACKET) V(LIBUSB_TRANSFER_TYPE_INTERRUPT)
    V(LIBUSB_SPEED_SUPER) V(LIBUSB_SPEED_SUPER_PLUS)
    return 0;
}
"""


def test_shim_structs_and_constants_match_libusb_h(shim, tmp_path):
    header = Path("/usr/include/libusb-1.0/libusb.h")
    if not header.is_file():
        pytest.skip(f"{header} is not installed (Debian: libusb-1.0-0-dev)")
    (tmp_path / "layout.c").write_text(_LAYOUT)
    printed = []
    for name, flags in (("shim", [f"-I{SHIM_DIR}", '-DHEADER="shim_abi.h"']),
                        ("libusb", [f"-I{header.parent}", '-DHEADER="libusb.h"'])):
        exe = tmp_path / name
        subprocess.run([find_compiler(), "-std=gnu11", *flags, "-o", str(exe),
                        str(tmp_path / "layout.c")], check=True, timeout=60)
        printed.append(subprocess.run([str(exe)], check=True, capture_output=True, text=True,
                                      timeout=10).stdout.splitlines())
    assert printed[0] == printed[1]


# -- transfers ------------------------------------------------------------------------------

def test_transfers_queued_on_one_endpoint_complete_in_submission_order(shim, tmp_path):
    stick, server = scripted(shim, tmp_path)
    with server:
        got = run_child(server, with_prelude("""
        done = []
        ts = [Async(lib, h, 0x81, 64, timeout_ms=10000,
                    on_done=lambda a, i=i: done.append(
                        [i, a.status, int.from_bytes(a.data[:4], "little"), a.actual]))
              for i in range(24)]
        submitted = [t.submit() for t in ts]
        n = c_int()
        rc = lib.libusb_bulk_transfer(h, 0x01, (c_ubyte * 4)(24), 4, byref(n), 1000)
        pump(lambda: len(done) == 24)
        print(json.dumps({"submitted": submitted, "rc": rc, "written": n.value, "done": done}))
        """))
    assert got["submitted"] == [0] * 24 and got["rc"] == 0 and got["written"] == 4
    assert got["done"] == [[i, 0, i, 16] for i in range(24)]
    assert server.failures == []
    # Both sides logged every transfer, with the same keys.
    lines = read_log(tmp_path / "usb.jsonl")
    assert all(list(line) == LOG_KEYS for line in lines)
    assert {line["side"] for line in lines} == {"shim", "server"}
    shim_ids = [x["id"] for x in lines if x["side"] == "shim" and x["call"] == "callback"]
    served = [x["id"] for x in lines if x["side"] == "server" and x["call"] == "transfer_done"]
    submits = [x["id"] for x in lines
               if x["side"] == "shim" and x["call"] == "libusb_submit_transfer"]
    assert shim_ids == submits and set(served) >= set(submits)


def test_cancel_completes_queued_and_waiting_transfers_without_reading(shim, tmp_path):
    stick, server = scripted(shim, tmp_path)
    with server:
        got = run_child(server, with_prelude("""
        a, b, c = (Async(lib, h, 0x81, 64) for _ in range(3))     # no timeout
        for t in (a, b, c):
            assert t.submit() == 0
        start = time.monotonic()
        rc_b = b.cancel()               # queued behind a
        rc_a = a.cancel()               # at the head, waiting for data
        pump(lambda: a.status is not None and b.status is not None)
        took = time.monotonic() - start
        pump(lambda: False, limit=0.3)  # c stays queued
        c_before = c.status
        rc_c = c.cancel()
        pump(lambda: c.status is not None)
        print(json.dumps({"rc": [rc_a, rc_b, rc_c], "again": a.cancel(), "took": took,
                          "status": [a.status, b.status, c.status], "c_before": c_before}))
        """))
    assert got["rc"] == [0, 0, 0] and got["again"] == -5          # LIBUSB_ERROR_NOT_FOUND
    assert got["status"] == [CANCELLED] * 3 and got["c_before"] is None
    assert got["took"] < 1.0
    assert stick.reads == []            # a cancelled transfer never reads the stick
    assert server.failures == []


def test_handle_events_returns_within_its_bound(shim, tmp_path):
    stick, server = scripted(shim, tmp_path)
    with server:
        got = run_child(server, with_prelude("""
        spans = []
        for _ in range(5):
            t = time.monotonic()
            lib.libusb_handle_events(ctx)
            spans.append(time.monotonic() - t)
        print(json.dumps({"spans": spans}))
        """))
    assert all(0.05 <= s < 0.3 for s in got["spans"]), got["spans"]


def test_backend_errors_become_libusb_codes_and_transfer_statuses(shim, tmp_path):
    stick, server = scripted(shim, tmp_path)
    codes = {errno.EPIPE: -9, errno.ENODEV: -4, errno.EBUSY: -6, errno.EACCES: -3,
             errno.ETIMEDOUT: -7, errno.EIO: -1, errno.EOVERFLOW: -8, errno.ENOENT: -5}
    statuses = {errno.EPIPE: STALL, errno.ENODEV: NO_DEVICE, errno.ETIMEDOUT: TIMED_OUT,
                errno.EOVERFLOW: OVERFLOW, errno.EIO: ERROR}
    with server:
        got = run_child(server, with_prelude("""
        errnos = json.loads(sys.argv[1])
        control = [ctrl(0xEE, e) for e in errnos]
        statuses = []
        for e in json.loads(sys.argv[2]):
            ctrl(0xEF, e)
            t = Async(lib, h, 0x82, 16, timeout_ms=2000)
            t.submit()
            pump(lambda: t.status is not None)
            statuses.append(t.status)
        ctrl(0xEF, 32)      # EPIPE, synchronously
        n = c_int()
        stalled = lib.libusb_bulk_transfer(h, 0x82, (c_ubyte * 16)(), 16, byref(n), 1000)
        start = time.monotonic()
        empty = lib.libusb_bulk_transfer(h, 0x81, (c_ubyte * 64)(), 64, byref(n), 200)
        print(json.dumps({"control": control, "statuses": statuses, "stalled": stalled,
                          "empty": empty, "waited": time.monotonic() - start}))
        """), json.dumps(list(codes)), json.dumps(list(statuses)))
    assert got["control"] == list(codes.values())
    assert got["statuses"] == list(statuses.values())
    assert got["stalled"] == -9 and got["empty"] == -7          # PIPE, TIMEOUT
    assert 0.15 <= got["waited"] < 2.0
    assert server.failures == []


def test_a_server_that_goes_away_fails_calls_instead_of_hanging(shim, tmp_path):
    stick, server = scripted(shim, tmp_path)
    with server:
        got = run_child(server, with_prelude("""
        pending = Async(lib, h, 0x81, 64)            # no timeout: only the loss ends it
        pending.submit()
        start = time.monotonic()
        ctrl(0xEC, 0)                                # the server stops
        pump(lambda: pending.status is not None)
        while ctrl(0, 0) != -4 and time.monotonic() - start < 5:
            time.sleep(0.01)                         # until the connection is gone
        n = c_int()
        after = [ctrl(0, 0), lib.libusb_bulk_transfer(h, 0x81, (c_ubyte * 8)(), 8, byref(n), 0),
                 Async(lib, h, 0x81, 8).submit()]
        other = ctypes.c_void_p()
        again = lib.libusb_init(byref(other))
        print(json.dumps({"status": pending.status, "after": after, "init": again,
                          "took": time.monotonic() - start}))
        """))
    assert got["status"] == NO_DEVICE
    assert got["after"] == [-4, -4, -4]              # LIBUSB_ERROR_NO_DEVICE
    assert got["init"] == -1                         # no server to connect to: IO
    assert got["took"] < 5


def test_a_server_that_stops_answering_gives_timeouts_after_max_wait(shim, tmp_path):
    stick, server = scripted(shim, tmp_path, max_wait=0.5)
    with server:
        got = run_child(server, with_prelude("""
        start = time.monotonic()
        slow = ctrl(0xED, 1500, timeout=0)            # the server takes 1.5 s
        t1 = time.monotonic()
        n = c_int()
        empty = lib.libusb_bulk_transfer(h, 0x81, (c_ubyte * 8)(), 8, byref(n), 0)
        print(json.dumps({"slow": slow, "t_slow": t1 - start, "empty": empty,
                          "t_empty": time.monotonic() - t1}))
        """))
    assert got["slow"] == -7 and 0.4 <= got["t_slow"] < 1.4
    assert got["empty"] == -7 and 0.4 <= got["t_empty"] < 1.4
    lines = read_log(tmp_path / "usb.jsonl")
    assert any("no answer from the server" in (x["detail"] or "") for x in lines)
    assert any("no completion from the server" in (x["detail"] or "") for x in lines)


def test_an_in_transfer_reads_the_stick_once_however_long_it_waits(shim, tmp_path):
    b = SimulatedBackend(firmware_loaded=True, transcript_limit=None, max_wait=0.05,
                         lock_scope="process")
    with StickServer(b, log_path=tmp_path / "usb.jsonl", shim=shim) as server:
        got = run_child(server, with_prelude("""
        timed = Async(lib, h, 0x82, 16, timeout_ms=400)     # longer than the stick's max_wait
        queued = Async(lib, h, 0x82, 16, timeout_ms=400)
        forever = Async(lib, h, 0x81, 1024)
        start = time.monotonic()
        for t in (timed, queued, forever):
            t.submit()
        pump(lambda: timed.status is not None and queued.status is not None)
        took = time.monotonic() - start
        forever.cancel()
        pump(lambda: forever.status is not None)
        print(json.dumps({"status": [timed.status, queued.status, forever.status],
                          "took": took}))
        """))
    assert got["status"] == [TIMED_OUT, TIMED_OUT, CANCELLED]
    assert 0.35 <= got["took"] < 2
    # One read of the stick at most per transfer (the queued one reads too if it gets to
    # the head before its own deadline), none for the cancelled one: no read per poll.
    reads = [(e["op"], e["ep"], e.get("error")) for e in b.transcript
             if e["op"] in ("bulk_in", "timeout")]
    assert reads in ([("bulk_in", 0x82, "timeout")], [("bulk_in", 0x82, "timeout")] * 2)


# -- coralrt's driver and libedgetpu through the shim -------------------------------------------

def _segment() -> bytes:
    from coralrt._formats.segment import build_segment
    from coralrt._formats.segment_codec import encode
    from support.models import conv_relu
    return encode(build_segment(conv_relu()))


def _steps(transcript) -> list[tuple]:
    return [(e["op"], e["register"], e["value"], e["tag"], e["length"]) for e in transcript]


def test_coralrt_driver_over_pyusb_and_the_shim_matches_in_process(shim, tmp_path):
    program = _segment()
    xs = [np.random.default_rng(s).integers(-128, 128, (1, 6, 6, 3), dtype=np.int8)
          for s in range(2)]
    (tmp_path / "segment.bin").write_bytes(program)
    np.save(tmp_path / "inputs.npy", np.stack(xs))

    local = SimulatedBackend(firmware_loaded=False, transcript_limit=None, lock_scope="process")
    with open_device("usb:0", backend=local, firmware=IMAGE) as dev:
        h = dev.load(program)
        want = [dev.run(h, [x]) for x in xs]

    remote = SimulatedBackend(firmware_loaded=False, transcript_limit=None)
    log = tmp_path / "usb.jsonl"
    with StickServer(remote, log_path=log, shim=shim) as server:
        got = run_child(server, """
        import json, sys
        from pathlib import Path
        import numpy as np
        from usbshim.client import shim_backend
        from coralrt import open_device
        folder = Path(sys.argv[1])
        program = (folder / "segment.bin").read_bytes()
        image = bytes(range(256)) * 42 + b"\\x02\\x00\\x10"
        with open_device("usb:0", backend=shim_backend(), firmware=image) as dev:
            h = dev.load(program)
            outs = [dev.run(h, [x[None] if x.ndim == 3 else x])
                    for x in np.load(folder / "inputs.npy")]
            info = {"path": dev.path, "speed": dev.usb_speed, "port": dev.info.port_path}
        np.savez(folder / "outputs.npz", *[o for run in outs for o in run])
        print(json.dumps(info))
        """, tmp_path, timeout=60)
    assert got == {"path": "usb:0", "speed": "usb3", "port": "/sys/bus/usb/devices/2-1"}
    saved = np.load(tmp_path / "outputs.npz")
    flat = [o for run in want for o in run]
    assert len(saved.files) == len(flat)
    for name, w in zip(saved.files, flat):
        np.testing.assert_array_equal(saved[name].reshape(w.shape), w)
    # The stick saw the same requests, in the same order, as in-process.
    assert _steps(remote.transcript) == _steps(local.transcript)
    assert any(e["op"] == "reenumerate" for e in remote.transcript)
    lines = read_log(log)
    resets = [x["status"] for x in lines
              if x["side"] == "shim" and x["call"] == "libusb_reset_device"]
    assert "LIBUSB_ERROR_NOT_FOUND" in resets       # the reset after the download
    assert server.failures == []
