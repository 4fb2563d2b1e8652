"""Regenerate protos/inference_pb2.py and .pyi from inference.proto.

Run from the repository root: ``python protos/generate.py``. Only message code is
generated; the service glue in ``protos/service.py`` is built from the descriptor,
so the result imports under any grpcio (no generated-version check).
Requires grpcio-tools; the committed files were made with grpcio-tools 1.85.1
(protobuf gencode 7.35.1, which the protobuf>=7.35.1 runtime accepts).
"""

from __future__ import annotations

import pathlib
import sys


def main() -> int:
    from grpc_tools import protoc

    root = pathlib.Path(__file__).resolve().parent.parent
    args = ["protoc", f"-I{root}", f"--python_out={root}", f"--pyi_out={root}", "protos/inference.proto"]
    return protoc.main(args)


if __name__ == "__main__":
    sys.exit(main())
