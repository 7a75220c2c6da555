"""PostgreSQL side of the ``Debouncing`` capability: ``debounce_jobs``.

Mixed into ``PostgresStateAdapter`` (``state.py``). The jobs of one call are folded to
one row per (chain type, key) here, since one ``INSERT ... ON CONFLICT DO UPDATE`` may
change a row once only; the statement (``sql.enqueue.DEBOUNCE_JOBS``) then inserts
each row or merges it into the key's pending debounced job, race-safe through the
unique index ``jobs_debounce_idx`` rather than a lock of pgwork's own, so that it
holds at every isolation level.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from uuid import UUID

from pgwork.adapters.notify import Notice, NotifyAdapter
from pgwork.adapters.state import Debounce, InsertedJob, NewJob, TransactionHandle
from pgwork.errors import ConfigurationError
from pgwork.postgres._base import AdapterBase
from pgwork.postgres._encoding import check_encodable, narrow_encoding
from pgwork.postgres._transactions import require_transaction, unwrap
from pgwork.records import JobStatus

__all__ = ["DebounceOps"]


@dataclass(slots=True)
class _Key:
    """The jobs of one (chain type, key) in a call, folded as if enqueued one after
    another: the first carries the row; ``input_json`` is the last input a ``"last"``
    job gave (else the first's), ``replace`` whether any gave one; ``delay_s`` the
    longest delay (each merge keeps the later start); ``max_wait_s`` the first's."""

    carrier: NewJob
    input_json: str
    replace: bool
    delay_s: float
    max_wait_s: float
    positions: list[int] = field(default_factory=list)


class DebounceOps(AdapterBase):
    """Insert debounced jobs, or merge them into their key's pending one."""

    async def debounce_jobs(
        self,
        tx: TransactionHandle,
        *,
        jobs: Sequence[NewJob],
        notify: NotifyAdapter | None = None,
    ) -> list[InsertedJob]:
        jobs = list(jobs)
        keys = _fold(jobs)
        conn = await unwrap(tx)
        require_transaction(conn)
        encoding = narrow_encoding(conn)
        if encoding is not None:
            check_encodable(jobs, encoding)
        results: list[InsertedJob | None] = [None] * len(jobs)
        due: dict[str, float] = {}
        # One statement per mode (the merge's SET differs), each over its keys sorted,
        # so that two calls debouncing the same keys the same way take their rows in
        # the same order and cannot deadlock.
        for mode in ("last", "first"):
            group = sorted(
                (k for k in keys.values() if (k.replace if mode == "last" else not k.replace)),
                key=lambda k: (k.carrier.chain_type_name, _spec(k.carrier).key),
            )
            if not group:
                continue
            rows = await self._fetch(
                conn, self.statements.enqueue.debounce_jobs[mode], _params(group)
            )
            landed: dict[tuple[str, str], UUID] = {(row[1], row[2]): row[0] for row in rows}
            for k in group:
                job_id = landed[(k.carrier.chain_type_name, _spec(k.carrier).key)]
                merged = job_id != k.carrier.id
                first, *rest = k.positions
                results[first] = InsertedJob(job_id, job_id, JobStatus.PENDING, merged, merged)
                for position in rest:
                    results[position] = InsertedJob(job_id, job_id, JobStatus.PENDING, True, True)
                if not merged:
                    queue = k.carrier.queue
                    # Due after the delay, held to the deadline as the statement holds it.
                    start_s = min(k.delay_s, k.max_wait_s)
                    due[queue] = min(due.get(queue, math.inf), time.time() + start_s)
        if notify is not None and due:
            notices = [Notice(kind="ready", queue=q, at=at) for q, at in sorted(due.items())]
            await notify.publish(tx, notices=notices)
        return [result for result in results if result is not None]


def _spec(job: NewJob) -> Debounce:
    dedup = job.dedup
    assert isinstance(dedup, Debounce)
    return dedup


def _fold(jobs: Sequence[NewJob]) -> dict[tuple[str, str], _Key]:
    """The jobs by (chain type, key), each checked to be a debounced chain's first job."""
    keys: dict[tuple[str, str], _Key] = {}
    for position, job in enumerate(jobs):
        spec = job.dedup
        if not isinstance(spec, Debounce):
            raise ConfigurationError(
                f"debounce_jobs takes jobs whose dedup is a Debounce, got {spec!r} "
                f"(job {job.id}): insert the others with insert_jobs"
            )
        if (
            job.blockers
            or job.run_at is not None
            or job.run_after is not None
            or job.chain_id != job.id
            or job.chain_index != 0
        ):
            raise ConfigurationError(
                f"a debounced job (key {spec.key!r}) starts a chain of its own and has no "
                "schedule (its delay is one) and no blockers"
            )
        name = (job.chain_type_name, spec.key)
        known = keys.get(name)
        if known is None:
            known = keys[name] = _Key(
                carrier=job,
                input_json=job.input_json,
                replace=spec.keep == "last",
                delay_s=spec.delay.total_seconds(),
                max_wait_s=spec.max_wait.total_seconds(),
            )
        else:
            if spec.keep == "last":
                known.input_json = job.input_json
                known.replace = True
            known.delay_s = max(known.delay_s, spec.delay.total_seconds())
        known.positions.append(position)
    return keys


def _params(group: Sequence[_Key]) -> dict[str, object]:
    carriers = [k.carrier for k in group]
    return {
        "ids": [j.id for j in carriers],
        "type_names": [j.type_name for j in carriers],
        "chain_type_names": [j.chain_type_name for j in carriers],
        "inputs": [k.input_json for k in group],
        "queues": [j.queue for j in carriers],
        "priorities": [j.priority for j in carriers],
        "max_attempts": [j.max_attempts for j in carriers],
        "delays": [k.delay_s for k in group],
        "max_waits": [k.max_wait_s for k in group],
        "keys": [_spec(j).key for j in carriers],
        "trace_contexts": [
            json.dumps(dict(j.trace_context)) if j.trace_context else None for j in carriers
        ],
        "contexts": [json.dumps(dict(j.context)) if j.context else None for j in carriers],
        "limit_keys": [j.limit_key for j in carriers],
        "limit_groups": [j.limit_group for j in carriers],
    }
