"""History commands: `runner runs` and `runner show`."""

from __future__ import annotations

import json

import click

from .common import project_of, reports_errors


@click.command()
@click.option("--goal", "goal_name", help="Only this goal's runs.")
@click.option("--limit", type=click.IntRange(1), help="Only the last N runs.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@reports_errors
def runs(ctx: click.Context, goal_name: str | None, limit: int | None, as_json: bool) -> None:
    """The history of runs, oldest first."""
    from rich.table import Table

    from ..store import RUN_FIELDS, open_store
    from .display import table_console

    store = open_store(project_of(ctx))
    store.mark_interrupted()
    rows = store.runs(goal_name, limit)
    if as_json:
        click.echo(json.dumps([{k: row[k] for k in RUN_FIELDS} for row in rows]))
        return
    table = Table("run", "goal", "trigger", "outcome", "attempts", "steps", "tokens", "started")
    for row in rows:
        table.add_row(
            row["run_id"],
            row["goal"],
            row["trigger"],
            row["outcome"],
            str(row["attempts"]),
            str(row["steps"]),
            str(row["tokens"]),
            row["started"][:19].replace("T", " "),
        )
    table_console().print(table)


@click.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@reports_errors
def show(ctx: click.Context, run_id: str, as_json: bool) -> None:
    """One run: its outcome, checks, usage and transcript."""
    from ..store import open_store

    store = open_store(project_of(ctx))
    store.mark_interrupted()
    run = store.run(run_id)
    events = store.transcript_events(run["id"])
    if as_json:
        click.echo(json.dumps({**run, "transcript": events}, default=str))
        return
    click.echo(f"run {run['id']}  goal {run['goal']}  trigger {run['trigger']}  outcome {run['outcome']}")
    click.echo(
        f"attempts {run['attempts']}  steps {run['steps']}  tokens {run['tokens']}  "
        f"started {run['started']}  ended {run['ended'] or '-'}"
    )
    if run["error"]:
        click.echo(f"error: {run['error']}")
    for event in events:
        line = _transcript_line(event)
        if line:
            click.echo(line)
    click.echo(f"transcript: {store.transcript_location(run['id'])}")


def _transcript_line(event: dict) -> str | None:
    kind = event["kind"]
    if kind == "message":
        message = event["message"]
        if message["role"] == "assistant":
            calls = ", ".join(c["function"]["name"] for c in message.get("tool_calls") or [])
            text = (message.get("content") or "").strip()[:200]
            return f"  assistant: {text}" + (f" [calls {calls}]" if calls else "")
        if message["role"] == "tool":
            return f"  tool: {message['content'][:200]!r}"
        return f"  {message['role']}: {message['content'][:200]!r}"
    if kind == "check":
        return f"  check {event['name']}: {'pass' if event['passed'] else 'fail'} ({event['check_kind']})"
    if kind in ("attempt", "outcome"):
        return f"{kind}: {event.get('attempt') or event.get('outcome')}"
    return None


COMMANDS = [runs, show]
