"""edgetpu_compiler under an x86-64 emulator on ARM, and doctor's "compile paths".

No emulator runs on this machine (x86-64) and no real edgetpu_compiler is
installed.  What is tested is coralrt's side: reading ELF headers (real binaries
of this machine and fake headers), naming the host, reading a fake
``binfmt_misc`` folder, choosing the emulator, and the command line
:class:`EdgeTpuCompiler` really runs on a pretended aarch64 host, where fake
``box64`` and ``qemu-x86_64`` scripts record their arguments and then run the
test stand-in compiler themselves.  Whether box64 or qemu run the real
compiler correctly is not shown here.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import sys
from pathlib import Path

import pytest
import test_edgetpu_compiler as stand_in
from conftest import shared_model
from test_edgetpu_compiler import DEEPLAB, VERSION, _compiled, _custom, _wrapper

from coralrt import _config as config
from coralrt._cli import doctor_cmd as D
from coralrt._cli import doctor_compile
from coralrt._cli.main import main
from coralrt._compile import emulation
from coralrt._compile.edgetpu_compiler import EdgeTpuCompiler
from coralrt.errors import COMPILER_HELP, CompileError, CompilerUnavailableError, ConfigError
from coralrt import load_model
from coralrt.plugins import _builtins as builtins
from coralrt.plugins._kind_registry import CompilerRegistry

# The stand-in compiler's fixtures: env (no compiler settings) and fake (its wrapper script).
env = stand_in.env
fake = stand_in.fake

# binfmt_misc entries as qemu-user-static / systemd-binfmt register them.
QEMU_X86_64 = ("7f454c4602010100000000000000000002003e00",
               "fffffffffffefefcfffffffffffffffffeffffff")
QEMU_AARCH64 = ("7f454c460201010000000000000000000200b700",
                "ffffffffffffff00fffffffffffffffffeffffff")


def header(machine: int, elf_class: int = 2, data: int = 1, e_type: int = 2) -> bytes:
    """A 64-byte ELF header with the given e_machine, class and byte order."""
    order = "little" if data == 1 else "big"
    head = b"\x7fELF" + bytes([elf_class, data, 1, 0]) + bytes(8)
    head += e_type.to_bytes(2, order) + machine.to_bytes(2, order) + (1).to_bytes(4, order)
    return head + bytes(64 - len(head))


def write(path: Path, data: bytes | str, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    path.chmod(mode)
    return path


def recorder(folder: Path, name: str, log: Path, drop_sysroot: bool = False) -> Path:
    """A fake emulator: records its argv (one per line, $0 first), then runs the rest."""
    skip = 'if [ "$1" = "-L" ]; then shift 2; fi\n' if drop_sysroot else ""
    return write(folder / name, f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" > "{log}"\n{skip}'
                                f'exec "$@"\n')


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    """No emulator setting, and a binfmt_misc folder of our own (empty)."""
    for name in (config.X86_EMULATOR, config.X86_SYSROOT, "QEMU_LD_PREFIX",
                 doctor_compile.COMPILER_URL):
        monkeypatch.delenv(name, raising=False)
    empty = tmp_path / "binfmt_empty"
    empty.mkdir()
    monkeypatch.setattr(emulation, "BINFMT_DIR", empty)


def binfmt(folder: Path, entries: dict[str, str], status: str = "enabled") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "status").write_text(status + "\n")
    (folder / "register").write_text("")
    for name, text in entries.items():
        (folder / name).write_text(text)
    return folder


def entry(magic_mask, interpreter: str, enabled: str = "enabled", flags: str = "POCF") -> str:
    magic, mask = magic_mask
    return (f"{enabled}\ninterpreter {interpreter}\nflags: {flags}\noffset 0\n"
            f"magic {magic}\nmask {mask}\n")


def x86_elf(tmp_path: Path) -> Path:
    """A file whose header is an x86-64 ELF executable's (not runnable)."""
    return write(tmp_path / "x86" / "edgetpu_compiler", header(62))


