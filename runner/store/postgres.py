"""The PostgreSQL store (`store: postgresql://...` in runner.yaml): the same state as the SQLite store, shared
by every machine that has the URL, transcripts included (so `runner show` works anywhere).

Each write is one statement in autocommit mode, visible to every other process at once. A run remembers
the host and pid that run it, so a machine only ever judges (and kills) processes of its own. The schema is
versioned (`runner_schema`); `runner db migrate` applies what is missing, and a store refuses a database
whose schema is behind.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import threading
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from ..errors import StoreError, UnknownRun
from .base import Store, new_run_id, now, pid_alive, process_start
from .pgconnect import HOST, PROCESS_PREFIX, first_line, psycopg_module, reconnected, redact, session
from .pgschema import MIGRATE_LOCK, MIGRATIONS, SCHEMA_VERSION
from .pgwriter import TRANSCRIPT_INSERT, Writer

JOB: ContextVar[int | None] = ContextVar("runner_job", default=None)
"""The Procrastinate job a run belongs to, set by the worker around `run_goal` (a run row keeps it)."""

CLAIM_FIRE = (
    "INSERT INTO runner_entries (id, last_fire) VALUES (%(entry)s, %(fire)s) ON CONFLICT (id) DO UPDATE"
    " SET last_fire = EXCLUDED.last_fire"
    " WHERE runner_entries.last_fire IS NULL OR runner_entries.last_fire < EXCLUDED.last_fire RETURNING paused"
)
"""An (entry, fire time) claimed, or no row when another process claimed it; with the entry's pause."""
ENTRY_PAUSED = "SELECT paused FROM runner_entries WHERE id = %(entry)s"

COMMANDS_CHANNEL = "runner_commands"
"""The channel on which a command sent tells the daemons to read their commands now, not at their next poll."""


