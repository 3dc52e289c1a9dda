"""More than one machine: the PostgreSQL store and Procrastinate daemons and workers, against a real server.

Several `runner daemon` and `runner worker` processes share one project and one database; each guarantee
is read back from the store. The server: RUNNER_TEST_DATABASE_URL, else 127.0.0.1:5432 (skipped without
one, failed under CI=true).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from cluster_helpers import ClusterProcess, fresh_database, server_url, use_store
from daemon_helpers import monitor, schedule
from support import call

from runner.schedule.cluster import ALREADY_QUEUED, INTERRUPTED_WITHIN, SPREAD, phase
from runner.store.pgconnect import HOST
from runner.store.postgres import PostgresStore

pytestmark = pytest.mark.timeout(600)  # several daemon processes each start in a few seconds, in minutes under load


@pytest.fixture
def url(proj):
    with fresh_database(server_url()) as database:
        use_store(proj, database, poll_interval=0.1)
        yield database


@pytest.fixture
def db(proj, url):
    """A migrated database."""
    result = proj.subprocess("db", "migrate")
    assert result.returncode == 0, result.stderr
    return url


@pytest.fixture
def cluster(proj):
    started: list[ClusterProcess] = []

    def start(command: str = "daemon", *args: str, root=None) -> ClusterProcess:
        process = ClusterProcess(root or proj.root, _url(proj), command, *args)
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()


def _url(proj) -> str:
    import yaml

    return yaml.safe_load((proj.root / "runner.yaml").read_text())["store"]


def spans(runs: list[dict]) -> list[tuple[datetime, datetime]]:
    return sorted((datetime.fromisoformat(r["started"]), datetime.fromisoformat(r["ended"])) for r in runs)


def test_schema_is_migrated_once_and_the_daemon_refuses_a_database_behind(proj, url):
    monitor(proj, "ping")
    refused = proj.subprocess("daemon", timeout=60)
    assert refused.returncode == 3
    assert "run `runner db migrate`" in refused.stderr and "Traceback" not in refused.stderr
    assert "runner.yaml: store: " in refused.stderr  # the setting to look at
    first = proj.subprocess("db", "migrate")
    assert "applied Procrastinate schema" in first.stdout
    assert "applied runner schema version 1" in first.stdout and "applied runner schema version 2" in first.stdout
    again = proj.subprocess("db", "migrate")
    assert again.returncode == 0 and "is up to date" in again.stdout
    status = proj.subprocess("db", "status")
    assert status.returncode == 0 and "workers alive: 0" in status.stdout and "schema version 2" in status.stdout
    store = PostgresStore(url)
    store.exec("INSERT INTO runner_schema VALUES (99, 'a newer runner')")
    store.close()
    for command in (("db", "migrate"), ("runs",)):  # a newer schema is never called up to date, nor read
        newer = proj.subprocess(*command)
        assert newer.returncode == 3 and "newer than this runner knows" in newer.stderr, command
        assert "upgrade runner" in newer.stderr and "up to date" not in newer.stdout


def test_a_follow_up_waiting_on_its_goals_lock_is_announced_when_the_run_ends(proj, db):
    """Procrastinate tells workers of new jobs only; a follow-up whose goal's run just ended must not wait for
    their next poll (JOB_POLL seconds), so the database announces it on the channel the workers listen to."""
    import psycopg

    with psycopg.connect(db, autocommit=True) as listener, psycopg.connect(db, autocommit=True) as conn:
        listener.execute("LISTEN procrastinate_any_queue_v1")
        insert = (
            "INSERT INTO procrastinate_jobs (queue_name, task_name, lock, queueing_lock, args, status)"
            " VALUES ('default', 'runner.run', %s, %s, '{}', %s) RETURNING id"
        )
        running = conn.execute(insert, ("g", None, "doing")).fetchone()[0]
        other = conn.execute(insert, ("h", None, "doing")).fetchone()[0]
        waiting = conn.execute(insert, ("g", "g", "todo")).fetchone()[0]
        list(listener.notifies(timeout=0.5))  # the insert's own notice
        conn.execute("SELECT procrastinate_finish_job_v1(%s, 'succeeded', false)", (other,))
        assert list(listener.notifies(timeout=0.5)) == []  # nothing waits on h's lock
        conn.execute("SELECT procrastinate_finish_job_v1(%s, 'succeeded', true)", (running,))
        notices = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert notices == [f'{{"type" : "job_inserted", "job_id" : {waiting}}}']


def test_the_cluster_connections_wake_only_for_the_server_and_still_answer_at_once(url):
    """Every cluster process keeps a LISTEN open; psycopg's waits wake every 0.1 s to look for a Ctrl-C, a third
    of an idle process's CPU. runner's connections wait WAKE seconds instead: a notification, a cancellation
    and a query must still end a wait at once."""
    import asyncio
    import contextlib

    import psycopg

    from runner.store.pgconnect import WAKE, quiet_connection

    def notify() -> None:
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("NOTIFY runner_test, 'hi'")

    async def scenario() -> tuple[float, str, float]:
        async with await quiet_connection().connect(url, autocommit=True) as conn:
            assert (await (await conn.execute("SELECT 41 + 1")).fetchone()) == (42,)
            await conn.execute("LISTEN runner_test")
            loop = asyncio.get_running_loop()
            looks = 0
            add_reader = loop.add_reader

            def counted(*args: Any) -> Any:  # psycopg asks the loop to watch the socket again at every wake-up
                nonlocal looks
                looks += 1
                return add_reader(*args)

            loop.add_reader = counted  # type: ignore[method-assign]
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(anext(conn.notifies()), 1.0)  # a second with nothing to hear
            loop.add_reader = add_reader  # type: ignore[method-assign]
            assert looks <= 2, f"the idle LISTEN woke {looks} times in a second"
            started = loop.time()
            loop.call_later(0.3, notify)
            notice = await anext(conn.notifies())
            delivered = loop.time() - started
            waiting = asyncio.create_task(anext(conn.notifies()))
            await asyncio.sleep(0.3)
            cancelled_at = loop.time()
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            return delivered, notice.payload, loop.time() - cancelled_at

    delivered, payload, cancelled = asyncio.run(scenario())
    assert WAKE >= 5 and payload == "hi"
    assert delivered < 2 and cancelled < 2  # far under WAKE: the server and the loop end a wait, not a timer


def test_the_queue_sends_one_statement_per_query_and_replaces_a_connection_the_server_dropped(url, monkeypatch):
    """Procrastinate's pool checked every connection it handed out and wrapped each statement in BEGIN/COMMIT:
    four round trips a query. runner's queue sends the statement alone and checks a connection only after it
    rested RECHECK_AFTER seconds or when the server let it go (then it is replaced, not an error)."""
    import asyncio

    import psycopg
    from psycopg_pool import AsyncConnectionPool

    from runner.schedule import jobs

    monkeypatch.setattr(jobs, "RECHECK_AFTER", 0.5)
    checks = 0
    check = AsyncConnectionPool.check_connection

    async def counted(connection: Any) -> None:
        nonlocal checks
        checks += 1
        await check(connection)

    monkeypatch.setattr(AsyncConnectionPool, "check_connection", staticmethod(counted))

    async def scenario() -> tuple[list[Any], int, int, int]:
        app = jobs.make_app(url)
        async with app.open_async():
            connector = app.connector
            pids = [(await connector.execute_query_one_async("SELECT pg_backend_pid() AS pid"))["pid"]]
            await connector.execute_query_async("CREATE TABLE alone (n integer)")
            for _ in range(20):  # VACUUM refuses to run inside a transaction block
                await connector.execute_query_async("VACUUM alone")
            quick = checks
            with psycopg.connect(url, autocommit=True) as admin:  # a restart, for this database
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            await asyncio.sleep(0.2)  # under RECHECK_AFTER: the pool sees the server's goodbye on the socket
            pids.append((await connector.execute_query_one_async("SELECT pg_backend_pid() AS pid"))["pid"])
            await asyncio.sleep(0.6)
            rested = checks
            await connector.execute_query_async("SELECT 1")
            return pids, quick, rested, checks

    pids, quick, dropped, rested = asyncio.run(scenario())
    assert quick == 0, f"{quick} checks for 22 queries in a row"
    assert dropped >= 1 and pids[1] != pids[0]  # looked at, found gone, replaced: no error
    assert rested > dropped  # a connection that rested is asked once more


def test_the_breakers_count_goes_up_in_one_statement_and_a_queued_reset_lands_first(db):
    """A good run's reset is queued (no round trip); a failure counts in one statement after what was queued."""
    store = PostgresStore(db)
    assert [store.count_failure("main/a/every") for _ in range(3)] == [1, 2, 3]
    store.reset_failures("main/a/every")
    assert store.count_failure("main/a/every") == 1
    store.reset_failures("main/new/every")  # an entry that never failed has no row to change
    store.flush()
    assert store.entry("main/a/every")["failures"] == 1 and store.entry("main/new/every")["failures"] == 0
    store.close()


