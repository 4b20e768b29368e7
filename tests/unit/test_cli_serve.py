"""``ropeserve serve`` refuses invalid settings with one line and exit status 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ROPESERVE_PORT": "abc"}, "ROPESERVE_PORT"),
        ({"ROPESERVE_BATCH_QUEUE_SIZE": "0"}, "ROPESERVE_BATCH_QUEUE_SIZE"),
        ({"ROPESERVE_HEADER_TIMEOUT_S": "0"}, "ROPESERVE_HEADER_TIMEOUT_S"),
        ({"ROPESERVE_MAX_INFLIGHT_BODY_BYTES": "1048576"}, "max_inflight_body_bytes (1048576) must hold"),
    ],
)
def test_invalid_settings_exit_two_with_one_line(env: dict[str, str], named: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ropeserve.cli", "serve"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0]


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_serve_sets_the_openmp_wait_policy_unless_given(
    monkeypatch: pytest.MonkeyPatch, given: str | None, expected: str
) -> None:
    from ropeserve import cli

    monkeypatch.setenv("ROPESERVE_PORT", "abc")  # invalid: serve stops (status 2) before starting anything
    if given is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", given)
    assert cli.main(["serve"]) == 2
    assert os.environ["OMP_WAIT_POLICY"] == expected
