"""``python -m coralrt.compat SCRIPT [ARGS...]``: see :mod:`coralrt.compat.runner`."""

import sys

from coralrt.compat.runner import main

sys.exit(main())
