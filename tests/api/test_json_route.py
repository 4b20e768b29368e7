"""``JSONRoute``'s direct handler answers exactly as FastAPI's own handler does, for good and bad requests.

Two apps share one endpoint and the service's problem handlers: one with FastAPI's route class (its dependency
solver), one with ``JSONRoute``. Every request below must get the same status, headers of interest and body from
both; and the direct handler must really be the one in use (not a silent fallback to FastAPI's).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Annotated, Any

import numpy as np
import pytest
import torch
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi import Body as FastAPIBody
from fastapi.responses import Response
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import Field

from ropeserve.api.app import add_routes, create_app
from ropeserve.api.fast_json import FastJSONResponse, encode_json
from ropeserve.api.inline import INLINE_MAX_POSITIONS, run_sized
from ropeserve.api.json_route import DirectCall, JSONRoute
from ropeserve.api.negotiation import json_array
from ropeserve.api.problems import install_problem_handlers
from ropeserve.api.schemas import Int64, StrictModel
from ropeserve.errors import InvalidInput
from ropeserve.kernels.threads import serial_torch
from ropeserve.settings import Settings


class Body(StrictModel):
    lengths: list[Int64] = Field(..., min_length=1)
    num_new: Int64 = Field(1, ge=1)
    name: str | None = None


class Scale:
    factor = 3


async def get_scale(request: Request) -> Scale:
    return request.app.state.scale


async def endpoint(body: Body, request: Request, scale: Annotated[Scale, Depends(get_scale)]) -> Response:
    if body.name == "refuse":
        raise InvalidInput("refused by the endpoint", field="name")
    total = sum(body.lengths) * body.num_new * scale.factor
    return FastJSONResponse({"total": total, "accept": request.headers.get("accept")})


def sync_endpoint(body: Body, request: Request) -> Response:
    return FastJSONResponse({"thread": threading.get_ident(), "n": len(body.lengths)})


def make_app(route_class: type[APIRoute], *, included: bool = True) -> FastAPI:
    """``included``: the router is included (FastAPI merges its routes lazily); else its routes are added to the app
    as the service adds its own (``add_routes``), where a direct route is served by starlette's wrapper."""
    app = FastAPI()
    app.state.scale = Scale()
    router = APIRouter(route_class=route_class)
    router.post("/sum", response_class=Response)(endpoint)
    router.post("/sync", response_class=Response)(sync_endpoint)
    if included:
        app.include_router(router)
    else:
        add_routes(app, router)
    install_problem_handlers(app)
    return app


REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("valid", {"content": json.dumps({"lengths": [3, 4], "num_new": 2})}),
    ("valid with charset", {"content": '{"lengths": [1]}', "ctype": "application/json; charset=utf-8"}),
    ("vendor json", {"content": '{"lengths": [1]}', "ctype": "application/problem+json"}),
    ("empty body", {"content": b""}),
    ("no content type", {"content": '{"lengths": [1]}', "ctype": None}),
    ("text content type", {"content": '{"lengths": [1]}', "ctype": "text/plain"}),
    ("content type of two slashes", {"content": '{"lengths": [1]}', "ctype": "application/vnd.a/b+json"}),
    ("malformed", {"content": '{"lengths": [1,\n 2'}),
    ("not an object", {"content": "[1, 2]"}),
    ("missing field", {"content": "{}"}),
    ("unknown field", {"content": '{"lengths": [1], "other": 1}'}),
    ("wrong type", {"content": '{"lengths": ["x"]}'}),
    ("huge integer", {"content": '{"lengths": [' + "9" * 400 + "]}"}),
    ("below minimum", {"content": '{"lengths": [1], "num_new": 0}'}),
    ("nested past the parser", {"content": '{"lengths": ' + "[" * 100_000 + "]" * 100_000 + "}"}),
    ("nested 200", {"content": '{"lengths": ' + "[" * 200 + "]" * 200 + "}"}),
    ("NaN", {"content": '{"lengths": [NaN]}'}),
    ("endpoint refusal", {"content": '{"lengths": [1], "name": "refuse"}'}),
]


def answer(client: TestClient, path: str, content: str | bytes, ctype: str | None) -> tuple[int, str, Any]:
    headers = {"accept": "application/json"} | ({"content-type": ctype} if ctype else {})
    response = client.post(path, content=content, headers=headers)
    body = response.json() if response.content else None
    return response.status_code, response.headers.get("content-type", ""), body


