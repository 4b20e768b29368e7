"""Precision and recall of ``ropeserve lint`` on real public configs and on known-bad variants of real issues.

Precision: every full config.json in tests/fixtures/configs (sources in SOURCES.md; the ``*snippet*`` files are
card fragments, not configs) is linted twice: with no flags (the default targets) and at its documented deployment
(engines and context length from its model card, ``deployments`` in tests/fixtures/lint/corpus.json). Every error
and warning must be listed in ``judgements`` of that file with a verdict, ``true`` (a real hazard for that
deployment) or ``false`` (a false finding); an unlisted one is reported as unjudged. Precision is
true / (true + false) over the errors and warnings.

Recall: every known-bad variant in tests/fixtures/lint/issues (one real user issue each, with the rules that must
fire) is linted at its intent; recall is the share of variants where every expected rule fires.

    .venv/bin/python benchmarks/lint_corpus.py            # table
    .venv/bin/python benchmarks/lint_corpus.py --json     # the figures as JSON (what the test suite checks)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ropeserve.lint import DeploymentIntent, LintReport, lint_config
from ropeserve.lint.pointers import patched

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
LINT_FIXTURES = ROOT / "tests" / "fixtures" / "lint"
CORPUS = LINT_FIXTURES / "corpus.json"
BLOCKING = ("error", "warning")


def corpus_files() -> list[Path]:
    return sorted(p for p in CONFIGS.glob("*.json") if "snippet" not in p.name)


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def runs(data: Mapping[str, Any]) -> Iterator[tuple[str, str, dict[str, Any], LintReport]]:
    """(file, run label, intent, report) for the no-flag run and the documented deployment of each config."""
    deployments = data["deployments"]
    for path in corpus_files():
        config = load(path)
        yield path.name, "no flags", {}, lint_config(config)
        intent = deployments.get(path.name)
        if intent is not None:
            yield path.name, "deployment", intent, lint_config(config, DeploymentIntent.from_mapping(intent))


def precision(data: Mapping[str, Any]) -> dict[str, Any]:
    judged = {(j["file"], j["rule"], j.get("engine")): j for j in data["judgements"]}
    rows, counts = [], {"true": 0, "false": 0, "unjudged": 0}
    files, runs_done = set(), 0
    for name, label, _intent, report in runs(data):
        files.add(name)
        runs_done += 1
        for finding in report.findings:
            if finding.severity.label not in BLOCKING:
                continue
            verdict = judged.get((name, finding.rule.id, finding.hit.engine), {}).get("verdict", "unjudged")
            counts[verdict] += 1
            rows.append(
                {
                    "file": name,
                    "run": label,
                    "rule": finding.rule.id,
                    "engine": finding.hit.engine,
                    "severity": finding.severity.label,
                    "verdict": verdict,
                    "message": finding.hit.message,
                }
            )
    flagged = counts["true"] + counts["false"]
    return {
        "configs": len(files),
        "runs": runs_done,
        "findings": rows,
        "counts": counts,
        "precision": counts["true"] / flagged if flagged else 1.0,
        "errors_without_flags": sum(1 for r in rows if r["run"] == "no flags" and r["severity"] == "error"),
    }


def issue_config(case: Mapping[str, Any]) -> dict[str, Any]:
    config = load(CONFIGS / case["config"])
    if "rope_scaling_snippet" in case:
        snippet = load(CONFIGS / case["rope_scaling_snippet"])
        config["rope_scaling"] = snippet.get("rope_scaling", snippet)
    return patched(config, case.get("patch"))


def recall() -> dict[str, Any]:
    rows = []
    for path in sorted((LINT_FIXTURES / "issues").glob("*.json")):
        case = load(path)
        draft = issue_config(case["draft"]) if "draft" in case else None
        report = lint_config(issue_config(case), DeploymentIntent.from_mapping(case["intent"]), draft_config=draft)
        fired = {f.rule.id for f in report.findings}
        missed = sorted(set(case["expect"]) - fired)
        rows.append({"issue": path.stem, "url": case["issue"], "expected": case["expect"], "missed": missed})
    caught = sum(1 for r in rows if not r["missed"])
    return {"variants": len(rows), "caught": caught, "recall": caught / len(rows) if rows else 1.0, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    data = load(CORPUS)
    result = {"precision": precision(data), "recall": recall()}
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        return 0
    p, r = result["precision"], result["recall"]
    for row in p["findings"]:
        engine = f" [{row['engine']}]" if row["engine"] else ""
        print(f"{row['verdict']:<9}{row['severity']:<8}{row['rule']}{engine} {row['file']} ({row['run']})")
    print(
        f"precision: {p['configs']} configs, {p['runs']} runs, errors+warnings {sum(p['counts'].values())} "
        f"(true {p['counts']['true']}, false {p['counts']['false']}, unjudged {p['counts']['unjudged']}), "
        f"precision {p['precision']:.3f}, errors with no flags {p['errors_without_flags']}"
    )
    print(f"recall: {r['caught']}/{r['variants']} known-bad issue variants caught ({r['recall']:.3f})")
    for row in r["rows"]:
        if row["missed"]:
            print(f"  missed {row['missed']} in {row['issue']} ({row['url']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
