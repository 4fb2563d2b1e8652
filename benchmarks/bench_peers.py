"""Peers side by side: netgain's handler served by ``netgain serve``, Triton (PyTriton) and LitServe.

The same handler (``--model``, image by default: JPEG decode + resize + normalise, then the CNN;
``--handler-option`` as for ``netgain serve``) behind three servers, each pinned to the same cores
(``--server-cpus``), driven by the same ``netgain load`` (Poisson arrivals, the same seed, latency
from each request's intended send time, open loop) from its own cores (``--load-cpus``). Each
peer's capacity at the SLO (p99 <= ``--slo-p99-ms``, errors <= ``--max-error-ratio``, a valid run)
comes from the one search ``compare`` and ``tune`` run (``netgain.experiments.capacity.search``).

- ``netgain``: ``netgain serve --model M`` with its defaults (``--max-batch-size 8``,
  ``--max-queue-delay-ms 2``, ``--workers auto``), driven over its own gRPC API.
- ``triton``: ``benchmarks/peer_servers.py triton`` under ``--triton-python`` (a venv with
  nvidia-pytriton, torch and Pillow; env NETGAIN_TRITON_PYTHON): the handler's steps bound as one
  PyTriton inference function, dynamic batching with the same max batch and queue delay,
  ``--triton-instances`` copies; driven by ``netgain load --protocol oip`` (gRPC).
- ``litserve``: ``benchmarks/peer_servers.py litserve`` under ``--litserve-python`` (env
  NETGAIN_LITSERVE_PYTHON): a LitAPI whose hooks are the handler's steps, ``max_batch_size`` and
  ``batch_timeout`` the same, ``--litserve-workers`` workers and ``--litserve-api-servers`` API
  servers; driven by ``--protocol http-json``. The peers' processes run ``--peer-threads`` torch
  threads each (OMP_NUM_THREADS; by default one on a GPU, where they only pre-process, and on the
  CPU the server's cores shared among the processes that run the forward).

A peer whose interpreter is not given (or cannot import what it needs) is skipped with the reason.
Every step's run directory is ``OUT/PEER/search/r<rate>`` and is reused when it is there, so a run
that was stopped resumes. Prints the placement first and last, every peer's configuration, a table
(capacity with its bracket, p99 at capacity, the bottleneck the report names, runs), and writes
``OUT/peers.json``. docs/benchmarks.md ("Peers side by side") says how to make the venvs.

    python benchmarks/bench_peers.py --out runs/peers --model image --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import pinned, table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEERS = ("netgain", "triton", "litserve")


@dataclass
class Peer:
    name: str
    config: dict[str, Any]  # what it runs with, printed and written: the fairness is stated
    start: Callable[[contextlib.ExitStack], str]  # starts the server, returns the load target
    load_args: list[str] = field(default_factory=list)  # protocol flags for netgain load


def _free_port() -> int:
    from netgain.experiments.orchestrate import free_port

    return free_port()


def _peer_process(
    stack: contextlib.ExitStack, python: str, args: list[str], log: str, cpus: list[int], threads: int
) -> subprocess.Popen[bytes]:
    """``python peer_servers.py ARGS`` on the server's cores in its own process group (stopped whole)."""
    env = dict(os.environ, PYTHONPATH=_pythonpath())
    # torch's intra-op threads, set explicitly as netgain serve sets its own
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(log, "ab") as out, pinned(set(cpus)):  # not a preexec_fn: fork() runs gRPC's at-fork handler
        proc = subprocess.Popen(
            [python, os.path.join(HERE, "peer_servers.py"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=os.path.dirname(log),
            start_new_session=True,
        )
    stack.callback(_stop_group, proc)
    return proc


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the peer's process group (its tritonserver or LitServe workers), then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)


def _pythonpath() -> str:
    """The repository first, then whatever the caller's path holds (a peer's wheels may be there)."""
    return os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)


def _check_python(python: str | None, peer: str, a: argparse.Namespace) -> str | None:
    """Why ``python`` cannot serve ``peer`` (None: it can): it must import the peer and build and
    run the handler's model and pre-processing (torch, Pillow, tokenizers, as the model needs)."""
    if not python:
        var = "NETGAIN_TRITON_PYTHON" if peer == "triton" else "NETGAIN_LITSERVE_PYTHON"
        return f"no interpreter: give --{peer}-python or {var}"
    opts = dict(o.split("=", 1) for o in a.handler_option)
    code = (
        f"import random, {'pytriton' if peer == 'triton' else 'litserve'}\n"
        "from netgain.server.handlers import create_handler\n"
        f"h = create_handler({a.model!r}, {opts!r})\n"
        "h.build_model()\n"
        "h.preprocess(h.example_input(random.Random(0)))\n"
    )
    env = dict(os.environ, PYTHONPATH=_pythonpath())
    try:
        r = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=300, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python}: {exc}"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return f"{python} cannot import {peer} or run the {a.model} handler: {last}"
    return None