@pytest.fixture(scope="module")
def clients() -> tuple[TestClient, TestClient]:
    return TestClient(make_app(APIRoute)), TestClient(make_app(JSONRoute))


@pytest.fixture(scope="module")
def added_client() -> TestClient:
    return TestClient(make_app(JSONRoute, included=False))


@pytest.mark.parametrize(("case", "request_args"), REQUESTS, ids=[case for case, _ in REQUESTS])
def test_the_direct_handler_answers_as_fastapi_does(
    clients: tuple[TestClient, TestClient], added_client: TestClient, case: str, request_args: dict[str, Any]
) -> None:
    fastapi_client, direct_client = clients
    ctype = request_args.get("ctype", "application/json")
    expected = answer(fastapi_client, "/sum", request_args["content"], ctype)
    assert answer(direct_client, "/sum", request_args["content"], ctype) == expected
    assert answer(added_client, "/sum", request_args["content"], ctype) == expected
    if case == "valid":
        assert expected[0] == 200 and expected[2]["total"] == 42


def test_the_json_routes_of_the_service_take_the_direct_path() -> None:
    from ropeserve.api import routes_encodings, routes_lint, routes_positions, routes_rope

    routes = [
        route
        for module in (routes_rope, routes_positions, routes_lint, routes_encodings)
        for route in module.router.routes
        if isinstance(route, JSONRoute) and route.body_field is not None  # not the safetensors ones
    ]
    assert len(routes) >= 9
    assert [route.path for route in routes if DirectCall.of(route) is None] == []


def test_the_services_json_routes_are_served_by_starlettes_wrapper() -> None:
    """Routes added to the app (not included) skip FastAPI's per-request exit stacks; other shapes keep FastAPI's."""
    app = create_app(Settings(access_log=False))
    served_by = {
        route.path: route.app.__module__
        for route in app.router.routes
        if isinstance(route, JSONRoute) and route.body_field is not None
    }
    assert len(served_by) >= 9 and set(served_by.values()) == {"starlette.routing"}
    added = make_app(JSONRoute, included=False)
    by_path = {route.path: route for route in added.router.routes if isinstance(route, JSONRoute)}
    assert by_path["/sum"].app.__module__ == "starlette.routing"


def test_other_shapes_keep_fastapis_handler() -> None:
    router = APIRouter(route_class=JSONRoute)

    @router.post("/query")
    async def with_query(body: Body, limit: int = 3) -> Response:
        return Response()

    @router.post("/model")
    async def with_response_model(body: Body) -> dict[str, int]:
        return {"n": len(body.lengths)}

    assert [DirectCall.of(route) for route in router.routes if isinstance(route, APIRoute)] == [None, None]
    app = FastAPI()
    app.include_router(router)
    assert TestClient(app).post("/model", json={"lengths": [1, 2]}).json() == {"n": 2}


async def embedded(body: Annotated[Body, FastAPIBody(embed=True)]) -> Response:
    return FastJSONResponse({"n": len(body.lengths)})


async def refuse_all(request: Request) -> None:
    raise InvalidInput("refused by the router's dependency", field="authorization")


INCLUDES: dict[str, tuple[Callable[..., Any], dict[str, Any], dict[str, Any]]] = {
    "embedded body": (embedded, {}, {}),
    "router dependency": (endpoint, {}, {"dependencies": [Depends(refuse_all)]}),
    "lax content type": (endpoint, {"strict_content_type": False}, {}),
}


@pytest.mark.parametrize("case", INCLUDES)
@pytest.mark.parametrize("body", [{"lengths": [1, 2]}, {"body": {"lengths": [1, 2]}}])
def test_what_fastapi_reads_otherwise_keeps_fastapis_answer(case: str, body: dict[str, Any]) -> None:
    """An embedded body, a router's dependencies given by ``include_router``, a lax Content-Type rule: the direct
    handler would skip or misread them (a 500, a skipped dependency, a 415), so such routes keep FastAPI's."""
    route_endpoint, app_options, include_options = INCLUDES[case]
    answers = []
    for route_class in (APIRoute, JSONRoute):
        app = FastAPI(**app_options)
        app.state.scale = Scale()
        router = APIRouter(route_class=route_class)
        router.post("/sum", response_class=Response)(route_endpoint)
        app.include_router(router, **include_options)
        install_problem_handlers(app)
        client = TestClient(app, raise_server_exceptions=False)
        for ctype in ("application/json", None):
            answers.append(answer(client, "/sum", json.dumps(body), ctype))
    assert answers[2:] == answers[:2]
    assert all(status != 500 for status, _, _ in answers)


