"""The worker's signal matcher on its own, over a store that records what it is asked
(no database): a name wanted again while it is being matched is matched again (the
second ask may come from a commit the first match's snapshot missed), a failed match
is tried again, a name another match held is asked for again after a backoff that
delays no other name, and names are matched many to a transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any
from uuid import uuid4

import anyio
import pytest

from pgwork.adapters.notify import Notice
from pgwork.adapters.state import SignalDelivery, SignalMatch
from pgwork.worker import _signals as signals_module
from pgwork.worker._signals import SignalMatcher

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(20)]


class Store:
    """Records each match; the first waits for ``release``; ``fail`` fails the next;
    a name in ``held`` is returned busy (and taken out of it)."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self.release = anyio.Event()
        self.began = anyio.Event()
        self.fail = 0
        self.held: set[str] = set()
        self._answers: dict[int, anyio.Event] = {}

    async def match_signals(self, *, names: Sequence[str], limit: int = 100) -> SignalMatch:
        self.asked.append(list(names))
        self.began.set()
        if len(self.asked) == 1:
            await self.release.wait()
        if self.fail:
            self.fail -= 1
            raise ConnectionError("the database went away")
        busy = tuple(sorted(self.held.intersection(names)))
        self.held.difference_update(busy)
        self._answer(len(self.asked)).set()
        return SignalMatch(
            delivered=tuple(
                SignalDelivery(uuid4(), uuid4(), name, "q") for name in names if name not in busy
            ),
            busy=busy,
        )

    def _answer(self, count: int) -> anyio.Event:
        return self._answers.setdefault(count, anyio.Event())

    async def answered(self, count: int) -> None:
        """Return once ``count`` matches were answered."""
        await self._answer(count).wait()

    async def send_signals(self, *args: Any, **kwargs: Any) -> None: ...
    async def sweep_signals(self, *, limit: int = 100) -> SignalMatch: ...
    async def received_signal(self, *args: Any, **kwargs: Any) -> None: ...
    async def prune_signals(self, *, older_than: timedelta, limit: int = 1000) -> int: ...


class Notify:
    def __init__(self) -> None:
        self.published: list[Notice] = []

    async def publish(self, tx: object | None, *, notices: Sequence[Notice]) -> None:
        self.published.extend(notices)


@pytest.mark.parametrize("build", ["taken-before-matching", "control-dropped-after"])
async def test_a_name_wanted_again_during_its_match_is_matched_again(
    build: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, notify = Store(), Notify()
    matcher = SignalMatcher(store=store, notify=notify)  # type: ignore[arg-type]
    if build == "control-dropped-after":
        # The mechanism taken out: the names matched are forgotten once the match is
        # back, a name wanted again meanwhile with them.
        matched = matcher._match

        async def forgetful(names: list[str]) -> None:
            await matched(names)
            for name in names:
                matcher._wanted.pop(name, None)

        monkeypatch.setattr(matcher, "_match", forgetful)
    async with anyio.create_task_group() as group:
        group.start_soon(matcher.run_forever)
        matcher.want(["payment:1"])
        await store.began.wait()
        matcher.want(["payment:1", "payment:2"])  # committed after the match began
        store.release.set()
        with anyio.fail_after(5):
            await matcher.flush()
        group.cancel_scope.cancel()
    if build == "taken-before-matching":
        assert store.asked == [["payment:1"], ["payment:1", "payment:2"]]
        assert matcher.delivered == 3
    else:
        # The second ask for payment:1 was lost with the first.
        assert store.asked == [["payment:1"], ["payment:2"]]
    assert {n.queue for n in notify.published} == {"q"}


async def test_a_failed_match_is_tried_again() -> None:
    store, notify = Store(), Notify()
    store.release.set()
    store.fail = 1
    matcher = SignalMatcher(store=store, notify=notify)  # type: ignore[arg-type]
    async with anyio.create_task_group() as group:
        group.start_soon(matcher.run_forever)
        matcher.want(["a", "b"])
        with anyio.fail_after(5):
            await matcher.flush()
        group.cancel_scope.cancel()
    assert store.asked == [["a", "b"], ["a", "b"]]
    assert matcher.delivered == 2


@pytest.mark.parametrize("build", ["asked-again", "control-dropped"])
async def test_a_busy_name_is_asked_for_again(build: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store, notify = Store(), Notify()
    store.release.set()
    store.held = {"held"}
    if build == "control-dropped":
        # The mechanism taken out: the matcher is never told a name was busy.
        match_signals = store.match_signals

        async def forgetful(**kwargs: Any) -> SignalMatch:
            return replace(await match_signals(**kwargs), busy=())

        monkeypatch.setattr(store, "match_signals", forgetful)
    matcher = SignalMatcher(store=store, notify=notify)  # type: ignore[arg-type]
    async with anyio.create_task_group() as group:
        group.start_soon(matcher.run_forever)
        matcher.want(["held", "free"])
        with anyio.fail_after(5):
            await matcher.flush()
        group.cancel_scope.cancel()
    if build == "asked-again":
        assert store.asked == [["held", "free"], ["held"]]
        assert (matcher.busy, matcher.delivered) == (1, 2)
    else:
        assert store.asked == [["held", "free"]]
        assert matcher.delivered == 1


async def test_a_busy_names_backoff_delays_no_other_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signals_module, "BUSY_RETRY_S", 3600.0)
    store, notify = Store(), Notify()
    store.release.set()
    store.held = {"held"}
    matcher = SignalMatcher(store=store, notify=notify)  # type: ignore[arg-type]

    async with anyio.create_task_group() as group:
        group.start_soon(matcher.run_forever)
        matcher.want(["held"])
        with anyio.fail_after(5):
            await store.answered(1)
            matcher.want(["other"])  # while "held" waits out its backoff
            await store.answered(2)
        assert store.asked == [["held"], ["other"]]
        assert not matcher._idle.is_set()  # "held" is still to be asked again
        group.cancel_scope.cancel()


async def test_the_steps_a_match_starts_are_announced_one_look_each() -> None:
    """Three steps of one queue started by one match: a ``ready`` notice counting three,
    so that an adapter handing out looks (Redis, NATS) wakes a worker for each."""
    store, notify = Store(), Notify()
    store.release.set()
    matcher = SignalMatcher(store=store, notify=notify)  # type: ignore[arg-type]
    async with anyio.create_task_group() as group:
        group.start_soon(matcher.run_forever)
        matcher.want(["a", "b", "c"])
        with anyio.fail_after(5):
            await matcher.flush()
        group.cancel_scope.cancel()
    assert [(n.kind, n.queue, n.count) for n in notify.published] == [("ready", "q", 3)]
