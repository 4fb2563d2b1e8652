"""Deal the schedule: one Plan per worker, its shard of the requests and its share of the run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from netgain.contract.messages import Plan
from netgain.loadgen.runner.config import LoadConfig
from netgain.loadgen.schedule import Schedule


def split_concurrency(concurrency: int, workers: int) -> list[int]:
    """Closed-loop users per worker: as even as it goes, the first workers taking the remainder."""
    return [concurrency // workers + (1 if i < concurrency % workers else 0) for i in range(workers)]


def plans(
    cfg: LoadConfig,
    schedule: Schedule,
    index_of: dict[str, int],
    workers: int,
    *,
    run_id: str,
    model: str,
    info: Any,
) -> Iterator[tuple[str, Plan]]:
    """(Locust client id, its Plan) for each worker numbered in ``index_of`` (of ``workers``);
    ``info`` is the first target's ServerInfo (its handler options go to every worker)."""
    users = split_concurrency(cfg.concurrency, workers)
    for cid, i in index_of.items():
        shard = schedule.shard(i, workers)
        yield (
            cid,
            Plan(
                run_id=run_id,
                worker=i,
                workers=workers,
                targets=cfg.targets,
                model=model,
                handler_options=dict(info.handler_options),
                seed=cfg.seed,
                mode=cfg.mode,
                warmup_ns=schedule.warmup_ns,
                timeout_s=cfg.timeout_s,
                max_in_flight=cfg.max_in_flight,
                connections=cfg.connections,
                index=shard.index.tobytes(),
                t_ns=shard.t_ns.tobytes(),
                size=shard.size.tobytes(),
                items=shard.items.tobytes(),
                concurrency=users[i],
                think_ms=cfg.think_ms,
                duration_ns=int((cfg.warmup_s + cfg.duration_s) * 1e9),
                tls_ca=cfg.tls_ca,
                extra={"payload_variants": cfg.payload_variants},
            ),
        )