def handler_args(a: argparse.Namespace) -> list[str]:
    out = ["--model", a.model, "--device", a.device, "--seed", str(a.seed)]
    for opt in a.handler_option:
        out += ["--handler-option", opt]
    return out


def _wait_http(port: int, path: str, timeout_s: float, proc: subprocess.Popen[bytes], log: str) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"peer exited with status {proc.returncode} while starting (log: {log})")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r,
        ):
            if r.status == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"peer not ready on port {port} within {timeout_s:.0f} s (log: {log})")


def peer_threads(a: argparse.Namespace, cores: int) -> dict[str, int]:
    """Torch threads per peer process: ``--peer-threads``, else one on a GPU (its processes only
    pre-process) and on the CPU the server's cores over the processes that run the forward (one
    for PyTriton's instances, which are threads; LitServe's workers)."""
    if a.peer_threads > 0:
        return {"triton": a.peer_threads, "litserve": a.peer_threads}
    if a.device != "cpu":
        return {"triton": 1, "litserve": 1}
    return {"triton": max(1, cores), "litserve": max(1, cores // max(1, a.litserve_workers))}


def make_peers(a: argparse.Namespace, server_cpus: list[int]) -> tuple[list[Peer], dict[str, str]]:
    """The peers to measure, and the reason each of the others is skipped."""
    peers: list[Peer] = []
    skipped: dict[str, str] = {}
    common = handler_args(a)
    batching = {"max_batch_size": a.max_batch_size, "max_queue_delay_ms": a.max_queue_delay_ms}
    threads = peer_threads(a, len(server_cpus))
    for name in a.peers.split(","):
        if name == "netgain":
            serve = [*common, "--max-batch-size", str(a.max_batch_size),
                     "--max-queue-delay-ms", f"{a.max_queue_delay_ms:g}", *a.serve_arg]  # fmt: skip

            def start_netgain(stack: contextlib.ExitStack, serve: list[str] = serve) -> str:
                from netgain.experiments.orchestrate import ServerProcess

                log = os.path.join(a.out, "netgain", "server.log")
                sp = stack.enter_context(ServerProcess(serve, log_path=log, cpus=server_cpus))
                sp.wait_ready()
                return sp.target

            workers = [x.split("=", 1)[1] for x in a.serve_arg if x.startswith("--workers=")]
            config = {"server": "netgain serve " + " ".join(serve), **batching,
                      "workers": workers[-1] if workers else "auto (netgain serve's default)",
                      "protocol": "netgain.v1 gRPC"}  # fmt: skip
            peers.append(Peer("netgain", config, start_netgain))
        elif name == "triton":
            why = _check_python(a.triton_python, "triton", a)
            if why:
                skipped[name] = why
                continue
            py = str(a.triton_python)

            def start_triton(stack: contextlib.ExitStack, py: str = py) -> str:
                grpc_port, http_port, metrics_port = _free_port(), _free_port(), _free_port()
                log = os.path.join(a.out, "triton", "server.log")
                args = ["triton", *common, "--max-batch-size", str(a.max_batch_size),
                        "--max-queue-delay-ms", f"{a.max_queue_delay_ms:g}",
                        "--instances", str(a.triton_instances), "--grpc-port", str(grpc_port),
                        "--http-port", str(http_port), "--metrics-port", str(metrics_port)]  # fmt: skip
                proc = _peer_process(stack, py, args, log, server_cpus, threads["triton"])
                _wait_http(http_port, f"/v2/models/{a.model}/ready", a.ready_timeout_s, proc, log)
                return f"127.0.0.1:{grpc_port}"

            config = {"server": "PyTriton (Triton Inference Server) " + _version(py, "pytriton"),
                      **batching, "instances": a.triton_instances, "torch_threads": threads["triton"],
                      "protocol": "Open Inference Protocol gRPC"}  # fmt: skip
            peers.append(Peer("triton", config, start_triton, ["--protocol", "oip", "--oip-model", a.model]))
        elif name == "litserve":
            why = _check_python(a.litserve_python, "litserve", a)
            if why:
                skipped[name] = why
                continue
            py = str(a.litserve_python)
            template = os.path.join(a.out, "litserve", "request.json")

            def start_litserve(stack: contextlib.ExitStack, py: str = py) -> str:
                port = _free_port()
                log = os.path.join(a.out, "litserve", "server.log")
                args = ["litserve", *common, "--max-batch-size", str(a.max_batch_size),
                        "--max-queue-delay-ms", f"{a.max_queue_delay_ms:g}",
                        "--instances", str(a.litserve_workers), "--port", str(port),
                        "--api-servers", str(a.litserve_api_servers),
                        *(["--fast-queue"] if a.litserve_fast_queue else [])]  # fmt: skip
                proc = _peer_process(stack, py, args, log, server_cpus, threads["litserve"])
                _wait_http(port, "/health", a.ready_timeout_s, proc, log)
                return f"127.0.0.1:{port}"

            config = {"server": "LitServe " + _version(py, "litserve"), **batching,
                      "batch_timeout_s": a.max_queue_delay_ms / 1000,
                      "workers_per_device": a.litserve_workers,
                      "num_api_servers": a.litserve_api_servers or "LitServe's default",
                      "fast_queue": a.litserve_fast_queue, "access_log": False,
                      "torch_threads": threads["litserve"],
                      "protocol": "HTTP/1.1 JSON (base64 payload)"}  # fmt: skip
            peers.append(
                Peer(
                    "litserve",
                    config,
                    start_litserve,
                    ["--protocol", "http-json", "--request-template", template],
                )
            )
        else:
            raise SystemExit(f"--peers: unknown peer {name!r}; use {', '.join(PEERS)}")
    return peers, skipped


def _version(python: str, dist: str) -> str:
    name = {"pytriton": "nvidia-pytriton"}.get(dist, dist)
    code = f"import importlib.metadata as m; print(m.version({name!r}))"
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    return r.stdout.strip() or "?"


def write_template(path: str, model: str) -> None:
    """LitServe's request: the item base64 in ``data`` (feature vectors in ``features``)."""
    from netgain.server.handlers import create_handler

    example = create_handler(model).example_input(random.Random(0))
    body = (
        {"features": "{features}"}
        if not example.data and len(example.features)
        else {"data": "{payload_b64}"}
    )
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        json.dump({"method": "POST", "path": "/predict", "body": body, "expect_status": 200}, fh)


def search_peer(peer: Peer, a: argparse.Namespace, load_cpus: list[int]) -> dict[str, Any]:
    """The capacity search for one peer; its server starts at the first step that has to run."""
    from netgain.experiments import capacity
    from netgain.experiments.orchestrate import run_load
    from netgain.experiments.steps import run_step

    root = os.path.join(a.out, peer.name)
    os.makedirs(root, exist_ok=True)
    steps: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        target: list[str] = []

        def measure(run_dir: str, rate: float) -> None:
            if not target:
                target.append(peer.start(stack))
            args = ["--target", target[0], "--model", a.model, *peer.load_args,
                    "--arrival", "poisson", "--rate", f"{rate:g}", "--duration", f"{a.duration:g}",
                    "--warmup-s", f"{a.warmup_s:g}", "--workers", str(a.load_workers),
                    "--connections", str(a.connections), "--seed", str(a.seed), "--timeout-s", "10",
                    "--wait-ready-s", f"{a.ready_timeout_s:g}", "--slo-p99-ms", f"{a.slo_p99_ms:g}",
                    "--out", run_dir]  # fmt: skip
            rc = run_load(args, quiet=True, cpus=load_cpus, stdout=subprocess.DEVNULL)
            if rc not in (0, 3, 4, 5):
                raise SystemExit(f"netgain load failed (exit {rc}) for {run_dir}")

        def run(rate: float) -> capacity.Trial:
            run_dir = os.path.join(root, "search", f"r{rate:.6g}")
            t, reused = run_step(
                run_dir,
                rate,
                a.slo_p99_ms,
                a.max_error_ratio,
                lambda: measure(run_dir, rate),
                lambda msg: print(f"  {peer.name} {msg}", file=sys.stderr),
            )
            steps.append({"rate": rate, "run_dir": run_dir, **t.__dict__})
            word = "held" if t.held else "missed" + ("" if t.valid else " (invalid run)")
            print(f"  {peer.name} at {rate:.4g} req/s: {t.throughput:.4g} done/s, p99 {t.p99:.2f} ms, {word}"
                  + (" (reused)" if reused else ""), file=sys.stderr, flush=True)  # fmt: skip
            return t

        res = capacity.search(run, a.start_rps, floor=a.min_rps, ceiling=a.max_rps, precision=a.precision)
    cap = res.capacity
    held = [s for s in steps if s["held"]]
    best = max(held, key=lambda s: s["throughput"]) if held else None
    return {
        "peer": peer.name,
        "config": peer.config,
        "capacity": cap.to_dict(),
        "p99_at_capacity_ms": best["p99"] if best else None,
        "bottleneck": best["bottleneck"] if best else (steps[-1]["bottleneck"] if steps else "?"),
        "steps": steps,
    }


def _bracket(cap: dict[str, Any]) -> str:
    if cap["reached_floor"]:
        return f"none held down to {cap['floor_rps']:g}/s"
    hi = "ceiling" if cap["unbounded"] else f"{cap['first_missed']:.4g}"
    return f"[{cap['last_held']:.4g}, {hi})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="run directories and peers.json (reused: resumes)")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated: netgain, triton, litserve")
    ap.add_argument("--model", default="image", help="netgain's handler, as netgain serve --model")
    ap.add_argument("--handler-option", action="append", default=[], help="KEY=VALUE, as netgain serve")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (every peer)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-batch-size", type=int, default=8, help="every peer's (netgain serve's default)")
    ap.add_argument("--max-queue-delay-ms", type=float, default=2.0, help="every peer's batching wait")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra netgain serve argument (--k=v)")
    ap.add_argument("--triton-python", default=os.environ.get("NETGAIN_TRITON_PYTHON"))
    ap.add_argument("--triton-instances", type=int, default=2, help="PyTriton inference-function copies")
    ap.add_argument("--litserve-python", default=os.environ.get("NETGAIN_LITSERVE_PYTHON"))
    ap.add_argument("--litserve-workers", type=int, default=1, help="LitServe workers_per_device")
    ap.add_argument(
        "--litserve-api-servers", type=int, default=0, help="LitServe num_api_servers (0: its default)"
    )
    ap.add_argument("--litserve-fast-queue", action="store_true", help="LitServe fast_queue (ZeroMQ)")
    ap.add_argument(
        "--peer-threads",
        type=int,
        default=0,
        help="OMP_NUM_THREADS of each Triton and LitServe process (0: 1 on cuda; on cpu the cores shared)",
    )
    ap.add_argument("--server-cpus", default="auto", help="cores of every server (0-11,14 or all)")
    ap.add_argument("--load-cpus", default="auto", help="cores of the load generator")
    ap.add_argument("--slo-p99-ms", type=float, default=100.0)
    ap.add_argument("--max-error-ratio", type=float, default=1e-3)
    ap.add_argument("--duration", type=float, default=20.0, help="measured seconds per search step")
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--start-rps", type=float, default=50.0, help="the search's first rate")
    ap.add_argument("--min-rps", type=float, default=1.0)
    ap.add_argument("--max-rps", type=float, default=20000.0)
    ap.add_argument("--precision", type=float, default=0.1, help="bisect until (missed-held)/held <= this")
    ap.add_argument(
        "--load-workers", type=int, default=0, help="netgain load --workers (0: one per load core)"
    )
    ap.add_argument("--connections", type=int, default=4, help="netgain load --connections")
    ap.add_argument("--ready-timeout-s", type=float, default=300.0)
    a = ap.parse_args(argv)
    from netgain.errors import NetgainError
    from netgain.experiments.orchestrate import choose_placement

    try:
        placement = choose_placement(a.server_cpus, a.load_cpus)
    except NetgainError as exc:
        raise SystemExit(f"bench_peers: {exc}") from None
    a.load_workers = placement.load_workers(a.load_workers)
    os.makedirs(a.out, exist_ok=True)
    place = placement.describe_load(a.load_workers, a.connections)
    print(f"host: {os.cpu_count()} cores, {len(os.sched_getaffinity(0))} usable; {place}", flush=True)
    write_template(os.path.join(a.out, "litserve", "request.json"), a.model)
    peers, skipped = make_peers(a, placement.server)
    for p in peers:
        print(f"{p.name}: " + ", ".join(f"{k} {v}" for k, v in p.config.items()), flush=True)
    for name, why in skipped.items():
        print(f"{name}: SKIPPED ({why})", flush=True)
    load = " ".join(f"--{k} {v}" for k, v in [("arrival", "poisson"), ("duration", f"{a.duration:g}"),
                    ("warmup-s", f"{a.warmup_s:g}"), ("workers", a.load_workers),
                    ("connections", a.connections), ("seed", a.seed)])  # fmt: skip
    print(f"load: netgain load {load}; SLO p99 <= {a.slo_p99_ms:g} ms, errors <= {a.max_error_ratio:g}; "
          f"search from {a.start_rps:g}/s in [{a.min_rps:g}, {a.max_rps:g}], precision {a.precision:g}",
          flush=True)  # fmt: skip
    results = []
    for p in peers:
        results.append(search_peer(p, a, placement.load))
    rows = []
    for r in results:
        cap = r["capacity"]
        rows.append([
            r["peer"], r["config"]["server"][:60],
            "n/a" if cap["capacity_rps"] is None else f"{cap['capacity_rps']:.4g}",
            _bracket(cap), "n/a" if r["p99_at_capacity_ms"] is None else f"{r['p99_at_capacity_ms']:.2f}",
            r["bottleneck"], cap["runs"],
        ])  # fmt: skip
    print()
    print(table(rows, ["peer", "configuration", "capacity req/s", "bracket (held, missed) req/s",
                       "p99 ms at capacity", "bottleneck", "runs"]))  # fmt: skip
    for name, why in skipped.items():
        print(f"{name}: skipped ({why})")
    doc = {
        "placement": {"server": placement.server, "load": placement.load, "separate": placement.separate},
        "model": a.model, "handler_options": a.handler_option, "device": a.device,
        "slo_p99_ms": a.slo_p99_ms, "max_error_ratio": a.max_error_ratio, "duration_s": a.duration,
        "peers": results, "skipped": skipped,
    }  # fmt: skip
    path = os.path.join(a.out, "peers.json")
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2, default=str)
    print(f"\n{place}\nwrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
