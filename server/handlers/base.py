"""The handler contract: how a model plugs into the server.

A handler turns CPU payloads into a batch, runs the forward pass on a device and
turns the output back into responses. The server owns batching, copies, timing
and threads; the handler owns only model-specific work. Users name their own
class as ``module:Class`` (see "Handlers: your own model" in docs/server.md).
"""

from __future__ import annotations

import random
from typing import Any

from netgain.contract.payloads import int_option
from netgain.protos import inference_pb2 as pb


class InvalidInput(ValueError):
    """A payload the handler cannot use. Fails only its own request with INVALID_ARGUMENT."""


class NonFiniteOutput(ValueError):
    """The model produced NaN or infinity for an item: its request fails (INVALID_ARGUMENT), never OK."""


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

    def __init__(self, options: dict[str, str] | None = None, seed: int = 0) -> None:
        self.options = dict(options or {})
        self.seed = seed

    # -- options -----------------------------------------------------------------
    def int_option(self, key: str, default: int, lo: int = 1, hi: int = 1 << 30) -> int:
        """``--handler-option key=value`` as an integer in ``[lo, hi]`` (ValueError otherwise)."""
        return int_option(self.options, key, default, lo, hi)

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
        import torch

        return torch.stack(items)

    def forward(self, model: Any, batch: Any) -> Any:
        """Device work for one batch. Must return a tensor whose first dimension is the item index."""
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
