"""Cluster commands (a PostgreSQL store): `runner db migrate`, `runner db status`, `runner worker`."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from ..errors import ConfigError
from .common import project_of, reports_errors

if TYPE_CHECKING:
    from ..store.postgres import PostgresStore


def postgres_store(ctx: click.Context, check_schema: bool = True) -> PostgresStore:
    from ..store import open_postgres

    project = project_of(ctx, lazy=True)
    if not project.on_postgres:
        raise ConfigError(
            f"{project.root / 'runner.yaml'}: store: expected a postgresql:// URL for this command"
            f" (the store is {project.store!r}, an SQLite folder)"
        )
    return open_postgres(project, check_schema=check_schema)


@click.group()
def db() -> None:
    """The PostgreSQL store's schema (runner's and Procrastinate's).

    \b
    Example:
      runner db migrate
    """


@db.command()
@click.pass_context
@reports_errors
def migrate(ctx: click.Context) -> None:
    """Apply what the database lacks of runner's and Procrastinate's schema (safe to run again).

    \b
    Example:
      runner db migrate -C ~/projects/nightly
    """
    from ..schedule.jobs import migrate as apply

    store = postgres_store(ctx, check_schema=False)
    done = _run(apply(store))
    click.echo("\n".join(f"applied {what}" for what in done) or f"{store.where} is up to date")


@db.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
@reports_errors
def status(ctx: click.Context, as_json: bool) -> None:
    """Workers alive (each daemon and worker by host:pid), and runs queued and running per goal.

    \b
    Example:
      runner db status --json
    """
    from ..schedule.jobs import status as read

    report = _run(read(postgres_store(ctx)))
    if as_json:
        click.echo(json.dumps(report))
        return
    alive = [w for w in report["workers"] if w["alive"]]
    click.echo(f"database {report['database']}  schema version {report['schema_version']}")
    silent = len(report["workers"]) - len(alive)
    click.echo(f"workers alive: {len(alive)}" + (f" ({silent} silent, pruned when a worker starts)" if silent else ""))
    for process in report["processes"]:
        click.echo(f"  {process['role']} {process['where']}")
    if report["commands_waiting"]:
        click.echo(f"commands waiting for a daemon: {report['commands_waiting']}")
    for name, counts in sorted(report["goals"].items()):
        click.echo(f"  {name}: {counts['running']} running, {counts['queued']} queued")
    if not report["goals"]:
        click.echo("no run queued or running")


@click.command()
@click.option(
    "--concurrency", type=click.IntRange(1), help="Runs at once in this worker (default: daemon.max_concurrent_runs)."
)
@click.pass_context
@reports_errors
def worker(ctx: click.Context, concurrency: int | None) -> None:
    """Work the queued runs of a PostgreSQL store until SIGTERM or SIGINT (schedules nothing).

    \b
    Example:
      runner worker --concurrency 8
    """
    import asyncio
    import logging

    from ..schedule.cluster import run_worker

    postgres_store(ctx).close()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    for noisy in ("httpx", "httpx2", "openai", "procrastinate"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    asyncio.run(run_worker(ctx.obj, concurrency))


def _run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


COMMANDS = [db, worker]
