"""``tools/pycoral_suite.py`` (``make pycoral-suite``): pycoral's own tests and examples
run unchanged on the simulator, their outcomes read from unittest's verbose output,
and an error caused by a file absent from the test data folder counted apart.

Nothing here needs pycoral or Coral's test data: the runner output below is
written for these tests in unittest's format, the end-to-end run uses a small
stand-in "checkout" written here, and the models are built in code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO_ROOT

from coralrt._model.compiled import not_on_host
from coralrt.testing import ModelBuilder

sys.path.insert(0, str(REPO_ROOT / "tools"))
import pycoral_examples  # noqa: E402
import pycoral_outcomes as oc  # noqa: E402
import pycoral_standins  # noqa: E402
import pycoral_suite  # noqa: E402

RULE_EQ, RULE_DASH = "=" * 70, "-" * 70


def _verdicts(text: str, data: Path, **kw) -> dict[str, oc.Verdict]:
    parsed = oc.parse(text)
    return {t.name: oc.classify(t, data, **kw) for t in parsed.tests.values()}


# -- reading unittest's verbose output ----------------------------------------------------


def test_parse_outcomes_with_noise_docstrings_subtests_and_old_style_ids(tmp_path):
    text = textwrap.dedent(f"""\
        test_a (tests.m_test.C.test_a) ... /x/y_edgetpu.tflite runs its plain model on 'sim'
        ok
        test_b (tests.m_test.C.test_b) ... skipped 'needs two sticks'
        test_c (tests.m_test.C)
        What test_c checks. ... FAIL
        test_d (tests.m_test.C.test_d) ...
          test_d (tests.m_test.C.test_d) (tpu=False) ... ERROR
          test_d (tests.m_test.C.test_d) (tpu=True) ... ERROR
        test_e (tests.m_test.C.test_e) ... expected failure
        test_f (tests.m_test.C.test_f) ... ok

        {RULE_EQ}
        FAIL: test_c (tests.m_test.C)
        What test_c checks.
        {RULE_DASH}
        Traceback (most recent call last):
          File "/p/tests/m_test.py", line 9, in test_c
            self.assertEqual(a, b)
        AssertionError: 3 != 4

        {RULE_EQ}
        ERROR: test_d (tests.m_test.C.test_d) (tpu=False)
        {RULE_DASH}
        Traceback (most recent call last):
          File "/p/tests/m_test.py", line 12, in test_d
        ValueError: Could not open '{tmp_path}/absent.tflite'.

        {RULE_EQ}
        ERROR: test_d (tests.m_test.C.test_d) (tpu=True)
        {RULE_DASH}
        Traceback (most recent call last):
          File "/p/tests/m_test.py", line 12, in test_d
        ValueError: Could not open '{tmp_path}/absent_edgetpu.tflite'.

        {RULE_DASH}
        Ran 6 tests in 0.1s

        FAILED (failures=1, errors=2, skipped=1)
        """)
    parsed = oc.parse(text)
    assert parsed.ran == 6
    tests = {name: t for (_, name), t in parsed.tests.items()}
    assert sorted(tests) == ["test_a", "test_b", "test_c", "test_d", "test_e", "test_f"]
    assert {t.where for t in tests.values()} == {"tests.m_test.C"}
    assert tests["test_a"].units[""].outcome == "ok"
    assert (tests["test_b"].units[""].outcome, tests["test_b"].units[""].reason) == (
        "skipped", "needs two sticks")
    assert tests["test_c"].units[""].outcome == "FAIL"
    assert oc.final_exception(tests["test_c"].units[""].traceback) == "AssertionError: 3 != 4"
    assert set(tests["test_d"].units) == {"", "(tpu=False)", "(tpu=True)"}

    verdicts = _verdicts(text, tmp_path)
    assert {n: v.status for n, v in verdicts.items()} == {
        "test_a": oc.PASSED, "test_b": oc.SKIPPED, "test_c": oc.FAILED,
        "test_d": oc.MISSING, "test_e": oc.PASSED, "test_f": oc.PASSED}
    assert verdicts["test_d"].missing == [tmp_path / "absent.tflite",
                                          tmp_path / "absent_edgetpu.tflite"]


def test_a_run_that_ends_early_leaves_a_test_without_outcome_which_is_a_failure(tmp_path):
    parsed = oc.parse("test_a (tests.m_test.C.test_a) ... ok\n"
                      "test_b (tests.m_test.C.test_b) ... Fatal Python error: Aborted\n")
    assert parsed.ran is None
    verdicts = {t.name: oc.classify(t, tmp_path) for t in parsed.tests.values()}
    assert verdicts["test_a"].status == oc.PASSED
    assert verdicts["test_b"].status == oc.FAILED
    assert "no outcome" in verdicts["test_b"].details[0][1]


def test_an_import_error_of_the_module_is_a_failure(tmp_path):
    text = (f"unittest.loader._FailedTest.m_test ... ERROR\n\n{RULE_EQ}\n"
            f"ERROR: m_test (unittest.loader._FailedTest.m_test)\n{RULE_DASH}\n"
            "ImportError: Failed to import test module: m_test\nTraceback (most recent call "
            "last):\n  File \"/p/tests/m_test.py\", line 3, in <module>\n"
            "ImportError: no module named pycoral.learn\n\n"
            f"{RULE_DASH}\nRan 1 test in 0.0s\n\nFAILED (errors=1)\n")
    (v,) = _verdicts(text, tmp_path).values()
    assert v.status == oc.FAILED
    assert v.details == [("", "ImportError: no module named pycoral.learn")]


def test_exceptions_in_a_tests_threads_are_not_hidden(tmp_path):
    """unittest counts a test whose threads raised as passed: the suite does not."""
    (tmp_path / "there.tflite").write_bytes(b"x")
    text = textwrap.dedent(f"""\
        test_two (tests.m_test.C.test_two) ... Exception in thread Thread-2 (detect):
        Traceback (most recent call last):
        Exception in thread Thread-1 (classify):
          File "/p/tests/m_test.py", line 58, in detect
        ValueError: Could not open '{tmp_path}/absent.tflite'.
        Traceback (most recent call last):
          File "/p/tests/m_test.py", line 40, in classify
        AssertionError: 'tabby' != 'Egyptian cat'
        ok
        test_one (tests.m_test.C.test_one) ... Exception in thread Thread-3 (detect):
        Traceback (most recent call last):
          File "/p/tests/m_test.py", line 58, in detect
        FileNotFoundError: [Errno 2] No such file or directory: 'absent.bmp'
        ok
        """)
    verdicts = _verdicts(text, tmp_path)
    assert verdicts["test_one"].status == oc.MISSING
    assert verdicts["test_one"].missing == [tmp_path / "absent.bmp"]
    assert verdicts["test_two"].status == oc.FAILED
    assert any("'tabby' != 'Egyptian cat'" in m and "counted the test as ok" in m
               for _, m in verdicts["test_two"].details)
    # On a stand-in model, a wrong label is the stand-in's, reported apart.
    assert _verdicts(text, tmp_path, stand_in_module=True)["test_two"].status == oc.DIFFERS


def test_two_threads_printing_at_once_still_name_both_absent_files(tmp_path):
    """Two threads' tracebacks written together can share a line, and echo the
    source line that raised (with a ``{...}`` f-string in it)."""
    a, b = tmp_path / "a_edgetpu.tflite", tmp_path / "b_edgetpu.tflite"
    text = textwrap.dedent(f"""\
        test_two (tests.m_test.C.test_two) ... Exception in thread Thread-1 (one):
        Traceback (most recent call last):
            Exception in thread Thread-2 (two):
          File "/p/x.py", line 130, in __init__
        ValueErrorraise ValueError(f"Could not open '{{os.fspath(path)}}'.")
        ValueError: : Could not open '{a}'.Could not open '{b}'.

        ok
        """)
    (v,) = _verdicts(text, tmp_path).values()
    assert v.status == oc.MISSING
    assert v.missing == [a, b]


# -- which errors are "missing data" ------------------------------------------------------


def test_missing_file_only_for_absent_files_under_the_data_folder(tmp_path):
    (tmp_path / "there.tflite").write_bytes(b"x")
    absent = tmp_path / "sub" / "absent.tflite"
    assert oc.missing_file(f"ValueError: Could not open '{absent}'.", tmp_path) == absent
    assert oc.missing_file("ValueError: Could not open 'sub/absent.tflite'.", tmp_path) == absent
    assert oc.missing_file("FileNotFoundError: [Errno 2] No such file or directory: "
                           f"'{absent}'", tmp_path) == absent
    assert oc.missing_file(f"ValueError: Failed to open file: {absent}", tmp_path) == absent
    # The file exists: whatever went wrong, it was not its absence.
    assert oc.missing_file(f"ValueError: Could not open '{tmp_path}/there.tflite'.",
                           tmp_path) is None
    # Outside the data folder: the program's own mistake, a failure.
    assert oc.missing_file("ValueError: Could not open '/nonexistent/x.tflite'.",
                           tmp_path) is None
    # A check of the test that quotes a path is not an absent file...
    assert oc.missing_file(f"AssertionError: 'Could not open '{absent}'' != 'x'",
                           tmp_path) is None
    # ...but assertRaisesRegex meeting "could not open" instead of its error is.
    assert oc.missing_file(f'AssertionError: "Interpreter \\d+ can not" does not match '
                           f'"Could not open \'{absent}\'."', tmp_path) == absent
    assert oc.missing_file("RuntimeError: Invoke called on model that is not ready.",
                           tmp_path) is None


def test_missing_plain_model_of_a_compiled_file_in_coralrts_own_words(tmp_path, monkeypatch):
    """The refusal of a compiled model whose plain model is absent, worded by
    coralrt/_model/compiled.py itself, counts as missing data."""
    monkeypatch.setenv("CORALRT_PLAIN_MODELS", str(tmp_path))
    compiled = tmp_path / "net_edgetpu.tflite"
    compiled.write_bytes(b"x")
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.uint8, scale=0.1, zero_point=0)
    y = b.tensor("y", (1, 4), np.uint8, scale=0.1, zero_point=0)
    b.op("edgetpu-custom-op", [x], [y])
    b.output(y)
    message = "coralrt.errors.ModelError: " + not_on_host(b.build(), str(compiled))
    assert "net.tflite" in message
    assert oc.missing_file(message, tmp_path) == tmp_path / "net.tflite"
    (tmp_path / "net.tflite").write_bytes(b"x")
    assert oc.missing_file(message, tmp_path) is None


def test_stand_in_differs_only_for_result_checks(tmp_path):
    text = textwrap.dedent(f"""\
        test_label (tests.m_test.C.test_label) ... FAIL
        test_error_text (tests.m_test.C.test_error_text) ... FAIL

        {RULE_EQ}
        FAIL: test_label (tests.m_test.C.test_label)
        {RULE_DASH}
        AssertionError: 'tabby' != 'Egyptian cat'

        {RULE_EQ}
        FAIL: test_error_text (tests.m_test.C.test_error_text)
        {RULE_DASH}
        AssertionError: "not ready" does not match "Tensor is unallocated"

        {RULE_DASH}
        Ran 2 tests in 0.1s
        """)
    plain = _verdicts(text, tmp_path)
    assert {n: v.status for n, v in plain.items()} == {"test_label": oc.FAILED,
                                                      "test_error_text": oc.FAILED}
    stand_in = _verdicts(text, tmp_path, stand_in_module=True)
    assert {n: v.status for n, v in stand_in.items()} == {"test_label": oc.DIFFERS,
                                                         "test_error_text": oc.FAILED}


# -- the tool end to end, on a checkout and a data folder written here ---------------------


def _classifier(path: Path, seed: int = 0) -> bytes:
    """A uint8 model of two 1x1 convolutions, its input named 'input' (as pycoral's
    pipeline test needs), written to ``path``."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("input", (1, 8, 8, 3), np.uint8, scale=0.02, zero_point=128)
    for j, c in enumerate((4, 5)):
        cin = 3 if j == 0 else 4
        w = b.constant(f"w{j}", rng.integers(0, 256, (c, 1, 1, cin), dtype=np.uint8),
                       scale=0.01, zero_point=128)
        bias = b.constant(f"b{j}", rng.integers(-200, 200, c).astype(np.int32),
                          scale=0.0002, zero_point=0)
        y = b.tensor(f"y{j}", (1, 8, 8, c), np.uint8, scale=0.05, zero_point=128)
        b.op("CONV_2D", [x, w, bias], [y], stride_w=1, stride_h=1, padding="SAME")
        x = y
    b.output(x)
    data = b.build().to_bytes()
    path.write_bytes(data)
    return data


