"""Fixtures: the scripted OpenAI-compatible server on 127.0.0.1 and a temporary runner project."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import DaemonProcess
from support import KEY, Proj

from runner.config import project
from runner.testing import ScriptedServer


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as srv:
        yield srv


@pytest.fixture
def proj(tmp_path: Path, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> Proj:
    monkeypatch.setenv("TEST_API_KEY", KEY)
    monkeypatch.setattr(project, "_DOTENV_NAMES", set())  # what another test's .env listed is not this one's
    monkeypatch.chdir(tmp_path)
    return Proj(tmp_path, server)


@pytest.fixture
def daemons() -> Iterator[Callable[..., DaemonProcess]]:
    """Starts real `runner daemon` processes; kills whatever is left at the end of the test."""
    started: list[DaemonProcess] = []

    def start(proj: Proj, *args: str, **popen: Any) -> DaemonProcess:
        daemon = DaemonProcess(proj.root, *args, **popen)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.kill()
