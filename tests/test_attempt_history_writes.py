"""Only the statements that end an attempt with an error write a job's attempt history:
the completion, claim, renewal and enqueue paths never touch it, so a job pays for its
history only when it fails."""

from __future__ import annotations

from dataclasses import fields

from pgwork.postgres._statements import Statements, render


def test_only_the_failure_and_the_reap_write_the_attempt_history() -> None:
    statements = render("pgwork")
    writers = {
        f.name for f in fields(Statements) if b"attempt_history =" in getattr(statements, f.name)
    }
    assert writers == {"fail", "reap"}
