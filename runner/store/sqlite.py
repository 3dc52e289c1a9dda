"""The embedded store: `.runner/runs.db` (SQLite, WAL), with transcripts as JSONL files beside it."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

from ..errors import StoreError, UnknownRun
from .base import Store, new_run_id, now, pid_alive, process_start
from .transcript import Transcript, read_transcript

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, goal TEXT NOT NULL, trigger TEXT NOT NULL, entry TEXT,
    outcome TEXT NOT NULL DEFAULT 'running', stop_reason TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, steps INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
    started TEXT NOT NULL, ended TEXT, pid INTEGER, final_message TEXT, error TEXT, pending TEXT
);
CREATE INDEX IF NOT EXISTS runs_goal ON runs (goal, started);
CREATE INDEX IF NOT EXISTS runs_started ON runs (started);
CREATE INDEX IF NOT EXISTS runs_outcome ON runs (outcome, started);
CREATE INDEX IF NOT EXISTS runs_goal_outcome ON runs (goal, outcome, started);
CREATE TABLE IF NOT EXISTS attempts (
    run_id TEXT NOT NULL, number INTEGER NOT NULL, stop_reason TEXT, steps INTEGER, tokens INTEGER,
    started TEXT, ended TEXT, PRIMARY KEY (run_id, number)
);
CREATE TABLE IF NOT EXISTS checks (
    run_id TEXT NOT NULL, attempt INTEGER NOT NULL, position INTEGER NOT NULL, name TEXT, kind TEXT,
    passed INTEGER, exit_code INTEGER, duration_s REAL, output TEXT, reason TEXT,
    PRIMARY KEY (run_id, attempt, position)
);
CREATE TABLE IF NOT EXISTS processes (
    run_id TEXT NOT NULL, pid INTEGER NOT NULL, started INTEGER, PRIMARY KEY (run_id, pid)
);
CREATE TABLE IF NOT EXISTS approvals (
    run_id TEXT PRIMARY KEY, decision TEXT, reason TEXT, decided TEXT
);
CREATE TABLE IF NOT EXISTS commands (
    id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, target TEXT NOT NULL, created TEXT NOT NULL,
    taken TEXT
);
CREATE TABLE IF NOT EXISTS entries (
    id TEXT PRIMARY KEY, last_fire TEXT, paused INTEGER NOT NULL DEFAULT 0, failures INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, entry TEXT, goal TEXT, kind TEXT NOT NULL,
    detail TEXT
);
"""

ADDED_COLUMNS = (
    ("runs", "cost", "REAL"),  # US dollars, when the model's price is known
    ("runs", "continues", "TEXT"),  # the run this one picks back up (runner continue)
    ("attempts", "cost", "REAL"),
    ("commands", "payload", "TEXT"),  # runner trigger --payload: the trigger context, JSON
)


