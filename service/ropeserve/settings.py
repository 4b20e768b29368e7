"""Service settings, read from ``ROPESERVE_*`` environment variables (pydantic-settings).

Every field documents its default; ``ropeserve serve --help`` and the README list the same names.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

JSON_MEMORY_FACTOR = 8
"""Budget bytes charged per received byte of a non-safetensors (JSON) body: parsed, a JSON number becomes a
Python object plus list slots (``1.0,``: 4 bytes on the wire, 32 in memory) and validation copies the lists.
A safetensors body is decoded in place (factor 1)."""


class Settings(BaseSettings):
    """Runtime configuration. Environment variable = ``ROPESERVE_`` + upper-case field name."""

    model_config = SettingsConfigDict(env_prefix="ROPESERVE_", extra="ignore")

    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to bind.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Compute device; auto picks CUDA when one is present."
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = Field(True, description="Structured JSON access log lines on stderr.")
    access_log_probes: bool = Field(False, description="Also log /health* and /metrics requests in the access log.")
    otlp_traces_endpoint: str | None = Field(
        None, description="OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces); unset = tracing off."
    )

    max_body_bytes: int = Field(
        256 * 2**20, ge=1024, description="Largest safetensors request body accepted (413 above)."
    )
    max_json_body_bytes: int = Field(
        2 * 2**20, ge=1024, description="Largest body of any other content type (JSON) accepted (413 above)."
    )
    max_inflight_body_bytes: int = Field(
        512 * 2**20,
        ge=1024,
        description="Bytes of all request bodies being received or served at once, JSON bodies counted 8 times "
        "(their parsed size); 503 + Retry-After above.",
    )
    max_positions: int = Field(1_048_576, ge=1, description="Most positions one request may ask for.")
    max_table_elements: int = Field(
        64 * 2**20, ge=1, description="Most elements of one computed table (cos+sin, bias matrix, ...)."
    )
    max_tensor_elements: int = Field(
        128 * 2**20, ge=1, description="Most elements of all tensors in one safetensors request."
    )
    json_response_max_elements: int = Field(
        65_536, ge=1, description="Larger results are only served as safetensors (Accept header)."
    )
    table_cache_entries: int = Field(32, ge=1, description="Most cos/sin tables kept in the LRU table cache.")
    table_cache_bytes: int = Field(
        256 * 2**20,
        ge=0,
        description="Bytes of cos/sin rows the table cache holds in all (one table: at most 64 MiB); least recently "
        "used tables are dropped beyond it, and rows past it are computed per request, uncached. 0: no rows cached.",
    )
    lint_answer_cache_bytes: int = Field(
        16 * 2**20,
        ge=0,
        description="Bytes of lint answers kept for requests whose body repeats one answered before, byte for byte "
        "(the report is a pure function of the body); least recently used answers are dropped beyond it, and one "
        "answer over a sixteenth of it is not kept. 0: every request is linted anew.",
    )

    batching: bool = Field(True, description="Concatenate compatible concurrent rotation requests.")
    batch_max_tokens: int = Field(65_536, ge=1, description="Token budget of one fused rotation call.")
    batch_max_wait_us: int = Field(500, ge=0, description="How long the batcher waits to fill a batch.")
    batch_queue_size: int = Field(256, ge=1, description="Queued requests beyond this are answered 429.")
    retry_after_s: int = Field(1, ge=0, description="Retry-After seconds sent with 429 and 503.")
    body_buffer_pool_bytes: int = Field(
        256 * 2**20,
        ge=0,
        description="Idle rotation request buffers (1 MiB and up) kept for reuse, in bytes; 0 turns reuse off.",
    )

    auth_token: str | None = Field(None, description="If set, Bearer token required on API routes.")
    auth_tokens: list[str] = Field(
        default_factory=list,
        description="More accepted Bearer tokens, one per client: each token is its own credential (shared-memory "
        "regions belong to the credential that registered them).",
    )
    auth_protect_probes: bool = Field(False, description="Also require the token on health and metrics.")
    cors_origins: list[str] = Field(default_factory=list, description="CORS allow-list; empty = CORS off.")
    shm_enabled: bool = Field(
        True, description="Shared-memory transport for clients on the same host (/v1/shm/regions, JSON rotations)."
    )
    shm_key_prefix: str = Field(
        "ropeserve", min_length=1, description="Shared-memory objects a client may register must start with it."
    )
    shm_max_regions_per_client: int = Field(16, ge=1, description="Registered regions per credential.")
    drain_delay_s: float = Field(
        0.0, ge=0, description="At SIGTERM: seconds to keep serving with readiness 503 before closing the listener."
    )
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Server processes accepting on one port (each with its own batcher and table cache); "
        "/metrics sums them (prometheus-client multiprocess mode).",
    )
    drain_timeout_s: float = Field(30.0, ge=0, description="Grace period for in-flight requests at SIGTERM.")
    header_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="Time a client has to send a complete request head (then 408 or close)."
    )
    body_idle_timeout_s: float = Field(
        10.0, gt=0, le=3600, description="Longest pause between two pieces of a request body (408 above)."
    )
    keep_alive_timeout_s: float = Field(
        5.0, gt=0, le=3600, description="Idle keep-alive connections are closed after this many seconds."
    )
    max_connections: int = Field(
        1000, ge=1, description="Open connections at once; further ones are answered 503 and closed."
    )

    @model_validator(mode="after")
    def _bodies_fit_the_budget(self) -> Settings:
        largest = max(self.max_body_bytes, JSON_MEMORY_FACTOR * self.max_json_body_bytes)
        if largest > self.max_inflight_body_bytes:
            raise ValueError(
                f"max_inflight_body_bytes ({self.max_inflight_body_bytes}) must hold the largest accepted body "
                f"({largest}): no such request could ever be served"
            )
        return self


def credentials(settings: Settings) -> list[str]:
    """Every accepted Bearer token (``auth_token`` first); empty when auth is off."""
    return [token for token in [settings.auth_token, *settings.auth_tokens] if token]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
