"""Django: enqueue a job in the same transaction as your models, without an event loop.

Inside ``transaction.atomic()``, Django's ``connection.connection`` is the psycopg 3
``Connection`` it is using; ``client.start_chain_sync`` writes the job on it, so the
job commits, or rolls back, with everything else in the block (outside it, Django's
connection is in autocommit mode, and the enqueue is refused). Needs Django 4.2+ with
psycopg 3 (``pip install django``):

    PGWORK_DSN=postgresql://localhost/app python examples/django_enqueue.py

In a project, ``settings.DATABASES`` is yours already, and the client is built once at
startup, without an event loop (below: ``make_client``; docs/enqueue.md, "Without an
event loop"); a worker (``pgwork worker ...``) runs the jobs. With Django's own task
framework (``pgwork.contrib.django``), ``task.enqueue()`` writes the job so for you:
examples/django_project is a project on it.
"""

from __future__ import annotations

import contextlib
import os

import django
from django.conf import settings
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from pgwork import (
    Client,
    JobTypeRegistry,
    PostgresNotifyAdapter,
    PostgresStateAdapter,
    StartedChain,
    UnsupportedConnectionError,
    create_client,
)

DSN = os.environ.get("PGWORK_DSN", "postgresql://localhost/app")


class Welcome(BaseModel):
    email: str


registry = JobTypeRegistry()
send_welcome = registry.job_type("send_welcome", input=Welcome)


def make_client() -> Client:
    """A client for enqueueing from synchronous code: built without an event loop (the
    pool is never opened: the *_sync calls only use the caller's connection)."""
    return create_client(
        state_adapter=PostgresStateAdapter(AsyncConnectionPool(DSN, open=False)),
        notify_adapter=PostgresNotifyAdapter(DSN),
        registry=registry,
    )


def configure_django() -> None:
    params = conninfo_to_dict(DSN)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params.get("dbname", ""),
                "USER": params.get("user", ""),
                "PASSWORD": params.get("password", ""),
                "HOST": params.get("host", ""),
                "PORT": params.get("port", ""),
            }
        },
        USE_TZ=True,
    )
    django.setup()


class SignupRejected(Exception):
    pass


def signup(client: Client, email: str, *, reject: bool = False) -> StartedChain[Welcome, None]:
    """What a view does: save the user and enqueue the welcome email, atomically."""
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO signups (email) VALUES (%s)", [email])
        started = client.start_chain_sync(connection.connection, send_welcome, Welcome(email=email))
        if reject:  # anything raising here rolls back the signup *and* the job
            raise SignupRejected(email)
    return started


def job_status(job_id: object) -> str | None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT status FROM pgwork.jobs WHERE id = %s", [job_id])
        row = cur.fetchone()
    return None if row is None else str(row[0])


def main() -> None:
    configure_django()
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS signups (email text)")
    client = make_client()

    kept = signup(client, "ada@example.com")
    print(f"committed: job {kept.job_id} is {job_status(kept.job_id)}")
    with contextlib.suppress(SignupRejected):
        signup(client, "mallory@example.com", reject=True)
    # Outside atomic() Django's connection is in autocommit mode: the job would commit
    # on its own, whatever the view did next, so pgwork refuses it.
    connection.ensure_connection()
    try:
        client.start_chain_sync(connection.connection, send_welcome, Welcome(email="eve@x.org"))
    except UnsupportedConnectionError:
        print("outside atomic(): refused, the connection is in autocommit mode")
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pgwork.jobs")
        (jobs,) = cur.fetchone() or (0,)
    print(f"rolled back: {jobs} job(s) in the table")


if __name__ == "__main__":
    main()
