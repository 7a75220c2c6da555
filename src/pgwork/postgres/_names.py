"""The schema's names and facts that running pgwork needs, without SQLAlchemy.

``schema.py`` (SQLAlchemy Core) and ``migrate.py`` (Alembic) describe and provision
the schema; the engine only needs the names below. Keeping them here means importing
pgwork to enqueue or to run a worker loads neither library, nor their imports' time
and memory (``python -X importtime -c "import pgwork"`` shows what is left).
"""

from __future__ import annotations

import re

from pgwork.errors import InvalidSchemaNameError

__all__ = [
    "CHAIN_STATUSES",
    "DEFAULT_SCHEMA",
    "HEAD_REVISION",
    "JOB_STATUSES",
    "LEGACY_VERSION_TABLE",
    "VERSION_TABLE",
    "validate_schema_name",
]

DEFAULT_SCHEMA = "pgwork"
# pgwork's Alembic version table, in pgwork's schema. Its own name, never Alembic's
# default: with ``--schema public`` the application's ``public.alembic_version`` lives
# next to it, and the two histories must not share a table.
VERSION_TABLE = "pgwork_alembic_version"
# Where pgwork up to 0.1 kept its revision; ``env.py`` moves it to VERSION_TABLE.
LEGACY_VERSION_TABLE = "alembic_version"

# The newest migration this pgwork ships; a test holds it to Alembic's head, so adding
# a migration without updating it fails the suite.
HEAD_REVISION = "0018"

JOB_STATUSES = ("blocked", "pending", "running", "completed", "failed", "cancelled")
CHAIN_STATUSES = ("active", "completed", "failed", "cancelled")

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")


def validate_schema_name(schema: str) -> str:
    """Return ``schema`` if it is a safe, unquoted-style PostgreSQL identifier.

    Schema names are still always quoted when composed into SQL; the check keeps names
    predictable (no case folding surprises, no channel-name overflow).
    """
    if not isinstance(schema, str) or not _SCHEMA_NAME.match(schema) or schema.startswith("pg_"):
        raise InvalidSchemaNameError(str(schema))
    return schema
