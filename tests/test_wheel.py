"""``python -m build`` makes an sdist and a wheel, and the wheel works on its own.

The test copies the sources to a temporary folder (so the build writes nothing
into this checkout), builds both distributions with ``python -m build`` (the
wheel is built from the sdist, so a file missing from the sdist shows up here),
creates a new virtual environment, installs the wheel into it with pip (pip
downloads the dependencies), and runs ``coralrt demo`` from that environment in
a folder outside the repository.  It checks that ``coralrt`` is imported from
the environment, not from the source tree.

It needs the package index pip is configured for (PyPI): when a quick
``pip download`` of one small package fails, the test skips and says so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from conftest import REPO_ROOT

_IGNORE = shutil.ignore_patterns(".venv", ".git", "__pycache__", "build", "dist", "*.egg-info",
                                 ".pytest_cache", ".benchmarks", ".hypothesis")


def _env(cache: Path) -> dict:
    """The environment of the commands: no PYTHONPATH and no user site (nothing
    may reach the source tree), a compile cache of the test's own.  pip keeps
    its download cache, so a second run does not download the dependencies again."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CORALRT_CACHE")}
    env.update(CORALRT_CACHE_DIR=str(cache), PYTHONNOUSERSITE="1")
    return env


def _run(argv, *, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, (f"{' '.join(map(str, argv))} exited {proc.returncode}\n"
                                  f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
                                  f"{proc.stderr[-4000:]}")
    return proc


def _index_reachable(tmp: Path, env: dict) -> str | None:
    """None when pip can download from its index, else why not."""
    tmp.mkdir(exist_ok=True)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
             "--disable-pip-version-check", "--retries", "1", "--timeout", "20",
             "--dest", str(tmp), "pluggy"],
            cwd=tmp, env=env, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        return "`pip download pluggy` did not finish within 90 s"
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"`pip download pluggy` failed: {tail}"
    return None


