"""netgain wire contract (package ``netgain.v1``): messages and service glue."""

from netgain.protos import inference_pb2 as pb
from netgain.protos.service import SERVICE_NAME, InferenceStub, add_inference_servicer

__all__ = ["SERVICE_NAME", "InferenceStub", "add_inference_servicer", "pb"]
