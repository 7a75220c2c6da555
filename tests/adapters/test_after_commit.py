"""``notify_after_commit``: what a block holds, when it sends, what it drops."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pgwork import InProcessNotifyAdapter, notify_after_commit
from pgwork.adapters.after_commit import held_notices
from pgwork.adapters.notify import Notice

pytestmark = pytest.mark.anyio

READY = Notice(kind="ready", queue="q", count=1)


class Recorder:
    """Records what a block sends it, and can be made to fail."""

    def __init__(self, *, fails: bool = False) -> None:
        self.sent: list[list[Notice]] = []
        self.fails = fails

    async def send_held(self, notices: Sequence[Notice]) -> None:
        if self.fails:
            raise ConnectionError("the broker is away")
        self.sent.append(list(notices))


async def test_a_block_sends_what_it_held_as_it_exits() -> None:
    recorder = Recorder()
    async with notify_after_commit() as held:
        held.hold(recorder, [READY])
        held.hold(recorder, [READY])
        assert recorder.sent == []
    assert recorder.sent == [[READY, READY]]
    assert held_notices() is None


async def test_a_block_that_raises_drops_what_it_held() -> None:
    recorder = Recorder()

    async def fail_inside() -> None:
        async with notify_after_commit() as held:
            held.hold(recorder, [READY])
            raise LookupError

    with pytest.raises(LookupError):
        await fail_inside()
    assert recorder.sent == []


async def test_an_inner_block_hands_its_notices_to_the_outer_one() -> None:
    recorder = Recorder()
    async with notify_after_commit():
        async with notify_after_commit() as inner:
            inner.hold(recorder, [READY])
        assert recorder.sent == [], "sent before the outer transaction committed"
    assert recorder.sent == [[READY]]


async def test_an_independent_block_sends_as_it_exits_whatever_encloses_it() -> None:
    recorder = Recorder()
    async with notify_after_commit():
        async with notify_after_commit(independent=True) as own:
            own.hold(recorder, [READY])
        assert recorder.sent == [[READY]]


async def test_a_failed_send_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async with notify_after_commit() as held:
        held.hold(Recorder(fails=True), [READY])
    assert "could not send notices after the commit" in caplog.text


async def test_the_in_process_adapter_holds_a_transactions_notice_in_a_block() -> None:
    adapter = InProcessNotifyAdapter()
    async with adapter.listen() as listener:
        async with notify_after_commit():
            await adapter.publish(object(), notices=[READY])
            assert await listener.wait(0) == []
            await adapter.publish(None, notices=[Notice(kind="ready", queue="now")])
            assert await listener.wait(0) == [Notice(kind="ready", queue="now")]
        assert await listener.wait(0) == [READY]
