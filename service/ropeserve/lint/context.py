"""Everything a rule may look at, computed once per lint run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ropeserve.config import RopeParams
from ropeserve.lint import pointers
from ropeserve.lint.engines import EngineLength, derive_length, vllm_window_cap
from ropeserve.lint.findings import Hit
from ropeserve.lint.intent import DTYPE_ALIASES, DeploymentIntent, EngineTarget
from ropeserve.lint.lazy import lazy
from ropeserve.lint.model import ModelView
from ropeserve.lint.numerics import TableError, table_error

DEFAULT_DTYPE = "bfloat16"
FLOAT32_TABLE_ENGINES = frozenset({"llama.cpp"})
"""Engines whose cos/sin stay float32 whatever the model dtype (ggml rotates in float32)."""


@dataclass(frozen=True)
class NumericsRow:
    engine: str
    error: TableError

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, **self.error.as_dict()}


@dataclass
class LintContext:
    """The intent, the config as engines see it (``model``, after any rope override) and as written
    (``original``), the optional tokenizer and draft documents, and per-target lengths and numerics."""

    intent: DeploymentIntent
    model: ModelView
    original: ModelView
    tokenizer_config: Mapping[str, Any] | None = None
    draft: ModelView | None = None
    lengths: dict[str, EngineLength] = field(default_factory=dict)
    dtype: str = DEFAULT_DTYPE
    dtype_source: str = "assumed"
    table_errors: dict[tuple[int, str, str], TableError] = field(default_factory=dict, repr=False)
    """``table_error_of`` results of this lint run by (position, phase dtype, table dtype)."""

    @classmethod
    def build(
        cls,
        config: Mapping[str, Any],
        intent: DeploymentIntent,
        tokenizer_config: Mapping[str, Any] | None = None,
        draft_config: Mapping[str, Any] | None = None,
    ) -> LintContext:
        """The context of ``config`` and ``draft_config``, whose numbers ``lint_config`` has checked (an intent's
        ``rope_override`` is checked with the config it makes)."""
        original = ModelView.build(config, numbers_checked=True)
        model = ModelView.build(config, intent.rope_override) if intent.rope_override is not None else original
        dtype, dtype_source = _model_dtype(model, intent)
        return cls(
            intent=intent,
            model=model,
            original=original,
            tokenizer_config=tokenizer_config,
            draft=ModelView.build(draft_config, numbers_checked=True) if draft_config is not None else None,
            lengths={t.name: _length(model, t, intent, tokenizer_config) for t in intent.engines},
            dtype=dtype,
            dtype_source=dtype_source,
        )

    @lazy
    def requested(self) -> int | None:
        return self.intent.max_model_len

    @lazy
    def _served(self) -> dict[str, int | None]:
        """Per target engine, the length it will serve (``served``), computed once per lint run."""
        return {name: length.served(self.requested) for name, length in self.lengths.items()}

    def served(self, engine: str) -> int | None:
        """The length ``engine`` will serve: the requested one, else the engine's default."""
        return self._served.get(engine, self.requested)

    @lazy
    def longest(self) -> int | None:
        """The longest length any target serves (None when nothing is known)."""
        return max((n for n in self._served.values() if n), default=None)

    def targets(self, *names: str) -> list[EngineTarget]:
        """The intent's targets among ``names`` (all targets when no name is given)."""
        if not names:
            return list(self.intent.engines)
        return [t for t in self.intent.engines if t.name in names]

    @lazy
    def target_names(self) -> tuple[str, ...]:
        """The names of every target."""
        return tuple(t.name for t in self.intent.engines)

    def targeted(self, *names: str) -> list[str]:
        """The names of ``targets(*names)``."""
        if not names:
            return list(self.target_names)
        return [name for name in self.target_names if name in names]

    @property
    def pairing(self) -> str:
        return self.model.family.pairing

    def hit(self, pointer: str, message: str, fix: str, engine: str | None = None) -> Hit:
        """A hit at ``pointer`` of the effective config; rope-override fields point into the intent."""
        if self.intent.rope_override is None:
            return Hit(pointer, message, fix, engine)
        override_root = pointers.join(self.model.text_pointer, "rope_parameters")
        if pointer == override_root or pointer.startswith(override_root + "/"):
            return Hit("/rope_override" + pointer[len(override_root) :], message, fix, engine, "intent")
        return Hit(pointer, message, fix, engine)

    def intent_hit(self, key: str, message: str, fix: str, engine: str | None = None) -> Hit:
        return Hit(pointers.join("", *key.split("/")), message, fix, engine, "intent")

    def table_dtype(self, engine: str) -> str:
        return "float32" if engine in FLOAT32_TABLE_ENGINES else self.dtype

    @lazy
    def numerics(self) -> list[NumericsRow]:
        """cos/sin error per target at the last position it serves (empty when the frequencies are undefined)."""
        main = self.model.computable_main
        if main is None:
            return []
        phase = self.intent.phase_dtype
        return [
            NumericsRow(name, self.table_error_of(main, served - 1, phase, self.table_dtype(name)))
            for name, served in self._served.items()  # every target, in the intent's order
            if served
        ]

    @lazy
    def float32_reference(self) -> TableError | None:
        """The error of float32 phases and float32 tables at the longest served position."""
        main, longest = self.model.computable_main, self.longest
        if main is None or not longest:
            return None
        return self.table_error_of(main, longest - 1, "float32", "float32")

    def table_error_of(self, main: RopeParams, position: int, phase_dtype: str, table_dtype: str) -> TableError:
        """``table_error`` of ``main``, looked up once per key in a lint run (several targets and the float32
        reference share one; a lookup in its cache hashes and compares the whole ``RopeParams``)."""
        key = (position, phase_dtype, table_dtype)
        if (error := self.table_errors.get(key)) is None:
            error = self.table_errors[key] = table_error(main, *key)
        return error


def _length(
    model: ModelView, target: EngineTarget, intent: DeploymentIntent, tokenizer_config: Mapping[str, Any] | None
) -> EngineLength:
    """``target``'s lengths for ``model``, with vLLM's window cap when the deployment disables the window."""
    cap = vllm_window_cap(model, target, intent) if target.name == "vllm" else None
    return derive_length(model, target.name, tokenizer_config, cap)


def _model_dtype(model: ModelView, intent: DeploymentIntent) -> tuple[str, str]:
    if intent.dtype is not None:
        return intent.dtype, "intent"
    for section, pointer in ((model.text, model.text_pointer), (model.document, "")):
        for key in ("dtype", "torch_dtype"):
            dtype = DTYPE_ALIASES.get(str(section.get(key, "")).lower())
            if dtype is not None:
                return dtype, pointers.join(pointer, key)
    return DEFAULT_DTYPE, "assumed"
