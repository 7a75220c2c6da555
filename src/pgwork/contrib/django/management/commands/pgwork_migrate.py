"""``manage.py pgwork_migrate``: create or upgrade pgwork's schema in the database of a
task backend (``pgwork migrate`` with the DSN and schema the backend uses)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from pgwork.contrib.django._compat import DEFAULT_TASK_BACKEND_ALIAS
from pgwork.contrib.django._worker import backend_named
from pgwork.postgres import migrate


class Command(BaseCommand):  # type: ignore[misc]
    help = "Create or upgrade pgwork's schema where a pgwork task backend keeps its jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            default=DEFAULT_TASK_BACKEND_ALIAS,
            help="The TASKS alias of the pgwork backend (default: %(default)s).",
        )
        parser.add_argument(
            "--revision",
            default="head",
            help="Revision to upgrade to ('head' or a revision id; never downgrades).",
        )

    def handle(self, *args: Any, backend: str, revision: str, **options: Any) -> None:
        chosen = backend_named(backend)
        change = migrate.upgrade(chosen.dsn, schema=chosen.schema, revision=revision)
        where = f"schema {chosen.schema!r} of database {chosen.database!r}"
        if change.changed:
            self.stdout.write(f"migrated {where}: {change.before or '(none)'} -> {change.after}")
        else:
            self.stdout.write(f"{where} is already at {change.after}")
