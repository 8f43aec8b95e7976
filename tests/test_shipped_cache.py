"""A compiled cache made on one machine runs on another that has no compiler.

"Machine A" compiles with the stand-in edgetpu_compiler (tests/support/
fake_edgetpu_compiler.py) into its cache and exports it; "machine B" has no
compiler on PATH (or a compile service that is down), imports the archive,
and runs the plain model on a (simulated) stick with target="coral".  The
simulated stick cannot execute Google's programs: what is checked is that the
imported program is the one that reaches it, without any compiler.
"""

from __future__ import annotations

import socket

import pytest
from conftest import shared_model
from support.service import stand_in

from coralrt import InferenceSession, _config as config
from coralrt._cli.main import main
from coralrt._compile.cache import CompileCache
from coralrt._compile.edgetpu_compiler import EdgeTpuCompiler
from coralrt._compile.jit import jit_compile, jit_lookup
from coralrt.errors import CompilerUnavailableError, CompileServiceError
from coralrt._formats.opnames import EDGETPU_OP

MODEL = "mobilenet_v1_0.25_128_quant"
VERSION = "16.0.384591198"


@pytest.fixture
def machines(tmp_path, monkeypatch):
    """Fresh plugin hosts, no compiler or service configured, the stand-in's models."""
    from coralrt.plugins import _host as plugins
    for name in (config.EDGETPU_COMPILER, config.COMPILER_URL, config.COMPILER_TOKEN):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_EDGETPU_MODELS", str(shared_model("MANIFEST.md").parent))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    plugins.reset()
    yield tmp_path
    plugins.reset()


@pytest.fixture
def stick():
    from support.sim import accept_dwn1

    from coralrt.testing import SimulatedBackend
    from coralrt import open_device
    device = open_device(None, accept_dwn1(SimulatedBackend(
        firmware_loaded=True, time_scale=0.0, lock_scope="process")))
    yield device
    device.close()


def _session(cache_dir, monkeypatch, stick):
    from coralrt.plugins import _host as plugins
    monkeypatch.setenv(config.CACHE_DIR, str(cache_dir))
    plugins.reset()
    return InferenceSession(shared_model(f"{MODEL}.tflite"), target="coral", device=stick)


def test_an_imported_cache_runs_without_any_compiler(machines, monkeypatch, stick, capsys):
    tmp = machines
    compiler = stand_in(tmp / "bin")
    # Machine A: the compiler is on PATH.
    monkeypatch.setenv("PATH", f"{compiler.parent}:/usr/bin:/bin")
    a = _session(tmp / "cache-a", monkeypatch, stick)
    assert a.compile_info["cache_hit"] is False
    assert a.compile_info["compiler"] == f"edgetpu_compiler {VERSION}"
    assert main(["cache", "export", str(tmp / "compiled.tar.gz"),
                 str(shared_model(f"{MODEL}.tflite"))]) == 0
    # Machine B: no compiler at all.
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(CompilerUnavailableError):
        _session(tmp / "cache-b", monkeypatch, stick)
    monkeypatch.setenv(config.CACHE_DIR, str(tmp / "cache-b"))
    assert main(["cache", "import", str(tmp / "compiled.tar.gz")]) == 0
    assert "edgetpu_compiler" in capsys.readouterr().out
    b = _session(tmp / "cache-b", monkeypatch, stick)
    assert b.compile_info["cache_hit"] is True
    assert b.compile_info["compiler"] == f"edgetpu_compiler {VERSION}"
    assert [op.name for op in b.model.main.operators] == [EDGETPU_OP]
    assert b.model.main.operators[0].custom_options == a.model.main.operators[0].custom_options
    assert [r["kind"] for r in (b.run(_zeros(b)), b.profile())[1]] == ["tpu"]
    # A compile service that is down is not needed either.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv(config.COMPILER_URL, f"http://127.0.0.1:{s.getsockname()[1]}")
    assert _session(tmp / "cache-b", monkeypatch, stick).compile_info["cache_hit"] is True
    with pytest.raises(CompileServiceError, match="connection refused"):
        _session(tmp / "cache-c", monkeypatch, stick)   # nothing cached there


def _zeros(session):
    import numpy as np
    (inp,) = session.get_inputs()
    return {inp.name: np.zeros(inp.shape, inp.dtype)}


class _Newer(EdgeTpuCompiler):
    version = "17.0.0"     # the same stand-in, reporting a later version


def test_the_newest_matching_entry_wins_and_others_do_not_match(machines):
    tmp = machines
    path = stand_in(tmp / "bin")
    cache = CompileCache(tmp / "cache", enabled=True)
    source = shared_model(f"{MODEL}.tflite")
    jit_compile(source, compiler=EdgeTpuCompiler(path), cache=cache)
    assert "16.0" in jit_lookup(source, device_kind="usb", cache=cache).compile_info["compiler"]
    jit_compile(source, compiler=_Newer(path), cache=cache)
    found = jit_lookup(source, device_kind="usb", cache=cache)
    assert found.compile_info["compiler"] == "edgetpu_compiler 17.0.0"
    # Other options, another device kind, another model: no match.
    assert jit_lookup(source, device_kind="usb", mode="compat", cache=cache) is None
    assert jit_lookup(source, device_kind="sim", cache=cache) is None
    assert jit_lookup(shared_model("split_concat.tflite"), device_kind="usb",
                      cache=cache) is None
    # The native compiler's programs are for the simulated stick only.
    jit_compile(source, cache=cache)
    assert jit_lookup(source, device_kind="usb", cache=cache).compile_info["compiler"] == \
        "edgetpu_compiler 17.0.0"
    assert "coralrt-native" in jit_lookup(source, device_kind="sim",
                                          cache=cache).compile_info["compiler"]
