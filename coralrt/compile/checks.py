"""The Edge TPU support checks: moved to :mod:`coralrt.ops.checks` (the operator
specs hold the rules); this name stays for code that imports it."""

from coralrt.ops.checks import *  # noqa: F401,F403
from coralrt.ops.checks import __all__  # noqa: F401
