"""Throughput of ``coralrt.gp`` on 1, 2 and 4 timing-only simulated sticks.

The sticks are ``SimulatedBackend(timing_only=True)`` (as in
test_bench_throughput.py): every tile-model run waits the latency model's
estimate and answers zeros, so what is measured is coralrt.gp's host side
(checks, quantization, tiling, scheduler, sessions, USB driver and framing,
accumulation) plus the estimated device time as wall time, not the
simulator's numpy kernels.  The results are zeros: only the time means
anything.  Figures are the latency model's, not a real stick's; docs/gp.md
quotes them.

- ``test_gp_matmul``: one 512 x 512 @ 512 x 512 ``ctx.matmul`` (64 tile jobs:
  4 K tiles x 4 N tiles x 4 row blocks of 128), tile jobs per second.
- ``test_gp_burst``: 16 independent element-wise tasks (``ctx.submit``: add,
  sub, mul, tanh in turn) on 256 x 256 arrays (4 tiles each, 64 jobs), then
  ``sync``.

Each context runs its work once before timing (the first call builds and
compiles the tile models and opens the sessions).  numpy's time for the same
work on this CPU is measured too and printed with the table.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from support.sim import timing_sticks

from coralrt import gp

pytestmark = pytest.mark.bench

N = 512                      # matmul size
SIDE, TASKS = 256, 16        # burst: TASKS tasks on SIDE x SIDE arrays
BURST_OPS = ("add", "sub", "mul", "tanh")
STICKS = (1, 2, 4)
_RESULTS: dict = {}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))


def _numpy_seconds(fn, rounds: int = 21) -> tuple[float, float]:
    """(median, best) seconds of ``fn``; numpy's BLAS uses both cores, so other work
    on the machine shows in the median more than in the best round."""
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)), min(times)


def _matmul_data():
    rng = np.random.default_rng(7)
    return rng.uniform(0, 1, (N, N)), rng.uniform(0, 1, (N, N))


def _burst_data():
    rng = np.random.default_rng(8)
    return [(rng.uniform(-1, 1, (SIDE, SIDE)), rng.uniform(-1, 1, (SIDE, SIDE)))
            for _ in range(TASKS)]


_BURST_DATA = _burst_data()


def _burst(ctx, data):
    futures = []
    for i, (x, y) in enumerate(data):
        op = BURST_OPS[i % len(BURST_OPS)]
        futures.append(ctx.submit(op, x) if op == "tanh" else ctx.submit(op, x, y))
    ctx.sync()
    return [f.result() for f in futures]


_NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply}


def _numpy_burst(data):
    out = []
    for i, (x, y) in enumerate(data):
        op = BURST_OPS[i % len(BURST_OPS)]
        out.append(np.tanh(x) if op == "tanh" else _NUMPY[op](x, y))
    return out


def _report(case: str, n_sticks: int, seconds: float, jobs: int, device: float,
            record_value, capsys) -> None:
    """One case's figures; the whole table (with numpy's times) after the last case."""
    _RESULTS[(case, n_sticks)] = (seconds, jobs, device)
    record_value(f"gp {case} {n_sticks} stick(s) wall time", seconds)
    one = _RESULTS.get((case, 1))
    speedup = "" if one is None else f", {one[0] / seconds:.2f}x one stick"
    with capsys.disabled():
        print(f"\ngp {case}, {n_sticks} stick(s): {seconds * 1e3:.1f} ms, "
              f"{jobs / seconds:.0f} tile jobs/s{speedup}")
        if all((c, n) in _RESULTS for c in ("matmul", "burst") for n in STICKS):
            _table(record_value)


def _table(record_value) -> None:
    a, b = _matmul_data()
    np_matmul = _numpy_seconds(lambda: a @ b)
    np_burst = _numpy_seconds(lambda: _numpy_burst(_BURST_DATA))
    record_value("gp matmul numpy", np_matmul[0])
    record_value("gp burst numpy", np_burst[0])
    print("\ncoralrt.gp on timing-only simulated sticks; wall time: median of 10 rounds; "
          "numpy on this CPU: median (best) of 21")
    print("| work | sticks | tile jobs | wall time | tile jobs/s | speed-up | "
          "est. device time (busiest stick) | numpy |")
    print("|---|---|---|---|---|---|---|---|")
    for case, ref, what in (("matmul", np_matmul, f"{N}x{N} @ {N}x{N}"),
                            ("burst", np_burst, f"{TASKS} element-wise tasks, {SIDE}x{SIDE}")):
        one = _RESULTS[(case, 1)][0]
        for n in STICKS:
            seconds, jobs, device = _RESULTS[(case, n)]
            print(f"| {what} | {n} | {jobs} | {seconds * 1e3:.1f} ms | {jobs / seconds:.0f} | "
                  f"{one / seconds:.2f}x | {device * 1e3:.1f} ms | "
                  f"{ref[0] * 1e3:.2f} ({ref[1] * 1e3:.2f}) ms |")


def _jobs_and_device(ctx, before):
    s = ctx.stats()
    jobs = sum(s["jobs"]) - before[0]
    device = max(d - b for d, b in zip(s["device_seconds"], before[1]))
    return jobs, device


def _measure(benchmark, record_value, capsys, case: str, n_sticks: int, work) -> None:
    """Time ``work(ctx)`` on ``n_sticks`` timing-only sticks, after one untimed call
    that builds, compiles and opens the tile models' sessions."""
    sticks = timing_sticks(n_sticks)
    try:
        with gp.Context(target="sim", devices=sticks) as ctx:
            work(ctx)
            s = ctx.stats()
            before = (sum(s["jobs"]), s["device_seconds"])
            benchmark.pedantic(lambda: work(ctx), rounds=10, iterations=1, warmup_rounds=1)
            runs = 11 if getattr(benchmark, "stats", None) is not None else 1
            jobs, device = _jobs_and_device(ctx, before)
    finally:
        for d in sticks:
            d.close()
    stats = getattr(benchmark, "stats", None)
    if stats is None:
        return
    _report(case, n_sticks, stats.stats.median, jobs // runs, device / runs,
            record_value, capsys)


@pytest.mark.parametrize("n_sticks", STICKS)
@pytest.mark.benchmark(group="coralrt.gp 512x512 matmul on 1, 2, 4 sticks (timing-only sim)")
def test_gp_matmul(benchmark, record_value, n_sticks, capsys):
    a, b = _matmul_data()
    _measure(benchmark, record_value, capsys, "matmul", n_sticks, lambda ctx: ctx.matmul(a, b))


@pytest.mark.parametrize("n_sticks", STICKS)
@pytest.mark.benchmark(group="coralrt.gp burst of 16 element-wise tasks (timing-only sim)")
def test_gp_burst(benchmark, record_value, n_sticks, capsys):
    data = _BURST_DATA
    _measure(benchmark, record_value, capsys, "burst", n_sticks,
             lambda ctx: _burst(ctx, data))
