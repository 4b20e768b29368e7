"""The deployment intent a config is linted against: engines, context length, dtype, env flags, layouts."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from ropeserve.config.jsonsafe import INT64_MAX, check_json_numbers, is_json_object
from ropeserve.errors import InvalidInput
from ropeserve.lint.versions import VersionSpec, shortened

ENGINES = ("transformers", "vllm", "sglang", "tgi", "llama.cpp")
ENGINE_ALIASES = {
    "hf": "transformers",
    "text-generation-inference": "tgi",
    "llamacpp": "llama.cpp",
    "llama_cpp": "llama.cpp",
    "llama-cpp": "llama.cpp",
}
DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float": "float32",
    "float32": "float32",
}
LENGTH_KEYS = ("max_model_len", "context_length", "n_ctx")
PAIRINGS = ("neox", "gptj")
MROPE_LAYOUTS = ("chunked", "interleaved")
TRUTHY = frozenset({"1", "true", "yes", "on"})
_TARGET = re.compile(r"^\s*(?P<name>[A-Za-z][\w.\-]*?)\s*(?P<spec>(?:[=!<>~]=?=?|@).*)?$")


@dataclass(frozen=True)
class EngineTarget:
    """One target engine and the versions the deployment may run (an empty spec means any)."""

    name: str
    spec: VersionSpec = VersionSpec()

    @classmethod
    def parse(cls, text: str, field: str = "engine") -> EngineTarget:
        """``vllm``, ``vllm==0.9.1``, ``vllm>=0.10,<0.12``, ``llama.cpp==b4500``; aliases such as ``hf``.

        A short target is parsed once per process (``_cached_target``): requests name the same few targets, and
        a parse (regex, alias, version spec) cost more than the rest of an intent."""
        parse = _cached_target if isinstance(text, str) and len(text) <= MAX_CACHED_TARGET else _parsed_target
        try:
            return parse(text)
        except InvalidInput as error:
            error.field = field
            raise

    def __str__(self) -> str:
        return f"{self.name}{self.spec}"


MAX_CACHED_TARGET = 64
"""Longest target text ``EngineTarget.parse`` caches (real ones are under 30 characters)."""


def _parsed_target(text: str) -> EngineTarget:
    """``EngineTarget.parse`` without the cache; its InvalidInput's field is the caller's to set."""
    match = _TARGET.match(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidInput(f"not an engine target: {shortened(str(text))!r} (e.g. 'vllm==0.9.1')")
    name = canonical_engine(match["name"])
    try:
        spec = VersionSpec.parse(_as_constraint((match["spec"] or "").removeprefix("@")))
    except InvalidInput as error:
        raise InvalidInput(f"{shortened(text)!r}: {error.detail}") from None
    return EngineTarget(name, spec)


_cached_target = functools.lru_cache(maxsize=256)(_parsed_target)
"""``_parsed_target`` of a short string, bounded; its values are frozen (EngineTarget, VersionSpec, Clause and
Version are frozen dataclasses holding tuples), so no request can change another's. Errors are not cached."""


def _as_constraint(version: str) -> str:
    """A bare version pins it (``0.9.1`` -> ``==0.9.1``); a constraint or the empty string stays as is."""
    version = version.strip()
    return version if not version or version[0] in "=!<>~" else f"=={version}"


def canonical_engine(name: str, field: str = "engine") -> str:
    key = name.strip().lower()
    key = ENGINE_ALIASES.get(key, key)
    if key not in ENGINES:
        raise InvalidInput(f"unknown engine {name!r}; known: {', '.join(ENGINES)}", field=field)
    return key


@dataclass(frozen=True)
class PositionPlan:
    """How a serving stack builds position ids; ``engine`` means the engine's own (correct) code path."""

    padding_side: str = "right"
    position_ids: str = "engine"
    chunked_prefill: str = "engine"
    mrope_decode: str = "engine"

    CHOICES = MappingProxyType(
        {
            "padding_side": ("left", "right"),
            "position_ids": ("engine", "per_row", "cache_position"),
            "chunked_prefill": ("engine", "slice", "recompute"),
            "mrope_decode": ("engine", "delta", "sequential"),
        }
    )


