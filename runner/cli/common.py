"""What every command shares: turning errors into exit codes, running a coroutine, finding the project.

`RunnerGroup` is the main group's class: it accepts `-C DIR` after the subcommand too, and
`project_root` refuses, before any state is written, to run a command outside a runner project.
"""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from ..errors import ConfigError, RunnerError

if TYPE_CHECKING:
    from ..config import Project

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
    "awaiting_approval": 4,  # --no-wait (DESIGN 7): the run waits for runner approve / reject
}


def fail(message: str, code: int) -> NoReturn:
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


def project_of(ctx: click.Context, lazy: bool = False) -> Project:
    """The command's project; `lazy` leaves runner.yaml's models unbuilt until used (a history command
    reads only `store`, without pydantic)."""
    from ..config.project import load_project

    return load_project(ctx.obj, lazy=lazy)


NO_PROJECT_NEEDED = ("init",)
"""Commands that run outside a project; every other one refuses there, and never creates .runner/."""
_PROJECT_FLAGS = ("-C", "--project")
_WANTS_HELP = "runner.wants_help"


class RunnerGroup(click.Group):
    """The main group: `-C DIR` may also follow the subcommand (`runner goal haiku -C DIR`)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = hoist_project_flag(args)
        ctx.meta[_WANTS_HELP] = any(a in ("-h", "--help") for a in args)
        return super().parse_args(ctx, args)


def hoist_project_flag(args: list[str]) -> list[str]:
    """Move a `-C DIR` / `--project DIR` / `--project=DIR` found after the subcommand in front of it."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in _PROJECT_FLAGS else 1
    front, rest = args[: i + 1], args[i + 1 :]
    moved: list[str] = []
    kept: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--":
            kept += rest[i:]
            break
        if arg in _PROJECT_FLAGS and i + 1 < len(rest):
            moved += rest[i : i + 2]
            i += 2
            continue
        if arg.startswith("--project=") or (arg.startswith("-C") and len(arg) > 2):
            moved.append(arg)
        else:
            kept.append(arg)
        i += 1
    return [*moved, *front, *kept]


def project_root(ctx: click.Context, project_dir: Path | None) -> Path | None:
    """The project the subcommand runs against: -C DIR, else the nearest project upwards from here.

    Outside a project every command but `init` (and `--help`) is refused with exit 2.
    """
    from ..config.project import PROJECT_MARKERS

    if project_dir is not None and not project_dir.is_dir():
        fail(f"-C {project_dir}: no such folder", 2)
    if ctx.invoked_subcommand in NO_PROJECT_NEEDED or ctx.meta.get(_WANTS_HELP):
        return project_dir
    start = (project_dir or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if any((folder / marker).exists() for marker in PROJECT_MARKERS):
            return folder
    fail(
        f"not a runner project: run `runner init` or pass -C DIR "
        f"(no runner.yaml, goals/ or schedules/ in {start} or above)",
        2,
    )
