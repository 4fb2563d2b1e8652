"""Tabular MLP: a feature vector per item → class scores."""

from __future__ import annotations

import random
from typing import Any

from netgain.contract.payloads import tabular_features
from netgain.protos import inference_pb2 as pb
from netgain.server.handlers.base import Handler, InvalidInput, argmax_output


class TabularHandler(Handler):
    """Options: ``features`` (default 64), ``hidden`` (256), ``layers`` (3), ``classes`` (10)."""

    name = "tabular"
    fixed_shapes = True

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)
        self.features = self.int_option("features", 64, hi=1 << 16)
        self.hidden = self.int_option("hidden", 256, hi=1 << 16)
        self.layers = self.int_option("layers", 3, hi=64)
        self.classes = self.int_option("classes", 10, hi=1 << 16)

    def build_model(self) -> Any:
        import torch
        from torch import nn

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            mods: list[nn.Module] = []
            width = self.features
            for _ in range(self.layers):
                mods += [nn.Linear(width, self.hidden), nn.ReLU()]
                width = self.hidden
            mods.append(nn.Linear(width, self.classes))
            return nn.Sequential(*mods).eval()

    def preprocess(self, item: pb.Input) -> Any:
        import numpy as np
        import torch

        n = len(item.features)
        if n != self.features:
            raise InvalidInput(f"expected {self.features} features, got {n}")
        arr = np.fromiter(item.features, dtype=np.float32, count=n)
        bad = ~np.isfinite(arr)
        if bad.any():
            i = int(np.argmax(bad))
            raise InvalidInput(f"feature {i} is {arr[i]}: features must be finite")
        return torch.from_numpy(arr)

    def postprocess(self, row: Any) -> pb.Output:
        return argmax_output(row)

    def example_input(self, rng: random.Random, size: int | None = None) -> pb.Input:
        return pb.Input(features=tabular_features(rng, self.features))
