"""Models that were already compiled for an Edge TPU, and where their plain model is.

Two compilers leave device programs inside a ``.tflite``, one program format
each (:data:`coralrt._formats.opnames.FORMATS`): edgetpu_compiler
(``edgetpu-custom-op``, runs only on a Coral stick) and coralrt's native
compiler (``coralrt-segment``, runs on the simulated Edge TPU).  Neither kind
runs on the CPU backend, and neither can be compiled again.  edgetpu_compiler
writes ``X_edgetpu.tflite`` next to ``X.tflite``; CI jobs often hold only the
compiled file's name, so :func:`plain_sibling` finds the plain model beside it,
or in the folders of ``CORALRT_PLAIN_MODELS``.  A compiled model given as bytes
is recognised by content: an ``X_edgetpu.tflite`` of the same bytes in one of
those folders names its plain model (only files of the same size are read).

A compiled model that coralrt itself extended (``coralrt.pycoral.learn``
appending a trained layer to a compiled embedding extractor) carries its plain
twin, the same layers on the plain extractor, as the metadata entry
:data:`PLAIN_TWIN`; the host runs that twin when no plain file is found
(:func:`host_model`).  A stick ignores the entry.

Every refusal of a compiled model is worded here, so the CLI, the compiler
and the session targets say the same thing.
"""

from __future__ import annotations

import os
import json
from pathlib import Path

import numpy as np

from coralrt import _config as config
from coralrt.errors import ModelError
from coralrt._formats.opnames import DWN1, SEGMENT
from coralrt._model.types import Buffer, Metadata

__all__ = ["compiled_by", "expected_plain", "plain_sibling", "not_on_host", "not_recompilable",
           "refuse_compiled", "PLAIN_TWIN", "plain_twin", "with_plain_twin", "host_model",
           "AlreadyCompiled", "ORIGIN_METADATA", "operator_origin", "with_operator_origin"]

#: The metadata entry of a compiled model holding its plain twin (a whole .tflite).
PLAIN_TWIN = "coralrt_plain_twin"

_SUFFIX = "_edgetpu.tflite"


# A model holding programs of both formats is edgetpu_compiler's: it needs a real stick.
_PRECEDENCE = (DWN1, SEGMENT)


def compiled_by(model) -> str | None:
    """``"edgetpu_compiler"``, ``"coralrt"`` or ``None`` (a plain model): the
    ``compiler`` of the program format whose operator the model holds."""
    names = {op.opcode.custom_code for sg in model.subgraphs for op in sg.operators}
    for fmt in _PRECEDENCE:
        if fmt.op_name in names:
            return fmt.compiler
    return None


def expected_plain(source) -> Path | None:
    """Where the plain model of ``source`` would be: ``X.tflite`` beside a path
    named ``X_edgetpu.tflite``; ``None`` for bytes, Models and other names."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    path = Path(source)
    if not path.name.endswith(_SUFFIX) or len(path.name) == len(_SUFFIX):
        return None
    return path.with_name(path.name[: -len(_SUFFIX)] + ".tflite")


def _candidates(source) -> list[Path]:
    """Where the plain model of ``source`` may be, in the order looked at."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        named = _same_bytes(source)
        return _candidates(named) if named is not None else []
    path = expected_plain(source)
    if path is None:
        return []
    return [path] + [folder / path.name for folder in config.plain_model_dirs()]


def _same_bytes(data) -> Path | None:
    """An ``X_edgetpu.tflite`` in a ``CORALRT_PLAIN_MODELS`` folder holding ``data``."""
    data = memoryview(data).cast("B")
    for folder in config.plain_model_dirs():
        try:
            entries = sorted(folder.glob("*" + _SUFFIX))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat().st_size == data.nbytes and entry.read_bytes() == data:
                    return entry
            except OSError:
                continue
    return None


def plain_sibling(source) -> Path | None:
    """The plain model of an edgetpu_compiler output (a path, or its bytes), when
    one exists: beside the file, else in a ``CORALRT_PLAIN_MODELS`` folder."""
    for path in _candidates(source):
        if path.is_file():
            return path
    return None


def plain_twin(model) -> bytes | None:
    """The plain twin a compiled ``model`` carries (:data:`PLAIN_TWIN`), or None."""
    for entry in model.metadata:
        if entry.name == PLAIN_TWIN and entry.buffer.nbytes:
            return entry.buffer.data.tobytes()
    return None


def with_plain_twin(compiled, plain):
    """``compiled`` (changed in place, and returned) carrying ``plain`` as its twin."""
    data = np.frombuffer(plain.to_bytes(), np.uint8)
    compiled.metadata = [m for m in compiled.metadata if m.name != PLAIN_TWIN] + \
        [Metadata(PLAIN_TWIN, Buffer(data))]
    return compiled


