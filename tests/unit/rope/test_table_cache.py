"""The shared cos/sin table cache: bounded by the bytes it holds, and safe when threads grow one table at once.

Issue 13 items 3 and 4: 32 tiny requests once grew the cache to 32 tables of 64 MiB (2 GiB); and a thread that
grew a table a little could put its short rows back over a longer table another thread had just installed and was
gathering from (IndexError). The race is forced with hooks, so the test fails on the old code on every run.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ropeserve.config import RopeParams, from_explicit
from ropeserve.rope import TableCache, rope_cos_sin
from ropeserve.rope.tables import RopeTable

HEAD_DIM = 128
ROW_BYTES = 8 * HEAD_DIM // 2
"""cos + sin float32 bytes of one half-width row."""
HOOK_TIMEOUT_S = 30.0
"""A safety net against a deadlocked test only; every wait below ends on an event in the intended interleaving."""


def params(theta: float) -> RopeParams:
    return from_explicit({"head_dim": HEAD_DIM, "rope_theta": theta})


def test_thirty_two_tiny_requests_keep_the_cache_within_its_byte_budget() -> None:
    budget = 4 * 2048 * ROW_BYTES  # four tables of 2048 rows (1 MiB each)
    cache = TableCache(max_entries=32, max_bytes=budget)
    for index in range(32):  # one position each, as the attack: every table grows to 2048 rows
        rope_cos_sin(params(10_000.0 + index), torch.tensor([2000]), cache=cache)
        assert cache.nbytes <= budget
    assert cache.nbytes == budget and len(cache) == 4  # the least recently used tables were dropped
    latest, direct = (rope_cos_sin(params(10_031.0), torch.tensor([2000]), cache=c) for c in (cache, None))
    assert cache.hits == 1 and torch.equal(latest.cos, direct.cos)


def test_dropping_follows_recent_use_by_bytes() -> None:
    cache = TableCache(max_entries=32, max_bytes=2 * 1024 * ROW_BYTES)
    first, second, third = params(1e4), params(2e4), params(3e4)
    rope_cos_sin(first, torch.tensor([1000]), cache=cache)
    rope_cos_sin(second, torch.tensor([1000]), cache=cache)
    rope_cos_sin(first, torch.tensor([5]), cache=cache)  # first is now the most recent
    rope_cos_sin(third, torch.tensor([1000]), cache=cache)  # over budget: second goes
    held = {key[0].rope_theta for key in cache._tables}
    assert held == {1e4, 3e4} and cache.nbytes == 2 * 1024 * ROW_BYTES


def test_a_table_larger_than_the_budget_is_served_but_not_cached() -> None:
    cache = TableCache(max_bytes=64 * ROW_BYTES)
    positions = torch.tensor([3, 100_000, 64, 63])
    served = rope_cos_sin(params(5e5), positions, cache=cache)
    direct = rope_cos_sin(params(5e5), positions, cache=None)
    assert torch.equal(served.cos, direct.cos) and torch.equal(served.sin, direct.sin)
    assert cache.nbytes <= 64 * ROW_BYTES
    rope_cos_sin(params(5e5), torch.tensor([62]), cache=cache)  # within the budget: cached
    assert cache.nbytes == 64 * ROW_BYTES


def test_a_zero_budget_caches_no_rows() -> None:
    cache = TableCache(max_bytes=0)
    served = rope_cos_sin(params(1e4), torch.arange(300), cache=cache)
    assert torch.equal(served.cos, rope_cos_sin(params(1e4), torch.arange(300), cache=None).cos)
    assert cache.nbytes == 0


class _Interleaving:
    """Hooks that force the lost update: ``small`` computes a short growth from a stale read while ``large``
    grows the same table far and gathers from it.

    ``small``'s computation waits until ``large`` has installed its rows, or is waiting for the growth lock (the
    fix serialises growth); ``large``, right after installing, waits until ``small`` has installed too.
    """

    def __init__(self) -> None:
        self.small_computing = threading.Event()
        self.large_installed_or_waiting = threading.Event()
        self.small_installed = threading.Event()
        self.small: threading.Thread | None = None
        self.large: threading.Thread | None = None

    def computing(self) -> None:
        if threading.current_thread() is self.small:
            self.small_computing.set()
            assert self.large_installed_or_waiting.wait(HOOK_TIMEOUT_S)

    def installed(self) -> None:
        if threading.current_thread() is self.small:
            self.small_installed.set()
        elif threading.current_thread() is self.large:
            self.large_installed_or_waiting.set()
            self.small_installed.wait(HOOK_TIMEOUT_S)


class _HookedTable(RopeTable):
    hooks: _Interleaving

    def compute_half(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.hooks.computing()
        return super().compute_half(positions)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "rows" and hasattr(self, "hooks"):
            self.hooks.installed()


class _SignallingLock:
    """The table's growth lock, telling the hooks when ``large`` starts waiting for it."""

    def __init__(self, hooks: _Interleaving) -> None:
        self.hooks, self.lock = hooks, threading.Lock()

    def acquire(self, blocking: bool = True) -> bool:
        if threading.current_thread() is self.hooks.large:
            self.hooks.large_installed_or_waiting.set()
        return self.lock.acquire(blocking)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_concurrent_growth_is_monotonic_and_gathers_use_rows_that_cover_them() -> None:
    table = _HookedTable.build(params(1e4), None, torch.device("cpu"))
    hooks = _Interleaving()
    object.__setattr__(table, "hooks", hooks)
    object.__setattr__(table, "_growth_lock", _SignallingLock(hooks))
    results: dict[str, Any] = {}

    def gather(name: str, positions: torch.Tensor) -> None:
        try:
            results[name] = table.gather_half(positions)
        except Exception as error:  # recorded for the assertion below
            results[name] = error

    small_positions, large_positions = torch.arange(16), torch.arange(1024)
    hooks.small = threading.Thread(target=gather, args=("small", small_positions))
    hooks.large = threading.Thread(target=gather, args=("large", large_positions))
    hooks.small.start()
    assert hooks.small_computing.wait(HOOK_TIMEOUT_S)
    hooks.large.start()
    for thread in (hooks.small, hooks.large):
        thread.join(HOOK_TIMEOUT_S)
    for name, positions in (("small", small_positions), ("large", large_positions)):
        assert not isinstance(results[name], Exception), f"{name}: {results[name]!r}"
        cos, sin = results[name]
        expected_cos, expected_sin = table.compute_half(positions)
        assert torch.equal(cos, expected_cos) and torch.equal(sin, expected_sin)
    assert table.rows[0].shape[0] >= 1024, "a shorter table was put back over a longer one"


