"""``lazy``: an attribute computed on first access and then stored on the instance (torch-free).

It is ``functools.cached_property`` without the lock that Python 3.11's version takes on every first access (one
lock per class attribute, shared by all instances; Python 3.12 dropped it): a lint run computes about fifteen such
values once each, and the lock cost more than several of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Self, TypeVar, overload

T = TypeVar("T")


class lazy(Generic[T]):  # noqa: N801 - a decorator, named like ``property``
    """Decorate a method taking only ``self``: the first read of the attribute calls it and stores the result
    in the instance ``__dict__`` (frozen dataclasses included), which later reads find without a call."""

    def __init__(self, compute: Callable[[Any], T]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> T | Self:
        if instance is None:
            return self
        value = self.compute(instance)
        instance.__dict__[self.name] = value
        return value
