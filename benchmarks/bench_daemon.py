"""The daemon under load: idle cost with 1,000 entries, start delay with 100 per-second entries, and
200 goals at once against a model with 1 s latency."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from common import PYTHON

TICK = os.sysconf("SC_CLK_TCK")


def project(folder: Path, goals: dict[str, dict], entries: list[dict], daemon: dict) -> Path:
    (folder / "goals").mkdir(parents=True)
    (folder / "schedules").mkdir()
    (folder / "runner.yaml").write_text(
        yaml.safe_dump({"model": {"name": "unused", "api_key_env": None}, "daemon": daemon})
    )
    for name, goal in goals.items():
        (folder / "goals" / f"{name}.yaml").write_text(yaml.safe_dump(goal))
    (folder / "schedules" / "bench.yaml").write_text(yaml.safe_dump(entries))
    return folder


def noop(checks_first: bool = True) -> dict:
    return {
        "prompt": "nothing to do",
        "verify": {"checks_first": checks_first, "max_attempts": 1, "checks": [{"run": "true"}]},
    }


@contextmanager
def daemon(root: Path) -> Any:
    proc = subprocess.Popen(
        [PYTHON, "-m", "runner", "-C", str(root), "daemon"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "daemon started" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the daemon did not start")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def idle(entries: int = 1000, seconds: float = 30.0) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        root = project(Path(folder), {"noop": noop()}, [{"goal": "noop", "every": "1h"}] * entries, {})
        with daemon(root) as proc:
            time.sleep(2)  # let start-up finish
            before = cpu_seconds(proc.pid)
            time.sleep(seconds)
            used = cpu_seconds(proc.pid) - before
            rss = rss_mb(proc.pid)
    return {"entries": entries, "idle_s": seconds, "cpu_percent": 100 * used / seconds, "rss_mb": rss}


def start_delay(goals: int = 100, seconds: float = 20.0) -> dict[str, float]:
    from runner.store import SqliteStore

    with tempfile.TemporaryDirectory() as folder:
        names = [f"noop{i:03d}" for i in range(goals)]
        root = project(
            Path(folder),
            {n: noop() for n in names},
            [{"goal": n, "every": "1s"} for n in names],
            {"max_concurrent_runs": goals},
        )
        with daemon(root):
            time.sleep(seconds)
        events = SqliteStore(root / ".runner").events("start")
    delays = sorted(
        (datetime.fromisoformat(e["at"]) - datetime.fromisoformat(e["detail"].split(" due ")[1])).total_seconds()
        for e in events
        if " due " in e["detail"]
    )
    p = lambda q: delays[min(len(delays) - 1, int(q * len(delays)))]  # noqa: E731
    return {"starts": len(delays), "p50_s": p(0.50), "p99_s": p(0.99), "max_s": delays[-1]}


ROUNDS_SERVER = """
import sys
from runner.testing import ScriptedServer
rounds = int(sys.argv[1])
def reply(request):
    done = sum(m["role"] == "assistant" for m in request["messages"])
    if done + 1 < rounds:
        return {"tool_calls": [{"name": "read_file", "arguments": {"path": "note.txt"}}]}
    return {"content": "done"}
server = ScriptedServer([reply] * 100000, latency=float(sys.argv[2]), record=False).start()
print(server.base_url, flush=True)
import threading; threading.Event().wait()
"""


def many_goals(goals: int = 200, rounds: int = 3, latency: float = 1.0) -> dict[str, float]:
    from runner.store import SqliteStore

    server = subprocess.Popen(
        [PYTHON, "-c", ROUNDS_SERVER, str(rounds), str(latency)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as folder:
            names = [f"g{i:03d}" for i in range(goals)]
            goal = {
                "prompt": "read note.txt",
                "tools": ["read_file"],
                "model": {"name": "m", "base_url": url, "api_key_env": None},
            }
            root = project(Path(folder), {n: goal for n in names}, [], {"max_concurrent_runs": goals})
            (root / "note.txt").write_text("a note\n")
            store = SqliteStore(root / ".runner")
            for name in names:
                store.send_command("trigger", name)
            with daemon(root) as proc:
                before = cpu_seconds(proc.pid)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    runs = store.runs()
                    if len(runs) == goals and all(r["ended"] for r in runs):
                        break
                    time.sleep(0.2)
                cpu = cpu_seconds(proc.pid) - before
            runs = store.runs()
    finally:
        server.terminate()
        server.wait()
    starts = sorted(datetime.fromisoformat(r["started"]) for r in runs)
    ended = max(datetime.fromisoformat(r["ended"]) for r in runs if r["ended"])
    total = (ended - starts[0]).total_seconds()
    durations = sorted(
        (datetime.fromisoformat(r["ended"]) - datetime.fromisoformat(r["started"])).total_seconds()
        for r in runs
        if r["ended"]
    )
    ideal = rounds * latency
    outcomes = sorted({r["outcome"] for r in runs})
    return {
        "goals": len(runs),
        "outcomes": ",".join(outcomes),
        "total_s": total,
        "ideal_s": ideal,
        "ratio": total / ideal,
        "start_spread_s": (starts[-1] - starts[0]).total_seconds(),
        "median_run_s": durations[len(durations) // 2],
        "daemon_cpu_s": cpu,
    }


HTTPX_CLIENT = """
import asyncio, sys, httpx2
url, n = sys.argv[1], int(sys.argv[2])
tls = httpx2.create_ssl_context()  # shared, as runner shares it


async def one():
    async with httpx2.AsyncClient(base_url=url, verify=tls) as http:
        messages = [{"role": "user", "content": "read note.txt"}]
        while True:
            response = await http.post("/chat/completions", json={"model": "m", "messages": messages})
            message = response.json()["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                return
            for call in message["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "a note"})


async def main():
    await asyncio.gather(*(one() for _ in range(n)))


sys.stdin.readline()  # start together
asyncio.run(main())
"""


def many_httpx(goals: int = 200, rounds: int = 3, latency: float = 1.0, processes: int = 1) -> dict[str, float]:
    """The floor: the same goals x rounds requests from bare httpx2 loops, no runner, split over processes."""
    server = subprocess.Popen(
        [PYTHON, "-c", ROUNDS_SERVER, str(rounds), str(latency)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        clients = [
            subprocess.Popen(
                [PYTHON, "-c", HTTPX_CLIENT, url, str(goals // processes)], stdin=subprocess.PIPE, text=True
            )
            for _ in range(processes)
        ]
        time.sleep(2)  # imports done before the clock starts
        started = time.perf_counter()
        for client in clients:
            assert client.stdin is not None
            client.stdin.write("go\n")
            client.stdin.flush()
        for client in clients:
            client.wait(120)
        total = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait()
    return {"total_s": total, "ratio": total / (rounds * latency), "processes": processes}


if __name__ == "__main__":
    which = sys.argv[1:] or ["idle", "delay", "many"]
    if "idle" in which:
        print(json.dumps(idle()))
    if "delay" in which:
        print(json.dumps(start_delay()))
    if "many" in which:
        print(json.dumps(many_httpx()))
        print(json.dumps(many_httpx(processes=2)))
        print(json.dumps(many_goals()))
