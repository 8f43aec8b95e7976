"""The Edge TPU support checks: moved to :mod:`coralrt._ops.checks` (the operator
specs hold the rules); this name stays for code that imports it."""

from coralrt._ops.checks import *  # noqa: F401,F403
from coralrt._ops.checks import __all__  # noqa: F401
