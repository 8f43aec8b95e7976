"""A site folder holding coralrt's start-up hook, for child Pythons of the tests.

The two files the wheel puts in site-packages (``coralrt-compat.pth`` and
``_coralrt_compat.py``) are copied to a folder that a ``sitecustomize`` adds with
``site.addsitedir`` (as site does for site-packages, so the ``.pth`` line runs), in
every process that inherits the returned ``PYTHONPATH``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def hook_pythonpath(tmp_path: Path) -> str:
    """The ``PYTHONPATH`` of a Python whose site-packages has coralrt's start-up hook."""
    hook = tmp_path / "hook-site"
    hook.mkdir()
    for name in ("coralrt-compat.pth", "_coralrt_compat.py"):
        shutil.copy(REPO_ROOT / name, hook / name)
    custom = tmp_path / "customize"
    custom.mkdir()
    (custom / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(hook)!r})\n")
    return str(custom)
