"""`rackflow.frozen.quick_init`: the same records as `dataclass(frozen=True)` makes, made directly."""

from __future__ import annotations

import dataclasses
import inspect
import pkgutil
from dataclasses import FrozenInstanceError, dataclass, field
from importlib import import_module

import pytest

import rackflow
from rackflow.frozen import quick_init


def _record(name: str) -> type:
    """A frozen record of four fields (a default, a factory, one left out of equality) as `dataclass`
    alone makes it: `Twin` as it is, `Sample` given quick_init's `__init__` too."""
    fields = [
        ("name", str),
        ("size", int, field(default=3)),
        ("tags", list[str], field(default_factory=list)),
        ("note", str, field(default="", compare=False)),
    ]
    return dataclasses.make_dataclass(name, fields, frozen=True)


Twin = _record("Twin")
Sample = quick_init(_record("Sample"))


def test_it_stores_what_dataclass_stores() -> None:
    for args, kwargs in [
        (("a",), {}),
        (("a", 5), {}),
        (("a",), {"size": 5, "tags": ["x"], "note": "n"}),
        ((), {"name": "a", "note": "n"}),
    ]:
        made, twin = Sample(*args, **kwargs), Twin(*args, **kwargs)
        assert vars(made) == vars(twin)
        assert repr(made) == repr(twin).replace("Twin", "Sample")


def test_a_factory_makes_a_new_default_per_record() -> None:
    first, second = Sample("a"), Sample("b")
    assert first.tags == [] and first.tags is not second.tags
    given = ["x"]
    assert Sample("c", tags=given).tags is given


def test_the_record_stays_frozen_hashable_and_replaceable() -> None:
    made = Sample("a", 5, ("x",), "n")  # a tuple, so the record hashes
    with pytest.raises(FrozenInstanceError):
        made.size = 6
    assert made == Sample("a", 5, ("x",), "other")  # note: compare=False
    assert hash(made) == hash(Sample("a", 5, ("x",)))
    assert dataclasses.replace(made, size=6) == Sample("a", 6, ("x",), "n")


def test_a_field_may_bear_any_name_the_init_uses() -> None:
    @quick_init
    @dataclass(frozen=True)
    class Odd:
        self: int
        d: int = 1
        make: list[int] = field(default_factory=list)

    assert vars(Odd(self=2, d=3)) == {"self": 2, "d": 3, "make": []}


def test_wrong_arguments_fail_as_they_do_for_dataclass() -> None:
    for call in (lambda cls: cls(), lambda cls: cls("a", nope=1), lambda cls: cls("a", 1, [], "n", 9)):
        with pytest.raises(TypeError):
            call(Twin)
        with pytest.raises(TypeError):
            call(Sample)


def test_what_it_cannot_copy_exactly_is_refused() -> None:
    @dataclass
    class Loose:
        a: int

    @dataclass(frozen=True, slots=True)
    class Slotted:
        a: int

    @dataclass(frozen=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, kw_only=True)
    class KeywordOnly:
        a: int

    @dataclass(frozen=True)
    class Hidden:
        a: int = field(init=False, default=1)

    for cls, reason in [
        (Loose, "is not a frozen dataclass"),
        (Slotted, "has __slots__"),
        (Checked, "has __post_init__"),
        (KeywordOnly, "has keyword-only fields"),
        (Hidden, "has fields outside __init__"),
    ]:
        with pytest.raises(TypeError, match=reason):
            quick_init(cls)


def test_every_quick_record_of_rackflow_takes_its_fields_in_order() -> None:
    """Each class the house decorates takes its fields as `dataclass` would: in order, with their
    defaults, a factory's default shown as dataclass shows it."""
    decorated = []
    for module in pkgutil.walk_packages(rackflow.__path__, "rackflow."):
        if not module.name.endswith(("_pb2", "_pb2_grpc", "__main__")) and ".migrations" not in module.name:
            decorated += [value for value in vars(import_module(module.name)).values() if _quick(value)]
    assert len(set(decorated)) >= 10
    for cls in set(decorated):
        parameters = list(inspect.signature(cls).parameters.values())
        fields = dataclasses.fields(cls)
        assert [p.name for p in parameters] == [f.name for f in fields], cls
        for p, f in zip(parameters, fields, strict=True):
            if f.default is not dataclasses.MISSING:
                assert p.default is f.default, (cls, f.name)
            elif f.default_factory is not dataclasses.MISSING:
                assert repr(p.default) == "<factory>", (cls, f.name)
            else:
                assert p.default is inspect.Parameter.empty, (cls, f.name)


def _quick(value: object) -> bool:
    """A class whose `__init__` is quick_init's: it stores into `self.__dict__`, which neither of the
    `__init__`s `dataclass` writes names."""
    init = getattr(value, "__init__", None)
    names = getattr(getattr(init, "__code__", None), "co_names", ())
    return isinstance(value, type) and dataclasses.is_dataclass(value) and "__dict__" in names
