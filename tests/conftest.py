"""Fixtures: the scripted OpenAI-compatible server on 127.0.0.1 and a temporary runner project."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import KEY, Proj

from runner.testing import ScriptedServer


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as srv:
        yield srv


@pytest.fixture
def proj(tmp_path: Path, server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> Proj:
    monkeypatch.setenv("TEST_API_KEY", KEY)
    monkeypatch.chdir(tmp_path)
    return Proj(tmp_path, server)
