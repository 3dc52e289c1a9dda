"""The PostgreSQL store (`store: postgresql://...` in runner.yaml): the same state as the SQLite store, shared
by every machine that has the URL, transcripts included (so `runner show` works anywhere).

Each write is one statement in autocommit mode, visible to every other process at once. A run remembers
the host and pid that run it, so a machine only ever judges (and kills) processes of its own. The schema is
versioned (`runner_schema`); `runner db migrate` applies what is missing, and a store refuses a database
whose schema is behind.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import os
import queue
import re
import select
import signal
import socket
import threading
from collections.abc import Callable
from contextvars import ContextVar
from datetime import datetime
from typing import Any
from urllib.parse import unquote

from ..errors import StoreError, UnknownRun
from .base import Store, new_run_id, now, pid_alive, process_start

INSTALL_HINT = "pip install 'runner[postgres]'"
HOST = socket.gethostname()
JOB: ContextVar[int | None] = ContextVar("runner_job", default=None)
"""The Procrastinate job a run belongs to, set by the worker around `run_goal` (a run row keeps it)."""

MIGRATIONS: list[str] = [
    # 1: the first schema
    """
    CREATE TABLE runner_runs (
        id TEXT PRIMARY KEY, goal TEXT NOT NULL, trigger TEXT NOT NULL, entry TEXT,
        outcome TEXT NOT NULL DEFAULT 'running', stop_reason TEXT,
        attempts INTEGER NOT NULL DEFAULT 0, steps INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
        started TEXT NOT NULL, ended TEXT, pid INTEGER, host TEXT, job_id BIGINT,
        final_message TEXT, error TEXT, pending TEXT, cost DOUBLE PRECISION, continues TEXT
    );
    CREATE INDEX runner_runs_started ON runner_runs (started, id);
    CREATE INDEX runner_runs_goal ON runner_runs (goal, started, id);
    CREATE INDEX runner_runs_outcome ON runner_runs (outcome, started, id);
    CREATE INDEX runner_runs_prefix ON runner_runs (id text_pattern_ops);
    CREATE INDEX runner_runs_running ON runner_runs (host) WHERE outcome = 'running';
    CREATE INDEX runner_runs_job ON runner_runs (job_id) WHERE job_id IS NOT NULL;
    CREATE TABLE runner_attempts (
        run_id TEXT NOT NULL, number INTEGER NOT NULL, stop_reason TEXT, steps INTEGER, tokens INTEGER,
        started TEXT, ended TEXT, cost DOUBLE PRECISION, PRIMARY KEY (run_id, number)
    );
    CREATE TABLE runner_checks (
        run_id TEXT NOT NULL, attempt INTEGER NOT NULL, position INTEGER NOT NULL, name TEXT, kind TEXT,
        passed INTEGER, exit_code INTEGER, duration_s DOUBLE PRECISION, output TEXT, reason TEXT,
        PRIMARY KEY (run_id, attempt, position)
    );
    CREATE TABLE runner_processes (
        host TEXT NOT NULL, pid INTEGER NOT NULL, run_id TEXT NOT NULL, started BIGINT,
        PRIMARY KEY (host, pid, run_id)
    );
    CREATE TABLE runner_approvals (run_id TEXT PRIMARY KEY, decision TEXT, reason TEXT, decided TEXT);
    CREATE TABLE runner_commands (
        id BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, target TEXT NOT NULL, created TEXT NOT NULL, taken TEXT,
        payload TEXT
    );
    CREATE INDEX runner_commands_open ON runner_commands (id) WHERE taken IS NULL;
    CREATE TABLE runner_entries (
        id TEXT PRIMARY KEY, last_fire TIMESTAMPTZ, paused INTEGER NOT NULL DEFAULT 0,
        failures INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE runner_events (
        id BIGSERIAL PRIMARY KEY, at TEXT NOT NULL, entry TEXT, goal TEXT, kind TEXT NOT NULL, detail TEXT
    );
    CREATE INDEX runner_events_kind ON runner_events (kind, id);
    CREATE TABLE runner_transcripts (
        id BIGSERIAL PRIMARY KEY, run_id TEXT NOT NULL, event TEXT NOT NULL
    );
    CREATE INDEX runner_transcripts_run ON runner_transcripts (run_id, id);
    """,
    # 2: a job that ends while a follow-up waits on its lock wakes the workers at once (Procrastinate only
    # notifies them of new jobs; without this the follow-up waits for their next poll)
    """
    CREATE FUNCTION runner_wake_follow_up() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF OLD.lock IS NOT NULL AND OLD.status = 'doing' AND (TG_OP = 'DELETE' OR NEW.status <> 'doing') THEN
            PERFORM pg_notify('procrastinate_any_queue_v1',
                              json_build_object('type', 'job_inserted', 'job_id', id)::text)
            FROM procrastinate_jobs WHERE lock = OLD.lock AND status = 'todo' LIMIT 1;
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER runner_wake_follow_up AFTER UPDATE OF status OR DELETE ON procrastinate_jobs
        FOR EACH ROW EXECUTE FUNCTION runner_wake_follow_up();
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)
MIGRATE_LOCK = 7_146_001  # a pg_advisory_xact_lock key: one `runner db migrate` at a time


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


