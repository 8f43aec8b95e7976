"""Single-endpoint framing: 8-byte headers, chunked payloads, events and interrupts.

Every host -> device stream goes to EP 0x01 as an 8-byte header (payload
length u32 little-endian, ``tag & 0xF``, three zero bytes) followed by the
payload in pieces of at most 1 MiB (libedgetpu's ``max_bulk_out_transfer_size``).
Outputs are read from EP 0x81 (reads of at most 1 MiB on USB 3; on USB 2 at
most 256 bytes per read, libedgetpu's USB 2 bulk-in chunk), 16-byte event
records from EP 0x82 and 4-byte interrupt words from EP 0x83.
"""

from __future__ import annotations

import array
import logging

import numpy as np

from coralrt.errors import DeviceError, DeviceTimeoutError
from coralrt._usb import constants as C
from coralrt._usb.transport import Transport

__all__ = ["Framer", "header", "to_array", "prepare_stream"]

log = logging.getLogger("coralrt.usb")


def header(length: int, tag: int) -> bytes:
    return C.HEADER.pack(length, tag & 0xF)


def to_array(data) -> array.array:
    """``data`` (any contiguous bytes-like, numpy included) as ``array('B')``: one memcpy."""
    a = array.array("B")
    a.frombytes(memoryview(data).cast("B") if not isinstance(data, np.ndarray)
                else data.reshape(-1).view(np.uint8).data)
    return a


def prepare_stream(tag: int, data, max_out: int = C.MAX_BULK_OUT) -> list[array.array]:
    """The transfers of one stream, header first, ready to resend (instructions)."""
    mv = memoryview(data).cast("B")
    parts = [array.array("B", header(len(mv), tag))]
    parts += [to_array(mv[i:i + max_out]) for i in range(0, len(mv), max_out)]
    return parts


class Framer:
    """Streams on one transport; counts bytes sent per tag (``sent``)."""

    def __init__(self, transport: Transport, usb_speed: str = "usb3"):
        self.t = transport
        self.usb_speed = usb_speed
        self.max_out = C.MAX_BULK_OUT
        self.max_in = C.BULK_IN_CHUNK["usb2"] if usb_speed in ("usb2", "usb1") else C.MAX_BULK_IN
        self.sent = {tag: 0 for tag in range(4)}

    def send(self, tag: int, data) -> None:
        """Header then payload, in pieces of at most ``max_out`` bytes."""
        mv = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else \
            memoryview(data.reshape(-1).view(np.uint8))
        n = len(mv)
        name = C.TAG_NAMES.get(tag, str(tag))
        self.t.bulk_write(C.EP_OUT, array.array("B", header(n, tag)), f"sending the {name} header")
        for start in range(0, n, self.max_out):
            self.t.bulk_write(C.EP_OUT, to_array(mv[start:start + self.max_out]),
                              f"sending {name} bytes {start}..{min(n, start + self.max_out)}")
        self.sent[tag] = self.sent.get(tag, 0) + n

    def send_prepared(self, tag: int, parts: list[array.array], nbytes: int) -> None:
        name = C.TAG_NAMES.get(tag, str(tag))
        for part in parts:
            self.t.bulk_write(C.EP_OUT, part, f"sending {name}")
        self.sent[tag] = self.sent.get(tag, 0) + nbytes

    def read_output(self, out: np.ndarray, what: str = "output", *,
                    allow_refusal: bool = False) -> bool:
        """Fill ``out`` (uint8, contiguous) from EP 0x81.

        With ``allow_refusal``, a zero-length first packet (the stick refused the
        request and explains why in an event record) returns False.
        """
        size, got = out.size, 0
        while got < size:
            want = min(size - got, self.max_in)
            data = self.t.bulk_read(C.EP_OUTPUT, want, f"reading {what}")
            n = len(data)
            if n == 0:
                if allow_refusal and got == 0:
                    return False
                raise DeviceError(f"{self.t.path or 'device'}: reading {what}: the stick "
                                  f"sent no data ({got} of {size} bytes received); it may "
                                  f"have refused the request", path=self.t.path)
            if n > size - got:
                raise DeviceError(f"{self.t.path or 'device'}: reading {what}: the stick sent "
                                  f"{got + n} bytes, more than the {size} expected",
                                  path=self.t.path)
            out[got:got + n] = np.frombuffer(data, np.uint8)
            got += n
        return True

    def read_event(self, what: str = "completion event") -> tuple[int, int, int]:
        """(address, length, tag) of the next 16-byte event record on EP 0x82."""
        data = self.t.bulk_read(C.EP_EVENT, C.EVENT_SIZE, f"waiting for the {what}")
        if len(data) != C.EVENT_SIZE:
            raise DeviceError(f"{self.t.path or 'device'}: event record of {len(data)} bytes "
                              f"(expected {C.EVENT_SIZE})", path=self.t.path)
        return C.EVENT.unpack(bytes(data))

    def poll_interrupt(self, timeout: float = 0.05) -> int | None:
        """The next 4-byte interrupt word, or None if none arrives within ``timeout``."""
        try:
            data = self.t.bulk_read(C.EP_INTERRUPT, C.INTERRUPT_SIZE, "reading interrupts",
                                    timeout=timeout)
        except DeviceTimeoutError:
            return None
        if len(data) < C.INTERRUPT_SIZE:
            return None
        return int.from_bytes(bytes(data[:4]), "little")
