"""The program formats: what an Edge TPU step carries inside a ``.tflite``, in one table.

A compiled model holds each device program in the ``custom_options`` of a
CUSTOM operator; the operator's name says which format the bytes are.
:data:`FORMATS` lists every format with what each reader needs:

* the compile path writes ``op_name`` (a compiler's
  :attr:`~coralrt._compile.base.Compiler.op_name`);
* :mod:`coralrt._model.compiled` says which compiler made a model
  (``compiler``) and refuses to compile it again;
* the executor (:mod:`coralrt._runtime.executor`) finds the format of each
  operator by its name and applies the output fix-ups
  (``outputs_need_dtypes``, ``outputs_need_shapes``);
* a device loads the bytes as the format's ``id``: the USB driver picks the
  handle class registered for that id (``handle`` names it), and a pyusb
  backend may refuse a format by its id (``ProgramRefusedError.kind``).

Handle classes live in a higher layer (:mod:`coralrt._usb.handles`), so the
table names them instead of importing them; the driver looks them up by
format id.  This module imports nothing of coralrt, so every layer, the
model layer included, may read it.  One constant per custom-operator name.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EDGETPU_OP", "SEGMENT_OP", "DEVICE_OPS", "ProgramFormat", "SEGMENT", "DWN1",
           "FORMATS", "BY_ID", "BY_OP", "identify"]

#: edgetpu_compiler's operator; its ``custom_options`` hold a DWN1 package.
EDGETPU_OP = "edgetpu-custom-op"
#: coralrt's native compiler's operator; its ``custom_options`` hold a segment.
SEGMENT_OP = "coralrt-segment"


@dataclass(frozen=True)
class ProgramFormat:
    """One program format (see the module docstring)."""

    #: The format's name where code chooses by format: ``"segment"``, ``"dwn1"``.
    id: str
    #: The custom operator that carries programs of this format.
    op_name: str
    #: How the program's bytes start, or None when the format has no fixed magic.
    magic: bytes | None
    #: Which compiler makes them (:func:`coralrt._model.compiled.compiled_by`).
    compiler: str
    #: The handle class a USB device loads them as (``module:class``).
    handle: str
    #: What they are, for messages ("cannot load a coralrt native segment").
    description: str
    #: Output fix-up: the device needs the operator's output dtypes to decode
    #: the outputs (a classifier's float outputs come back as uint8 otherwise).
    outputs_need_dtypes: bool = False
    #: Output fix-up: the device returns outputs without the batch dimension
    #: the model declares; the executor reshapes them to the operator's shapes.
    outputs_need_shapes: bool = False

    def matches(self, data) -> bool:
        """Whether ``data`` starts with this format's magic (False without one)."""
        return self.magic is not None and bytes(data[:len(self.magic)]) == self.magic


#: coralrt's native segment (docs/segment-format.md); runs on the simulated Edge TPU.
SEGMENT = ProgramFormat(
    id="segment", op_name=SEGMENT_OP, magic=b"CRTSEG\0\0", compiler="coralrt",
    handle="coralrt._usb.handles:SegmentHandle", description="a coralrt native segment")
#: edgetpu_compiler's DWN1 executable package (a FlexBuffer map, so no magic of its
#: own at offset 0); runs on a real Coral USB Accelerator.
DWN1 = ProgramFormat(
    id="dwn1", op_name=EDGETPU_OP, magic=None, compiler="edgetpu_compiler",
    handle="coralrt._usb.handles:ExecutableHandle",
    description="an edgetpu_compiler program (DWN1 executable package)",
    outputs_need_dtypes=True, outputs_need_shapes=True)

#: Every program format, in this order.
FORMATS: tuple[ProgramFormat, ...] = (SEGMENT, DWN1)
#: Format id -> format.
BY_ID: dict[str, ProgramFormat] = {f.id: f for f in FORMATS}
#: Custom-operator name -> format.
BY_OP: dict[str, ProgramFormat] = {f.op_name: f for f in FORMATS}
#: Operators that run on an Edge TPU device rather than on the CPU.
DEVICE_OPS = tuple(BY_OP)


def identify(data) -> ProgramFormat:
    """The format of program bytes that come without their operator's name (a
    caller of ``UsbEdgeTpu.load``): the format whose magic they start with, else
    the one format without a magic (DWN1), whose parser then judges them."""
    for fmt in FORMATS:
        if fmt.matches(data):
            return fmt
    return DWN1
