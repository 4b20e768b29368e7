"""M-RoPE (3-axis T/H/W) prefill positions from token-level input, decode positions and chunked-prefill slices.

Token-level input is what a serving stack holds (transformers' ``get_rope_index`` arguments). It is validated and
cut into blocks (see :mod:`ropeserve.positions._blocks`, which lays them out): every maximal run of equal token
types in a row is a block, padding included, and image and video runs consume the grids in batch order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._blocks import (
    IMAGE_TOKEN,
    KIND_NAMES,
    PAD_BLOCK,
    TEXT_TOKEN,
    VIDEO_TOKEN,
    Blocks,
    plan_positions,
)
from ropeserve.positions._common import (
    PAD_POSITION,
    IntsLike,
    as_long_tensor,
    as_mask_and_lengths,
    check_element_limit,
    per_row_values,
    require_finite_float,
    require_int,
)
from ropeserve.positions.families import (
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
    "mrope_decode_positions",
    "mrope_positions_from_tokens",
    "slice_prefill_positions",
]

FloatsLike = torch.Tensor | Sequence[float]


@dataclass(frozen=True)
class MRopePositions:
    """Result of a prefill position computation."""

    position_ids: torch.Tensor
    """``[3, B, T]`` int64: T, H, W positions; padded slots hold the fill value."""
    mrope_position_deltas: torch.Tensor
    """``[B, 1]`` int64: ``max position + 1 - real tokens`` per row (0 for an empty row); decode adds it."""
    attention_mask: torch.Tensor
    """``[B, T]`` bool: True on real tokens."""


@dataclass(frozen=True)
class ModelSettings:
    """A family's defaults with the request's overrides applied."""

    family: MRopeFamily
    spatial_merge_size: int
    tokens_per_second: float | None
    compat: MRopeCompat


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
        tps = require_finite_float(tps, "tokens_per_second", minimum=0.0)
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
    mask: torch.Tensor  # [B, L] bool
    row_lengths: torch.Tensor  # [B] int64 real tokens per row
    spatial_merge_size: int
    second_per_grid_t: torch.Tensor | None  # [G] of video blocks when given and used; None otherwise


@dataclass(frozen=True)
class _Runs:
    """Maximal runs of equal token type (padding is its own type) in the flat ``[B * L]`` layout, rows kept apart."""

    kind: torch.Tensor  # [G] int64
    row: torch.Tensor  # [G] int64
    first_slot: torch.Tensor  # [G] int64 flat index of the run's first token
    length: torch.Tensor  # [G] int64
    width: int  # L


def _token_types(
    mm_token_type_ids: IntsLike | None,
    input_ids: IntsLike | None,
    image_token_id: int,
    video_token_id: int,
) -> torch.Tensor:
    """``[B, L]`` modality of each token, from ``mm_token_type_ids`` or else from ``input_ids``."""
    if mm_token_type_ids is not None:
        types = as_long_tensor(mm_token_type_ids, "mm_token_type_ids", ndim=2)
        low, high = torch.aminmax(types) if types.numel() else (0, 0)
        if int(low) < TEXT_TOKEN or int(high) > VIDEO_TOKEN:
            row, col = (int(i) for i in ((types < TEXT_TOKEN) | (types > VIDEO_TOKEN)).nonzero()[0])
            raise InvalidInput(
                f"row {row}, column {col}: mm_token_type_ids value {int(types[row, col])} is not "
                "0 (text), 1 (image) or 2 (video)",
                field=f"mm_token_type_ids[{row}][{col}]",
            )
        return types
    if input_ids is None:
        raise InvalidInput("give mm_token_type_ids or input_ids", field="mm_token_type_ids")
    ids = as_long_tensor(input_ids, "input_ids", ndim=2)
    return (ids == image_token_id).long() * IMAGE_TOKEN + (ids == video_token_id).long() * VIDEO_TOKEN


def _find_runs(types: torch.Tensor, mask: torch.Tensor | None) -> _Runs:
    """Cut ``[B, L]`` token types into runs; ``mask`` None means every slot is a real token.

    A run starts at each row start, each change of type and each change between real and padding (a stretch of
    padding may be cut more than once, which is harmless: padding blocks take no positions).
    """
    width = types.shape[1]
    flat = types.reshape(-1)
    opens_run = torch.empty(flat.numel(), dtype=torch.bool, device=types.device)
    if flat.numel():
        torch.ne(flat[1:], flat[:-1], out=opens_run[1:])
        if mask is not None:
            real = mask.reshape(-1)
            opens_run[1:] |= real[1:] != real[:-1]
        opens_run[::width] = True
    first_slot = opens_run.nonzero()[:, 0]
    kind = flat.index_select(0, first_slot)
    if mask is not None:
        kind.masked_fill_(~mask.reshape(-1).index_select(0, first_slot), PAD_BLOCK)
    next_first_slot = torch.full_like(first_slot, flat.numel())
    next_first_slot[:-1] = first_slot[1:]
    return _Runs(
        kind=kind,
        row=torch.div(first_slot, width, rounding_mode="floor"),
        first_slot=first_slot,
        length=next_first_slot - first_slot,
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


def _grid_tensor(grid_thw: IntsLike | None, field: str, device: torch.device) -> torch.Tensor:
    if grid_thw is None:
        return torch.zeros((0, 3), dtype=torch.long, device=device)
    grid = as_long_tensor(grid_thw, field, device=device)
    if grid.numel() == 0:
        return grid.reshape(0, 3)
    if grid.dim() != 2 or grid.shape[1] != 3:
        raise InvalidInput(f"{field} must have shape [N, 3], got {tuple(grid.shape)}", field=field)
    return grid


def _assign_grids(
    runs: _Runs,
    wanted: int,
    grids: torch.Tensor,
    source_row: torch.Tensor | None,
    field: str,
    error: _RunErrors,
    unit: str = "rows",
) -> torch.Tensor:
    """``[n]`` run ids of kind ``wanted``, consuming ``grids`` in order (global across the batch, as transformers).

    ``source_row[i]`` is the row of the caller's grid tensor that grid ``i`` came from (frames of one video share
    it); None means grid ``i`` is row ``i``.
    """
    run_ids = (runs.kind == wanted).nonzero()[:, 0]
    name = KIND_NAMES[wanted]
    available = grids.shape[0]
    if run_ids.numel() > available:
        raise error(
            int(run_ids[available]),
            f"more {name} blocks than {field} has {unit} ({available}); this block has no grid",
        )
    if run_ids.numel() < available:
        unused = run_ids.numel() if source_row is None else int(source_row[run_ids.numel()])
        raise InvalidInput(
            f"the tokens hold only {run_ids.numel()} {name} blocks, fewer than {field} describes; "
            f"{field}[{unused}] is not used by any block",
            field=f"{field}[{unused}]",
        )
    return run_ids


def _split_video_frames(video_grid: torch.Tensor, runs: _Runs, error: _RunErrors) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-VL / GLM-4V: each video ``(t, h, w)`` becomes t frames ``(1, h, w)``; returns (frames, video of frame)."""
    frames_per_video = video_grid[:, 0]
    empty = frames_per_video < 1
    if bool(empty.any()):
        video = int(empty.nonzero()[0, 0])
        first_frame = int(frames_per_video[:video].sum())
        video_runs = (runs.kind == VIDEO_TOKEN).nonzero()[:, 0]
        message = f"video_grid_thw[{video}] = {video_grid[video].tolist()} has no frames"
        if first_frame < video_runs.numel():
            raise error(int(video_runs[first_frame]), message)
        raise InvalidInput(message, field=f"video_grid_thw[{video}]")
    video_of_frame = torch.repeat_interleave(frames_per_video)
    frames = video_grid.index_select(0, video_of_frame)
    frames[:, 0] = 1
    return frames, video_of_frame


