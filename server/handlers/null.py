"""The null model: no torch, no device. Measures the server's own overhead."""

from __future__ import annotations

import random
from typing import Any

from netgain.contract.payloads import null_bytes
from netgain.protos import inference_pb2 as pb
from netgain.server.handlers.base import Handler


class NullHandler(Handler):
    name = "null"
    uses_device = False

    def build_model(self) -> Any:
        return None

    def preprocess(self, item: pb.Input) -> Any:
        return len(item.data) + len(item.features)

    def collate(self, items: list[Any]) -> Any:
        return items

    def forward(self, model: Any, batch: Any) -> Any:
        return batch

    def postprocess(self, row: Any) -> pb.Output:
        return pb.Output(label=int(row))

    def example_input(self, rng: random.Random, size: int | None = None) -> pb.Input:
        return pb.Input(data=null_bytes(rng, size))
