"""Mutated models end the same way on every leg, and never crash the process.

A short, deterministic run of the differential fuzzer (``tools/fuzz_models.py``
runs long campaigns; ``make fuzz``).  Each case mutates a small model
(``tests/support/fuzz_cases.py``: bytes, operator rewiring, zero points,
scales, tensor types, int32 constants) and runs it on every leg: LiteRT's default and
reference kernels, the NumPy backend and the simulated Edge TPU, each in its
own child process, on the same seeded inputs (``tests/support/fuzz_legs.py``
says what must agree and what a leg may decline).  Without ai-edge-litert the
LiteRT legs are left out and the other two are compared with each other.

``CORALRT_FUZZ_SEED`` and ``CORALRT_FUZZ_CASES`` (cases per mutation kind)
change the run; each failing case is listed with the command that runs it
again.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import MODELS_DIR, shared_model

from support.fuzz_cases import BUILT, KINDS, SEEDS, make_case, seed_bytes
from support.fuzz_legs import HAVE_LITERT, LITERT_LEGS, Legs, available_legs, check, outcome

SEED = int(os.environ.get("CORALRT_FUZZ_SEED", "0"))
# The whole file took 25 s on two cores (under 50 s with other work on them).
CASES_PER_KIND = int(os.environ.get("CORALRT_FUZZ_CASES", "25"))
MODELS = (*SEEDS, *BUILT)

pytestmark = pytest.mark.skipif(not MODELS_DIR.is_dir(),
                                reason=f"test models folder {MODELS_DIR} is absent")


@pytest.fixture(scope="module")
def legs():
    with Legs() as legs:
        yield legs


@pytest.mark.parametrize("leg", ["litert-default", "litert-reference", "numpy", "sim"])
def test_each_leg_is_fuzzed_when_installed(leg):
    if leg in LITERT_LEGS and not HAVE_LITERT:
        pytest.skip("ai-edge-litert is not installed: the LiteRT legs are not fuzzed")
    assert leg in available_legs()


def test_every_leg_answers_for_a_valid_and_an_invalid_model(legs):
    answers = legs.run(shared_model("add_quantized_uint8.tflite"))
    assert {leg: outcome(a) for leg, a in answers.items()} == dict.fromkeys(legs.workers, "ok")
    answers = legs.run(shared_model("invalid/not_a_model.bin"))
    assert {leg: (outcome(a), a["stage"]) for leg, a in answers.items()} == \
        dict.fromkeys(legs.workers, ("ModelError", "validate"))


@pytest.mark.parametrize("model", MODELS)
def test_unmutated_models_agree_on_every_leg(legs, tmp_path, model):
    """The check raises no false alarm: each seed model, on two sets of inputs."""
    path = tmp_path / "seed.tflite"
    path.write_bytes(seed_bytes(model))
    for input_seed in (0, 1):
        answers = legs.run(path, input_seed)
        assert [outcome(a) for a in answers.values()] == ["ok"] * len(answers)
        assert check(answers) == []


def test_a_leg_that_dies_is_reported_and_replaced(legs):
    worker = legs.workers["numpy"]
    worker.send("ABORT\t0")
    answer = worker.receive()
    assert answer["status"] == "died" and answer["signal"] == "SIGABRT"
    assert check({"numpy": answer})[0].kind == "died SIGABRT"
    pid = worker.proc.pid
    answers = legs.run(shared_model("add_quantized_uint8.tflite"))
    assert outcome(answers["numpy"]) == "ok"
    assert worker.proc.pid == pid      # only the case's own process died


def _ok(*arrays):
    return {"status": "ok", "inputs": [], "outputs": [(f"out{k}", a) for k, a in enumerate(arrays)]}


def test_the_check_holds_each_leg_to_its_tolerance():
    a = np.array([10, 20, 30], np.uint8)
    assert check({"litert-reference": _ok(a), "numpy": _ok(a), "sim": _ok(a)}) == []
    off_by_one = a + np.array([0, 1, 0], np.uint8)
    [p] = check({"litert-reference": _ok(a), "sim": _ok(off_by_one)})
    assert (p.legs, p.kind) == (("sim", "litert-reference"), "outputs")
    # LiteRT's default kernels round differently: 2 LSB pass, 3 do not.
    assert check({"litert-reference": _ok(a), "litert-default": _ok(a + 2)}) == []
    assert check({"litert-reference": _ok(a), "litert-default": _ok(a + 3)})
    f = np.array([1.0, np.nan, -2.5], np.float32)
    assert check({"numpy": _ok(f), "sim": _ok(f * np.float32(1 + 1e-6))}) == []
    assert check({"numpy": _ok(f), "sim": _ok(f * np.float32(1.01))})
    refused = {"status": "error", "class": "ModelError", "family": ["ModelError", "CoralRTError"],
               "message": "the CPU backend rejected the model", "stage": "session"}
    # The NumPy backend may decline an operator; LiteRT refusing what another leg runs may not.
    assert check({"litert-reference": _ok(a), "numpy": refused}) == []
    [p] = check({"litert-reference": refused, "numpy": _ok(a)})
    assert p.kind == "disagree"


@pytest.mark.parametrize("kind", KINDS)
def test_mutated_models_agree_on_every_leg(legs, tmp_path, kind):
    if CASES_PER_KIND <= 0:
        pytest.skip("CORALRT_FUZZ_CASES is 0")
    path = tmp_path / "case.tflite"
    bad, ran = [], 0
    for i in range(CASES_PER_KIND):
        case = make_case(SEED, i, MODELS, [kind])
        if case is None:
            continue
        path.write_bytes(case.mutation.data)
        problems = check(legs.run(path, case.input_seed))
        ran += 1
        if problems:
            bad.append(f"case {i}, {case.model}: {case.mutation.what}\n    "
                       + "\n    ".join(str(p)[:600] for p in problems)
                       + f"\n    again: {case.reproduce()}")
    assert ran
    assert not bad, (f"{len(bad)} of {ran} {kind} mutations (seed {SEED}) ended badly on "
                     f"{', '.join(legs.workers)}:\n" + "\n".join(bad))
