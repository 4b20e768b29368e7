"""Contract fuzzing: schemathesis generates requests from the OpenAPI schema; no 5xx, responses conform."""

from __future__ import annotations

import os

import schemathesis
from hypothesis import HealthCheck, settings

from schemathesis.checks import positive_data_acceptance

from ropeserve.api import create_app
from ropeserve.settings import Settings

EXAMPLES_PER_OPERATION = int(os.environ.get("ROPESERVE_FUZZ_EXAMPLES", "80"))
APP = create_app(Settings(access_log=False, max_positions=4096, max_table_elements=1 << 20))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck))
def test_operation_conforms(case: schemathesis.Case) -> None:
    # Schema-valid data may still be semantically invalid (an unknown preset, a config without head_dim):
    # those are declared 422s, so "positive data acceptance" does not apply; every other check does.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
