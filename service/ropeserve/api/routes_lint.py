"""``POST /v1/config/validate``: the config linter over HTTP, for deployment pipelines."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import Field

from ropeserve.api.docs import operation_id
from ropeserve.api.fast_json import encode_json
from ropeserve.api.inline import INLINE_MAX_BODY_BYTES, run_sized
from ropeserve.api.json_route import JSONRoute
from ropeserve.api.runtime import Runtime, RuntimeDep
from ropeserve.api.schemas import StrictModel
from ropeserve.lint import validate_config_request
from ropeserve.serving.answers import CachedAnswer

router = APIRouter(tags=["lint"], route_class=JSONRoute, generate_unique_id_function=operation_id)
REPORT_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": True}
"""The report's keys are documented in docs/lint.md (findings, engines' derived lengths, numerics)."""


class ValidateRequest(StrictModel):
    config: dict[str, Any] = Field(..., description="A Hugging Face config.json object (any form).")
    intent: dict[str, Any] | None = Field(
        None,
        description="Deployment intent: engines (e.g. 'vllm==0.9.1'), max_model_len (or context_length / n_ctx), "
        "dtype, phase_dtype, env, disable_sliding_window, pairing, mrope_layout, rope_override, video_fps, "
        "max_video_seconds, positions.",
        examples=[{"engines": ["vllm", "sglang"], "max_model_len": 131072, "dtype": "bf16"}],
    )
    tokenizer_config: dict[str, Any] | None = Field(None, description="tokenizer_config.json (model_max_length).")
    draft_config: dict[str, Any] | None = Field(None, description="The speculative draft model's config.json.")


@router.post(
    "/v1/config/validate",
    summary="Lint an inference config against a deployment intent",
    description="Returns findings (rule id, severity, JSON pointer, message, fix, reference), the maximum length "
    "and rope cache rows each target engine derives, and cos/sin numerics for the dtype. Problems in the config "
    "are findings (200); only a malformed request is a 422. A body that repeats one answered before, byte for "
    "byte, gets the stored report (ROPESERVE_LINT_ANSWER_CACHE_BYTES). Rules: docs/lint.md.",
    response_class=Response,
    responses={200: {"description": "The lint report.", "content": {"application/json": {"schema": REPORT_SCHEMA}}}},
)
async def validate_config(body: ValidateRequest, request: Request, runtime: RuntimeDep) -> Response:
    raw = await request.body()  # read already, to parse it: the exact bytes the report is a function of
    answer = runtime.lint_answers.get(raw)
    if answer is None:
        runtime.metrics.lint_answer_misses.inc()
        answer = await run_sized(len(raw), lambda: _lint(body), INLINE_MAX_BODY_BYTES, uses_torch=False)
        runtime.lint_answers.put(raw, answer)
    else:
        runtime.metrics.lint_answer_hits.inc()
    return _served(answer, runtime)


def _lint(body: ValidateRequest) -> CachedAnswer:
    """The encoded report, labelled with each finding's (rule, severity)."""
    report = validate_config_request(_request_of(body))
    return CachedAnswer(encode_json(report), tuple((f["rule"], f["severity"]) for f in report["findings"]))


def _served(answer: CachedAnswer, runtime: Runtime) -> Response:
    """``answer`` as this request's response, its findings counted as if linted now."""
    for rule, severity in answer.labels:
        runtime.metrics.count_lint_finding(rule, severity)
    return Response(answer.body, media_type="application/json")


def _request_of(body: ValidateRequest) -> dict[str, Any]:
    """The request as ``validate_config_request`` reads it: the fields given, their parsed JSON as is (what
    ``model_dump(exclude_none=True)`` returns, without copying every document; pydantic keeps the field values in
    the model's ``__dict__``, which ``ValidateRequest``'s ``extra="forbid"`` leaves without other keys)."""
    return {name: value for name, value in vars(body).items() if value is not None}
