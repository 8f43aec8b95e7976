"""The Edge TPU support checks: moved to :mod:`coralrt._ops.checks` and, for the
layer-width rule, :mod:`coralrt._ops.width` (the operator specs hold the
rules); this name stays for code that imports it."""

from coralrt._ops.checks import *  # noqa: F401,F403
from coralrt._ops.checks import __all__ as _checks_all
from coralrt._ops.width import *  # noqa: F401,F403
from coralrt._ops.width import __all__ as _width_all

__all__ = [*_checks_all, *_width_all]
