"""Building frozen, slotted dataclasses the worker makes one of per job, for less.

A frozen dataclass's generated ``__init__`` sets every field through
``object.__setattr__`` (the class's own ``__setattr__`` refuses), which looks the
name up on the type each time, and a worker builds four such records per job. The
fields' own slot descriptors set them directly, in well under half the time for a
``Job`` (``python -m bench.cpu --only drain --profile FILE`` shows the builders).
Nothing else differs: the object is of the same class, compares, hashes and pickles
the same, and stays frozen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

__all__ = ["frozen_builder"]

T = TypeVar("T")


def frozen_builder(cls: type[T], names: Sequence[str]) -> Callable[..., T]:
    """A function that builds a ``cls`` from positional values, one for each field
    in ``names`` (the caller's order, not necessarily the declaration's).

    ``names`` must be every field of ``cls`` without a default, each once: a required
    field added to the class later fails here, at import, instead of being left unset.
    A field with a default that ``names`` leaves out is set to its default, as the
    class's ``__init__`` would. ``cls`` must be a slotted dataclass without
    ``__post_init__`` (nothing would run it)."""
    if not dataclasses.is_dataclass(cls) or "__slots__" not in vars(cls):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__, which the builder would skip")
    fields = dataclasses.fields(cls)
    defaulted = {
        f.name: f
        for f in fields
        if f.name not in names
        and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
    }
    required = [f.name for f in fields if f.name not in defaulted]
    if sorted(names) != sorted(required):
        raise TypeError(f"{cls.__name__}'s builder must name each of its fields once: {required}")
    # One line per field, as ``dataclasses`` writes ``__init__`` itself: a loop over
    # the setters cost two thirds more.
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def build_{cls.__name__}({', '.join(names)}):", "    obj = _new(_cls)"]
    for name in names:
        scope[f"_set_{name}"] = getattr(cls, name).__set__
        lines.append(f"    _set_{name}(obj, {name})")
    for name, f in defaulted.items():
        scope[f"_set_{name}"] = getattr(cls, name).__set__
        if f.default_factory is not dataclasses.MISSING:
            scope[f"_make_{name}"] = f.default_factory
            lines.append(f"    _set_{name}(obj, _make_{name}())")
        else:
            scope[f"_default_{name}"] = f.default
            lines.append(f"    _set_{name}(obj, _default_{name})")
    lines.append("    return obj")
    exec("\n".join(lines), scope)  # the names are the dataclass's own fields
    build: Callable[..., T] = scope[f"build_{cls.__name__}"]
    return build
