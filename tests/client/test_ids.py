"""Job ids: UUIDv7 made in batches, indistinguishable from the public constructor's."""

from __future__ import annotations

import pickle
import time
import uuid

from pgwork._ids import new_id, new_ids


def test_batch_ids_are_distinct_version_7_uuids_equal_to_their_parsed_form() -> None:
    ids = new_ids(5000)
    assert len(set(ids)) == 5000
    for made in ids[:50]:
        parsed = uuid.UUID(str(made))
        assert made == parsed
        assert hash(made) == hash(parsed)
        assert made.version == 7
        assert made.variant == uuid.RFC_4122
        assert pickle.loads(pickle.dumps(made)) == made


def test_batch_ids_carry_the_current_unix_millisecond_like_single_ids() -> None:
    before = time.time_ns() // 1_000_000
    [batch_id] = new_ids(1)
    single = new_id()
    after = time.time_ns() // 1_000_000
    for made in (batch_id, single):
        assert before <= made.int >> 80 <= after
    assert new_ids(0) == []


def test_ids_made_one_after_another_always_grow_even_within_a_millisecond() -> None:
    made = [new_id() for _ in range(2000)] + new_ids(500) + [new_id() for _ in range(10)]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    assert {u.version for u in made} == {7}
