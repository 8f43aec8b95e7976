"""TEST MODE ONLY: request-level answers to edgetpu_compiler (DWN1) programs.

The simulated Edge TPU cannot execute Google's Edge TPU instructions.  So that
the test suite can still drive a host's DWN1 path (coralrt's driver, or
libedgetpu) end to end, a backend in test mode is told which DWN1 packages it
may see (``SimulatedBackend.know_dwn1``) and each stick then plays the
*transfers* of those programs, never their computation:

* **Recognition.**  With no request in progress, a request starts with a
  tag 0 stream.  Once complete, its bytes are compared with the instruction
  chunk named by the first DMA hint of every known executable, ignoring the
  bits the chunk's ``FieldOffset`` entries cover: the host links addresses
  there (the parameter base in a parameter-caching program, the input, output
  and scratch bases in an execution program).  libedgetpu writes each one as
  a 32-bit immediate, bit ``offset_bit + k`` of the chunk taking bit ``k`` of
  the value, counting bits from the least significant bit of each byte
  (``ExecutableUtil::CopyUint32``, driver/executable_util.cc, for every
  ``Position`` and every ``Description``), so exactly those 32 bits of each
  entry are ignored.  The first executable that matches is the request's
  (executables that start with the same chunk but walk differently cannot be
  told apart, so ``Dwn1Catalog.add`` refuses the second one).
* **The walk.**  The stick then follows that executable's DMA hints in order.
  Each host -> device hint expects the next stream to have its tag and exactly
  its size: instruction -> tag 0 (its bytes must match the chunk, as above),
  input -> tag 1, parameter -> tag 2, scratch (infeed) -> tag 1, as
  libedgetpu's ``DmaInfoExtractor`` maps them.  Between two such streams the
  device -> host hints are played at once: an output (or outfeed scratch) hint
  queues its bytes on EP 0x81 as one chunk, so a read of any size gets at most
  the rest of that hint (a short transfer) and never bytes of a later output
  before the walk reached it; an interrupt hint queues a 16-byte event record
  (address 0, length 0, tag 4 + the interrupt number) on EP 0x82; a fence hint
  does nothing.  When the hints end without an interrupt hint, one tag 4 event
  is queued at the end.  (A host waits for an event at each interrupt hint,
  and at the end when there is none: coralrt's driver does, and libedgetpu
  matches each event to an interrupt hint and completes the request on the
  Interrupt0 one.)  Every compiled model in ``shared/models`` ends with its
  only interrupt hint, so each of its requests gets exactly one event, after
  all its host -> device data arrived.  Requests need not wait for each
  other: the streams of the next request may arrive before the host read the
  previous outputs and events, which stay queued in order.
* **Faults.**  A stream while no request is in progress that is not tag 0,
  a tag 0 stream that matches no known executable, or a stream of the wrong
  tag or size for the hint being walked raises the stick's fatal error with
  the reason (the stick then answers nothing until a reset): a host that
  strays from the program gets an error, never made-up outputs.

**The output bytes are placeholders, not the program's outputs.**  For an
outfeed hint at position ``j`` of the executable's DMA hints (0-based), with
``offset`` its ``offset_in_bytes``, byte ``i`` of the hint's data is::

    crc   = 0, then for each tag 1 payload P of the request so far, in order:
            crc = zlib.crc32(zlib.crc32(P).to_bytes(4, "little"), crc)
    seed  = zlib.crc32(j.to_bytes(4, "little"), crc)
    x     = (offset + i) * 0x9E3779B1 mod 2**32
    x     = x XOR seed;  x = x XOR (x >> 16);  x = x * 0x85EBCA6B mod 2**32
    x     = x XOR (x >> 13)
    byte  = x >> 24

so the bytes depend on the request's inputs, on which hint they belong to and
on their place in the output: a host that stitches transfers together in the
wrong order, or mixes up two requests, gets visibly different bytes.
:func:`placeholder` computes them (numpy, a few milliseconds for a megabyte).
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np

from coralrt._formats.dwn1 import Executable, UnknownEnum, parse_package
from coralrt._usb.constants import TAG_INPUT, TAG_INSTRUCTIONS, TAG_INTERRUPT0, TAG_PARAMETERS

__all__ = ["Dwn1Catalog", "KnownExecutable", "RequestWalker", "Switches", "placeholder",
           "instruction_mask"]

_INFEED_TAG = {"instruction": TAG_INSTRUCTIONS, "input": TAG_INPUT,
               "parameter": TAG_PARAMETERS}
_TAG_WORDS = {TAG_INSTRUCTIONS: "instructions", TAG_INPUT: "input",
              TAG_PARAMETERS: "parameters"}
_FIELD_BITS = 32        # every linked field is a 32-bit immediate (CopyUint32)


@dataclass(frozen=True)
class Switches:
    """The backend's test-only switches, as a stick reads them at each stream."""

    accept_dwn1: bool
    record_payloads: bool
    catalog: "Dwn1Catalog"


