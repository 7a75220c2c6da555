"""A job's logging context: given at enqueue, stored, inherited, read back, logged."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import psycopg
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ChainStart,
    Continue,
    InvalidOptionError,
    JobTypeRegistry,
    LogContextFilter,
    log_context,
)
from pgwork.cli import main

from .conftest import ClientFactory

pytestmark = pytest.mark.anyio

CONTEXT = {"request_id": "req-42", "tenant": "acme"}


class Num(BaseModel):
    n: int


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(LogContextFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_context_is_stored_inherited_read_back_and_on_every_handler_log_line(
    make_client: ClientFactory,
    conn: psycopg.AsyncConnection[Any],
    workers: Any,
    pgwork_dsn: str,
) -> None:
    reg = JobTypeRegistry()
    first = reg.job_type("first", input=Num, continue_with=["second"])
    second = reg.job_type("second", input=Num, entry=False)
    client = await make_client(reg)
    started = await client.start_chain(conn, first, Num(n=1), context=CONTEXT)
    # A batch large enough to go by COPY carries it too.
    batch = await client.start_chains(conn, [ChainStart(first, Num(n=0))] * 99)
    await conn.commit()
    assert (await client.get_job(started.job_id)).context == CONTEXT
    assert (await client.get_job(batch[0].job_id)).context is None

    seen: dict[str, Any] = {}
    done = anyio.Event()
    logger = logging.getLogger("app.handlers")
    collect = Collect()
    logger.addHandler(collect)
    logger.setLevel(logging.INFO)

    async def hand_on(attempt: Attempt[Num, Any]) -> Any:
        if attempt.job.input.n == 0:
            return None
        seen["first"] = attempt.job.context
        logger.info("first step")
        return Continue(second, Num(n=2))

    async def finish(attempt: Attempt[Num, Any]) -> None:
        seen["second"] = attempt.job.context
        logger.info("second step")
        done.set()

    try:
        await workers(
            client=client, processors={first: hand_on, second: finish}, middlewares=[log_context]
        )
        with anyio.fail_after(30):
            await done.wait()
    finally:
        logger.removeHandler(collect)
    assert seen == {"first": CONTEXT, "second": CONTEXT}
    [continuation] = (await client.list_chain_jobs(started.id))[1:]
    assert continuation.context == CONTEXT  # inherited by the chain's next job
    lines = [r for r in collect.records if r.getMessage().endswith("step")]
    assert [r.getMessage() for r in lines] == ["first step", "second step"]
    for record in lines:
        assert record.__dict__["context"] == CONTEXT
        assert record.__dict__["request_id"] == "req-42"

    args = ["jobs", "show", str(started.job_id), "--dsn", pgwork_dsn]
    shown = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(main, args))
    assert shown.exit_code == 0, shown.output
    assert '"request_id": "req-42"' in shown.stdout


@pytest.mark.parametrize(
    "context",
    [{"n": 1}, {1: "x"}, ["not", "a", "mapping"], {"big": "x" * 5000}, {"k": "nul\x00"}],
    ids=["int-value", "int-key", "list", "too-big", "nul"],
)
async def test_a_context_that_is_not_a_small_string_map_is_refused_before_any_sql(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any], context: Any
) -> None:
    reg = JobTypeRegistry()
    first = reg.job_type("first", input=Num)
    client = await make_client(reg)
    with pytest.raises(InvalidOptionError, match="context must be a mapping of str to str"):
        await client.start_chain(conn, first, Num(n=1), context=context)
    await client.start_chain(conn, first, Num(n=1))  # the transaction is still usable
    await conn.commit()
