"""Service settings, read from ``ROPESERVE_*`` environment variables (pydantic-settings).

Every field documents its default; ``ropeserve serve --help`` and the README list the same names.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    max_body_bytes: int = Field(256 * 2**20, ge=1024, description="Largest request body accepted (413 above).")
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
    table_cache_entries: int = Field(
        32, ge=1, description="Bounded LRU of cached cos/sin tables (each at most 64 MiB; 2 GiB worst case)."
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


def credentials(settings: Settings) -> list[str]:
    """Every accepted Bearer token (``auth_token`` first); empty when auth is off."""
    return [token for token in [settings.auth_token, *settings.auth_tokens] if token]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
