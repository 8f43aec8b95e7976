"""Shared test helpers: where the third-party test models live.

The models are not part of this repository: they sit in ``shared/models``
next to the repository root (the same layout in CI). Tests that need them
skip with an explicit reason only when that folder is absent.

Without LiteRT (``ai-edge-litert`` uninstalled, as on boards it has no wheels
for; ``make test-nolitert`` builds such a venv), every test runs with
coralrt's NumPy backend; a test skips only when it uses LiteRT as its
yardstick (its own code imports ``ai_edge_litert``), asks for a LiteRT backend
by name, or is marked ``needs_litert`` because it checks LiteRT's own output.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

#: LiteRT is installed (the yardstick of most tests).
HAVE_LITERT = importlib.util.find_spec("ai_edge_litert") is not None
NO_LITERT_REASON = "ai-edge-litert is not installed: this test checks LiteRT's own output"
_TESTS_DIR = str(Path(__file__).resolve().parent)


def litert_module():
    """``ai_edge_litert.interpreter``, the yardstick module; skips the test without it.

    A skip, not an ImportError: a Hypothesis test re-raises it at once instead
    of shrinking a failure that every example would repeat.
    """
    return pytest.importorskip("ai_edge_litert.interpreter",
                               reason="ai-edge-litert is not installed: the test compares "
                                      "against LiteRT")


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_litert(why): the test checks LiteRT's own output "
                            "(its backend name, log lines or kernels) or something the numpy "
                            "backend does not do (why); skipped without LiteRT")


def pytest_collection_modifyitems(config, items):
    if HAVE_LITERT:
        return
    for item in items:
        mark = item.get_closest_marker("needs_litert")
        if mark:
            why = f"ai-edge-litert is not installed: {mark.args[0]}" if mark.args \
                else NO_LITERT_REASON
            item.add_marker(pytest.mark.skip(reason=why))


def _needs_litert(excinfo) -> str | None:
    """Why a failure only means "LiteRT is absent", or None for a real failure.

    Two cases, both narrow on purpose so that a coralrt bug is never hidden:
    the test's own code (a frame under tests/) imported ``ai_edge_litert`` to
    use LiteRT as the yardstick, or the test asked for a LiteRT backend by name
    and coralrt answered with BackendUnavailableError. An ``ai_edge_litert``
    import failing inside coralrt itself stays a failure: with the NumPy
    backend installed, coralrt must not need LiteRT anywhere.
    """
    from coralrt.errors import BackendUnavailableError

    exc = excinfo.value
    if isinstance(exc, BackendUnavailableError) and str(exc).startswith(
            ("CPU backend 'litert' ", "CPU backend 'tflite_runtime' ")):
        return f"ai-edge-litert is not installed: the test asks for a LiteRT backend ({exc})"
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "ai_edge_litert":
        importer = None
        for entry in excinfo.traceback:
            path = str(entry.path)
            if "importlib" in path or "<frozen" in path:
                continue
            importer = path
        if importer and importer.startswith(_TESTS_DIR):
            return "ai-edge-litert is not installed: the test compares against LiteRT"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if not HAVE_LITERT and report.failed and call.excinfo is not None:
        reason = _needs_litert(call.excinfo)
        if reason:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")
    return report

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


def model_params(names: list, width: int = 1) -> list:
    """``pytest.param`` per name, or one skipped param when the models are absent.

    Keeps a missing folder visible as a skip instead of a test that
    silently collects nothing.  ``width``: the number of values each param
    has (a parametrize over two names gets a skipped pair).
    """
    if not MODELS_DIR.is_dir():
        return [pytest.param(*[None] * width, marks=pytest.mark.skip(reason=MISSING_REASON))]
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
    Interpreter, OpResolverType = litert_module().Interpreter, litert_module().OpResolverType
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
    Interpreter = litert_module().Interpreter
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