class PgTranscript:
    """A run's transcript as rows of runner_transcripts, one INSERT per message or event."""

    def __init__(self, store: PostgresStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id

    def append(self, kind: str, data: dict[str, Any]) -> None:
        event = json.dumps({"at": now(), "kind": kind, **data}, ensure_ascii=False, default=str)
        self.store.write(TRANSCRIPT_INSERT, (self.run_id, event))

    def close(self) -> None:
        pass


class PostgresStore(Store):
    """runner's state in PostgreSQL; one autocommit connection, shared by the threads of a process."""

    def __init__(self, url: str, check_schema: bool = True) -> None:
        self.url = url
        self.where = redact(url)
        self._lock = threading.Lock()
        self.writer: Writer | None = None
        self.db = self._connect_main()
        if check_schema:
            self.check_schema()

    # schema
    def schema_version(self) -> int:
        row = self.exec("SELECT to_regclass('runner_schema') AS t").fetchone()
        if row["t"] is None:
            return 0
        return self.exec("SELECT max(version) AS v FROM runner_schema").fetchone()["v"] or 0

    def check_schema(self) -> None:
        version = self.schema_version()
        if version < SCHEMA_VERSION:
            raise StoreError(
                f"the database {self.where} has runner's schema at version {version}, this runner needs"
                f" {SCHEMA_VERSION}: run `runner db migrate`"
            )
        self._not_newer(version)

    def _not_newer(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the database {self.where} has runner's schema at version {version}, newer than this runner"
                f" knows ({SCHEMA_VERSION}): upgrade runner"
            )

    def migrate(self) -> list[int]:
        """Apply the migrations the database lacks, each in its own transaction; the versions applied."""
        applied = []
        with self._lock, self.db.transaction():
            self.db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
            self.db.execute("CREATE TABLE IF NOT EXISTS runner_schema (version INTEGER PRIMARY KEY, applied TEXT)")
            row = self.db.execute("SELECT max(version) AS v FROM runner_schema").fetchone()
            self._not_newer(row["v"] or 0)
            for version in range((row["v"] or 0) + 1, SCHEMA_VERSION + 1):
                self.db.execute(MIGRATIONS[version - 1])
                self.db.execute("INSERT INTO runner_schema VALUES (%s, %s)", (version, now()))
                applied.append(version)
        return applied

    def close(self) -> None:
        if self.writer is not None:
            self.writer.queue.put(None)
            self.writer.join()
            self.writer.db.close()
            self.writer = None
        self.db.close()

    def _connect_main(self) -> Any:
        """The connection of the store's own statements: rows as dicts."""
        from psycopg.rows import dict_row

        return self._connect(row_factory=dict_row)

    def _connect(self, **options: Any) -> Any:
        psycopg = psycopg_module()
        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=10, **options, **session(self.url))
        except psycopg.Error as exc:
            raise StoreError(f"cannot reach the PostgreSQL store {self.where}: {first_line(exc)}") from None

    def exec(self, sql: str, args: tuple[Any, ...] | dict[str, Any] = (), *, after_writes: bool = True) -> Any:
        """A statement whose result is needed (or that must be done on return), after every queued write.

        `after_writes=False` for tables that are never written through the queue (entries, but for a good
        run's `reset_failures`, which only `count_failure` reads, after the writes; commands, approvals,
        Procrastinate's): such a read does not wait for a burst of queued writes to drain.
        A connection the server let go (a restart) is made again first.
        """
        psycopg = psycopg_module()
        if after_writes:
            self.flush()
        try:
            with self._lock:
                self.db = reconnected(self.db, self._connect_main)
                values = {k: _text(v) for k, v in args.items()} if isinstance(args, dict) else tuple(map(_text, args))
                return self.db.execute(sql, values)  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise StoreError(f"run store {self.where}: {first_line(exc)}") from None

    def write(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        """A statement that returns nothing: queued for the writer thread (started on the first write)."""
        self.start_writer()
        assert self.writer is not None
        self.writer.queue.put((sql, tuple(_text(a) for a in args)))

    def start_writer(self) -> None:
        """Connect the writer thread now: a daemon does it before its first run, so that the first trigger of a
        burst does not hold the event loop while it connects."""
        if self.writer is None:
            self.writer = Writer(self._connect, self.where)
            self.writer.start()
            atexit.register(self.flush)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    # runs
    def new_run(self, goal: str, trigger: str = "manual", entry_id: str | None = None) -> str:
        run_id = new_run_id()
        self.write(
            "INSERT INTO runner_runs (id, goal, trigger, entry, started, pid, host, job_id)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (run_id, goal, trigger, entry_id, now(), os.getpid(), HOST, JOB.get()),
        )
        return run_id

    def update_run(self, run_id: str, **fields: Any) -> None:
        if fields:
            columns = ", ".join(f"{name} = %s" for name in fields)
            self.write(f"UPDATE runner_runs SET {columns} WHERE id = %s", (*fields.values(), run_id))

    def run(self, run_id: str) -> dict[str, Any]:
        rows = self.exec(
            "SELECT * FROM runner_runs WHERE id = %s OR id LIKE %s ORDER BY id LIMIT 21",
            (run_id, _like_prefix(run_id)),
        ).fetchall()
        rows = [r for r in rows if r["id"] == run_id] or rows
        if not rows:
            raise UnknownRun(f"no run with id {run_id!r} in {self.where} (see `runner runs`)")
        if len(rows) > 1:
            listed = "\n".join(f"  {r['id']}  {r['goal']}  {r['outcome']}" for r in rows[:20])
            more = "\n  ... and more" if len(rows) > 20 else ""
            raise UnknownRun(f"several runs start with {run_id!r}; give more of the id:\n{listed}{more}")
        run = {**rows[0], "run_id": rows[0]["id"]}
        run["attempt_rows"] = self.exec(
            "SELECT * FROM runner_attempts WHERE run_id = %s ORDER BY number", (run["id"],)
        ).fetchall()
        run["checks"] = self.exec(
            "SELECT * FROM runner_checks WHERE run_id = %s ORDER BY attempt, position", (run["id"],)
        ).fetchall()
        return run

    def runs(self, goal: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        where = " WHERE goal = %s" if goal else ""
        args: tuple[Any, ...] = (goal,) if goal else ()
        if limit:
            sql = f"SELECT * FROM runner_runs{where} ORDER BY started DESC, id DESC LIMIT %s"
            rows = self.exec(sql, (*args, limit)).fetchall()[::-1]
        else:
            rows = self.exec(f"SELECT * FROM runner_runs{where} ORDER BY started, id", args).fetchall()
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
        sql = f"SELECT * FROM runner_runs{where} ORDER BY started DESC, id DESC LIMIT %s OFFSET %s"
        return [{**r, "run_id": r["id"]} for r in self.exec(sql, (*args, limit, offset)).fetchall()]

    def count_runs(
        self, goal: str | None = None, outcome: str | None = None, since: str | None = None, until: str | None = None
    ) -> int:
        where, args = _run_filter(goal, outcome, since, until)
        return int(self.exec(f"SELECT count(*) AS n FROM runner_runs{where}", args).fetchone()["n"])

    def daily_totals(self, goal: str | None, since: str) -> list[dict[str, Any]]:
        where, args = _run_filter(goal, None, since, None)
        sql = (
            "SELECT goal, substr(started, 1, 10) AS day, outcome, count(*) AS runs, sum(tokens) AS tokens,"
            f" sum(cost) AS cost FROM runner_runs{where} GROUP BY 1, 2, 3"
        )
        return self.exec(sql, args).fetchall()

    def mark_interrupted(self) -> list[str]:
        """This machine's runs left `running` by a process that is gone become `interrupted`; the process groups
        its dead runs left behind (whatever their outcome, e.g. set by another machine) are killed."""
        rows = self.exec("SELECT id, pid FROM runner_runs WHERE outcome = 'running' AND host = %s", (HOST,))
        dead = [r["id"] for r in rows.fetchall() if not pid_alive(r["pid"])]
        for run_id in dead:
            self.finish_run(run_id, "interrupted", error=f"the process running it on {HOST} died")
        self.kill_orphans()
        return dead

    def run_alive(self, run: dict[str, Any]) -> bool:
        """On this machine, its process; on another, its worker's heartbeat (unknown there: assumed alive)."""
        if run.get("host") == HOST:
            return pid_alive(run.get("pid"))
        if run.get("job_id") is None:
            return True
        row = self.exec(
            "SELECT 1 FROM procrastinate_jobs j JOIN procrastinate_workers w ON w.id = j.worker_id"
            " WHERE j.id = %s AND j.status = 'doing' AND w.last_heartbeat > now() - interval '30 seconds'",
            (run["job_id"],),
        ).fetchone()
        return row is not None

    def kill_orphans(self) -> None:
        """Kill the process groups on this machine whose run's process is gone."""
        rows = self.exec(
            "SELECT DISTINCT p.run_id, r.pid FROM runner_processes p LEFT JOIN runner_runs r ON r.id = p.run_id"
            " WHERE p.host = %s",
            (HOST,),
        ).fetchall()
        for row in rows:
            if not pid_alive(row["pid"]):
                self.kill_processes(row["run_id"])

    def interrupt_job_runs(self, job_id: int, why: str) -> list[str]:
        """The runs of a job whose worker stalled become `interrupted` (once, whoever sees it first)."""
        rows = self.exec(
            "UPDATE runner_runs SET outcome = 'interrupted', ended = %s, error = %s"
            " WHERE job_id = %s AND outcome = 'running' RETURNING id",
            (now(), why, job_id),
        ).fetchall()
        return [r["id"] for r in rows]

    # transcripts
    def transcript(self, run_id: str) -> PgTranscript:
        return PgTranscript(self, run_id)

    def transcript_events(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.exec("SELECT event FROM runner_transcripts WHERE run_id = %s ORDER BY id", (run_id,))
        return [json.loads(r["event"]) for r in rows.fetchall()]

    def transcript_location(self, run_id: str) -> str:
        return f"in {self.where} (runner show {run_id} --json)"

    # process groups of a run
    def track_process(self, run_id: str, pid: int, alive: bool) -> None:
        if alive:
            self.write(
                "INSERT INTO runner_processes VALUES (%s, %s, %s, %s) ON CONFLICT (host, pid, run_id)"
                " DO UPDATE SET started = EXCLUDED.started",
                (HOST, pid, run_id, process_start(pid)),
            )
        else:
            self.write("DELETE FROM runner_processes WHERE host = %s AND pid = %s AND run_id = %s", (HOST, pid, run_id))

    def kill_processes(self, run_id: str) -> None:
        """Kill the process groups a dead run left on this machine (only those whose start time still matches)."""
        rows = self.exec(
            "SELECT pid, started FROM runner_processes WHERE run_id = %s AND host = %s", (run_id, HOST)
        ).fetchall()
        for row in rows:
            if row["started"] is not None and process_start(row["pid"]) == row["started"]:
                try:
                    os.killpg(row["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.exec("DELETE FROM runner_processes WHERE run_id = %s AND host = %s", (run_id, HOST))

    # attempts and checks
    def record_attempt(self, run_id: str, number: int, **fields: Any) -> None:
        self.write(
            "INSERT INTO runner_attempts (run_id, number, started) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (run_id, number, now()),
        )
        if fields:
            columns = ", ".join(f"{name} = %s" for name in fields)
            self.write(
                f"UPDATE runner_attempts SET {columns} WHERE run_id = %s AND number = %s",
                (*fields.values(), run_id, number),
            )

    def record_check(self, run_id: str, attempt: int, position: int, **fields: Any) -> None:
        names = ", ".join(fields)
        marks = ", ".join("%s" for _ in fields)
        updates = ", ".join(f"{name} = EXCLUDED.{name}" for name in fields) or "name = EXCLUDED.name"
        self.write(
            f"INSERT INTO runner_checks (run_id, attempt, position, {names}) VALUES (%s, %s, %s, {marks})"
            f" ON CONFLICT (run_id, attempt, position) DO UPDATE SET {updates}",
            (run_id, attempt, position, *fields.values()),
        )

    # approvals
    def answer(self, run_id: str, decision: str, reason: str | None = None) -> None:
        self.exec(
            "INSERT INTO runner_approvals VALUES (%s, %s, %s, %s) ON CONFLICT (run_id)"
            " DO UPDATE SET decision = EXCLUDED.decision, reason = EXCLUDED.reason, decided = EXCLUDED.decided",
            (run_id, decision, reason, now()),
        )

    def take_answer(self, run_id: str) -> tuple[str, str | None] | None:
        row = self.exec("DELETE FROM runner_approvals WHERE run_id = %s RETURNING decision, reason", (run_id,))
        found = row.fetchone()
        return (found["decision"], found["reason"]) if found else None

    def live_processes(self) -> list[dict[str, str]]:
        """The daemons and workers connected to this database now, each as {"role", "where"} (host:pid), from
        the server's session list: a process that died has no session left."""
        rows = self.exec(
            "SELECT DISTINCT application_name AS name FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE %s AND pid <> pg_backend_pid() ORDER BY 1",
            (f"{PROCESS_PREFIX}%",),
            after_writes=False,
        ).fetchall()
        found = [row["name"][len(PROCESS_PREFIX) :].partition(" ") for row in rows]
        return [{"role": role, "where": where} for role, _, where in found if role in ("daemon", "worker")]

    def take_over(self, run_id: str) -> bool:
        taken = self.exec(  # no longer its job's: a sweep of a stalled worker leaves it alone
            "UPDATE runner_runs SET outcome = 'running', pid = %s, host = %s, job_id = NULL"
            " WHERE id = %s AND outcome = 'awaiting_approval' RETURNING id",
            (os.getpid(), HOST, run_id),
        )
        return taken.fetchone() is not None

    # commands for the daemons: each is taken by exactly one of them
    def send_command(self, kind: str, target: str, payload: str | None = None) -> int:
        row = self.exec(  # with a notice that wakes the daemons' command readers at once
            "WITH sent AS (INSERT INTO runner_commands (kind, target, created, payload) VALUES (%s, %s, %s, %s)"
            f" RETURNING id) SELECT id, pg_notify('{COMMANDS_CHANNEL}', '') FROM sent",
            (kind, target, now(), payload),
        ).fetchone()
        return int(row["id"])

    def command_taken(self, command_id: int) -> bool:
        row = self.exec("SELECT taken FROM runner_commands WHERE id = %s", (command_id,)).fetchone()
        return row is not None and row["taken"] is not None

    def take_commands(self) -> list[tuple[str, str, str | None]]:
        rows = self.exec(
            "UPDATE runner_commands SET taken = %s WHERE id IN (SELECT id FROM runner_commands WHERE taken IS NULL"
            " ORDER BY id FOR UPDATE SKIP LOCKED) RETURNING id, kind, target, payload",
            (now(),),
            after_writes=False,
        ).fetchall()
        return [(r["kind"], r["target"], r["payload"]) for r in sorted(rows, key=lambda r: r["id"])]

    # schedule entries
    def entry(self, entry_id: str) -> dict[str, Any]:
        row = self.exec("SELECT * FROM runner_entries WHERE id = %s", (entry_id,), after_writes=False).fetchone()
        if row is None:
            return {"id": entry_id, "last_fire": None, "paused": 0, "failures": 0}
        return {**row, "last_fire": row["last_fire"].isoformat() if row["last_fire"] else None}

    def update_entry(self, entry_id: str, **fields: Any) -> None:
        columns = ", ".join(f"{name} = EXCLUDED.{name}" for name in fields)
        self.exec(
            f"INSERT INTO runner_entries (id, {', '.join(fields)}) VALUES (%s, {', '.join('%s' for _ in fields)})"
            f" ON CONFLICT (id) DO UPDATE SET {columns}",
            (entry_id, *fields.values()),
            after_writes=False,
        )

    def count_failure(self, entry_id: str) -> int:
        row = self.exec(  # after the queued writes: a reset_failures before it has landed
            "INSERT INTO runner_entries (id, failures) VALUES (%s, 1) ON CONFLICT (id) DO UPDATE"
            " SET failures = runner_entries.failures + 1 RETURNING failures",
            (entry_id,),
        ).fetchone()
        return int(row["failures"])

    def reset_failures(self, entry_id: str) -> None:
        """Queued, no round trip: after a good run, a row to change only when it counted failures."""
        self.write("UPDATE runner_entries SET failures = 0 WHERE id = %s AND failures <> 0", (entry_id,))

    def claim_fire(self, entry_id: str, fire: datetime) -> bool:
        """True for exactly one caller per (entry, fire time): last_fire only moves forwards, once per time."""
        row = self.exec(CLAIM_FIRE, {"entry": entry_id, "fire": fire}, after_writes=False).fetchone()
        return row is not None

    def log_event(self, kind: str, goal: str | None = None, entry_id: str | None = None, detail: str = "") -> None:
        self.write(
            "INSERT INTO runner_events (at, entry, goal, kind, detail) VALUES (%s, %s, %s, %s, %s)",
            (now(), entry_id, goal, kind, detail),
        )

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM runner_events" + (" WHERE kind = %s" if kind else "") + " ORDER BY id"
        return self.exec(sql, (kind,) if kind else ()).fetchall()


def _run_filter(
    goal: str | None, outcome: str | None, since: str | None, until: str | None
) -> tuple[str, tuple[Any, ...]]:
    """A WHERE clause the runs indexes serve: (goal, started), (outcome, started), (started)."""
    tests = [("goal = %s", goal), ("outcome = %s", outcome), ("started >= %s", since), ("started < %s", until)]
    used = [(sql, value) for sql, value in tests if value is not None]
    where = " WHERE " + " AND ".join(sql for sql, _ in used) if used else ""
    return where, tuple(value for _, value in used)


def _like_prefix(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _text(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL bytes (a tool's output can): they become U+FFFD."""
    return value.replace("\x00", "\ufffd") if isinstance(value, str) and "\x00" in value else value
