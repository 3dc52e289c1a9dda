"""The verify loop: checks decide, failures go back to the model, up to N attempts; the tamper lock."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest
from support import approve_goal, call, child_env

HAIKU_CHECK = """
import sys, pathlib
p = pathlib.Path(sys.argv[1])
if not p.is_file(): sys.exit(f"{p} does not exist")
lines = [l for l in p.read_text().splitlines() if l.strip()]
if len(lines) != 3: sys.exit(f"{p} has {len(lines)} lines, expected 3")
print("three lines")
"""
TWO = "loops go round\nand round\n"
THREE = "loops go round\nand round again\nback to the start\n"


def haiku_goal(proj, **verify):
    proj.write("verifiers/haiku.py", HAIKU_CHECK)
    checks = verify.pop("checks", [{"name": "three lines", "run": "python3 verifiers/haiku.py haiku.txt"}])
    proj.goal("haiku", prompt="write haiku.txt, three lines about loops", verify={"checks": checks, **verify})


def write(content: str) -> dict:
    return {"tool_calls": [call("write_file", path="haiku.txt", content=content)]}


def test_wrong_first_then_right_after_feedback(proj, server):
    haiku_goal(proj)
    server.add(write(TWO), {"content": "done"}, write(THREE), {"content": "fixed"})
    out = proj.cli_json("goal", "haiku")
    assert out["exit_code"] == 0
    assert (out["outcome"], out["attempts"], out["steps"]) == ("achieved", 2, 4)
    assert out["checks"] == [{"name": "three lines", "passed": True, "exit_code": 0}]
    feedback = server.requests[2]["messages"][-1]
    assert feedback["role"] == "user"
    assert "haiku.txt has 2 lines, expected 3" in feedback["content"]
    assert "python3 verifiers/haiku.py haiku.txt" in feedback["content"] and "exit code 1" in feedback["content"]
    assert "haiku.txt has 2 lines" not in json.dumps(server.requests[1])
    run = proj.cli_json("show", out["run_id"])
    assert [(c["attempt"], c["passed"]) for c in run["checks"]] == [(1, 0), (2, 1)]
    assert [a["stop_reason"] for a in run["attempt_rows"]] == ["completed", "completed"]


def test_gives_up_after_max_attempts(proj, server):
    haiku_goal(proj, max_attempts=2)
    server.add(write(TWO), {"content": "done"}, write("x\n"), {"content": "done"})
    out = proj.cli_json("goal", "haiku")
    assert (out["exit_code"], out["outcome"], out["attempts"]) == (1, "not_achieved", 2)
    second_feedback = server.requests[2]["messages"][-1]["content"]
    assert "Attempt 1" in second_feedback
    assert server.remaining == 0


def test_feedback_says_what_newly_fails_and_what_was_fixed(proj, server):
    proj.write("verifiers/haiku.py", HAIKU_CHECK)
    haiku_goal(
        proj,
        max_attempts=3,
        checks=[
            {"name": "three lines", "run": "python3 verifiers/haiku.py haiku.txt"},
            {"name": "has notes", "run": "test -f notes.txt"},
        ],
    )
    server.add(
        write(TWO),
        {"content": "a"},
        write(THREE),
        {"content": "b"},
        {"tool_calls": [call("write_file", path="notes.txt", content="n")]},
        {"content": "c"},
    )
    out = proj.cli_json("goal", "haiku")
    assert (out["outcome"], out["attempts"]) == ("achieved", 3)
    second = server.requests[4]["messages"][-1]["content"]
    assert "Fixed since the last attempt: three lines" in second and "Newly failing: none" in second


def test_checks_first_makes_no_model_request(proj, server):
    haiku_goal(proj, checks_first=True)
    (proj.root / "haiku.txt").write_text(THREE)
    out = proj.cli_json("goal", "haiku")
    assert (out["exit_code"], out["outcome"], out["attempts"]) == (0, "satisfied", 0)
    assert server.requests == []


def test_checks_first_failing_works_with_the_failure_in_the_prompt(proj, server):
    haiku_goal(proj)
    server.add(write(THREE), {"content": "done"})
    out = proj.cli_json("goal", "haiku", "--checks-first")
    assert out["outcome"] == "achieved"
    assert "haiku.txt does not exist" in server.requests[0]["messages"][1]["content"]


def test_a_hanging_check_is_killed_at_its_timeout(proj, server):
    haiku_goal(proj, max_attempts=1, checks=[{"name": "hangs", "run": "sleep 60", "timeout": "0.5s"}])
    server.add({"content": "done"})
    started = time.monotonic()
    out = proj.cli_json("goal", "haiku")
    assert out["outcome"] == "not_achieved" and out["checks"][0]["exit_code"] is None
    assert time.monotonic() - started < 30
    run = proj.cli_json("show", out["run_id"])
    assert "timed out after 0.5s" in run["checks"][0]["reason"]


def test_a_check_printing_binary_garbage(proj, server):
    haiku_goal(
        proj,
        max_attempts=2,
        checks=[
            {
                "name": "garbage",
                "run": "printf 'ok\\000\\377\\376\\200bad'; head -c 5000 /dev/urandom; test -f haiku.txt",
            }
        ],
    )
    server.add({"content": "nothing"}, write(THREE), {"content": "done"})
    out = proj.cli_json("goal", "haiku")
    assert (out["outcome"], out["attempts"]) == ("achieved", 2)
    feedback = server.requests[1]["messages"][-1]["content"]
    assert "ok\ufffd\ufffd\ufffd\ufffdbad" in feedback
    assert len(feedback.encode()) < 8_000


def judge_goal(proj, rubric="The poem in haiku.txt is about loops."):
    proj.goal(
        "poem",
        prompt="write a poem",
        verify={
            "max_attempts": 2,
            "checks": [
                {"name": "exists", "run": "cat haiku.txt"},
                {"name": "about loops", "judge": rubric, "files": ["haiku.txt"]},
            ],
        },
    )


def test_judge_passes(proj, server):
    judge_goal(proj)
    server.add(write(THREE), {"content": "done"}, {"content": '```json\n{"pass": true, "reason": "It loops."}\n```'})
    out = proj.cli_json("goal", "poem")
    assert out["outcome"] == "achieved" and [c["passed"] for c in out["checks"]] == [True, True]
    judged = server.requests[2]["messages"]
    assert "strict evaluator" in judged[0]["content"]
    assert "The poem in haiku.txt is about loops." in judged[1]["content"]
    assert "back to the start" in judged[1]["content"]
    assert "Output of the check `exists` (exit code 0)" in judged[1]["content"]
    assert "tools" not in server.requests[2]


def test_judge_fails_then_passes_and_its_reason_is_feedback(proj, server):
    judge_goal(proj)
    server.add(
        write(TWO),
        {"content": "done"},
        {"content": '{"pass": false, "reason": "It is about cats."}'},
        write(THREE),
        {"content": "done"},
        {"content": '{"pass": true, "reason": "ok"}'},
    )
    out = proj.cli_json("goal", "poem")
    assert (out["outcome"], out["attempts"]) == ("achieved", 2)
    assert "judge: It is about cats." in server.requests[3]["messages"][-1]["content"]


def test_judge_nonsense_is_a_failed_check_not_a_crash(proj, server):
    judge_goal(proj)
    server.add(
        write(THREE),
        {"content": "done"},
        {"content": "I think it is lovely!"},
        {"content": "still done"},
        {"content": '{"pass": "maybe"}'},
    )
    out = proj.cli_json("goal", "poem")
    assert (out["exit_code"], out["outcome"]) == (1, "not_achieved")
    assert "could not be parsed: 'I think it is lovely!'" in server.requests[3]["messages"][-1]["content"]


def test_judge_model_can_differ(proj, server):
    proj.goal(
        "poem",
        prompt="p",
        judge_model="judge-9000",
        verify={"max_attempts": 1, "checks": [{"judge": "fine", "files": ["missing.txt"]}]},
    )
    server.add({"content": "done"}, {"content": '{"pass": true, "reason": "ok"}'})
    assert proj.cli_json("goal", "poem")["outcome"] == "achieved"
    assert [r["model"] for r in server.requests] == ["test-model", "judge-9000"]
    assert "(the file does not exist)" in server.requests[1]["messages"][1]["content"]


def run_in_pty(proj, answer: str) -> tuple[int, str]:
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "-C", str(proj.root), "goal", "ship"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=child_env(),
        close_fds=True,
    )
    os.close(terminal)
    seen = b""
    deadline = time.monotonic() + 60
    while b"Publish this poem? [y/N]" not in seen and time.monotonic() < deadline:
        if select.select([controller], [], [], 0.5)[0]:
            seen += os.read(controller, 4096)
    os.write(controller, answer.encode())
    while proc.poll() is None and time.monotonic() < deadline:
        if select.select([controller], [], [], 0.2)[0]:
            try:
                seen += os.read(controller, 4096)
            except OSError:
                break
    code = proc.wait(10)
    os.close(controller)
    return code, seen.decode(errors="replace")


def test_approve_at_a_terminal(proj, server):
    approve_goal(proj)
    server.add(write(THREE), {"content": "done"})
    code, screen = run_in_pty(proj, "y\n")
    assert code == 0 and "Goal achieved" in screen


def test_reject_at_a_terminal(proj, server):
    approve_goal(proj)
    server.add(write(THREE), {"content": "done"})
    code, screen = run_in_pty(proj, "n\ntoo sad\n")
    assert code == 1 and "Goal rejected" in screen and "too sad" in screen


def wait_for_outcome(proj, outcome: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = json.loads(proj.cli("runs", "--json").output)
        if runs and runs[-1]["outcome"] == outcome:
            return runs[-1]
        time.sleep(0.2)
    raise AssertionError(f"no run reached {outcome}: {runs}")


def test_approve_later_by_run_id(proj, server):
    approve_goal(proj)
    server.add(write(THREE), {"content": "done"})
    proc = proj.popen("goal", "ship", "--json", stdin=subprocess.DEVNULL)
    run = wait_for_outcome(proj, "awaiting_approval")
    result = proj.cli("approve", run["run_id"])
    assert result.exit_code == 0 and "approved" in result.output
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and json.loads(stdout)["outcome"] == "achieved"


def test_reject_later_by_run_id(proj, server):
    approve_goal(proj)
    server.add(write(THREE), {"content": "done"})
    proc = proj.popen("goal", "ship", "--json", stdin=subprocess.DEVNULL)
    run = wait_for_outcome(proj, "awaiting_approval")
    assert proj.cli("reject", run["run_id"], "--reason", "not today").exit_code == 0
    stdout, _ = proc.communicate(timeout=60)
    out = json.loads(stdout)
    assert proc.returncode == 1 and out["outcome"] == "rejected" and out["error"] == "not today"


def test_a_waiting_run_survives_the_death_of_its_process(proj, server):
    approve_goal(proj)
    server.add(write(THREE), {"content": "done"})
    proc = proj.popen("goal", "ship", "--json", stdin=subprocess.DEVNULL)
    run = wait_for_outcome(proj, "awaiting_approval")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert json.loads(proj.cli("runs", "--json").output)[-1]["outcome"] == "awaiting_approval"
    result = proj.cli("approve", run["run_id"])
    assert "its outcome is achieved" in result.output
    shown = proj.cli_json("show", run["run_id"])
    assert shown["outcome"] == "achieved"
    assert [(c["name"], c["passed"]) for c in shown["checks"]] == [("exists", 1), ("ship it", 1), ("after", 1)]
    assert proj.cli("approve", run["run_id"]).exit_code == 2


def test_before_retry_runs_before_each_retry(proj, server):
    haiku_goal(proj, max_attempts=3, nudge=False, before_retry="echo reset >> retries.log; rm -f haiku.txt")
    server.add(write(TWO), {"content": "a"}, {"content": "b"}, write(THREE), {"content": "c"})
    out = proj.cli_json("goal", "haiku")
    assert (out["outcome"], out["attempts"]) == ("achieved", 3)
    assert (proj.root / "retries.log").read_text() == "reset\nreset\n"
    assert "haiku.txt does not exist" in server.requests[3]["messages"][-1]["content"]


def test_fresh_context_starts_a_new_conversation(proj, server):
    haiku_goal(proj, fresh_context=True)
    server.add(write(TWO), {"content": "a"}, write(THREE), {"content": "b"})
    assert proj.cli_json("goal", "haiku")["outcome"] == "achieved"
    retry = server.requests[2]["messages"]
    assert [m["role"] for m in retry] == ["system", "user"]
    assert retry[1]["content"].startswith("write haiku.txt, three lines about loops")
    assert "haiku.txt has 2 lines, expected 3" in retry[1]["content"]


def test_stuck_ends_early(proj, server):
    haiku_goal(proj, max_attempts=5, stuck_after=2, nudge=False)
    server.add(write(TWO), {"content": "a"}, {"content": "b"})
    out = proj.cli_json("goal", "haiku")
    assert (out["exit_code"], out["outcome"], out["attempts"]) == (1, "stuck", 2)


@pytest.mark.parametrize(
    "attack",
    [
        {"tool_calls": [call("write_file", path="verifiers/haiku.py", content="print('pass')")]},
        {"tool_calls": [call("edit_file", path="verifiers/haiku.py", old_text="sys.exit", new_text="print")]},
    ],
)
def test_write_tools_refuse_the_verifiers(proj, server, attack):
    haiku_goal(proj, max_attempts=1)
    server.add(attack, {"content": "done"})
    out = proj.cli_json("goal", "haiku")
    assert out["outcome"] == "not_achieved"
    assert "protected" in server.requests[1]["messages"][-1]["content"]
    assert (proj.root / "verifiers/haiku.py").read_text() == HAIKU_CHECK


@pytest.mark.parametrize(
    "command",
    [
        "echo 'print(1)' > verifiers/haiku.py",
        "echo 'import sys' > verifiers/extra.py",
        "rm verifiers/haiku.py",
        "mkdir -p schedules && echo '- goal: haiku' > schedules/evil.yaml",
        "echo 'exit 0' > check.sh",
    ],
)
def test_tampering_through_the_shell_is_caught_and_undone(proj, server, command, monkeypatch):
    monkeypatch.setenv("RUNNER_SANDBOX", "off")  # the fallback: in the jail these writes fail (tests/test_sandbox.py)
    haiku_goal(proj, checks=[{"run": "python3 verifiers/haiku.py haiku.txt"}, {"run": "sh check.sh"}])
    proj.write("check.sh", "test -f haiku.txt\n")
    before = {p: p.read_bytes() for p in [proj.root / "verifiers/haiku.py", proj.root / "check.sh"]}
    server.add({"tool_calls": [call("shell", command=command)]}, {"content": "all checks pass now"})
    out = proj.cli_json("goal", "haiku")
    assert (out["exit_code"], out["outcome"]) == (1, "tampered")
    run = proj.cli_json("show", out["run_id"])
    assert "changed protected files" in run["error"]
    for path, content in before.items():
        assert path.read_bytes() == content
    assert not (proj.root / "verifiers/extra.py").exists() and not (proj.root / "schedules/evil.yaml").exists()


def test_inline_goal(proj, server):
    server.add(write(TWO), {"content": "a"}, write(THREE), {"content": "b"})
    out = proj.cli_json(
        "goal", "-p", "write haiku.txt", "-c", "test -f haiku.txt", "-c", "test $(wc -l < haiku.txt) -eq 3", "-n", "2"
    )
    assert (out["exit_code"], out["outcome"], out["attempts"], out["goal"]) == (0, "achieved", 2, "inline")
    assert [c["name"] for c in out["checks"]] == ["test -f haiku.txt", "test $(wc -l < haiku.txt) -eq 3"]


def test_check_command_runs_only_the_checks(proj, server):
    haiku_goal(proj)
    result = proj.cli("check", "haiku")
    assert result.exit_code == 1 and "0/1 checks pass" in result.output
    (proj.root / "haiku.txt").write_text(THREE)
    result = proj.cli("check", "haiku")
    assert result.exit_code == 0 and "1/1 checks pass" in result.output
    assert server.requests == []


def test_check_environment(proj, server):
    proj.goal(
        "env",
        prompt="p",
        verify={
            "max_attempts": 1,
            "checks": [{"run": 'echo "$RUNNER_ROOT|$RUNNER_GOAL|$RUNNER_ATTEMPT|$RUNNER_RUN_ID" > check.txt'}],
        },
    )
    server.add({"content": "done"})
    out = proj.cli_json("goal", "env")
    assert (proj.root / "check.txt").read_text().strip() == f"{proj.root}|env|1|{out['run_id']}"
