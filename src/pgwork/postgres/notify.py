"""The PostgreSQL notify adapter: LISTEN/NOTIFY as wake-up hints.

``publish`` with a transaction runs ``pg_notify`` inside it, so PostgreSQL itself
delivers the notice only on commit, never on rollback, and folds identical notices of
one transaction into one. Each ``listen`` holds one dedicated autocommit connection;
when it breaks, the listener reconnects with capped exponential backoff and reports a
``reconnected`` notice so the worker fetches at once instead of trusting the gap.

LISTEN needs a direct connection (or a session-mode pooler): a transaction-mode pooler
hands the listening server session to other clients, and notifications never arrive.
So ``listen`` first checks the channel end to end: a probe sent from another connection
must come back within ``probe_timeout``. When it does not, it raises
``NotificationsUnavailableError`` or, with ``when_unavailable="poll"``, warns and hands
the worker a ``ready`` hint every ``fallback_poll_interval`` instead.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal
from uuid import UUID, uuid4

import anyio
import psycopg
from psycopg import sql

from pgwork.adapters.notify import Listener, Notice
from pgwork.errors import ConfigurationError, DatabaseTimeoutError, NotificationsUnavailableError
from pgwork.postgres._callers import execute
from pgwork.postgres._names import DEFAULT_SCHEMA, validate_schema_name
from pgwork.postgres._transactions import unwrap
from pgwork.postgres.connect import connect, redact_dsn
from pgwork.records import AbortReason

__all__ = ["PostgresNotifyAdapter"]

log = logging.getLogger("pgwork.notify")

_SEP = "|"
_KINDS = ("ready", "abort", "chain_done", "signal")
_REASONS = frozenset(reason.value for reason in AbortReason)
# A listener's end-to-end check; not a notice (decode_notice ignores it).
_PROBE = "probe" + _SEP
_POLL_HINT = Notice(kind="ready")
# How long a silent listener's probe waits for its own notification when the adapter
# was told not to probe at start (probe_timeout=None).
_SILENCE_PROBE_TIMEOUT = 2.0
# A listener logs a payload it ignores at most this often (seconds): anyone who can
# connect may NOTIFY on the channel, and a flood must not flood the log as well.
_IGNORED_LOG_EVERY = 60.0

WhenUnavailable = Literal["raise", "poll"]


def encode_notice(notice: Notice) -> str:
    """Compact text payload: ``kind|job_id|chain_id|reason|at|queue``, never job data;
    a ``signal`` notice carries its signal's name where the queue goes.

    The queue comes last and the decoder splits off only the first five fields, so a
    queue name (or a signal's) may contain any character, the separator included.
    """
    return _SEP.join(
        (
            notice.kind,
            str(notice.job_id) if notice.job_id else "",
            str(notice.chain_id) if notice.chain_id else "",
            notice.reason or "",
            repr(round(notice.at, 3)) if notice.at is not None else "",
            (notice.name if notice.kind == "signal" else notice.queue) or "",
        )
    )


def decode_notice(payload: str) -> Notice | None:
    """The notice in ``payload``, or None for anything this version does not know.

    Anyone who can connect may NOTIFY on the channel, and a newer pgwork may send
    kinds or reasons an older one lacks, so every field is checked here, where a
    payload becomes a notice: a known kind, well-formed ids, an abort reason this
    version knows for the job it names, the chain a ``chain_done`` names, the name a
    ``signal`` carries (and nothing else), a finite due time.
    """
    parts = payload.split(_SEP, 5)
    if len(parts) != 6 or parts[0] not in _KINDS:
        return None
    kind, job_id, chain_id, reason, at, queue = parts
    if kind == "signal":
        if not queue or job_id or chain_id or reason or at:
            return None
        return Notice(kind="signal", name=queue)
    try:
        notice = Notice(
            kind=kind,  # type: ignore[arg-type]
            queue=queue or None,
            job_id=UUID(job_id) if job_id else None,
            chain_id=UUID(chain_id) if chain_id else None,
            reason=reason or None,
            at=float(at) if at else None,
        )
    except ValueError:
        return None
    if notice.at is not None and not math.isfinite(notice.at):
        return None
    if kind == "abort" and (notice.job_id is None or reason not in _REASONS):
        return None
    if kind == "chain_done" and notice.chain_id is None:
        return None
    return notice


class _PgListener:
    def __init__(self, adapter: PostgresNotifyAdapter) -> None:
        self._adapter = adapter
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._failures = 0
        self._early: list[Notice] = []  # arrived while probing
        self._poll_every: float | None = None  # set when notifications cannot arrive
        self._heard = time.monotonic()  # when the connection last delivered anything
        self._ignored = 0  # payloads ignored since the last one logged
        self._ignored_logged_at = -math.inf

    async def open(self) -> None:
        self._conn = await self._adapter._listen_connection()
        self._heard = time.monotonic()

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def probe(self, timeout: float) -> bool:
        """Whether a notification sent from another connection reaches this one.

        Another connection, not this one: a session always receives its own NOTIFY,
        even through a transaction pooler that loses everybody else's.
        """
        assert self._conn is not None
        token = f"{_PROBE}{uuid4().hex}"
        deadline = time.monotonic() + timeout
        # Sending counts against the timeout too: the publishing connection may have
        # gone silent as well.
        with anyio.move_on_after(timeout):
            await self._adapter._publish_payloads([token])
        while (left := deadline - time.monotonic()) > 0:
            # stop_after, not break: psycopg's generator holds the connection's lock.
            async for note in self._conn.notifies(timeout=left, stop_after=1):
                self._heard = time.monotonic()
                if note.payload == token:
                    return True
                self._collect(note.payload, self._early)
        return False

    async def poll_instead(self, every: float) -> None:
        """Give up on notifications: ``wait`` hints every ``every`` seconds instead."""
        self._poll_every = every
        await self.close()

    async def wait(self, timeout: float) -> list[Notice]:
        if self._early:
            early, self._early = self._early, []
            return early
        if self._poll_every is not None:
            await anyio.sleep(min(timeout, self._poll_every))
            return [_POLL_HINT]
        if self._conn is None or self._conn.closed or self._conn.broken:
            return await self._reconnect(timeout)
        check_every = self._adapter.check_interval
        if check_every is not None:
            silent_for = time.monotonic() - self._heard
            if silent_for >= check_every:
                return await self._check_silence(timeout)
            timeout = min(timeout, check_every - silent_for)
        notices: list[Notice] = []
        try:
            gen = self._conn.notifies(timeout=timeout, stop_after=1)
            async for note in gen:
                self._heard = time.monotonic()
                self._collect(note.payload, notices)
            # Drain whatever else already arrived without waiting again.
            async for note in self._conn.notifies(timeout=0.0):
                self._collect(note.payload, notices)
        except psycopg.OperationalError as exc:
            log.warning("pgwork listener connection lost: %s", exc)
            await self.close()
            return await self._reconnect(timeout)
        return notices

    async def _check_silence(self, budget: float) -> list[Notice]:
        """The listener heard nothing for a while: prove the connection still carries
        notifications, or replace it."""
        waited = self._adapter.probe_timeout or _SILENCE_PROBE_TIMEOUT
        try:
            alive = await self.probe(waited)
        except (psycopg.OperationalError, DatabaseTimeoutError) as exc:
            log.warning("pgwork listener check failed: %s", exc)
            alive = False
        if alive:
            early, self._early = self._early, []
            return early
        log.warning(
            "pgwork listener heard nothing, not even its own probe within %.1fs: "
            "reconnecting (a network path that dropped the connection silently?)",
            waited,
        )
        # Closing only discards the local end: nothing waits on a silent peer.
        await self.close()
        return await self._reconnect(budget)

    def _collect(self, payload: str, into: list[Notice]) -> None:
        notice = decode_notice(payload)
        if notice is not None:
            into.append(notice)
        elif not payload.startswith(_PROBE):  # other listeners' probes pass by here too
            self._ignore(payload)

    def _ignore(self, payload: str) -> None:
        """Log a payload that is no notice of this version, at most once a minute."""
        self._ignored += 1
        now = time.monotonic()
        if now - self._ignored_logged_at < _IGNORED_LOG_EVERY:
            return
        log.warning(
            "pgwork listener ignored %d notification(s) it could not read on %s, "
            "the last: %r (sent by another program, or by a newer pgwork?)",
            self._ignored,
            self._adapter.channel,
            payload[:200],
        )
        self._ignored = 0
        self._ignored_logged_at = now

    async def _reconnect(self, budget: float) -> list[Notice]:
        """Try to reconnect within ``budget`` seconds; backoff is capped and resets
        after a success."""
        delay = min(
            self._adapter.reconnect_max, self._adapter.reconnect_initial * 2**self._failures
        )
        try:
            self._conn = await self._adapter._listen_connection()
        except Exception as exc:  # any failure: keep the worker polling, try again later
            self._failures += 1
            log.warning("pgwork listener reconnect failed (%s); retrying in %.1fs", exc, delay)
            await anyio.sleep(min(budget, delay * random.uniform(0.8, 1.2)))
            return []
        self._failures = 0
        log.info("pgwork listener reconnected")
        return [Notice(kind="reconnected")]


class PostgresNotifyAdapter:
    """``NotifyAdapter`` over PostgreSQL LISTEN/NOTIFY on one channel per schema."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 5.0,
        probe_timeout: float | None = 2.0,
        when_unavailable: WhenUnavailable = "raise",
        fallback_poll_interval: float = 1.0,
        check_interval: float | None = 60.0,
        publish_timeout: float | None = 10.0,
    ) -> None:
        """``dsn`` must reach PostgreSQL directly (or through a session-mode pooler) for
        ``listen``; publishing works through any pooler.

        ``probe_timeout``: how long ``listen`` waits for its test notification (None:
        no test). ``when_unavailable``: what it does when that never comes: ``"raise"``
        ``NotificationsUnavailableError``, or ``"poll"``: log a warning and hint the
        worker to look for jobs every ``fallback_poll_interval`` seconds.
        """
        if when_unavailable not in ("raise", "poll"):
            raise ConfigurationError(
                f"when_unavailable must be 'raise' or 'poll', got {when_unavailable!r}"
            )
        for name, value in (
            ("probe_timeout", probe_timeout),
            ("fallback_poll_interval", fallback_poll_interval),
            ("check_interval", check_interval),
            ("publish_timeout", publish_timeout),
        ):
            if value is not None and value <= 0:
                raise ConfigurationError(f"{name} must be positive, got {value!r}")
        self.probe_timeout = probe_timeout
        self.when_unavailable = when_unavailable
        self.fallback_poll_interval = fallback_poll_interval
        self.check_interval = check_interval
        self.publish_timeout = publish_timeout
        self.schema = validate_schema_name(schema)
        self.channel = f"{self.schema}_events"
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self._dsn = dsn
        self._publish_conn: psycopg.AsyncConnection[Any] | None = None
        self._publish_lock = anyio.Lock()
        self._notify_sql = b"SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p"
        self._notify_tx_sql = (
            b"SELECT pg_notify(%(channel)s, p) FROM unnest(%(payloads)s::text[]) AS p"
        )
        self._listen_sql = sql.SQL("LISTEN {}").format(sql.Identifier(self.channel))

    async def publish(self, tx: object | None, *, notices: Sequence[Notice]) -> None:
        if not notices:
            return
        payloads = sorted({encode_notice(n) for n in notices})
        if tx is not None:
            await execute(
                await unwrap(tx),
                self._notify_tx_sql,
                {"channel": self.channel, "payloads": payloads},
            )
            return
        await self._publish_payloads(payloads)

    async def _publish_payloads(self, payloads: list[str]) -> None:
        async with self._publish_lock:
            with anyio.move_on_after(self.publish_timeout) as scope:
                if self._publish_conn is None or self._publish_conn.closed:
                    self._publish_conn = await self._connect()
                try:
                    await self._publish_conn.execute(self._notify_sql, (self.channel, payloads))
                except psycopg.OperationalError:
                    await self._publish_conn.close()
                    self._publish_conn = None
                    raise
            if scope.cancelled_caught:
                if self._publish_conn is not None:
                    await self._publish_conn.close()
                    self._publish_conn = None
                raise DatabaseTimeoutError("a notification", self.publish_timeout or 0.0)

    @asynccontextmanager
    async def listen(self) -> AsyncIterator[Listener]:
        listener = _PgListener(self)
        await listener.open()
        try:
            if self.probe_timeout is not None and not await listener.probe(self.probe_timeout):
                await self._unavailable(listener, self.probe_timeout)
            yield listener
        finally:
            await listener.close()

    async def _unavailable(self, listener: _PgListener, waited: float) -> None:
        error = NotificationsUnavailableError(redact_dsn(self._dsn), waited)
        if self.when_unavailable == "raise":
            raise error
        log.warning(
            "pgwork notifications unavailable, polling every %.1fs instead: %s",
            self.fallback_poll_interval,
            error,
        )
        await listener.poll_instead(self.fallback_poll_interval)

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        # Never prepared: publishing may go through a transaction pooler, where a
        # prepared statement's name belongs to a server session the pooler moves.
        return await connect(self._dsn, autocommit=True, prepare_threshold=None)

    async def _listen_connection(self) -> psycopg.AsyncConnection[Any]:
        conn = await self._connect()
        await conn.execute(self._listen_sql)
        return conn

    async def close(self) -> None:
        if self._publish_conn is not None:
            await self._publish_conn.close()
            self._publish_conn = None
