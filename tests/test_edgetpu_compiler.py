"""The edgetpu_compiler plugin, driven through a stand-in executable.

No real edgetpu_compiler is installed here: ``tests/support/fake_edgetpu_compiler.py``
plays its part, answering from the compiled models in ``shared/models/edgetpu``
that the real compiler produced (see its docstring).  What these tests show is
coralrt's side: finding the binary, running it with a timeout, parsing its log,
taking the DWN1 package out of its output and re-splitting what it leaves on the
CPU.  They say nothing about the real compiler's behaviour on other models.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import pytest
from conftest import MODELS_DIR, shared_model

from coralrt._formats.opnames import EDGETPU_OP
from coralrt import _config as config
from coralrt._compile.cache import CompileCache
from coralrt._compile.edgetpu_compiler import (
    CompiledSegment, EdgeTpuCompiler, find_compiler, parse_log, parse_version,
)
from coralrt._compile.jit import jit_compile
from coralrt._compile.segments import compile_model
from coralrt._compile.partition import partition, plan_from_groups
from coralrt._compile.rules import MAPPED, SECOND_SUBGRAPH, UNSPECIFIED_LIMITATION
from coralrt.plugins import _builtins as builtins
from coralrt.plugins._kind_registry import CompilerRegistry
from coralrt.errors import (
    CompileError, CompilerUnavailableError, ConfigError, CoralRTError, SegmentNotMapped,
    TargetUnavailableError,
)
from coralrt import load_model

FAKE = Path(__file__).parent / "support" / "fake_edgetpu_compiler.py"
VERSION = "16.0.384591198"
DEEPLAB = "deeplabv3_mnv2_dm05_pascal_quant"
ALL_MAPPED = ["mobilenet_v1_0.25_128_quant", "mobilenet_v2_1.0_224_quant",
              "keras_lstm_mnist_ptq", "split_concat"]


def _wrapper(folder: Path, body: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "edgetpu_compiler"
    path.write_text(body or f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv(config.EDGETPU_COMPILER, raising=False)
    monkeypatch.delenv(config.EDGETPU_COMPILER_TIMEOUT, raising=False)
    for name in ("FAKE_EDGETPU_HANG", "FAKE_EDGETPU_FAIL", "FAKE_EDGETPU_PIDFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_EDGETPU_MODELS", str(MODELS_DIR))
    return monkeypatch


@pytest.fixture
def fake(tmp_path, env) -> Path:
    return _wrapper(tmp_path / "bin")


@pytest.fixture
def compiler(fake) -> EdgeTpuCompiler:
    return EdgeTpuCompiler(fake, timeout=60)


def _compiled(name: str):
    return load_model(shared_model(f"edgetpu/{name}_edgetpu.tflite"))


def _custom(model):
    ops = [op for op in model.main.operators if op.name == EDGETPU_OP]
    assert len(ops) == 1
    return ops[0]


# -- finding the binary ------------------------------------------------------------------

def test_find_compiler_env_var_file_and_folder(fake, env):
    env.setenv("PATH", "/nonexistent")
    assert find_compiler() is None
    env.setenv(config.EDGETPU_COMPILER, str(fake))
    assert find_compiler() == fake
    env.setenv(config.EDGETPU_COMPILER, str(fake.parent))
    assert find_compiler() == fake


def test_find_compiler_env_var_wins_over_path(tmp_path, fake, env):
    other = _wrapper(tmp_path / "other")
    env.setenv("PATH", str(other.parent))
    assert find_compiler() == other
    env.setenv(config.EDGETPU_COMPILER, str(fake))
    assert find_compiler() == fake


def test_find_compiler_bad_env_var_is_an_error(tmp_path, env):
    env.setenv(config.EDGETPU_COMPILER, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=config.EDGETPU_COMPILER):
        find_compiler()


def test_timeout_from_env(env):
    assert EdgeTpuCompiler("/x").timeout == 180
    env.setenv(config.EDGETPU_COMPILER_TIMEOUT, "12.5")
    assert EdgeTpuCompiler("/x").timeout == 12.5
    env.setenv(config.EDGETPU_COMPILER_TIMEOUT, "soon")
    with pytest.raises(ConfigError):
        EdgeTpuCompiler("/x")


def test_missing_compiler_raises_unavailable(env):
    env.setenv("PATH", "/nonexistent")
    with pytest.raises(CompilerUnavailableError) as info:
        _ = EdgeTpuCompiler().path
    text = str(info.value)
    assert isinstance(info.value, TargetUnavailableError)
    for needle in ("apt-get install edgetpu-compiler", "x86-64", "Raspberry Pi", "ARM",
                   "coralrt compile", "_edgetpu.tflite", config.EDGETPU_COMPILER,
                   "coralrt serve-compiler", config.COMPILER_URL, "box64", "qemu-user",
                   "coralrt cache import"):
        assert needle in text, needle


# -- version -------------------------------------------------------------------------------

def test_version_parsing(compiler):
    assert parse_version("Edge TPU Compiler version 16.0.384591198\n") == VERSION
    assert parse_version("Edge TPU Compiler version 2.1.302470888") == "2.1.302470888"
    assert parse_version("edgetpu_compiler: command not found") is None
    assert compiler.version == VERSION
    assert compiler.id == "edgetpu_compiler" and compiler.runs_on == ("coral",)
    assert compiler.op_name == "edgetpu-custom-op"


def test_version_of_a_broken_binary_is_a_compile_error(tmp_path, env):
    broken = _wrapper(tmp_path / "broken", "#!/bin/sh\necho 'segmentation fault'\nexit 139\n")
    with pytest.raises(CompileError, match="did not print") as info:
        _ = EdgeTpuCompiler(broken).version
    assert "segmentation fault" in info.value.log_tail


# -- parse_log -----------------------------------------------------------------------------

V16 = """Edge TPU Compiler version 16.0.384591198
Started a compilation timeout timer of 180 seconds.

