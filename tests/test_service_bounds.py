"""The compile service's bounds against clients that misbehave on the wire.

Raw sockets on loopback play the clients: they trickle bodies, announce more
than they send, half-close their side, send ``Expect: 100-continue`` without
the token, non-UTF-8 tokens and requests that do not parse.  Small limits
(set the way ``coralrt serve-compiler`` sets them) keep each test short.
"""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest
from conftest import shared_model

pytest.importorskip("aiohttp", reason="the compile service needs aiohttp (coralrt[server])")

from support.service import compile_calls, service  # noqa: E402

from coralrt._compile.remote import RemoteCompiler  # noqa: E402
from coralrt.errors import ConfigError  # noqa: E402

TOKEN = "t0ken-for-the-tests-0123456789"
MODEL = "mobilenet_v1_0.25_128_quant"      # 525 598 bytes


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("FAKE_EDGETPU_MODELS", str(shared_model("MANIFEST.md").parent))
    for name in ("FAKE_EDGETPU_HANG", "FAKE_EDGETPU_FAIL", "CORALRT_COMPILER_URL",
                 "CORALRT_COMPILER_TOKEN", "CORALRT_COMPILER_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)


def _model() -> bytes:
    return shared_model(f"{MODEL}.tflite").read_bytes()


def _connect(url: str, timeout: float = 10.0) -> socket.socket:
    host, port = url.split("://")[1].split(":")
    s = socket.create_connection((host, int(port)))
    s.settimeout(timeout)
    return s


def _head(length: int | None, *, token: str | None = TOKEN, extra: bytes = b"") -> bytes:
    head = b"POST /compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
    if token:
        head += f"Authorization: Bearer {token}\r\n".encode()
    if length is not None:
        head += b"Content-Length: %d\r\n" % length
    return head + extra + b"\r\n"


def _answer(s: socket.socket) -> tuple[int, dict | bytes, bytes]:
    """``(status, JSON body or raw body, everything received)`` of the first answer, read
    until the connection closes or the body is complete."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = s.recv(65536)
        if not piece:
            break
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    if not head:
        return 0, b"", data
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), None)
    while length is not None and len(body) < length:
        piece = s.recv(65536)
        if not piece:
            break
        body += piece
    status = int(head.split(b" ")[1])
    try:
        return status, json.loads(body), data
    except ValueError:
        return status, body, data


def _closed(s: socket.socket) -> bool:
    """The service closed the connection (reads end) within the socket's timeout."""
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


# -- memory held by uploads in flight -------------------------------------------------


def test_uploads_in_flight_hold_at_most_max_upload_total(tmp_path):
    data = _model()
    with service(tmp_path, token=TOKEN, max_upload_bytes=600_000,
                 max_upload_total=1_200_000, body_timeout=30) as (url, svc, compiler):
        held = []
        for _ in range(2):     # two uploads stalled half-way fill 1 051 196 of 1 200 000
            s = _connect(url)
            s.sendall(_head(len(data)) + data[:1000])
            held.append(s)
        deadline = time.monotonic() + 10
        while svc.status()["upload_bytes"] < 2 * len(data):
            assert time.monotonic() < deadline, svc.status()
            time.sleep(0.05)
        third = _connect(url)
        t0 = time.monotonic()
        third.sendall(_head(len(data)) + data)
        status, body, raw = _answer(third)
        assert status == 503 and "--max-upload-total" in body["error"], raw[:300]
        assert b"Retry-After: " in raw and time.monotonic() - t0 < 5
        assert svc.status()["upload_bytes_peak"] <= 1_200_000
        for s in held:       # once they are gone, their bytes are given back
            s.close()
        deadline = time.monotonic() + 10
        while svc.status()["upload_bytes"]:
            assert time.monotonic() < deadline, svc.status()
            time.sleep(0.05)
        remote = RemoteCompiler(url, token=TOKEN, timeout=60)
        compiled, _log, _ = remote.compile_raw(data)
        assert compiled and len(compile_calls(compiler)) == 1
        assert svc.status()["upload_bytes"] == 0 and svc.status()["refused_busy"] == 1


def test_a_chunked_upload_counts_as_it_arrives(tmp_path):
    with service(tmp_path, token=TOKEN, max_upload_bytes=600_000,
                 max_upload_total=600_000, body_timeout=30) as (url, svc, _):
        first = _connect(url)
        first.sendall(_head(None, extra=b"Transfer-Encoding: chunked\r\n")
                      + b"%x\r\n%s\r\n" % (400_000, b"\0" * 400_000))
        deadline = time.monotonic() + 10
        while svc.status()["upload_bytes"] < 400_000:
            assert time.monotonic() < deadline, svc.status()
            time.sleep(0.05)
        second = _connect(url)
        second.sendall(_head(300_000) + b"\0" * 300_000)
        status, body, _ = _answer(second)
        assert status == 503 and "busy" in body["error"]
        first.close()


def test_max_upload_total_must_hold_one_largest_upload(tmp_path, capsys):
    from coralrt._cli.main import main
    from coralrt._server.service import Limits

    with pytest.raises(ConfigError, match="--max-upload-total"):
        Limits(max_upload_bytes=64 << 20, max_upload_total=32 << 20)
    assert main(["serve-compiler", "--max-upload", "64M", "--max-upload-total", "32M",
                 "--compiler", str(tmp_path / "none")]) == 1
    assert "--max-upload-total" in capsys.readouterr().err


# -- body-read timeout ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["announces more than it sends", "trickles"])
def test_a_body_that_does_not_arrive_in_time_is_a_408_and_the_connection_closes(tmp_path,
                                                                                how):
    data = _model()
    with service(tmp_path, token=TOKEN, body_timeout=1.5) as (url, svc, compiler):
        s = _connect(url, timeout=8)
        t0 = time.monotonic()
        if how == "trickles":
            s.sendall(_head(len(data)))
            s.setblocking(False)
            answer = b""
            while b"\r\n\r\n" not in answer and time.monotonic() - t0 < 8:
                try:
                    s.send(b"\0")
                    answer += s.recv(65536)
                except BlockingIOError:
                    pass
                except OSError:
                    break
                time.sleep(0.05)
            s.settimeout(8)
            status = int(answer.split(b" ")[1]) if answer else 0
            assert status == 408, answer[:300]
        else:
            s.sendall(_head(len(data)) + data[:1000])
            status, body, raw = _answer(s)
            assert status == 408 and "--body-timeout" in body["error"], raw[:300]
        took = time.monotonic() - t0
        assert 1.0 < took < 1.5 + 2, took
        assert _closed(s)
        assert svc.status()["upload_bytes"] == 0 and svc.status()["slow_uploads"] == 1
        assert compile_calls(compiler) == []


def test_an_upload_that_arrives_in_time_is_compiled(tmp_path):
    data = _model()
    with service(tmp_path, token=TOKEN, body_timeout=5) as (url, _svc, compiler):
        s = _connect(url)
        s.sendall(_head(len(data)))
        for start in range(0, len(data), 65536):    # a slow but steady link: ~2 s
            s.sendall(data[start:start + 65536])
            time.sleep(0.2)
        status, body, _ = _answer(s)
        assert status == 200 and body["size"] > 0 and len(compile_calls(compiler)) == 1


# -- a body cut short, Expect: 100-continue, a token that is not UTF-8, log lines ------


def test_a_body_cut_short_by_a_half_close_is_answered_400(tmp_path):
    data = _model()
    with service(tmp_path, token=TOKEN) as (url, svc, compiler):
        s = _connect(url)
        s.sendall(_head(len(data)) + data[:1000])
        s.shutdown(socket.SHUT_WR)    # the client can still read the answer
        status, body, raw = _answer(s)
        assert status == 400 and "cut short" in body["error"], raw[:300]
        assert _closed(s) and compile_calls(compiler) == []
        assert svc.status()["upload_bytes"] == 0


def test_a_complete_request_then_a_half_close_still_gets_its_answer(tmp_path):
    data = _model()
    with service(tmp_path, token=TOKEN) as (url, _svc, _):
        s = _connect(url, timeout=30)
        s.sendall(_head(len(data)) + data)
        s.shutdown(socket.SHUT_WR)
        status, body, raw = _answer(s)
        assert status == 200 and body["size"] > 0, raw[:300]


def test_expect_100_continue_without_the_token_is_a_401_and_no_100(tmp_path):
    data = _model()
    with service(tmp_path, token=TOKEN, max_upload_bytes=600_000) as (url, _svc, compiler):
        for token, length, want in ((None, len(data), 401), ("wrong-token-wrong-token", 100, 401),
                                    (TOKEN, 700_000, 413)):
            s = _connect(url, timeout=5)
            s.sendall(_head(length, token=token, extra=b"Expect: 100-continue\r\n"))
            status, body, raw = _answer(s)
            assert status == want and not raw.startswith(b"HTTP/1.1 100"), raw[:200]
            assert _closed(s)
        s = _connect(url, timeout=30)    # with the token: 100 Continue, then the answer
        s.sendall(_head(len(data), extra=b"Expect: 100-continue\r\n"))
        first = s.recv(25)
        assert first.startswith(b"HTTP/1.1 100 Continue"), first
        s.sendall(data)
        status, body, raw = _answer(s)
        assert status == 200 and body["size"] > 0, raw[:300]
        assert len(compile_calls(compiler)) == 1


@pytest.mark.parametrize("value", [b"Bearer \xff\xfe\xfd", b"\xc3\x28 \x80", b"Bearer \xed\xa0\x80"])
def test_an_authorization_header_that_is_not_utf8_is_a_401(tmp_path, value):
    with service(tmp_path, token=TOKEN) as (url, _svc, _):
        s = _connect(url)
        s.sendall(b"POST /compile HTTP/1.1\r\nHost: x\r\nAuthorization: " + value
                  + b"\r\nContent-Length: 3\r\n\r\nabc")
        status, body, raw = _answer(s)
        assert status == 401 and "token" in body["error"], raw[:300]
        s = _connect(url)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: " + value + b"\r\n\r\n")
        status, body, raw = _answer(s)
        assert (status, body) == (200, {"status": "ok"}), raw[:300]


MALFORMED = [
    b"POST /compile HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\nabc",
    b"POST /compile HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc",
    b"POST /compile HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /compile HTTP/1.1\r\nHo\x00st: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\n" + b"X-Long: " + b"a" * 20000 + b"\r\n\r\n",
]


def test_malformed_requests_are_one_log_line_each_without_a_traceback(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    with service(tmp_path, token=TOKEN) as (url, _svc, _):
        for request in MALFORMED:
            s = _connect(url)
            s.sendall(request)
            status, _body, raw = _answer(s)
            assert 400 <= status < 500, raw[:200]
            s.close()
        assert RemoteCompiler(url, token=TOKEN).health()["status"] == "ok"
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert records, "the malformed requests were not logged"
    for r in records:
        assert r.exc_info is None and "Traceback" not in caplog.text
        assert "\n" not in r.getMessage() and len(r.getMessage()) < 300, r.getMessage()
    assert sum("malformed request from 127.0.0.1" in r.getMessage()
               for r in records) == len(MALFORMED)
