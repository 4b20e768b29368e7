"""``llama3``: Llama 3.1's wavelength-banded scaling (transformers 5.24 ``_compute_llama3_parameters``).

Wavelengths above ``original / low_freq_factor`` are divided by ``factor``, those below
``original / high_freq_factor`` are kept, and the band between is blended.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ropeserve.config.params import RopeParams
from ropeserve.config.rope_types.base import Problem, Ramp, RopeType, Spectrum, Torch, base_inv_freq

if TYPE_CHECKING:
    from torch import Tensor

BAND_KEYS = ("low_freq_factor", "high_freq_factor")


def wavelength_bounds(original: float, low: float, high: float) -> tuple[float, float]:
    """``(low_freq_wavelen, high_freq_wavelen) = (original / low_freq_factor, original / high_freq_factor)``."""
    return original / low, original / high


def inv_freq(torch: Torch, params: RopeParams, seq_len: int | None) -> tuple[Tensor, float]:
    inv = base_inv_freq(torch, params.rope_theta, params.rotary_dim)
    factor, original = params.factor, params.original_max_position_embeddings
    low, high = params.low_freq_factor, params.high_freq_factor
    assert factor is not None and original is not None and low is not None and high is not None  # required
    low_freq_wavelen, high_freq_wavelen = wavelength_bounds(original, low, high)
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


def spectrum(params: RopeParams, base: list[float], seq_len: int | None) -> Spectrum:
    factor = params.factor or 1.0
    low, high = params.low_freq_factor or 1.0, params.high_freq_factor or 1.0
    original = params.original_max_position_embeddings or 1
    low_wavelength, high_wavelength = wavelength_bounds(original, low, high)
    scaled, blended = [], []
    for index, value in enumerate(base):
        wavelength = 2 * math.pi / value
        kept = value / factor if wavelength > low_wavelength else value
        if high_wavelength <= wavelength <= low_wavelength and high > low:
            smooth = (original / wavelength - low) / (high - low)
            kept = (1 - smooth) * kept / factor + smooth * kept
            blended.append(index)
        scaled.append(kept)
    ramp = None
    if blended:
        detail = (
            f"wavelengths < {high_wavelength:g} tokens keep their frequency, > {low_wavelength:g} are divided by "
            f"{factor:g}; indices {blended[0]}-{blended[-1]} are blended"
        )
        ramp = Ramp("llama3", blended[0], blended[-1], detail)
    return Spectrum(tuple(base), tuple(scaled), 1.0, ramp)


def problems(params: RopeParams) -> Iterator[Problem]:
    for key in BAND_KEYS:
        value = params.value(key)
        if value is not None and not (math.isfinite(value) and value > 0):
            yield Problem(key, f"{key} = {value!r} must be finite and > 0 (it divides the original length)", "range")
    low, high = params.low_freq_factor, params.high_freq_factor
    if low is not None and high is not None and high <= low:
        yield Problem(
            "high_freq_factor",
            f"high_freq_factor {high:g} <= low_freq_factor {low:g}: the smoothing band is empty or inverted",
            "order",
        )


ROPE_TYPE = RopeType(
    "llama3",
    inv_freq,
    spectrum,
    required=frozenset({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}),
    problems=problems,
    original_from_config=True,
    length_includes_extension=True,
)
