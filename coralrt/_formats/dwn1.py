"""Edge TPU executables (DWN1) inside an ``edgetpu-custom-op``.

:func:`parse_package` reads an operator's ``custom_options`` (a FlexBuffer
map) in the three layouts edgetpu_compiler has produced:

* ``"current"``: keys 1, 4, 5, 6, 7; key 4 is a ``Package`` flatbuffer;
* ``"older"``: keys 1, 4, 5 only (no chip list);
* ``"oldest"``: keys 1, 2, 3, 4 where 4 (and 3, a separate parameter-caching
  executable) are bare ``Executable`` flatbuffers with no ``Package``.

It checks what libedgetpu checks when it registers a package
(``driver/package_registry.cc``: runtime version, multi-chip packages, the
allowed executable combinations, batch size >= 1) plus every index and size
the host driver later relies on, so a damaged package fails here with
:class:`~coralrt.errors.ExecutableError` instead of in the middle of a USB
transfer.  Parameters and instruction bitstreams are zero-copy memoryviews
into the caller's buffer.  The FlexBuffer, the Package and every Executable
draw from one :class:`~coralrt._model.flatbuf.DecodeBudget` sized by the
``custom_options`` bytes, so parsing stays linear in them however the offsets
inside repeat one table or one executable.  Field meanings:
``shared/reference/edgetpu-stack.md`` section 2.  Nothing here needs a device.

Enum values and union tags outside coralrt's schema (an executable type,
data type, layer kind, DMA hint type...) are not damage: they are kept as
:class:`UnknownEnum` numbers, logged once per field and value, listed in
``Package.unknown_values``, and refused by :func:`check_runnable` only where
a run needs them.  The executable itself is read in ``dwn1_executable.py``,
its layers in ``dwn1_layer.py``, the byte layout in ``dwn1_schema.py``.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field

from coralrt.errors import ExecutableError
from coralrt._model.flatbuf import DecodeBudget
from coralrt._formats.flexreader import FlexReader
from coralrt._formats.dwn1_executable import (
    DmaHint, Executable, FieldOffset, decode_table, read_executable, view,
)
from coralrt._formats.dwn1_layer import Layer, OutputLayout, TensorSlice
from coralrt._formats.dwn1_schema import (
    ENUMS, IDENTIFIER, UnknownEnum, UnknownValue, Unknowns, binary_strings,
)

__all__ = ["Package", "Executable", "DmaHint", "FieldOffset", "Layer", "OutputLayout",
           "TensorSlice", "UnknownEnum", "UnknownValue", "parse_package",
           "select_executables", "check_runnable", "describe", "RUNTIME_VERSION",
           "MIN_VALID_RUNTIME_VERSION"]

log = logging.getLogger("coralrt.usb")

RUNTIME_VERSION = 14  # libedgetpu api/runtime_version.h kCurrent (kCoralGrouperRelease)
MIN_VALID_RUNTIME_VERSION = 10  # below this libedgetpu only warns


@dataclass
class Package:
    """The contents of one ``edgetpu-custom-op``; ``layout`` names the custom_options form."""

    min_runtime_version: int
    compiler_version: str
    model_identifier: str
    executables: list[Executable]
    layout: str  # "current" | "older" | "oldest"
    keypair_version: int = 0
    virtual_chip_id: int = 0
    signature_bytes: int = 0
    custom_op_version: int = 0
    execution_preference: int | None = None
    chip_ids: list[int] | None = None  # key "6": libedgetpu's internal chip enum per package
    # Enum values outside coralrt's schema, one per field and value (each was logged).
    unknown_values: list[UnknownValue] = field(default_factory=list)


_TYPES = ("STAND_ALONE", "PARAMETER_CACHING", "EXECUTION_ONLY")
_ALLOWED = ({"STAND_ALONE"}, {"PARAMETER_CACHING"}, {"EXECUTION_ONLY"},
            {"PARAMETER_CACHING", "EXECUTION_ONLY"},
            {"PARAMETER_CACHING", "EXECUTION_ONLY", "STAND_ALONE"})


def _check_combination(executables: list[Executable]) -> None:
    types = [e.type for e in executables]
    if len(set(types)) != len(types):
        raise ExecutableError(f"multiple executables of the same type in the package: {types}")
    if any(isinstance(t, UnknownEnum) for t in types):
        return  # judged when the package is loaded (select_executables, check_runnable)
    if set(types) not in _ALLOWED:
        raise ExecutableError(f"invalid combination of executables in the package: {types}; "
                              f"libedgetpu accepts one executable, PARAMETER_CACHING + "
                              f"EXECUTION_ONLY, or those two + STAND_ALONE")


# ---------------------------------------------------------------------------
# public API


def parse_package(custom_options) -> Package:
    """Parse an ``edgetpu-custom-op``'s ``custom_options`` into a :class:`Package`.

    Accepts any bytes-like object; parameters and instruction chunks of the
    result are views into it (keep it alive and unchanged while they are used).
    Raises :class:`~coralrt.errors.ExecutableError` for every defect.  Enum
    values outside coralrt's schema are not defects here: they are kept as
    :class:`UnknownEnum` numbers, listed in ``Package.unknown_values`` and
    logged once per field and value; :func:`check_runnable` refuses those
    that matter to a run.
    """
    try:
        buf = memoryview(custom_options).cast("B")
    except TypeError as e:
        raise ExecutableError(f"custom_options must be bytes-like ({e})") from None
    unknowns = Unknowns()
    try:
        package = _parse(buf, DecodeBudget(len(buf)), unknowns)
    except (struct.error, IndexError, OverflowError, UnicodeDecodeError) as e:
        # The readers check bounds first; this is a last guard for the unforeseen.
        raise ExecutableError(f"malformed executable package ({type(e).__name__}: {e})") from None
    package.unknown_values = unknowns.values
    unknowns.warn()
    return package


def _parse(buf: memoryview, budget: DecodeBudget, unknowns: Unknowns) -> Package:
    # One budget for everything nested in ``buf``: the package and the
    # executables are slices of it, so a valid package spends a fraction of it.
    opts = FlexReader(buf, budget).root_map()
    blob = opts.get("4")
    if not isinstance(blob, memoryview):
        raise ExecutableError("custom_options has no serialized executable under key \"4\"",
                              where="custom_options")
    version = opts.get("1", 0)
    preference = opts.get("5")
    common = dict(custom_op_version=version if isinstance(version, int) else 0,
                  execution_preference=preference if isinstance(preference, int) else None)
    if blob[4:8] != IDENTIFIER and ("2" in opts or "3" in opts):
        return _oldest(opts, blob, common, budget, unknowns)
    chips = opts.get("6")
    layout = "older" if chips is None else "current"
    if chips is not None:
        extra = opts.get("7") or []
        if not isinstance(chips, list) or not chips or not all(isinstance(c, int) for c in chips):
            raise ExecutableError("key \"6\" (chip per package) is not a non-empty list of "
                                  "integers", where="custom_options")
        if not isinstance(extra, list) or len(chips) != len(extra) + 1:
            raise ExecutableError(f"key \"6\" lists {len(chips)} chips but there are "
                                  f"{1 + len(extra) if isinstance(extra, list) else '?'} "
                                  f"packages", where="custom_options")
        if extra:
            raise ExecutableError(f"the custom op carries {len(chips)} packages (key \"7\"); "
                                  f"like libedgetpu's direct runtime, only one is supported",
                                  where="custom_options")
    if blob[4:8] != IDENTIFIER:
        log.warning("package file identifier %r is not %r", bytes(blob[4:8]), IDENTIFIER)
    pkg = decode_table(blob, "Package", "package", budget)
    mrv = pkg.get("min_runtime_version", 0)
    if mrv > RUNTIME_VERSION:
        raise ExecutableError(f"package requires runtime version {mrv}, which is newer than "
                              f"this runtime's version {RUNTIME_VERSION}", where="package")
    if mrv < MIN_VALID_RUNTIME_VERSION:
        log.warning("package minimum runtime version %d is lower than expected (%d)", mrv,
                    MIN_VALID_RUNTIME_VERSION)
    if pkg.get("virtual_chip_id", 0) == -1:
        raise ExecutableError("this is a multi-chip package, which is not supported",
                              where="package")
    multi = view(pkg.get("serialized_multi_executable"))
    if not len(multi):
        raise ExecutableError("no executables to register (empty multi-executable)",
                              where="package")
    blobs = binary_strings(multi, "package.multi_executable", budget)
    if not blobs:
        raise ExecutableError("no executables provided", where="package.multi_executable")
    if len(blobs) > len(_TYPES):
        # _check_combination refuses these anyway (a type repeats); say so
        # before decoding them.
        raise ExecutableError(f"the package holds {len(blobs)} executables; libedgetpu "
                              f"accepts at most one of each of the {len(_TYPES)} types",
                              where="package.multi_executable")
    exes = [read_executable(b, f"executable {i}", budget, unknowns)
            for i, b in enumerate(blobs)]
    _check_combination(exes)
    signature = pkg.get("signature")
    return Package(
        min_runtime_version=mrv, compiler_version=pkg.get("compiler_version") or "",
        model_identifier=pkg.get("model_identifier") or "", executables=exes, layout=layout,
        keypair_version=pkg.get("keypair_version", 0),
        virtual_chip_id=pkg.get("virtual_chip_id", 0),
        signature_bytes=0 if signature is None else len(signature), chip_ids=chips, **common)


def _oldest(opts: dict, blob: memoryview, common: dict, budget: DecodeBudget,
            unknowns: Unknowns) -> Package:
    # Bare executables, no Package.  Key "3" held the parameter-caching half:
    # libedgetpu now ignores it, but the main executable then lacks its
    # parameters, so keep the pair (the main one runs as EXECUTION_ONLY).
    main = read_executable(blob, "executable 0", budget, unknowns)
    exes = [main]
    pc_blob = opts.get("3")
    if isinstance(pc_blob, memoryview) and len(pc_blob):
        pc = read_executable(pc_blob, "executable 1", budget, unknowns)
        if pc.type == "STAND_ALONE":
            pc.type = "PARAMETER_CACHING"
        if main.type == "STAND_ALONE":
            main.type = "EXECUTION_ONLY"
        exes.append(pc)
    _check_combination(exes)
    chip = opts.get("2")
    if isinstance(chip, memoryview):
        name = bytes(chip).decode("utf-8", "replace")
        for e in exes:
            e.chip = e.chip or name
    return Package(min_runtime_version=0, compiler_version="", model_identifier="",
                   executables=exes, layout="oldest", **common)


def select_executables(package: Package) -> tuple[Executable | None, Executable]:
    """(parameter-caching executable or None, executable to run), as libedgetpu picks them.

    One executable: it runs whatever its type says.  Two: PARAMETER_CACHING
    then EXECUTION_ONLY.  Three: the STAND_ALONE one, with no caching.  With
    several executables, one whose type coralrt does not know leaves the
    choice open: :class:`~coralrt.errors.ExecutableError`.
    """
    exes = package.executables
    if exes:
        _check_combination(exes)
    if len(exes) == 1:
        return None, exes[0]
    for i, e in enumerate(exes):
        if isinstance(e.type, UnknownEnum):
            raise ExecutableError(
                f"executable type {int(e.type)} is not one coralrt knows ({', '.join(_TYPES)}), "
                f"so which of the package's {len(exes)} executables runs cannot be decided",
                where=f"executable {i}")
    by_type = {e.type: e for e in exes}
    if len(exes) == 2:
        return by_type["PARAMETER_CACHING"], by_type["EXECUTION_ONLY"]
    if len(exes) == 3:
        return None, by_type["STAND_ALONE"]
    raise ExecutableError("the package has no executables")


def _known(value) -> bool:
    return not isinstance(value, UnknownEnum)


def check_runnable(package: Package, executables) -> None:
    """Refuse ``executables`` (of ``package``; None entries skipped) when a value a run needs
    is outside coralrt's schema.

    Needed: the executable type (when to run it), each input's and output's
    data type (the size and conversion of the bytes the host sends and
    receives), each output's layer kind (its OutputLayer gives the layout),
    and every DMA hint's type, target, direction and interrupt (the transfer
    order the host follows).  Field offsets are not used by a USB host, so
    unknown values there do not matter.  Raises
    :class:`~coralrt.errors.ExecutableError` naming the field and the value.
    """
    for e in executables:
        if e is None:
            continue
        i = next(n for n, x in enumerate(package.executables) if x is e)
        where = f"executable {i}"
        if not _known(e.type):
            raise ExecutableError(f"executable type {int(e.type)} is not one coralrt knows "
                                  f"({', '.join(_TYPES)}); it cannot schedule this executable",
                                  where=where)
        for role, layers in (("input", e.inputs), ("output", e.outputs)):
            for layer in layers:
                w = f"{where}, {role} layer {layer.name!r}"
                if not _known(layer.data_type):
                    raise ExecutableError(
                        f"data type {int(layer.data_type)} is not one coralrt knows "
                        f"({', '.join(ENUMS['DataType'].values())}); it cannot size or "
                        f"convert the tensor's bytes", where=w)
                if role == "output" and not _known(layer.kind):
                    raise ExecutableError(
                        f"layer kind {int(layer.kind)} is not one coralrt knows (OutputLayer); "
                        f"it cannot tell where the device puts the output's bytes", where=w)
        for j, h in enumerate(e.dma_hints):
            for what, value in (("DMA hint type" if getattr(h.kind, "enum", "") == "AnyHint"
                                 else "DMA descriptor target", h.kind),
                                ("DMA direction", h.direction), ("interrupt type", h.interrupt)):
                if isinstance(value, UnknownEnum):
                    raise ExecutableError(
                        f"{what} {int(value)} is not one coralrt knows; it cannot follow the "
                        f"executable's transfer order", where=f"{where}, dma hint {j}")


def _layer_dict(layer: Layer) -> dict:
    return {"name": layer.name, "shape": list(layer.shape), "dtype": layer.dtype,
            "zero_point": layer.zero_point, "scale": layer.scale,
            "size_bytes": layer.size_bytes, "data_type": layer.data_type}


def describe(package: Package) -> dict:
    """A JSON-ready summary of the package (``coralrt inspect --json``, key "edgetpu").

    Values outside coralrt's schema appear as numbers (``UnknownEnum`` is an
    int), and ``unknown_values`` lists them with the first place each was met.
    """
    try:
        pc, main = select_executables(package)
    except ExecutableError:     # an executable type coralrt does not know
        pc = main = None
    exes = []
    for e in package.executables:
        kinds: dict[str, int] = {}
        for h in e.dma_hints:
            kinds[str(h.kind)] = kinds.get(str(h.kind), 0) + 1
        role = "run" if e is main else ("cache" if e is pc else
                                        "unused" if main is not None else "unknown")
        exes.append({
            "type": e.type, "role": role,
            "batch_size": e.batch_size, "chip": e.chip, "caching_token": e.caching_token,
            "parameters_bytes": e.parameters_bytes, "instruction_bytes": e.instruction_bytes,
            "instruction_chunks": [len(c) for c in e.instructions],
            "scratch_bytes": e.scratch_size_bytes, "estimated_cycles": e.estimated_cycles,
            "fully_deterministic": e.fully_deterministic, "dma_hints": kinds,
            "layer_format": e.layer_format,
            "inputs": [_layer_dict(x) for x in e.inputs],
            "outputs": [_layer_dict(x) for x in e.outputs],
        })
    return {"layout": package.layout, "min_runtime_version": package.min_runtime_version,
            "compiler_version": package.compiler_version,
            "model_identifier": package.model_identifier, "executables": exes,
            "unknown_values": [{"field": v.field, "value": v.value, "where": v.where,
                                "count": v.count, "message": str(v)}
                               for v in package.unknown_values]}
