"""``python -m netgain.server [serve flags]``: the server alone, same flags as ``netgain serve``.

A shim: the command line lives in netgain.cli (netgain.cli.serve).
"""

from __future__ import annotations

import sys

from netgain.cli.serve import standalone_main

if __name__ == "__main__":
    sys.exit(standalone_main())
