"""The first hour (issue 10): what a newcomer meets in the history, in mistakes, at the terminal and in the docs."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from support import child_env

from runner.cli import main

REPO = Path(__file__).resolve().parent.parent
LONG_GOAL = "a-goal-with-a-rather-long-name-that-would-push-the-id-off"


def lines_of(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


# Reading the history


def test_runs_never_cuts_a_run_id_at_80_columns(proj, server, monkeypatch):
    proj.goal(LONG_GOAL, prompt="hi")
    server.add({"content": "done"})
    run_id = proj.cli_json("goal", LONG_GOAL)["run_id"]
    monkeypatch.setenv("COLUMNS", "80")
    table = proj.cli("runs").output
    assert run_id in table
    assert all(len(line) <= 80 for line in table.splitlines())


def test_runs_shows_the_newest_20_first_with_limit_and_all(proj, server):
    proj.goal("g", prompt="hi")
    server.add(*({"content": f"reply {i}"} for i in range(22)))
    ids = [proj.cli_json("goal", "g")["run_id"] for _ in range(22)]
    shown = json.loads(proj.cli("runs", "--json").output)
    assert [r["run_id"] for r in shown] == ids[::-1][:20]
    assert [r["run_id"] for r in json.loads(proj.cli("runs", "--limit", "2", "--json").output)] == ids[:-3:-1]
    assert len(json.loads(proj.cli("runs", "--all", "--json").output)) == 22
    table = proj.cli("runs").output
    assert table.index(ids[-1]) < table.index(ids[-2]) and ids[0] not in table
    assert "20 of 22 runs shown" in table


def test_runs_of_an_unknown_goal_is_bad_input(proj, server):
    proj.goal("g", prompt="hi")
    result = proj.cli("runs", "--goal", "nope")
    assert result.exit_code == 2 and "no goal named 'nope'" in result.stderr and "goals: g" in result.stderr
    assert proj.cli("runs", "--goal", "g").exit_code == 0


def retry_goal(proj) -> None:
    proj.write("verifiers/ok.py", "import pathlib, sys\nsys.exit(0 if pathlib.Path('ok.txt').exists() else 7)\n")
    checks = [{"name": "ok exists", "run": "python3 verifiers/ok.py"}]
    proj.goal("g", prompt="make ok.txt", verify={"max_attempts": 2, "checks": checks})


def test_show_prints_each_attempts_steps_and_checks(proj, server):
    retry_goal(proj)
    server.add(
        {"tool_calls": [{"name": "shell", "arguments": {"command": "echo not yet"}}]},
        {"content": "tried"},
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "ok.txt", "content": "x"}}]},
        {"content": "made ok.txt"},
    )
    run_id = proj.cli_json("goal", "g")["run_id"]
    shown = lines_of(proj.cli("show", run_id).output)
    first, second = shown.index("attempt 1/2"), shown.index("attempt 2/2")
    assert any("step 1  shell: echo not yet" in line for line in shown[first:second])
    assert "  ✗ fail  ok exists  exit 7" in shown[first:second]
    assert any("step 1  write_file: ok.txt" in line for line in shown[second:])
    assert "  ✓ pass  ok exists  exit 0" in shown[second:]


def test_show_reads_transcripts_written_before_check_kind(proj, server):
    retry_goal(proj)
    shell = [{"name": "shell", "arguments": {"command": "true"}}]
    server.add({"tool_calls": shell}, {"content": "nothing"}, {"tool_calls": shell}, {"content": "still nothing"})
    run_id = proj.cli_json("goal", "g")["run_id"]
    path = proj.root / ".runner" / "runs" / run_id / "transcript.jsonl"
    old = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "check":  # the old format: the check's own kind overwrote the event's
            event["kind"] = event.pop("check_kind")
        old.append(json.dumps(event))
    path.write_text("\n".join(old) + "\n")
    shown = proj.cli("show", run_id).output
    assert shown.count("✗ fail  ok exists  exit 7") == 2


def test_show_full_prints_whole_messages(proj, server):
    long_prompt = "Do the thing. " + "detail " * 100 + "THE END"
    proj.goal("g", prompt=long_prompt)
    server.add({"content": "done"})
    run_id = proj.cli_json("goal", "g")["run_id"]
    assert "THE END" not in proj.cli("show", run_id).output
    assert "THE END" in proj.cli("show", run_id, "--full").output


def test_a_prefix_of_several_runs_lists_them(proj, server):
    proj.goal("g", prompt="hi")
    server.add({"content": "one"}, {"content": "two"})
    ids = [proj.cli_json("goal", "g")["run_id"] for _ in range(2)]
    prefix = next(ids[0][:n] for n in range(len(ids[0]), 0, -1) if ids[1].startswith(ids[0][:n]))
    result = proj.cli("show", prefix)
    assert result.exit_code == 2
    assert f"2 runs start with {prefix!r}" in result.stderr and all(i in result.stderr for i in ids)


def test_check_prints_the_head_and_tail_of_a_failing_checks_output(proj, server):
    script = "print('first line')\nfor i in range(200): print('noise', i)\nprint('1 failed, 9 passed')\n"
    proj.write("verifiers/long.py", script + "raise SystemExit(1)\n")
    proj.goal("g", prompt="hi", verify={"checks": [{"name": "suite", "run": "python3 verifiers/long.py"}]})
    result = proj.cli("check", "g")
    assert result.exit_code == 1
    assert "first line" in result.stderr and "1 failed, 9 passed" in result.stderr and "noise 100" not in result.stderr


def test_show_json_and_goal_json_agree(proj, server):
    proj.goal("g", prompt="hi", verify={"checks": [{"name": "true", "run": "true"}]})
    server.add({"content": "done"})
    ran = proj.cli_json("goal", "g")
    shown = proj.cli_json("show", ran["run_id"])
    for key in ("run_id", "goal", "outcome", "attempts", "steps", "tokens", "stop_reason", "final_message", "error"):
        assert shown[key] == ran[key], key
    assert "id" not in shown and "id" not in ran
    assert shown["checks"][0]["passed"] is True and ran["checks"][0]["passed"] is True
    assert {"name", "passed", "exit_code"} <= set(shown["checks"][0])


# Catching mistakes before they cost tokens


def test_validate_reports_check_scripts_that_do_not_exist(proj, server):
    checks = [
        {"name": "py", "run": "python3 verifiers/nope.py"},
        {"name": "sh", "run": "sh verifiers/x.sh data.json"},
        {"name": "exe", "run": "./check"},
        {"name": "module", "run": "python3 -m pytest -q"},
        {"name": "builtin", "run": "test -f out.txt"},
    ]
    proj.goal("g", prompt="hi", verify={"checks": checks})
    result = proj.cli("validate")
    assert result.exit_code == 2
    problems = result.stderr.splitlines()
    assert len(problems) == 3
    for line, word in zip(problems, ("verifiers/nope.py", "verifiers/x.sh", "./check"), strict=True):
        assert re.match(rf"goals/g\.yaml:\d+: verify\.checks\[\d\]\.run: {re.escape(word)} does not exist", line)


def test_goal_reports_mistakes_before_the_first_model_call(proj, server):
    proj.write("goals/g.yaml", "prompt: ''\nverify:\n  max_attempt: 2\n")
    result = proj.cli("goal", "g")
    assert result.exit_code == 2 and server.requests == []
    assert "goals/g.yaml:1: prompt: the prompt is empty" in result.stderr
    assert "goals/g.yaml:3: verify.max_attempt: unknown field; did you mean `max_attempts`?" in result.stderr


def test_yaml_syntax_errors_are_one_line_with_file_line_and_hint(proj):
    proj.write("goals/g.yaml", "prompt: fix it\n  tools: [shell]\n")
    proj.write("goals/t.yaml", "prompt: fix it\nverify:\n\tmax_attempts: 2\n")
    result = proj.cli("validate")
    assert result.exit_code == 2
    problems = result.stderr.splitlines()
    assert len(problems) == 2 and all("(hint: " in p for p in problems)
    assert problems[0].startswith("goals/g.yaml:2: invalid YAML: mapping values are not allowed here")
    assert problems[1].startswith("goals/t.yaml:3: invalid YAML:") and "tabs" in problems[1]


def test_commands_refuse_outside_a_project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (["runs"], ["goal", "-p", "hi"], ["validate"], ["list"], ["show", "x"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2, args
        assert "not a runner project: run `runner init` or pass -C DIR" in result.stderr
    assert list(tmp_path.iterdir()) == []
    assert CliRunner().invoke(main, ["goal", "--help"]).exit_code == 0


def test_project_flag_with_a_missing_folder_is_bad_input(tmp_path):
    result = CliRunner().invoke(main, ["-C", str(tmp_path / "nowhere"), "runs"])
    assert result.exit_code == 2 and "no such folder" in result.stderr
    assert not (tmp_path / "nowhere").exists()


def test_project_flag_after_the_subcommand(proj, server, tmp_path, monkeypatch):
    proj.goal("haiku", prompt="hi")
    server.add({"content": "done"})
    monkeypatch.chdir(tmp_path.parent)
    result = CliRunner().invoke(main, ["goal", "haiku", "-C", str(proj.root), "--quiet"])
    assert result.exit_code == 0 and result.output.startswith("Goal achieved")
    assert CliRunner().invoke(main, ["runs", f"--project={proj.root}", "--json"]).exit_code == 0


def test_init_ignores_state_and_keys_and_keeps_the_script_to_the_example(tmp_path, monkeypatch):
    monkeypatch.delenv("RUNNER_MODEL", raising=False)
    demo = tmp_path / "demo"
    assert CliRunner().invoke(main, ["init", str(demo)]).exit_code == 0
    assert {".runner/", ".env"} <= set((demo / ".gitignore").read_text().splitlines())
    assert "model: script:models/haiku.yaml" in (demo / "goals/haiku.yaml").read_text()
    settings = (demo / "runner.yaml").read_text()
    assert not any(line.startswith("model:") for line in settings.splitlines()) and "# model: {name:" in settings
    (demo / "goals/mine.yaml").write_text("prompt: fix the failing test\n")
    result = CliRunner().invoke(main, ["-C", str(demo), "goal", "mine"])
    assert result.exit_code == 2 and "goals/mine.yaml:1: model: no model is set; give `model:`" in result.stderr
    assert "RUNNER_MODEL" in result.stderr
    (demo / ".gitignore").write_text("node_modules/\n.env\n")
    CliRunner().invoke(main, ["init", str(demo)])
    assert (demo / ".gitignore").read_text() == "node_modules/\n.env\n.runner/\n"


# Seeing work happen


def run_at_a_terminal(proj, *args: str) -> str:
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "-C", str(proj.root), *args],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env=child_env(),
        close_fds=True,
    )
    os.close(terminal)
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([controller], [], [], 0.2)[0]:
            try:
                chunk = os.read(controller, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    proc.wait(10)
    os.close(controller)
    return seen.decode(errors="replace")


def test_a_terminal_shows_the_step_under_way_with_elapsed_time(proj, server):
    proj.goal("g", prompt="hi")
    server.add(
        {"delay": 1.0, "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 1"}}]}, {"content": "done"}
    )
    screen = run_at_a_terminal(proj, "goal", "g")
    assert re.search(r"step 1  thinking  \S*\d+\.\ds", screen)
    assert re.search(r"step 1  shell: sleep 1  \S*\d+\.\ds", screen)
    assert "step 1  shell: sleep 1  -> exit 0" in screen


def test_piped_output_is_plain_and_never_wrapped_at_80_columns(proj, server):
    command = "echo " + "word " * 30
    proj.goal("g", prompt="hi")
    server.add({"tool_calls": [{"name": "shell", "arguments": {"command": command}}]}, {"content": "done"})
    result = proj.subprocess("goal", "g")
    step = next(line for line in result.stderr.splitlines() if "step 1" in line)
    assert len(step) > 80 and "-> exit 0" in step and "\x1b" not in result.stderr and "thinking" not in result.stderr


def test_feedback_at_the_terminal_keeps_its_head_and_tail(proj, server):
    script = "print('collected 40 items')\nfor i in range(60): print('FAILED test', i)\nprint('=== 60 failed ===')\n"
    proj.write("verifiers/suite.py", script + "raise SystemExit(1)\n")
    checks = [{"name": "suite", "run": "python3 verifiers/suite.py"}]
    proj.goal("g", prompt="hi", verify={"max_attempts": 2, "checks": checks})
    server.add({"content": "a"}, {"content": "b"}, {"content": "c"})
    stderr = proj.subprocess("goal", "g").stderr
    feedback = stderr[stderr.index("feedback sent back") :]
    assert "=== 60 failed ===" in feedback and "lines ...]" in feedback


def test_a_provider_error_is_said_once(proj, server):
    proj.goal("g", prompt="hi")
    server.add({"status": 400, "error": "model overloaded today"})
    result = proj.subprocess("goal", "g")
    assert result.returncode == 3
    assert (result.stdout + result.stderr).count("model overloaded today") == 1


def test_a_refused_connection_on_this_machine_is_one_line_without_retries(proj, server):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    proj.goal("g", prompt="hi", model={"base_url": f"http://127.0.0.1:{port}/v1", "max_retries": 4})
    result = proj.subprocess("goal", "g")
    assert result.returncode == 3
    said = [line for line in (result.stdout + result.stderr).splitlines() if "connection refused" in line]
    assert len(said) == 1 and "0 retries" in said[0] and f"127.0.0.1:{port}" in said[0]


def entry_project(proj) -> None:
    proj.goal("g", prompt="hi", verify={"checks": [{"run": "true"}]})
    proj.write("schedules/team.yaml", [{"goal": "g", "every": "1h"}, {"goal": "g", "cron": "0 9 * * 1-5"}])


def test_list_shows_entry_ids_durations_as_written_and_whether_a_daemon_runs(proj, server):
    entry_project(proj)
    out = proj.cli("list").output
    assert "team/g/every" in out and "team/g/cron" in out and "every 1h" in out and "3600" not in out
    assert "daemon: not running" in out
    rows = json.loads(proj.cli("list", "--json").output)
    assert json.loads(proj.cli("list", "--json").output) == rows  # the same next fire each time
    assert proj.cli("pause", rows[0]["entry"]).exit_code == 0


def test_list_shows_the_last_outcome_of_each_entry(proj, server):
    from runner.config import Catalog
    from runner.store import open_store

    entry_project(proj)
    store = open_store(Catalog.load(proj.root).project)
    run_id = store.new_run("g", "every", "team/g/every")
    store.finish_run(run_id, "not_achieved")
    server.add({"content": "done"})
    proj.cli_json("goal", "g")  # a manual run: no entry's
    rows = {r["entry"]: r for r in json.loads(proj.cli("list", "--json").output)}
    assert rows["team/g/every"]["last_outcome"] == "not_achieved"
    assert rows["team/g/cron"]["last_outcome"] is None


def every_command(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found = []
    for name, command in group.commands.items():
        found.append(((*path, name), command))
        if isinstance(command, click.Group):
            found += every_command(command, (*path, name))
    return found


def test_every_option_has_help_and_every_command_an_example():
    assert "Example:" in CliRunner().invoke(main, ["--help"]).output
    for path, command in every_command(main):
        for param in command.params:
            if isinstance(param, click.Option) and "--help" not in param.opts:
                assert param.help, f"runner {' '.join(path)} {param.opts[0]} has no help text"
        assert "Example:" in CliRunner().invoke(main, [*path, "--help"]).output, f"runner {' '.join(path)}"


# Docs inside the repository


def example_blocks(markdown: str) -> list[tuple[str, str]]:
    """(path, body) of each fenced block whose first line is `# PATH` naming a file of the example project."""
    found = []
    for block in re.findall(r"```(?:yaml|python)\n(.*?)```", markdown, flags=re.S):
        first, _, body = block.partition("\n")
        path = first.removeprefix("# ").strip()
        if first.startswith("# ") and (REPO / path).is_file():
            found.append((path, body))
    return found


@pytest.mark.parametrize("doc", ["README.md", "docs/reference.md"])
def test_example_blocks_equal_the_real_example_files(doc):
    blocks = example_blocks((REPO / doc).read_text())
    assert blocks, f"{doc} shows none of the example files"
    for path, body in blocks:
        assert body == (REPO / path).read_text(), f"{doc}: the block of {path} differs from the file"


def test_readme_links_only_to_files_in_the_repository():
    for target in re.findall(r"\]\(([^)#]+)", (REPO / "README.md").read_text()):
        if not target.startswith("http"):
            path = (REPO / target).resolve()
            assert path.is_relative_to(REPO) and path.exists(), f"README links to {target}, outside the repository"


def test_the_reference_documents_every_field():
    from runner.config import models, schedules

    reference = (REPO / "docs/reference.md").read_text()
    documented = (
        models.Goal,
        models.ModelConfig,
        models.Limits,
        models.Verify,
        models.Check,
        models.ToolEntry,
        models.McpServer,
        models.Settings,
        models.DaemonSettings,
        models.WebhookSettings,
        schedules.Entry,
    )
    for model in documented:
        for name in set(model.model_fields) - {"root", "source", "id"}:
            assert re.search(rf"`[^`\n]*\b{name}\b[^`\n]*`", reference), f"{model.__name__}.{name} is not documented"
