"""Healthy real configs lint clean: default targets, and the false-finding classes of issue 14 section 2.

Each case lints a real public config.json (tests/fixtures/configs, sources in SOURCES.md), unpatched unless the
patch is the point of the case.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from lint_helpers import CONFIGS, DELETE, build_config, lint, real_config

from ropeserve.lint import LintReport, validate_config_request
from ropeserve.lint.intent import ENGINES

QWEN3VL = "Qwen__Qwen3-VL-8B-Instruct.json"
QWEN35 = "Qwen__Qwen3.5-0.8B.json"
GEMMA3 = "google__gemma-3-4b-it.json"
LLAMA2 = "meta-llama__Llama-2-7b-chat-hf.json"
HUNYUAN = "tencent__Tencent-Hunyuan-Large.json"
DYNAMIC_2 = {"/rope_scaling": {"type": "dynamic", "factor": 2.0}}


def findings(report: LintReport, rule: str) -> list[tuple[str | None, str]]:
    """(engine, severity) of each finding of ``rule``."""
    return [(f.hit.engine, f.severity.label) for f in report.findings if f.rule.id == rule]


def errors(report: LintReport) -> set[str]:
    return {f.rule.id for f in report.findings if f.severity.label == "error"}


# --- default targets -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [QWEN3VL, QWEN35])
def test_engine_gap_of_an_unasked_engine_is_info(name: str) -> None:
    report = lint(real_config(name))
    assert findings(report, "RS105") == [("tgi", "info")]
    assert not errors(report), report.to_text()


@pytest.mark.parametrize(
    "intent", [{"engines": ["tgi"]}, {"engines": list(ENGINES)}, {"engines": ["vllm", "tgi"], "max_model_len": 8192}]
)
def test_engine_gap_of_an_asked_engine_is_an_error(intent: dict) -> None:
    assert findings(lint(real_config(QWEN3VL), intent), "RS105") == [("tgi", "error")]


def test_http_field_asks_for_engines() -> None:
    config = real_config(QWEN3VL)
    unasked = validate_config_request({"config": config})
    asked = validate_config_request({"config": config, "intent": {"engines": ["tgi"]}})
    assert unasked["summary"]["error"] == 0 and unasked["intent"]["engines"] is None
    assert asked["summary"]["error"] == 1 and asked["intent"]["engines"] == ["tgi"]


def test_cli_flag_and_intent_file_ask_for_engines(tmp_path) -> None:
    path = str(CONFIGS / QWEN3VL)
    intent = tmp_path / "intent.json"
    intent.write_text('{"engines": ["tgi"]}', encoding="utf-8")

    def exit_code(*args: str) -> int:
        command = [sys.executable, "-m", "ropeserve.cli", "lint", path, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60).returncode

    assert exit_code() == 0
    assert exit_code("--engine", "tgi") == 1
    assert exit_code("--intent", str(intent)) == 1


def test_fault_that_breaks_every_engine_stays_an_error() -> None:
    config = build_config({"config": LLAMA2, "patch": {"/rope_scaling": {"rope_type": "not-a-type", "factor": 2.0}}})
    assert sorted(findings(lint(config), "RS105")) == sorted((engine, "error") for engine in ENGINES)


def test_engine_independent_error_keeps_its_severity() -> None:
    report = lint(real_config(LLAMA2), {"max_model_len": 16384})
    assert ("RS309" in errors(report)) and sorted(findings(report, "RS301")) == [("sglang", "info"), ("vllm", "info")]


# --- RS112: class defaults that equal what engines assume ------------------------------------------------------


@pytest.mark.parametrize("name", [LLAMA2, "THUDM__chatglm2-6b.json", "llava-hf__llava-1.5-7b-hf.json"])
def test_no_rope_theta_with_a_10000_class_default_is_not_reported(name: str) -> None:
    report = lint(real_config(name))
    assert not findings(report, "RS112") and report.model["rope_theta"] == 10000.0


def test_missing_theta_with_another_class_default_points_at_the_key_the_file_uses() -> None:
    config = build_config({"config": "Qwen__Qwen2.5-VL-7B-Instruct.json", "patch": {"/rope_theta": DELETE}})
    [finding] = [f for f in lint(config).findings if f.rule.id == "RS112"]
    assert finding.hit.pointer == "/rope_theta" and "1e+06" in finding.hit.message


def test_missing_theta_in_a_v5_rope_parameters_file_points_into_that_dict() -> None:
    patch = {
        "/rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24]},
        "/rope_scaling": DELETE,
        "/rope_theta": DELETE,
    }
    config = build_config({"config": "Qwen__Qwen2.5-VL-7B-Instruct.json", "patch": patch})
    [finding] = [f for f in lint(config).findings if f.rule.id == "RS112"]
    assert finding.hit.pointer == "/rope_parameters/rope_theta"


# --- RS100: GPT-J-style keys, phi-2's first release, llava-1.5's sparse text_config -----------------------------


@pytest.mark.parametrize(
    ("name", "head_dim", "rotary_dim"),
    [
        ("microsoft__phi-2.mixformer.json", 80, 32),
        ("microsoft__phi-2.json", 80, 32),
        ("llava-hf__llava-1.5-7b-hf.json", 128, 128),
    ],
)
def test_config_class_keys_and_defaults_are_readable(name: str, head_dim: int, rotary_dim: int) -> None:
    report = lint(real_config(name))
    assert not findings(report, "RS100"), report.to_text()
    assert (report.model["head_dim"], report.model["rotary_dim"]) == (head_dim, rotary_dim)
    assert not errors(report)


def test_unreadable_gpt_j_style_config_points_at_the_key_the_file_wrote() -> None:
    config = build_config({"config": "microsoft__phi-2.mixformer.json", "patch": {"/n_head": "32"}})
    [finding] = [f for f in lint(config).findings if f.rule.id == "RS100"]
    assert finding.hit.pointer in ("/n_head", "/head_dim")


# --- RS105: llama.cpp drops dynamic NTK -------------------------------------------------------------------------


@pytest.mark.parametrize(("length", "severity"), [(None, "info"), (4096, "info"), (8192, "error")])
def test_llama_cpp_dynamic_ntk_is_info_inside_the_trained_length(length: int | None, severity: str) -> None:
    config = build_config({"config": LLAMA2, "patch": DYNAMIC_2})
    intent = {"engines": ["llama.cpp"], **({"max_model_len": length} if length else {})}
    assert findings(lint(config, intent), "RS105") == [("llama.cpp", severity)]


# --- Gemma-3 ----------------------------------------------------------------------------------------------------


def test_stock_gemma3_has_no_factor_warning() -> None:
    assert findings(lint(real_config(GEMMA3)), "RS304") == [("vllm", "info")]
    assert not findings(lint(real_config(GEMMA3), {"engines": ["sglang", "transformers"]}), "RS304")


def test_gemma3_on_sglang_keeps_the_length_under_transformers_5() -> None:
    report = lint(real_config(GEMMA3), {"engines": ["sglang"]})
    [sglang] = report.engines
    assert sglang.derived == 131072 and "transformers 5" in sglang.derived_from
    assert not errors(report), report.to_text()


# --- RS107 and RS303 --------------------------------------------------------------------------------------------


def test_llama_4_scaling_beta_is_a_key_engines_read() -> None:
    report = lint(real_config("mistralai__Ministral-3-8B-Instruct-2512.json"))
    assert not findings(report, "RS107")


@pytest.mark.parametrize("intent", [None, {"engines": ["vllm"], "max_model_len": 131072}])
def test_hunyuan_alpha_is_a_key_its_model_class_reads(intent: dict | None) -> None:
    """Tencent-Hunyuan-Large's dynamic rope sets alpha 1000 with factor 1.0: the HunYuan classes and vLLM's
    DynamicNTKAlphaRotaryEmbedding read alpha, so it is not an unknown key."""
    assert not findings(lint(real_config(HUNYUAN), intent), "RS107")


def test_alpha_on_a_family_whose_class_does_not_read_it_is_still_reported() -> None:
    config = build_config({"config": HUNYUAN, "patch": {"/model_type": "llama"}})
    [finding] = [f for f in lint(config).findings if f.rule.id == "RS107"]
    assert finding.hit.pointer == "/rope_scaling/alpha" and "HunYuan" in finding.hit.message


def test_unknown_key_next_to_it_is_still_reported() -> None:
    config = build_config(
        {"config": "mistralai__Ministral-3-8B-Instruct-2512.json", "patch": {"/text_config/rope_parameters/betta": 1}}
    )
    [finding] = [f for f in lint(config).findings if f.rule.id == "RS107"]
    assert finding.hit.pointer.endswith("/betta")


@pytest.mark.parametrize(("engines", "quoted"), [(["vllm", "sglang"], False), (["transformers==4.45.0"], True)])
def test_yarn_length_mismatch_quotes_transformers_4_only_for_that_target(engines: list[str], quoted: bool) -> None:
    spec = {
        "config": "Qwen__Qwen2.5-7B-Instruct.json",
        "rope_scaling_snippet": "Qwen__Qwen2.5-7B-Instruct.yarn-snippet.json",
    }
    [finding] = [f for f in lint(build_config(spec), {"engines": engines}).findings if f.rule.id == "RS303"]
    assert ("transformers 4.x" in finding.hit.message) is quoted


# --- messages: pointers and references ---------------------------------------------------------------------------


def test_refused_length_points_at_the_key_that_set_it_and_cites_the_engine() -> None:
    report = lint(real_config("THUDM__chatglm2-6b.json"), {"engines": ["vllm", "sglang"], "max_model_len": 65536})
    refused = {f.hit.engine: f for f in report.findings if f.rule.id == "RS301"}
    assert {engine: f.hit.pointer for engine, f in refused.items()} == {"vllm": "/seq_length", "sglang": "/seq_length"}
    assert refused["vllm"].reference.startswith("https://github.com/vllm-project/")
    assert refused["sglang"].reference.startswith("https://github.com/sgl-project/")


def test_references_are_public_urls_or_shipped_docs_anchors() -> None:
    from ropeserve.lint import RULES

    docs = (CONFIGS.parents[2] / "docs" / "lint.md").read_text(encoding="utf-8")
    for rule in RULES.values():
        if not rule.reference.startswith("https://"):
            assert rule.reference == f"docs/lint.md#{rule.id.lower()}" and f'id="{rule.id.lower()}"' in docs


# --- recall: the config's length already includes the extension ---------------------------------------------------


@pytest.mark.parametrize("rope_type", ["linear", "dynamic"])
def test_factor_without_original_length_is_reported_for_the_engines_that_multiply(rope_type: str) -> None:
    config = build_config({"config": LLAMA2, "patch": {"/rope_scaling": {"type": rope_type, "factor": 4.0}}})
    report = lint(config, {"engines": ["vllm", "sglang", "transformers"]})
    [vllm, sglang] = sorted(
        (f for f in report.findings if f.rule.id == "RS312"), key=lambda f: f.hit.engine or "", reverse=True
    )
    assert (vllm.hit.engine, sglang.hit.engine) == ("vllm", "sglang")
    assert vllm.severity.label == "warning" and "16,384 = max_position_embeddings 4,096 x factor 4" in vllm.hit.message
    assert not findings(lint(config, {"engines": ["vllm"], "max_model_len": 4096}), "RS312")
    assert findings(lint(config), "RS312") == [("sglang", "info"), ("vllm", "info")]


def test_override_that_keeps_the_type_but_retunes_it_is_reported() -> None:
    config = real_config("meta-llama__Llama-3.1-8B-Instruct.json")
    same = dict(config["rope_scaling"])
    retuned = {**same, "factor": 16.0, "original_max_position_embeddings": 4096}
    report = lint(config, {"engines": ["vllm"], "rope_override": retuned})
    hits = {f.hit.pointer: f for f in report.findings if f.rule.id == "RS405"}
    assert set(hits) == {"/rope_override/factor", "/rope_override/original_max_position_embeddings"}
    assert all(f.hit.artifact == "intent" and f.severity.label == "warning" for f in hits.values())
    assert "from 8 to 16" in hits["/rope_override/factor"].hit.message
    assert not findings(lint(config, {"engines": ["vllm"], "rope_override": same}), "RS405")


def test_wrapper_level_yarn_dict_without_original_length_fails_transformers_5() -> None:
    """Checked against transformers 5.24: Qwen3VLConfig(**config) raises KeyError "Missing required keys in
    `rope_parameters` for 'rope_type'='yarn': {'original_max_position_embeddings'}" for this config."""
    config = build_config({"config": QWEN3VL, "patch": {"/rope_parameters": {"rope_type": "yarn", "factor": 4.0}}})
    assert findings(lint(config, {"engines": ["transformers"]}), "RS114") == [("transformers", "error")]
    assert findings(lint(config), "RS114") == [("transformers", "info")]
    assert not findings(lint(real_config(QWEN3VL), {"engines": ["transformers"]}), "RS114")


