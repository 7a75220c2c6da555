"""The event loop the suite's async code runs on: ``PGWORK_TEST_LOOP`` (``asyncio``, the
default, or ``uvloop``). Read by the anyio fixture and by the helpers that start an
event loop of their own in a subprocess or a thread (``run``)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

__all__ = ["TEST_LOOP", "run"]

T = TypeVar("T")

TEST_LOOP = os.environ.get("PGWORK_TEST_LOOP", "asyncio")
if TEST_LOOP not in ("asyncio", "uvloop"):
    raise RuntimeError(f"PGWORK_TEST_LOOP must be asyncio or uvloop, not {TEST_LOOP!r}")


def run(func: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``anyio.run`` on the suite's event loop."""
    return anyio.run(func, *args, backend_options={"use_uvloop": TEST_LOOP == "uvloop"})
