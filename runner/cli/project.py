"""Project commands: `runner init` and `runner validate`."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click

from ..errors import ConfigError

TEMPLATES = Path(__file__).parent.parent / "templates"


@click.command()
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


@click.command()
@click.pass_context
def validate(ctx: click.Context) -> None:
    """Validate runner.yaml, every goal and every schedule file."""
    from ..config import Catalog

    try:
        config = Catalog.load(ctx.obj)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(problem, err=True)
        sys.exit(2)
    entries = len(config.entries)
    click.echo(f"valid: {len(config.goals)} goal(s), {entries} schedule entr{'y' if entries == 1 else 'ies'}")


COMMANDS = [init, validate]
