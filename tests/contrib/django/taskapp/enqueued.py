"""Tasks the tests enqueue but no worker of theirs runs: plain ``def`` functions, as most
Django tasks are, with the options Django's ``@task`` takes."""

from __future__ import annotations

from pgwork.contrib.django._compat import task


@task(priority=10, queue_name="emails")
def send_email(to: str, *, subject: str = "") -> str:
    return f"sent to {to}"


@task
def noop() -> None:
    return None
