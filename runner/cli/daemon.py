"""Schedule commands: `runner daemon`, `runner list`, `runner trigger`, `runner pause`, `runner resume`."""

from __future__ import annotations

import json
import math
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal

import click

from ..errors import ConfigError, DaemonError
from .common import reports_errors

if TYPE_CHECKING:
    from ..config import Catalog, Entry, Project
    from ..store import Store
    from ..store.postgres import PostgresStore

MAX_PAYLOAD = 1_048_576
"""Bytes of a `runner trigger --payload` (the webhook listener's default body limit)."""


@click.command()
@click.option("-v", "--verbose", is_flag=True, help="Also log APScheduler's and the HTTP client's messages.")
@click.pass_context
@reports_errors
def daemon(ctx: click.Context, verbose: bool) -> None:
    """Run the schedule loop in the foreground until SIGTERM or SIGINT.

    \b
    Example:
      runner daemon -C ~/projects/nightly
    """
    import logging

    from ..schedule.daemon import Daemon

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if not verbose:
        for noisy in ("apscheduler", "httpx", "httpx2", "openai", "procrastinate", "watchfiles"):
            logging.getLogger(noisy).setLevel(logging.WARNING)

    async def serve() -> None:
        from ..config import load_project
        from ..ui import alongside  # the dashboard beside the daemon when runner.yaml says daemon.ui: true

        project = load_project(ctx.obj)
        if project.on_postgres:
            from ..schedule.cluster import run_daemon

            await alongside(project, run_daemon(ctx.obj))
        else:
            await alongside(project, Daemon(ctx.obj).run())

    import asyncio

    asyncio.run(serve())  # the daemon handles SIGTERM/SIGINT itself: drain, then cancel


@click.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of entries (and goals without one).")
@click.pass_context
@reports_errors
def list_goals(ctx: click.Context, as_json: bool) -> None:
    """Goals and their schedule entries: entry id (what `pause` takes), trigger, next fire, last outcome, state.

    \b
    Example:
      runner list --json
    """
    from ..config import Catalog
    from ..schedule.daemon import daemon_pid
    from ..store import open_store
    from ..store.postgres import PostgresStore

    config = Catalog.load(ctx.obj)
    store = open_store(config.project)
    if isinstance(store, PostgresStore):  # daemons anywhere, on one grid of fire times
        daemons = _connected_daemons(store)
        running = f"running ({len(daemons)}: {', '.join(daemons)})" if daemons else ""
        started: datetime | Literal["grid"] | None = "grid"
    else:
        pid = daemon_pid(config.project)
        running = f"running (pid {pid})" if pid else ""
        started = _daemon_started(config.project) if pid else None
    rows = [row for name in sorted(config.goals) for row in _goal_rows(config, store, name, started)]
    if as_json:
        click.echo(json.dumps(rows))
        return
    _print_entries(rows)
    click.echo(f"daemon: {running or 'not running; schedules fire only while `runner daemon` runs'}")


def _goal_rows(
    config: Catalog, store: Store, name: str, daemon_started: datetime | Literal["grid"] | None
) -> list[dict[str, Any]]:
    """One row per entry of the goal (one row with no entry when it has none), with the entry's last outcome."""
    from ..schedule.triggers import describe

    history = store.runs(name)
    entries = [e for e in config.entries if e.goal == name]
    if not entries:
        last = history[-1]["outcome"] if history else None
        return [_row(name, None, "-", (None, "-"), last, {}, None)]
    rows = []
    for entry in entries:
        state = store.entry(entry.id)
        last = next((r["outcome"] for r in reversed(history) if r.get("entry") == entry.id), None)
        fire = _next_fire(entry, state, daemon_started) if entry.enabled and not state.get("paused") else (None, "-")
        rows.append(_row(name, entry.id, describe(entry), fire, last, state, entry.enabled))
    return rows


def _row(
    goal: str,
    entry: str | None,
    trigger: str,
    fire: tuple[datetime | None, str],
    last: str | None,
    state: dict[str, Any],
    enabled: bool | None,
) -> dict[str, Any]:
    return {
        "goal": goal,
        "entry": entry,
        "trigger": trigger,
        "next_fire": fire[0].isoformat() if fire[0] else None,
        "next_fire_text": fire[1],
        "last_outcome": last,
        "paused": bool(state.get("paused")),
        "enabled": enabled,
    }