def test_sync_endpoints_run_in_the_threadpool(clients: tuple[TestClient, TestClient]) -> None:
    _, direct_client = clients
    loop_thread = direct_client.post("/sum", json={"lengths": [1]})
    assert loop_thread.status_code == 200
    answer = direct_client.post("/sync", json={"lengths": [1, 2]}).json()
    assert answer["n"] == 2 and answer["thread"] != threading.get_ident()


def test_dependency_overrides_are_honoured() -> None:
    app = make_app(JSONRoute)

    class Double(Scale):
        factor = 6

    app.dependency_overrides[get_scale] = lambda request: Double()
    assert TestClient(app).post("/sum", json={"lengths": [7]}).json()["total"] == 42


@pytest.mark.parametrize(
    "value",
    [
        {"a": [0.1, 1e-05, 1e22, -0.0, 5e-324, 1.7976931348623157e308], "b": [1, -(2**63), 2**63 - 1], "c": None},
        {"nested": [[True, False], {"x": "é\u2028/"}], "big": 2**70},
        {1: "non-string key"},
    ],
)
def test_the_encoder_writes_what_pydantic_core_writes(value: Any) -> None:  # noqa: ANN401
    import pydantic_core

    assert encode_json(value) == pydantic_core.to_json(value)


def test_non_finite_floats_are_null_on_both_paths() -> None:
    """orjson writes NaN and infinity as null; its pydantic-core fallback (a 64-bit-plus integer alongside) wrote
    NaN / Infinity, which no JSON parser in strict mode reads."""
    values = [float("nan"), float("inf"), -float("inf")]
    assert encode_json({"v": values}) == b'{"v":[null,null,null]}'
    assert json.loads(encode_json({"v": values, "big": 2**70}), parse_constant=pytest.fail) == {
        "v": [None, None, None],
        "big": 2**70,
    }


def test_tensors_are_encoded_as_their_float64_values() -> None:
    import pydantic_core

    values = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)).bfloat16()
    array = values.double().numpy()
    assert encode_json({"t": array, "i": torch.arange(4).numpy()}) == pydantic_core.to_json(
        {"t": values.double().tolist(), "i": [0, 1, 2, 3]}
    )
    assert json.loads(encode_json({"t": array, "big": 2**80}))["big"] == 2**80  # the fallback keeps arrays


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12).view(3, 4),
        torch.arange(12).view(3, 4).t(),
        torch.arange(12, dtype=torch.int32).view(3, 4),
        torch.linspace(-1, 1, 12, dtype=torch.float64).view(3, 4)[:, ::2],
        torch.linspace(-1, 1, 12).bfloat16().view(3, 4),
        torch.linspace(-1, 1, 12, dtype=torch.float64, requires_grad=True).view(3, 4),
    ],
    ids=["int64", "transposed", "int32", "float64 strided", "bfloat16", "requires grad"],
)
def test_json_arrays_hold_the_tensors_values_in_any_layout(tensor: torch.Tensor) -> None:
    array = json_array("t", tensor)
    assert isinstance(array, np.ndarray) and array.flags.c_contiguous
    assert array.dtype == (np.float64 if tensor.is_floating_point() else np.int64)
    expected = tensor.detach().double() if tensor.is_floating_point() else tensor.long()
    assert array.tolist() == expected.tolist()


def test_inline_work_runs_torch_serially_and_nothing_else_does() -> None:
    """Inline work (``run_sized`` below its limit) sees one intra-op thread; work sent to the threadpool, the
    same thread after the block, and other threads keep torch's count."""
    threads = torch.get_num_threads()
    if threads == 1:
        pytest.skip("torch runs one intra-op thread here anyway")

    async def counts() -> tuple[int, int, int]:
        inline = await run_sized(1, torch.get_num_threads)
        pooled = await run_sized(INLINE_MAX_POSITIONS + 1, torch.get_num_threads)
        return inline, pooled, torch.get_num_threads()

    inline, pooled, after = asyncio.run(counts())
    if inline != 1:
        pytest.skip("this torch build has no OpenMP runtime to set per thread")
    assert (pooled, after) == (threads, threads)
    seen: list[int] = []
    with serial_torch():
        other = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        other.start()
        other.join()
        assert torch.get_num_threads() == 1
    assert seen == [threads] and torch.get_num_threads() == threads
