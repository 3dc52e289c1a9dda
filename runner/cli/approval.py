"""Approval commands: `runner approve` and `runner reject` answer a run waiting on an `approve` check."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .common import project_of, reports_errors, run_async

if TYPE_CHECKING:
    from ..config import Project


@click.command()
@click.argument("run_id")
@click.pass_context
@reports_errors
def approve(ctx: click.Context, run_id: str) -> None:
    """Approve the `approve` check run RUN_ID is waiting on.

    \b
    Example:
      runner approve 20261129-233331-0cd5e6
    """
    answer_run(project_of(ctx), run_id, "approve", "approved with runner approve")


@click.command()
@click.argument("run_id")
@click.option("--reason", default=None, help="Why; shown in the run's history.")
@click.pass_context
@reports_errors
def reject(ctx: click.Context, run_id: str, reason: str | None) -> None:
    """Reject the `approve` check run RUN_ID is waiting on.

    \b
    Example:
      runner reject 20261129-233331-0cd5e6 --reason "too sad"
    """
    answer_run(project_of(ctx), run_id, "reject", reason or "rejected with runner reject")


def answer_run(project: Project, run_id: str, decision: str, reason: str) -> None:
    """Answer, saying who decided when the person gave no reason (the run's history shows it)."""
    from ..verify import answer

    click.echo(run_async(answer(project, run_id, decision, reason)))


COMMANDS = [approve, reject]
