"""The command line: init, the example project, runs/show/list output, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import python_lines

from runner.cli import main

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "runner" / "templates"


def test_init_writes_a_working_example_that_runs_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    runner = CliRunner()
    result = runner.invoke(main, ["init", str(tmp_path / "demo")])
    assert result.exit_code == 0 and "wrote" in result.output
    demo = ["-C", str(tmp_path / "demo")]
    assert runner.invoke(main, [*demo, "validate"]).output.splitlines()[0] == "valid: 1 goal(s), 1 schedule entry"
    result = runner.invoke(main, [*demo, "goal", "haiku", "--json"])
    out = json.loads(result.output)
    assert result.exit_code == 0 and (out["outcome"], out["attempts"]) == ("achieved", 2)
    assert len((tmp_path / "demo" / "haiku.txt").read_text().splitlines()) == 3
    again = runner.invoke(main, ["init", str(tmp_path / "demo")])
    assert "kept" in again.output and (tmp_path / "demo/verifiers/haiku.py").read_text()


def test_the_repository_example_is_the_init_template():
    for template in TEMPLATES.rglob("*"):
        if template.is_file() and "__pycache__" not in template.parts:
            twin = REPO / template.relative_to(TEMPLATES)
            assert twin.read_text() == template.read_text(), f"{twin} differs from {template}"


def test_quiet_prints_only_the_outcome_line(proj, server):
    proj.goal("g", prompt="hi")
    server.add({"content": "hello"})
    result = proj.cli("goal", "g", "--quiet")
    assert result.exit_code == 0
    assert result.stdout.strip().startswith("Goal achieved · 1 attempt · 1 step · ")
    assert len(result.stdout.strip().splitlines()) == 1


def test_runs_and_show_json(proj, server):
    proj.goal("g", prompt="hi")
    server.add({"content": "one"}, {"content": "two"})
    first = proj.cli_json("goal", "g")
    proj.cli_json("goal", "g")
    runs = json.loads(proj.cli("runs", "--json").output)
    assert runs[1]["run_id"] == first["run_id"] and len(runs) == 2  # newest first
    assert set(runs[0]) == {
        *("run_id", "goal", "trigger", "outcome", "started", "ended", "attempts", "steps", "tokens"),
        *("cost_usd", "continues"),  # DESIGN 10: the cost of the run, the run it continues
    }
    assert proj.cli("runs", "--goal", "other", "--json").exit_code == 2  # no such goal
    shown = proj.cli_json("show", first["run_id"])
    assert shown["final_message"] == "one" and shown["transcript"][-1]["kind"] == "outcome"
    assert proj.cli("show", "nope").exit_code == 2
    assert proj.cli("approve", "nope").exit_code == 2
    assert "no run with id 'nope'" in proj.cli("show", "nope").stderr


def test_live_display_shows_steps_and_checks(proj, server):
    proj.goal("g", prompt="hi", verify={"checks": [{"name": "exists", "run": "test -f a.txt"}]})
    server.add(
        {"tool_calls": [{"name": "shell", "arguments": {"command": "touch a.txt && exit 3"}}]}, {"content": "done"}
    )
    result = proj.cli("goal", "g")
    assert "step 1  shell: touch a.txt && exit 3  -> exit 3" in result.stderr
    assert "✓ pass  exists" in result.stderr
    assert result.stdout.startswith("Goal achieved · 1 attempt · 2 steps")


def test_a_goal_file_by_path(proj, server):
    proj.write("elsewhere/task.yaml", "name: custom\nprompt: hi\n")
    server.add({"content": "ok"})
    out = proj.cli_json("goal", str(proj.root / "elsewhere/task.yaml"))
    assert (out["exit_code"], out["goal"], out["outcome"]) == (0, "custom", "achieved")


def test_sigint_cancels_a_run_and_kills_its_processes(proj, server):
    proj.goal("slow", prompt="wait")
    server.add({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 63.1"}}]})
    proc = proj.popen("goal", "slow", "--json", stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while "sleep 63.1" not in os.popen("ps -eo args").read() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=60)
    out = json.loads(stdout)
    assert proc.returncode == 130 and out["outcome"] == "cancelled" and out["stop_reason"] == "cancelled"
    assert "sleep 63.1" not in os.popen("ps -eo args").read()
    assert json.loads(proj.cli("runs", "--json").output)[-1]["outcome"] == "cancelled"


def test_sigint_while_the_first_reply_is_out_cancels_the_run_and_its_attempt(proj, server):
    """The first model call goes out before the run sets up; a Ctrl-C while it is out still ends the run and
    its first attempt `cancelled`, and leaves no claim behind."""
    proj.goal("slow", prompt="wait")
    server.add({"content": "too late", "delay": 60})
    proc = proj.popen("goal", "slow", "--json", stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not server.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=60)
    out = json.loads(stdout)
    assert proc.returncode == 130 and (out["outcome"], out["stop_reason"], out["attempts"]) == ("cancelled",) * 2 + (1,)
    shown = proj.cli_json("show", out["run_id"])
    events = shown["transcript"]
    assert [e["attempt"] for e in events if e["kind"] == "attempt"] == [1]
    assert [e["reason"] for e in events if e["kind"] == "stopped"] == ["cancelled"]
    assert not list((proj.root / ".runner/tamper").glob("*.json"))


@pytest.mark.skipif(
    shutil.which("bwrap") is None and os.environ.get("CI") != "true", reason="bubblewrap is not installed"
)
def test_validate_and_the_run_say_when_the_sandbox_is_on(proj, server):
    proj.goal("g", prompt="hi")
    server.add({"content": "ok"})
    jailed = "sandbox: bubblewrap jail (network on)"
    assert jailed in proj.cli("validate").output
    assert proj.cli("goal", "g").stderr.startswith(jailed)


def test_runs_loads_the_tools_only_to_settle_an_interrupted_run(proj):
    """`runner runs` with nothing to settle loads neither the tools' package nor asyncio (50 ms of its start on a
    slow machine), nor pydantic (runner.yaml's `store` is read without its models: 0.2 s of CPU on a slow
    machine); settling a run left `running` by a dead process still kills what it left (test_ghost_runs)."""
    out = python_lines(
        "import runpy, sys",
        f"sys.argv = ['runner', '-C', {str(proj.root)!r}, 'runs']",
        "try:",
        "    runpy.run_module('runner', run_name='__main__')",
        "except SystemExit:",
        "    pass",
        "print(sorted(m for m in ('asyncio', 'pydantic', 'runner.work.tools') if m in sys.modules))",
    )
    assert out == ["no runs yet (start one with `runner goal NAME`)", "[]"]


def test_validate_and_the_run_say_when_the_sandbox_is_off_and_why(proj, server, monkeypatch):
    proj.goal("g", prompt="hi")
    server.add({"content": "ok"})
    monkeypatch.setenv("RUNNER_SANDBOX", "off")
    fallback = "sandbox: off (RUNNER_SANDBOX=off in the environment)"
    assert fallback in proj.cli("validate").output
    assert proj.cli("goal", "g").stderr.startswith(fallback)


def test_help_and_version_do_not_load_the_loops():
    """`runner --help` answers without loading pydantic's models, the model client or the loops (0.7 s -> 0.17 s
    on the CI machine; benchmarks/bench_startup.py measures it), and `import runner` still gives every public name."""
    out = python_lines(
        "import sys, runner.cli",
        "heavy = ('pydantic', 'openai', 'psycopg', 'runner.config', 'runner.verify', 'runner.work')",
        "print(sorted(m for m in heavy if m in sys.modules))",
        "import runner",
        "print(runner.run_goal.__module__, [n for n in runner.__all__ if getattr(runner, n, None) is None])",
    )
    assert out == ["[]", "runner.verify.loop []"]
