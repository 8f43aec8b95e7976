"""DFU 1.1 state machine of the simulated stick in bootloader mode.

Follows the USB DFU 1.1 class specification with the request codes, states
and status codes of the Edge TPU stack reference §1.4.  The device is
manifestation tolerant: after the final zero-length DNLOAD, GETSTATUS
answers OK with state dfuIDLE (what libedgetpu checks), and an UPLOAD from
dfuIDLE returns the manifested image for verification.

``busy_polls`` > 0 makes each block (and the manifestation) report dfuDNBUSY
(dfuMANIFEST) with a poll timeout first, as slower DFU devices do; the host
must then wait bwPollTimeout before the next request, else the request
stalls.  A block number out of sequence is reported by the next GETSTATUS as
errADDRESS / dfuERROR.  Any image of at least one byte is accepted.

A request the device stalls puts it in dfuERROR with errSTALLEDPKT (DFU 1.1:
"device stalled an unexpected request"); in dfuERROR only GETSTATUS and
GETSTATE are answered (the state stays), CLRSTATUS returns to dfuIDLE, and
everything else (DNLOAD, UPLOAD, ABORT) stalls again.  :meth:`usb_reset`
(a port reset) is the other way out.
"""

from __future__ import annotations

import hashlib
import time

from coralrt._usb.constants import (
    DFU_ABORT, DFU_BLOCK_SIZE, DFU_CLRSTATUS, DFU_DETACH, DFU_DNLOAD, DFU_GETSTATE,
    DFU_GETSTATUS, DFU_STATE_DNBUSY, DFU_STATE_DNLOAD_IDLE, DFU_STATE_DNLOAD_SYNC,
    DFU_STATE_ERROR, DFU_STATE_IDLE, DFU_STATE_MANIFEST, DFU_STATE_MANIFEST_SYNC,
    DFU_STATE_UPLOAD_IDLE, DFU_STATES, DFU_STATUS, DFU_STATUS_ERR_ADDRESS,
    DFU_STATUS_ERR_STALLEDPKT, DFU_STATUS_OK, DFU_UPLOAD,
)

__all__ = ["DfuStall", "DfuMachine", "REQUEST_NAMES"]

# Short local names of the DFU 1.1 states and status codes (values in coralrt._usb.constants).
IDLE, DN_SYNC, DN_BUSY, DN_IDLE = (DFU_STATE_IDLE, DFU_STATE_DNLOAD_SYNC, DFU_STATE_DNBUSY,
                                   DFU_STATE_DNLOAD_IDLE)
MAN_SYNC, MANIFEST, UP_IDLE, ERROR = (DFU_STATE_MANIFEST_SYNC, DFU_STATE_MANIFEST,
                                      DFU_STATE_UPLOAD_IDLE, DFU_STATE_ERROR)
OK, ERR_ADDRESS, ERR_STALLEDPKT = DFU_STATUS_OK, DFU_STATUS_ERR_ADDRESS, DFU_STATUS_ERR_STALLEDPKT
REQUEST_NAMES = {DFU_DETACH: "detach", DFU_DNLOAD: "dnload", DFU_UPLOAD: "upload",
                 DFU_GETSTATUS: "getstatus", DFU_CLRSTATUS: "clrstatus",
                 DFU_GETSTATE: "getstate", DFU_ABORT: "abort"}


class DfuStall(Exception):
    """The request is not valid in this state: the device stalls EP0."""


