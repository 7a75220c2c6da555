"""Failed logins, counted per client: after too many, the client is locked out a while.

Without it a password can be guessed as fast as the server answers. A client (by
address) that fails ``limit`` times within ``window`` seconds is refused — the right
password included — for ``lockout`` seconds, with 429 and ``Retry-After``; each
lockout in a row doubles, up to ``max_lockout``. A successful login forgets the
client's failures. The clock is injected, so the tests move time instead of waiting.

Behind a reverse proxy every client has the proxy's address unless the server is told
to trust the proxy's ``X-Forwarded-For`` (uvicorn ``--forwarded-allow-ips``): then one
guesser locks everyone out for a while, which is still better than guessing freely.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LoginThrottle"]


@dataclass(slots=True)
class _Record:
    failures: int
    first_failure: float
    locked_until: float
    lockouts: int


class LoginThrottle:
    """Per-client failed-login counter (in memory, one per dashboard app)."""

    def __init__(
        self,
        *,
        limit: int = 10,
        window: float = 300.0,
        lockout: float = 60.0,
        max_lockout: float = 3600.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if limit < 1 or window <= 0 or lockout <= 0 or max_lockout < lockout:
            raise ValueError("LoginThrottle needs limit >= 1 and positive window and lockout")
        self.limit = limit
        self.window = window
        self.lockout = lockout
        self.max_lockout = max_lockout
        self.max_clients = max_clients
        self.clock = clock
        self._clients: OrderedDict[str, _Record] = OrderedDict()

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        record = self._clients.get(client)
        if record is None:
            return None
        left = record.locked_until - self.clock()
        return left if left > 0 else None

    def failed(self, client: str) -> bool:
        """Count a failed login; True when it locks the client out."""
        now = self.clock()
        record = self._clients.get(client)
        if record is None or now - record.first_failure > self.window:
            lockouts = record.lockouts if record is not None else 0
            record = _Record(failures=0, first_failure=now, locked_until=0.0, lockouts=lockouts)
        record.failures += 1
        self._clients[client] = record
        self._clients.move_to_end(client)
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)
        if record.failures < self.limit:
            return False
        record.locked_until = now + min(self.lockout * 2**record.lockouts, self.max_lockout)
        record.lockouts += 1
        record.failures = 0
        record.first_failure = now
        return True

    def succeeded(self, client: str) -> None:
        """A login that worked: the client starts afresh."""
        self._clients.pop(client, None)