class SqliteStore(Store):
    """SQLite in WAL mode; every write commits at once so another process sees it."""

    def __init__(self, state_dir: Path, timeout: float = 30.0) -> None:
        self.dir = state_dir
        try:
            (state_dir / "runs").mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(state_dir / "runs.db", timeout=timeout, isolation_level=None)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            self.inode = (state_dir / "runs.db").stat().st_ino
            self._add_columns()
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open the run store in {state_dir}: {exc}") from None

    def _add_columns(self) -> None:
        """Columns added after the first release, added to an existing database once (idempotent)."""
        for table, column, kind in ADDED_COLUMNS:
            if column not in self._columns(table):
                try:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
                except sqlite3.OperationalError as exc:  # another process added it a moment ago
                    if "duplicate column" not in str(exc):
                        raise

    def problem(self) -> str | None:
        path = self.dir / "runs.db"
        try:
            inode = path.stat().st_ino
        except OSError:
            return f"the run store {path} was deleted while in use"
        if inode != self.inode:
            return f"the run store {path} was replaced while in use"
        return None

    def close(self) -> None:
        self.db.close()

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        try:
            return self.db.execute(sql, args)
        except sqlite3.Error as exc:
            raise StoreError(f"run store {self.dir / 'runs.db'}: {exc}") from None

    # runs
    def new_run(self, goal: str, trigger: str = "manual", entry_id: str | None = None) -> str:
        run_id = new_run_id()
        self._exec(
            "INSERT INTO runs (id, goal, trigger, entry, started, pid) VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, goal, trigger, entry_id, now(), os.getpid()),
        )
        return run_id

    def update_run(self, run_id: str, **fields: Any) -> None:
        if fields:
            columns = ", ".join(f"{name} = ?" for name in fields)
            self._exec(f"UPDATE runs SET {columns} WHERE id = ?", (*fields.values(), run_id))

    def transcript_path(self, run_id: str) -> Path:
        return self.dir / "runs" / run_id / "transcript.jsonl"

    def transcript(self, run_id: str) -> Transcript:
        return Transcript(self.transcript_path(run_id))

    def transcript_events(self, run_id: str) -> list[dict[str, Any]]:
        return read_transcript(self.transcript_path(run_id))

    def transcript_location(self, run_id: str) -> str:
        return str(self.transcript_path(run_id))

    def run(self, run_id: str) -> dict[str, Any]:
        # a prefix as a range of the primary key: LIKE would scan every run (and read `_` as a wildcard)
        rows = self._exec(
            "SELECT * FROM runs WHERE id = ? OR (id > ? AND id < ?) LIMIT 21", (run_id, run_id, run_id + "\uffff")
        ).fetchall()
        if not rows:
            raise UnknownRun(f"no run with id {run_id!r} in {self.dir / 'runs.db'} (see `runner runs`)")
        if len(rows) > 1:
            listed = "\n".join(f"  {r['id']}  {r['goal']}  {r['outcome']}" for r in rows[:20])
            count = "more than 20" if len(rows) > 20 else str(len(rows))
            raise UnknownRun(f"{count} runs start with {run_id!r}; give more of the id:\n{listed}")
        run = dict(rows[0])
        run["run_id"] = run["id"]
        run["attempt_rows"] = [
            dict(r) for r in self._exec("SELECT * FROM attempts WHERE run_id = ? ORDER BY number", (run["id"],))
        ]
        run["checks"] = [
            dict(r)
            for r in self._exec("SELECT * FROM checks WHERE run_id = ? ORDER BY attempt, position", (run["id"],))
        ]
        return run

    def runs(self, goal: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        where, args = (" WHERE goal = ?", (goal,)) if goal else ("", ())
        if limit:  # the newest `limit` through the index, not every row
            sql = f"SELECT * FROM runs{where} ORDER BY started DESC, rowid DESC LIMIT ?"
            rows = [dict(r) for r in self._exec(sql, (*args, limit))][::-1]
        else:
            rows = [dict(r) for r in self._exec(f"SELECT * FROM runs{where} ORDER BY started, rowid", args)]
        for row in rows:
            row["run_id"] = row["id"]
        return rows

    def find_runs(
        self,
        goal: str | None = None,
        outcome: str | None = None,
        since: str | None = None,
        until: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        where, args = _run_filter(goal, outcome, since, until)
        sql = f"SELECT * FROM runs{where} ORDER BY started DESC, rowid DESC LIMIT ? OFFSET ?"
        rows = [dict(r) for r in self._exec(sql, (*args, limit, offset))]
        for row in rows:
            row["run_id"] = row["id"]
        return rows

    def count_runs(
        self, goal: str | None = None, outcome: str | None = None, since: str | None = None, until: str | None = None
    ) -> int:
        where, args = _run_filter(goal, outcome, since, until)
        return self._exec(f"SELECT COUNT(*) FROM runs{where}", args).fetchone()[0]

    def daily_totals(self, goal: str | None, since: str) -> list[dict[str, Any]]:
        where, args = _run_filter(goal, None, since, None)
        # all goals: in through the range of `started` (for the GROUP BY the planner would scan all of runs_goal)
        source = "runs" if goal else "runs INDEXED BY runs_started"
        sql = (
            "SELECT goal, substr(started, 1, 10) AS day, outcome, COUNT(*) AS runs, SUM(tokens) AS tokens,"
            f" SUM(cost) AS cost FROM {source}{where} GROUP BY goal, day, outcome"
        )
        return [dict(r) for r in self._exec(sql, args)]

    def _columns(self, table: str) -> set[str]:
        return {r["name"] for r in self._exec(f"PRAGMA table_info({table})")}

    def mark_interrupted(self) -> list[str]:
        """Runs left `running` by a process that is gone become `interrupted`; their processes are killed."""
        rows = self._exec("SELECT id, pid FROM runs WHERE outcome = 'running'").fetchall()
        dead = [r["id"] for r in rows if not pid_alive(r["pid"])]
        for run_id in dead:
            self.kill_processes(run_id)
            self.finish_run(run_id, "interrupted", error="the process running it died")
        return dead

    # process groups of a run (shell, command tools, checks)
    def track_process(self, run_id: str, pid: int, alive: bool) -> None:
        if alive:
            self._exec("INSERT OR REPLACE INTO processes VALUES (?, ?, ?)", (run_id, pid, process_start(pid)))
        else:
            self._exec("DELETE FROM processes WHERE run_id = ? AND pid = ?", (run_id, pid))

    def kill_processes(self, run_id: str) -> None:
        """Kill the process groups a dead run left behind (only those whose start time still matches)."""
        for row in self._exec("SELECT pid, started FROM processes WHERE run_id = ?", (run_id,)).fetchall():
            if row["started"] is not None and process_start(row["pid"]) == row["started"]:
                try:
                    os.killpg(row["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self._exec("DELETE FROM processes WHERE run_id = ?", (run_id,))

    # attempts and checks
    def record_attempt(self, run_id: str, number: int, **fields: Any) -> None:
        self._exec("INSERT OR IGNORE INTO attempts (run_id, number, started) VALUES (?, ?, ?)", (run_id, number, now()))
        if fields:
            columns = ", ".join(f"{name} = ?" for name in fields)
            self._exec(
                f"UPDATE attempts SET {columns} WHERE run_id = ? AND number = ?", (*fields.values(), run_id, number)
            )

    def record_check(self, run_id: str, attempt: int, position: int, **fields: Any) -> None:
        names = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        self._exec(
            f"INSERT OR REPLACE INTO checks (run_id, attempt, position, {names}) VALUES (?, ?, ?, {marks})",
            (run_id, attempt, position, *fields.values()),
        )

    # approvals
    def answer(self, run_id: str, decision: str, reason: str | None = None) -> None:
        self._exec(
            "INSERT OR REPLACE INTO approvals (run_id, decision, reason, decided) VALUES (?, ?, ?, ?)",
            (run_id, decision, reason, now()),
        )

    def take_answer(self, run_id: str) -> tuple[str, str | None] | None:
        row = self._exec("SELECT decision, reason FROM approvals WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        if self._exec("DELETE FROM approvals WHERE run_id = ?", (run_id,)).rowcount == 0:
            return None  # another process took it between the two statements
        return row["decision"], row["reason"]

    def take_over(self, run_id: str) -> bool:
        taken = self._exec(
            "UPDATE runs SET outcome = 'running', pid = ? WHERE id = ? AND outcome = 'awaiting_approval'",
            (os.getpid(), run_id),
        )
        return taken.rowcount == 1

    # commands for the daemon
    def send_command(self, kind: str, target: str, payload: str | None = None) -> int:
        cursor = self._exec(
            "INSERT INTO commands (kind, target, created, payload) VALUES (?, ?, ?, ?)", (kind, target, now(), payload)
        )
        return int(cursor.lastrowid or 0)

    def command_taken(self, command_id: int) -> bool:
        row = self._exec("SELECT taken FROM commands WHERE id = ?", (command_id,)).fetchone()
        return row is not None and row["taken"] is not None

    def take_commands(self) -> list[tuple[str, str, str | None]]:
        rows = self._exec("SELECT id, kind, target, payload FROM commands WHERE taken IS NULL ORDER BY id").fetchall()
        if rows:
            self._exec(f"UPDATE commands SET taken = ? WHERE id <= {rows[-1]['id']} AND taken IS NULL", (now(),))
        return [(r["kind"], r["target"], r["payload"]) for r in rows]

    # schedule entries
    def entry(self, entry_id: str) -> dict[str, Any]:
        row = self._exec("SELECT * FROM entries WHERE id = ?", (entry_id,)).fetchone()
        return dict(row) if row else {"id": entry_id, "last_fire": None, "paused": 0, "failures": 0}

    def update_entry(self, entry_id: str, **fields: Any) -> None:
        self._exec("INSERT OR IGNORE INTO entries (id) VALUES (?)", (entry_id,))
        columns = ", ".join(f"{name} = ?" for name in fields)
        self._exec(f"UPDATE entries SET {columns} WHERE id = ?", (*fields.values(), entry_id))

    def log_event(self, kind: str, goal: str | None = None, entry_id: str | None = None, detail: str = "") -> None:
        self._exec(
            "INSERT INTO events (at, entry, goal, kind, detail) VALUES (?, ?, ?, ?, ?)",
            (now(), entry_id, goal, kind, detail),
        )

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM events" + (" WHERE kind = ?" if kind else "") + " ORDER BY id"
        return [dict(r) for r in self._exec(sql, (kind,) if kind else ())]


def _run_filter(
    goal: str | None, outcome: str | None, since: str | None, until: str | None
) -> tuple[str, tuple[Any, ...]]:
    """A WHERE clause the runs indexes serve: (goal, started), (outcome, started), (started)."""
    tests = [("goal = ?", goal), ("outcome = ?", outcome), ("started >= ?", since), ("started < ?", until)]
    used = [(sql, value) for sql, value in tests if value is not None]
    where = " WHERE " + " AND ".join(sql for sql, _ in used) if used else ""
    return where, tuple(value for _, value in used)
