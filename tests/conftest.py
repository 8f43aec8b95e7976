"""Shared test helpers: where the third-party test models live.

The models are not part of this repository: they sit in ``shared/models``
next to the repository root (the same layout in CI). Tests that need them
skip with an explicit reason only when that folder is absent.

Without LiteRT (``ai-edge-litert`` uninstalled, as on boards it has no wheels
for; ``make test-nolitert`` builds such a venv), the test modules that compare
against LiteRT or drive it directly skip with that reason, and the rest run
with coralrt's NumPy backend.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

#: LiteRT is installed (the yardstick of most tests).
HAVE_LITERT = importlib.util.find_spec("ai_edge_litert") is not None
NO_LITERT_REASON = "ai-edge-litert is not installed: this module compares against LiteRT"
# What marks a test module as needing LiteRT itself (not only a CPU backend).
_LITERT_WORDS = ("run_litert", "ai_edge_litert", "litert(", "harness import", "BUILTIN_REF", "cpu_kernels=\"reference\"",
                 'backend="litert"', "LiteRTBackend")


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_litert: the test checks LiteRT's own output "
                            "(its backend name, log lines or kernels); skipped without it")


def pytest_collection_modifyitems(config, items):
    if HAVE_LITERT:
        return
    needs: dict[str, bool] = {}
    for item in items:
        if item.get_closest_marker("needs_litert"):
            item.add_marker(pytest.mark.skip(reason=NO_LITERT_REASON))
            continue
        path = str(item.fspath)
        if path not in needs:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            needs[path] = any(word in text for word in _LITERT_WORDS)
        if needs[path]:
            item.add_marker(pytest.mark.skip(reason=NO_LITERT_REASON))

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO_ROOT.parent / "shared" / "models"
MISSING_REASON = f"test models folder {MODELS_DIR} is absent"


def shared_model(name: str) -> Path:
    """Path of ``name`` (relative to ``shared/models``); skips when the folder is absent.

    A missing file inside a present folder is an error, not a skip.
    """
    if not MODELS_DIR.is_dir():
        pytest.skip(MISSING_REASON)
    path = MODELS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"test model {name!r} not found in {MODELS_DIR}")
    return path


def model_params(names: list[str]) -> list:
    """``pytest.param`` per name, or one skipped param when the models are absent.

    Keeps a missing folder visible as a skip instead of a test that
    silently collects nothing.
    """
    if not MODELS_DIR.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=MISSING_REASON))]
    return [pytest.param(n, id=n) for n in names]


@pytest.fixture
def models_dir() -> Path:
    if not MODELS_DIR.is_dir():
        pytest.skip(MISSING_REASON)
    return MODELS_DIR


def shared_model_names(*, compiled: bool | None = None) -> list[str]:
    """Every valid ``.tflite`` under ``shared/models`` (``invalid/`` excluded), as params.

    ``compiled`` True/False keeps only the edgetpu_compiler outputs / only the
    plain models.  Found by listing the folder, so new files are tested too.
    """
    if not MODELS_DIR.is_dir():
        return model_params([])
    names = sorted(
        str(p.relative_to(MODELS_DIR)) for p in MODELS_DIR.rglob("*.tflite")
        if p.parent.name != "invalid"
    )
    if compiled is not None:
        names = [n for n in names if n.endswith("_edgetpu.tflite") == compiled]
    return model_params(names)


EXTRA_MODELS_ENV = "CORALRT_EXTRA_MODELS"


def extra_model_paths(*, compiled: bool | None = None) -> list:
    """``pytest.param`` per real model in the folders named by ``CORALRT_EXTRA_MODELS``.

    The variable lists folders (``os.pathsep``-separated) of further real
    models, such as a checkout of Coral's public test data; they are searched
    recursively.  Unset, this is one skipped param that says how to enable it,
    so the real-model checks stay visible in every run.
    """
    import os

    folders = [Path(f) for f in os.environ.get(EXTRA_MODELS_ENV, "").split(os.pathsep) if f]
    if not folders:
        reason = f"{EXTRA_MODELS_ENV} is not set (folders of further real .tflite models)"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
    paths = sorted(p for f in folders for p in f.rglob("*.tflite"))
    if compiled is not None:
        paths = [p for p in paths if p.name.endswith("_edgetpu.tflite") == compiled]
    return [pytest.param(p, id=str(p.name)) for p in paths]


def run_litert(model_bytes: bytes, inputs: list, kernels: str = "optimized") -> list:
    """Run ``model_bytes`` directly in the LiteRT interpreter (the yardstick).

    ``kernels``: "optimized" (the default kernels, XNNPACK delegate included),
    "reference" (``BUILTIN_REF``) or "builtin" (the builtin kernels without
    the default delegates).
    """
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    resolver = {"reference": OpResolverType.BUILTIN_REF,
                "builtin": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}.get(
                    kernels, OpResolverType.AUTO)
    interp = Interpreter(model_content=model_bytes, experimental_op_resolver_type=resolver)
    interp.allocate_tensors()
    for detail, value in zip(interp.get_input_details(), inputs):
        interp.set_tensor(detail["index"], value)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def litert(path_or_bytes):
    """LiteRT's own Interpreter for a path or the model's bytes, tensors allocated."""
    from ai_edge_litert.interpreter import Interpreter
    if isinstance(path_or_bytes, (bytes, bytearray)):
        interp = Interpreter(model_content=bytes(path_or_bytes))
    else:
        interp = Interpreter(model_path=str(path_or_bytes))
    interp.allocate_tensors()
    return interp


def random_inputs(tensors, seed: int = 0) -> list:
    """Deterministic random data for a list of coralrt ``Tensor``/``TensorInfo``s."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for t in tensors:
        dt = np.dtype(t.dtype)
        if dt.kind in "iu":
            info = np.iinfo(dt)
            out.append(rng.integers(info.min, info.max, t.shape, endpoint=True).astype(dt))
        elif dt.kind == "b":
            out.append(rng.integers(0, 2, t.shape).astype(bool))
        else:
            out.append(rng.standard_normal(t.shape).astype(dt))
    return out


@pytest.fixture(autouse=True)
def _private_compile_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own compile cache, never the user's."""
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.delenv("CORALRT_CACHE", raising=False)


IMAGES_DIR = REPO_ROOT.parent / "shared" / "images"


def shared_image(name: str) -> Path:
    """Path of ``name`` in ``shared/images`` (test images, label files); skips when the
    folder is absent.  A missing file inside a present folder is an error, not a skip."""
    if not IMAGES_DIR.is_dir():
        pytest.skip(f"test images folder {IMAGES_DIR} is absent")
    path = IMAGES_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"test image {name!r} not found in {IMAGES_DIR}")
    return path
