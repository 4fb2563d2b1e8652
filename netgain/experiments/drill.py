"""``netgain drill``: cold start measured from outside and inside, and a scale-up drill under load.

Cold start, per repeat: spawn → process up (ports bound) → health SERVING → first successful
response at the client, beside the server's own timeline (imports, model built, on device,
warm-up, ready) from ServerInfo. Scale-up: load runs against replica 1 and a second target
that is not started yet; replica 2 is then spawned, and the drill measures until it answers
its share.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import grpc

from netgain.contract import rundir as files
from netgain.errors import NetgainError
from netgain.experiments.orchestrate import ServerProcess, run_load
from netgain.loadgen.payloads import example_maker
from netgain.protos import InferenceStub, pb
from netgain.server.ports import reserve
from netgain.stats.quantiles import quantiles


def _first_success(target: str, request: pb.InferRequest, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as ch:
        stub = InferenceStub(ch)
        while time.monotonic() < deadline:
            try:
                stub.Infer(request, timeout=10.0)
                return time.time()
            except grpc.RpcError:
                time.sleep(0.01)
    raise TimeoutError(f"no successful response from {target} within {timeout_s:.0f} s")


def cold_start(model: str, device: str, serve_args: list[str], log_path: str) -> dict[str, Any]:
    example = example_maker(model, _options(serve_args))
    request = pb.InferRequest(inputs=[example(random.Random(0), None)])
    sp = ServerProcess(["--model", model, "--device", device, *serve_args], log_path=log_path)
    with sp:
        up = time.time()  # ports file exists: the process is up and listening
        serving_s = sp.wait_ready()
        first = _first_success(sp.target, request, 60.0)
        with grpc.insecure_channel(sp.target) as ch:
            info = InferenceStub(ch).ServerInfo(pb.ServerInfoRequest(), timeout=10.0)
    spawn = sp.spawned_at
    return {
        "spawn_to_up_s": up - spawn,
        "spawn_to_serving_s": serving_s,
        "spawn_to_first_ok_s": first - spawn,
        "inside": {c.name: c.duration_s for c in info.cold_start},
        "inside_total_s": info.cold_start[-1].at_s if info.cold_start else None,
    }


def _options(serve_args: list[str]) -> dict[str, str]:
    opts = {}
    for i, a in enumerate(serve_args):
        if a == "--handler-option" and i + 1 < len(serve_args):
            k, _, v = serve_args[i + 1].partition("=")
            opts[k] = v
    return opts


def distribution(values: list[float]) -> dict[str, float]:
    """n, min, median and p90 (nearest-rank, ``netgain.stats.quantiles``), max, mean."""
    values = sorted(values)
    med, p90 = quantiles(values, [0.5, 0.9])
    return {
        "n": len(values),
        "min": values[0],
        "median": med,
        "p90": p90,
        "max": values[-1],
        "mean": statistics.fmean(values),
    }


def scale_up(
    model: str,
    device: str,
    serve_args: list[str],
    out: str,
    rate: float,
    duration_s: float,
    delay_s: float,
    workers: int,
) -> dict[str, Any]:
    """Replica 1 serves; load goes to replica 1 and replica 2's address; replica 2 starts after delay_s."""
    import pyarrow.parquet as pq

    run_dir = os.path.join(out, "scale-up")
    hold = reserve("127.0.0.1", checked=True)  # until replica 2 listens: the load's connects must not take it
    port2 = int(hold.getsockname()[1])
    base = ["--model", model, "--device", device, *serve_args]
    with hold, ServerProcess(base, log_path=os.path.join(out, "replica1.log")) as r1:
        r1.wait_ready()
        target2 = f"127.0.0.1:{port2}"
        result: dict[str, Any] = {}

        def start_replica2() -> None:
            time.sleep(delay_s)
            r2 = ServerProcess(base, log_path=os.path.join(out, "replica2.log"), port=port2)
            result["proc"] = r2  # stopped below even when it never turns SERVING
            try:
                r2.start()
                result["spawn_unix_s"] = r2.spawned_at  # the instant wait_ready counts from
                result["serving_s"] = r2.wait_ready()
            except NetgainError as exc:  # reported after the load, which runs its course
                result["error"] = str(exc)
            finally:
                hold.close()

        t = threading.Thread(target=start_replica2)
        t.start()
        rc = run_load(
            [
                "--target",
                f"{r1.target},{target2}",
                "--probe",
                "first",
                "--arrival",
                "constant",
                "--rate",
                str(rate),
                "--duration",
                str(duration_s),
                "--warmup-s",
                "0",
                "--workers",
                str(workers),
                "--timeout-s",
                "2",
                "--out",
                run_dir,
                "--max-send-lag-ms",
                "1000",
            ],
            quiet=True,
            # Its verdict counts the failures the drill causes on purpose (replica 2 not up yet) as a
            # target gone away; the drill's own line below tells them apart.
            stdout=subprocess.DEVNULL,
        )
        t.join()
        r2proc = result.pop("proc", None)
        if r2proc is not None:
            r2proc.stop()
        if "error" in result:
            raise NetgainError(f"scale-up: replica 2 did not come up: {result['error']}")
    epoch_s = files.read_meta(run_dir)["epoch_unix_ns"] / 1e9
    t_ = pq.read_table(os.path.join(run_dir, files.REQUESTS), columns=["target", "status", "done_ns"])
    d = t_.to_pydict()
    rows = list(zip(d["target"], d["status"], d["done_ns"], strict=True))
    ok2 = [
        done / 1e9 + epoch_s for tgt, st, done in rows if tgt == target2 and st == "OK" and done is not None
    ]
    spawn = result.get("spawn_unix_s")
    first_ok = min(ok2) if ok2 else None

    def before_up(done: int | None) -> bool:  # ended before replica 2's first answer: the drill's own
        return first_ok is None or done is None or done / 1e9 + epoch_s <= first_ok

    failed2 = [(st, done) for tgt, st, done in rows if tgt == target2 and st != "OK"]
    return {
        "load_exit": rc,
        "replica2_spawn_to_serving_s": result.get("serving_s"),
        "replica2_spawn_to_first_ok_s": (first_ok - spawn) if first_ok and spawn else None,
        "replica2_failed_requests": len(failed2),
        "replica2_failed_before_up": sum(1 for _, done in failed2 if before_up(done)),
        "replica2_failed_after_up": sum(1 for _, done in failed2 if not before_up(done)),
        "replica2_ok_requests": len(ok2),
        "replica1_failed_requests": sum(1 for tgt, st, _ in rows if tgt != target2 and st != "OK"),
        "delay_s": delay_s,
        "run_dir": run_dir,
    }


