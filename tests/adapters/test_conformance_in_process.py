"""The shipped notify suite against the in-process adapter, publishing inside real
PostgreSQL transactions it cannot see (so it claims no commit-only delivery)."""

from __future__ import annotations

import pytest
from tests.adapters._notify_suite import InCallersTransactions

from pgwork import InProcessNotifyAdapter

pytestmark = pytest.mark.anyio


class TestInProcessNotifyAdapter(InCallersTransactions):
    delivers_on_commit_only = False
    folds_identical_notices = False

    def new_adapter(self) -> InProcessNotifyAdapter:
        return InProcessNotifyAdapter()
