"""JSON pointers (RFC 6901): build, resolve, and map to line numbers of the source text (for SARIF)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

_DECODER = json.JSONDecoder()
_WHITESPACE = " \t\r\n"


def join(pointer: str, *keys: str | int) -> str:
    """``pointer`` extended by ``keys`` (escaped)."""
    for key in keys:
        pointer += "/" + str(key).replace("~", "~0").replace("/", "~1")
    return pointer


def split(pointer: str) -> list[str]:
    if not pointer:
        return []
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer.lstrip("/").split("/")]


def resolve(document: Any, pointer: str, default: Any = None) -> Any:
    """The value at ``pointer``, or ``default`` when it does not exist."""
    node = document
    for part in split(pointer):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return default
    return node


DELETE = "$delete"


def patched(document: Mapping[str, Any], patch: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``document`` with each pointer of ``patch`` set to its value (``DELETE`` removes the member).

    Missing or non-object parents on the way are replaced by empty objects (the fixtures' patch format).
    """
    result = copy.deepcopy(dict(document))
    for pointer, value in (patch or {}).items():
        *parents, last = split(pointer)
        node = result
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        if value == DELETE:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return result


def line_of(lines: Mapping[str, int], pointer: str) -> int:
    """The line of ``pointer`` in a ``line_index``, or of its closest ancestor present there."""
    parts = split(pointer)
    while parts and join("", *parts) not in lines:
        parts.pop()
    return lines.get(join("", *parts), 1)


def line_index(text: str) -> dict[str, int]:
    """Pointer -> 1-based line of every member and element in the JSON ``text`` (keys: the key's line)."""
    lines: dict[str, int] = {}
    newlines = [i for i, char in enumerate(text) if char == "\n"]

    def line_of(offset: int) -> int:
        low, high = 0, len(newlines)
        while low < high:
            mid = (low + high) // 2
            if newlines[mid] < offset:
                low = mid + 1
            else:
                high = mid
        return low + 1

    def skip(index: int) -> int:
        while index < len(text) and text[index] in _WHITESPACE:
            index += 1
        return index

    def value(index: int, pointer: str) -> int:
        index = skip(index)
        lines.setdefault(pointer, line_of(index))
        opener = text[index : index + 1]
        if opener not in ("{", "["):
            return _DECODER.raw_decode(text, index)[1]
        closer, position, index = ("}" if opener == "{" else "]"), 0, skip(index + 1)
        while text[index] != closer:
            if opener == "{":
                key, index = _DECODER.raw_decode(text, index)
                lines[join(pointer, key)] = line_of(index)
                index = value(skip(index) + 1, join(pointer, key))  # past ':'
            else:
                index = value(index, join(pointer, position))
                position += 1
            index = skip(index)
            if text[index] == ",":
                index = skip(index + 1)
        return index + 1

    try:
        value(0, "")
    except (ValueError, IndexError):
        return {"": 1}
    return lines
