"""`runner service install|status|uninstall`: the daemon of a project as a systemd unit (DESIGN 10).

The unit runs `runner -C ROOT daemon` with the `runner` of the Python environment that installed it,
restarts it on failure, stops it with SIGTERM (the daemon drains its runs) and gives it more than
`daemon.shutdown_grace` to do so. `--print` writes the unit to stdout, for a machine without systemd.
"""

from __future__ import annotations

import getpass
import hashlib
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import ConfigError, DaemonError
from .common import project_of, reports_errors

if TYPE_CHECKING:
    from ..config import Project

STOP_MARGIN = 30
"""Seconds the unit's stop timeout adds to shutdown_grace: cancelling runs, killing their processes, notifying."""

UNIT = """\
[Unit]
Description=runner daemon for {root}
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
WorkingDirectory={root}
ExecStart={exec_start}
{environment}Restart=on-failure
RestartSec=5
# SIGTERM to the daemon alone: it stops new runs and drains running ones for shutdown_grace ({grace:g}s),
# then cancels them and kills their processes itself; systemd kills what is left only after the timeout.
KillSignal=SIGTERM
KillMode=mixed
TimeoutStopSec={stop_timeout}
{user}
[Install]
WantedBy={wanted_by}
"""

user_flag = click.option("--user", "user_unit", is_flag=True, help="A unit of your user's systemd (no root needed).")


@click.group()
def service() -> None:
    """The daemon as a systemd unit: install, status, uninstall.

    \b
    Example:
      runner service install --user
    """


@service.command()
@user_flag
@click.option("--print", "print_only", is_flag=True, help="Write the unit to stdout; install nothing.")
@click.option("--env-file", is_flag=True, help="Also load ROOT/.env through systemd (runner reads it anyway).")
@click.pass_context
@reports_errors
def install(ctx: click.Context, user_unit: bool, print_only: bool, env_file: bool) -> None:
    """Write and enable a systemd unit running `runner daemon` for this project, and start it.

    \b
    Example:
      runner service install --user && loginctl enable-linger $USER
      runner service install --print > runner.service
    """
    project = project_of(ctx)
    text = unit_text(project, user_unit, env_file)
    if print_only:
        click.echo(text, nl=False)
        return
    systemctl = _systemctl(user_unit)
    path = unit_path(project, user_unit)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        hint = " (a system unit needs root; try --user)" if not user_unit else ""
        raise DaemonError(f"cannot write the unit {path}: {exc.strerror}{hint}") from None
    _run([*systemctl, "daemon-reload"])
    _run([*systemctl, "enable", "--now", path.name])
    click.echo(f"installed and started {path.name} ({path})")
    click.echo(f"  status: runner -C {project.root} service status{' --user' if user_unit else ''}")
    if user_unit:
        click.echo(f"  to keep it running after you log out: loginctl enable-linger {getpass.getuser()}")


@service.command()
@user_flag
@click.pass_context
@reports_errors
def status(ctx: click.Context, user_unit: bool) -> None:
    """Whether the unit is installed, enabled and running; exit 0 when it runs, 3 when not installed.

    \b
    Example:
      runner service status --user
    """
    path = _installed_unit(ctx, user_unit)
    systemctl = _systemctl(user_unit)
    state = {what: _query([*systemctl, what, path.name]) for what in ("is-enabled", "is-active")}
    click.echo(f"{path.name}: {state['is-active']}, {state['is-enabled']}  ({path})")
    shown = subprocess.run([*systemctl, "status", "--no-pager", "--lines=10", path.name], text=True, check=False)
    sys.exit(0 if state["is-active"] == "active" else max(shown.returncode, 1))


@service.command()
@user_flag
@click.pass_context
@reports_errors
def uninstall(ctx: click.Context, user_unit: bool) -> None:
    """Stop and disable the unit, and remove its file.

    \b
    Example:
      runner service uninstall --user
    """
    path = _installed_unit(ctx, user_unit)
    systemctl = _systemctl(user_unit)
    _run([*systemctl, "disable", "--now", path.name])
    path.unlink()
    _run([*systemctl, "daemon-reload"])
    click.echo(f"stopped, disabled and removed {path.name}")


def unit_name(project: Project) -> str:
    """`runner-NAME-HASH.service`: one unit per project folder."""
    root = str(project.root.resolve())
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", project.root.name).strip("-") or "project"
    return f"runner-{slug}-{hashlib.sha256(root.encode()).hexdigest()[:8]}.service"


def unit_path(project: Project, user_unit: bool) -> Path:
    folder = Path.home() / ".config/systemd/user" if user_unit else Path("/etc/systemd/system")
    return folder / unit_name(project)


def unit_text(project: Project, user_unit: bool, env_file: bool) -> str:
    root = project.root.resolve()
    _no_specials(root)
    grace = project.settings.daemon.shutdown_grace
    environment = "Environment=PYTHONUNBUFFERED=1\n"
    if env_file:
        environment += f"EnvironmentFile=-{root / '.env'}\n"
    return UNIT.format(
        root=root,
        exec_start=" ".join([*runner_command(), "-C", str(root), "daemon"]),
        environment=environment,
        grace=grace,
        stop_timeout=math.ceil(grace) + STOP_MARGIN,
        user="" if user_unit else f"User={getpass.getuser()}\n",
        wanted_by="default.target" if user_unit else "multi-user.target",
    )


def runner_command() -> list[str]:
    """The `runner` of this Python environment (a venv's own), else this Python with `-m runner`."""
    beside = Path(sys.executable).parent / "runner"
    if beside.is_file():
        return [str(beside.absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "runner"]


def _no_specials(root: Path) -> None:
    """systemd reads spaces, quotes, % and $ in ExecStart and WorkingDirectory specially."""
    if re.search(r"[\s\"'%$\\]", str(root)):
        raise ConfigError(f"{root}: a project path with spaces, quotes, % or $ cannot go into a systemd unit")


def _systemctl(user_unit: bool) -> list[str]:
    if shutil.which("systemctl") is None:
        raise DaemonError(
            "systemd is not available here (no systemctl); `runner service install --print` writes the unit"
        )
    systemctl = ["systemctl", "--user"] if user_unit else ["systemctl"]
    reached = subprocess.run([*systemctl, "show-environment"], capture_output=True, text=True, check=False)
    if reached.returncode != 0:
        said = " ".join(reached.stderr.split()) or f"exit code {reached.returncode}"
        raise DaemonError(f"systemd cannot be reached ({said}); `runner service install --print` writes the unit")
    return systemctl


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise DaemonError(f"{' '.join(command)} failed: {(done.stderr or done.stdout).strip()}")


def _query(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    return done.stdout.strip() or done.stderr.strip() or "unknown"


COMMANDS = [service]


def _installed_unit(ctx: click.Context, user_unit: bool) -> Path:
    """The project's unit file, or a DaemonError saying none is installed."""
    project = project_of(ctx)
    path = unit_path(project, user_unit)
    if not path.exists():
        raise DaemonError(f"no unit installed for {project.root} ({path} does not exist; runner service install)")
    return path
