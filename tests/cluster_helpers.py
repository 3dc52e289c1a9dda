"""A real PostgreSQL server for the cluster tests: find it (or skip, or fail under CI), give each test its own
database, and run `runner daemon` / `runner worker` processes against it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml
from daemon_helpers import DaemonProcess
from support import child_env

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432"


def server_url() -> str:
    """The server the tests use: RUNNER_TEST_DATABASE_URL, else 127.0.0.1:5432; skip (fail under CI) without one."""
    url = os.environ.get("RUNNER_TEST_DATABASE_URL") or DEFAULT_URL
    try:
        import procrastinate  # noqa: F401
        import psycopg

        psycopg.connect(url, connect_timeout=5).close()
    except Exception as exc:  # no driver, or no server listening
        reason = f"no PostgreSQL server for the cluster tests at {url} ({type(exc).__name__}: {exc})"
        if os.environ.get("CI") == "true":
            pytest.fail(reason + "; under CI=true a server is required")
        pytest.skip(reason)
    return url


@contextmanager
def fresh_database(server: str) -> Iterator[str]:
    """A new empty database on the server, dropped afterwards; its URL."""
    import psycopg

    name = f"runner_test_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def use_store(proj: Any, url: str, **daemon: Any) -> None:
    """Point the project's runner.yaml at the database (and set daemon settings)."""
    path = proj.root / "runner.yaml"
    settings = yaml.safe_load(path.read_text())
    settings["store"] = url
    settings["daemon"] = {**settings.get("daemon", {}), **daemon}
    proj.write("runner.yaml", settings)


class ClusterProcess(DaemonProcess):
    """`runner daemon` or `runner worker` on a PostgreSQL store; reads the shared store back."""

    def __init__(self, root: Path, url: str, command: str = "daemon", *args: str) -> None:
        from runner.store.postgres import PostgresStore

        self.root = root
        self.lines: list[str] = []
        self.shared = PostgresStore(url)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "-C", str(root), command, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_log(f"{command} started", timeout=120)  # a loaded CI machine imports slowly

    def store(self) -> Any:
        return self.shared

    def wait_for(self, what: str, check: Any, timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"{what} did not happen within {timeout}s:\n{self.log}")
