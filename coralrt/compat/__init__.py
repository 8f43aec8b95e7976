"""Run programs written for tflite_runtime + libedgetpu, or for pycoral, unchanged on coralrt.

Three ways to switch a program over (docs/porting.md):

* ``python -m coralrt.compat [--target T] SCRIPT [ARGS...]`` (or ``-m MODULE``,
  ``-c CODE``) runs it with the import hook installed (:mod:`.runner`);
* ``CORALRT_COMPAT=1`` in the environment installs the hook when any Python of
  the environment starts, for processes nobody starts by hand (multiprocessing
  children, a container's command): coralrt's start-up hook, a ``.pth`` file
  that the wheel puts in site-packages, reads it;
* :func:`install` in a program (before its first import of either package).

The hook (:mod:`.finder`) makes ``import tflite_runtime...`` and
``import pycoral...`` return ``coralrt.tflite...`` and ``coralrt.pycoral...``
(the same module objects). ``CORALRT_TARGET`` (cpu, sim, coral, auto; default
auto) says where their Edge TPU work goes.
"""

from __future__ import annotations

# The start-up hook may have loaded the finder module on its own, before this package:
# bind it here, as importing it from here would have.
from coralrt.compat import _finder  # noqa: F401
from coralrt.compat._finder import (
    ALIASES, ENV, CompatFinder, env_enabled, install, installed, target_of, uninstall,
)

__all__ = ["ALIASES", "ENV", "CompatFinder", "env_enabled", "install", "installed",
           "target_of", "uninstall"]
