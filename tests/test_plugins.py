"""Plugins: operators, compilers, devices, observers and step wrappers."""

from __future__ import annotations

import inspect
import re
import time

import numpy as np
import pluggy
import pytest
from conftest import random_inputs, shared_model

import coralrt
from coralrt import InferenceSession
from coralrt.compile.native import NativeCompiler
from coralrt.compile.rules import OpSupport
from coralrt.plugins import hookspecs
from coralrt.plugins.host import PluginHost, plugin_host
from coralrt.plugins.registry import CompilerRegistry, DeviceRegistry, OpRegistry
from coralrt.errors import PluginError, UnsupportedOperatorError
from coralrt.model.builder import ModelBuilder
from coralrt.sim.stick import SimulatedBackend
from coralrt.usb.driver import UsbEdgeTpu

Q = dict(scale=0.05, zero_point=-3)


class SinhPlugin:
    @coralrt.hookimpl
    def coralrt_register_ops(self, registry):
        registry.add_kernel("Sinh", lambda inputs, op: [np.sinh(inputs[0])])


def clamp_cpu(inputs, op):
    lo, hi = op.flex_options["lo"], op.flex_options["hi"]
    return [np.clip(inputs[0], lo, hi).astype(np.int8)]


def clamp_tpu(ctx):
    from flatbuffers import flexbuffers
    opts = flexbuffers.Loads(ctx.op.custom_options)

    def run(inputs):
        return [np.clip(inputs[0], opts["lo"], opts["hi"]).astype(np.int8)]
    return run


class ClampCpuPlugin:
    @coralrt.hookimpl
    def coralrt_register_ops(self, registry):
        registry.add_kernel("Clamp8", clamp_cpu)


class ClampTpuPlugin(ClampCpuPlugin):
    @coralrt.hookimpl
    def coralrt_register_ops(self, registry):
        super().coralrt_register_ops(registry)
        registry.add_tpu_op("Clamp8", OpSupport(max_version=1), clamp_tpu)


def clamp_model():
    """int8 CONV_2D -> custom Clamp8 -> CONV_2D, generated with coralrt's writer."""
    from flatbuffers import flexbuffers
    rng = np.random.default_rng(3)
    b = ModelBuilder()
    x = b.input("x", (1, 32, 32, 32), np.int8, **Q)

    def conv(src, name):
        w = b.constant(f"{name}_w", rng.integers(-127, 128, (32, 3, 3, 32), dtype=np.int8),
                       scale=0.01, zero_point=0)
        bias = b.constant(f"{name}_b", rng.integers(-2000, 2000, 32).astype(np.int32),
                          scale=0.05 * 0.01, zero_point=0)
        y = b.tensor(name, (1, 32, 32, 32), np.int8, scale=0.5, zero_point=-3)
        b.op("CONV_2D", [src, w, bias], [y], stride_w=1, stride_h=1, padding="SAME")
        return y

    h = conv(x, "conv1")
    c = b.tensor("clamped", (1, 32, 32, 32), np.int8, scale=0.5, zero_point=-3)
    b.op("Clamp8", [h], [c], custom_options=flexbuffers.Dumps({"lo": -40, "hi": 60}))
    b.output(conv(c, "conv2"))
    return b.build()


# -- the contract ---------------------------------------------------------------------


HOOKS = [name for name in dir(hookspecs) if name.startswith("coralrt_")]


def test_hookspecs_are_documented():
    assert set(HOOKS) == {"coralrt_register_ops", "coralrt_register_compilers",
                          "coralrt_register_devices", "coralrt_compile_event",
                          "coralrt_run_step"}
    for name in HOOKS:
        fn = getattr(hookspecs, name)
        doc = inspect.getdoc(fn) or ""
        for param in inspect.signature(fn).parameters:
            assert f":param {param}:" in doc, f"{name} does not document {param}"
        assert ":returns:" in doc, f"{name} does not document its return value"


def test_every_hook_has_a_test_calling_it_through_the_plugin_manager():
    source = inspect.getsource(inspect.getmodule(test_hookspecs_are_documented))
    for name in HOOKS:
        assert f"def test_hook_{name}(" in source
        assert f"pm.hook.{name}(" in source, f"no test calls {name} through the manager"


def test_hookimpl_is_the_public_marker():
    assert isinstance(coralrt.hookimpl, pluggy.HookimplMarker)
    assert coralrt.hookimpl.project_name == "coralrt"