def test_a_unreachable_server_is_one_line_naming_the_setting_without_the_password(proj):
    use_store(proj, "postgresql://someone:hunter2@127.0.0.1:9/nowhere")
    result = proj.subprocess("runs")
    assert result.returncode == 3
    assert "runner.yaml: store: cannot reach the PostgreSQL store postgresql://someone:***@127.0.0.1:9/nowhere" in (
        result.stderr
    )
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr
    use_store(proj, "postgresql://someone@127.0.0.1:9/nowhere?sslmode=disable&password=hunter2&%70assword=hunter2")
    result = proj.subprocess("db", "status")
    assert result.returncode == 3 and "nowhere?sslmode=disable&password=***&%70assword=***" in result.stderr
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr


def test_history_and_transcripts_live_in_the_database(proj, server, db):
    server.add({"tool_calls": [call("write_file", path="a.txt", content="hi")]}, {"content": "done"})
    proj.goal("write", prompt="write a.txt", verify={"checks": [{"run": "test -f a.txt"}]})
    result = proj.cli_json("goal", "write")
    assert result["outcome"] == "achieved", result
    shutil.rmtree(proj.root / ".runner", ignore_errors=True)  # nothing of it is on this machine's disk
    shown = proj.cli_json("show", result["run_id"])
    assert [e["kind"] for e in shown["transcript"]][:1] == ["run"]
    assert any(e["kind"] == "check" and e["passed"] for e in shown["transcript"])
    assert shown["checks"][0]["passed"] == 1
    listed = proj.subprocess("runs", "--json")
    assert '"outcome": "achieved"' in listed.stdout


