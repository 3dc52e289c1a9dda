"""The cluster engine (PostgreSQL store + Procrastinate) under load, each figure against a baseline measured in
the same run:
- 200 goals at once, 1 s model latency, 3 rounds, on 2 daemon processes, against the 2-process bare-httpx floor
  (REPEATS=3 alternated pairs; the median ratio);
- fire-to-start delay of 100 `every: 1s` entries on 2 daemons, and duplicate fires (target: p99 < 1 s, none);
- idle cost of 10,000 entries on each of 2 daemons (target: < 1% CPU, < 150 MB RSS each);
- `runner runs` on 100,000 runs, SQLite and PostgreSQL (target: < 0.5 s, the query plan uses an index).

The server: RUNNER_BENCH_DATABASE_URL, else postgresql://postgres@127.0.0.1:5432. Each benchmark makes and drops
its own database. Run: python benchmarks/bench_cluster.py [many] [delay] [idle] [runs]
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml
from bench_daemon import ROUNDS_SERVER, cpu_seconds, many_httpx, noop, project, rss_mb
from common import PYTHON

SERVER = os.environ.get("RUNNER_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432")


@contextmanager
def database() -> Iterator[str]:
    import psycopg

    name = f"runner_bench_{secrets.token_hex(4)}"
    with psycopg.connect(SERVER, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(SERVER)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(SERVER, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def on_postgres(root: Path, url: str) -> Path:
    settings = yaml.safe_load((root / "runner.yaml").read_text())
    (root / "runner.yaml").write_text(yaml.safe_dump({**settings, "store": url}))
    subprocess.run([PYTHON, "-m", "runner", "-C", str(root), "db", "migrate"], check=True, capture_output=True)
    return root


@contextmanager
def process(root: Path, command: str = "daemon") -> Iterator[subprocess.Popen]:
    """`runner daemon` or `runner worker`, started and ready; SIGTERM at the end."""
    proc = subprocess.Popen(
        [PYTHON, "-m", "runner", "-C", str(root), command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if f"{command} started" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(300):
            raise RuntimeError(f"runner {command} did not start")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def store(url: str) -> Any:
    from runner.store.postgres import PostgresStore

    return PostgresStore(url)


def many_goals(goals: int = 200, rounds: int = 3, latency: float = 1.0, daemons: int = 2) -> dict[str, Any]:
    server = subprocess.Popen(
        [PYTHON, "-c", ROUNDS_SERVER, str(rounds), str(latency)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as folder, database() as db:
            names = [f"g{i:03d}" for i in range(goals)]
            goal = {
                "prompt": "read note.txt",
                "tools": ["read_file"],
                "model": {"name": "m", "base_url": url, "api_key_env": None},
            }
            root = project(Path(folder), {n: goal for n in names}, [], {"max_concurrent_runs": goals // daemons})
            on_postgres(root, db)
            (root / "note.txt").write_text("a note\n")
            shared = store(db)
            with ExitStack() as stack:
                procs = [stack.enter_context(process(root)) for _ in range(daemons)]
                before = [cpu_seconds(p.pid) for p in procs]
                for name in names:
                    shared.send_command("trigger", name)
                deadline = time.monotonic() + 180
                while time.monotonic() < deadline:
                    runs = shared.runs()
                    if len(runs) == goals and all(r["ended"] for r in runs):
                        break
                    time.sleep(0.2)
                cpu = [cpu_seconds(p.pid) - b for p, b in zip(procs, before, strict=True)]
            runs = shared.runs()
            shared.close()
    finally:
        server.terminate()
        server.wait()
    starts = sorted(datetime.fromisoformat(r["started"]) for r in runs)
    ended = max(datetime.fromisoformat(r["ended"]) for r in runs if r["ended"])
    total = (ended - starts[0]).total_seconds()
    return {
        "goals": len(runs),
        "outcomes": ",".join(sorted({r["outcome"] for r in runs})),
        "total_s": round(total, 3),
        "start_spread_s": round((starts[-1] - starts[0]).total_seconds(), 3),
        "daemon_cpu_s": [round(c, 2) for c in cpu],
        "hosts_pids": len({r["pid"] for r in runs}),
    }


def start_delay(goals: int = 100, seconds: float = 20.0, daemons: int = 2) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder, database() as db:
        names = [f"noop{i:03d}" for i in range(goals)]
        root = project(
            Path(folder),
            {n: noop() for n in names},
            [{"goal": n, "every": "1s"} for n in names],
            {"max_concurrent_runs": goals},
        )
        on_postgres(root, db)
        with ExitStack() as stack:
            up = []
            for _ in range(daemons):
                stack.enter_context(process(root))
                up.append(datetime.now(timezone.utc))
            time.sleep(seconds)
        shared = store(db)
        events = shared.events("start")
        triggers = len(shared.events("trigger"))
        shared.close()
    fires = Counter((e["entry"], e["detail"]) for e in events if " due " in e["detail"])  # follow-ups have no due
    delays = sorted(
        (datetime.fromisoformat(e["at"]) - datetime.fromisoformat(e["detail"].split(" due ")[1])).total_seconds()
        for e in events
        if " due " in e["detail"]
    )
    p = lambda q: delays[min(len(delays) - 1, int(q * len(delays)))]  # noqa: E731
    # the first daemon fires every entry alone while the others start: the same figures for fires due 2 s
    # after the last daemon was ready, when all of them share the work
    steady_from = up[-1] + timedelta(seconds=2)
    steady = sorted(
        (datetime.fromisoformat(e["at"]) - due).total_seconds()
        for e in events
        if " due " in e["detail"] and (due := datetime.fromisoformat(e["detail"].split(" due ")[1])) >= steady_from
    )
    q = lambda x: steady[min(len(steady) - 1, int(x * len(steady)))] if steady else None  # noqa: E731
    return {
        "starts": len(delays),
        "follow_up_starts": sum(" due " not in e["detail"] for e in events),
        "triggers": triggers,
        "duplicate_fires": sum(n - 1 for n in fires.values()),
        "p50_s": round(p(0.50), 3),
        "p99_s": round(p(0.99), 3),
        "max_s": round(delays[-1], 3),
        "last_daemon_ready_after_s": round((up[-1] - up[0]).total_seconds(), 2),
        "steady_starts": len(steady),
        "steady_p50_s": round(q(0.50), 3) if steady else None,
        "steady_p99_s": round(q(0.99), 3) if steady else None,
    }


def idle(entries: int = 10_000, seconds: float = 60.0, daemons: int = 2, postgres: bool = True) -> dict[str, Any]:
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory())
        root = project(Path(folder), {"noop": noop()}, [], {})
        for i in range(100):  # 100 files: the loader's per-file entry ids stay short
            (root / "schedules" / f"s{i:02d}.yaml").write_text(
                yaml.safe_dump([{"goal": "noop", "every": "1h"}] * (entries // 100))
            )
        if postgres:
            on_postgres(root, stack.enter_context(database()))
        procs = [stack.enter_context(process(root)) for _ in range(daemons)]
        time.sleep(5)  # let start-up finish
        before = [cpu_seconds(p.pid) for p in procs]
        time.sleep(seconds)
        used = [cpu_seconds(p.pid) - b for p, b in zip(procs, before, strict=True)]
        rss = [rss_mb(p.pid) for p in procs]
    return {
        "entries": entries,
        "idle_s": seconds,
        "cpu_percent": [round(100 * u / seconds, 3) for u in used],
        "rss_mb": [round(r, 1) for r in rss],
    }


def many_runs(count: int = 100_000) -> dict[str, Any]:
    """`runner runs` (newest 20) on COUNT runs in each store: the command's wall time and the query plan."""
    from runner.store import SqliteStore

    rows = [
        (f"20260101-{i:06d}-000000", f"goal{i % 50}", "every", "achieved", f"2026-01-01T00:00:00.{i:06d}+00:00")
        for i in range(count)
    ]
    result: dict[str, Any] = {"runs": count}
    with tempfile.TemporaryDirectory() as folder:
        root = project(Path(folder), {"noop": noop()}, [], {})
        sqlite = SqliteStore(root / ".runner")
        sqlite.db.executemany("INSERT INTO runs (id, goal, trigger, outcome, started) VALUES (?, ?, ?, ?, ?)", rows)
        plan = sqlite.db.execute("EXPLAIN QUERY PLAN SELECT * FROM runs ORDER BY started DESC, rowid DESC LIMIT 20")
        result["sqlite_plan"] = " / ".join(r[3] for r in plan.fetchall())
        result["sqlite_query_s"] = _query_time(sqlite)
        result["sqlite_command_s"] = _command_time(root)
        with database() as db:
            on_postgres(root, db)
            pg = store(db)
            with pg.db.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO runner_runs (id, goal, trigger, outcome, started) VALUES (%s, %s, %s, %s, %s)", rows
                )
            pg.exec("ANALYZE runner_runs")
            plan = pg.exec("EXPLAIN SELECT * FROM runner_runs ORDER BY started DESC, id DESC LIMIT 20").fetchall()
            result["postgres_plan"] = " / ".join(r["QUERY PLAN"].strip() for r in plan)
            result["postgres_query_s"] = _query_time(pg)
            result["postgres_command_s"] = _command_time(root)
            result["bare_command_s"] = _command_time(root, "--version")
            pg.close()
    return result


