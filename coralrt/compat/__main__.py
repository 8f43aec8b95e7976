"""``python -m coralrt.compat SCRIPT [ARGS...]``: see :mod:`coralrt.compat._runner`."""

import sys

from coralrt.compat._runner import main

sys.exit(main())
