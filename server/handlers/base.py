"""The handler contract: how a model plugs into the server.

A handler turns CPU payloads into a batch, runs the forward pass on a device and
turns the output back into responses. The server owns batching, copies, timing
and threads; the handler owns only model-specific work. Users name their own
class as ``module:Class`` (see "Handlers: your own model" in docs/server.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from netgain.contract.payloads import int_option
from netgain.protos import inference_pb2 as pb


class InvalidInput(ValueError):
    """A payload the handler cannot use. Fails only its own request with INVALID_ARGUMENT."""


class NonFiniteOutput(ValueError):
    """The model produced NaN or infinity for an item: its request fails (INVALID_ARGUMENT), never OK."""


@dataclass
class PartialOutput:
    """What ``forward`` returns when some items of its batch turn out to be bad input only on the
    device (a JPEG body nvJPEG cannot decode): ``output`` has one row per item, and ``invalid`` maps
    a bad item's row to its one-line message. Those requests fail with INVALID_ARGUMENT (their rows
    are never read); the others are answered as usual."""

    output: Any
    invalid: dict[int, str] = field(default_factory=dict)


class Handler:
    """Base class for model handlers.

    Subclasses set ``name`` and override ``build_model``, ``preprocess``,
    ``forward`` and ``postprocess``; ``collate`` defaults to ``torch.stack``.
    ``options`` come from ``--handler-option key=value`` and are strings.
    """

    name = "custom"
    #: False for handlers that never touch torch (the null model): no copies, no device.
    uses_device = True
    #: True when every batch of a given size has the same input shapes (CUDA graphs allowed).
    fixed_shapes = False
    #: True when the batch stays on the host and ``forward`` makes its own copies (no pinning, no h2d
    #: copy, no CUDA graphs); ``collate`` then defaults to a list of the items.
    host_inputs = False
    #: Bytes one pre-processed item may take where ``example_input``'s do not show it: the
    #: ``--workers`` hand-off slots are sized for at least this much (0: the example items alone).
    max_item_bytes = 0

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        self.options = dict(options or {})
        self.seed = seed

    # -- options -----------------------------------------------------------------
    def int_option(self, key: str, default: int, lo: int = 1, hi: int = 1 << 30) -> int:
        """``--handler-option key=value`` as an integer in ``[lo, hi]`` (ValueError otherwise)."""
        return int_option(self.options, key, default, lo, hi)

    def check_device(self, device: str) -> None:
        """Raise ValueError (one line) when these options cannot serve on ``device`` (``cpu``,
        ``cuda``, ``cuda:N``); the server calls it at start-up, before it builds the model."""

    # -- model lifecycle ---------------------------------------------------------
    def build_model(self) -> Any:
        """Build the model on the CPU, deterministically from ``self.seed``. Returns a torch.nn.Module."""
        raise NotImplementedError

    # -- request path ------------------------------------------------------------
    def preprocess(self, item: pb.Input) -> Any:
        """CPU work for one item (decode, tokenize, features). Raise InvalidInput on bad payloads."""
        raise NotImplementedError

    def collate(self, items: list[Any]) -> Any:
        """Combine preprocessed items into one batch (a tensor or a dict of tensors)."""
        if self.host_inputs:
            return list(items)
        import torch

        return torch.stack(items)

    def forward(self, model: Any, batch: Any) -> Any:
        """Device work for one batch. Must return a tensor whose first dimension is the item index
        (or a PartialOutput holding one, when some items prove invalid only here)."""
        return model(batch)

    def postprocess(self, row: Any) -> pb.Output:
        """CPU work for one item of the output (already on the host)."""
        raise NotImplementedError

    # -- payloads ----------------------------------------------------------------
    def example_input(self, rng: random.Random, size: int | None = None) -> pb.Input:
        """A valid payload, for warm-up and for the load generator. ``size`` is a hint in bytes or items."""
        raise NotImplementedError


def argmax_output(row: Any) -> pb.Output:
    """Post-processing shared by the classifiers: top class and its softmax score.

    A row holding NaN or infinity raises NonFiniteOutput: finite inputs can still overflow the
    model, and a NaN score must never be answered as OK. The pipeline fails that request only,
    with INVALID_ARGUMENT: the input drove the model out of floating-point range (handlers that can
    name the input responsible, as tabular does, refuse it in preprocess first)."""
    import numpy as np
    import torch

    x = row.detach()
    a = (x if x.dtype == torch.float32 else x.float()).cpu().numpy().reshape(-1)  # numpy: no op dispatch
    finite = np.isfinite(a)
    if not finite.all():
        raise NonFiniteOutput(
            f"model output is not finite ({a.size - int(finite.sum())} of {a.size} values NaN or infinite): "
            "the input drove the model out of floating-point range"
        )
    label = int(a.argmax())
    score = 1.0 / float(np.exp(a - a[label], dtype=np.float32).sum(dtype=np.float32))  # softmax at the top
    return pb.Output(label=label, score=score)
