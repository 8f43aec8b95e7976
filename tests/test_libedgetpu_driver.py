"""``driver="libedgetpu"``: the paths that can run here (no libedgetpu, no stick).

What is real: the probing child process (a real Python running the real probe
script against real files: a missing library, a file that is not a shared
library, a real shared library that is not a delegate, and, where a C compiler
is installed, tiny shared objects standing in for broken builds: one that
crashes when loaded, one whose delegate creation crashes, one that refuses to
create a delegate, and one whose delegate takes no operator).  A crashing
child is also stood in for by a Python child that kills itself with SIGSEGV.
Nothing here runs libedgetpu or an Edge TPU.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import shared_model

from coralrt import InferenceSession, _config as config
from coralrt._backends import get_backend
from coralrt._backends import libedgetpu as via
from coralrt.errors import (
    CompilerUnavailableError,
    ConfigError,
    DriverUnavailableError,
    LIBEDGETPU_HELP,
    ModelError,
    TargetUnavailableError,
)
from coralrt import load_model

# The driver loads the Edge TPU delegate into a LiteRT interpreter.
pytestmark = pytest.mark.needs_litert("the libedgetpu driver runs inside LiteRT's interpreter")

COMPILED = "edgetpu/split_concat_edgetpu.tflite"
PLAIN = "add_quantized_uint8.tflite"
SEGV = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(config.DRIVER, raising=False)
    via.clear_probe_cache()
    yield
    via.clear_probe_cache()


def installed() -> bool:
    return ctypes.util.find_library("edgetpu") is not None or any(
        os.path.exists(os.path.join(d, via.LIBRARY))
        for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d)


def no_probe(*args, **kwargs):
    raise AssertionError("libedgetpu was probed")


# -- not installed -------------------------------------------------------------------------

@pytest.mark.skipif(installed(), reason="libedgetpu is installed on this machine")
def test_not_installed_is_a_typed_error_with_install_help_in_bounded_time():
    start = time.monotonic()
    with pytest.raises(DriverUnavailableError) as info:
        InferenceSession(shared_model(COMPILED), target="coral", driver="libedgetpu")
    assert time.monotonic() - start < 30
    e = info.value
    assert isinstance(e, TargetUnavailableError) and isinstance(e, NotImplementedError)
    assert e.cause == "missing" and e.library == "libedgetpu.so.1"
    text = str(e)
    assert text.startswith("libedgetpu is not installed: libedgetpu.so.1 was not found")
    for hint in ("libedgetpu.so.1", "LD_LIBRARY_PATH", "community build", "feranick/libedgetpu",
                 "driver='coralrt'"):
        assert hint in text, hint


@pytest.mark.skipif(installed(), reason="libedgetpu is installed on this machine")
def test_the_library_is_probed_before_any_compile(monkeypatch):
    # A plain model and no compiler: the missing library is said first, not the compiler.
    monkeypatch.setenv(config.DRIVER, "libedgetpu")
    monkeypatch.setenv("CORALRT_EDGETPU_COMPILER", "")
    with pytest.raises(DriverUnavailableError, match="not installed"):
        InferenceSession(shared_model(PLAIN), target="coral")


def test_a_file_that_is_not_a_shared_library(tmp_path, monkeypatch):
    fake = tmp_path / "libedgetpu.so.1"
    fake.write_text("not an ELF file\n")
    monkeypatch.setattr(via, "LIBRARY", str(fake))
    with pytest.raises(DriverUnavailableError) as info:
        InferenceSession(shared_model(COMPILED), target="coral", driver="libedgetpu")
    assert info.value.cause == "not-loadable" and info.value.library == str(fake)
    assert "cannot be loaded as a shared library" in str(info.value)
    assert LIBEDGETPU_HELP in str(info.value)


def test_a_shared_library_that_is_not_a_delegate():
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to stand in for a shared library that is not libedgetpu")
    p = via.probe(libm)
    assert p.stage == "not-libedgetpu" and "tflite_plugin_create_delegate" in p.message
    with pytest.raises(DriverUnavailableError, match="is not libedgetpu") as info:
        via.check_ready(get_backend(), library=libm)
    assert info.value.cause == "not-libedgetpu"


def test_an_interpreter_the_child_cannot_import():
    p = via.probe("libedgetpu.so.1", module="no_such_litert_module.interpreter")
    assert p.stage == "no-litert" and "ModuleNotFoundError" in p.message


# -- a crashing, hanging or silent child ------------------------------------------------------

def test_a_child_killed_by_sigsegv_is_a_typed_error_and_this_process_lives():
    p = via.probe("libedgetpu.so.1", command=SEGV)
    assert p.stage == "crash" and p.signal == 11 and p.returncode == -11
    e = via.failure(p, {"device": "usb"}, 5.0)
    assert isinstance(e, DriverUnavailableError) and e.cause == "crash" and e.signal == 11
    assert "SIGSEGV while loading the library" in str(e)
    assert "did not load it into this process" in str(e)
    assert "another LiteRT version" in str(e) and "ai-edge-litert" in str(e)
    assert os.getpid() > 0   # still here


def test_a_crash_is_kept_per_library_and_process(tmp_path):
    runs = tmp_path / "runs"
    count = [sys.executable, "-c", f"open({str(runs)!r}, 'a').write('x'); "
             "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    first = via.probe("libedgetpu.so.1", command=count)
    assert via.probe("libedgetpu.so.1", command=count) is first
    assert runs.read_text() == "x"
    via.probe("/other/libedgetpu.so.1", command=count)      # another library: probed again
    assert runs.read_text() == "xx"
    via.clear_probe_cache()
    via.probe("libedgetpu.so.1", command=count)
    assert runs.read_text() == "xxx"


def test_a_hanging_child_is_stopped_and_not_cached():
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    start = time.monotonic()
    p = via.probe("libedgetpu.so.1", command=sleeper, timeout=1.0)
    assert p.stage == "timeout" and time.monotonic() - start < 20
    e = via.failure(p, {}, 1.0)
    assert e.cause == "timeout" and "did not finish within 1 s" in str(e)
    assert via.probe("libedgetpu.so.1", command=SEGV) is not p   # other command, other key
    assert via.probe("libedgetpu.so.1", command=sleeper, timeout=0.5) is not p


def test_a_child_that_ends_without_a_report():
    silent = [sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"]
    p = via.probe("libedgetpu.so.1", command=silent)
    assert p.stage == "error" and p.returncode == 3
    e = via.failure(p, {}, 5.0)
    assert e.cause == "error" and "status 3" in str(e) and "boom" in str(e)


# -- settings ------------------------------------------------------------------------------

def test_coralrt_driver_values(monkeypatch):
    assert config.driver() == "coralrt"
    monkeypatch.setenv(config.DRIVER, " LibEdgeTPU ")
    assert config.driver() == "libedgetpu"
    monkeypatch.setenv(config.DRIVER, "")
    assert config.driver() == "coralrt"
    monkeypatch.setenv(config.DRIVER, "pycoral")
    with pytest.raises(ConfigError, match="CORALRT_DRIVER='pycoral' is not a driver"):
        config.driver()
    with pytest.raises(ConfigError, match="CORALRT_DRIVER"):
        InferenceSession(shared_model(PLAIN))


def test_the_keyword_wins_over_the_variable(monkeypatch):
    monkeypatch.setenv(config.DRIVER, "pycoral")          # not even read
    assert InferenceSession(shared_model(PLAIN), driver="coralrt").target == "cpu"
    monkeypatch.setenv(config.DRIVER, "libedgetpu")
    monkeypatch.setattr(via, "probe", no_probe)
    monkeypatch.setenv("CORALRT_EDGETPU_COMPILER", "")
    import coralrt._usb     # a stick is attached: the next thing coralrt's path needs is a compiler
    monkeypatch.setattr(coralrt._usb, "list_devices", lambda *a, **k: [object()])
    with pytest.raises(CompilerUnavailableError):        # coralrt's path, not libedgetpu's
        InferenceSession(shared_model(PLAIN), target="coral", driver="coralrt")


def test_unknown_driver_keyword():
    with pytest.raises(ConfigError, match="unknown driver 'pycoral'; choose one of coralrt, "
                                          "libedgetpu"):
        InferenceSession(shared_model(PLAIN), target="coral", driver="pycoral")


@pytest.mark.parametrize("target", ["cpu", "sim"])
def test_driver_keyword_on_cpu_and_sim_is_refused(target, monkeypatch):
    monkeypatch.setattr(via, "probe", no_probe)
    with pytest.raises(ConfigError, match=f"applies only to target='coral'.*{target!r}"):
        InferenceSession(shared_model(PLAIN), target=target, driver="libedgetpu")


@pytest.mark.parametrize("target", ["cpu", "sim"])
def test_the_variable_is_not_applied_to_cpu_and_sim(target, monkeypatch, caplog):
    monkeypatch.setenv(config.DRIVER, "libedgetpu")
    monkeypatch.setattr(via, "probe", no_probe)
    with caplog.at_level(logging.INFO, logger="coralrt.session"):
        sess = InferenceSession(shared_model(PLAIN), target=target)
    assert sess.target == target
    assert any("CORALRT_DRIVER=libedgetpu does not apply to target" in r.getMessage()
               for r in caplog.records)


def test_auto_never_picks_libedgetpu(monkeypatch, tmp_path, caplog):
    from tests.support.sim import dwn1_backend
    from coralrt import open_device

    monkeypatch.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(via, "probe", no_probe)
    # A stick present, nothing asked: coralrt's own driver.
    with open_device(backend=dwn1_backend()) as dev:
        sess = InferenceSession(shared_model(COMPILED), target="auto", device=dev)
        assert sess.target == "coral" and sess.device is dev
        assert not isinstance(sess._program, via.DelegateProgram)
    # No stick: the CPU, even when libedgetpu is asked for, and said so.
    with caplog.at_level(logging.INFO, logger="coralrt.session"):
        assert InferenceSession(shared_model(PLAIN), target="auto",
                                driver="libedgetpu").target == "cpu"
    assert any("driver 'libedgetpu' not used" in r.getMessage() for r in caplog.records)


# -- devices and options ---------------------------------------------------------------------

def test_delegate_options():
    assert via.delegate_options(None) == {"device": "usb"}
    assert via.delegate_options("usb") == {"device": "usb"}
    assert via.delegate_options("usb:0") == {"device": "usb:0"}
    assert via.delegate_options("USB:12") == {"device": "usb:12"}
    assert via.delegate_options(":1") == {"device": "usb:1"}
    for bad in ("1-1.2", "pci:0", "usb:x", "", "usb:-1"):
        with pytest.raises(ConfigError, match="not understood with driver='libedgetpu'"):
            via.delegate_options(bad)
    with pytest.raises(ConfigError, match="several sticks are not supported"):
        via.delegate_options(["usb:0", "usb:1"])
    with pytest.raises(ConfigError, match="instead of an open device"):
        via.delegate_options(object())


def test_a_device_list_is_refused_before_the_probe(monkeypatch):
    monkeypatch.setattr(via, "probe", no_probe)
    with pytest.raises(ConfigError, match="several sticks are not supported with "
                                          "driver='libedgetpu'"):
        InferenceSession(shared_model(COMPILED), target="coral", driver="libedgetpu",
                         device=["usb:0", "usb:1"])


def test_the_probe_is_given_the_delegate_options(monkeypatch):
    seen = {}

    def fake(library=None, **kw):
        seen.update(kw, library=library)
        return via.Probe(library or via.LIBRARY, kw["module"], "crash", signal=11)

    monkeypatch.setattr(via, "probe", fake)
    with pytest.raises(DriverUnavailableError, match="crashed"):
        InferenceSession(shared_model(COMPILED), target="coral", driver="libedgetpu",
                         device=":2")
    assert seen["options"] == {"device": "usb:2"}
    assert seen["module"] == "ai_edge_litert.interpreter" and seen["library"] == via.LIBRARY


def test_coralrt_segments_are_refused():
    from coralrt._compile.jit import jit_compile
    model = jit_compile(shared_model("mobilenet_v1_0.25_128_quant.tflite")).model
    with pytest.raises(ModelError, match="coralrt-segment"):
        via.load_program(model, backend=get_backend())


# -- stand-in shared objects (need a C compiler) -------------------------------------------------

STUBS = {
    "crash_on_load": """
        #include <signal.h>
        __attribute__((constructor)) static void boom(void) { raise(SIGSEGV); }
        void* tflite_plugin_create_delegate(void) { return 0; }
        void tflite_plugin_destroy_delegate(void* d) { (void)d; }
    """,
    "crash_on_create": """
        void* tflite_plugin_create_delegate(void) { return *(void* volatile*)0; }
        void tflite_plugin_destroy_delegate(void* d) { (void)d; }
    """,
    "refuses": """
        #include <stddef.h>
        void* tflite_plugin_create_delegate(char** k, char** v, size_t n,
                                            void (*report)(const char*)) {
            report("Failed to open the Edge TPU (stand-in)"); return NULL; }
        void tflite_plugin_destroy_delegate(void* d) { (void)d; }
    """,
    # A TfLiteDelegate whose Prepare claims nothing: the model runs on LiteRT's kernels.
    "takes_nothing": """
        #include <stdint.h>
        #include <stdlib.h>
        typedef struct D { void* data; int (*prepare)(void*, struct D*); void* copy_from;
                           void* copy_to; void* free_handle; int64_t flags; void* builder;
                           char spare[256]; } D;
        static int prepare(void* context, D* d) { (void)context; (void)d; return 0; }
        D* tflite_plugin_create_delegate(char** k, char** v, size_t n, void (*report)(const char*))
            { D* d = calloc(1, sizeof(D)); d->prepare = prepare; return d; }
        void tflite_plugin_destroy_delegate(D* d) { free(d); }
        const char* edgetpu_version(void) { return "stand-in (coralrt tests)"; }
    """,
}


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in shared objects")
    folder = tmp_path_factory.mktemp("stubs")
    out = {}
    for name, source in STUBS.items():
        (folder / f"{name}.c").write_text(source)
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / f"{name}.so"),
                        str(folder / f"{name}.c")], check=True, capture_output=True)
        out[name] = str(folder / f"{name}.so")
    return out


def test_a_library_that_crashes_when_loaded(stubs, monkeypatch):
    monkeypatch.setattr(via, "LIBRARY", stubs["crash_on_load"])
    with pytest.raises(DriverUnavailableError) as info:
        InferenceSession(shared_model(COMPILED), target="coral", driver="libedgetpu")
    assert info.value.cause == "crash" and info.value.signal == 11
    assert "SIGSEGV while loading the library" in str(info.value)


def test_a_library_whose_delegate_crashes(stubs):
    with pytest.raises(DriverUnavailableError) as info:
        via.check_ready(get_backend(), "usb:0", library=stubs["crash_on_create"])
    assert info.value.cause == "crash"
    assert "SIGSEGV while creating the delegate" in str(info.value)


def test_a_delegate_that_cannot_be_created_is_not_cached(stubs):
    lib = stubs["refuses"]
    with pytest.raises(DriverUnavailableError) as info:
        via.check_ready(get_backend(), "usb:1", library=lib)
    e = info.value
    assert e.cause == "delegate" and "Failed to open the Edge TPU (stand-in)" in str(e)
    assert "{'device': 'usb:1'}" in str(e) and "coralrt devices" in str(e)
    assert via.probe(lib) is not via.probe(lib)     # a stick may be plugged in meanwhile


def test_a_successful_probe_loads_the_model_with_the_delegate(stubs):
    """The wiring after a successful probe, with a delegate that takes no operator
    (not libedgetpu: the whole model runs on LiteRT's CPU kernels)."""
    p = via.probe(stubs["takes_nothing"])
    assert p.ok and p.version == "stand-in (coralrt tests)"
    model = load_model(shared_model(PLAIN))
    program = via.load_program(model, model.source, backend=get_backend(),
                               library=stubs["takes_nothing"], device="usb:0")
    assert isinstance(program, via.DelegateProgram)
    assert program.label == "libedgetpu usb:0 + litert: whole model"
    inputs = [np.full(d["shape"], 7, d["dtype"]) for d in program.input_details]
    expected = get_backend().load(model.source).run(inputs)
    for got, want in zip(program.run(inputs), expected):
        np.testing.assert_array_equal(got, want)
    assert program.profile()[0]["kind"] == "cpu"     # no edgetpu-custom-op in this model
    program.close()
    program.close()


def test_a_delegate_that_leaves_the_edgetpu_ops_is_a_typed_error(stubs, monkeypatch):
    monkeypatch.setattr(via, "LIBRARY", stubs["takes_nothing"])
    with pytest.raises(DriverUnavailableError, match="did not take the model's "
                                                     "edgetpu-custom-op operators"):
        InferenceSession(shared_model(COMPILED), target="coral", driver="libedgetpu")
