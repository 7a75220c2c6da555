"""Open psycopg connections, turning "cannot connect" into ``DatabaseUnreachableError``.

Every connection pgwork opens from a DSN goes through here, so a wrong host, a refused
port, failed authentication or a malformed DSN all surface as one catchable error whose
message shows the DSN *without its password*.

Not re-exported by ``pgwork``: the adapters of this package, the CLI and the testing
helpers import it by this name (a public module name, so nothing reaches into a
private one from outside ``postgres/``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgwork.errors import DatabaseUnreachableError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "connect",
    "connect_sync",
    "normalize_dsn",
    "redact_dsn",
    "unreachable",
]

# libpq waits forever for a host that drops packets; a typo in a DSN should fail fast.
DEFAULT_CONNECT_TIMEOUT = 10

_MASK = "***"
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


# ``postgresql+psycopg://``, ``postgresql+asyncpg://``, ``postgres://``: the URL forms a
# DATABASE_URL takes in SQLAlchemy and hosting platforms, all meaning one PostgreSQL.
_URL_SCHEME = re.compile(r"^postgres(?:ql)?(?:\+(?P<driver>[a-z0-9_]+))?://", re.IGNORECASE)


def normalize_dsn(dsn: str) -> str:
    """Return ``dsn`` in a form libpq reads, whatever URL form it came in.

    A SQLAlchemy driver suffix (``+psycopg``, ``+asyncpg``, ...) is dropped and
    ``postgres://`` becomes ``postgresql://``; asyncpg's ``ssl=`` query parameter
    becomes libpq's ``sslmode=``. A ``key=value`` DSN is returned unchanged. Every DSN
    pgwork is given (the CLI's ``--dsn`` / ``PGWORK_DSN`` / ``DATABASE_URL``, the
    adapters, migrations) goes through here, so any of these forms works everywhere.
    """
    match = _URL_SCHEME.match(dsn)
    if match is None:
        return dsn
    rest = dsn[match.end() :]
    if (match.group("driver") or "").lower() == "asyncpg" and "?" in rest:
        location, _, query = rest.partition("?")
        params = [
            ("sslmode" if key == "ssl" else key, value)
            for key, value in parse_qsl(query, keep_blank_values=True)
        ]
        rest = f"{location}?{urlencode(params, safe='/')}"
    return f"postgresql://{rest}"


def _split_uri_password(dsn: str) -> tuple[str, str | None]:
    """Return the URI with its password masked, and the password (None when absent)."""
    parts = urlsplit(dsn)
    secret: str | None = None
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if colon and password:
            secret = password
            netloc = f"{user}:{_MASK}@{hosts}"
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = []
    for key, value in query:
        if key == "password":
            secret = secret or value
            kept.append((key, _MASK))
        else:
            kept.append((key, value))
    if secret is None:
        return dsn, None
    masked = urlunsplit(
        (parts.scheme, netloc, parts.path, urlencode(kept, safe="/*"), parts.fragment)
    )
    return masked, secret


def _split_password(dsn: str) -> tuple[str, str | None]:
    if "://" in dsn:
        try:
            return _split_uri_password(dsn)
        except ValueError:
            return "(an unparseable DSN)", None
    match = _KV_PASSWORD.search(dsn)
    secret = match.group(2).strip("'") if match else None
    return _KV_PASSWORD.sub(lambda m: m.group(1) + _MASK, dsn), secret


def redact_dsn(dsn: str) -> str:
    """Return ``dsn`` (URI or ``key=value`` form) with any password replaced by ``***``."""
    return _split_password(dsn)[0]


def unreachable(dsn: str, exc: BaseException) -> DatabaseUnreachableError:
    """Build the error for a failed connection attempt, scrubbing the password everywhere."""
    shown, secret = _split_password(dsn)
    reason = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    if secret:
        reason = reason.replace(secret, _MASK)
    return DatabaseUnreachableError(shown, reason or type(exc).__name__)


def with_connect_timeout(dsn: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Add a connect timeout unless the DSN or the caller already chose one.

    Parsing the DSN here also reports a malformed DSN before any network activity.
    """
    if "connect_timeout" in kwargs or "connect_timeout" in conninfo_to_dict(dsn):
        return kwargs
    return {**kwargs, "connect_timeout": DEFAULT_CONNECT_TIMEOUT}


async def connect(dsn: str, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """Open a psycopg ``AsyncConnection``; raise ``DatabaseUnreachableError`` if it fails.

    ``kwargs`` go to ``psycopg.AsyncConnection.connect`` (``autocommit=True``, ...).
    """
    dsn = normalize_dsn(dsn)
    try:
        return await psycopg.AsyncConnection.connect(dsn, **with_connect_timeout(dsn, kwargs))
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        raise unreachable(dsn, exc) from exc


def connect_sync(dsn: str, **kwargs: Any) -> psycopg.Connection[Any]:
    """Blocking twin of :func:`connect`, for migrations and test fixtures (never the engine)."""
    dsn = normalize_dsn(dsn)
    try:
        return psycopg.Connection.connect(dsn, **with_connect_timeout(dsn, kwargs))
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        raise unreachable(dsn, exc) from exc
