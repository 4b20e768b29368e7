"""``ropeserve explain``: the rotary spectrum of a config, band by band, against the trained and requested context.

For every frequency index ``i`` (one band = one rotating channel pair) it reports the wavelength in tokens
``2*pi / inv_freq`` before and after the rope type's scaling, how many turns the band makes over the trained and
the requested context, and whether the requested context drives it to angles it never reached in training.
A band's trained reach is the larger of ``original x base frequency`` (pre-training) and
``max_position_embeddings x scaled frequency`` (a checkpoint extended with its scaling, e.g. Llama 3.1 at 128K).
Yarn and llama3 ramps are reported as index ranges.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ropeserve.config import RopeParams
from ropeserve.config.rope_types import Ramp, spectrum
from ropeserve.errors import InvalidInput
from ropeserve.lint.engines import position_capacity
from ropeserve.lint.intent import DEFAULT_INTENT, DeploymentIntent
from ropeserve.lint.model import ModelView, check_computable

TWO_PI = 2 * math.pi


@dataclass(frozen=True)
class Band:
    index: int
    channels: tuple[int, int]
    axis: str | None
    wavelength: float
    scaled_wavelength: float
    scale: float
    turns_trained: float
    turns_requested: float
    regime: str


@dataclass(frozen=True)
class ExplainReport:
    model_type: str | None
    layer_type: str
    rope_type: str
    rope_theta: float
    head_dim: int
    rotary_dim: int
    pairing: str
    original_context: int
    trained_context: int
    requested_context: int
    attention_factor: float
    ramp: Ramp | None
    bands: tuple[Band, ...]

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form; infinite wavelengths (zero-frequency bands) become null."""
        data = asdict(self)
        data["bands"] = [{k: _finite(v) for k, v in asdict(band).items()} for band in self.bands]
        return data

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)

    def to_text(self) -> str:
        header = (
            f"{self.model_type or 'model'} [{self.layer_type}]: {self.rope_type}, theta {self.rope_theta:g}, "
            f"rotary {self.rotary_dim}/{self.head_dim} ({self.pairing} pairs), attention factor "
            f"{self.attention_factor:.4g}\n"
            f"original context {self.original_context:,} tokens, trained to {self.trained_context:,}, "
            f"requested {self.requested_context:,}"
        )
        ramp = f"\n{self.ramp.kind} ramp: {self.ramp.detail}" if self.ramp else ""
        rows: list[tuple[str, ...]] = [
            ("i", "channels", "axis", "wavelength", "scaled", "x", "turns@trained", "turns@req", "regime")
        ]
        rows += [_row(band) for band in self.bands]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        table = "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)
        return f"{header}{ramp}\n{table}"

    def plot(self, path: str) -> None:
        """Write a PNG of wavelength per band (needs the ``plot`` extra: matplotlib)."""
        from ropeserve.lint.plot import plot_spectrum

        plot_spectrum(self, path)


@dataclass(frozen=True)
class Contexts:
    """Context lengths a spectrum is read against: pre-extension, trained (max_position_embeddings), requested."""

    original: int
    trained: int
    requested: int


def explain(
    config: Mapping[str, Any], intent: DeploymentIntent | None = None, *, layer_type: str | None = None
) -> ExplainReport:
    """The spectrum of ``config``'s RoPE layer ``layer_type`` (default: full attention) for ``intent``."""
    intent = intent or DEFAULT_INTENT
    view = ModelView.build(config, intent.rope_override)
    if view.error is not None:
        raise view.error
    if not view.layers:
        raise InvalidInput("the config has no RoPE layer", field="layer_type")
    name = layer_type or ("full_attention" if "full_attention" in view.layers else next(iter(view.layers)))
    params = view.layers.get(name)
    if params is None:
        raise InvalidInput(f"no RoPE layer {name!r}; available: {sorted(view.layers)}", field="layer_type")
    check_computable(params, view.normalized.sources.get(name) if view.normalized else None)
    trained = params.max_position_embeddings or 0
    original = params.original_max_position_embeddings or trained
    requested = intent.max_model_len or position_capacity(view) or original
    return _report(view, name, params, Contexts(original, trained, requested))


def _report(view: ModelView, name: str, params: RopeParams, contexts: Contexts) -> ExplainReport:
    spec = spectrum(params, contexts.requested)
    if not all(math.isfinite(value) for value in (*spec.base, *spec.scaled)):
        raise InvalidInput(
            f"the {params.rope_type} scaling makes a frequency overflow float64 (a factor too close to 0)",
            field="rope_scaling",
        )
    axes = _axes(params, len(spec.base))
    bands = []
    for index, (base, scaled) in enumerate(zip(spec.base, spec.scaled, strict=True)):
        wavelength = TWO_PI / base if base else math.inf
        scaled_wavelength = TWO_PI / scaled if scaled else math.inf
        scale = scaled_wavelength / wavelength if base else 1.0
        turns_trained = max(contexts.original / wavelength, contexts.trained / scaled_wavelength)
        turns_requested = contexts.requested / scaled_wavelength
        bands.append(
            Band(
                index=index,
                channels=_channels(index, len(spec.base), view.family.pairing),
                axis=axes[index],
                wavelength=wavelength,
                scaled_wavelength=scaled_wavelength,
                scale=scale,
                turns_trained=turns_trained,
                turns_requested=turns_requested,
                regime=_regime(turns_trained, turns_requested, scale),
            )
        )
    return ExplainReport(
        model_type=view.model_type,
        layer_type=name,
        rope_type=params.rope_type,
        rope_theta=params.rope_theta,
        head_dim=params.head_dim,
        rotary_dim=params.rotary_dim,
        pairing=view.family.pairing,
        original_context=contexts.original,
        trained_context=contexts.trained,
        requested_context=contexts.requested,
        attention_factor=spec.attention_factor,
        ramp=spec.ramp,
        bands=tuple(bands),
    )


def _regime(turns_trained: float, turns_requested: float, scale: float) -> str:
    """How a band behaves at the requested length compared with training."""
    if turns_requested > turns_trained * (1 + 1e-9) and turns_trained < 1:
        return "unseen angles"
    if turns_trained >= 1:
        return "periodic" if scale <= 1 + 1e-9 else "periodic, interpolated"
    return "interpolated" if scale > 1 + 1e-9 else "within trained range"


def _channels(index: int, half: int, pairing: str) -> tuple[int, int]:
    return (2 * index, 2 * index + 1) if pairing == "gptj" else (index, index + half)


def _axes(params: RopeParams, half: int) -> list[str | None]:
    """T/H/W per frequency index for M-RoPE (None otherwise)."""
    section = params.mrope_section
    if section is None:
        return [None] * half
    if params.mrope_layout == "interleaved":
        return [
            "H" if i % 3 == 1 and i < 3 * section[1] else "W" if i % 3 == 2 and i < 3 * section[2] else "T"
            for i in range(half)
        ]
    labels = ["T"] * section[0] + ["H"] * section[1] + ["W"] * section[2]
    return (labels + [None] * half)[:half]


def _row(band: Band) -> tuple[str, ...]:
    return (
        str(band.index),
        f"{band.channels[0]},{band.channels[1]}",
        band.axis or "-",
        _tokens(band.wavelength),
        _tokens(band.scaled_wavelength),
        f"{band.scale:.3g}",
        f"{band.turns_trained:.3g}",
        f"{band.turns_requested:.3g}",
        band.regime,
    )


def _tokens(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:,.1f}" if value < 1e4 else f"{value:,.0f}"


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and math.isinf(value) else value
