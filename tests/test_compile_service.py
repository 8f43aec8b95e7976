"""The compile service (coralrt serve-compiler) and the remote compiler, on loopback.

The service runs the stand-in compiler (tests/support/fake_edgetpu_compiler.py),
which answers from the real compiled models in shared/models; what is shown
here is coralrt's side: HTTP, tokens, TLS, limits, one compile per segment
for many clients, verification of what comes back, and the typed errors.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO_ROOT, shared_model

pytest.importorskip("aiohttp", reason="the compile service needs aiohttp (coralrt[server])")

from support.service import compile_calls, service, stand_in  # noqa: E402

from coralrt import _config as config# noqa: E402
from coralrt._compile.cache import CompileCache  # noqa: E402
from coralrt._compile.segments import compile_model  # noqa: E402
from coralrt._compile.remote import RemoteCompiler, check_url  # noqa: E402
from coralrt.errors import CompileServiceError, ConfigError  # noqa: E402
from coralrt._model import load_model  # noqa: E402

TOKEN = "t0ken-for-the-tests-0123456789"
MOBILENET = "mobilenet_v1_0.25_128_quant"
VERSION = "16.0.384591198"


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("FAKE_EDGETPU_MODELS", str(shared_model("MANIFEST.md").parent))
    for name in ("FAKE_EDGETPU_HANG", "FAKE_EDGETPU_FAIL", "FAKE_EDGETPU_PIDFILE",
                 config.COMPILER_URL, config.COMPILER_TOKEN, config.COMPILER_TOKEN_FILE,
                 config.COMPILER_CA, config.COMPILER_URL_TIMEOUT):
        monkeypatch.delenv(name, raising=False)


def _model_bytes(name: str = MOBILENET) -> bytes:
    return shared_model(f"{name}.tflite").read_bytes()


def _request(url: str, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None) -> tuple[int, dict, dict]:
    host, port = url.split("://")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, json.loads(data), dict(r.getheaders())
    finally:
        conn.close()


def _auth() -> dict:
    return {"Authorization": f"Bearer {TOKEN}"}


# -- the service ------------------------------------------------------------------------


def test_health_names_the_compiler_only_with_the_token(tmp_path):
    with service(tmp_path, token=TOKEN) as (url, _svc, _):
        status, body, _ = _request(url, "GET", "/health")
        assert (status, body) == (200, {"status": "ok"})
        status, body, _ = _request(url, "GET", "/health", headers=_auth())
        assert status == 200 and body["compiler"] == {"id": "edgetpu_compiler",
                                                      "version": VERSION}
        assert body["limits"]["max_concurrent"] == 2 and body["load"]["requests"] == 0
        assert body["limits"]["compile_timeout"] == 60.0     # the compiler's own limit


def test_compile_answers_the_compilers_output_with_its_sha256(tmp_path):
    data = _model_bytes()
    with service(tmp_path, token=TOKEN) as (url, svc, compiler):
        status, body, _ = _request(url, "POST", "/compile", data, _auth())
        assert status == 200, body
        compiled = base64.b64decode(body["compiled"])
        assert body["sha256"] == hashlib.sha256(compiled).hexdigest()
        assert body["size"] == len(compiled)
        assert body["source_sha256"] == hashlib.sha256(data).hexdigest()
        assert body["compiler"]["version"] == VERSION and body["cache_hit"] is False
        assert "Model compiled successfully" in body["log"]
        assert load_model(compiled).is_edgetpu_compiled
        again = _request(url, "POST", "/compile", data, _auth())[1]
        assert again["cache_hit"] is True and again["sha256"] == body["sha256"]
        assert len(compile_calls(compiler)) == 1


def test_token_refusal(tmp_path):
    with service(tmp_path, token=TOKEN) as (url, _svc, compiler):
        for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"},
                        {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}):
            status, body, h = _request(url, "POST", "/compile", _model_bytes(), headers)
            assert status == 401 and "token" in body["error"]
            assert h["WWW-Authenticate"].startswith("Bearer")
        with pytest.raises(CompileServiceError) as info:
            RemoteCompiler(url, token="not-the-token-at-all").compile_raw(_model_bytes())
        assert info.value.status == 401 and url in str(info.value)
        assert "refused the token" in str(info.value)
        with pytest.raises(CompileServiceError, match="requires a token"):
            RemoteCompiler(url).compile_raw(_model_bytes())
        assert compile_calls(compiler) == []


def test_eight_clients_compiling_one_model_compile_it_once(tmp_path):
    data = _model_bytes()
    with service(tmp_path, token=TOKEN, delay=1.0) as (url, svc, compiler):
        remote = RemoteCompiler(url, token=TOKEN)
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: remote.compile_raw(data), range(8)))
        assert len(compile_calls(compiler)) == 1
        assert len({a[0] for a in answers}) == 1
        assert svc.status()["compiles"] == 1 and svc.status()["requests"] == 8


def test_a_hung_compiler_times_out_and_the_service_lives(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_EDGETPU_PIDFILE", str(pids))
    with service(tmp_path, token=TOKEN, compile_timeout=2.0) as (url, svc, _):
        RemoteCompiler(url, token=TOKEN).version   # asked before the compiler hangs
        monkeypatch.setenv("FAKE_EDGETPU_HANG", "1")
        t0 = time.monotonic()
        status, body, _ = _request(url, "POST", "/compile", _model_bytes(), _auth())
        assert status == 504 and "did not finish within 2 s" in body["error"]
        assert time.monotonic() - t0 < 15
        for pid in map(int, pids.read_text().split()):
            with pytest.raises(ProcessLookupError):    # the compiler and its child are gone
                for _ in range(50):
                    os.kill(pid, 0)
                    time.sleep(0.1)
        monkeypatch.delenv("FAKE_EDGETPU_HANG")
        status, body, _ = _request(url, "POST", "/compile", _model_bytes(), _auth())
        assert status == 200 and body["cache_hit"] is False   # the failure was not cached
        assert svc.status()["failures"] == 1


def test_a_failing_compiler_is_a_422_with_its_output(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_EDGETPU_FAIL", "1")
    with service(tmp_path) as (url, _svc, _):
        status, body, _ = _request(url, "POST", "/compile", _model_bytes())
        assert status == 422 and "exit status 1" in body["error"]
        assert "Internal compiler error" in body["log_tail"]
        with pytest.raises(CompileServiceError) as info:
            RemoteCompiler(url).compile_raw(_model_bytes())
        assert info.value.status == 422 and "Internal compiler error" in str(info.value)


@pytest.mark.parametrize("body, status, words", [
    (b"", 400, "empty"),
    (b"not a model at all, just text", 400, "not a TFLite model"),
    (b"\x18\x00\x00\x00TFL3" + b"\x00" * 40, 400, "not a valid TFLite model"),
    ("half", 400, "not a valid TFLite model"),
    ("compiled", 400, "already compiled"),
    ("large", 413, "limit of 4096"),
])
def test_bad_uploads_get_a_4xx_json_error_and_the_service_keeps_serving(tmp_path, body,
                                                                        status, words):
    if body == "half":
        whole = _model_bytes()
        body = whole[:len(whole) // 2]
    elif body == "compiled":
        body = shared_model(f"edgetpu/{MOBILENET}_edgetpu.tflite").read_bytes()
    elif body == "large":
        body = b"\x00" * 5000
    with service(tmp_path, max_upload_bytes=4096 if status == 413 else 64 << 20) \
            as (url, svc, compiler):
        got, answer, _ = _request(url, "POST", "/compile", body)
        assert got == status and words in answer["error"], answer
        assert _request(url, "GET", "/health")[0] == 200
        assert compile_calls(compiler) == []


def test_unknown_paths_and_methods_are_json_errors(tmp_path):
    with service(tmp_path) as (url, _svc, _):
        status, body, _ = _request(url, "GET", "/nothing-here")
        assert status == 404 and body["error"]
        status, body, _ = _request(url, "GET", "/compile")
        assert status == 405 and body["error"]


def test_a_body_cut_short_on_the_wire_leaves_the_service_serving(tmp_path):
    with service(tmp_path) as (url, svc, compiler):
        host, port = url.split("://")[1].split(":")
        for _ in range(3):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(b"POST /compile HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
                          b"\r\n" + _model_bytes()[:1000])
            # the client vanished mid-upload
        status, body, _ = _request(url, "POST", "/compile", _model_bytes())
        assert status == 200 and len(compile_calls(compiler)) == 1


def test_a_full_queue_answers_503_busy(tmp_path):
    models = [_model_bytes(n) for n in (MOBILENET, "mobilenet_v2_1.0_224_quant",
                                        "split_concat")]
    with service(tmp_path, delay=3.0, max_concurrent=1, max_queue=1) as (url, svc, _):
        RemoteCompiler(url).version
        results = {}

        def post(i):
            results[i] = _request(url, "POST", "/compile", models[i])

        first = threading.Thread(target=post, args=(0,))
        first.start()
        _wait(lambda: svc.status()["compiling"] == 1)
        second = threading.Thread(target=post, args=(1,))
        second.start()
        _wait(lambda: svc.status()["waiting"] == 1)
        status, body, headers = _request(url, "POST", "/compile", models[2])
        assert status == 503 and "busy" in body["error"] and headers["Retry-After"]
        first.join()
        second.join()
        assert results[0][0] == results[1][0] == 200


def _wait(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_the_service_never_runs_a_shell(tmp_path, monkeypatch):
    seen = []
    real = subprocess.Popen

    def recording(*args, **kwargs):
        seen.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording)
    with service(tmp_path) as (url, _svc, compiler):
        assert _request(url, "POST", "/compile", _model_bytes())[0] == 200
    assert seen and all(not kw.get("shell") and isinstance(args[0], list)
                        and args[0][0] == str(compiler) for args, kw in seen)


# -- the client -------------------------------------------------------------------------


def test_remote_compiler_maps_segments_like_a_local_edgetpu_compiler(tmp_path):
    model = load_model(shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite"))
    with service(tmp_path, token=TOKEN) as (url, _svc, _):
        remote = RemoteCompiler(url, token=TOKEN)
        assert (remote.id, remote.version) == ("remote", f"edgetpu_compiler {VERSION}")
        result = compile_model(model, compiler=remote)
    assert result.plan.summary["tpu_ops"] == 64 and result.compiler.startswith("remote ")
    assert load_model(result.to_bytes()).is_edgetpu_compiled


def test_a_corrupted_answer_is_refused_and_nothing_is_cached(tmp_path, monkeypatch):
    from coralrt._compile.jit import jit_compile
    from coralrt._server.service import CompileService

    real = CompileService.compile

    async def corrupting(self, data):
        answer = await real(self, data)
        blob = bytearray(answer["compiled"])
        blob[len(blob) // 2] ^= 0xFF
        return {**answer, "compiled": bytes(blob)}

    monkeypatch.setattr(CompileService, "compile", corrupting)
    cache = CompileCache(tmp_path / "client-cache", enabled=True)
    with service(tmp_path) as (url, _svc, _):
        with pytest.raises(CompileServiceError, match="does not match the SHA-256"):
            jit_compile(shared_model(f"{MOBILENET}.tflite"), compiler=RemoteCompiler(url),
                        cache=cache)
    assert cache.info()["entries"] == 0


def test_an_unreachable_service_is_a_typed_error_in_bounded_time():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # nothing listens there once closed
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    with pytest.raises(CompileServiceError) as info:
        RemoteCompiler(url, timeout=5).compile_segment(load_model(_model_bytes()))
    assert time.monotonic() - t0 < 5
    assert info.value.url == url and "connection refused" in str(info.value)
    assert info.value.status is None


def test_a_service_that_never_answers_times_out(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)    # accepts connections (the kernel does) but never answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(CompileServiceError) as info:
            RemoteCompiler(url, timeout=1.5).compile_raw(_model_bytes())
        assert time.monotonic() - t0 < 6
    assert "timed out" in str(info.value) and url in str(info.value)


def test_urls_and_tokens_in_clear():
    assert check_url("https://builder:9000/coral/", token=True) == ("https", "builder",
                                                                    9000, "/coral")
    assert check_url("http://localhost", token=True)[2] == 8765
    for bad in ("builder:8765", "ftp://builder", "http://", "http://h/?q=1",
                "http://user:pw@builder"):
        with pytest.raises(ConfigError):
            check_url(bad, token=False)
    with pytest.raises(ConfigError, match="in clear"):
        RemoteCompiler("http://builder.example:8765", token=TOKEN)
    RemoteCompiler("http://builder.example:8765")          # no token: nothing to leak
    RemoteCompiler("http://127.0.0.1:8765", token=TOKEN)   # a tunnel to this machine


def test_tls_with_the_services_certificate(tmp_path):
    trustme = pytest.importorskip("trustme")
    from coralrt._server.app import tls_context

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    context = tls_context(str(tmp_path / "server.pem"), str(tmp_path / "server.pem"))
    with service(tmp_path, token=TOKEN, ssl_context=context) as (url, _svc, _):
        assert url.startswith("https://")
        with pytest.raises(CompileServiceError, match="certificate does not verify"):
            RemoteCompiler(url, token=TOKEN).health()
        remote = RemoteCompiler(url, token=TOKEN, ca_file=tmp_path / "ca.pem")
        assert remote.health()["compiler"]["version"] == VERSION
        compiled, _log, _ = remote.compile_raw(_model_bytes())
        assert load_model(compiled).is_edgetpu_compiled


# -- sessions, settings and the command ------------------------------------------------


@pytest.fixture
def fresh_plugins():
    from coralrt.plugins import _host as plugins
    plugins.reset()
    yield
    plugins.reset()


def test_session_on_coral_compiles_through_the_service(tmp_path, monkeypatch, fresh_plugins):
    import numpy as np
    from support.sim import accept_dwn1

    from coralrt import InferenceSession
    from coralrt.testing import SimulatedBackend
    from coralrt import open_device

    monkeypatch.setenv(config.CACHE_DIR, str(tmp_path / "client-cache"))
    stick = open_device(None, accept_dwn1(SimulatedBackend(firmware_loaded=True,
                                                           time_scale=0.0,
                                                           lock_scope="process")))
    try:
        with service(tmp_path, token=TOKEN) as (url, svc, compiler):
            monkeypatch.setenv(config.COMPILER_TOKEN, TOKEN)
            session = InferenceSession(shared_model(f"{MOBILENET}.tflite"), target="coral",
                                       device=stick, compiler_url=url)
            assert session.compile_info["compiler"] == f"remote edgetpu_compiler {VERSION}"
            assert session.compile_info["cache_hit"] is False
            (inp,) = session.get_inputs()
            session.run({inp.name: np.zeros(inp.shape, inp.dtype)})
            assert [r["kind"] for r in session.profile()] == ["tpu"]
            # CORALRT_COMPILER_URL registers the same compiler for every session.
            monkeypatch.setenv(config.COMPILER_URL, url)
            from coralrt.plugins._host import plugin_host, reset
            reset()   # the process-wide host was built before the variable was set
            assert plugin_host().compilers.for_device("usb").url == url
            again = InferenceSession(shared_model(f"{MOBILENET}.tflite"), target="coral",
                                     device=stick)
            assert again.compile_info["cache_hit"] is True
            assert len(compile_calls(compiler)) == 1
    finally:
        stick.close()


def test_a_bad_compiler_url_names_the_variable(monkeypatch, fresh_plugins):
    from coralrt import InferenceSession

    monkeypatch.setenv(config.COMPILER_URL, "builder:8765")
    with pytest.raises(ConfigError, match="CORALRT_COMPILER_URL"):
        InferenceSession(shared_model(f"{MOBILENET}.tflite"), target="cpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_compiler_command_serves_until_stopped(tmp_path):
    compiler = stand_in(tmp_path / "bin")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    port = _free_port()
    env = {**os.environ, "FAKE_EDGETPU_MODELS": str(shared_model("MANIFEST.md").parent)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "coralrt", "serve-compiler", "--port", str(port),
         "--compiler", str(compiler), "--token-file", str(token),
         "--cache-dir", str(tmp_path / "svc")],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        remote = RemoteCompiler(url, token=TOKEN, timeout=30)
        deadline = time.monotonic() + 30
        while True:
            try:
                assert remote.health()["compiler"]["version"] == VERSION
                break
            except CompileServiceError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.2)
        compiled, _log, _ = remote.compile_raw(_model_bytes())
        assert load_model(compiled).is_edgetpu_compiled
        assert any(p.suffix == ".bin" for p in (tmp_path / "svc").rglob("*"))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"coralrt compile service on http://127.0.0.1:{port}" in out
    assert "token required" in out


@pytest.mark.parametrize("args, words", [
    (["--host", "0.0.0.0"], "without --token-file"),
    (["--tls-cert", "x.pem"], "go together"),
    (["--token-file", "short"], "at least 16"),
])
def test_serve_compiler_refuses_unsafe_settings(tmp_path, args, words, capsys):
    from coralrt._cli.main import main

    (tmp_path / "short").write_text("abc")
    os.chdir(tmp_path)
    assert main(["serve-compiler", *args]) == 1
    assert words in capsys.readouterr().err


def test_compile_command_with_a_compile_service(tmp_path, monkeypatch, capsys):
    from coralrt._cli.main import main

    monkeypatch.chdir(tmp_path)
    model = str(shared_model(f"{MOBILENET}.tflite"))
    with service(tmp_path, token=TOKEN) as (url, _svc, compiler):
        monkeypatch.setenv(config.COMPILER_TOKEN, TOKEN)
        assert main(["compile", "--compiler-url", url, model]) == 0
        out = tmp_path / f"{MOBILENET}_edgetpu.tflite"
        assert load_model(out.read_bytes()).is_edgetpu_compiled
        assert f"remote edgetpu_compiler {VERSION}" in capsys.readouterr().out
        assert main(["compile", "--compiler-url", url, "--num-segments", "2", model,
                     "-o", "x.tflite"]) == 1
        assert "a compile service compiles one model per request" in capsys.readouterr().err
        assert len(compile_calls(compiler)) == 1
    assert main(["compile", "--compiler", "remote", model, "-o", "y.tflite"]) == 1
    assert "CORALRT_COMPILER_URL" in capsys.readouterr().err


def test_doctor_reports_what_the_service_answers(tmp_path, monkeypatch, capsys):
    from coralrt._cli.main import main

    with service(tmp_path, token=TOKEN) as (url, _svc, _):
        monkeypatch.setenv(config.COMPILER_URL, url)
        main(["doctor"])
        assert "did not accept the token" in capsys.readouterr().out
        monkeypatch.setenv(config.COMPILER_TOKEN, TOKEN)
        main(["doctor", "--json"])
        (remote,) = [p for p in json.loads(capsys.readouterr().out)["compile_paths"]
                     if p["path"] == "remote"]
        assert f"answers with edgetpu_compiler {VERSION}" in remote["detail"]
    main(["doctor"])
    assert f"{url} (not usable: cannot connect: connection refused" in capsys.readouterr().out


def test_an_oversized_chunked_upload_is_refused_without_a_length(tmp_path):
    with service(tmp_path, max_upload_bytes=4096) as (url, _svc, compiler):
        host, port = url.split("://")[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            conn.request("POST", "/compile", body=iter([b"\0" * 3000] * 3),
                         encode_chunked=True)
            r = conn.getresponse()
            assert r.status == 413 and "limit of 4096" in json.loads(r.read())["error"]
        finally:
            conn.close()
        assert _request(url, "GET", "/health")[0] == 200 and compile_calls(compiler) == []
