"""A real `runner daemon` process for tests: start it, wait for its log lines, signal it, read the store."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from support import child_env

from runner.store import SqliteStore


class DaemonProcess:
    def __init__(self, root: Path, *args: str, **popen: Any) -> None:
        self.root = root
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "-C", str(root), "daemon", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(),
            **popen,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_log("daemon started")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def wait_log(self, text: str, timeout: float = 30, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(text in line for line in self.lines) >= count:
                return
            if self.proc.poll() is not None and not self.lines:
                break
            time.sleep(0.05)
        raise AssertionError(f"{text!r} x{count} not in the daemon's log:\n{self.log}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def store(self) -> SqliteStore:
        return SqliteStore(self.root / ".runner")

    def runs(self) -> list[dict[str, Any]]:
        return self.store().runs()

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        return self.store().events(kind)

    def wait_runs(self, count: int, outcome: str | None = None, timeout: float = 30) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = [r for r in self.runs() if outcome is None or r["outcome"] == outcome]
            if len(runs) >= count:
                return runs
            time.sleep(0.1)
        runs = json.dumps(self.runs(), indent=1)
        raise AssertionError(f"fewer than {count} {outcome or ''} runs: {runs}\n{self.log}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def monitor(proj, name: str, check: str = "true") -> None:
    """A goal whose passing checks end every run `satisfied`, with no model request."""
    proj.goal(
        name, prompt=f"keep {name} green", verify={"max_attempts": 1, "checks_first": True, "checks": [{"run": check}]}
    )


def schedule(proj, *entries: dict, file: str = "main") -> None:
    proj.write(f"schedules/{file}.yaml", list(entries))


def post(port: int, body: bytes, signature: str | None, length: int | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/hooks/triage", data=body, method="POST")
    if signature:
        request.add_header("X-Runner-Signature", signature)
    if length is not None:
        request.add_header("Content-Length", str(length))
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
