"""What every command shares: turning errors into exit codes, running a coroutine, finding the project."""

from __future__ import annotations

import functools
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

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
    "awaiting_approval": 130,
}


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
    from ..config import load_project

    return load_project(ctx.obj)


