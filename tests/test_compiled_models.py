"""Compiled models given to targets that cannot run them: say what happened, run
the plain model beside them when it is there, and refuse to compile them again."""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest

from coralrt import InferenceSession
from coralrt._cli.main import main
from coralrt._compile.segments import compile_model
from coralrt.errors import ModelError
from coralrt import load_model
from coralrt._model.compiled import compiled_by, expected_plain, plain_sibling
from tests.conftest import random_inputs, shared_model

COMPILED = "edgetpu/split_concat_edgetpu.tflite"
PLAIN = "split_concat.tflite"


@pytest.fixture
def pair(tmp_path):
    """The compiled split_concat model with its plain model beside it."""
    compiled = tmp_path / "split_concat_edgetpu.tflite"
    shutil.copy(shared_model(COMPILED), compiled)
    shutil.copy(shared_model(PLAIN), tmp_path / PLAIN)
    return compiled


@pytest.fixture
def lone(tmp_path):
    """The compiled model alone in its folder."""
    compiled = tmp_path / "split_concat_edgetpu.tflite"
    shutil.copy(shared_model(COMPILED), compiled)
    return compiled


@pytest.fixture
def no_stick(monkeypatch):
    import coralrt._usb
    monkeypatch.setattr(coralrt._usb, "list_devices", lambda: [])


def test_expected_plain_names():
    assert expected_plain("a/b/m_edgetpu.tflite").as_posix() == "a/b/m.tflite"
    assert expected_plain("m.tflite") is None
    assert expected_plain("_edgetpu.tflite") is None
    assert expected_plain(b"bytes") is None
    assert plain_sibling("/nonexistent/m_edgetpu.tflite") is None


@pytest.mark.parametrize("target", ["cpu", "sim"])
def test_refusal_names_where_the_plain_model_is_expected(lone, target):
    with pytest.raises(ModelError) as e:
        InferenceSession(lone, target=target)
    text = str(e.value)
    assert "compiled by edgetpu_compiler" in text and "target='coral'" in text
    assert str(lone.with_name(PLAIN)) in text and "none exists" in text
    assert "CORALRT_PLAIN_MODELS (not set" in text
    assert "no Coral USB Accelerator was found" not in text


def test_auto_without_a_stick_says_a_compiled_model_needs_one(lone, no_stick, caplog):
    with caplog.at_level(logging.INFO, logger="coralrt"), pytest.raises(ModelError) as e:
        InferenceSession(lone, target="auto")
    assert "no Coral USB Accelerator was found" in str(e.value)
    assert "runs anywhere" in str(e.value)
    # It does not claim to run on the CPU first and then fail.
    assert not any("running on the CPU" in r.getMessage() for r in caplog.records)


def test_compiled_bytes_refusal_says_what_was_looked_for(monkeypatch, tmp_path):
    monkeypatch.setenv("CORALRT_PLAIN_MODELS", str(tmp_path))
    with pytest.raises(ModelError, match=r"given as bytes, and no \*_edgetpu.tflite with the "
                                         r"same bytes is in the folders of "
                                         r"CORALRT_PLAIN_MODELS \(" + str(tmp_path)):
        InferenceSession(shared_model(COMPILED).read_bytes(), target="cpu")


@pytest.mark.parametrize("target", ["cpu", "sim", "auto"])
def test_plain_model_beside_the_compiled_one_runs_and_is_logged(pair, target, no_stick,
                                                                caplog):
    with caplog.at_level(logging.WARNING, logger="coralrt"):
        session = InferenceSession(pair, target=target)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(pair.with_name(PLAIN)) in m and "plain model" in m for m in messages)
    assert compiled_by(session.model) != "edgetpu_compiler"
    plain = InferenceSession(shared_model(PLAIN), target="cpu")
    feeds = random_inputs(plain.get_inputs(), seed=3)
    got, want = session.run(feeds), plain.run(feeds)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_sim_with_no_edge_tpu_segment_warns_once_and_profiles_it(caplog):
    path = shared_model("add_float.tflite")
    with caplog.at_level(logging.WARNING, logger="coralrt"):
        session = InferenceSession(path, target="sim")
    warned = [r for r in caplog.records if "maps to the Edge TPU" in r.getMessage()]
    assert len(warned) == 1 and "FLOAT32" in warned[0].getMessage()
    session.run(random_inputs(session.get_inputs()))
    rows = session.profile()
    assert rows and all("no Edge TPU segment" in r["note"] for r in rows)
    # A model that maps has no note and no warning.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="coralrt"):
        mapped = InferenceSession(shared_model(PLAIN), target="sim")
    assert not [r for r in caplog.records if "maps to the Edge TPU" in r.getMessage()]
    mapped.run(random_inputs(mapped.get_inputs()))
    assert all("note" not in r for r in mapped.profile())


