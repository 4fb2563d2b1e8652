"""The reference models at real size (resnet50, bert-base): their architecture, the handler
contract on the CPU, deterministic weights from the seed, bad payloads, and a real server that
serves them by name to the load generator's payloads. Each model is built once per module."""

from __future__ import annotations

import random
from typing import Any

import grpc
import pytest
import torch
from conftest import ServerLauncher
from torch import nn

from netgain.contract.payloads import BUILTIN as PAYLOADS
from netgain.loadgen.payloads import PayloadFactory
from netgain.protos import InferenceStub, pb
from netgain.server.handlers import BUILTIN, create_handler, resolve_handler_class
from netgain.server.handlers.base import InvalidInput
from netgain.server.handlers.resnet import ResNet50Handler
from netgain.server.handlers.text import BertBaseHandler, TextHandler

RESNET50_PARAMETERS = 25_557_032  # torchvision's resnet50(weights=None)
BERT_LAYER_PARAMETERS = 7_087_872  # one BERT-base encoder layer: attention, feed-forward, two norms


@pytest.fixture(scope="module")
def resnet() -> tuple[ResNet50Handler, Any]:
    h = ResNet50Handler(seed=0)
    return h, h.build_model()


@pytest.fixture(scope="module")
def bert() -> tuple[BertBaseHandler, Any]:
    h = BertBaseHandler(seed=0)
    return h, h.build_model()


def _run(h: Any, model: Any, items: list[pb.Input]) -> torch.Tensor:
    with torch.inference_mode():
        return h.forward(model, h.collate([h.preprocess(x) for x in items]))


def _examples(h: Any, n: int = 2) -> list[pb.Input]:
    rng = random.Random(7)
    return [h.example_input(rng) for _ in range(n)]


def test_served_by_name_with_built_in_payloads() -> None:
    assert resolve_handler_class("resnet50") is ResNet50Handler
    assert resolve_handler_class("bert-base") is BertBaseHandler
    assert set(PAYLOADS) == set(BUILTIN)  # every model the server knows, the load generator can feed
    for name in ("resnet50", "bert-base"):
        factory = PayloadFactory(name, seed=1)
        request = pb.InferRequest.FromString(factory.request_bytes(0, 0, 2))
        h = create_handler(name)
        assert h.name == name and len(request.inputs) == 2
        assert all(h.preprocess(x) is not None for x in request.inputs)


def test_resnet50_is_the_real_architecture(resnet: tuple[ResNet50Handler, Any]) -> None:
    _, model = resnet
    assert sum(p.numel() for p in model.parameters()) == RESNET50_PARAMETERS
    stages = [model.layer1, model.layer2, model.layer3, model.layer4]
    assert [len(s) for s in stages] == [3, 4, 6, 3]
    assert [s[-1].conv3.out_channels for s in stages] == [256, 512, 1024, 2048]
    assert (model.fc.in_features, model.fc.out_features) == (2048, 1000)


def test_bert_base_is_bert_sized(bert: tuple[BertBaseHandler, Any]) -> None:
    h, model = bert
    layers = model.encoder.layers
    assert len(layers) == 12 and h.max_len == 128 and h.pad_fixed
    first = layers[0]
    assert first.self_attn.embed_dim == 768 and first.self_attn.num_heads == 12
    assert first.linear1.out_features == 3072 and first.activation is nn.functional.gelu
    assert sum(p.numel() for p in layers.parameters()) == 12 * BERT_LAYER_PARAMETERS
    assert model.embed.num_embeddings == 30522
    # the preset's defaults give way to the text handler's options
    assert BertBaseHandler({"layers": "2", "pad": "longest"}).layers == 2
    assert TextHandler().layers == 6 and TextHandler().activation == "relu"


@pytest.mark.parametrize("which", ["resnet", "bert"])
def test_handler_contract_on_cpu(which: str, request: pytest.FixtureRequest) -> None:
    """example_input -> preprocess -> collate -> forward -> postprocess: one finite output per item,
    the same for an item whichever batch it is in."""
    h, model = request.getfixturevalue(which)
    items = _examples(h, 3)
    out = _run(h, model, items)
    assert out.shape == (3, h.classes) and torch.isfinite(out).all()
    replies = [h.postprocess(row) for row in out]
    assert all(0 <= r.label < h.classes and 0.0 < r.score <= 1.0 for r in replies)
    alone = _run(h, model, items[1:2])
    assert torch.allclose(alone[0], out[1], atol=1e-4, rtol=1e-4)
    if which == "bert":
        ids = h.collate([h.preprocess(x) for x in items])["ids"]
        assert ids.shape == (3, 128)  # fixed shapes: every request padded to 128 tokens


@pytest.mark.parametrize("which", ["resnet", "bert"])
def test_weights_come_from_the_seed(which: str, request: pytest.FixtureRequest) -> None:
    h, model = request.getfixturevalue(which)
    cls = type(h)
    again = cls(seed=0).build_model()
    items = _examples(h)
    assert torch.equal(_run(h, model, items), _run(h, again, items))
    other = cls(seed=1).build_model()
    assert not torch.allclose(_run(h, model, items), _run(h, other, items))


@pytest.mark.parametrize(
    ("handler", "payload", "message"),
    [
        (ResNet50Handler, b"\xff\xd8\xff\xe0 a JPEG cut short", "image header is truncated or corrupt"),
        (ResNet50Handler, b"GIF89a", "not a decodable JPEG or PNG"),
        (BertBaseHandler, b"caf\xc3", "text is not valid UTF-8"),
        (BertBaseHandler, b" \t\x00 ", "text is empty after normalisation"),
    ],
)
def test_bad_payloads_are_invalid_input(handler: Any, payload: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        handler().preprocess(pb.Input(data=payload))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "bert-base"])
def test_a_server_serves_it_by_name(start_server: ServerLauncher, name: str) -> None:
    """`netgain serve --model NAME` on the CPU answers the load generator's payloads, and fails only
    the bad request of a batch with INVALID_ARGUMENT."""
    srv = start_server("--model", name, "--max-batch-size", "2", "--max-queue-delay-ms", "50")
    stub = InferenceStub(srv.channel)
    good = pb.InferRequest.FromString(PayloadFactory(name, seed=3).request_bytes(0, 0, 1))
    bad = pb.InferRequest(inputs=[pb.Input(data=b"\xff\xfe not this model's payload \xc3")])
    futures = [
        stub.Infer.future(req, metadata=[("x-request-id", rid)], timeout=60.0)
        for rid, req in (("good", good), ("bad", bad))
    ]
    resp = futures[0].result()
    assert resp.model == name and len(resp.outputs) == 1
    with pytest.raises(grpc.RpcError) as err:
        futures[1].result()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
