"""Every exception coralrt raises on purpose.

Each class subclasses :class:`CoralRTError` and the builtin that matches its
meaning, so ``except ValueError`` keeps working for callers that do not know
coralrt.  Messages say what was wrong, where, and what to do about it.
Exceptions keep their structured attributes when pickled (they cross process
boundaries in the cache and the multi-stick runner).
"""

from __future__ import annotations

__all__ = [
    "CoralRTError",
    "ModelError",
    "UnsupportedOperatorError",
    "InputError",
    "BackendError",
    "BackendUnavailableError",
    "InferenceError",
    "ConfigError",
    "TargetUnavailableError",
    "PluginError",
    "SegmentFormatError",
    "SegmentTooLargeError",
    "CacheLockTimeoutError",
]


class CoralRTError(Exception):
    """Base class of every error coralrt raises on purpose."""

    def __reduce__(self):
        # Keep keyword attributes across pickling (multiprocessing, subprocess
        # workers): the default reduce only replays ``args``.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls, args, state):
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class ModelError(CoralRTError, ValueError):
    """The model file is not a valid TFLite model, or cannot be used as one.

    ``where`` names the place (for example ``"subgraph 0, operator 12"``)
    when one is known.
    """

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


class UnsupportedOperatorError(ModelError):
    """An operator that neither the CPU backend nor any plugin provides."""

    def __init__(self, op_name: str, *, where: str | None = None, detail: str | None = None):
        self.op_name = op_name
        msg = (
            f"operator {op_name!r} is not provided by the CPU backend or by any "
            f"installed coralrt plugin; install or register a plugin that provides "
            f"a kernel for {op_name!r} (see docs/plugins.md)"
        )
        if detail:
            msg += f" [{detail}]"
        super().__init__(msg, where=where)


class InputError(CoralRTError, ValueError):
    """The inputs passed to ``run`` do not match what the model expects."""


class BackendError(CoralRTError, RuntimeError):
    """The CPU backend failed in a way that is not the model's or the caller's fault."""


class BackendUnavailableError(BackendError, ImportError):
    """The requested CPU backend (or any CPU backend) is not installed."""


class InferenceError(CoralRTError, RuntimeError):
    """Running the model failed after it was loaded successfully."""


class ConfigError(CoralRTError, ValueError):
    """An option passed to coralrt has a value it does not know.

    For example an unknown CPU backend name or kernel set; the message lists
    the accepted values.
    """


class TargetUnavailableError(CoralRTError, NotImplementedError):
    """The requested target cannot run in this installation or version."""


class CacheLockTimeoutError(CoralRTError, TimeoutError):
    """Waiting for another process to finish compiling the same model took too long.

    ``path`` is the lock file and ``timeout`` the seconds waited.
    """

    def __init__(self, path, timeout: float):
        self.path = str(path)
        self.timeout = timeout
        super().__init__(
            f"gave up after {timeout:g} s waiting for the compile cache lock {self.path}: "
            f"another process is still compiling the same model; wait for it to finish, "
            f"or stop it and try again")


class SegmentFormatError(ModelError):
    """A native Edge TPU segment cannot be encoded, or its bytes are not a valid segment.

    Raised by :func:`coralrt._formats.segment.decode` for every defect in the
    input (wrong magic, unsupported format version, truncation, checksum
    mismatch, an offset or id out of range), and by ``build_segment`` /
    ``encode`` when a model holds something the format cannot represent.
    A cache treats it as a miss and rebuilds the segment.
    """


class SegmentTooLargeError(ModelError):
    """A segment's activations do not fit in the Edge TPU's on-chip memory.

    ``required_bytes`` is the activation peak of the memory plan and
    ``limit_bytes`` the on-chip memory it had to fit in; the partitioner
    reacts by cutting the segment into smaller ones.
    """

    def __init__(self, required_bytes: int, limit_bytes: int, *, where: str | None = None):
        self.required_bytes = required_bytes
        self.limit_bytes = limit_bytes
        super().__init__(
            f"the segment needs {required_bytes} bytes ({required_bytes / 2**20:.2f} MiB) of "
            f"on-chip activation memory but the Edge TPU has {limit_bytes} bytes "
            f"({limit_bytes / 2**20:.2f} MiB); split it into smaller segments",
            where=where)


class PluginError(CoralRTError, RuntimeError):
    """A plugin could not be loaded or registered, or breaks the plugin contract."""