# -- ELF headers ------------------------------------------------------------------------------

def test_real_binaries_of_this_machine():
    info = emulation.inspect_binary(sys.executable)
    assert info.kind == "elf" and info.path == Path(sys.executable).resolve()
    assert info.machine == emulation.host_machine()
    if platform.machine() == "x86_64":
        assert info.machine == "x86_64"
    sh = emulation.inspect_binary(shutil.which("sh"))  # ELF (or a link to one)
    assert sh.kind == "elf" and sh.machine == info.machine


def test_script_random_file_and_missing_file(tmp_path):
    script = write(tmp_path / "wrap", "#!/bin/sh -e\nexec true\n")
    info = emulation.inspect_binary(script)
    assert (info.kind, info.machine, info.interpreter) == ("script", None, "/bin/sh -e")
    assert "script" in info.describe()
    noise = write(tmp_path / "noise", os.urandom(200).replace(b"\x7f", b"x"))
    assert emulation.inspect_binary(noise).kind == "other"
    assert emulation.inspect_binary(tmp_path / "absent").kind == "other"
    assert emulation.inspect_binary(write(tmp_path / "empty", b"")).kind == "other"


def test_symlinks_are_resolved(tmp_path):
    target = write(tmp_path / "lib" / "edgetpu_compiler_bin", header(62))
    link = tmp_path / "bin" / "edgetpu_compiler"
    link.parent.mkdir()
    link.symlink_to(target)
    info = emulation.inspect_binary(link)
    assert info.path == target.resolve() and info.machine == "x86_64"


@pytest.mark.parametrize("machine, elf_class, data, name", [
    (62, 2, 1, "x86_64"), (183, 2, 1, "aarch64"), (40, 1, 1, "arm"), (3, 1, 1, "x86"),
    (243, 2, 1, "riscv64"), (243, 1, 1, "riscv32"), (21, 2, 2, "ppc64"),
    (21, 2, 1, "ppc64le"), (22, 2, 2, "s390x"), (8, 1, 2, "mips"), (9999, 2, 1,
                                                                    "elf-machine-9999"),
])
def test_fake_headers(machine, elf_class, data, name):
    assert emulation.elf_machine(header(machine, elf_class, data)) == name


def test_not_elf_headers():
    assert emulation.elf_machine(b"") is None
    assert emulation.elf_machine(b"\x7fELF") is None                   # too short
    assert emulation.elf_machine(b"#!/bin/sh\n" + bytes(30)) is None
    assert emulation.elf_machine(header(62, elf_class=3)) is None      # bad class
    assert emulation.elf_machine(header(62, data=0)) is None           # bad byte order


@pytest.mark.parametrize("given, name", [
    ("x86_64", "x86_64"), ("AMD64", "x86_64"), ("amd64", "x86_64"), ("aarch64", "aarch64"),
    ("arm64", "aarch64"), ("ARM64", "aarch64"), ("armv7l", "arm"), ("armv6l", "arm"),
    ("i686", "x86"), ("riscv64", "riscv64"),
])
def test_host_normalisation(given, name):
    assert emulation.host_machine(given) == name


