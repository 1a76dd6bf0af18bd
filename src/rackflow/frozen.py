"""A frozen dataclass made almost as fast as a plain one: `quick_init`.

A frozen dataclass cannot assign its own fields, so the `__init__` that `dataclass` writes for it stores
each field through `object.__setattr__`, a call per field: 3.9 µs to make a `Task` of 23 fields, against
0.7 µs for the same class not frozen (Python 3.11). A firing makes ten such records (its schedule,
scope, task, run, outcome and the values between them), and a profile of a drain found 15 % of the
server's busy time in their `__init__`s (docs/PERFORMANCE.md, "Frozen records made directly").

`quick_init` replaces that `__init__` with one of the same signature that stores each field in the
instance's `__dict__` directly, which is where `object.__setattr__` put it: 1.1 µs for a `Task`.
Everything else stays as `dataclass(frozen=True)` made it: assigning a field still raises
`FrozenInstanceError`, and equality, hashing, `repr` and `dataclasses.replace` are unchanged. Put it
above the dataclass decorator:

    @quick_init
    @dataclass(frozen=True)
    class Task: ...

It takes only what it can copy exactly: a frozen dataclass without `__slots__`, `__post_init__`,
keyword-only fields or fields left out of `__init__`; anything else is refused when the class is made.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

_T = TypeVar("_T")


class _Factory:
    """The default of a field made by a `default_factory`, as `dataclass` marks it: called per instance."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def quick_init(cls: type[_T]) -> type[_T]:
    """Give the frozen dataclass `cls` an `__init__` that stores its fields directly (module
    docstring); refuse a class it cannot copy exactly."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    refused = [
        reason
        for reason, applies in (
            ("is not a frozen dataclass", not params.frozen),
            ("has __slots__", "__slots__" in cls.__dict__),
            ("has __post_init__", hasattr(cls, "__post_init__")),
            ("has keyword-only fields", any(f.kw_only for f in fields)),
            ("has fields outside __init__", any(not f.init for f in fields)),
        )
        if applies
    ]
    if refused:
        raise TypeError(f"quick_init: {cls.__qualname__} {', '.join(refused)}")
    # The generated names start with two underscores: a field's name never does (a class body mangles
    # it), so no field can shadow them.
    namespace: dict[str, Any] = {"__quick_factory": _FACTORY}
    parameters, values = ["__quick_self"], []
    for f in fields:
        if f.default is not dataclasses.MISSING:
            namespace[f"__quick_default_{f.name}"] = f.default
            parameters.append(f"{f.name}=__quick_default_{f.name}")
            values.append(f.name)
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"__quick_make_{f.name}"] = f.default_factory
            parameters.append(f"{f.name}=__quick_factory")
            values.append(f"__quick_make_{f.name}() if {f.name} is __quick_factory else {f.name}")
        else:
            parameters.append(f.name)
            values.append(f.name)
    stores = "".join(
        f"    __quick_dict[{f.name!r}] = {value}\n" for f, value in zip(fields, values, strict=True)
    )
    source = f"def __init__({', '.join(parameters)}):\n    __quick_dict = __quick_self.__dict__\n{stores}"
    # The source is made above from the class's own field names, as `dataclass` makes its own.
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses assigning a method
    return cls
