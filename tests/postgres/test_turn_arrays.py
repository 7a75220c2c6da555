"""The turn statement's arrays, written by pgwork in PostgreSQL's binary format
(``postgres/_arrays``), read back by the server as the values they were built from."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest

from pgwork.postgres._arrays import bools, floats, texts, turn_constants, uuids

UUIDS = [uuid.uuid4() for _ in range(3)]
TEXTS = ["noop", "", 'quo"te,{brace}\\', "naïve ☃"]


@pytest.mark.parametrize(
    ("array", "cast", "expected"),
    [
        (uuids(UUIDS), "uuid[]", UUIDS),
        (texts(TEXTS, "utf-8"), "text[]", TEXTS),
        (bools([True, False, True]), "bool[]", [True, False, True]),
        (floats([300.0, 0.5]), "float8[]", [300.0, 0.5]),
        (uuids([]), "uuid[]", []),
        (texts([], "utf-8"), "text[]", []),
    ],
)
def test_the_server_reads_pgwork_built_arrays_as_the_values_they_came_from(
    pgwork_dsn: str, array: bytes, cast: str, expected: list[object]
) -> None:
    with psycopg.connect(pgwork_dsn) as conn:
        [(got,)] = conn.execute(f"SELECT %(a)b::{cast}".encode(), {"a": array}).fetchall()
    assert got == expected


def test_an_array_passed_as_plain_bytes_is_not_taken_for_an_array(pgwork_dsn: str) -> None:
    # Control: without the registered dumper the same bytes travel as bytea, which the
    # server refuses to read as uuid[]: the dumper is what makes them an array.
    with psycopg.connect(pgwork_dsn) as conn, pytest.raises(psycopg.Error):
        conn.execute(b"SELECT %(a)b::uuid[]", {"a": bytes(uuids(UUIDS))})


def test_a_workers_constant_arrays_are_built_once() -> None:
    leases = (("noop", timedelta(seconds=300)),)
    first = turn_constants(leases, ("default",), "utf-8")
    assert turn_constants(leases, ("default",), "utf-8") is first
    assert turn_constants(leases, None, "utf-8").keys() == {"type_names", "lease_seconds"}


def test_a_missing_lease_token_travels_as_a_null_element(pgwork_dsn: str) -> None:
    with psycopg.connect(pgwork_dsn) as conn:
        [(got,)] = conn.execute(
            b"SELECT %(a)b::uuid[]", {"a": uuids([UUIDS[0], None, UUIDS[1]])}
        ).fetchall()
    assert got == [UUIDS[0], None, UUIDS[1]]