def _seconds_per_grid(
    second_per_grid_ts: FloatsLike | None, num_videos: int, device: torch.device
) -> torch.Tensor | None:
    """``[num_videos]`` float seconds per temporal patch; float32 unless given as a float64 tensor."""
    if second_per_grid_ts is None:
        return None
    if isinstance(second_per_grid_ts, torch.Tensor):
        dtype = second_per_grid_ts.dtype if second_per_grid_ts.is_floating_point() else torch.float32
        seconds = second_per_grid_ts.to(device=device, dtype=dtype).reshape(-1)
    else:
        try:
            seconds = torch.as_tensor(second_per_grid_ts, dtype=torch.float32, device=device).reshape(-1)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise InvalidInput(
                f"second_per_grid_ts must be a list of numbers: {exc}", field="second_per_grid_ts"
            ) from exc
    if seconds.numel() != num_videos:
        raise InvalidInput(
            f"second_per_grid_ts has {seconds.numel()} values for {num_videos} videos", field="second_per_grid_ts"
        )
    bad = ~torch.isfinite(seconds) | (seconds < 0)
    if bool(bad.any()):
        video = int(bad.nonzero()[0, 0])
        raise InvalidInput(
            f"second_per_grid_ts[{video}] is {float(seconds[video])}; it must be finite and >= 0",
            field=f"second_per_grid_ts[{video}]",
        )
    return seconds


