"""``report.json`` as a type (docs/report.md): the report ``netgain report`` writes, the run section
a comparison nests, and ``tune.json``, as TypedDicts that mypy checks every key of.

They describe the JSON exactly as written (same keys, same order of construction), so typing adds no
byte to the files. The version is the run directory's (``SCHEMA_VERSION``), checked on read with the
required top-level keys. Sections other modules build and only the renderers read in part stay
``dict[str, Any]`` where their keys are open-ended (named in each docstring).
"""

from pathlib import Path
from typing import Any, NotRequired, TypedDict

from netgain.contract.rundir import REPORT, SCHEMA_VERSION, RunDirError, read_json

#: report.json's version: the run directory's, which it shares.
REPORT_SCHEMA = SCHEMA_VERSION
#: tune.json's version (a document of its own, outside the run directory).
TUNE_SCHEMA = 1


class Quantiles(TypedDict):
    """Nearest-rank quantiles in ms (None without a value to take them from)."""

    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    p999: float | None
    max: float | None


class LatencyMs(Quantiles):
    """End-to-end latency of the measured successful requests, with their mean."""

    mean: float | None


class LatencyCi(TypedDict):
    p99: list[float] | None
    draws: int
    confidence: float


class Counts(TypedDict):
    rows: int
    measured: int
    ok: int
    completed_in_window: int
    dropped: int
    warmup: int


class WindowS(TypedDict):
    start: float
    end: float
    duration: float


class Drift(TypedDict):
    first_half_p50_ms: float | None
    second_half_p50_ms: float | None
    ratio: float | None


class Cost(TypedDict):
    """The price, the SLO and the costs; ``autoscale`` is the replay's open map (docs/report.md)."""

    price_per_hour: float | None
    slo_p99_ms: float | None
    slo_held: bool | None
    note: str | None
    cost_per_1k_measured: float | None
    capacity_note: str | None
    autoscale: dict[str, Any] | None


class Bottleneck(TypedDict):
    """The first limiting resource; ``kinds`` lists every one found (each with kind, resource,
    action, evidence)."""

    kind: str
    resource: str
    action: str
    evidence: list[str]
    kinds: list[dict[str, Any]]
    drops_caused_by: str | None
    approximate: bool


class RunConfig(TypedDict):
    arrival: Any
    rate: Any
    duration_s: Any
    warmup_s: Any
    mode: Any
    max_send_lag_ms: Any


class SweepPoint(TypedDict):
    """One run of a rate (or batch-size) sweep."""

    run_dir: str
    offered_rps: float
    throughput_rps: float
    p99_ms: float | None
    error_rate: float | None
    valid: bool
    batch_size_mean: float | None
    device: str


class Sweep(TypedDict):
    """A sweep's capacity at the SLO: its best valid throughput (``capacity_at_slo``)."""

    capacity_rps: float | None
    from_run: str | None
    slo_p99_ms: float | None
    runs: int
    runs_meeting_slo: int
    points: list[SweepPoint]


class RunReport(TypedDict):
    """One run's section: the whole of a single run's report before the report-level keys, and a
    comparison's ``baseline``/``treatment``. Open maps: ``errors``/``statuses`` (per status),
    ``phases_ms`` (per phase), ``tail``, ``gpu``, ``cpu``, ``queue``, ``trace``, ``versions``,
    ``series``, ``enough_samples``, ``service_ms``, ``server_config``, ``join``."""

    schema: int
    run_dir: str
    run_id: str | None
    device: str
    model: str | None
    server_config: dict[str, Any] | None
    latency_ms: LatencyMs
    latency_ci_ms: LatencyCi
    enough_samples: dict[str, Any]
    service_ms: dict[str, Any]
    throughput_rps: float
    throughput_ci_rps: list[float] | None
    offered_rps: float
    errors: dict[str, int]
    batch_size_mean: float | None
    statuses: dict[str, int]
    error_rate: float | None
    send_lag_ms: Quantiles
    phases_ms: dict[str, Any]
    tail: dict[str, Any]
    gpu: dict[str, Any]
    cpu: dict[str, Any]
    queue: dict[str, Any]
    cold_start_s: float | None
    cold_start: list[Any]
    cost_per_1k: float | None
    cost: Cost
    bottleneck: Bottleneck
    valid: bool
    interrupted: bool
    invalid_reasons: list[str]
    warnings: list[str]
    window_s: WindowS
    counts: Counts
    drift: Drift
    attribution_gaps: list[str]
    join: dict[str, Any] | None
    config: RunConfig
    trace: dict[str, Any]
    versions: dict[str, Any]
    series: dict[str, Any]
    #: the rate sweep's capacity at the SLO, with ``--sweep``
    sweep: NotRequired[Sweep]


