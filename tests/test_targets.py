"""The target registry, SessionOptions, and the former device-kind word ``usb``."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from conftest import shared_model
from test_cli import cli

import coralrt
from coralrt import InferenceSession, SessionOptions, _config as config, _targets as targets
from coralrt.testing import build_demo_model
from coralrt.plugins import NativeCompiler
from coralrt.errors import ConfigError
from coralrt.plugins._host import PluginHost
from coralrt.plugins._kind_registry import CompilerRegistry, DeviceRegistry
from coralrt._sim.stick.backend import SimulatedBackend
from coralrt._sim.stick.device import SimulatedStick, simulated_stick
from coralrt._usb.driver import UsbEdgeTpu

# -- the registry ---------------------------------------------------------------------------


def test_builtin_targets_and_auto_order():
    assert coralrt.TARGETS == ("cpu", "sim", "coral", "auto")
    assert config.COMPAT_TARGETS is coralrt.TARGETS
    assert [t.name for t in targets.auto_order()] == ["coral", "cpu"]
    kinds = {t.name: (t.device_kind, t.compiler_kind) for t in targets.registered()}
    assert kinds == {"cpu": (None, None), "sim": ("sim", "sim"), "coral": ("coral", "coral")}
    assert targets.names(hardware=False) == ("cpu", "sim")


@pytest.fixture
def spare_target():
    """A target "spare" on a plugin's device kind "spare", registered for one test."""
    target = targets.Target("spare", "spare", "spare", targets.prepare_on_device,
                            title="the spare device")
    targets.register(target)
    yield target
    targets.unregister("spare")


class SparePlugin:
    """Device kind "spare" (a simulated stick) and a compiler for it."""

    def __init__(self):
        self.made = []

    @coralrt.hookimpl
    def coralrt_register_devices(self, registry):
        def factory(kernels=None):
            self.made.append("spare")
            return simulated_stick(kernels)
        registry.add("spare", factory)

    @coralrt.hookimpl
    def coralrt_register_compilers(self, registry):
        compiler = NativeCompiler()
        compiler.id, compiler.runs_on = "spare-native", ("spare",)
        registry.add(compiler)


def test_a_registered_target_is_in_every_list(spare_target, capsys, monkeypatch):
    assert coralrt.TARGETS == ("cpu", "sim", "coral", "spare", "auto")
    assert "spare" in coralrt._session.TARGETS
    code, out, _ = cli(capsys, "run", "--help")
    assert code == 0 and "{cpu,sim,coral,spare,auto}" in out
    code, out, _ = cli(capsys, "bench", "--help")
    assert code == 0 and "{cpu,sim,spare}" in out
    monkeypatch.setenv(config.TARGET, "spare")
    assert config.compat_target() == "spare"
    from coralrt.compat._runner import _parser
    assert "{cpu,sim,coral,spare,auto}" in _parser().format_usage()
    from coralrt.gp._context import _targets
    assert _targets() == ["sim", "coral", "spare", "cpu"]
    with pytest.raises(ConfigError, match="choose sim, coral, spare or cpu"):
        coralrt.gp.Context("nowhere")


def test_a_plugin_device_kind_is_reachable_through_its_target(spare_target):
    plugin = SparePlugin()
    model = build_demo_model()
    sess = InferenceSession(model, "spare", plugins=[plugin])
    want = InferenceSession(model, "sim").run(np.zeros(sess.get_inputs()[0].shape, np.uint8))
    got = sess.run(np.zeros(sess.get_inputs()[0].shape, np.uint8))
    assert plugin.made == ["spare"] and sess.target == "spare"
    assert sess.compile_info["compiler"].startswith("spare-native")
    for w, g in zip(want.values(), got.values()):
        np.testing.assert_array_equal(w, g)
    with pytest.raises(ConfigError, match="no compiler for 'spare' devices"):
        InferenceSession(model, "spare")
    sess.close()


def test_target_registration_is_checked(spare_target):
    with pytest.raises(ConfigError, match="already registered"):
        targets.register(spare_target)
    with pytest.raises(ConfigError, match="other than 'auto'"):
        targets.Target("auto", None, None, targets.prepare_cpu)
    with pytest.raises(ConfigError, match="probe and auto_rank go together"):
        targets.Target("x", None, None, targets.prepare_cpu, auto_rank=1)


# -- device kinds -----------------------------------------------------------------------------


