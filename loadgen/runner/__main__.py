"""``python -m netgain.loadgen.runner --master-host H --master-port P``: a bare worker process.

This is what the master spawns for local workers."""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m netgain.loadgen.runner")
    parser.add_argument("--master-host", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, required=True)
    args = parser.parse_args()
    import locust  # noqa: F401 - gevent patching before grpc is used
    from grpc.experimental import gevent as grpc_gevent  # type: ignore[attr-defined]

    grpc_gevent.init_gevent()
    from netgain.loadgen.runner.worker import run_worker

    return run_worker(args.master_host, args.master_port)


if __name__ == "__main__":
    sys.exit(main())
