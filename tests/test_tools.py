"""The built-in tools: confinement to the workdir, protected paths, caps, the scrubbed environment."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from support import KEY, call

from runner.config import Goal, ModelConfig, ToolEntry
from runner.work.tools import Toolbox
from runner.work.tools.process import OUTPUT_CAP, cap


def toolbox(root: Path, workdir: str = ".", **fields) -> Toolbox:
    goal = Goal(name="g", prompt="p", model=ModelConfig(name="m"), root=root, workdir=workdir, **fields)
    return Toolbox.for_goal(goal)


def use(box: Toolbox, name: str, **arguments) -> str:
    return asyncio.run(box.call(name, json.dumps(arguments)))


@pytest.fixture
def box(tmp_path: Path) -> Toolbox:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "outside.txt").write_text("private")
    return toolbox(tmp_path, "work", protect=["work/locked/**"])


def test_read_write_edit_list_search(box: Toolbox, tmp_path: Path):
    assert use(box, "read_file", path="notes.txt") == "one\ntwo\nthree\n"
    assert use(box, "read_file", path="notes.txt", offset=2, limit=1).startswith("two\n[1 more lines")
    assert use(box, "write_file", path="deep/new/file.txt", content="héllo") == "wrote 6 bytes to deep/new/file.txt"
    assert (tmp_path / "work/deep/new/file.txt").read_text() == "héllo"
    assert use(box, "edit_file", path="notes.txt", old_text="two", new_text="2") == "edited notes.txt"
    assert (tmp_path / "work/notes.txt").read_text() == "one\n2\nthree\n"
    assert "found 0" not in use(box, "edit_file", path="notes.txt", old_text="zzz", new_text="x")
    assert "not found" in use(box, "edit_file", path="notes.txt", old_text="zzz", new_text="x")
    use(box, "write_file", path="twice.txt", content="a a")
    assert "found 2 times" in use(box, "edit_file", path="twice.txt", old_text="a", new_text="b")
    assert use(box, "list_files").splitlines() == ["deep/new/file.txt", "notes.txt", "twice.txt"]
    assert use(box, "list_files", pattern="*.txt").count("\n") == 2
    assert use(box, "search_files", pattern="thr+ee") == "notes.txt:3:three"
    assert use(box, "search_files", pattern="(").startswith("error: invalid regular expression")


def test_edit_file_errors_say_what_to_do_next(box: Toolbox, tmp_path: Path):
    use(box, "write_file", path="notes.md", content="# Notes\n\nThe colour of the sky.\nA colour.\n")
    several = use(box, "edit_file", path="notes.md", old_text="colour", new_text="color")
    assert several.startswith("error: old_text found 2 times in notes.md") and "replace_all" in several
    assert (tmp_path / "work/notes.md").read_text().count("colour") == 2  # nothing changed
    done = use(box, "edit_file", path="notes.md", old_text="colour", new_text="color", replace_all=True)
    assert done == "edited notes.md (2 replacements)"
    assert (tmp_path / "work/notes.md").read_text() == "# Notes\n\nThe color of the sky.\nA color.\n"
    missed = use(box, "edit_file", path="notes.md", old_text="version = 1.2.0", new_text="x")
    assert missed.endswith("the file holds exactly:\n```\n# Notes\n\nThe color of the sky.\nA color.\n```")
    use(box, "write_file", path="big.txt", content="line\n" * 1000)
    assert use(box, "edit_file", path="big.txt", old_text="zzz", new_text="x").endswith(
        "read it with read_file to see its exact text"
    )
    missing = use(box, "edit_file", path="new.txt", old_text="", new_text="a")
    assert missing == "error: new.txt does not exist; the working directory holds: big.txt, notes.md, notes.txt"
    wrong = use(box, "read_file", path="test_verifiers/deep/test_calc.py")
    assert wrong.endswith("does not exist; the working directory holds: big.txt, notes.md, notes.txt")
    use(box, "write_file", path="src/a.py", content="")
    assert use(box, "read_file", path="src/b.py").endswith("src/b.py does not exist; src/ holds: a.py")
    assert (
        use(box, "edit_file", path="notes.md", old_text="A color.", new_text="B", replace_all=True) == "edited notes.md"
    )
    assert "replace_all" in use(box, "edit_file", path="notes.md", old_text="B", new_text="C", replace_all="yes")


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "deep/../../outside.txt", "/tmp"])
def test_paths_outside_the_workdir_are_refused(box: Toolbox, path: str):
    for name, args in [
        ("read_file", {}),
        ("write_file", {"content": "x"}),
        ("list_files", {}),
        ("edit_file", {"old_text": "a", "new_text": "b"}),
    ]:
        result = use(box, name, path=path, **args)
        assert result.startswith("error: refused:") and "outside the working directory" in result


def test_symlinks_out_of_the_workdir_are_refused(box: Toolbox, tmp_path: Path):
    (tmp_path / "work" / "link").symlink_to(tmp_path / "outside.txt")
    (tmp_path / "work" / "dirlink").symlink_to(tmp_path)
    assert "outside the working directory" in use(box, "read_file", path="link")
    assert "outside the working directory" in use(box, "write_file", path="link", content="pwned")
    assert "outside the working directory" in use(box, "write_file", path="dirlink/outside.txt", content="x")
    assert (tmp_path / "outside.txt").read_text() == "private"
    assert "outside.txt" not in use(box, "list_files")
    assert use(box, "search_files", pattern="private") == "no matches"


def test_protected_paths_cannot_be_written(tmp_path: Path):
    (tmp_path / "verifiers").mkdir()
    (tmp_path / "verifiers/check.py").write_text("print('ok')")
    (tmp_path / ".env").write_text("SOME_KEY=1")
    (tmp_path / "check.sh").write_text("exit 0")
    box = toolbox(
        tmp_path,
        protect=["secrets/**"],
        verify={"checks": [{"run": "sh check.sh"}, {"run": "python3 verifiers/check.py haiku.txt"}]},
    )
    for path in [
        "verifiers/check.py",
        "verifiers/new.py",
        "goals/x.yaml",
        "schedules/s.yaml",
        "runner.yaml",
        ".runner/runs.db",
        "secrets/a/b.txt",
        "check.sh",
    ]:
        result = use(box, "write_file", path=path, content="x")
        assert result.startswith("error: refused:") and "protected" in result, path
    assert "protected" in use(box, "edit_file", path="check.sh", old_text="0", new_text="1")
    assert "protected" in use(box, "read_file", path=".env")
    assert use(box, "read_file", path="verifiers/check.py") == "print('ok')"
    assert use(box, "write_file", path="haiku.txt", content="ok").startswith("wrote")
    assert ".env" not in use(box, "list_files")


def test_long_outputs_keep_head_and_tail(box: Toolbox):
    text = "".join(f"line {i}\n" for i in range(100_000))
    out = cap(text)
    assert out.startswith("line 0\n") and out.endswith("line 99999\n") and "characters cut" in out
    shell = use(box, "shell", command="seq 1 300000")
    assert shell.startswith("exit code 0\n1\n2\n") and shell.rstrip().endswith("300000") and "bytes cut" in shell
    assert len(shell) < OUTPUT_CAP + 200


def test_shell_timeout_kills_the_process_group(box: Toolbox, tmp_path: Path):
    result = use(box, "shell", command="(sleep 31.7; echo late > late.txt) & sleep 31.7", timeout=0.5)
    assert result.startswith("timed out after 0.5s and was killed")
    asyncio.run(asyncio.sleep(0.3))
    ps = os.popen("ps -eo args").read()
    assert "sleep 31.7" not in ps
    assert not (tmp_path / "work/late.txt").exists()


def test_command_tool_gets_json_on_stdin_never_a_shell_string(tmp_path: Path):
    tool = ToolEntry(
        name="echo",
        description="echo",
        run="cat",
        parameters={"type": "object", "properties": {"text": {"type": "string"}}},
    )
    box = toolbox(tmp_path, tools=[tool])
    hostile = "$(touch pwned); `touch pwned2`; ' \" && rm -rf /"
    assert json.loads(use(box, "echo", text=hostile)) == {"text": hostile}
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_secrets_stay_out_of_tools_transcript_and_output(proj, server, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-passed-on")
    monkeypatch.setenv("DB_PASSWORD", "hunter2-db")
    monkeypatch.setenv("PLAIN_SETTING", "visible")
    proj.goal(
        "env",
        prompt="show env",
        env=["GITHUB_TOKEN"],
        verify={"checks": [{"name": "env", "run": "env > check-env.txt"}]},
    )
    server.add({"tool_calls": [call("shell", command="env")]}, {"content": "done"})
    result = proj.cli("goal", "env")
    tool_output = next(m for m in server.requests[1]["messages"] if m["role"] == "tool")["content"]
    assert "PLAIN_SETTING=visible" in tool_output and "GITHUB_TOKEN=ghp-passed-on" in tool_output
    assert KEY not in tool_output and "hunter2-db" not in tool_output and "TEST_API_KEY" not in tool_output
    check_env = (proj.root / "check-env.txt").read_text()
    assert KEY not in check_env and "hunter2-db" not in check_env and "RUNNER_GOAL=env" in check_env
    for path in (proj.root / ".runner").rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in result.output and KEY not in result.stderr
