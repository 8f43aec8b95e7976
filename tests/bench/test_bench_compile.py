"""Just-in-time compile cost: a cold compile of MobileNet v2 (goal: under 1 s)
against creating a session whose compiled model is already in the cache
(goal: at least 10x faster).  Both in the same run; the conftest prints the
ratio.
"""

from __future__ import annotations

import pytest
from conftest import shared_model

from coralrt import InferenceSession
from coralrt._compile.cache import CompileCache
from coralrt._compile.jit import jit_compile

pytestmark = pytest.mark.bench

BENCH_MODEL = "mobilenet_v2_1.0_224_quant.tflite"
GROUP = "mobilenet_v2_1.0_224_quant jit"


def create_sim_session(path):
    return InferenceSession(path, target="sim").compile_info


@pytest.mark.benchmark(group=GROUP)
def test_cold_compile(benchmark, record_median, tmp_path):
    path = shared_model(BENCH_MODEL)
    cache = CompileCache(tmp_path, enabled=False)

    def cold():
        return jit_compile(path, cache=cache)

    result = benchmark.pedantic(cold, rounds=5, warmup_rounds=1, iterations=1)
    record_median("compile_cold", benchmark)
    assert result.compile_info["cache_hit"] is False and result.compile_info["segments"] == 1


@pytest.mark.benchmark(group=GROUP)
def test_session_creation_cache_hit(benchmark, record_median):
    path = shared_model(BENCH_MODEL)
    assert create_sim_session(path)["cache_hit"] is False  # fills the cache
    info = benchmark.pedantic(create_sim_session, args=(path,), rounds=20, warmup_rounds=2,
                              iterations=1)
    record_median("session_cache_hit", benchmark)
    assert info["cache_hit"] is True
