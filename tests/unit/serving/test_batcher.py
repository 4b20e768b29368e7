"""Micro-batcher with concurrent asyncio tasks: grouping, budgets, back-pressure, dropped clients, errors."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from ropeserve.errors import InvalidInput, NotReady, Overloaded
from ropeserve.serving.batcher import Batcher, ClientDisconnected


@dataclass(frozen=True)
class Item:
    value: int
    batch_key: str = "a"
    tokens: int = 1


@dataclass
class Recorder:
    """A run_batch that records its batches, can be held, and fails on negative values."""

    batches: list[list[int]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.release.set()

    def __call__(self, items: Sequence[Item]) -> list[int]:
        self.entered.set()
        self.release.wait(timeout=10)
        self.batches.append([item.value for item in items])
        if any(item.value < 0 for item in items):
            raise InvalidInput("negative", field="value")
        return [item.value * 10 for item in items]


@dataclass
class Observer:
    queue: list[float] = field(default_factory=list)
    kernel: list[float] = field(default_factory=list)
    sizes: list[tuple[int, int]] = field(default_factory=list)
    drops: int = 0
    depths: list[int] = field(default_factory=list)

    def queue_seconds(self, seconds: float) -> None:
        self.queue.append(seconds)

    def kernel_seconds(self, seconds: float) -> None:
        self.kernel.append(seconds)

    def batch(self, size: int, tokens: int) -> None:
        self.sizes.append((size, tokens))

    def dropped(self, count: int) -> None:
        self.drops += count

    def queue_depth(self, depth: int) -> None:
        self.depths.append(depth)


def make_batcher(recorder: Recorder, **options: object) -> Batcher[Item, int]:
    settings: dict[str, object] = {"max_batch_tokens": 100, "max_wait_s": 0.02, "queue_size": 64}
    settings.update(options)
    return Batcher(recorder, **settings)  # type: ignore[arg-type]


async def wait_entered(recorder: Recorder) -> None:
    await asyncio.to_thread(recorder.entered.wait, 10)


def test_concurrent_items_batch_by_key_with_the_same_results_as_unbatched() -> None:
    items = [Item(value, batch_key="ab"[value % 2]) for value in range(12)]

    async def run(enabled: bool) -> tuple[list[int], Recorder]:
        recorder = Recorder()
        batcher = make_batcher(recorder, enabled=enabled)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(item) for item in items))
        await batcher.stop()
        return [timed.value for timed in results], recorder

    batched, batched_recorder = asyncio.run(run(True))
    unbatched, unbatched_recorder = asyncio.run(run(False))
    assert batched == unbatched == [item.value * 10 for item in items]
    assert all(len(batch) == 1 for batch in unbatched_recorder.batches)
    assert len(batched_recorder.batches) < len(items)
    for batch in batched_recorder.batches:
        assert len({value % 2 for value in batch}) == 1


def test_token_budget_cuts_batches_and_big_items_run_alone() -> None:
    items = [Item(0, tokens=60), Item(1, tokens=30), Item(2, tokens=30), Item(3, tokens=500), Item(4, tokens=10)]

    async def run() -> Recorder:
        recorder = Recorder()
        batcher = make_batcher(recorder, max_wait_s=0.05)
        await batcher.start()
        await asyncio.gather(*(batcher.submit(item) for item in items))
        await batcher.stop()
        return recorder

    batches = asyncio.run(run()).batches
    sizes = {tuple(batch): sum(items[v].tokens for v in batch) for batch in batches}
    assert all(tokens <= 100 or len(batch) == 1 for batch, tokens in sizes.items())
    assert sorted(v for batch in batches for v in batch) == [0, 1, 2, 3, 4]
    assert [3] in batches


def test_full_queue_answers_overloaded_with_retry_after() -> None:
    async def run() -> Overloaded:
        recorder = Recorder()
        recorder.release.clear()
        batcher = make_batcher(recorder, queue_size=2, max_wait_s=0, retry_after_s=3)
        await batcher.start()
        running = asyncio.create_task(batcher.submit(Item(0)))
        await wait_entered(recorder)
        queued = [asyncio.create_task(batcher.submit(Item(v))) for v in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(Overloaded) as raised:
            await batcher.submit(Item(3))
        recorder.release.set()
        await asyncio.gather(running, *queued)
        await batcher.stop()
        return raised.value

    error = asyncio.run(run())
    assert error.status == 429 and error.headers == {"Retry-After": "3"}


def test_unbatched_mode_is_bounded_too() -> None:
    async def run() -> None:
        recorder = Recorder()
        recorder.release.clear()
        batcher = make_batcher(recorder, queue_size=2, enabled=False)
        await batcher.start()
        first = [asyncio.create_task(batcher.submit(Item(v))) for v in (0, 1)]
        await wait_entered(recorder)
        with pytest.raises(Overloaded):
            await batcher.submit(Item(2))
        recorder.release.set()
        assert [timed.value for timed in await asyncio.gather(*first)] == [0, 10]
        await batcher.stop()

    asyncio.run(run())


def test_disconnected_and_cancelled_requests_are_never_computed() -> None:
    observer = Observer()

    async def gone() -> bool:
        return True

    async def run() -> Recorder:
        recorder = Recorder()
        recorder.release.clear()
        batcher = make_batcher(recorder, max_wait_s=0, observer=observer)
        await batcher.start()
        blocker = asyncio.create_task(batcher.submit(Item(0)))
        await wait_entered(recorder)
        cancelled = asyncio.create_task(batcher.submit(Item(1)))
        disconnected = asyncio.create_task(batcher.submit(Item(2), is_disconnected=gone))
        kept = asyncio.create_task(batcher.submit(Item(3)))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        recorder.release.set()
        with pytest.raises(ClientDisconnected):
            await disconnected
        assert (await kept).value == 30
        await blocker
        assert cancelled.cancelled()
        await batcher.stop()
        return recorder

    recorder = asyncio.run(run())
    computed = [value for batch in recorder.batches for value in batch]
    assert 1 not in computed and 2 not in computed and 3 in computed
    assert observer.drops == 2


def test_a_failing_item_fails_alone() -> None:
    async def run() -> list[object]:
        batcher = make_batcher(Recorder(), max_wait_s=0.05)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(Item(v)) for v in (1, -1, 2)), return_exceptions=True)
        await batcher.stop()
        return results

    good, bad, other = asyncio.run(run())
    assert isinstance(bad, InvalidInput)
    assert good.value == 10 and other.value == 20  # type: ignore[union-attr]


def test_observer_sees_queue_kernel_and_batch_figures() -> None:
    observer = Observer()

    async def run() -> list[int]:
        batcher = make_batcher(Recorder(), observer=observer)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(Item(v, tokens=3)) for v in range(5)))
        await batcher.stop()
        return [timed.batch_tokens for timed in results]

    tokens = asyncio.run(run())
    assert len(observer.queue) == 5 and all(seconds >= 0 for seconds in observer.queue)
    assert len(observer.kernel) == len(observer.sizes) >= 1
    assert sum(size for size, _ in observer.sizes) == 5
    assert sum(tokens for _, tokens in observer.sizes) == 15
    assert set(tokens) <= {tokens for _, tokens in observer.sizes}
    assert observer.depths and max(observer.depths) >= 1


def test_stop_fails_waiting_items_and_refuses_new_ones() -> None:
    async def run() -> None:
        recorder = Recorder()
        recorder.release.clear()
        batcher = make_batcher(recorder, max_wait_s=0)
        await batcher.start()
        running = asyncio.create_task(batcher.submit(Item(0)))
        await wait_entered(recorder)
        waiting = asyncio.create_task(batcher.submit(Item(1)))
        await asyncio.sleep(0)
        stopping = asyncio.create_task(batcher.stop())
        await asyncio.sleep(0.01)
        recorder.release.set()
        await stopping
        with pytest.raises(NotReady):
            await waiting
        with pytest.raises(NotReady):
            await running
        with pytest.raises(NotReady):
            await batcher.submit(Item(2))

    asyncio.run(run())
