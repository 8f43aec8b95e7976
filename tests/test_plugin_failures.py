"""A broken plugin does not take coralrt down; plugin errors name the plugin.

Installed plugins are real: each test writes a distribution (``*.dist-info``
with ``METADATA`` and ``entry_points.txt``, and its module) into a folder put
on ``sys.path``, where ``importlib.metadata`` finds it as it finds a package
installed with pip.
"""

from __future__ import annotations

import itertools
import json
import logging
import sys
import textwrap

import numpy as np
import pytest

import coralrt
from coralrt import InferenceSession
from coralrt._cli.main import main
from coralrt.plugins import OpSupport
from coralrt.errors import ConfigError, InferenceError, InputError, PluginError
from coralrt.testing import ModelBuilder
from coralrt.plugins import _host as plugin_host_module, _hookspecs as hookspecs
from coralrt.plugins._host import PluginHost, columns
from coralrt.plugins._registry import BUILTIN

DISABLE = "CORALRT_DISABLE_PLUGIN_AUTOLOAD"
STRICT = "CORALRT_PLUGINS_STRICT"
_MODULE_NUMBER = itertools.count()   # a fresh module name per install: no stale sys.modules

GOOD = """
import numpy as np
import coralrt

@coralrt.hookimpl
def coralrt_register_ops(registry):
    registry.add_kernel("Twice", lambda inputs, op: [inputs[0] * np.float32(2)])
"""

BROKEN = {
    "import": ("import coralrt_no_such_module\n", "ModuleNotFoundError: No module named"),
    "raises": ("""
import coralrt

@coralrt.hookimpl
def coralrt_register_ops(registry):
    raise ValueError("acme kernels are out of stock")
""", "coralrt_register_ops raised ValueError: acme kernels are out of stock"),
    "returns": ("""
import coralrt

@coralrt.hookimpl
def coralrt_register_devices(registry):
    return 42
""", "coralrt_register_devices returned int 42"),
    "adds garbage": ("""
import coralrt

@coralrt.hookimpl
def coralrt_register_compilers(registry):
    registry.add("not a compiler")
""", "coralrt_register_compilers raised ConfigError: compiler 'not a compiler' has no 'id'"),
    "unknown hook": ("""
import coralrt

@coralrt.hookimpl
def coralrt_register_operators(registry):
    pass
""", "unknown hook 'coralrt_register_operators'"),
}


@pytest.fixture
def install(tmp_path, monkeypatch):
    """``install(dist, source, entry_point=...)`` makes ``dist`` 1.0 an installed
    package with one module and one ``coralrt`` entry point."""
    monkeypatch.delenv(DISABLE, raising=False)
    monkeypatch.delenv(STRICT, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = []

    def install(dist: str, source: str, *, entry_point: str | None = None,
                version: str = "1.0") -> str:
        module = f"{dist.replace('-', '_')}_{next(_MODULE_NUMBER)}"
        modules.append(module)
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\n"
                                       f"Version: {version}\n")
        (info / "entry_points.txt").write_text(
            f"[coralrt]\n{entry_point or dist.split('-')[-1]} = {module}\n")
        import importlib
        importlib.invalidate_caches()
        return module

    plugin_host_module.reset()
    yield install
    plugin_host_module.reset()
    for module in modules:
        sys.modules.pop(module, None)


def twice_model():
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.float32)
    y = b.tensor("y", (1, 4), np.float32)
    b.op("ADD", [x, x], [y])
    z = b.tensor("z", (1, 4), np.float32)
    b.op("Twice", [y], [z])
    b.output(z)
    return b.build()


def add_model():
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.float32)
    y = b.tensor("y", (1, 4), np.float32)
    b.op("ADD", [x, x], [y])
    b.output(y)
    return b.build()


