"""Quantiles and the log-bucket histogram, shared by the server and the load generator.

``netgain.stats.quantiles`` states the percentile policy (nearest-rank) and implements it;
``netgain.stats.histogram`` is the one bucket histogram (server telemetry, the load generator's
live view and client metrics). Neither imports torch or ``netgain.server``.
"""
