"""Tabular MLP: a feature vector per item → class scores."""

from __future__ import annotations

import math
import random
from typing import Any

from netgain.contract.payloads import tabular_features
from netgain.protos import inference_pb2 as pb
from netgain.server.handlers.base import Handler, InvalidInput, argmax_output

FLOAT32_MAX = 3.4028234663852886e38


def finite_bound(fan_ins: list[int]) -> float:
    """The largest feature magnitude the MLP cannot overflow in float32. Each layer's weights and
    biases lie within +-1/sqrt(fan_in) (torch's default init), so |out| <= (sqrt(fan_in) + 1) |in|
    for |in| >= 1; ReLU never grows a value; a factor 2 spares rounding. A float32 value (rounded
    down), so that float32 features compare with it alike in float32 and float64."""
    import numpy as np

    amplification = 1.0
    for n in fan_ins:
        amplification *= math.sqrt(n) + 1.0
    bound = FLOAT32_MAX / (2.0 * amplification)
    as32 = np.float32(bound)
    return float(as32 if float(as32) <= bound else np.nextafter(as32, np.float32(0)))


class TabularHandler(Handler):
    """Options: ``features`` (default 64), ``hidden`` (256), ``layers`` (3), ``classes`` (10).
    Features must be finite and within ``finite_bound`` (3.8e33 for the defaults)."""

    name = "tabular"
    fixed_shapes = True

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        super().__init__(options, seed)
        self.features = self.int_option("features", 64, hi=1 << 16)
        self.hidden = self.int_option("hidden", 256, hi=1 << 16)
        self.layers = self.int_option("layers", 3, hi=64)
        self.classes = self.int_option("classes", 10, hi=1 << 16)
        self.max_abs = finite_bound([self.features] + [self.hidden] * self.layers)

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
        big = np.abs(arr) > self.max_abs
        if big.any():
            i = int(np.argmax(big))
            raise InvalidInput(
                f"feature {i} is {arr[i]:.6g}: beyond +-{self.max_abs:.3g}, the largest magnitude for "
                "which this model's float32 output stays finite"
            )
        return torch.from_numpy(arr)

    def postprocess(self, row: Any) -> pb.Output:
        return argmax_output(row)

    def example_input(self, rng: random.Random, size: int | None = None) -> pb.Input:
        return pb.Input(features=tabular_features(rng, self.features))
