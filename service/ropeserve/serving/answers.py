"""``AnswerCache``: the encoded answers of a deterministic endpoint, kept under the exact request bytes.

For an endpoint whose answer is a pure function of its request body (the config linter: the same config, intent
and documents always give the same report), a request whose body is byte for byte one answered before gets that
answer's bytes again instead of recomputing it. What is shared between requests is immutable: the key and the
answer are ``bytes``, and the per-answer labels a route re-counts are a tuple of string pairs. Nothing of one
request can reach another's answer unless the two sent the same bytes, and then the answers are the same by
construction. Only answers the caller chose to store are ever returned (a route stores its 200 answers only).

Bounded in bytes: every entry is charged its key, its answer, its labels and ``ENTRY_OVERHEAD_BYTES``; an entry
over ``max_entry_bytes`` is not stored; least recently used entries are dropped until the total fits ``max_bytes``
(0: nothing is stored). Thread-safe (the linter of a large body runs in the threadpool).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

ENTRY_OVERHEAD_BYTES = 256
"""Charged per entry besides its bytes: the dict slot, the objects around the key and the answer."""
LABEL_OVERHEAD_BYTES = 128
"""Charged per stored label pair (a tuple of two short strings)."""
ENTRIES_PER_BUDGET = 16
"""The default largest entry is this fraction of the budget, so that one large answer cannot empty the cache."""


@dataclass(frozen=True)
class CachedAnswer:
    """An encoded answer and the labels its route counts each time it is served (the linter: one
    ``(rule, severity)`` per finding)."""

    body: bytes
    labels: tuple[tuple[str, str], ...] = ()

    def charge(self, key: bytes) -> int:
        """Bytes this answer is charged when stored under ``key``."""
        return len(key) + len(self.body) + LABEL_OVERHEAD_BYTES * len(self.labels) + ENTRY_OVERHEAD_BYTES


class AnswerCache:
    """Thread-safe LRU of ``CachedAnswer`` by request bytes, bounded in bytes (module docstring)."""

    def __init__(self, max_bytes: int, max_entry_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_bytes // ENTRIES_PER_BUDGET if max_entry_bytes is None else max_entry_bytes
        self._answers: OrderedDict[bytes, tuple[CachedAnswer, int]] = OrderedDict()  # (answer, bytes charged)
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> CachedAnswer | None:
        """The answer stored under ``key`` (now the most recently used), or None."""
        with self._lock:
            found = self._answers.get(key)
            if found is None:
                return None
            self._answers.move_to_end(key)
            return found[0]

    def put(self, key: bytes, answer: CachedAnswer) -> bool:
        """Store ``answer`` under ``key`` unless it is over ``max_entry_bytes``; returns whether it was stored."""
        charged = answer.charge(key)
        if charged > min(self.max_entry_bytes, self.max_bytes):
            return False
        with self._lock:
            previous = self._answers.pop(key, None)
            if previous is not None:
                self._held -= previous[1]
            self._answers[key] = (answer, charged)
            self._held += charged
            while self._held > self.max_bytes:
                self._held -= self._answers.popitem(last=False)[1][1]
        return True

    @property
    def nbytes(self) -> int:
        """Bytes charged to the stored answers now (at most ``max_bytes``)."""
        with self._lock:
            return self._held

    def __len__(self) -> int:
        return len(self._answers)
