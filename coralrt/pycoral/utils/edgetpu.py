"""pycoral.utils.edgetpu on coralrt: interpreters bound to an Edge TPU, and the devices.

Interpreters and delegates come from :mod:`coralrt.tflite.interpreter`, the
``tflite_runtime.interpreter`` look-alike; the delegate runs the model with
coralrt (on a USB Accelerator, or on the simulated stick when
``CORALRT_TARGET=sim``).  PCIe Edge TPUs are not supported by coralrt.
"""

from __future__ import annotations

import ctypes
import logging
import os

import numpy as np

from coralrt._logs import StderrHandler

__all__ = ["load_edgetpu_delegate", "make_interpreter", "list_edge_tpus", "run_inference",
           "invoke_with_bytes", "invoke_with_membuffer", "invoke_with_dmabuffer",
           "supports_dmabuf", "get_runtime_version", "set_verbosity"]

# The library name pycoral asks for on Linux; coralrt's load_delegate knows it.
EDGETPU_SHARED_LIB = "libedgetpu.so.1"

log = logging.getLogger("coralrt.pycoral")


def _tflite():
    # Imported on first use: the adapters and label helpers need none of it.
    from coralrt.tflite import interpreter
    return interpreter


def load_edgetpu_delegate(options: dict | None = None):
    """The Edge TPU delegate, given ``options`` such as ``{"device": "usb:0"}``."""
    return _tflite().load_delegate(EDGETPU_SHARED_LIB, dict(options or {}))


def make_interpreter(model_path_or_content, device: str | None = None, delegate=None):
    """A new Interpreter for a model, with the Edge TPU delegate attached.

    ``model_path_or_content``: ``bytes`` (or another bytes-like object) is the
    model itself; anything else is a path.  ``device``: None (any Edge TPU),
    ``"usb"``, ``"usb:N"``, ``"pci"``, ``"pci:N"`` or ``":N"`` (the N-th of
    :func:`list_edge_tpus`).  ``delegate``: an already loaded delegate (from
    :func:`load_edgetpu_delegate`); ``device`` is then ignored.  Call
    ``allocate_tensors()`` on the result before use, as with pycoral.
    """
    if not delegate:
        delegate = load_edgetpu_delegate({"device": device} if device else {})
    tflite = _tflite()
    if isinstance(model_path_or_content, (bytes, bytearray, memoryview)):
        return tflite.Interpreter(model_content=bytes(model_path_or_content),
                                  experimental_delegates=[delegate])
    return tflite.Interpreter(model_path=os.fspath(model_path_or_content),
                              experimental_delegates=[delegate])


def list_edge_tpus() -> list[dict]:
    """Every Coral USB Accelerator found, as ``{"type": "usb", "path": ...}``.

    ``path`` is the stick's sysfs port path (``/sys/bus/usb/devices/B-P``), or
    ``usb:N`` when the port is unknown; the list order is the ``:N`` numbering.
    Sticks are listed whether or not their firmware is loaded.  Never raises:
    without libusb, pyusb or permission to look, the list is empty.

    Under ``CORALRT_TARGET=sim`` the list is the simulated sticks instead
    (``CORALRT_SIM_STICKS``, default 4): ``{"type": "usb", "path": "usb:N",
    "simulated": True}``, so that programs written for several sticks run.
    """
    from coralrt import _config as config
    try:
        if config.compat_target() == "sim":
            return [{"type": "usb", "path": f"usb:{i}", "simulated": True}
                    for i in range(config.sim_sticks())]
    except Exception as e:  # noqa: BLE001 - a bad variable: as no stick, said in the log
        log.warning("list_edge_tpus: %s", e)
        return []
    try:
        from coralrt._usb import list_devices
        found = list_devices()
    except Exception as e:  # noqa: BLE001 - pycoral's listing never fails either
        log.debug("listing Edge TPUs failed: %s", e)
        return []
    return [{"type": "usb", "path": info.port_path or info.path} for info in found]


def _input_bytes(input_data, expected: int) -> bytes:
    """The first ``expected`` bytes of ``input_data``; ValueError when it holds fewer."""
    def check(size):
        if size < expected:
            raise ValueError(f"input size={size}, expected={expected}.")

    if isinstance(input_data, (bytes, bytearray, memoryview)):
        data = memoryview(input_data).cast("B")
        check(data.nbytes)
        return bytes(data[:expected])
    if (isinstance(input_data, tuple) and len(input_data) == 2
            and isinstance(input_data[0], ctypes.c_void_p) and isinstance(input_data[1], int)):
        pointer, size = input_data
        check(size)
        return ctypes.string_at(pointer.value, expected)
    if isinstance(input_data, np.ndarray):
        data = np.ascontiguousarray(input_data).reshape(-1).view(np.uint8)
        check(data.nbytes)
        return data[:expected].tobytes()
    if hasattr(input_data, "extract_dup") and hasattr(input_data, "get_size"):
        check(input_data.get_size())        # a Gst.Buffer: copied out, never mapped
        return bytes(input_data.extract_dup(0, expected))
    raise TypeError("input data type is not supported.")