class Writer(threading.Thread):
    """Writes that return nothing, in order, on a connection of their own, many per round trip (a pipeline):
    the event loop that records a step never waits for the database. Every read of the store waits for the
    writes before it (`flush`), so a process always reads what it wrote.

    A busy daemon records thousands of rows a second, a few at a time: the writer lets a burst gather for
    LINGER seconds (unless a reader waits), then sends the burst's transcript rows first (append-only, read
    by run id) as one COPY, and the rest in the order they came in one pipeline, one `executemany` per run
    of identical statements.
    """

    LINGER = 0.005
    MAX_BATCH = 1000

    def __init__(self, connect: Callable[[], Any], where: str) -> None:
        super().__init__(name="runner-store-writer", daemon=True)
        self.connect, self.where = connect, where
        self.db = connect()
        self.queue: queue.Queue[tuple[str, tuple[Any, ...]] | None] = queue.Queue()
        self.failure: str | None = None
        self.waited = threading.Event()
        """Set while a reader waits in `flush`: the writer sends what it has without lingering."""

    def run(self) -> None:
        stop = False
        while not stop:
            batch = [self.queue.get()]
            if batch[0] is not None:
                self.waited.wait(self.LINGER)
            while len(batch) < self.MAX_BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in batch
            self._write([item for item in batch if item is not None])
            for _ in batch:
                self.queue.task_done()

    def _write(self, batch: list[tuple[str, tuple[Any, ...]]]) -> None:
        psycopg = psycopg_module()
        transcript = [args for sql, args in batch if sql == TRANSCRIPT_INSERT]
        rest = [(sql, args) for sql, args in batch if sql != TRANSCRIPT_INSERT]
        try:
            self.db = reconnected(self.db, self.connect)  # after a restart of the server
            with self.db.cursor() as cursor:
                if transcript:
                    with cursor.copy(TRANSCRIPT_COPY) as copy:
                        for row in transcript:
                            copy.write_row(row)
                if rest:
                    with self.db.pipeline():
                        for sql, group in itertools.groupby(rest, key=lambda item: item[0]):
                            cursor.executemany(sql, [args for _, args in group])
        except (psycopg.Error, StoreError) as exc:
            self.failure = f"run store {self.where}: {_first_line(exc)}"

    def flush(self) -> None:
        self.waited.set()
        try:
            self.queue.join()
        finally:
            self.waited.clear()
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise StoreError(failure)


CLAIM_FIRE = (
    "INSERT INTO runner_entries (id, last_fire) VALUES (%(entry)s, %(fire)s) ON CONFLICT (id) DO UPDATE"
    " SET last_fire = EXCLUDED.last_fire"
    " WHERE runner_entries.last_fire IS NULL OR runner_entries.last_fire < EXCLUDED.last_fire RETURNING paused"
)
"""An (entry, fire time) claimed, or no row when another process claimed it; with the entry's pause."""
ENTRY_PAUSED = "SELECT paused FROM runner_entries WHERE id = %(entry)s"

COMMANDS_CHANNEL = "runner_commands"
"""The channel on which a command sent tells the daemons to read their commands now, not at their next poll."""

TRANSCRIPT_INSERT = "INSERT INTO runner_transcripts (run_id, event) VALUES (%s, %s)"
"""A transcript row as queued for the writer, which sends a batch of them with TRANSCRIPT_COPY instead."""
TRANSCRIPT_COPY = "COPY runner_transcripts (run_id, event) FROM STDIN"
"""How the writer sends a batch's transcript rows: a quarter of the client CPU of the same rows as INSERTs."""


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
            raise StoreError(f"cannot reach the PostgreSQL store {self.where}: {_first_line(exc)}") from None

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
            raise StoreError(f"run store {self.where}: {_first_line(exc)}") from None

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


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
