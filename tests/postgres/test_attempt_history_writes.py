"""Only the statements that end an attempt with an error write a job's attempt history:
the completion, claim, renewal and enqueue paths never touch it, so a job pays for its
history only when it fails."""

from __future__ import annotations

from pgwork.postgres.sql import render


def test_only_the_failure_and_the_reap_write_the_attempt_history() -> None:
    statements = render("pgwork").named()
    writers = {name for name, query in statements.items() if b"attempt_history =" in query}
    assert writers == {"outcomes.fail", "leases.reap"}
