"""The Redis notify adapter: pub/sub for the wake-ups, a counter per hint.

Needs ``pgwork[redis]`` (redis-py). Notices travel as one pub/sub message per
``publish`` on one channel (``channel``, default ``pgwork``: one per pgwork deployment
sharing a Redis). A worker claims a look at a counted ``ready`` notice with a Lua script
that counts the claims under ``{channel}:hint:{key}`` (the key expiring ``hint_ttl``
after the first): the first ``count`` claims win. The publisher stores nothing. See
``pgwork.notify._broker`` for when a notice goes out (held until commit, or early) and
docs/notify.md for the model.

Each ``listen`` holds one connection in subscribe mode. When it breaks (Redis
restarted, the network dropped), the listener reconnects with capped exponential
backoff and reports a ``reconnected`` notice, so the worker fetches at once instead of
trusting the gap; Redis keeps no message for a subscriber that was away.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from pgwork.adapters.notify import Listener, Notice
from pgwork.errors import ConfigurationError
from pgwork.notify._broker import BrokerListener, Publishing, hinted, positive
from pgwork.notify._wire import decode, encode

__all__ = ["RedisNotifyAdapter"]

log = logging.getLogger("pgwork.notify")

# Count one more claim on a notice's looks (KEYS[1], expiring after ARGV[1] ms from the
# first claim); the caller won if the count is within the notice's looks.
_CLAIM = """
local claims = redis.call('INCR', KEYS[1])
if claims == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return claims
"""

_LOST = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


class _RedisListener(BrokerListener):
    def __init__(self, adapter: RedisNotifyAdapter) -> None:
        super().__init__(recheck_after=adapter.recheck_after)
        self._adapter = adapter
        self._pubsub: PubSub | None = None
        self._failures = 0
        self._ignored = 0

    async def open(self) -> None:
        self._pubsub = await self._adapter._subscribe()

    async def close(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with anyio.CancelScope(shield=True):
                try:
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                except Exception as exc:  # the connection is gone already
                    log.debug("pgwork redis listener close: %r", exc)

    async def wait(self, timeout: float) -> list[Notice]:
        due = self.due_rechecks()
        if due:
            return due
        if self._pubsub is None:
            return await self._reconnect(timeout)
        notices: list[Notice] = []
        try:
            first = await self._pubsub.get_message(
                ignore_subscribe_messages=True, timeout=self.until_next_recheck(timeout)
            )
            while first is not None:
                notices += self._read(first)
                first = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=0)
        except _LOST as exc:
            log.warning("pgwork redis listener connection lost: %r", exc)
            await self.close()
            return notices + await self._reconnect(timeout)
        return notices + self.due_rechecks()

    def _read(self, message: dict[str, Any]) -> list[Notice]:
        if message.get("type") != "message":
            return []
        decoded = decode(message.get("data", b""))
        if decoded is None or decoded.ignored:
            self._ignored += 1
            log.debug("pgwork redis listener ignored a message it could not read")
        return self.accept(decoded) if decoded is not None else []

    async def _reconnect(self, budget: float) -> list[Notice]:
        delay = min(
            self._adapter.reconnect_max, self._adapter.reconnect_initial * 2**self._failures
        )
        try:
            self._pubsub = await self._adapter._subscribe()
        except Exception as exc:  # any failure: the worker keeps polling meanwhile
            self._failures += 1
            log.warning(
                "pgwork redis listener reconnect failed (%r); retrying in %.1fs", exc, delay
            )
            await anyio.sleep(min(budget, delay * random.uniform(0.8, 1.2)))
            return []
        self._failures = 0
        log.info("pgwork redis listener reconnected")
        return [Notice(kind="reconnected")]

    async def _take_look(self, hint: str, looks: int) -> bool:
        return await self._adapter._take_look(hint, looks)


class RedisNotifyAdapter(Publishing):
    """``NotifyAdapter`` over Redis pub/sub, handing out hints (``ClaimsHints``)."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        channel: str = "pgwork",
        hint_ttl: float = 30.0,
        recheck_after: float = 0.5,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 5.0,
        operation_timeout: float = 5.0,
        check_interval: float = 30.0,
    ) -> None:
        """``url``: a ``redis://`` (or ``rediss://``, ``unix://``) URL, as redis-py takes
        it. ``hint_ttl``: how long a notice's count of claims is kept. ``recheck_after``:
        when an early notice is repeated to the worker that took it
        (``pgwork.notify._broker``). ``operation_timeout``: the longest wait for a
        publish or a claim. ``check_interval``: how often an idle listening connection is
        pinged, so that a connection the network dropped silently is noticed."""
        super().__init__()
        if not channel or any(c.isspace() for c in channel):
            raise ConfigurationError(f"channel must be a name without spaces, got {channel!r}")
        positive(
            hint_ttl=hint_ttl,
            recheck_after=recheck_after,
            reconnect_initial=reconnect_initial,
            reconnect_max=reconnect_max,
            operation_timeout=operation_timeout,
            check_interval=check_interval,
        )
        self.channel = channel
        self.hint_ttl = hint_ttl
        self.recheck_after = recheck_after
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self._hint_prefix = f"{channel}:hint:"
        self._ttl_ms = max(1, round(hint_ttl * 1000))
        try:
            self._commands: Redis = Redis.from_url(
                url, socket_timeout=operation_timeout, socket_connect_timeout=operation_timeout
            )
            # Listening connections: no read timeout (``wait`` bounds each read itself),
            # no retry inside redis-py (a reconnect must be seen, to report it), a ping
            # when idle for ``check_interval``.
            self._listening: Redis = Redis.from_url(
                url,
                socket_timeout=None,
                socket_connect_timeout=operation_timeout,
                socket_keepalive=True,
                health_check_interval=max(1, round(check_interval)),
                retry=Retry(NoBackoff(), 0),
            )
        except ValueError as exc:
            raise ConfigurationError(
                f"url must be a Redis URL (redis://host:port/db, rediss://, unix://): {exc}"
            ) from exc
        self._claim = self._commands.register_script(_CLAIM)

    async def _send(self, notices: Sequence[Notice], *, early: bool) -> None:
        await self._commands.publish(self.channel, encode(hinted(notices), early=early))

    async def _take_look(self, hint: str, looks: int) -> bool:
        claims = await self._claim(keys=[self._hint_prefix + hint], args=[self._ttl_ms])
        return int(claims) <= looks

    async def _subscribe(self) -> PubSub:
        pubsub = self._listening.pubsub()
        try:
            await pubsub.subscribe(self.channel)
            # The subscription is in place once Redis confirms it: a notice published
            # after ``listen`` returns reaches this listener.
            with anyio.fail_after(self.reconnect_max + 5.0):
                while True:
                    reply = await pubsub.get_message(timeout=1.0)
                    if reply is not None and reply.get("type") == "subscribe":
                        break
        except BaseException:
            with anyio.CancelScope(shield=True):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            raise
        return pubsub

    @asynccontextmanager
    async def listen(self) -> AsyncIterator[Listener]:
        listener = _RedisListener(self)
        await listener.open()
        try:
            yield listener
        finally:
            await listener.close()

    async def close(self) -> None:
        await self._commands.aclose()
        await self._listening.aclose()
