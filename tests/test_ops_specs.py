"""The operator specs (coralrt/_ops): one home per operator, and the path
CONTRIBUTING.md gives for adding one (a family file), taken end to end."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import coralrt._ops as ops_pkg
from coralrt import InferenceSession
from coralrt._backends import numpy_backend
from coralrt._compile.partition import partition
from coralrt._compile.rules import default_rules
from coralrt.testing import ModelBuilder
from coralrt._model.writer import write_model
from coralrt._ops import OpSpec, builtin_specs, family_of, kernel_table, operator_table
from coralrt._ops.fused import FUSED_BOUNDS, fused_bounds
from coralrt.plugins import _host as host
from coralrt.plugins._host import PluginHost
from coralrt._sim import kernels as sim_kernels

FAMILY = '''
"""A family file as CONTRIBUTING.md describes it (test only)."""

import numpy as np

from coralrt._ops.arith.common import refuse
from coralrt._ops.arith.fixedpoint import multiply_by_quantized_multiplier, quantize_multiplier
from coralrt._ops.spec import OpSpec, OpSupport


def zeros_like(ctx: "OpContext"):
    """Sim kernel: every output code is the output's zero point (a real 0)."""
    out = ctx.outputs[0]
    shape, dtype, zp = tuple(out.shape), ctx.dtype(out), ctx.zero_point(out)
    return lambda inputs: [np.full(shape, zp, dtype)]


def rescale(ctx: "OpContext"):
    """Sim kernel: an 8-bit tensor requantized to the output's scale and zero
    point, as TFLite's Requantize (QUANTIZE between 8-bit types) computes it:
    zo + MultiplyByQuantizedMultiplier(x - zi, M, shift), M * 2^shift = si / so,
    clamped to the output type."""
    x, out = ctx.inputs[0], ctx.outputs[0]
    dtype = ctx.dtype(out)
    if ctx.dtype(x).itemsize != 1 or dtype.itemsize != 1:
        refuse(ctx, "only 8-bit tensors are supported")
    multiplier, shift = quantize_multiplier(ctx.scale(x) / ctx.scale(out))
    zi, zo = ctx.zero_point(x), ctx.zero_point(out)
    lo, hi = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)

    def run(inputs):
        acc = multiply_by_quantized_multiplier(np.asarray(inputs[0], np.int64) - zi,
                                               multiplier, shift)
        return [np.clip(acc + zo, lo, hi).astype(dtype)]
    return run


SPECS = (OpSpec("ZEROS_LIKE", tpu=OpSupport(max_version=1), sim=zeros_like),
         OpSpec("Rescale", custom=True, tpu=OpSupport(max_version=1), sim=rescale,
                numpy_any=rescale))
