"""``source_params``: the rope parameters of a request's source (explicit parameters, a config.json or a preset).

A serving stack sends the same source with every request, and resolving it (every check included) costs 50-200 us
of Python: more than the rest of a 16-position cos/sin. The result is a pure function of the source's JSON value,
so it is remembered (a bounded LRU) under the value's JSON text. ``json.dumps`` keeps key order and writes ``1``,
``1.0`` and ``true``, and NaN, infinity and null, differently, so two sources share an entry only when they are
the same JSON value. What is shared is immutable (a frozen ``RopeParams`` and a pairing string). Errors are never
remembered: a failing source is resolved again by each request, which gets its own exception. A source whose
text is longer than ``MAX_REMEMBERED_TEXT``, or that is no JSON value, is resolved every time; its text is still
written once to learn that (about 8 ms per MiB of config, against about 7 ms per MiB to normalise it: only
configs far larger than any real config.json pay it).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any, Literal

from ropeserve.config.families import Pairing
from ropeserve.config.normalize import from_explicit, normalize_config
from ropeserve.config.params import RopeParams
from ropeserve.config.presets import preset_config

SourceKind = Literal["rope", "config", "preset"]
"""``rope``: explicit parameters (``from_explicit``); ``config``: a config.json; ``preset``: a preset's name."""
REMEMBERED_SOURCES = 256
"""Most sources remembered (least recently used forgotten first)."""
MAX_REMEMBERED_TEXT = 16 * 1024
"""Longest JSON text of a remembered source, in characters: with ``REMEMBERED_SOURCES``, at most 4 MiB of keys."""


def source_params(
    kind: SourceKind, value: str | Mapping[str, Any], layer_type: str | None
) -> tuple[RopeParams, Pairing]:
    """``(params of layer_type, the model's default pairing)`` of a source; raises what its resolution raises
    (``InvalidInput`` with a field inside the source, ``/``-rooted for a config)."""
    text = _json_text(value)
    if text is None or len(text) > MAX_REMEMBERED_TEXT:
        return _resolve(kind, value, layer_type)
    return _remembered(kind, text, layer_type)


def forget_sources() -> None:
    """Forget every remembered source (tests and benchmarks that time a first resolution)."""
    _remembered.cache_clear()


def _json_text(value: object) -> str | None:
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError):  # no JSON value, or too deep to write: never remembered
        return None


@functools.lru_cache(maxsize=REMEMBERED_SOURCES)
def _remembered(kind: SourceKind, text: str, layer_type: str | None) -> tuple[RopeParams, Pairing]:
    """``_resolve`` of the value ``text`` holds (``json.loads`` gives back an equal value)."""
    return _resolve(kind, json.loads(text), layer_type)


def _resolve(kind: SourceKind, value: Any, layer_type: str | None) -> tuple[RopeParams, Pairing]:  # noqa: ANN401 - a JSON value
    if kind == "rope":
        return from_explicit(value), "neox"
    normalized = normalize_config(preset_config(value) if kind == "preset" else value)
    return normalized.params(layer_type), normalized.pairing
