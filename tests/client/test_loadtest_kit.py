"""The load kit: report arithmetic on synthetic samples, and a ~5 s headless run against the test server."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hostile import HOSTILE_PREFIX, AnswerBook, problem_check  # loadtest/, on pytest's pythonpath (pyproject.toml)
from report import Sample, build_report, users_per_second, write_markdown
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


def test_the_timeline_counts_from_load_start_and_shows_the_users_that_ran() -> None:
    recorded = [(0.0, 1), (0.25, 1), (0.5, 2), (0.75, 2), (1.0, 2), (2.5, 1), (3.2, 0)]
    assert users_per_second(recorded, 3) == [2, 2, 1]
    report = build_report(samples(), run=RUN, users=users_per_second(recorded, 3), expects_rejections=True,
                          load_started=99.0)  # fmt: skip
    assert [row["t"] for row in report["timeline"]] == [0, 1, 2]
    assert [row["ok_rps"] for row in report["timeline"]] == [0, 10, 10]  # the first request came 1 s in
    assert [row["users"] for row in report["timeline"]] == [2, 2, 1]
    assert report["measured_s"] == 3.1  # from load start (99.0) to the end of the last request (102.105)


def _safetensors_answer(metadata: str, data: bytes) -> bytes:
    header = json.dumps({"__metadata__": {"ropeserve": metadata}, "q": {"dtype": "U8", "shape": [len(data)],
                         "data_offsets": [0, len(data)]}}).encode()  # fmt: skip
    return len(header).to_bytes(8, "little") + header + data


def test_the_answer_book_ignores_timings_but_not_a_single_changed_byte() -> None:
    book = AnswerBook()
    book.record("rotate", 200, _safetensors_answer('{"total_s": 0.1}', bytes(range(64))))
    assert book.check("rotate", _safetensors_answer('{"total_s": 0.25}', bytes(range(64)))) is None
    leaked = bytearray(range(64))
    leaked[63] ^= 1
    assert book.check("rotate", _safetensors_answer('{"total_s": 0.1}', bytes(leaked))) is not None
    assert book.check("cos-sin", b"anything") is None  # no reference taken: nothing to compare
    with pytest.raises(RuntimeError):
        book.record("broken", 500, b"")


def test_hostile_requests_must_be_refused_with_a_problem() -> None:
    problem = {"content-type": "application/problem+json"}
    assert problem_check(422, problem, b"{}") is None
    assert problem_check(200, {"content-type": "application/json"}, b"{}") is not None  # accepted: wrong
    assert problem_check(500, problem, b"{}") is not None
    assert problem_check(429, problem, b"{}") is not None
    assert problem_check(400, {"content-type": "text/plain"}, b"") is not None


def test_wrong_answers_fail_a_run_and_expected_refusals_do_not() -> None:
    refused = [Sample(100.0, HOSTILE_PREFIX + "theta 10**400", 422, 1.0, 10, "")] * 3
    report = build_report(samples()[:20] + refused, run=RUN, users=[4], expects_rejections=False)
    assert report["expected_refusals"] == 3 and report["wrong_answers"] == 0 and report["checks"]["passed"]
    assert report["totals"]["failures"] == 0
    wrong = [Sample(101.0, "verified rotate 4 #0", 200, 1.0, 10, "wrong: answer differs")]
    report = build_report(samples()[:20] + wrong, run=RUN, users=[4], expects_rejections=False)
    assert report["wrong_answers"] == 1 and report["checks"]["failed_by"] == ["wrong"]


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
    totals = report["totals"]  # how many requests fit in 4 s depends on the machine: only their shape is checked
    assert totals["requests"] >= 1 and 0 < totals["p50_ms"] <= totals["p95_ms"] <= totals["p99_ms"]
    assert totals["requests"] == sum(row["requests"] for row in report["endpoints"])
    assert report["server_errors_5xx"] == 0 and report["transport_errors"] == 0 and report["checks"]["passed"]
    assert report["run"]["server"]["version"]
    meta = json.loads((tmp_path / "samples.csv.meta.json").read_text())
    first_request = min(float(line.split(",")[0]) for line in (tmp_path / "samples.csv").read_text().splitlines()[1:])
    assert meta["load_started"] <= first_request  # the clock starts with the load, after the payloads are built
    timeline = report["timeline"]
    assert [row["t"] for row in timeline] == list(range(len(timeline))) and 1 <= len(timeline) <= 4
    running = [row["users"] for row in timeline]
    assert max(users for users in running if users is not None) == 2  # the users that ran, not the plan
    assert meta["users"][0][1] <= 1  # sampled as load starts: the ramp's first step at most, never the plan's peak
    assert (tmp_path / "report.md").read_text().startswith("# ropeserve load run: steady")
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_remote_targets_are_refused(tmp_path: Path) -> None:
    command = [sys.executable, str(LOADTEST / "run.py"), "--url", "http://example.com", "--out", str(tmp_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 2 and "only targets loopback" in completed.stderr
