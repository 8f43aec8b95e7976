"""Plugins: operators, compilers, devices, observers and step wrappers."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import re
import time

import numpy as np
import pluggy
import pytest
from conftest import random_inputs, shared_model

import coralrt
from coralrt import InferenceSession
from coralrt.plugins import NativeCompiler
from coralrt._compile.rules import OpSupport, OpView
from coralrt.plugins import _hookspecs as hookspecs
from coralrt.plugins._host import PluginHost, plugin_host
from coralrt.plugins._kind_registry import CompilerRegistry, DeviceRegistry
from coralrt.plugins._registry import BUILTIN, OpRegistry
from coralrt.errors import ConfigError, PluginError, UnsupportedOperatorError
from coralrt._runtime.info import OpInfo, StepInfo
from coralrt.testing import ModelBuilder, SimulatedBackend
from coralrt._usb.driver import UsbEdgeTpu

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


def manager(**plugins) -> pluggy.PluginManager:
    """A plugin manager with the coralrt hooks and only ``plugins`` (by name)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name, plugin in plugins.items():
        pm.register(plugin, name)
    return pm


# -- the contract ---------------------------------------------------------------------


HOOKS = [name for name in dir(hookspecs) if name.startswith("coralrt_")]


def test_hookspecs_are_documented():
    assert set(HOOKS) == {"coralrt_register_ops", "coralrt_register_compilers",
                          "coralrt_register_devices", "coralrt_register_rewrites",
                          "coralrt_compile_event", "coralrt_run_step"}
    for name in HOOKS:
        fn = getattr(hookspecs, name)
        doc = inspect.getdoc(fn) or ""
        for param in inspect.signature(fn).parameters:
            assert f":param {param}:" in doc, f"{name} does not document {param}"
        assert ":returns:" in doc, f"{name} does not document its return value"


def test_hookspecs_document_what_plugins_receive():
    ops = inspect.getdoc(hookspecs.coralrt_register_ops)
    assert "coralrt._runtime.info.OpInfo" in ops
    for f in dataclasses.fields(OpInfo):
        assert f"``{f.name}``" in ops, f"coralrt_register_ops does not document OpInfo.{f.name}"
    step = inspect.getdoc(hookspecs.coralrt_run_step)
    assert "coralrt._runtime.info.StepInfo" in step
    for f in dataclasses.fields(StepInfo):
        assert f"``{f.name}" in step, f"coralrt_run_step does not document StepInfo.{f.name}"
    source = inspect.getsource(hookspecs)
    assert "coralrt.delegate" not in source and "runtime.executor" not in source
    assert "PluginError" in inspect.getdoc(hookspecs)  # broken entry points
    assert BUILTIN in inspect.getdoc(hookspecs)        # who wins over whom


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
    real = importlib.metadata.distributions
    monkeypatch.setattr(importlib.metadata, "distributions",
                        lambda: calls.append("scan") or real())
    PluginHost()
    assert calls == ["scan"]
    monkeypatch.setenv("CORALRT_DISABLE_PLUGIN_AUTOLOAD", "1")
    PluginHost()
    assert calls == ["scan"]  # not looked for again


# -- one test per hook, each calling it through the plugin manager ---------------------


def test_hook_coralrt_register_ops():
    plugin = SinhPlugin()
    host = PluginHost([plugin])
    kernel = host.ops.kernels["Sinh"]
    assert kernel.plugin == host.pm.get_name(plugin) and not kernel.builtin
    fresh = OpRegistry()
    host.pm.hook.coralrt_register_ops(registry=fresh.for_plugin("probe"))
    assert fresh.kernels["Sinh"].plugin == "probe"
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

    fresh = CompilerRegistry()
    pm = manager(counting=Plugin())
    pm.hook.coralrt_register_compilers(registry=fresh.for_plugin("counting"))
    assert set(fresh.compilers) == {"counting-native"}
    assert fresh.plugin_for("sim") == "counting"
    host = PluginHost([Plugin()])
    assert set(host.compilers.compilers) >= {"counting-native", "coralrt-native"}
    assert host.compilers.for_device("sim").id == "counting-native"  # a plugin wins
    sess = InferenceSession(shared_model("split_concat.tflite"), target="sim",
                            plugins=[Plugin()])
    assert CountingCompiler.calls == 1 and sess.compile_info["compiler"].startswith(
        "counting-native")


