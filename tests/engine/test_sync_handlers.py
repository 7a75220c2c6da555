"""A handler the worker cannot await is refused when the worker is built, before any
job is taken; every kind of async callable is still accepted and runs."""

from __future__ import annotations

import functools
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from pgwork import (
    Attempt,
    ConfigurationError,
    JobTypeRegistry,
    SyncHandlerError,
    create_in_process_worker,
)

from .conftest import ClientFactory, eventually

pytestmark = pytest.mark.anyio


class Num(BaseModel):
    n: int


class Total(BaseModel):
    total: int


async def test_a_plain_def_handler_is_refused_before_any_job_runs(
    make_client: ClientFactory, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    send_email = reg.job_type("send_email", input=Num)
    client = await make_client(reg)
    started = await client.start_chain(conn, send_email, Num(n=1))
    await conn.commit()
    calls: list[int] = []

    def send(attempt: Attempt[Num, Any]) -> dict[str, int]:
        calls.append(attempt.job.input.n)
        return {"sent": 1}

    class SyncCallable:
        def __call__(self, attempt: Attempt[Num, Any]) -> None:
            calls.append(attempt.job.input.n)

    for handler in (send, SyncCallable(), functools.partial(send), lambda attempt: None):
        with pytest.raises(SyncHandlerError) as caught:
            create_in_process_worker(client=client, processors={send_email: handler})
        assert isinstance(caught.value, ConfigurationError)
        assert caught.value.type_name == "send_email"
        message = str(caught.value)
        assert "'send_email'" in message
        assert "async def" in message
        assert "asyncio.to_thread" in message
    assert calls == []
    job = await client.get_job(started.job_id)
    assert job.attempt == 0


async def test_a_plain_def_middleware_is_refused(make_client: ClientFactory) -> None:
    reg = JobTypeRegistry()
    job = reg.job_type("job", input=Num)
    client = await make_client(reg)

    async def handle(attempt: Attempt[Num, Any]) -> None:
        return None

    def middleware(attempt: Attempt[Any, Any], call_next: Any) -> Any:
        return call_next(attempt)

    with pytest.raises(SyncHandlerError, match="middleware"):
        create_in_process_worker(client=client, processors={job: handle}, middlewares=[middleware])


async def test_async_callables_of_every_shape_are_accepted_and_run(
    make_client: ClientFactory, workers: Any, conn: psycopg.AsyncConnection[Any]
) -> None:
    reg = JobTypeRegistry()
    plain = reg.job_type("plain", input=Num, output=Total)
    callable_object = reg.job_type("callable_object", input=Num, output=Total)
    partial = reg.job_type("partial", input=Num, output=Total)
    method = reg.job_type("method", input=Num, output=Total)

    async def square(attempt: Attempt[Num, Total], offset: int = 0) -> Total:
        return Total(total=attempt.job.input.n**2 + offset)

    class Squares:
        async def __call__(self, attempt: Attempt[Num, Total]) -> Total:
            return await square(attempt)

        async def handle(self, attempt: Attempt[Num, Total]) -> Total:
            return await square(attempt)

    client = await make_client(reg)
    await workers(
        client=client,
        processors={
            plain: square,
            callable_object: Squares(),
            partial: functools.partial(square, offset=1),
            method: Squares().handle,
        },
    )
    started = [
        await client.start_chain(conn, job_type, Num(n=3))
        for job_type in (plain, callable_object, partial, method)
    ]
    await conn.commit()

    async def done() -> bool:
        chains = [await client.get_chain(s.id) for s in started]
        return all(chain.status == "completed" for chain in chains)

    await eventually(done, what="every chain completed")
    outputs = [(await client.get_chain(s.id)).output for s in started]
    assert outputs == [Total(total=9), Total(total=9), Total(total=10), Total(total=9)]
