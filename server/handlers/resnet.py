"""ResNet-50 image classifier with random weights: the image handler's decode and resize, then the
ResNet-50 v1.5 architecture (torchvision's ``resnet50(weights=None)``, written here in plain torch:
bottleneck blocks [3, 4, 6, 3], widths 64 to 2048, the stride on the 3x3 convolution), 1000
classes, about 25.6 million parameters. No download and no torchvision: the weights are drawn
from ``seed`` as torchvision initialises them.
"""

from __future__ import annotations

from typing import Any

from netgain.server.handlers.image import _MEAN, _STD, ImageHandler

BLOCKS = (3, 4, 6, 3)
WIDTHS = (64, 128, 256, 512)
EXPANSION = 4


def build_resnet50(classes: int) -> Any:
    """The module, on the CPU; the caller seeds torch's generator. Input: uint8 pixels, channels
    first or last (as the image handler's resize leaves them), normalised on the device."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, inp: int, width: int, stride: int) -> None:
            super().__init__()
            out = width * EXPANSION
            self.conv1 = nn.Conv2d(inp, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, out, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample: nn.Module | None = None
            if stride != 1 or inp != out:
                conv = nn.Conv2d(inp, out, 1, stride, bias=False)
                self.downsample = nn.Sequential(conv, nn.BatchNorm2d(out))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            identity = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + identity)

    class ResNet50(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1) * 255.0)
            self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1) * 255.0)
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            stages: list[nn.Module] = []
            inp = 64
            for i, (n, width) in enumerate(zip(BLOCKS, WIDTHS, strict=True)):
                blocks = []
                for j in range(n):
                    blocks.append(Bottleneck(inp, width, 2 if j == 0 and i > 0 else 1))
                    inp = width * EXPANSION
                stages.append(nn.Sequential(*blocks))
            self.layer1, self.layer2, self.layer3, self.layer4 = stages
            self.fc = nn.Linear(inp, classes)
            for m in self.modules():  # torchvision's initialisation
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.constant_(m.weight, 1.0)
                    nn.init.constant_(m.bias, 0.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mean: torch.Tensor = self.mean  # type: ignore[assignment]
            std: torch.Tensor = self.std  # type: ignore[assignment]
            if x.shape[1] != 3:  # channels last (the side is at least 8): channels first
                x = x.permute(0, 3, 1, 2)
            x = ((x.to(mean.dtype) - mean) / std).contiguous()
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

    return ResNet50()


class ResNet50Handler(ImageHandler):
    """Options as ``image`` (``size`` 224, ``classes`` 1000, ``max_pixels``, ``resize``): the same
    payloads and pre-processing, a ResNet-50 instead of the small CNN."""

    name = "resnet50"

    def build_model(self) -> Any:
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return build_resnet50(self.classes).eval()
