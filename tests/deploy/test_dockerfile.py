"""Dockerfile: hadolint clean, multi-stage, CPU default and CUDA by build argument, non-root, one worker."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pytest
from deploy_tools import REPO

from ropeserve.settings import Settings

pytestmark = pytest.mark.deploy


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, keyword: str) -> list[str]:
        return [value for key, value in self.instructions if key == keyword]


def parse_dockerfile(text: str) -> tuple[list[tuple[str, str]], list[Stage]]:
    """(global ARGs, stages); each instruction is (KEYWORD, rest of the line), continuations joined."""
    joined = re.sub(r"\\\n", " ", text)
    lines = [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    preamble: list[tuple[str, str]] = []
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = rest.split()
            stages.append(Stage(base=parts[0], name=parts[2] if len(parts) > 2 else None))
        elif stages:
            stages[-1].instructions.append((keyword, rest.strip()))
        else:
            preamble.append((keyword, rest.strip()))
    return preamble, stages


@pytest.fixture(scope="module")
def dockerfile() -> tuple[list[tuple[str, str]], list[Stage]]:
    return parse_dockerfile((REPO / "Dockerfile").read_text())


def test_hadolint_finds_nothing(tool) -> None:
    result = tool("hadolint", "--no-color", "Dockerfile")
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_multi_stage_build_copies_only_the_environment(dockerfile) -> None:
    _, stages = dockerfile
    assert len(stages) >= 3 and [s.name for s in stages][-1] == "runtime"
    final = stages[-1]
    copies = final.values("COPY")
    assert copies and all(c.startswith("--from=build ") for c in copies), copies
    assert not any("pip install" in run for run in final.values("RUN")), "no installs in the final stage"


def test_cpu_by_default_and_cuda_by_build_argument(dockerfile) -> None:
    preamble, stages = dockerfile
    assert ("ARG", "BASE_IMAGE=python:3.11-slim-bookworm") in preamble
    assert stages[0].base == "${BASE_IMAGE}"
    build = next(s for s in stages if s.name == "build")
    assert "VARIANT=cpu" in build.values("ARG")
    installs = " ".join(build.values("RUN"))
    assert "https://download.pytorch.org/whl/cpu" in installs
    assert "https://download.pytorch.org/whl/${TORCH_CUDA}" in installs and 'extra="server,gpu"' in installs
    assert 'extra="server"' in installs, "the service needs the server extra (the base install is lint-only)"


def test_runs_as_a_non_root_user(dockerfile) -> None:
    final = dockerfile[1][-1]
    (user,) = final.values("USER")
    assert user.split(":")[0] not in {"root", "0"} and user.split(":")[0].isdigit(), user


def test_one_uvicorn_worker_listening_on_all_interfaces(dockerfile) -> None:
    final = dockerfile[1][-1]
    (cmd,) = final.values("CMD")
    assert json.loads(cmd) == ["ropeserve", "serve"]  # exec form; `ropeserve serve` runs exactly one worker
    env = " ".join(final.values("ENV"))
    assert "ROPESERVE_HOST=0.0.0.0" in env
    assert final.values("EXPOSE") == [str(Settings().port)] and f"ROPESERVE_PORT={Settings().port}" in env


def test_health_check_probes_readiness(dockerfile) -> None:
    final = dockerfile[1][-1]
    (check,) = final.values("HEALTHCHECK")
    command = json.loads(check.split(" CMD ", 1)[1])
    assert command[:2] == ["python3", "-c"] and "/health/ready" in command[2]
    compile(command[2], "HEALTHCHECK", "exec")


def test_build_context_holds_only_what_the_image_copies(dockerfile) -> None:
    patterns = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert patterns[0] == "*", "allow-list: ignore everything, then re-include"
    included = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    sources = {
        src.rstrip("/")
        for stage in dockerfile[1]
        for copy in stage.values("COPY")
        if not copy.startswith("--from")
        for src in copy.split()[:-1]
    }
    assert sources and sources <= included, sources - included
    assert all((REPO / path).exists() for path in included)


def test_runtime_can_build_the_cpu_kernel_into_a_writable_cache(dockerfile) -> None:
    """The C kernel is compiled for the host CPU at start-up: the runtime's base stage installs a compiler
    whenever the base image lacks one, and the cache lies under /tmp (writable with readOnlyRootFilesystem)."""
    _, stages = dockerfile
    by_name = {stage.name: stage for stage in stages}
    runtime = by_name["runtime"]
    assert runtime.base == "base"
    assert any("command -v cc" in run and "gcc libc6-dev" in run for run in by_name["base"].values("RUN"))
    env = " ".join(runtime.values("ENV"))
    assert re.search(r"ROPESERVE_KERNEL_CACHE=/tmp/\S+", env), env
