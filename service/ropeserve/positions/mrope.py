"""M-RoPE (3-axis T/H/W) prefill positions from token-level input, decode positions and chunked-prefill slices.

Token-level input is what a serving stack holds (transformers' ``get_rope_index`` arguments). It is validated and
cut into blocks (see :mod:`ropeserve.positions._blocks`, which lays them out): every maximal run of equal token
types in a row is a block, padding included, and image and video runs consume the grids in batch order.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._blocks import (
    IMAGE_TOKEN,
    KIND_NAMES,
    PAD_BLOCK,
    TEXT_TOKEN,
    VIDEO_TOKEN,
    Blocks,
    frame_strides,
    needs_frame_time,
    plan_positions,
    time_factors,
)
from ropeserve.positions._common import (
    PAD_POSITION,
    IntsLike,
    as_long_array,
    as_mask_array,
    as_mask_only,
    check_element_limit,
    device_of,
    first_true,
    per_row_array,
    require_finite_float,
    require_int,
    require_sum_fits,
    tensor_on,
)
from ropeserve.positions.families import (
    COMPAT_RULES,
    DEFAULT_COMPAT,
    MRopeCompat,
    MRopeFamily,
    get_mrope_family,
    parse_compat,
)

__all__ = [
    "IMAGE_TOKEN",
    "TEXT_TOKEN",
    "VIDEO_TOKEN",
    "MRopePositions",
    "mrope_decode_array",
    "mrope_decode_positions",
    "mrope_positions_from_tokens",
    "slice_prefill_positions",
]

FloatsLike = torch.Tensor | Sequence[float]


MAX_TOKENS_PER_SECOND = 1e12
"""Largest ``tokens_per_second`` (released checkpoints use 2 to 25 temporal positions per second): a larger value
is refused naming it, so that a frame time that still overflows 2**53 is ``second_per_grid_t``'s doing and is
refused naming that, where the frame times are computed."""


@dataclass(frozen=True)
class MRopePositions:
    """Result of a prefill position computation."""

    position_ids: torch.Tensor
    """``[3, B, T]`` int64: T, H, W positions; padded slots hold the fill value."""
    mrope_position_deltas: torch.Tensor
    """``[B, 1]`` int64: ``max position + 1 - real tokens`` per row (0 for an empty row); decode adds it."""
    attention_mask: torch.Tensor
    """``[B, T]`` bool: True on real tokens."""


class ModelSettings(NamedTuple):
    """A family's defaults with the request's overrides applied."""

    family: MRopeFamily
    spatial_merge_size: int
    tokens_per_second: float | None
    compat: MRopeCompat

    @property
    def continue_after_max(self) -> bool:
        """Whether the block after a vision block starts at its largest position + 1 (compat or family rule)."""
        return COMPAT_RULES[self.compat].next_start_after_max or self.family.temporal_rule.always_after_max


def resolve_settings(
    family: str | MRopeFamily,
    spatial_merge_size: int | None,
    tokens_per_second: float | None,
    compat: str | MRopeCompat,
) -> ModelSettings:
    """Apply overrides to the family defaults and validate them."""
    spec = get_mrope_family(family)
    merge = spatial_merge_size if spatial_merge_size is not None else spec.spatial_merge_size
    tps = tokens_per_second if tokens_per_second is not None else spec.tokens_per_second
    if tps is not None:
        tps = require_finite_float(tps, "tokens_per_second", minimum=0.0, maximum=MAX_TOKENS_PER_SECOND)
    if spec.temporal_rule.scales_by_seconds and tps is None:
        raise InvalidInput(f"family {spec.name} needs tokens_per_second", field="tokens_per_second")
    return ModelSettings(
        family=spec,
        spatial_merge_size=require_int(merge, "spatial_merge_size", minimum=1),
        tokens_per_second=tps,
        compat=parse_compat(compat),
    )


# --------------------------------------------------------------------------------------------------------------
# Token form: what a serving stack holds
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenBlocks:
    """Blocks found in token-level input, with what the segment conversion needs."""

    blocks: Blocks
    mask: np.ndarray  # [B, L] bool
    row_lengths: np.ndarray  # [B] int64 real tokens per row
    device: torch.device | None  # of the token tensor, where the results go; None: the CPU
    spatial_merge_size: int
    second_per_grid_t: np.ndarray | None  # [G] of video blocks when given and used; None otherwise


@dataclass(frozen=True)
class _Runs:
    """Maximal runs of equal token type (padding is its own type) in the flat ``[B * L]`` layout, rows kept apart."""

    kind: np.ndarray  # [G] int64
    row: np.ndarray  # [G] int64
    first_slot: np.ndarray  # [G] int64 flat index of the run's first token
    length: np.ndarray  # [G] int64
    width: int  # L


def _token_types(
    mm_token_type_ids: IntsLike | None,
    input_ids: IntsLike | None,
    image_token_id: int,
    video_token_id: int,
) -> tuple[np.ndarray, torch.device | None]:
    """``[B, L]`` int64 modality of each token, from ``mm_token_type_ids`` or else from ``input_ids``, and the
    device of the tokens (None: the CPU)."""
    if mm_token_type_ids is not None:
        types = as_long_array(mm_token_type_ids, "mm_token_type_ids", ndim=2)
        unsigned = types.view(np.uint64)  # negative values wrap around to huge ones
        if types.size and int(unsigned.max()) > VIDEO_TOKEN:
            row, col = (int(i) for i in np.argwhere(unsigned > VIDEO_TOKEN)[0])
            raise InvalidInput(
                f"row {row}, column {col}: mm_token_type_ids value {int(types[row, col])} is not "
                "0 (text), 1 (image) or 2 (video)",
                field=f"mm_token_type_ids[{row}][{col}]",
            )
        return types, device_of(mm_token_type_ids)
    if input_ids is None:
        raise InvalidInput("give mm_token_type_ids or input_ids", field="mm_token_type_ids")
    ids = as_long_array(input_ids, "input_ids", ndim=2)
    types = (ids == image_token_id).astype(np.int64) * IMAGE_TOKEN + (ids == video_token_id).astype(
        np.int64
    ) * VIDEO_TOKEN
    return types, device_of(input_ids)


def _find_runs(types: np.ndarray, mask: np.ndarray | None) -> _Runs:
    """Cut ``[B, L]`` token types into runs; ``mask`` None means every slot is a real token.

    A run starts at each row start, each change of type and each change between real and padding; padding is a
    type of its own (``PAD_BLOCK``), whatever the token types under it.
    """
    width = types.shape[1]
    flat = (types if mask is None else np.where(mask, types, PAD_BLOCK)).reshape(-1)
    opens_run = np.empty(flat.size + 1, dtype=bool)  # one slot past the end, where the last run ends
    opens_run[-1] = True
    if flat.size:
        np.not_equal(flat[1:], flat[:-1], out=opens_run[1:-1])
        opens_run[:-1:width] = True
    bounds = np.flatnonzero(opens_run)
    first_slot = bounds[:-1]
    return _Runs(
        kind=flat[first_slot],
        row=first_slot // max(width, 1),  # no runs when width is 0
        first_slot=first_slot,
        length=bounds[1:] - first_slot,
        width=width,
    )


class _RunErrors:
    """Builds errors that name a run as ``rows[b].segments[i]`` (i counts the row's real runs) and its columns."""

    def __init__(self, runs: _Runs) -> None:
        self.runs = runs

    def __call__(self, run: int, message: str) -> InvalidInput:
        runs = self.runs
        row = int(runs.row[run])
        earlier = (runs.row[:run] == row) & (runs.kind[:run] != PAD_BLOCK)
        segment = int(earlier.sum())
        first = int(runs.first_slot[run])
        first_col, last_col = first % runs.width, (first + int(runs.length[run]) - 1) % runs.width
        kind = KIND_NAMES[int(runs.kind[run])]
        return InvalidInput(
            f"row {row}, segment {segment} ({kind} tokens at columns {first_col}..{last_col}): {message}",
            field=f"rows[{row}].segments[{segment}]",
        )


def _grid_array(grid_thw: IntsLike | None, field: str) -> np.ndarray:
    """``[N, 3]`` int64 grids (``[0, 3]`` for None or an empty input)."""
    if grid_thw is None:
        return np.zeros((0, 3), dtype=np.int64)
    grid = as_long_array(grid_thw, field)
    if grid.size == 0:
        return grid.reshape(0, 3)
    if grid.ndim != 2 or grid.shape[1] != 3:
        raise InvalidInput(f"{field} must have shape [N, 3], got {tuple(grid.shape)}", field=field)
    return grid


def _assign_grids(
    runs: _Runs,
    wanted: int,
    grids: np.ndarray,
    source_row: np.ndarray | None,
    field: str,
    error: _RunErrors,
    unit: str = "rows",
) -> np.ndarray:
    """``[n]`` run ids of kind ``wanted``, consuming ``grids`` in order (global across the batch, as transformers).

    ``source_row[i]`` is the row of the caller's grid tensor that grid ``i`` came from (frames of one video share
    it); None means grid ``i`` is row ``i``.
    """
    run_ids = np.flatnonzero(runs.kind == wanted)
    name = KIND_NAMES[wanted]
    available = grids.shape[0]
    if run_ids.size > available:
        raise error(
            int(run_ids[available]),
            f"more {name} blocks than {field} has {unit} ({available}); this block has no grid",
        )
    if run_ids.size < available:
        unused = run_ids.size if source_row is None else int(source_row[run_ids.size])
        raise _unused_grid(run_ids.size, name, field, unused)
    return run_ids


def _unused_grid(blocks: int, name: str, field: str, unused: int) -> InvalidInput:
    """The tokens hold only ``blocks`` blocks of kind ``name``: ``field[unused]`` has none."""
    return InvalidInput(
        f"the tokens hold only {blocks} {name} blocks, fewer than {field} describes; "
        f"{field}[{unused}] is not used by any block",
        field=f"{field}[{unused}]",
    )


def _split_video_frames(video_grid: np.ndarray, runs: _Runs, error: _RunErrors) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-VL / GLM-4V: each video ``(t, h, w)`` becomes t frames ``(1, h, w)``; returns (frames, video of frame)."""
    frames_per_video = video_grid[:, 0]
    empty = frames_per_video < 1
    if empty.any():
        video = int(np.flatnonzero(empty)[0])
        first_frame = int(frames_per_video[:video].sum())
        video_runs = np.flatnonzero(runs.kind == VIDEO_TOKEN)
        message = f"video_grid_thw[{video}] = {video_grid[video].tolist()} has no frames"
        if first_frame < video_runs.size:
            raise error(int(video_runs[first_frame]), message)
        raise InvalidInput(message, field=f"video_grid_thw[{video}]")
    # every frame needs a block of its own: refuse extra frames before making them (exact sums: an int64 sum of
    # huge frame counts wraps, and numpy's repeat crashed on it)
    ends = list(itertools.accumulate(frames_per_video.tolist()))
    blocks = int(np.count_nonzero(runs.kind == VIDEO_TOKEN))
    if ends and ends[-1] > blocks:
        raise _unused_grid(blocks, KIND_NAMES[VIDEO_TOKEN], "video_grid_thw", bisect.bisect_right(ends, blocks))
    video_of_frame = np.repeat(np.arange(frames_per_video.size), frames_per_video)
    frames = video_grid[video_of_frame]
    frames[:, 0] = 1
    return frames, video_of_frame


NARROW_SECONDS = (torch.float16, torch.bfloat16)
"""Seconds tensor dtypes whose frame-time products transformers' torch code rounds to them (``BatchFeature.to(dtype)``
casts the processor's float32 seconds with the pixel values): reproduced in float32 with a rounding per product,
under the transformers rules only (vLLM reads the seconds as Python floats and multiplies in float32)."""


def _seconds_per_grid(second_per_grid_ts: FloatsLike | None, num_videos: int) -> np.ndarray | None:
    """``[num_videos]`` seconds per temporal patch: float64 when given as a float64 tensor, else float32 (as the
    processor's tensor holds them; a float16 / bfloat16 tensor's values, exact in float32: see NARROW_SECONDS)."""
    if second_per_grid_ts is None:
        return None
    if isinstance(second_per_grid_ts, torch.Tensor):
        dtype = torch.float64 if second_per_grid_ts.dtype == torch.float64 else torch.float32
        seconds = second_per_grid_ts.detach().to(device="cpu", dtype=dtype).reshape(-1).numpy()
    else:
        try:
            seconds = torch.as_tensor(second_per_grid_ts, dtype=torch.float32).reshape(-1).numpy()
        except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
            raise InvalidInput(
                f"second_per_grid_ts must be a list of numbers: {exc}", field="second_per_grid_ts"
            ) from exc
    if seconds.size != num_videos:
        raise InvalidInput(
            f"second_per_grid_ts has {seconds.size} values for {num_videos} videos", field="second_per_grid_ts"
        )
    video = first_true(~(seconds >= 0) | (seconds == np.inf))  # NaN compares False
    if video is not None:
        raise InvalidInput(
            f"second_per_grid_ts[{video}] is {float(seconds[video])}; it must be finite and >= 0",
            field=f"second_per_grid_ts[{video}]",
        )
    return seconds


def _merge_grids(
    grids: np.ndarray,
    grid_runs: np.ndarray,
    merge: int,
    error: _RunErrors,
    grid_name: _GridNames,
    video_t_merge: int = 1,
) -> np.ndarray:
    """``[n, 3]`` patch grids (images, then videos) -> merged ``(t, h / merge, w / merge)`` (a video's ``t`` floor
    divided by ``video_t_merge``); raises for the first empty or ragged grid, naming the run it was assigned to
    (``grid_runs[i]``)."""
    if grids.size == 0:
        return grids
    divisors = np.empty_like(grids)
    divisors[:] = (1, merge, merge)  # np.tile costs three times as much
    divisors[grid_name.num_images :, 0] = video_t_merge
    merged, remainder = np.divmod(grids, divisors)
    remainder[:, 0] = 0  # transformers floors t // temporal_merge_size
    if int(grids.min()) >= 1 and int(merged[:, 0].min()) >= 1 and not remainder.any():
        return merged
    bad = (grids < 1).any(axis=1) | (merged[:, 0] < 1) | remainder.any(axis=1)
    index = int(np.flatnonzero(bad)[0])
    grid_text = grids[index].tolist()
    if min(grid_text) < 1:
        problem = "has a zero or negative size"
    elif merged[index, 0] < 1:
        problem = f"t must be at least the video temporal_merge_size {video_t_merge}"
    else:
        problem = f"h and w must be multiples of spatial_merge_size {merge}"
    raise error(int(grid_runs[index]), f"{grid_name(index)} = {grid_text}: {problem}")


@dataclass(frozen=True)
class _GridNames:
    """Names vision grid ``i`` (images first, then videos or video frames) for error messages."""

    num_images: int
    video_of_grid: np.ndarray | None

    def __call__(self, index: int) -> str:
        if index < self.num_images:
            return f"image_grid_thw[{index}]"
        video = index - self.num_images
        if self.video_of_grid is None:
            return f"video_grid_thw[{video}]"
        return f"video_grid_thw[{int(self.video_of_grid[video])}] (frame {video})"


def _check_token_counts(thw: np.ndarray, runs: _Runs, merge: int, row_end: int, error: _RunErrors) -> None:
    """Every run must hold ``t * h * w`` tokens of its merged grid (``w`` counting ``row_end`` tokens per row; true by
    construction for text and padding)."""
    needed = thw.prod(axis=1, dtype=np.float64)  # no overflow, and exact whenever it could equal a token count
    mismatch = needed != runs.length
    if mismatch.any():
        run = int(np.flatnonzero(mismatch)[0])
        t, h, w = thw[run].tolist()
        raise error(
            run,
            f"{int(runs.length[run])} tokens but grid {[t, h * merge, (w - row_end) * merge]} with "
            f"spatial_merge_size {merge} needs {t * h * w}",
        )


def _run_seconds(
    num_runs: int, video_runs: np.ndarray, video_of_grid: np.ndarray | None, seconds: np.ndarray
) -> np.ndarray:
    """``[G]`` float: ``second_per_grid_t`` of each video run, 1.0 elsewhere."""
    run_seconds = np.ones(num_runs, dtype=seconds.dtype)
    run_seconds[video_runs] = seconds if video_of_grid is None else seconds[video_of_grid]
    return run_seconds


def analyse_tokens(
    settings: ModelSettings,
    *,
    mm_token_type_ids: IntsLike | None,
    input_ids: IntsLike | None,
    image_grid_thw: IntsLike | None,
    video_grid_thw: IntsLike | None,
    second_per_grid_ts: FloatsLike | None,
    attention_mask: IntsLike | None,
    image_token_id: int | None,
    video_token_id: int | None,
) -> TokenBlocks:
    """Validate token-level input and turn it into blocks (grids consumed in batch order, as transformers does)."""
    family = settings.family
    rule = family.temporal_rule
    types, device = _token_types(
        mm_token_type_ids,
        input_ids,
        family.image_token_id if image_token_id is None else image_token_id,
        family.video_token_id if video_token_id is None else video_token_id,
    )
    mask, row_lengths = mask_and_lengths(attention_mask, types)
    has_padding = attention_mask is not None and int(row_lengths.sum()) != types.size
    runs = _find_runs(types, mask if has_padding else None)
    error = _RunErrors(runs)

    image_grid = _grid_array(image_grid_thw, "image_grid_thw")
    video_grid = _grid_array(video_grid_thw, "video_grid_thw")
    num_videos = video_grid.shape[0]
    video_of_grid = None
    image_runs = _assign_grids(runs, IMAGE_TOKEN, image_grid, None, "image_grid_thw", error)
    if rule.splits_video_frames:
        video_grid, video_of_grid = _split_video_frames(video_grid, runs, error)
    video_unit = "frames" if rule.splits_video_frames else "rows"
    video_runs = _assign_grids(runs, VIDEO_TOKEN, video_grid, video_of_grid, "video_grid_thw", error, video_unit)

    merge = settings.spatial_merge_size
    vision_runs = np.concatenate([image_runs, video_runs])
    merged = _merge_grids(
        np.concatenate([image_grid, video_grid]),
        vision_runs,
        merge,
        error,
        _GridNames(image_grid.shape[0], video_of_grid),
        family.video_temporal_merge_size,
    )
    if rule.row_end_tokens:
        merged[:, 2] += rule.row_end_tokens
    thw = np.ones((runs.length.size, 3), dtype=np.int64)
    thw[:, 2] = runs.length
    thw[vision_runs] = merged
    _check_token_counts(thw, runs, merge, rule.row_end_tokens, error)

    time_step, time_scale, run_seconds, narrow = None, None, None, None
    if rule.scales_by_seconds:
        if (
            isinstance(second_per_grid_ts, torch.Tensor)
            and second_per_grid_ts.dtype in NARROW_SECONDS
            and not COMPAT_RULES[settings.compat].seconds_first
        ):
            narrow = second_per_grid_ts.dtype
        seconds = _seconds_per_grid(second_per_grid_ts, num_videos)
        if seconds is not None:
            run_seconds = _run_seconds(runs.length.size, video_runs, video_of_grid, seconds)
        if needs_frame_time(runs.kind, thw[:, 0]).any():
            assert settings.tokens_per_second is not None
            per_run = np.ones(runs.length.size, dtype=np.float32) if run_seconds is None else run_seconds
            time_step, time_scale = time_factors(
                runs.kind, per_run, per_run.dtype.type, settings.tokens_per_second, settings.compat, narrow
            )
    strides = frame_strides(runs.kind, thw) if rule.frame_stride_all_axes else None
    blocks = Blocks(runs.row, runs.kind, thw, time_step, has_padding, time_scale, strides, narrow)
    return TokenBlocks(blocks, mask, row_lengths, device, merge, run_seconds)


def mask_and_lengths(attention_mask: IntsLike | None, types: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[B, L]`` bool mask (all True when None) and ``[B]`` int64 real tokens per row."""
    num_rows, width = types.shape
    if attention_mask is None:
        return np.ones(types.shape, dtype=bool), np.full(num_rows, width, dtype=np.int64)
    mask, row_lengths = as_mask_array(attention_mask, "attention_mask")
    return _shaped_like(mask, types), row_lengths


def real_mask(attention_mask: IntsLike | None, types: np.ndarray) -> np.ndarray:
    """:func:`mask_and_lengths` without the lengths."""
    if attention_mask is None:
        return np.ones(types.shape, dtype=bool)
    return _shaped_like(as_mask_only(attention_mask, "attention_mask"), types)


def _shaped_like(mask: np.ndarray, types: np.ndarray) -> np.ndarray:
    if mask.shape != types.shape:
        raise InvalidInput(
            f"attention_mask has shape {tuple(mask.shape)} but the tokens have {tuple(types.shape)}",
            field="attention_mask",
        )
    return mask


def mrope_positions_from_tokens(
    *,
    family: str | MRopeFamily,
    mm_token_type_ids: IntsLike | None = None,
    input_ids: IntsLike | None = None,
    image_grid_thw: IntsLike | None = None,
    video_grid_thw: IntsLike | None = None,
    second_per_grid_ts: FloatsLike | None = None,
    attention_mask: IntsLike | None = None,
    image_token_id: int | None = None,
    video_token_id: int | None = None,
    spatial_merge_size: int | None = None,
    tokens_per_second: float | None = None,
    compat: str | MRopeCompat = DEFAULT_COMPAT,
    fill_value: int = PAD_POSITION,
) -> MRopePositions:
    """Prefill M-RoPE positions from what a serving stack holds (``get_rope_index``'s inputs).

    Args:
        family: ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``, ``glm4v`` (or an alias / :class:`MRopeFamily`).
        mm_token_type_ids: ``[B, L]`` 0 text, 1 image pad, 2 video pad. Preferred over ``input_ids``.
        input_ids: ``[B, L]`` token ids; types come from ``image_token_id`` / ``video_token_id`` (family
            defaults). Only read when ``mm_token_type_ids`` is None.
        image_grid_thw: ``[N_img, 3]`` patch-unit grids, ordered by row then appearance (global over the batch).
        video_grid_thw: ``[N_vid, 3]`` likewise. Qwen3-VL / GLM-4V: each video is split into ``t`` frames of
            ``(1, h, w)``, each a separate run of video tokens between timestamp text.
        second_per_grid_ts: ``[N_vid]`` seconds per temporal patch (Qwen2.5-VL only; ignored by the other
            families; missing = 1.0 per video). Computed in the tensor's dtype as transformers does (float32 for
            lists and integer tensors, like the processor's; always float32 under the vLLM / SGLang rule).
        attention_mask: ``[B, L]`` 1 real / 0 pad (any side); default all real.
        spatial_merge_size, tokens_per_second: override the family defaults.
        compat: where the block after a vision block starts (default ``transformers5``).
        fill_value: value of padded slots (transformers 5: 0).

    Returns:
        :class:`MRopePositions` with ``position_ids`` ``[3, B, L]`` and ``mrope_position_deltas`` ``[B, 1]``.

    Raises:
        InvalidInput naming ``rows[b].segments[i]`` (the i-th run of equal token types among row b's real tokens)
        when a run has no grid, the grid is empty or not divisible by the merge size, or its token count differs
        from ``t * (h / merge) * (w / merge)``; naming the grid when grids are left unused.

    Padding always ends a run. transformers drops padding before grouping, which differs only when padding sits
    inside a vision run or between two runs of one vision kind (input no processor produces): there transformers
    fails on the merged run, while here each side is its own block, so a grid or token count error names it.
    """
    settings = resolve_settings(family, spatial_merge_size, tokens_per_second, compat)
    analysis = analyse_tokens(
        settings,
        mm_token_type_ids=mm_token_type_ids,
        input_ids=input_ids,
        image_grid_thw=image_grid_thw,
        video_grid_thw=video_grid_thw,
        second_per_grid_ts=second_per_grid_ts,
        attention_mask=attention_mask,
        image_token_id=image_token_id,
        video_token_id=video_token_id,
    )
    plan = plan_positions(
        analysis.blocks, analysis.row_lengths, analysis.mask.shape[1], settings.continue_after_max, fill_value
    )
    position_ids, deltas = plan.expand(analysis.device)
    return MRopePositions(position_ids, deltas, tensor_on(analysis.mask, analysis.device))


# --------------------------------------------------------------------------------------------------------------
# Decode and chunked prefill
# --------------------------------------------------------------------------------------------------------------


def mrope_decode_positions(
    mrope_position_deltas: IntsLike | int,
    cache_lengths: IntsLike | int,
    num_new: int = 1,
) -> torch.Tensor:
    """Positions of the next ``num_new`` tokens after a prefill -> ``[3, B, num_new]`` int64, all three rows equal.

    Row ``b`` gets ``cache_lengths[b] + mrope_position_deltas[b] + arange(num_new)`` (vLLM's
    ``get_next_input_positions``; transformers' forward with a cache). ``cache_lengths`` counts the real tokens
    already processed (prompt without padding, plus generated tokens); ``num_new > 1`` covers speculative
    decoding. Deltas may be ``[B, 1]``, ``[B]`` or one int. On the deltas' device (a CPU tensor shares the memory
    of :func:`mrope_decode_array`'s answer).
    """
    positions = mrope_decode_array(mrope_position_deltas, cache_lengths, num_new)
    return tensor_on(positions, device_of(mrope_position_deltas))


def mrope_decode_array(
    mrope_position_deltas: IntsLike | int,
    cache_lengths: IntsLike | int,
    num_new: int = 1,
) -> np.ndarray:
    """:func:`mrope_decode_positions` as a new ``[3, B, num_new]`` int64 numpy array (the JSON answer needs no
    tensor), with the same checks in the same order."""
    count = require_int(num_new, "num_new", minimum=1)
    delta_input = [mrope_position_deltas] if isinstance(mrope_position_deltas, int) else mrope_position_deltas
    deltas = as_long_array(delta_input, "mrope_position_deltas").reshape(-1)
    cache = per_row_array(cache_lengths, deltas.size, "cache_lengths")
    check_element_limit(3 * max(deltas.size, 1) * count, None, "decode positions", field="num_new")  # arange(count)
    require_sum_fits(cache, deltas, "cache_lengths", extra=count - 1)
    first = cache + deltas
    row = first_true(first < 0)
    if row is not None:
        raise InvalidInput(
            f"row {row}: cache length {int(cache[row])} plus delta {int(deltas[row])} gives a negative position; "
            "the cache length must count the whole prompt",
            field=f"rows[{row}]",
        )
    positions: np.ndarray = first[:, None] + np.arange(count)  # numpy types this Any
    return positions[None].repeat(3, axis=0)  # a new array, also for an empty batch


PositionsT = TypeVar("PositionsT", torch.Tensor, np.ndarray)


def slice_prefill_positions(position_ids: PositionsT, context_len: int, seq_len: int) -> PositionsT:
    """Chunked prefill: columns ``[context_len:seq_len]`` of a full prompt's positions.

    ``position_ids`` (a tensor or an array) is ``[3, T]`` (one unpadded sequence, as vLLM holds it) or
    ``[3, B, T]``; the result keeps the leading dimensions. Positions must always come from the *full* prompt: a
    chunk's own positions (and its delta) differ from the slice when an image straddles the chunk boundary.
    """
    arrays = (torch.Tensor, np.ndarray)
    if not isinstance(position_ids, arrays) or position_ids.ndim not in (2, 3) or position_ids.shape[0] != 3:
        shape = tuple(position_ids.shape) if isinstance(position_ids, arrays) else type(position_ids).__name__
        raise InvalidInput(f"position_ids must be [3, T] or [3, B, T], got {shape}", field="position_ids")
    total = position_ids.shape[-1]
    start = require_int(context_len, "context_len", minimum=0)
    end = require_int(seq_len, "seq_len", minimum=start)
    if end > total:
        raise InvalidInput(f"seq_len {end} exceeds the prompt length {total}", field="seq_len")
    return position_ids[..., start:end]
