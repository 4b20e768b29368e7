"""``AnswerCache``: exact-bytes keys, least-recently-used eviction within a byte budget, thread safety."""

from __future__ import annotations

import threading

from ropeserve.serving.answers import ENTRY_OVERHEAD_BYTES, LABEL_OVERHEAD_BYTES, AnswerCache, CachedAnswer


def answer(size: int, labels: int = 0) -> CachedAnswer:
    return CachedAnswer(b"a" * size, tuple((f"RS{k}", "info") for k in range(labels)))


def test_an_answer_is_found_only_under_its_exact_bytes() -> None:
    cache = AnswerCache(max_bytes=10_000)
    stored = CachedAnswer(b'{"findings":[]}', (("RS101", "error"),))
    assert cache.put(b'{"config":{"a":1}}', stored)
    assert cache.get(b'{"config":{"a":1}}') is stored
    for other in (b'{"config":{"a":1.0}}', b'{"config": {"a":1}}', b'{"config":{"a":NaN}}', b""):
        assert cache.get(other) is None


def test_each_entry_is_charged_its_key_answer_and_labels() -> None:
    cache = AnswerCache(max_bytes=100_000)
    cache.put(b"k" * 10, answer(100, labels=3))
    assert cache.nbytes == 10 + 100 + 3 * LABEL_OVERHEAD_BYTES + ENTRY_OVERHEAD_BYTES
    cache.put(b"k" * 10, answer(50))  # the same key again: charged once, as the new answer
    assert cache.nbytes == 10 + 50 + ENTRY_OVERHEAD_BYTES
    assert len(cache) == 1


def test_least_recently_used_answers_go_first_and_the_budget_holds() -> None:
    charge = answer(700).charge(b"k0")
    cache = AnswerCache(max_bytes=3 * charge, max_entry_bytes=charge)
    for k in range(3):
        cache.put(f"k{k}".encode(), answer(700))
    assert cache.get(b"k0") is not None  # k0 is now the most recently used: k1 goes first
    cache.put(b"k3", answer(700))
    assert [cache.get(f"k{k}".encode()) is not None for k in range(4)] == [True, False, True, True]
    assert cache.nbytes == 3 * charge


def test_an_answer_over_the_entry_bound_or_a_zero_budget_is_not_stored() -> None:
    cache = AnswerCache(max_bytes=16_000)  # entries up to a sixteenth: 1,000 bytes
    assert not cache.put(b"k", answer(1_000))
    assert cache.put(b"k", answer(100))
    disabled = AnswerCache(max_bytes=0)
    assert not disabled.put(b"k", answer(1))
    assert disabled.get(b"k") is None
    assert disabled.nbytes == 0


def test_threads_storing_and_reading_keep_the_budget_and_their_answers() -> None:
    cache = AnswerCache(max_bytes=20 * answer(64).charge(b"key-000"), max_entry_bytes=1_000)
    wrong: list[str] = []

    def worker(seed: int) -> None:
        for k in range(300):
            key = f"key-{(seed * 7 + k) % 60:03d}".encode()
            cache.put(key, CachedAnswer(key * 9, ()))
            found = cache.get(key)
            if found is not None and found.body != key * 9:
                wrong.append(key.decode())

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong
    assert 0 < cache.nbytes <= cache.max_bytes
