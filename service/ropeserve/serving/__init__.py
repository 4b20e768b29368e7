"""Serving machinery without web imports: safetensors codec, micro-batcher, rotation service."""

from ropeserve.serving.batcher import Batcher, BatchObserver, ClientDisconnected, NullObserver, Timed
from ropeserve.serving.buffers import BodyBudget, BodyBuffers, BodyClaim, BufferLease
from ropeserve.serving.codec import (
    METADATA_KEY,
    EncodedSafetensors,
    SafetensorsPayload,
    decode_safetensors,
    encode_safetensors,
    read_body,
)
from ropeserve.serving.rotation import OPTIONAL_TENSORS, REQUIRED_TENSORS, RotationOptions, RotationService

__all__ = [
    "METADATA_KEY",
    "OPTIONAL_TENSORS",
    "REQUIRED_TENSORS",
    "BatchObserver",
    "Batcher",
    "BodyBudget",
    "BodyBuffers",
    "BodyClaim",
    "BufferLease",
    "ClientDisconnected",
    "EncodedSafetensors",
    "NullObserver",
    "RotationOptions",
    "RotationService",
    "SafetensorsPayload",
    "Timed",
    "decode_safetensors",
    "encode_safetensors",
    "read_body",
]
