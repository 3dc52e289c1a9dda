"""The dashboard (DESIGN section 11): goals, runs, a run's transcript live, approvals, charts.

    await serve(project)                     # runner ui: until cancelled
    await alongside(project, daemon.run())   # runner daemon, with the dashboard beside it if daemon.ui: true
    app = create_app(project, token=None)    # the ASGI app itself

Starlette serves it (small, ASGI, on the event loop the daemon already runs), uvicorn listens, Jinja2
renders the pages on the server; the `ui` extra brings all three.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import ConfigError, DaemonError
from .security import check_bind

if TYPE_CHECKING:
    from ..config import Project

__all__ = ["alongside", "check_bind", "create_app", "serve", "settings_of"]
T = TypeVar("T")
log = logging.getLogger("runner.ui")


def settings_of(project: Project) -> tuple[str, int, str | None]:
    """`daemon.ui` of runner.yaml: host, port, token."""
    ui = project.settings.daemon.ui
    return ui.host, ui.port, ui.token


def create_app(project: Project, token: str | None = None, host: str = "127.0.0.1") -> Any:
    require_extra()
    from .app import create_app as build

    return build(project, token, host)


def require_extra() -> None:
    for module in ("starlette", "uvicorn", "jinja2", "multipart"):
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"the dashboard needs {module}: pip install 'runner[ui]'")


async def alongside(project: Project, work: Awaitable[T]) -> T:
    """Await `work` (the daemon) with the dashboard served beside it when runner.yaml says `daemon.ui: true`.

    A bad address or a missing extra stops the start; a dashboard that fails later is logged and the work
    goes on; the dashboard stops when the work ends.
    """
    ui = project.settings.daemon.ui
    if not ui.enabled:
        return await work
    try:
        check_bind(ui.host, ui.token)
        require_extra()
    except ConfigError:
        if inspect.iscoroutine(work):
            work.close()
        raise
    task = asyncio.create_task(serve(project))
    task.add_done_callback(_report)
    try:
        return await work
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the dashboard stopped: %s", task.exception())


async def serve(
    project: Project,
    host: str | None = None,
    port: int | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the dashboard until cancelled; then stop listening and close the connections within a second.

    host and port default to daemon.ui's. It leaves signals to the process that runs it (the daemon, the CLI).
    """
    ui_host, ui_port, token = settings_of(project)
    host, port = host or ui_host, ui_port if port is None else port
    check_bind(host, token)
    app = create_app(project, token, host)
    import uvicorn

    class Server(uvicorn.Server):
        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # SIGINT/SIGTERM belong to the process that serves the dashboard

    with _listen(host, port) as sock:
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1, access_log=False)
        server = Server(config)
        bound = sock.getsockname()
        url = f"http://{f'[{host}]' if ':' in host else host}:{bound[1]}/"
        log.info("dashboard on %s", url)
        if ready is not None:
            ready(url)
        task = asyncio.ensure_future(server.serve(sockets=[sock]))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            server.should_exit = True
            await task
            raise


@contextmanager
def _listen(host: str, port: int) -> Iterator[socket.socket]:
    """Bind here, so that a taken port is a one-line error rather than uvicorn leaving the process."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        raise DaemonError(f"the dashboard cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        yield sock
    finally:
        sock.close()
