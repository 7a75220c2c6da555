"""The NATS notify adapter: core pub/sub for the wake-ups, JetStream KV for the hints.

Needs ``pgwork[nats]`` (nats-py). Notices travel as one message per ``publish`` on one
subject (``subject``, default ``pgwork.events``). A worker claims a look at a counted
``ready`` notice by creating a key for it in a JetStream key-value bucket
(``hint_bucket``, kept in memory, its keys expiring after ``hint_ttl``): look ``i`` is
``{hint}.{i}``, and the claimant whose create comes first has it (a create is refused
for a key that exists). The publisher stores nothing. Without JetStream on the server
every claim wins: every listening worker looks, as with PostgreSQL's adapter. See
``pgwork.notify._broker`` for when a notice goes out (held until commit, or early) and
docs/notify.md.

One connection per adapter carries the publishes and every ``listen``'s subscription.
nats-py reconnects by itself, forever, and subscribes again; each listener then reports
a ``reconnected`` notice, so the worker fetches at once: NATS keeps no message for a
subscriber that was away.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeout
from nats.js import api
from nats.js import errors as js_errors
from nats.js.kv import KeyValue

from pgwork.adapters.notify import Listener, Notice
from pgwork.errors import ConfigurationError
from pgwork.notify._broker import BrokerListener, Publishing, hinted, positive
from pgwork.notify._wire import decode, encode

__all__ = ["NatsNotifyAdapter"]

log = logging.getLogger("pgwork.notify")

# Looks a claimant tries to create before it stays asleep.
_LOOK_TRIES = 4
# After JetStream was found missing, hints stay off this long before it is asked again.
_NO_JETSTREAM_RETRY_S = 60.0


class _NatsListener(BrokerListener):
    def __init__(self, adapter: NatsNotifyAdapter, sub: Subscription, seen: int) -> None:
        super().__init__(recheck_after=adapter.recheck_after)
        self._adapter = adapter
        self._sub = sub
        self._seen_reconnects = seen

    async def wait(self, timeout: float) -> list[Notice]:
        notices = self.due_rechecks()
        if self._adapter._reconnects != self._seen_reconnects:
            self._seen_reconnects = self._adapter._reconnects
            notices.append(Notice(kind="reconnected"))
        if notices:
            return notices
        wait = self.until_next_recheck(timeout)
        try:
            msg = await self._sub.next_msg(timeout=wait if wait > 0 else 0.001)
        except NatsTimeout:
            return self.due_rechecks() + self._reconnected()
        notices = self._read(msg)
        while self._sub.pending_msgs > 0:  # what else already arrived
            notices += self._read(await self._sub.next_msg(timeout=self._adapter.operation_timeout))
        return notices + self.due_rechecks() + self._reconnected()

    def _reconnected(self) -> list[Notice]:
        if self._adapter._reconnects == self._seen_reconnects:
            return []
        self._seen_reconnects = self._adapter._reconnects
        return [Notice(kind="reconnected")]

    def _read(self, msg: Msg) -> list[Notice]:
        decoded = decode(msg.data)
        if decoded is None or decoded.ignored:
            log.debug("pgwork nats listener ignored a message it could not read")
        return self.accept(decoded) if decoded is not None else []

    async def _take_look(self, hint: str, looks: int) -> bool:
        return await self._adapter._take_look(hint, looks)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self._sub.unsubscribe()
            except Exception as exc:  # the connection is closed already
                log.debug("pgwork nats listener close: %r", exc)


class NatsNotifyAdapter(Publishing):
    """``NotifyAdapter`` over NATS, handing out hints (``ClaimsHints``) where the server
    runs JetStream."""

    def __init__(
        self,
        servers: str | Sequence[str] = "nats://127.0.0.1:4222",
        *,
        subject: str = "pgwork.events",
        hint_bucket: str = "pgwork_hints",
        hint_ttl: float = 30.0,
        recheck_after: float = 0.5,
        reconnect_wait: float = 0.5,
        operation_timeout: float = 5.0,
        connect_options: dict[str, Any] | None = None,
    ) -> None:
        """``servers``: one NATS URL or several. ``hint_ttl``: how long a claimed look's
        key is kept. ``recheck_after``: when an early notice is repeated to
        the worker that took it (``pgwork.notify._broker``). ``reconnect_wait``: the
        pause between two reconnect attempts. ``operation_timeout``: the longest wait
        for a hint's write or claim. ``connect_options``: more of ``nats.connect``'s
        keyword arguments (credentials, TLS)."""
        super().__init__()
        if not subject or any(c.isspace() or c in "*>" for c in subject):
            raise ConfigurationError(f"subject must be a literal NATS subject, got {subject!r}")
        if not hint_bucket or not all(c.isalnum() or c in "_-" for c in hint_bucket):
            raise ConfigurationError(
                f"hint_bucket must be letters, digits, '_' or '-', got {hint_bucket!r}"
            )
        positive(
            hint_ttl=hint_ttl,
            recheck_after=recheck_after,
            reconnect_wait=reconnect_wait,
            operation_timeout=operation_timeout,
        )
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        self.subject = subject
        self.hint_bucket = hint_bucket
        self.hint_ttl = hint_ttl
        self.recheck_after = recheck_after
        self.reconnect_wait = reconnect_wait
        self.operation_timeout = operation_timeout
        self._connect_options = dict(connect_options or {})
        self._nc: NatsClient | None = None
        self._connecting = anyio.Lock()
        self._kv: KeyValue | None = None
        self._no_jetstream_until = 0.0
        self._reconnects = 0  # bumped by nats-py's reconnected callback
        self._connect_again_at = 0.0

    # --- connection --------------------------------------------------------------------

    async def _connection(self) -> NatsClient:
        """The adapter's connection, made on first use. Once made, nats-py keeps it up
        (reconnecting forever); the first connect is bounded by ``operation_timeout``,
        and after a failed one the next waits ``reconnect_wait``: a publish while no
        server answers fails fast (and is logged) instead of waiting on a connect."""
        nc = self._nc
        if nc is not None and not nc.is_closed:
            return nc
        async with self._connecting:
            if self._nc is None or self._nc.is_closed:
                if time.monotonic() < self._connect_again_at:
                    raise ConnectionError(f"no NATS server answered at {self.servers}")
                try:
                    with anyio.fail_after(self.operation_timeout):
                        self._nc = await nats.connect(
                            servers=self.servers,
                            connect_timeout=max(1, round(self.operation_timeout)),
                            reconnect_time_wait=self.reconnect_wait,
                            max_reconnect_attempts=-1,
                            reconnected_cb=self._on_reconnected,
                            disconnected_cb=self._on_disconnected,
                            error_cb=self._on_error,
                            **self._connect_options,
                        )
                except BaseException:
                    self._connect_again_at = time.monotonic() + self.reconnect_wait
                    raise
            return self._nc

    async def _on_reconnected(self) -> None:
        self._reconnects += 1
        self._kv = None  # a bucket kept in memory did not survive a server restart
        log.info("pgwork nats connection reconnected")

    async def _on_disconnected(self) -> None:
        if self._nc is not None:  # not the adapter closing it
            log.warning("pgwork nats connection lost; reconnecting")

    async def _on_error(self, exc: Exception) -> None:
        log.debug("pgwork nats connection error: %r", exc)

    def _connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    # --- hints -------------------------------------------------------------------------

    async def _bucket(self) -> KeyValue | None:
        """The hints' bucket, made on first use; None without JetStream."""
        if self._kv is not None:
            return self._kv
        if time.monotonic() < self._no_jetstream_until:
            return None
        js = (await self._connection()).jetstream(timeout=self.operation_timeout)
        try:
            try:
                self._kv = await js.key_value(self.hint_bucket)
            except js_errors.BucketNotFoundError:
                self._kv = await js.create_key_value(
                    api.KeyValueConfig(
                        bucket=self.hint_bucket,
                        ttl=self.hint_ttl,
                        history=1,
                        storage=api.StorageType.MEMORY,
                    )
                )
        except Exception as exc:
            self._no_jetstream_until = time.monotonic() + _NO_JETSTREAM_RETRY_S
            log.warning(
                "pgwork nats adapter hands out no hints (every listening worker looks): "
                "no JetStream key-value bucket %r (%r)",
                self.hint_bucket,
                exc,
            )
            return None
        return self._kv

    async def _take_look(self, hint: str, looks: int) -> bool:
        """Create the key of one of the notice's looks, from a random one on, trying
        ``_LOOK_TRIES`` of them: with a few looks every one is tried and the count is
        exact; with many, a claimant that finds its tries taken stays asleep, and the
        workers that won keep acquiring while their acquires come back full."""
        # While reconnecting, a key-value request would wait out its timeout: look.
        kv = await self._bucket() if self._connected() else None
        if kv is None:
            return True
        first = random.randrange(looks)
        with anyio.fail_after(self.operation_timeout):
            for step in range(min(looks, _LOOK_TRIES)):
                try:
                    await kv.create(f"{hint}.{(first + step) % looks}", b"")
                except js_errors.KeyWrongLastSequenceError:
                    continue  # that look is another worker's
                return True
        return False

    # --- NotifyAdapter -----------------------------------------------------------------

    async def _send(self, notices: Sequence[Notice], *, early: bool) -> None:
        nc = await self._connection()
        await nc.publish(self.subject, encode(hinted(notices), early=early))

    @asynccontextmanager
    async def listen(self) -> AsyncIterator[Listener]:
        nc = await self._connection()
        sub = await nc.subscribe(self.subject)
        # A round trip to the server: the subscription is in place before ``listen``
        # returns, so a notice published afterwards reaches it.
        await nc.flush(timeout=max(1, round(self.operation_timeout)))
        listener = _NatsListener(self, sub, self._reconnects)
        try:
            yield listener
        finally:
            await listener.close()

    async def close(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            await nc.close()
