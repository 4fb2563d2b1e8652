"""The aggregator: a run directory (or two) in, a report with a verdict out.

Public API: :func:`build_report`, :func:`write_outputs`, :func:`capacity_at_slo`, :class:`AnalysisError`.
"""

from netgain.analysis.report import build_report, capacity_at_slo, to_json, write_outputs
from netgain.analysis.rundir import AnalysisError

__all__ = ["AnalysisError", "build_report", "capacity_at_slo", "to_json", "write_outputs"]
