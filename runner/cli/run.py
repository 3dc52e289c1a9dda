"""Run commands: `runner goal` (work + verify) and `runner check` (the checks alone)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from ..errors import ConfigError
from .common import EXIT, project_of, reports_errors, run_async

if TYPE_CHECKING:
    from ..config import Check, Goal, Project
    from ..store import Store
    from ..verify import RunResult
    from ..verify.resume import Resume


def overrides(model: str | None, max_steps: int | None, max_attempts: int | None, workdir: str | None) -> dict:
    out: dict[str, Any] = {}
    if model:
        out["model"] = {"name": model}
    if max_steps:
        out["limits"] = {"max_steps": max_steps}
    if max_attempts:
        out["verify"] = {"max_attempts": max_attempts}
    if workdir:
        out["workdir"] = workdir
    return out


@click.command()
@click.argument("name", required=False)
@click.option("-p", "--prompt", help="An inline goal: the task.")
@click.option("-c", "--check", "checks", multiple=True, help="Inline goal: a check command (repeatable).")
@click.option("-n", "attempts", type=click.IntRange(1), help="Inline goal: max attempts.")
@click.option("--model", help="Model name (overrides the goal and runner.yaml).")
@click.option("--max-steps", type=click.IntRange(1), help="Rounds of the work loop per attempt (limits.max_steps).")
@click.option("--max-attempts", type=click.IntRange(1), help="Work + check rounds (verify.max_attempts).")
@click.option("--workdir", help="Working directory, relative to the project root.")
@click.option("--checks-first", is_flag=True, default=None, help="Run the checks first; all pass -> satisfied.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the outcome line.")
@click.option("--no-wait", is_flag=True, help="At an approve check, end at once awaiting_approval (exit 4).")
@click.pass_context
@reports_errors
def goal(
    ctx: click.Context,
    name: str | None,
    prompt: str | None,
    checks: tuple[str, ...],
    attempts: int | None,
    model: str | None,
    max_steps: int | None,
    max_attempts: int | None,
    workdir: str | None,
    checks_first: bool | None,
    as_json: bool,
    quiet: bool,
    no_wait: bool,
) -> None:
    """Run one goal once (NAME or FILE, or an inline -p PROMPT): work + verify.

    Exit 0 achieved/satisfied, 1 not achieved/stuck/tampered/rejected, 2 bad input, 3 provider or
    infrastructure error, 4 awaiting approval (--no-wait), 130 interrupted.

    \b
    Example:
      runner goal -p "make the tests pass" -c "python3 -m pytest -q" -n 3
    """
    from ..config import build_goal, load_goal

    project = project_of(ctx)
    extra = overrides(model, max_steps, max_attempts or attempts, workdir)
    if prompt is not None and name is not None:
        raise ConfigError("give a goal NAME or an inline -p PROMPT, not both")
    if prompt is not None:
        data = {"prompt": prompt, "verify": {"checks": [{"name": c, "run": c} for c in checks]}}
        the_goal = build_goal(project, data, default_name="inline", source="<inline>", overrides=extra)
    elif name is not None:
        if checks or attempts:
            raise ConfigError("-c and -n go with an inline goal (-p PROMPT); use --max-attempts for a goal file")
        the_goal = load_goal(project, name, extra)
    else:
        raise ConfigError("give a goal NAME or FILE, or an inline goal with -p PROMPT (see runner goal --help)")
    result = execute(project, the_goal, checks_first, as_json, quiet, no_wait)
    sys.exit(EXIT.get(result["outcome"], 3))


NOTIFY_WAIT = 10.0
"""Seconds a command waits, after printing its result, for notifications still being delivered."""


def execute(
    project: Project,
    the_goal: Goal,
    checks_first: bool | None,
    as_json: bool,
    quiet: bool,
    no_wait: bool = False,
    resume: Resume | None = None,
) -> dict:
    import getpass

    from .. import notify
    from ..store import now, open_store
    from ..verify import StoreApprover, TerminalApprover, run_goal
    from ..work import ignore
    from .display import Display

    store = open_store(project)
    interactive = sys.stdin.isatty() and not as_json and not no_wait
    approver = NoWait(store) if no_wait else TerminalApprover() if interactive else StoreApprover(store)
    observer = ignore if (as_json or quiet) else Display()
    command = "runner continue" if resume else "runner goal"
    context = {"kind": "manual", "by": command, "user": getpass.getuser(), "fired": now()}

    async def run_then_notify() -> dict:
        result = await run_goal(
            the_goal,
            store,
            trigger="continue" if resume else "manual",
            observe=observer,
            approver=approver,
            checks_first=checks_first,
            context=context,
            pass_trigger=False,  # the person wrote the prompt; trigger.json still says who ran it
            resume=resume,
        )
        store.flush()  # what the person reads next (runner show, runner continue) is in the store
        data = show_result(result, store, as_json, quiet)
        await notify.drain(NOTIFY_WAIT)  # after the result is out: a slow receiver delays only the exit
        return data

    return run_async(run_then_notify())


class NoWait:
    """--no-wait: at the first approve check the run ends `awaiting_approval`; `runner approve` finishes it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def __call__(self, run_id: str, check: Check) -> tuple[bool, str | None]:
        import asyncio

        self.store.update_run(run_id, outcome="awaiting_approval", pending=check.name)
        raise asyncio.CancelledError  # the verify loop ends the run, keeping it awaiting_approval


