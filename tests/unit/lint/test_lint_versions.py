"""The tiny version parser used for engine pins."""

from __future__ import annotations

import pytest

from ropeserve.errors import InvalidInput
from ropeserve.lint.versions import Version, VersionSpec

ORDERED = ["0.9.0.dev1", "0.9.0a1", "0.9.0b2", "0.9.0rc1", "0.9", "0.9.0.post1", "0.9.1", "0.10", "0.10.1", "1.0"]


def test_ordering_follows_pep440() -> None:
    versions = [Version.parse(text) for text in ORDERED]
    assert versions == sorted(versions)
    assert Version.parse("0.9") == Version.parse("0.9.0") == Version.parse("v0.9.0")
    assert Version.parse("4.57.0+cu121") == Version.parse("4.57.0")


def test_llama_cpp_build_tags() -> None:
    assert Version.parse("b4500") < Version.parse("b4600")


@pytest.mark.parametrize(
    ("spec", "version", "allowed"),
    [
        ("==0.9.1", "0.9.1", True),
        ("==0.9.1", "0.9.2", False),
        (">=0.10", "0.9.2", False),
        (">=0.10,<0.12", "0.11.2", True),
        (">=0.10,<0.12", "0.12", False),
        ("~=0.10.1", "0.10.9", True),
        ("~=0.10.1", "0.11", False),
        ("==0.10.*", "0.10.7", True),
        ("!=0.10.*", "0.10.7", False),
        ("", "0.1", True),
    ],
)
def test_spec_allows(spec: str, version: str, allowed: bool) -> None:
    assert VersionSpec.parse(spec).allows(Version.parse(version)) is allowed


@pytest.mark.parametrize(
    ("spec", "predates"),
    [("", False), ("==4.42.0", True), ("==4.43.0", False), (">=4.40", True), (">=4.43", False), ("<5", True)],
)
def test_may_predate(spec: str, predates: bool) -> None:
    assert VersionSpec.parse(spec).may_predate(Version.parse("4.43.0")) is predates


@pytest.mark.parametrize("text", ["banana", "==", ">=x.y", "~=1"])
def test_invalid_specs_raise(text: str) -> None:
    with pytest.raises(InvalidInput):
        VersionSpec.parse(text)
