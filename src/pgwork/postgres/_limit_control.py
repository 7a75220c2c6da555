"""PostgreSQL side of flow limits changed at run time (``LimitControl``): overrides and
pauses written to ``job_limits``, and what runs against them read back; and the
maintenance of flow control's rows (``Maintenance.prune_limits``).

Mixed into ``PostgresStateAdapter``. A change without ``tx`` runs and commits on a
pooled connection of its own (an attempt's pause must hold even when the attempt's own
transaction rolls back).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pgwork._flow_control import Rate
from pgwork.adapters.limits import KEEP, KeyUsage, LimitChange, LimitPruning, Limits, TypeUsage
from pgwork.adapters.state import TransactionHandle
from pgwork.postgres._base import AdapterBase

__all__ = ["LimitControlOps"]


class LimitControlOps(AdapterBase):
    """``change_limits``, ``limit_usage`` and ``prune_limits`` of the PostgreSQL state
    adapter."""

    async def change_limits(
        self,
        tx: TransactionHandle | None,
        *,
        type_name: str,
        limit_key: str,
        change: LimitChange,
    ) -> list[str]:
        pause = change.paused_until
        params: dict[str, Any] = {
            "type_name": type_name,
            "limit_key": limit_key,
            "set_concurrency": change.concurrency is not KEEP,
            "concurrency": None if change.concurrency is KEEP else change.concurrency,
            "set_key_concurrency": change.key_concurrency is not KEEP,
            "key_concurrency": None if change.key_concurrency is KEEP else change.key_concurrency,
            **_rate("rate", change.rate),
            **_rate("key_rate", change.key_rate),
            "set_pause": pause is not KEEP,
            "paused_until": pause if isinstance(pause, datetime) else None,
            "pause_for_s": pause.total_seconds() if isinstance(pause, timedelta) else None,
            "extend_pause": change.extend_pause,
        }
        rows = await self._read(tx, self.statements.limit_control.change_limits, params)
        return [str(row[0]) for row in rows]

    async def limit_usage(
        self,
        tx: TransactionHandle | None,
        *,
        type_names: Sequence[str],
        key_concurrency: Mapping[str, int],
        rate: Mapping[str, Rate],
        key_rate: Mapping[str, Rate],
        keys: int,
    ) -> list[TypeUsage]:
        statements = self.statements.limit_control
        rated = sorted(rate)
        rows = await self._read(
            tx,
            statements.type_usage,
            {
                "type_names": list(type_names),
                "rated_names": rated,
                "rate_n": [rate[n].n for n in rated],
                "rate_per_s": [rate[n].per.total_seconds() for n in rated],
            },
        )
        names = [str(r[0]) for r in rows]
        key_rates = [key_rate.get(n) for n in names]
        key_rows = await self._read(
            tx,
            statements.key_usage,
            {
                "type_names": names,
                "key_concurrency": [key_concurrency.get(n) for n in names],
                "key_rate_n": [r.n if r else None for r in key_rates],
                "key_rate_per_s": [r.per.total_seconds() if r else None for r in key_rates],
                "keys": keys,
            },
        )
        by_type: dict[str, list[KeyUsage]] = {}
        for r in key_rows:
            by_type.setdefault(r[0], []).append(
                KeyUsage(
                    limit_key=r[1] or None,
                    running=int(r[2]),
                    pending=int(r[3]),
                    override=Limits(key_concurrency=r[4], key_rate=_rate_of(r[5], r[6])),
                    paused_until=r[7],
                    started=_count(r[8]),
                )
            )
        return [
            TypeUsage(
                type_name=r[0],
                override=Limits(
                    concurrency=r[1],
                    key_concurrency=r[2],
                    rate=_rate_of(r[3], r[4]),
                    key_rate=_rate_of(r[5], r[6]),
                ),
                paused_until=r[7],
                running=int(r[8]),
                pending=int(r[9]),
                keys=tuple(by_type.get(r[0], ())),
                now=r[10],
                started=_count(r[11]),
            )
            for r in rows
        ]

    async def prune_limits(
        self, *, starts_older_than: timedelta, limit: int = 1000
    ) -> LimitPruning:
        params = {"starts_older_than_s": starts_older_than.total_seconds(), "limit": limit}
        [(key_rows, starts)] = await self._read(
            None, self.statements.limit_control.prune_limits, params
        )
        return LimitPruning(key_rows=int(key_rows), starts=int(starts))


def _count(value: int | None) -> int | None:
    return None if value is None else int(value)


def _rate(name: str, value: Rate | object | None) -> dict[str, Any]:
    rate = value if isinstance(value, Rate) else None
    return {
        f"set_{name}": value is not KEEP,
        f"{name}_n": rate.n if rate else None,
        f"{name}_per_s": rate.per.total_seconds() if rate else None,
    }


def _rate_of(n: int | None, per_s: float | None) -> Rate | None:
    if n is None or per_s is None:
        return None
    return Rate(int(n), per=timedelta(seconds=float(per_s)))
