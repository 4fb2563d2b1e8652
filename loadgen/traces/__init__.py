"""Traces: recorded or synthetic traffic (arrival offsets, payload sizes, items per request).

Read and write CSV / JSON lines / Parquet, import access logs and public production traces by
name, synthesize seeded traffic, rescale keeping the shape, fit arrival models and describe a
trace. See docs/traces.md.
"""

from netgain.loadgen.traces.access_log import import_access_log
from netgain.loadgen.traces.fit import fit, params_from_fit
from netgain.loadgen.traces.inspect import inspect_trace
from netgain.loadgen.traces.io import read_trace, write_trace
from netgain.loadgen.traces.model import Trace, TraceError
from netgain.loadgen.traces.public import FORMATS as PUBLIC_FORMATS
from netgain.loadgen.traces.public import Imported, import_public
from netgain.loadgen.traces.synth import ARRIVALS, rescale, synthesize

__all__ = [
    "ARRIVALS",
    "PUBLIC_FORMATS",
    "Imported",
    "Trace",
    "TraceError",
    "fit",
    "import_access_log",
    "import_public",
    "inspect_trace",
    "params_from_fit",
    "read_trace",
    "rescale",
    "synthesize",
    "write_trace",
]
