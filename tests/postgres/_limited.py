"""A job of a limited type, as a client would enqueue it, for tests that drive the
limited acquire directly."""

from __future__ import annotations

from pgwork._ids import new_id
from pgwork.adapters.state import NewJob


def limited_job(type_name: str, key: str | None) -> NewJob:
    """A ready job of ``type_name`` with limit key ``key`` (its group: the key, or ''
    for none)."""
    job_id = new_id()
    return NewJob(
        id=job_id,
        type_name=type_name,
        chain_id=job_id,
        chain_type_name=type_name,
        chain_index=0,
        input_json="{}",
        queue="default",
        priority=0,
        max_attempts=3,
        limit_key=key,
        limit_group=key or "",
    )
