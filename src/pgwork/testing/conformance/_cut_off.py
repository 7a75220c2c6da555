"""A chain's end cut off before it settled its dependants, as when its process dies
between the two: what ``sweep_blocked`` repairs. Shared by the blocker and fan-out
suites, each of which ends a chain others wait on that way."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

import anyio

from pgwork.adapters.state import Completion
from pgwork.records import ChainStatus
from pgwork.testing.conformance._harness import StateHarness, StateSuiteBase
from pgwork.testing.conformance._rollback import rolled_back

__all__ = ["CutOffEnds"]


class CutOffEnds(StateSuiteBase):
    async def _end_cut_off(
        self, store: StateHarness, chain_id: uuid.UUID, *, held: Sequence[uuid.UUID]
    ) -> bool:
        """Complete ``chain_id`` (a chain's pending first job) from outside any worker
        while another transaction holds the ``held`` chains (deleting them, then
        changing its mind), and cut the completion off once the chain's end is visible
        (or after ``blocking_grace``): an adapter that ends a chain, then settles its
        dependants, stops between the two. Returns whether the chain ended (an adapter
        that does both at once ends it, or not, with its dependants)."""
        adapter = store.adapter
        with anyio.fail_after(self.test_timeout):
            async with rolled_back(adapter.transaction()) as busy:
                deletion = await adapter.delete_chains(busy, chain_ids=held, cascade=False)
                assert deletion.deleted_chains == len(held)
                async with anyio.create_task_group() as tg:
                    completing = anyio.CancelScope()

                    async def complete() -> None:
                        with completing:
                            await adapter.complete(
                                None, completions=[Completion(chain_id, None, '"done"')]
                            )

                    tg.start_soon(complete)
                    await self._until_chain_ended(store, chain_id)
                    completing.cancel()
        return (await store.chain(chain_id)).status is ChainStatus.COMPLETED

    async def _until_chain_ended(self, store: StateHarness, chain_id: uuid.UUID) -> None:
        """Wait (at most ``blocking_grace``) for the chain's end to be visible."""
        deadline = time.monotonic() + self.blocking_grace
        while time.monotonic() < deadline:
            if (await store.chain(chain_id)).status is not ChainStatus.ACTIVE:
                return
            await anyio.sleep(self.poll / 5)