def test_coralrt_compiled_model_on_cpu_points_to_sim(tmp_path):
    compiled = compile_model(load_model(shared_model(PLAIN))).to_bytes()
    with pytest.raises(ModelError) as e:
        InferenceSession(compiled, target="cpu")
    assert "target='sim'" in str(e.value) and "plugin" not in str(e.value)
    sim = InferenceSession(compiled, target="sim")
    assert any(r["kind"] == "tpu" for r in (sim.run(random_inputs(sim.get_inputs())),
                                            sim.profile())[1])


@pytest.mark.parametrize("command", ["partition", "compile"])
def test_cli_refuses_to_partition_or_compile_compiled_models(command, tmp_path, capsys):
    path = shared_model(COMPILED)
    args = [command, str(path)] + (["-o", str(tmp_path / "o.tflite")] if command == "compile"
                                   else [])
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "already compiled by edgetpu_compiler" in err and "plain .tflite" in err
    ours = tmp_path / "ours.tflite"
    ours.write_bytes(compile_model(load_model(shared_model(PLAIN))).to_bytes())
    args[1] = str(ours)
    assert main(args) == 1
    assert "already compiled by coralrt" in capsys.readouterr().err


# -- CORALRT_PLAIN_MODELS: plain models kept apart from the compiled ones -------------------

def _outputs(session) -> list:
    feed = [np.random.default_rng(3).integers(0, 255, i.shape, dtype=np.uint8)
            if i.dtype == np.uint8 else np.zeros(i.shape, i.dtype) for i in session.get_inputs()]
    return [np.asarray(o) for o in session.run(None, feed)]


@pytest.mark.parametrize("target", ["cpu", "sim"])
def test_the_plain_model_is_found_in_a_named_folder(lone, target, monkeypatch, tmp_path_factory):
    plain_dir = tmp_path_factory.mktemp("plain")
    shutil.copy(shared_model(PLAIN), plain_dir / PLAIN)
    with pytest.raises(ModelError):
        InferenceSession(lone, target=target)
    monkeypatch.setenv("CORALRT_PLAIN_MODELS",
                       os.pathsep.join([str(plain_dir / "absent"), str(plain_dir)]))
    assert plain_sibling(lone) == plain_dir / PLAIN
    session = InferenceSession(lone, target=target)
    reference = InferenceSession(shared_model(PLAIN), target="cpu")
    for got, want in zip(_outputs(session), _outputs(reference)):
        np.testing.assert_array_equal(got, want)


def test_compiled_bytes_find_their_plain_model_by_content(monkeypatch, tmp_path):
    # The compiled file in a named folder, its plain model beside it: bytes read from
    # anywhere are recognised as that file.
    shutil.copy(shared_model(COMPILED), tmp_path / "split_concat_edgetpu.tflite")
    shutil.copy(shared_model(PLAIN), tmp_path / PLAIN)
    (tmp_path / "other_edgetpu.tflite").write_bytes(b"x" * 10)   # not read: another size
    monkeypatch.setenv("CORALRT_PLAIN_MODELS", str(tmp_path))
    data = shared_model(COMPILED).read_bytes()
    assert plain_sibling(data) == tmp_path / PLAIN
    assert plain_sibling(data[:-1] + b"\0") is None          # same size, other bytes
    session = InferenceSession(data, target="sim")
    reference = InferenceSession(shared_model(PLAIN), target="cpu")
    for got, want in zip(_outputs(session), _outputs(reference)):
        np.testing.assert_array_equal(got, want)
