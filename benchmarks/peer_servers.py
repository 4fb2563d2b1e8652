"""netgain's handler served by a peer: Triton Inference Server (through PyTriton) or LitServe.

Run by ``benchmarks/bench_peers.py`` with the interpreter of the peer's own virtualenv (PyTriton
pins numpy < 2 and tritonclient; LitServe brings FastAPI and uvicorn), never imported by netgain;
the repository root must be on PYTHONPATH so that ``netgain.server.handlers`` imports:

    python benchmarks/peer_servers.py triton --model image --grpc-port P --http-port P --metrics-port P
    python benchmarks/peer_servers.py litserve --model image --port P

Both run the same code as ``netgain serve --model M``: the handler's ``preprocess`` per item,
``collate``, ``forward`` under ``torch.inference_mode`` on ``--device`` (the batch copied there and
the output back, as the server's device stage does), ``postprocess`` per row. Only the serving
around it differs: the peer's own protocol, queue, dynamic batching and workers.

- ``triton``: one model named ``--model``'s name with one input, BYTES ``data`` [1] per item (or FP32
  ``features`` [width] for feature-vector handlers), outputs INT64 ``label`` and FP32 ``score``;
  dynamic batching up to ``--max-batch-size`` waiting at most ``--max-queue-delay-ms``;
  ``--instances`` copies of the inference function (PyTriton runs each on its own thread). Driven
  by ``netgain load --protocol oip`` (gRPC) or ``oip-http``.
- ``litserve``: ``POST /predict`` with JSON ``{"data": BASE64}`` (or ``{"features": [...]}``),
  answering ``{"label": L, "score": S}``; ``max_batch_size``, ``batch_timeout`` and
  ``workers_per_device`` from the flags. Driven by ``netgain load --protocol http-json``.

Binds 127.0.0.1 only; stops on SIGTERM/SIGINT, when its parent dies, or after ``--max-seconds``.
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import signal
import sys
import sysconfig
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Pipeline:
    """The handler's request path as ``netgain serve`` runs it, for one batch of raw inputs."""

    def __init__(self, model: str, options: dict[str, str], device: str, seed: int) -> None:
        from netgain.server.handlers import create_handler

        self.handler = create_handler(model, options, seed)
        self.device = device
        self.model = self.handler.build_model()
        if self.handler.uses_device:  # the null model needs no torch: nor does its peer's venv
            self.model = self.model.to(device)
        example = self.handler.example_input(random.Random(seed))
        self.features = not example.data and len(example.features) > 0
        self.width = len(example.features)
        self.name = self.handler.name

    def input(self, raw: Any) -> Any:
        from netgain.protos import inference_pb2 as pb

        if self.features:
            return pb.Input(features=[float(v) for v in raw])
        return pb.Input(data=bytes(raw))

    def __call__(self, raws: list[Any]) -> list[tuple[int, float]]:
        """(label, score) per input, in order."""
        items = [self.handler.preprocess(self.input(r)) for r in raws]
        return self.answers(self.forward(self.handler.collate(items)))

    def forward(self, batch: Any) -> Any:
        if not self.handler.uses_device:
            return self.handler.forward(self.model, batch)
        import torch

        with torch.inference_mode():
            out = self.handler.forward(self.model, _tree_map(lambda t: t.to(self.device), batch))
        return out.float().cpu()

    def answers(self, out: Any) -> list[tuple[int, float]]:
        rows = [self.handler.postprocess(out[i]) for i in range(len(out))]
        return [(int(r.label), float(r.score)) for r in rows]


def _tree_map(fn: Any, batch: Any) -> Any:
    if isinstance(batch, dict):
        return {k: _tree_map(fn, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_tree_map(fn, v) for v in batch)
    return fn(batch)


def _stop_when(parent: int, deadline: float, stop: threading.Event) -> None:
    """Polled, not waited on: a parent that dies without a signal must stop this server too."""
    while not stop.is_set() and os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()


def serve_triton(a: argparse.Namespace, options: dict[str, str], stop: threading.Event) -> int:
    # The Python backend's stub links libpython3.X.so: load this interpreter's, not another build's.
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if libdir:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p
        )
    import numpy as np
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    def make() -> Any:
        pipe = Pipeline(a.model, options, a.device, a.seed)

        @batch
        def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
            (x,) = inputs.values()
            raws = list(x) if pipe.features else [v for v in x.reshape(x.shape[0], -1)[:, 0]]
            out = pipe(raws)
            return {
                "label": np.array([[lab] for lab, _ in out], dtype=np.int64),
                "score": np.array([[s] for _, s in out], dtype=np.float32),
            }

        return pipe, infer

    made = [make() for _ in range(a.instances)]
    pipe = made[0][0]
    if pipe.features:
        inputs = [Tensor(name="features", dtype=np.float32, shape=(pipe.width,))]
    else:
        inputs = [Tensor(name="data", dtype=np.bytes_, shape=(1,))]
    config = TritonConfig(
        grpc_port=a.grpc_port,
        http_port=a.http_port,
        metrics_port=a.metrics_port,
        grpc_address="127.0.0.1",
        http_address="127.0.0.1",
    )
    model_config = ModelConfig(
        max_batch_size=a.max_batch_size,
        batcher=DynamicBatcher(max_queue_delay_microseconds=int(a.max_queue_delay_ms * 1000)),
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=a.model,
            infer_func=[f for _, f in made],
            inputs=inputs,
            outputs=[
                Tensor(name="label", dtype=np.int64, shape=(1,)),
                Tensor(name="score", dtype=np.float32, shape=(1,)),
            ],
            config=model_config,
            strict=False,
        )
        triton.run()
        print(f"peer_servers: triton serving {a.model} on 127.0.0.1:{a.grpc_port} (gRPC)", flush=True)
        while not stop.is_set() and triton.is_alive():
            time.sleep(0.2)
    return 0


