"""requests.parquet read in chunks of whole row groups and decoded as ``rundir.load_requests``
decodes the whole file: the reader behind the streamed report (``netgain.analysis.stream``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from netgain.analysis.rundir import AnalysisError, _diff_ms, _float, _ns, _open_parquet
from netgain.contract import rundir as files
from netgain.contract.phases import PHASES
from netgain.contract.records import PHASE_COLUMNS, REQUIRED_COLUMNS

CHUNK_ROWS = 1 << 18


@dataclass
class Chunk:
    scheduled_s: np.ndarray
    latency: np.ndarray
    service: np.ndarray
    send_lag: np.ndarray
    code: np.ndarray  # index into the run's status names, in order of first appearance
    warm: np.ndarray
    measured: np.ndarray  # outside the warm-up and, in an interrupted run, scheduled before its cut
    phases: dict[str, np.ndarray]
    total: np.ndarray
    batch: np.ndarray
    ok: np.ndarray  # measured, OK, with a latency


class Reader:
    """requests.parquet in chunks, decoded as ``rundir.load_requests`` decodes the whole file."""

    def __init__(self, run_dir: str | Path, warmup_s: float | None) -> None:
        self.path = Path(run_dir) / files.REQUESTS
        self.pf = _open_parquet(self.path)
        self.names = set(self.pf.schema_arrow.names)
        missing = [c for c in REQUIRED_COLUMNS if c not in self.names]
        if missing:
            raise AnalysisError(
                f"{self.path} lacks column(s) {', '.join(missing)}: it was not written by this "
                "netgain version; re-run `netgain load`"
            )
        self.warmup_s = warmup_s
        self.cut_s: float | None = None  # an interrupted run's window end: later rows are not measured
        self.status_names: list[str] = []
        self._status_ids: dict[str, int] = {}
        optional = [*PHASE_COLUMNS, "server_total_ms", "batch_size"]
        self.columns = [*REQUIRED_COLUMNS, *(c for c in optional if c in self.names)]

    def status_id(self, name: str) -> int:
        return self._status_ids.get(name, -1)

    def scheduled_max(self) -> float | None:
        """The last scheduled time (s), read from that column alone; None for an empty file."""
        top: float | None = None
        for table in self._batches(["scheduled_ns"]):
            sched, _ = _ns(table.column(0).combine_chunks())
            if len(sched):
                m = float(sched.max()) / 1e9
                top = m if top is None else max(top, m)
        return top

    def _batches(self, columns: list[str]) -> Iterator[pa.Table]:
        """Whole row groups, several to a chunk up to ``CHUNK_ROWS`` rows (reading a row group is
        several times faster than ``iter_batches``); a larger row group in slices of that size."""
        meta = self.pf.metadata
        try:
            group: list[int] = []
            rows = 0
            for i in range(meta.num_row_groups):
                n = meta.row_group(i).num_rows
                if n > CHUNK_ROWS:
                    for b in self.pf.iter_batches(batch_size=CHUNK_ROWS, row_groups=[i], columns=columns):
                        yield pa.Table.from_batches([b])
                    continue
                if rows + n > CHUNK_ROWS and group:
                    yield self.pf.read_row_groups(group, columns=columns)
                    group, rows = [], 0
                group.append(i)
                rows += n
            if group:
                yield self.pf.read_row_groups(group, columns=columns)
        except (pa.ArrowException, OSError) as exc:
            raise AnalysisError(f"{self.path} could not be read ({exc}): re-run `netgain load`") from None

    def chunks(self, full: bool) -> Iterator[Chunk]:
        """Every chunk, decoded; without ``full`` only what the latencies need (no phases, no send
        times: those figures are then NaN)."""
        columns = self.columns if full else [*REQUIRED_COLUMNS[:1], "done_ns", "status", "warmup"]
        for table in self._batches(columns):
            try:
                yield self._decode(table)
            except (pa.ArrowException, OSError) as exc:
                raise AnalysisError(f"{self.path} could not be read ({exc}): re-run `netgain load`") from None

    def _decode(self, table: pa.Table) -> Chunk:
        col = {name: table.column(name).combine_chunks() for name in table.column_names}
        sched, _ = _ns(col["scheduled_ns"])
        done, done_ok = _ns(col["done_ns"])
        if "sent_ns" in col:
            sent, sent_ok = _ns(col["sent_ns"])
        else:
            sent, sent_ok = sched, np.zeros(len(sched), dtype=bool)
        status = pc.dictionary_encode(pc.fill_null(col["status"], "UNKNOWN"))
        local = np.asarray(status.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        to_global = np.array([self._id(str(s)) for s in status.dictionary.to_pylist()], dtype=np.int32)
        scheduled_s = sched.astype(np.float64) / 1e9
        if self.warmup_s is not None:
            warm = scheduled_s < self.warmup_s
        else:
            warm = np.asarray(pc.fill_null(col["warmup"], False).to_numpy(zero_copy_only=False), dtype=bool)
        n = len(sched)
        phases = {
            p: _float(col[c]) if c in col else np.full(n, np.nan)
            for p, c in zip(PHASES, PHASE_COLUMNS, strict=True)
        }
        latency = _diff_ms(done, sched, done_ok)
        code = to_global[local] if len(local) else np.zeros(0, np.int32)
        measured = ~warm if self.cut_s is None else ~warm & (scheduled_s < self.cut_s)
        return Chunk(
            scheduled_s=scheduled_s,
            latency=latency,
            service=_diff_ms(done, sent, done_ok & sent_ok),
            send_lag=_diff_ms(sent, sched, sent_ok),
            code=code,
            warm=warm,
            measured=measured,
            phases=phases,
            total=_float(col["server_total_ms"]) if "server_total_ms" in col else np.full(n, np.nan),
            batch=_float(col["batch_size"]) if "batch_size" in col else np.full(n, np.nan),
            ok=measured & (code == self.status_id("OK")) & ~np.isnan(latency),
        )

    def _id(self, name: str) -> int:
        if name not in self._status_ids:
            self._status_ids[name] = len(self.status_names)
            self.status_names.append(name)
        return self._status_ids[name]
