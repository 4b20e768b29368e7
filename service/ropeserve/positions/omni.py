"""Qwen2.5-Omni and Qwen3-Omni M-RoPE positions: text, images, videos, audio, and audio interleaved with its video.

Reproduces transformers 5.24 ``Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index`` (every compat
choice gives the same ids: the Omni function is its own reference). Each block starts at the largest position of the
piece before it + 1; audio and text advance by 1 per token on all three axes; an image's frame ``k`` has
``T = start + k * position_id_per_seconds``, a video's ``T = start + floor(fp32(fp32(k * s) * pps))``
(``s = second_per_grid_t``, ``pps = position_id_per_seconds``), both passed through float32 as transformers does.

Audio in video (``use_audio_in_video``): ``<vision_bos><audio_bos>`` both at the start position ``p``; from ``p + 1``
the video's tokens (with their times) and the audio's (``p + 1 + a``) are cut into chunks of
``int(pps * seconds_per_chunk)`` position steps, as transformers' ``get_chunked_index`` cuts them (a new video chunk
at most once per token), and emitted video chunk 0, audio chunk 0, video chunk 1, ...; the two closing tokens sit at
the largest position of the last chunk + 1.

Qwen3-Omni (``Qwen3OmniMoePreTrainedModelForConditionalGeneration.get_rope_index``) keeps its positions in float32:
``T = start + k * s * pps`` is not truncated, every block starts at the previous piece's largest position + 1 (even
when fractional), markers advance like text, and a video's tokens merge with its audio's by position (video first on
ties) instead of by chunks; padded slots are 0 and the deltas float32.

Segment form: ``{"text": n}``, ``{"image": [t, h, w]}``, ``{"video": [t, h, w], "second_per_grid_t": s}``,
``{"audio": n}`` (``n`` audio tokens; the start/end markers around them are text), and
``{"video": [t, h, w], "second_per_grid_t": s, "audio": n}``: a video with its audio, *including* its two opening and
two closing markers (``4 + video tokens + n`` tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np
import torch

from ropeserve.errors import InvalidInput
from ropeserve.positions._common import (
    MAX_ELEMENTS,
    IntsLike,
    as_long_array,
    check_element_limit,
    require_finite_float,
    require_int,
)
from ropeserve.positions.mrope import FloatsLike, MRopePositions, mask_and_lengths

__all__ = [
    "OMNI_FAMILIES",
    "OmniFamily",
    "omni_audio_tokens",
    "omni_positions_from_segments",
    "omni_positions_from_tokens",
]

MAX_TIME_OFFSET = 2**31 - 1
"""Largest temporal offset a video or image frame may get (the positions must stay far inside int64 and float32's
exact integers are what transformers keeps anyway)."""


@dataclass(frozen=True)
class OmniFamily:
    """Defaults of an Omni model (transformers config class defaults)."""

    name: str
    spatial_merge_size: int
    position_id_per_seconds: int
    seconds_per_chunk: int
    image_token_id: int
    video_token_id: int
    audio_token_id: int
    fill_value: int
    """Padded slots: Qwen2.5-Omni's ``get_rope_index`` starts from ``torch.ones`` (1), Qwen3-Omni's from zeros."""
    audio_window: int | None = None
    """Qwen3-Omni: the audio encoder's ``n_window`` (its token count formula); None: Qwen2.5-Omni's formula."""


OMNI_FAMILIES: dict[str, OmniFamily] = {
    "qwen2_5_omni": OmniFamily("qwen2_5_omni", 2, 25, 2, 151655, 151656, 151646, 1),
    "qwen3_omni_moe": OmniFamily("qwen3_omni_moe", 2, 25, 2, 151655, 151656, 151646, 0, audio_window=50),
}


def omni_audio_tokens(seqlen: int, audio_window: int | None = None) -> int:
    """Audio tokens of ``seqlen`` input feature frames: Qwen2.5-Omni ``((seqlen - 1) // 2 + 1 - 2) // 2 + 1``;
    Qwen3-Omni (``audio_window`` = its ``n_window``) the same three halvings per ``2 * n_window`` chunk, 13 tokens
    for each whole chunk."""
    if audio_window is None:
        return ((seqlen - 1) // 2 + 1 - 2) // 2 + 1
    chunk = audio_window * 2
    feat = (seqlen % chunk - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (seqlen // chunk) * 13


@dataclass(frozen=True)
class _Settings:
    merge: int
    pps: int | float
    chunk: int


def _settings(
    family: str, merge: int | None, pps: float | None, seconds_per_chunk: float | None
) -> tuple[OmniFamily, _Settings]:
    if family not in OMNI_FAMILIES:
        raise InvalidInput(f"unknown Omni family {family!r}; known: {', '.join(OMNI_FAMILIES)}", field="family")
    spec = OMNI_FAMILIES[family]
    merge = require_int(spec.spatial_merge_size if merge is None else merge, "spatial_merge_size", minimum=1)
    if pps is None:
        pps = spec.position_id_per_seconds
    else:
        pps = require_finite_float(pps, "position_id_per_seconds", minimum=0)
        pps = int(pps) if pps.is_integer() and pps <= MAX_TIME_OFFSET else pps  # config values are ints
    chunk_seconds = spec.seconds_per_chunk if seconds_per_chunk is None else seconds_per_chunk
    chunk_seconds = require_finite_float(chunk_seconds, "seconds_per_chunk", minimum=0)
    if pps > MAX_TIME_OFFSET or chunk_seconds > MAX_TIME_OFFSET:
        raise InvalidInput("position_id_per_seconds and seconds_per_chunk must be <= 2**31 - 1", field="family")
    chunk = int(pps * chunk_seconds)
    if chunk < 1:
        raise InvalidInput(
            f"position_id_per_seconds × seconds_per_chunk = {pps * chunk_seconds} gives chunks of {chunk} positions; "
            "it must be at least 1",
            field="seconds_per_chunk",
        )
    return spec, _Settings(merge, pps, chunk)


# ------------------------------------------------------------------------------------------------ per-row layout
def _frame_times(frames: int, step: torch.Tensor | None, pps: int | float, field: str) -> np.ndarray:
    """``[frames]`` int64 T offsets: images ``arange * 1 * pps`` (step None), videos ``arange * s * pps`` in float32;
    then the float32 round trip of ``get_llm_pos_ids_for_vision``."""
    ks = torch.arange(frames)
    times = (ks * 1 * pps) if step is None else (ks * step * pps)
    if not bool(torch.isfinite(times).all()) or float(times.max()) > MAX_TIME_OFFSET:
        raise InvalidInput(
            f"{field}: a frame's temporal offset exceeds {MAX_TIME_OFFSET} (or is not finite)", field=field
        )
    return torch.Tensor(times.long().tolist()).long().numpy()


def _vision(start: int, times: np.ndarray, h: int, w: int) -> np.ndarray:
    """``[3, t*h*w]`` positions of a vision block whose frames have T offsets ``times``."""
    t = times.size
    out = np.empty((3, t, h, w), dtype=np.int64)
    out[0] = times[:, None, None]
    out[1] = np.arange(h)[None, :, None]
    out[2] = np.arange(w)[None, None, :]
    return out.reshape(3, -1) + start


def _video_chunks(times: np.ndarray, per_frame: int, chunk: int) -> np.ndarray:
    """``[V]`` chunk index of each video token, as ``get_chunked_index`` assigns them (at most one new chunk per
    token): ``count_i = min(count_{i-1} + 1, T_i // chunk)``, solved as a running minimum."""
    reached = np.repeat(times // chunk, per_frame)
    index = np.arange(reached.size)
    return index + np.minimum(1, np.minimum.accumulate(reached - index))


def _audio_in_video(start: int, times: np.ndarray, h: int, w: int, audio: int, chunk: int) -> list[np.ndarray]:
    """Pieces of a video with its audio: 2 opening markers, the interleaved chunks, 2 closing markers."""
    inner = start + 1
    video = _vision(inner, times, h, w)
    video_chunk = _video_chunks(times, h * w, chunk)
    audio_chunk = np.arange(audio) // chunk
    key = np.concatenate([2 * video_chunk, 2 * audio_chunk + 1])
    order = np.argsort(key, kind="stable")
    audio_positions = np.broadcast_to(inner + np.arange(audio), (3, audio))
    body = np.concatenate([video, audio_positions], axis=1)[:, order]
    video_chunks, audio_chunks = int(video_chunk[-1]) + 1, int(audio_chunk[-1]) + 1
    last = max(video_chunks, audio_chunks) - 1
    # the last piece appended is audio chunk `last` (its last token) when there is one, else video chunk `last`
    last_max = inner + audio - 1 if last < audio_chunks else int(video[:, video_chunk == last].max())
    return [np.full((3, 2), start, dtype=np.int64), body, np.full((3, 2), last_max + 1, dtype=np.int64)]


@dataclass
class _Row:
    pieces: list[np.ndarray]
    next_start: int = 0
    tokens: int = 0

    def add(self, piece: np.ndarray, next_start: int) -> None:
        self.pieces.append(piece)
        self.next_start = next_start
        self.tokens += piece.shape[1]


def _grid(value: object, field: str, merge: int, kind: str) -> tuple[int, int, int]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 3:
        raise InvalidInput(f"{field}: {kind} must be a list [t, h, w], got {value!r}", field=field)
    t, h, w = (require_int(size, field) for size in value)
    if min(t, h, w) < 1:
        raise InvalidInput(f"{field}: {kind} grid {[t, h, w]} has a zero or negative size", field=field)
    if h % merge or w % merge:
        raise InvalidInput(
            f"{field}: {kind} grid {[t, h, w]}: h and w must be multiples of spatial_merge_size {merge}", field=field
        )
    return t, h // merge, w // merge


def _count(value: object, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{field}: expected an integer >= {minimum}, got {value!r}", field=field)
    return value


_KEYS = {"text", "image", "video", "audio", "second_per_grid_t"}


def _add_segment(row: _Row, segment: Mapping[str, object], field: str, settings: _Settings, limit: int) -> None:
    if not isinstance(segment, Mapping) or not segment or set(segment) - _KEYS:
        raise InvalidInput(f"{field} must be an object with text, image, video and/or audio", field=field)
    start = row.next_start
    kinds = {key for key in ("text", "image", "video", "audio") if key in segment}
    if kinds == {"text"} and len(segment) == 1:
        count = _count(segment["text"], field, 0)
        if count:
            _reserve(row, count, limit, field)
            row.add(np.broadcast_to(start + np.arange(count), (3, count)), start + count)
        return
    if kinds == {"audio"} and len(segment) == 1:
        count = _count(segment["audio"], field, 1)
        _reserve(row, count, limit, field)
        row.add(np.broadcast_to(start + np.arange(count), (3, count)), start + count)
        return
    if kinds == {"image"} and len(segment) == 1:
        t, h, w = _grid(segment["image"], field, settings.merge, "image")
        _reserve(row, t * h * w, limit, field)
        piece = _vision(start, _frame_times(t, None, settings.pps, field), h, w)
        row.add(piece, int(piece.max()) + 1)
        return
    if "video" in kinds and not kinds & {"text", "image"}:
        t, h, w = _grid(segment["video"], field, settings.merge, "video")
        seconds = segment.get("second_per_grid_t", 1.0)
        seconds = require_finite_float(seconds, field, minimum=0.0)
        _reserve(row, t * h * w, limit, field)
        times = _frame_times(t, torch.tensor(seconds, dtype=torch.float32), settings.pps, field)
        if "audio" not in segment:
            piece = _vision(start, times, h, w)
            row.add(piece, int(piece.max()) + 1)
            return
        audio = _count(segment["audio"], field, 1)
        _reserve(row, audio + 4, limit, field)
        for piece in _audio_in_video(start, times, h, w, audio, settings.chunk):
            row.add(piece, int(piece[0, -1]) + 1)
        return
    raise InvalidInput(f"{field}: unexpected combination of keys {sorted(segment)}", field=field)


def _reserve(row: _Row, tokens: int, limit: int, field: str) -> None:
    check_element_limit(row.tokens + tokens, limit, "tokens of a row", field=field)


def _layout_rows(rows: object, settings: _Settings, limit: int) -> list[np.ndarray]:
    """``[3, n_b]`` positions of each row's real tokens."""
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence):
        raise InvalidInput("rows must be a list of segment lists", field="rows")
    out = []
    for b, segments in enumerate(rows):
        if isinstance(segments, str | bytes | Mapping) or not isinstance(segments, Sequence):
            raise InvalidInput(f"rows[{b}] must be a list of segments", field=f"rows[{b}]")
        row = _Row([])
        for i, segment in enumerate(segments):
            _add_segment(row, segment, f"rows[{b}].segments[{i}]", settings, limit)
        out.append(np.concatenate(row.pieces, axis=1) if row.pieces else np.zeros((3, 0), dtype=np.int64))
    return out


# ------------------------------------------------------------------------------------------------ Qwen3-Omni
_Qwen3Block = (
    tuple[Literal["audio"], int]
    | tuple[Literal["image"], int, int, int]
    | tuple[Literal["video"], int, int, int, float]
    | tuple[Literal["av"], int, int, int, float, int]
)
"""A non-text block of a Qwen3-Omni row (merged sizes): audio length, image ``t, h, w``, video
``t, h, w, second_per_grid_t``, or a video with its audio ``t, h, w, second_per_grid_t, audio length``."""
_Qwen3Item = tuple[Literal["text"], int] | _Qwen3Block
"""One validated segment of a Qwen3-Omni row: a text length or a block."""


def _qwen3_items(segments: object, b: int, settings: _Settings, limit: int) -> list[_Qwen3Item]:
    """Validated segments of one row as ``("text", n)``, ``("image", t, h, w)``, ``("video", t, h, w, s)``,
    ``("audio", n)`` or ``("av", t, h, w, s, n)`` (merged sizes); token count checked against ``limit``."""
    if isinstance(segments, str | bytes | Mapping) or not isinstance(segments, Sequence):
        raise InvalidInput(f"rows[{b}] must be a list of segments", field=f"rows[{b}]")
    items: list[_Qwen3Item] = []
    tokens = 0
    for i, segment in enumerate(segments):
        field = f"rows[{b}].segments[{i}]"
        if not isinstance(segment, Mapping) or not segment or set(segment) - _KEYS:
            raise InvalidInput(f"{field} must be an object with text, image, video and/or audio", field=field)
        keys = set(segment) - {"second_per_grid_t"}
        if keys == {"text"} and len(segment) == 1:
            item: _Qwen3Item = ("text", _count(segment["text"], field, 0))
            size = item[1]
        elif keys == {"audio"} and len(segment) == 1:
            item = ("audio", _count(segment["audio"], field, 1))
            size = item[1]
        elif keys == {"image"} and len(segment) == 1:
            t, h, w = _grid(segment["image"], field, settings.merge, "image")
            item, size = ("image", t, h, w), t * h * w
        elif keys in ({"video"}, {"video", "audio"}):
            grid = _grid(segment["video"], field, settings.merge, "video")
            seconds = require_finite_float(segment.get("second_per_grid_t", 1.0), field, minimum=0.0)
            _frame_times(grid[0], torch.tensor(seconds, dtype=torch.float32), settings.pps, field)  # range check
            size = grid[0] * grid[1] * grid[2]
            if "audio" in segment:
                audio = _count(segment["audio"], field, 1)
                item, size = ("av", *grid, seconds, audio), size + audio + 4
            else:
                item = ("video", *grid, seconds)
        else:
            raise InvalidInput(f"{field}: unexpected combination of keys {sorted(segment)}", field=field)
        tokens += size
        check_element_limit(tokens, limit, "tokens of a row", field=field)
        items.append(item)
    return items


Start = int | torch.Tensor
"""A block's start as transformers holds it: 0 (a Python int) or a 0-d int64/float32 tensor."""


def _qwen3_vision(start: Start, t: int, h: int, w: int, times: torch.Tensor) -> torch.Tensor:
    """``get_llm_pos_ids_for_vision``: float32 T/H/W of a vision block, plus ``start``."""
    h_index = torch.arange(h).view(1, -1, 1).expand(t, -1, w).flatten().float()
    w_index = torch.arange(w).view(1, 1, -1).expand(t, h, -1).flatten().float()
    t_index = torch.Tensor(times).view(-1, 1).expand(-1, h * w).flatten().float()
    return torch.stack([t_index, h_index, w_index]) + start


def _arange_from(count: int, start: Start) -> torch.Tensor:
    return torch.arange(count).view(1, -1).expand(3, -1) + start


def _qwen3_block(pieces: list[torch.Tensor], item: _Qwen3Block, start: Start, pps: int | float) -> None:
    """Append the pieces of one image / video / audio / audio-in-video block starting at ``start``."""
    if item[0] == "audio":
        pieces.append(_arange_from(item[1], start))
        return
    t, h, w = item[1:4]
    if item[0] == "image":
        pieces.append(_qwen3_vision(start, t, h, w, (torch.arange(t) * 1 * pps).float()))
        return
    times = (torch.arange(t) * torch.tensor(item[4], dtype=torch.float32) * pps).float()
    video = _qwen3_vision(start, t, h, w, times)
    if item[0] == "video":
        pieces.append(video)
        return
    audio = _arange_from(item[5], start)
    # transformers merges one token at a time, video first on ties: a stable sort of the two T rows in float32
    keys = torch.cat([video[0], audio[0].float()])
    order = torch.sort(keys, stable=True).indices
    merged = torch.cat([video, audio.float()], dim=1)[:, order]
    from_video = order < video.shape[1]
    # the loop stops once one side is used up; the other side's rest is appended as one piece (the last one)
    stop = min(int(from_video.nonzero().max()), int((~from_video).nonzero().max()))
    pieces.append(merged[:, : stop + 1])
    if stop + 1 < merged.shape[1]:
        rest = merged[:, stop + 1 :]
        pieces.append(rest if bool(from_video[stop + 1]) else rest.to(audio.dtype))
    else:  # the last token appended alone keeps its own dtype
        last = merged[:, stop:]
        pieces[-1] = merged[:, :stop]
        pieces.append(last if bool(from_video[stop]) else last.to(audio.dtype))


def _qwen3_row(items: list[_Qwen3Item], settings: _Settings, b: int) -> torch.Tensor:
    """``[3, n]`` float32 positions of one row, in transformers' order of float operations."""
    pieces: list[torch.Tensor] = []
    pending, eos_in_text = 0, 0
    for item in items:
        if item[0] == "text":
            pending += item[1]
            continue
        compound = item[0] == "av"
        prefix = pending - eos_in_text - (0 if compound else 1)
        if prefix < 0:
            raise InvalidInput(
                f"rows[{b}]: a block needs its start marker (and the block before it its end marker) as text",
                field=f"rows[{b}]",
            )
        start = pieces[-1].max() + 1 if pieces else 0
        if prefix:
            pieces.append(_arange_from(prefix, start))
            start = start + prefix
        markers = 2 if compound else 1
        pieces.append(_arange_from(markers, start))
        _qwen3_block(pieces, item, start + markers, settings.pps)
        pieces.append(_arange_from(markers, pieces[-1].max() + 1))
        pending, eos_in_text = 0, (0 if compound else 1)
    tail = pending - eos_in_text
    if tail < 0:
        raise InvalidInput(f"rows[{b}]: the last block needs its end marker as text", field=f"rows[{b}]")
    if tail:
        pieces.append(_arange_from(tail, pieces[-1].max() + 1 if pieces else 0))
    return torch.cat([piece.float() for piece in pieces], dim=1) if pieces else torch.zeros((3, 0))


def _qwen3_assemble(rows: list[torch.Tensor], mask: np.ndarray, fill_value: float) -> MRopePositions:
    """Qwen3-Omni's float32 ``[3, B, L]`` (padded slots ``fill_value``) and float32 deltas."""
    mask_t = torch.from_numpy(mask)
    positions = torch.full((3, *mask.shape), float(fill_value), dtype=torch.float32)
    deltas = torch.zeros((mask.shape[0], 1), dtype=torch.float32)
    for b, row in enumerate(rows):
        positions[:, b, mask_t[b]] = row
        if row.shape[1]:
            deltas[b, 0] = row.max() + 1 - row.shape[1]
    return MRopePositions(positions, deltas, mask_t)


def _layout_qwen3(rows: object, settings: _Settings, limit: int) -> list[torch.Tensor]:
    if isinstance(rows, str | bytes) or not isinstance(rows, Sequence):
        raise InvalidInput("rows must be a list of segment lists", field="rows")
    return [_qwen3_row(_qwen3_items(segments, b, settings, limit), settings, b) for b, segments in enumerate(rows)]


def _assemble(rows: list[np.ndarray], mask: np.ndarray, fill_value: int) -> MRopePositions:
    """Scatter each row's positions into the real slots of a ``[3, B, L]`` tensor filled with ``fill_value``."""
    num_rows, width = mask.shape
    positions = np.full((3, num_rows, width), fill_value, dtype=np.int64)
    deltas = np.zeros((num_rows, 1), dtype=np.int64)
    for b, row in enumerate(rows):
        positions[:, b, mask[b]] = row
        if row.shape[1]:
            deltas[b, 0] = int(row.max()) + 1 - row.shape[1]
    return MRopePositions(torch.from_numpy(positions), torch.from_numpy(deltas), torch.from_numpy(mask))


def omni_positions_from_segments(
    rows: Sequence[Sequence[Mapping[str, object]]],
    *,
    family: str = "qwen2_5_omni",
    spatial_merge_size: int | None = None,
    position_id_per_seconds: float | None = None,
    seconds_per_chunk: float | None = None,
    padding_side: str = "right",
    fill_value: int | None = None,
    max_tokens: int | None = None,
) -> MRopePositions:
    """Prefill positions of Omni rows given as segment lists (see the module docstring); rows pad to the longest on
    ``padding_side`` with ``fill_value`` (default: the family's, 1 for Qwen2.5-Omni, as transformers)."""
    if padding_side not in ("left", "right"):
        raise InvalidInput(f"padding_side must be 'left' or 'right', got {padding_side!r}", field="padding_side")
    spec, settings = _settings(family, spatial_merge_size, position_id_per_seconds, seconds_per_chunk)
    limit = MAX_ELEMENTS if max_tokens is None else min(max_tokens, MAX_ELEMENTS)
    layout, assemble = LAYOUTS[spec.name]
    laid_out = layout(rows, settings, limit)
    lengths = np.array([row.shape[1] for row in laid_out], dtype=np.int64)
    width = int(lengths.max(initial=0))
    check_element_limit(len(laid_out) * width, max_tokens, "M-RoPE position slots", "rows")
    columns = np.arange(width)[None, :]
    mask = columns >= width - lengths[:, None] if padding_side == "left" else columns < lengths[:, None]
    return assemble(laid_out, mask, spec.fill_value if fill_value is None else fill_value)


LAYOUTS: dict[str, tuple[Callable[..., list[np.ndarray] | list[torch.Tensor]], Callable[..., MRopePositions]]] = {
    "qwen2_5_omni": (_layout_rows, _assemble),
    "qwen3_omni_moe": (_layout_qwen3, _qwen3_assemble),
}
"""Omni family -> (rows -> per-row positions, assembly into the padded batch)."""


# ------------------------------------------------------------------------------------------------ token form
_IMAGE, _VIDEO, _AUDIO = 1, 2, 3


def _runs(kinds: np.ndarray) -> list[tuple[int, int, int]]:
    """``(kind, first, end)`` of each maximal run of non-text tokens."""
    change = np.flatnonzero(np.diff(kinds)) + 1
    bounds = np.concatenate([[0], change, [kinds.size]])
    return [(int(kinds[a]), int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if kinds[a]]


_T = TypeVar("_T")
_Segment = dict[str, int | float | list[int]]
"""A segment as ``mrope_positions_from_segments`` takes it: ``{"text": n}``, ``{"image": grid}``, ..."""


@dataclass
class _Inputs:
    images: list[list[int]]
    videos: list[list[int]]
    seconds: list[float]
    audio_tokens: list[int]
    used: list[int]  # images, videos, audios consumed so far


def _take(items: list[_T], used: list[int], slot: int, name: str, field: str) -> _T:
    if used[slot] >= len(items):
        raise InvalidInput(f"{field}: more {name} runs than entries in {name}", field=field)
    used[slot] += 1
    return items[used[slot] - 1]


def _row_segments(kinds: np.ndarray, inputs: _Inputs, use_audio_in_video: bool, merge: int, row: int) -> list[_Segment]:
    """Segments of one row's real tokens, validating run lengths against grids and audio lengths."""
    segments: list[_Segment] = []
    position = 0
    runs = _runs(kinds)
    index = 0
    while index < len(runs):
        kind, first, end = runs[index]
        field = f"rows[{row}].segments[{len(segments) + 1}]"  # after the text segment before it
        if kind == _IMAGE or (kind == _VIDEO and not use_audio_in_video):
            name = "image_grid_thw" if kind == _IMAGE else "video_grid_thw"
            grid = _take(inputs.images if kind == _IMAGE else inputs.videos, inputs.used, kind - 1, name, field)
            needed = grid[0] * (grid[1] // merge) * (grid[2] // merge)
            if end - first != needed:
                raise InvalidInput(f"{field}: {end - first} tokens but {name} {grid} needs {needed}", field=field)
            segments.append({"text": first - position})
            segment: _Segment = {"image" if kind == _IMAGE else "video": grid}
            if kind == _VIDEO:
                segment["second_per_grid_t"] = inputs.seconds[inputs.used[1] - 1]
            segments.append(segment)
            position, index = end, index + 1
        elif kind == _AUDIO:
            count = _take(inputs.audio_tokens, inputs.used, 2, "audio_seqlens", field)
            if end - first != count:
                raise InvalidInput(f"{field}: {end - first} audio tokens but audio_seqlens gives {count}", field=field)
            segments += [{"text": first - position}, {"audio": count}]
            position, index = end, index + 1
        else:  # a video with its audio interleaved
            grid = _take(inputs.videos, inputs.used, 1, "video_grid_thw", field)
            count = _take(inputs.audio_tokens, inputs.used, 2, "audio_seqlens", field)
            span_end = first + grid[0] * (grid[1] // merge) * (grid[2] // merge) + count
            inside = kinds[first:span_end]
            if (
                first - 2 < position
                or span_end + 2 > kinds.size
                or int((inside == _VIDEO).sum()) + int((inside == _AUDIO).sum()) != span_end - first
                or kinds[span_end : span_end + 2].any()
            ):
                raise InvalidInput(
                    f"{field}: a video with its audio needs 2 text markers, {span_end - first} video and audio "
                    "tokens, and 2 text markers",
                    field=field,
                )
            segments += [
                {"text": first - 2 - position},
                {"video": grid, "second_per_grid_t": inputs.seconds[inputs.used[1] - 1], "audio": count},
            ]
            position = span_end + 2
            while index < len(runs) and runs[index][1] < span_end:
                index += 1
    segments.append({"text": kinds.size - position})
    return segments


def omni_positions_from_tokens(
    *,
    input_ids: IntsLike,
    image_grid_thw: IntsLike | None = None,
    video_grid_thw: IntsLike | None = None,
    second_per_grid_ts: FloatsLike | None = None,
    audio_seqlens: IntsLike | None = None,
    attention_mask: IntsLike | None = None,
    use_audio_in_video: bool = False,
    family: str = "qwen2_5_omni",
    image_token_id: int | None = None,
    video_token_id: int | None = None,
    audio_token_id: int | None = None,
    spatial_merge_size: int | None = None,
    position_id_per_seconds: float | None = None,
    seconds_per_chunk: float | None = None,
    fill_value: int | None = None,
) -> MRopePositions:
    """Prefill positions from what the Omni processor returns (``get_rope_index``'s inputs): ``input_ids`` ``[B, L]``,
    grids in batch order, ``second_per_grid_ts`` ``[N_vid]`` (default 1.0), ``audio_seqlens`` ``[N_audio]`` (input
    feature frames; :func:`omni_audio_tokens` gives the tokens), ``use_audio_in_video``."""
    spec, settings = _settings(family, spatial_merge_size, position_id_per_seconds, seconds_per_chunk)
    if not isinstance(use_audio_in_video, bool):
        raise InvalidInput("use_audio_in_video must be true or false", field="use_audio_in_video")
    ids = as_long_array(input_ids, "input_ids", ndim=2)
    mask = mask_and_lengths(attention_mask, ids)[0]
    token_ids = [
        (spec.image_token_id if image_token_id is None else image_token_id, _IMAGE),
        (spec.video_token_id if video_token_id is None else video_token_id, _VIDEO),
        (spec.audio_token_id if audio_token_id is None else audio_token_id, _AUDIO),
    ]
    kinds = np.zeros(ids.shape, dtype=np.int64)
    for token, kind in token_ids:
        kinds[ids == token] = kind
    inputs = _inputs(image_grid_thw, video_grid_thw, second_per_grid_ts, audio_seqlens, spec.audio_window)
    rows = [
        _row_segments(kinds[b][mask[b]], inputs, use_audio_in_video, settings.merge, b) for b in range(ids.shape[0])
    ]
    entries: tuple[Sequence[object], ...] = (inputs.images, inputs.videos, inputs.audio_tokens)
    names = ("image_grid_thw", "video_grid_thw", "audio_seqlens")
    for used, items, name in zip(inputs.used, entries, names, strict=True):
        if used != len(items):
            raise InvalidInput(f"{name} has {len(items)} entries but the tokens use {used}", field=name)
    if image_grid_thw is None and video_grid_thw is None:
        return _without_grids(mask, float_positions=spec.audio_window is not None)
    layout, assemble = LAYOUTS[spec.name]
    return assemble(layout(rows, settings, MAX_ELEMENTS), mask, spec.fill_value if fill_value is None else fill_value)


def _without_grids(mask: np.ndarray, *, float_positions: bool) -> MRopePositions:
    """transformers' branch for a batch without image or video grids (text and audio only): ``cumsum(mask) - 1``,
    padded slots 1, deltas from the row maximum padded slots included."""
    mask_t = torch.from_numpy(mask)
    counts = mask_t.sum(dim=-1, keepdim=True)
    positions = (mask_t.float() if float_positions else mask_t.long()).cumsum(-1) - 1
    positions.masked_fill_(~mask_t, 1)
    positions = positions.unsqueeze(0).expand(3, -1, -1).contiguous()
    deltas = positions.max(0)[0].max(-1, keepdim=True)[0] + 1 - counts
    return MRopePositions(positions, deltas, mask_t)


def _inputs(
    image_grid_thw: IntsLike | None,
    video_grid_thw: IntsLike | None,
    second_per_grid_ts: FloatsLike | None,
    audio_seqlens: IntsLike | None,
    audio_window: int | None,
) -> _Inputs:
    images = [] if image_grid_thw is None else as_long_array(image_grid_thw, "image_grid_thw", ndim=2).tolist()
    videos = [] if video_grid_thw is None else as_long_array(video_grid_thw, "video_grid_thw", ndim=2).tolist()
    for name, grids in (("image_grid_thw", images), ("video_grid_thw", videos)):
        if any(len(grid) != 3 for grid in grids):
            raise InvalidInput(f"{name} must be [N, 3]", field=name)
    if second_per_grid_ts is None:
        seconds = [1.0] * len(videos)
    else:
        values = second_per_grid_ts.tolist() if isinstance(second_per_grid_ts, torch.Tensor) else second_per_grid_ts
        seconds = [require_finite_float(v, f"second_per_grid_ts[{i}]", minimum=0.0) for i, v in enumerate(values)]
        if len(seconds) != len(videos):
            raise InvalidInput(
                f"second_per_grid_ts has {len(seconds)} values for {len(videos)} videos", field="second_per_grid_ts"
            )
    lengths = [] if audio_seqlens is None else as_long_array(audio_seqlens, "audio_seqlens").reshape(-1).tolist()
    for i, length in enumerate(lengths):
        if length < 1 or length > MAX_ELEMENTS:
            raise InvalidInput(
                f"audio_seqlens[{i}] is {length}; it must be in [1, {MAX_ELEMENTS}]", field=f"audio_seqlens[{i}]"
            )
    tokens = [omni_audio_tokens(length, audio_window) for length in lengths]
    return _Inputs(images, videos, seconds, tokens, [0, 0, 0])