@dataclass(frozen=True)
class DeploymentIntent:
    """What the deployment will do with the config.

    * **engines** - target engines with version constraints (default: all five, any version).
    * **engines_asked** - whether ``engines`` was given (flag, intent file or HTTP field). With the default
      targets, a finding about one engine's support is reported at info unless it holds for every engine.
    * **max_model_len** - requested context length (vLLM ``max_model_len``, SGLang ``context_length``,
      llama.cpp ``n_ctx``); ``None`` lets each engine pick its default.
    * **dtype** - model dtype the rope tables are cast to; ``None`` reads the config's (``torch_dtype``/``dtype``).
    * **phase_dtype** - dtype the angles ``p * inv_freq`` are computed in (engines use float32).
    * **env** - environment of the engine processes (``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` etc.).
    * **disable_sliding_window** - vLLM's ``--disable-sliding-window`` (it caps the length at the window).
    * **pairing** / **mrope_layout** - what the deployment's kernels or converted weights expect.
    * **rope_override** - rope parameters given outside config.json (vLLM ``--hf-overrides``
      ``rope_parameters``, TGI ``ROPE_SCALING``/``ROPE_FACTOR``); they replace the config's rope dict.
    * **video_fps** / **max_video_seconds** - multimodal video input the deployment serves.
    * **positions** - how a custom stack builds position ids (``PositionPlan``).
    """

    engines: tuple[EngineTarget, ...] = tuple(EngineTarget(name) for name in ENGINES)
    engines_asked: bool = False
    max_model_len: int | None = None
    dtype: str | None = None
    phase_dtype: str = "float32"
    env: Mapping[str, str] = field(default_factory=dict)
    disable_sliding_window: bool = False
    pairing: str | None = None
    mrope_layout: str | None = None
    rope_override: Mapping[str, Any] | None = None
    video_fps: float | None = None
    max_video_seconds: float | None = None
    positions: PositionPlan = PositionPlan()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, pointer: str = "/intent") -> DeploymentIntent:
        """Build an intent from a JSON-able dict (the HTTP and ``--intent`` form); InvalidInput names the field."""
        if data is None:
            return DEFAULT_INTENT
        if not is_json_object(data):
            raise InvalidInput("intent must be a JSON object", field=pointer)
        check_json_numbers(data, pointer)
        unknown = sorted(set(data) - INTENT_KEYS)
        if unknown:
            raise InvalidInput(
                f"unknown intent keys {unknown}; known: {sorted(INTENT_KEYS)}", field=f"{pointer}/{unknown[0]}"
            )
        return cls(
            engines=_engines(data.get("engines"), f"{pointer}/engines"),
            engines_asked=data.get("engines") is not None,
            max_model_len=_requested_length(data, pointer),
            dtype=_optional_dtype(data.get("dtype"), f"{pointer}/dtype"),
            phase_dtype=_optional_dtype(data.get("phase_dtype"), f"{pointer}/phase_dtype") or "float32",
            env=_env(data.get("env"), f"{pointer}/env"),
            disable_sliding_window=_flag(data.get("disable_sliding_window"), f"{pointer}/disable_sliding_window"),
            pairing=_choice(data.get("pairing"), PAIRINGS, f"{pointer}/pairing"),
            mrope_layout=_choice(data.get("mrope_layout"), MROPE_LAYOUTS, f"{pointer}/mrope_layout"),
            rope_override=_optional_object(data.get("rope_override"), f"{pointer}/rope_override"),
            video_fps=_positive_number(data.get("video_fps"), f"{pointer}/video_fps"),
            max_video_seconds=_positive_number(data.get("max_video_seconds"), f"{pointer}/max_video_seconds"),
            positions=_positions(data.get("positions"), f"{pointer}/positions"),
        )

    def env_flag(self, name: str) -> bool:
        return str(self.env.get(name, "")).strip().lower() in TRUTHY

    def target(self, engine: str) -> EngineTarget | None:
        return next((t for t in self.engines if t.name == engine), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "engines": [str(t) for t in self.engines] if self.engines_asked else None,
            "max_model_len": self.max_model_len,
            "dtype": self.dtype,
            "phase_dtype": self.phase_dtype,
            "env": dict(self.env),
            "disable_sliding_window": self.disable_sliding_window,
            "pairing": self.pairing,
            "mrope_layout": self.mrope_layout,
            "rope_override": dict(self.rope_override) if self.rope_override is not None else None,
            "video_fps": self.video_fps,
            "max_video_seconds": self.max_video_seconds,
            "positions": {name: getattr(self.positions, name) for name in PositionPlan.CHOICES},
        }


