"""The CLI's tests run ``pgwork`` in-process through click's runner, with none of the
environment that would point it elsewhere (a DSN, a schema, a terminal width)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for name in ("PGWORK_DSN", "DATABASE_URL", "PGWORK_SCHEMA", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    return CliRunner()
