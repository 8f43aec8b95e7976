"""What compiled files are, as the command line names them.

``coralrt compile``'s native output holds coralrt's own programs: it runs on
the simulated Edge TPU only, and the command, ``inspect`` and a ``coral``
session say so.  ``inspect`` shows an edgetpu_compiler build only when the
package records one.
"""

from __future__ import annotations

import json

import pytest
from conftest import shared_model

from coralrt import InferenceSession
from coralrt._cli.main import main
from coralrt.errors import CompilerUnavailableError

MOBILENET = "mobilenet_v1_0.25_128_quant.tflite"


@pytest.fixture
def native_output(tmp_path, capsys):
    out = tmp_path / "m_coralrt.tflite"
    assert main(["compile", str(shared_model(MOBILENET)), "-o", str(out)]) == 0
    return out, capsys.readouterr().out


def test_native_compile_says_it_runs_on_sim_only(native_output, tmp_path, capsys):
    out, text = native_output
    last = text.strip().splitlines()[-1]
    assert last.startswith(f"{out} is compiled by coralrt for the simulated Edge TPU: it runs "
                           f"with --target sim (target='sim') only.")
    assert "--compiler edgetpu_compiler" in last and "compile service" in last
    assert main(["compile", str(shared_model(MOBILENET)), "-o", str(tmp_path / "j.tflite"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs_on"] == "sim"


def test_inspect_names_the_native_output(native_output, capsys):
    out, _ = native_output
    assert main(["inspect", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["compiled_by"] == "coralrt" and r["edgetpu_compiled"] is False
    assert main(["inspect", str(out)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines()
                if x.startswith("edgetpu compiled"))
    assert "compiled by coralrt for the simulated Edge TPU (runs with target='sim' only" in line
    assert main(["inspect", str(shared_model(MOBILENET)), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["compiled_by"] is None


def test_coral_target_names_the_native_output_for_what_it_is(native_output, monkeypatch,
                                                             tmp_path):
    out, _ = native_output
    for var in ("CORALRT_EDGETPU_COMPILER", "CORALRT_COMPILER_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))          # no edgetpu_compiler on it
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(CompilerUnavailableError) as e:
        InferenceSession(out, target="coral")
    text = str(e.value)
    assert "compiled by coralrt for the simulated Edge TPU, which runs only with " \
           "target='sim'" in text
    assert "not compiled for the Edge TPU" not in text
    assert InferenceSession(out, target="sim").run  # the same file runs on sim


@pytest.mark.parametrize("name, build", [
    ("edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite", None),    # stores "cl/" only
    ("edgetpu/split_concat_edgetpu.tflite", "cl/343520747"),
])
def test_inspect_shows_the_compiler_build_only_when_recorded(name, build, capsys):
    assert main(["inspect", str(shared_model(name))]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "min runtime version" in x)
    assert "cl/," not in line and not line.endswith("cl/") and "compiler -" not in line
    if build is None:
        assert "compiler" not in line
    else:
        assert line.endswith(f", compiler build {build}")


def test_serve_compiler_without_a_compiler_gives_the_remedy(monkeypatch, tmp_path, capsys):
    """Not 'run coralrt serve-compiler' (this command): install edgetpu_compiler here, or
    name it with --compiler."""
    pytest.importorskip("aiohttp", reason="the compile service needs the server extra")
    monkeypatch.delenv("CORALRT_EDGETPU_COMPILER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["serve-compiler"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("coralrt: error: the compile service runs edgetpu_compiler, and "
                          "here it is missing")
    assert "--compiler PATH" in err and "apt-get install edgetpu-compiler" in err
    assert "serve-compiler" not in err and "CORALRT_COMPILER_URL" not in err
