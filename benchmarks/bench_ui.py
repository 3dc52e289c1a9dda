"""Dashboard server time with 100,000 runs in the store: the runs page and a run page of 200 steps.

    python3 benchmarks/bench_ui.py [--runs 100000] [--reps 200]

"Server time" is the ASGI app's own time for one request, from the call to the last byte handed to
the server (no socket, no browser). The store is filled in one SQLite transaction (setup only; the
pages read it through the store's public methods). Target: p95 < 100 ms for both pages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from runner.config import load_project
from runner.store import open_store
from runner.ui import create_app

GOALS = [f"goal-{i:02d}" for i in range(10)]
OUTCOMES = ["achieved"] * 6 + ["not_achieved", "stuck", "error", "satisfied"]
STEPS = 200


def make_project(root: Path, runs: int) -> str:
    """A project of 10 goals, `runs` runs over the last 90 days, and one run of 200 steps; its id."""
    (root / "goals").mkdir()
    (root / "runner.yaml").write_text("model: {name: bench, base_url: 'http://127.0.0.1:9/v1'}\n")
    for goal in GOALS:
        (root / "goals" / f"{goal}.yaml").write_text(f"prompt: do {goal}\nverify: {{checks: [{{run: 'true'}}]}}\n")
    (root / "schedules").mkdir()
    (root / "schedules" / "all.yaml").write_text("".join(f"- goal: {g}\n  every: 15m\n" for g in GOALS))
    store = open_store(load_project(root))
    _fill(store, runs)
    return _long_run(store)


def _fill(store: Any, runs: int) -> None:
    rng = random.Random(7)
    start = time.time() - 90 * 86400
    rows = []
    for i in range(runs):
        began = start + i * (90 * 86400 / runs)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(began)) + ".000+00:00"
        ended = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(began + 40)) + ".000+00:00"
        tokens = rng.randint(1_000, 60_000)
        rows.append(
            (f"bench-{i:06d}", GOALS[i % 10], "cron", rng.choice(OUTCOMES), 1, 5, tokens, stamp, ended, tokens * 1e-6)
        )
    db = store.db  # setup only: one transaction instead of 100,000 commits
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO runs (id, goal, trigger, outcome, attempts, steps, tokens, started, ended, cost)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    db.execute("COMMIT")


def _long_run(store: Any) -> str:
    run_id = store.new_run(GOALS[0], "manual")
    transcript = store.transcript(run_id)
    transcript.append("run", {"run_id": run_id, "goal": GOALS[0], "trigger": "manual"})
    transcript.append("message", {"message": {"role": "system", "content": "You are an agent."}})
    transcript.append("message", {"message": {"role": "user", "content": "Fix the build."}})
    transcript.append("attempt", {"attempt": 1, "of": 3})
    output = "\n".join(f"tests/test_{i}.py::test_case PASSED" for i in range(60))
    for step in range(1, STEPS + 1):
        call = {
            "id": f"call_{step}",
            "type": "function",
            "function": {"name": "shell", "arguments": json.dumps({"command": f"pytest -q tests/{step}"})},
        }
        transcript.append("step", {"step": step})
        usage = {"prompt_tokens": 1000 + step * 50, "completion_tokens": 40, "total_tokens": 1040 + step * 50}
        transcript.append("reply", {"step": step, "finish_reason": "tool_calls", "usage": usage, "cost": 0.0004})
        message = {"role": "assistant", "content": f"Step {step}: run the tests.", "tool_calls": [call]}
        transcript.append("message", {"message": message})
        transcript.append(
            "tool_call", {"step": step, "id": call["id"], "name": "shell", "summary": f"shell: pytest {step}"}
        )
        transcript.append(
            "tool_result",
            {
                "step": step,
                "id": call["id"],
                "name": "shell",
                "summary": f"shell: pytest {step}",
                "output": output,
                "duration_s": 0.8,
            },
        )
        transcript.append("message", {"message": {"role": "tool", "tool_call_id": call["id"], "content": output}})
    transcript.append("stopped", {"reason": "max_steps", "steps": STEPS, "tokens": 1_200_000, "error": None})
    transcript.append(
        "check",
        {
            "attempt": 1,
            "name": "build",
            "check_kind": "run",
            "passed": True,
            "command": "make",
            "exit_code": 0,
            "output": "ok",
            "duration_s": 1.0,
        },
    )
    transcript.close()
    store.finish_run(run_id, "achieved", attempts=1, steps=STEPS, tokens=1_200_000)
    return run_id


async def server_time(app: Any, path: str) -> tuple[float, float, int]:
    """Seconds the app spends on one GET (wall, and CPU of this process), and the status it answered."""
    raw_path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": raw_path,
        "raw_path": raw_path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8788")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8788),
    }
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    started, cpu = time.perf_counter(), time.process_time()
    await app(scope, receive, send)
    return time.perf_counter() - started, time.process_time() - cpu, status


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def run(runs: int = 100_000, reps: int = 200) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        long_run = make_project(root, runs)
        app = create_app(load_project(root))
        pages = {
            "runs page": "/runs",
            "runs page, goal + outcome": "/runs?goal=goal-03&outcome=not_achieved",
            "runs page, last page": "/runs?page=2000",
            f"run page, {STEPS} steps": f"/runs/{long_run}",
            "goals page": "/",
            "charts page": "/goals/goal-03/charts",
        }

        async def measure() -> dict[str, list[tuple[float, float]]]:
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in pages}
            for path in pages.values():
                await server_time(app, path)  # warm: templates compiled, caches filled
            for _ in range(reps):
                for name, path in pages.items():
                    wall, cpu, status = await server_time(app, path)
                    assert status == 200, (path, status)
                    times[name].append((wall, cpu))
            return times

        times = asyncio.run(measure())
    figures = {}
    for name, pairs in times.items():
        wall, cpu = [w * 1e3 for w, _ in pairs], [c * 1e3 for _, c in pairs]
        figures[name] = {
            "p50_ms": statistics.median(wall),
            "p95_ms": percentile(wall, 0.95),
            "max_ms": max(wall),
            "cpu_p50_ms": statistics.median(cpu),
            "cpu_p95_ms": percentile(cpu, 0.95),
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    figures = run(args.runs, args.reps)
    load = os.getloadavg()[0]
    print(
        f"{args.runs:,} runs in the store, {args.reps} requests per page;"
        f" load average {load:.1f} on {os.cpu_count()} cores"
    )
    print(f"{'page':28} {'wall p50':>9} {'p95':>7} {'max':>7} {'CPU p50':>8} {'p95':>7}  target: p95 < 100 ms")
    for name, f in figures.items():
        verdict = ("met" if f["p95_ms"] < 100 else "MISSED") if name.startswith(("runs page", "run page")) else "-"
        print(
            f"{name:28} {f['p50_ms']:9.1f} {f['p95_ms']:7.1f} {f['max_ms']:7.1f} {f['cpu_p50_ms']:8.1f}"
            f" {f['cpu_p95_ms']:7.1f}  {verdict}"
        )


if __name__ == "__main__":
    main()