# -- USB device errors ------------------------------------------------------------------

__all__ += [
    "DeviceError", "DeviceNotFoundError", "DevicePermissionError", "DeviceBusyError",
    "DeviceTimeoutError", "DeviceLostError", "FirmwareError", "ProgramRefusedError",
]


class DeviceError(CoralRTError, OSError):
    """The Coral USB Accelerator (or its simulated stand-in) failed an operation.

    ``errno`` is the operating-system error number when the failure came from
    one (``errno.EPIPE`` for a stalled endpoint, ``errno.ENODEV`` for a device
    that left the bus ...), ``path`` the device (``"usb:0"``) when known.
    ``str(err)`` is the message alone, without the ``[Errno N]`` prefix.
    """

    def __init__(self, message: str, *, errno: int | None = None, path: str | None = None):
        self.message = message
        self.path = path
        if errno is None:
            OSError.__init__(self, message)
        else:
            OSError.__init__(self, errno, message)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return (_rebuild_device_error, (type(self), self.errno, self.__dict__))


def _rebuild_device_error(cls, errno, state):
    err = cls.__new__(cls)
    if errno is None:
        OSError.__init__(err, state.get("message", ""))
    else:
        OSError.__init__(err, errno, state.get("message", ""))
    err.__dict__.update(state)
    return err


class DeviceNotFoundError(DeviceError):
    """No Coral USB Accelerator is connected (or none matches the requested path)."""


class DevicePermissionError(DeviceError, PermissionError):
    """The operating system refused access to the stick (usually a missing udev rule)."""


class DeviceBusyError(DeviceError):
    """Another process (``holder_pid``, when known) has the stick open."""

    def __init__(self, message: str, *, errno: int | None = None, path: str | None = None,
                 holder_pid: int | None = None):
        self.holder_pid = holder_pid
        super().__init__(message, errno=errno, path=path)


class DeviceTimeoutError(DeviceError, TimeoutError):
    """A transfer or a wait on the stick took longer than its timeout (``timeout`` seconds)."""

    def __init__(self, message: str, *, errno: int | None = None, path: str | None = None,
                 timeout: float | None = None):
        self.timeout = timeout
        super().__init__(message, errno=errno, path=path)


class DeviceLostError(DeviceError):
    """The stick left the bus or reported a fatal error; close it and open it again."""


class FirmwareError(DeviceError):
    """The stick's firmware is missing, does not match the pinned checksum, or failed to load."""


class ProgramRefusedError(DeviceError):
    """The device cannot execute this kind of program; raised when the program is loaded.

    ``kind`` is the program kind (``"segment"``: a coralrt native segment,
    ``"dwn1"``: an edgetpu_compiler executable) and ``reason`` why the device
    refuses it and what to do instead.  A real Edge TPU refuses coralrt's
    native segments; the simulated Edge TPU refuses edgetpu_compiler programs.
    """

    def __init__(self, message: str, *, kind: str | None = None, reason: str | None = None,
                 errno: int | None = None, path: str | None = None):
        self.kind = kind
        self.reason = reason
        super().__init__(message, errno=errno, path=path)


# -- Edge TPU executables ---------------------------------------------------------------

__all__ += ["ExecutableError"]


class ExecutableError(ModelError):
    """The DWN1 executable package inside an ``edgetpu-custom-op`` is malformed or unusable.

    Raised by :func:`coralrt._formats.dwn1.parse_package` for every defect: a
    FlexBuffer or flatbuffer that cannot be read, a package that needs a newer
    runtime, a combination of executables libedgetpu rejects, an invalid batch
    size, or a size, offset or index outside its range.  ``where`` names the
    part (for example ``"executable 1 (EXECUTION_ONLY), dma hint 3"``).
    """


# -- edgetpu_compiler -------------------------------------------------------------------

__all__ += ["CompileError", "SegmentNotMapped", "CompilerUnavailableError"]


class CompileError(CoralRTError, RuntimeError):
    """The Edge TPU compiler failed, crashed or ran past its timeout.

    ``log_tail`` holds the last lines it printed, ``returncode`` its exit
    status (``None`` after a timeout) and ``timeout`` the seconds allowed.
    """

    def __init__(self, message: str, *, log_tail: str = "", returncode: int | None = None,
                 timeout: float | None = None):
        self.message = message
        self.log_tail = log_tail
        self.returncode = returncode
        self.timeout = timeout
        text = message
        if log_tail:
            text += "\n--- compiler output (last lines) ---\n" + log_tail
        super().__init__(text)


