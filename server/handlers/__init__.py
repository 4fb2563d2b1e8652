"""Built-in handlers and the ``module:Class`` loader."""

from __future__ import annotations

import importlib
import os
import sys

from netgain.server.handlers.base import Handler, InvalidInput

BUILTIN = {
    "null": "netgain.server.handlers.null:NullHandler",
    "tabular": "netgain.server.handlers.tabular:TabularHandler",
    "image": "netgain.server.handlers.image:ImageHandler",
    "text": "netgain.server.handlers.text:TextHandler",
    # reference models at real size, random weights
    "resnet50": "netgain.server.handlers.resnet:ResNet50Handler",
    "bert-base": "netgain.server.handlers.text:BertBaseHandler",
}


def resolve_handler_class(spec: str) -> type[Handler]:
    """``image`` / ``text`` / ``tabular`` / ``null`` / ``resnet50`` / ``bert-base``, or
    ``package.module:Class`` for a user's handler.

    User handlers are loaded only from an explicit ``module:Class`` path, never guessed. The module
    is looked for on the path and then in the current directory, in every command and process
    (serve, its workers, load's workers), so ``mymodel:MyModel`` beside the user is found.
    """
    target = BUILTIN.get(spec, spec)
    if ":" not in target:
        names = ", ".join(sorted(BUILTIN))
        raise ValueError(f"unknown model {spec!r}: use one of {names} or module:Class")
    module_name, _, class_name = target.partition(":")
    here = os.getcwd()
    if spec not in BUILTIN and here not in sys.path and "" not in sys.path:
        sys.path.append(here)  # after installed packages: a file here never shadows one of them
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"cannot import handler module {module_name!r} (looked on PYTHONPATH and in {here}): {exc}"
        ) from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} ({module.__file__}) has no class {class_name!r}")
    if not isinstance(cls, type) or not issubclass(cls, Handler):
        raise ValueError(f"{target!r} is not a subclass of netgain.server.handlers.Handler")
    return cls


def create_handler(spec: str, options: dict[str, str] | None = None, seed: int = 0) -> Handler:
    return resolve_handler_class(spec)(options=options, seed=seed)


__all__ = ["BUILTIN", "Handler", "InvalidInput", "create_handler", "resolve_handler_class"]
