"""A run answered after its process is gone (`runner goal --no-wait`, a killed `runner goal`, a stopped daemon):
`runner approve` / `runner reject` finish it, and its transcript tells the whole story; `--no-wait` itself
reports what ran before the approval it stops at. Real CLI processes, the scripted model, SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
from cluster_helpers import fresh_database, server_url, use_store
from support import approve_goal, call

from runner.store import SqliteStore
from runner.store.postgres import PostgresStore


def ship_goal(proj, after: str = "test -f haiku.txt") -> None:
    """The approval goal; the model writes the file the checks test."""
    approve_goal(proj, after)
    proj.server.add({"tool_calls": [call("write_file", path="haiku.txt", content="a\nb\nc\n")]}, {"content": "done"})


def no_wait(proj) -> tuple[int, dict]:
    out = proj.subprocess("goal", "ship", "--no-wait", "--json", timeout=120)
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def killed_while_waiting(proj) -> str:
    """`runner goal` waiting for a person, killed: its run stays awaiting_approval with no outcome written."""
    proc = proj.popen("goal", "ship", "--json", stdin=subprocess.DEVNULL)
    store = SqliteStore(proj.root / ".runner")
    try:
        run_id = wait_for_approval(store)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return run_id


def wait_for_approval(store, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = [r["id"] for r in store.runs() if r["outcome"] == "awaiting_approval"]
        if waiting:
            return waiting[0]
        time.sleep(0.1)
    raise AssertionError(f"no run awaits approval: {store.runs()}")


def shown(proj, run_id: str) -> tuple[list[str], dict]:
    """`runner show`'s lines (the transcript's location cut off) and `runner show --json`."""
    text = proj.subprocess("show", run_id, timeout=60)
    assert text.returncode == 0, text.stderr
    data = proj.subprocess("show", run_id, "--json", timeout=60)
    assert data.returncode == 0, data.stderr
    lines = text.stdout.splitlines()
    assert lines[-1].startswith("transcript: ")
    return lines[:-1], json.loads(data.stdout)


def after_approval(lines: list[str]) -> list[str]:
    """The lines `show` prints after the last check that ran before the approval."""
    return lines[lines.index("  ✓ pass  exists  exit 0") + 1 :]


def assert_approved(proj, run_id: str) -> None:
    answered = proj.subprocess("approve", run_id, timeout=120)
    assert answered.returncode == 0 and "its outcome is achieved" in answered.stdout, answered.stderr
    lines, run = shown(proj, run_id)
    assert run["outcome"] == "achieved" and run["error"] is None
    assert [(c["name"], c["passed"], c["reason"]) for c in run["checks"]] == [
        ("exists", True, None),
        ("ship it", True, "approved with runner approve"),
        ("after", True, None),
    ]
    checks = [(e["attempt"], e["name"], e["passed"]) for e in run["transcript"] if e["kind"] == "check"]
    assert checks == [(1, "exists", True), (1, "ship it", True), (1, "after", True)]
    last = run["transcript"][-1]
    assert (last["kind"], last["outcome"], last["attempts"], last["steps"]) == ("outcome", "achieved", 1, 2)
    later = after_approval(lines)
    assert "  ✓ pass  ship it  reason: approved with runner approve" in later
    assert "  ✓ pass  after  exit 0" in later
    assert lines[-1] == "outcome achieved"


def assert_rejected(proj, run_id: str) -> None:
    answered = proj.subprocess("reject", run_id, "--reason", "not today", timeout=120)
    assert answered.returncode == 0 and "its outcome is rejected" in answered.stdout, answered.stderr
    lines, run = shown(proj, run_id)
    assert run["outcome"] == "rejected" and run["error"] == "not today"
    assert [(c["name"], c["passed"], c["reason"]) for c in run["checks"]] == [
        ("exists", True, None),
        ("ship it", False, "not today"),
    ]
    assert "  ✗ fail  ship it  reason: not today" in after_approval(lines)
    assert lines[-1] == "outcome rejected: not today"


# finding 2: what --no-wait reports
def test_no_wait_json_reports_the_checks_before_the_pending_approval(proj, server):
    ship_goal(proj)
    code, data = no_wait(proj)
    assert (code, data["outcome"], data["error"]) == (4, "awaiting_approval", None)
    assert data["checks"] == [
        {"name": "exists", "passed": True, "exit_code": 0},
        {"name": "ship it", "passed": None, "exit_code": None},
    ]


def test_no_wait_says_how_to_answer_not_that_it_was_cancelled(proj, server):
    ship_goal(proj)
    out = proj.subprocess("goal", "ship", "--no-wait", timeout=120)
    run_id = SqliteStore(proj.root / ".runner").runs()[-1]["id"]
    assert out.returncode == 4 and out.stdout.startswith("Goal awaiting approval · 1 attempt · 2 steps")
    assert "cancelled" not in out.stdout
    assert f"waits for approval of ship it: runner approve {run_id} or runner reject {run_id}" in out.stdout


# finding 1: the transcript of a run finished by runner approve / reject
@pytest.mark.parametrize("gone", ["no-wait", "killed"])
def test_approve_after_the_process_is_gone_writes_the_rest_of_the_transcript(proj, server, gone):
    ship_goal(proj)
    run_id = no_wait(proj)[1]["run_id"] if gone == "no-wait" else killed_while_waiting(proj)
    assert_approved(proj, run_id)


@pytest.mark.parametrize("gone", ["no-wait", "killed"])
def test_reject_after_the_process_is_gone_writes_the_rest_of_the_transcript(proj, server, gone):
    ship_goal(proj)
    run_id = no_wait(proj)[1]["run_id"] if gone == "no-wait" else killed_while_waiting(proj)
    assert_rejected(proj, run_id)


def test_two_answers_at_once_finish_the_run_once(proj, server):
    """Two people answer the same run at once (its process gone, a slow check after the approval): one of them
    finishes it, the other is told, and the run has one approval, one of each later check and one outcome."""
    ship_goal(proj, after="sleep 1 && test -f haiku.txt")
    run_id = no_wait(proj)[1]["run_id"]
    answers = [proj.popen("approve", run_id), proj.popen("approve", run_id)]
    said = [(a.wait(120), *a.communicate()) for a in answers]
    finished = [s for s in said if "its outcome is achieved" in s[1]]
    assert len(finished) == 1, said
    (code, out, err) = next(s for s in said if s not in finished)
    told = (code == 0 and "it was taken up meanwhile" in out) or (code == 2 and "is not waiting for approval" in err)
    assert told, (code, out, err)
    _, run = shown(proj, run_id)
    assert run["outcome"] == "achieved"
    assert [c["name"] for c in run["checks"]] == ["exists", "ship it", "after"]
    assert [e["name"] for e in run["transcript"] if e["kind"] == "check"] == ["exists", "ship it", "after"]
    assert [e["outcome"] for e in run["transcript"] if e["kind"] == "outcome"] == ["awaiting_approval", "achieved"]


def test_an_approval_refused_leaves_the_run_waiting(proj, server):
    """A goal file that no longer loads refuses the approval and changes nothing: fixed, the run is approved;
    a later check that fails ends it not_achieved and says how to go on."""
    ship_goal(proj, after="false")
    run_id = no_wait(proj)[1]["run_id"]
    good = (proj.root / "goals/ship.yaml").read_text()
    (proj.root / "goals/ship.yaml").write_text(good + "prompt: [\n")
    refused = proj.subprocess("approve", run_id, timeout=120)
    assert refused.returncode == 2 and "goals/ship.yaml" in refused.stderr
    assert SqliteStore(proj.root / ".runner").run(run_id)["outcome"] == "awaiting_approval"
    (proj.root / "goals/ship.yaml").write_text(good)
    answered = proj.subprocess("approve", run_id, timeout=120)
    assert answered.returncode == 0, answered.stderr
    assert f"its outcome is not_achieved (runner continue {run_id} tries again)" in answered.stdout


def test_approve_of_checks_that_ran_before_any_work_ends_satisfied(proj, server):
    proj.goal("gate", prompt="p", verify={"checks_first": True, "checks": [{"run": "true"}, {"approve": "ship it?"}]})
    out = proj.subprocess("goal", "gate", "--no-wait", "--json", timeout=120)
    data = json.loads(out.stdout)
    assert (out.returncode, data["attempts"], [c["passed"] for c in data["checks"]]) == (4, 0, [True, None])
    answered = proj.subprocess("approve", data["run_id"], timeout=120)
    assert "its outcome is satisfied" in answered.stdout, answered.stderr
    lines, run = shown(proj, data["run_id"])
    assert run["outcome"] == "satisfied" and lines[-1] == "outcome satisfied"
    assert [(c["attempt"], c["passed"]) for c in run["checks"]] == [(0, True), (0, True)]
    assert server.requests == []


def test_approve_after_the_daemon_stopped_writes_the_rest_of_the_transcript(proj, server, daemons):
    ship_goal(proj)
    daemon = daemons(proj)
    assert proj.subprocess("trigger", "ship", timeout=60).returncode == 0
    run_id = wait_for_approval(daemon.store())
    assert daemon.stop() == 0
    assert_approved(proj, run_id)


def test_approve_after_the_process_is_gone_on_postgresql(proj, server):
    ship_goal(proj)
    with fresh_database(server_url()) as url:
        use_store(proj, url)
        migrated = proj.subprocess("db", "migrate", timeout=120)
        assert migrated.returncode == 0, migrated.stderr
        code, data = no_wait(proj)
        assert code == 4
        assert_approved(proj, data["run_id"])
    assert [c["passed"] for c in data["checks"]] == [True, None]  # what --no-wait read back from the store


def test_an_approval_on_another_machine_than_the_work_is_refused_a_rejection_is_not(proj, server):
    """The checks after an approval read the run's files: they run only on the machine that did the work."""
    ship_goal(proj)
    with fresh_database(server_url()) as url:
        use_store(proj, url)
        assert proj.subprocess("db", "migrate", timeout=120).returncode == 0
        run_id = no_wait(proj)[1]["run_id"]
        store = PostgresStore(url)
        store.exec("UPDATE runner_runs SET host = 'build-7' WHERE id = %s", (run_id,))
        refused = proj.subprocess("approve", run_id, timeout=120)
        assert refused.returncode == 2 and f"run {run_id} was worked on build-7" in refused.stderr
        assert store.run(run_id)["outcome"] == "awaiting_approval"
        assert store.take_answer(run_id) is None  # the refused answer was taken back
        rejected = proj.subprocess("reject", run_id, "--reason", "no", timeout=120)
        assert rejected.returncode == 0 and "its outcome is rejected" in rejected.stdout, rejected.stderr
        store.close()
