"""Contract fuzzing against the real server (HTTP over loopback): schemathesis from the live OpenAPI schema.

Fewer examples per operation than the in-process run (tests/contract), which it complements: together they
generate well over 1,000 cases. Safetensors bodies mix valid files with the malformed corpus and random bytes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import positive_data_acceptance
from test_malformed_bodies import CORPUS

from ropeserve_client.testing import LocalServer
from support import VALID_BODIES

LIVE_EXAMPLES_PER_OPERATION = int(os.environ.get("ROPESERVE_LIVE_FUZZ_EXAMPLES", "40"))
SAFETENSORS_MEDIA = "application/x-safetensors"
MEDIA_STRATEGIES = schemathesis.openapi.media_type.__globals__["MEDIA_TYPE_STRATEGIES"]
CASES: Counter[str] = Counter()


def tensor_bodies() -> st.SearchStrategy[bytes]:
    valid = [make() for make in VALID_BODIES.values()]
    malformed = [case("q", valid[0]) for case in CORPUS.values()]
    return st.sampled_from(valid + malformed) | st.binary(max_size=256)


@pytest.fixture(scope="module")
def live_schema(guarded_server: LocalServer) -> Iterator[schemathesis.BaseSchema]:
    """The live schema, with this suite's safetensors strategy for as long as it runs (then the previous one)."""
    previous = MEDIA_STRATEGIES.get(SAFETENSORS_MEDIA)
    schemathesis.openapi.media_type(SAFETENSORS_MEDIA, tensor_bodies())
    yield schemathesis.openapi.from_url(f"{guarded_server.url}/openapi.json")
    if previous is not None:
        MEDIA_STRATEGIES[SAFETENSORS_MEDIA] = previous


def fuzz_operation(operation: schemathesis.APIOperation) -> None:
    @given(case=operation.as_strategy())
    @settings(max_examples=LIVE_EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck))
    def check(case: schemathesis.Case) -> None:
        CASES[operation.label] += 1
        case.call_and_validate(excluded_checks=[positive_data_acceptance], timeout=30)

    check()


def test_every_live_operation_conforms(live_schema: schemathesis.BaseSchema) -> None:
    operations = [result.ok() for result in live_schema.get_all_operations()]
    for operation in operations:
        fuzz_operation(operation)
    total = sum(CASES.values())
    print(f"\nlive fuzzing: {total} cases over {len(operations)} operations")
    assert len(CASES) == len(operations) and total >= len(operations) * min(LIVE_EXAMPLES_PER_OPERATION, 10), CASES
