"""Chains and blockers: fan out, fan in, and a chain that decides its next step.

Two ``fetch_price`` chains run side by side; ``build_quote`` is started blocked on both
and runs only when they completed, reading their outputs. Its handler then continues
the chain with ``approve`` or ``escalate`` depending on the total, and the caller
awaits the chain's final output.

    PGWORK_DSN=postgresql://localhost/app python examples/chains_with_blockers.py
"""

from __future__ import annotations

import os

import anyio
import psycopg
from pydantic import BaseModel

from pgwork import (
    Attempt,
    Client,
    Continue,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    create_client,
    create_in_process_worker,
)


class Sku(BaseModel):
    sku: str


class Price(BaseModel):
    sku: str
    cents: int


class Quote(BaseModel):
    customer: str
    total_cents: int = 0


class Decision(BaseModel):
    customer: str
    total_cents: int
    approved_by: str


registry = JobTypeRegistry()
fetch_price = registry.job_type("fetch_price", input=Sku, output=Price)
# A quote is useless if a price is missing: fail it when a blocker fails.
build_quote = registry.job_type(
    "build_quote",
    input=Quote,
    output=Decision,
    continue_with=["approve", "escalate"],
    blocker_failure="fail",
)
approve = registry.job_type("approve", input=Quote, output=Decision, entry=False)
escalate = registry.job_type("escalate", input=Quote, output=Decision, entry=False)

PRICES = {"widget": 1250, "gadget": 9900}


async def handle_fetch_price(attempt: Attempt[Sku, Price]) -> Price:
    return Price(sku=attempt.job.input.sku, cents=PRICES[attempt.job.input.sku])


async def handle_build_quote(attempt: Attempt[Quote, Decision]) -> Continue[Quote]:
    prices: list[Price] = await attempt.blocker_outputs()
    quote = Quote(customer=attempt.job.input.customer, total_cents=sum(p.cents for p in prices))
    # Branch at run time: big quotes need a human.
    return Continue(escalate if quote.total_cents > 10_000 else approve, quote)


async def handle_approve(attempt: Attempt[Quote, Decision]) -> Decision:
    quote = attempt.job.input
    return Decision(customer=quote.customer, total_cents=quote.total_cents, approved_by="auto")


async def handle_escalate(attempt: Attempt[Quote, Decision]) -> Decision:
    quote = attempt.job.input
    return Decision(customer=quote.customer, total_cents=quote.total_cents, approved_by="sales")


async def main(dsn: str) -> Decision:
    state = await PostgresStateAdapter.connect(dsn)
    client: Client = create_client(
        state_adapter=state, notify_adapter=PostgresNotifyAdapter(dsn), registry=registry
    )
    worker = create_in_process_worker(
        client=client,
        processors={
            fetch_price: handle_fetch_price,
            build_quote: handle_build_quote,
            approve: handle_approve,
            escalate: handle_escalate,
        },
    )
    try:
        async with worker:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                widget = await client.start_chain(conn, fetch_price, Sku(sku="widget"))
                gadget = await client.start_chain(conn, fetch_price, Sku(sku="gadget"))
                quote = await client.start_chain(
                    conn, build_quote, Quote(customer="ACME"), blockers=[widget, gadget]
                )
                await conn.commit()
            decision: Decision = await client.await_chain(quote.id, timeout=30)
            jobs = await client.list_chain_jobs(quote.id)
        print(" -> ".join(job.type_name for job in jobs), decision)
        return decision
    finally:
        await client.close()


if __name__ == "__main__":
    anyio.run(main, os.environ["PGWORK_DSN"])
