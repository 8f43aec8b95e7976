"""The ``remote`` compiler's bounds against services that misbehave on the wire.

Each "service" here is a plain socket server on loopback that answers badly on
purpose: one byte at a time, far too much, JSON nested too deeply.  What is
shown is the client's side (coralrt._compile.remote): its timeout is one
deadline for the whole request, the answer it reads is capped, and every such
answer is a CompileServiceError naming the URL, in bounded time.  No aiohttp
is needed: a Raspberry Pi client has only the standard library.
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import pytest
from conftest import shared_model

from coralrt import _config as config
from coralrt._compile.remote import DEFAULT_MAX_ANSWER_BYTES, RemoteCompiler, check_url
from coralrt.errors import CompileServiceError, ConfigError

MODEL = "mobilenet_v1_0.25_128_quant"


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for name in (config.COMPILER_URL, config.COMPILER_TOKEN, config.COMPILER_TOKEN_FILE,
                 config.COMPILER_CA, config.COMPILER_URL_TIMEOUT,
                 config.COMPILER_URL_MAX_ANSWER):
        monkeypatch.delenv(name, raising=False)


def _model_bytes() -> bytes:
    return shared_model(f"{MODEL}.tflite").read_bytes()


def _read_request(conn: socket.socket) -> None:
    """Read one request's head and its Content-Length body (the service's part)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


@contextmanager
def bad_service(answer, *, seconds: float = 8.0):
    """A service on loopback whose every connection is answered by ``answer(conn)``,
    which may take up to ``seconds``; yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    threads = []

    def serve_one(conn):
        with conn:
            conn.settimeout(seconds)
            try:
                _read_request(conn)
                answer(conn, stop)
            except OSError:
                pass      # the client hung up: what the bounds are for

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=serve_one, args=(conn,), daemon=True)
            t.start()
            threads.append(t)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join(5)
        listener.close()
        for t in threads:
            t.join(seconds + 2)


def _drip(text: bytes, every: float, seconds: float = 8.0):
    """An answer sent one byte every ``every`` seconds, for at most ``seconds``."""
    def answer(conn, stop):
        end = time.monotonic() + seconds
        for i in range(len(text)):
            if stop.is_set() or time.monotonic() > end:
                return
            conn.sendall(text[i:i + 1])
            time.sleep(every)
    return answer


_SLOW_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X-Pad: " + b"a" * 400


def test_the_timeout_bounds_the_whole_request_not_each_read():
    with bad_service(_drip(_SLOW_HEAD, 0.2)) as url:
        t0 = time.monotonic()
        with pytest.raises(CompileServiceError) as info:
            RemoteCompiler(url, timeout=2).compile_raw(_model_bytes())
        took = time.monotonic() - t0
    assert took < 2 + 1, f"a 2 s timeout lasted {took:.1f} s"
    assert "timed out" in str(info.value) and info.value.url == url
    assert info.value.timeout == 2


def test_the_health_request_has_a_deadline_too():
    with bad_service(_drip(_SLOW_HEAD, 0.2)) as url:
        t0 = time.monotonic()
        with pytest.raises(CompileServiceError, match="timed out"):
            RemoteCompiler(url).health(timeout=1.5)
        took = time.monotonic() - t0
    assert took < 1.5 + 1, f"a 1.5 s health check lasted {took:.1f} s"


def test_a_slow_answer_body_is_cut_off_at_the_deadline():
    def answer(conn, stop):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n")
        _drip(b"{" + b" " * 99999, 0.1)(conn, stop)

    with bad_service(answer) as url:
        t0 = time.monotonic()
        with pytest.raises(CompileServiceError, match="timed out"):
            RemoteCompiler(url, timeout=1.5).compile_raw(_model_bytes())
        assert time.monotonic() - t0 < 1.5 + 1


def _announce(length: int, send: int, chunked: bool = False):
    """An answer announcing ``length`` bytes (or chunked, no length) and sending ``send``."""
    def answer(conn, stop):
        if chunked:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % length)
        block = b'{"compiled":"' + b"A" * 65523
        sent = 0
        while sent < send and not stop.is_set():
            conn.sendall(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
            sent += len(block)
        if chunked:
            conn.sendall(b"0\r\n\r\n")
        time.sleep(1)
    return answer


def test_an_answer_announced_larger_than_the_cap_is_refused_unread():
    with bad_service(_announce(300 << 20, 1 << 20)) as url:
        t0 = time.monotonic()
        with pytest.raises(CompileServiceError) as info:
            RemoteCompiler(url, timeout=30).compile_raw(_model_bytes())
        assert time.monotonic() - t0 < 5
    message = str(info.value)
    assert f"{300 << 20} bytes" in message and str(DEFAULT_MAX_ANSWER_BYTES) in message
    assert config.COMPILER_URL_MAX_ANSWER in message


def test_an_answer_without_a_length_is_read_up_to_the_cap_only(monkeypatch):
    monkeypatch.setenv(config.COMPILER_URL_MAX_ANSWER, "1M")
    with bad_service(_announce(0, 4 << 20, chunked=True)) as url:
        remote = RemoteCompiler(url, timeout=30)
        assert remote.max_answer_bytes == 1 << 20
        with pytest.raises(CompileServiceError, match=f"runs past the largest answer this client reads .{1 << 20} bytes"):
            remote.compile_raw(_model_bytes())


def test_the_answer_cap_is_a_setting_with_a_documented_default(monkeypatch):
    assert RemoteCompiler("http://127.0.0.1:1").max_answer_bytes == DEFAULT_MAX_ANSWER_BYTES
    assert RemoteCompiler("http://127.0.0.1:1", max_answer_bytes=5 << 30).max_answer_bytes \
        == 5 << 30
    monkeypatch.setenv(config.COMPILER_URL_MAX_ANSWER, "2G")
    assert RemoteCompiler("http://127.0.0.1:1").max_answer_bytes == 2 << 30
    monkeypatch.setenv(config.COMPILER_URL_MAX_ANSWER, "lots")
    with pytest.raises(ConfigError, match=config.COMPILER_URL_MAX_ANSWER):
        RemoteCompiler("http://127.0.0.1:1")


def _nested(conn, stop):
    body = b"[" * 200000
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def test_json_nested_too_deeply_is_a_typed_error():
    with bad_service(_nested) as url:
        with pytest.raises(CompileServiceError, match="not a JSON object"):
            RemoteCompiler(url).health()
        with pytest.raises(CompileServiceError, match="not a JSON object"):
            RemoteCompiler(url).compile_raw(_model_bytes())


def test_the_compile_command_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    from coralrt._cli.main import main

    monkeypatch.chdir(tmp_path)
    with bad_service(_nested) as url:
        assert main(["compile", "--compiler-url", url,
                     str(shared_model(f"{MODEL}.tflite"))]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("coralrt: error: compile service")
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("url", ["http://[::1", "https://[nothost]:8765"])
def test_a_malformed_url_is_a_config_error_naming_it(url):
    with pytest.raises(ConfigError) as info:
        RemoteCompiler(url)
    assert repr(url) in str(info.value)
    with pytest.raises(ConfigError):
        check_url(url, token=False)


def test_an_ipv6_url_in_brackets_is_fine():
    assert check_url("http://[::1]:9000", token=True) == ("http", "::1", 9000, "")