def _spread(offset: int, size: int) -> np.ndarray:
    """``(offset + i) * 0x9E3779B1 mod 2**32`` for i < size, the part without the seed."""
    x = np.arange(offset, offset + size, dtype=np.uint64).astype(np.uint32)
    x *= np.uint32(0x9E3779B1)
    return x


def placeholder(seed: int, offset: int, size: int, spread: np.ndarray | None = None) -> bytes:
    """``size`` placeholder bytes from output offset ``offset`` (module docstring).

    ``spread``: ``_spread(offset, size)``, when the caller keeps it.
    """
    x = _spread(offset, size) if spread is None else spread.copy()
    x ^= np.uint32(seed & 0xFFFFFFFF)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x85EBCA6B)
    x ^= x >> np.uint32(13)
    x >>= np.uint32(24)
    return x.astype(np.uint8).tobytes()


def instruction_mask(n_bytes: int, offset_bits) -> dict[int, int]:
    """{byte index: mask of the bits a host may link} for 32-bit fields at ``offset_bits``."""
    mask: dict[int, int] = {}
    for start in offset_bits:
        for bit in range(max(start, 0), min(start + _FIELD_BITS, 8 * n_bytes)):
            mask[bit >> 3] = mask.get(bit >> 3, 0) | (1 << (bit & 7))
    return mask


class _Chunk:
    """An instruction chunk and the bits of it a host links at run time."""

    __slots__ = ("data", "linked")

    def __init__(self, data, offset_bits):
        self.data = bytes(data)
        self.linked = sorted(instruction_mask(len(self.data), offset_bits).items())

    def matches(self, payload: bytearray) -> bool:
        """Whether ``payload`` is this chunk outside the linked bits.  It takes the
        chunk's bits where the host links (``payload`` is changed)."""
        if len(payload) != len(self.data):
            return False
        ref = self.data
        for i, m in self.linked:
            payload[i] = (payload[i] & ~m) | (ref[i] & m)
        return payload == ref


class _Step:
    __slots__ = ("index", "kind", "tag", "size", "offset", "chunk", "event_tag", "_spread")

    def __init__(self, index, kind, tag=None, size=0, offset=0, chunk=None, event_tag=None):
        self.index, self.kind, self.tag, self.size = index, kind, tag, size
        self.offset, self.chunk, self.event_tag = offset, chunk, event_tag
        self._spread = None

    def placeholder(self, inputs_crc: int) -> bytes:
        """This outfeed hint's placeholder bytes for a request with ``inputs_crc``."""
        if self._spread is None:
            self._spread = _spread(self.offset, self.size)
        seed = zlib.crc32(self.index.to_bytes(4, "little"), inputs_crc)
        return placeholder(seed, self.offset, self.size, self._spread)

    def describe(self) -> str:
        if self.tag is not None:
            return f"a tag {self.tag} ({_TAG_WORDS[self.tag]}) stream of {self.size} bytes"
        return self.kind