def test_misspelled_hook_fails_loudly():
    class Typo:
        @coralrt.hookimpl
        def coralrt_register_op(self, registry):  # missing "s"
            pass

    with pytest.raises(PluginError, match="coralrt_register_op"):
        PluginHost([Typo()])


def test_disable_autoload(monkeypatch):
    calls = []
    monkeypatch.setattr(pluggy.PluginManager, "load_setuptools_entrypoints",
                        lambda self, group, name=None: calls.append(group) or 0)
    PluginHost()
    assert calls == ["coralrt"]
    monkeypatch.setenv("CORALRT_DISABLE_PLUGIN_AUTOLOAD", "1")
    PluginHost()
    assert calls == ["coralrt"]  # not loaded again


# -- one test per hook, each calling it through the plugin manager ---------------------


def test_hook_coralrt_register_ops():
    host = PluginHost([SinhPlugin()])
    fresh = OpRegistry()
    host.pm.hook.coralrt_register_ops(registry=fresh)
    assert "Sinh" in fresh.kernels
    sess = InferenceSession(shared_model("custom_sinh.tflite"), plugins=[SinhPlugin()])
    x = np.linspace(-2, 2, int(np.prod(sess.get_inputs()[0].shape)), dtype=np.float32)
    x = x.reshape(sess.get_inputs()[0].shape)
    (out,) = sess.run(x).values()
    np.testing.assert_allclose(out, np.sinh(x), rtol=1e-6)
    assert [s["kind"] for s in sess.profile()] == ["plugin"]


def test_hook_coralrt_register_compilers():
    class CountingCompiler(NativeCompiler):
        id = "counting-native"
        calls = 0

        def compile_segment(self, piece):
            CountingCompiler.calls += 1
            return super().compile_segment(piece)

    class Plugin:
        @coralrt.hookimpl
        def coralrt_register_compilers(self, registry):
            registry.add(CountingCompiler())

    host = PluginHost([Plugin()])
    fresh = CompilerRegistry()
    host.pm.hook.coralrt_register_compilers(registry=fresh)
    assert set(fresh.compilers) == {"counting-native", "coralrt-native"}
    assert fresh.for_device("sim").id == "counting-native"  # plugins come first
    sess = InferenceSession(shared_model("split_concat.tflite"), target="sim",
                            plugins=[Plugin()])
    assert CountingCompiler.calls == 1 and sess.compile_info["compiler"].startswith(
        "counting-native")


def test_hook_coralrt_register_devices():
    made = []

    class RecordingDevice(UsbEdgeTpu):
        def run(self, handle, inputs):
            made.append("run")
            return super().run(handle, inputs)

    def factory(kernels=None):
        return RecordingDevice(None, SimulatedBackend(firmware_loaded=True, kernels=kernels,
                                                      lock_scope="process"))

    class Plugin:
        @coralrt.hookimpl
        def coralrt_register_devices(self, registry):
            registry.add("sim", factory)

    host = PluginHost([Plugin()])
    fresh = DeviceRegistry()
    host.pm.hook.coralrt_register_devices(registry=fresh)
    assert fresh.factories["sim"] is factory
    sess = InferenceSession(shared_model("split_concat.tflite"), target="sim",
                            plugins=[Plugin()])
    sess.run(random_inputs(sess.get_inputs()))
    assert isinstance(sess.device, RecordingDevice) and made == ["run"]


def test_hook_coralrt_compile_event():
    events = []

    class Observer:
        @coralrt.hookimpl
        def coralrt_compile_event(self, event):
            events.append(event)

    host = PluginHost([Observer()])
    host.pm.hook.coralrt_compile_event(event={"kind": "cache_hit", "key": "k"})
    assert events == [{"kind": "cache_hit", "key": "k"}]
    events.clear()
    path = shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite")
    InferenceSession(path, target="sim", plugins=[Observer()])
    assert [e["kind"] for e in events] == ["cache_miss", "segment_compiled",
                                           "segment_compiled"]
    assert events[1]["operators"] == 64 and events[1]["bytes"] > 0
    events.clear()
    InferenceSession(path, target="sim", plugins=[Observer()])
    assert [e["kind"] for e in events] == ["cache_hit"]