def test_hook_coralrt_register_rewrites():
    """A plugin's rewrite replaces coralrt's own of the same name and runs in sessions."""
    from coralrt.plugins._rewrite_registry import RewriteRegistry
    ran = []

    class NoGelu:
        name, version, exact, order = "gelu", 7, False, 100
        description = "a stand-in that only counts"

        def apply(self, editor):
            ran.append(len(editor.ops))
            return []

    class Plugin:
        @coralrt.hookimpl
        def coralrt_register_rewrites(self, registry):
            registry.add(NoGelu())

    fresh = RewriteRegistry()
    pm = manager(rw=Plugin())
    pm.hook.coralrt_register_rewrites(registry=fresh.for_plugin("rw"))
    assert list(fresh.rewrites) == ["gelu"] and fresh.plugin_for("gelu") == "rw"
    host = PluginHost([Plugin()])
    assert isinstance(host.rewrites.rewrites["gelu"], NoGelu)          # a plugin wins
    assert {"fc_as_conv", "split_wide"} <= set(host.rewrites.rewrites)
    sess = InferenceSession(shared_model("split_concat.tflite"), target="sim",
                            plugins=[Plugin()], rewrites=["gelu"])
    assert ran and sess.compile_info["rewrites"] == []


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

    fresh = DeviceRegistry()
    pm = manager(recording=Plugin())
    pm.hook.coralrt_register_devices(registry=fresh.for_plugin("recording"))
    assert fresh.factories["sim"] is factory and fresh.plugin_for("sim") == "recording"
    host = PluginHost([Plugin()])
    assert host.devices.factories["sim"] is factory  # a plugin wins
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
    assert [e["kind"] for e in events] == ["cache_miss", "segments_planned",
                                           "segment_compiled", "segment_compiled", "compiled"]
    assert events[1]["segments"] == 2 and events[1]["operators"] == 70
    assert events[2]["operators"] == 64 and events[2]["bytes"] > 0
    assert events[4]["segments"] == 2 and events[4]["operators"] == 70
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
            seen.append((step, time.perf_counter() - start))
            return outputs

    host = PluginHost([Timer()])
    assert host.wraps_steps
    step = StepInfo(index=0, kind="cpu", label="fake", operators=(3,), device=None,
                    run=lambda inputs: [inputs[0] + 1])
    assert host.pm.hook.coralrt_run_step(step=step, inputs=[1]) == [2]
    assert host.run_step(step, [1]) == [2]
    assert len(seen) == 2 and all(s is step for s, _ in seen)
    seen.clear()
    sess = InferenceSession(shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite"),
                            target="sim", plugins=[Timer()])
    sess.run(random_inputs(sess.get_inputs()))
    steps = [s for s, _ in seen]
    assert all(isinstance(s, StepInfo) for s in steps)  # not the executor's own Step
    assert [s.kind for s in steps] == ["tpu", "cpu", "tpu", "cpu"]
    assert [s.index for s in steps] == [0, 1, 2, 3]
    assert [s.label for s in steps] == [row["label"] for row in sess.profile()]
    assert [s.device is not None for s in steps] == [True, False, True, False]
    assert steps[0].device == sess.device.path
    assert all(isinstance(s.operators, tuple) and s.operators for s in steps)
    with pytest.raises(dataclasses.FrozenInstanceError):
        steps[0].kind = "cpu"


def test_step_hook_is_skipped_when_only_coralrt_implements_it(monkeypatch):
    calls = []
    original = PluginHost.run_step
    monkeypatch.setattr(PluginHost, "run_step",
                        lambda self, step, inputs: calls.append(step) or original(
                            self, step, inputs))
    assert not PluginHost().wraps_steps
    assert not PluginHost([SinhPlugin()]).wraps_steps  # other hooks do not count
    sess = InferenceSession(shared_model("custom_sinh.tflite"), plugins=[SinhPlugin()])
    sess.run(np.zeros(sess.get_inputs()[0].shape, np.float32))
    assert calls == []

    class Observer:  # a plain (non-wrapper) implementation also counts
        @coralrt.hookimpl
        def coralrt_run_step(self, step, inputs):
            return None

    assert PluginHost([Observer()]).wraps_steps
    sess = InferenceSession(shared_model("custom_sinh.tflite"),
                            plugins=[SinhPlugin(), Observer()])
    sess.run(np.zeros(sess.get_inputs()[0].shape, np.float32))
    assert [s.kind for s in calls] == ["plugin"]


# -- how registration hooks are called, and which plugin wins ---------------------------