def test_host_defaults_to_platform_machine(monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert emulation.host_machine() == "aarch64"


# -- binfmt_misc ------------------------------------------------------------------------------

def test_binfmt_enabled_matching_entry(tmp_path):
    qemu = write(tmp_path / "usr" / "bin" / "qemu-x86_64-static", "")
    root = binfmt(tmp_path / "binfmt", {
        "qemu-aarch64": entry(QEMU_AARCH64, "/usr/bin/qemu-aarch64-static"),
        "qemu-x86_64": entry(QEMU_X86_64, str(qemu), flags="OC"),
        "python3.11": "enabled\ninterpreter /usr/bin/python3.11\nflags: \nextension .py\n",
    })
    assert emulation.binfmt_interpreter(root=root) == str(qemu)
    # Both an ET_EXEC header and a PIE (ET_DYN) one match qemu's mask.
    assert emulation.binfmt_interpreter(header(62, e_type=3), root) == str(qemu)
    assert emulation.binfmt_interpreter(header(183), root) == "/usr/bin/qemu-aarch64-static"
    assert emulation.binfmt_interpreter(header(40, elf_class=1), root) is None


def test_binfmt_disabled_or_not_matching(tmp_path):
    on = entry(QEMU_X86_64, "/usr/bin/qemu-x86_64-static")
    off = entry(QEMU_X86_64, "/usr/bin/qemu-x86_64-static", enabled="disabled")
    assert emulation.binfmt_interpreter(root=binfmt(tmp_path / "a", {"x": off})) is None
    assert emulation.binfmt_interpreter(
        root=binfmt(tmp_path / "b", {"a": entry(QEMU_AARCH64, "/q")})) is None
    assert emulation.binfmt_interpreter(
        root=binfmt(tmp_path / "c", {"x": on}, status="disabled")) is None
    assert emulation.binfmt_interpreter(root=binfmt(tmp_path / "d", {"x": on})) == \
        "/usr/bin/qemu-x86_64-static"  # F flag: the kernel opened it already
    no_f = entry(QEMU_X86_64, str(tmp_path / "gone"), flags="OC")
    assert emulation.binfmt_interpreter(root=binfmt(tmp_path / "e", {"x": no_f})) is None
    assert emulation.binfmt_interpreter(root=tmp_path / "not-mounted") is None


# -- choosing the emulator --------------------------------------------------------------------

@pytest.fixture
def emulators(tmp_path, monkeypatch):
    """Fake box64, qemu-x86_64 and qemu-x86_64-static, each in its own folder."""
    dirs = {}
    for name in emulation.EMULATORS:
        write(tmp_path / name / name, "#!/bin/sh\nexit 0\n")
        dirs[name] = tmp_path / name
    return dirs


def _path(monkeypatch, *folders):
    monkeypatch.setenv("PATH", os.pathsep.join(str(f) for f in (*folders, "/nonexistent")))


def test_emulator_order(emulators, monkeypatch):
    box, qemu, static = (emulators[n] for n in emulation.EMULATORS)
    _path(monkeypatch, static, qemu, box)
    assert emulation.find_emulator() == box / "box64"
    _path(monkeypatch, static, qemu)
    assert emulation.find_emulator() == qemu / "qemu-x86_64"
    _path(monkeypatch, static)
    assert emulation.find_emulator() == static / "qemu-x86_64-static"
    _path(monkeypatch)
    assert emulation.find_emulator() is None


def test_emulator_setting(emulators, monkeypatch):
    box, qemu, static = (emulators[n] for n in emulation.EMULATORS)
    _path(monkeypatch, box, qemu)
    monkeypatch.setenv(config.X86_EMULATOR, "qemu-x86_64")
    assert emulation.find_emulator() == qemu / "qemu-x86_64"
    monkeypatch.setenv(config.X86_EMULATOR, str(static / "qemu-x86_64-static"))
    assert emulation.find_emulator() == static / "qemu-x86_64-static"
    for word in ("none", "NONE"):
        monkeypatch.setenv(config.X86_EMULATOR, word)
        assert emulation.find_emulator() is None
    monkeypatch.setenv(config.X86_EMULATOR, "fex-emu")
    with pytest.raises(ConfigError, match=config.X86_EMULATOR):
        emulation.find_emulator()


# -- the command prefix -----------------------------------------------------------------------

def test_prefix_native_and_other_machines(tmp_path):
    assert emulation.command_prefix(sys.executable) == []
    x86 = x86_elf(tmp_path)
    assert emulation.command_prefix(x86, host="x86_64") == []
    arm64 = write(tmp_path / "a" / "edgetpu_compiler", header(183))  # compiler 2.1 had one
    assert emulation.command_prefix(arm64, host="aarch64") == []
    assert emulation.compile_paths(arm64, host="aarch64")[0]["path"] == "native"
    arm32 = write(tmp_path / "b" / "edgetpu_compiler", header(40, elf_class=1))
    assert emulation.compile_paths(arm32, host="aarch64")[0]["path"] == "native"
    # Another machine's binary is not emulated: run as it is (the kernel decides), but
    # doctor says it will not run.
    assert emulation.command_prefix(arm64, host="x86_64") == []
    other = emulation.compile_paths(arm64, host="x86_64")[0]
    assert other["path"] == "none" and "will not run" in other["detail"] and other["how"]


def test_prefix_box64_on_aarch64(tmp_path, emulators, monkeypatch):
    _path(monkeypatch, emulators["box64"], emulators["qemu-x86_64"])
    x86 = x86_elf(tmp_path)
    assert emulation.command_prefix(x86, host="aarch64") == [str(emulators["box64"] / "box64")]
    assert emulation.command_prefix(x86, host="x86_64") == []


def test_prefix_qemu_with_a_sysroot(tmp_path, emulators, monkeypatch):
    _path(monkeypatch, emulators["qemu-x86_64"])
    qemu = str(emulators["qemu-x86_64"] / "qemu-x86_64")
    x86 = x86_elf(tmp_path)
    assert emulation.command_prefix(x86, host="aarch64") == [qemu]
    # QEMU_LD_PREFIX is read by qemu itself from the environment the compiler inherits.
    monkeypatch.setenv("QEMU_LD_PREFIX", str(tmp_path))
    assert emulation.command_prefix(x86, host="aarch64") == [qemu]
    paths = emulation.compile_paths(x86, host="aarch64")
    assert "QEMU_LD_PREFIX" in paths[0]["detail"]
    sysroot = tmp_path / "sysroot-amd64"
    sysroot.mkdir()
    monkeypatch.setenv(config.X86_SYSROOT, str(sysroot))
    assert emulation.command_prefix(x86, host="aarch64") == [qemu, "-L", str(sysroot)]
    monkeypatch.setenv(config.X86_SYSROOT, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=config.X86_SYSROOT):
        emulation.command_prefix(x86, host="aarch64")


def test_prefix_qemu_with_the_packages_own_loader(tmp_path, emulators, monkeypatch):
    # Coral's .deb: usr/bin/edgetpu_compiler_bin/{edgetpu_compiler, ld-linux-x86-64.so.2, libs}
    folder = tmp_path / "usr" / "bin" / "edgetpu_compiler_bin"
    binary = write(folder / "edgetpu_compiler", header(62))
    loader = write(folder / "ld-linux-x86-64.so.2", header(62, e_type=3))
    qemu = str(emulators["qemu-x86_64"] / "qemu-x86_64")
    _path(monkeypatch, emulators["qemu-x86_64"])
    assert emulation.command_prefix(binary, host="aarch64") == \
        [qemu, str(loader), "--library-path", str(folder)]
    assert "ld-linux-x86-64.so.2" in emulation.compile_paths(binary, host="aarch64")[0]["detail"]
    monkeypatch.setenv(config.X86_SYSROOT, str(tmp_path))  # an explicit sysroot wins
    assert emulation.command_prefix(binary, host="aarch64") == [qemu, "-L", str(tmp_path)]
    monkeypatch.delenv(config.X86_SYSROOT)
    monkeypatch.setenv("QEMU_LD_PREFIX", str(tmp_path))
    assert emulation.command_prefix(binary, host="aarch64") == [qemu]
    _path(monkeypatch, emulators["box64"])
    assert emulation.command_prefix(binary, host="aarch64") == \
        [str(emulators["box64"] / "box64")]


def test_prefix_box64_ignores_the_sysroot(tmp_path, emulators, monkeypatch):
    _path(monkeypatch, emulators["box64"])
    monkeypatch.setenv(config.X86_SYSROOT, str(tmp_path))
    assert emulation.command_prefix(x86_elf(tmp_path), host="aarch64") == \
        [str(emulators["box64"] / "box64")]


def test_prefix_binfmt(tmp_path, emulators, monkeypatch):
    root = binfmt(tmp_path / "binfmt", {"qemu-x86_64": entry(QEMU_X86_64, "/usr/bin/q")})
    x86 = x86_elf(tmp_path)
    _path(monkeypatch, emulators["box64"])
    assert emulation.command_prefix(x86, host="aarch64", binfmt_root=root) == []
    paths = emulation.compile_paths(x86, host="aarch64", binfmt_root=root)
    assert paths[0]["path"] == "emulated" and paths[0]["via"] == "binfmt_misc"
    # An emulator named explicitly wins over binfmt_misc.
    monkeypatch.setenv(config.X86_EMULATOR, "box64")
    assert emulation.command_prefix(x86, host="aarch64", binfmt_root=root) == \
        [str(emulators["box64"] / "box64")]
    # none forbids coralrt's emulator; the kernel still runs it through binfmt_misc.
    monkeypatch.setenv(config.X86_EMULATOR, "none")
    assert emulation.command_prefix(x86, host="aarch64", binfmt_root=root) == []
    monkeypatch.setattr(emulation, "BINFMT_DIR", root)  # the default folder
    assert emulation.command_prefix(x86, host="aarch64") == []


def test_no_emulator_is_an_error_with_the_install_hint(tmp_path, monkeypatch, emulators):
    _path(monkeypatch)
    x86 = x86_elf(tmp_path)
    with pytest.raises(CompilerUnavailableError) as info:
        emulation.command_prefix(x86, host="aarch64")
    text = str(info.value)
    for needle in ("x86_64 ELF", "aarch64", "sudo apt install box64", "qemu-user", "sysroot",
                   "CORALRT_X86_SYSROOT", "CORALRT_COMPILER_URL", "coralrt serve-compiler"):
        assert needle in text, needle
    _path(monkeypatch, emulators["box64"])
    monkeypatch.setenv(config.X86_EMULATOR, "none")
    with pytest.raises(CompilerUnavailableError, match="CORALRT_X86_EMULATOR=none"):
        emulation.command_prefix(x86, host="aarch64")


def test_a_script_runs_as_it_is_with_a_hint(tmp_path, monkeypatch):
    _path(monkeypatch)
    script = write(tmp_path / "edgetpu_compiler", "#!/bin/sh\nexec /opt/x86/edgetpu_compiler\n")
    assert emulation.command_prefix(script, host="aarch64") == []
    hint = emulation.run_hint(script, host="aarch64")
    assert "CORALRT_EDGETPU_COMPILER" in hint and "ELF binary itself" in hint
    assert emulation.run_hint(script, host="x86_64") == ""
    assert "box64" in emulation.run_hint(x86_elf(tmp_path), host="aarch64")
    assert emulation.run_hint(sys.executable) == ""
    paths = emulation.compile_paths(script, host="aarch64")
    assert paths[0]["path"] == "native" and "ELF binary itself" in paths[0]["detail"]


def test_a_wrapper_that_fails_on_arm_says_to_use_the_binary(tmp_path, env, monkeypatch):
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    broken = _wrapper(tmp_path / "w", "#!/bin/sh\necho 'cannot execute binary file' >&2\n"
                                      "exit 126\n")
    with pytest.raises(CompileError, match="ELF binary itself"):
        _ = EdgeTpuCompiler(broken, timeout=30).version


# -- EdgeTpuCompiler on a pretended aarch64 host ----------------------------------------------

@pytest.fixture
def arm_host(monkeypatch, fake):
    """This machine pretends to be aarch64 and ``fake`` (the stand-in's wrapper script) to
    be an x86-64 ELF binary; everything else (prefix choice, subprocess run) is real."""
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    real = emulation.inspect_binary

    def inspect(path):
        info = real(path)
        if info.path == fake.resolve():
            return emulation.BinaryInfo(info.path, "elf", "x86_64",
                                        header=emulation.X86_64_HEADER)
        return info
    monkeypatch.setattr(emulation, "inspect_binary", inspect)
    return fake


def test_compiler_runs_under_box64(arm_host, tmp_path, monkeypatch, caplog):
    log = tmp_path / "box64.argv"
    box = recorder(tmp_path / "emu", "box64", log)
    _path(monkeypatch, box.parent, Path(sys.executable).parent)
    compiler = EdgeTpuCompiler(arm_host, timeout=60)
    assert compiler.command_prefix == [str(box)]
    assert compiler.version == VERSION
    assert log.read_text().splitlines() == [str(box), str(arm_host), "--version"]
    model = load_model(shared_model(f"{DEEPLAB}.tflite"))
    with caplog.at_level(logging.DEBUG, logger="coralrt.compile"):
        got = compiler.compile_segment(model.extract(range(64)))
    assert got == bytes(_custom(_compiled(DEEPLAB)).custom_options)
    argv = log.read_text().splitlines()
    assert argv[:3] == [str(box), str(arm_host), "-s"] and argv[-1].endswith("segment.tflite")
    assert any(r.getMessage().startswith(f"running {box} {arm_host} -s")
               for r in caplog.records)


def test_compiler_runs_under_qemu_with_a_sysroot(arm_host, tmp_path, monkeypatch):
    log = tmp_path / "qemu.argv"
    qemu = recorder(tmp_path / "emu", "qemu-x86_64", log, drop_sysroot=True)
    sysroot = tmp_path / "amd64-root"
    sysroot.mkdir()
    monkeypatch.setenv(config.X86_SYSROOT, str(sysroot))
    _path(monkeypatch, qemu.parent)
    assert EdgeTpuCompiler(arm_host, timeout=60).version == VERSION
    assert log.read_text().splitlines() == [str(qemu), "-L", str(sysroot), str(arm_host),
                                            "--version"]


def test_no_emulator_on_arm(arm_host, monkeypatch, caplog):
    _path(monkeypatch)
    with pytest.raises(CompilerUnavailableError, match="sudo apt install box64"):
        _ = EdgeTpuCompiler(arm_host).version
    monkeypatch.setenv(config.EDGETPU_COMPILER, str(arm_host))
    registry = CompilerRegistry()
    with caplog.at_level(logging.DEBUG, logger="coralrt.plugins"):
        builtins.coralrt_register_compilers(registry)
    assert "edgetpu_compiler" not in registry.compilers and registry.for_device("usb") is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert "box64" in text and "qemu-user" in text and COMPILER_HELP not in text


def test_builtins_register_an_emulated_compiler(arm_host, tmp_path, monkeypatch, caplog):
    box = recorder(tmp_path / "emu", "box64", tmp_path / "argv")
    _path(monkeypatch, box.parent, arm_host.parent)
    registry = CompilerRegistry()
    with caplog.at_level(logging.DEBUG, logger="coralrt.plugins"):
        builtins.coralrt_register_compilers(registry)
    found = registry.for_device("usb")
    assert isinstance(found, EdgeTpuCompiler) and found.path == arm_host
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(f"emulated through {box}" in r.getMessage() for r in caplog.records)


@pytest.mark.skipif(emulation.host_machine() != "x86_64", reason="needs an x86-64 host")
def test_enoexec_hint_mentions_emulation(tmp_path, env):
    # An aarch64 build (compiler 2.1 had one) on this x86-64 machine: the kernel refuses it.
    arm64 = write(tmp_path / "bin" / "edgetpu_compiler", header(183))
    with pytest.raises(CompileError) as info:
        _ = EdgeTpuCompiler(arm64).version
    text = str(info.value)
    assert "cannot run" in text and "built for aarch64" in text and "emulator" in text


# -- coralrt doctor ---------------------------------------------------------------------------

def test_compile_paths_native_with_a_compiler_on_path(fake, env):
    env.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    paths = doctor_compile.compile_paths_report()
    assert [p["path"] for p in paths] == ["native", "remote"]
    assert paths[0]["compiler"] == str(fake) and paths[0]["via"] is None
    assert paths[1]["via"] is None and "not configured" in paths[1]["detail"]
    text = doctor_compile.format_compile_paths(paths)
    assert "native" in text and str(fake.resolve()) in text
    assert "To get one" not in text


def test_compile_paths_none(env, tmp_path):
    paths = doctor_compile.compile_paths_report(lambda: None)
    assert [p["path"] for p in paths] == ["none", "remote"] and paths[0]["how"]
    text = doctor_compile.format_compile_paths(paths)
    for needle in ("none", "not configured", "x86-64 Linux", "box64 or qemu-user",
                   "CORALRT_COMPILER_URL", "coralrt serve-compiler", "ahead of time"):
        assert needle in text, needle
    env.setenv(config.EDGETPU_COMPILER, str(tmp_path / "missing"))
    paths = doctor_compile.compile_paths_report()
    assert paths[0]["path"] == "none" and config.EDGETPU_COMPILER in paths[0]["detail"]


def test_compile_paths_on_arm_without_a_compiler(monkeypatch, tmp_path, emulators):
    _path(monkeypatch, emulators["box64"])
    paths = emulation.compile_paths(None, host="aarch64")
    assert paths[0]["path"] == "none" and "box64 is installed" in paths[0]["detail"]
    assert "CORALRT_EDGETPU_COMPILER" in paths[0]["how"]
    _path(monkeypatch)
    paths = emulation.compile_paths(None, host="aarch64")
    assert "sudo apt install box64" in paths[0]["how"]
    paths = emulation.compile_paths(x86_elf(tmp_path), host="aarch64")
    assert paths[0]["path"] == "none" and "cannot run here" in paths[0]["detail"]
    assert "qemu-user" in paths[0]["how"]


def test_remote_path_is_reported_without_network(monkeypatch):
    monkeypatch.setenv(doctor_compile.COMPILER_URL, "https://me:s3cret@builder:8765/")
    paths = doctor_compile.compile_paths_report(lambda: None)
    remote = paths[-1]
    assert remote["path"] == "remote" and remote["via"] == "https://me:***@builder:8765/"
    assert "s3cret" not in json.dumps(paths)
    text = doctor_compile.format_compile_paths(paths)
    assert "CORALRT_COMPILER_URL is set to https://me:***@builder:8765/" in text
    assert "To get one" not in text  # a configured service is a way to compile


def _args(**kw):
    import argparse
    return argparse.Namespace(json=kw.pop("json", False), simulated=kw.pop("simulated", None))


def test_doctor_text_and_json(fake, env, capsys):
    D.command_doctor(_args(simulated=1), find_compiler=lambda: fake)
    out = capsys.readouterr().out
    assert "compile paths" in out and "native" in out
    code = D.command_doctor(_args(simulated=1, json=True), find_compiler=lambda: None)
    data = json.loads(capsys.readouterr().out)
    assert [p["path"] for p in data["compile_paths"]] == ["none", "remote"]
    assert set(data["compile_paths"][0]) == {"path", "compiler", "via", "detail", "how"}
    # Information only: no compile path is not a failed check.
    assert len(data["checks"]) == 11 and code == (0 if data["ok"] else 1)


def test_doctor_cli_with_a_compiler_on_path(fake, env, capsys):
    env.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    main(["doctor", "--simulated", "1", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["compile_paths"][0]["path"] == "native"
    assert data["compile_paths"][0]["compiler"] == str(fake)
    main(["doctor", "--simulated", "1"])
    out = capsys.readouterr().out
    assert "compile paths" in out and f"native    {fake.resolve()}" in out
