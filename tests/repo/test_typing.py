"""The public API is typed end to end: mypy catches misuse in users' code.

One snippet holds correct usage and the mistakes, each marked ``# E: <message part>``;
mypy must report exactly those lines, so correct usage is proven clean too. Signals are
typed by their payload: a wrong payload to ``client.signal``, or a wait for another
signal type than the step's ``waits_for``, is a type error, and so is a job type's
option of the wrong type, with or without ``waits_for``. Fan-out is typed by the
child's job type: a wrong input to ``attempt.start_chain`` (async or sync), a wrong
input to the step that waits for the children, and a field the children's output lacks
are type errors.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SNIPPET = """\
from datetime import timedelta
from pydantic import BaseModel
import psycopg
from pgwork import (
    Attempt, ChainStart, Children, Client, Continue, JobTypeRegistry, Signalled, SyncAttempt
)

class Email(BaseModel):
    to: str

class Sent(BaseModel):
    message_id: str

registry = JobTypeRegistry()
send_email = registry.job_type("send_email", input=Email, output=Sent, continue_with=["audit"])
audit = registry.job_type("audit", input=Sent, entry=False)
slow = registry.job_type("slow", input=Email, lease=60)  # E: "job_type"

async def handle(attempt: Attempt[Email, Sent]) -> Sent:
    return Sent(message_id=attempt.job.input.to)

async def handle_and_continue(attempt: Attempt[Email, Sent]) -> None:
    receipt = Sent(message_id="1")
    await attempt.complete(receipt, continue_with=Continue(audit, receipt))

async def enqueue(client: Client, conn: psycopg.AsyncConnection[object]) -> None:
    started = await client.start_chain(conn, send_email, Email(to="a@b.c"))
    print(started.id, started.deduplicated)
    await client.start_chains(conn, [ChainStart(send_email, Email(to="x@y.z"))])

async def reads_a_missing_field(attempt: Attempt[Email, Sent]) -> Sent:
    return Sent(message_id=attempt.job.input.subject)  # E: has no attribute "subject"

async def enqueues_the_wrong_model(client: Client, conn: psycopg.AsyncConnection[object]) -> None:
    await client.start_chain(conn, send_email, Sent(message_id="x"))  # E: start_chain

async def continues_with_the_wrong_model(attempt: Attempt[Email, Sent]) -> None:
    await attempt.complete(continue_with=Continue(audit, Email(to="x")))  # E: Continue

class Paid(BaseModel):
    amount: int

class Refunded(BaseModel):
    amount: int

payment = registry.signal("payment", payload=Paid)
refund = registry.signal("refund", payload=Refunded)
ship = registry.job_type("ship", input=Email, entry=False, waits_for=payment)
ship_later = registry.job_type("later", input=Email, waits_for=payment, queue=3)  # E: "job_type"

async def waits_for_payment(attempt: Attempt[Email, Sent]) -> None:
    wait = payment.named("order-1", timeout=timedelta(days=3))
    await attempt.complete(continue_with=Continue(ship, Email(to="a"), wait_for=wait))

async def reads_the_payment(attempt: Attempt[Email, None]) -> int:
    got = await attempt.received(payment)
    return got.payload.amount if isinstance(got, Signalled) else 0

async def signals(client: Client, conn: psycopg.AsyncConnection[object]) -> None:
    await client.signal(conn, payment, "order-1", Paid(amount=3))
    client.signal_sync(conn, payment, 7, Paid(amount=3))

async def signals_the_wrong_payload(client: Client, conn: psycopg.AsyncConnection[object]) -> None:
    await client.signal(conn, payment, "order-1", Refunded(amount=3))  # E: "signal"

async def waits_for_another_signal(attempt: Attempt[Email, Sent]) -> None:
    step = Continue(ship, Email(to="a"), wait_for=refund.named("order-1"))  # E: Continue
    await attempt.complete(continue_with=step)

async def reads_a_field_the_payload_lacks(attempt: Attempt[Email, None]) -> int:
    got = await attempt.received(payment)
    return got.payload.cents if isinstance(got, Signalled) else 0  # E: has no attribute "cents"

collect = registry.job_type("collect", input=Sent, output=Sent, entry=False)
fan = registry.job_type("fan", input=Email, continue_with=[collect])

async def fans_out(attempt: Attempt[Email, None]) -> Continue[Sent]:
    kids = [attempt.start_chain(send_email, Email(to=to)) for to in ("a", "b")]
    print(kids[0].id)
    return Continue(collect, Sent(message_id="x"), wait_for=Children(kids, need=1))

def fans_out_on_a_thread(attempt: SyncAttempt[Email, None]) -> Continue[Sent]:
    kid = attempt.start_chain(send_email, Email(to="a"))
    return Continue(collect, Sent(message_id="x"), wait_for=Children([kid]))

async def reads_the_childrens_outputs(attempt: Attempt[Sent, Sent]) -> Sent:
    outputs = await attempt.blocker_outputs(send_email)
    return Sent(message_id=",".join(o.message_id for o in outputs if o is not None))

async def starts_a_child_with_the_wrong_model(attempt: Attempt[Email, None]) -> None:
    attempt.start_chain(send_email, Sent(message_id="x"))  # E: "start_chain"

def starts_a_child_on_a_thread_with_the_wrong_model(attempt: SyncAttempt[Email, None]) -> None:
    attempt.start_chain(send_email, Sent(message_id="x"))  # E: "start_chain"

async def waits_with_the_wrong_step_input(attempt: Attempt[Email, None]) -> None:
    kid = attempt.start_chain(send_email, Email(to="a"))
    step = Continue(collect, Email(to="b"), wait_for=Children([kid]))  # E: Continue
    await attempt.complete(continue_with=step)

async def waits_for_children_and_a_delay(attempt: Attempt[Email, None]) -> None:
    kids, out = Children([attempt.start_chain(send_email, Email(to="a"))]), Sent(message_id="x")
    step = Continue(collect, out, after=timedelta(1), wait_for=kids)  # E: Continue
    await attempt.complete(continue_with=step)

async def reads_a_field_the_outputs_lack(attempt: Attempt[Sent, Sent]) -> list[str]:
    outputs = await attempt.blocker_outputs(send_email)
    return [o.subject for o in outputs if o is not None]  # E: has no attribute "subject"
"""


@pytest.mark.timeout(180)
def test_mypy_reports_exactly_the_marked_mistakes(tmp_path: Path) -> None:
    source = tmp_path / "snippet.py"
    source.write_text(SNIPPET)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--no-error-summary",
            str(source),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=150,
    )
    expected = {
        number: line.split("# E: ")[1]
        for number, line in enumerate(SNIPPET.splitlines(), start=1)
        if "# E: " in line
    }
    reported: dict[int, str] = {}
    for line in result.stdout.splitlines():
        match = re.match(r".*snippet\.py:(\d+): error: (.*)", line)
        if match:
            reported.setdefault(int(match[1]), "")
            reported[int(match[1])] += match[2]
    assert sorted(reported) == sorted(expected), result.stdout
    for number, fragment in expected.items():
        assert fragment in reported[number], (number, reported[number])
