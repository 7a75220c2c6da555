"""``python -m bench.retention`` keeps working and measures what it says: with
retention the chains that ended are deleted while the drain goes on; without it (the
control) none is. Speeds are never asserted."""

from __future__ import annotations

import re

import pytest

from bench.retention import Run, Sample, sustain
from bench.tests._runs import run_bench


@pytest.mark.anyio
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["with", "without"])
async def test_a_run_with_retention_deletes_ended_chains_while_it_drains(
    pgwork_dsn: str, mode: str
) -> None:
    run = await sustain(
        pgwork_dsn, mode, seconds=15, rate=200, slots=4, vacuum_every=5, sample_every=3
    )

    first, last = run.samples[0], run.samples[-1]
    assert (first.enqueued, first.rows) == (0, 0)
    assert last.enqueued > 0
    assert run.ended > 0
    if mode == "with":  # the first chains ended over 5 s before the end
        assert last.deleted > 0
    else:
        assert last.deleted == 0
    assert run.vacuums > 0


def test_deletes_are_counted_over_the_second_half_of_the_run() -> None:
    run = Run("with", seconds=20, rate=100)
    run.samples += [
        Sample(at=0, enqueued=0, rows=0, size=0, open=0),
        Sample(at=10, enqueued=1000, rows=900, size=0, open=0),
        Sample(at=20, enqueued=2000, rows=500, size=0, open=0),
    ]

    assert run.deletes_per_s == pytest.approx((1500 - 100) / 10)


@pytest.mark.timeout(300)
def test_the_bench_prints_a_row_per_mode_and_their_ratio(pg_server_dsn: str) -> None:
    out = run_bench(
        "bench.retention", pg_server_dsn, "--seconds", "6", "--rate", "200", "--slots", "4"
    )

    rows = re.findall(r"^\| (without|with) retention \|", out, re.MULTILINE)
    assert rows == ["without", "with"], out
    assert "ended chains/s with retention / without:" in out, out
