"""Request/response models shared by the routes (pydantic v2)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ropeserve.config import RopeParams
from ropeserve.config.families import Pairing
from ropeserve.config.sources import source_params
from ropeserve.errors import InvalidInput, check_limit
from ropeserve.positions import INT64_MAX, INT64_MIN
from ropeserve.rope.tables import MAX_POSITION

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DtypeName = Literal["float32", "bfloat16", "float16"]
PairingName = Pairing
Position = Annotated[int, Field(ge=0, le=MAX_POSITION)]


def _within_int64(value: int) -> int:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"must be an int64 ({INT64_MIN}..{INT64_MAX})")
    return value


Int64 = Annotated[int, AfterValidator(_within_int64)]
"""Every integer of a request model: JSON integers have no bound, the tensors they fill are int64. A validator,
not ``Field(ge, le)``: annotated bounds would replace a field's own (pydantic keeps one ``ge``/``le``)."""


class StrictModel(BaseModel):
    """Base of the request models: unknown keys refused, no coercion, and no NaN or infinity in a float field
    (they would reach the arithmetic and the JSON encoder); integers are ``Int64``."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def require_exactly_one(model: BaseModel, names: tuple[str, ...]) -> str:
    """The one field of ``names`` that ``model`` sets; ValueError (a 422 in validators) otherwise."""
    given = [name for name in names if getattr(model, name) is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of {', '.join(names)} (got {given or 'none'})")
    return given[0]


class RopeSource(StrictModel):
    """Where rope parameters come from: exactly one of ``config``, ``preset`` or ``rope``."""

    config: dict[str, Any] | None = Field(
        None, description="A Hugging Face config.json (any form: rope_parameters, rope_scaling, text_config, ...)."
    )
    preset: str | None = Field(
        None, description="A built-in preset name (GET /v1/info lists them).", examples=["llama-3.1-8b"]
    )
    rope: dict[str, Any] | None = Field(
        None,
        description="Explicit parameters: rope_type, rope_theta, head_dim, rotary_dim or partial_rotary_factor, "
        "max_position_embeddings and the type's keys (factor, original_max_position_embeddings, ...).",
        examples=[{"rope_type": "default", "rope_theta": 10000.0, "head_dim": 8}],
    )
    layer_type: str | None = Field(None, description="Per-layer-type configs: which layer (default full_attention).")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> RopeSource:
        require_exactly_one(self, ("config", "preset", "rope"))
        return self

    def resolve(self) -> tuple[RopeParams, Pairing]:
        """``(params, default pairing)`` for this source (``config.sources``: remembered across requests)."""
        if self.rope is not None:
            return source_params("rope", self.rope, None)
        if self.config is None:
            return source_params("preset", self.preset or "", self.layer_type)
        try:
            return source_params("config", self.config, self.layer_type)
        except InvalidInput as error:  # the normaliser points into the config: point into the request instead
            if error.field and error.field.startswith("/"):
                error.field = "/config" + error.field
            raise


class PositionRange(StrictModel):
    start: Position = 0
    stop: Annotated[int, Field(ge=0, le=MAX_POSITION + 1)]
    step: Int64 = Field(1, ge=1, le=MAX_POSITION)

    @model_validator(mode="after")
    def _ordered(self) -> PositionRange:
        if self.stop < self.start:
            raise ValueError(f"stop ({self.stop}) must be >= start ({self.start})")
        return self

    def count(self) -> int:
        return -(-(self.stop - self.start) // self.step)


def positions_tensor(positions: list[Position] | PositionRange, limit: int, field: str = "positions") -> torch.Tensor:
    """Positions as int64 [N]; rejects negatives and counts over ``limit`` before allocating."""
    if isinstance(positions, PositionRange):
        check_limit(positions.count(), limit, "positions", field)
        tensor = torch.arange(positions.start, positions.stop, positions.step, dtype=torch.int64)
    else:
        check_limit(len(positions), limit, "positions", field)
        tensor = torch.tensor(positions, dtype=torch.int64)
    if tensor.numel() and int(tensor.min()) < 0:
        raise InvalidInput("positions must be >= 0", field=field)
    return tensor
