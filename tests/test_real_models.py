"""Validation never refuses a real model that LiteRT runs.

Every plain (not Edge TPU compiled) model in ``shared/models`` and in the
folders named by ``CORALRT_EXTRA_MODELS`` (Coral's public test data, for
instance) goes through LiteRT directly first: a model LiteRT itself cannot
load or run (a custom operator no runtime ships, a model made to fail) is
skipped with LiteRT's reason.  Every other model must pass validation and
run on both coralrt targets:

- ``target="cpu"`` gives exactly what LiteRT's default kernels give (or, for
  a model whose only problem there is the XNNPACK delegate, what LiteRT's
  builtin kernels without the delegate give);
- ``target="sim"`` (simulated Edge TPU plus LiteRT reference kernels for the
  rest) gives exactly what LiteRT's reference kernels give, the yardstick
  of tests/test_sim_session.py.

The shared set takes a few seconds; the extra set (about 40 models, some of
them large) runs only when the variable is set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import (
    MODELS_DIR, extra_model_paths, random_inputs, run_litert, shared_model_names,
)

from coralrt import InferenceSession
from coralrt.errors import CoralRTError
from coralrt import load_model

SHARED = [pytest.param(MODELS_DIR / p.values[0], id=p.id, marks=p.marks)
          if p.values[0] is not None else p for p in shared_model_names(compiled=False)]
EXTRA = extra_model_paths(compiled=False)


def _litert(data: bytes, feeds: list, kernels: str):
    """LiteRT's outputs with one kernel set, or the first line of its error."""
    try:
        return run_litert(data, feeds, kernels=kernels), None
    except (RuntimeError, ValueError) as e:
        return None, str(e).splitlines()[0][:200]


def _inputs(data: bytes) -> list:
    # The model's inputs as LiteRT reports them, filled deterministically.
    from conftest import litert_module
    Interpreter = litert_module().Interpreter
    try:
        details = Interpreter(model_content=data).get_input_details()
    except (RuntimeError, ValueError) as e:
        pytest.skip(f"LiteRT itself does not load this model: {str(e).splitlines()[0][:200]}")
    shapes = [type("T", (), {"shape": tuple(d["shape"]), "dtype": np.dtype(d["dtype"])})
              for d in details]
    return random_inputs(shapes, seed=7)


def _same(got: dict, want: list, what: str) -> None:
    assert len(got) == len(want), what
    for (name, g), w in zip(got.items(), want):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: {name}"
        assert np.array_equal(g, w, equal_nan=g.dtype.kind == "f"), (
            f"{what}: {name} differs in {int(np.sum(g != w))} of {g.size} values")


def _check_real_model(path: Path) -> None:
    data = path.read_bytes()
    feeds = _inputs(data)
    optimized, why_not = _litert(data, feeds, "optimized")
    reference, why_not_ref = _litert(data, feeds, "reference")
    if optimized is None and reference is None:
        pytest.skip(f"LiteRT itself does not run this model: {why_not}")
    load_model(data)   # validation accepts it
    if optimized is not None:
        _same(InferenceSession(data, target="cpu").run(feeds), optimized, "cpu vs LiteRT")
    else:
        # LiteRT's default kernels refuse it: when only its XNNPACK delegate
        # does, the CPU target runs the builtin kernels without the delegate;
        # otherwise it reports the refusal as a coralrt error.
        builtin, why_not_builtin = _litert(data, feeds, "builtin")
        if builtin is not None:
            _same(InferenceSession(data, target="cpu").run(feeds), builtin,
                  "cpu vs LiteRT builtin kernels without delegates")
        else:
            with pytest.raises(CoralRTError):
                InferenceSession(data, target="cpu").run(feeds)
    if reference is not None:
        sim = InferenceSession(data, target="sim", cpu_kernels="reference")
        _same(sim.run(feeds), reference, "sim vs LiteRT reference kernels")


@pytest.mark.parametrize("path", SHARED)
def test_shared_real_model_passes_validation_and_runs(path):
    _check_real_model(path)


@pytest.mark.parametrize("path", EXTRA)
def test_extra_real_model_passes_validation_and_runs(path):
    _check_real_model(path)


def test_models_shipped_in_the_package_pass_validation():
    import coralrt
    from coralrt.testing import build_demo_model, demo_input

    shipped = sorted(Path(coralrt.__file__).parent.rglob("*.tflite"))
    for path in shipped:
        _check_real_model(path)
    # The package's own model is built in code: the demo classifier.
    data = build_demo_model().to_bytes()
    load_model(data)
    feeds = [demo_input()]
    _same(InferenceSession(data, target="cpu").run(feeds), run_litert(data, feeds),
          "demo model on cpu")
    _same(InferenceSession(data, target="sim", cpu_kernels="reference").run(feeds),
          run_litert(data, feeds, kernels="reference"), "demo model on sim")
