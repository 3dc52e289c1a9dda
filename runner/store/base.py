"""The store interface: where runs, attempts, checks, events, approvals, commands and transcripts live.

Two implementations: `SqliteStore` (the embedded default, `.runner/runs.db`) and a PostgreSQL store for
more than one machine. The loops, the daemon, the CLI and the dashboard use only the methods here.
"""

from __future__ import annotations

import os
import secrets
import time
from abc import ABC, abstractmethod
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

RUN_FIELDS = ("run_id", "goal", "trigger", "outcome", "started", "ended", "attempts", "steps", "tokens")
"""The fields of a run that `runner runs --json` prints."""


class TranscriptWriter(Protocol):
    """Appends a run's messages and events as they happen; nothing already appended is lost."""

    def append(self, kind: str, data: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class Store(ABC):
    """Every read and write of runner's state. Each write is visible to other processes within milliseconds
    (at once in SQLite; the PostgreSQL store writes in the background), and at once after `flush`."""

    # runs
    @abstractmethod
    def new_run(self, goal: str, trigger: str = "manual", entry_id: str | None = None) -> str:
        """A new run, `running`, owned by this process; its id."""

    @abstractmethod
    def update_run(self, run_id: str, **fields: Any) -> None: ...

    def finish_run(self, run_id: str, outcome: str, **fields: Any) -> None:
        self.update_run(run_id, outcome=outcome, ended=now(), **fields)

    @abstractmethod
    def run(self, run_id: str) -> dict[str, Any]:
        """One run by id or unique id prefix, with `attempt_rows` and `checks`; UnknownRun otherwise."""

    @abstractmethod
    def runs(self, goal: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Runs oldest first (the newest `limit` of them)."""

    def run_alive(self, run: dict[str, Any]) -> bool:
        """Whether the process running `run` is alive (a cluster store asks about the machine it runs on)."""
        return pid_alive(run.get("pid"))

    @abstractmethod
    def mark_interrupted(self) -> list[str]:
        """Runs left `running` by a process that is gone become `interrupted`; their processes are killed."""

    # the dashboard's reads: these defaults filter runs(); a store with many runs overrides them with indexed queries
    def find_runs(
        self,
        goal: str | None = None,
        outcome: str | None = None,
        since: str | None = None,
        until: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """Runs newest first: of a goal, with an outcome, started at or after `since` and before `until` (ISO)."""
        rows = [r for r in reversed(self.runs(goal)) if _matches(r, outcome, since, until)]
        return rows[offset : offset + limit]

    def count_runs(
        self, goal: str | None = None, outcome: str | None = None, since: str | None = None, until: str | None = None
    ) -> int:
        """How many runs find_runs would page through."""
        return sum(1 for r in self.runs(goal) if _matches(r, outcome, since, until))

    def daily_totals(self, goal: str | None, since: str) -> list[dict[str, Any]]:
        """Per goal, UTC day of `started` (YYYY-MM-DD) and outcome, from the day `since` on: runs, tokens, cost
        (None where no run of the group has a cost)."""
        groups: dict[tuple[str, str, str], dict[str, Any]] = {}
        for r in self.runs(goal):
            if r["started"] >= since:
                key = (r["goal"], r["started"][:10], r["outcome"])
                row = groups.setdefault(
                    key, {"goal": key[0], "day": key[1], "outcome": key[2], "runs": 0, "tokens": 0, "cost": None}
                )
                row["runs"] += 1
                row["tokens"] += r["tokens"] or 0
                if r.get("cost") is not None:
                    row["cost"] = (row["cost"] or 0.0) + r["cost"]
        return list(groups.values())

    # transcripts
    @abstractmethod
    def transcript(self, run_id: str) -> TranscriptWriter: ...

    @abstractmethod
    def transcript_events(self, run_id: str) -> list[dict[str, Any]]:
        """Every event of a run's transcript, in order; a torn last line is skipped."""

    @abstractmethod
    def transcript_location(self, run_id: str) -> str:
        """Where a person finds the raw transcript (a file path, or a command)."""

    # process groups of a run (shell, command tools, checks)
    @abstractmethod
    def track_process(self, run_id: str, pid: int, alive: bool) -> None: ...

    @abstractmethod
    def kill_processes(self, run_id: str) -> None:
        """Kill the process groups a dead run left behind."""

    # attempts and checks
    @abstractmethod
    def record_attempt(self, run_id: str, number: int, **fields: Any) -> None: ...

    @abstractmethod
    def record_check(self, run_id: str, attempt: int, position: int, **fields: Any) -> None: ...

    # approvals
    @abstractmethod
    def answer(self, run_id: str, decision: str, reason: str | None = None) -> None:
        """A person's answer to the `approve` check a run waits on."""

    @abstractmethod
    def take_answer(self, run_id: str) -> tuple[str, str | None] | None: ...

    @abstractmethod
    def take_over(self, run_id: str) -> bool:
        """A run awaiting approval whose process is gone becomes this process's (`running`, this pid) while it
        finishes it: False when another process (a second answer at the same moment) took it first."""

    # commands for the daemon
    @abstractmethod
    def send_command(self, kind: str, target: str, payload: str | None = None) -> int:
        """A command for the daemon; `payload` (JSON text) is a trigger's context (runner trigger --payload).
        Returns the command's id."""

    @abstractmethod
    def command_taken(self, command_id: int) -> bool:
        """Whether a daemon has taken the command."""

    @abstractmethod
    def take_commands(self) -> list[tuple[str, str, str | None]]:
        """The commands not taken yet, oldest first: (kind, target, payload)."""

    # schedule entries and the daemon's events
    @abstractmethod
    def entry(self, entry_id: str) -> dict[str, Any]:
        """What the store remembers of an entry: last_fire, paused, failures."""

    @abstractmethod
    def update_entry(self, entry_id: str, **fields: Any) -> None: ...

    def count_failure(self, entry_id: str) -> int:
        """One more run in a row of the entry not achieved: the count now (the circuit breaker's)."""
        failures = int(self.entry(entry_id)["failures"] or 0) + 1
        self.update_entry(entry_id, failures=failures)
        return failures

    def reset_failures(self, entry_id: str) -> None:
        """A run of the entry achieved its goal: no failures in a row."""
        self.update_entry(entry_id, failures=0)

    @abstractmethod
    def log_event(self, kind: str, goal: str | None = None, entry_id: str | None = None, detail: str = "") -> None: ...

    @abstractmethod
    def events(self, kind: str | None = None) -> list[dict[str, Any]]: ...

    @abstractmethod
    def close(self) -> None: ...

    def flush(self) -> None:
        """Wait until every write so far is visible to other processes (a store that writes in the background
        sends within milliseconds; a command that prints a run's result flushes first)."""
        return None

    def problem(self) -> str | None:
        """Why the store can no longer be trusted (deleted, replaced), or None while it is sound."""
        return None


def _matches(run: dict[str, Any], outcome: str | None, since: str | None, until: str | None) -> bool:
    return (
        (outcome is None or run["outcome"] == outcome)
        and (since is None or run["started"] >= since)
        and (until is None or run["started"] < until)
    )


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def process_start(pid: int) -> int | None:
    """When a process started, in clock ticks since boot (tells a pid apart from a later reuse of it)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
