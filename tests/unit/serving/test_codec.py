"""safetensors codec: a corpus of malformed bodies, zero-copy views, chunked encoding, the capped reader."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch
from pydantic import BaseModel, ConfigDict
from safetensors.torch import load, save

from ropeserve.errors import InvalidInput, LimitExceeded, MalformedPayload, PayloadTooLarge, ServiceError
from ropeserve.serving.codec import METADATA_KEY, decode_safetensors, encode_safetensors, read_body

LIMIT = 1_000


def raw_body(header: Any, data: bytes = b"", *, length: int | None = None, pad: int = 0) -> bytes:
    """A body from a header object (or raw header bytes), optionally lying about the header length."""
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    header_bytes += b" " * pad
    return struct.pack("<Q", len(header_bytes) if length is None else length) + header_bytes + data


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


Q = entry("F32", [2], 0, 8)
K = entry("F32", [1], 8, 12)
Q_JSON = json.dumps(Q).encode()
DATA = bytes(12)

MALFORMED: dict[str, tuple[bytes, type[ServiceError], str]] = {
    "empty": (b"", MalformedPayload, "body"),
    "truncated length": (b"\x05\x00\x00", MalformedPayload, "body"),
    "header past body": (raw_body({"q": Q}, DATA, length=500), MalformedPayload, "body"),
    "absurd header length": (raw_body({"q": Q}, DATA, length=2**63), MalformedPayload, "body"),
    "invalid json": (raw_body(b"{not json", DATA), MalformedPayload, "body"),
    "not utf-8": (raw_body(b'{"\xff": 1}'), MalformedPayload, "body"),
    "header is a list": (raw_body([1, 2]), MalformedPayload, "body"),
    "metadata not an object": (raw_body({"__metadata__": "x", "q": Q}, DATA[:8]), MalformedPayload, "__metadata__"),
    "metadata values not strings": (
        raw_body({"__metadata__": {"a": 1}, "q": Q}, DATA[:8]),
        MalformedPayload,
        "__metadata__",
    ),
    "duplicate names": (raw_body(b'{"q": %s, "q": %s}' % (Q_JSON, Q_JSON), DATA[:8]), MalformedPayload, "q"),
    "entry not an object": (raw_body({"q": [1]}), MalformedPayload, "q"),
    "entry with extra key": (raw_body({"q": {**Q, "extra": 1}}, DATA[:8]), MalformedPayload, "q"),
    "entry missing offsets": (raw_body({"q": {"dtype": "F32", "shape": [2]}}, DATA[:8]), MalformedPayload, "q"),
    "unknown dtype": (raw_body({"q": entry("F128", [2], 0, 8)}, DATA[:8]), MalformedPayload, "q"),
    "refused dtype": (raw_body({"q": entry("F64", [1], 0, 8)}, DATA[:8]), InvalidInput, "q"),
    "negative dim": (raw_body({"q": entry("F32", [-2], 0, 8)}, DATA[:8]), MalformedPayload, "q"),
    "bool dim": (raw_body({"q": entry("F32", [True], 0, 4)}, DATA[:4]), MalformedPayload, "q"),
    "offsets out of range": (raw_body({"q": entry("F32", [2], 8, 16)}, DATA[:8]), MalformedPayload, "q"),
    "offsets reversed": (raw_body({"q": entry("F32", [0], 8, 0)}, DATA[:8]), MalformedPayload, "q"),
    "shape vs span": (raw_body({"q": entry("F32", [3], 0, 8)}, DATA[:8]), MalformedPayload, "q"),
    "overlap": (raw_body({"q": Q, "k": entry("F32", [1], 4, 8)}, DATA[:8]), MalformedPayload, "k"),
    "gap": (raw_body({"q": entry("F32", [1], 4, 8)}, DATA[:8]), MalformedPayload, "q"),
    "trailing bytes": (raw_body({"q": Q}, DATA), MalformedPayload, "body"),
    "zero-size with a span": (raw_body({"q": entry("F32", [0, 4], 0, 4)}, DATA[:4]), MalformedPayload, "q"),
    "too many elements": (
        raw_body({"q": entry("F32", [LIMIT + 1], 0, 4 * (LIMIT + 1))}, bytes(4 * (LIMIT + 1))),
        LimitExceeded,
        "q",
    ),
    "missing required": (raw_body({"k": entry("F32", [2], 0, 8)}, DATA[:8]), InvalidInput, "q"),
    "unexpected name": (raw_body({"q": Q, "v": K}, DATA), InvalidInput, "v"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_bodies_raise_the_right_error_naming_the_field(name: str) -> None:
    body, error, field = MALFORMED[name]
    with pytest.raises(error) as raised:
        decode_safetensors(bytearray(body), max_elements=LIMIT, required=("q",), optional=("k",))
    assert type(raised.value) is error
    assert raised.value.field == field


def test_header_over_the_cap_is_refused_even_when_present() -> None:
    body = raw_body({"q": Q}, DATA[:8], pad=64)
    with pytest.raises(MalformedPayload, match="cap"):
        decode_safetensors(bytearray(body), max_elements=LIMIT, header_cap=32)


def test_element_budget_counts_all_tensors_together() -> None:
    body = save({"a": torch.zeros(600), "b": torch.zeros(600)})
    with pytest.raises(LimitExceeded) as raised:
        decode_safetensors(bytearray(body), max_elements=LIMIT)
    assert raised.value.field == "b"


def test_reference_files_decode_to_views_on_the_buffer() -> None:
    tensors = {
        "q": torch.randn(2, 3, 4).to(torch.bfloat16),
        "k": torch.randn(2, 1, 4, dtype=torch.float16),
        "positions": torch.arange(7, dtype=torch.int32),
    }
    body = bytearray(save(tensors, metadata={METADATA_KEY: "{}"}))
    payload = decode_safetensors(body, max_elements=LIMIT, required=("q", "positions"), optional=("k",))
    assert payload.metadata == {METADATA_KEY: "{}"}
    for name, tensor in tensors.items():
        assert torch.equal(payload.tensors[name], tensor)
    q = payload.tensors["q"]
    buffer_start = torch.frombuffer(body, dtype=torch.uint8).data_ptr()
    assert buffer_start <= q.data_ptr() < buffer_start + len(body)
    q.fill_(2.0)
    assert torch.equal(load(bytes(body))["q"], torch.full((2, 3, 4), 2.0, dtype=torch.bfloat16))


def test_zero_size_and_scalar_tensors_are_valid() -> None:
    body = save({"empty": torch.zeros(0, 4), "scalar": torch.tensor(3, dtype=torch.int64)})
    payload = decode_safetensors(body, max_elements=LIMIT)
    assert payload.tensors["empty"].shape == (0, 4)
    assert payload.tensors["scalar"].item() == 3


def test_misaligned_tensor_is_copied_with_its_values() -> None:
    values = torch.tensor([1.5, -2.0])
    body = raw_body({"q": entry("F32", [2], 0, 8)}, values.numpy().tobytes())
    assert (len(body) - 8) % 4  # the data starts off a float32 boundary
    assert torch.equal(decode_safetensors(body, max_elements=LIMIT).tensors["q"], values)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(3, 5).to(torch.bfloat16),
        torch.randn(4, 6).t(),
        torch.zeros(0, 3, dtype=torch.float16),
        torch.tensor(7, dtype=torch.int32),
    ],
    ids=["bf16", "non-contiguous", "empty", "scalar"],
)
def test_encoding_round_trips_through_the_reference_loader(tensor: torch.Tensor) -> None:
    encoded = encode_safetensors({"x": tensor, "y": torch.arange(3)}, {METADATA_KEY: '{"a": 1}'})
    raw = encoded.to_bytes()
    assert len(raw) == encoded.length
    (header_length,) = struct.unpack_from("<Q", raw)
    assert (8 + header_length) % 8 == 0
    loaded = load(raw)
    assert torch.equal(loaded["x"], tensor) and loaded["x"].dtype == tensor.dtype
    decoded = decode_safetensors(
        bytearray(raw), max_elements=LIMIT, allowed_dtypes=frozenset({"BF16", "F32", "F16", "I32", "I64"})
    )
    assert torch.equal(decoded.tensors["x"], tensor)
    assert json.loads(decoded.metadata[METADATA_KEY]) == {"a": 1}


def test_encoding_shares_the_tensor_memory() -> None:
    tensor = torch.zeros(4)
    encoded = encode_safetensors({"x": tensor})
    tensor.fill_(1.0)
    assert torch.equal(load(encoded.to_bytes())["x"], torch.ones(4))


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    layout: str = "bhtd"
    rotary_dim: int | None = None


@pytest.mark.parametrize(
    ("metadata", "error", "field"),
    [
        ({}, InvalidInput, f"__metadata__.{METADATA_KEY}"),
        ({METADATA_KEY: "{not json"}, MalformedPayload, f"__metadata__.{METADATA_KEY}"),
        ({METADATA_KEY: '{"rotary_dim": "x"}'}, InvalidInput, "rotary_dim"),
        ({METADATA_KEY: '{"colour": 1}'}, InvalidInput, "colour"),
    ],
)
def test_bad_parameters_name_the_key(metadata: dict[str, str], error: type[ServiceError], field: str) -> None:
    payload = decode_safetensors(save({"q": torch.zeros(1)}, metadata=metadata or None), max_elements=LIMIT)
    with pytest.raises(error) as raised:
        payload.params(Params)
    assert type(raised.value) is error and raised.value.field == field


def test_parameters_parse_into_the_model() -> None:
    payload = decode_safetensors(
        save({"q": torch.zeros(1)}, metadata={METADATA_KEY: '{"rotary_dim": 8}'}), max_elements=LIMIT
    )
    assert payload.params(Params) == Params(rotary_dim=8)


class FakeRequest:
    """Headers plus a chunked body; records how much of it was read."""

    def __init__(self, chunks: list[bytes], content_length: str | None) -> None:
        self.headers = {} if content_length is None else {"content-length": content_length}
        self.chunks, self.read = chunks, 0

    async def stream(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.read += 1
            yield chunk


def test_declared_length_over_the_limit_is_refused_before_reading() -> None:
    request = FakeRequest([b"x" * 10] * 10, content_length="100")
    with pytest.raises(PayloadTooLarge) as raised:
        asyncio.run(read_body(request, limit=50))
    assert request.read == 0
    assert raised.value.status == 413 and raised.value.headers["Connection"] == "close"


def test_streamed_body_stops_at_the_limit() -> None:
    request = FakeRequest([b"x" * 10] * 10, content_length=None)
    with pytest.raises(PayloadTooLarge):
        asyncio.run(read_body(request, limit=25))
    assert request.read == 3


def test_body_within_the_limit_is_one_writable_buffer() -> None:
    request = FakeRequest([b"ab", b"cd"], content_length="4")
    body = asyncio.run(read_body(request, limit=4))
    assert isinstance(body, bytearray) and body == b"abcd"


def test_a_lent_buffer_is_filled_to_the_declared_length() -> None:
    lent = memoryview(bytearray(8))[:4]
    body = asyncio.run(read_body(FakeRequest([b"ab", b"cd"], content_length="4"), limit=4, take=lambda size: lent))
    assert body is lent and bytes(body) == b"abcd" and bytes(lent.obj) == b"abcd\0\0\0\0"


@pytest.mark.parametrize(("chunks", "declared"), [([b"ab"], "4"), ([b"abc", b"de"], "4")], ids=["short", "long"])
def test_a_body_that_breaks_its_declared_length_is_malformed(chunks: list[bytes], declared: str) -> None:
    def take(size: int) -> memoryview:
        return memoryview(bytearray(size))

    with pytest.raises(MalformedPayload) as raised:
        asyncio.run(read_body(FakeRequest(chunks, content_length=declared), limit=16, take=take))
    assert raised.value.field == "content-length"


def test_a_pool_that_declines_leaves_a_fresh_buffer() -> None:
    body = asyncio.run(read_body(FakeRequest([b"ab"], content_length="2"), limit=4, take=lambda size: None))
    assert isinstance(body, bytearray) and body == b"ab"


def test_unparsable_content_length_is_malformed() -> None:
    with pytest.raises(MalformedPayload):
        asyncio.run(read_body(FakeRequest([], content_length="12abc"), limit=50))


def test_broadcast_views_encode_like_their_values() -> None:
    """A one-element tensor expanded from a scalar has stride 0 yet counts as contiguous."""
    expanded = torch.tensor([[-3]]).expand(1, 1)
    single = torch.tensor(7.5).expand(1)
    encoded = encode_safetensors({"deltas": expanded, "one": single})
    decoded = decode_safetensors(bytearray(b"".join(bytes(chunk) for chunk in encoded.chunks)), max_elements=LIMIT)
    assert decoded.tensors["deltas"].tolist() == [[-3]] and decoded.tensors["one"].tolist() == [7.5]
