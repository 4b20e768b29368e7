"""Every route declares the problem+json statuses it can answer, so the OpenAPI schema is the contract."""

from __future__ import annotations

import pytest

from ropeserve.api import create_app
from ropeserve.settings import Settings

SCHEMA = create_app(Settings(access_log=False)).openapi()
POST_OPERATIONS = [(path, item["post"]) for path, item in SCHEMA["paths"].items() if "post" in item]


def test_there_are_post_operations() -> None:
    assert len(POST_OPERATIONS) >= 1


@pytest.mark.parametrize(("path", "operation"), POST_OPERATIONS, ids=[path for path, _ in POST_OPERATIONS])
def test_post_routes_declare_problem_responses(path: str, operation: dict) -> None:
    responses = operation["responses"]
    for status in ("413", "422"):
        assert status in responses, f"{path} does not declare {status}"
        assert "application/problem+json" in responses[status]["content"], f"{path} {status} is not problem+json"
    assert operation.get("summary"), f"{path} has no summary"