def test_many_threads_growing_one_cached_table_share_it_and_agree_with_direct_values() -> None:
    workers = 8
    cache = TableCache()
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []
    theta = params(7e4)

    def grow(stop: int) -> None:
        barrier.wait()
        try:
            served = rope_cos_sin(theta, torch.arange(stop), cache=cache)
            assert torch.equal(served.cos, rope_cos_sin(theta, torch.arange(stop), cache=None).cos)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=grow, args=(64 << index,)) for index in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HOOK_TIMEOUT_S)
    assert not errors
    assert cache.get(theta, None, torch.device("cpu")).rows[0].shape[0] == 64 << (workers - 1)


def test_build_elements_tells_what_a_lookup_would_compute_without_counting_it() -> None:
    """A miss builds the whole table (rows to the next power of two), a covered lookup nothing, a far position the
    grown table; past ``row_cap`` positions are computed one by one (0 to build). No hit or miss is counted."""
    cache, p, cpu = TableCache(), params(123.0), torch.device("cpu")
    n_freq = HEAD_DIM // 2
    assert cache.build_elements(p, None, cpu, 100) == 2 * 128 * n_freq
    assert (cache.hits, cache.misses, len(cache)) == (0, 0, 0)
    rope_cos_sin(p, torch.arange(101), cache=cache)
    counts = (cache.hits, cache.misses)
    assert cache.build_elements(p, None, cpu, 127) == 0
    assert cache.build_elements(p, None, cpu, 5000) == 2 * 8192 * n_freq
    table = cache.get(p, None, cpu)
    assert cache.build_elements(p, None, cpu, table.row_cap) == 0
    assert (cache.hits, cache.misses) == (counts[0] + 1, counts[1])  # only the get() above


def test_without_growth_wait_computes_the_positions_while_another_thread_grows_the_table() -> None:
    """Inline work (the event loop) must not wait while another thread grows a shared table (a growth can take
    up to the table's byte cap): within ``without_growth_wait`` the positions asked are computed directly, the
    same values, and the table is left to the thread growing it."""
    from ropeserve.rope.tables import without_growth_wait

    table = TableCache().get(from_explicit({"head_dim": 64, "rope_theta": 1e4}), None, torch.device("cpu"))
    positions = torch.tensor([5, 700, 3])
    expected = table.compute_half(positions)
    with table._growth_lock:  # held, as by a thread growing the table (Lock is not reentrant: a wait never ends)
        with without_growth_wait():
            cos, sin = table.gather_half(positions)
        assert table.rows[0].shape[0] == 0
    assert torch.equal(cos, expected[0]) and torch.equal(sin, expected[1])
    assert torch.equal(table.gather_half(positions)[0], cos) and table.rows[0].shape[0] == 1024  # grown after
