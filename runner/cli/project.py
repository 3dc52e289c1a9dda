"""Project commands: `runner init` and `runner validate`."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click

from ..errors import ConfigError

TEMPLATES = Path(__file__).parent.parent / "templates"
IGNORED = (".runner/", ".env")
"""What `init` puts in .gitignore: the state and the keys never belong in git."""


@click.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False, path_type=Path))
def init(directory: Path) -> None:
    """Write the project layout into DIRECTORY (default: here) with a working example goal and its verifier.

    Files that exist are kept. The example goal runs offline on a scripted model.

    \b
    Example:
      runner init demo && cd demo && runner goal haiku
    """
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
    click.echo(ignore_state(directory / ".gitignore"))
    click.echo(f"Run the example offline: cd {directory} && runner goal haiku")


def ignore_state(path: Path) -> str:
    """Make .gitignore list the state folder and .env; what was done, for the user."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    present = {line.strip() for line in text.splitlines()}
    missing = [entry for entry in IGNORED if entry not in present and entry.rstrip("/") not in present]
    if not missing:
        return f"kept {path} (it ignores {', '.join(IGNORED)})"
    prefix = "" if not text or text.endswith("\n") else "\n"
    with path.open("a", encoding="utf-8") as handle:
        handle.write(prefix + "".join(f"{entry}\n" for entry in missing))
    return f"{'added ' + ', '.join(missing) + ' to' if text else 'wrote'} {path}"


@click.command()
@click.pass_context
def validate(ctx: click.Context) -> None:
    """Validate runner.yaml, every goal and every schedule file; exit 2 with one `file:line: ...` line per problem.

    Nothing runs and no model is called.

    \b
    Example:
      runner validate -C ~/projects/nightly
    """
    from ..config import Catalog

    try:
        config = Catalog.load(ctx.obj)
    except ConfigError as exc:
        for problem in exc.problems:
            click.echo(problem, err=True)
        sys.exit(2)
    entries = len(config.entries)
    click.echo(f"valid: {len(config.goals)} goal(s), {entries} schedule entr{'y' if entries == 1 else 'ies'}")
    from ..work.tools.sandbox import sandbox_status

    for line in sorted({sandbox_status(goal) for goal in config.goals.values()}):
        click.echo(line)


COMMANDS = [init, validate]