class CompileServiceError(CompileError):
    """A compile service (``coralrt serve-compiler``) could not be reached, refused
    the request, failed, or sent an answer that does not verify.

    ``url`` is the service's URL, ``status`` the HTTP status when it answered
    (None when it could not be reached or did not answer in time) and
    ``cause`` a short description of what went wrong.
    """

    def __init__(self, url: str, cause: str, *, status: int | None = None,
                 log_tail: str = "", returncode: int | None = None,
                 timeout: float | None = None):
        self.url = url
        self.status = status
        self.cause = cause
        super().__init__(f"compile service {url}: {cause}", log_tail=log_tail,
                         returncode=returncode, timeout=timeout)


class SegmentNotMapped(CoralRTError):
    """The compiler left some operators of a segment on the CPU.

    ``cpu_ops`` lists the operators left on the CPU, as indices into the
    segment's sub-model (execution order); ``reasons`` maps each of them to
    the status the compiler's log gives it.  The partitioner moves those
    operators to the CPU and compiles the rest of the segment again.
    """

    def __init__(self, cpu_ops, reasons: dict[int, str] | None = None, *,
                 total_ops: int | None = None):
        self.cpu_ops = sorted(int(i) for i in cpu_ops)
        self.reasons = dict(reasons or {})
        self.total_ops = total_ops
        of = f" of {total_ops}" if total_ops is not None else ""
        super().__init__(f"the compiler left {len(self.cpu_ops)}{of} operator(s) of the "
                         f"segment on the CPU (operators {self.cpu_ops[:8]}"
                         f"{' ...' if len(self.cpu_ops) > 8 else ''})")


COMPILER_HELP = (
    "edgetpu_compiler runs on x86-64 Debian or Ubuntu Linux only. Install it from "
    "Coral's apt repository:\n"
    "  curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | "
    "sudo gpg --dearmor -o /usr/share/keyrings/coral-edgetpu.gpg\n"
    "  echo \"deb [signed-by=/usr/share/keyrings/coral-edgetpu.gpg] "
    "https://packages.cloud.google.com/apt coral-edgetpu-stable main\" | "
    "sudo tee /etc/apt/sources.list.d/coral-edgetpu.list\n"
    "  sudo apt-get update && sudo apt-get install edgetpu-compiler\n"
    "or point CORALRT_EDGETPU_COMPILER at an edgetpu_compiler executable.\n"
    "On ARM (Raspberry Pi and other ARM boards) there is no native build; either\n"
    "  - compile on a compile service: run `coralrt serve-compiler` on an x86-64 machine "
    "and set CORALRT_COMPILER_URL (docs/compile-service.md),\n"
    "  - run an x86-64 edgetpu_compiler under box64 or qemu-user "
    "(docs/install-raspberry-pi.md),\n"
    "  - import the compiled cache of a machine that compiled the model: `coralrt cache "
    "export` there, `coralrt cache import` here,\n"
    "  - or compile ahead of time on x86-64 Linux with `coralrt compile --compiler "
    "edgetpu_compiler model.tflite` and load the model_edgetpu.tflite it writes with "
    "target=\"coral\".")


class CompilerUnavailableError(TargetUnavailableError):
    """No compiler whose programs run on a real Edge TPU (edgetpu_compiler) is available.

    The message explains how to install edgetpu_compiler and, for ARM
    (Raspberry Pi), the other ways: a compile service, emulation, an imported
    cache, or compiling ahead of time elsewhere.
    """

    def __init__(self, message: str | None = None):
        head = message or ("this model holds no program for a real Edge TPU (it is a plain "
                           ".tflite, or a file compiled by coralrt for the simulated Edge TPU, "
                           "which runs only with target='sim'), and no compiler whose programs "
                           "run on a real Edge TPU (edgetpu_compiler) was found.")
        super().__init__(head if COMPILER_HELP in head else f"{head}\n{COMPILER_HELP}")


class CacheArchiveError(CoralRTError, ValueError):
    """A compile cache archive (``coralrt cache export``/``import``) cannot be
    written or read: not an archive, truncated, an unsafe or unexpected
    member, an unknown archive or cache format version, or nothing to export."""


