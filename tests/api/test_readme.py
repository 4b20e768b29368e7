"""The README's ``curl`` example keeps working: its request body (the JSON after ``-d``) is POSTed to the app and
the answer must equal transformers' values computed live, and the values the README prints must match it."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from fastapi.testclient import TestClient
from safetensors.torch import load
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from ropeserve.api import create_app
from ropeserve.config import normalize_config, preset_config
from ropeserve.rope import apply_rotary, rope_cos_sin
from ropeserve.settings import Settings

transformers.logging.set_verbosity_error()

README = Path(__file__).resolve().parents[2] / "README.md"
EXPLICIT_KEYS_THE_ORACLE_MAPS = {"rope_type", "rope_theta", "head_dim", "max_position_embeddings", "factor"}


def curl_example() -> tuple[str, dict[str, Any]]:
    """``(path, body)`` of the first ``curl ... -d '<json>'`` command in the README."""
    command = re.search(r"^curl .*?(?=^```)", README.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    assert command, "README has no curl example"
    words = shlex.split(command.group(0).replace("\\\n", " "))
    url = next(word for word in words if "/v1/" in word)
    return url[url.index("/v1/") :], json.loads(words[words.index("-d") + 1])


def printed_values(name: str) -> list[float]:
    """The values the README prints after ``name = [...] ×2`` (the NeoX layout repeats the half)."""
    match = re.search(rf"{name} = \[([^\]]+)\] ×2", README.read_text(encoding="utf-8"))
    assert match, f"README prints no {name} values"
    return [float(value) for value in match.group(1).split(",")] * 2


def transformers_cos_sin(rope: dict[str, Any], positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The Llama rotary module for the explicit parameters of the example (full rotary, NeoX layout)."""
    assert set(rope) <= EXPLICIT_KEYS_THE_ORACLE_MAPS, "extend the oracle mapping for the new README example"
    rope_parameters = {key: value for key, value in rope.items() if key not in ("head_dim", "max_position_embeddings")}
    config = LlamaConfig(
        hidden_size=rope["head_dim"],
        num_attention_heads=1,
        head_dim=rope["head_dim"],
        max_position_embeddings=rope.get("max_position_embeddings", 2048),
        rope_parameters={"rope_type": "default", **rope_parameters},
    )
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1), torch.tensor([positions]))
    return cos[0], sin[0]


@pytest.fixture(scope="module")
def answer() -> dict[str, Any]:
    path, body = curl_example()
    with TestClient(create_app(Settings(access_log=False))) as client:
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_readme_example_returns_transformers_values(answer: dict[str, Any]) -> None:
    _, body = curl_example()
    cos, sin = transformers_cos_sin(body["rope"], body["positions"])
    assert torch.equal(torch.tensor(answer["cos"], dtype=torch.float64).float(), cos)
    assert torch.equal(torch.tensor(answer["sin"], dtype=torch.float64).float(), sin)


def test_readme_prints_the_values_it_returns(answer: dict[str, Any]) -> None:
    assert answer["cos"][0] == pytest.approx(printed_values("cos"), abs=5e-7)
    assert answer["sin"][0] == pytest.approx(printed_values("sin"), abs=5e-7)


def test_readme_rotation_example_round_trips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's rotation snippet writes a body that /v1/rope/apply rotates like the native reference."""
    snippet = re.search(r"<<'EOF'\n(.*?)\nEOF\n", README.read_text(encoding="utf-8"), re.DOTALL)
    assert snippet, "README has no rotation snippet"
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet.group(1), "README.md", "exec"), {})  # our own README's example
    body = (tmp_path / "qk.safetensors").read_bytes()
    with TestClient(create_app(Settings(access_log=False))) as client:
        response = client.post("/v1/rope/apply", content=body, headers={"content-type": "application/x-safetensors"})
    assert response.status_code == 200, response.text
    assert {"x-queue-time", "x-compute-time", "x-total-time"} <= set(response.headers)
    rotated, sent = load(response.content), load(body)
    params = normalize_config(preset_config("llama-3.1-8b")).params()
    table = rope_cos_sin(params, sent["positions"])
    expected_q, expected_k = apply_rotary(sent["q"], sent["k"], table.cos, table.sin, head_dim=128, layout="flat")
    assert torch.equal(rotated["q"], expected_q) and torch.equal(rotated["k"], expected_k)
