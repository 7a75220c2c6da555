"""Finding what a command names as ``MODULE:ATTR`` (a worker factory, schedules): one
line, not a traceback, when it cannot be imported."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from pgwork.errors import ConfigurationError

__all__ = ["import_failed", "load_target"]


def load_target(target: str, *, what: str, example: str) -> object:
    """Import ``module:attr`` (``attr`` may be dotted) with the current directory on the
    path; ``what`` and ``example`` name it in the error of a malformed target."""
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr:
        raise ConfigurationError(f"{what} {target!r} is not MODULE:ATTR (e.g. {example})")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise import_failed(module_name, target, exc) from exc
        raise ConfigurationError(f"cannot import {module_name!r} for {target!r}: {exc}") from exc
    except Exception as exc:
        raise import_failed(module_name, target, exc) from exc
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigurationError(
                f"{module_name!r} has no attribute {attr!r} (from {target!r})"
            ) from None
    return found


def import_failed(module_name: str, target: str, exc: Exception) -> ConfigurationError:
    """One line for a module that exists but fails while importing: the error, where it
    was raised, and how to see the whole traceback."""
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" ({exc.filename}, line {exc.lineno})"
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        own = [f for f in frames if not f.filename.startswith("<frozen ")]
        if own:
            where = f" ({own[-1].filename}, line {own[-1].lineno})"
    detail = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    return ConfigurationError(
        f"importing {module_name!r} for {target!r} failed: {type(exc).__name__}: "
        f"{detail}{where}; run `python -c 'import {module_name}'` for the traceback"
    )
