"""Compare a simulated-Edge-TPU kernel with LiteRT's reference kernels.

``check(model, inputs)`` runs ``model`` (built with ModelBuilder) once in the
LiteRT interpreter with ``OpResolverType.BUILTIN_REF`` and as a coralrt
segment through the simulated Edge TPU's kernels, and asserts the outputs are
equal (or within ``lsb`` units where a documented tolerance applies).  The
segment runs on the NumPy kernels and, when the ``fast`` extra's compiled
kernels are usable here, once more on them (both paths are checked).
"""

from __future__ import annotations

import os

import numpy as np

from coralrt._formats.segment import build_segment
from coralrt import Model, load_model
from coralrt._sim import compiled
from coralrt._sim.runner import SegmentRunner

#: The kernel paths of a segment: the NumPy kernels, and the compiled ones.
PATHS = ("numpy", "compiled")


def run_reference(model_bytes: bytes, inputs: list) -> list:
    from conftest import litert_module
    Interpreter, OpResolverType = litert_module().Interpreter, litert_module().OpResolverType
    interp = Interpreter(model_content=model_bytes,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), inputs):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def compiled_usable() -> bool:
    """Whether the compiled kernels are installed and work (not forced off)."""
    saved = os.environ.pop(compiled.ENV, None)
    try:
        return compiled.enabled()
    finally:
        if saved is not None:
            os.environ[compiled.ENV] = saved


def run_sim(model_bytes: bytes, inputs: list, path: str = "numpy") -> list:
    """The segment's outputs with the NumPy (``path="numpy"``) or compiled kernels
    (the kernels are chosen when the segment loads)."""
    saved = os.environ.get(compiled.ENV)
    os.environ[compiled.ENV] = "0" if path == "numpy" else "1"
    try:
        runner = SegmentRunner(build_segment(load_model(model_bytes)))
    finally:
        if saved is None:
            del os.environ[compiled.ENV]
        else:
            os.environ[compiled.ENV] = saved
    return runner.run(list(inputs))


def check(model: Model, inputs: list, *, lsb: int = 0) -> list:
    """Assert sim == reference (within ``lsb``); returns the reference outputs."""
    data = model.to_bytes()
    want = run_reference(data, inputs)
    for path in PATHS if compiled_usable() else PATHS[:1]:
        _compare(run_sim(data, inputs, path), want, lsb, path)
    return want


def _compare(got: list, want: list, lsb: int, path: str) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        k = f"{k} ({path} kernels)"
        assert g.shape == w.shape, f"output {k}: shape {g.shape} != reference {w.shape}"
        assert g.dtype == w.dtype, f"output {k}: dtype {g.dtype} != reference {w.dtype}"
        diff = np.abs(g.astype(np.int64) - w.astype(np.int64)) if w.dtype.kind in "iu" \
            else np.abs(g - w)
        worst = int(diff.max()) if diff.size else 0
        assert worst <= lsb, (f"output {k}: {int((diff > lsb).sum())} of {diff.size} values "
                              f"differ by up to {worst} (allowed {lsb})")


def random_data(rng, shape, dtype):
    """Integers spanning ``dtype``'s whole range (kernel test inputs)."""
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape, dtype=np.int64).astype(dtype)


def quant_strategy():
    """A hypothesis strategy factory: ``quant(dtype)`` draws (scale, zero point)."""
    from hypothesis import strategies as st

    @st.composite
    def quant(draw, dtype, lo=-3.0, hi=0.0):
        info = np.iinfo(dtype)
        return (float(10.0 ** draw(st.floats(lo, hi))),
                draw(st.integers(int(info.min), int(info.max))))
    return quant
