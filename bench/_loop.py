"""The event loop pgwork runs on in a benchmark: ``--loop`` of ``python -m bench`` and
of ``bench.cpu``, passed on to pgwork's worker and enqueuer processes.

``auto`` is what ``pgwork worker`` does (``pgwork.cli._common.loop_options``): uvloop
when it is installed, else asyncio's own loop. The peers run on the loop their own
command lines pick (``bench.peers.PEERS``), so each library is measured as it runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LOOPS", "current", "resolve", "run"]

T = TypeVar("T")

LOOPS = ("auto", "asyncio", "uvloop")


def resolve(choice: str) -> str:
    """``asyncio`` or ``uvloop``: what ``choice`` runs on here."""
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise SystemExit("--loop uvloop: uvloop is not installed") from None
        return "asyncio"
    return "uvloop"


def current() -> str:
    """The running event loop's kind: ``asyncio`` or ``uvloop`` (what a process the
    harness starts for pgwork, or the raw floor's, is told to run on)."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], loop: str) -> T:
    """``asyncio.run(main)`` on ``loop`` (``asyncio`` or ``uvloop``)."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    if loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