class DfuMachine:
    def __init__(self, *, busy_polls: int = 0, poll_timeout_ms: int = 2):
        self.busy_polls = busy_polls
        self.poll_timeout_ms = poll_timeout_ms
        self.firmware: bytes | None = None      # the manifested image
        self.firmware_sha256: str | None = None
        self.blocks = 0
        self._reset_state()

    def _reset_state(self) -> None:
        self.state = IDLE
        self.status = OK
        self._image = bytearray()
        self._next_block: int | None = None
        self._pending_error = OK
        self._busy_left = 0
        self._busy_until = 0.0
        self._upload_at = 0

    def usb_reset(self) -> None:
        """A port reset: any transfer in progress is dropped; the manifested image stays."""
        self._reset_state()

    @property
    def state_name(self) -> str:
        return DFU_STATES[self.state]

    def stalled(self) -> None:
        """The request was stalled outside the state machine (an injected fault):
        like any stalled request, it leaves the device in dfuERROR / errSTALLEDPKT."""
        self.state, self.status = ERROR, ERR_STALLEDPKT

    def _stall(self, why: str):
        self.state, self.status = ERROR, ERR_STALLEDPKT
        raise DfuStall(why)

    def _tick(self) -> None:
        # dfuDNBUSY and dfuMANIFEST end by themselves once the poll timeout has passed.
        if self.state in (DN_BUSY, MANIFEST) and time.monotonic() >= self._busy_until:
            self.state = DN_SYNC if self.state == DN_BUSY else MAN_SYNC

    def request(self, request: int, value: int, length: int, data: bytes) -> bytes | None:
        """Handle one class request; IN requests return their data stage."""
        self._tick()
        if self.state in (DN_BUSY, MANIFEST):
            self._stall(f"{REQUEST_NAMES.get(request, request)} sent before the poll "
                        f"timeout of state {self.state_name} elapsed")
        handler = {DFU_DNLOAD: self._dnload, DFU_UPLOAD: self._upload,
                   DFU_GETSTATUS: self._getstatus, DFU_CLRSTATUS: self._clrstatus,
                   DFU_GETSTATE: self._getstate, DFU_ABORT: self._abort}.get(request)
        if handler is None:
            self._stall(f"request {request} is not supported in DFU mode")
        return handler(value, length, data)

    def _dnload(self, block: int, length: int, data: bytes) -> None:
        if length == 0:
            if self.state != DN_IDLE:
                self._stall(f"zero-length DNLOAD in state {self.state_name} (no image sent)")
            self.state = MAN_SYNC
            self._busy_left = self.busy_polls
            return None
        if self.state not in (IDLE, DN_IDLE):
            self._stall(f"DNLOAD in state {self.state_name}")
        if length > DFU_BLOCK_SIZE:
            self._stall(f"DNLOAD of {length} bytes exceeds wTransferSize {DFU_BLOCK_SIZE}")
        if self.state == IDLE:
            self._image = bytearray()
        elif block != self._next_block:
            self._pending_error = ERR_ADDRESS
        self._next_block = (block + 1) & 0xFFFF
        self._image += data
        self.blocks += 1
        self._busy_left = self.busy_polls
        self.state = DN_SYNC
        return None

    def _busy(self, state: int) -> int:
        self._busy_left -= 1
        self.state = state
        self._busy_until = time.monotonic() + self.poll_timeout_ms / 1000
        return self.poll_timeout_ms

    def _getstatus(self, value: int, length: int, data: bytes) -> bytes:
        poll = 0
        if self.state == DN_SYNC:
            if self._pending_error:
                self.state, self.status, self._pending_error = ERROR, self._pending_error, OK
            elif self._busy_left > 0:
                poll = self._busy(DN_BUSY)
            else:
                self.state = DN_IDLE
        elif self.state == MAN_SYNC:
            if self._busy_left > 0:
                poll = self._busy(MANIFEST)
            else:
                self.firmware = bytes(self._image)
                self.firmware_sha256 = hashlib.sha256(self.firmware).hexdigest()
                self._image = bytearray()
                self.state = IDLE
        return DFU_STATUS.pack(self.status, poll.to_bytes(3, "little"), self.state, 0)

    def _getstate(self, value: int, length: int, data: bytes) -> bytes:
        return bytes([self.state])

    def _clrstatus(self, value: int, length: int, data: bytes) -> None:
        if self.state != ERROR:
            self._stall(f"CLRSTATUS in state {self.state_name}")
        self._reset_state()
        return None

    def _abort(self, value: int, length: int, data: bytes) -> None:
        if self.state not in (IDLE, DN_SYNC, DN_IDLE, MAN_SYNC, UP_IDLE):
            self._stall(f"ABORT in state {self.state_name}")
        self._reset_state()
        return None

    def _upload(self, block: int, length: int, data: bytes) -> bytes:
        if self.state == IDLE:
            self._upload_at = 0
            self.state = UP_IDLE
        elif self.state != UP_IDLE:
            self._stall(f"UPLOAD in state {self.state_name}")
        image = self.firmware or b""
        chunk = image[self._upload_at:self._upload_at + length]
        self._upload_at += len(chunk)
        if len(chunk) < length:       # a short packet ends the upload
            self.state = IDLE
        return chunk
