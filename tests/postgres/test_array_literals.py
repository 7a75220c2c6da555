"""The array literals of the batch insert (``_enqueue.insert_params``) hold one element
per value, whatever the values contain."""

from __future__ import annotations

import psycopg

from pgwork.postgres._enqueue import _quoted, _repeated

AWKWARD = ['{"a": "b"}', "back\\slash", '"', "\\", "", "NULL", "{,}", "ünï ✓", 'x\\"y']


def test_quoted_values_come_back_as_they_went(pgwork_dsn: str) -> None:
    with psycopg.connect(pgwork_dsn) as conn:
        for values in (AWKWARD, AWKWARD[:1], [""], []):
            row = conn.execute("SELECT %s::text::text[]", (_quoted(values),)).fetchone()
            assert row == (values,)
            row = conn.execute("SELECT %s::text::text[]", (_repeated(values),)).fetchone()
            assert row == (values,)
        row = conn.execute("SELECT %s::text::text[]", (_repeated(["q", "q", "r"]),)).fetchone()
        assert row == (["q", "q", "r"],)


def test_a_value_holding_the_separator_stays_one_element() -> None:
    # The values are joined on NUL and escaped in one pass; a value with a NUL of its
    # own (which PostgreSQL refuses later) must not split into two elements here.
    assert _quoted(["a\x00b", "c"]) == '{"a\x00b","c"}'
