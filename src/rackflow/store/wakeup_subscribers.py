"""This process's subscribers to "a schedule became due sooner" (`store.wakeups` says who tells them).

Its own module so that `Database`, which holds the one list per database, imports nothing that imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

Subscriber = Callable[[datetime | None], None]


class Wakeups:
    """This process's subscribers to "due sooner": each gets the announced time (None: look now)."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Add a subscriber; returns the function that removes it."""
        self._subscribers.append(subscriber)
        return lambda: self._subscribers.remove(subscriber)

    def deliver(self, at: datetime | None) -> None:
        for subscriber in list(self._subscribers):
            subscriber(at)
