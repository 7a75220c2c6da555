"""``pgwork limits``: each limited job type's limits and what runs against them; set
or reset an override, pause and resume a type or one of its keys.

The command has no job-type registry: it knows a type's declared limits from what the
registered workers record (``Client.limits``), and checks a change against them, so a
type no worker has run is refused (except a reset or a resume, which lift what is
stored).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from pgwork._flow_control import parse_duration, parse_rate
from pgwork.cli import _limit_views as limit_views
from pgwork.cli._common import dsn_option, schema_option
from pgwork.cli._operate import group_connection, json_option, operate, show
from pgwork.errors import ConfigurationError

__all__ = ["limits"]

RESETTABLE = ("concurrency", "key-concurrency", "rate", "key-rate")


def parse_until(value: str) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ConfigurationError(
            f"--until {value!r} is not an ISO 8601 time; give one with its offset, "
            "e.g. 2030-01-31T12:00:00+00:00"
        ) from None


@click.group(invoke_without_command=True, short_help="Flow limits: use, overrides, pauses.")
@dsn_option
@schema_option
@json_option
@click.option("--keys", type=int, default=5, show_default=True, help="Keys shown per type.")
@click.option("--type", "type_name", default=None, help="Only this job type.")
@click.pass_context
def limits(
    ctx: click.Context,
    dsn: str | None,
    schema: str,
    as_json: bool,
    keys: int,
    type_name: str | None,
) -> None:
    """Without a command: per limited job type, what runs against its concurrency
    limit and what started in its rate's current window, the effective limits (an
    operator's override marked *), the jobs due and waiting, and its pause; for a
    keyed type, the keys closest to their limits and the keys paused or overridden."""
    if ctx.invoked_subcommand is not None:
        return
    found = operate(dsn, schema, lambda client: client.limits(job_type=type_name, keys=keys))
    show(
        as_json,
        limit_views.limits_json(found),
        lambda w: limit_views.limits_view(found, width=w),
    )


@limits.command("set")
@click.argument("type_name", metavar="TYPE")
@click.option("--key", default=None, help="Change this limit key's own limits.")
@click.option("--concurrency", type=int, default=None, help="At most N running of the type.")
@click.option(
    "--key-concurrency", type=int, default=None, help="At most N running per key (or of --key)."
)
@click.option("--rate", default=None, help="At most N starts per window, e.g. 10/1s.")
@click.option("--key-rate", default=None, help="The same per key (or of --key).")
@click.option(
    "--reset",
    "resets",
    multiple=True,
    type=click.Choice([*RESETTABLE, "all"]),
    help="Return a limit to the code's declaration (repeatable).",
)
@dsn_option
@schema_option
@click.pass_context
def set_limits(
    ctx: click.Context,
    type_name: str,
    key: str | None,
    concurrency: int | None,
    key_concurrency: int | None,
    rate: str | None,
    key_rate: str | None,
    resets: tuple[str, ...],
    dsn: str | None,
    schema: str,
) -> None:
    """Override TYPE's declared limits for every worker (or, with --key, that key's
    own key limits). Limits not named keep their current override."""
    dsn, schema = group_connection(ctx, dsn, schema)
    wanted = set(RESETTABLE if "all" in resets else resets)
    if key is not None:
        wanted -= {"concurrency", "rate"}
    values: dict[str, Any] = {
        "concurrency": concurrency,
        "key-concurrency": key_concurrency,
        "rate": parse_rate(rate, "--rate") if rate is not None else None,
        "key-rate": parse_rate(key_rate, "--key-rate") if key_rate is not None else None,
    }
    both = sorted(name for name in wanted if values[name] is not None)
    if both:
        raise ConfigurationError(f"--{both[0]} is both set and reset: give one of them")

    changes: dict[str, Any] = {
        name.replace("-", "_"): None if name in wanted else values[name]
        for name in RESETTABLE
        if name in wanted or values[name] is not None
    }
    operate(dsn, schema, lambda client: client.set_limits(type_name, key=key, **changes))
    what = f"key {key!r} of {type_name!r}" if key is not None else repr(type_name)
    click.echo(f"changed the limits of {what}")


@limits.command("pause")
@click.argument("type_name", metavar="TYPE")
@click.option("--key", default=None, help="Pause this limit key only.")
@click.option("--for", "duration", default=None, help="How long, e.g. 30s, 5m, 2h.")
@click.option("--until", "until", default=None, help="Until this ISO 8601 time (with offset).")
@dsn_option
@schema_option
@click.pass_context
def pause_limits(
    ctx: click.Context,
    type_name: str,
    key: str | None,
    duration: str | None,
    until: str | None,
    dsn: str | None,
    schema: str,
) -> None:
    """Start no attempt of TYPE (or of its --key) for a while; running ones go on."""
    dsn, schema = group_connection(ctx, dsn, schema)
    if (duration is None) == (until is None):
        raise click.UsageError("give exactly one of --for and --until")
    after = parse_duration(duration, "--for") if duration is not None else None
    moment = parse_until(until) if until is not None else None
    operate(
        dsn,
        schema,
        lambda client: client.pause_limits(type_name, key=key, until=moment, after=after),
    )
    what = f"key {key!r} of {type_name!r}" if key is not None else repr(type_name)
    click.echo(f"paused {what}")


@limits.command("resume")
@click.argument("type_name", metavar="TYPE")
@click.option("--key", default=None, help="Resume this limit key only.")
@dsn_option
@schema_option
@click.pass_context
def resume_limits(
    ctx: click.Context, type_name: str, key: str | None, dsn: str | None, schema: str
) -> None:
    """End a pause of TYPE (or of its --key) now, and wake the workers."""
    dsn, schema = group_connection(ctx, dsn, schema)
    operate(dsn, schema, lambda client: client.resume_limits(type_name, key=key))
    what = f"key {key!r} of {type_name!r}" if key is not None else repr(type_name)
    click.echo(f"resumed {what}")