try:  # only the LitServe venv has it; the class is module-level so its spawned workers can unpickle it
    from litserve import LitAPI as _LitAPI
except ImportError:
    _LitAPI = object


class HandlerAPI(_LitAPI):  # type: ignore[misc,valid-type]
    """LitServe's hooks, each one step of the handler's request path."""

    spec_args: tuple[str, dict[str, str], str, int]
    unbatched = False

    def setup(self, device: str) -> None:
        self.pipe = Pipeline(*self.spec_args)

    # Unannotated: LitServe reads the annotation for FastAPI's body type (none: the JSON as a dict).
    def decode_request(self, request):  # type: ignore[no-untyped-def]
        if self.pipe.features:
            return self.pipe.handler.preprocess(self.pipe.input(request["features"]))
        return self.pipe.handler.preprocess(self.pipe.input(base64.b64decode(request["data"])))

    def batch(self, inputs: list[Any]) -> Any:
        return self.pipe.handler.collate(inputs)

    def predict(self, x: Any) -> Any:
        if self.unbatched:  # max_batch_size 1: LitServe hands one item, without batch/unbatch
            return self.pipe.forward(self.pipe.handler.collate([x]))[0]
        return self.pipe.forward(x)

    def unbatch(self, output: Any) -> list[Any]:
        return [output[i] for i in range(len(output))]

    def encode_response(self, output):  # type: ignore[no-untyped-def]
        r = self.pipe.handler.postprocess(output)
        return {"label": int(r.label), "score": float(r.score)}


def serve_litserve(a: argparse.Namespace, options: dict[str, str], stop: threading.Event) -> int:
    import litserve as ls

    api = HandlerAPI(max_batch_size=a.max_batch_size, batch_timeout=a.max_queue_delay_ms / 1000)
    api.spec_args = (a.model, options, a.device, a.seed)
    api.unbatched = a.max_batch_size <= 1
    server = ls.LitServer(
        api,
        accelerator="cpu" if a.device == "cpu" else "cuda",
        devices=1,
        workers_per_device=a.instances,
        timeout=30,
        fast_queue=a.fast_queue,  # ZeroMQ between the API servers and the workers
    )

    def watch() -> None:
        stop.wait()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()
    print(f"peer_servers: litserve serving {a.model} on 127.0.0.1:{a.port}", flush=True)
    # No access log: a line per request costs the API servers CPU that netgain serve does not spend.
    server.run(
        host="127.0.0.1",
        port=a.port,
        num_api_servers=a.api_servers or None,
        generate_client_file=False,
        log_level="warning",
        access_log=False,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("peer", choices=("triton", "litserve"))
    ap.add_argument("--model", default="image", help="netgain's handler (image, text, null, ...)")
    ap.add_argument("--handler-option", action="append", default=[], help="KEY=VALUE, as netgain serve")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--max-queue-delay-ms", type=float, default=2.0)
    ap.add_argument("--instances", type=int, default=1, help="triton: model instances; litserve: workers")
    ap.add_argument("--api-servers", type=int, default=0, help="litserve: num_api_servers (0: its default)")
    ap.add_argument("--fast-queue", action="store_true", help="litserve: fast_queue (ZeroMQ)")
    ap.add_argument("--grpc-port", type=int, default=0)
    ap.add_argument("--http-port", type=int, default=0)
    ap.add_argument("--metrics-port", type=int, default=0)
    ap.add_argument("--port", type=int, default=0, help="litserve's HTTP port")
    ap.add_argument("--max-seconds", type=float, default=3600.0, help="stop after this long, whatever")
    a = ap.parse_args(argv)
    options = dict(o.split("=", 1) for o in a.handler_option)
    stop = threading.Event()
    if a.peer == "triton":  # LitServe's uvicorn handles the signals itself
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    watcher = threading.Thread(
        target=_stop_when, args=(os.getppid(), time.monotonic() + a.max_seconds, stop), daemon=True
    )
    watcher.start()
    if a.peer == "triton":
        return serve_triton(a, options, stop)
    return serve_litserve(a, options, stop)


if __name__ == "__main__":
    sys.exit(main())
