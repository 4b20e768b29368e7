"""Reading config files and model directories for the CLI; every problem is one InvalidInput line."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ropeserve.config.jsonsafe import loads_bounded
from ropeserve.errors import InvalidInput

CONFIG_NAME = "config.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"


@dataclass(frozen=True)
class JsonFile:
    path: str
    text: str
    data: dict[str, Any]


@dataclass(frozen=True)
class ModelFiles:
    config: JsonFile
    tokenizer_config: JsonFile | None = None


def read_json(path: str) -> JsonFile:
    """A JSON object from ``path``; InvalidInput (field = path) when unreadable, invalid or not an object."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise InvalidInput(f"cannot read: {error.strerror or error}", field=path) from None
    except UnicodeDecodeError:
        raise InvalidInput("not UTF-8 text", field=path) from None
    data = loads_bounded(text, error=InvalidInput, field=path)
    if not isinstance(data, dict):
        raise InvalidInput(f"expected a JSON object, got {type(data).__name__}", field=path)
    return JsonFile(path, text, data)


def read_model(path: str) -> ModelFiles:
    """A ``config.json`` file, or a model directory holding ``config.json`` (and ``tokenizer_config.json``)."""
    if not os.path.isdir(path):
        return ModelFiles(read_json(path))
    config_path = os.path.join(path, CONFIG_NAME)
    if not os.path.isfile(config_path):
        raise InvalidInput(f"directory has no {CONFIG_NAME}", field=path)
    tokenizer_path = os.path.join(path, TOKENIZER_CONFIG_NAME)
    tokenizer = read_json(tokenizer_path) if os.path.isfile(tokenizer_path) else None
    return ModelFiles(read_json(config_path), tokenizer)
