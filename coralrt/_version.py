"""coralrt's version, as installed (``importlib.metadata``), read once per process."""

from __future__ import annotations

import functools

__all__ = ["version"]


@functools.lru_cache(maxsize=1)
def version() -> str:
    """The installed distribution's version, or ``"0+unknown"`` when run from a bare tree."""
    # importlib.metadata is slow to import: only on first use, as pluggy does.
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("coralrt")
    except PackageNotFoundError:
        return "0+unknown"