def scale_up_lines(s: dict[str, Any]) -> list[str]:
    """The scale-up drill in words: when replica 2 served, which failures the drill caused on
    purpose (requests sent to it before it was up) and which it did not."""

    def sec(v: float | None) -> str:
        return "never" if v is None else f"{v:.2f} s"

    lines = [
        f"scale-up: replica 2 spawned {s['delay_s']:g} s into the load: SERVING after "
        f"{sec(s['replica2_spawn_to_serving_s'])}, first OK after {sec(s['replica2_spawn_to_first_ok_s'])}; "
        f"{s['replica2_ok_requests']} requests answered by it",
        f"scale-up: {s['replica2_failed_before_up']} requests to replica 2 failed before it answered: "
        "expected, the drill sends to it before it starts",
    ]
    real = s["replica2_failed_after_up"] + s["replica1_failed_requests"]
    if real:
        lines.append(
            f"scale-up: FAILED: {s['replica2_failed_after_up']} requests to replica 2 after it answered, "
            f"{s['replica1_failed_requests']} to replica 1 (see {s['run_dir']}: netgain report)"
        )
    else:
        lines.append("scale-up: no other request failed (replica 1 throughout, replica 2 once up)")
    return lines


def run_drill(
    model: str, device: str, repeats: int, serve_args: list[str], out: str, scale: dict[str, Any] | None
) -> dict[str, Any]:
    os.makedirs(out, exist_ok=True)
    samples = []
    for i in range(repeats):
        s = cold_start(model, device, serve_args, os.path.join(out, f"server-{i}.log"))
        samples.append(s)
        print(
            f"[{i + 1}/{repeats}] spawn→up {s['spawn_to_up_s']:.2f} s, "
            f"→SERVING {s['spawn_to_serving_s']:.2f} s, "
            f"→first OK {s['spawn_to_first_ok_s']:.2f} s",
            file=sys.stderr,
            flush=True,
        )
    summary: dict[str, Any] = {"model": model, "device": device, "repeats": repeats, "samples": samples}
    for key in ("spawn_to_up_s", "spawn_to_serving_s", "spawn_to_first_ok_s"):
        summary[key] = distribution([s[key] for s in samples])
    phases = samples[0]["inside"].keys() if samples else []
    summary["inside"] = {p: distribution([s["inside"][p] for s in samples]) for p in phases}
    if scale is not None:
        summary["scale_up"] = scale_up(model, device, serve_args, out, **scale)
    with open(os.path.join(out, "drill.json"), "w") as fh:
        json.dump(summary, fh, indent=2)
    return summary