def _next_fire(
    entry: Entry, state: dict[str, Any], daemon_started: datetime | Literal["grid"] | None
) -> tuple[datetime | None, str]:
    """When the entry fires next, and how to say it; the same answer on every call (no `now + every`).
    `daemon_started` is "grid" on a PostgreSQL store: there `every` entries fire on a fixed grid."""
    from ..schedule.triggers import next_fire

    if entry.every is None:
        fire = next_fire(entry, state.get("last_fire"))
        return fire, _when(fire) if fire else "-"
    every = timedelta(seconds=entry.every)
    last = datetime.fromisoformat(state["last_fire"]) if state.get("last_fire") else None
    now = datetime.now(timezone.utc)
    if daemon_started == "grid":
        from ..schedule.cluster import next_on_grid

        fire = next_on_grid(entry, max(b for b in (last, now) if b is not None))
        return (fire, _when(fire)) if fire is not None else (None, "-")
    if daemon_started is not None:
        base = max(b for b in (last, daemon_started) if b is not None)
        steps = max(1, math.ceil((now - base) / every))
        fire = base + steps * every
        return fire, _when(fire)
    if last is not None and last + every > now:
        return last + every, _when(last + every)
    from ..config.values import format_duration

    return None, f"{format_duration(entry.every)} after `runner daemon` starts"


def _when(fire: datetime) -> str:
    return fire.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _daemon_started(project: Project) -> datetime | None:
    """When the running daemon started: it writes its pid into daemon.lock then."""
    try:
        stamp = (project.state / "daemon.lock").stat().st_mtime
    except OSError:
        return None
    return datetime.fromtimestamp(stamp, timezone.utc)


def _print_entries(rows: list[dict[str, Any]]) -> None:
    from rich import box
    from rich.table import Table

    from .display import table_console

    columns = ("entry", "goal", "trigger", "next fire", "last outcome", "state")
    table = Table(*columns, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for row in rows:
        state = "paused" if row["paused"] else ("disabled" if row["enabled"] is False else "")
        table.add_row(
            row["entry"] or "-", row["goal"], row["trigger"], row["next_fire_text"], row["last_outcome"] or "-", state
        )
    table.columns[0].no_wrap = True
    table_console().print(table)


@click.command()
@click.argument("name")
@click.option(
    "--payload",
    type=click.File("r", encoding="utf-8", errors="replace"),
    help="A file (or - for stdin) handed to the run as its trigger context (JSON, or text).",
)
@click.pass_context
@reports_errors
def trigger(ctx: click.Context, name: str, payload: Any) -> None:
    """Ask the running daemon to run goal NAME now (queued like any trigger).

    \b
    Example:
      runner trigger haiku
      gh api repos/o/r/issues/7 | runner trigger triage --payload -
    """
    from ..config import Catalog
    from ..schedule.daemon import daemon_pid
    from ..store import open_store
    from ..store.postgres import PostgresStore

    config = Catalog.load(ctx.obj)
    if name not in config.goals:
        raise ConfigError(f"no goal named {name!r} (goals: {', '.join(sorted(config.goals)) or 'none'})")
    store = open_store(config.project)
    text = payload.read() if payload is not None else None
    if text is not None and len(text.encode()) > MAX_PAYLOAD:
        raise ConfigError(f"--payload: {len(text.encode())} bytes is over the limit of {MAX_PAYLOAD} bytes")
    command = store.send_command("trigger", name, text)
    if isinstance(store, PostgresStore):  # its daemons may run on other machines
        daemons = _connected_daemons(store)
        who, which = ("a daemon", f" (connected: {', '.join(daemons)})") if daemons else ("", "")
    else:
        pid = daemon_pid(config.project)
        who, which = (f"the daemon (pid {pid})", "") if pid else ("", "")
    if not who:
        click.echo(f"queued {name}: no daemon is running now; it runs when `runner daemon` starts")
        return
    wait = max(5.0, 4 * config.project.settings.daemon.poll_interval)
    if not _taken(store, command, wait):
        raise DaemonError(
            f"{who} did not take the trigger of {name} within {wait:g}s{which}; it stays queued (see the daemon's log)"
        )
    click.echo(f"triggered {name}: {who} runs it as soon as the goal is free{which}")


def _connected_daemons(store: PostgresStore) -> list[str]:
    """host:pid of each daemon connected to the cluster's database now."""
    return [process["where"] for process in store.live_processes() if process["role"] == "daemon"]


def _taken(store: Store, command: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while not store.command_taken(command):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@click.command()
@click.argument("name")
@click.pass_context
@reports_errors
def pause(ctx: click.Context, name: str) -> None:
    """Stop the schedule entries of goal NAME (or one entry by id, see `runner list`) until `runner resume`.

    \b
    Example:
      runner pause example/haiku/every
    """
    set_paused(ctx, name, True)


@click.command()
@click.argument("name")
@click.pass_context
@reports_errors
def resume(ctx: click.Context, name: str) -> None:
    """Restart the schedule entries of goal NAME (or one entry by id), resetting the circuit breaker.

    \b
    Example:
      runner resume haiku
    """
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