DEFAULT_INTENT = DeploymentIntent()
"""The intent of a request that gives none (built once: every field default, nothing asked)."""

INTENT_KEYS = frozenset(f.name for f in fields(DeploymentIntent) if f.name != "engines_asked") | set(LENGTH_KEYS)
"""The keys an intent object may hold."""


def normalize_dtype(value: str, field: str = "dtype") -> str:
    dtype = DTYPE_ALIASES.get(str(value).strip().lower())
    if dtype is None:
        raise InvalidInput(f"unknown dtype {value!r}; use one of {sorted(set(DTYPE_ALIASES))}", field=field)
    return dtype


def _engines(value: Any, pointer: str) -> tuple[EngineTarget, ...]:
    if value is None:
        return DeploymentIntent.engines
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise InvalidInput("engines must be a non-empty list", field=pointer)
    targets = []
    for index, item in enumerate(value):
        where = f"{pointer}/{index}"
        if is_json_object(item):
            name = item.get("name")
            version = item.get("version") or ""
            if not isinstance(name, str) or not isinstance(version, str):
                raise InvalidInput("an engine object needs string 'name' and optional string 'version'", field=where)
            item = name + _as_constraint(version)
        targets.append(EngineTarget.parse(item, where))
    names = [t.name for t in targets]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise InvalidInput(f"engine {duplicate!r} is listed twice", field=pointer)
    return tuple(targets)


def _requested_length(data: Mapping[str, Any], pointer: str) -> int | None:
    """The one requested length of ``LENGTH_KEYS`` given (None without one): each an int in 1..INT64_MAX (an
    engine's int64; 2**64 once reached the numerics as position 2**64 - 1), all equal."""
    given = [key for key in LENGTH_KEYS if data.get(key) is not None]
    for key in given:
        value = data[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= INT64_MAX:
            raise InvalidInput(f"{key} must be an integer in [1, 2**63 - 1], got {value!r}", field=f"{pointer}/{key}")
    if len({data[key] for key in given}) > 1:
        raise InvalidInput(f"{given} disagree; give one requested length", field=f"{pointer}/{given[1]}")
    return data[given[0]] if given else None


def _optional_dtype(value: Any, pointer: str) -> str | None:
    return None if value is None else normalize_dtype(value, pointer)


def _env(value: Any, pointer: str) -> dict[str, str]:
    if value is None:
        return {}
    if not is_json_object(value) or not all(isinstance(k, str) for k in value):
        raise InvalidInput("env must be an object of NAME: value", field=pointer)
    return {key: str(item) for key, item in value.items()}


def _flag(value: Any, pointer: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidInput(f"must be true or false, got {value!r}", field=pointer)
    return value


def _choice(value: Any, choices: tuple[str, ...], pointer: str) -> str | None:
    if value is None:
        return None
    if value not in choices:
        raise InvalidInput(f"must be one of {list(choices)}, got {value!r}", field=pointer)
    return str(value)


def _optional_object(value: Any, pointer: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not is_json_object(value):
        raise InvalidInput("must be a JSON object", field=pointer)
    for key, item in value.items():
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidInput(f"must be a finite number, got {item!r}", field=f"{pointer}/{key}")
    return dict(value)


def _positive_number(value: Any, pointer: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < math.inf:
        raise InvalidInput(f"must be a finite positive number, got {value!r}", field=pointer)
    return float(value)


def _positions(value: Any, pointer: str) -> PositionPlan:
    if value is None:
        return PositionPlan()
    if not is_json_object(value):
        raise InvalidInput("positions must be a JSON object", field=pointer)
    for key, item in value.items():
        choices = PositionPlan.CHOICES.get(key)
        if choices is None:
            raise InvalidInput(f"unknown key; known: {sorted(PositionPlan.CHOICES)}", field=f"{pointer}/{key}")
        _choice(item, choices, f"{pointer}/{key}")
    return PositionPlan(**value)
