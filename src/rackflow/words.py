"""Counts in words, for people: "1 rack", "3 racks", never "1 racks". The one rule for the CLI's tables and
the console's pages alike."""

from __future__ import annotations


def noun_for(count: int | str, noun: str, plural: str = "") -> str:
    """`noun` for exactly one, else `plural` (default `noun` + "s"; give it for a noun that does not take an
    s: "deliveries"). A count shown as text ("10,000+", a capped count) is many."""
    return noun if count == 1 else plural or f"{noun}s"


def counted(count: int | str, noun: str, plural: str = "") -> str:
    """The count with its noun: `1 budget`, `0 budgets`, `10,000+ tasks`."""
    return f"{count} {noun_for(count, noun, plural)}"
