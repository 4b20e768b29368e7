"""Classic (non-rotary) position encodings in pure torch (no web imports).

Sinusoidal absolute tables, ALiBi slopes and biases, T5 buckets and Shaw clipped indices, 2-D sin-cos tables
for ViT/MAE grids, and resampling of learned absolute tables to new grids.
"""

from ropeserve.encodings.alibi import DISTANCES, AlibiMode, alibi_bias, alibi_slopes, closest_power_of_two
from ropeserve.encodings.relative import (
    relative_positions,
    shaw_relative_indices,
    shaw_table_rows,
    t5_bucket,
    t5_relative_buckets,
)
from ropeserve.encodings.resample import (
    DEFAULT_MODES,
    RESAMPLE_MODES,
    InterpolationMode,
    resample_table,
)
from ropeserve.encodings.sincos2d import GridAxis, sincos_2d_table
from ropeserve.encodings.sinusoidal import (
    LAYOUTS,
    SCHEDULES,
    SinusoidalLayout,
    SinusoidalSchedule,
    sinusoidal_table,
)

__all__ = [
    "DEFAULT_MODES",
    "DISTANCES",
    "LAYOUTS",
    "RESAMPLE_MODES",
    "SCHEDULES",
    "AlibiMode",
    "GridAxis",
    "InterpolationMode",
    "SinusoidalLayout",
    "SinusoidalSchedule",
    "alibi_bias",
    "alibi_slopes",
    "closest_power_of_two",
    "relative_positions",
    "resample_table",
    "shaw_relative_indices",
    "shaw_table_rows",
    "sincos_2d_table",
    "sinusoidal_table",
    "t5_bucket",
    "t5_relative_buckets",
]
