"""Conformance suites for storage and notify adapters: the contract, as tests.

A store or a notify transport is a pgwork adapter only once it passes these suites
unchanged. They are plain pytest classes of async tests (marked for anyio); subclass one
in a test module named ``test_*.py`` and give it the adapter under test::

    from pgwork.testing.conformance import NotifyAdapterConformance, StateAdapterConformance

    class TestMyStateAdapter(StateAdapterConformance):
        @pytest.fixture
        async def state_adapter(self, my_fresh_store):
            adapter = await MyStateAdapter.connect(my_fresh_store)
            yield adapter
            await adapter.close()

    class TestMyNotifyAdapter(NotifyAdapterConformance):
        delivers_on_commit_only = True

        @pytest.fixture
        async def notify_adapter(self):
            adapter = MyNotifyAdapter(...)
            yield adapter
            await adapter.close()

The tests speak only the protocols. Time passes for real: leases of a fraction of a
second are left to run out on the store's clock, waited for in bounded polls.

A case that needs a capability of the contract beyond its core (``BatchedTurns``,
``AtomicAttempts``... in ``pgwork.adapters.state``) is marked ``@requires(...)``, and
skipped, saying which, for a store that does not offer it.
"""

import pytest

# Before the test modules are imported, so their asserts explain themselves.
pytest.register_assert_rewrite(
    *(
        f"pgwork.testing.conformance.{name}"
        for name in (
            "_harness",
            "_notify",
            "_rollback",
            "_state_acquire",
            "_state_atomic_group",
            "_state_blockers",
            "_state_complete",
            "_state_control",
            "_state_debounce",
            "_state_dedup",
            "_state_deletion",
            "_state_enqueue",
            "_state_fan_out",
            "_state_history",
            "_state_insight",
            "_state_lease",
            "_state_lending",
            "_state_limit_control",
            "_state_queries",
            "_state_reap",
            "_state_registry",
            "_state_signals",
            "_state_work",
        )
    )
)

from pgwork.testing.conformance._harness import (  # noqa: E402
    LockWaiters,
    StateHarness,
    StateSuiteBase,
    requires,
)
from pgwork.testing.conformance._notify import (  # noqa: E402
    NotifyAdapterConformance,
    TransactionFactory,
)
from pgwork.testing.conformance._state import StateAdapterConformance  # noqa: E402

__all__ = [
    "LockWaiters",
    "NotifyAdapterConformance",
    "StateAdapterConformance",
    "StateHarness",
    "StateSuiteBase",
    "TransactionFactory",
    "requires",
]
