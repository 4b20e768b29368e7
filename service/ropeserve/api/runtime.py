"""Per-app runtime state: settings, metrics, device, table cache, readiness. Reached via ``get_runtime``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

import torch
from fastapi import Depends, Request

from ropeserve.metrics import Metrics
from ropeserve.rope import TableCache
from ropeserve.serving.answers import AnswerCache
from ropeserve.serving.buffers import BodyBudget
from ropeserve.settings import Settings


def resolve_device(choice: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(choice)


AsyncHook = Callable[["Runtime"], Awaitable[None]]
"""A lifespan hook awaited with the runtime (``Runtime.startups`` and ``Runtime.shutdowns``)."""
WarmupHook = Callable[["Runtime"], None]
"""A warm-up hook called with the runtime before it is marked ready (``Runtime.warmups``)."""


@dataclass
class Runtime:
    settings: Settings
    metrics: Metrics
    device: torch.device
    tables: TableCache
    body_budget: BodyBudget
    lint_answers: AnswerCache
    ready: bool = False
    draining: bool = False
    extensions: dict[str, object] = field(default_factory=dict)
    startups: list[AsyncHook] = field(default_factory=list)
    warmups: list[WarmupHook] = field(default_factory=list)
    shutdowns: list[AsyncHook] = field(default_factory=list)

    @classmethod
    def create(cls, settings: Settings) -> Runtime:
        return cls(
            settings=settings,
            metrics=Metrics(),
            device=resolve_device(settings.device),
            tables=TableCache(settings.table_cache_entries, settings.table_cache_bytes),
            body_budget=BodyBudget(settings.max_inflight_body_bytes, settings.retry_after_s),
            lint_answers=AnswerCache(settings.lint_answer_cache_bytes),
        )

    def set_ready(self, ready: bool) -> None:
        self.ready = ready
        self.metrics.ready.set(1 if ready and not self.draining else 0)


async def get_runtime(request: Request) -> Runtime:
    """``async`` so that FastAPI resolves it on the event loop (a sync dependency costs a thread hop)."""
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
"""Route parameter type that injects the app's ``Runtime``."""
