"""The daemon's event sources: file changes for watch entries, and the webhook listener."""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import hmac
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .unattended import webhook_context

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger("runner.daemon")
IGNORED_PARTS = {".runner", ".git", "__pycache__", "node_modules", ".venv"}
MAX_HEADER = 16_384


def start_listeners(daemon: Daemon, running: dict[str, asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    """The file watcher and the webhook listener that the entries need and that are not running yet (at
    start, and after a reload that adds the first watch or webhook entry); `running` keeps them by name.
    Without a watch entry nothing watches the project: a busy daemon's own writes cost nothing."""
    wanted = {
        "watch": (watch_files, any(e.watch for e in daemon.catalog.entries)),
        "webhook": (serve_webhooks, any(e.webhook for e in daemon.catalog.entries)),
    }
    started = []
    for name, (listen, needed) in wanted.items():
        if needed and (name not in running or running[name].done()):
            running[name] = asyncio.create_task(listen(daemon))
            started.append(running[name])
    return started


def glob_match(rel: str, pattern: str) -> bool:
    """fnmatch, where `**/` also matches no folder at all (`docs/**/*.md` matches `docs/a.md`)."""
    return fnmatch.fnmatchcase(rel, pattern) or (
        "**/" in pattern and fnmatch.fnmatchcase(rel, pattern.replace("**/", ""))
    )


async def watch_files(daemon: Daemon) -> None:
    """One watcher over the project; a watch entry fires once, `debounce` after the first matching change."""
    from watchfiles import awatch

    root = daemon.catalog.project.root
    windows: dict[str, asyncio.Task[Any]] = {}
    changed: dict[str, set[str]] = {}
    """The paths changed within each entry's debounce window: the run's trigger context."""

    def relevant(_change: Any, path: str) -> bool:
        return not IGNORED_PARTS.intersection(Path(path).parts)

    async for changes in awatch(root, watch_filter=relevant, debounce=200, step=20, stop_event=daemon.stopping):
        rels = {Path(path).resolve().relative_to(root).as_posix() for _, path in changes}
        for entry in daemon.catalog.entries:
            if not entry.watch or not entry.enabled:
                continue
            hits = sorted(rel for rel in rels if any(glob_match(rel, p) for p in entry.watch))
            if not hits:
                continue
            if entry.id in windows and not windows[entry.id].done():
                changed[entry.id].update(hits)
                continue  # already waiting out this debounce window
            slot = daemon.slots.get(entry.goal)
            if slot is not None and slot.task is not None and not slot.task.done():
                daemon.record(
                    "skip", entry, f"{hits[0]} changed while the goal ran (its own writes do not retrigger it)"
                )
                continue
            changed[entry.id] = set(hits)
            windows[entry.id] = asyncio.create_task(_after_debounce(daemon, entry, changed[entry.id]))


async def _after_debounce(daemon: Daemon, entry: Any, paths: set[str]) -> None:
    await asyncio.sleep(entry.debounce)
    daemon.fire(entry, "watch", context={"paths": sorted(paths)})


async def serve_webhooks(daemon: Daemon) -> None:
    settings = daemon.settings.webhook
    slots = asyncio.Semaphore(settings.max_connections)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if slots.locked():  # over the bound: closed at once, so connections never take the runs' descriptors
            writer.transport.abort()
            return
        async with slots:
            await _handle(daemon, reader, writer)

    server = await asyncio.start_server(handle, settings.host, settings.port, limit=MAX_HEADER)
    port = server.sockets[0].getsockname()[1]
    (daemon.catalog.project.state / "webhook.port").write_text(str(port))
    log.info("webhooks listen on http://%s:%d/hooks/NAME", settings.host, port)
    async with server:
        await server.serve_forever()


async def _handle(daemon: Daemon, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request within `request_timeout` from its first byte to its last; a slow one is closed quietly."""
    try:
        status, message = await asyncio.wait_for(_respond(daemon, reader), daemon.settings.webhook.request_timeout)
    except (asyncio.TimeoutError, TimeoutError):
        writer.transport.abort()
        return
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError, UnicodeError):
        status, message = 400, "bad request"
    body = json.dumps({"status": status, "message": message}).encode()
    writer.write(
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
        % (status, message.encode()[:40], len(body), body)
    )
    try:
        await asyncio.wait_for(writer.drain(), daemon.settings.webhook.request_timeout)
    except (asyncio.TimeoutError, TimeoutError, ConnectionError):
        writer.transport.abort()
        return
    writer.close()


async def _respond(daemon: Daemon, reader: asyncio.StreamReader) -> tuple[int, str]:
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > MAX_HEADER:
        return 431, "headers too large"
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    name = path.split("?")[0].removeprefix("/hooks/")
    entry = next((e for e in daemon.catalog.entries if e.webhook == name and path.startswith("/hooks/")), None)
    if method != "POST":
        return 405, "method not allowed"
    if entry is None:
        return 404, "no such hook"
    length = int(headers.get("content-length", "-1"))
    if length < 0:
        return 411, "length required"
    if length > daemon.settings.webhook.max_body:
        daemon.record("rejected", entry, f"webhook body of {length} bytes is over the limit")
        return 413, "body too large"
    body = await reader.readexactly(length)
    secret = (entry.secret or daemon.settings.webhook.secret or "").encode()
    expected = "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()
    given = headers.get("x-runner-signature") or headers.get("x-hub-signature-256") or ""
    if not secret or not hmac.compare_digest(expected, given):
        daemon.record("rejected", entry, "webhook with a bad signature")
        return 401, "bad signature"
    daemon.fire(entry, "webhook", context=webhook_context(body, headers))
    return 202, "accepted"
