"""The notify suite: what every ``NotifyAdapter`` does with a notice.

Absence is shown by ordering, not by waiting: to prove a notice never arrives, a test
publishes a *marker* after it and collects until the marker shows up; an adapter
delivers one publisher's notices in order, so anything still missing then is gone.
Only the "not before commit" checks watch a quiet listener for ``quiet_period``.

Every adapter honours ``notify_after_commit``: one that sees the caller's transaction
delivers on commit anyway, one that does not holds what is published with a
transaction inside the block until the block exits. An adapter that hands out hints
(``hands_out_hints``) turns a counted ``ready`` notice into that many looks, claimed
through its listeners (``ClaimsHints``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import replace
from typing import ClassVar

import anyio
import pytest

from pgwork.adapters.after_commit import notify_after_commit
from pgwork.adapters.notify import ClaimsHints, Listener, Notice, NotifyAdapter
from pgwork.testing.conformance._rollback import rolled_back

__all__ = ["NotifyAdapterConformance", "TransactionFactory"]

TransactionFactory = Callable[[], AbstractAsyncContextManager[object]]
"""Opens a transaction ``publish`` accepts as ``tx``: committed on clean exit, rolled
back when the block raises."""


def _marker() -> Notice:
    return Notice(kind="ready", queue=f"marker-{uuid.uuid4().hex}")


class _BlockFailed(Exception):
    """Raised inside a ``notify_after_commit`` block, as a failing caller would."""


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
    hands_out_hints: ClassVar[bool] = False
    """A ``ready`` notice with a ``count`` reaches every listener with a ``hint``, and
    exactly ``count`` claims on it win (the listeners are ``ClaimsHints``)."""

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

    async def _arrives_once_committed(
        self,
        adapter: NotifyAdapter,
        transaction: TransactionFactory,
        notice: Notice,
        *,
        held: bool,
    ) -> None:
        """Publish ``notice`` in a transaction (``held``: inside ``notify_after_commit``)
        and see it arrive once that commits; not before, where the block holds it or
        the adapter claims ``delivers_on_commit_only``."""
        async with adapter.listen() as listener:
            async with AsyncExitStack() as block:
                if held:
                    await block.enter_async_context(notify_after_commit())
                tx = await block.enter_async_context(transaction())
                await adapter.publish(tx, notices=[notice])
                if held or self.delivers_on_commit_only:
                    early = await listener.wait(self.quiet_period)
                    assert notice not in early, "delivered before the transaction committed"
            got = await self._collect_until(listener, lambda got: notice in got)
        assert notice in got

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
        notice = Notice(kind="ready", queue="after-commit")
        transaction = self._transactions(notify_transaction)
        await self._arrives_once_committed(notify_adapter, transaction, notice, held=False)

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

    async def test_notice_held_for_commit_arrives_once_the_block_exits(
        self,
        notify_adapter: NotifyAdapter,
        notify_transaction: TransactionFactory | None,
    ) -> None:
        notice = Notice(kind="ready", queue="held-for-commit")
        transaction = self._transactions(notify_transaction)
        await self._arrives_once_committed(notify_adapter, transaction, notice, held=True)

    async def test_notice_held_for_a_block_that_raises_never_arrives(
        self,
        notify_adapter: NotifyAdapter,
        notify_transaction: TransactionFactory | None,
    ) -> None:
        transaction = self._transactions(notify_transaction)
        notice = Notice(kind="ready", queue="held-then-raised")
        async with notify_adapter.listen() as listener:
            try:
                async with notify_after_commit(), transaction() as tx:
                    await notify_adapter.publish(tx, notices=[notice])
                    raise _BlockFailed
            except _BlockFailed:
                pass
            got = await self._through_marker(notify_adapter, listener)
        assert notice not in got

    async def test_notice_without_a_transaction_is_not_held_by_the_block(
        self, notify_adapter: NotifyAdapter
    ) -> None:
        notice = Notice(kind="ready", queue="not-held")
        async with notify_adapter.listen() as listener, notify_after_commit():
            await notify_adapter.publish(None, notices=[notice])
            got = await self._collect_until(listener, lambda got: notice in got)
        assert notice in got

    async def test_a_counted_notice_hands_out_as_many_looks_as_it_counts(
        self, notify_adapter: NotifyAdapter
    ) -> None:
        if not self.hands_out_hints:
            pytest.skip("adapter does not claim hands_out_hints")
        sent = Notice(kind="ready", queue="hinted", count=2)
        async with AsyncExitStack() as stack:
            listeners = [await stack.enter_async_context(notify_adapter.listen()) for _ in range(5)]
            await notify_adapter.publish(None, notices=[sent])
            heard = []
            for listener in listeners:
                assert isinstance(listener, ClaimsHints), "a hinting adapter's listener claims"
                got = await self._collect_until(
                    listener, lambda got: any(n.queue == sent.queue for n in got)
                )
                [notice] = [n for n in got if n.queue == sent.queue]
                assert notice.hint is not None, "a counted ready notice arrives with a hint"
                assert replace(notice, hint=None) == sent
                heard.append((listener, notice))
            won = [await listener.claim(notice) for listener, notice in heard]
        assert won.count(True) == 2, f"claims won: {won}"

    async def test_a_notice_without_a_count_carries_no_hint(
        self, notify_adapter: NotifyAdapter
    ) -> None:
        if not self.hands_out_hints:
            pytest.skip("adapter does not claim hands_out_hints")
        sent = [
            Notice(kind="ready", queue="uncounted"),
            Notice(kind="ready", queue="due-later", at=time.time() + 60, count=None),
        ]
        async with notify_adapter.listen() as listener:
            await notify_adapter.publish(None, notices=sent)
            got = await self._collect_until(listener, lambda got: all(n in got for n in sent))
            assert isinstance(listener, ClaimsHints)
            for notice in got:
                assert notice.hint is None
                assert await listener.claim(notice), "a notice without a hint: look"
