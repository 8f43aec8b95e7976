#!/usr/bin/env python3
"""Load the compile service on loopback with normal, slow and oversized clients mixed.

    python tools/load_service.py [--seconds 90] [--normal 8] [--requests 10]
                                 [--bulk 40] [--bulk-mib 16] [--tricklers 10]
                                 [--oversized 4] [--body-timeout 10]
                                 [--tree DIR] [--no-bounds]

Runs ``coralrt serve-compiler`` in a child process, on a free loopback port,
over the tests' stand-in compiler (``tests/support/fake_edgetpu_compiler.py``,
which answers with the real compiler's output for the models in
``../shared/models``), and sends it, all at once:

- ``--normal`` clients, each making ``--requests`` compile requests of real
  models one after the other with the ``remote`` compiler (which retries a
  503 busy); their latencies are the figures that matter;
- ``--bulk`` clients each uploading ``--bulk-mib`` MiB that are not a model,
  at about 10 MiB/s (so that they are in flight together): memory pressure;
- ``--tricklers`` clients announcing a 1 MiB body and sending one byte every
  0.5 s: the body-read timeout (they start half a second before the others);
- ``--oversized`` clients announcing more than ``--max-upload`` (64 MiB), or
  sending a chunked body past it.

Everything is bounded: each client stops at ``--seconds`` (default 90), and
the run with it.  Printed: the service's peak memory (VmHWM of the child
process, Linux), its ``upload_bytes_peak``, the normal requests' latency
(p50, p99, max) and failures, and how each kind of bad client was answered.
``--tree DIR`` runs the service from another source tree (say, an older
commit's checkout), with ``--no-bounds`` when that tree has no
``--max-upload-total`` / ``--body-timeout`` options.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from coralrt._compile.remote import RemoteCompiler  # noqa: E402
from coralrt.errors import CompileServiceError  # noqa: E402
from support.service import stand_in  # noqa: E402

SHARED = REPO.parent / "shared" / "models"
MODELS = ["mobilenet_v1_0.25_128_quant", "mobilenet_v2_1.0_224_quant",
          "deeplabv3_mnv2_dm05_pascal_quant", "split_concat"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kib(status_line: str) -> int:
    return int(status_line.split()[1])


def _memory(pid: int) -> dict:
    """``{"VmRSS": KiB, "VmHWM": KiB}`` of process ``pid`` (Linux)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = _kib(line)
    return out


def _status(head: bytes) -> int | None:
    try:
        return int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


