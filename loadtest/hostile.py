"""Hostile traffic and answer verification for the soak: what an attacker or a broken client sends, and a check
that every valid answer is the one a quiet server gives.

* :data:`HOSTILE` lists requests the service must refuse with a 4xx ``application/problem+json`` (never a 5xx,
  never a 2xx): numbers beyond every range, typos, malformed safetensors, unknown methods and encodings, an
  oversized JSON body. Each one is built once and sent as raw bytes.
* :class:`AnswerBook` holds the answer digest of each verified request, taken serially before the load starts; a
  later answer that differs is a *wrong answer* (a byte of another request reached it, or the server computed
  something else under load). Several same-size rotation variants with different contents make a leak between
  neighbours visible.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["HOSTILE", "HOSTILE_PREFIX", "WRONG", "AnswerBook", "HostileRequest", "problem_check"]

HUGE = "1" + "0" * 400
"""An integer literal of 401 digits: 10**400, beyond float64 and every integer type."""
HOSTILE_PREFIX = "hostile: "
"""Stats names of hostile requests start with this (the report counts their 4xx as expected refusals)."""
WRONG = "wrong: "
"""Failure texts of wrong answers start with this (the report counts them apart from errors)."""
JSON = {"content-type": "application/json"}
SAFETENSORS = {"content-type": "application/x-safetensors"}


@dataclass(frozen=True)
class HostileRequest:
    """One request the server must refuse: raw method, path, headers and body."""

    name: str
    method: str
    path: str
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)


def _json(name: str, path: str, text: str, headers: Mapping[str, str] = JSON) -> HostileRequest:
    return HostileRequest(name, "POST", path, text.encode(), headers)


def _safetensors_with_header(header: str, data: bytes = b"") -> bytes:
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _deeply_nested_header(depth: int = 100_000) -> bytes:
    return _safetensors_with_header("[" * depth + "]" * depth)


def _oversized_positions_body(megabytes: int = 16) -> str:
    count = megabytes * 2**20 // 7
    return '{"positions": [' + ",".join(["123456"] * count) + '], "preset": "llama-3.1-8b"}'


ROPE = '"rope_type": "default", "head_dim": 64'
YARN_BETA_FAST_1E308 = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "rope_theta": 1e6,
    "max_position_embeddings": 32768,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 1e308, "original_max_position_embeddings": 32768},
}
HOSTILE: list[HostileRequest] = [
    _json("theta 10**400", "/v1/rope/cos-sin", f'{{"rope": {{{ROPE}, "rope_theta": {HUGE}}}, "positions": [1]}}'),
    _json("theta NaN", "/v1/rope/cos-sin", f'{{"rope": {{{ROPE}, "rope_theta": NaN}}, "positions": [1]}}'),
    _json("typo in rope", "/v1/rope/cos-sin", f'{{"rope": {{{ROPE}, "rope_thetaa": 5e5}}, "positions": [1]}}'),
    _json("position 2**64", "/v1/rope/cos-sin", '{"preset": "llama-3.1-8b", "positions": [18446744073709551616]}'),
    _json("cache length 2**63-1", "/v1/positions", '{"cache_lengths": [9223372036854775807], "num_new": 2}'),
    _json("negative cache length", "/v1/positions", '{"cache_lengths": [-5], "num_new": 1}'),
    _json(
        "tokens_per_second 1e308",
        "/v1/mrope/positions",
        '{"family": "qwen2_5_vl", "tokens_per_second": 1e308, '
        '"rows": [[{"text": 3}, {"video": [2, 4, 4], "second_per_grid_t": 1.0}]]}',
    ),
    _json("vision_config list", "/v1/vision/rope", '{"config": {"vision_config": [1, 2]}, "grid_thw": [[1, 4, 4]]}'),
    _json("YaRN beta_fast 1e308", "/v1/rope/cos-sin", json.dumps({"config": YARN_BETA_FAST_1E308, "positions": [1]})),
    _json("JSON nested 100k", "/v1/positions", "[" * 100_000 + "]" * 100_000),
    _json("JSON without content type", "/v1/positions", '{"cache_lengths": [3]}', headers={}),
    _json("oversized JSON body", "/v1/rope/cos-sin", _oversized_positions_body()),
    HostileRequest(
        "gzip body", "POST", "/v1/positions", b"\x1f\x8b\x08\x00" + bytes(16), {**JSON, "content-encoding": "gzip"}
    ),
    HostileRequest("random bytes as safetensors", "POST", "/v1/rope/apply", bytes(range(256)) * 64, SAFETENSORS),
    HostileRequest("safetensors header nested 100k", "POST", "/v1/rope/apply", _deeply_nested_header(), SAFETENSORS),
    HostileRequest(
        "safetensors integer of 5000 digits",
        "POST",
        "/v1/rope/apply",
        _safetensors_with_header(
            '{"q": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 4]}}', bytes(4)
        ),
        SAFETENSORS,
    ),
    HostileRequest("unknown method", "PROPFIND", "/v1/info"),
]


def problem_check(status: int, headers: Mapping[str, str], body: bytes) -> str | None:
    """Why a hostile request's answer is wrong (None when it is a 4xx problem+json other than 429)."""
    media_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if not 400 <= status < 500 or status == 429:
        return f"{WRONG}hostile request answered {status}"
    if media_type != "application/problem+json":
        return f"{WRONG}hostile request answered {status} as {media_type or 'no content type'}"
    return None


def _safetensors_header(body: bytes) -> dict[str, object] | None:
    """The header of a safetensors answer, or None when ``body`` is not one."""
    if len(body) < 8:
        return None
    length = struct.unpack_from("<Q", body)[0]
    try:
        header = json.loads(body[8 : 8 + length]) if 8 + length <= len(body) else None
    except ValueError:
        return None
    return header if isinstance(header, dict) else None


class AnswerBook:
    """Digests of the answers a quiet server gives; ``check`` compares an answer under load with them."""

    def __init__(self) -> None:
        self.digests: dict[str, str] = {}

    @staticmethod
    def digest(body: bytes) -> str:
        """SHA-256 of what an answer says: a safetensors answer's tensors (names, dtypes, shapes, bytes) without
        its ``__metadata__``, which carries timings; any other answer's bytes."""
        header = _safetensors_header(body)
        if header is None:
            return hashlib.sha256(body).hexdigest()
        header.pop("__metadata__", None)
        described = json.dumps(header, sort_keys=True).encode()
        start = 8 + struct.unpack_from("<Q", body)[0]
        return hashlib.sha256(described + memoryview(body)[start:]).hexdigest()

    def record(self, key: str, status: int, body: bytes) -> None:
        """Keep the reference answer for ``key`` (taken by a request on its own, before the load starts)."""
        if status != 200:
            raise RuntimeError(f"reference answer for {key!r}: HTTP {status}: {body[:200]!r}")
        self.digests[key] = self.digest(body)

    def check(self, key: str, body: bytes) -> str | None:
        """Why this answer is wrong (None when it equals the reference, or no reference was taken)."""
        expected = self.digests.get(key)
        if expected is None or self.digest(body) == expected:
            return None
        return f"{WRONG}answer of {key!r} differs from the quiet server's"
