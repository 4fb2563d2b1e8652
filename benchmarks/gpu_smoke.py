"""Smoke check on a GPU host: image and text on cuda answer with every phase, GPU metrics are exported."""

from __future__ import annotations

import random
import sys
import time
import urllib.request

import grpc

from netgain.experiments.orchestrate import ServerProcess
from netgain.protos import InferenceStub, pb
from netgain.server.handlers import create_handler


def main() -> int:
    failures = 0
    for model, dtype in (("image", "float32"), ("text", "bfloat16")):
        with ServerProcess(["--model", model, "--device", "cuda", "--dtype", dtype, "--nvtx"]) as sp:
            sp.wait_ready()
            h = create_handler(model)
            with grpc.insecure_channel(sp.target) as ch:
                stub = InferenceStub(ch)
                for i in range(5):
                    req = pb.InferRequest(inputs=[h.example_input(random.Random(i)) for _ in range(4)])
                    resp, call = stub.Infer.with_call(req, metadata=(("x-request-id", f"smoke-{i}"),))
                md = dict(call.trailing_metadata())
                info = stub.ServerInfo(pb.ServerInfoRequest())
            time.sleep(2.5)  # the sampler publishes GPU gauges once a second
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{sp.metrics_port}/metrics").read().decode()
            gpu_lines = [ln for ln in metrics.splitlines() if ln.startswith("netgain_gpu_")]
            print(
                f"{model} {dtype}: outputs={len(resp.outputs)} trailer={md.get('server-timing')} "
                f"device={info.device} gpu={info.versions.get('gpu')} "
                f"driver={info.versions.get('driver')} "
                f"cold={[(c.name, round(c.duration_s, 3)) for c in info.cold_start]}"
            )
            print("  " + "\n  ".join(gpu_lines[:8]))
            ok = "h2d;dur=" in md.get("server-timing", "") and bool(gpu_lines)
            failures += 0 if ok else 1
    return failures


if __name__ == "__main__":
    sys.exit(main())