def test_hook_coralrt_run_step():
    seen = []

    class Timer:
        @coralrt.hookimpl(wrapper=True)
        def coralrt_run_step(self, step, inputs):
            start = time.perf_counter()
            outputs = yield
            seen.append((step.kind, time.perf_counter() - start))
            return outputs

    host = PluginHost([Timer()])
    assert host.wraps_steps

    class Fake:
        kind, label = "cpu", "fake"

        @staticmethod
        def run(inputs):
            return [inputs[0] + 1]

    assert host.pm.hook.coralrt_run_step(step=Fake(), inputs=[1]) == [2]
    assert seen == [("cpu", pytest.approx(0, abs=1))]
    seen.clear()
    sess = InferenceSession(shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite"),
                            target="sim", plugins=[Timer()])
    sess.run(random_inputs(sess.get_inputs()))
    assert [k for k, _ in seen] == ["tpu", "cpu", "tpu", "cpu"]


# -- the executor with plugin kernels ------------------------------------------------------


def test_custom_op_between_two_tpu_segments_on_sim():
    model = clamp_model()
    x = random_inputs([model.main.tensors[0]], seed=4)
    sim = InferenceSession(model, target="sim", plugins=[ClampCpuPlugin()],
                           cpu_kernels="reference")
    assert [s["kind"] for s in (sim.run(x), sim.profile())[1]] == ["tpu", "plugin", "tpu"]
    cpu = InferenceSession(model, target="cpu", plugins=[ClampCpuPlugin()],
                           cpu_kernels="reference")
    assert [s["kind"] for s in (cpu.run(x), cpu.profile())[1]] == ["cpu", "plugin", "cpu"]
    np.testing.assert_array_equal(sim.run(x)["conv2"], cpu.run(x)["conv2"])


def test_plugin_declares_its_operator_edgetpu_compatible():
    model = clamp_model()
    x = random_inputs([model.main.tensors[0]], seed=5)
    sim = InferenceSession(model, target="sim", plugins=[ClampTpuPlugin()],
                           cpu_kernels="reference")
    out = sim.run(x)
    assert [s["kind"] for s in sim.profile()] == ["tpu"]  # one segment, custom op inside
    cpu = InferenceSession(model, target="cpu", plugins=[ClampCpuPlugin()],
                           cpu_kernels="reference")
    np.testing.assert_array_equal(out["conv2"], cpu.run(x)["conv2"])
    # The plugin's operators are part of the compile-cache key.
    other = InferenceSession(model, target="sim", plugins=[ClampCpuPlugin()])
    assert other.compile_info["key"] != sim.compile_info["key"]


def test_builtin_kernels_are_overridden_only_on_request():
    class DoubleAdd:
        @coralrt.hookimpl
        def coralrt_register_ops(self, registry):
            registry.add_kernel("ADD", lambda inputs, op: [
                np.zeros(op.outputs[0].shape, op.outputs[0].dtype)])

    path = shared_model("add_quantized_int8.tflite")
    plain = InferenceSession(path, plugins=[DoubleAdd()])
    x = random_inputs(plain.get_inputs(), seed=1)
    assert np.any(list(plain.run(x).values())[0] != 0)
    overridden = InferenceSession(path, plugins=[DoubleAdd()], override_builtins=True)
    assert [s["kind"] for s in (overridden.run(x), overridden.profile())[1]] == \
        ["plugin", "plugin"]
    assert not np.any(list(overridden.run(x).values())[0])


def test_plugin_kernel_contract_is_checked():
    class Bad:
        @coralrt.hookimpl
        def coralrt_register_ops(self, registry):
            registry.add_kernel("Sinh", lambda inputs, op: [inputs[0].astype(np.float64)])

    sess = InferenceSession(shared_model("custom_sinh.tflite"), plugins=[Bad()])
    x = np.zeros(sess.get_inputs()[0].shape, np.float32)
    with pytest.raises(PluginError, match=r"returned float64\[.*\] for output"):
        sess.run(x)


def test_without_a_plugin_the_operator_is_named():
    with pytest.raises(UnsupportedOperatorError, match="Sinh"):
        InferenceSession(shared_model("custom_sinh.tflite"))


def test_op_info_given_to_kernels():
    seen = {}

    class Spy:
        @coralrt.hookimpl
        def coralrt_register_ops(self, registry):
            def kernel(inputs, op):
                seen["op"] = op
                return clamp_cpu(inputs, op)
            registry.add_kernel("Clamp8", kernel)

    model = clamp_model()
    InferenceSession(model, plugins=[Spy()]).run(random_inputs([model.main.tensors[0]]))
    op = seen["op"]
    assert op.name == "Clamp8" and op.flex_options == {"lo": -40, "hi": 60}
    assert op.inputs[0].name == "conv1" and op.outputs[0].quantization == (0.5, -3)
    assert re.fullmatch(rb".+", op.custom_options, re.S)


def test_default_host_is_shared():
    assert plugin_host() is plugin_host()