# --- version boundaries -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "refused"), [("vllm==0.5.2", True), ("vllm==0.5.3", False), ("vllm", False)])
def test_llama3_rope_needs_vllm_0_5_3(engine: str, refused: bool) -> None:
    report = lint(real_config("meta-llama__Llama-3.1-8B-Instruct.json"), {"engines": [engine]})
    assert (findings(report, "RS105") == [("vllm", "error")]) is refused


@pytest.mark.parametrize(("engine", "refused"), [("vllm==0.6.2", True), ("vllm>=0.6.3", False), ("vllm", False)])
def test_mrope_saved_as_default_type_needs_vllm_0_6_3(engine: str, refused: bool) -> None:
    report = lint(real_config("apjanco__es_qwen2_vl_pangea.json"), {"engines": [engine]})
    assert (findings(report, "RS511") == [("vllm", "error")]) is refused


def test_gpt_j_keys_and_pairing_come_from_the_family_table() -> None:
    """phi-2's first config already writes GPT-J's keys (n_embd, n_head, n_positions, rotary_dim); read as a
    ``gptj`` file it also gets GPT-J's interleaved pairing."""
    config = build_config({"config": "microsoft__phi-2.mixformer.json", "patch": {"/model_type": "gptj"}})
    report = lint(config, {"engines": ["vllm"], "pairing": "gptj"})
    assert (report.model["head_dim"], report.model["rotary_dim"], report.model["pairing"]) == (80, 32, "gptj")
    assert not errors(report) and not findings(report, "RS601")