def test_registration_hooks_are_called_through_pluggy_once_per_plugin():
    calls = []

    class Spy:  # wraps every registration hook, as pluggy's tracing would see them
        @coralrt.hookimpl(wrapper=True)
        def coralrt_register_ops(self, registry):
            calls.append(("ops", registry.plugin))
            return (yield)

        @coralrt.hookimpl(wrapper=True)
        def coralrt_register_compilers(self, registry):
            calls.append(("compilers", registry.plugin))
            return (yield)

        @coralrt.hookimpl(wrapper=True)
        def coralrt_register_devices(self, registry):
            calls.append(("devices", registry.plugin))
            return (yield)

    sinh, clamp = SinhPlugin(), ClampTpuPlugin()
    host = PluginHost([Spy(), sinh, clamp])
    names = {p: host.pm.get_name(p) for p in (sinh, clamp)}
    # coralrt's own operators come through the same hook (its operator specs).
    assert calls == [("ops", BUILTIN), ("ops", names[sinh]), ("ops", names[clamp]),
                     ("compilers", BUILTIN), ("devices", BUILTIN)]
    assert host.ops.kernels["Sinh"].plugin == names[sinh]
    assert host.ops.kernels["Clamp8"].plugin == names[clamp]
    assert host.ops.tpu_ops["Clamp8"].plugin == names[clamp]
    assert host.compilers.plugin_for("sim") == host.devices.plugin_for("sim") == BUILTIN


def test_registration_hooks_are_traced_by_pluggy(monkeypatch):
    traced = []
    real_init = pluggy.PluginManager.__init__

    def traced_init(pm, project):
        real_init(pm, project)
        pm.add_hookcall_monitoring(
            lambda hook, impls, kwargs: traced.append(
                (hook, [i.plugin_name for i in impls], kwargs.get("registry"))),
            lambda outcome, hook, impls, kwargs: None)

    monkeypatch.setattr(pluggy.PluginManager, "__init__", traced_init)
    host = PluginHost([SinhPlugin(), ClampCpuPlugin()])
    ops = [(impls, registry.plugin) for hook, impls, registry in traced
           if hook == "coralrt_register_ops"]
    # One call per plugin (coralrt's own too: its operator specs), each with only
    # that plugin's implementation.
    assert ops == [([name], name) for name in host.names]
    assert ("coralrt_register_devices", [BUILTIN]) in [(h, i) for h, i, _ in traced]


@pytest.mark.parametrize("order", [{}, {"tryfirst": True}, {"trylast": True}],
                         ids=["plain", "tryfirst", "trylast"])
def test_a_plugin_wins_over_the_builtins_whatever_the_call_order(order):
    compiler = NativeCompiler()
    compiler.id = "plugin-native"

    def factory(**options):
        raise AssertionError("not called")

    class Plugin:
        @coralrt.hookimpl(**order)
        def coralrt_register_compilers(self, registry):
            registry.add(compiler)

        @coralrt.hookimpl(**order)
        def coralrt_register_devices(self, registry):
            registry.add("sim", factory)

    host = PluginHost([Plugin()])
    assert host.compilers.for_device("sim") is compiler
    assert host.devices.factories["sim"] is factory
    assert host.compilers.for_device("usb") is not compiler  # only for its runs_on


@pytest.mark.parametrize("builtin_first", [True, False])
def test_registry_precedence_is_not_the_call_order(builtin_first):
    theirs, ours = NativeCompiler(), NativeCompiler()
    theirs.id = "theirs"

    def in_order(add, builtin, plugin):
        calls = [(builtin, BUILTIN), (plugin, "acme")]
        for value, name in calls if builtin_first else reversed(calls):
            add(value, name)

    compilers = CompilerRegistry()
    in_order(lambda c, name: compilers.for_plugin(name).add(c), ours, theirs)
    assert compilers.for_device("sim") is theirs and compilers.plugin_for("sim") == "acme"
    devices = DeviceRegistry()
    in_order(lambda f, name: devices.for_plugin(name).add("sim", f), print, repr)
    assert devices.factories["sim"] is repr and devices.plugin_for("sim") == "acme"
    kernels = OpRegistry()
    in_order(lambda f, name: kernels.for_plugin(name).add_kernel("ADD", f), print, repr)
    assert kernels.kernels["ADD"].fn is repr and not kernels.kernels["ADD"].builtin
    tpu = OpRegistry()
    in_order(lambda s, name: tpu.for_plugin(name).add_tpu_op("ADD", s, clamp_tpu),
             OpSupport(max_version=9), OpSupport(max_version=1))
    assert tpu.tpu_ops["ADD"].support.max_version == 1 and tpu.tpu_ops["ADD"].plugin == "acme"