class KnownExecutable:
    """One executable of a known package, ready to be recognised and walked."""

    def __init__(self, exe: Executable):
        self.exe = exe
        what = f"the {exe.type} executable{f' {exe.name!r}' if exe.name else ''}"
        chunks = {}
        steps = []
        for j, h in enumerate(exe.dma_hints):
            kind = h.kind
            if kind == "instruction":
                if h.chunk not in chunks:
                    chunks[h.chunk] = _Chunk(exe.instructions[h.chunk],
                                             [f.offset_bit for f in exe.field_offsets[h.chunk]])
                steps.append(_Step(j, "infeed", TAG_INSTRUCTIONS, h.size, chunk=chunks[h.chunk]))
            elif kind in ("input", "parameter"):
                steps.append(_Step(j, "infeed", _INFEED_TAG[kind], h.size, h.offset))
            elif kind == "scratch" and h.direction == "infeed":
                steps.append(_Step(j, "infeed", TAG_INPUT, h.size, h.offset))
            elif kind == "output" or (kind == "scratch" and h.direction == "outfeed"):
                steps.append(_Step(j, "outfeed", None, h.size, h.offset))
            elif kind == "interrupt" and not isinstance(h.interrupt, UnknownEnum) and \
                    0 <= (h.interrupt or 0) <= 3:
                steps.append(_Step(j, "interrupt", event_tag=TAG_INTERRUPT0 + (h.interrupt or 0)))
            elif kind == "fence":
                continue
            else:
                raise ValueError(f"{what}: the simulated stick cannot follow DMA hint {j} "
                                 f"(kind {kind!r}, direction {h.direction!r}, interrupt "
                                 f"{h.interrupt!r})")
        if not steps or steps[0].tag != TAG_INSTRUCTIONS:
            raise ValueError(f"{what}: its DMA hints do not start with an instruction "
                             f"chunk, so a stick cannot recognise its requests")
        self.steps = steps
        self.first = steps[0].chunk
        self.ends_with_interrupt = steps[-1].kind == "interrupt"
        self.key = (self.first.data, tuple((s.kind, s.tag, s.size, s.offset) for s in steps))


@functools.lru_cache(maxsize=32)
def _read(package: bytes) -> tuple[KnownExecutable, ...]:
    """The executables of ``package``, all or none (kept: tests give the same ones often)."""
    return tuple(KnownExecutable(e) for e in parse_package(package).executables)


class Dwn1Catalog:
    """The executables a backend in test mode knows (``SimulatedBackend.know_dwn1``).

    An executable is named by its number here (the order it became known).
    """

    def __init__(self):
        self._known: list[KnownExecutable] = []
        self._by_size: dict[int, list[tuple[int, KnownExecutable]]] = {}
        self._seen: set = set()

    def add(self, package) -> list[Executable]:
        """Know every executable of ``package`` (an edgetpu-custom-op's ``custom_options``).

        Raises :class:`~coralrt.errors.ExecutableError` when the package does not
        parse, ValueError when an executable's DMA hints cannot be followed.
        """
        fresh = _read(bytes(package))
        known = list(self._known)   # new containers: sticks may be reading the old ones
        by_size = {n: list(v) for n, v in self._by_size.items()}
        added = []
        for k in fresh:
            if k.key in self._seen:         # known already (the same package twice)
                continue
            for other in by_size.get(len(k.first.data), ()):
                if other[1].first.data == k.first.data:
                    raise ValueError(f"the {k.exe.type} executable starts with the same "
                                     f"instructions as known executable {other[0]} but its "
                                     f"DMA hints differ: a stick could not tell them apart")
            self._seen.add(k.key)
            by_size.setdefault(len(k.first.data), []).append((len(known), k))
            known.append(k)
            added.append(k.exe)
        self._known, self._by_size = known, by_size
        return added

    @property
    def known(self) -> list[KnownExecutable]:
        return self._known

    def starts(self, length: int) -> bool:
        return length in self._by_size

    def match(self, payload: bytearray) -> tuple[int, KnownExecutable] | None:
        """(number, executable) of the first known executable ``payload`` starts
        (``payload`` may be changed, see ``_Chunk.matches``)."""
        same = self._by_size.get(len(payload), ())
        for i, (number, k) in enumerate(same):
            if k.first.matches(payload if i == len(same) - 1 else bytearray(payload)):
                return number, k
        return None

    def first_sizes(self) -> list[int]:
        return sorted(self._by_size)


class _Request:
    __slots__ = ("known", "number", "pos", "crc")

    def __init__(self, number: int, known: KnownExecutable):
        self.known, self.number, self.pos, self.crc = known, number, 1, 0

    @property
    def label(self) -> str:
        return f"known executable {self.number} ({self.known.exe.type})"


