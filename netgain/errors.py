"""Domain errors: what the library raises for a problem the user can fix.

``NetgainError`` is bad input, a bad config or a bad run directory: the message alone says what is
wrong and how to fix it. The library raises it (or a subclass, such as
``netgain.analysis.AnalysisError``) and never imports the command line; the ``netgain``
command prints it as one line, ``netgain <cmd>: error: ...``, and exits with status 2 (a traceback
only with ``--debug``).
"""

from __future__ import annotations


class NetgainError(Exception):
    """A user-facing problem (bad input, bad config, bad run directory); the message says how to fix it."""