ANSWER_HINT = "  waits for approval of {check}: runner approve {run_id} or runner reject {run_id} --reason ..."
"""What `runner goal` says under a run it left awaiting approval."""


def show_result(result: RunResult, store: Store, as_json: bool, quiet: bool) -> dict:
    from .display import outcome_line

    data = result.to_json()
    if result.outcome == "awaiting_approval":
        data = awaiting(store, data)
    if as_json:
        click.echo(json.dumps(data))
    else:
        click.echo(outcome_line(data))
        if not quiet:
            if data["error"]:
                click.echo(f"  {data['error']}")
            if result.outcome == "awaiting_approval":
                click.echo(ANSWER_HINT.format(check=data["checks"][-1]["name"], run_id=result.run_id))
            if result.final_message:
                click.echo(f"  final message: {result.final_message.strip()[:500]}")
            if result.continues:
                click.echo(f"  continues run {result.continues}")
            click.echo(f"  run {result.run_id} (runner show {result.run_id})")
    return data


def awaiting(store: Store, data: dict[str, Any]) -> dict[str, Any]:
    """A run left awaiting approval (--no-wait, or its process stopped waiting): the checks of its attempt that
    ran, then the approve check it waits on (`passed` null), and no error: the run goes on with runner approve."""
    run = store.run(data["run_id"])
    ran = [c for c in run["checks"] if c["attempt"] == data["attempts"]]  # attempt 0: checks_first
    checks = [{"name": c["name"], "passed": bool(c["passed"]), "exit_code": c["exit_code"]} for c in ran]
    return {**data, "checks": [*checks, {"name": run["pending"], "passed": None, "exit_code": None}], "error": None}


@click.command(name="continue")
@click.argument("run_id")
@click.option("--max-steps", type=click.IntRange(1), help="Rounds of the work loop per attempt (limits.max_steps).")
@click.option("--max-attempts", type=click.IntRange(1), help="How many more attempts (verify.max_attempts).")
@click.option("-m", "--message", "text", help="An extra instruction for the model.")
@click.option("--no-wait", is_flag=True, help="At an approve check, end at once awaiting_approval (exit 4).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the outcome line.")
@click.pass_context
@reports_errors
def continue_run(
    ctx: click.Context,
    run_id: str,
    max_steps: int | None,
    max_attempts: int | None,
    text: str | None,
    no_wait: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Pick run RUN_ID back up from its transcript with new limits, as a new run that `continues` it.

    For runs that ended not_achieved, stuck, error, cancelled, interrupted or by a forced stop. Its
    attempts are numbered after the old run's. Exit codes as `runner goal`.

    \b
    Example:
      runner continue 20250101-090000-abc123 --max-steps 40 -m "the tests are in tests/unit"
    """
    from ..config import load_goal
    from ..store import open_store
    from ..verify import settle_interrupted
    from ..verify.resume import resume_from

    project = project_of(ctx)
    store = open_store(project)
    settle_interrupted(store)
    resume = resume_from(store, run_id, text)
    if resume.goal == "inline":
        raise ConfigError(f"run {resume.run_id} ran an inline goal (runner goal -p), whose checks are not kept")
    the_goal = load_goal(project, resume.goal, overrides(None, max_steps, max_attempts, None))
    result = execute(project, the_goal, False, as_json, quiet, no_wait, resume)
    sys.exit(EXIT.get(result["outcome"], 3))


@click.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: passed, and each check's result.")
@click.pass_context
@reports_errors
def check(ctx: click.Context, name: str, as_json: bool) -> None:
    """Run goal NAME's checks alone, with no work and no model; a failing check shows its output's head and tail.

    Exit 0 when all pass, 1 when one fails.

    \b
    Example:
      runner check haiku
    """
    from ..config import load_goal
    from ..verify import TerminalApprover, run_checks_alone
    from .display import Display

    the_goal = load_goal(project_of(ctx), name)
    display = Display()
    approver = TerminalApprover() if sys.stdin.isatty() else None
    on_result = None if as_json else lambda _, r: display.check_with_output(r.record())
    results = run_async(run_checks_alone(the_goal, the_goal.verify.checks, "check", 0, approver, on_result))
    passed = all(r.passed for r in results)
    if as_json:
        click.echo(json.dumps({"goal": the_goal.name, "passed": passed, "checks": [r.record() for r in results]}))
    else:
        click.echo(f"{sum(r.passed for r in results)}/{len(results)} checks pass")
    sys.exit(0 if passed else 1)


COMMANDS = [goal, check, continue_run]
