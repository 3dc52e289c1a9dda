"""Procrastinate on runner's PostgreSQL store: the app and its connection pools, the task every run is a job
of, how long a silent worker counts as alive, the schema (`runner db migrate`) and `runner db status`.

The cluster engine (`cluster`) runs on it; `runner db` needs no more than this.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import DaemonError
from ..store import now
from ..store.pgconnect import INSTALL_HINT, dropped, quiet_connection, redact, session
from ..store.postgres import PostgresStore

TASK = "runner.run"
STALLED_AFTER = 10.0
"""A worker without a heartbeat for this long is dead; its running jobs are stalled."""


def procrastinate_module() -> Any:
    try:
        import procrastinate
    except ImportError:
        raise DaemonError(f"a postgresql:// store runs on Procrastinate: {INSTALL_HINT}") from None
    return procrastinate


def make_app(url: str, name: str | None = None) -> Any:
    """A Procrastinate app on the store's database; its connections carry `name` (see `process_name`)."""
    procrastinate = procrastinate_module()
    connector = procrastinate.PsycopgConnector(
        conninfo=url,
        min_size=1,
        max_size=10,
        kwargs={**session(url), **({"application_name": name} if name else {})},
        connection_class=quiet_connection(),
        pool_factory=_pool,
        configure=_configure,
        reset=_returned,
    )
    return procrastinate.App(connector=connector)


async def _configure(connection: Any) -> None:
    """A new connection: in autocommit, since Procrastinate's statements are one each (its functions do their
    own locking) and each is then one round trip, not three (BEGIN, the statement, COMMIT); and as good as
    checked, having just answered."""
    await connection.set_autocommit(True)
    connection.runner_returned = time.monotonic()


RECHECK_AFTER = 2.0
"""Seconds a pooled connection may rest before the pool asks the server whether it still answers."""


def _pool(**args: Any) -> Any:
    """Procrastinate's pool, checking a connection before handing it out only when it rested RECHECK_AFTER
    seconds: it checks every one, a round trip to the server before each of a run's four queries."""
    from psycopg_pool import AsyncConnectionPool

    return AsyncConnectionPool(**{**args, "check": _check_rested})


async def _returned(connection: Any) -> None:
    connection.runner_returned = time.monotonic()


async def _check_rested(connection: Any) -> None:
    """A round trip only for a connection that rested, or that the server let go meanwhile (a restart: a
    statement on it would fail, and a failed fetch stops Procrastinate's worker)."""
    from psycopg.pq import TransactionStatus
    from psycopg_pool import AsyncConnectionPool

    rested = time.monotonic() - getattr(connection, "runner_returned", -RECHECK_AFTER) >= RECHECK_AFTER
    if rested or connection.pgconn.transaction_status != TransactionStatus.IDLE or dropped(connection):
        await AsyncConnectionPool.check_connection(connection)


# the schema: runner's and Procrastinate's
async def migrate(store: PostgresStore) -> list[str]:
    """Apply what the database lacks of runner's schema and of Procrastinate's; what was applied."""
    done = []
    app = make_app(store.url)
    async with app.open_async():
        if not await app.check_connection_async():
            await app.schema_manager.apply_schema_async()
            done.append(f"Procrastinate schema {procrastinate_module().__version__}")
    # runner's schema after Procrastinate's: its trigger is on Procrastinate's jobs table
    return done + [f"runner schema version {v}" for v in store.migrate()]


async def status(store: PostgresStore) -> dict[str, Any]:
    """The daemons and workers connected, Procrastinate's workers alive, commands no daemon took yet, and jobs
    queued and running per goal."""
    if store.exec("SELECT to_regclass('procrastinate_jobs') AS t").fetchone()["t"] is None:
        raise DaemonError(f"the database {redact(store.url)} has no Procrastinate schema: run `runner db migrate`")
    workers = store.exec(
        "SELECT id, last_heartbeat, now() - last_heartbeat < make_interval(secs => %s) AS alive"
        " FROM procrastinate_workers ORDER BY id",
        (STALLED_AFTER,),
    ).fetchall()
    jobs = store.exec(
        "SELECT args->>'goal' AS goal, status::text AS status, count(*) AS n FROM procrastinate_jobs"
        " WHERE task_name = %s AND status IN ('todo', 'doing') GROUP BY 1, 2 ORDER BY 1, 2",
        (TASK,),
    ).fetchall()
    goals: dict[str, dict[str, int]] = {}
    for row in jobs:
        counts = goals.setdefault(row["goal"], {"queued": 0, "running": 0})
        counts["queued" if row["status"] == "todo" else "running"] = row["n"]
    waiting = store.exec("SELECT count(*) AS n FROM runner_commands WHERE taken IS NULL").fetchone()["n"]
    return {
        "database": store.where,
        "schema_version": store.schema_version(),
        "processes": store.live_processes(),
        "commands_waiting": waiting,
        "workers": [{**w, "last_heartbeat": w["last_heartbeat"].isoformat()} for w in workers],
        "goals": goals,
        "checked": now(),
    }
