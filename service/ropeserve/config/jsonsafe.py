"""Guards that keep hostile JSON out of arithmetic and out of the JSON encoder (torch-free, no web imports).

JSON puts no bound on nesting or on the size of an integer, and Python's parser also reads ``NaN`` and
``Infinity``. Three limits follow, each checked before any value is used:

- ``MAX_JSON_DEPTH``: nesting of a parsed document (a safetensors header, a config); deeper input is
  refused before parsing, so the recursive parser never runs out of stack;
- ``MAX_INT_DIGITS``: digits of one integer literal, refused before ``int()`` converts it (Python refuses
  4,300 and more with a plain ValueError; anything past 309 digits is outside the float range anyway);
- ``FLOAT_MAX``: every number of a config must be representable as a float (10**400 is not), because the
  rope arithmetic and the linter convert them to floats.

A NaN or infinity inside a config is left to the validation of its key (a rope computation refuses it, the
linter reports it as a finding); ``first_non_finite`` finds one before a result is encoded as JSON.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeGuard

from ropeserve.errors import InvalidInput, ServiceError

MAX_JSON_DEPTH = 64
"""Deepest nesting accepted in a safetensors header or a config (real configs nest 3 or 4 levels)."""
MAX_INT_DIGITS = 1000
"""Most digits of one JSON integer literal, checked before conversion (10**309 is already past the float range,
which `check_json_numbers` reports with its pointer; Python refuses 4,300 digits with a plain ValueError)."""
FLOAT_MAX = sys.float_info.max
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""Bounds of every position id and length (int64 in every engine): a result beyond them is a 422 (positions) or
saturates (the linter's lengths), never a wrapped number."""
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{]+|[\]}]+')
"""A string (skipped), a run of openers or a run of closers; the unrolled string pattern and the runs keep the
scan at about 30 us for a 1.5 kB header with an embedded config and 0.3 ms for 100,000 nested brackets."""


def json_depth(text: str) -> int:
    """Deepest ``[``/``{`` nesting of ``text``, brackets inside strings ignored; linear, no recursion."""
    depth = deepest = 0
    for token in _TOKENS.findall(text):
        if token[0] in "[{":
            depth += len(token)
            deepest = max(deepest, depth)
        elif token[0] in "]}":
            depth -= len(token)
    return deepest


