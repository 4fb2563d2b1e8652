"""A real Triton Inference Server (through PyTriton) for tests/test_oip_triton.py.

Run by the interpreter of a separate virtualenv that has ``nvidia-pytriton`` (it pins numpy<2 and
tritonclient~=2.50, so it cannot share netgain's environment), never imported by netgain's tests:

    python tests/triton_server.py GRPC_PORT HTTP_PORT METRICS_PORT [--max-seconds S]

Models, each shaped the way ``netgain load --protocol oip --model M`` sends requests (one input
tensor, read from ModelMetadata; BYTES items or FP32 rows; the batch dimension filled in):

- ``null``: BYTES ``payload`` [-1] per item (``--model null``), answers each item's length;
- ``image_jpeg``: BYTES ``jpeg`` [1] per item (``--model image``), answers each item's length and
  refuses an item that is not a JPEG (so an OK proves the load generator sent JPEGs);
- ``tabular_sum``: FP32 ``features`` [16] per row (``--model tabular``), answers each row's sum;
- ``fail``: BYTES ``payload`` [-1], raises on every request (the errors' path).

It binds 127.0.0.1 only and stops (stopping tritonserver with it) on SIGTERM or SIGINT, when its
parent process dies, or after ``--max-seconds``, so a test that is killed leaves nothing running.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import sysconfig
import time
from typing import Any

import numpy as np

JPEG_MAGIC = b"\xff\xd8\xff"


def _items(x: np.ndarray) -> list[bytes]:
    """A BYTES batch (pytriton hands numpy bytes or object arrays) as one bytes value per row."""
    return [bytes(v) for v in x.reshape(x.shape[0], -1)[:, 0]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("grpc_port", type=int)
    parser.add_argument("http_port", type=int)
    parser.add_argument("metrics_port", type=int)
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop after this long, whatever")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.max_seconds
    parent = os.getppid()

    # The Python backend's stub links libpython3.11.so.1.0: load this interpreter's, not another build's.
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    if libdir:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir, os.environ.get("LD_LIBRARY_PATH", "")) if p
        )

    # Imported after the environment is set: pytriton copies it when it starts tritonserver.
    from pytriton.decorators import batch
    from pytriton.model_config import ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    @batch
    def null(payload: np.ndarray) -> dict[str, np.ndarray]:
        return {"length": np.array([[len(v)] for v in _items(payload)], dtype=np.int64)}

    @batch
    def image_jpeg(jpeg: np.ndarray) -> dict[str, np.ndarray]:
        items = _items(jpeg)
        bad = [i for i, v in enumerate(items) if not v.startswith(JPEG_MAGIC)]
        if bad:
            raise ValueError(f"items {bad} are not JPEGs")
        return {"length": np.array([[len(v)] for v in items], dtype=np.int64)}

    @batch
    def tabular_sum(features: np.ndarray) -> dict[str, np.ndarray]:
        return {"sum": features.astype(np.float32).sum(axis=1, keepdims=True)}

    @batch
    def fail(payload: np.ndarray) -> dict[str, np.ndarray]:
        raise RuntimeError(f"the fail model fails every request ({len(payload)} items)")

    stop = False

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    config = TritonConfig(
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        grpc_address="127.0.0.1",
        http_address="127.0.0.1",
    )
    length = Tensor(name="length", dtype=np.int64, shape=(1,))
    batched = ModelConfig(max_batch_size=16)
    with Triton(config=config) as triton:
        triton.bind(
            model_name="null",
            infer_func=null,
            inputs=[Tensor(name="payload", dtype=np.bytes_, shape=(-1,))],
            outputs=[length],
            config=batched,
        )
        triton.bind(
            model_name="image_jpeg",
            infer_func=image_jpeg,
            inputs=[Tensor(name="jpeg", dtype=np.bytes_, shape=(1,))],
            outputs=[length],
            config=batched,
        )
        triton.bind(
            model_name="tabular_sum",
            infer_func=tabular_sum,
            inputs=[Tensor(name="features", dtype=np.float32, shape=(16,))],
            outputs=[Tensor(name="sum", dtype=np.float32, shape=(1,))],
            config=batched,
        )
        triton.bind(
            model_name="fail",
            infer_func=fail,
            inputs=[Tensor(name="payload", dtype=np.bytes_, shape=(-1,))],
            outputs=[length],
            config=batched,
        )
        triton.run()
        print(f"triton_server: serving on 127.0.0.1:{args.grpc_port}", flush=True)
        # Polled, not waited on: a parent that dies without a signal must stop this server too.
        while not stop and triton.is_alive() and os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.2)
        print("triton_server: stopping", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
