"""JSON request text carrying literals json.dumps cannot write: 10**400 as digits, NaN, deep nesting."""

from __future__ import annotations

import json
from typing import Any

SENTINEL = "\u0000hostile\u0000"
HUGE_INT = "1" + "0" * 400
"""10**400 written out: an integer no float holds."""


def with_literal(body: dict[str, Any], path: tuple[Any, ...], literal: str) -> str:
    """``body`` as JSON text with the value at ``path`` (keys and list indices) replaced by the raw ``literal``."""
    copy = json.loads(json.dumps(body))
    node = copy
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = SENTINEL
    return json.dumps(copy).replace(json.dumps(SENTINEL), literal)
