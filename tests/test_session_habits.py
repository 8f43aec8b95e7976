"""onnxruntime's habits in InferenceSession.run, signatures, and CORALRT_TARGET."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_model
from coralrt import InferenceSession, _config as config
from coralrt.errors import ConfigError, InputError

litert = pytest.importorskip("ai_edge_litert.interpreter")


@pytest.fixture
def split():
    with InferenceSession(shared_model("split_concat.tflite")) as sess:
        yield sess


def feed_of(sess, seed=0):
    rng = np.random.default_rng(seed)
    return {i.name: rng.integers(0, 255, i.shape, dtype=np.uint8) for i in sess.get_inputs()}


def test_run_none_feed_returns_every_output_as_a_list(split):
    feed = feed_of(split)
    as_dict = split.run(feed)
    got = split.run(None, feed)
    assert isinstance(got, list) and len(got) == len(as_dict)
    assert all(np.array_equal(g, w) for g, w in zip(got, as_dict.values()))
    # the feed may be a list in input order too
    got = split.run(None, list(feed.values()))
    assert all(np.array_equal(g, w) for g, w in zip(got, as_dict.values()))


def test_run_named_outputs_in_the_order_asked(split):
    feed = feed_of(split, 1)
    names = [o.name for o in split.get_outputs()][::-1]
    got = split.run(names, feed)
    want = split.run(feed)
    assert [g.shape for g in got] == [want[n].shape for n in names]
    assert all(np.array_equal(g, want[n]) for g, n in zip(got, names))
    assert split.run(("outputs/rnn1",), feed)[0].shape == (1, 8, 8, 1)


def test_onnxruntime_form_errors(split):
    feed = feed_of(split)
    with pytest.raises(InputError, match="do not also pass outputs="):
        split.run(None, feed, outputs=["outputs/rnn1"])
    with pytest.raises(InputError, match="output_names must be None or a list"):
        split.run("outputs/rnn1", feed)
    with pytest.raises(InputError, match="output_names must be None or a list"):
        split.run([1, 2], feed)
    with pytest.raises(InputError, match="run_options"):
        split.run(None, feed, object())
    assert len(split.run(None, feed, None)) == len(split.get_outputs())
    with pytest.raises(InputError, match="unknown output 'nope'"):
        split.run(["nope"], feed)
    with pytest.raises(InputError, match=r"got None \(onnxruntime's form"):
        split.run(None)


def test_coralrt_form_unchanged(split):
    feed = feed_of(split)
    got = split.run(feed, outputs=["outputs/rnn2"])
    assert list(got) == ["outputs/rnn2"]


# -- signatures --------------------------------------------------------------------------

def test_signatures_equal_litert():
    path = shared_model("multi_signatures.tflite")
    ref = litert.Interpreter(model_path=str(path))
    with InferenceSession(path) as sess:
        assert sess.get_signatures() == ref.get_signature_list()
        x = np.array([1.0, -2.0, 7.5], np.float32)
        for key in ("add", "sub"):
            want = ref.get_signature_runner(key)(x=x)
            got = sess.run({"x": x}, signature=key)
            assert list(got) == list(want) and np.array_equal(got["output_0"], want["output_0"])
            assert np.array_equal(sess.run(None, [x], signature=key)[0], want["output_0"])
            assert np.array_equal(sess.run(["output_0"], x, signature=key)[0], want["output_0"])
        # subgraph 1 has its own session, created once, closed with this one
        sub = sess.signature_session("sub")[0]
        assert sub is not sess and sess.signature_session("sub")[0] is sub
        assert sess.signature_session("add")[0] is sess
        with pytest.raises(InputError, match="unknown signature 'mul'; its signatures are "
                                             r"\['add', 'sub'\]"):
            sess.run({"x": x}, signature="mul")
        with pytest.raises(InputError, match=r"missing \['x'\], unknown \['y'\]"):
            sess.run({"y": x}, signature="add")
        with pytest.raises(InputError, match="unknown output 'nope'"):
            sess.run({"x": x}, outputs=["nope"], signature="add")


def test_signature_on_sim_shares_the_stick():
    path = shared_model("multi_signatures.tflite")
    x = np.array([4.0], np.float32)
    with InferenceSession(path, target="sim") as sess:
        got = sess.run({"x": x}, signature="sub")["output_0"]
        sub = sess.signature_session("sub")[0]
        assert sub.target == "sim" and sub.device is sess.device
        assert np.array_equal(got, litert.Interpreter(model_path=str(path))
                              .get_signature_runner("sub")(x=x)["output_0"])


def test_model_without_signatures(split):
    assert split.get_signatures() == {}
    with pytest.raises(InputError, match="it has no signatures"):
        split.run(feed_of(split), signature="serving_default")


# -- CORALRT_TARGET ------------------------------------------------------------------------

@pytest.mark.parametrize("value, want", [(None, "auto"), ("", "auto"), ("cpu", "cpu"),
                                         (" SIM ", "sim"), ("Coral", "coral"), ("auto", "auto")])
def test_compat_target(monkeypatch, value, want):
    monkeypatch.delenv("CORALRT_TARGET", raising=False)
    if value is not None:
        monkeypatch.setenv("CORALRT_TARGET", value)
    assert config.compat_target() == want


def test_compat_target_refuses_other_values(monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "gpu")
    with pytest.raises(ConfigError, match="CORALRT_TARGET='gpu' is not a target; use one of "
                                          "cpu, sim, coral, auto"):
        config.compat_target()