# --- corpus-a configs: class attribute maps, remote config classes, class default lengths ------------------------

FALCON_7B = "tiiuae__falcon-7b.resave.json"
FALCON_40B = "tiiuae__falcon-40b.json"
PHI_15_REMOTE = "habanoz__phi-1_5-lr-5-3epch-airoboros3.1-1k-instruct-V1.json"
GRANITE_CODE = "ibm-granite__granite-3b-code-base.pr1.json"


def test_falcon_n_head_and_n_layer_are_falconconfig_aliases() -> None:
    report = lint(real_config(FALCON_7B))
    assert not findings(report, "RS100"), report.to_text()
    assert (report.model["head_dim"], report.model["rotary_dim"]) == (64, 64)


def test_falcon_without_length_key_gets_the_class_default() -> None:
    assert not findings(lint(real_config(FALCON_40B)), "RS307")
    unknown_class = build_config({"config": FALCON_40B, "patch": {"/model_type": "some_remote_type"}})
    assert findings(lint(unknown_class), "RS307") == [(None, "warning")]


@pytest.mark.parametrize(("name", "head_dim", "rotary_dim"), [(PHI_15_REMOTE, 64, 32), (GRANITE_CODE, 80, 80)])
def test_remote_config_class_reads_gpt_style_keys(name: str, head_dim: int, rotary_dim: int) -> None:
    report = lint(real_config(name))
    assert not findings(report, "RS100"), report.to_text()
    assert (report.model["head_dim"], report.model["rotary_dim"]) == (head_dim, rotary_dim)


