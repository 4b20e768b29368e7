"""Mock-transport helpers for the client tests: problem answers and a scripted, recording handler."""

from __future__ import annotations

from collections.abc import Callable

import httpx

__all__ = ["Recorder", "problem"]

Handler = Callable[[httpx.Request], httpx.Response]


def problem(status: int, slug: str, detail: str = "something went wrong", **extra: object) -> httpx.Response:
    """A problem+json answer as ropeserve sends it."""
    body = {"type": f"https://ropeserve.dev/problems/{slug}", "title": slug, "status": status, "detail": detail}
    headers = {"content-type": "application/problem+json", "x-request-id": "req-1"}
    retry_after = extra.pop("retry_after", None)
    if retry_after is not None:
        headers["retry-after"] = str(retry_after)
    return httpx.Response(status, json={**body, **extra}, headers=headers)


class Recorder:
    """A MockTransport handler that answers from a script and records the requests it saw."""

    def __init__(self, *answers: httpx.Response | Exception | Handler) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if callable(answer) and not isinstance(answer, httpx.Response):
            return answer(request)
        return answer

    async def handle_async(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        return self(request)