Model compiled successfully in 1524 ms.

Input model: X.tflite
Input size: 4.24MiB
Output model: X_edgetpu.tflite
Output size: 5.57MiB
On-chip memory used for caching model parameters: 4.21MiB
On-chip memory remaining for caching model parameters: 3.29MiB
Off-chip memory used for streaming uncached model parameters: 0.00B
Number of Edge TPU subgraphs: 1
Total number of operations: 267
Operation log: X_edgetpu.log

[Model successfully compiled but not all operations are supported by the Edge TPU. A \
percentage of the model will instead run on the CPU, which is slower. If possible, consider \
updating your model to use only operations supported by the Edge TPU. For details, visit \
g.co/coral/model-reqs.]
Number of operations that will run on Edge TPU: 264
Number of operations that will run on CPU: 3

Operator                       Count      Status

CONV_2D                        200        Mapped to Edge TPU
ADD                            64         Mapped to Edge TPU
DEQUANTIZE                     1          Operation is working on an unsupported data type
RESIZE_BILINEAR                1          Operation version not supported
ARG_MAX                        1          More than one subgraph is not supported

Compilation child process completed within timeout period.
Compilation succeeded!
"""

V15 = """Edge TPU Compiler version 15.0.340273435

Model compiled successfully in 387 ms.

Input model: mobilenet_v1_1.0_224_quant.tflite
Input size: 4.08MiB
Output model: mobilenet_v1_1.0_224_quant_edgetpu.tflite
Output size: 4.38MiB
On-chip memory used for caching model parameters: 4.21MiB
Off-chip memory used for streaming uncached model parameters: 512.00KiB
Total number of operations: 31
Operation log: mobilenet_v1_1.0_224_quant_edgetpu.log
See the operation log file for individual operation details.
"""

LOG_FILE = """Edge TPU Compiler version 14.1.317412892
Input: ssd.tflite
Output: ssd_edgetpu.tflite

Operator                       Count      Status

