"""requirements/*.lock: every Python package of the image pinned with hashes, in step with pyproject.toml.

scripts/lock regenerates them (uv pip compile --generate-hashes); these checks need no network.
"""

from __future__ import annotations

import re
import tomllib

import pytest
from deploy_tools import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
BUILD_REQUIRES = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
VARIANT_EXTRAS = {"cpu": ["server", "tracing"], "cuda": ["server", "gpu", "tracing"]}


def locked(variant: str) -> dict[str, tuple[Version, list[str]]]:
    """name -> (pinned version, hashes) of one lock file."""
    text = (REPO / f"requirements/{variant}.lock").read_text()
    entries: dict[str, tuple[Version, list[str]]] = {}
    for block in re.split(r"\n(?=\S)", text):
        match = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)", block)
        if match:
            hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
            entries[canonicalize_name(match.group(1))] = (Version(match.group(2)), hashes)
    return entries


@pytest.mark.parametrize("variant", VARIANT_EXTRAS)
def test_every_pin_has_a_hash(variant: str) -> None:
    entries = locked(variant)
    assert len(entries) > 20
    unhashed = sorted(name for name, (_, hashes) in entries.items() if not hashes)
    assert not unhashed


@pytest.mark.parametrize("variant", VARIANT_EXTRAS)
def test_lock_covers_pyproject_and_satisfies_its_specifiers(variant: str) -> None:
    entries = locked(variant)
    wanted = PROJECT["dependencies"] + BUILD_REQUIRES
    for extra in VARIANT_EXTRAS[variant]:
        wanted += PROJECT["optional-dependencies"][extra]
    for line in wanted:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        if name == canonicalize_name(PROJECT["name"]):
            continue  # an extra that names another extra of this project (gpu = ropeserve[server] + triton)
        assert name in entries, f"{name} is not in requirements/{variant}.lock: run scripts/lock"
        version = entries[name][0]
        assert requirement.specifier.contains(version, prereleases=True), f"{name} {version} vs {requirement}"


def test_locked_torch_is_the_version_bootstrap_installs() -> None:
    bootstrap = re.search(r"^torch_version=(\S+)$", (REPO / "scripts/bootstrap").read_text(), re.MULTILINE).group(1)
    cpu_torch, cuda_torch = locked("cpu")["torch"][0], locked("cuda")["torch"][0]
    assert cpu_torch.public == cuda_torch.public == bootstrap
    assert cpu_torch.local == "cpu", "the CPU image must never pull PyPI's CUDA build"
    assert "triton" in locked("cuda") and not any(name.startswith("nvidia-") for name in locked("cpu"))
