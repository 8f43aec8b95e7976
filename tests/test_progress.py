"""Progress bars: drawn by the CLI on a terminal only; the library never prints."""

from __future__ import annotations

import io
import sys

import pytest
from conftest import shared_model

from coralrt._cli import _progress
from coralrt._cli.main import main
from coralrt._compile.cache import CompileCache
from coralrt._compile.cache_archive import export_cache
from coralrt._compile.segments import compile_model
from coralrt._compile.jit import jit_compile
from coralrt._compile.partition import partition
from coralrt import load_model

pytest.importorskip("tqdm")

DEEPLAB = "deeplabv3_mnv2_dm05_pascal_quant.tflite"


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """``terminal()`` makes stderr a terminal (call it in the test: pytest's own
    capture puts its stream back between setup and call); bars are drawn at
    once (no 1 s delay)."""
    monkeypatch.setattr(_progress, "DELAY", 0)

    def install(stream=None):
        stream = TTY() if stream is None else stream
        monkeypatch.setattr(sys, "stderr", stream)
        return stream
    return install


def _compile(tmp_path, *extra) -> int:
    return main(["compile", str(shared_model(DEEPLAB)), "-o", str(tmp_path / "d.tflite"),
                 "--force", *extra])


def test_compile_draws_a_bar_that_reaches_its_total(tmp_path, capsys, terminal):
    stderr = terminal()
    assert _compile(tmp_path) == 0
    tpu_ops = partition(load_model(shared_model(DEEPLAB)), "multi").summary["tpu_ops"]
    drawn = stderr.getvalue()
    assert "compiling Edge TPU segments" in drawn
    assert f"{tpu_ops}/{tpu_ops}" in drawn and "100%" in drawn


@pytest.mark.parametrize("extra", [["--json"], ["-q"], ["--quiet"]])
def test_json_and_quiet_draw_nothing(tmp_path, capsys, terminal, extra):
    stderr = terminal()
    assert _compile(tmp_path, *extra) == 0
    assert stderr.getvalue() == ""


def test_not_a_terminal_draws_nothing(tmp_path, capsys, terminal):
    stream = terminal(io.StringIO())          # isatty() is False
    assert _compile(tmp_path) == 0
    assert stream.getvalue() == ""


def test_without_tqdm_nothing_breaks(tmp_path, capsys, terminal, monkeypatch):
    stderr = terminal()
    monkeypatch.setitem(sys.modules, "tqdm", None)
    assert _compile(tmp_path) == 0
    assert stderr.getvalue() == ""


def test_cold_load_in_run_and_bench_draws_bars(tmp_path, capsys, terminal, monkeypatch):
    stderr = terminal()
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "cache"))
    model = str(shared_model("mobilenet_v1_0.25_128_quant.tflite"))
    assert main(["run", model, "--target", "sim", "--repeat", "1"]) == 0
    assert "compiling Edge TPU segments" in stderr.getvalue()     # cold: compiled
    stderr.seek(0)
    stderr.truncate()
    assert main(["bench", model, "--repeat", "3", "--warmup", "1"]) == 0
    drawn = stderr.getvalue()
    assert "compiling" not in drawn                                # warm: from the cache
    assert "bench" in drawn and "4/4" in drawn                     # warmup + repetitions


def test_cache_export_draws_a_bar(tmp_path, capsys, terminal, monkeypatch):
    stderr = terminal()
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "cache"))
    jit_compile(str(shared_model(DEEPLAB)), cache=CompileCache())
    assert main(["cache", "export", str(tmp_path / "a.tar")]) == 0
    assert "exporting" in stderr.getvalue() and "100%" in stderr.getvalue()


def test_library_functions_print_nothing(tmp_path, capfd):
    model = load_model(shared_model(DEEPLAB))
    events, seen = [], []
    result = compile_model(model, on_plan=lambda plan: seen.append(plan),
                           on_segment=lambda *a: seen.append(a))
    cache = CompileCache(tmp_path / "cache")
    jit_compile(str(shared_model(DEEPLAB)), cache=cache,
                events=lambda **event: events.append(event))
    done = []
    export_cache(cache, tmp_path / "a.tar.gz", progress=lambda d, t: done.append((d, t)))
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert len(seen) == 1 + len(result.plan.segments)
    kinds = [e["kind"] for e in events]
    assert kinds == ["cache_miss", "segments_planned",
                     *["segment_compiled"] * len(result.plan.segments), "compiled"]
    planned = events[1]
    assert planned["segments"] == len(result.plan.segments)
    assert planned["operators"] == sum(e["operators"] for e in events
                                       if e["kind"] == "segment_compiled")
    assert done[0][0] == 0 and done[-1][0] == done[-1][1] > 0
