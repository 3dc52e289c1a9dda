"""`runner notify test`: a test message to every notification target the project configures."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from ..errors import ConfigError
from .common import reports_errors

if TYPE_CHECKING:
    from ..config import Catalog, NotifyTarget


@click.group()
def notify() -> None:
    """Notifications (`notify:` in runner.yaml, a goal or a schedule entry).

    \b
    Example:
      runner notify test
    """


@notify.command()
@click.pass_context
@reports_errors
def test(ctx: click.Context) -> None:
    """Send a test message to every configured target, once each; exit 1 if one cannot be reached.

    \b
    Example:
      runner notify test
    """
    from .. import notify as notifications
    from ..config import Catalog

    catalog = Catalog.load(ctx.obj)
    targets = configured_targets(catalog)
    if not targets:
        raise ConfigError(
            "no notification targets: give `notify:` (Apprise URLs or {command: ...}) in runner.yaml, "
            "a goal or a schedule entry"
        )
    failed = 0
    for target, where in targets:
        message = notifications.Message(
            "notify-test", notifications.TEST, look="runner runs", error=f"a test message from runner ({where})"
        )
        ok, detail = notifications.deliver(target, message, catalog.project.root, tries=1)
        failed += not ok
        mark = "ok  " if ok else "FAIL"
        click.echo(f"{mark} {notifications.describe(target)}  ({where}): {detail}")
    sys.exit(1 if failed else 0)


def configured_targets(catalog: Catalog) -> list[tuple[NotifyTarget, str]]:
    """Each distinct target with where it is first configured: runner.yaml, a goal, an entry."""
    from pydantic import ValidationError

    from ..config import NotifyTarget

    found: list[tuple[NotifyTarget, str]] = []
    for i, raw in enumerate(catalog.project.settings.notify):
        try:
            found.append((NotifyTarget.model_validate(raw), "runner.yaml"))
        except ValidationError as exc:
            problem = exc.errors()[0]["msg"]
            raise ConfigError(f"{catalog.project.root / 'runner.yaml'}: notify[{i}]: {problem}") from None
    for goal in catalog.goals.values():
        found += [(t, f"goal {goal.name}") for t in goal.notify]
    for entry in catalog.entries:
        found += [(t, f"entry {entry.id}") for t in entry.notify or []]
    seen: set[tuple[str | None, str | None]] = set()
    distinct = []
    for target, where in found:
        if (target.url, target.command) not in seen:
            seen.add((target.url, target.command))
            distinct.append((target, where))
    return distinct


COMMANDS = [notify]
