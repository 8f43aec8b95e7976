"""The public test models the self-test runs, pinned by SHA-256.

They are Coral's compiled classifiers (and their plain counterparts) from
https://github.com/google-coral/test_data, Apache-2.0; coralrt does not ship
them.  ``coralrt selftest --models DIR`` takes them from a folder (``DIR/name``
or ``DIR/edgetpu/name``); ``--download`` fetches the missing ones into the user
cache folder and keeps a file only when its SHA-256 is the pinned one.
"""

from __future__ import annotations

import hashlib
import logging
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from coralrt.errors import CoralRTError
from coralrt._fileio import atomic_write

__all__ = ["TestModel", "MODELS", "PINS", "BASE_URL", "ModelDownloadError", "models_cache_dir",
           "find_model", "download_model", "resolve_models"]

log = logging.getLogger("coralrt.selftest")

BASE_URL = "https://github.com/google-coral/test_data/raw/master/"
_MAX_DOWNLOAD = 64 << 20

#: SHA-256 of the files Coral publishes in google-coral/test_data (master).
PINS: dict[str, str] = {
    "mobilenet_v1_0.25_128_quant_edgetpu.tflite":
        "a4cb1e493346542248687939fbd7421ab92d74c58b1f0a0018b8f1bdddfcef7e",
    "mobilenet_v1_0.25_128_quant.tflite":
        "cb273c23ee76374b05b9583177e28aa19744858a7679c56a250e83d0333da785",
    "mobilenet_v1_0.75_192_quant_edgetpu.tflite":
        "ead897a0aa6d184fc1b4149e85aede5c2eb4b4c5644424c71c651f19f5761b33",
    "mobilenet_v1_0.75_192_quant.tflite":
        "41daeb22fdcf947e0e5ec32373aa9df7c31f3ef45dbd0ef7b5940fbce3c20f6a",
}


@dataclass(frozen=True)
class TestModel:
    compiled: str       # the edgetpu_compiler output the stick runs
    plain: str          # the same model before compiling (the CPU reference)

    __test__ = False    # not a pytest class, whatever its name


MODELS: tuple[TestModel, ...] = (
    TestModel("mobilenet_v1_0.25_128_quant_edgetpu.tflite", "mobilenet_v1_0.25_128_quant.tflite"),
    TestModel("mobilenet_v1_0.75_192_quant_edgetpu.tflite", "mobilenet_v1_0.75_192_quant.tflite"),
)


class ModelDownloadError(CoralRTError, OSError):
    """A test model could not be downloaded, or its SHA-256 is not the pinned one."""


def models_cache_dir() -> Path:
    """``<coralrt cache folder>/selftest-models`` (:func:`coralrt._config.cache_dir`:
    ``CORALRT_CACHE_DIR`` or the user cache folder)."""
    from coralrt import _config as config
    return config.cache_dir() / "selftest-models"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_model(name: str, folders) -> Path | None:
    """``name`` in the first of ``folders`` that has it (``F/name`` or ``F/edgetpu/name``)."""
    for folder in folders:
        if folder is None:
            continue
        for path in (Path(folder) / name, Path(folder) / "edgetpu" / name):
            if path.is_file():
                return path
    return None


def _fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - fixed https URL
            data = resp.read(_MAX_DOWNLOAD + 1)
    except OSError as e:
        raise ModelDownloadError(f"could not download {url}: {e}") from e
    if len(data) > _MAX_DOWNLOAD:
        raise ModelDownloadError(f"{url} is larger than {_MAX_DOWNLOAD} bytes: not a test model")
    return data


def download_model(name: str, dest: Path | None = None, *, base_url: str = BASE_URL,
                   pins: dict[str, str] | None = None, fetch=_fetch) -> Path:
    """``name`` in ``dest`` (default :func:`models_cache_dir`), downloaded if it is not
    there with its pinned SHA-256.  A download whose SHA-256 differs is refused
    (:class:`ModelDownloadError`) and not kept; a cached copy that differs is
    downloaded again."""
    pins = PINS if pins is None else pins
    if name not in pins:
        raise ModelDownloadError(f"{name} has no pinned SHA-256; coralrt downloads only "
                                 f"{', '.join(sorted(pins))}")
    dest = models_cache_dir() if dest is None else Path(dest)
    target = dest / name
    if target.is_file():
        if sha256_of(target) == pins[name]:
            return target
        log.warning("%s: cached copy has the wrong SHA-256; downloading it again", target)
    url = base_url + name
    data = fetch(url)
    digest = hashlib.sha256(data).hexdigest()
    if digest != pins[name]:
        raise ModelDownloadError(f"{url}: SHA-256 {digest} ({len(data)} bytes) is not the "
                                 f"pinned {pins[name]}; the file was not kept")
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write(target, data)
    log.info("downloaded %s into %s", name, dest)
    return target


def resolve_models(models_dir=None, *, download: bool = False, models=MODELS,
                   base_url: str = BASE_URL, fetch=_fetch) -> list[dict]:
    """For each test model: the paths found (None when absent) and why not.

    Looks in ``models_dir`` when given, otherwise in the download folder;
    ``download`` fetches what is missing there.  Each entry: ``model`` (the
    :class:`TestModel`), ``compiled``/``plain`` (Path or None), ``problem``
    (a sentence when the compiled model is missing), ``pinned`` (whether the
    compiled file's SHA-256 is the published one).
    """
    cache = models_cache_dir()
    folders = [models_dir] if models_dir is not None else [cache]
    out = []
    for m in models:
        entry = {"model": m, "compiled": None, "plain": None, "problem": None,
                 "pinned": None}
        for key, name in (("compiled", m.compiled), ("plain", m.plain)):
            path = find_model(name, folders)
            if path is None and download:
                try:
                    path = download_model(name, cache, base_url=base_url, fetch=fetch)
                except ModelDownloadError as e:
                    if key == "compiled":
                        entry["problem"] = str(e)
            entry[key] = path
        if entry["compiled"] is None and entry["problem"] is None:
            where = (f"not in {models_dir}" if models_dir is not None
                     else f"not downloaded yet ({cache})")
            entry["problem"] = (f"{m.compiled} is {where}; run with --download, or "
                                f"--models DIR with a folder that has it")
        if entry["compiled"] is not None:
            entry["pinned"] = sha256_of(entry["compiled"]) == PINS.get(m.compiled)
        out.append(entry)
    return out