def test_one_word_per_kind():
    assert UsbEdgeTpu.kind == "coral" and SimulatedStick.kind == "sim"
    assert simulated_stick().kind == "sim"
    host = PluginHost([])
    assert host.compilers.for_device("sim").runs_on == ("sim",)
    assert host.devices.factories.keys() == {"sim"}


def test_usb_is_an_alias_of_coral():
    compiler = NativeCompiler()
    compiler.id, compiler.runs_on = "old-words", ("usb",)
    registry = CompilerRegistry()
    with pytest.warns(DeprecationWarning, match="'usb' is now called 'coral'"):
        registry.add(compiler, plugin="old")
    assert registry.for_device("coral") is compiler is registry.for_device("usb")
    assert registry.plugin_for("coral") == "old"

    def factory(**options):
        return UsbEdgeTpu(None, SimulatedBackend(firmware_loaded=True))
    devices = DeviceRegistry()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)   # may have warned already
        devices.add("usb", factory, plugin="old")
    assert devices.factories == {"coral": factory}
    assert devices.plugin_for("usb") == devices.plugin_for("coral") == "old"
    assert isinstance(devices.create("usb"), UsbEdgeTpu)


def test_a_plugin_coral_device_is_the_default_stick_of_coral():
    from coralrt._backends import get_backend
    from coralrt._targets.prepare import _first_stick
    made = []

    class Plugin:
        @coralrt.hookimpl
        def coralrt_register_devices(self, registry):
            def factory():
                made.append(simulated_stick())
                return made[-1]
            registry.add("coral", factory)

    loading = targets.Loading(SessionOptions(), get_backend(None), PluginHost([Plugin()]))
    stick = _first_stick(loading, "coral")
    assert made == [stick] and stick.is_open
    stick.close()


# -- SessionOptions ---------------------------------------------------------------------------


def test_session_options_are_frozen_typed_and_declared_once():
    options = SessionOptions(num_threads=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.num_threads = 3
    hints = {f.name: f.type for f in dataclasses.fields(SessionOptions)}
    assert hints["rewrites"] == "str | Sequence[str] | None"
    assert "object" not in hints.values()
    assert coralrt.SessionOptions is coralrt._session.SessionOptions
    assert set(hints) == {"num_threads", "backend", "cpu_kernels", "partition_mode",
                          "rewrites", "cache", "device", "plugins", "override_builtins",
                          "pipeline_depth", "compiler_url", "strategy", "max_pending",
                          "driver"}


def test_options_and_keywords_make_the_same_session():
    path = shared_model("add_quantized_int8.tflite")
    by_words = InferenceSession(path, "cpu", num_threads=1, max_pending=2)
    by_options = InferenceSession(path, "cpu", SessionOptions(num_threads=1, max_pending=2))
    overridden = InferenceSession(path, "cpu", SessionOptions(num_threads=3, max_pending=2),
                                  num_threads=1)
    assert by_words.options == by_options.options == overridden.options
    assert by_words.options == SessionOptions(num_threads=1, max_pending=2)


def test_options_are_checked_as_the_keywords_were():
    path = shared_model("add_quantized_int8.tflite")
    with pytest.raises(TypeError, match=r"InferenceSession.__init__\(\) got an unexpected "
                                        r"keyword argument 'bogus'"):
        InferenceSession(path, "gpu", bogus=1)        # the keyword first, as before
    with pytest.raises(ConfigError, match="unknown target 'gpu'"):
        InferenceSession(path, "gpu", strategy="bad")
    for bad in (dict(strategy="bad"), dict(max_pending=0)):
        with pytest.raises(ConfigError):
            SessionOptions(**bad)
        with pytest.raises(ConfigError):
            InferenceSession(path, "cpu", **bad)
    with pytest.raises(TypeError, match="options must be a coralrt.SessionOptions"):
        InferenceSession(path, "cpu", {"num_threads": 1})


def test_the_session_keeps_the_driver_only_for_coral(monkeypatch):
    monkeypatch.delenv(config.DRIVER, raising=False)
    sess = InferenceSession(shared_model("add_quantized_int8.tflite"), "cpu")
    assert sess.options.driver is None
    with pytest.raises(ConfigError, match="applies only to target='coral'"):
        InferenceSession(shared_model("add_quantized_int8.tflite"), "sim",
                         driver="libedgetpu")
