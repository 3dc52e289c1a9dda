"""`runner ui`: the dashboard in the foreground (DESIGN section 11)."""

from __future__ import annotations

import click

from .common import project_of, reports_errors, run_async


@click.command()
@click.option("--host", default=None, help="Address to listen on (default daemon.ui.host, else 127.0.0.1).")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Port (default daemon.ui.port, else 8788).")
@click.pass_context
@reports_errors
def ui(ctx: click.Context, host: str | None, port: int | None) -> None:
    """Serve the dashboard: goals, runs, live transcripts, approvals, charts. Any address but loopback needs
    daemon.ui.token in runner.yaml.

    \b
    Example:
      runner ui --port 8800
    """
    import asyncio

    from ..ui import serve

    def ready(url: str) -> None:
        click.echo(f"dashboard on {url}  (Ctrl+C stops it)", err=True)

    try:
        run_async(serve(project_of(ctx), host, port, ready))
    except asyncio.CancelledError:
        pass


COMMANDS = [ui]
