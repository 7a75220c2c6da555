"""``_frozen.frozen_builder``: the worker's per-job records, built without their frozen
``__init__``, are the same objects the class itself builds."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from pgwork._frozen import frozen_builder
from pgwork.adapters.state import AcquiredJob, Completion, CompletionResult
from pgwork.postgres._rows import acquired_from_row
from pgwork.records import AttemptError, Job


@dataclass(frozen=True, slots=True)
class Pair:
    left: int
    right: str = "r"


def test_a_built_record_equals_and_hashes_as_the_class_built_it_and_stays_frozen() -> None:
    build = frozen_builder(Pair, ("right", "left"))  # the caller's order
    made = build("x", 3)
    assert type(made) is Pair
    assert made == Pair(left=3, right="x")
    assert hash(made) == hash(Pair(3, "x"))
    assert pickle.loads(pickle.dumps(made)) == made
    assert dataclasses.replace(made, left=4) == Pair(4, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.left = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        build(3)  # every field, or nothing is built


def test_a_builder_must_name_every_field_once() -> None:
    with pytest.raises(TypeError, match="each of its fields once"):
        frozen_builder(Pair, ("right",))  # left has no default: it would be left unset
    with pytest.raises(TypeError, match="each of its fields once"):
        frozen_builder(Pair, ("left", "left", "right"))
    with pytest.raises(TypeError, match="each of its fields once"):
        frozen_builder(Pair, ("left", "right", "extra"))


def test_a_field_with_a_default_left_out_gets_its_default() -> None:
    @dataclass(frozen=True, slots=True)
    class Tagged:
        left: int
        right: str = "r"
        tags: list[str] = dataclasses.field(default_factory=list)

    build = frozen_builder(Tagged, ("left",))
    made, other = build(3), build(4)
    assert made == Tagged(3)
    assert made.tags is not other.tags  # a fresh value from the factory each time


def test_a_builder_refuses_what_it_cannot_build_faithfully() -> None:
    @dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    with pytest.raises(TypeError, match="not a slotted dataclass"):
        frozen_builder(Unslotted, ("a",))
    with pytest.raises(TypeError, match="__post_init__"):
        frozen_builder(Checked, ("a",))


def test_an_acquired_row_becomes_the_acquired_job_the_constructor_makes() -> None:
    """Every column lands in its own field (distinct values, so a swap shows)."""
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    ids = [uuid4() for _ in range(3)]
    row = (
        ids[0],
        "type-a",
        ids[1],
        "chain-type",
        2,
        '{"n": 1}',
        "queue-q",
        7,
        3,
        9,
        ids[2],
        now + timedelta(seconds=1),
        now + timedelta(seconds=2),
        now + timedelta(seconds=3),
        {"type": "E", "message": "m", "traceback": "t"},
        {"traceparent": "00-x"},
        now + timedelta(seconds=4),
        now + timedelta(seconds=5),
        "dedup",
        {"tenant": "t1"},
        "tenant-1",
    )
    assert acquired_from_row(row) == AcquiredJob(
        id=ids[0],
        type_name="type-a",
        chain_id=ids[1],
        chain_type_name="chain-type",
        chain_index=2,
        input={"n": 1},
        queue="queue-q",
        priority=7,
        attempt=3,
        max_attempts=9,
        lease_token=ids[2],
        leased_until=now + timedelta(seconds=1),
        created_at=now + timedelta(seconds=2),
        scheduled_at=now + timedelta(seconds=3),
        last_attempt_error=AttemptError(type="E", message="m", traceback="t"),
        trace_context={"traceparent": "00-x"},
        started_at=now + timedelta(seconds=4),
        last_attempt_at=now + timedelta(seconds=5),
        dedup_key="dedup",
        context={"tenant": "t1"},
        limit_key="tenant-1",
    )


@pytest.mark.parametrize("cls", [Job, AcquiredJob, Completion, CompletionResult])
def test_the_per_job_records_can_be_built_so(cls: type) -> None:
    """A field added to one of them must be added to its builder (it fails at import
    otherwise); a ``__post_init__`` added to one would make the builder refuse it."""
    names = [f.name for f in dataclasses.fields(cls)]
    assert type(frozen_builder(cls, names)(*range(len(names)))) is cls
