"""Turn what ``pgwork worker MODULE:ATTR`` named into a running-ready InProcessWorker.

The options come in as values that the ``worker`` command (``_worker``) parsed (argv and
the environment are read there only); here they are matched, by name, to the parameters of
the user's factory.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import click

from pgwork.errors import ConfigurationError

__all__ = ["build_worker", "factory_arguments"]


async def build_worker(
    found: object,
    target: str,
    dsn: str | None,
    options: dict[str, Any],
    *,
    dsn_given: bool = False,
) -> Any:
    """What ``pgwork worker`` runs: ``found`` itself if it is an InProcessWorker (and no
    option would change it), else what calling it (sync or async) returns.

    ``dsn_given``: ``--dsn`` was typed on the command line (not read from the
    environment), so a target that cannot take it is an error rather than a worker
    silently connected elsewhere."""
    from pgwork.worker import InProcessWorker

    # None means "not given", except for prepare_threshold, whose None is --no-prepare.
    given = {
        name: value
        for name, value in options.items()
        if value is not None or name == "prepare_threshold"
    }
    if isinstance(found, InProcessWorker):
        if given or dsn_given:
            raise ConfigurationError(
                f"{target} is a worker built in advance, so --dsn, --slots, --queues, "
                "--poll-interval, --notify-dsn and --no-prepare cannot change it; export a "
                "function that builds it "
                "(e.g. def worker(dsn, max_slots=10): ...) to take them"
            )
        return found
    if not callable(found):
        raise ConfigurationError(
            f"{target} is a {type(found).__name__}, not an InProcessWorker or a function "
            "returning one"
        )
    kwargs = factory_arguments(found, target, dsn, given, dsn_given=dsn_given)
    built = found(**kwargs)
    if inspect.isawaitable(built):
        built = await built
    if not isinstance(built, InProcessWorker):
        raise ConfigurationError(
            f"{target} returned a {type(built).__name__}, not an InProcessWorker "
            "(build one with pgwork.create_in_process_worker)"
        )
    return built


def factory_arguments(
    factory: Callable[..., object],
    target: str,
    dsn: str | None,
    given: dict[str, Any],
    *,
    dsn_given: bool = False,
) -> dict[str, Any]:
    """Match the options given to the factory's parameters, by name; a ConfigurationError
    when the factory cannot be called with them (a parameter no option fills, or an
    option it does not take)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return {"dsn": dsn, **given} if dsn else given
    parameters = signature.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    kwargs: dict[str, Any] = {}
    if dsn_given and "dsn" not in parameters and not takes_any:
        raise ConfigurationError(
            f"--dsn was given but {target} takes no dsn= parameter, so the worker would "
            "connect wherever the function does; add a dsn parameter to the function, "
            "or drop --dsn"
        )
    if "dsn" in parameters or takes_any:
        wanted = parameters.get("dsn")
        if dsn is not None:
            kwargs["dsn"] = dsn
        elif wanted is not None and wanted.default is inspect.Parameter.empty:
            raise click.UsageError(
                f"{target} needs a database: pass --dsn, or set PGWORK_DSN or DATABASE_URL"
            )
    flags = {
        "max_slots": "--slots",
        "queues": "--queues",
        "poll_interval": "--poll-interval",
        "notify_dsn": "--notify-dsn",
        "prepare_threshold": "--no-prepare",
    }
    for name, value in given.items():
        if name not in parameters and not takes_any:
            raise ConfigurationError(
                f"{flags[name]} was given but {target} takes no {name}= parameter; "
                f"add one to the function to accept it"
            )
        kwargs[name] = value
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise ConfigurationError(
            f"{target} cannot be called with the options given ({_listed(kwargs)}): {exc}; "
            "pgwork worker passes only dsn=, max_slots=, queues=, poll_interval=, "
            "notify_dsn= and prepare_threshold=, by name: give its other parameters defaults"
        ) from None
    return kwargs


def _listed(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{name}=" for name in kwargs) or "none"
