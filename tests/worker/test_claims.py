"""Which worker claims a look at a hinted notice, and what it does with the answer."""

from __future__ import annotations

import pytest

from pgwork.adapters.notify import Notice
from pgwork.observability.emitter import Emitter
from pgwork.worker._bell import Bell
from pgwork.worker._side.notices import Claim, NoticeRouter, act_on_claim
from pgwork.worker._wakeups import Wakeups

pytestmark = pytest.mark.anyio

HINTED = Notice(kind="ready", queue="q", count=1, hint="k")


class Claiming:
    """A listener that answers claims as told, counting them."""

    def __init__(self, answer: bool | Exception) -> None:
        self.answer = answer
        self.claims = 0

    async def wait(self, timeout: float) -> list[Notice]:
        return []

    async def claim(self, notice: Notice) -> bool:
        self.claims += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _drained() -> Wakeups:
    wakeups = Wakeups()
    wakeups.acquired(wakeups.generation, sent_at=0.0, asked=1, got=0, poll_interval=30)
    assert not wakeups.may_have_work
    return wakeups


@pytest.mark.parametrize(
    ("answer", "looks"), [(True, True), (False, False), (ConnectionError("away"), True)]
)
async def test_a_worker_with_room_looks_only_if_its_claim_won(
    answer: bool | Exception, looks: bool
) -> None:
    listener, wakeups, bell = Claiming(answer), _drained(), Bell()
    looked = await act_on_claim(listener, Claim(HINTED), has_room=True, wakeups=wakeups, bell=bell)
    assert listener.claims == 1
    assert looked is looks
    assert wakeups.may_have_work is looks
    assert bell.rung is looks


async def test_a_full_worker_takes_no_look_and_acquires_as_its_slots_free() -> None:
    listener, wakeups, bell = Claiming(True), _drained(), Bell()
    assert await act_on_claim(listener, Claim(HINTED), has_room=False, wakeups=wakeups, bell=bell)
    assert listener.claims == 0
    assert wakeups.may_have_work


def test_only_a_hinted_ready_notice_is_left_to_claim() -> None:
    router = NoticeRouter(
        worker_id="w", queues=["q"], wakeups=_drained(), bell=Bell(), events=Emitter([])
    )
    assert router.route(HINTED) == Claim(HINTED)
    assert router.route(Notice(kind="ready", queue="q", count=1)) is None
    assert router.route(Notice(kind="ready", queue="other", hint="k")) is None