def int8_add_model():
    """One int8 ADD, which maps to the Edge TPU."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8), np.int8, scale=0.05, zero_point=-3)
    y = b.tensor("y", (1, 4, 4, 8), np.int8, scale=0.05, zero_point=-3)
    b.op("ADD", [x, x], [y])
    b.output(y)
    return b.build()


X = np.arange(4, dtype=np.float32).reshape(1, 4)


def plugin_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "coralrt.plugins" and r.levelno >= logging.WARNING]


# -- a broken installed plugin is skipped -------------------------------------------------


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_broken_installed_plugin_is_skipped_with_one_warning(kind, install, caplog):
    source, error = BROKEN[kind]
    install("acme-broken", source, entry_point="acme")
    install("acme-good", GOOD, entry_point="twice")
    with caplog.at_level(logging.DEBUG, logger="coralrt.plugins"):
        plain = InferenceSession(add_model())              # a plain CPU run
        np.testing.assert_array_equal(plain.run(X)["y"], X + X)
        custom = InferenceSession(twice_model())           # the good plugin still works
        np.testing.assert_array_equal(custom.run(X)["z"], 4 * X)
        PluginHost()                                       # a second host: no second warning
    (message,) = plugin_warnings(caplog)
    assert "'acme'" in message and "acme-broken 1.0" in message
    assert error in message
    assert f"{DISABLE}=1" in message and f"{STRICT}=1" in message
    host = plugin_host_module.plugin_host()
    assert "acme" not in host.names and "twice" in host.names
    (record,) = [r for r in host.records if r.name == "acme"]
    assert record.status == "skipped" and error in record.error


def test_strict_mode_raises_plugin_error(install, monkeypatch):
    install("acme-broken", BROKEN["raises"][0], entry_point="acme")
    monkeypatch.setenv(STRICT, "1")
    with pytest.raises(PluginError, match=r"plugin 'acme' \(entry point acme = .* in "
                                          r"acme-broken 1.0\) is broken: coralrt_register_ops "
                                          r"raised ValueError") as info:
        InferenceSession(add_model())
    assert isinstance(info.value.__cause__, ValueError)
    assert STRICT in str(info.value) and DISABLE in str(info.value)
    monkeypatch.setenv(STRICT, "maybe")
    with pytest.raises(ConfigError, match=STRICT):
        PluginHost()


def test_strict_mode_names_an_entry_point_that_does_not_import(install):
    install("acme-missing", BROKEN["import"][0], entry_point="missing")
    with pytest.raises(PluginError, match="'missing'.*acme-missing 1.0.*loading it failed: "
                                          "ModuleNotFoundError") as info:
        PluginHost(strict=True)
    assert isinstance(info.value.__cause__, ImportError)


def test_a_plugin_failing_half_way_adds_nothing(install, caplog):
    install("acme-half", """
        import numpy as np
        import coralrt

        @coralrt.hookimpl
        def coralrt_register_ops(registry):
            registry.add_kernel("Twice", lambda inputs, op: [inputs[0] * 2])

        @coralrt.hookimpl
        def coralrt_register_devices(registry):
            raise RuntimeError("no device today")

        @coralrt.hookimpl(wrapper=True)
        def coralrt_run_step(step, inputs):
            raise AssertionError("a skipped plugin is not called")
            yield
    """, entry_point="half")
    host = PluginHost()
    assert "Twice" not in host.ops.kernels        # registered before its devices hook failed
    assert "half" not in host.names and not host.wraps_steps
    assert host.devices.plugin_for("sim") == BUILTIN
    assert "coralrt_register_devices raised RuntimeError: no device today" in \
        plugin_warnings(caplog)[0]


def test_an_observer_that_raises_does_not_stop_the_compile(install, caplog, monkeypatch):
    install("acme-observer", """
        import coralrt

        @coralrt.hookimpl
        def coralrt_compile_event(event):
            raise OSError("log server unreachable")
    """, entry_point="observer")
    seen = []

    class Observer:
        @coralrt.hookimpl
        def coralrt_compile_event(self, event):
            seen.append(event["kind"])

    sess = InferenceSession(int8_add_model(), target="sim", plugins=[Observer()])
    # the other observer still sees all
    assert seen == ["cache_miss", "segments_planned", "segment_compiled", "compiled"]
    assert [s["kind"] for s in sess.profile()] == ["tpu"]
    (message,) = plugin_warnings(caplog)
    assert "'observer'" in message and "coralrt_compile_event raised OSError" in message
    monkeypatch.setenv(STRICT, "1")
    monkeypatch.setenv("CORALRT_CACHE", "0")
    with pytest.raises(PluginError, match="coralrt_compile_event raised OSError"):
        InferenceSession(int8_add_model(), target="sim")


def test_two_installed_plugins_providing_the_same_thing_stay_an_error(install):
    install("acme-one", GOOD, entry_point="one")
    install("acme-two", GOOD, entry_point="two")
    with pytest.raises(ConfigError, match=r"two plugins provide a CPU kernel for 'Twice' "
                                          r"\((one and two|two and one)\)"):
        PluginHost()


def test_autoload_off_loads_no_installed_plugin(install, monkeypatch, caplog):
    install("acme-broken", BROKEN["raises"][0], entry_point="acme")
    monkeypatch.setenv(DISABLE, "1")
    host = PluginHost(strict=True)
    assert host.names == [BUILTIN] and not plugin_warnings(caplog)


def test_an_explicit_broken_plugin_raises():
    class Raises:
        @coralrt.hookimpl
        def coralrt_register_ops(self, registry):
            raise KeyError("Twice")

    with pytest.raises(PluginError, match=r"plugin test_plugin_failures\."
                                          r"test_an_explicit_broken_plugin_raises\.<locals>\."
                                          r"Raises: coralrt_register_ops raised KeyError") as e:
        PluginHost([Raises()])
    assert isinstance(e.value.__cause__, KeyError)


# -- names --------------------------------------------------------------------------------


class Twice:
    @coralrt.hookimpl
    def coralrt_register_ops(self, registry):
        registry.add_kernel("Twice", lambda inputs, op: [inputs[0] * np.float32(2)])


class Watcher:
    @coralrt.hookimpl
    def coralrt_compile_event(self, event):
        pass


def test_plugin_objects_are_named_by_their_class():
    import coralrt.plugins._builtins as module
    host = PluginHost([Twice(), Watcher(), Watcher(), Watcher])
    names = host.names[1:]
    assert names == ["test_plugin_failures.Twice", "test_plugin_failures.Watcher",
                     "test_plugin_failures.Watcher#2", "test_plugin_failures.Watcher#3"]
    assert host.ops.kernels["Twice"].plugin == "test_plugin_failures.Twice"
    sess = InferenceSession(twice_model(), plugins=[Twice()])
    sess.run(X)
    assert "plugin: Twice (test_plugin_failures.Twice)" in [s["label"] for s in sess.profile()]
    with pytest.raises(PluginError, match="already registered"):
        PluginHost([module])  # coralrt's own plugin module, under its module name


# -- errors inside plugin kernels ---------------------------------------------------------


def raising_plugin(error: BaseException):
    class Raising:
        @coralrt.hookimpl
        def coralrt_register_ops(self, registry):
            def kernel(inputs, op):
                raise error
            registry.add_kernel("Twice", kernel)
    return Raising()


@pytest.mark.parametrize("error", [ValueError("bad lane"), InputError("bad input")],
                         ids=["ValueError", "coralrt error"])
def test_a_kernel_error_is_an_inference_error_naming_operator_and_plugin(error):
    plugin = raising_plugin(error)
    sess = InferenceSession(twice_model(), plugins=[plugin])
    with pytest.raises(InferenceError) as info:
        sess.run(X)
    name = f"{type(plugin).__module__}.{type(plugin).__qualname__}"
    assert str(info.value) == (f"operator 1 (custom Twice): the CPU kernel of plugin {name} "
                               f"raised {type(error).__name__}: {error}")
    assert info.value.__cause__ is error
    sess = InferenceSession(twice_model(), plugins=[Twice()])  # nothing left behind
    np.testing.assert_array_equal(sess.run(X)["z"], 4 * X)


def test_an_interrupt_inside_a_kernel_is_not_wrapped():
    sess = InferenceSession(twice_model(), plugins=[raising_plugin(KeyboardInterrupt())])
    with pytest.raises(KeyboardInterrupt):
        sess.run(X)


def negate_model():
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 8), np.int8, scale=0.1, zero_point=0)
    h = b.tensor("h", (1, 8, 8, 8), np.int8, scale=0.1, zero_point=0)
    b.op("RELU", [x], [h])
    y = b.tensor("y", (1, 8, 8, 8), np.int8, scale=0.1, zero_point=0)
    b.op("Negate8", [h], [y])
    b.output(y)
    return b.build()


class BadTpuNegate:
    @coralrt.hookimpl
    def coralrt_register_ops(self, registry):
        def factory(ctx):
            def run(inputs):
                raise ValueError("negative zero")
            return run
        registry.add_tpu_op("Negate8", OpSupport(max_version=1), factory)


def test_a_simulated_edge_tpu_kernel_error_names_operator_and_plugin():
    sess = InferenceSession(negate_model(), target="sim", plugins=[BadTpuNegate()])
    assert [s["kind"] for s in sess.profile()] == ["tpu"]
    with pytest.raises(InferenceError, match=r"operator Negate8 \(Edge TPU kernel of plugin "
                                             r"test_plugin_failures.BadTpuNegate\) raised "
                                             r"ValueError: negative zero"):
        sess.run(np.ones((1, 8, 8, 8), np.int8))


# -- coralrt plugins ----------------------------------------------------------------------


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plugins_command_lists_builtin_installed_and_broken(install, capsys):
    install("acme-good", GOOD, entry_point="twice", version="2.5")
    install("acme-broken", BROKEN["raises"][0], entry_point="acme")
    code, out, err = cli(capsys, "plugins")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split()[:7] == ["plugin", "from", "status", "operators", "rules",
                                  "compilers", "devices"]
    builtin = next(r for r in rows if r.startswith(BUILTIN))
    assert "coralrt-native" in builtin and " sim " in builtin
    good = next(r for r in rows if r.startswith("twice "))
    assert "acme-good 2.5" in good and "loaded" in good and "Twice" in good
    broken = next(r for r in rows if r.startswith("acme "))
    assert "acme-broken 1.0" in broken and "SKIPPED" in broken
    assert "  acme: coralrt_register_ops raised ValueError: acme kernels are out of stock" in out
    assert DISABLE in out and STRICT in out


def test_plugins_command_json(install, capsys, monkeypatch):
    install("acme-good", GOOD, entry_point="twice", version="2.5")
    install("acme-broken", BROKEN["import"][0], entry_point="acme")
    monkeypatch.setenv(STRICT, "1")  # the listing never raises: it shows the error
    code, out, _ = cli(capsys, "plugins", "--json")
    report = json.loads(out)
    assert code == 0 and report["strict"] and report["autoload"]
    assert report["columns"] == ["operators", "rules", "compilers", "devices",
                                 "rewrites"] == columns()
    plugins = {p["name"]: p for p in report["plugins"]}
    assert plugins[BUILTIN]["source"] == "builtin"
    assert plugins[BUILTIN]["provides"]["devices"] == ["sim"]
    # Approximations are marked with "~".
    assert plugins[BUILTIN]["provides"]["rewrites"] == ["fc_as_conv", "gelu~",
                                                        "split_embedding", "split_wide"]
    good = plugins["twice"]
    assert (good["distribution"], good["version"], good["status"]) == ("acme-good", "2.5",
                                                                       "loaded")
    assert good["provides"] == {"operators": ["Twice"], "rules": [], "compilers": [],
                                "devices": [], "rewrites": []}
    assert good["hooks"] == ["coralrt_register_ops"]
    broken = plugins["acme"]
    assert broken["status"] == "skipped" and "ModuleNotFoundError" in broken["error"]
    assert broken["provides"] == dict.fromkeys(report["columns"], [])


def test_plugins_command_with_autoload_off_lists_without_loading(install, capsys,
                                                                 monkeypatch):
    module = install("acme-good", GOOD, entry_point="twice")
    monkeypatch.setenv(DISABLE, "1")
    code, out, _ = cli(capsys, "plugins", "--json")
    plugins = {p["name"]: p for p in json.loads(out)["plugins"]}
    assert code == 0 and plugins["twice"]["status"] == "disabled"
    assert module not in sys.modules


def test_plugins_command_shows_a_conflict(install, capsys):
    install("acme-one", GOOD, entry_point="one")
    install("acme-two", GOOD, entry_point="two")
    code, out, _ = cli(capsys, "plugins", "--json")
    statuses = {p["name"]: p["status"] for p in json.loads(out)["plugins"]}
    assert code == 0 and sorted(statuses.values()).count("conflict") == 1


def test_a_new_registration_hook_becomes_a_column(install, capsys, monkeypatch):
    @hookspecs.hookspec
    def coralrt_register_exporters(registry):
        """A registration hook this version of the host does not fill."""

    monkeypatch.setattr(hookspecs, "coralrt_register_exporters", coralrt_register_exporters,
                        raising=False)
    install("acme-exporters", """
        import coralrt

        @coralrt.hookimpl
        def coralrt_register_exporters(registry):
            pass
    """, entry_point="exporters")
    assert columns()[-1] == "exporters"
    code, out, _ = cli(capsys, "plugins", "--json")
    plugins = {p["name"]: p for p in json.loads(out)["plugins"]}
    assert plugins["exporters"]["provides"]["exporters"] == ["yes"]
    assert plugins[BUILTIN]["provides"]["exporters"] == []
    code, out, _ = cli(capsys, "plugins")
    assert out.splitlines()[0].split()[-3:] == ["exporters", "other", "hooks"]