FAKE_TEST = '''\
import unittest
from pycoral.utils.edgetpu import make_interpreter


class FakeTest(unittest.TestCase):
    def test_runs(self):
        interpreter = make_interpreter('tiny.tflite')
        interpreter.allocate_tensors()
        interpreter.invoke()

    def test_model_absent(self):
        make_interpreter('absent_edgetpu.tflite')

    def test_wrong(self):
        self.assertEqual(len(make_interpreter('tiny.tflite').get_output_details()), 2)

    @unittest.skip('needs a second stick')
    def test_skipped(self):
        pass
'''

FAKE_EXAMPLE = '''\
import argparse
from pycoral.utils.dataset import read_label_file
from pycoral.utils.edgetpu import make_interpreter
p = argparse.ArgumentParser()
for a in ("--model", "--labels", "--input"):
    p.add_argument(a, required=True)
args = p.parse_args()
make_interpreter(args.model).allocate_tensors()
print("-------RESULTS--------")
print("%s: 0.50000" % read_label_file(args.labels)[1])
'''


@pytest.fixture
def checkout(tmp_path):
    pycoral, data = tmp_path / "pycoral", tmp_path / "test_data"
    (pycoral / "tests").mkdir(parents=True)
    (pycoral / "examples").mkdir()
    (pycoral / "tests" / "__init__.py").write_text("")
    (pycoral / "tests" / "classify_test.py").write_text(FAKE_TEST)
    (pycoral / "examples" / "classify_image.py").write_text(FAKE_EXAMPLE)
    data.mkdir()
    _classifier(data / "tiny.tflite")
    return pycoral, data


