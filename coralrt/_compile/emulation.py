"""Running the x86-64 ``edgetpu_compiler`` on another machine, under an emulator.

Google ships edgetpu_compiler for x86-64 Linux only (its ARM64 builds ended
with 2.1).  On an aarch64 machine such as a 64-bit Raspberry Pi, an x86-64
user-mode emulator can run it: ``box64`` or ``qemu-x86_64`` (also packaged as
``qemu-x86_64-static``).  This module decides how the compiler binary is run:

- :func:`inspect_binary` reads the file's ELF header (the first 64 bytes:
  magic, class, byte order, ``e_machine``) after resolving symbolic links,
  and tells an ELF executable (and its machine) from a ``#!`` script;
- :func:`host_machine` is ``platform.machine()`` in the same names
  (``amd64`` -> ``x86_64``, ``arm64`` -> ``aarch64``, ``armv7l`` -> ``arm``);
- :func:`binfmt_interpreter` finds an enabled ``binfmt_misc`` entry whose
  magic matches an x86-64 ELF header: then the kernel starts the emulator
  itself and the binary runs as it is (read-only look at
  ``/proc/sys/fs/binfmt_misc``);
- :func:`find_emulator` picks the emulator: ``CORALRT_X86_EMULATOR`` (a path,
  a name looked up on ``PATH``, or ``none`` to forbid emulation), else the
  first of ``box64``, ``qemu-x86_64``, ``qemu-x86_64-static`` on ``PATH``;
- :func:`command_prefix` returns what goes before the binary on the command
  line: ``[]`` (native, or ``binfmt_misc`` handles it), ``[emulator]``, or for
  qemu with ``CORALRT_X86_SYSROOT`` set ``[qemu, "-L", sysroot]`` (qemu reads
  ``QEMU_LD_PREFIX`` from the environment by itself); with neither, when the
  binary's folder holds ``ld-linux-x86-64.so.2`` (Coral's Debian package puts
  the binary, its loader and its libraries in ``/usr/bin/edgetpu_compiler_bin``)
  ``[qemu, loader, "--library-path", folder]``, as the package's own wrapper
  script runs it.  It raises
  :class:`~coralrt.errors.CompilerUnavailableError` saying what to install
  when the binary is x86-64, this machine is not and nothing can run it;
- :func:`compile_paths` describes the local ways this machine has to run
  edgetpu_compiler, for ``coralrt doctor``.

Only x86-64 binaries are emulated.  A binary built for another machine than
this one (an old aarch64 build on an x86-64 machine, say) is run as it is and
the kernel decides; a ``#!`` script is run as it is too (it may be a wrapper
that starts an emulator itself), with a hint to point
``CORALRT_EDGETPU_COMPILER`` at the ELF binary when it fails.

Nothing here runs a program: it reads file headers, ``PATH`` and
``/proc/sys/fs/binfmt_misc``.  None of it has been tried under a real
emulator: the tests drive it with fake headers, fake emulators on ``PATH``
and a pretended host machine.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from coralrt import _config as config
from coralrt.errors import CompilerUnavailableError, ConfigError

__all__ = ["BINFMT_DIR", "EMULATORS", "X86_64", "BinaryInfo", "elf_machine", "inspect_binary",
           "host_machine", "binfmt_interpreter", "find_emulator", "command_prefix",
           "run_hint", "compile_paths"]

X86_64 = "x86_64"
#: Where the kernel lists its binfmt_misc entries (read only).
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
#: The emulators looked for on ``PATH``, in this order.
EMULATORS = ("box64", "qemu-x86_64", "qemu-x86_64-static")

ELF_MAGIC = b"\x7fELF"
HEADER_BYTES = 64
# e_machine -> name (as platform.machine() says it on Linux); 32/64-bit pairs by class.
_MACHINES = {3: "x86", 62: X86_64, 40: "arm", 183: "aarch64", 8: ("mips", "mips64"),
             20: "ppc", 21: "ppc64", 22: "s390x", 243: ("riscv32", "riscv64"),
             258: "loongarch64"}
_HOST_ALIASES = {"amd64": X86_64, "x64": X86_64, "arm64": "aarch64", "i386": "x86",
                 "i486": "x86", "i586": "x86", "i686": "x86"}
# The machines whose binaries a host's kernel runs itself (32-bit ones on 64-bit hosts).
_RUNS_ON = {X86_64: (X86_64, "x86"), "aarch64": ("aarch64", "arm")}
# A typical x86-64 ELF executable header (e_ident, e_type ET_EXEC, e_machine 62), for
# asking binfmt_misc about x86-64 binaries in general.
X86_64_HEADER = ELF_MAGIC + bytes([2, 1, 1, 0]) + bytes(8) + bytes([2, 0, 62, 0, 1, 0, 0, 0])

INSTALL_EMULATOR = (
    "install an x86-64 emulator: `sudo apt install box64` (Debian 13, Raspberry Pi OS "
    "Trixie, Ubuntu 24.04 and later; elsewhere see https://github.com/ptitSeb/box64) or "
    "`sudo apt install qemu-user` (qemu-x86_64 also needs an x86-64 sysroot with the C "
    "library, CORALRT_X86_SYSROOT or QEMU_LD_PREFIX, unless the compiler's folder holds "
    "its own ld-linux-x86-64.so.2 as in Coral's package)")
#: The dynamic loader Coral's edgetpu-compiler package ships next to the binary
#: (``/usr/bin/edgetpu_compiler_bin/``, with the libraries it needs).
BUNDLED_LOADER = "ld-linux-x86-64.so.2"
REMOTE_HINT = ("or compile on an x86-64 machine that runs `coralrt serve-compiler` by "
               "setting CORALRT_COMPILER_URL to its address")


@dataclass(frozen=True)
class BinaryInfo:
    """What a compiler file is.

    ``path``: the file after resolving symbolic links; ``kind``: ``"elf"``,
    ``"script"`` (starts with ``#!``; ``interpreter`` is that line) or
    ``"other"``; ``machine``: the ELF machine (``"x86_64"``, ``"aarch64"``,
    ``"arm"``...), None when not ELF; ``header``: the first bytes read.
    """

    path: Path
    kind: str
    machine: str | None = None
    interpreter: str | None = None
    header: bytes = b""

    def describe(self) -> str:
        if self.kind == "elf":
            return f"{self.machine} ELF executable"
        if self.kind == "script":
            return f"script ({self.interpreter})"
        return "not an ELF executable or a script"


def elf_machine(header: bytes) -> str | None:
    """The machine an ELF header is built for, or None when ``header`` is not ELF.

    Reads ``EI_CLASS`` (32/64-bit), ``EI_DATA`` (byte order) and ``e_machine``
    (offset 18).  An unknown ``e_machine`` gives ``"elf-machine-N"``.
    """
    if len(header) < 20 or not header.startswith(ELF_MAGIC):
        return None
    elf_class, data = header[4], header[5]
    if elf_class not in (1, 2) or data not in (1, 2):
        return None
    number = int.from_bytes(header[18:20], "little" if data == 1 else "big")
    name = _MACHINES.get(number)
    if isinstance(name, tuple):
        name = name[elf_class - 1]
    if name == "ppc64" and data == 1:
        name = "ppc64le"
    return name or f"elf-machine-{number}"


def inspect_binary(path: str | os.PathLike) -> BinaryInfo:
    """Read the start of ``path`` (symbolic links resolved): ELF, ``#!`` script or other."""
    real = Path(path).resolve()
    try:
        with open(real, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError:
        return BinaryInfo(real, "other")
    machine = elf_machine(head)
    if machine is not None:
        return BinaryInfo(real, "elf", machine, header=head)
    if head.startswith(b"#!"):
        line = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()
        return BinaryInfo(real, "script", interpreter=line, header=head)
    return BinaryInfo(real, "other", header=head)


def host_machine(machine: str | None = None) -> str:
    """This machine as ELF names it: ``platform.machine()`` lower-cased, ``amd64`` ->
    ``x86_64``, ``arm64`` -> ``aarch64``, ``armv6l``/``armv7l``/``armv8l`` -> ``arm``,
    ``i686`` -> ``x86``."""
    name = (machine if machine is not None else platform.machine()).strip().lower()
    if name.startswith("armv") and not name.startswith("armv9"):
        return "arm"
    return _HOST_ALIASES.get(name, name)


def binfmt_interpreter(header: bytes = X86_64_HEADER, root: str | os.PathLike | None = None
                       ) -> str | None:
    """The interpreter of the enabled ``binfmt_misc`` entry that matches ``header``, or None.

    ``root`` (default :data:`BINFMT_DIR`) is only read: its ``status`` file
    (binfmt_misc as a whole enabled or not) and each entry's
    ``enabled``/``disabled`` line, ``offset``, ``magic``, ``mask``,
    ``interpreter`` and ``flags``.  An entry without the ``F`` flag needs its
    interpreter to exist in this file system.
    """
    root = Path(BINFMT_DIR if root is None else root)
    try:
        if (root / "status").read_text().strip() == "disabled":
            return None
        entries = sorted(p for p in root.iterdir() if p.name not in ("status", "register"))
    except OSError:
        return None
    for entry in entries:
        try:
            lines = entry.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        if not lines or lines[0].strip() != "enabled":
            continue
        fields = {}
        for line in lines[1:]:
            key, _, value = line.partition(" ")
            fields[key.rstrip(":")] = value.strip()
        if _magic_matches(fields, header):
            interpreter = fields.get("interpreter", "")
            if "F" in fields.get("flags", "") or Path(interpreter).exists():
                return interpreter
    return None


def _magic_matches(fields: dict, header: bytes) -> bool:
    try:
        magic = bytes.fromhex(fields["magic"])
        mask = bytes.fromhex(fields["mask"]) if fields.get("mask") else b"\xff" * len(magic)
        offset = int(fields.get("offset", "0"))
    except (KeyError, ValueError):
        return False  # an "extension" entry, or one we cannot read
    data = header[offset:offset + len(magic)]
    if not magic or len(data) < len(magic) or len(mask) < len(magic):
        return False
    return all(d & m == g & m for d, g, m in zip(data, magic, mask))


def find_emulator() -> Path | None:
    """The x86-64 emulator to use, or None (none installed, or ``CORALRT_X86_EMULATOR=none``).

    ``CORALRT_X86_EMULATOR`` names one (a path, or a name looked up on
    ``PATH``; one that cannot be found is a ConfigError); unset: the first of
    :data:`EMULATORS` on ``PATH``.
    """
    value = config.x86_emulator()
    if value == config.NO_EMULATOR:
        return None
    if value is not None:
        found = shutil.which(value)
        if found is None:
            raise ConfigError(f"{config.X86_EMULATOR}={value!r} is not an executable (nor a "
                              f"name on PATH); name box64, qemu-x86_64 or the path of one, "
                              f"'none' to forbid emulation, or unset it to search PATH")
        return Path(found)
    for name in EMULATORS:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def _is_qemu(emulator: Path) -> bool:
    return emulator.name.startswith("qemu")


def _emulator_command(emulator: Path, binary: Path) -> list[str]:
    sysroot = config.x86_sysroot()
    if not _is_qemu(emulator):
        return [str(emulator)]
    if sysroot is not None:
        return [str(emulator), "-L", str(sysroot)]
    loader = binary.parent / BUNDLED_LOADER
    if not os.environ.get("QEMU_LD_PREFIX") and loader.is_file():
        # Coral's package layout: run the binary through its own loader and libraries,
        # as its /usr/bin/edgetpu_compiler wrapper does natively.
        return [str(emulator), str(loader), "--library-path", str(binary.parent)]
    return [str(emulator)]


def _plan(binary, host, binfmt_root) -> tuple[str, list[str], str | None, str]:
    """(path, prefix, via, detail), path ``native``/``emulated``/``none``; for ``none``
    the detail is the reason."""
    info = inspect_binary(binary)
    host = host_machine(host)
    what = f"{info.path} is an {info.describe()}" if info.kind == "elf" else \
        f"{info.path} is a {info.describe()}"
    if info.kind != "elf" or info.machine != X86_64 or host == X86_64:
        # Native, a wrapper script, or a machine we do not emulate: the kernel decides.
        note = ""
        if info.kind == "elf" and info.machine not in _RUNS_ON.get(host, (host,)):
            return "none", [], None, (f"{what} and this machine is {host}: it will not run "
                                      f"here (an emulator is used for x86-64 binaries only)")
        if info.kind == "script" and host != X86_64:
            note = ("; it runs as it is, so if it starts an x86-64 binary, point "
                    "CORALRT_EDGETPU_COMPILER at that ELF binary itself so that coralrt "
                    "runs it through an emulator")
        return "native", [], None, f"{what}, run as it is on this {host} machine{note}"
    explicit = config.x86_emulator()
    emulator = find_emulator()
    if explicit is None or emulator is None:
        handler = binfmt_interpreter(info.header or X86_64_HEADER, binfmt_root)
        if handler is not None:
            return "emulated", [], "binfmt_misc", (
                f"{what}; this {host} machine's kernel runs it through binfmt_misc "
                f"(interpreter {handler})")
    if emulator is not None:
        prefix = _emulator_command(emulator, info.path)
        extra = ""
        if _is_qemu(emulator):
            if len(prefix) > 3:
                extra = f" with the loader and libraries next to it ({BUNDLED_LOADER})"
            elif len(prefix) > 1:
                extra = f" with the x86-64 sysroot {prefix[-1]} ({config.X86_SYSROOT})"
            elif os.environ.get("QEMU_LD_PREFIX"):
                extra = f" with the x86-64 sysroot {os.environ['QEMU_LD_PREFIX']} (QEMU_LD_PREFIX)"
            else:
                extra = (f" (no x86-64 sysroot set: if it cannot find its libraries, set "
                         f"{config.X86_SYSROOT} to one)")
        return "emulated", prefix, str(emulator), (
            f"{what}; this machine is {host}, so it runs under {emulator}{extra}")
    forbidden = explicit == config.NO_EMULATOR
    why = (f"{config.X86_EMULATOR}=none forbids emulation" if forbidden else
           f"no x86-64 emulator was found ({', '.join(EMULATORS)} on PATH) and binfmt_misc "
           f"does not handle x86-64 binaries")
    return "none", [], None, f"{what} and this machine is {host}: it cannot run here, " \
                             f"because {why}"


def command_prefix(binary: str | os.PathLike, *, host: str | None = None,
                   binfmt_root: str | os.PathLike | None = None) -> list[str]:
    """What to put before ``binary`` on its command line.

    ``[]`` when it runs as it is (built for this machine, a script, or
    x86-64 binaries handled by binfmt_misc; an explicit
    ``CORALRT_X86_EMULATOR`` is preferred over binfmt_misc); ``[emulator]``,
    ``[qemu, "-L", sysroot]`` or ``[qemu, folder/ld-linux-x86-64.so.2,
    "--library-path", folder]`` when an x86-64 binary needs an emulator.
    ``host``: the machine to assume (default: this one).  Raises
    CompilerUnavailableError when an x86-64 binary cannot run here, ConfigError
    for a bad ``CORALRT_X86_EMULATOR`` or ``CORALRT_X86_SYSROOT``.
    """
    path, prefix, _, detail = _plan(binary, host, binfmt_root)
    if path == "none" and inspect_binary(binary).machine != X86_64:
        return []  # not ours to emulate: the kernel decides (binfmt_misc may run it)
    if path == "none":
        raise CompilerUnavailableError(f"{detail}. To run it, {INSTALL_EMULATOR}; "
                                       f"{REMOTE_HINT}.")
    return prefix


def run_hint(binary: str | os.PathLike, *, host: str | None = None) -> str:
    """Why ``binary`` may fail to start here ("" when nothing is known), for error messages."""
    info = inspect_binary(binary)
    host = host_machine(host)
    if info.kind == "script" and host != X86_64:
        return (f"{info.path} is a script run as it is on this {host} machine: if it starts "
                f"the x86-64 edgetpu_compiler, point CORALRT_EDGETPU_COMPILER at that ELF "
                f"binary itself so that coralrt runs it under box64 or qemu-x86_64")
    if info.kind == "elf" and info.machine != host:
        return (f"{info.path} is built for {info.machine} and this machine is {host}; an "
                f"x86-64 edgetpu_compiler runs on ARM under an emulator ({INSTALL_EMULATOR}), "
                f"{REMOTE_HINT}, or compile on an x86-64 Linux machine instead")
    return ""


def compile_paths(compiler: str | os.PathLike | None, *, host: str | None = None,
                  binfmt_root: str | os.PathLike | None = None) -> list[dict]:
    """The local ways this machine has to run edgetpu_compiler (nothing is run).

    ``compiler``: the binary :func:`~coralrt._compile.edgetpu_compiler.find_compiler`
    found, or None.  Each item: ``path`` (``"native"``, ``"emulated"`` or
    ``"none"``), ``compiler`` (the binary, or None), ``via`` (the emulator,
    ``"binfmt_misc"`` or None), ``detail`` and ``how`` (how to get a path,
    when ``path`` is ``"none"``; else None).  The compile service
    (``CORALRT_COMPILER_URL``) is not a local path: ``coralrt doctor`` adds it.
    """
    host_name = host_machine(host)
    if compiler is None:
        if host_name == X86_64:
            detail = "no edgetpu_compiler found (CORALRT_EDGETPU_COMPILER is not set and it " \
                     "is not on PATH)"
            how = "install edgetpu_compiler (Coral's apt package edgetpu-compiler) or point " \
                  "CORALRT_EDGETPU_COMPILER at one"
        else:
            try:
                emulator = find_emulator()
            except ConfigError as e:
                emulator, bad = None, str(e)
            else:
                bad = ""
            handler = binfmt_interpreter(X86_64_HEADER, binfmt_root)
            forbidden = config.x86_emulator() == config.NO_EMULATOR
            runner = (f"{emulator} is installed" if emulator else
                      f"binfmt_misc runs x86-64 binaries through {handler}" if handler else
                      bad or (f"{config.X86_EMULATOR}=none forbids emulation" if forbidden
                              else "no x86-64 emulator is installed"))
            detail = (f"no edgetpu_compiler found (CORALRT_EDGETPU_COMPILER is not set and it "
                      f"is not on PATH); {runner}")
            how = ("get the x86-64 edgetpu_compiler (from the amd64 .deb of Coral's "
                   "edgetpu-compiler package) and point CORALRT_EDGETPU_COMPILER at it"
                   + ("" if emulator or handler else f"; {INSTALL_EMULATOR}"))
        return [{"path": "none", "compiler": None, "via": None, "detail": detail, "how": how}]
    try:
        path, _, via, detail = _plan(compiler, host, binfmt_root)
    except ConfigError as e:
        path, via, detail = "none", None, str(e)
    how = None
    if path == "none":
        x86 = inspect_binary(compiler).machine == X86_64
        how = f"{INSTALL_EMULATOR}; {REMOTE_HINT}" if x86 else \
            f"use an x86-64 edgetpu_compiler (under an emulator on ARM), {REMOTE_HINT}"
    return [{"path": path, "compiler": str(compiler), "via": via, "detail": detail, "how": how}]
