"""The JSON guards: nesting and integer digits bounded before parsing, floats-only numbers, non-finite finder."""

from __future__ import annotations

import json
import math

import pytest

from ropeserve.config.jsonsafe import (
    FLOAT_MAX,
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    check_json_numbers,
    first_non_finite,
    json_depth,
    loads_bounded,
)
from ropeserve.errors import InvalidInput, MalformedPayload


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("text", "depth"),
    [("1", 0), ("{}", 1), ('{"a": [1, {"b": []}]}', 4), ('["[[[[", "]]\\"[[["]', 1), (nested(100_000), 100_000)],
)
def test_depth_counts_brackets_outside_strings(text: str, depth: int) -> None:
    assert json_depth(text) == depth


def test_loads_bounded_accepts_the_limits_and_refuses_one_past_them() -> None:
    assert loads_bounded(nested(MAX_JSON_DEPTH), error=MalformedPayload, field="body") is not None
    assert loads_bounded("9" * MAX_INT_DIGITS, error=MalformedPayload, field="body") == int("9" * MAX_INT_DIGITS)
    for text, message in ((nested(MAX_JSON_DEPTH + 1), "nested"), ("-" + "9" * (MAX_INT_DIGITS + 1), "digits")):
        with pytest.raises(MalformedPayload, match=message) as error:
            loads_bounded(text, error=MalformedPayload, field="body")
        assert error.value.field == "body"


def test_loads_bounded_reports_invalid_json_with_line_and_column() -> None:
    with pytest.raises(InvalidInput, match=r"line 2, column 7") as error:
        loads_bounded('{"a": 1,\n "b": }', error=InvalidInput, field="config.json")
    assert error.value.field == "config.json"


@pytest.mark.parametrize("value", [FLOAT_MAX, -(2**1023), 2**63, 1e308, math.nan, math.inf, True])
def test_numbers_a_float_holds_pass(value: object) -> None:
    check_json_numbers({"a": [{"b": value}]})


@pytest.mark.parametrize("value", [10**400, -(10**309), int(FLOAT_MAX) + 2**970])
def test_integers_past_the_float_range_are_refused_with_their_pointer(value: int) -> None:
    with pytest.raises(InvalidInput, match="outside the float range") as error:
        check_json_numbers({"a": [{"b~/c": value}]}, "/config")
    assert error.value.field == "/config/a/0/b~0~1c"


def test_nesting_past_the_limit_is_refused_without_recursion() -> None:
    deep = json.loads(nested(MAX_JSON_DEPTH))
    check_json_numbers(deep)
    value: list = []
    for _ in range(100_000):  # far past the recursion limit: the walk is iterative
        value = [value]
    with pytest.raises(InvalidInput, match="nested deeper"):
        check_json_numbers(value)


def test_first_non_finite_names_the_first_in_document_order() -> None:
    assert first_non_finite({"a": 1.0, "b": [2.0, math.inf], "c": math.nan}) == "/b/1"
    assert first_non_finite({"a": [1e308, -1e308], "b": "inf"}) is None
