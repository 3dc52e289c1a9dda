"""The command line: parses, loads the project, calls a loop, shows the result, leaves with DESIGN's exit codes.

One module per group of commands; each lists its commands in `COMMANDS`, registered here.
"""

from __future__ import annotations

from pathlib import Path

import click

from . import approval, daemon, db, history, mcp, notify, project, run, service, ui
from .common import RunnerGroup, project_root


@click.group(cls=RunnerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-C",
    "--project",
    "project_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Project folder, before or after the command (default: found upwards from here).",
)
@click.version_option(package_name="runner")
@click.pass_context
def main(ctx: click.Context, project_dir: Path | None) -> None:
    """runner: LLM agents in three loops - work (ReAct), verify (acceptance checks), schedule (daemon).

    \b
    Example:
      runner init demo && cd demo && runner goal haiku
    """
    ctx.obj = project_root(ctx, project_dir)


for _module in (run, approval, history, daemon, project, db, ui, mcp, notify, service):
    for _command in _module.COMMANDS:
        main.add_command(_command)
