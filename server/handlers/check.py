"""A handler checked before the server starts: each method the contract needs exists, and its own
``example_input`` goes through ``preprocess`` and ``collate``. Each failure is one line naming the
method, so a user's unfinished handler never ends in a traceback from a server process."""

from __future__ import annotations

import random
from typing import Any

from netgain.protos import inference_pb2 as pb
from netgain.server.handlers import Handler, resolve_handler_class

REQUIRED = ("build_model", "preprocess", "postprocess", "example_input")
SEE = "see docs/server.md, 'Handlers: your own model'"


class HandlerError(ValueError):
    """A handler that breaks the contract; the message names the method and how to fix it."""


def _call(where: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except NotImplementedError:
        raise HandlerError(f"{where} is not implemented ({SEE})") from None
    except Exception as exc:  # a user's code: any error, said in one line
        raise HandlerError(f"{where} raised {type(exc).__name__}: {exc}".rstrip(": ")) from None


def check_handler(spec: str, options: dict[str, str] | None = None, seed: int = 0) -> Handler:
    """The handler named by ``spec``, built with ``options``; HandlerError (one line) if it cannot serve."""
    cls = resolve_handler_class(spec)
    name = f"{cls.__module__}:{cls.__qualname__}"
    missing = [m for m in REQUIRED if getattr(cls, m) is getattr(Handler, m)]
    if missing:
        methods = ", ".join(f"{m}()" for m in missing)
        raise HandlerError(f"handler {name} does not define {methods} ({SEE})")
    handler: Handler = _call(f"{name}(options={dict(options or {})})", cls, options, seed)
    example = _call(f"{name}.example_input", handler.example_input, random.Random(seed))
    if not isinstance(example, pb.Input):
        raise HandlerError(
            f"{name}.example_input returned {type(example).__name__}, not an Input "
            "(from netgain.protos import inference_pb2 as pb; return pb.Input(data=... or features=...))"
        )
    item = _call(f"{name}.preprocess(example_input())", handler.preprocess, example)
    _call(f"{name}.collate([preprocess(example_input())])", handler.collate, [item])
    return handler
