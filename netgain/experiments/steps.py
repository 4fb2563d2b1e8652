"""One capacity-search step on disk, for every search that writes its runs (compare, bench_peers):
a finished run is reused, an invalid one that met the SLO is measured once more."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable

from netgain.contract import rundir as files
from netgain.errors import NetgainError
from netgain.experiments.capacity import Trial, start_from


class LoadCrashed(NetgainError):
    """``netgain load`` was killed by a signal (an abort in gRPC's core, the OOM killer) before it
    finished: its run is incomplete, no evidence either way, so it is measured once more."""


def done(run_dir: str) -> bool:
    """A finished run: its meta.json is written last."""
    return os.path.exists(os.path.join(run_dir, files.META))


def judge(run_dir: str, rate: float, slo_p99_ms: float, max_error_ratio: float) -> Trial:
    """A run's figures and whether it held (valid, p99 within the SLO, errors under the bound)."""
    from netgain.analysis import build_report
    from netgain.experiments.tune import trial

    rep = build_report(run_dir, slo_p99_ms=slo_p99_ms, bootstrap=0) if done(run_dir) else None
    return trial(rep, rate, slo_p99_ms, max_error_ratio)


def first_rate(run_dir: str, slo_p99_ms: float, max_error_ratio: float) -> tuple[float, str] | None:
    """Where a search on the server of a finished run can start, and why: from a run that held, the
    rate its nearest resource allows (``capacity.start_from``); None when it missed or nothing was
    measured (the caller's start stands)."""
    from netgain.analysis import build_report
    from netgain.analysis.saturation import pressures
    from netgain.experiments.tune import trial

    if not done(run_dir):
        return None
    rep = build_report(run_dir, slo_p99_ms=slo_p99_ms, bootstrap=0)
    t = trial(rep, float(rep["offered_rps"]), slo_p99_ms, max_error_ratio)
    on_gpu = str(rep["device"]).startswith("cuda") or bool(rep["gpu"].get("present"))
    ranked = pressures(rep["gpu"], rep["cpu"], on_gpu)
    start = start_from(t.throughput, ranked[0].ratio if ranked else None) if t.held else None
    if start is None:
        return None
    top = ranked[0]
    return (
        start,
        f"the warm run held {t.throughput:.4g} req/s with {top.resource} at {top.ratio:.2f} of saturation",
    )


START = "start.json"  # a search's first rate, beside its steps: a resumed search repeats the same steps


def search_start(
    search_dir: str,
    given: float,
    warm_dir: str | None,
    slo_p99_ms: float,
    max_error_ratio: float,
    ceiling: float,
    say: Callable[[str], None],
) -> float:
    """The first rate of the search whose steps are in ``search_dir``, recorded there. ``warm_dir``
    None (a start the user chose): ``given``. Else the one recorded (a resumed search repeats its
    steps); for a search begun before starts were recorded, ``given``; else ``given``, or higher
    where the warm run held with room (``first_rate``, at most ``ceiling``)."""
    path = os.path.join(search_dir, START)
    if warm_dir is not None and os.path.exists(path):
        with open(path) as fh:
            return float(json.load(fh)["rate"])
    begun = os.path.isdir(search_dir) and any(n.startswith("r") for n in os.listdir(search_dir))
    if warm_dir is not None and begun:
        return given
    first, why = given, "as given"
    room = first_rate(warm_dir, slo_p99_ms, max_error_ratio) if warm_dir is not None else None
    if room is not None and room[0] > given:
        first, why = min(room[0], ceiling), room[1]
        say(f"starts at {first:.4g} req/s: {why}")
    os.makedirs(search_dir, exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"rate": first, "why": why}, fh)
    return first


def set_aside(run_dir: str) -> None:
    """Keep an invalid run in ``invalid/`` beside it (the last such run), so it is measured again."""
    if not os.path.exists(run_dir):  # a load that crashed before it wrote anything
        return
    kept = os.path.join(os.path.dirname(run_dir), "invalid", os.path.basename(run_dir))
    shutil.rmtree(kept, ignore_errors=True)
    os.makedirs(os.path.dirname(kept), exist_ok=True)
    os.rename(run_dir, kept)


def run_step(
    run_dir: str,
    rate: float,
    slo_p99_ms: float,
    max_error_ratio: float,
    measure: Callable[[], None],
    say: Callable[[str], None],
) -> tuple[Trial, bool]:
    """(trial, reused) for the step in ``run_dir``. An invalid run that met the SLO says nothing about
    the server: it is kept in ``invalid/`` beside the step and the step measured once more."""
    reused = done(run_dir)
    if not reused:
        once_more_if_crashed(run_dir, measure, lambda why: say(f"at {rate:.4g} req/s: {why}"))
    t = judge(run_dir, rate, slo_p99_ms, max_error_ratio)
    if not reused and not t.valid and not t.p99 > slo_p99_ms:
        set_aside(run_dir)
        say(f"at {rate:.4g} req/s: invalid run (send lag), repeated once")
        measure()
        t = judge(run_dir, rate, slo_p99_ms, max_error_ratio)
    return t, reused


def once_more_if_crashed(run_dir: str, measure: Callable[[], None], say: Callable[[str], None]) -> None:
    """``measure``; a load generator killed by a signal is set aside and measured once more on the
    same server (a second crash stops the search with its error)."""
    try:
        measure()
    except LoadCrashed as exc:
        set_aside(run_dir)
        say(f"{exc}, repeated once")
        measure()


def warm_step(traffic: list[str], warm_dir: str) -> tuple[float, str] | None:
    """(rate, run) of a compare's warm run, which is its search's step at its own rate: the same
    arrivals (``traffic``), batch size and server, measured longer. None with a trace (a step
    replays it rescaled), with no --rate given, or while the run is unfinished."""
    if "--trace" in traffic or "--rate" not in traffic or not warm_dir or not done(warm_dir):
        return None
    return float(traffic[traffic.index("--rate") + 1]), warm_dir


def step_dir(root: str, batch: int, rate: float) -> str:
    """A search step's run directory: named by its rate, so a resumed search finds it again."""
    return os.path.join(root, "search", f"b{batch}", f"r{rate:.6g}")
