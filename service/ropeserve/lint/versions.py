"""A tiny, dependency-free version parser for engine pins such as ``vllm==0.9.1`` or ``vllm>=0.10,<0.12``.

Versions follow the PEP 440 subset engines actually publish: ``N(.N)*`` with optional ``aN``/``bN``/``rcN``,
``.postN``, ``.devN`` and a ``+local`` tag (ignored); a leading ``v`` is dropped, and llama.cpp build tags
``b4500`` read as version ``4500``. A specifier is a comma-separated list of ``==``, ``!=``, ``>=``, ``>``,
``<=``, ``<`` and ``~=`` clauses (``==`` accepts a trailing ``.*``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

from ropeserve.errors import InvalidInput

_VERSION = re.compile(
    r"^[vb]?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[.-]?(?P<pre>a|b|rc|alpha|beta|c)(?P<pre_n>\d*))?"
    r"(?:[.-]?post(?P<post>\d*))?"
    r"(?:[.-]?dev(?P<dev>\d*))?"
    r"(?:\+[a-z0-9.]+)?$",
    re.IGNORECASE,
)
_NUMBERS = re.compile(r"\d+")
MAX_VERSION_DIGITS = 18
"""Most digits of one number in a version (real ones have at most 8, e.g. a date); longer ones are refused
before ``int()`` (which refuses 4,300 digits with a plain ValueError)."""
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2}
_FINAL = 3
_CLAUSE = re.compile(r"^(?P<op>===|==|!=|>=|<=|~=|>|<)\s*(?P<version>\S+)$")


@total_ordering
@dataclass(frozen=True)
class Version:
    """A parsed version; ordered like PEP 440 (dev < pre-release < final < post-release)."""

    text: str
    release: tuple[int, ...]
    stage: tuple[int, int] = (_FINAL, 0)
    post: int = -1
    dev: float = float("inf")

    @classmethod
    def parse(cls, text: str) -> Version:
        match = _VERSION.match(text.strip())
        if match is None:
            raise InvalidInput(f"not a version: {shortened(text)!r}", field="version")
        longest = max(len(number) for number in _NUMBERS.findall(text))
        if longest > MAX_VERSION_DIGITS:
            raise InvalidInput(
                f"a version number of {longest} digits; at most {MAX_VERSION_DIGITS} are accepted", field="version"
            )
        release = tuple(int(part) for part in match["release"].split("."))
        while len(release) > 1 and release[-1] == 0:
            release = release[:-1]
        stage = (_PRE_RANK[match["pre"].lower()], int(match["pre_n"] or 0)) if match["pre"] else (_FINAL, 0)
        post = int(match["post"] or 0) if match["post"] is not None else -1
        dev = float(match["dev"] or 0) if match["dev"] is not None else float("inf")
        if dev != float("inf") and stage == (_FINAL, 0) and post < 0:
            stage = (-1, 0)  # 1.0.dev0 sorts before 1.0a1
        return cls(text.strip(), release, stage, post, dev)

    def _key(self) -> tuple[tuple[int, ...], tuple[int, int], int, float]:
        return self.release, self.stage, self.post, self.dev

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return self.text


def shortened(text: str, keep: int = 60) -> str:
    """``text`` cut to ``keep`` characters for an error message (a hostile version string can be megabytes)."""
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


@dataclass(frozen=True)
class Clause:
    op: str
    version: Version
    prefix: bool = False  # ``==X.*``

    def allows(self, candidate: Version) -> bool:
        if self.prefix:
            matches = candidate.release[: len(self.version.release)] == self.version.release
            return matches if self.op == "==" else not matches
        return bool(_COMPARE[self.op](candidate, self.version))

    def __str__(self) -> str:
        return f"{self.op}{self.version}{'.*' if self.prefix else ''}"


def _compatible(candidate: Version, base: Version) -> bool:
    upper = Version.parse(".".join(str(n) for n in (*base.release[:-2], base.release[-2] + 1)))
    return base <= candidate < upper


_COMPARE = {
    "==": lambda a, b: a == b,
    "===": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    "~=": _compatible,
}


@dataclass(frozen=True)
class VersionSpec:
    """A conjunction of clauses; the empty spec admits every version."""

    clauses: tuple[Clause, ...] = ()

    @classmethod
    def parse(cls, text: str) -> VersionSpec:
        clauses = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            match = _CLAUSE.match(part)
            if match is None:
                raise InvalidInput(f"not a version constraint: {shortened(part)!r}", field="version")
            raw, prefix = match["version"], False
            if raw.endswith(".*") and match["op"] in ("==", "!="):
                raw, prefix = raw[:-2], True
            if match["op"] == "~=" and "." not in raw:
                raise InvalidInput(f"~= needs at least two release parts: {part!r}", field="version")
            clauses.append(Clause(match["op"], Version.parse(raw), prefix))
        return cls(tuple(clauses))

    def allows(self, version: Version) -> bool:
        return all(clause.allows(version) for clause in self.clauses)

    def may_predate(self, bound: Version) -> bool:
        """Whether the spec admits a version older than ``bound``.

        An empty spec (no version given) is read as "a current release" and does not.
        """
        if not self.clauses:
            return False
        pins = [c.version for c in self.clauses if c.op in ("==", "===") and not c.prefix]
        if pins:
            return pins[0] < bound and self.allows(pins[0])
        lower = [c for c in self.clauses if c.op in (">=", ">", "~=") or (c.op == "==" and c.prefix)]
        return all(c.version < bound for c in lower)

    @property
    def pinned(self) -> bool:
        return any(c.op in ("==", "===") and not c.prefix for c in self.clauses)

    def __str__(self) -> str:
        return ",".join(str(c) for c in self.clauses)
