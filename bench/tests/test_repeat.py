"""``python -m bench --repeat N``: each workload runs N times, pgwork and the peers
taking turns, and the table shows each row's median run, with every run's figure in
its note. One run's rate moves by a third on a shared machine; a verdict on a ratio
should not rest on one draw."""

from __future__ import annotations

from bench._report import Cost, Measurement, medians
from bench.tests._runs import run_bench


def _drain(value: float, library: str = "pgwork", note: str = "") -> Measurement:
    cost = Cost(library_us=value / 1000, server_us=1.0, writes=0.01, wal_bytes=800.0)
    return Measurement("drain", library, value, "jobs/s", note=note, cost=cost)


def test_the_median_run_is_kept_with_its_own_cost_and_every_figure_noted() -> None:
    runs = [_drain(30_000, note="a"), _drain(20_000, note="b"), _drain(25_000, note="c")]
    (kept,) = medians(runs)
    assert kept.value == 25_000
    assert kept.cost == runs[2].cost  # the cost rows are the median run's, not a mix
    assert kept.note == "median of 3 runs (30,000, 20,000, 25,000 jobs/s); c"


def test_an_even_count_keeps_the_lower_middle_run() -> None:
    (kept,) = medians([_drain(4.0), _drain(1.0), _drain(3.0), _drain(2.0)])
    assert kept.value == 2.0
    assert kept.note == "median of 4 runs (4.0, 1.0, 3.0, 2.0 jobs/s)"


def test_rows_run_once_are_untouched_and_the_order_is_kept() -> None:
    single = Measurement("enqueue", "pgwork", 1_000.0, "jobs/s", note="once")
    peer = [_drain(10.0, "pgqueuer-asyncpg"), _drain(12.0, "pgqueuer-asyncpg")]
    out = medians([single, _drain(5.0), *peer, _drain(7.0), _drain(6.0)])
    assert [(m.row, m.library) for m in out] == [
        ("enqueue", "pgwork"),
        ("drain", "pgwork"),
        ("drain", "pgqueuer-asyncpg"),
    ]
    assert out[0] == single
    assert [m.value for m in out[1:]] == [6.0, 10.0]


def test_the_harness_repeats_each_workload_and_reports_medians(pg_server_dsn: str) -> None:
    table = run_bench(
        "bench", pg_server_dsn, "--only", "enqueue", "--size", "0.002", "--repeat", "3", "--quiet"
    )
    assert "repeats=3" in table
    rows = [line for line in table.splitlines() if line.startswith("- pgwork, enqueue")]
    assert len(rows) == 3, table  # one note per enqueue row: 1, 100 and 1,000 per batch
    assert all("median of 3 runs (" in line for line in rows), rows
