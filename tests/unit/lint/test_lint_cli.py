"""``python -m ropeserve.cli``: exit codes, formats, inputs, explain and its plot."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lint_helpers import CONFIGS

QWEN = str(CONFIGS / "Qwen__Qwen2.5-7B-Instruct.json")
LLAMA = str(CONFIGS / "meta-llama__Llama-3.1-8B-Instruct.json")
QWEN_VL = str(CONFIGS / "Qwen__Qwen2.5-VL-7B-Instruct.json")


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ropeserve.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=cwd)


def test_clean_config_exits_zero() -> None:
    result = run("lint", LLAMA, "--max-model-len", "131072")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 errors" in result.stdout


def test_errors_exit_one_and_fail_on_warning() -> None:
    assert run("lint", QWEN, "--max-model-len", "131072").returncode == 1
    phi = str(CONFIGS / "microsoft__Phi-3-mini-128k-instruct.json")
    assert run("lint", phi, "--engine", "vllm").returncode == 0
    assert run("lint", phi, "--engine", "vllm", "--fail-on", "warning").returncode == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("lint", "/nonexistent/config.json"), "cannot read"),
        (("lint", QWEN, "--engine", "vllm==banana"), "not a version"),
        (("lint", QWEN, "--engine", "exllama"), "unknown engine"),
        (("lint", QWEN, "--env", "NOVALUE"), "NAME=VALUE"),
        (("lint",), "at least one PATH"),
        (("explain", "/nonexistent.json"), "cannot read"),
    ],
)
def test_input_errors_exit_two_with_one_line(args: tuple[str, ...], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_invalid_json_and_non_object(tmp_path: Path) -> None:
    broken = tmp_path / "config.json"
    broken.write_text('{"rope_theta": ')
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    for path, message in ((broken, "invalid JSON"), (listing, "expected a JSON object")):
        result = run("lint", str(path))
        assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


HUGE_INT = "1" + "0" * 400  # 10**400: no float holds it
LLAMA_TEXT = Path(LLAMA).read_text()


@pytest.mark.parametrize(
    ("config_text", "args", "message"),
    [
        (
            LLAMA_TEXT.replace('"max_position_embeddings": 131072', f'"max_position_embeddings": {HUGE_INT}'),
            (),
            "/config/max_position_embeddings: an integer of about 400 digits is outside the float range",
        ),
        (LLAMA_TEXT, ("--engine", "vllm==" + "9" * 5000), "a version number of 5000 digits"),
        (LLAMA_TEXT, ("--engine", "vllm>=0." + "1" * 5000), "a version number of 5000 digits"),
        (LLAMA_TEXT.replace('"rope_theta": 500000.0', f'"rope_theta": 1{"0" * 5000}'), (), "5001 digits"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", (), "JSON nested 100001 deep"),
    ],
    ids=["max_position_embeddings 10**400", "5000-digit engine pin", "5000-digit constraint", "5001-digit int", "deep"],
)
def test_hostile_input_is_an_input_error_not_a_crash(
    tmp_path: Path, config_text: str, args: tuple[str, ...], message: str
) -> None:
    """Each of these crashed with a traceback and exit 1 (the findings code); input errors are exit 2, one line."""
    path = tmp_path / "config.json"
    path.write_text(config_text)
    result = run("lint", str(path), *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("rope_scaling", "intent"),
    [
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "beta_fast": 1e308}, {}),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "beta_slow": 5e-324}, {}),
        (None, {"video_fps": 1e308, "max_video_seconds": 600}),
    ],
    ids=["yarn beta_fast 1e308", "yarn beta_slow 5e-324", "video_fps 1e308"],
)
def test_extreme_finite_values_are_linted_not_crashed(tmp_path: Path, rope_scaling: dict | None, intent: dict) -> None:
    """Finite values whose formulas overflow (a traceback and exit 1 before): a report, exit 0 or 1 by findings."""
    if rope_scaling is not None:
        config = json.loads(LLAMA_TEXT) | {"rope_scaling": rope_scaling}
    else:  # without vision_config.tokens_per_second the video extent comes from video_fps
        config = json.loads(Path(QWEN_VL).read_text())
        del config["vision_config"]["tokens_per_second"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "intent.json").write_text(json.dumps(intent))
    result = run("lint", str(tmp_path / "config.json"), "--intent", str(tmp_path / "intent.json"), "--format", "json")
    assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    assert json.loads(result.stdout)["reports"][0]["model"]["model_type"] == config["model_type"]


def test_usage_error_exits_two() -> None:
    result = run("lint", QWEN, "--max-model-len", "lots")
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_model_directory_with_tokenizer_config(tmp_path: Path) -> None:
    shutil.copy(QWEN, tmp_path / "config.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 8192}))
    result = run("lint", str(tmp_path), "--format", "json")
    data = json.loads(result.stdout)
    finding = next(f for f in data["reports"][0]["findings"] if f["rule"] == "RS305")
    assert finding["artifact"] == "tokenizer_config"
    assert run("lint", str(tmp_path / "missing")).returncode == 2


def test_sarif_output_for_several_paths() -> None:
    result = run("lint", QWEN, LLAMA, "--max-model-len", "131072", "--format", "sarif")
    log = json.loads(result.stdout)
    assert result.returncode == 1 and log["version"] == "2.1.0"
    assert {a["location"]["uri"] for a in log["runs"][0]["artifacts"]} >= {QWEN}


def test_intent_file_and_flag_override(tmp_path: Path) -> None:
    intent = tmp_path / "intent.json"
    intent.write_text(json.dumps({"engines": ["vllm"], "max_model_len": 131072, "env": {"A": "1"}}))
    assert run("lint", QWEN, "--intent", str(intent)).returncode == 1
    assert run("lint", QWEN, "--intent", str(intent), "--max-model-len", "32768").returncode == 0


def test_list_rules_prints_the_catalogue() -> None:
    result = run("lint", "--list-rules")
    assert result.returncode == 0 and result.stdout.count("\n| ") >= 35


def test_explain_text_and_json() -> None:
    result = run("explain", LLAMA, "--max-model-len", "131072")
    assert result.returncode == 0 and "llama3 ramp" in result.stdout
    data = json.loads(run("explain", LLAMA, "--format", "json").stdout)
    assert len(data["bands"]) == 64


def test_explain_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "spectrum.png"
    result = run("explain", LLAMA, "--plot", str(target))
    assert result.returncode == 0, result.stderr
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explain_plot_without_matplotlib_exits_two(tmp_path: Path) -> None:
    blocker = tmp_path / "matplotlib"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('blocked for the test')")
    argv = ["explain", LLAMA, "--plot", str(tmp_path / "x.png")]
    code = f"import sys; from ropeserve.cli import main; sys.exit(main({argv!r}))"
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and "pip install 'ropeserve[plot]'" in result.stderr
