"""Request-body memory: the idle-buffer pool (size classes, the idle cap, no allocation on take), leases, and
the budget of bodies in flight."""

from __future__ import annotations

import pytest

from ropeserve.errors import Busy
from ropeserve.serving import BodyBudget, BodyBuffers, BufferLease

MIB = 1 << 20


def pooled(pool: BodyBuffers, size: int) -> bytearray:
    """A body of ``size`` bytes grown as it arrived, answered and given back."""
    buffer = bytearray(size)
    pool.give_back(buffer)
    return buffer


def test_take_never_allocates_it_only_lends_an_idle_buffer() -> None:
    pool = BodyBuffers(idle_bytes=16 * MIB)
    assert pool.take(3 * MIB) is None, "an empty pool lends nothing: the body grows as its bytes arrive"
    buffer = pooled(pool, 3 * MIB + 7)
    view = pool.take(3 * MIB + 5)
    assert view is not None and len(view) == 3 * MIB + 5 and not view.readonly and view.obj is buffer
    assert pool.idle == 0


def test_an_idle_buffer_serves_only_bodies_that_fit_in_it() -> None:
    pool = BodyBuffers(idle_bytes=16 * MIB)
    buffer = pooled(pool, 3 * MIB)
    assert pool.take(3 * MIB + 1) is None, "same size class, but the idle buffer is too short"
    assert pool.take(2 * MIB - 1) is None, "another size class"
    view = pool.take(2 * MIB + 1)
    assert view is not None and view.obj is buffer


def test_small_bodies_and_a_zero_cap_are_never_pooled() -> None:
    small, off, capped = BodyBuffers(16 * MIB), BodyBuffers(0), BodyBuffers(2 * MIB)
    pooled(small, MIB - 1)
    pooled(off, 4 * MIB)
    pooled(capped, 3 * MIB)
    assert small.idle == off.idle == capped.idle == 0


def test_idle_buffers_stay_under_the_cap() -> None:
    pool = BodyBuffers(idle_bytes=6 * MIB)
    pooled(pool, 4 * MIB)
    pooled(pool, 4 * MIB)
    assert pool.idle == 4 * MIB


def test_a_lease_gives_back_once_what_it_took_or_kept() -> None:
    pool = BodyBuffers(idle_bytes=16 * MIB)
    lease = BufferLease(pool)
    lease.give_back()
    assert pool.idle == 0
    lease.keep(bytearray(2 * MIB))
    lease.give_back()
    lease.give_back()
    assert pool.idle == 2 * MIB
    assert lease.take(2 * MIB) is not None and pool.idle == 0
    lease.give_back()
    assert pool.idle == 2 * MIB


def test_the_budget_charges_each_claim_its_largest_size_and_refuses_past_the_limit() -> None:
    budget = BodyBudget(limit=10 * MIB, retry_after_s=3)
    first, second = budget.claim(), budget.claim()
    first.grow_to(4 * MIB)
    first.grow_to(2 * MIB)
    second.grow_to(6 * MIB)
    assert budget.used == 10 * MIB
    with pytest.raises(Busy) as refused:
        second.grow_to(6 * MIB + 1)
    assert refused.value.status == 503 and refused.value.headers["Retry-After"] == "3"
    first.release()
    second.grow_to(10 * MIB)
    assert budget.used == 10 * MIB
    second.release()
    assert budget.used == 0


def test_a_lent_buffer_is_charged_to_the_claim_before_use_and_returned_when_refused() -> None:
    pool, budget = BodyBuffers(idle_bytes=16 * MIB), BodyBudget(limit=5 * MIB)
    buffer = pooled(pool, 4 * MIB)
    claim = budget.claim()
    view = BufferLease(pool, claim).take(3 * MIB)
    assert view is not None and view.obj is buffer and budget.used == 4 * MIB
    claim.release()
    pool.give_back(buffer)  # its answer was sent
    budget.claim().grow_to(2 * MIB)
    with pytest.raises(Busy):
        BufferLease(pool, budget.claim()).take(3 * MIB)
    assert pool.idle == 4 * MIB, "a refused lend goes back to the pool"
