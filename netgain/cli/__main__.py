"""``python -m netgain.cli ...``: the ``netgain`` command without the console script."""

from __future__ import annotations

import sys

from netgain.cli import main

if __name__ == "__main__":
    sys.exit(main())
