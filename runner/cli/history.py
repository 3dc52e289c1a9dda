"""History commands: `runner runs` (the newest runs, ids never cut) and `runner show` (one run, attempt by attempt)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from ..vocabulary import Event
from .common import project_of, reports_errors

if TYPE_CHECKING:
    from ..config import Project

DEFAULT_LIMIT = 20
SHORT = 200
"""Characters of a message `show` prints without --full."""
OUTPUT_LINES = 4
"""Lines of a failed check's output `show` prints at each end without --full."""
SHOW_EXTRA = ("cost", "continues", "attempt_rows")
"""What `show --json` adds from the store when it has it: the run's cost, the run it continues, per-attempt usage."""
OLD_CHECK_KINDS = ("run", "judge", "approve")
"""Transcripts written before the fix kept a check's own kind in `kind`; `show` still reads them."""


@click.command()
@click.option("--goal", "goal_name", metavar="GOAL", help="Only this goal's runs (an unknown goal is an error).")
@click.option(
    "--limit", type=click.IntRange(1), default=DEFAULT_LIMIT, show_default=True, help="Show the newest N runs."
)
@click.option("--all", "show_all", is_flag=True, help="Show every run, however many.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of runs, newest first.")
@click.pass_context
@reports_errors
def runs(ctx: click.Context, goal_name: str | None, limit: int, show_all: bool, as_json: bool) -> None:
    """The history of runs, newest first; run ids are printed whole (copy one into `runner show`).

    \b
    Example:
      runner runs --goal haiku --limit 5
    """
    from ..store import RUN_FIELDS, open_store
    from ..verify import settle_interrupted

    project = project_of(ctx, lazy=True)
    store = open_store(project)
    settle_interrupted(store)
    rows = list(reversed(store.runs(goal_name, None if show_all else limit)))
    if goal_name and not rows:
        _known_goal(project, goal_name)
    if as_json:
        listed = [
            {**{k: row[k] for k in RUN_FIELDS}, "cost_usd": row.get("cost"), "continues": row.get("continues")}
            for row in rows
        ]
        click.echo(json.dumps(listed))
        return
    if not rows:
        click.echo("no runs yet (start one with `runner goal NAME`)")
        return
    _print_runs(rows)
    total = len(rows) if show_all else store.count_runs(goal_name)
    if total > len(rows):
        click.echo(f"{len(rows)} of {total} runs shown (newest first); --limit N or --all for more")


def _known_goal(project: Project, name: str) -> None:
    """Raise ConfigError (exit 2, listing the goals) when `name` is no goal of the project."""
    from ..config import goal_path

    if name != "inline":
        goal_path(project, name)


def _print_runs(rows: list[dict[str, Any]]) -> None:
    """A table whose run ids are never cut: at a narrow terminal the least useful columns go first."""
    from rich import box
    from rich.table import Table

    from .display import table_console

    console = table_console()
    columns = {
        "run": [r["run_id"] for r in rows],
        "goal": [r["goal"] for r in rows],
        "outcome": [r["outcome"] for r in rows],
        "started": [r["started"][:19].replace("T", " ") for r in rows],
        "tokens": [str(r["tokens"]) for r in rows],
        "cost": [money(r.get("cost")) for r in rows],
        "attempts": [str(r["attempts"]) for r in rows],
        "steps": [str(r["steps"]) for r in rows],
        "trigger": [r["trigger"] for r in rows],
    }
    order = list(columns)
    for dropped in ("trigger", "cost", "steps", "attempts", "tokens", "started"):
        if _width(columns, order) <= console.width:
            break
        order.remove(dropped)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in order:
        widest = max([len(name), *(len(v) for v in columns[name])])
        keep = name in ("run", "outcome")
        table.add_column(name, no_wrap=True, min_width=widest if keep else None, overflow="ellipsis")
    for i in range(len(rows)):
        table.add_row(*(columns[name][i] for name in order))
    console.print(table)


def _width(columns: dict[str, list[str]], order: list[str]) -> int:
    return sum(max([len(name), *(len(v) for v in columns[name])]) + 3 for name in order)


