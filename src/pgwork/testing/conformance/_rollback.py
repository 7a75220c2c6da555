"""Rolling a transaction back from inside, the way a failing caller would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TypeVar

__all__ = ["rolled_back"]

T = TypeVar("T")


class _Rollback(Exception):
    """Raised at the end of the block so the transaction manager rolls back."""


@asynccontextmanager
async def rolled_back(transaction: AbstractAsyncContextManager[T]) -> AsyncIterator[T]:
    """Enter ``transaction``, run the block, then leave it by an exception: the
    transaction rolls back. An exception from the block itself still propagates."""
    try:
        async with transaction as tx:
            yield tx
            raise _Rollback
    except _Rollback:
        pass