LOGISTIC                       1          Mapped to Edge TPU
CUSTOM                         1          Operation is working on an unsupported data type
CONCATENATION                  2          Mapped to Edge TPU
RESHAPE                        13         Mapped to Edge TPU
"""


def test_parse_log_v16_with_subgraphs_and_table():
    info = parse_log(V16)
    assert info["version"] == VERSION and info["succeeded"] and info["compile_ms"] == 1524
    assert info["input_model"] == "X.tflite" and info["output_model"] == "X_edgetpu.tflite"
    assert info["input_size"] == round(4.24 * 2**20)
    assert info["on_chip_bytes"] == round(4.21 * 2**20)
    assert info["on_chip_remaining_bytes"] == round(3.29 * 2**20)
    assert info["off_chip_bytes"] == 0
    assert (info["subgraphs"], info["total_ops"], info["tpu_ops"], info["cpu_ops"]) == \
        (1, 267, 264, 3)
    assert info["all_mapped"] is False
    assert info["log_file"] == "X_edgetpu.log"
    assert info["operators"][0] == {"operator": "CONV_2D", "count": 200, "status": MAPPED}
    assert [r["status"] for r in info["operators"][2:]] == [
        "Operation is working on an unsupported data type", "Operation version not supported",
        SECOND_SUBGRAPH]
    assert info["errors"] == []


def test_parse_log_v15_without_subgraph_lines_all_mapped():
    info = parse_log(V15)
    assert info["version"] == "15.0.340273435"
    assert info["subgraphs"] is None and info["on_chip_remaining_bytes"] is None
    assert info["off_chip_bytes"] == 512 * 1024
    # No "Number of operations" lines: everything mapped.
    assert (info["total_ops"], info["tpu_ops"], info["cpu_ops"]) == (31, 31, 0)
    assert info["all_mapped"] is True and info["operators"] == []


def test_parse_log_file_layout_counts_from_table():
    info = parse_log(LOG_FILE)
    assert info["version"] == "14.1.317412892"
    assert info["input_model"] == "ssd.tflite" and info["output_model"] == "ssd_edgetpu.tflite"
    assert len(info["operators"]) == 4
    assert (info["total_ops"], info["tpu_ops"], info["cpu_ops"]) == (17, 16, 1)
    assert info["all_mapped"] is False


def test_parse_log_failure():
    info = parse_log("Edge TPU Compiler version 16.0.384591198\nERROR: Didn't find op for "
                     "builtin opcode 'FOO'\nInternal compiler error. Aborting!\n")
    assert not info["succeeded"] and info["total_ops"] is None and info["all_mapped"] is None
    assert len(info["errors"]) == 2


# -- compile_segment -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL_MAPPED)
def test_compile_segment_returns_the_compilers_package(compiler, name):
    plain = load_model(shared_model(f"{name}.tflite"))
    want = _custom(_compiled(name))
    got = compiler.compile_segment(plain)
    assert isinstance(got, CompiledSegment)
    assert got == bytes(want.custom_options)
    sg = _compiled(name).main
    assert list(got.input_names) == [sg.tensors[t].name for t in want.inputs]
    assert list(got.output_names) == [sg.tensors[t].name for t in want.outputs]
    assert got.report["version"] == VERSION and got.report["all_mapped"]
    assert pickle.loads(pickle.dumps(got)).output_names == got.output_names


def test_compile_segment_of_a_piece(compiler):
    # deeplab's first 64 operators are what the real compiler mapped.
    model = load_model(shared_model(f"{DEEPLAB}.tflite"))
    got = compiler.compile_segment(model.extract(range(64)))
    assert got == bytes(_custom(_compiled(DEEPLAB)).custom_options)


def test_deeplab_whole_model_is_not_mapped(compiler):
    model = load_model(shared_model(f"{DEEPLAB}.tflite"))
    with pytest.raises(SegmentNotMapped) as info:
        compiler.compile_segment(model)
    e = info.value
    assert isinstance(e, CoralRTError)
    assert e.cpu_ops == list(range(64, 72)) and e.total_ops == 72
    assert [model.main.operators[k].name for k in e.cpu_ops] == [
        "RESIZE_BILINEAR", "QUANTIZE", "CONCATENATION", "CONV_2D", "CONV_2D",
        "RESIZE_BILINEAR", "RESIZE_BILINEAR", "ARG_MAX"]
    assert e.reasons[64] == UNSPECIFIED_LIMITATION
    assert all(e.reasons[k] == SECOND_SUBGRAPH for k in range(65, 72))
    again = pickle.loads(pickle.dumps(e))
    assert again.cpu_ops == e.cpu_ops and again.reasons == e.reasons


def test_unknown_model_maps_nothing(compiler):
    model = load_model(shared_model("add_quantized_uint8.tflite"))
    with pytest.raises(SegmentNotMapped) as info:
        compiler.compile_segment(model)
    assert info.value.cpu_ops == [0, 1]
    assert set(info.value.reasons.values()) == {UNSPECIFIED_LIMITATION}


def test_compiler_failure_is_a_compile_error(compiler, env):
    env.setenv("FAKE_EDGETPU_FAIL", "1")
    with pytest.raises(CompileError, match="exit status 1") as info:
        compiler.compile_segment(load_model(shared_model("split_concat.tflite")))
    assert info.value.returncode == 1
    assert "Internal compiler error" in info.value.log_tail
    assert "Internal compiler error" in str(info.value)


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state  # killed, waiting to be reaped


def test_timeout_stops_the_compiler_and_its_child(fake, env, tmp_path):
    pid_file = tmp_path / "pids"
    env.setenv("FAKE_EDGETPU_HANG", "1")
    env.setenv("FAKE_EDGETPU_PIDFILE", str(pid_file))
    slow = EdgeTpuCompiler(fake, timeout=2.0)
    t0 = time.monotonic()
    with pytest.raises(CompileError, match="did not finish within 2 s") as info:
        slow.compile_segment(load_model(shared_model("split_concat.tflite")))
    assert time.monotonic() - t0 < 5.0
    assert info.value.timeout == 2.0 and info.value.returncode is None
    assert "Started a compilation timeout timer" in info.value.log_tail
    deadline = time.monotonic() + 3.0
    pids = [int(p) for p in pid_file.read_text().split()]
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids), pids


# -- compile_model with the compiler ---------------------------------------------------------

def test_compile_model_moves_unmapped_operators_to_the_cpu(compiler):
    model = load_model(shared_model(f"{DEEPLAB}.tflite"))
    n = len(model.main.operators)
    whole = plan_from_groups(model, partition(model, "compat"), [list(range(n))])
    result = compile_model(model, compiler=compiler, plan=whole)
    plan = result.plan
    assert [s.ops for s in plan.segments] == [list(range(64))]
    assert [o.reason for o in plan.ops[64:]] == [UNSPECIFIED_LIMITATION] + [SECOND_SUBGRAPH] * 7
    assert plan.summary["tpu_ops"] == 64 and plan.summary["cpu_ops"] == 8
    assert plan.segments[0].on_chip_bytes == result.segments[0].report["on_chip_bytes"]
    compiled = load_model(result.to_bytes())
    want = _compiled(DEEPLAB)
    assert [op.name for op in compiled.main.operators] == \
        [op.name for op in want.main.operators]
    assert bytes(_custom(compiled).custom_options) == bytes(_custom(want).custom_options)
    assert result.compiler == f"edgetpu_compiler {VERSION}"


class _Stub:
    """A compiler that leaves chosen operators (by output tensor name) on the CPU."""

    id, version, runs_on, op_name = "stub", "1", ("usb",), "stub-op"

    def __init__(self, refuse=(), multi=False):
        self.refuse, self.multi, self.calls = set(refuse), multi, []

    def compile_segment(self, piece):
        sg = piece.main
        names = [sg.tensors[op.outputs[0]].name for op in sg.operators]
        self.calls.append(names)
        bad = [k for k, n in enumerate(names) if n in self.refuse]
        if bad:
            raise SegmentNotMapped(bad, {k: "stub says no" for k in bad})
        if self.multi and len(names) > 4:
            raise SegmentNotMapped([])
        return b"program"


def test_compile_model_resplits_around_cpu_operators():
    model = load_model(shared_model("mobilenet_v1_0.25_128_quant.tflite"))
    sg = model.main
    out = sg.tensors[sg.operators[10].outputs[0]].name
    stub = _Stub(refuse={out})
    result = compile_model(model, compiler=stub)
    assert [s.ops for s in result.plan.segments] == [list(range(10)), list(range(11, 31))]
    assert result.plan.ops[10].unit == "cpu" and result.plan.ops[10].reason == "stub says no"
    assert len(stub.calls) == 3
    compiled = load_model(result.to_bytes())
    assert [op.name for op in compiled.main.operators] == \
        ["stub-op", sg.operators[10].name, "stub-op"]


def test_compile_model_splits_a_segment_mapped_as_several_programs():
    model = load_model(shared_model("mobilenet_v1_0.25_128_quant.tflite"))
    result = compile_model(model, compiler=_Stub(multi=True))
    assert all(len(s.ops) <= 4 for s in result.plan.segments)
    assert result.plan.summary["tpu_ops"] == 31


def test_compile_model_resplitting_is_bounded():
    model = load_model(shared_model("mobilenet_v1_0.25_128_quant.tflite"))
    sg = model.main
    stub = _Stub(refuse={sg.tensors[op.outputs[0]].name for op in sg.operators[::2]})
    result = compile_model(model, compiler=stub, max_compiles=3)
    # One run for the planned segment, then three of the 15 pieces left between
    # the refused operators; the other 12 pieces stay on the CPU uncompiled.
    assert len(stub.calls) == 4
    assert [s.ops for s in result.plan.segments] == [[1], [3], [5]]
    assert result.plan.ops[0].reason == "stub says no"
    assert "budget" in result.plan.ops[7].reason and result.plan.ops[7].unit == "cpu"
    assert result.plan.summary["tpu_ops"] == 3


# -- registration and the just-in-time path -----------------------------------------------------

def test_builtins_register_only_an_installed_compiler(fake, env):
    env.setenv("PATH", "/nonexistent")
    registry = CompilerRegistry()
    builtins.coralrt_register_compilers(registry)
    assert "edgetpu_compiler" not in registry.compilers
    assert registry.for_device("usb") is None
    env.setenv("PATH", str(fake.parent))
    registry = CompilerRegistry()
    builtins.coralrt_register_compilers(registry)
    found = registry.for_device("usb")
    assert isinstance(found, EdgeTpuCompiler) and found.path == fake
    assert registry.for_device("sim").id != "edgetpu_compiler"


def test_builtins_skip_a_compiler_that_does_not_answer(tmp_path, env):
    env.setenv(config.EDGETPU_COMPILER, str(_wrapper(tmp_path / "b", "#!/bin/sh\nexit 3\n")))
    registry = CompilerRegistry()
    builtins.coralrt_register_compilers(registry)
    assert registry.for_device("usb") is None


def test_jit_compile_with_edgetpu_compiler(compiler, tmp_path):
    cache = CompileCache(tmp_path / "cache", enabled=True)
    path = shared_model("split_concat.tflite")
    first = jit_compile(path, compiler=compiler, cache=cache)
    second = jit_compile(path, compiler=compiler, cache=cache)
    assert not first.compile_info["cache_hit"] and second.compile_info["cache_hit"]
    assert first.compile_info["compiler"] == f"edgetpu_compiler {VERSION}"
    for result in (first, second):
        model = result.model
        assert model.is_edgetpu_compiled
        op = _custom(model)
        want = _compiled("split_concat")
        wop = _custom(want)
        assert bytes(op.custom_options) == bytes(wop.custom_options)
        assert [model.main.tensors[t].name for t in op.outputs] == \
            [want.main.tensors[t].name for t in wop.outputs]


def test_jit_compile_deeplab_keeps_the_tail_on_the_cpu(compiler):
    result = jit_compile(shared_model(f"{DEEPLAB}.tflite"), compiler=compiler,
                         cache=CompileCache(enabled=False))
    names = [op.name for op in result.model.main.operators]
    assert names[0] == EDGETPU_OP and names.count(EDGETPU_OP) == 1
    assert result.compile_info["summary"]["tpu_ops"] == 64
    assert load_model(result.model.to_bytes()).is_edgetpu_compiled


def test_stand_in_is_documented_and_executable():
    text = FAKE.read_text()
    assert "STAND-IN" in text.split("\n", 3)[1]
    assert os.access(FAKE, os.X_OK)


@pytest.fixture
def fresh_plugins():
    from coralrt.plugins import _host as plugins
    plugins.reset()
    yield
    plugins.reset()  # the process-wide host must not keep this test's compiler


def test_session_coral_compiles_with_edgetpu_compiler(fake, env, fresh_plugins):
    # The whole path on the simulated stick: the plain model is compiled by the
    # stand-in through the registered plugin and the custom op goes to the stick.
    # The simulated Edge TPU cannot execute edgetpu_compiler programs and says so
    # when the session is created; with the test-only switch of tests/support/sim.py
    # the driver's DWN1 path runs (framing, hints; the stick answers placeholder bytes).
    import numpy as np
    from support.sim import accept_dwn1

    from coralrt import InferenceSession
    from coralrt.errors import ProgramRefusedError
    from coralrt.testing import SimulatedBackend
    from coralrt import open_device

    env.setenv("PATH", str(fake.parent))
    backend = SimulatedBackend(firmware_loaded=True, time_scale=0.0, lock_scope="process")
    stick = open_device(None, backend)
    try:
        with pytest.raises(ProgramRefusedError) as info:
            InferenceSession(shared_model(f"{DEEPLAB}.tflite"), target="coral", device=stick)
        text = str(info.value)
        assert "cannot load an edgetpu_compiler program" in text
        assert "cannot execute edgetpu_compiler programs" in text
        assert "Google's closed Edge TPU instruction set" in text
        assert "target='sim'" in text and "Coral USB Accelerator attached" in text

        accept_dwn1(backend)
        session = InferenceSession(shared_model(f"{DEEPLAB}.tflite"), target="coral",
                                   device=stick)
        assert session.compile_info["compiler"] == f"edgetpu_compiler {VERSION}"
        names = [op.name for op in session.model.main.operators]
        assert names[0] == EDGETPU_OP and names.count(EDGETPU_OP) == 1 and len(names) == 9
        (inp,) = session.get_inputs()
        out = session.run({inp.name: np.zeros(inp.shape, inp.dtype)})
        assert out["ArgMax"].shape == (1, 513, 513)
    finally:
        stick.close()


def test_compile_command_with_edgetpu_compiler(tmp_path, env, fake, capsys):
    from coralrt._cli.main import main
    from coralrt.plugins import _host as plugins

    monkeypatch = env
    monkeypatch.setenv("CORALRT_EDGETPU_COMPILER", str(fake))
    out = tmp_path / "v1_edgetpu.tflite"
    assert main(["compile", str(shared_model("mobilenet_v1_0.25_128_quant.tflite")), "-o",
                 str(out), "--compiler", "edgetpu_compiler"]) == 0
    assert "edgetpu_compiler 16.0.384591198" in capsys.readouterr().out
    assert [op.name for op in load_model(out).main.operators] == ["edgetpu-custom-op"]
    monkeypatch.setenv("CORALRT_EDGETPU_COMPILER", str(tmp_path / "missing"))
    plugins.reset()
    assert main(["compile", str(shared_model("mobilenet_v1_0.25_128_quant.tflite")), "-o",
                 str(tmp_path / "x.tflite"), "--compiler", "edgetpu_compiler"]) == 1
    plugins.reset()


def test_target_coral_parses_a_plain_model_once(fake, env, fresh_plugins, monkeypatch,
                                               tmp_path):
    # The session reads the source to see whether it is compiled already; the
    # JIT compiles that same parse on a miss, and keeps the model it builds.
    from support.sim import dwn1_backend

    from coralrt import InferenceSession
    from coralrt._compile.cache import CompileCache
    from coralrt._model import reader
    from coralrt import open_device

    source = shared_model(f"{DEEPLAB}.tflite").read_bytes()
    parsed = []    # parses of the source (edgetpu_compiler's own outputs are parsed too)
    real = reader.validate
    monkeypatch.setattr(reader, "validate", lambda m: (
        parsed.append(m) if m.source is not None and bytes(m.source) == source else None,
        real(m))[1])
    env.setenv("PATH", str(fake.parent))
    cache = CompileCache(tmp_path / "cache")
    with open_device(None, dwn1_backend(lock_scope="process")) as stick:
        session = InferenceSession(shared_model(f"{DEEPLAB}.tflite"), target="coral",
                                   device=stick, cache=cache)
        assert session.compile_info["cache_hit"] is False
        assert len(parsed) == 1
        parsed.clear()
        session = InferenceSession(shared_model(f"{DEEPLAB}.tflite"), target="coral",
                                   device=stick, cache=cache)
        # A hit: the source once, to see that it is a plain model.
        assert session.compile_info["cache_hit"] is True and len(parsed) == 1
