"""``config.sources.source_params``: a request's rope source resolved once and remembered under its JSON text.

Every remembered answer must be the answer the resolution gives afresh, whatever was remembered before: values
equal in Python but not as JSON (``1``, ``1.0`` and ``true``; NaN and null) are different sources, failures are
never remembered, and the memory is bounded in entries and in text length.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ropeserve.config import preset_catalog, sources
from ropeserve.config.sources import MAX_REMEMBERED_TEXT, REMEMBERED_SOURCES, forget_sources, source_params
from ropeserve.errors import InvalidInput

FIXTURES = Path(__file__).parents[2] / "fixtures" / "configs"
BASE = {"rope_type": "linear", "rope_theta": 10000.0, "head_dim": 128, "factor": 2.0}


@pytest.fixture(autouse=True)
def forgotten() -> Iterator[None]:
    forget_sources()
    yield
    forget_sources()


def fresh(kind: str, value: Any, layer_type: str | None = None) -> object:  # noqa: ANN401 - a JSON value
    """What resolving ``value`` gives without any memory: the result, or the error's (type, message, field)."""
    try:
        return sources._resolve(kind, value, layer_type)  # type: ignore[arg-type]
    except InvalidInput as error:
        return type(error), str(error), error.field


def remembered(kind: str, value: Any, layer_type: str | None = None) -> object:  # noqa: ANN401 - a JSON value
    try:
        return source_params(kind, value, layer_type)  # type: ignore[arg-type]
    except InvalidInput as error:
        return type(error), str(error), error.field


def entries() -> int:
    return sources._remembered.cache_info().currsize


@pytest.mark.parametrize("name", ["Qwen__Qwen2.5-7B-Instruct.json", "NousResearch__Yarn-Llama-2-13b-64k.json"])
def test_a_config_twice_gives_its_fresh_params_and_one_entry(name: str) -> None:
    config = json.loads((FIXTURES / name).read_text())
    for _ in range(2):
        assert remembered("config", config) == fresh("config", config)
    assert entries() == 1


def test_every_preset_and_its_layer_types_match_a_fresh_resolution() -> None:
    for name in sorted(preset_catalog()):
        assert remembered("preset", name) == fresh("preset", name), name
        assert remembered("preset", name) == fresh("preset", name), name


# Values equal in Python (1 == 1.0 == True; a dict key would merge them) but different JSON, and so different
# requests: each order of asking must give each value its own fresh answer.
LOOKALIKES = [
    [{**BASE, "factor": 1}, {**BASE, "factor": 1.0}, {**BASE, "factor": True}],
    [{**BASE, "head_dim": 64}, {**BASE, "head_dim": 64.0}],
    [{**BASE, "rope_theta": math.nan}, {**BASE, "rope_theta": None}, {**BASE, "rope_theta": math.inf}],
    [{**BASE, "factor": 0.0}, {**BASE, "factor": -0.0}, {**BASE, "factor": False}],
]


@pytest.mark.parametrize("values", LOOKALIKES)
@pytest.mark.parametrize("reverse", [False, True])
def test_values_equal_in_python_but_not_in_json_are_resolved_on_their_own(values: list[Any], reverse: bool) -> None:
    ordered = values[::-1] if reverse else values
    answers = [remembered("rope", value) for value in ordered]
    assert answers == [fresh("rope", value) for value in ordered]
    assert [remembered("rope", value) for value in ordered] == answers


def test_failures_are_not_remembered_and_each_caller_gets_its_own_error() -> None:
    bad = {**BASE, "rope_thetaa": 1.0}
    errors = []
    for _ in range(2):
        with pytest.raises(InvalidInput) as caught:
            source_params("rope", bad, None)
        errors.append(caught.value)
    assert errors[0] is not errors[1]
    assert errors[0].field == errors[1].field == "rope.rope_thetaa"
    assert entries() == 0


def test_key_order_is_part_of_the_source() -> None:
    reordered = dict(reversed(list(BASE.items())))
    assert remembered("rope", BASE) == remembered("rope", reordered) == fresh("rope", BASE)
    assert entries() == 2


def test_long_sources_are_resolved_each_time_and_never_kept() -> None:
    config = json.loads((FIXTURES / "Qwen__Qwen2.5-7B-Instruct.json").read_text())
    padded = {**config, "notes": "x" * MAX_REMEMBERED_TEXT}
    assert remembered("config", padded) == fresh("config", padded)
    assert entries() == 0


def test_memory_is_bounded_in_entries() -> None:
    for k in range(REMEMBERED_SOURCES + 10):
        value = {**BASE, "rope_theta": 1000.0 + k}
        assert remembered("rope", value) == fresh("rope", value)
    assert entries() == REMEMBERED_SOURCES


def test_values_that_are_no_json_are_resolved_without_memory() -> None:
    not_json = {**BASE, "factor": object()}
    assert remembered("rope", not_json) == fresh("rope", not_json)
    assert entries() == 0


def test_values_too_deep_to_write_are_resolved_without_memory() -> None:
    deep: list[Any] = []
    for _ in range(100_000):  # json.dumps raises RecursionError long before this depth
        deep = [deep]
    too_deep = {**BASE, "extra": deep}
    assert remembered("rope", too_deep) == fresh("rope", too_deep)
    assert entries() == 0