def test_transcript_rows_with_any_text_read_back_as_written(db):
    """The writer sends transcript rows with COPY: tabs, newlines, backslashes, COPY's own end marker and
    NULL spelling, quotes, a NUL, non-ASCII and a long text come back unchanged and in order, beside the run's
    other writes."""
    hostile = ["a\tb\nc\r\n", "back\\slash \\N \\.", "\\.", "\\N", "'\";--", "nul\x00byte", "é 漢字 🙂", ""]
    hostile.append("long " * 14_000)
    store = PostgresStore(db)
    try:
        run_id = store.new_run("g", "manual")
        transcript = store.transcript(run_id)
        for i, text in enumerate(hostile):
            transcript.append("message", {"i": i, "content": text})
            store.update_run(run_id, tokens=i)
        store.finish_run(run_id, "achieved")
        events = store.transcript_events(run_id)
        run = store.run(run_id)
    finally:
        store.close()
    assert [e["content"] for e in events] == hostile
    assert [e["i"] for e in events] == list(range(len(hostile)))
    assert run["outcome"] == "achieved" and run["tokens"] == len(hostile) - 1


def test_three_daemons_fire_each_interval_once_and_a_goal_never_overlaps(proj, db, cluster):
    monitor(proj, "tick")
    monitor(proj, "slow", check="sleep 1.2")
    schedule(proj, {"goal": "tick", "every": "1s"}, {"goal": "slow", "every": "0.5s"})
    daemons = [cluster("daemon") for _ in range(3)]
    store = daemons[0].store()
    daemons[0].wait_for("6 tick runs", lambda: len([r for r in store.runs("tick") if r["ended"]]) >= 6)
    daemons[0].wait_for("3 slow runs", lambda: len([r for r in store.runs("slow") if r["ended"]]) >= 3)
    for daemon in daemons:
        assert daemon.stop() == 0
    fires = Counter((e["entry"], e["detail"]) for e in store.events("start") if " due " in e["detail"])
    assert fires and max(fires.values()) == 1  # each (entry, fire time) started once, by one of three daemons
    triggers = len([e for e in store.events("trigger") if e["goal"] == "tick"])
    skips = len([e for e in store.events("skip") if e["goal"] == "tick"])
    runs = len(store.runs("tick"))
    assert runs + skips <= triggers <= runs + skips + 1  # each trigger ran or was skipped (one may wait in the queue)
    slow = spans([r for r in store.runs("slow") if r["ended"]])
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(slow))  # one at a time
    skips = [e["detail"] for e in store.events("skip") if e["goal"] == "slow"]
    assert "a run is already queued (one follow-up at most)" in skips  # collapsed triggers are recorded
    queued = [e["detail"] for e in store.events("queued") if e["goal"] == "slow"]
    assert "the goal is running; one follow-up run queued" in queued  # the claim saw the goal's run
    assert {r["outcome"] for r in store.runs()} == {"satisfied"}


