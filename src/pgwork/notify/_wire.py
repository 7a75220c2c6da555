"""Notices on a broker's wire: one JSON message per ``publish``.

``{"v": 1, "early": bool, "n": [[kind, queue, job_id, chain_id, reason, at, name,
count, hint], ...]}``. ``early``: the notices were published inside a transaction the
adapter could not hold them for, so they may arrive before its commit (``_broker``).

Anyone who can reach the broker may publish on the channel, and a newer pgwork may
send kinds or reasons an older one lacks, so every field is checked where a message
becomes notices, as PostgreSQL's adapter checks its payloads: what does not parse is
dropped (and counted by the listener), never raised into the worker.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from pgwork.adapters.notify import Notice
from pgwork.records import AbortReason

__all__ = ["Message", "decode", "encode"]

VERSION = 1
_KINDS = frozenset({"ready", "abort", "chain_done", "signal"})
_REASONS = frozenset(reason.value for reason in AbortReason)
_FIELDS = 9


@dataclass(frozen=True, slots=True)
class Message:
    """What one broker message carried: its notices, and whether they may be early."""

    notices: list[Notice]
    early: bool
    ignored: int  # entries that were no notice of this version


def encode(notices: Sequence[Notice], *, early: bool) -> bytes:
    rows = [
        [
            n.kind,
            n.queue,
            str(n.job_id) if n.job_id else None,
            str(n.chain_id) if n.chain_id else None,
            n.reason,
            n.at,
            n.name,
            n.count,
            n.hint,
        ]
        for n in notices
    ]
    return json.dumps({"v": VERSION, "early": early, "n": rows}, separators=(",", ":")).encode()


def decode(payload: bytes | str) -> Message | None:
    """The notices in ``payload``, or None when it is no pgwork message at all."""
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if (
        not isinstance(data, dict)
        or data.get("v") != VERSION
        or not isinstance(data.get("n"), list)
    ):
        return None
    notices: list[Notice] = []
    ignored = 0
    for row in data["n"]:
        notice = _notice(row)
        if notice is None:
            ignored += 1
        else:
            notices.append(notice)
    return Message(notices, early=data.get("early") is True, ignored=ignored)


def _notice(row: Any) -> Notice | None:
    if not isinstance(row, list) or len(row) != _FIELDS:
        return None
    kind, queue, job_id, chain_id, reason, at, name, count, hint = row
    if kind not in _KINDS:
        return None
    if not all(_optional(v, str) for v in (queue, job_id, chain_id, reason, name, hint)):
        return None
    if at is not None and (
        not isinstance(at, int | float) or isinstance(at, bool) or not math.isfinite(at)
    ):
        return None
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        return None
    try:
        notice = Notice(
            kind=kind,
            queue=queue,
            job_id=UUID(job_id) if job_id else None,
            chain_id=UUID(chain_id) if chain_id else None,
            reason=reason,
            at=float(at) if at is not None else None,
            name=name,
            count=count,
            hint=hint,
        )
    except ValueError:
        return None
    if kind == "abort" and (notice.job_id is None or reason not in _REASONS):
        return None
    if kind == "chain_done" and notice.chain_id is None:
        return None
    if kind == "signal" and not name:
        return None
    if hint is not None and (kind != "ready" or at is not None):
        return None
    return notice


def _optional(value: Any, kind: type) -> bool:
    return value is None or isinstance(value, kind)
