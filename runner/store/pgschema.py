"""runner's tables in PostgreSQL, as numbered migrations: `runner db migrate` applies those a database lacks
(`runner_schema` holds the version it is at), and a store refuses a database whose schema is behind."""

from __future__ import annotations

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