def loads_bounded(
    text: str,
    *,
    error: type[ServiceError],
    field: str,
    object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
) -> Any:
    """``json.loads(text)`` with ``MAX_JSON_DEPTH`` and ``MAX_INT_DIGITS`` enforced before the value is built.

    Raises ``error`` (naming ``field``) for either limit and for invalid JSON.
    """
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise error(f"JSON nested {depth} deep; at most {MAX_JSON_DEPTH} levels are accepted", field=field)
    try:
        return json.loads(text, parse_int=_bounded_int(error, field), object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as decode_error:
        where = f"line {decode_error.lineno}, column {decode_error.colno}"
        raise error(f"invalid JSON: {decode_error.msg} ({where})", field=field) from None


def _bounded_int(error: type[ServiceError], field: str) -> Callable[[str], int]:
    def parse(literal: str) -> int:
        digits = len(literal.lstrip("-"))
        if digits > MAX_INT_DIGITS:
            raise error(f"an integer of {digits} digits; at most {MAX_INT_DIGITS} are accepted", field=field)
        return int(literal)

    return parse


def _with_pointers(value: Any, pointer: str) -> Iterator[tuple[Any, str, int]]:  # noqa: ANN401
    """Every node of ``value`` with its JSON pointer and depth, in document order (for the error message)."""
    stack: list[tuple[Any, str, int]] = [(value, pointer, 0)]
    while stack:
        node, where, depth = stack.pop()
        yield node, where, depth
        if isinstance(node, Mapping | list | tuple):
            items = node.items() if isinstance(node, Mapping) else enumerate(node)
            stack.extend((child, f"{where}/{_escape(key)}", depth + 1) for key, child in reversed(list(items)))


def _number_problem(node: Any, depth: int) -> str | None:  # noqa: ANN401 - any parsed JSON node
    if isinstance(node, Mapping | list | tuple):
        return f"nested deeper than {MAX_JSON_DEPTH} levels" if depth >= MAX_JSON_DEPTH else None
    if isinstance(node, int) and not isinstance(node, bool) and abs(node) > FLOAT_MAX:
        return (
            f"an integer of about {node.bit_length() * math.log10(2):.0f} digits is outside the float range "
            f"(numbers up to {FLOAT_MAX:.6g} are accepted)"
        )
    return None


_IN_RANGE_LEAVES = frozenset({str, float, bool, type(None)})
"""Exact types of JSON leaves that are never out of range: skipped by type, without a call per node."""


def _numbers_in_range(value: Any) -> bool:  # noqa: ANN401 - any parsed JSON
    """Whether no node of ``value`` has a ``_number_problem``: an iterative walk, with the parsed-JSON
    types (``dict``, ``list``, ``int`` and the leaves of ``_IN_RANGE_LEAVES``) told apart by exact type, without a
    call per node (a config's walk in a few microseconds)."""
    stack: list[tuple[Iterable[Any], int]] = [((value,), 0)]
    while stack:
        children, depth = stack.pop()
        for child in children:
            kind = type(child)
            if kind in _IN_RANGE_LEAVES or (kind is int and -FLOAT_MAX <= child <= FLOAT_MAX):
                continue
            if kind is dict and depth < MAX_JSON_DEPTH:
                stack.append((child.values(), depth + 1))
            elif kind is list and depth < MAX_JSON_DEPTH:
                stack.append((child, depth + 1))
            elif _number_problem(child, depth) is not None:
                return False
            elif isinstance(child, Mapping):
                stack.append((child.values(), depth + 1))
            elif isinstance(child, list | tuple):
                stack.append((child, depth + 1))
    return True


def is_json_object(value: Any) -> TypeGuard[Mapping[str, Any]]:  # noqa: ANN401 - any parsed JSON
    """``isinstance(value, Mapping)``, answered for the parsed ``dict`` and for ``None`` without the ABC check."""
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def check_json_numbers(value: Any, pointer: str = "") -> None:  # noqa: ANN401 - any parsed JSON
    """Refuse (InvalidInput naming the JSON pointer) nesting past ``MAX_JSON_DEPTH`` and any integer outside
    the float range, anywhere in the parsed document ``value``. Iterative: safe on any depth."""
    if _numbers_in_range(value):
        return
    for node, where, depth in _with_pointers(value, pointer):
        if (problem := _number_problem(node, depth)) is not None:
            raise InvalidInput(problem, field=where or "/")


def _non_finite(node: Any) -> bool:  # noqa: ANN401 - any parsed JSON node
    return isinstance(node, float) and not math.isfinite(node)


_FINITE_LEAVES = frozenset({str, int, bool, type(None)})
"""Exact types of JSON leaves that are never NaN or infinite: skipped by type, without a call per node."""


def _all_finite(value: Any) -> bool:  # noqa: ANN401 - any parsed JSON
    """Whether no float in ``value`` (dicts, lists and tuples walked, iteratively) is NaN or infinite; exact types
    first, as ``_numbers_in_range`` does."""
    stack: list[Iterable[Any]] = [(value,)]
    while stack:
        for child in stack.pop():
            kind = type(child)
            if kind in _FINITE_LEAVES or (kind is float and math.isfinite(child)):
                continue
            if isinstance(child, Mapping):
                stack.append(child.values())
            elif isinstance(child, list | tuple):
                stack.append(child)
            elif _non_finite(child):
                return False
    return True


def first_non_finite(value: Any, pointer: str = "") -> str | None:  # noqa: ANN401 - any parsed JSON
    """The JSON pointer of the first NaN or infinity in ``value`` (dicts and lists walked), else None."""
    if _all_finite(value):
        return None
    return next((where or "/" for node, where, _ in _with_pointers(value, pointer) if _non_finite(node)), None)


def _escape(key: Any) -> str:
    """A JSON pointer reference token (RFC 6901): ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return str(key).replace("~", "~0").replace("/", "~1")