class Ratio(TypedDict):
    value: float | None
    ci: list[float] | None


#: treatment/baseline ratios by name: p99, p50, throughput, cost_per_1k, cost_per_1k_autoscaled.
Ratios = dict[str, Ratio]


class Verdict(TypedDict):
    """The comparison's answer; ``capacity`` holds both sides' search brackets when searched."""

    outcome: str  # net_gain, no_net_gain or inconclusive
    net_gain: bool
    reasons: list[str]
    allowed_p99_ms: float | None
    cost_per_1k_baseline: float | None
    cost_per_1k_treatment: float | None
    cost_ratio: float | None
    cost_ratio_ci: list[float] | None
    capacity_rps: dict[str, float | None]
    capacity: dict[str, dict[str, Any]] | None
    only_side: str | None


class Comparison(TypedDict):
    """The keys a comparison adds to the treatment's report (``compare``'s result)."""

    baseline: RunReport
    treatment: RunReport
    ratios: Ratios
    verdict: Verdict
    maintainability: list[str]
    traffic_differences: list[str]


class Report(RunReport):
    """``report.json``: the treatment's (or single) run section, then the report-level keys; a
    comparison adds ``Comparison``'s keys and ``netgain compare`` its own (``compare``, ``crossover``,
    ``trace_cost``: open maps of that experiment)."""

    slo_p99_ms: float | None
    failed_headline: str
    baseline: NotRequired[RunReport]
    treatment: NotRequired[RunReport]
    ratios: NotRequired[Ratios]
    verdict: NotRequired[Verdict]
    maintainability: NotRequired[list[str]]
    traffic_differences: NotRequired[list[str]]
    comparison: bool
    compare: NotRequired[dict[str, Any]]
    crossover: NotRequired[dict[str, Any] | None]
    trace_cost: NotRequired[dict[str, Any] | None]


class BestConfig(TypedDict):
    """tune.json's best configuration: the knobs (``Knobs``' fields) and their serve flags."""

    workers: str
    max_batch_size: int
    max_queue_delay_ms: float
    intra_op_threads: int
    pre_threads: int
    pre_processes: str
    serve_args: list[str]
    capacity_rps: float | None


class TunedConfig(BestConfig):
    """One configuration tried: its capacity search's bracket and trials (open maps)."""

    bracket: dict[str, Any] | None
    error: str
    trials: list[dict[str, Any]]


class TuneResult(TypedDict):
    """``tune.json``."""

    schema: int
    model: str
    device: str
    slo_p99_ms: float
    configs: list[TunedConfig]
    best: BestConfig | None


#: The keys every report.json has (a comparison's and an experiment's come on top).
REQUIRED_KEYS = tuple(sorted(Report.__required_keys__))


def read_report(run_dir: str | Path) -> Report:
    """``RUN_DIR/report.json``; RunDirError when it is missing, unreadable or lacks a required key,
    SchemaVersionError when it is of another schema version."""
    doc = read_json(run_dir, REPORT, "netgain report")
    missing = [k for k in REQUIRED_KEYS if k not in doc]
    if missing:
        raise RunDirError(
            f"{Path(run_dir) / REPORT} lacks the key(s) {', '.join(missing)}: it was not written by "
            "this netgain's `netgain report`; write it again"
        )
    report: Report = doc  # type: ignore[assignment]  # its keys are checked just above
    return report
