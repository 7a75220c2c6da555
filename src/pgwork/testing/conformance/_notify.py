"""The notify suite: what every ``NotifyAdapter`` does with a notice.

Absence is shown by ordering, not by waiting: to prove a notice never arrives, a test
publishes a *marker* after it and collects until the marker shows up; an adapter
delivers one publisher's notices in order, so anything still missing then is gone.
Only the "not before commit" checks watch a quiet listener for ``quiet_period``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import ClassVar

import anyio
import pytest

from pgwork.adapters.notify import Listener, Notice, NotifyAdapter
from pgwork.testing.conformance._rollback import rolled_back

__all__ = ["NotifyAdapterConformance", "TransactionFactory"]

TransactionFactory = Callable[[], AbstractAsyncContextManager[object]]
"""Opens a transaction ``publish`` accepts as ``tx``: committed on clean exit, rolled
back when the block raises."""


def _marker() -> Notice:
    return Notice(kind="ready", queue=f"marker-{uuid.uuid4().hex}")


class NotifyAdapterConformance:
    """Subclass and define a ``notify_adapter`` fixture (an adapter, closed after the
    test); optionally ``notify_transaction`` and the capability flags below."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.anyio]

    # --- capabilities ------------------------------------------------------------------
    delivers_on_commit_only: ClassVar[bool] = False
    """The adapter sees the caller's transaction: a notice published in it arrives only
    after commit, never after rollback."""
    folds_identical_notices: ClassVar[bool] = False
    """Identical notices published in one transaction arrive once."""

    # --- timing knobs ------------------------------------------------------------------
    delivery_timeout: ClassVar[float] = 10.0
    """Longest wait for a notice that must arrive."""
    quiet_period: ClassVar[float] = 0.3
    """How long a listener is watched to stay quiet before a commit."""

    @pytest.fixture
    def notify_adapter(self) -> NotifyAdapter:
        """Override: yield the ``NotifyAdapter`` under test."""
        pytest.fail(f"{type(self).__name__} must define a `notify_adapter` fixture")

    @pytest.fixture
    def notify_transaction(self) -> TransactionFactory | None:
        """Override (optional): a factory of transactions to publish in."""
        return None

    def _transactions(self, factory: TransactionFactory | None) -> TransactionFactory:
        if factory is None:
            if self.delivers_on_commit_only:
                pytest.fail("delivers_on_commit_only needs a `notify_transaction` fixture")
            pytest.skip("no `notify_transaction` fixture: transactional publishing untested")
        return factory

    async def _collect_until(
        self, listener: Listener, done: Callable[[Sequence[Notice]], bool]
    ) -> list[Notice]:
        """Gather notices until ``done(all so far)``; fail after ``delivery_timeout``."""
        got: list[Notice] = []
        deadline = time.monotonic() + self.delivery_timeout
        while not done(got):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for notices; got {got}"
            got.extend(await listener.wait(left))
        return got

    async def _through_marker(self, adapter: NotifyAdapter, listener: Listener) -> list[Notice]:
        """Publish a marker and return everything that arrived up to and including it."""
        marker = _marker()
        await adapter.publish(None, notices=[marker])
        return await self._collect_until(listener, lambda got: marker in got)

    # --- tests -------------------------------------------------------------------------

    async def test_listener_receives_a_published_notice(
        self, notify_adapter: NotifyAdapter
    ) -> None:
        assert isinstance(notify_adapter, NotifyAdapter)
        sent = [
            Notice(kind="ready", queue="mail"),
            Notice(kind="abort", job_id=uuid.uuid4(), reason="cancelled"),
            Notice(kind="chain_done", chain_id=uuid.uuid4()),
            Notice(kind="signal", name="payment:order | 7"),
        ]
        async with notify_adapter.listen() as listener:
            await notify_adapter.publish(None, notices=sent)
            got = await self._collect_until(listener, lambda got: all(n in got for n in sent))
        assert sorted(got, key=repr) == sorted(sent, key=repr)

    async def test_distinct_notices_all_arrive(self, notify_adapter: NotifyAdapter) -> None:
        sent = [Notice(kind="ready", queue=f"q{n}") for n in range(50)]
        async with notify_adapter.listen() as listener:
            for start in range(0, len(sent), 10):
                await notify_adapter.publish(None, notices=sent[start : start + 10])
            got = await self._collect_until(listener, lambda got: set(sent) <= set(got))
        assert set(got) == set(sent)

    async def test_wait_returns_an_empty_list_after_its_timeout(
        self, notify_adapter: NotifyAdapter
    ) -> None:
        async with notify_adapter.listen() as listener:
            with anyio.fail_after(self.delivery_timeout):
                assert await listener.wait(0.1) == []
                assert await listener.wait(0) == []

    async def test_every_listener_receives_the_notice(self, notify_adapter: NotifyAdapter) -> None:
        notice = Notice(kind="ready", queue="fan-out")
        async with (
            notify_adapter.listen() as one,
            notify_adapter.listen() as two,
            notify_adapter.listen() as three,
        ):
            await notify_adapter.publish(None, notices=[notice])
            for listener in (one, two, three):
                assert notice in await self._collect_until(listener, lambda got: notice in got)

    async def test_notice_published_in_a_transaction_arrives_once_committed(
        self,
        notify_adapter: NotifyAdapter,
        notify_transaction: TransactionFactory | None,
    ) -> None:
        transaction = self._transactions(notify_transaction)
        notice = Notice(kind="ready", queue="after-commit")
        async with notify_adapter.listen() as listener:
            async with transaction() as tx:
                await notify_adapter.publish(tx, notices=[notice])
                if self.delivers_on_commit_only:
                    early = await listener.wait(self.quiet_period)
                    assert notice not in early, "delivered before the transaction committed"
            got = await self._collect_until(listener, lambda got: notice in got)
        assert notice in got

    async def test_notice_published_in_a_rolled_back_transaction_never_arrives(
        self,
        notify_adapter: NotifyAdapter,
        notify_transaction: TransactionFactory | None,
    ) -> None:
        if not self.delivers_on_commit_only:
            pytest.skip("adapter does not claim delivers_on_commit_only")
        transaction = self._transactions(notify_transaction)
        notice = Notice(kind="ready", queue="rolled-back")
        async with notify_adapter.listen() as listener:
            async with rolled_back(transaction()) as tx:
                await notify_adapter.publish(tx, notices=[notice])
            got = await self._through_marker(notify_adapter, listener)
        assert notice not in got

    async def test_identical_notices_in_one_transaction_arrive_once(
        self,
        notify_adapter: NotifyAdapter,
        notify_transaction: TransactionFactory | None,
    ) -> None:
        if not self.folds_identical_notices:
            pytest.skip("adapter does not claim folds_identical_notices")
        transaction = self._transactions(notify_transaction)
        notice = Notice(kind="ready", queue="folded")
        async with notify_adapter.listen() as listener:
            async with transaction() as tx:
                await notify_adapter.publish(tx, notices=[notice, notice])
                await notify_adapter.publish(tx, notices=[notice])
            got = await self._collect_until(listener, lambda got: notice in got)
            got += await self._through_marker(notify_adapter, listener)
        assert got.count(notice) == 1
