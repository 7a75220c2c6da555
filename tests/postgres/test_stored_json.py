"""Stored inputs are parsed row by row (``parse_stored_json``): a fast parser first, and
``json.loads`` for what it refuses, so every input pgwork accepts at enqueue still
reads back, and only a truly unreadable one stands in as ``UndecodablePayload``."""

from __future__ import annotations

import json

from pgwork.payload import MAX_PAYLOAD_DEPTH
from pgwork.postgres._rows import parse_stored_json
from pgwork.records import UndecodablePayload


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_inputs_as_deep_as_enqueue_accepts_read_back() -> None:
    # Deeper than the fast parser's own limit (200), within what enqueue accepts.
    text = _nested(MAX_PAYLOAD_DEPTH)
    assert parse_stored_json(text) == json.loads(text)


def test_an_input_too_deep_for_any_parser_is_undecodable() -> None:
    parsed = parse_stored_json(_nested(5000))
    assert isinstance(parsed, UndecodablePayload)
    assert "nested too deeply" in parsed.reason


def test_values_read_back_as_json_loads_reads_them() -> None:
    text = '{"a": [1, -0.0, 1E2, 123456789012345678901234567890, "x\\u00e9\\n", null, true]}'
    parsed = parse_stored_json(text)
    assert parsed == json.loads(text)
    assert [type(v) for v in parsed["a"]] == [type(v) for v in json.loads(text)["a"]]
