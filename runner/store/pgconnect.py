"""Connecting to PostgreSQL: psycopg loaded when first needed (the `postgres` extra), the session's options, an
async connection that does not wake ten times a second, a connection the server let go found without a round
trip, URLs without their passwords, and the name each daemon and worker gives its connections."""

from __future__ import annotations

import functools
import os
import re
import select
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from ..errors import StoreError

INSTALL_HINT = "pip install 'runner[postgres]'"
HOST = socket.gethostname()


def process_name(role: str) -> str:
    """The `application_name` of a daemon's or worker's connections: who is connected reads from the server's
    own session list (`live_processes`), with no heartbeat to write and nothing to clean up after a crash."""
    return f"{PROCESS_PREFIX}{role} {HOST}:{os.getpid()}"[:63]  # the server keeps 63 bytes


PROCESS_PREFIX = "runner "


def session(url: str) -> dict[str, Any]:
    """Connection options: commits do not wait for the WAL to reach the disk (like SQLite's synchronous=NORMAL,
    a crash of the database server can lose its last fraction of a second; a crash of runner loses nothing)."""
    from psycopg.conninfo import conninfo_to_dict

    given = str(conninfo_to_dict(url).get("options") or "")
    return {"options": f"{given} -c synchronous_commit=off".strip()}


WAKE = 5.0
"""Seconds an async connection waits for the server before looking again (psycopg's default is 0.1 s)."""


@functools.cache
def quiet_connection() -> type:
    """psycopg's async connection, except that its waits (above all the LISTEN that every cluster process keeps
    open) do not wake every 0.1 s to look for a Ctrl-C: under asyncio a signal or a cancellation reaches the
    waiting task without that, and an idle cluster process spent a third of its CPU on those wake-ups. A
    reply, a notification or a timeout still ends the wait at once."""
    psycopg = psycopg_module()

    class QuietConnection(psycopg.AsyncConnection):  # type: ignore[misc, name-defined]
        async def wait(self, gen: Any, interval: float = WAKE, **kwargs: Any) -> Any:
            return await super().wait(gen, interval, **kwargs)

    return QuietConnection


def dropped(connection: Any) -> bool:
    """Whether the server let an idle connection go (a restart, pg_terminate_backend): its socket holds the
    goodbye or the end while nothing was asked. One look at the socket, no round trip."""
    if connection.closed:
        return True
    try:
        readable, _, _ = select.select([connection.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg_module().Error):
        return True
    return bool(readable)


def reconnected(connection: Any, connect: Callable[[], Any]) -> Any:
    """`connection`, or a new one from `connect` when the server let it go (see `dropped`)."""
    if not dropped(connection):
        return connection
    connection.close()
    return connect()


def redact(url: str) -> str:
    """The URL without its passwords (in the user part, or a parameter whose name, decoded, ends in `password`:
    `password`, `sslpassword`, `%70assword`), for messages."""
    start, netloc, rest = re.match(r"([^:]*://)?([^/?#]*)(.*)", url, re.DOTALL).groups()  # type: ignore[union-attr]
    userinfo, at, host = netloc.rpartition("@")  # a password may hold an @ of its own
    if at and ":" in userinfo:
        netloc = f"{userinfo.partition(':')[0]}:***@{host}"
    url = f"{start or ''}{netloc}{rest}"

    def masked(match: re.Match[str]) -> str:
        secret = unquote(match.group(2)).lower().endswith("password")
        return f"{match.group(1)}{match.group(2)}={'***' if secret else match.group(3)}"

    return re.sub(r"([?&])([^=&#]*)=([^&#]*)", masked, url)


def psycopg_module() -> Any:
    try:
        import psycopg
    except ImportError:
        raise StoreError(f"a postgresql:// store needs psycopg: {INSTALL_HINT}") from None
    return psycopg


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
