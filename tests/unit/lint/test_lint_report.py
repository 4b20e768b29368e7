"""Report renderings: JSON, SARIF 2.1.0 (structure and line numbers), terminal text."""

from __future__ import annotations

import json

from lint_helpers import CONFIGS, build_config, lint

from ropeserve.lint import RULES, Artifact, sarif_log
from ropeserve.lint.pointers import join, line_index, line_of, resolve, split

QWEN_FILE = CONFIGS / "Qwen__Qwen2.5-VL-7B-Instruct.json"


def _located_report():
    text = QWEN_FILE.read_text(encoding="utf-8")
    report = lint(json.loads(text), {"engines": ["vllm", "tgi"], "max_model_len": 262144})
    return report.located({"config": Artifact(str(QWEN_FILE), text)})


def test_json_round_trip_and_summary() -> None:
    data = json.loads(_located_report().to_json())
    assert data["source"] == str(QWEN_FILE)
    assert {"findings", "engines", "numerics", "model", "intent", "summary", "tool"} <= set(data)
    assert data["summary"]["error"] == sum(1 for f in data["findings"] if f["severity"] == "error")
    assert data["findings"] == sorted(data["findings"], key=lambda f: ("error", "warning", "info").index(f["severity"]))


def test_sarif_structure() -> None:
    log = json.loads(_located_report().to_sarif())
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(RULES)
    assert run["artifacts"] == [{"location": {"uri": str(QWEN_FILE)}}]
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] in ("error", "warning", "note")
        location = result["locations"][0]["physicalLocation"]
        assert location["region"]["startLine"] >= 1
        assert location["artifactLocation"]["uri"] == str(QWEN_FILE)


def test_sarif_lines_point_at_the_member() -> None:
    text = QWEN_FILE.read_text(encoding="utf-8")
    log = json.loads(_located_report().to_sarif())
    result = next(r for r in log["runs"][0]["results"] if r["ruleId"] == "RS309")
    line = result["locations"][0]["physicalLocation"]["region"]["startLine"]
    assert '"max_position_embeddings"' in text.splitlines()[line - 1]


def test_sarif_log_merges_reports() -> None:
    first = lint(build_config({"config": "Qwen__Qwen2.5-7B-Instruct.json"}), {"max_model_len": 131072})
    second = lint(build_config({"config": "mistralai__Mistral-7B-Instruct-v0.3.json"}), {"max_model_len": 65536})
    named = [r.located({"config": Artifact(name)}) for r, name in ((first, "a.json"), (second, "b.json"))]
    run = sarif_log(named)["runs"][0]
    assert [a["location"]["uri"] for a in run["artifacts"]] == ["a.json", "b.json"]
    assert len(run["results"]) == len(first.findings) + len(second.findings)


def test_text_is_readable() -> None:
    text = _located_report().to_text()
    lines = text.splitlines()
    assert lines[0].startswith(str(QWEN_FILE)) and "qwen2_5_vl" in lines[0]
    assert any(line.startswith("  error   RS309") for line in lines)
    assert any(line.lstrip().startswith("fix: ") for line in lines)
    assert "cache rows" in text and lines[-1].strip().endswith(("info", "infos"))
    assert max(len(line) for line in lines if not line.lstrip().startswith(("fix", "ref", "numerics"))) < 400


def test_pointer_helpers() -> None:
    assert join("/a", "b/c", "d~e") == "/a/b~1c/d~0e"
    assert split("/a/b~1c/d~0e") == ["a", "b/c", "d~e"]
    assert resolve({"a": [{"b": 1}]}, "/a/0/b") == 1 and resolve({"a": 1}, "/x", "missing") == "missing"
    lines = line_index('{\n  "a": {\n    "b": [1,\n      2]\n  }\n}')
    assert lines["/a"] == 2 and lines["/a/b"] == 3 and lines["/a/b/1"] == 4
    assert line_of(lines, "/a/b/c/d") == 3 and line_of(lines, "/zzz") == 1
