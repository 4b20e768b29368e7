"""Built-in presets: public ``config.json`` files of popular checkpoints, shipped as package data."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from ropeserve.errors import InvalidInput

_PRESET_DIR = "presets"


@cache
def preset_catalog() -> dict[str, dict[str, Any]]:
    """Preset name -> ``{"source": checkpoint, "config": config.json dict}``, read once."""
    folder = resources.files(__package__).joinpath(_PRESET_DIR)
    catalog = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            catalog[entry.name.removesuffix(".json")] = json.loads(entry.read_text(encoding="utf-8"))
    return catalog


def preset_config(name: str) -> dict[str, Any]:
    """The config dict of preset ``name``; InvalidInput (naming the known presets) otherwise."""
    catalog = preset_catalog()
    if name not in catalog:
        raise InvalidInput(f"unknown preset {name!r}; known: {sorted(catalog)}", field="preset")
    config: dict[str, Any] = catalog[name]["config"]
    return config