class QueueFullError(CoralRTError, RuntimeError):
    """``InferenceSession.submit`` found the session's request queue full.

    Raised at once with ``block=False``, or when ``timeout`` seconds passed
    without room.  A ``RuntimeError`` like ``queue.Full``'s use: nothing
    failed, the caller is ahead of the device; wait for some futures, or
    create the session with a larger ``max_pending``.  ``max_pending`` is the
    queue's length.
    """

    def __init__(self, message: str, *, max_pending: int | None = None):
        self.max_pending = max_pending
        super().__init__(message)


class InferenceTimeoutError(CoralRTError, TimeoutError):
    """``InferenceSession.run(..., timeout=...)`` waited longer than ``timeout`` seconds.

    The late result is discarded; a stick the request was interrupted on is
    reset before its next request (docs/reliability.md, "Run timeouts").
    """

    def __init__(self, message: str, *, timeout: float | None = None):
        self.timeout = timeout
        super().__init__(message)


class SessionClosedError(InferenceError):
    """``run`` or ``submit`` on an :class:`~coralrt.InferenceSession` that was closed."""


# -- driver="libedgetpu" ----------------------------------------------------------------

__all__ += ["DriverUnavailableError", "LIBEDGETPU_HELP"]

LIBEDGETPU_HELP = (
    "driver='libedgetpu' runs the Edge TPU segments through Google's libedgetpu, loaded by "
    "the LiteRT interpreter as a delegate from the shared library libedgetpu.so.1. Google's "
    "own packages (libedgetpu1-std / libedgetpu1-max from Coral's apt repository) were "
    "last built years ago and need an old LiteRT; on current Debian, Ubuntu or Raspberry "
    "Pi OS install a community build made for the LiteRT (ai-edge-litert or "
    "tflite-runtime) version you have, for example a release of feranick/libedgetpu on "
    "GitHub. Then check that `ldconfig -p | grep libedgetpu.so.1` lists it, or put the "
    "folder holding libedgetpu.so.1 on LD_LIBRARY_PATH before Python starts. A build made "
    "for another LiteRT version can crash the process that loads it; coralrt loads it in "
    "a child process first. The default driver, driver='coralrt' (CORALRT_DRIVER unset), "
    "needs none of this: it talks to the stick itself over pyusb.")


class DriverUnavailableError(TargetUnavailableError):
    """``driver="libedgetpu"`` cannot be used in this process.

    A :class:`TargetUnavailableError` like :class:`CompilerUnavailableError`:
    what is missing is the way to reach the Edge TPU for ``target="coral"``,
    not a CPU backend (a ``BackendUnavailableError`` would make
    :func:`coralrt._backends.get_backend` and ``coralrt doctor`` treat it as a
    missing interpreter).  ``library`` is the library asked for, ``cause``
    one of ``"missing"``, ``"not-loadable"``, ``"not-libedgetpu"``,
    ``"no-litert"``, ``"delegate"``, ``"crash"``, ``"timeout"``, ``"error"``;
    ``signal`` the signal that ended the probing child (``cause="crash"``);
    ``detail`` what the loader said.  The message ends with how to install
    libedgetpu (:data:`LIBEDGETPU_HELP`).
    """

    def __init__(self, message: str, *, library: str | None = None, cause: str | None = None,
                 signal: int | None = None, detail: str | None = None):
        self.library = library
        self.cause = cause
        self.signal = signal
        self.detail = detail
        super().__init__(message if LIBEDGETPU_HELP in message
                         else f"{message}\n{LIBEDGETPU_HELP}")


__all__ += ["DeviceNotReadyError", "DeviceWedgedError"]


class DeviceNotReadyError(DeviceTimeoutError):
    """The stick is enumerated (18d1:9302) but did not answer register reads within
    ``timeout`` seconds of being opened; unplug and replug it.

    Public reports say enumeration does not prove a stick is usable (libedgetpu
    waits before every open "to reduce chances of transfer errors";
    coral-usb-oxidized's *Enumerated-But-Unusable* state).  ``errno`` is that of
    the last failed read.
    """


class DeviceWedgedError(DeviceLostError):
    """A transfer timed out and the stick no longer answers anything, register reads
    included: public reports say only unplugging and replugging it helps
    (edgetpu#70, edgetpu#237)."""


__all__ += ["TrainingError"]


class TrainingError(CoralRTError, RuntimeError):
    """On-device training (``coralrt.pycoral.learn``) was asked for something it cannot
    do: an embedding of the wrong size, a class id out of order, saving before any
    training.  A RuntimeError, as pycoral raises for the same cases."""