def _merge_grids(
    grids: torch.Tensor, grid_runs: torch.Tensor, merge: int, error: _RunErrors, grid_name: _GridNames
) -> torch.Tensor:
    """``[n, 3]`` patch grids -> merged ``(t, h / merge, w / merge)``; raises for the first empty or ragged grid,
    naming the run it was assigned to (``grid_runs[i]``)."""
    if grids.numel() == 0:
        return grids
    spatial = grids[:, 1:]
    if int(grids.min()) >= 1 and int((spatial % merge).max()) == 0:
        merged = grids.clone()
        merged[:, 1:] //= merge
        return merged
    bad = (grids < 1).any(dim=1) | (spatial % merge != 0).any(dim=1)
    index = int(bad.nonzero()[0, 0])
    grid_text = grids[index].tolist()
    problem = (
        "has a zero or negative size"
        if min(grid_text) < 1
        else f"h and w must be multiples of spatial_merge_size {merge}"
    )
    raise error(int(grid_runs[index]), f"{grid_name(index)} = {grid_text}: {problem}")


@dataclass(frozen=True)
class _GridNames:
    """Names vision grid ``i`` (images first, then videos or video frames) for error messages."""

    num_images: int
    video_of_grid: torch.Tensor | None

    def __call__(self, index: int) -> str:
        if index < self.num_images:
            return f"image_grid_thw[{index}]"
        video = index - self.num_images
        if self.video_of_grid is None:
            return f"video_grid_thw[{video}]"
        return f"video_grid_thw[{int(self.video_of_grid[video])}] (frame {video})"


def _check_token_counts(thw: torch.Tensor, runs: _Runs, merge: int, error: _RunErrors) -> None:
    """Every run must hold ``t * h * w`` tokens of its merged grid (true by construction for text and padding)."""
    needed = thw.prod(dim=1, dtype=torch.float64)  # no overflow, and exact whenever it could equal a token count
    mismatch = needed != runs.length
    if bool(mismatch.any()):
        run = int(mismatch.nonzero()[0, 0])
        t, h, w = thw[run].tolist()
        raise error(
            run,
            f"{int(runs.length[run])} tokens but grid {[t, h * merge, w * merge]} with spatial_merge_size {merge} "
            f"needs {t * h * w}",
        )


