"""Helpers for the tests: a temporary project on the scripted server, a child environment, tool calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from runner.cli import main
from runner.testing import ScriptedServer

KEY = "sk-test-secret-value-0123456789"


class Proj:
    """A temporary project whose model is the scripted server."""

    def __init__(self, root: Path, server: ScriptedServer) -> None:
        self.root = root
        self.server = server
        self.write(
            "runner.yaml",
            {
                "model": {
                    "name": "test-model",
                    "base_url": server.base_url,
                    "api_key_env": "TEST_API_KEY",
                    "max_retries": 2,
                },
                "daemon": {"poll_interval": 0.1},
            },
        )

    def write(self, rel: str, content: Any) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False))
        return path

    def goal(self, name: str, **fields: Any) -> Path:
        return self.write(f"goals/{name}.yaml", fields)

    def cli(self, *args: str, input: str | None = None) -> Any:
        """Run the CLI in this process (real loops, real HTTP to the scripted server)."""
        result = CliRunner().invoke(main, ["-C", str(self.root), *args], input=input, catch_exceptions=False)
        return result

    def cli_json(self, *args: str) -> dict:
        result = self.cli(*args, "--json")
        return {"exit_code": result.exit_code, **json.loads(result.output.strip().splitlines()[-1])}

    def subprocess(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "runner", "-C", str(self.root), *args],
            capture_output=True,
            text=True,
            env=child_env(),
            **kwargs,
        )

    def popen(self, *args: str, **kwargs: Any) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "runner", "-C", str(self.root), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            **kwargs,
        )


def child_env() -> dict[str, str]:
    return {**os.environ, "TEST_API_KEY": KEY}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def count_threads(monkeypatch: Any) -> list[str]:
    """The names of the functions sent to a thread through asyncio.to_thread from now on (the list grows)."""
    import asyncio

    sent: list[str] = []
    to_thread = asyncio.to_thread

    async def counted(function: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(function.__name__)
        return await to_thread(function, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    return sent


def python_lines(*code: str) -> list[str]:
    """What a fresh Python process running these lines prints, line by line."""
    run = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, check=True)
    return run.stdout.splitlines()


def approve_goal(proj: Any, after: str = "test -f haiku.txt") -> None:
    """Goal `ship`: an `approve` check between two command checks on haiku.txt (the third one is `after`)."""
    proj.goal(
        "ship",
        prompt="p",
        verify={
            "max_attempts": 1,
            "checks": [
                {"name": "exists", "run": "test -f haiku.txt"},
                {"name": "ship it", "approve": "Publish this poem?"},
                {"name": "after", "run": after},
            ],
        },
    )
