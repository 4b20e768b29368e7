"""``lazy``: computed on the first read only, stored on the instance (frozen dataclasses too)."""

from __future__ import annotations

import threading
from dataclasses import FrozenInstanceError, dataclass, field

import pytest

from ropeserve.lint.lazy import lazy


@dataclass(frozen=True)
class Counted:
    base: int
    calls: list[int] = field(default_factory=list)

    @lazy
    def doubled(self) -> int:
        """Twice ``base``."""
        self.calls.append(1)
        return 2 * self.base


def test_computed_once_per_instance_and_stored_on_it() -> None:
    first, second = Counted(2), Counted(5)
    assert (first.doubled, first.doubled, second.doubled) == (4, 4, 10)
    assert (len(first.calls), len(second.calls)) == (1, 1)
    assert first.__dict__["doubled"] == 4
    with pytest.raises(FrozenInstanceError):
        first.base = 3  # type: ignore[misc]


def test_class_access_returns_the_descriptor_with_its_doc() -> None:
    assert isinstance(Counted.__dict__["doubled"], lazy)
    assert Counted.doubled.__doc__ == "Twice ``base``."


def test_each_instance_gets_its_own_value_across_threads() -> None:
    instances = [Counted(n) for n in range(64)]
    threads = [threading.Thread(target=lambda item=item: item.doubled) for item in instances]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [item.doubled for item in instances] == [2 * n for n in range(64)]
