"""The audit trail: who did what from the dashboard, and who failed to log in.

Events go to the client's observers, like every pgwork event (the default
``LoggingObserver`` writes them on the ``pgwork.events`` logger): ``dashboard.action``
for each action tried, whatever its outcome, and ``dashboard.auth_failed`` for each
request refused although it carried credentials. See the catalogue in
``pgwork.observability``.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable
from typing import Any

from starlette.requests import HTTPConnection

from pgwork.client import Client
from pgwork.observability import DASHBOARD_ACTION, DASHBOARD_AUTH_FAILED
from pgwork.observability.emitter import Emitter

__all__ = ["DASHBOARD_ACTION", "DASHBOARD_AUTH_FAILED", "client_address", "emit", "who"]

log = logging.getLogger("pgwork.dashboard")


def who(conn: HTTPConnection) -> str | None:
    """The user the request says it is: the Basic user name, ``bearer`` for a token,
    None without credentials. Said, not proven: a failed login records the claim."""
    scheme, _, value = conn.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return "bearer"
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return "(malformed)"
    return decoded.partition(":")[0][:128]


def client_address(conn: HTTPConnection) -> str:
    return conn.client.host if conn.client is not None else "unknown"


def _printable(value: Any) -> Any:
    """What a request supplied, safe to put on one log line: a name with a newline or
    an escape sequence could forge or hide the lines around it."""
    if isinstance(value, str):
        return value if value.isprintable() else ascii(value)
    if isinstance(value, tuple):
        return tuple(_printable(v) for v in value)
    return value


def emit(source: Client | Callable[[], Client], name: str, /, **fields: Any) -> None:
    """Send one audit event to the client's observers; never fails the request."""
    try:
        client = source if isinstance(source, Client) else source()
        safe = {key: _printable(value) for key, value in fields.items()}
        Emitter(client.observers).emit(name, **safe)
    except Exception:
        log.exception("pgwork dashboard could not record %s %r", name, fields)