'''


def _forget_tables(monkeypatch):
    """The derived tables are built once per process; a test that adds a family
    file starts them afresh (and monkeypatch restores the old ones after)."""
    for cached in (ops_pkg._built, ops_pkg.operator_table, ops_pkg.operators_with):
        cached.cache_clear()
    numpy_backend._tables.cache_clear()
    host.reset()        # the process-wide plugin host registered the old specs
    monkeypatch.setattr(sim_kernels, "KERNELS", {})
    monkeypatch.setattr(sim_kernels, "_loaded", False)


@pytest.fixture
def new_family(tmp_path, monkeypatch):
    (tmp_path / "testfamily.py").write_text(textwrap.dedent(FAMILY))
    monkeypatch.setattr(ops_pkg, "__path__", [*ops_pkg.__path__, str(tmp_path)])
    _forget_tables(monkeypatch)
    yield
    _forget_tables(monkeypatch)


def zeros_like_model():
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8), np.uint8, scale=0.1, zero_point=128)
    y = b.tensor("y", (1, 4, 4, 8), np.uint8, scale=0.05, zero_point=7)
    b.op("ZEROS_LIKE", [x], [y])
    b.output(y)
    return b.build()


def test_an_operator_added_as_a_family_file_is_partitioned_and_runs_everywhere(new_family):
    spec = builtin_specs()["ZEROS_LIKE"]
    assert family_of("ZEROS_LIKE") == "testfamily"
    assert spec.min_inputs == 1 and spec.optional_inputs == frozenset()   # LiteRT's facts
    model = zeros_like_model()
    # Partitioned onto the Edge TPU, through the rules and through the plugin hook.
    assert "ZEROS_LIKE" in default_rules()
    assert PluginHost([]).ops.specs["ZEROS_LIKE"].plugin == "coralrt.builtins"
    plan = partition(model, "multi", rules=PluginHost([]).ops.rules())
    assert [o.unit for o in plan.ops] == ["tpu"]
    x = np.arange(128, dtype=np.uint8).reshape(1, 4, 4, 8)
    want = np.full((1, 4, 4, 8), 7, np.uint8)
    data = write_model(model)
    sim = InferenceSession(data, target="sim")
    assert sim.compile_info["summary"]["tpu_ops"] == 1
    np.testing.assert_array_equal(sim.run({"x": x})["y"], want)
    cpu = InferenceSession(data, target="cpu", backend="numpy")
    np.testing.assert_array_equal(cpu.run({"x": x})["y"], want)


def one_op_model(name, in_type, out_type):
    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 16), in_type[0], scale=in_type[1], zero_point=in_type[2])
    y = b.tensor("y", (1, 6, 6, 16), out_type[0], scale=out_type[1], zero_point=out_type[2])
    b.op(name, [x], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("in_type, out_type", [
    ((np.int8, 0.1, 3), (np.int8, 0.07, -5)),           # multiplier above 1
    ((np.int8, 0.02, -128), (np.int8, 0.3, 17)),        # below 1
    ((np.uint8, 0.05, 128), (np.uint8, 0.011, 100)),    # uint8, clamped at both ends
])
def test_a_family_file_kernel_requantizes_with_coralrt_ops_arith(new_family, in_type, out_type):
    """The family file's requantizing kernel, bit for bit LiteRT's BUILTIN_REF
    Requantize (its QUANTIZE between 8-bit types; LiteRT has no other builtin
    operator of that arithmetic), on the simulated Edge TPU and on the NumPy
    backend."""
    from kernels.harness import run_reference
    model = one_op_model("Rescale", in_type, out_type)
    plan = partition(model, "multi", rules=PluginHost([]).ops.rules())
    assert [o.unit for o in plan.ops] == ["tpu"]
    info = np.iinfo(in_type[0])
    x = np.random.default_rng(29).integers(info.min, info.max + 1, (1, 6, 6, 16)).astype(
        in_type[0])
    x.flat[:2] = info.min, info.max
    want = run_reference(write_model(one_op_model("QUANTIZE", in_type, out_type)), [x])[0]
    data = write_model(model)
    sim = InferenceSession(data, target="sim")
    assert sim.compile_info["summary"]["tpu_ops"] == 1
    np.testing.assert_array_equal(sim.run({"x": x})["y"], want)
    cpu = InferenceSession(data, target="cpu", backend="numpy")
    np.testing.assert_array_equal(cpu.run({"x": x})["y"], want)
    assert len(np.unique(want)) > 10            # a real rescaling, not a constant


def test_every_spec_lives_in_one_family_and_names_importable_kernels():
    specs = builtin_specs()
    assert all(family_of(name) for name in specs)
    for slot in ("sim", "numpy_float", "numpy_wide_int", "numpy_any", "numpy_8bit"):
        assert all(callable(k) for k in kernel_table(slot).values()), slot
    # Every Edge TPU operator (table or compat mode) has a sim kernel.
    assert set(operator_table("tpu")) | set(operator_table("compat")) <= set(
        operator_table("sim"))


def test_a_spec_names_its_kernels_by_string_or_callable():
    spec = OpSpec("X", sim="coralrt._sim.kernels.shape:tile", numpy_any=len)
    assert spec.sim.load() is sim_kernels.kernel_for("TILE") and spec.numpy_any is len


def test_an_unknown_fused_activation_is_refused_everywhere():
    # One table and one behaviour for all kernels: TANH (4) and SIGN_BIT (5) are
    # no clamp, so an operator that can only clamp refuses them, as TFLite does.
    assert set(FUSED_BOUNDS) == {0, 1, 2, 3}
    from coralrt.errors import ModelError
    with pytest.raises(ModelError, match="fused activation function 4 is not supported"):
        fused_bounds(4, op_name="CONV_2D")
    assert fused_bounds(3, op_name="CONV_2D") == (0.0, 6.0)


def test_a_plugin_spec_adds_to_coralrts_rules_and_wins_over_a_builtin_spec():
    from coralrt._compile.rules import OpSupport, OpView
    from coralrt.plugins._registry import BUILTIN, OpRegistry
    bare = OpRegistry()
    bare.for_plugin("acme").add_spec(OpSpec("ZEROS_LIKE", tpu=OpSupport(1)))
    rules = bare.rules()
    assert "ZEROS_LIKE" in rules and "CONV_2D" in rules      # coralrt's table stays
    assert bare.fingerprint() == [["ZEROS_LIKE", "v1:['NONE', 'RELU', 'RELU6', "
                                                 "'RELU_N1_TO_1']:"]]
    ops = PluginHost([]).ops
    ops.for_plugin("acme").add_spec(OpSpec("ADD", tpu=OpSupport(4, (lambda v: "acme: no",))))
    assert ops.specs["ADD"].plugin == "acme" and ops.specs["MUL"].plugin == BUILTIN
    model = ModelBuilder()
    x = model.input("x", (1, 4, 4, 8), np.int8, scale=0.1, zero_point=0)
    y = model.tensor("y", (1, 4, 4, 8), np.int8, scale=0.1, zero_point=0)
    model.op("ADD", [x, x], [y])
    model.output(y)
    sg = model.build().main
    assert ops.rules().check(OpView(sg, sg.operators[0], 0)) == "acme: no"