def test_gpt_style_keys_without_a_remote_config_class_stay_unreadable() -> None:
    """The in-library GraniteConfig has no n_embd alias: without auto_map the file cannot be read."""
    config = build_config({"config": GRANITE_CODE, "patch": {"/auto_map": DELETE}})
    [finding] = [f for f in lint(config).findings if f.rule.id == "RS100"]
    assert finding.severity.label == "error"


def test_stablelm_epoch_rope_pct_is_the_rotary_fraction() -> None:
    report = lint(real_config("stabilityai__stablelm-2-12b-chat.json"))
    assert (report.model["head_dim"], report.model["rotary_dim"]) == (160, 40)


def test_yarn_finetuned_key_of_the_yarn_release_is_not_unknown() -> None:
    name = "NousResearch__Yarn-Llama-2-13b-64k.json"
    assert not findings(lint(real_config(name)), "RS107")
    config = build_config({"config": name, "patch": {"/rope_scaling/finetune": True}})
    [finding] = [f for f in lint(config).findings if f.rule.id == "RS107"]
    assert finding.hit.pointer == "/rope_scaling/finetune"


def test_model_max_length_in_config_is_the_trained_context() -> None:
    """Command-R v01 writes max_position_embeddings 8192 and model_max_length 131072 (its card: 128K)."""
    name = "Aratako__c4ai-command-r-v01-japanese-instruct.json"
    report = lint(real_config(name), {"engines": ["transformers", "vllm"], "max_model_len": 131072})
    assert not findings(report, "RS309")
    assert findings(report, "RS302") == [("vllm", "error")]
    past = lint(real_config(name), {"engines": ["transformers"], "max_model_len": 262144})
    assert findings(past, "RS309") == [(None, "error")]


def test_persimmon_rotates_half_of_each_head() -> None:
    """PersimmonConfig's partial_rotary_factor default (0.5); persimmon-8b-base does not write it."""
    report = lint(real_config("adept__persimmon-8b-base.json"))
    assert (report.model["head_dim"], report.model["rotary_dim"], report.model["rope_theta"]) == (64, 32, 25000.0)


def test_phi3_small_rope_embedding_base_is_the_theta() -> None:
    report = lint(real_config("microsoft__Phi-3-small-8k-instruct.json"))
    assert report.model["rope_theta"] == 1e6
    assert findings(report, "RS110") == [(None, "info")]
