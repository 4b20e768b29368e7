"""The service and the linter read one definition of each rope type, so they agree.

For every fixture config and every registered rope type (the config's rope dict replaced by a typical one of
that type, as ``--hf-overrides`` would): the strict normaliser (service) and the linter's lenient view build the
same parameters (lengths included); the service's exact float32 ``inv_freq`` equals the linter's float64
spectrum to float32 accuracy, at initialisation and, for length-dependent types, at twice the trained length;
the attention factors are equal; and a configuration the service refuses is one the linter cannot tabulate.
The messages of RS203/205/207 are the service's 422 details.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ropeserve.config import ROPE_TYPES, RopeParams, from_explicit, normalize_config
from ropeserve.config.rope_types import spectrum
from ropeserve.errors import InvalidInput
from ropeserve.lint import lint_config
from ropeserve.lint.model import ModelView
from ropeserve.rope import compute_inv_freq, effective_length

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"
FIXTURES = sorted(path.name for path in CONFIGS.glob("*.json") if "snippet" not in path.name)


def example(rope_type: str, rotary_dim: int) -> dict[str, Any]:
    """A typical rope dict of ``rope_type`` for a head rotating ``rotary_dim`` channels."""
    half = rotary_dim // 2
    examples: dict[str, dict[str, Any]] = {
        "default": {},
        "linear": {"factor": 4.0},
        "dynamic": {"factor": 2.0},
        "yarn": {"factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1},
        "longrope": {
            "short_factor": [1 + 0.01 * i for i in range(half)],
            "long_factor": [1 + 0.5 * i for i in range(half)],
            "original_max_position_embeddings": 4096,
        },
        "llama3": {
            "factor": 8.0,
            "original_max_position_embeddings": 8192,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
        "proportional": {"factor": 2.0},
        "ntk": {"factor": 4.0, "mixed_b": 0.625},
    }
    return {"rope_type": rope_type, **examples[rope_type]}


def test_every_rope_type_has_an_example() -> None:
    for rope_type in ROPE_TYPES:
        assert example(rope_type, 8)["rope_type"] == rope_type


def _config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / name).read_text(encoding="utf-8"))
    return loaded


def _rotary_dim(config: dict[str, Any]) -> int:
    view = ModelView.build(config)
    return view.main.rotary_dim if view.main is not None else 0


def _assert_close(exact: torch.Tensor, approximate: tuple[float, ...]) -> None:
    """float32 ``exact`` equals the float64 ``approximate`` to float32 accuracy."""
    assert exact.shape == (len(approximate),)
    expected = torch.tensor(approximate, dtype=torch.float64)
    torch.testing.assert_close(exact.to(torch.float64), expected, rtol=2e-6, atol=0.0)


@pytest.mark.parametrize("rope_type", sorted(ROPE_TYPES))
@pytest.mark.parametrize("name", FIXTURES)
def test_service_and_linter_agree(name: str, rope_type: str) -> None:
    config = _config(name)
    rotary_dim = _rotary_dim(config)
    if rotary_dim < 4:
        pytest.skip(f"{name}: the linter reads no rotary width")
    view = ModelView.build(config, rope_override=example(rope_type, rotary_dim))
    try:
        service = normalize_config(view.document)
    except InvalidInput as refusal:
        assert view.computable_main is None or view.layers != {}, refusal
        assert view.computable_main is None, f"the service refuses ({refusal.detail}) what the linter tabulates"
        return
    layers = {layer: params for layer, params in service.layers.items() if params is not None}
    assert layers == view.layers
    for params in layers.values():
        _assert_agree(params)


@pytest.mark.parametrize("name", FIXTURES)
def test_service_reads_each_fixture_as_the_linter_does(name: str) -> None:
    """Regression: the service refused MixFormer's ``n_embd``/``n_head``/``rotary_dim`` (phi-2 remote code), which
    the linter read by completing the config as the config class does; both now use one completion."""
    config = _config(name)
    view = ModelView.build(config)
    try:
        service = normalize_config(config, validate=False)
    except InvalidInput as refusal:
        assert view.error is not None and view.error.detail == refusal.detail
        return
    assert {layer: params for layer, params in service.layers.items() if params is not None} == view.layers
    for layer in view.layers:
        for key in ("head_dim", "partial_rotary_factor", "max_position_embeddings"):
            assert service.sources[layer].get(key, "default") == view.source(layer, key), key


def _assert_agree(params: RopeParams) -> None:
    inv_freq, attention_factor = compute_inv_freq(params)
    linter = spectrum(params)
    _assert_close(inv_freq, linter.scaled)
    assert attention_factor == linter.attention_factor
    limit = params.max_position_embeddings
    seq_len = None if limit is None else effective_length(params, 2 * limit - 1)
    if seq_len is not None:
        inv_freq, attention_factor = compute_inv_freq(params, seq_len)
        linter = spectrum(params, seq_len)
        _assert_close(inv_freq, linter.scaled)
        assert attention_factor == linter.attention_factor


SHARED_MESSAGES = [
    ("RS203", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}),
    ("RS205", {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [2.0] * 4}),
    ("RS207", {"rope_type": "yarn", "factor": -4.0, "original_max_position_embeddings": 4096}),
    ("RS207", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": -1.0, "high_freq_factor": 4.0}),
    ("RS207", {"rope_type": "ntk", "factor": 4.0, "mixed_b": 100.0}),
]


@pytest.mark.parametrize(("rule", "rope"), SHARED_MESSAGES, ids=[f"{r} {p['rope_type']}" for r, p in SHARED_MESSAGES])
def test_lint_findings_quote_the_service_validator(rule: str, rope: dict[str, Any]) -> None:
    explicit = {**rope, "rope_theta": 1e4, "head_dim": 8, "max_position_embeddings": 8192}
    explicit.setdefault("original_max_position_embeddings", 4096)
    with pytest.raises(InvalidInput) as refusal:
        from_explicit(explicit)
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8, "max_position_embeddings": 8192}
    findings = lint_config({**config, "rope_parameters": {**rope, "rope_theta": 1e4}}).findings
    messages = [finding.hit.message for finding in findings if finding.rule.id == rule]
    assert refusal.value.detail in messages
