"""Schedule commands: `runner daemon`, `runner list`, `runner trigger`, `runner pause`, `runner resume`."""

from __future__ import annotations

import json
import sys

import click

from ..errors import ConfigError
from .common import reports_errors


@click.command()
@click.option("-v", "--verbose", is_flag=True, help="Also log APScheduler's and the HTTP client's messages.")
@click.pass_context
@reports_errors
def daemon(ctx: click.Context, verbose: bool) -> None:
    """Run the schedule loop in the foreground until SIGTERM or SIGINT."""
    import logging

    from ..schedule.daemon import Daemon

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if not verbose:
        for noisy in ("apscheduler", "httpx", "httpx2", "openai", "watchfiles"):
            logging.getLogger(noisy).setLevel(logging.WARNING)

    async def serve() -> None:
        await Daemon(ctx.obj).run()

    import asyncio

    asyncio.run(serve())  # the daemon handles SIGTERM/SIGINT itself: drain, then cancel


@click.command(name="list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@reports_errors
def list_goals(ctx: click.Context, as_json: bool) -> None:
    """Goals, their schedule entries, next fire times, last outcomes and paused state."""
    from ..config import Catalog
    from ..schedule.triggers import describe, next_fire
    from ..store import open_store

    config = Catalog.load(ctx.obj)
    store = open_store(config.project)
    rows = []
    for name in sorted(config.goals):
        runs = store.runs(name, limit=1)
        entries = [e for e in config.entries if e.goal == name] or [None]
        for entry in entries:
            state = store.entry(entry.id) if entry else {}
            fire = next_fire(entry, state.get("last_fire")) if entry and entry.enabled else None
            rows.append(
                {
                    "goal": name,
                    "entry": entry.id if entry else None,
                    "trigger": describe(entry) if entry else "-",
                    "next_fire": fire.isoformat() if fire else None,
                    "last_outcome": runs[-1]["outcome"] if runs else None,
                    "paused": bool(state.get("paused")),
                    "enabled": entry.enabled if entry else None,
                }
            )
    if as_json:
        click.echo(json.dumps(rows))
        return
    from rich.table import Table

    from .display import table_console

    table = Table("goal", "trigger", "next fire", "last outcome", "state")
    for row in rows:
        state = "paused" if row["paused"] else ("disabled" if row["enabled"] is False else "")
        table.add_row(
            row["goal"],
            row["trigger"],
            (row["next_fire"] or "-")[:19].replace("T", " "),
            row["last_outcome"] or "-",
            state,
        )
    table_console().print(table)


@click.command()
@click.argument("name")
@click.pass_context
@reports_errors
def trigger(ctx: click.Context, name: str) -> None:
    """Ask the running daemon to run goal NAME now (queued like any trigger)."""
    from ..config import Catalog
    from ..schedule.daemon import daemon_pid
    from ..store import open_store

    config = Catalog.load(ctx.obj)
    if name not in config.goals:
        raise ConfigError(f"no goal named {name!r} (goals: {', '.join(sorted(config.goals)) or 'none'})")
    open_store(config.project).send_command("trigger", name)
    pid = daemon_pid(config.project)
    if pid:
        click.echo(f"triggered {name}: the daemon (pid {pid}) runs it as soon as the goal is free")
    else:
        click.echo(f"queued {name}: no daemon is running now; it runs when `runner daemon` starts")


@click.command()
@click.argument("name")
@click.pass_context
@reports_errors
def pause(ctx: click.Context, name: str) -> None:
    """Stop the schedule entries of goal NAME (or one entry by id) until `runner resume`."""
    set_paused(ctx, name, True)


@click.command()
@click.argument("name")
@click.pass_context
@reports_errors
def resume(ctx: click.Context, name: str) -> None:
    """Restart the schedule entries of goal NAME (or one entry by id), resetting the circuit breaker."""
    set_paused(ctx, name, False)


def set_paused(ctx: click.Context, name: str, paused: bool) -> None:
    from ..config import Catalog
    from ..store import open_store

    config = Catalog.load(ctx.obj)
    entries = [e for e in config.entries if name in (e.goal, e.id)]
    if not entries:
        raise ConfigError(f"no schedule entry for {name!r} (entries: {', '.join(e.id for e in config.entries)})")
    store = open_store(config.project)
    for entry in entries:
        store.update_entry(entry.id, paused=int(paused), failures=0)
        store.log_event("paused" if paused else "resumed", entry.goal, entry.id, "by the command line")
        click.echo(f"{'paused' if paused else 'resumed'} {entry.id}")


COMMANDS = [daemon, list_goals, trigger, pause, resume]
