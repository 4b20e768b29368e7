"""asyncio micro-batcher: a bounded queue, grouping by key, one worker thread for the kernel.

``submit`` puts a work item on a bounded queue (full → ``Overloaded``, 429 with Retry-After). One consumer task
takes the first waiting item, then keeps collecting for up to ``max_wait_s`` or until ``max_batch_tokens`` are
queued, groups what it has by ``batch_key`` (first-come order), drops items whose client went away, and hands each
group, cut to the token budget, to ``run_batch`` in a single worker thread, so the event loop never runs tensor
code. With ``enabled=False`` every item runs alone in that thread, still bounded by the queue size.

Work items only need ``batch_key`` and ``tokens``; what a batch means is ``run_batch``'s business.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from ropeserve.errors import NotReady, Overloaded

logger = logging.getLogger("ropeserve.serving")


class Batchable(Protocol):
    """A work item: requests with equal ``batch_key`` may share a kernel call; ``tokens`` is their size."""

    @property
    def batch_key(self) -> Hashable: ...

    @property
    def tokens(self) -> int: ...


class BatchObserver(Protocol):
    """Metrics hooks (the API plugs Prometheus objects in; the batcher imports none)."""

    def queue_seconds(self, seconds: float) -> None: ...

    def kernel_seconds(self, seconds: float) -> None: ...

    def batch(self, size: int, tokens: int) -> None: ...

    def dropped(self, count: int) -> None: ...

    def queue_depth(self, depth: int) -> None: ...


class NullObserver:
    """Observer that records nothing."""

    def queue_seconds(self, seconds: float) -> None:
        pass

    def kernel_seconds(self, seconds: float) -> None:
        pass

    def batch(self, size: int, tokens: int) -> None:
        pass

    def dropped(self, count: int) -> None:
        pass

    def queue_depth(self, depth: int) -> None:
        pass


class ClientDisconnected(Exception):
    """The item was dropped before compute because its client went away."""


Work = TypeVar("Work", bound=Batchable)
Result = TypeVar("Result")
DisconnectCheck = Callable[[], Awaitable[bool]]


@dataclass(frozen=True)
class Timed(Generic[Result]):
    """A result with the timings of the kernel call that produced it."""

    value: Result
    queue_s: float
    compute_s: float
    batch_size: int
    batch_tokens: int


@dataclass
class _Job(Generic[Work, Result]):
    work: Work
    future: asyncio.Future[Timed[Result]]
    is_disconnected: DisconnectCheck | None
    enqueued: float = field(default_factory=time.perf_counter)


class Batcher(Generic[Work, Result]):
    """See the module docstring. ``run_batch(items) -> results`` (same order) runs in the worker thread."""

    def __init__(
        self,
        run_batch: Callable[[Sequence[Work]], list[Result]],
        *,
        max_batch_tokens: int,
        max_wait_s: float,
        queue_size: int,
        retry_after_s: int = 1,
        enabled: bool = True,
        observer: BatchObserver | None = None,
    ) -> None:
        self.run_batch, self.enabled = run_batch, enabled
        self.max_batch_tokens, self.max_wait_s = max_batch_tokens, max_wait_s
        self.queue_size, self.retry_after_s = queue_size, retry_after_s
        self.observer: BatchObserver = observer or NullObserver()
        self._queue: asyncio.Queue[_Job[Work, Result]] = asyncio.Queue(maxsize=queue_size)
        self._taken: list[_Job[Work, Result]] = []
        self._executor: ThreadPoolExecutor | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._unbatched_in_flight = 0

    async def start(self) -> None:
        """Start the worker thread (and the consumer task when batching)."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ropeserve-kernel")
        if self.enabled:
            self._consumer = asyncio.create_task(self._consume(), name="ropeserve-batcher")

    async def stop(self) -> None:
        """Stop consuming, fail every waiting item with NotReady, and let a running kernel call finish."""
        if self._consumer is not None:
            self._consumer.cancel()
            await asyncio.gather(self._consumer, return_exceptions=True)
            self._consumer = None
        waiting = self._taken + [self._queue.get_nowait() for _ in range(self._queue.qsize())]
        for job in waiting:
            _settle(job.future, self._not_ready())
        self._taken = []
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.to_thread(executor.shutdown, wait=True)

    async def submit(self, work: Work, is_disconnected: DisconnectCheck | None = None) -> Timed[Result]:
        """Run ``work`` (batched with compatible items when enabled). Overloaded when the queue is full;
        ClientDisconnected when ``is_disconnected`` said so before compute. Cancelling the caller drops it."""
        if self._executor is None:
            raise self._not_ready()
        future: asyncio.Future[Timed[Result]] = asyncio.get_running_loop().create_future()
        job = _Job(work, future, is_disconnected)
        if self.enabled:
            self._enqueue(job)
            return await future
        if self._unbatched_in_flight >= self.queue_size:
            raise self._overloaded()
        self._unbatched_in_flight += 1
        try:
            await self._run([job])
        finally:
            self._unbatched_in_flight -= 1
        return await future

    def _not_ready(self) -> NotReady:
        return NotReady("the rotation worker is not running", headers={"Retry-After": str(self.retry_after_s)})

    def _overloaded(self) -> Overloaded:
        return Overloaded(
            f"{self.queue_size} rotation requests are already waiting; retry later",
            headers={"Retry-After": str(self.retry_after_s)},
            limit=self.queue_size,
        )

    def _enqueue(self, job: _Job[Work, Result]) -> None:
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise self._overloaded() from None
        self.observer.queue_depth(self._queue.qsize())

    async def _consume(self) -> None:
        while True:
            self._taken = [await self._queue.get()]
            await self._collect()
            self.observer.queue_depth(self._queue.qsize())
            for batch in self._batches(self._taken):
                await self._run(batch)
            self._taken = []

    async def _collect(self) -> None:
        """Take more waiting jobs until ``max_wait_s`` passes or the token budget is reached."""
        tokens = sum(job.work.tokens for job in self._taken)
        deadline = time.perf_counter() + self.max_wait_s
        while tokens < self.max_batch_tokens:
            try:
                job = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    return
                try:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    return
            self._taken.append(job)
            tokens += job.work.tokens

    def _batches(self, jobs: list[_Job[Work, Result]]) -> list[list[_Job[Work, Result]]]:
        """Group by key in arrival order, cutting each group at the token budget (a larger job runs alone)."""
        open_batches: dict[Hashable, tuple[list[_Job[Work, Result]], int]] = {}
        batches: list[list[_Job[Work, Result]]] = []
        for job in jobs:
            key, tokens = job.work.batch_key, job.work.tokens
            batch, batch_tokens = open_batches.get(key, ([], 0))
            if not batch or batch_tokens + tokens > self.max_batch_tokens:
                batch, batch_tokens = [], 0
                batches.append(batch)
            batch.append(job)
            open_batches[key] = (batch, batch_tokens + tokens)
        return batches

    async def _run(self, jobs: list[_Job[Work, Result]]) -> None:
        """Drop jobs whose client left, run the rest as one kernel call, and settle their futures."""
        live = await self._live(jobs)
        if not live:
            return
        assert self._executor is not None
        loop = asyncio.get_running_loop()
        try:
            run = await loop.run_in_executor(self._executor, self._timed_run, [job.work for job in live])
        except asyncio.CancelledError:
            for job in live:
                _settle(job.future, self._not_ready())
            raise
        tokens = sum(job.work.tokens for job in live)
        self.observer.kernel_seconds(run.seconds)
        self.observer.batch(len(live), tokens)
        for job, outcome in zip(live, run.outcomes, strict=True):
            queue_s = run.started - job.enqueued
            self.observer.queue_seconds(queue_s)
            if isinstance(outcome, BaseException):
                _settle(job.future, outcome)
            else:
                _settle(job.future, Timed(outcome, queue_s, run.seconds, len(live), tokens))

    def _timed_run(self, works: list[Work]) -> _Run[Result]:
        """In the worker: ``run_batch`` on all items, timed; if a batch of several fails, each item again
        alone, so one bad item fails only itself."""
        started = time.perf_counter()
        try:
            outcomes: list[Result | BaseException] = list(self.run_batch(works))
        except Exception as error:
            if len(works) == 1:
                outcomes = [error]
            else:
                logger.warning("a batch of %d failed (%r); running its items one by one", len(works), error)
                outcomes = [self._run_alone(work) for work in works]
        return _Run(outcomes, started, time.perf_counter() - started)

    def _run_alone(self, work: Work) -> Result | BaseException:
        try:
            return self.run_batch([work])[0]
        except Exception as error:
            return error

    async def _live(self, jobs: list[_Job[Work, Result]]) -> list[_Job[Work, Result]]:
        live = []
        for job in jobs:
            if job.future.done() or (job.is_disconnected is not None and await job.is_disconnected()):
                _settle(job.future, ClientDisconnected("client disconnected before compute"))
            else:
                live.append(job)
        if len(live) < len(jobs):
            self.observer.dropped(len(jobs) - len(live))
        return live


@dataclass(frozen=True)
class _Run(Generic[Result]):
    outcomes: list[Result | BaseException]
    started: float
    seconds: float


def _settle(future: asyncio.Future[Timed[Result]], outcome: Timed[Result] | BaseException) -> None:
    """Resolve ``future`` unless its caller already gave up."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
