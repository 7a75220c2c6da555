"""``pgwork jobs list|show|retry|cancel`` and ``pgwork chains show`` on real PostgreSQL,
without the job-type registry that made the jobs."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from click.testing import CliRunner, Result
from psycopg_pool import AsyncConnectionPool
from tests.cli._cli_seed import Mail, Seeded, digest, seed
from tests.cli._cli_seed import registry as seed_registry
from tests.cli._run import run

from pgwork import Client, Debounce, PostgresStateAdapter, create_client
from pgwork.cli import EXIT_ERROR

JOB_KEYS = {
    "attempt_history",
    "id",
    "type_name",
    "status",
    "queue",
    "priority",
    "chain_id",
    "chain_type_name",
    "chain_index",
    "attempt",
    "max_attempts",
    "input",
    "output",
    "last_attempt_error",
    "created_at",
    "scheduled_at",
    "started_at",
    "completed_at",
    "last_attempt_at",
    "leased_by",
    "leased_until",
    "dedup_key",
    "context",
    "limit_key",
    "debounce_deadline",
}


@pytest.fixture
def seeded(pgwork_dsn: str) -> Seeded:
    return seed(pgwork_dsn)


def run_json(runner: CliRunner, dsn: str, *args: str) -> Any:
    result = run(runner, dsn, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def listed_ids(runner: CliRunner, dsn: str, *args: str) -> list[UUID]:
    return [UUID(job["id"]) for job in run_json(runner, dsn, "jobs", "list", *args)["jobs"]]


def one_line_error(result: Result) -> str:
    assert result.exit_code == EXIT_ERROR, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


# --- jobs list -------------------------------------------------------------------------


def test_jobs_list_prints_a_table_newest_first(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    result = run(runner, pgwork_dsn, "jobs", "list")

    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.splitlines()[0].split() == [
        "ID",
        "STATUS",
        "TYPE",
        "QUEUE",
        "TRIES",
        "AGE",
        "LAST",
        "ERROR",
    ]
    newest_first = [
        seeded.blocked_job,
        seeded.scheduled_job,
        *reversed(seeded.mail_jobs),
        seeded.parse_job,
        seeded.failed_job,
        seeded.fetch_chain,
    ]
    assert [out.index(str(i)) for i in newest_first] == sorted(
        out.index(str(i)) for i in newest_first
    )
    failed_row = next(line for line in out.splitlines() if str(seeded.failed_job) in line)
    assert failed_row.split()[1:5] == ["failed", "explode", "default", "1/1"]
    assert "builtins.ValueError: cannot fetch https://bad.example" in failed_row
    assert "next page" not in out


def test_jobs_list_in_80_columns_drops_the_error_column_not_the_ids(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    result = run(runner, pgwork_dsn, "jobs", "list", width=80)

    assert result.exit_code == 0, result.output
    assert "LAST ERROR" not in result.stdout
    assert all(len(line.rstrip()) <= 80 for line in result.stdout.splitlines())
    assert str(seeded.failed_job) in result.stdout
    assert "explode" in result.stdout


def test_jobs_list_filters_by_type_queue_status_and_chain(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    mail = {*seeded.mail_jobs, seeded.scheduled_job}

    assert set(listed_ids(runner, pgwork_dsn, "--type", "send_mail")) == mail
    assert set(listed_ids(runner, pgwork_dsn, "--queue", "mail")) == mail | {seeded.blocked_job}
    assert listed_ids(runner, pgwork_dsn, "--status", "failed") == [seeded.failed_job]
    assert listed_ids(runner, pgwork_dsn, "--status", "BLOCKED") == [seeded.blocked_job]
    assert listed_ids(runner, pgwork_dsn, "--chain", str(seeded.fetch_chain)) == [
        seeded.parse_job,
        seeded.fetch_chain,
    ]
    assert listed_ids(runner, pgwork_dsn, "--type", "send_mail", "--status", "completed") == []


def test_jobs_list_pages_with_the_printed_cursor(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    first = run(runner, pgwork_dsn, "jobs", "list", "--limit", "3")
    match = re.search(r"next page: --cursor (\S+)", first.stdout)
    assert match is not None, first.stdout
    cursor: str | None = match.group(1)
    seen = [UUID(line.split()[0]) for line in first.stdout.splitlines()[1:4]]
    while cursor is not None:
        page = run_json(runner, pgwork_dsn, "jobs", "list", "--limit", "3", "--cursor", cursor)
        seen += [UUID(job["id"]) for job in page["jobs"]]
        cursor = page["next_cursor"]

    assert seen == listed_ids(runner, pgwork_dsn)
    assert len(set(seen)) == 8


def test_jobs_list_json_has_stable_keys_iso_timestamps_and_string_ids(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    page = run_json(runner, pgwork_dsn, "jobs", "list", "--status", "failed")

    assert set(page) == {"jobs", "next_cursor"}
    assert page["next_cursor"] is None
    (job,) = page["jobs"]
    assert set(job) == JOB_KEYS
    assert job["id"] == job["chain_id"] == str(seeded.failed_job)
    assert datetime.fromisoformat(job["created_at"]).tzinfo is not None
    assert job["input"] == {"url": "https://bad.example"}
    assert job["last_attempt_error"]["type"] == "builtins.ValueError"


def test_jobs_list_with_nothing_matching_says_so(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    result = run(runner, pgwork_dsn, "jobs", "list", "--type", "nope")

    assert result.exit_code == 0
    assert result.stdout.strip() == "no jobs match"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "done"], "unknown job status 'done'; use one of blocked, pending"),
        (["--cursor", "not-a-cursor"], "invalid cursor 'not-a-cursor'"),
        (["--cursor", "not-a-cursor"], "leave it out for the first page"),
        (["--limit", "0"], "limit must be between 1 and 1000, got 0"),
        (["--chain", "42"], "'42' is not a chain id"),
    ],
)
def test_jobs_list_refuses_bad_filters_in_one_line(
    runner: CliRunner, pgwork_dsn: str, args: list[str], message: str
) -> None:
    result = run(runner, pgwork_dsn, "jobs", "list", *args)

    assert message in one_line_error(result)
    assert "None" not in one_line_error(result)  # Python's word, not the CLI's


# --- jobs show -------------------------------------------------------------------------


def test_jobs_show_prints_every_field_with_the_last_error_and_traceback(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    result = run(runner, pgwork_dsn, "jobs", "show", str(seeded.failed_job))

    assert result.exit_code == 0, result.output
    fields = {
        line.split(maxsplit=1)[0]: line.split(maxsplit=1)[1].strip()
        for line in result.stdout.splitlines()
        if line[:1].isalpha() and len(line.split(maxsplit=1)) == 2
    }
    assert fields["id"] == str(seeded.failed_job)
    assert fields["status"] == "failed"
    assert fields["type"] == "explode"
    assert fields["attempt"] == "1 of 1"
    assert fields["chain"] == f"{seeded.failed_job} (explode, step 0)"
    # Its end time is labelled with how it ended, not "completed".
    assert "completed" not in fields
    assert fields["failed"].startswith("20")
    assert '"url": "https://bad.example"' in result.stdout
    assert "last error    builtins.ValueError: cannot fetch https://bad.example" in result.stdout
    assert "Traceback (most recent call last)" in result.stdout
    assert "in _explode" in result.stdout
    # Its one failed attempt, on the line of the failures.
    [failure] = [line for line in result.stdout.splitlines() if line.startswith("failures")]
    assert "#1 20" in failure
    assert "builtins.ValueError: cannot fetch https://bad.example" in failure


def test_jobs_show_json_holds_input_output_and_error(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    parsed = run_json(runner, pgwork_dsn, "jobs", "show", str(seeded.parse_job))
    failed = run_json(runner, pgwork_dsn, "jobs", "show", str(seeded.failed_job))

    assert set(parsed) == JOB_KEYS
    assert parsed["status"] == "completed"
    assert (parsed["chain_id"], parsed["chain_index"]) == (str(seeded.fetch_chain), 1)
    assert parsed["output"] == {"words": 19}
    assert parsed["last_attempt_error"] is None
    error = failed["last_attempt_error"]
    assert error["message"] == "cannot fetch https://bad.example"
    assert "Traceback (most recent call last)" in error["traceback"]
    assert parsed["attempt_history"] == []
    [entry] = failed["attempt_history"]
    assert (entry["attempt"], entry["error"]["message"]) == (1, error["message"])
    assert datetime.fromisoformat(entry["at"]) == datetime.fromisoformat(failed["last_attempt_at"])
    assert entry["worker"]


# --- jobs retry / cancel ---------------------------------------------------------------


@pytest.mark.parametrize(("flag", "front"), [([], True), (["--no-front"], False)])
def test_jobs_retry_puts_a_failed_job_back_in_its_queue(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded, flag: list[str], front: bool
) -> None:
    result = run(runner, pgwork_dsn, "jobs", "retry", str(seeded.failed_job), *flag)

    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"retried {seeded.failed_job}"
    job = run_json(runner, pgwork_dsn, "jobs", "show", str(seeded.failed_job))
    assert (job["status"], job["attempt"]) == ("pending", 0)
    scheduled = datetime.fromisoformat(job["scheduled_at"])
    others = [
        datetime.fromisoformat(j["scheduled_at"])
        for j in run_json(
            runner, pgwork_dsn, "jobs", "list", "--queue", job["queue"], "--status", "pending"
        )["jobs"]
        if j["id"] != job["id"]
    ]
    if front:  # ahead of every job already waiting in its queue
        assert all(scheduled < other for other in others)
    else:  # due from the retry on, behind what was already waiting
        assert scheduled > datetime.fromisoformat(job["created_at"])
        assert all(scheduled > other for other in others)


def test_jobs_retry_of_a_job_that_has_not_failed_changes_nothing(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    result = run(
        runner, pgwork_dsn, "jobs", "retry", str(seeded.failed_job), str(seeded.mail_jobs[0])
    )

    line = one_line_error(result)
    assert f"only failed jobs can be retried: {seeded.mail_jobs[0]} (pending)" in line
    assert listed_ids(runner, pgwork_dsn, "--status", "failed") == [seeded.failed_job]


def test_jobs_cancel_cancels_the_chains_of_jobs_and_chain_ids(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    first, second, _ = seeded.mail_jobs
    result = run(runner, pgwork_dsn, "jobs", "cancel", str(second), str(first))

    assert result.exit_code == 0, result.output
    assert sorted(result.stdout.split("\n")[:2]) == sorted(
        [f"cancelled chain {first}", f"cancelled chain {second}"]
    )
    assert set(listed_ids(runner, pgwork_dsn, "--status", "cancelled")) >= {first, second}
    # The digest job waited on the first mail's chain: its type fails with its blocker.
    blocked = run_json(runner, pgwork_dsn, "jobs", "show", str(seeded.blocked_job))
    assert blocked["status"] == "failed"
    assert blocked["last_attempt_error"]["type"] == "BlockerChainEnded"


def test_jobs_cancel_of_an_ended_chain_changes_nothing(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    pending = seeded.mail_jobs[2]
    result = run(runner, pgwork_dsn, "jobs", "cancel", str(pending), str(seeded.parse_job))

    assert f"chain already ended: {seeded.parse_job} (completed)" in one_line_error(result)
    assert run_json(runner, pgwork_dsn, "jobs", "show", str(pending))["status"] == "pending"


# --- chains show -----------------------------------------------------------------------


def test_chains_show_prints_status_output_and_jobs_in_order(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    result = run(runner, pgwork_dsn, "chains", "show", str(seeded.fetch_chain))

    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["chain", str(seeded.fetch_chain)]
    assert "status     completed" in result.stdout
    assert '"words": 19' in result.stdout
    steps = [line.split()[:4] for line in lines if line.strip()[:1].isdigit()]
    assert steps == [
        ["0", str(seeded.fetch_chain), "completed", "fetch"],
        ["1", str(seeded.parse_job), "completed", "parse"],
    ]


def test_chains_show_of_a_failed_chain_names_the_error(
    runner: CliRunner, pgwork_dsn: str, seeded: Seeded
) -> None:
    result = run(runner, pgwork_dsn, "chains", "show", str(seeded.failed_job))

    assert result.exit_code == 0, result.output
    assert "status     failed" in result.stdout
    assert "completed  " not in result.stdout
    assert "builtins.ValueError: cannot fetch https://bad.example" in result.stdout


def test_chains_show_json(runner: CliRunner, pgwork_dsn: str, seeded: Seeded) -> None:
    chain = run_json(runner, pgwork_dsn, "chains", "show", str(seeded.fetch_chain))

    assert set(chain) == {
        "id",
        "type_name",
        "status",
        "input",
        "output",
        "created_at",
        "completed_at",
        "dedup_key",
        "waiting",
        "jobs",
    }
    assert (chain["id"], chain["status"], chain["output"]) == (
        str(seeded.fetch_chain),
        "completed",
        {"words": 19},
    )
    assert [job["id"] for job in chain["jobs"]] == [str(seeded.fetch_chain), str(seeded.parse_job)]
    assert all(set(job) == JOB_KEYS for job in chain["jobs"])
    assert chain["waiting"] is None  # an ended chain waits for nothing


def test_chains_show_and_jobs_show_give_a_debounced_jobs_next_start_and_deadline(
    runner: CliRunner, pgwork_dsn: str
) -> None:
    client = create_client(
        state_adapter=PostgresStateAdapter(AsyncConnectionPool(pgwork_dsn, open=False)),
        registry=seed_registry,
    )
    spec = Debounce("digest-ada", delay=timedelta(minutes=5), max_wait=timedelta(hours=1))
    with psycopg.connect(pgwork_dsn) as conn:
        started = client.start_chain_sync(conn, digest, Mail(to="ada@example.com"), dedup=spec)
        conn.commit()
        client.start_chain_sync(conn, digest, Mail(to="ada@example.org"), dedup=spec)
        conn.commit()
    job = run_json(runner, pgwork_dsn, "jobs", "show", str(started.job_id))
    assert job["debounce_deadline"] is not None
    line = re.compile(
        rf"debounced +next start {re.escape(job['scheduled_at'])} \(in \d+m \d+s\), "
        rf"deadline {re.escape(job['debounce_deadline'])} \(in \d+m \d+s\)$"
    )

    for command in ("chains", "jobs"):
        result = run(runner, pgwork_dsn, command, "show", str(started.id))
        assert result.exit_code == 0, result.output
        [shown] = [row for row in result.stdout.splitlines() if row.startswith("debounced")]
        assert line.match(shown.rstrip()), shown

    # A job that is not debounced has no such line.
    plain = run(runner, pgwork_dsn, "jobs", "show", str(_plain_job(client, pgwork_dsn)))
    assert "debounced" not in plain.stdout


def _plain_job(client: Client, dsn: str) -> UUID:
    with psycopg.connect(dsn) as conn:
        started = client.start_chain_sync(conn, digest, Mail(to="bob@example.com"))
        conn.commit()
    return started.job_id


# --- ids -------------------------------------------------------------------------------

UNKNOWN = "01a2ffff-0000-7000-8000-000000000000"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["jobs", "show", UNKNOWN], f"no job with id {UNKNOWN}"),
        (["jobs", "retry", UNKNOWN], f"no job with id {UNKNOWN}"),
        (["jobs", "cancel", UNKNOWN], f"no job with id {UNKNOWN}"),
        (["chains", "show", UNKNOWN], f"no chain with id {UNKNOWN}"),
        (["jobs", "show", "nope"], "'nope' is not a job id"),
        (["jobs", "retry", "nope"], "'nope' is not a job id"),
        (["jobs", "cancel", "nope"], "'nope' is not a job or chain id"),
        (["chains", "show", "nope"], "'nope' is not a chain id"),
    ],
)
def test_an_unknown_or_malformed_id_is_one_line(
    runner: CliRunner, pgwork_dsn: str, args: list[str], message: str
) -> None:
    result = run(runner, pgwork_dsn, *args)

    assert message in one_line_error(result)


def test_retry_and_cancel_need_at_least_one_id(runner: CliRunner, pgwork_dsn: str) -> None:
    for command in ("retry", "cancel"):
        result = run(runner, pgwork_dsn, "jobs", command)

        assert result.exit_code == 2
        assert "Missing argument 'ID...'" in result.stderr