class Run:
    def __init__(self, url: str, end: float):
        self.url = url
        self.end = end
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.failures: collections.Counter = collections.Counter()
        self.answers: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)
        self.answer_times: dict[str, list[float]] = collections.defaultdict(list)

    def left(self) -> float:
        return self.end - time.monotonic()

    def record(self, kind: str, what, seconds: float) -> None:
        with self.lock:
            self.answers[kind][what] += 1
            self.answer_times[kind].append(seconds)

    # -- the clients -----------------------------------------------------------------

    def normal(self, index: int, requests: int) -> None:
        remote = RemoteCompiler(self.url, timeout=max(1.0, min(120.0, self.left())))
        for i in range(requests):
            if self.left() <= 1:
                return
            data = (SHARED / f"{MODELS[(index + i) % len(MODELS)]}.tflite").read_bytes()
            remote.timeout = max(1.0, min(120.0, self.left()))
            t0 = time.monotonic()
            try:
                remote.compile_raw(data)
            except CompileServiceError as e:
                with self.lock:
                    self.failures[e.status or "no answer"] += 1
                continue
            with self.lock:
                self.latencies.append(time.monotonic() - t0)

    def bulk(self, size: int) -> None:
        body = bytearray(size)
        body[4:8] = b"TFL3"    # passes the first check; not a model
        piece = 1 << 20

        def pieces():
            for start in range(0, size, piece):
                yield bytes(body[start:start + piece])
                time.sleep(0.1)

        self._post("bulk", pieces(), {"Content-Length": str(size)})

    def oversized(self, index: int) -> None:
        if index % 2:
            self._post("oversized", b"", {"Content-Length": str(100 << 20)}, send_body=False)
        else:
            self._post("oversized", (b"\0" * (1 << 20) for _ in range(80)), {},
                       chunked=True)

    def _post(self, kind: str, body, headers: dict, *, chunked: bool = False,
              send_body: bool = True) -> None:
        host, port = self.url.split("://")[1].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=max(1.0, self.left()))
        t0 = time.monotonic()
        try:
            if send_body:
                conn.request("POST", "/compile", body=body, headers=headers,
                             encode_chunked=chunked)
            else:
                conn.putrequest("POST", "/compile")
                for k, v in headers.items():
                    conn.putheader(k, v)
                conn.endheaders()
            response = conn.getresponse()
            response.read()
            self.record(kind, response.status, time.monotonic() - t0)
        except (OSError, http.client.HTTPException) as e:
            self.record(kind, type(e).__name__, time.monotonic() - t0)
        finally:
            conn.close()

    def trickler(self) -> None:
        host, port = self.url.split("://")[1].rsplit(":", 1)
        t0 = time.monotonic()
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
        except OSError as e:
            self.record("trickler", type(e).__name__, 0.0)
            return
        with s:
            s.sendall(b"POST /compile HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                      % (1 << 20))
            s.setblocking(False)
            answer = b""
            while self.left() > 0:
                try:
                    got = s.recv(65536)
                    if not got:
                        break
                    answer += got
                    if b"\r\n" in answer:
                        break
                except BlockingIOError:
                    pass
                except OSError:
                    break
                try:
                    s.send(b"\0")
                except (BlockingIOError, OSError):
                    pass
                time.sleep(0.5)
        what = _status(answer) if answer else ("no answer" if self.left() <= 0 else "closed")
        self.record("trickler", what, time.monotonic() - t0)


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=90.0, help="bound of the whole run")
    ap.add_argument("--normal", type=int, default=8)
    ap.add_argument("--requests", type=int, default=10, help="per normal client")
    ap.add_argument("--bulk", type=int, default=40)
    ap.add_argument("--bulk-mib", type=int, default=16)
    ap.add_argument("--tricklers", type=int, default=10)
    ap.add_argument("--oversized", type=int, default=4)
    ap.add_argument("--body-timeout", type=float, default=10.0,
                    help="the service's --body-timeout (default here 10 s, to keep the run "
                         "short; the service's own default is 60)")
    ap.add_argument("--max-upload-total", default="256M")
    ap.add_argument("--tree", type=Path, default=REPO,
                    help="source tree the service runs from (default: this one)")
    ap.add_argument("--no-bounds", action="store_true",
                    help="the service's tree has no --max-upload-total/--body-timeout")
    args = ap.parse_args(argv)
    if not SHARED.is_dir():
        ap.error(f"the models are missing: {SHARED}")

    with tempfile.TemporaryDirectory(prefix="coralrt-load-") as tmp:
        compiler = stand_in(Path(tmp) / "bin")
        port = _free_port()
        bounds = [] if args.no_bounds else [
            "--max-upload-total", args.max_upload_total,
            "--body-timeout", str(args.body_timeout)]
        cmd = [sys.executable, "-m", "coralrt", "-q", "serve-compiler", "--port", str(port),
               "--compiler", str(compiler), "--cache-dir", str(Path(tmp) / "cache"),
               *bounds]
        env = {**os.environ, "FAKE_EDGETPU_MODELS": str(SHARED),
               "PYTHONPATH": str(args.tree.resolve())}
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            ready = time.monotonic() + 30
            while True:
                try:
                    RemoteCompiler(url, timeout=5).health(timeout=5)
                    break
                except CompileServiceError:
                    if proc.poll() is not None or time.monotonic() > ready:
                        print(proc.stderr.read() if proc.poll() is not None else "",
                              file=sys.stderr)
                        raise SystemExit("the service did not start")
                    time.sleep(0.2)
            at_start = _memory(proc.pid)
            t_start = time.monotonic()
            run = Run(url, t_start + args.seconds)
            tricklers = [threading.Thread(target=run.trickler, daemon=True)
                         for _ in range(args.tricklers)]
            for t in tricklers:
                t.start()
            time.sleep(0.5)
            threads = [threading.Thread(target=run.normal, args=(i, args.requests))
                       for i in range(args.normal)]
            threads += [threading.Thread(target=run.bulk, args=(args.bulk_mib << 20,))
                        for _ in range(args.bulk)]
            threads += [threading.Thread(target=run.oversized, args=(i,))
                        for i in range(args.oversized)]
            for t in threads:
                t.daemon = True
                t.start()
            for t in tricklers + threads:
                t.join(max(0.0, run.end + 5 - time.monotonic()))
            took = time.monotonic() - t_start
            memory = _memory(proc.pid)
            try:
                load = RemoteCompiler(url, timeout=10).health(timeout=10).get("load", {})
            except CompileServiceError as e:
                load = {"error": str(e)}
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()

    lat = run.latencies
    print(f"service: coralrt serve-compiler {' '.join(bounds)} (from {args.tree.resolve()})")
    print(f"run: {took:.1f} s (bound {args.seconds:g} s); clients: {args.normal} normal x "
          f"{args.requests}, {args.bulk} bulk x {args.bulk_mib} MiB, {args.tricklers} "
          f"tricklers, {args.oversized} oversized")
    if lat:
        print(f"normal requests: {len(lat)} answered, failures {dict(run.failures) or 0}; "
              f"latency p50 {statistics.median(lat):.3f} s, p99 {_percentile(lat, 99):.3f} s, "
              f"max {max(lat):.3f} s")
    else:
        print(f"normal requests: none answered; failures {dict(run.failures)}")
    for kind in ("bulk", "trickler", "oversized"):
        times = run.answer_times.get(kind) or [0.0]
        print(f"{kind}: answered {dict(run.answers.get(kind, {}))} after "
              f"{min(times):.1f}-{max(times):.1f} s")
    print(f"service memory: VmHWM {memory.get('VmHWM', 0) / 1024:.0f} MiB (VmRSS at start "
          f"{at_start.get('VmRSS', 0) / 1024:.0f} MiB, at the end "
          f"{memory.get('VmRSS', 0) / 1024:.0f} MiB); upload_bytes_peak "
          f"{load.get('upload_bytes_peak', 'n/a')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