def _time_steps(
    runs: _Runs,
    video_runs: torch.Tensor,
    video_of_grid: torch.Tensor | None,
    seconds: torch.Tensor | None,
    tokens_per_second: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Qwen2.5-VL: ``[G]`` T step per frame (``tokens_per_second * second_per_grid_t`` for videos, 1 otherwise)
    and ``[G]`` seconds of each run when given."""
    dtype = torch.float32 if seconds is None else seconds.dtype
    steps = torch.ones(runs.kind.numel(), dtype=dtype, device=runs.kind.device)
    if seconds is None:
        steps[video_runs] = tokens_per_second
        return steps, None
    video_seconds = seconds if video_of_grid is None else seconds.index_select(0, video_of_grid)
    steps[video_runs] = video_seconds * tokens_per_second
    run_seconds = torch.zeros_like(steps)
    run_seconds[video_runs] = video_seconds
    return steps, run_seconds


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
    types = _token_types(
        mm_token_type_ids,
        input_ids,
        family.image_token_id if image_token_id is None else image_token_id,
        family.video_token_id if video_token_id is None else video_token_id,
    )
    device = types.device
    mask, row_lengths = _mask_and_lengths(attention_mask, types)
    has_padding = int(row_lengths.sum()) != types.numel()
    runs = _find_runs(types, mask if has_padding else None)
    error = _RunErrors(runs)

    image_grid = _grid_tensor(image_grid_thw, "image_grid_thw", device)
    video_grid = _grid_tensor(video_grid_thw, "video_grid_thw", device)
    num_videos = video_grid.shape[0]
    video_of_grid = None
    if rule.splits_video_frames:
        video_grid, video_of_grid = _split_video_frames(video_grid, runs, error)
    image_runs = _assign_grids(runs, IMAGE_TOKEN, image_grid, None, "image_grid_thw", error)
    video_unit = "frames" if rule.splits_video_frames else "rows"
    video_runs = _assign_grids(runs, VIDEO_TOKEN, video_grid, video_of_grid, "video_grid_thw", error, video_unit)

    merge = settings.spatial_merge_size
    vision_runs = torch.cat([image_runs, video_runs])
    merged = _merge_grids(
        torch.cat([image_grid, video_grid]),
        vision_runs,
        merge,
        error,
        _GridNames(image_grid.shape[0], video_of_grid),
    )
    thw = torch.ones((runs.length.numel(), 3), dtype=torch.long, device=device)
    thw[:, 2] = runs.length
    thw.index_copy_(0, vision_runs, merged)
    _check_token_counts(thw, runs, merge, error)

    time_step, run_seconds = None, None
    if rule.scales_by_seconds:
        seconds = _seconds_per_grid(second_per_grid_ts, num_videos, device)
        assert settings.tokens_per_second is not None
        time_step, run_seconds = _time_steps(runs, video_runs, video_of_grid, seconds, settings.tokens_per_second)
    blocks = Blocks(row=runs.row, kind=runs.kind, thw=thw, time_step=time_step, has_padding=has_padding)
    return TokenBlocks(blocks, mask, row_lengths, merge, run_seconds)


def _mask_and_lengths(attention_mask: IntsLike | None, types: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, L]`` bool mask (all True when None) and ``[B]`` real tokens per row."""
    num_rows, width = types.shape
    if attention_mask is None:
        mask = torch.ones(types.shape, dtype=torch.bool, device=types.device)
        return mask, torch.full((num_rows,), width, dtype=torch.long, device=types.device)
    mask, row_lengths = as_mask_and_lengths(attention_mask, "attention_mask", device=types.device)
    if mask.shape != types.shape:
        raise InvalidInput(
            f"attention_mask has shape {tuple(mask.shape)} but the tokens have {tuple(types.shape)}",
            field="attention_mask",
        )
    return mask, row_lengths


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
            families; missing = 1.0 per video). float32 unless given as a float64 tensor, like the processor's.
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
    with torch.inference_mode():  # see PositionPlan
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
            analysis.blocks, analysis.row_lengths, analysis.mask.shape[1], settings.compat, fill_value
        )
    position_ids, deltas = plan.expand()
    return MRopePositions(position_ids, deltas, analysis.mask.clone())


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
    decoding. Deltas may be ``[B, 1]``, ``[B]`` or one int.
    """
    count = require_int(num_new, "num_new", minimum=1)
    if isinstance(mrope_position_deltas, int):
        deltas = torch.tensor([mrope_position_deltas], dtype=torch.long)
    else:
        deltas = as_long_tensor(mrope_position_deltas, "mrope_position_deltas").reshape(-1)
    cache = per_row_values(cache_lengths, deltas.numel(), "cache_lengths", device=deltas.device)
    check_element_limit(3 * deltas.numel() * count, None, "decode positions", field="num_new")
    first = cache + deltas
    negative = first < 0
    if bool(negative.any()):
        row = int(negative.nonzero()[0, 0])
        raise InvalidInput(
            f"row {row}: cache length {int(cache[row])} plus delta {int(deltas[row])} gives a negative position; "
            "the cache length must count the whole prompt",
            field=f"rows[{row}]",
        )
    positions = first[:, None] + torch.arange(count, device=deltas.device)
    return positions.unsqueeze(0).expand(3, -1, -1).contiguous()


def slice_prefill_positions(position_ids: torch.Tensor, context_len: int, seq_len: int) -> torch.Tensor:
    """Chunked prefill: columns ``[context_len:seq_len]`` of a full prompt's positions.

    ``position_ids`` is ``[3, T]`` (one unpadded sequence, as vLLM holds it) or ``[3, B, T]``; the result keeps
    the leading dimensions. Positions must always come from the *full* prompt: a chunk's own positions (and its
    delta) differ from the slice when an image straddles the chunk boundary.
    """
    if not isinstance(position_ids, torch.Tensor) or position_ids.dim() not in (2, 3) or position_ids.shape[0] != 3:
        shape = tuple(position_ids.shape) if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise InvalidInput(f"position_ids must be [3, T] or [3, B, T], got {shape}", field="position_ids")
    total = position_ids.shape[-1]
    start = require_int(context_len, "context_len", minimum=0)
    end = require_int(seq_len, "seq_len", minimum=start)
    if end > total:
        raise InvalidInput(f"seq_len {end} exceeds the prompt length {total}", field="seq_len")
    return position_ids[..., start:end]
