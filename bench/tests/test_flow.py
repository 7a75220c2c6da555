"""``python -m bench.flow`` keeps working and its oracle counts what it claims to.

The oracle (bench/_spans.py) is checked on spans made by hand, then on live worker
processes: the keyed type's run never shows a key past its limit, and the same run of
a type without limits, given the same keys, does (what shows the oracle can see it).
Speeds are never asserted.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from bench._pgwork_app import KEY_CONCURRENCY
from bench._spans import densest_window, oracle
from bench.flow import Run, Scenario, drain, failures, scenario_keys
from bench.tests._runs import run_bench

SMALL = Scenario(jobs=300, processes=2, slots=8, keys=12, hot_keys=3, hot_share=0.8, hold_ms=5)


def test_the_oracle_counts_the_most_spans_of_one_key_at_once() -> None:
    found = oracle(
        [("a", 0.0, 1.0), ("a", 0.5, 1.5), ("a", 0.6, 0.9), ("b", 0.0, 2.0), ("a", 1.0, 2.0)]
    )

    assert (found.spans, found.most, found.busiest) == (5, 3, "a")


def test_a_span_ending_as_another_starts_does_not_overlap_it() -> None:
    found = oracle([("a", 0.0, 1.0), ("a", 1.0, 2.0), ("a", 2.0, 3.0)])

    assert found.most == 1
    assert found.waits == (0.0, 0.0)


def test_a_freed_place_is_timed_only_while_its_key_has_jobs_waiting() -> None:
    """Two places: the first end frees a place the third job takes 0.25 s later; the
    second end frees one no job waits for, and is not timed."""
    found = oracle([("a", 0.0, 1.0), ("a", 0.0, 1.5), ("a", 1.25, 2.0)])

    assert found.waits == (0.25,)
    assert found.wait_ms()[0] == pytest.approx(250.0)


def test_places_freed_together_are_taken_in_the_order_they_were_freed() -> None:
    found = oracle(
        [("a", 0.0, 1.0), ("a", 0.0, 2.0), ("a", 3.0, 4.0), ("a", 3.5, 4.0), ("b", 0.0, 1.0)]
    )

    assert found.waits == (2.0, 1.5)


def test_the_hot_keys_hold_their_share_of_the_jobs() -> None:
    keys = scenario_keys(
        Scenario(
            jobs=10_000, processes=4, slots=50, keys=100, hot_keys=10, hot_share=0.8, hold_ms=10
        )
    )

    hot = sum(key.startswith("hot-") for key in keys)
    assert len(set(keys)) == 100
    assert 0.77 < hot / len(keys) < 0.83
    assert keys == scenario_keys(
        Scenario(
            jobs=10_000, processes=4, slots=50, keys=100, hot_keys=10, hot_share=0.8, hold_ms=10
        )
    )


def test_a_run_past_the_limit_or_short_of_its_jobs_fails() -> None:
    past = Run(1.0, None, None, oracle([("a", 0.0, 1.0)] * 3), completed=3, commits=1.0)

    assert failures(Scenario(3, 1, 1, 2, 1, 0.5, 1), past) == [
        f"key 'a' ran 3 handlers at once, past its limit of {KEY_CONCURRENCY}"
    ]
    assert failures(Scenario(4, 1, 1, 2, 1, 0.5, 1), past)[-1] == (
        "4 jobs: 3 completed, 3 handler spans"
    )


@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_worker_processes_keep_every_key_within_its_limit(
    pgwork_dsn: str, pg_server_dsn: str
) -> None:
    """Two worker processes drain the keyed type: every job ran once, no key ran past
    two at once, and places freed while jobs waited were timed."""
    run = await drain(pgwork_dsn, pg_server_dsn, SMALL)

    assert failures(SMALL, run) == []
    assert run.found.most == KEY_CONCURRENCY
    assert run.found.waits


@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_control_a_type_without_limits_runs_a_key_past_two(
    pgwork_dsn: str, pg_server_dsn: str
) -> None:
    """The same run of ``noop`` (no limit), its jobs given the same keys: the oracle
    sees a hot key run more than two at once."""
    unlimited = replace(SMALL, type_name="noop")

    run = await drain(pgwork_dsn, pg_server_dsn, unlimited)

    assert run.completed == run.found.spans == SMALL.jobs
    assert run.found.most > KEY_CONCURRENCY


@pytest.mark.timeout(300)
def test_the_bench_prints_a_row_per_run_and_their_median(pg_server_dsn: str) -> None:
    out = run_bench(
        "bench.flow",
        pg_server_dsn,
        *("--jobs", "300", "--repeat", "2", "--processes", "2", "--slots", "8"),
        *("--keys", "12", "--hot-keys", "3", "--hold-ms", "5"),
    )

    assert "| run | jobs/s | worker CPU µs/job | server CPU µs/job |" in out, out
    rows = re.findall(r"^\| (keys, run \d|median of 2) \|(.*)$", out, re.MULTILINE)
    assert [label for label, _ in rows] == ["keys, run 1", "keys, run 2", "median of 2"]
    for _label, cells in rows[:2]:
        most = int(cells.split("|")[4])
        assert 1 <= most <= KEY_CONCURRENCY, out
    assert "FAILED" not in out


def test_the_densest_window_counts_the_busiest_second() -> None:
    """Three starts within a second, then two more a second later: the busiest second
    holds three; a start exactly a second after another is in the next window."""
    assert densest_window([0.0, 0.2, 0.9, 1.0, 1.9], 1.0) == 3
    assert densest_window([0.0, 1.0, 2.0], 1.0) == 1
    assert densest_window([], 1.0) == 0


def test_the_rate_run_prints_its_row(pg_server_dsn: str) -> None:
    """A run of ``--rate`` drains its jobs and prints its figures (the pace and the
    starts over the drain need more jobs than one window's, so they are numbers here)."""
    out = run_bench(
        "bench.flow",
        pg_server_dsn,
        *("--rate", "--jobs", "1200", "--repeat", "1", "--processes", "2", "--slots", "8"),
        *("--hold-ms", "1"),
    )

    assert "| run | pace, starts/s (rate 1000/s) |" in out, out
    [cells] = re.findall(r"^\| rate, run 1 \|(.*)$", out, re.MULTILINE)
    pace, _, over_the_drain = cells.split("|")[:3]
    assert float(pace.replace(",", "")) > 0, out
    assert float(over_the_drain.replace(",", "")) > 0, out
    assert "FAILED" not in out
