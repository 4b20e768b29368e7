"""The load kit: report arithmetic on synthetic samples, and a ~5 s headless run against the test server."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from report import Sample, build_report, write_markdown  # loadtest/, on pytest's pythonpath (pyproject.toml)
from scenarios import users_at

LOADTEST = Path(__file__).resolve().parents[2] / "loadtest"

RUN = {
    "scenario": "overload",
    "users": 4,
    "duration_s": 3,
    "target": "http://127.0.0.1:1",
    "replicas": 1,
    "started": "now",
    "server": {},
    "machine": {"cpus": 2},
}


def samples() -> list[Sample]:
    ok = [Sample(100.0 + i / 10, "cos-sin", 200, float(i + 1), 10, "") for i in range(20)]
    rejected = [Sample(101.5, "cos-sin", 429, 1.0, 0, "429 overloaded")] * 3
    broken = [Sample(102.0, "rotate", 500, 2.0, 0, "500 internal"), Sample(102.1, "rotate", 0, 5.0, 0, "transport: X")]
    return ok + rejected + broken


def test_report_counts_outcomes_and_fails_on_5xx(tmp_path: Path) -> None:
    report = build_report(samples(), run=RUN, users=[4, 4, 4], expects_rejections=True)
    assert report["totals"]["requests"] == 25
    assert (report["server_errors_5xx"], report["transport_errors"], report["rejected_429"]) == (1, 1, 3)
    assert report["failures_by_type"] == {"429 overloaded": 3, "500 internal": 1, "transport: X": 1}
    assert report["checks"] == {"passed": False, "failed_by": ["server_error", "transport"], "expects_429": True,
                                "saw_429": True}  # fmt: skip
    cos_sin = next(row for row in report["endpoints"] if row["name"] == "cos-sin")
    assert cos_sin["p50_ms"] == 10.5 and cos_sin["max_ms"] == 20.0 and cos_sin["failures"] == 3
    assert [row["ok_rps"] for row in report["timeline"]] == [10, 10, 0]
    write_markdown(report, tmp_path / "report.md")
    assert "FAILED: server_error, transport" in (tmp_path / "report.md").read_text()


def test_429_fails_a_run_unless_the_scenario_expects_it() -> None:
    only_rejections = [s for s in samples() if s.status in (200, 429)]
    assert build_report(only_rejections, run=RUN, users=[], expects_rejections=True)["checks"]["passed"]
    steady = build_report(only_rejections, run=RUN, users=[], expects_rejections=False)
    assert steady["checks"]["failed_by"] == ["rejected"]


def test_scenarios_are_bounded_curves() -> None:
    assert [users_at("spike", t, 16, 10) for t in range(11)] == [4] * 4 + [16] * 2 + [4] * 4 + [0]
    assert users_at("steady", 0, 8, 20) >= 1 and users_at("steady", 5, 8, 20) == 8 and users_at("soak", 20, 8, 20) == 0


def test_a_short_headless_run_writes_a_sane_report(ropeserve_url: str, tmp_path: Path) -> None:
    missing = [name for name in ("locust", "matplotlib") if importlib.util.find_spec(name) is None]
    if missing:  # find_spec, not import: importing locust here would gevent-patch this test process
        pytest.skip(f"needs the 'load' extra ({', '.join(missing)} missing)")
    command = [sys.executable, str(LOADTEST / "run.py"), "--url", ropeserve_url, "--scenario", "steady"]
    command += ["--users", "2", "--duration", "4", "--out", str(tmp_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=150)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    totals = report["totals"]
    assert (
        totals["requests"] > 10 and totals["rps"] > 0 and 0 < totals["p50_ms"] <= totals["p95_ms"] <= totals["p99_ms"]
    )
    assert report["server_errors_5xx"] == 0 and report["checks"]["passed"]
    assert {row["name"] for row in report["endpoints"]} >= {"cos-sin decode"}
    assert report["run"]["server"]["version"] and report["timeline"]
    assert (tmp_path / "report.md").read_text().startswith("# ropeserve load run: steady")
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_remote_targets_are_refused(tmp_path: Path) -> None:
    command = [sys.executable, str(LOADTEST / "run.py"), "--url", "http://example.com", "--out", str(tmp_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 2 and "only targets loopback" in completed.stderr
