"""Contract fuzzing: schemathesis generates requests from the OpenAPI schema; no 5xx, responses conform.

Safetensors bodies come from a strategy that mixes well-formed files (random small tensors under the names
the endpoints read, random JSON parameters in ``__metadata__``) with arbitrary bytes.
"""

from __future__ import annotations

import json
import os

import schemathesis
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from safetensors.torch import save
from schemathesis.checks import positive_data_acceptance

from ropeserve.api import create_app
from ropeserve.settings import Settings

EXAMPLES_PER_OPERATION = int(os.environ.get("ROPESERVE_FUZZ_EXAMPLES", "80"))
TENSOR_NAMES = ("q", "k", "positions", "table")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32)
JSON_SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8)
)
JSON_PARAMS = st.dictionaries(
    st.sampled_from(["preset", "rope", "layout", "pairing", "source_grid", "target_grid", "mode", "prefix_rows"]),
    JSON_SCALARS | st.lists(st.integers(0, 64), max_size=3),
    max_size=5,
)


@st.composite
def safetensors_files(draw: st.DrawFn) -> bytes:
    names = draw(st.lists(st.sampled_from(TENSOR_NAMES), min_size=1, max_size=3, unique=True))
    tensors = {}
    for name in names:
        shape = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4))
        dtype = draw(st.sampled_from(DTYPES))
        tensors[name] = (torch.randn(shape) * 8).to(dtype)
    params = draw(
        JSON_PARAMS | st.sampled_from([{"preset": "llama-3.1-8b"}, {"source_grid": [2, 2], "target_grid": [3, 3]}])
    )
    return save(tensors, metadata={"ropeserve": json.dumps(params)})


schemathesis.openapi.media_type("application/x-safetensors", safetensors_files() | st.binary(max_size=256))
APP = create_app(Settings(access_log=False, max_positions=4096, max_table_elements=1 << 20))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck))
def test_operation_conforms(case: schemathesis.Case) -> None:
    # Schema-valid data may still be semantically invalid (an unknown preset, a config without head_dim):
    # those are declared 422s, so "positive data acceptance" does not apply; every other check does.
    case.call_and_validate(excluded_checks=[positive_data_acceptance])
