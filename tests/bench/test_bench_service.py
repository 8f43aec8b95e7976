"""The compile service on loopback: N concurrent clients.

The service is the real command, ``coralrt serve-compiler``, in a process of
its own; the clients are N processes (machines of a fleet would be), each
running the ``remote`` compiler's requests.  Clients and service share the
machine's cores.

- cache hits: N clients each post the same segment (already compiled)
  K times; the latency of every request is recorded and p50/p99 reported, with
  the requests per second of the whole burst;
- compiles: M distinct segments (MobileNet v1 0.25 with M different
  descriptions, so M different uploads the stand-in maps) posted by N clients
  at once; seconds per compile with the service's default two compile slots.

The compiler is the stand-in (tests/support/fake_edgetpu_compiler.py: a Python
process that loads coralrt, about 0.3-0.5 s per run), not edgetpu_compiler:
the compile rate measures the service's scheduling around a compiler of that
cost, not the real compiler's speed.  Not pass/fail.
"""

from __future__ import annotations

import dataclasses
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

import pytest
from conftest import REPO_ROOT, shared_model

pytest.importorskip("aiohttp", reason="the compile service needs aiohttp (coralrt[server])")

from support.service import compile_calls, stand_in  # noqa: E402

from coralrt._compile.remote import RemoteCompiler  # noqa: E402
from coralrt.errors import CompileServiceError  # noqa: E402
from coralrt._model import load_model  # noqa: E402

pytestmark = pytest.mark.bench

MODEL = "mobilenet_v1_0.25_128_quant.tflite"
CLIENTS = 8
REQUESTS_PER_CLIENT = 25
DISTINCT = 8


@pytest.fixture(autouse=True)
def _models(monkeypatch):
    monkeypatch.setenv("FAKE_EDGETPU_MODELS", str(shared_model("MANIFEST.md").parent))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _hits(args) -> list[float]:
    url, data, n = args
    remote = RemoteCompiler(url)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        remote.compile_raw(data)
        times.append(time.perf_counter() - t0)
    return times


def _compile(args) -> None:
    url, data = args
    RemoteCompiler(url).compile_raw(data)


@contextmanager
def _served(tmp_path):
    """The URL of ``coralrt serve-compiler`` over the stand-in, in its own process."""
    compiler = stand_in(tmp_path / "bin")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "coralrt", "serve-compiler", "--port",
                             str(port), "--compiler", str(compiler), "--cache-dir",
                             str(tmp_path / "svc")], cwd=REPO_ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                RemoteCompiler(url).version
                break
            except CompileServiceError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        yield url, compiler
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.benchmark(group="compile service")
def test_cache_hit_latency(benchmark, record_value, tmp_path):
    data = shared_model(MODEL).read_bytes()
    with _served(tmp_path) as (url, _), ProcessPoolExecutor(CLIENTS) as pool:
        RemoteCompiler(url).compile_raw(data)   # the one compile; every request below hits

        def burst():
            t0 = time.perf_counter()
            jobs = [(url, data, REQUESTS_PER_CLIENT)] * CLIENTS
            times = [t for ts in pool.map(_hits, jobs) for t in ts]
            return times, time.perf_counter() - t0

        times, seconds = benchmark.pedantic(burst, rounds=3, iterations=1)
    record_value(f"service cache hit p50 ({CLIENTS} client processes)", statistics.median(times))
    record_value(f"service cache hit p99 ({CLIENTS} client processes)",
                 _percentile(times, 0.99))
    record_value("service cache hits: seconds per hit over a burst", seconds / len(times))


@pytest.mark.benchmark(group="compile service")
def test_compiles_per_second(benchmark, record_value, tmp_path):
    model = load_model(shared_model(MODEL))
    rounds = iter(range(1000))

    def uploads():
        r = next(rounds)
        return [dataclasses.replace(model, description=f"variant {r}.{i}").to_bytes()
                for i in range(DISTINCT)]

    with _served(tmp_path) as (url, compiler), ProcessPoolExecutor(CLIENTS) as pool:
        def burst(blobs):
            t0 = time.perf_counter()
            list(pool.map(_compile, [(url, b) for b in blobs]))
            return time.perf_counter() - t0

        seconds = benchmark.pedantic(burst, setup=lambda: ((uploads(),), {}), rounds=3,
                                     iterations=1)
        assert len(compile_calls(compiler)) == 3 * DISTINCT
    record_value(f"service seconds per compile ({DISTINCT} distinct, {CLIENTS} clients, "
                 f"stand-in compiler)", seconds / DISTINCT)