@pytest.mark.slow
def test_cron_and_every_for_a_minute_with_three_daemons_without_a_duplicate(proj, db, cluster):
    monitor(proj, "minutely")
    monitor(proj, "second")
    schedule(proj, {"goal": "minutely", "cron": "* * * * *"}, {"goal": "second", "every": "1s"})
    daemons = [cluster("daemon") for _ in range(3)]
    store = daemons[0].store()
    daemons[0].wait_for("a cron run", lambda: store.runs("minutely"), timeout=75)
    # the minute may turn a few seconds after the daemons start: wait for ten `every` fires as well
    daemons[0].wait_for("ten every fires", lambda: len(store.runs("second")) >= 11, timeout=60)
    time.sleep(1.5)
    for daemon in daemons:
        assert daemon.stop() == 0
    starts = Counter((e["entry"], e["detail"]) for e in store.events("start") if " due " in e["detail"])
    assert max(starts.values()) == 1
    assert len(store.runs("minutely")) == 1
    seconds = [e["detail"] for e in store.events("start") if e["goal"] == "second" and " due " in e["detail"]]
    assert len(seconds) == len(set(seconds)) >= 10


def test_catch_up_after_every_daemon_was_down_runs_once(proj, db, cluster):
    monitor(proj, "nightly")
    schedule(proj, {"goal": "nightly", "every": "1h", "misfire_grace": "10m"})
    store = PostgresStore(db)
    store.update_entry("main/nightly/every", last_fire=datetime.now(timezone.utc) - timedelta(hours=1, minutes=2))
    daemons = [cluster("daemon") for _ in range(3)]
    daemons[0].wait_for("the catch-up run", lambda: [r for r in store.runs() if r["ended"]])
    time.sleep(1)
    for daemon in daemons:
        assert daemon.stop() == 0
    assert [r["trigger"] for r in store.runs()] == ["catch_up"]
    assert len(store.events("catch_up")) == 1


def test_pause_resume_and_the_circuit_breaker_hold_cluster_wide(proj, db, cluster):
    monitor(proj, "flaky", check="false")
    schedule(proj, {"goal": "flaky", "every": "0.5s", "pause_after": 2})
    daemons = [cluster("daemon"), cluster("daemon")]
    store = daemons[0].store()
    daemons[0].wait_for("the breaker", lambda: store.events("paused"))
    time.sleep(1.5)
    assert len(store.runs()) == 2  # paused after 2 runs not achieved, whichever daemon ran them
    assert any("paused" in e["detail"] for e in store.events("skip"))
    resumed = proj.subprocess("resume", "flaky")
    assert resumed.returncode == 0
    daemons[0].wait_for("runs after resume", lambda: len(store.runs()) >= 3)
    proj.subprocess("pause", "flaky")
    time.sleep(1.5)
    count = len(store.runs())
    time.sleep(1.5)
    assert len(store.runs()) == count
    for daemon in daemons:
        assert daemon.stop() == 0


def test_runner_trigger_reaches_one_daemon_of_many(proj, db, cluster):
    monitor(proj, "manual")
    daemons = [cluster("daemon"), cluster("daemon")]
    sent = proj.subprocess("trigger", "manual")
    assert sent.returncode == 0 and "triggered manual: a daemon runs it" in sent.stdout
    assert all(f":{daemon.proc.pid}" in sent.stdout for daemon in daemons)  # who may take it, by host:pid
    store = daemons[0].store()
    daemons[0].wait_for("the run", lambda: [r for r in store.runs() if r["ended"]])
    time.sleep(1)
    assert [r["trigger"] for r in store.runs()] == ["manual"]
    for daemon in daemons:
        assert daemon.stop() == 0


