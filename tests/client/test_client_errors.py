"""problem+json answers become typed exceptions (by slug, then status, then status class)."""

from __future__ import annotations

import httpx
import pytest
from client_mocks import Recorder, problem

import ropeserve_client as rc
from ropeserve_client._exceptions import error_class, error_from_response


def client_for(*answers: httpx.Response | Exception) -> rc.Client:
    return rc.Client("http://rs.test", transport=httpx.MockTransport(Recorder(*answers)), retry=rc.NO_RETRY)


@pytest.mark.parametrize(
    ("status", "slug", "expected"),
    [
        (400, "malformed-payload", rc.MalformedPayload),
        (401, "unauthorized", rc.Unauthorized),
        (404, "not-found", rc.NotFound),
        (405, "method-not-allowed", rc.MethodNotAllowed),
        (406, "not-acceptable", rc.NotAcceptable),
        (413, "payload-too-large", rc.PayloadTooLarge),
        (415, "unsupported-media-type", rc.UnsupportedMediaType),
        (422, "invalid-input", rc.InvalidInput),
        (422, "limit-exceeded", rc.LimitExceeded),
        (429, "overloaded", rc.Overloaded),
        (500, "internal", rc.InternalError),
        (503, "not-ready", rc.NotReady),
    ],
)
def test_every_server_problem_type_has_its_exception(status: int, slug: str, expected: type) -> None:
    with (
        client_for(problem(status, slug, "bad thing", field="rope.head_dim")) as client,
        pytest.raises(expected) as info,
    ):
        client.info()
    error = info.value
    assert type(error) is expected
    assert (error.status, error.type_slug, error.detail, error.field) == (status, slug, "bad thing", "rope.head_dim")
    assert error.request_id == "req-1"
    assert str(error) == f"{status} {slug}: bad thing [field rope.head_dim]"


def test_slug_wins_over_status_and_unknowns_fall_back_by_status_class() -> None:
    assert error_class(400, "limit-exceeded") is rc.LimitExceeded
    assert error_class(422, "brand-new-slug") is rc.InvalidInput
    assert error_class(418, "") is rc.ClientError
    assert error_class(502, "bad-gateway") is rc.ServerError


def test_hierarchy_lets_callers_catch_broadly() -> None:
    assert issubclass(rc.LimitExceeded, rc.InvalidInput)
    assert issubclass(rc.InvalidInput, ValueError)
    assert issubclass(rc.NotReady, rc.ServerError)
    assert all(issubclass(cls, rc.APIError) for cls in (rc.ClientError, rc.Overloaded, rc.ServerError))
    assert all(issubclass(cls, rc.RopeserveError) for cls in (rc.APIError, rc.TransportError, rc.DecodeError))


def test_limit_exceeded_exposes_the_limit() -> None:
    response = problem(422, "limit-exceeded", "positions: 9 exceeds the limit of 8", limit=8)
    with client_for(response) as client, pytest.raises(rc.LimitExceeded) as info:
        client.cos_sin([0] * 9, preset="llama-3.1-8b")
    assert info.value.limit == 8
    assert info.value.problem["limit"] == 8


def test_non_problem_error_bodies_still_map_by_status() -> None:
    text = httpx.Response(502, text="upstream connect error", headers={"content-type": "text/plain"})
    error = error_from_response(text)
    assert type(error) is rc.ServerError
    assert error.detail == "upstream connect error"
    empty = error_from_response(httpx.Response(404))
    assert type(empty) is rc.NotFound and empty.detail == "HTTP 404"


def test_transport_failures_are_wrapped_with_their_cause() -> None:
    with client_for(httpx.ConnectError("refused")) as client, pytest.raises(rc.ConnectError) as info:
        client.info()
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    with client_for(httpx.ReadTimeout("slow")) as client, pytest.raises(rc.RequestTimeout):
        client.info()