def run_inference(interpreter, input_data) -> None:
    """Copy raw bytes into input 0 and ``invoke()``.

    ``input_data``: ``bytes``, a NumPy array (its raw bytes), a
    ``(ctypes.c_void_p, size)`` pair or a ``Gst.Buffer``, holding at least as
    many bytes as input 0 (extra bytes are ignored).  Outputs are read as
    usual afterwards.  As with pycoral, arrays from ``interpreter.tensor(i)()``
    may be held meanwhile: they see the new outputs (``invoke()`` itself
    refuses to run while one is held, as tflite_runtime's does).
    """
    details = interpreter.get_input_details()[0]
    dtype = np.dtype(details["dtype"])
    shape = tuple(int(d) for d in details["shape"])
    expected = int(np.prod(shape)) * dtype.itemsize
    data = _input_bytes(input_data, expected)
    if hasattr(interpreter, "_invoke_with_bytes"):     # coralrt's: as pycoral's native call
        interpreter._invoke_with_bytes(data)
        return
    interpreter.set_tensor(details["index"], np.frombuffer(data, dtype).reshape(shape))
    interpreter.invoke()


def invoke_with_bytes(interpreter_handle, input_data) -> None:
    """Input 0 from the first bytes of ``input_data``, then invoke.

    ``interpreter_handle`` is ``interpreter._native_handle()``.  RuntimeError
    when the interpreter is not allocated ("Invoke called on model that is not
    ready.") or the bytes are too few, as pycoral's.
    """
    _tflite()._interpreter_of(interpreter_handle)._invoke_with_bytes(input_data)


def invoke_with_membuffer(interpreter_handle, buffer: int, size: int) -> None:
    """Input 0 from ``size`` bytes at address ``buffer``, then invoke.

    As :func:`invoke_with_bytes`; the bytes are copied before the run."""
    interpreter = _tflite()._interpreter_of(interpreter_handle)
    interpreter._invoke_with_bytes(ctypes.string_at(int(buffer), int(size)) if size else b"")


def invoke_with_dmabuffer(interpreter_handle, dma_fd: int, size: int) -> None:
    """RuntimeError: dma-buf input is for PCIe Edge TPUs, and coralrt drives USB ones.

    The checks pycoral makes first come first (an unallocated interpreter
    raises "Invoke called on model that is not ready."); :func:`supports_dmabuf`
    is False."""
    interpreter = _tflite()._interpreter_of(interpreter_handle)
    if not interpreter._is_ready():
        interpreter.invoke()                    # raises pycoral's "not ready" error
    raise RuntimeError("dma-buf input needs a PCIe Edge TPU (supports_dmabuf() is False "
                       "for Coral USB Accelerators, which coralrt drives); pass the "
                       "bytes with run_inference() or invoke_with_membuffer()")


def supports_dmabuf(interpreter_handle) -> bool:
    """False: only PCIe Edge TPUs take dma-buf input, and coralrt drives USB ones."""
    _tflite()._interpreter_of(interpreter_handle)
    return False


def get_runtime_version() -> str:
    """The runtime's name and version (pycoral gives libedgetpu's build string here)."""
    from coralrt._version import version
    return f"coralrt {version()} (pure-Python Edge TPU runtime)"


# set_verbosity's handler, kept so that level 0 can take it away again.
_handler: logging.Handler | None = None


def set_verbosity(verbosity: int) -> bool:
    """Set how much coralrt logs, on libedgetpu's scale: 0 (the default) to 10.

    0 logs warnings and errors only; 1 adds INFO; 2 and more add DEBUG.  A
    level above 0 also sends the ``coralrt`` loggers to stderr (as libedgetpu
    logs there) unless they already have a handler.  Returns False, changing
    nothing, when ``verbosity`` is not an int in 0..10.
    """
    global _handler
    if isinstance(verbosity, bool) or not isinstance(verbosity, (int, np.integer)):
        return False
    if not 0 <= verbosity <= 10:
        return False
    logger = logging.getLogger("coralrt")
    logger.setLevel(logging.WARNING if verbosity == 0 else
                    logging.INFO if verbosity == 1 else logging.DEBUG)
    if verbosity == 0:
        if _handler is not None:
            logger.removeHandler(_handler)
            _handler = None
    elif _handler is None and not logger.handlers:
        _handler = StderrHandler()
        _handler.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
        logger.addHandler(_handler)
    return True