def test_who_is_connected_decides_what_trigger_list_and_db_status_say(proj, db, cluster):
    """No daemon connected: a trigger is queued at once, exit 0, and `list` says no daemon runs; with a daemon
    and a worker, each is named by host:pid; a daemon killed with -9 is gone from the list at once."""
    monitor(proj, "manual")
    schedule(proj, {"goal": "manual", "every": "1h"})
    use_store(proj, f"{db}?application_name=runner%20daemon%20fake:1")  # the command's own session is no daemon
    queued = proj.subprocess("trigger", "manual")
    assert queued.returncode == 0 and "queued manual: no daemon is running now" in queued.stdout
    listed = proj.subprocess("list", "--json")
    hourly = next(row for row in json.loads(listed.stdout) if row["entry"])
    fire = datetime.fromisoformat(hourly["next_fire"])  # on the cluster's grid, not "after the daemon starts"
    assert timedelta(0) < fire - datetime.now(timezone.utc) <= timedelta(hours=1)
    assert json.loads(proj.subprocess("list", "--json").stdout) == json.loads(listed.stdout)  # the same each time
    assert "daemon: not running" in proj.subprocess("list").stdout
    status = proj.subprocess("db", "status")
    assert "commands waiting for a daemon: 1" in status.stdout

    use_store(proj, db)
    daemon, worker = cluster("daemon"), cluster("worker")
    store = daemon.store()
    daemon.wait_for("the queued trigger's run", lambda: [r for r in store.runs("manual") if r["ended"]])
    assert f"daemon: running (1: {HOST}:{daemon.proc.pid})" in proj.subprocess("list").stdout
    report = json.loads(proj.subprocess("db", "status", "--json").stdout)
    assert sorted((p["role"], p["where"]) for p in report["processes"]) == [
        ("daemon", f"{HOST}:{daemon.proc.pid}"),
        ("worker", f"{HOST}:{worker.proc.pid}"),
    ]
    assert report["commands_waiting"] == 0
    daemon.proc.kill()
    daemon.proc.wait()
    daemon.wait_for(
        "the killed daemon's sessions to end", lambda: "daemon: not running" in proj.subprocess("list").stdout
    )
    again = proj.subprocess("trigger", "manual")
    assert (
        again.returncode == 0 and "queued manual: no daemon is running now" in again.stdout
    )  # the worker is no daemon
    assert worker.stop() == 0


