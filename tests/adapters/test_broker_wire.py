"""The brokers' wire format: notices round-trip, and anything else is dropped; and the
broker adapters' settings, checked before any connection."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from pgwork import ConfigurationError
from pgwork.adapters.notify import Notice
from pgwork.notify._wire import decode, encode
from pgwork.notify.nats import NatsNotifyAdapter
from pgwork.notify.redis import RedisNotifyAdapter

NOTICES = [
    Notice(kind="ready", queue="mail | urgent", count=3, hint="a" * 32),
    Notice(kind="ready", queue="later", at=1_900_000_000.125),
    Notice(kind="abort", job_id=uuid.uuid4(), reason="cancelled"),
    Notice(kind="chain_done", chain_id=uuid.uuid4()),
    Notice(kind="signal", name="payment:order 7"),
]


@pytest.mark.parametrize("early", [True, False])
def test_notices_round_trip(early: bool) -> None:
    message = decode(encode(NOTICES, early=early))
    assert message is not None
    assert message.notices == NOTICES
    assert message.early is early
    assert message.ignored == 0


@pytest.mark.parametrize(
    "row",
    [
        ["reconnected", None, None, None, None, None, None, None, None],  # not sent
        ["ready", 7, None, None, None, None, None, None, None],  # a queue that is no name
        ["ready", "q", None, None, None, None, None, 0, None],  # no looks
        ["ready", "q", None, None, None, None, None, True, None],
        ["ready", "q", None, None, None, float("inf"), None, None, None],
        ["ready", "q", None, None, None, 1.0, None, None, "k"],  # a due time has no hint
        ["abort", None, "not-a-uuid", None, "cancelled", None, None, None, None],
        ["abort", None, str(uuid.uuid4()), None, "no-such-reason", None, None, None, None],
        ["chain_done", None, None, None, None, None, None, None, None],
        ["signal", None, None, None, None, None, "", None, None],
        ["ready", "q"],
    ],
)
def test_an_entry_that_is_no_notice_is_ignored(row: list[object]) -> None:
    good = ["ready", "ok", None, None, None, None, None, None, None]
    message = decode(json.dumps({"v": 1, "early": False, "n": [row, good]}))
    assert message is not None
    assert message.notices == [Notice(kind="ready", queue="ok")]
    assert message.ignored == 1


@pytest.mark.parametrize("payload", [b"", b"not json", b"[]", b'{"v": 2, "n": []}', b"\xff"])
def test_a_message_that_is_no_pgwork_message_decodes_to_none(payload: bytes) -> None:
    assert decode(payload) is None


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: RedisNotifyAdapter("http://127.0.0.1"), "url must be a Redis URL"),
        (lambda: RedisNotifyAdapter(channel="two words"), "channel must be a name"),
        (lambda: RedisNotifyAdapter(hint_ttl=0), "hint_ttl must be a positive"),
        (lambda: NatsNotifyAdapter(subject="pgwork.*"), "subject must be a literal"),
        (lambda: NatsNotifyAdapter(hint_bucket="a.b"), "hint_bucket must be letters"),
        (lambda: NatsNotifyAdapter(recheck_after=float("nan")), "recheck_after must be"),
    ],
)
def test_settings_that_cannot_work_are_refused_before_any_connection(
    make: Callable[[], object], says: str
) -> None:
    with pytest.raises(ConfigurationError, match=says):
        make()
