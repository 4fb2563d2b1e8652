"""Regenerate protos/inference_pb2.py, protos/oip_pb2.py and their .pyi from the .proto files.

Run from the repository root: ``python protos/generate.py``. Only message code is
generated; the service glue in ``protos/service.py`` is built from the descriptors,
so the result imports under any grpcio (no generated-version check).

The committed files were made with grpcio-tools 1.62.3 (protoc 25.1, protobuf gencode 4.25.1):
gencode that old carries no runtime-version check, so one committed file imports under every
protobuf runtime netgain allows (5.26 to 7.x, pyproject.toml), including the 6.x that
tritonclient[grpc] pins. A newer protoc writes ``ValidateProtobufRuntimeVersion`` calls that refuse
an older runtime, so regenerate with that version (``pip install grpcio-tools==1.62.3`` into a
scratch ``--target`` directory and put it first on PYTHONPATH); this script refuses another.

``oip.proto`` (package ``inference``) declares the same message names as Triton's and KServe's
``grpc_service.proto``; tritonclient registers those in protobuf's default descriptor pool, so
netgain's copy is built into a private pool (the one edit below) and both import in one process.
"""

from __future__ import annotations

import pathlib
import sys

PROTOC_VERSION = "1.62.3"
PROTOS = ("protos/inference.proto", "protos/oip.proto")
PRIVATE_POOL = {
    "protos/oip_pb2.py": (
        "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(",
        "# A private pool: tritonclient's grpc_service.proto defines the same names in the default one.\n"
        "POOL = _descriptor_pool.DescriptorPool()\n"
        "DESCRIPTOR = POOL.AddSerializedFile(",
    ),
}


def main() -> int:
    from importlib.metadata import version

    from grpc_tools import protoc

    found = version("grpcio-tools")
    if found != PROTOC_VERSION:
        print(f"generate.py: grpcio-tools {found} found, {PROTOC_VERSION} needed (see the docstring)")
        return 2
    root = pathlib.Path(__file__).resolve().parent.parent
    rc = protoc.main(["protoc", f"-I{root}", f"--python_out={root}", f"--pyi_out={root}", *PROTOS])
    if rc:
        return int(rc)
    for proto in PROTOS:
        path = root / proto.replace(".proto", "_pb2.py")
        text = path.read_text()
        # Message classes' __module__ is the import path (pickling in --workers relies on it).
        module = proto.replace("/", ".").removesuffix(".proto") + "_pb2"
        text = text.replace(f"'{module}'", f"'netgain.{module}'")
        edit = PRIVATE_POOL.get(str(path.relative_to(root)))
        if edit:
            assert edit[0] in text, f"{path}: generated code changed shape; update PRIVATE_POOL"
            text = text.replace(edit[0], edit[1])
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