@pytest.mark.parametrize("reverse", [False, True])
def test_two_third_party_plugins_providing_the_same_thing_is_an_error(reverse):
    compiler = NativeCompiler()
    compiler.id = "other-native"

    def factory(**options):
        raise AssertionError("not called")

    def plugin(hook, *args, method="add"):
        class Plugin:
            pass

        def impl(self, registry):
            getattr(registry, method)(*args)
        impl.__name__ = hook
        setattr(Plugin, hook, coralrt.hookimpl(impl))
        return Plugin()

    cases = [
        ("coralrt_register_ops", ("Sinh", np.sinh), "add_kernel", "a CPU kernel for 'Sinh'"),
        ("coralrt_register_ops", ("Clamp8", OpSupport(1), clamp_tpu), "add_tpu_op",
         "Edge TPU support for 'Clamp8'"),
        ("coralrt_register_compilers", (compiler,), "add", "compiler"),
        ("coralrt_register_devices", ("sim", factory), "add", "device kind 'sim'"),
    ]
    for hook, args, method, what in cases:
        a, b = plugin(hook, *args, method=method), plugin(hook, *args, method=method)
        pair = [b, a] if reverse else [a, b]
        with pytest.raises(ConfigError, match=f"two plugins provide {what}"):
            PluginHost(pair)


def test_compilers_conflict_on_a_shared_device_kind_or_id():
    first, second, third = NativeCompiler(), NativeCompiler(), NativeCompiler()
    first.id, second.id, third.id = "a", "b", "a"
    second.runs_on = ("usb", "sim")
    third.runs_on = ("tpu-farm",)
    registry = CompilerRegistry()
    registry.add(first, plugin="one")
    with pytest.raises(ConfigError, match=r"a compiler for 'sim' devices \(one and two\)"), \
            pytest.warns(DeprecationWarning, match="'usb' is now called 'coral'"):
        registry.add(second, plugin="two")
    with pytest.raises(ConfigError, match=r"compiler id 'a' \(one and three\)"):
        registry.add(third, plugin="three")
    assert registry.for_device("usb") is None  # a refused compiler leaves nothing behind
    assert registry.compilers == {"a": first}


def add_model():
    """One int8 ADD, which coralrt's rule table maps to the Edge TPU."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8), np.int8, **Q)
    y = b.tensor("y", (1, 4, 4, 8), np.int8, **Q)
    b.op("ADD", [x, x], [y])
    b.output(y)
    return b.build()


def test_a_plugin_support_rule_replaces_the_builtin_rule():
    sg = add_model().main
    view = OpView(sg, sg.operators[0], 0)

    def refuse(v):
        return "acme refuses ADD"

    ops = OpRegistry()
    assert ops.rules().check(view) is None  # coralrt's table maps this ADD
    ops.for_plugin("acme").add_tpu_op("ADD", OpSupport(4, (refuse,)), clamp_tpu)
    assert ops.rules().check(view) == "acme refuses ADD"
    # A rule from coralrt's own plugin does not override a third party's either.
    ops.for_plugin(BUILTIN).add_tpu_op("ADD", OpSupport(4), clamp_tpu)
    assert ops.rules().check(view) == "acme refuses ADD"
    assert [name for name, _ in ops.fingerprint()] == ["ADD"]


def test_a_plugin_support_rule_replaces_the_builtin_rule_in_a_session():
    class NoTpuAdd:
        @coralrt.hookimpl
        def coralrt_register_ops(self, registry):
            registry.add_tpu_op("ADD", OpSupport(4, (lambda v: "acme: no ADD",)), clamp_tpu)

    plain = InferenceSession(add_model(), target="sim")
    assert [s["kind"] for s in plain.profile()] == ["tpu"]
    refused = InferenceSession(add_model(), target="sim", plugins=[NoTpuAdd()])
    assert [s["kind"] for s in refused.profile()] == ["cpu"]
    assert refused.compile_info["placement"][0][2] == "acme: no ADD"


def test_plugin_objects_must_be_hashable():
    @dataclasses.dataclass
    class Unhashable:  # eq=True makes instances unhashable
        kind: str = "sim"

        @coralrt.hookimpl
        def coralrt_register_devices(self, registry):
            registry.add(self.kind, print)

    @dataclasses.dataclass(eq=False)
    class Hashable:
        kind: str = "sim"
        coralrt_register_devices = Unhashable.coralrt_register_devices

    with pytest.raises(PluginError, match="not hashable"):
        PluginHost([Unhashable()])
    assert PluginHost([Hashable()]).devices.factories["sim"] is print


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
