"""The API surface: one operation builder per endpoint, bound to both clients by the :class:`Endpoint` descriptor.

Adding an endpoint = one builder function below (typed keyword options → :class:`Operation`) plus one line in
:class:`Endpoints`. ``Client.name(...)`` then sends it and returns the result; ``AsyncClient.name(...)`` returns an
awaitable of it. Every builder takes ``**extra`` fields, passed through to the request body unchanged, so options a
newer server adds work before the client learns their names; ``timeout=`` and ``extra_headers=`` are the exception
(:data:`CALL_OPTIONS`): every method takes them, and they apply to the request itself.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, TypeVar, overload

from ropeserve_client._operations import (
    ConfigLike,
    Operation,
    PositionsLike,
    get_json,
    get_text,
    json_post,
    lint_post,
    load_config,
    parse_empty,
    position_spec,
    rope_source,
    tensor_post,
    tensors_post,
)
from ropeserve_client._results import LintReport, TensorResult

if TYPE_CHECKING:
    from ropeserve_client._clients import AsyncClient, Client

__all__ = ["Endpoint", "Endpoints"]

P = ParamSpec("P")
T = TypeVar("T")
Dtype = Literal["float32", "bfloat16", "float16"]
Pairing = Literal["neox", "gptj"]
Layout = Literal["bhtd", "bthd", "flat", "batched_flat"]
Transport = Literal["http", "shm"]
ROPE_APPLY, MROPE_APPLY, ROPE_APPLY_TABLE = "/v1/rope/apply", "/v1/mrope/apply", "/v1/rope/apply-table"
Ints = Sequence[int] | Sequence[Sequence[int]] | Any
"""A (nested) list of ints, or an integer tensor/array."""


CALL_OPTIONS = ("timeout", "extra_headers")
"""Keywords every endpoint method takes for the request itself, never sent as body fields: ``timeout`` (seconds,
an ``httpx.Timeout`` or None) and ``extra_headers`` (a mapping added to this request's headers)."""


class Endpoint(Generic[P, T]):
    """Descriptor: ``client.name(*args, **kwargs)`` sends ``build(*args, **kwargs)`` through ``client._send``.

    The :data:`CALL_OPTIONS` keywords are taken out first and applied to the request, not to its body.
    """

    def __init__(self, build: Callable[P, Operation[T]]) -> None:
        self.build = build
        self.__doc__, self.__name__, self.__wrapped__ = build.__doc__, build.__name__, build

    @overload
    def __get__(self, client: None, owner: type) -> Endpoint[P, T]: ...
    @overload
    def __get__(self, client: AsyncClient, owner: type) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __get__(self, client: Client, owner: type) -> Callable[P, T]: ...
    def __get__(self, client: Any, owner: type) -> Any:
        if client is None:
            return self
        build, send = self.build, client._send

        @functools.wraps(build)
        def call(*args: P.args, **kwargs: P.kwargs) -> Any:
            options = {name: kwargs.pop(name) for name in CALL_OPTIONS if name in kwargs}
            return send(build(*args, **kwargs).with_call_options(**options))

        return call


class RotationEndpoint(Endpoint[P, T]):
    """``apply_rope`` / ``apply_mrope``: as :class:`Endpoint`, plus ``transport="shm"`` (shared memory)."""

    def __init__(self, build: Callable[P, Operation[T]], path: str) -> None:
        super().__init__(build)
        self.path = path

    def __get__(self, client: Any, owner: type) -> Any:
        if client is None:
            return self
        over_http = super().__get__(client, owner)

        @functools.wraps(self.build)
        def call(*args: Any, transport: Transport = "http", **kwargs: Any) -> Any:
            if transport == "shm":
                if kwargs.get("table") is not None:
                    raise ValueError("a caller's table travels over HTTP only: drop table= or transport='shm'")
                return client._rotate_shm(self.path, *rotation_inputs(*args, **kwargs))
            if transport != "http":
                raise ValueError(f"transport must be 'http' or 'shm', not {transport!r}")
            return over_http(*args, **kwargs)

        return call


# --------------------------------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------------------------------


def live() -> Operation[dict[str, Any]]:
    """``GET /health/live``: the process answers."""
    return get_json("/health/live", retry=False)


def ready() -> Operation[dict[str, Any]]:
    """``GET /health/ready``: raises NotReady (not retried) while warming up or draining."""
    return get_json("/health/ready", retry=False)


def health() -> Operation[dict[str, Any]]:
    """``GET /health``: alias of ready."""
    return get_json("/health", retry=False)


def metrics() -> Operation[str]:
    """``GET /metrics``: Prometheus text exposition."""
    return get_text("/metrics")


def version() -> Operation[dict[str, Any]]:
    """``GET /version``: the service's name and version, and its Python and torch versions."""
    return get_json("/version")


def info() -> Operation[dict[str, Any]]:
    """``GET /v1/info``: version, device, kernels, rope types, presets and limits."""
    return get_json("/v1/info")


SHM_REGIONS = "/v1/shm/regions"


def register_region(name: str, key: str, byte_size: int, *, read_only: bool = False) -> Operation[dict[str, Any]]:
    """``POST /v1/shm/regions``: register the POSIX shared-memory object ``key`` (``/ropeserve...``, made by the
    caller, at least ``byte_size`` bytes) as region ``name`` of this client. ``transport="shm"`` does it itself."""
    return json_post(SHM_REGIONS, {"name": name, "key": key, "byte_size": byte_size, "read_only": read_only})


def list_regions() -> Operation[dict[str, Any]]:
    """``GET /v1/shm/regions``: the regions this client (its credential) registered."""
    return get_json(SHM_REGIONS)


def unregister_region(name: str) -> Operation[dict[str, Any]]:
    """``DELETE /v1/shm/regions/{name}``: forget the region (the caller still owns and unlinks the object)."""
    return Operation("DELETE", f"{SHM_REGIONS}/{name}", parse_empty, retry=False)


def cos_sin(
    positions: PositionsLike,
    *,
    preset: str | None = None,
    config: ConfigLike | None = None,
    rope: Mapping[str, Any] | None = None,
    layer_type: str | None = None,
    dtype: Dtype | None = None,
    pairing: Pairing | None = None,
    seq_len_cached: int | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/rope/cos-sin``: tensors ``cos``, ``sin`` ``[N, width]`` and ``inv_freq``.

    * **positions** - a list, ``range``, ``"start:stop[:step]"`` or 1-D array.
    * **preset** / **config** / **rope** - exactly one: a preset name, a config.json (mapping or path), or
      explicit parameters (``{"rope_type": "default", "rope_theta": 1e4, "head_dim": 128}``).
    * **dtype** - ``float32`` (default), ``bfloat16`` or ``float16``; **pairing** - ``neox`` or ``gptj``.
    """
    body = {
        **rope_source(preset=preset, config=config, rope=rope, layer_type=layer_type),
        "positions": position_spec(positions),
        "dtype": dtype,
        "pairing": pairing,
        "seq_len_cached": seq_len_cached,
        **extra,
    }
    return tensor_post("/v1/rope/cos-sin", body)


def positions(
    *,
    attention_mask: Ints | None = None,
    segment_lengths: Ints | None = None,
    cu_seqlens: Ints | None = None,
    cache_lengths: Ints | None = None,
    past_lengths: Ints | int | None = None,
    num_new: int | None = None,
    total_length: int | None = None,
    fill_value: int | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/positions``: 1-D position ids (tensor ``positions``) for one of three inputs.

    * **attention_mask** - ``[B, T]`` 0/1 (padded batch; any padding side), with optional **past_lengths**;
    * **segment_lengths** or **cu_seqlens** - packed sequences (restart at each boundary), optional
      **past_lengths** per segment and **total_length**;
    * **cache_lengths** - decode: the next **num_new** positions of each row.
    """
    body = {
        "attention_mask": attention_mask,
        "segment_lengths": segment_lengths,
        "cu_seqlens": cu_seqlens,
        "cache_lengths": cache_lengths,
        "past_lengths": past_lengths,
        "num_new": num_new,
        "total_length": total_length,
        "fill_value": fill_value,
        **extra,
    }
    return tensor_post("/v1/positions", body)


def mrope_positions(
    *,
    family: str | None = None,
    preset: str | None = None,
    rows: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    mm_token_type_ids: Ints | None = None,
    input_ids: Ints | None = None,
    image_grid_thw: Ints | None = None,
    video_grid_thw: Ints | None = None,
    second_per_grid_ts: Sequence[float] | None = None,
    attention_mask: Ints | None = None,
    spatial_merge_size: int | None = None,
    tokens_per_second: float | None = None,
    compat: str | None = None,
    padding_side: Literal["left", "right"] | None = None,
    fill_value: int | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/mrope/positions``: prefill M-RoPE ``position_ids`` ``[3, B, T]`` and ``mrope_position_deltas``.

    * **family** - ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl`` or ``glm4v`` (or a **preset** naming one).
    * **rows** - one segment list per row: ``[{"text": 12}, {"image": [1, 28, 28]}, {"text": 5}]``; or the
      token form: **mm_token_type_ids** (0 text, 1 image, 2 video) or **input_ids**, with **image_grid_thw**,
      **video_grid_thw**, **second_per_grid_ts** and **attention_mask**.
    """
    body = {
        "family": family,
        "preset": preset,
        "rows": rows,
        "mm_token_type_ids": mm_token_type_ids,
        "input_ids": input_ids,
        "image_grid_thw": image_grid_thw,
        "video_grid_thw": video_grid_thw,
        "second_per_grid_ts": second_per_grid_ts,
        "attention_mask": attention_mask,
        "spatial_merge_size": spatial_merge_size,
        "tokens_per_second": tokens_per_second,
        "compat": compat,
        "padding_side": padding_side,
        "fill_value": fill_value,
        **extra,
    }
    return tensor_post("/v1/mrope/positions", body)


def mrope_decode_positions(
    *,
    mrope_position_deltas: Ints | int,
    cache_lengths: Ints | int,
    num_new: int | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/mrope/decode-positions``: ``position_ids`` ``[3, B, num_new]`` of the next decode step(s)."""
    body = {"mrope_position_deltas": mrope_position_deltas, "cache_lengths": cache_lengths, "num_new": num_new}
    return tensor_post("/v1/mrope/decode-positions", {**body, **extra})


def mrope_cos_sin(
    position_ids: Ints,
    *,
    preset: str | None = None,
    config: ConfigLike | None = None,
    rope: Mapping[str, Any] | None = None,
    layer_type: str | None = None,
    dtype: Dtype | None = None,
    pairing: Pairing | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/mrope/cos-sin``: ``cos``/``sin`` ``[*shape, rotary_dim]`` for ``[3, *shape]`` M-RoPE positions."""
    body = {
        **rope_source(preset=preset, config=config, rope=rope, layer_type=layer_type),
        "position_ids": position_ids,
        "dtype": dtype,
        "pairing": pairing,
        **extra,
    }
    return tensor_post("/v1/mrope/cos-sin", body)


def vision_rope(
    grid_thw: Ints,
    *,
    preset: str | None = None,
    config: ConfigLike | None = None,
    spatial_merge_size: int | None = None,
    head_dim: int | None = None,
    theta: float | None = None,
    dtype: Dtype | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/vision/rope``: vision-tower 2-D position ids ``[N, 2]`` and their cos/sin, per patch grid."""
    body = _vision_params(grid_thw, preset, config, spatial_merge_size, head_dim, theta)
    return tensor_post("/v1/vision/rope", {**body, "dtype": dtype, **extra})


def _vision_params(
    grid_thw: Ints,
    preset: str | None,
    config: ConfigLike | None,
    spatial_merge_size: int | None,
    head_dim: int | None,
    theta: float | None,
) -> dict[str, Any]:
    """The vision-tower fields ``/v1/vision/rope`` and ``/v1/vision/apply`` share."""
    loaded = load_config(config) if config is not None else None
    return {
        "grid_thw": grid_thw,
        "preset": preset,
        "config": loaded,
        "spatial_merge_size": spatial_merge_size,
        "head_dim": head_dim,
        "theta": theta,
    }


def _rotation_params(source: dict[str, Any], options: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    return {**source, **options, **extra}


def rotation_inputs(
    q: Any,
    k: Any = None,
    *,
    positions: Any,
    preset: str | None = None,
    config: ConfigLike | None = None,
    rope: Mapping[str, Any] | None = None,
    layer_type: str | None = None,
    layout: Layout | None = None,
    pairing: Pairing | None = None,
    dtype: Dtype | None = None,
    rotary_dim: int | None = None,
    table: Any = None,
    **extra: Any,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, params)`` of a rotation request, whatever carries it."""
    source = rope_source(preset=preset, config=config, rope=rope, layer_type=layer_type)
    tensors = {"q": q, "k": k, "positions": _int_tensor(positions), **table_tensors(table)}
    options = {"layout": layout, "pairing": pairing, "dtype": dtype, "rotary_dim": rotary_dim}
    return tensors, _rotation_params(source, options, extra)


def apply_rope(
    q: Any,
    k: Any = None,
    *,
    positions: Any,
    preset: str | None = None,
    config: ConfigLike | None = None,
    rope: Mapping[str, Any] | None = None,
    layer_type: str | None = None,
    layout: Layout | None = None,
    pairing: Pairing | None = None,
    dtype: Dtype | None = None,
    rotary_dim: int | None = None,
    table: Any = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/rope/apply`` (safetensors both ways): rotated ``q`` (and ``k``), same shapes and dtypes.

    * **q**, **k** - tensors in **layout** ``bhtd`` (transformers), ``bthd`` (flash-attn), ``flat`` (vLLM,
      ``[T, H*D]``) or ``batched_flat`` (``[B, T, H*D]``); ``k`` may have fewer heads (GQA) or be omitted.
    * **positions** - int tensor ``[T]`` or ``[B, T]``.
    * **dtype** - cast q and k to it before rotating (default: keep theirs); **rotary_dim** - override the
      rotated width (partial rotary).
    * **table** - rotate with your own cos/sin table instead of ropeserve's: a ``cos_sin_cache`` ``[N, rotary_dim]``
      (cos half, then sin half, as vLLM/SGLang keep it) or a ``(cos, sin)`` pair (``[N, rotary_dim/2]``, or full
      width in the pairing's layout); **positions** index its rows. ``result.meta["table"]`` then compares it
      with ropeserve's (``max_abs_error``, ``first_differing_position``; ``atol=`` loosens it). HTTP only.
    * **transport** (on a client) - ``"http"`` (default) or ``"shm"``: through shared memory, for a client on
      the server's host (the results are then views on the client's region; see ``ropeserve_client._shm``).
    """
    tensors, params = rotation_inputs(
        q, k, positions=positions, preset=preset, config=config, rope=rope, layer_type=layer_type, layout=layout,
        pairing=pairing, dtype=dtype, rotary_dim=rotary_dim, table=table, **extra,
    )  # fmt: skip
    return tensors_post(ROPE_APPLY, tensors, params)


def apply_mrope(q: Any, k: Any = None, *, positions: Any, **options: Any) -> Operation[TensorResult]:
    """``POST /v1/mrope/apply``: as :func:`apply_rope` (same options, ``transport="shm"`` too) with M-RoPE
    ``positions`` ``[3, T]`` or ``[3, B, T]``."""
    return tensors_post(MROPE_APPLY, *rotation_inputs(q, k, positions=positions, **options))


def apply_rope_table(
    q: Any,
    k: Any = None,
    *,
    positions: Any,
    cos_sin_cache: Any = None,
    cos: Any = None,
    sin: Any = None,
    layout: Layout | None = None,
    **options: Any,
) -> Operation[TensorResult]:
    """``POST /v1/rope/apply-table``: :func:`apply_rope` with the caller's own table required and **layout**
    ``flat`` by default; ``result.meta["table"]`` compares that table with ropeserve's (``max_abs_error``,
    ``first_differing_position``, ``non_finite``; ``atol=`` - rows differing by more count as differing).

    * **cos_sin_cache** - ``[N, rotary_dim]`` (cos half, then sin half: vLLM, SGLang), or **cos** and **sin**
      (``[N, rotary_dim/2]`` or full width in the pairing's layout); **positions** index its rows.
    """
    if cos_sin_cache is not None and (cos is not None or sin is not None):
        raise ValueError("pass cos_sin_cache, or cos and sin, not both")
    table = cos_sin_cache if cos is None and sin is None else (cos, sin)
    tensors, params = rotation_inputs(q, k, positions=positions, layout=layout, table=table, **options)
    return tensors_post(ROPE_APPLY_TABLE, tensors, params)


def table_tensors(table: Any) -> dict[str, Any]:
    """The body's tensors for a caller's table: ``cos_sin_cache`` (one tensor or array), or ``cos`` and ``sin``
    (a pair); none for None."""
    if table is None:
        return {}
    if isinstance(table, tuple | list):
        if len(table) != 2:
            raise ValueError("table must be a cos_sin_cache tensor or a (cos, sin) pair")
        return {"cos": table[0], "sin": table[1]}
    return {"cos_sin_cache": table}


def apply_vision_rope(
    q: Any,
    k: Any = None,
    *,
    grid_thw: Ints,
    preset: str | None = None,
    config: ConfigLike | None = None,
    spatial_merge_size: int | None = None,
    head_dim: int | None = None,
    theta: float | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/vision/apply``: the vision tower's 2-D rotation of ``q`` (and ``k``) ``[patches, heads, head_dim]``
    (patches in :func:`vision_rope`'s order), as transformers' ``apply_rotary_pos_emb_vision``."""
    params = _vision_params(grid_thw, preset, config, spatial_merge_size, head_dim, theta)
    return tensors_post("/v1/vision/apply", {"q": q, "k": k}, {**params, **extra})


def _int_tensor(value: Any) -> Any:
    """Lists become int64 arrays; tensors and arrays pass unchanged."""
    if isinstance(value, list | tuple | range):
        import numpy as np

        return np.asarray(value, dtype=np.int64)
    return value


def validate_config(
    config: ConfigLike,
    *,
    intent: Mapping[str, Any] | None = None,
    engines: Sequence[str | Mapping[str, str]] | None = None,
    max_model_len: int | None = None,
    dtype: str | None = None,
    env: Mapping[str, str] | None = None,
    pairing: Pairing | None = None,
    mrope_layout: Literal["chunked", "interleaved"] | None = None,
    rope_override: Mapping[str, Any] | None = None,
    tokenizer_config: ConfigLike | None = None,
    draft_config: ConfigLike | None = None,
    **extra: Any,
) -> Operation[LintReport]:
    """``POST /v1/config/validate``: lint a config.json against a deployment intent; problems are findings.

    * **engines** - targets with optional versions: ``["vllm==0.9.1", "sglang", "llama.cpp"]`` (default: all).
    * **max_model_len** - the context length the deployment serves; **dtype** the model dtype (bf16, fp16, ...).
    * **intent** - any other intent keys (``phase_dtype``, ``video_fps``, ``positions``, ...); the keyword
      arguments above override its keys.
    * **tokenizer_config**, **draft_config** - tokenizer_config.json and a speculative draft's config.json.
    """
    options = {
        "engines": engines,
        "max_model_len": max_model_len,
        "dtype": dtype,
        "env": env,
        "pairing": pairing,
        "mrope_layout": mrope_layout,
        "rope_override": rope_override,
    }
    merged_intent = {**(intent or {}), **{key: value for key, value in options.items() if value is not None}}
    body = {
        "config": load_config(config),
        "intent": merged_intent or None,
        "tokenizer_config": load_config(tokenizer_config) if tokenizer_config is not None else None,
        "draft_config": load_config(draft_config) if draft_config is not None else None,
        **extra,
    }
    return lint_post("/v1/config/validate", body)


def sinusoidal(
    positions: PositionsLike,
    *,
    dim: int,
    offset: int | None = None,
    base: float | None = None,
    layout: Literal["interleaved", "concat"] | None = None,
    schedule: Literal["vaswani", "tensor2tensor"] | None = None,
    dtype: Dtype | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/pe/sinusoidal``: absolute sinusoidal ``table`` ``[N, dim]`` for ``positions + offset``."""
    body = {
        "positions": position_spec(positions),
        "dim": dim,
        "offset": offset,
        "base": base,
        "layout": layout,
        "schedule": schedule,
        "dtype": dtype,
        **extra,
    }
    return tensor_post("/v1/pe/sinusoidal", body)


def alibi(
    *,
    num_heads: int,
    query_len: int | None = None,
    key_len: int | None = None,
    max_bias: float | None = None,
    mode: Literal["causal", "symmetric"] | None = None,
    offset: int | None = None,
    dtype: Dtype | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/pe/alibi``: ALiBi ``slopes`` ``[H]``, and ``bias`` ``[H, Tq, Tk]`` when both lengths are given."""
    body = {
        "num_heads": num_heads,
        "query_len": query_len,
        "key_len": key_len,
        "max_bias": max_bias,
        "mode": mode,
        "offset": offset,
        "dtype": dtype,
        **extra,
    }
    return tensor_post("/v1/pe/alibi", body)


def relative(
    *,
    query_len: int,
    key_len: int,
    mode: Literal["t5", "shaw"] | None = None,
    bidirectional: bool | None = None,
    offset: int | None = None,
    num_buckets: int | None = None,
    max_distance: int | None = None,
    clip: int | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/pe/relative``: ``relative_index`` ``[Tq, Tk]`` (T5 buckets, or Shaw clipped distances with
    **clip**); ``meta["table_rows"]`` is the size of the learned table it indexes."""
    body = {
        "query_len": query_len,
        "key_len": key_len,
        "mode": mode,
        "bidirectional": bidirectional,
        "offset": offset,
        "num_buckets": num_buckets,
        "max_distance": max_distance,
        "clip": clip,
        **extra,
    }
    return tensor_post("/v1/pe/relative", body)


def sincos_2d(
    *,
    grid_h: int,
    grid_w: int,
    dim: int,
    base: float | None = None,
    cls_token: bool | None = None,
    first_axis: Literal["h", "w"] | None = None,
    dtype: Dtype | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/pe/sincos-2d``: fixed 2-D sin-cos ``table`` ``[(1 if cls_token) + H*W, dim]`` (ViT/MAE)."""
    body = {
        "grid_h": grid_h,
        "grid_w": grid_w,
        "dim": dim,
        "base": base,
        "cls_token": cls_token,
        "first_axis": first_axis,
        "dtype": dtype,
        **extra,
    }
    return tensor_post("/v1/pe/sincos-2d", body)


def resample(
    table: Any,
    *,
    source_grid: Sequence[int],
    target_grid: Sequence[int],
    prefix_rows: int | None = None,
    mode: str | None = None,
    antialias: bool | None = None,
    align_corners: bool | None = None,
    **extra: Any,
) -> Operation[TensorResult]:
    """``POST /v1/pe/resample`` (safetensors both ways): a learned position ``table`` (``[P + H*W, D]``) resampled
    from **source_grid** ``[H, W]`` (or ``[N]``) to **target_grid**; the **prefix_rows** (class tokens) are kept."""
    params = {
        "source_grid": source_grid,
        "target_grid": target_grid,
        "prefix_rows": prefix_rows,
        "mode": mode,
        "antialias": antialias,
        "align_corners": align_corners,
        **extra,
    }
    return tensors_post("/v1/pe/resample", {"table": table}, params)


def request(
    method: str,
    path: str,
    *,
    json: Mapping[str, Any] | None = None,
    tensors: Mapping[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
) -> Operation[TensorResult]:
    """Any endpoint: a JSON body, or ``tensors`` (+ ``params`` metadata) as safetensors; a TensorResult back
    (JSON answers without numeric lists give ``result.meta`` only)."""
    if method.upper() == "GET":
        return dataclasses.replace(tensor_post(path, {}), method="GET", json=None)
    operation = tensors_post(path, tensors, params or {}) if tensors is not None else tensor_post(path, json or {})
    return dataclasses.replace(operation, method=method.upper())


class Endpoints:
    """The endpoint methods of :class:`Client` and :class:`AsyncClient` (see each builder's docstring)."""

    live = Endpoint(live)
    ready = Endpoint(ready)
    health = Endpoint(health)
    metrics = Endpoint(metrics)
    version = Endpoint(version)
    info = Endpoint(info)
    cos_sin = Endpoint(cos_sin)
    positions = Endpoint(positions)
    mrope_positions = Endpoint(mrope_positions)
    mrope_decode_positions = Endpoint(mrope_decode_positions)
    mrope_cos_sin = Endpoint(mrope_cos_sin)
    vision_rope = Endpoint(vision_rope)
    apply_rope = RotationEndpoint(apply_rope, ROPE_APPLY)
    apply_mrope = RotationEndpoint(apply_mrope, MROPE_APPLY)
    apply_rope_table = Endpoint(apply_rope_table)
    apply_vision_rope = Endpoint(apply_vision_rope)
    validate_config = Endpoint(validate_config)
    sinusoidal = Endpoint(sinusoidal)
    alibi = Endpoint(alibi)
    relative = Endpoint(relative)
    sincos_2d = Endpoint(sincos_2d)
    resample = Endpoint(resample)
    register_region = Endpoint(register_region)
    list_regions = Endpoint(list_regions)
    unregister_region = Endpoint(unregister_region)
    request = Endpoint(request)
