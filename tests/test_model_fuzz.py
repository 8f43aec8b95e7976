"""Mutated models never crash the process or escape as a raw traceback.

Hypothesis truncates and flips bytes of real models, and rewires their
operators (an input set to -1, "omitted", or swapped to another tensor);
each case runs in a long-lived subprocess (so a native crash shows up as
that process dying instead of killing pytest) through the full path:
validation, the CPU backend's load and one inference.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS_DIR, REPO_ROOT, shared_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coralrt._model import flatbuf

SEEDS = ["add_quantized_uint8.tflite", "hello_world_int8.tflite", "split_concat.tflite",
         "keras_lstm_mnist_ptq.tflite", "add_float.tflite",
         "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite"]
CASE_TIMEOUT = 60.0
# Operator rewiring: an input set to -1 (omitted), or swapped to another tensor.
INPUT_MUTATIONS = ("minus_one", "swap")

pytestmark = pytest.mark.skipif(not MODELS_DIR.is_dir(),
                                reason=f"test models folder {MODELS_DIR} is absent")


class Worker:
    def __init__(self):
        self.proc = None

    def ask(self, path: Path, target: str = "cpu", backend: str = "") -> str:
        if self.proc is None or self.proc.poll() is not None:
            # No compile cache: each mutated model would only add an entry.
            env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), CORALRT_CACHE="0")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.fuzz_worker"], cwd=REPO_ROOT, env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True)
        self.proc.stdin.write(f"{path}\t{target}\t{backend}\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], CASE_TIMEOUT)
        if not ready:
            self.proc.kill()
            self.proc = None
            return "HANG"
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            return f"DIED {code}"
        return line.rstrip("\n")

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


@st.composite
def mutated(draw):
    name = draw(st.sampled_from(SEEDS))
    data = bytearray(shared_model(name).read_bytes())
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data) - 1))]
    for _ in range(draw(st.integers(0 if len(data) < len(shared_model(name).read_bytes()) else 1, 8))):
        if not data:
            break
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return name, bytes(data)


def mutate_operator_input(data: bytes, kind: str, pick) -> bytes | None:
    """``data`` with one operator input rewired: set to -1 (``"minus_one"``) or
    to another tensor index of its subgraph (``"swap"``).  ``pick(n)`` chooses
    an int in ``range(n)``; None when the model has no input to rewire."""
    tree = flatbuf.decode(data)
    ops = [(sg, op) for sg in tree.get("subgraphs") or () for op in sg.get("operators") or ()
           if len(op.get("inputs", ())) and sg.get("tensors")]
    if not ops:
        return None
    sg, op = ops[pick(len(ops))]
    inputs = [int(i) for i in op["inputs"]]
    k = pick(len(inputs))
    if kind == "minus_one":
        inputs[k] = -1
    else:
        n = len(sg["tensors"])
        inputs[k] = (inputs[k] + 1 + pick(n - 1)) % n if n > 1 else 0
    op["inputs"] = np.array(inputs, np.int32)
    return flatbuf.encode(tree)


def test_worker_answers_for_a_valid_and_an_invalid_model(worker, tmp_path):
    assert worker.ask(shared_model("add_quantized_uint8.tflite")) == "OK"
    assert worker.ask(shared_model("invalid/not_a_model.bin")).startswith("ModelError ")


# In CI the examples are derandomized, so a run is reproducible; locally each run
# explores new mutations (and tools/fuzz_models.py runs long campaigns).
@settings(max_examples=int(os.environ.get("CORALRT_FUZZ_EXAMPLES", "200")), deadline=None,
          derandomize=bool(os.environ.get("CI")),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(case=mutated())
def test_mutated_models_end_cleanly(worker, tmp_path, case):
    name, data = case
    path = tmp_path / "case.tflite"
    path.write_bytes(data)
    answer = worker.ask(path)
    # InferenceError is the one other clean ending: a kernel that checks its
    # parameters only when it runs (TFLite_Detection_PostProcess reading its
    # custom options) rejects a damaged model at the first inference.
    assert answer == "OK" or answer.startswith(("ModelError ", "InferenceError ")), (
        f"mutation of {name} ({len(data)} bytes) ended with: {answer[:2000]}")


@st.composite
def rewired(draw):
    name = draw(st.sampled_from(SEEDS))
    kind = draw(st.sampled_from(INPUT_MUTATIONS))
    data = mutate_operator_input(shared_model(name).read_bytes(), kind,
                                 lambda n: draw(st.integers(0, n - 1)))
    return name, kind, data


# About 10-15 s in `make test` on 2 cores; `make fuzz` runs tools/fuzz_models.py longer.
@settings(max_examples=int(os.environ.get("CORALRT_FUZZ_REWIRE_EXAMPLES", "1000")),
          deadline=None, derandomize=bool(os.environ.get("CI")),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(case=rewired())
def test_rewired_operators_end_cleanly(worker, tmp_path, case):
    name, kind, data = case
    path = tmp_path / "case.tflite"
    path.write_bytes(data)
    answer = worker.ask(path)
    assert answer == "OK" or answer.startswith(("ModelError ", "InferenceError ")), (
        f"{kind} mutation of {name} ended with: {answer[:2000]}")


# The NumPy backend's own kernels, on the same mutations (the rest of the path is shared).
@settings(max_examples=int(os.environ.get("CORALRT_FUZZ_NUMPY_EXAMPLES", "300")),
          deadline=None, derandomize=bool(os.environ.get("CI")),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(case=st.one_of(rewired(), mutated().map(lambda c: (c[0], "bytes", c[1]))))
def test_mutations_end_cleanly_on_the_numpy_backend(worker, tmp_path, case):
    name, kind, data = case
    path = tmp_path / "case.tflite"
    path.write_bytes(data)
    answer = worker.ask(path, "cpu", "numpy")
    assert answer == "OK" or answer.startswith(("ModelError ", "InferenceError ")), (
        f"{kind} mutation of {name} on the numpy backend ended with: {answer[:2000]}")