@click.command()
@click.argument("run_id")
@click.option("--full", is_flag=True, help="Print whole messages, tool outputs and check outputs.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (the shape of `runner goal --json`).")
@click.pass_context
@reports_errors
def show(ctx: click.Context, run_id: str, full: bool, as_json: bool) -> None:
    """One run (RUN_ID or a unique prefix of it): each attempt's steps and checks, usage and transcript.

    \b
    Example:
      runner show 20261129-233331-0cd5e6 --full
    """
    from ..store import open_store
    from ..verify import settle_interrupted

    store = open_store(project_of(ctx, lazy=True))
    settle_interrupted(store)
    run = store.run(run_id)
    events = [normalized(e) for e in store.transcript_events(run["id"])]
    if as_json:
        click.echo(json.dumps(run_json(run, events), default=str))
        return
    for line in header(run):
        click.echo(line)
    for line in transcript_lines(events, full):
        click.echo(line)
    if not any(e["kind"] == Event.CHECK for e in events):  # a transcript lost or cut short: the store's checks
        for check in run["checks"]:
            click.echo("\n".join(check_lines({**check, "check_kind": check.get("kind")}, full)))
    click.echo(f"transcript: {store.transcript_location(run['id'])}")


def normalized(event: dict[str, Any]) -> dict[str, Any]:
    """An event as written today: a check event from an old transcript (kind run/judge/approve) becomes one."""
    if event.get("kind") in OLD_CHECK_KINDS and "passed" in event and "run_id" not in event:
        return {**event, "kind": Event.CHECK, "check_kind": event["kind"]}
    return event