def _query_time(store: Any, reps: int = 5) -> float:
    """The median time of what `runner runs` asks the store: interrupted runs, then the newest 20."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        store.mark_interrupted()
        store.runs(None, 20)
        times.append(time.perf_counter() - started)
    return round(sorted(times)[len(times) // 2], 4)


def _command_time(root: Path, command: str = "runs", reps: int = 5) -> float:
    """The median wall time of `runner runs` (a new process each time, as a person types it)."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        subprocess.run([PYTHON, "-m", "runner", "-C", str(root), command], check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return round(sorted(times)[len(times) // 2], 3)


if __name__ == "__main__":
    import bench_daemon

    which = sys.argv[1:] or ["many", "delay", "idle", "runs"]
    if "many" in which:
        # the floor and runner alternated REPEATS times: one pair varies by +-0.05 on a shared 2-core machine
        pairs = []
        for _ in range(int(os.environ.get("REPEATS", "3"))):
            floor = many_httpx(processes=2)
            cluster = many_goals()
            pairs.append({"floor_2_processes_s": round(floor["total_s"], 3), **cluster})
            pairs[-1]["ratio"] = round(cluster["total_s"] / floor["total_s"], 3)
        ratios = sorted(pair["ratio"] for pair in pairs)
        print(
            json.dumps({"benchmark": "many", "ratio_median": ratios[len(ratios) // 2], "ratios": ratios, "runs": pairs})
        )
    if "delay" in which:
        local = bench_daemon.start_delay()
        print(json.dumps({"benchmark": "delay", "sqlite_one_daemon": local, "postgres_two_daemons": start_delay()}))
    if "idle" in which:
        local = idle(daemons=1, postgres=False)
        print(json.dumps({"benchmark": "idle", "sqlite_one_daemon": local, "postgres_two_daemons": idle()}))
    if "runs" in which:
        print(json.dumps({"benchmark": "runs", **many_runs()}))
