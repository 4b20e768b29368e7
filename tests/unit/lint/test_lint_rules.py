"""Every rule fires on its failing fixture and stays silent on its passing one (data-driven)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from lint_helpers import DELETE, lint, patched, real_config, rule_ids, with_snippet

from ropeserve.lint import RULES, LintReport
from ropeserve.lint.findings import FAMILIES

LLAMA = "meta-llama__Llama-3.1-8B-Instruct.json"
QWEN = "Qwen__Qwen2.5-7B-Instruct.json"
QWEN_YARN_SNIPPET = "Qwen__Qwen2.5-7B-Instruct.yarn-snippet.json"
QWEN25VL = "Qwen__Qwen2.5-VL-7B-Instruct.json"
QWEN3VL = "Qwen__Qwen3-VL-8B-Instruct.json"
QWEN35 = "Qwen__Qwen3.5-0.8B.json"
PHI3 = "microsoft__Phi-3-mini-128k-instruct.json"
PHI4 = "microsoft__Phi-4-mini-instruct.json"
DEEPSEEK = "deepseek-ai__DeepSeek-V3.json"
GEMMA3 = "google__gemma-3-4b-it.json"
MISTRAL = "mistralai__Mistral-7B-Instruct-v0.3.json"
QWEN_YARN = "qwen-yarn"  # Qwen2.5-7B-Instruct + the card's YaRN block


@dataclass(frozen=True)
class Side:
    """One side of a case: a real config (plus the card's YaRN block for QWEN_YARN), a patch and an intent."""

    base: str
    patch: dict[str, Any] = field(default_factory=dict)
    intent: dict[str, Any] = field(default_factory=dict)
    tokenizer_config: dict[str, Any] | None = None
    draft_patch: dict[str, Any] | None = None

    def report(self) -> LintReport:
        config = (
            with_snippet(real_config(QWEN), QWEN_YARN_SNIPPET) if self.base == QWEN_YARN else real_config(self.base)
        )
        draft = patched(config, self.draft_patch) if self.draft_patch is not None else None
        return lint(
            patched(config, self.patch), self.intent, tokenizer_config=self.tokenizer_config, draft_config=draft
        )


def side(base: str, patch: dict[str, Any] | None = None, **options: Any) -> Side:
    tokenizer, draft = options.pop("tokenizer_config", None), options.pop("draft_patch", None)
    return Side(base, patch or {}, options, tokenizer, draft)


LINEAR_2 = {"/rope_scaling": {"rope_type": "linear", "factor": 2.0}}
VLLM, SGLANG, TGI, LLAMA_CPP, HF = ["vllm"], ["sglang"], ["tgi"], ["llama.cpp"], ["transformers"]

CASES: list[tuple[str, Side, Side]] = [
    ("RS100", side(MISTRAL, {"/hidden_size": DELETE}), side(MISTRAL)),
    ("RS101", side(LLAMA, {"/rope_scaling/type": "yarn"}), side(LLAMA, {"/rope_scaling/type": "llama3"})),
    ("RS102", side(DEEPSEEK), side(DEEPSEEK, {"/rope_scaling/type": DELETE, "/rope_scaling/rope_type": "yarn"})),
    ("RS103", side(QWEN25VL, {"/rope_scaling/mrope_section": DELETE}), side(QWEN25VL)),
    ("RS104", side(PHI3, {"/rope_scaling/type": "su"}), side(PHI3)),
    ("RS105", side(QWEN3VL, engines=TGI), side(QWEN3VL, engines=VLLM)),
    ("RS105", side(LLAMA, engines=["transformers==4.42.0"]), side(LLAMA, engines=["transformers>=4.43"])),
    (
        "RS106",
        side(QWEN_YARN, {"/rope_scaling/original_max_position_embeddings": DELETE}, engines=VLLM),
        side(QWEN_YARN, engines=VLLM),
    ),
    ("RS107", side(QWEN_YARN, {"/rope_scaling/attn_factor": 1.0}), side(QWEN_YARN)),
    (
        "RS108",
        side(QWEN_YARN, {"/rope_scaling/attention_factor": 1.2}, engines=VLLM),
        side(QWEN_YARN, {"/rope_scaling/attention_factor": 1.2}, engines=HF),
    ),
    ("RS109", side(LLAMA, {"/rope_scaling/rope_theta": 10000.0}), side(LLAMA, {"/rope_scaling/rope_theta": 500000.0})),
    ("RS110", side(MISTRAL, {"/rotary_emb_base": 1e6}), side(MISTRAL)),
    ("RS111", side(MISTRAL, {"/rope_theta": -1.0}), side(MISTRAL)),
    ("RS112", side(QWEN25VL, {"/rope_theta": DELETE}), side(MISTRAL, {"/rope_theta": DELETE})),
    (
        "RS114",
        side(QWEN3VL, {"/rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, engines=HF),
        side(QWEN3VL, {"/rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, engines=["transformers==4.57.0"]),
    ),
    (
        "RS113",
        side(MISTRAL, {"/rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.25}}, engines=VLLM),
        side(MISTRAL, {"/rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.25}}, engines=HF),
    ),
    ("RS201", side(MISTRAL, {"/rope_scaling": {"rope_type": "linear", "factor": 0.5}}), side(MISTRAL, LINEAR_2)),
    (
        "RS202",
        side(QWEN_YARN, {"/rope_scaling/beta_fast": 1, "/rope_scaling/beta_slow": 32}),
        side(QWEN_YARN, {"/rope_scaling/beta_fast": 32, "/rope_scaling/beta_slow": 1}),
    ),
    ("RS203", side(LLAMA, {"/rope_scaling/high_freq_factor": 1.0}), side(LLAMA)),
    ("RS204", side(LLAMA, {"/rope_scaling/original_max_position_embeddings": 131072}), side(LLAMA)),
    ("RS205", side(PHI4, {"/partial_rotary_factor": 0.5}), side(PHI4)),
    ("RS206", side(MISTRAL, {"/partial_rotary_factor": 1.5}), side(MISTRAL, {"/partial_rotary_factor": 0.5})),
    ("RS207", side(QWEN_YARN, {"/rope_scaling/factor": -4.0}), side(QWEN_YARN)),
    ("RS208", side(MISTRAL, {"/sliding_window": 0}), side(MISTRAL, {"/sliding_window": 4096})),
    (
        "RS301",
        side(QWEN_YARN, engines=SGLANG, max_model_len=131072),
        side(QWEN_YARN, engines=SGLANG, max_model_len=131072, env={"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}),
    ),
    (
        "RS302",
        side(QWEN, engines=VLLM, max_model_len=65536, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}),
        side(QWEN, engines=VLLM, max_model_len=32768, env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}),
    ),
    ("RS303", side(QWEN_YARN), side(QWEN_YARN, {"/max_position_embeddings": 131072})),
    ("RS304", side(GEMMA3), side(MISTRAL, LINEAR_2)),
    (
        "RS312",
        side(MISTRAL, LINEAR_2, engines=VLLM),
        side(MISTRAL, {**LINEAR_2, "/rope_scaling/original_max_position_embeddings": 32768}, engines=VLLM),
    ),
    (
        "RS305",
        side(QWEN, tokenizer_config={"model_max_length": 8192}),
        side(QWEN, tokenizer_config={"model_max_length": 32768}),
    ),
    ("RS306", side(MISTRAL, {"/seq_length": 4096}), side(MISTRAL, {"/seq_length": 32768})),
    ("RS307", side(MISTRAL, {"/max_position_embeddings": DELETE}), side(MISTRAL)),
    (
        "RS308",
        side(QWEN, engines=VLLM, draft_patch={"/max_position_embeddings": 4096}),
        side(QWEN, engines=VLLM, draft_patch={}),
    ),
    ("RS309", side(QWEN, max_model_len=131072), side(QWEN_YARN, max_model_len=131072)),
    (
        "RS310",
        side(QWEN_YARN, engines=LLAMA_CPP, n_ctx=131072),
        side(QWEN_YARN, {"/max_position_embeddings": 131072}, engines=LLAMA_CPP, n_ctx=131072),
    ),
    ("RS311", side(PHI3, engines=VLLM), side(PHI3, engines=VLLM, max_model_len=131072)),
    ("RS313", side(QWEN), side(QWEN, {"/sliding_window": None})),
    (
        "RS313",
        side(QWEN, {"/use_sliding_window": True}),
        side(QWEN, {"/use_sliding_window": True, "/max_window_layers": 14}),
    ),
    ("RS314", side(GEMMA3, engines=VLLM, disable_sliding_window=True), side(GEMMA3, engines=VLLM)),
    ("RS315", side(PHI3), side(MISTRAL, {"/sliding_window": 4096})),
    ("RS401", side(PHI3, max_model_len=131072), side(PHI3, max_model_len=4096)),
    ("RS402", side(MISTRAL, {"/rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}), side(MISTRAL, LINEAR_2)),
    (
        "RS403",
        side(QWEN_YARN, {"/rope_scaling/truncate": False}, engines=TGI),
        side(QWEN_YARN, {"/rope_scaling/truncate": False}, engines=VLLM),
    ),
    ("RS404", side(QWEN_YARN, {"/rope_scaling/mscale": 1.0, "/rope_scaling/mscale_all_dim": 1.0}), side(DEEPSEEK)),
    ("RS405", side(LLAMA, rope_override={"rope_type": "dynamic", "factor": 8.0}), side(LLAMA)),
    (
        "RS406",
        side(QWEN_YARN, {"/rope_scaling/beta_fast": 16}, engines=TGI),
        side(QWEN_YARN, {"/rope_scaling/beta_fast": 16}, engines=VLLM),
    ),
    (
        "RS407",
        side(LLAMA, {"/rope_scaling/original_max_position_embeddings": 4096}, engines=LLAMA_CPP),
        side(LLAMA, engines=LLAMA_CPP),
    ),
    ("RS408", side(MISTRAL, LINEAR_2, engines=TGI), side(MISTRAL, LINEAR_2, engines=VLLM)),
    ("RS501", side(QWEN35, {"/text_config/rope_parameters/mrope_section": [22, 21, 21]}), side(QWEN35)),
    ("RS502", side(QWEN35, {"/text_config/rope_parameters/mrope_section": [0, 16, 16]}), side(QWEN35)),
    ("RS503", side(QWEN3VL, {"/text_config/rope_scaling/mrope_interleaved": DELETE}), side(QWEN3VL)),
    (
        "RS504",
        side(QWEN25VL, {"/model_type": "glm4v"}, engines=VLLM),
        side(QWEN25VL, {"/model_type": "glm4v"}, engines=SGLANG),
    ),
    (
        "RS505",
        side(QWEN25VL, engines=SGLANG, max_model_len=128000, max_video_seconds=3600),
        side(QWEN25VL, engines=SGLANG, max_model_len=128000),
    ),
    (
        "RS506",
        side(QWEN25VL, engines=["transformers==4.49.0"], video_fps=4.0),
        side(QWEN25VL, engines=["transformers==5.24.0"], video_fps=4.0),
    ),
    ("RS507", side(QWEN25VL), side(QWEN25VL, {"/rope_scaling/type": "default"})),
    ("RS508", side(QWEN25VL, engines=LLAMA_CPP), side(QWEN25VL, engines=VLLM)),
    ("RS509", side(QWEN25VL, {"/rope_scaling": DELETE}), side(QWEN25VL)),
    (
        "RS511",
        side("apjanco__es_qwen2_vl_pangea.json", engines=["vllm==0.6.2"]),
        side("apjanco__es_qwen2_vl_pangea.json", engines=["vllm>=0.6.3"]),
    ),
    ("RS510", side(QWEN3VL, mrope_layout="chunked"), side(QWEN3VL, mrope_layout="interleaved")),
    ("RS601", side(LLAMA, pairing="gptj"), side(LLAMA, pairing="neox")),
    (
        "RS602",
        side(MISTRAL, {"/partial_rotary_factor": 0.5}, engines=HF),
        side(MISTRAL, {"/partial_rotary_factor": 0.5}, engines=VLLM),
    ),
    ("RS603", side(PHI3, engines=VLLM, pairing="gptj"), side(PHI3, engines=SGLANG, pairing="gptj")),
    ("RS701", side(LLAMA, phase_dtype="bf16"), side(LLAMA, phase_dtype="float32")),
    ("RS702", side(LLAMA, dtype="bf16"), side(LLAMA, dtype="float32")),
    ("RS703", side(LLAMA, engines=HF, max_model_len=2_000_000), side(LLAMA, engines=HF, max_model_len=131072)),
    (
        "RS801",
        side(LLAMA, positions={"padding_side": "left", "position_ids": "cache_position"}),
        side(LLAMA, positions={"padding_side": "left", "position_ids": "per_row"}),
    ),
    (
        "RS802",
        side(QWEN25VL, positions={"mrope_decode": "sequential"}),
        side(QWEN25VL, positions={"mrope_decode": "delta"}),
    ),
    (
        "RS803",
        side(QWEN25VL, positions={"chunked_prefill": "recompute"}),
        side(QWEN25VL, positions={"chunked_prefill": "slice"}),
    ),
    ("RS804", side(QWEN3VL, video_fps=2.0), side(QWEN3VL)),
    ("RS805", side(LLAMA, engines=HF, max_model_len=20_000_000), side(LLAMA, engines=HF, max_model_len=131072)),
]


@pytest.mark.parametrize(("rule_id", "bad", "good"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_on_bad_and_not_on_good(rule_id: str, bad: Side, good: Side) -> None:
    bad_report, good_report = bad.report(), good.report()
    assert rule_id in rule_ids(bad_report), bad_report.to_text()
    assert rule_id not in rule_ids(good_report), good_report.to_text()


def test_every_rule_has_a_failing_and_passing_fixture() -> None:
    assert set(RULES) == {case[0] for case in CASES}


def test_catalogue_size_and_family_coverage() -> None:
    assert len(RULES) >= 35
    assert {rule.family for rule in RULES.values()} == set(FAMILIES)


def test_rule_metadata_is_complete() -> None:
    for rule in RULES.values():
        assert rule.id[2] == FAMILIES[rule.family][2], rule.id
        assert rule.name == rule.name.lower() and " " not in rule.name
        assert rule.summary.endswith("."), rule.id
        assert rule.reference.startswith("https://") or rule.reference == f"docs/lint.md#{rule.id.lower()}"


def test_findings_carry_pointer_fix_and_reference() -> None:
    report = side(QWEN_YARN, {"/rope_scaling/factor": -4.0}, max_model_len=131072).report()
    for finding in report.findings:
        data = finding.as_dict()
        assert data["pointer"] == "" or data["pointer"].startswith("/")
        assert data["message"] and data["fix"] and data["reference"]
        assert data["severity"] in ("error", "warning", "info")


VLLM_SOURCE_PENDING = {"RS113"}
"""vLLM findings whose vLLM source is not yet recorded (the support matrix's unverified cells)."""


def test_vllm_findings_cite_a_vllm_source() -> None:
    """Issue 14 §3: a finding about vLLM cites vLLM (an issue, a pull request or its source at a commit)."""
    uncited = {
        finding.rule.id
        for _, bad, good in CASES
        for report in (bad.report(), good.report())
        for finding in report.findings
        if finding.hit.engine == "vllm" and not finding.reference.startswith("https://github.com/vllm-project/vllm/")
    }
    assert uncited <= VLLM_SOURCE_PENDING, sorted(uncited - VLLM_SOURCE_PENDING)


def test_table_dtype_error_groups_engines_by_position() -> None:
    """RS702 names each (position, table dtype) once, with every engine whose table it is, in target order."""
    (same,) = [f for f in side(QWEN).report().findings if f.rule.id == "RS702"]
    assert same.hit.message.endswith("transformers, vllm, sglang, tgi: 0.0023 at position 32,767")
    (split,) = [f for f in side(PHI3).report().findings if f.rule.id == "RS702"]
    assert split.hit.message.endswith(
        "transformers, sglang, tgi: 0.0041 at position 131,071; vllm: 0.0038 at position 4,095"
    )