def test_the_tool_counts_passed_failed_missing_and_skipped(checkout, tmp_path, capsys):
    pycoral, data = checkout
    code = pycoral_suite.main(["--pycoral-dir", str(pycoral), "--test-data", str(data),
                               "--only", "classify", "--only", "classify_image",
                               "--work", str(tmp_path / "work")])
    out = capsys.readouterr().out
    assert code == 1, out                           # test_wrong failed, its file exists
    row = next(ln for ln in out.splitlines() if ln.strip().startswith("classify "))
    assert row.split()[1:5] == ["1", "1", "1", "1"], out   # passed failed missing skipped
    assert "tests.classify_test.FakeTest.test_wrong\n    AssertionError: 1 != 2" in out
    assert "- classify: absent_edgetpu.tflite" in out
    assert "- tests.classify_test.FakeTest.test_skipped: needs a second stick" in out
    # The example lacks its files here: missing data, nothing run.
    assert re.search(r"classify_image +missing data .* absent: mobilenet_v2_1.0_224_inat", out)


def test_an_example_runs_with_its_files_and_its_output_is_checked(checkout, tmp_path, capsys):
    pycoral, data = checkout
    shutil.copy(data / "tiny.tflite", data / "mobilenet_v2_1.0_224_inat_bird_quant.tflite")
    (data / "inat_bird_labels.txt").write_text("0 background\n1 Ara macao\n")
    (data / "parrot.jpg").write_bytes(b"")
    code = pycoral_suite.main(["--pycoral-dir", str(pycoral), "--test-data", str(data),
                               "--only", "classify_image", "--work", str(tmp_path / "w")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "top-1 Ara macao: 0.50000" in out
    # A label the labels file does not have is a failure.
    (data / "inat_bird_labels.txt").write_text("1 Ara macao\n")
    (pycoral / "examples" / "classify_image.py").write_text(
        FAKE_EXAMPLE.replace("read_label_file(args.labels)[1]", "'no such bird'"))
    code = pycoral_suite.main(["--pycoral-dir", str(pycoral), "--test-data", str(data),
                               "--only", "classify_image", "--work", str(tmp_path / "w2")])
    out = capsys.readouterr().out
    assert code == 1
    assert "'no such bird' is not a label of the labels file" in out


def test_example_dataset_needs_two_classes(tmp_path):
    data = tmp_path / "d"
    (data / "imprinting").mkdir(parents=True)
    for name in ("imprinting/cat_train_0.bmp", "cat.bmp", "hot_dog.jpg"):
        (data / name).write_bytes(b"x")
    with pytest.raises(pycoral_examples.Missing):
        pycoral_examples.make_dataset(data, tmp_path / "set")
    (data / "imprinting" / "hotdog_test_0.bmp").write_bytes(b"x")
    folder = pycoral_examples.make_dataset(data, tmp_path / "set")
    assert sorted(p.name for p in folder.iterdir()) == ["cat", "hotdog"]
    assert sorted(p.name for p in (folder / "cat").iterdir()) == ["cat.bmp", "cat_train_0.bmp"]


def test_stand_in_segments_compose_to_the_whole_model(tmp_path):
    """The pipeline stand-ins: two plain segments cut from a model that exists, and
    the model itself as their reference, in an overlay that links every other file."""
    from coralrt import InferenceSession

    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "cat.bmp").write_bytes(b"x")
    whole = _classifier(data / "mobilenet_v1_0.25_128_quant.tflite")
    overlay = pycoral_standins.build_overlay(data, tmp_path / "overlay", None)
    root = overlay.root
    assert (root / "sub" / "cat.bmp").resolve() == (data / "sub" / "cat.bmp").resolve()
    seg0 = root / "pipeline/inception_v3_299_quant_segment_0_of_2_edgetpu.tflite"
    seg1 = root / "pipeline/inception_v3_299_quant_segment_1_of_2_edgetpu.tflite"
    assert (root / "inception_v3_299_quant_edgetpu.tflite").read_bytes() == whole
    assert overlay.is_stand_in(seg0) and not overlay.is_stand_in(root / "sub" / "cat.bmp")
    x = np.random.default_rng(1).integers(0, 256, (1, 8, 8, 3), dtype=np.uint8)
    mid = InferenceSession(seg0.read_bytes(), target="sim").run({"input": x})
    assert list(mid) == ["y0"]
    got = InferenceSession(seg1.read_bytes(), target="sim").run(mid)
    want = InferenceSession(whole, target="sim").run({"input": x})
    np.testing.assert_array_equal(got["y1"], want["y1"])
    # No source for the classifier and detector stand-ins: listed as not made.
    listing = (root / "STAND-INS.md").read_text()
    assert "`pipeline/inception_v3_299_quant_segment_0_of_2_edgetpu.tflite`" in listing
    assert "mobilenet_v1_1.0_224_quant_edgetpu.tflite`: no usable source" in listing


def test_a_stand_in_source_without_an_input_named_input_is_not_used(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    b = ModelBuilder()
    x = b.input("image", (1, 4), np.uint8, scale=0.1, zero_point=0)
    y = b.tensor("y", (1, 4), np.uint8, scale=0.1, zero_point=0)
    b.op("RELU", [x], [y])
    b.output(y)
    (data / "mobilenet_v1_0.25_128_quant.tflite").write_bytes(b.build().to_bytes())
    overlay = pycoral_standins.build_overlay(data, tmp_path / "overlay", None)
    assert not (overlay.root / "inception_v3_299_quant_edgetpu.tflite").exists()
    assert "inputs ['image']" in overlay.not_made["inception_v3_299_quant_edgetpu.tflite"]


def test_a_module_opens_a_stand_in_by_name_or_by_format_string():
    source = textwrap.dedent("""\
        def model(depth, size):
          return 'mobilenet_v1_%s_%d_quant_edgetpu.tflite' % (depth, size)
        SEGMENTS = ['pipeline/net_segment_0_of_2_edgetpu.tflite']
        """)
    opens = pycoral_suite._opens
    assert opens(source, "mobilenet_v1_1.0_224_quant_edgetpu.tflite")
    assert opens(source, "pipeline/net_segment_0_of_2_edgetpu.tflite")
    assert not opens(source, "mobilenet_v2_1.0_224_quant_edgetpu.tflite")
    assert not opens(source, "ssd_mobilenet_v1_coco_quant_postprocess_edgetpu.tflite")


# -- skipping without the folders ----------------------------------------------------------


def _without_folders() -> dict:
    return {k: v for k, v in os.environ.items()
            if k not in (pycoral_suite.PYCORAL_DIR, pycoral_suite.TEST_DATA, "MAKEFLAGS")}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_target_skips_with_the_reason_when_the_variables_are_unset():
    done = subprocess.run(["make", "-s", "pycoral-suite"], cwd=REPO_ROOT, env=_without_folders(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pycoral-suite skipped" in done.stdout
    assert "CORALRT_PYCORAL_DIR" in done.stdout and "CORALRT_CORAL_TEST_DATA" in done.stdout


def test_the_tool_skips_and_names_the_unset_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(pycoral_suite.TEST_DATA, raising=False)
    monkeypatch.setenv(pycoral_suite.PYCORAL_DIR, str(tmp_path))
    assert pycoral_suite.main([]) == 0
    out = capsys.readouterr().out
    assert "skipped: CORALRT_CORAL_TEST_DATA is not set" in out
    assert "CORALRT_PYCORAL_DIR" not in out
    # A folder that is named but absent is a mistake, not a reason to skip.
    monkeypatch.setenv(pycoral_suite.TEST_DATA, str(tmp_path / "nowhere"))
    assert pycoral_suite.main([]) == 2
