"""Per-engine derived lengths and rope cache rows: the worked table of engines-and-config-lint.md §2.5."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
from lint_helpers import LINT_FIXTURES, build_config, lint

from ropeserve.lint.engines import LENGTH_CEILING, SUPPORT, scaled_length, support
from ropeserve.lint.intent import ENGINES, EngineTarget

WORKED_TABLE = json.loads((LINT_FIXTURES / "worked_table.json").read_text(encoding="utf-8"))["rows"]


@pytest.mark.parametrize("row", WORKED_TABLE, ids=[row["model"] for row in WORKED_TABLE])
def test_worked_table(row: dict) -> None:
    report = lint(build_config(row))
    engines = {length.engine: length.as_dict() for length in report.engines}
    for engine, expected in row["expect"].items():
        for key, value in expected.items():
            assert engines[engine][key] == value, (engine, key)


def test_every_target_gets_a_length_row() -> None:
    report = lint(build_config({"config": "meta-llama__Llama-3.1-8B-Instruct.json"}))
    assert [length.engine for length in report.engines] == list(ENGINES)


def test_only_targets_are_reported() -> None:
    report = lint(build_config({"config": "mistralai__Mistral-7B-Instruct-v0.3.json"}), {"engines": ["vllm==0.9.1"]})
    assert [length.engine for length in report.engines] == ["vllm"]


def test_tokenizer_limit_lowers_vllm_and_tgi_but_not_sglang() -> None:
    config = build_config({"config": "Qwen__Qwen2.5-7B-Instruct.json"})
    report = lint(config, tokenizer_config={"model_max_length": 16384})
    derived = {length.engine: length.derived for length in report.engines}
    assert derived["vllm"] == derived["tgi"] == 16384
    assert derived["sglang"] == 32768


def test_tokenizer_sentinel_is_ignored() -> None:
    config = build_config({"config": "Qwen__Qwen2.5-7B-Instruct.json"})
    report = lint(config, tokenizer_config={"model_max_length": 1000000000000000019884624838656})
    assert {length.derived for length in report.engines} == {32768}


def test_no_length_key_assumes_2048_in_vllm_and_sglang() -> None:
    config = build_config(
        {"config": "mistralai__Mistral-7B-Instruct-v0.3.json", "patch": {"/max_position_embeddings": "$delete"}}
    )
    derived = {length.engine: length.derived for length in lint(config).engines}
    assert derived["vllm"] == derived["sglang"] == 2048


def test_yarn_mrope_cache_is_four_times_original_times_factor_in_vllm() -> None:
    config = build_config(
        {
            "config": "Qwen__Qwen2.5-VL-7B-Instruct.json",
            "rope_scaling_snippet": "Qwen__Qwen2.5-VL-7B-Instruct.yarn-snippet.json",
        }
    )
    rows = {length.engine: length.cache_rows for length in lint(config).engines}
    assert rows["vllm"] == 4 * 32768 * 4
    assert rows["sglang"] == 32768 * 4


def test_support_matrix_covers_every_engine() -> None:
    for kind, row in SUPPORT.items():
        assert set(row) == set(ENGINES), kind


@pytest.mark.parametrize(
    ("target", "refused"),
    [
        ("transformers", False),
        ("transformers==4.42.0", True),
        ("transformers>=4.40", True),
        ("transformers>=4.43", False),
    ],
)
def test_version_gated_support(target: str, refused: bool) -> None:
    assert (support("llama3", "transformers").refuses(EngineTarget.parse(target)) is not None) is refused


def test_unknown_rope_type_is_refused_everywhere() -> None:
    for engine in ENGINES:
        assert support("telechat3-yarn", engine).level == "N"


@pytest.mark.parametrize(
    ("length", "factor", "expected"),
    [
        (32768, 4.0, 131072),
        (4 * int(1e308), 4.0, LENGTH_CEILING),  # an int past the float range: no OverflowError
        (4 * int(1e308), 1e-300, int(Fraction(4 * int(1e308)) * Fraction(1e-300))),  # exact, not saturated
        (4 * int(1e308), math.inf, LENGTH_CEILING),
        (1e308, 1e308, LENGTH_CEILING),
        (2**63 - 1, 1.0, 2**63 - 1),  # the float product is 2**63: saturated within int64
        (-1e308, 2.0, 0),  # an unchecked negative length: a bound, not int(-inf)
        (4096, math.nan, 0),
    ],
)
def test_scaled_length_saturates_without_overflow(length: float, factor: float, expected: int) -> None:
    assert scaled_length(length, factor) == expected