def test_a_trigger_reaches_the_daemons_at_once_not_at_their_next_poll(proj, db, cluster):
    """A command's notice (LISTEN/NOTIFY) wakes the daemons: triggers run within seconds although the daemons
    poll only every two minutes: the first sent while they may not listen yet, the second after a run, the
    third after the server dropped every connection (they listen again)."""
    import psycopg

    monitor(proj, "manual")
    use_store(proj, db, poll_interval=120)
    daemons = [cluster("daemon"), cluster("daemon")]
    store = daemons[0].store()
    for sent in (1, 2, 3):
        if sent == 3:
            with psycopg.connect(db, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
        began = time.monotonic()
        trigger = proj.subprocess("trigger", "manual")  # waits until a daemon took it (here up to 8 minutes)
        assert trigger.returncode == 0 and "a daemon runs it" in trigger.stdout, trigger.stderr
        daemons[0].wait_for(f"run {sent}", lambda n=sent: len([r for r in store.runs() if r["ended"]]) == n, 30)
        assert time.monotonic() - began < 30, "the trigger waited for the poll"
    assert [r["trigger"] for r in store.runs()] == ["manual"] * 3
    for daemon in daemons:
        assert daemon.stop() == 0


def test_a_daemon_goes_on_after_the_server_dropped_every_connection(proj, db, cluster):
    """A PostgreSQL restart under a daemon left alone: its store and queue connect again, and the next trigger
    runs (the daemon used to stay up but fail every poll on its closed connection, and stop taking triggers)."""
    import psycopg

    monitor(proj, "manual")
    daemon = cluster("daemon")
    store = daemon.store()
    assert proj.subprocess("trigger", "manual").returncode == 0
    daemon.wait_for("the first run", lambda: [r for r in store.runs() if r["ended"]])
    with psycopg.connect(db, autocommit=True) as admin:
        gone = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()[0]
    assert gone >= 3  # the daemon's store, writer and queue connections, and the test's own store
    time.sleep(0.3)
    assert proj.subprocess("trigger", "manual").returncode == 0
    runs = daemon.wait_for("the run after the drop", lambda: [r for r in daemon.store().runs() if r["ended"]][1:])
    assert runs[0]["outcome"] == "satisfied"
    assert daemon.stop() == 0


def test_a_burst_of_triggers_in_one_poll_is_one_job_per_goal_and_every_extra_one_a_recorded_skip(proj, db, cluster):
    """The fires of one poll are deferred together (one look at the jobs, one INSERT): a goal triggered three
    times in it gets one job, and the other two are skips with the reason, as one at a time would give."""
    for name in ("a", "b", "c"):
        monitor(proj, name)
    store = PostgresStore(db)
    for name in ("a", "b", "a", "c", "a", "c"):
        store.send_command("trigger", name)
    daemon = cluster("daemon")
    daemon.wait_for("three runs", lambda: len([r for r in store.runs() if r["ended"]]) == 3)
    time.sleep(1)
    assert sorted(r["goal"] for r in store.runs()) == ["a", "b", "c"]
    skips = Counter(e["goal"] for e in store.events("skip") if "already queued" in e["detail"])
    assert skips == {"a": 2, "c": 1}
    assert daemon.stop() == 0
    store.close()


def test_a_batch_that_races_another_daemon_defers_the_rest_one_by_one(proj, db):
    """Between the look at the jobs and the INSERT another daemon may queue one of the goals: the batch's
    INSERT is refused as a whole, so each job is deferred on its own and only the raced one is a skip."""
    import asyncio

    from runner.schedule.cluster import Cluster

    for name in ("a", "b"):
        monitor(proj, name)

    async def burst() -> None:
        cluster = Cluster(proj.root)
        async with cluster.queue.open_async():
            other = cluster.queue.configure_task("runner.run", lock="a", queueing_lock="a")
            await other.defer_async(goal="a", entry_id=None, trigger="manual", digest="x", due=None, context=None)

            async def before_the_other_insert(goals: set[str]) -> dict[str, set[str]]:
                return {}  # the look happened before the other daemon's INSERT

            cluster.jobs_of_goals = before_the_other_insert
            cluster.start(None, "manual", "a", None, None)
            cluster.start(None, "manual", "b", None, None)
            await asyncio.gather(*cluster.deferring)
        cluster.store.close()

    asyncio.run(burst())
    store = PostgresStore(db)
    queued = store.exec("SELECT lock FROM procrastinate_jobs ORDER BY id", after_writes=False).fetchall()
    assert [r["lock"] for r in queued] == ["a", "b"]
    assert [(e["goal"], e["detail"]) for e in store.events("skip")] == [("a", ALREADY_QUEUED)]
    assert store.events("error") == []
    store.close()


def test_approval_answered_from_the_command_line(proj, db, cluster):
    proj.goal("gate", prompt="p", verify={"checks_first": True, "checks": [{"run": "true"}, {"approve": "ship it?"}]})
    daemon = cluster("daemon")
    assert proj.subprocess("trigger", "gate").returncode == 0
    store = daemon.store()
    run = daemon.wait_for(
        "a run awaiting approval", lambda: [r for r in store.runs() if r["outcome"] == "awaiting_approval"]
    )
    answered = proj.subprocess("approve", run[0]["id"])
    assert answered.returncode == 0, answered.stderr
    daemon.wait_for("satisfied", lambda: store.run(run[0]["id"])["outcome"] == "satisfied")
    assert daemon.stop() == 0


def test_sigterm_drains_then_cancels(proj, db, cluster):
    monitor(proj, "long", check="sleep 77.25")
    use_store(proj, db, poll_interval=0.1, shutdown_grace=1)
    daemon = cluster("daemon")
    proj.subprocess("trigger", "long")
    daemon.wait_log("start     long")
    time.sleep(0.3)
    assert daemon.stop() == 0
    assert [r["outcome"] for r in daemon.store().runs()] == ["cancelled"]
    assert "sleep 77.25" not in os.popen("ps -eo args").read()


def test_a_worker_with_a_different_or_missing_goal_file_ends_the_run_error(proj, db, cluster, tmp_path_factory):
    monitor(proj, "hog", check="while [ ! -e released ]; do sleep 0.1; done")  # holds the slot until released
    monitor(proj, "edited")
    monitor(proj, "gone")
    use_store(proj, db, poll_interval=0.1, max_concurrent_runs=1)
    other = tmp_path_factory.mktemp("other-machine")
    shutil.copytree(proj.root, other, dirs_exist_ok=True)
    (other / "goals" / "edited.yaml").write_text((other / "goals" / "edited.yaml").read_text() + "\n# changed here\n")
    (other / "goals" / "gone.yaml").unlink()
    daemon = cluster("daemon")
    proj.subprocess("trigger", "hog")
    daemon.wait_log("start     hog")  # the daemon's only slot is taken: the worker gets the next run
    worker = cluster("worker", root=other)
    proj.subprocess("trigger", "edited")
    store = daemon.store()
    run = daemon.wait_for("the refused run", lambda: [r for r in store.runs("edited") if r["ended"]])[0]
    assert run["outcome"] == "error"
    assert "goals/edited.yaml" in run["error"] and "differs from the copy the scheduler read" in run["error"]
    proj.subprocess("trigger", "gone")  # a goal this checkout lacks: a run that says so, not a silent skip
    run = daemon.wait_for("the run of a missing goal", lambda: [r for r in store.runs("gone") if r["ended"]])[0]
    assert run["outcome"] == "error" and "goals/gone.yaml is missing" in run["error"]
    assert "update this machine's checkout" in run["error"]
    (proj.root / "released").touch()
    assert worker.stop() == 0 and daemon.stop() == 0


@pytest.mark.slow
def test_kill_9_of_a_worker_interrupts_its_run_retries_once_and_reaps_its_processes(proj, db, cluster):
    monitor(proj, "fragile", check="test -f once || { touch once; sleep 31.5; }")
    at = (datetime.now(timezone.utc) + timedelta(seconds=3)).isoformat()
    schedule(proj, {"goal": "fragile", "at": at, "retry_interrupted": True})
    worker = cluster("worker")
    daemon = cluster("daemon")
    store = daemon.store()
    first = daemon.wait_for("the run", lambda: store.runs("fragile"))[0]
    victim = next(p for p in (worker, daemon) if p.proc.pid == first["pid"])
    survivor = daemon if victim is worker else worker
    time.sleep(0.5)
    victim.stop(signal.SIGKILL)
    killed = time.monotonic()
    assert "sleep 31.5" in os.popen("ps -eo args").read()  # kill -9 leaves the check running
    survivor.wait_for(
        "interrupted", lambda: store.run(first["id"])["outcome"] == "interrupted", timeout=INTERRUPTED_WITHIN + 10
    )
    print(f"interrupted {time.monotonic() - killed:.1f}s after kill -9 (bound {INTERRUPTED_WITHIN:g}s)")
    retried = survivor.wait_for(
        "the retry", lambda: [r for r in store.runs("fragile") if r["trigger"] == "retry" and r["ended"]]
    )
    assert retried[0]["outcome"] == "satisfied"
    assert len(store.runs("fragile")) == 2  # retried once, not more
    again = cluster("worker")  # a worker starting on this machine kills what the dead run left
    again.wait_for("the orphan killed", lambda: "sleep 31.5" not in os.popen("ps -eo args").read(), timeout=10)
    assert again.stop() == 0 and survivor.stop() == 0


def test_every_entries_fire_at_a_phase_of_their_own_the_same_on_every_daemon():
    """A hundred entries of one interval spread over it (at most SPREAD seconds), each at a fixed place."""
    from runner.config import Entry

    seconds = [phase(Entry(id=f"s.yaml#{i}", goal="g", every=1)) for i in range(100)]
    assert all(0 <= s < 1 for s in seconds) and len(set(seconds)) > 90
    assert sum(s < 0.5 for s in seconds) in range(35, 66)  # spread, not bunched
    assert phase(Entry(id="s.yaml#7", goal="g", every=1)) == seconds[7]  # the same wherever it is computed
    hourly = [phase(Entry(id=f"h#{i}", goal="g", every=3600)) for i in range(50)]
    assert max(hourly) < SPREAD and max(hourly) > SPREAD / 2