def host_model(source, model):
    """What the host runs in place of the edgetpu_compiler output ``model`` (read
    from ``source``): its plain file (:func:`plain_sibling`), else the plain twin
    it carries (bytes), else None."""
    path = plain_sibling(source)
    return path if path is not None else plain_twin(model)


def _looked_at(source) -> str:
    folders = config.plain_model_dirs()
    where = (f"the folders of {config.PLAIN_MODELS} ({', '.join(map(str, folders))})"
             if folders else f"{config.PLAIN_MODELS} (not set; it names folders of plain "
                             f"models, separated by {os.pathsep!r})")
    if isinstance(source, (bytes, bytearray, memoryview)):
        named = _same_bytes(source)
        if named is None:
            return (f"it was given as bytes, and no *{_SUFFIX} with the same bytes is in "
                    f"{where}; give its path, or the plain model")
        source = named
    plain = expected_plain(source)
    if plain is None:
        return "give the plain, uncompiled .tflite instead"
    return (f"give the plain model instead; looked for {plain.name} beside this file "
            f"({plain}) and in {where}: none exists")


def not_on_host(model, source, *, no_stick: bool = False) -> str:
    """Why the host (the ``cpu`` target, or ``sim`` for edgetpu_compiler
    outputs) cannot run the compiled ``model``, and what does."""
    if compiled_by(model) == "coralrt":
        return ("this model was compiled by coralrt (it contains coralrt-segment operators), "
                "whose programs run on the simulated Edge TPU: use target='sim', or give the "
                "plain, uncompiled .tflite for target='cpu'")
    head = ("this model was compiled by edgetpu_compiler (it contains edgetpu-custom-op): its "
            "Edge TPU program runs only on a Coral USB Accelerator (target='coral')")
    if no_stick:
        head += ", and no Coral USB Accelerator was found"
    return f"{head}. The plain model runs anywhere (target='cpu' or 'sim'): {_looked_at(source)}"


class AlreadyCompiled(ModelError):
    """A compiler was given a model edgetpu_compiler already compiled (``model``).

    A session target that compiles catches it and words the refusal as the
    ``cpu`` target does (:func:`not_on_host`): a file whose name does not end
    in ``_edgetpu.tflite`` is found to be compiled only once it is read."""

    def __init__(self, model):
        super().__init__(not_recompilable(model))
        self.model = model

    def __reduce__(self):   # the model stays behind when pickled
        return (ModelError, (self.message,))


def refuse_compiled(model, where: str | None = None) -> None:
    """Raise :class:`ModelError` when ``model`` cannot be partitioned or compiled."""
    refusal = not_recompilable(model)
    if refusal:
        raise ModelError(refusal, where=where)


def not_recompilable(model) -> str | None:
    """Why ``model`` cannot be partitioned or compiled, or ``None`` when it can."""
    by = compiled_by(model)
    if by == "edgetpu_compiler":
        return ("this model was already compiled by edgetpu_compiler (it contains "
                "edgetpu-custom-op); its Edge TPU programs only run with target='coral'. "
                "Partition or compile the plain .tflite instead")
    if by == "coralrt":
        return ("this model was already compiled by coralrt (it contains coralrt-segment "
                "operators); it runs with target='sim'. Partition or compile the plain "
                ".tflite instead")
    return None


# -- where a compiled model's operators came from ----------------------------------------

#: The metadata entry in which coralrt's compiler records, per operator of the
#: compiled model, the index of that operator in the model it was given (JSON:
#: a list of integers, null for an Edge TPU segment's operator).  Messages
#: about a CPU operator of a compiled model name it by that index.
ORIGIN_METADATA = "coralrt_operator_origin"


def operator_origin(model) -> list[int | None] | None:
    """Per operator of ``model``, its index in the model the compiler was given,
    or None when ``model`` records none (or a malformed one)."""
    for m in model.metadata:
        if m.name != ORIGIN_METADATA:
            continue
        try:
            origin = json.loads(bytes(m.buffer.data).decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None
        n = len(model.main.operators)
        if isinstance(origin, list) and len(origin) == n and all(
                o is None or (type(o) is int and o >= 0) for o in origin):
            return origin
        return None
    return None


def with_operator_origin(metadata: list, origin: list) -> list:
    """``metadata`` with the origin entry set to ``origin`` (see :data:`ORIGIN_METADATA`)."""
    raw = np.frombuffer(json.dumps(origin, separators=(",", ":")).encode(), np.uint8)
    return [m for m in metadata if m.name != ORIGIN_METADATA] + [
        Metadata(ORIGIN_METADATA, Buffer(raw))]
