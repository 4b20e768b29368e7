"""Qwen2.5-Omni and Qwen3-Omni M-RoPE positions: text, images, videos, audio, and audio interleaved with its video.

Reproduces transformers 5.24 ``Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index`` (every compat
choice gives the same ids: the Omni function is its own reference). Each block starts at the largest position of the
piece before it + 1; audio and text advance by 1 per token on all three axes; an image's frame ``k`` has
``T = start + k * position_id_per_seconds`` (exact in int64; ``floor(fp32(k * pps))`` for a fractional ``pps``), a
video's ``T = start + floor(fp32(fp32(k * s) * pps))`` (``s = second_per_grid_t``, ``pps = position_id_per_seconds``),
as transformers computes them.

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
    padded_mask,
    require_finite_float,
    require_int,
    require_padding_side,
    segment_row,
    segment_rows,
)
from ropeserve.positions._patterns import grid_pattern, pattern, real_runs
from ropeserve.positions.mrope import FloatsLike, MRopePositions, real_mask

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


# ------------------------------------------------------------------------------------------------ row plans
_Write = Callable[[np.ndarray], None]
"""Writes one piece of a row into its ``[3, n]`` slots (a view of the answer, or a scratch row)."""
Start = int | np.float32
"""A position as transformers holds it: an int (int64 arithmetic) or a float32 (Qwen3-Omni, once a vision block has
made the positions float)."""


@dataclass
class _Row:
    """A row laid out but not yet written: its pieces ``(tokens, writer)`` in order, its token count, its largest
    position and, for Qwen2.5-Omni, where its next segment starts."""

    pieces: list[tuple[int, _Write]]
    tokens: int = 0
    maximum: float = -1.0
    next_start: int = 0

    def add(self, tokens: int, write: _Write, maximum: float | np.float32) -> None:
        self.pieces.append((tokens, write))
        self.tokens += tokens
        self.maximum = max(self.maximum, float(maximum))  # as Python floats: exact for both kinds of position


def _arange(row: _Row, count: int, start: Start) -> Start:
    """Append ``arange(count) + start`` on all three axes (in float32 when ``start`` is one); return its last value."""
    values = np.arange(count, dtype=np.float32 if isinstance(start, np.float32) else np.int64)
    last: Start = values[-1] + start if isinstance(start, np.float32) else start + count - 1

    def write(out: np.ndarray) -> None:
        np.add(values, start, out=out)

    row.add(count, write, last)
    return last


def _raw_times(frames: int, seconds: float | None, pps: int | float) -> np.ndarray:
    """``[frames]`` frame times as transformers computes them: images ``arange * 1 * pps`` (int64 for an int ``pps``,
    else float32), videos ``arange * fp32(seconds) * pps`` in float32 (torch multiplies by a Python number in the
    tensor's dtype, as numpy does by a float32 scalar)."""
    if seconds is None and isinstance(pps, int):
        return np.arange(frames) * pps
    with np.errstate(over="ignore", invalid="ignore"):  # an infinite or NaN time is refused by the caller
        times = np.arange(frames, dtype=np.float32)
        return times * np.float32(pps) if seconds is None else times * np.float32(seconds) * np.float32(pps)


def _checked_times(frames: int, seconds: float | None, pps: int | float, field: str) -> np.ndarray:
    """:func:`_raw_times`, refused when one is not finite or past ``MAX_TIME_OFFSET``."""
    times = _raw_times(frames, seconds, pps)
    if not np.isfinite(times).all() or float(times.max()) > MAX_TIME_OFFSET:
        raise InvalidInput(
            f"{field}: a frame's temporal offset exceeds {MAX_TIME_OFFSET} (or is not finite)", field=field
        )
    return times


def _float32_grid(frames: int, rows: int, columns: int) -> np.ndarray:
    """:func:`grid_pattern` in float32 (read-only, cached)."""
    key = ("omni-float32", frames, rows, columns)
    return pattern(key, lambda: grid_pattern(frames, rows, columns).astype(np.float32))


def _vision_writer(grid: np.ndarray, times: np.ndarray, hw: int, start: Start) -> _Write:
    """Writes a vision block: ``grid`` (frame, row, column of each token) + ``start``, its T row ``times[frame] +
    start`` (``[t]``, in the grid's dtype; a single frame's time is 0)."""

    def write(out: np.ndarray) -> None:
        if times.size == 1:
            np.add(grid, start, out=out)
            return
        np.add(grid[1:], start, out=out[1:])
        out[0].reshape(times.size, hw)[...] = (times + start)[:, None]

    return write


# ------------------------------------------------------------------------------------------------ Qwen2.5-Omni
def _frame_offsets(times: np.ndarray) -> np.ndarray:
    """``[t]`` int64 T offsets of :func:`_checked_times`, truncated as transformers' ``.long()`` (its
    ``get_llm_pos_ids_for_vision`` then keeps them: ``torch.Tensor`` of an int64 tensor is that tensor)."""
    return times.astype(np.int64, copy=False)


def _vision(row: _Row, start: int, t: int, h: int, w: int, offsets: np.ndarray) -> None:
    """Append a vision block of ``t`` frames (T offsets ``offsets``) at ``start``."""
    last = start + max(int(offsets[-1]), h - 1, w - 1)
    row.add(t * h * w, _vision_writer(grid_pattern(t, h, w), offsets, h * w, start), last)
    row.next_start = last + 1


def _video_chunks(times: np.ndarray, per_frame: int, chunk: int) -> np.ndarray:
    """``[V]`` chunk index of each video token, as ``get_chunked_index`` assigns them (at most one new chunk per
    token): ``count_i = min(count_{i-1} + 1, T_i // chunk)``, solved as a running minimum."""
    reached = np.repeat(times // chunk, per_frame)
    index = np.arange(reached.size)
    return index + np.minimum(1, np.minimum.accumulate(reached - index))


def _audio_in_video(row: _Row, start: int, t: int, h: int, w: int, offsets: np.ndarray, audio: int, chunk: int) -> None:
    """Append a video with its audio: 2 opening markers, the interleaved chunks, 2 closing markers.

    Both chunk sequences are non-decreasing, so the chunks' order (video chunk 0, audio chunk 0, video chunk 1, ...)
    puts video token ``i`` after the audio tokens of earlier chunks and audio token ``j`` after the video tokens of
    chunks up to its own."""
    inner = start + 1
    video = np.empty((3, t * h * w), dtype=np.int64)
    _vision_writer(grid_pattern(t, h, w), offsets, h * w, inner)(video)
    video_chunk = _video_chunks(offsets, h * w, chunk)
    audio_index = np.arange(audio)
    audio_chunk = audio_index // chunk
    video_slot = np.arange(video_chunk.size) + np.minimum(video_chunk * chunk, audio)
    audio_slot = audio_index + np.searchsorted(video_chunk, audio_chunk, side="right")
    video_chunks, audio_chunks = int(video_chunk[-1]) + 1, int(audio_chunk[-1]) + 1
    last = max(video_chunks, audio_chunks) - 1
    # the last piece appended is audio chunk `last` (its last token) when there is one, else video chunk `last`
    last_max = inner + audio - 1 if last < audio_chunks else int(video[:, video_chunk == last].max())

    def write(out: np.ndarray) -> None:
        out[:, :2] = start
        body = out[:, 2:-2]
        body[:, video_slot] = video
        body[:, audio_slot] = inner + audio_index
        out[:, -2:] = last_max + 1

    video_max = inner + max(int(offsets[-1]), h - 1, w - 1)
    row.add(video.shape[1] + audio + 4, write, max(video_max, inner + audio - 1, last_max + 1))
    row.next_start = last_max + 2


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
_SINGLE_FRAME = np.zeros(1, dtype=np.int64)
"""The T offsets of a single-frame image (0 whatever ``position_id_per_seconds``)."""


def _add_segment(row: _Row, segment: Mapping[str, object], field: str, settings: _Settings, limit: int) -> None:
    if not isinstance(segment, Mapping) or not segment or set(segment) - _KEYS:
        raise InvalidInput(f"{field} must be an object with text, image, video and/or audio", field=field)
    start = row.next_start
    kinds = {key for key in ("text", "image", "video", "audio") if key in segment}
    if kinds == {"text"} and len(segment) == 1:
        count = _count(segment["text"], field, 0)
        if count:
            _reserve(row, count, limit, field)
            _arange(row, count, start)
            row.next_start = start + count
        return
    if kinds == {"audio"} and len(segment) == 1:
        count = _count(segment["audio"], field, 1)
        _reserve(row, count, limit, field)
        _arange(row, count, start)
        row.next_start = start + count
        return
    if kinds == {"image"} and len(segment) == 1:
        t, h, w = _grid(segment["image"], field, settings.merge, "image")
        _reserve(row, t * h * w, limit, field)
        offsets = _SINGLE_FRAME if t == 1 else _frame_offsets(_checked_times(t, None, settings.pps, field))
        _vision(row, start, t, h, w, offsets)
        return
    if "video" in kinds and not kinds & {"text", "image"}:
        t, h, w = _grid(segment["video"], field, settings.merge, "video")
        seconds = segment.get("second_per_grid_t", 1.0)
        seconds = require_finite_float(seconds, field, minimum=0.0)
        _reserve(row, t * h * w, limit, field)
        offsets = _frame_offsets(_checked_times(t, seconds, settings.pps, field))
        if "audio" not in segment:
            _vision(row, start, t, h, w, offsets)
            return
        audio = _count(segment["audio"], field, 1)
        _reserve(row, audio + 4, limit, field)  # the video's tokens are counted once the whole segment is laid out
        _audio_in_video(row, start, t, h, w, offsets, audio, settings.chunk)
        return
    raise InvalidInput(f"{field}: unexpected combination of keys {sorted(segment)}", field=field)


def _reserve(row: _Row, tokens: int, limit: int, field: str) -> None:
    check_element_limit(row.tokens + tokens, limit, "tokens of a row", field=field)


def _layout_rows(rows: object, settings: _Settings, limit: int) -> list[_Row]:
    """Each row laid out (validated, its pieces planned)."""
    rows = segment_rows(rows)
    out = []
    for b, segments in enumerate(rows):
        segments = segment_row(segments, b)
        row = _Row([])
        for i, segment in enumerate(segments):
            _add_segment(row, segment, f"rows[{b}].segments[{i}]", settings, limit)
        out.append(row)
    return out


def _write_rows(rows: list[_Row], mask: np.ndarray, out: np.ndarray) -> None:
    """Write each row into its real slots of ``out`` ``[3, B, L]`` (``mask`` ``[B, L]``): in place when they are one
    run of slots (the usual left or right padding), else through a scratch row."""
    first, one_run = (values.tolist() for values in real_runs(mask))
    for b, row in enumerate(rows):
        slots = out[:, b, first[b] : first[b] + row.tokens] if one_run[b] else np.empty((3, row.tokens), out.dtype)
        offset = 0
        for tokens, write in row.pieces:
            write(slots[:, offset : offset + tokens])
            offset += tokens
        if not one_run[b]:
            out[:, b, mask[b]] = slots


def _assemble(rows: list[_Row], mask: np.ndarray, fill_value: int) -> MRopePositions:
    """Qwen2.5-Omni's int64 ``[3, B, L]`` (padded slots ``fill_value``) and deltas."""
    positions = np.full((3, *mask.shape), fill_value, dtype=np.int64)
    _write_rows(rows, mask, positions)
    deltas = np.array([int(row.maximum) + 1 - row.tokens if row.tokens else 0 for row in rows], dtype=np.int64)
    return MRopePositions(torch.from_numpy(positions), torch.from_numpy(deltas.reshape(-1, 1)), torch.from_numpy(mask))


# ------------------------------------------------------------------------------------------------ Qwen3-Omni
_Qwen3Block = (
    tuple[Literal["audio"], int]
    | tuple[Literal["image"], int, int, int]
    | tuple[Literal["video"], int, int, int, np.ndarray]
    | tuple[Literal["av"], int, int, int, np.ndarray, int]
)
"""A non-text block of a Qwen3-Omni row (merged sizes): audio length, image ``t, h, w``, video ``t, h, w, times``, or
a video with its audio ``t, h, w, times, audio length`` (``times`` ``[t]`` float32, :func:`_raw_times`)."""
_Qwen3Item = tuple[Literal["text"], int] | _Qwen3Block
"""One validated segment of a Qwen3-Omni row: a text length or a block."""


def _qwen3_items(segments: object, b: int, settings: _Settings, limit: int) -> list[_Qwen3Item]:
    """Validated segments of one row as ``("text", n)``, ``("image", t, h, w)``, ``("video", t, h, w, times)``,
    ``("audio", n)`` or ``("av", t, h, w, times, n)`` (merged sizes); token count checked against ``limit``."""
    segments = segment_row(segments, b)
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
            t, h, w = _grid(segment["video"], field, settings.merge, "video")
            seconds = require_finite_float(segment.get("second_per_grid_t", 1.0), field, minimum=0.0)
            size = t * h * w
            check_element_limit(tokens + size, limit, "tokens of a row", field=field)  # before timing every frame
            times = _checked_times(t, seconds, settings.pps, field)
            if "audio" in segment:
                audio = _count(segment["audio"], field, 1)
                item, size = ("av", t, h, w, times, audio), size + audio + 4
            else:
                item = ("video", t, h, w, times)
        else:
            raise InvalidInput(f"{field}: unexpected combination of keys {sorted(segment)}", field=field)
        tokens += size
        check_element_limit(tokens, limit, "tokens of a row", field=field)
        items.append(item)
    return items


def _qwen3_vision(t: int, h: int, w: int, times: np.ndarray, start: Start) -> tuple[_Write, np.float32]:
    """``get_llm_pos_ids_for_vision``: the writer of a vision block's float32 T/H/W ``+ start``, and its largest
    position (its last token's: times do not decrease)."""
    origin = np.float32(start)
    last = max(times[-1], np.float32(h - 1), np.float32(w - 1)) + origin
    return _vision_writer(_float32_grid(t, h, w), times, h * w, origin), last


def _qwen3_block(row: _Row, item: _Qwen3Block, start: Start, pps: int | float) -> Start:
    """Append one image / video / audio / audio-in-video block starting at ``start``; return the largest position of
    the last piece transformers appends for it (which sets where the closing markers go)."""
    if item[0] == "audio":
        return _arange(row, item[1], start)
    t, h, w = item[1:4]
    times = _raw_times(t, None, pps).astype(np.float32) if item[0] == "image" else item[4]
    write, last = _qwen3_vision(t, h, w, times, start)
    if item[0] != "av":
        row.add(t * h * w, write, last)
        return last
    return _qwen3_merge(row, t * h * w, write, last, item[5], start)


def _qwen3_merge(
    row: _Row, tokens: int, write_video: _Write, video_last: np.float32, audio: int, start: Start
) -> Start:
    """Append a video (``tokens``, written by ``write_video``) merged with its ``audio`` tokens by T, as transformers
    merges them one token at a time (video first on ties); return the largest position of the last piece it appends:
    the rest of the side left over once the other is used up (audio keeps its dtype there)."""
    video = np.empty((3, tokens), dtype=np.float32)
    write_video(video)
    audio_values = (
        np.arange(audio, dtype=np.float32) + start if isinstance(start, np.float32) else np.arange(audio) + start
    )
    audio_keys = audio_values.astype(np.float32, copy=False)
    video_slot = np.arange(tokens) + np.searchsorted(audio_keys, video[0], side="left")
    audio_slot = np.arange(audio) + np.searchsorted(video[0], audio_keys, side="right")

    def write(out: np.ndarray) -> None:
        out[:, video_slot] = video
        out[:, audio_slot] = audio_values

    row.add(tokens + audio, write, max(float(video_last), float(audio_keys[-1])))
    if audio_slot[-1] < video_slot[-1]:
        return video_last
    return audio_values[-1] if isinstance(start, np.float32) else int(audio_keys[-1])


def _qwen3_row(items: list[_Qwen3Item], settings: _Settings, b: int) -> _Row:
    """One row's float32 positions planned, in transformers' order of float operations."""
    row = _Row([])
    last: Start | None = None  # largest position of the last piece transformers appended
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
        start = 0 if last is None else last + 1
        if prefix:
            _arange(row, prefix, start)
            start = start + prefix
        markers = 2 if compound else 1
        _arange(row, markers, start)
        last = _arange(row, markers, _qwen3_block(row, item, start + markers, settings.pps) + 1)
        pending, eos_in_text = 0, (0 if compound else 1)
    tail = pending - eos_in_text
    if tail < 0:
        raise InvalidInput(f"rows[{b}]: the last block needs its end marker as text", field=f"rows[{b}]")
    if tail:
        _arange(row, tail, 0 if last is None else last + 1)
    return row


def _qwen3_assemble(rows: list[_Row], mask: np.ndarray, fill_value: int) -> MRopePositions:
    """Qwen3-Omni's float32 ``[3, B, L]`` (padded slots ``fill_value``) and float32 deltas."""
    positions = torch.full((3, *mask.shape), float(fill_value), dtype=torch.float32)
    _write_rows(rows, mask, positions.numpy())
    deltas = np.zeros((mask.shape[0], 1), dtype=np.float32)
    for b, row in enumerate(rows):
        if row.tokens:
            deltas[b, 0] = np.float32(row.maximum) + 1 - row.tokens
    return MRopePositions(positions, torch.from_numpy(deltas), torch.from_numpy(mask))


def _layout_qwen3(rows: object, settings: _Settings, limit: int) -> list[_Row]:
    rows = segment_rows(rows)
    return [_qwen3_row(_qwen3_items(segments, b, settings, limit), settings, b) for b, segments in enumerate(rows)]


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
    require_padding_side(padding_side)
    spec, settings = _settings(family, spatial_merge_size, position_id_per_seconds, seconds_per_chunk)
    limit = MAX_ELEMENTS if max_tokens is None else min(max_tokens, MAX_ELEMENTS)
    layout, assemble = LAYOUTS[spec.name]
    laid_out = layout(rows, settings, limit)
    lengths = np.array([row.tokens for row in laid_out], dtype=np.int64)
    width = int(lengths.max(initial=0))
    check_element_limit(len(laid_out) * width, max_tokens, "M-RoPE position slots", "rows")
    mask = padded_mask(lengths, width, padding_side)
    return assemble(laid_out, mask, spec.fill_value if fill_value is None else fill_value)


_Layout = Callable[[object, _Settings, int], list[_Row]]
_Assemble = Callable[[list[_Row], np.ndarray, int], MRopePositions]
LAYOUTS: dict[str, tuple[_Layout, _Assemble]] = {
    "qwen2_5_omni": (_layout_rows, _assemble),
    "qwen3_omni_moe": (_layout_qwen3, _qwen3_assemble),
}
"""Omni family -> (rows -> each row laid out, written into the padded batch with its deltas)."""


# ------------------------------------------------------------------------------------------------ token form
_IMAGE, _VIDEO, _AUDIO = 1, 2, 3


def _runs(kinds: np.ndarray) -> list[tuple[int, int, int]]:
    """``(kind, first, end)`` of each maximal run of non-text tokens (none in a row without real tokens)."""
    if kinds.size == 0:
        return []
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
    mask = real_mask(attention_mask, ids)
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
    if positions.shape[-1] == 0:  # rows of no tokens have no maximum (transformers raises): delta 0, as elsewhere
        return MRopePositions(positions, torch.zeros(counts.shape, dtype=positions.dtype), mask_t)
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
