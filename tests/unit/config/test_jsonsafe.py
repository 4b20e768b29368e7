"""The JSON guards: nesting and integer digits bounded before parsing, floats-only numbers, non-finite finder."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ropeserve.config.jsonsafe import (
    FLOAT_MAX,
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    check_json_numbers,
    first_non_finite,
    is_json_object,
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


class Huge(int):
    """An int subclass (not the parsed ``int``): walked by the general path, not the exact-type one."""


@pytest.mark.parametrize(
    ("document", "field"),
    [
        (MappingProxyType({"a": (1, {"b": 10**400})}), "/a/1/b"),
        ({"a": [0, Huge(10**400)]}, "/a/1"),
        ((2.0, MappingProxyType({"x~": -(10**309)})), "/1/x~0"),
    ],
)
def test_other_mappings_sequences_and_int_subclasses_are_walked_too(document: Any, field: str) -> None:
    with pytest.raises(InvalidInput, match="outside the float range") as error:
        check_json_numbers(document)
    assert error.value.field == field


def test_nesting_through_tuples_and_mapping_proxies_counts() -> None:
    value: Any = 1
    for level in range(MAX_JSON_DEPTH + 1):
        value = (value,) if level % 2 else MappingProxyType({"k": value})
    with pytest.raises(InvalidInput, match="nested deeper"):
        check_json_numbers(value)
    check_json_numbers(value["k"] if isinstance(value, Mapping) else value[0])


def _first_problem(value: Any, pointer: str = "", depth: int = 0) -> str | None:  # noqa: ANN401
    """Reference: the pointer of the first node (document order) ``check_json_numbers`` must refuse."""
    if isinstance(value, Mapping | list | tuple):
        if depth >= MAX_JSON_DEPTH:
            return pointer or "/"
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, child in items:
            escaped = str(key).replace("~", "~0").replace("/", "~1")
            if (found := _first_problem(child, f"{pointer}/{escaped}", depth + 1)) is not None:
                return found
        return None
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > FLOAT_MAX:
        return pointer or "/"
    return None


LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**309, -(10**400), Huge(10**400), Huge(3), int(FLOAT_MAX)]),
)


def documents_of(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Lists, tuples, dicts and mapping proxies of ``children``."""
    return st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=2), children, max_size=3),
        st.dictionaries(st.text(max_size=2), children, max_size=3).map(MappingProxyType),
    )


DOCUMENTS = st.recursive(LEAVES, documents_of, max_leaves=40)


def _deepen(value: Any, levels: int) -> Any:  # noqa: ANN401
    for _ in range(levels):
        value = [value]
    return value


@settings(max_examples=300, deadline=None)
@given(document=DOCUMENTS, extra_depth=st.sampled_from([0, 0, MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH - 1]))
def test_check_json_numbers_refuses_exactly_what_a_plain_walk_finds(document: Any, extra_depth: int) -> None:
    document = _deepen(document, extra_depth)
    expected = _first_problem(document)
    if expected is None:
        check_json_numbers(document)
        return
    with pytest.raises(InvalidInput) as error:
        check_json_numbers(document)
    assert error.value.field == expected


@pytest.mark.parametrize(
    "value", [{}, {"a": 1}, MappingProxyType({}), None, [], (), "text", 1, 1.5, True, json.loads('{"a": null}')]
)
def test_is_json_object_is_isinstance_mapping(value: object) -> None:
    assert is_json_object(value) == isinstance(value, Mapping)


class Real(float):
    """A float subclass (numpy's float64 is one): walked by value, not skipped by its type."""


def _first_non_finite(value: Any, pointer: str = "") -> str | None:  # noqa: ANN401
    """Reference: the pointer of the first NaN or infinity in document order, by a plain recursive walk."""
    if isinstance(value, Mapping | list | tuple):
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for key, child in items:
            escaped = str(key).replace("~", "~0").replace("/", "~1")
            if (found := _first_non_finite(child, f"{pointer}/{escaped}")) is not None:
                return found
        return None
    return pointer or "/" if isinstance(value, float) and not math.isfinite(value) else None


@settings(max_examples=300, deadline=None)
@given(
    document=st.recursive(
        LEAVES | st.sampled_from([Real(math.nan), Real(-math.inf), Real(2.5)]), documents_of, max_leaves=40
    )
)
def test_first_non_finite_finds_what_a_plain_walk_finds(document: Any) -> None:  # noqa: ANN401
    assert first_non_finite(document) == _first_non_finite(document)
