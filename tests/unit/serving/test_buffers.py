"""Request-body buffer pool: exact-size lends, size classes, the idle cap, and leases."""

from __future__ import annotations

from ropeserve.serving import BodyBuffers, BufferLease

MIB = 1 << 20


def test_lends_an_exact_size_writable_view_on_a_power_of_two_buffer() -> None:
    view = BodyBuffers(idle_bytes=16 * MIB).take(3 * MIB + 5)
    assert view is not None and len(view) == 3 * MIB + 5 and not view.readonly
    assert isinstance(view.obj, bytearray) and len(view.obj) == 4 * MIB


def test_small_bodies_and_a_zero_cap_get_no_pooled_buffer() -> None:
    assert BodyBuffers(idle_bytes=16 * MIB).take(MIB - 1) is None
    assert BodyBuffers(idle_bytes=0).take(4 * MIB) is None
    assert BodyBuffers(idle_bytes=2 * MIB).take(3 * MIB) is None, "bodies larger than the cap are never pooled"


def test_a_returned_buffer_serves_the_next_body_of_its_size_class() -> None:
    pool = BodyBuffers(idle_bytes=16 * MIB)
    first = pool.take(3 * MIB)
    assert first is not None
    pool.give_back(first)
    assert pool.idle == 4 * MIB
    second = pool.take(2 * MIB + 1)
    assert second is not None and second.obj is first.obj and pool.idle == 0
    other_class = pool.take(MIB)
    assert other_class is not None and other_class.obj is not first.obj


def test_idle_buffers_stay_under_the_cap() -> None:
    pool = BodyBuffers(idle_bytes=6 * MIB)
    views = [pool.take(4 * MIB), pool.take(4 * MIB)]
    for view in views:
        assert view is not None
        pool.give_back(view)
    assert pool.idle == 4 * MIB


def test_a_lease_gives_back_once_and_only_what_it_took() -> None:
    pool = BodyBuffers(idle_bytes=16 * MIB)
    lease = BufferLease(pool)
    lease.give_back()
    assert pool.idle == 0
    assert lease.take(2 * MIB) is not None
    lease.give_back()
    lease.give_back()
    assert pool.idle == 2 * MIB
