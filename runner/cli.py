"""The command line: parses, loads the project, calls a loop, shows the result, leaves with DESIGN's exit codes."""

from __future__ import annotations

import functools
import json
import shutil
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .errors import ConfigError, RunnerError

if TYPE_CHECKING:
    from .config import Goal, Project

T = TypeVar("T")
EXIT = {
    "achieved": 0,
    "satisfied": 0,
    "not_achieved": 1,
    "tampered": 1,
    "rejected": 1,
    "stuck": 1,
    "error": 3,
    "cancelled": 130,
    "interrupted": 130,
    "awaiting_approval": 130,
}
TEMPLATES = Path(__file__).parent / "templates"


def fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def reports_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a RunnerError into its message and exit code; no traceback for anything the user can fix."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except ConfigError as exc:
            for problem in exc.problems:
                click.echo(problem, err=True)
            sys.exit(exc.exit_code)
        except RunnerError as exc:
            fail(str(exc), exc.exit_code)

    return wrapper


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine; SIGINT and SIGTERM cancel it, so it can record `cancelled` and kill its processes."""

    import asyncio

    async def main() -> T:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await task

    return asyncio.run(main())


def project_of(ctx: click.Context) -> Project:
    from .config import load_project

    return load_project(ctx.obj)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-C",
    "--project",
    "project_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Project folder (default: found upwards from here).",
)
@click.version_option(package_name="runner")
@click.pass_context
def main(ctx: click.Context, project_dir: Path | None) -> None:
    """runner: LLM agents in three loops - work (ReAct), verify (acceptance checks), schedule (daemon)."""
    ctx.obj = project_dir


@main.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False, path_type=Path))
def init(directory: Path) -> None:
    """Write the project layout with a working example goal and its verifier."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sorted(TEMPLATES.rglob("*")):
        target = directory / source.relative_to(TEMPLATES)
        if source.is_dir() or "__pycache__" in source.parts:
            continue
        if target.exists():
            click.echo(f"kept {target} (exists)")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        written.append(target)
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(f"Run the example offline: cd {directory} && runner goal haiku")


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


@main.command()
@click.argument("name", required=False)
@click.option("-p", "--prompt", help="An inline goal: the task.")
@click.option("-c", "--check", "checks", multiple=True, help="Inline goal: a check command (repeatable).")
@click.option("-n", "attempts", type=click.IntRange(1), help="Inline goal: max attempts.")
@click.option("--model", help="Model name (overrides the goal and runner.yaml).")
@click.option("--max-steps", type=click.IntRange(1))
@click.option("--max-attempts", type=click.IntRange(1))
@click.option("--workdir", help="Working directory, relative to the project root.")
@click.option("--checks-first", is_flag=True, default=None, help="Run the checks first; all pass -> satisfied.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the outcome line.")
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
) -> None:
    """Run one goal once (NAME or FILE, or an inline -p PROMPT): work + verify."""
    from .config import build_goal, load_goal

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
    result = execute(project, the_goal, checks_first, as_json, quiet)
    sys.exit(EXIT.get(result["outcome"], 3))


def execute(project: Project, the_goal: Goal, checks_first: bool | None, as_json: bool, quiet: bool) -> dict:
    from .checks import StoreApprover, TerminalApprover
    from .display import Display, outcome_line
    from .store import Store
    from .verify import run_goal
    from .work import ignore

    store = Store(project.state)
    interactive = sys.stdin.isatty() and not as_json
    approver = TerminalApprover() if interactive else StoreApprover(store)
    observer = ignore if (as_json or quiet) else Display()
    result = run_async(run_goal(the_goal, store, observe=observer, approver=approver, checks_first=checks_first))
    data = result.to_json()
    if as_json:
        click.echo(json.dumps(data))
    else:
        click.echo(outcome_line(data))
        if not quiet:
            if result.error:
                click.echo(f"  {result.error}")
            if result.final_message:
                click.echo(f"  final message: {result.final_message.strip()[:500]}")
            click.echo(f"  run {result.run_id} (runner show {result.run_id})")
    return data


@main.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@reports_errors
def check(ctx: click.Context, name: str, as_json: bool) -> None:
    """Run a goal's checks alone, with no work; exit 0 when all pass."""
    from .checks import TerminalApprover, run_checks_alone
    from .config import load_goal
    from .display import Display

    the_goal = load_goal(project_of(ctx), name)
    display = Display()
    approver = TerminalApprover() if sys.stdin.isatty() else None
    on_result = None if as_json else lambda _, r: display("check", r.record())
    results = run_async(run_checks_alone(the_goal, the_goal.verify.checks, "check", 0, approver, on_result))
    passed = all(r.passed for r in results)
    if as_json:
        click.echo(json.dumps({"goal": the_goal.name, "passed": passed, "checks": [r.record() for r in results]}))
    else:
        click.echo(f"{sum(r.passed for r in results)}/{len(results)} checks pass")
    sys.exit(0 if passed else 1)


@main.command()
@click.pass_context
def validate(ctx: click.Context) -> None:
    """Validate runner.yaml, every goal and every schedule file."""
    from .triggers import Config

    try:
        config = Config.load(ctx.obj)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(problem, err=True)
        sys.exit(2)
    entries = len(config.entries)
    click.echo(f"valid: {len(config.goals)} goal(s), {entries} schedule entr{'y' if entries == 1 else 'ies'}")


@main.command()
@click.argument("run_id")
@click.pass_context
@reports_errors
def approve(ctx: click.Context, run_id: str) -> None:
    """Approve the `approve` check a run is waiting on."""
    answer_run(project_of(ctx), run_id, "approve", None)


@main.command()
@click.argument("run_id")
@click.option("--reason", default=None, help="Why; shown in the run's history.")
@click.pass_context
@reports_errors
def reject(ctx: click.Context, run_id: str, reason: str | None) -> None:
    """Reject the `approve` check a run is waiting on."""
    answer_run(project_of(ctx), run_id, "reject", reason)


def answer_run(project: Project, run_id: str, decision: str, reason: str | None) -> None:
    from .approval import answer

    click.echo(run_async(answer(project, run_id, decision, reason)))


from . import cli_daemon, cli_history  # noqa: E402, F401  (they add their commands to `main`)
