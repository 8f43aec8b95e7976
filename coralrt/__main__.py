"""``python -m coralrt``: the same as the ``coralrt`` command."""

from __future__ import annotations

import sys

from coralrt._cli.main import main

if __name__ == "__main__":
    sys.exit(main())
