"""Strings a database that is not UTF8 cannot store, found before any statement runs.

A LATIN1 (or other single-byte) database stores only the characters of its encoding.
Sent anyway, a character outside it fails in the driver (psycopg encodes parameters in
the connection's encoding: a bare ``UnicodeEncodeError``) or on the server (asyncpg
sends UTF-8, which the server cannot convert), and the latter aborts the caller's
transaction. So when the database's encoding is not UTF8, each job's strings are
checked first, and the first that cannot be stored raises ``UnencodableTextError``
naming where it is (the input's JSON path, or the option). A UTF8 database, the usual
one, costs one look at a parameter the server reported when the connection opened.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg
from psycopg._encodings import pg2pyenc

from pgwork.adapters.state import NewJob
from pgwork.errors import UnencodableTextError
from pgwork.postgres._callers import AsyncpgCaller, DbConn, SyncPsycopgCaller

__all__ = ["check_encodable", "narrow_encoding"]

# Encodings that store every character (SQL_ASCII stores bytes as they come).
_WIDE = frozenset({"UTF8", "SQL_ASCII"})


def narrow_encoding(conn: DbConn) -> str | None:
    """The database's encoding, when it cannot store every character (else None)."""
    name: str | None
    if isinstance(conn, psycopg.AsyncConnection):
        raw = conn.pgconn.parameter_status(b"server_encoding")
        if raw == b"UTF8":  # the usual case, on start_chain's path: nothing more
            return None
        name = raw.decode() if raw else None
    elif isinstance(conn, SyncPsycopgCaller):
        raw = conn.connection.pgconn.parameter_status(b"server_encoding")
        name = raw.decode() if raw else None
    elif isinstance(conn, AsyncpgCaller):
        name = getattr(conn.connection.get_settings(), "server_encoding", None)
    else:
        name = None
    if name is None or name.upper() in _WIDE:
        return None
    return name.upper()


def check_encodable(jobs: Iterable[NewJob], encoding: str) -> None:
    """Raise ``UnencodableTextError`` for the first string of ``jobs`` that the database's
    ``encoding`` cannot store."""
    try:
        codec = pg2pyenc(encoding.encode())
    except psycopg.NotSupportedError:
        return  # an encoding Python does not know: leave it to the database
    for job in jobs:
        for field, text in _texts(job):
            bad = _unencodable(text, codec)
            if bad is None:
                continue
            if field == "input":
                field, bad = _input_path(job, codec)
            raise UnencodableTextError(field, encoding, bad)


def _texts(job: NewJob) -> Iterator[tuple[str, str]]:
    yield "input", job.input_json
    yield "queue", job.queue
    if job.dedup is not None:
        yield "dedup key", job.dedup.key
    if job.limit_key is not None:
        yield "limit key", job.limit_key
    for key, value in (job.context or {}).items():
        yield "context", key
        yield f"context[{key!r}]", value


def _unencodable(text: str, codec: str) -> str | None:
    """The first character of ``text`` that ``codec`` cannot encode, or None."""
    if text.isascii():
        return None
    try:
        text.encode(codec)
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return None


def _input_path(job: NewJob, codec: str) -> tuple[str, str]:
    """Where in ``job``'s input the first unencodable character is, and which."""
    where = f"input of job type {job.type_name!r}"
    found = _find(json.loads(job.input_json), "$", codec)
    if found is None:  # not in a string of the parsed input: name the input itself
        return where, _unencodable(job.input_json, codec) or "?"
    path, bad = found
    return f"{where} at {path}", bad


def _find(value: Any, path: str, codec: str) -> tuple[str, str] | None:
    if isinstance(value, str):
        bad = _unencodable(value, codec)
        return None if bad is None else (path, bad)
    if isinstance(value, dict):
        for key, item in value.items():
            bad = _unencodable(key, codec)
            if bad is not None:
                return f"{path} (a key)", bad
            found = _find(item, f"{path}.{key}", codec)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _find(item, f"{path}[{i}]", codec)
            if found is not None:
                return found
    return None