class RequestWalker:
    """One stick's DWN1 requests: the one being walked and what it queues.

    ``emit_output(bytes)`` queues one EP 0x81 chunk, ``emit_event(tag)`` one
    EP 0x82 record, ``record(op, **fields)`` writes a transcript entry.
    """

    def __init__(self, emit_output, emit_event, record):
        self._emit_output, self._emit_event, self._record = emit_output, emit_event, record
        self.reset()

    def reset(self) -> None:
        self._request: _Request | None = None
        self._catalog: Dwn1Catalog | None = None
        self._tag = None
        self._data: bytearray | None = None

    @property
    def busy(self) -> bool:
        """A request is half walked: every stream belongs to it."""
        return self._request is not None

    def begin(self, catalog: Dwn1Catalog, tag: int, length: int, entry: dict) -> str | None:
        """A stream's header; returns why the stick cannot take it, or None."""
        self._tag, self._data = tag, None
        r = self._request
        if r is None:
            if tag != TAG_INSTRUCTIONS:
                return (f"DWN1 test mode: a tag {tag} stream of {length} bytes arrived with no "
                        f"request in progress; a request starts with its instructions (tag 0)")
            if catalog is None or not catalog.known:
                return ("DWN1 test mode: no DWN1 executable is known to this simulated stick "
                        "(tests register packages with SimulatedBackend.know_dwn1)")
            if not catalog.starts(length):
                return (f"DWN1 test mode: no known executable starts with {length} bytes of "
                        f"instructions (first chunks of {catalog.first_sizes()} bytes are known)")
            self._catalog = catalog
            self._data = bytearray()
            return None
        step = r.known.steps[r.pos]
        entry["executable"], entry["hint"] = r.number, step.index
        if tag != step.tag or length != step.size:
            return (f"DWN1 test mode: {r.label}, DMA hint {step.index} expects "
                    f"{step.describe()}; got a tag {tag} stream of {length} bytes")
        if tag == TAG_INSTRUCTIONS:
            self._data = bytearray()
        return None

    def feed(self, chunk, own: bool = False) -> None:
        """Payload bytes of the stream (``own``: a bytearray the walker may keep)."""
        if self._data is not None:
            if own and not self._data:
                self._data = chunk
            else:
                self._data += chunk

    def end(self, entry: dict, crc: int) -> str | None:
        """The stream is complete (``crc``: CRC-32 of its payload); returns why the
        stick cannot take it, or None."""
        r, data = self._request, self._data
        self._data = None
        if r is not None and self._tag == TAG_INPUT:
            r.crc = zlib.crc32(crc.to_bytes(4, "little"), r.crc)
        if r is None:
            found = self._catalog.match(data)
            if found is None:
                return (f"DWN1 test mode: {len(data)} bytes of instructions (CRC-32 "
                        f"{crc:#010x}) match no known executable, even ignoring "
                        f"the bits its FieldOffset entries link")
            r = self._request = _Request(*found)
            entry["executable"], entry["hint"] = r.number, r.known.steps[0].index
        else:
            step = r.known.steps[r.pos]
            if step.chunk is not None and not step.chunk.matches(data):
                return (f"DWN1 test mode: {r.label}, DMA hint {step.index}: the instructions "
                        f"differ from the chunk outside its FieldOffset bits")
            r.pos += 1
        self._advance(r)
        return None

    def _advance(self, r: _Request) -> None:
        steps = r.known.steps
        while r.pos < len(steps) and steps[r.pos].kind != "infeed":
            step = steps[r.pos]
            if step.kind == "outfeed":
                if step.size:
                    self._emit_output(step.placeholder(r.crc))
            else:
                self._emit_event(step.event_tag)
            r.pos += 1
        if r.pos < len(steps):
            return
        tag = steps[-1].event_tag if r.known.ends_with_interrupt else TAG_INTERRUPT0
        if not r.known.ends_with_interrupt:
            self._emit_event(TAG_INTERRUPT0)
        self._record("dwn1_request", executable=r.number, type=str(r.known.exe.type),
                     value=r.crc, tag=tag,
                     length=sum(s.size for s in steps if s.kind == "outfeed"))
        self._request = None
