"""No process outlives its attempt, none escapes the store's process table, and no tool call freezes runner:
attacks by a scripted model through real processes, in the jail and in the fallback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import call, child_env, count_threads
from test_sandbox import attack, mode  # noqa: F401  (the fixture: jail and fallback)

from runner.config import Goal, ModelConfig
from runner.store import SqliteStore
from runner.work.tools import Toolbox, files, sandbox

ALIVE = """import os, sys
mark = b'sleep\\0' + sys.argv[1].encode() + b'\\0'
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        if open(f'/proc/{pid}/cmdline', 'rb').read() == mark:
            sys.exit(f'alive: {pid}')
    except OSError:
        pass
"""
"""verifiers/alive.py MARK: fails while `sleep MARK` runs."""


def alive(mark: str) -> list[int]:
    """Processes whose command line holds `mark` (`sleep MARK`, the search child's script)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if pid != str(os.getpid()) and mark.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


DETACH = {
    "nohup": "nohup sleep {mark} >/dev/null 2>&1 &",
    "setsid": "setsid sleep {mark} >/dev/null 2>&1 &",
    "subshell": "(sleep {mark} >/dev/null 2>&1 &)",
    "double fork": (
        "python3 -c \"import os; os.fork() or (os.setsid(), os.fork() or os.execlp('sleep', 'sleep', '{mark}'))\""
        " >/dev/null 2>&1"
    ),
    "scrubbed env": "env -i /usr/bin/setsid sleep {mark} >/dev/null 2>&1 &",
}


@pytest.mark.parametrize("how", DETACH)
def test_detached_processes_are_gone_before_the_checks(proj, server, mode, how):  # noqa: F811
    mark = f"300.{abs(hash((how, mode))) % 10**6}"
    proj.write("verifiers/alive.py", ALIVE)
    out, output = attack(
        proj,
        server,
        DETACH[how].format(mark=mark) + "\nsleep 0.2\necho started",
        checks=[{"run": f"python3 verifiers/alive.py {mark}"}],
    )
    assert "started" in output
    assert out["outcome"] == "achieved", out  # the check saw no process of the attempt
    assert alive(mark) == []


def test_a_background_forger_cannot_rewrite_the_verifier_while_the_checks_run(proj, server, mode):  # noqa: F811
    """The attack of issue 9: a process left behind waits for the checks, then rewrites the verifier."""
    proj.write("verifiers/v.sh", "exit 1\n")
    forger = "sh -c 'while [ ! -e go ]; do sleep 0.05; done; echo \"exit 0\" > verifiers/v.sh' >/dev/null 2>&1 &"
    out, _ = attack(
        proj, server, f"setsid {forger}", checks=[{"run": "touch go; sleep 1"}, {"run": "sh verifiers/v.sh"}]
    )
    assert out["outcome"] == "not_achieved"
    assert (proj.root / "verifiers/v.sh").read_text() == "exit 1\n"


def test_what_a_check_leaves_running_is_killed_after_the_checks(proj, server):
    mark = "300.4711"
    check = {"run": f"setsid sleep {mark} >/dev/null 2>&1 &"}
    proj.goal("g", prompt="p", verify={"checks_first": True, "checks": [check]})
    assert proj.cli_json("goal", "g")["outcome"] == "satisfied"
    assert alive(mark) == []


@pytest.mark.slow
def test_kill_9_of_runner_never_orphans_an_unrecorded_process(proj):
    """runner killed at many moments around a check's start: whatever it started is recorded and killed by
    the next command, or never ran at all."""
    mark = "300.8123"
    proj.goal("g", prompt="p", verify={"checks_first": True, "checks": [{"run": f"sleep {mark}"}]})
    store = SqliteStore(proj.root / ".runner")
    for delay in (0, 0.002, 0.01, 0.03, 0.1, 0.3):
        before = len(store.runs())
        proc = proj.popen("goal", "g")
        deadline = time.monotonic() + 60
        while len(store.runs()) == before and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proj.subprocess("runs")  # marks the run interrupted and kills what it recorded
        deadline = time.monotonic() + 10
        while alive(mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive(mark) == [], f"orphaned after a kill {delay}s into the run"
    assert {r["outcome"] for r in store.runs()} == {"interrupted"}


# one tool call cannot freeze everything
def toolbox(root: Path) -> Toolbox:
    return Toolbox.for_goal(Goal(name="g", prompt="p", model=ModelConfig(name="m"), root=root))


def use(box: Toolbox, name: str, **arguments) -> str:
    return asyncio.run(box.call(name, json.dumps(arguments)))


def test_fifos_devices_and_huge_files_are_refused_not_read(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with open(tmp_path / "huge.log", "wb") as file:
        file.truncate(1 << 30)  # 1 GB, sparse
    box = toolbox(tmp_path)
    assert "not a regular file" in use(box, "read_file", path="pipe")
    assert "not a regular file" in use(box, "write_file", path="pipe", content="x")
    assert "over the 8,000,000 bytes" in use(box, "read_file", path="huge.log")
    assert "over the 8,000,000 bytes" in use(box, "edit_file", path="huge.log", old_text="a", new_text="b")
    assert use(box, "search_files", pattern="x") == "no matches\n[1 files over 4 MB not searched]"
    if os.geteuid() == 0:
        os.mknod(tmp_path / "zero", 0o666 | 0o020000, os.makedev(1, 5))  # a character device: /dev/zero
        assert "not a regular file" in use(box, "read_file", path="zero")


def test_one_small_file_is_read_and_written_on_the_event_loop_anything_bigger_in_a_thread(tmp_path, monkeypatch):
    """A hundred runs of a daemon each reading a small file: a thread per call waits 15-30 ms for the GIL."""
    threaded = count_threads(monkeypatch)
    (tmp_path / "note.txt").write_text("a note\n")
    (tmp_path / "big.txt").write_text("line\n" * 60_000)  # 300 KB
    os.mkfifo(tmp_path / "pipe")
    box = toolbox(tmp_path)
    assert use(box, "read_file", path="note.txt") == "a note\n"
    assert use(box, "write_file", path="new.txt", content="hi\n").startswith("wrote 3 bytes")
    assert use(box, "edit_file", path="new.txt", old_text="hi", new_text="ho") == "edited new.txt"
    assert "does not exist" in use(box, "read_file", path="missing.txt")
    assert threaded == []
    assert use(box, "read_file", path="big.txt", limit=2) == "line\nline\n[59998 more lines: read on with offset=3]"
    assert use(box, "write_file", path="large.txt", content="x" * 100_000).startswith("wrote 100000 bytes")
    assert "not a regular file" in use(box, "read_file", path="pipe")
    assert threaded == ["read_file", "write_file", "read_file"]
    assert (tmp_path / "new.txt").read_text() == "ho\n" and (tmp_path / "large.txt").stat().st_size == 100_000


def test_a_catastrophic_regex_is_stopped_and_the_event_loop_keeps_running(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "SEARCH_TIMEOUT", 2.0)
    (tmp_path / "a.txt").write_text("a" * 40 + "!\n")
    box = toolbox(tmp_path)

    async def both() -> tuple[str, int]:
        ticks = 0
        search = asyncio.ensure_future(box.call("search_files", json.dumps({"pattern": "(a+)+$"})))
        while not search.done():
            await asyncio.sleep(0.01)
            ticks += 1
        return search.result(), ticks

    result, ticks = asyncio.run(both())
    assert "took longer than 2s and was stopped" in result
    assert ticks > 20  # the loop ran other work all along


def test_a_freezing_tool_round_ends_at_the_attempt_time_limit(proj, server):
    """A run whose model asks for a FIFO, a 1 GB file and a catastrophic search ends on its own, within its
    time limit, with each call answered; nothing is left running."""
    os.mkfifo(proj.root / "pipe")
    with open(proj.root / "huge.log", "wb") as file:
        file.truncate(1 << 30)
    proj.write("a.txt", "a" * 40 + "!\n")
    proj.goal("g", prompt="p", limits={"timeout": "3s"})
    server.add(
        {"tool_calls": [call("read_file", path="pipe"), call("read_file", path="huge.log")]},
        {"tool_calls": [call("search_files", pattern="(a+)+$")]},
        {"content": "done"},
    )
    out = proj.cli_json("goal", "g")
    assert (out["outcome"], out["stop_reason"]) == ("not_achieved", "timeout")
    events = SqliteStore(proj.root / ".runner").transcript_events(out["run_id"])
    results = [e["message"]["content"] for e in events if e["kind"] == "message" and e["message"]["role"] == "tool"]
    assert "not a regular file" in results[0] and "bytes, over the" in results[1]
    assert "the attempt stopped (timeout)" in results[2]
    assert alive("regex, found = re.compile") == []


@pytest.mark.slow
def test_a_run_in_a_daemon_is_not_frozen_by_another_goals_search(proj, server):
    """Two goals at once in one process: one searches with a catastrophic pattern, the other finishes."""
    proj.write("a.txt", "a" * 40 + "!\n")
    proj.goal("slow", prompt="p", limits={"timeout": "10s"}, model={"name": "script:slow.yaml"})
    proj.write("slow.yaml", [{"tool_calls": [call("search_files", pattern="(a+)+$")]}, {"content": "done"}])
    proj.goal("quick", prompt="p", model={"name": "script:quick.yaml"}, verify={"checks": [{"run": "true"}]})
    proj.write("quick.yaml", [{"tool_calls": [call("shell", command="echo hi")]}, {"content": "done"}])
    code = (
        "import asyncio, sys, time; from runner.config import load_project, load_goal; "
        "from runner.store import open_store; from runner.verify import run_goal\n"
        "async def main():\n"
        "    p = load_project(); store = open_store(p); started = time.monotonic(); order = []\n"
        "    async def one(name):\n"
        "        r = await run_goal(load_goal(p, name), store); order.append((name, r.outcome))\n"
        "    await asyncio.gather(one('slow'), one('quick'))\n"
        "    print(order)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=proj.root, env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("[('quick', 'achieved')"), done.stdout


def test_what_a_killed_runner_left_outside_its_process_groups_is_found_by_its_run(proj):
    """kill -9 of runner while a check runs that put a process in a session of its own: the store's process
    groups miss it, `kill_leftovers(run_id)` (called where a dead run is marked interrupted) does not."""
    mark = "300.5151"
    check = {"run": f"setsid sleep {mark} >/dev/null 2>&1 & sleep 300.5152"}
    proj.goal("g", prompt="p", verify={"checks_first": True, "checks": [check]})
    proc = proj.popen("goal", "g")
    deadline = time.monotonic() + 60
    while not (alive(mark) and alive("sleep\0" + "300.5152")) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run_id = SqliteStore(proj.root / ".runner").runs()[0]["id"]
    SqliteStore(proj.root / ".runner").mark_interrupted()  # kills the recorded group: the check itself
    assert alive(mark)  # the process in its own session survived that
    assert sandbox.kill_leftovers(run_id)
    deadline = time.monotonic() + 10
    while alive(mark) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert alive(mark) == []
