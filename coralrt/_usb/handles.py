"""The handles of programs a stick runs, as the host prepares them: a coralrt
segment (the coralrt wire protocol, docs/usb.md) or a DWN1 package from
edgetpu_compiler.  (A handle is what ``UsbEdgeTpu.load`` returns; a
:class:`~coralrt._runtime.program.Program` is something else: what a session runs.)

:data:`HANDLES` registers each handle class under the id of its program
format (:data:`coralrt._formats.opnames.FORMATS`, whose ``handle`` field names
the class); the driver looks handles up there, never by the program's bytes.
"""

from __future__ import annotations

import zlib

import numpy as np

from coralrt._formats import segment_codec as seg_codec
from coralrt._formats.dwn1 import check_runnable, parse_package, select_executables
from coralrt.errors import ExecutableError
from coralrt._formats.opnames import DWN1, SEGMENT
from coralrt._model.types import numpy_dtype
from coralrt._usb import constants as C
from coralrt._usb.framing import prepare_stream
from coralrt._usb.transforms import InputStager, OutputDecoder

__all__ = ["SegmentHandle", "ExecutableHandle", "HANDLES"]


class SegmentHandle:
    """A coralrt segment; decoded (output shapes) on its first run."""

    kind = SEGMENT.id
    output_dtypes = None    # not used: a segment's outputs have the model's dtypes

    def __init__(self, data: memoryview):
        self.data = data
        self.key = bytes(data[:seg_codec.HEADER_SIZE])
        self.prepared = False

    @classmethod
    def from_cache(cls, data: memoryview, handles: dict) -> SegmentHandle:
        """The handle of ``data`` in ``handles`` (by its header, which holds the
        body's CRC-32), made and added when missing: a segment is decoded on its
        first run only."""
        key = bytes(data[:seg_codec.HEADER_SIZE])
        handle = handles.get(key)
        if handle is None:
            handle = handles[key] = cls(data)
        return handle

    def prepare(self) -> None:
        seg = seg_codec.decode(self.data)
        self.inputs = [(seg.tensors[i].shape, numpy_dtype(seg.tensors[i].dtype))
                       for i in seg.inputs]
        self.outputs = [(tuple(seg.tensors[i].shape), numpy_dtype(seg.tensors[i].dtype))
                        for i in seg.outputs]
        record = C.RUN_RECORD.pack(C.RUN_MAGIC, zlib.crc32(self.key), len(seg.inputs))
        self.run_parts = prepare_stream(C.TAG_INSTRUCTIONS, record)
        self.prepared = True


class ExecutableHandle:
    """A DWN1 package: the executables libedgetpu would pick, with staged buffers."""

    kind = DWN1.id

    def __init__(self, data: memoryview):
        self.data = data
        self.package = parse_package(data)
        self.cache, self.exe = select_executables(self.package)
        check_runnable(self.package, (self.cache, self.exe))  # enum values it needs
        for e in (self.cache, self.exe):
            if e is not None and not e.fully_deterministic:
                raise ExecutableError(
                    f"the {e.type} executable does not have fully deterministic DMA hints; "
                    f"libedgetpu refuses such executables over USB unless the device sends "
                    f"bulk descriptors, which coralrt does not support")
        if self.cache is not None and not self.cache.caching_token:
            raise ExecutableError("the parameter-caching executable has caching token 0")
        self.key = ("dwn1", len(data), zlib.crc32(data))
        self.prepared = False
        self.output_dtypes: list | None = None   # host dtypes when they differ (classifiers)

    @classmethod
    def from_cache(cls, data: memoryview, handles: dict) -> ExecutableHandle:
        """The handle of ``data``: parsed and checked on every load (a package
        that does not parse or run is refused here), then the one in ``handles``
        with the same bytes, or this one, added."""
        handle = cls(data)
        return handles.setdefault(handle.key, handle)

    def prepare(self) -> None:
        exe = self.exe
        self.parts = {id(e): [prepare_stream(C.TAG_INSTRUCTIONS, c) for c in e.instructions]
                      for e in (self.cache, exe) if e is not None}
        reach: dict[str, int] = {}
        for h in exe.dma_hints:
            if h.kind in ("input", "output"):
                reach[h.name] = max(reach.get(h.name, 0), h.offset + h.size)
        self.stagers = [InputStager(layer, reach.get(layer.name)) for layer in exe.inputs]
        self.by_input = {s.layer.name: s for s in self.stagers}
        wants = self.output_dtypes or [None] * len(exe.outputs)
        self.decoders = [OutputDecoder(layer, w) for layer, w in zip(exe.outputs, wants)]
        self.raw = {layer.name: np.zeros(max(reach.get(layer.name, 0),
                                             layer.size_bytes * layer.execution_count),
                                         np.uint8) for layer in exe.outputs}
        self.prepared = True


#: Format id -> the handle class of that program format.
HANDLES: dict[str, type] = {SEGMENT.id: SegmentHandle, DWN1.id: ExecutableHandle}
