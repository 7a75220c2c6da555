"""Fan-out: a step that waits for child chains its handler started (docs/chains.md).

A handler starts children with ``attempt.start_chain(job_type, input)``: each is
recorded on the attempt (its id made at once) and written with the attempt's
completion, in the same transaction, or not at all. ``Continue(step, input,
wait_for=Children(children, need=None))`` hands the chain on to ``step``, which waits
``blocked`` until every child completed (``need=None``) or until ``need`` of them did;
the step's type's ``blocker_failure`` says what a failed or cancelled child does.

``Children`` only holds the children's ids and the count: which chains the attempt
started is checked when the outcome is built (``ChildNotStartedHereError``).
``ChildOptions`` are the options a child takes, the same for an async handler's
``Attempt`` and a sync handler's ``SyncAttempt``, which hands them on as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypedDict
from uuid import UUID

from pgwork.errors import InvalidOptionError

__all__ = ["ChainHandle", "ChildOptions", "Children"]


class ChainHandle(Protocol):
    """What ``Children`` takes: a started chain (``StartedChain``), by its ``id``."""

    @property
    def id(self) -> UUID: ...


class ChildOptions(TypedDict, total=False):
    """The options of ``attempt.start_chain(job_type, input, **options)``, each checked
    as ``client.start_chain`` checks it; one left out (or None) takes the job type's
    own (``queue``, ``priority``, ``max_attempts``) or the parent job's (``context``,
    ``limit_key``)."""

    queue: str | None
    priority: int | None
    max_attempts: int | None
    context: Mapping[str, str] | None
    limit_key: str | None


class Children:
    """What ``Continue(..., wait_for=...)`` takes to wait for child chains: the chains
    ``attempt.start_chain`` returned in this attempt, and ``need``, how many of them
    must complete before the step starts (None: all; ``need=1``: the first). A chain
    given twice is waited for once. Checked here, where it is built: at least one
    chain, and ``need`` from 1 to the number of chains (``InvalidOptionError``)."""

    __slots__ = ("chain_ids", "need")

    chain_ids: tuple[UUID, ...]
    need: int | None

    def __init__(self, chains: Sequence[ChainHandle], *, need: int | None = None) -> None:
        if isinstance(chains, str | bytes) or not isinstance(chains, Sequence):
            raise InvalidOptionError(
                "chains", chains, "a sequence of the chains attempt.start_chain returned"
            )
        ids: list[UUID] = []
        for chain in chains:
            chain_id = getattr(chain, "id", None)
            if not isinstance(chain_id, UUID):
                raise InvalidOptionError(
                    "chains", chain, "chains attempt.start_chain returned (StartedChain)"
                )
            ids.append(chain_id)
        self.chain_ids = tuple(dict.fromkeys(ids))
        if not self.chain_ids:
            raise InvalidOptionError(
                "chains",
                list(chains),
                "at least one chain started by this attempt (a step waiting for no child "
                "would never start: hand on without wait_for instead)",
            )
        if need is not None and (
            isinstance(need, bool)
            or not isinstance(need, int)
            or not 1 <= need <= len(self.chain_ids)
        ):
            raise InvalidOptionError(
                "need",
                need,
                f"None (all) or an integer from 1 to the number of chains ({len(self.chain_ids)})",
                "Children",
            )
        self.need = need

    def __repr__(self) -> str:
        need = "all" if self.need is None else self.need
        return f"Children({len(self.chain_ids)} chains, need={need})"
