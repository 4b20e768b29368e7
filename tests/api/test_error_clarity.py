"""Errors say what to send instead (issue 13, item 11).

A JSON body without a JSON Content-Type is a 415 naming the expected type (it was "Input should be a valid
dictionary"); malformed JSON names line and column (it was "65: JSON decode error"); media types and the bearer
scheme are case-insensitive; an encoded body (gzip, ...) is a 415 problem+json (it was a 400 about a header length).
Through the ASGI app, and the same requests over a real socket.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load, save

from ropeserve.api import create_app
from ropeserve.settings import Settings
from ropeserve_client.testing import LocalServer

TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
COS_SIN = "/v1/rope/cos-sin"
APPLY = "/v1/rope/apply"
REQUEST = {"preset": "llama-3.1-8b", "positions": [1, 2]}
MALFORMED = '{\n  "preset": "llama-3.1-8b",\n  "positions": [1, 2,]\n}'
"""A trailing comma: the value expected after it is missing on line 3."""


def rotation_body() -> bytes:
    tensors = {"q": torch.ones(1, 2, 3, 128), "positions": torch.arange(3)}
    return save(tensors, metadata={"ropeserve": json.dumps({"preset": "llama-3.1-8b"})})


Client = TestClient | httpx.Client


@pytest.fixture(scope="module")
def app_client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(access_log=False, auth_token=TOKEN))) as client:
        yield client


@pytest.fixture(scope="module")
def socket_client() -> Iterator[httpx.Client]:
    env = {"ROPESERVE_AUTH_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
    with LocalServer(env=env) as server, httpx.Client(base_url=server.url, timeout=30.0) as client:
        yield client


@pytest.fixture(params=["asgi", "socket"])
def client(request: pytest.FixtureRequest) -> Client:
    return request.getfixturevalue("app_client" if request.param == "asgi" else "socket_client")


def problem(response: httpx.Response, status: int, field: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["status"] == status and body.get("field") == field
    return body


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_json_without_a_json_content_type_names_the_expected_type(client: Client, content_type: str | None) -> None:
    headers = AUTH | ({"content-type": content_type} if content_type else {})
    response = client.post(COS_SIN, content=json.dumps(REQUEST), headers=headers)
    detail = problem(response, 415, "content-type")["detail"]
    assert "Content-Type: application/json" in detail
    assert (repr(content_type) if content_type else "no Content-Type") in detail


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_json_content_types_are_accepted_in_any_case(client: Client, content_type: str) -> None:
    response = client.post(COS_SIN, content=json.dumps(REQUEST), headers=AUTH | {"content-type": content_type})
    assert response.status_code == 200 and response.json()["count"] == 2


def test_malformed_json_names_line_and_column(client: Client) -> None:
    response = client.post(COS_SIN, content=MALFORMED, headers=AUTH | {"content-type": "application/json"})
    detail = problem(response, 400, "body")["detail"]
    with pytest.raises(json.JSONDecodeError) as parsed:
        json.loads(MALFORMED)
    error = parsed.value
    assert error.lineno == 3 and f"{error.msg} at line 3, column {error.colno} (character {error.pos})" in detail


def test_malformed_json_on_the_first_line(client: Client) -> None:
    response = client.post(COS_SIN, content="{oops", headers=AUTH | {"content-type": "application/json"})
    assert "line 1, column 2" in problem(response, 400, "body")["detail"]


@pytest.mark.parametrize(
    "content_type",
    ["APPLICATION/X-SAFETENSORS", "application/x-safetensors; charset=utf-8", "Application/Octet-Stream"],
)
def test_safetensors_media_types_are_case_insensitive_and_take_parameters(client: Client, content_type: str) -> None:
    headers = AUTH | {"content-type": content_type, "accept": "APPLICATION/X-SAFETENSORS"}
    response = client.post(APPLY, content=rotation_body(), headers=headers)
    assert response.status_code == 200, response.text
    assert load(response.content)["q"].shape == (1, 2, 3, 128)


@pytest.mark.parametrize("authorization", [f"bearer {TOKEN}", f"BEARER {TOKEN}", f"Bearer  {TOKEN}"])
def test_the_bearer_scheme_is_case_insensitive(client: Client, authorization: str) -> None:
    response = client.post(COS_SIN, json=REQUEST, headers={"authorization": authorization})
    assert response.status_code == 200


@pytest.mark.parametrize("authorization", [None, f"Basic {TOKEN}", "Bearer wrong", f"Bearer{TOKEN}", TOKEN])
def test_wrong_credentials_are_still_refused(client: Client, authorization: str | None) -> None:
    headers = {"authorization": authorization} if authorization else {}
    response = client.post(COS_SIN, json=REQUEST, headers=headers)
    problem(response, 401, None)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP", "identity, gzip"])
@pytest.mark.parametrize(("path", "content_type", "body"), [
    pytest.param(APPLY, "application/x-safetensors", rotation_body(), id="safetensors"),
    pytest.param(COS_SIN, "application/json", json.dumps(REQUEST).encode(), id="json"),
])  # fmt: skip
def test_encoded_bodies_are_415_problems(
    client: Client, encoding: str, path: str, content_type: str, body: bytes
) -> None:
    headers = AUTH | {"content-type": content_type, "content-encoding": encoding}
    response = client.post(path, content=gzip.compress(body), headers=headers)
    detail = problem(response, 415, "content-encoding")["detail"]
    assert encoding in detail and response.headers["accept-encoding"] == "identity"


@pytest.mark.parametrize("encoding", ["identity", "Identity"])
def test_identity_encoding_is_accepted(client: Client, encoding: str) -> None:
    headers = AUTH | {"content-type": "application/json", "content-encoding": encoding}
    assert client.post(COS_SIN, content=json.dumps(REQUEST), headers=headers).status_code == 200
