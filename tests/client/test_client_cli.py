"""``ropeserve-client`` CLI: output and exit codes (0 ok, 1 findings / not ready, 2 usage, input or connection)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from client_mocks import Recorder, problem
from safetensors.numpy import load

import ropeserve_client as rc
from ropeserve_client import _cli_common, cli

FINDINGS = {
    "findings": [
        {"rule": "RS301", "name": "length-over-derived", "severity": "error", "artifact": "config",
         "pointer": "/max_position_embeddings", "engine": "vllm", "message": "too long", "fix": "lower max_model_len"},
        {"rule": "RS701", "name": "table-precision", "severity": "info", "artifact": "config", "pointer": "/rope_theta",
         "engine": None, "message": "fyi", "fix": "none needed"},
    ],
    "engines": [{"engine": "vllm", "derived_max_len": 8192, "default_max_len": 8192, "rope_cache_rows": 8192,
                 "length_check": "ok"}],
    "model": {"model_type": "llama"},
}  # fmt: skip


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def mocked_server(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Route the CLI's client to a scripted MockTransport; tests set ``recorder.answers``."""
    recorder = Recorder(httpx.Response(200, json={"findings": []}))

    def mock_client(base_url: str | None, **options: object) -> rc.Client:
        options |= {"transport": httpx.MockTransport(recorder), "retry": rc.NO_RETRY}
        return rc.Client(base_url, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(_cli_common, "Client", mock_client)
    return recorder


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "rope_theta": 500000.0}))
    return path


def test_lint_exit_codes_follow_findings(
    capsys: pytest.CaptureFixture[str], mocked_server: Recorder, config_file: Path
) -> None:
    code, out, _ = run(capsys, "lint", str(config_file), "--engine", "vllm==0.9.1", "--max-model-len", "8192")
    assert code == 0 and out.strip().endswith("0 error, 0 warning, 0 info")
    sent = json.loads(mocked_server.requests[0].content)
    assert sent == {"config": {"model_type": "llama", "rope_theta": 500000.0},
                    "intent": {"engines": ["vllm==0.9.1"], "max_model_len": 8192}}  # fmt: skip

    mocked_server.answers = [httpx.Response(200, json=FINDINGS)]
    code, out, _ = run(capsys, "lint", str(config_file))
    assert code == 1
    assert "error   RS301 length-over-derived [vllm] at /max_position_embeddings" in out
    assert "fix: lower max_model_len" in out and "vllm: derived 8192, default 8192, cache rows 8192, ok" in out
    assert out.strip().endswith("1 error, 0 warning, 1 info")

    only_info = {**FINDINGS, "findings": FINDINGS["findings"][1:]}
    mocked_server.answers = [httpx.Response(200, json=only_info)]
    assert run(capsys, "lint", str(config_file))[0] == 0  # --fail-on defaults to error, as `ropeserve lint`
    assert run(capsys, "lint", str(config_file), "--fail-on", "warning")[0] == 0
    code, out, _ = run(capsys, "lint", str(config_file), "--fail-on", "info", "--format", "json")
    assert code == 1 and json.loads(out)["reports"][0]["findings"][0]["rule"] == "RS701"


def test_lint_reads_model_directories_and_intent_files(
    capsys: pytest.CaptureFixture[str], mocked_server: Recorder, tmp_path: Path, config_file: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (model / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 32768}))
    intent = tmp_path / "intent.json"
    intent.write_text(json.dumps({"engines": ["sglang"], "dtype": "bf16", "env": {"A": "1"}}))
    argv = ["lint", str(model), str(config_file), "--intent", str(intent), "--engine", "tgi", "--env", "B=2"]
    assert run(capsys, *argv)[0] == 0
    first, second = (json.loads(request.content) for request in mocked_server.requests)
    assert first["tokenizer_config"] == {"model_max_length": 32768} and "tokenizer_config" not in second
    assert first["intent"] == {"engines": ["tgi"], "dtype": "bf16", "env": {"A": "1", "B": "2"}}
    assert run(capsys, "lint", str(config_file), "--env", "novalue")[0] == 2
    (tmp_path / "empty").mkdir()
    assert run(capsys, "lint", str(tmp_path / "empty"))[0] == 2  # a directory without config.json


def test_input_and_server_errors_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], mocked_server: Recorder, tmp_path: Path, config_file: Path
) -> None:
    code, out, err = run(capsys, "lint", str(tmp_path / "missing.json"))
    assert code == 2 and err.startswith("ropeserve-client: error: cannot read") and err.count("\n") == 1
    (tmp_path / "bad.json").write_text("{not json")
    assert run(capsys, "lint", str(tmp_path / "bad.json"))[0] == 2
    mocked_server.answers = [problem(422, "invalid-input", "config must be a JSON object", field="/config")]
    code, _, err = run(capsys, "lint", str(config_file))
    assert code == 2 and "422 invalid-input: config must be a JSON object [field /config]" in err
    assert run(capsys, "cos-sin", "--positions", "0:4")[0] == 2  # no rope source
    assert run(capsys, "cos-sin", "--preset", "x", "--positions", "a:b")[0] == 2
    with pytest.raises(SystemExit) as usage:
        cli.main(["lint"])
    assert usage.value.code == 2


def test_connection_refused_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "info", "--url", "http://127.0.0.1:9", "--retries", "0")
    assert code == 2 and err.startswith("ropeserve-client: error: ConnectError")


def test_info_health_and_cos_sin_against_a_live_server(
    capsys: pytest.CaptureFixture[str], ropeserve_url: str, tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "info", "--url", ropeserve_url)
    assert code == 0 and "presets:" in out and "llama-3.1-8b" in out
    assert json.loads(run(capsys, "info", "--url", ropeserve_url, "--format", "json")[1])["version"]
    assert run(capsys, "health", "--url", ropeserve_url)[:2] == (0, "ready\n")

    code, out, _ = run(capsys, "cos-sin", "--url", ropeserve_url, "--preset", "llama-3.1-8b", "--positions", "0:16")
    assert code == 0 and "cos [16, 128] float32" in out and "attention_factor: 1.0" in out
    rope = '{"rope_type": "default", "rope_theta": 10000.0, "head_dim": 8}'
    code, out, _ = run(
        capsys, "cos-sin", "--url", ropeserve_url, "--rope", rope, "--positions", "1", "--format", "json"
    )
    assert code == 0 and json.loads(out)["cos"][0][0] == pytest.approx(0.5403023, abs=1e-7)
    target = tmp_path / "table.safetensors"
    assert (
        run(
            capsys,
            "cos-sin",
            "--url",
            ropeserve_url,
            "--preset",
            "qwen3-8b",
            "--positions",
            "0:4",
            "--out",
            str(target),
        )[0]
        == 0
    )  # noqa: E501
    assert load(target.read_bytes())["cos"].shape == (4, 128)
    assert np.isfinite(load(target.read_bytes())["sin"]).all()


def test_the_installed_command_runs_without_a_traceback(ropeserve_url: str) -> None:
    command = [sys.executable, "-m", "ropeserve_client.cli", "cos-sin", "--url", ropeserve_url]
    completed = subprocess.run(
        [*command, "--preset", "no-such-preset", "--positions", "0:2"], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 2
    assert completed.stderr.startswith("ropeserve-client: error: 422") and "Traceback" not in completed.stderr