def run_json(run: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """`runner goal --json`'s fields (one id field, `passed` a boolean), then the history's own."""
    return {
        "run_id": run["id"],
        "goal": run["goal"],
        "outcome": run["outcome"],
        "attempts": run["attempts"],
        "steps": run["steps"],
        "tokens": run["tokens"],
        "stop_reason": run.get("stop_reason"),
        "duration_s": _duration(run),
        "checks": [
            {
                "name": c["name"],
                "passed": bool(c["passed"]),
                "exit_code": c["exit_code"],
                "attempt": c["attempt"],
                "kind": c.get("kind"),
                "reason": c.get("reason"),
            }
            for c in run["checks"]
        ],
        "final_message": run.get("final_message"),
        "error": run.get("error"),
        "cost_usd": run.get("cost"),
        "continues": run.get("continues"),
        "trigger": run["trigger"],
        "started": run["started"],
        "ended": run["ended"],
        **{key: run[key] for key in SHOW_EXTRA if key in run},
        "transcript": events,
    }


def _duration(run: dict[str, Any]) -> float | None:
    from datetime import datetime

    if not run.get("ended"):
        return None
    try:
        seconds = (datetime.fromisoformat(run["ended"]) - datetime.fromisoformat(run["started"])).total_seconds()
    except (TypeError, ValueError):
        return None
    return round(seconds, 3)


def header(run: dict[str, Any]) -> list[str]:
    lines = [
        f"run {run['id']}  goal {run['goal']}  trigger {run['trigger']}  outcome {run['outcome']}",
        f"attempts {run['attempts']}  steps {run['steps']}  tokens {run['tokens']}  "
        f"started {run['started'][:19].replace('T', ' ')}  ended {(run['ended'] or '-')[:19].replace('T', ' ')}",
    ]
    if run.get("cost") is not None:
        lines[1] += f"  cost {money(run['cost'])}"
    if run.get("continues"):
        lines.append(f"continues run {run['continues']}")
    if run.get("error"):
        lines.append(f"error: {run['error']}")
    return lines


def money(cost: float | None) -> str:
    """US dollars as `runs` and `show` print them; `-` when the model's price is unknown."""
    return "-" if cost is None else f"${cost:.4f}" if cost < 1 else f"${cost:.2f}"


def transcript_lines(events: list[dict[str, Any]], full: bool) -> list[str]:
    """The transcript as a person reads it; the feedback messages only with --full (the failed checks say it)."""
    feedback = {e.get("text") for e in events if e.get("kind") == Event.FEEDBACK}
    lines: list[str] = []
    for event in events:
        message = event.get("message") or {}
        if event.get("kind") == Event.MESSAGE and message.get("role") == "user" and message.get("content") in feedback:
            continue
        lines += event_lines(event, full)
    return lines


def event_lines(event: dict[str, Any], full: bool) -> list[str]:
    """How `show` prints one transcript event (nothing for the events a reader does not need)."""
    kind = event.get("kind")
    if kind == Event.MESSAGE:
        return message_lines(event.get("message") or {}, full)
    if kind == Event.ATTEMPT:
        return [f"attempt {event.get('attempt')}/{event.get('of')}"]
    if kind == Event.TOOL_RESULT:
        return tool_lines(event, full)
    if kind == Event.STOPPED:
        reason = event.get("reason")
        extra = f": {event['error']}" if event.get("error") else ""
        return [] if reason == "completed" else [f"  stopped: {reason}{extra}"]
    if kind == Event.CHECK:
        return check_lines(event, full)
    if kind == Event.FEEDBACK and full:
        return ["  feedback sent back to the model:", *_indented(event.get("text") or "", "    ")]
    if kind == Event.BEFORE_RETRY:
        return [f"  before retry: {event.get('command')}  exit {event.get('exit_code')}"]
    if kind == Event.OUTCOME:
        return [f"outcome {event.get('outcome')}" + (f": {event['error']}" if event.get("error") else "")]
    if kind == Event.TRIGGER:
        context = event.get("context") or {}
        shown = json.dumps(context, ensure_ascii=False, default=str)
        return [f"triggered by {context.get('kind')}: {shown if full else shown[:SHORT]}"]
    if kind == Event.PRICE_UNKNOWN:
        return [f"cost: tokens only ({event.get('reason')})"]
    return []


def message_lines(message: dict[str, Any], full: bool) -> list[str]:
    role = message.get("role")
    text = str(message.get("content") or "").strip()
    if role == "tool" or (role == "system" and not full) or not text:
        return []
    if full:
        return [f"  {role}:", *_indented(text, "    ")]
    short = text.replace("\n", " ")
    return [f"  {role}: {short[:SHORT]}" + ("..." if len(short) > SHORT else "")]


def tool_lines(event: dict[str, Any], full: bool) -> list[str]:
    """`step 2  shell: pytest -q  -> exit 1  0.4s`, and with --full the whole output."""
    output = str(event.get("output") or "")
    first = output.split("\n", 1)[0][:80]
    summary = event.get("summary") or event.get("name")
    duration = event.get("duration_s")
    line = f"  step {event.get('step')}  {summary}  -> {first or 'ok'}"
    line += f"  {float(duration):.1f}s" if duration is not None else ""
    return [line, *_indented(output, "      ")] if full and "\n" in output.strip() else [line]


def check_lines(check: dict[str, Any], full: bool) -> list[str]:
    """`✗ fail  three lines  exit 1`, its reason, and the head and tail of a failing check's output."""
    if check.get("skipped"):
        return [f"  - {check.get('name')}  not asked: {check.get('reason') or 'an earlier check failed'}"]
    passed = bool(check.get("passed"))
    parts = ["  " + ("✓ pass" if passed else "✗ fail"), str(check.get("name"))]
    if check.get("exit_code") is not None:
        parts.append(f"exit {check['exit_code']}")
    if check.get("reason"):
        parts.append(f"reason: {check['reason']}")
    lines = ["  ".join(parts)]
    from .display import head_and_tail

    output = str(check.get("output") or "").rstrip()
    if output and (full or not passed):
        lines += _indented(output if full else head_and_tail(output, OUTPUT_LINES), "      ")
    return lines


def _indented(text: str, prefix: str) -> list[str]:
    return [prefix + line for line in text.rstrip().splitlines()]


COMMANDS = [runs, show]