def test_wheel_installs_into_a_fresh_venv_and_runs_the_demo(tmp_path):
    if importlib.util.find_spec("build") is None:
        pytest.fail("the `build` package is missing: it is in the dev extras "
                    "(pip install -e '.[dev]', or `make test` rebuilds .venv)")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = _env(tmp_path / "coralrt-cache")
    times = {}
    t = time.perf_counter()
    why = _index_reachable(tmp_path / "probe", env)
    if why is not None:
        pytest.skip(f"the package index is unreachable, so the wheel's dependencies cannot "
                    f"be installed: {why}")
    times["index probe"] = time.perf_counter() - t

    t = time.perf_counter()
    src = tmp_path / "src"
    shutil.copytree(REPO_ROOT, src, ignore=_IGNORE, symlinks=True)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--outdir", dist, src], cwd=tmp_path, env=env)
    times["build sdist + wheel"] = time.perf_counter() - t
    sdists = list(dist.glob("coralrt-*.tar.gz"))
    wheels = list(dist.glob("coralrt-*-py3-none-any.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in dist.iterdir())
    wheel = wheels[0]
    names = zipfile.ZipFile(wheel).namelist()
    assert "coralrt/py.typed" in names
    assert "coralrt/_cli/main.py" in names and "coralrt/_sim/stick/__init__.py" in names
    assert not any(n.startswith("tests/") for n in names), "the wheel must not ship the tests"
    # The CORALRT_COMPAT=1 start-up hook sits at the top of site-packages.
    assert "coralrt-compat.pth" in names and "_coralrt_compat.py" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "coralrt = coralrt._cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
    _check_platform_markers(wheel, names)

    t = time.perf_counter()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv], cwd=outside, env=env)
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "--disable-pip-version-check", wheel],
         cwd=outside, env=env, timeout=600)
    times["venv + pip install"] = time.perf_counter() - t

    t = time.perf_counter()
    where = _run([py, "-c", "import coralrt, sys; print(coralrt.__file__); "
                  "print(coralrt.__version__)"], cwd=outside, env=env).stdout.split()
    installed = Path(where[0]).resolve()
    assert installed.is_relative_to(venv.resolve()), f"coralrt imported from {installed}"
    assert not installed.is_relative_to(REPO_ROOT), installed
    assert (installed.parent / "py.typed").is_file()
    assert wheel.name.startswith(f"coralrt-{where[1]}-")

    coralrt_cmd = venv / "bin" / "coralrt"
    text = _run([coralrt_cmd, "demo", "--runs", "2"], cwd=outside, env=env).stdout
    assert "top-5 classes of the synthetic input" in text
    report = json.loads(_run([coralrt_cmd, "demo", "--runs", "2", "--json"],
                             cwd=outside, env=env).stdout)
    assert report["target"] == "sim"
    times["coralrt demo x2"] = time.perf_counter() - t

    t = time.perf_counter()
    _check_compat_hook(py, outside, env)
    times["CORALRT_COMPAT checks"] = time.perf_counter() - t
    print("wheel test times: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))


# The native wheels coralrt depends on only where they exist (pyproject.toml names the
# wheel tags): elsewhere the system's libusb and the 'numpy' CPU backend stand in.
_PLATFORM_MARKERS = {
    "ai-edge-litert": (
        "(sys_platform == 'linux' and (platform_machine == 'x86_64' "
        "or platform_machine == 'aarch64')) "
        "or (sys_platform == 'darwin' and platform_machine == 'arm64') "
        "or (sys_platform == 'win32' and platform_machine == 'AMD64')"),
    "libusb-package": (
        "(sys_platform == 'linux' and (platform_machine == 'x86_64' "
        "or platform_machine == 'aarch64')) "
        "or (sys_platform == 'darwin' and (platform_machine == 'x86_64' "
        "or platform_machine == 'arm64')) "
        "or (sys_platform == 'win32' and (platform_machine == 'AMD64' "
        "or platform_machine == 'x86'))"),
}


def _check_platform_markers(wheel: Path, names: list[str]) -> None:
    """The wheel's METADATA has a Requires-Dist line with exactly these markers for each
    native dependency, and no other dependency is conditional (extras aside)."""
    from email.parser import HeaderParser

    from packaging.markers import Marker
    from packaging.requirements import Requirement

    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    headers = HeaderParser().parsestr(zipfile.ZipFile(wheel).read(metadata).decode())
    reqs = [Requirement(line) for line in headers.get_all("Requires-Dist") or []]
    base = {r.name: r for r in reqs if r.marker is None or "extra" not in str(r.marker)}
    for name, marker in _PLATFORM_MARKERS.items():
        assert name in base, f"no Requires-Dist for {name}: {sorted(base)}"
        assert str(base[name].marker) == str(Marker(marker)), (name, str(base[name].marker))
    conditional = sorted(n for n, r in base.items() if r.marker is not None)
    assert conditional == sorted(_PLATFORM_MARKERS), conditional


_SPAWN = """\
import multiprocessing as mp

def child(queue):
    import pycoral.utils.edgetpu as e
    queue.put(e.__name__)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    print(queue.get(timeout=120))
    proc.join(60)
"""


def _check_compat_hook(py: Path, cwd: Path, env: dict) -> None:
    """In the installed venv, CORALRT_COMPAT=1 maps tflite_runtime and pycoral to coralrt
    (in spawned multiprocessing children too); without it the import fails as usual."""
    code = "import tflite_runtime.interpreter as t; print(t.__name__)"
    off = {k: v for k, v in env.items() if k != "CORALRT_COMPAT"}
    out = _run([py, "-c", code], cwd=cwd, env={**off, "CORALRT_COMPAT": "1"}).stdout
    assert out.strip() == "coralrt.tflite.interpreter"
    proc = subprocess.run([str(py), "-c", code], cwd=cwd, env=off, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ModuleNotFoundError: No module named 'tflite_runtime'" in proc.stderr, proc.stderr
    script = cwd / "spawner.py"
    script.write_text(_SPAWN)
    out = _run([py, script], cwd=cwd, env={**off, "CORALRT_COMPAT": "1"}).stdout
    assert out.strip() == "coralrt.pycoral.utils.edgetpu"


def _would_install(argv_prefix: list, wheel: Path, tmp: Path, env: dict) -> set[str]:
    """The distributions ``pip install <wheel>`` would install (a dry run, resolved
    for an empty x86-64 target, so what this venv holds does not matter)."""
    report = tmp / f"report-{len(argv_prefix)}.json"
    _run([*argv_prefix, sys.executable, "-m", "pip", "install", "--dry-run",
          "--disable-pip-version-check", "--ignore-installed", "--quiet", "--report", report,
          "--only-binary=:all:", "--platform", "manylinux_2_17_x86_64",
          "--target", tmp / "target", wheel], cwd=tmp, env=env)
    return {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}


@pytest.mark.skipif(shutil.which("linux32") is None or platform.machine() != "x86_64",
                    reason="needs linux32 (util-linux) on an x86-64 Linux kernel")
def test_pip_under_the_32_bit_personality_skips_the_native_wheels(tmp_path):
    """The Pi guide's command for a 32-bit OS on a 64-bit kernel, `linux32 pip install
    coralrt-*.whl`: pip itself evaluates the markers with the kernel's 32-bit machine
    name and leaves out ai-edge-litert and libusb-package.  Checked with the x86-64
    kernel's personality (i686); on an arm64 kernel it is armv8l, which the markers
    exclude the same way (tests/test_backend_choice.py)."""
    env = _env(tmp_path / "coralrt-cache")
    why = _index_reachable(tmp_path / "probe", env)
    if why is not None:
        pytest.skip(f"the package index is unreachable: {why}")
    src = tmp_path / "src"
    shutil.copytree(REPO_ROOT, src, ignore=_IGNORE, symlinks=True)
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", src],
         cwd=tmp_path, env=env)
    (wheel,) = (tmp_path / "dist").glob("coralrt-*-py3-none-any.whl")
    native = {"ai-edge-litert", "libusb-package"}
    plain = _would_install([], wheel, tmp_path, env)
    personality = _would_install(["linux32"], wheel, tmp_path, env)
    core = {"coralrt", "numpy", "pyusb", "pluggy", "flatbuffers", "filelock", "platformdirs"}
    assert native | core <= plain, plain
    # Only the native wheels (and what they alone pull in, e.g. LiteRT's tqdm) go.
    assert core <= personality <= plain and not personality & native, (plain, personality)
