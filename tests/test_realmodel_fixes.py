"""What real models do that a script rarely does, and how runner copes (issue 15).

A model answers feedback in prose instead of acting (the nudge), writes its tool call as text
instead of through `tool_calls` (text tool calls), or meets a check that fails without a word
(the feedback of a silent check). Each test replays such a model on the scripted server.
"""

from __future__ import annotations

import json

import pytest
from support import call

from runner.work.textcalls import find_calls

TOOLS = {"read_file", "write_file", "edit_file", "shell"}
TOTAL = [{"name": "total", "run": "grep -qx 41 total.txt"}]


def total_goal(proj, checks=TOTAL, model=None, **verify):
    proj.write("sales.csv", "item,amount\napples,12\npears,7\nplums,9\nfigs,13\n")
    fields = {
        "prompt": "Write the total of the amount column of sales.csv to total.txt.",
        "verify": {"checks": checks, **verify},
    }
    if model is not None:
        fields["model"] = model
    proj.goal("total", **fields)


def write(path: str, content: str) -> dict:
    return {"tool_calls": [call("write_file", path=path, content=content)]}


def events(proj, run_id: str, kind: str | None = None) -> list[dict]:
    path = proj.root / ".runner" / "runs" / run_id / "transcript.jsonl"
    found = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in found if kind is None or e["kind"] == kind]


# --- tool calls written as text: what counts as one


@pytest.mark.parametrize(
    "content",
    [
        "```json\n{'name': 'write_file', 'arguments': {'path': 'total.txt', 'content': '41'}}\n```",
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "total.txt", "content": "41"}}\n</tool_call>',
        'I will write the file now.\n{"name": "write_file", "arguments": {"path": "total.txt", "content": "41",}}',
        "{'name': 'write_file', 'parameters': {'path': 'total.txt', 'content': '41'}}",
        '{"name": "write_file", "arguments": "{\\"path\\": \\"total.txt\\", \\"content\\": \\"41\\"}"}',
        '```\n{"type": "function", "function": {"name": "write_file", "arguments": {"path": "total.txt", '
        '"content": "41"}}}\n```',
        '{"name": "write_file", "arguments": {"path": "total.txt", "content": """41"""}}',
    ],
    ids=[
        "fenced-single-quotes",
        "tags",
        "bare-after-prose-trailing-comma",
        "parameters",
        "string-arguments",
        "openai-shape",
        "python-triple-quotes",
    ],
)
def test_a_call_written_as_text_is_recognised(content):
    assert [(c.name, json.loads(c.arguments)) for c in find_calls(content, TOOLS)] == [
        ("write_file", {"path": "total.txt", "content": "41"})
    ]


def test_several_calls_as_text_keep_their_order():
    content = (
        '<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>\n'
        "<tool_call>{'name': 'shell', 'arguments': {'command': 'ls', 'timeout': null}}</tool_call>"
    )
    calls = find_calls(content, TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("read_file", {"path": "a"}),
        ("shell", {"command": "ls", "timeout": None}),
    ]


@pytest.mark.parametrize(
    "content",
    [
        '{"name": "delete_everything", "arguments": {"path": "."}}',
        "Use write_file to write 41 to total.txt.",
        '```python\nprint({"name": "write_file"})\n```',
        '{"name": "write_file", "arguments": ["total.txt", "41"]}',
        '{"name": "write_file", "arguments": {"path": "total.txt", "content": "41"}',
        "",
    ],
    ids=["unknown-tool", "prose", "code", "arguments-not-an-object", "unclosed", "empty"],
)
def test_what_is_not_plainly_a_call_is_not_one(content):
    assert find_calls(content, TOOLS) == []


# --- tool calls written as text: in the work loop

TEXT_CALL = "```json\n{'name': 'write_file', 'arguments': {'path': 'total.txt', 'content': '41\\n'}}\n```"


def test_a_text_call_runs_and_the_provider_sees_a_proper_tool_call(proj, server):
    total_goal(proj)
    server.add({"content": TEXT_CALL}, {"content": "total.txt holds 41."})
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["attempts"], out["steps"]) == ("achieved", 1, 2)
    assert (proj.root / "total.txt").read_text() == "41\n"
    history = server.requests[1]["messages"]
    assistant, tool = history[-2], history[-1]
    assert assistant["content"] is None
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["write_file"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"path": "total.txt", "content": "41\n"}
    assert tool["role"] == "tool" and tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
    assert tool["content"].startswith("wrote")
    [event] = events(proj, out["run_id"], "text_tool_call")
    assert event["names"] == ["write_file"] and event["executed"] is True and event["content"] == TEXT_CALL


def test_with_text_tool_calls_off_the_model_is_told_nothing_ran(proj, server):
    total_goal(proj, model={"text_tool_calls": "off"})
    server.add({"content": TEXT_CALL}, write("total.txt", "41\n"), {"content": "done"})
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["attempts"], out["steps"]) == ("achieved", 1, 3)
    told = server.requests[1]["messages"][-1]
    assert told["role"] == "user" and "not executed" in told["content"] and "write_file" in told["content"]
    assert server.requests[1]["messages"][-2] == {"role": "assistant", "content": TEXT_CALL}
    [event] = events(proj, out["run_id"], "text_tool_call")
    assert event["executed"] is False


INVENTED = '```json\n{"name": "add_function", "arguments": {"path": "total.txt", "function": "is_even"}}\n```'


def test_a_text_call_of_an_unknown_tool_is_not_run_and_the_model_is_told_its_tools(proj, server):
    total_goal(proj, max_attempts=1)
    server.add({"content": INVENTED}, write("total.txt", "41\n"), {"content": "done"})
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["steps"]) == ("achieved", 3)
    told = server.requests[1]["messages"][-1]
    assert (
        told["role"] == "user" and "add_function, which is not a tool you have, so nothing was run" in told["content"]
    )
    assert "read_file, write_file, edit_file" in told["content"]
    assert server.requests[1]["messages"][-2] == {"role": "assistant", "content": INVENTED}
    assert [r.get("tool_choice") for r in server.requests] == [None, "required", None]  # asked for a real call
    [event] = events(proj, out["run_id"], "text_tool_call")
    assert event["names"] == ["add_function"] and event["executed"] is False and event["unknown"] is True


def test_an_invented_tool_is_answered_once_an_attempt_and_never_run(proj, server):
    total_goal(proj, max_attempts=1)
    server.add({"content": '{"name": "rm_rf", "arguments": {"path": "."}}'}, {"content": INVENTED})
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["steps"]) == ("not_achieved", 2)
    assert len(server.requests) == 2 and (proj.root / "sales.csv").exists()
    assert [e["names"] for e in events(proj, out["run_id"], "text_tool_call")] == [["rm_rf"]]


def test_prose_that_merely_holds_braces_is_not_an_invented_call(proj, server):
    total_goal(proj, max_attempts=1)
    server.add({"content": 'Use {"name": "x"} as a template, or {"arguments": {}} alone.'})
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["steps"]) == ("not_achieved", 1)
    assert events(proj, out["run_id"], "text_tool_call") == []


# --- the nudge: a turn after feedback that calls no tool

PROSE = {"content": "The grep command is not finding 41 in total.txt because the total is different."}


def test_prose_after_feedback_is_answered_once_within_the_attempt(proj, server):
    total_goal(proj)
    server.add(write("total.txt", "42\n"), {"content": "done"}, PROSE, write("total.txt", "41\n"), {"content": "ok"})
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["attempts"]) == ("achieved", 2)
    nudge = server.requests[3]["messages"][-1]
    assert nudge["role"] == "user" and "You have not changed any file" in nudge["content"]
    assert "write_file, edit_file" in nudge["content"] and "read_file" not in nudge["content"]  # tools that act
    assert "so they still fail. It passes only when total.txt has a line that is exactly `41`. Call" in nudge["content"]
    assert server.requests[3]["messages"][-2] == {"role": "assistant", "content": PROSE["content"]}
    [event] = events(proj, out["run_id"], "nudge")
    assert event["step"] == 1 and event["text"] == nudge["content"]
    assert [r.get("tool_choice") for r in server.requests] == [None, None, None, "required", None]
    run = proj.cli_json("show", out["run_id"])
    assert [a["steps"] for a in run["attempt_rows"]] == [2, 3]


def test_an_attempt_that_only_reads_is_nudged_too(proj, server):
    total_goal(proj, max_attempts=2)
    read = {"tool_calls": [call("read_file", path="total.txt")]}
    server.add(
        write("total.txt", "42\n"), {"content": "done"}, read, PROSE, write("total.txt", "41\n"), {"content": "ok"}
    )
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["attempts"]) == ("achieved", 2)
    [event] = events(proj, out["run_id"], "nudge")
    assert event["step"] == 2


def test_the_nudge_is_given_once_per_attempt(proj, server):
    total_goal(proj, max_attempts=3, stuck_after=5)
    server.add(write("total.txt", "42\n"), {"content": "done"}, PROSE, PROSE, PROSE, PROSE)
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["attempts"], out["steps"]) == ("not_achieved", 3, 6)
    assert len(events(proj, out["run_id"], "nudge")) == 2  # one in attempt 2, one in attempt 3


def test_no_nudge_before_any_feedback_nor_after_a_tool_call(proj, server):
    total_goal(proj, max_attempts=2)
    server.add(PROSE, write("total.txt", "42\n"), {"content": "done"})
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["attempts"], out["steps"]) == ("not_achieved", 2, 3)
    assert events(proj, out["run_id"], "nudge") == []


def test_nudge_can_be_turned_off(proj, server):
    total_goal(proj, max_attempts=2, nudge=False)
    server.add(write("total.txt", "42\n"), {"content": "done"}, PROSE)
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["attempts"], out["steps"]) == ("not_achieved", 2, 3)
    assert events(proj, out["run_id"], "nudge") == []


# --- feedback that leads to action


def test_feedback_says_to_act_with_the_tools(proj, server):
    total_goal(proj, max_attempts=2)
    server.add(write("total.txt", "42\n"), {"content": "done"}, write("total.txt", "41\n"), {"content": "ok"})
    proj.cli_json("goal", "total")
    feedback = server.requests[2]["messages"][-1]["content"]
    assert "call the tools now" in feedback and "Do not explain" in feedback


def test_a_silent_check_shows_its_command_and_the_file_it_reads(proj, server):
    total_goal(proj, max_attempts=2)
    server.add(write("total.txt", "42\n"), {"content": "done"}, write("total.txt", "41\n"), {"content": "ok"})
    out = proj.cli_json("goal", "total")
    assert out["outcome"] == "achieved"
    feedback = server.requests[2]["messages"][-1]["content"]
    assert "command: grep -qx 41 total.txt" in feedback
    assert "exit code 1, and the command printed nothing" in feedback
    assert "total.txt (3 bytes):\n```\n42\n```" in feedback


def test_a_silent_check_says_when_the_file_it_reads_is_missing(proj, server):
    total_goal(proj, checks=[{"name": "total", "run": "grep -sqx 41 total.txt"}], max_attempts=2)
    server.add(
        {"tool_calls": [call("read_file", path="sales.csv")]},
        {"content": "The total is 41."},
        write("total.txt", "41\n"),
        {"content": "ok"},
    )
    out = proj.cli_json("goal", "total")
    assert out["outcome"] == "achieved"
    assert "total.txt does not exist." in server.requests[2]["messages"][-1]["content"]


def test_a_silent_script_check_shows_the_script_and_long_files_are_cut(proj, server):
    proj.write("verifiers/out.sh", "set -e\n" + "".join(f"test -s out/{i}.txt  # line {i}\n" for i in range(40)))
    proj.write("notes.txt", "n" * 5000)
    checks = [{"name": "outputs", "run": "sh verifiers/out.sh"}, {"name": "notes", "run": "grep -q zzz notes.txt"}]
    total_goal(proj, checks=checks, max_attempts=2)
    server.add({"content": "done"}, {"content": "done"}, {"content": "still done"})
    out = proj.cli_json("goal", "total")
    assert out["outcome"] == "not_achieved"
    feedback = server.requests[1]["messages"][-1]["content"]
    assert "verifiers/out.sh (" in feedback and "test -s out/0.txt  # line 0" in feedback
    assert "# line 8\n" in feedback and "# line 9\n" not in feedback and "(more follows)" in feedback
    assert "notes.txt (5000 bytes)" in feedback and "n" * 700 not in feedback


def test_a_check_with_output_keeps_its_output_and_shows_no_files(proj, server):
    total_goal(proj, checks=[{"name": "total", "run": "cat total.txt; grep -qx 41 total.txt"}], max_attempts=2)
    server.add(write("total.txt", "42\n"), {"content": "done"}, write("total.txt", "41\n"), {"content": "ok"})
    proj.cli_json("goal", "total")
    feedback = server.requests[2]["messages"][-1]["content"]
    assert "exit code 1\n42" in feedback and "printed nothing" not in feedback and "(3 bytes)" not in feedback


def test_the_terminal_shows_the_nudge_and_the_text_call(proj, server):
    total_goal(proj)
    server.add(
        {"content": TEXT_CALL.replace("41", "42")},
        {"content": "done"},
        PROSE,
        write("total.txt", "41\n"),
        {"content": "ok"},
    )
    shown = proj.subprocess("goal", "total")
    assert shown.returncode == 0
    assert "tool call written as text (write_file): run as calls" in shown.stderr
    assert "no tool called after feedback: told to use the tools" in shown.stderr


def test_a_provider_that_refuses_tool_choice_is_asked_again_without_it(proj, server):
    total_goal(proj, max_attempts=2)
    refuse = {"status": 400, "error": "tool_choice 'required' is not supported"}
    server.add(write("total.txt", "42\n"), {"content": "done"}, PROSE, refuse, write("total.txt", "41\n"))
    server.add({"content": "ok"})
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["attempts"]) == ("achieved", 2)
    assert [r.get("tool_choice") for r in server.requests][3:5] == ["required", None]


# --- feedback: what the attempt changed, where the checks look, the task again


def test_feedback_names_what_the_attempt_changed_and_the_file_the_check_reads(proj, server):
    total_goal(proj, max_attempts=4, stuck_after=5)
    proj.write("notes.txt", "old\n")
    server.add(
        write("total_number.txt", "41\n"),
        {"content": "done"},
        write("notes.txt", "new and longer\n"),
        {"content": "done"},
        {"content": "nothing more"},
        {"content": "still nothing"},  # after the nudge
        {"content": "last"},
        {"content": "last again"},
    )
    out = proj.cli_json("goal", "total")
    assert out["outcome"] == "not_achieved"
    first, second, third = (
        m["messages"][-1]["content"] for m in (server.requests[2], server.requests[4], server.requests[6])
    )
    assert "Files your attempt changed: total_number.txt (new). It did not change total.txt, which the failing" in first
    assert "Files your attempt changed: notes.txt. It did not change total.txt" in second
    assert "Your attempt changed no file. It did not change total.txt" in third
    for feedback in (first, second, third):
        assert "The task, as given: Write the total of the amount column of sales.csv to total.txt." in feedback
        assert feedback.index("It did not change") < feedback.index("The task, as given") < feedback.index("Do not")


def test_feedback_never_points_the_agent_at_a_protected_file(proj, server):
    proj.write("verifiers/check.py", "import sys\nsys.exit(0 if open(sys.argv[1]).read() else 1)\n")
    check = "python3 verifiers/check.py sales.csv && grep -qx 41 total.txt"  # sales.csv exists: a protected input
    total_goal(proj, checks=[{"name": "total", "run": check}], max_attempts=2)
    server.add(write("other.txt", "x"), {"content": "done"}, write("total.txt", "41\n"), {"content": "ok"})
    out = proj.cli_json("goal", "total")
    assert out["outcome"] == "achieved"
    feedback = server.requests[2]["messages"][-1]["content"]
    assert "Files your attempt changed: other.txt (new). It did not change total.txt, which" in feedback
    assert "sales.csv, which" not in feedback and "verifiers/check.py, which" not in feedback


def test_a_deleted_file_and_caches_in_the_changes(proj, server):
    proj.write("old.txt", "x\n")
    total_goal(proj, max_attempts=2)
    server.add(
        {"tool_calls": [call("shell", command="rm old.txt && mkdir -p __pycache__ && touch __pycache__/a.pyc")]},
        {"content": "done"},
        write("total.txt", "41\n"),
        {"content": "ok"},
    )
    proj.cli_json("goal", "total")
    feedback = server.requests[2]["messages"][-1]["content"]
    assert "Files your attempt changed: old.txt (deleted)." in feedback and "pyc" not in feedback


@pytest.mark.parametrize(
    ("command", "meaning"),
    [
        ("grep -qx 41 total.txt", "It passes only when total.txt has a line that is exactly `41`."),
        ("grep -q 'Hello, runner!' hello.txt", "It passes only when hello.txt has a line containing `Hello, runner!`."),
        ("grep -qxF 31.5 max.txt", "has a line that is exactly `31.5`."),
        ("grep -qiw error a.log b.log", "when one of a.log, b.log has a line with the word `error` (ignoring case)."),
        ("grep -q -e '^v[0-9]' VERSION", "VERSION has a line matching the regular expression `^v[0-9]`."),
        ("grep -qEx 'a+b' f.txt", "f.txt has a line wholly matching the regular expression `a+b`."),
    ],
)
def test_a_silent_grep_check_is_explained_in_words(command, meaning):
    from runner.verify.feedback import grep_meaning

    assert grep_meaning(command).strip().endswith(meaning)


@pytest.mark.parametrize(
    "command",
    ["grep -qv 41 total.txt", "grep -c 41 total.txt", "grep -qx 41 total.txt && test -s x", "grep -qr x .",
     "grep --quiet x f", "egrep -q x f", "grep -q", "grep -q 'unclosed f"],
)  # fmt: skip
def test_a_grep_with_another_meaning_is_not_explained(command):
    from runner.verify.feedback import grep_meaning

    assert grep_meaning(command) == ""


def test_the_silent_grep_feedback_says_what_the_check_wants(proj, server):
    total_goal(proj, max_attempts=2)
    server.add(write("total.txt", "42\n"), {"content": "done"}, write("total.txt", "41\n"), {"content": "ok"})
    proj.cli_json("goal", "total")
    feedback = server.requests[2]["messages"][-1]["content"]
    assert "printed nothing. It passes only when total.txt has a line that is exactly `41`. What it reads:" in feedback


def test_a_huge_workdir_is_not_listed(tmp_path, monkeypatch):
    from runner.verify import changes

    for i in range(5):
        (tmp_path / f"f{i}").write_text("x")
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "big.js").write_text("x")
    assert sorted(changes.listing(tmp_path)) == [f"f{i}" for i in range(5)]
    monkeypatch.setattr(changes, "MAX_FILES", 3)
    assert changes.listing(tmp_path) is None
    assert changes.listing(tmp_path / "missing") is None


def test_a_block_of_python_style_calls_of_known_tools_is_run(proj, server):
    total_goal(proj, max_attempts=1)
    text = '<tool_response>\nread_file("sales.csv")\nwrite_file("total.txt", content="41\\n")\n</tool_response>'
    server.add({"content": text}, {"content": "done"})
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["steps"]) == ("achieved", 2)
    assert (proj.root / "total.txt").read_text() == "41\n"
    calls = server.requests[1]["messages"][-3]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("read_file", {"path": "sales.csv"}),
        ("write_file", {"path": "total.txt", "content": "41\n"}),
    ]


@pytest.mark.parametrize(
    "content",
    [
        'Call read_file("sales.csv") to see it.',  # prose, not a block of calls
        '```python\nwith open("total.txt", "w") as f:\n    f.write("41")\n```',  # code, not calls
        '```\nwrite_file("total.txt", open("x").read())\n```',  # not literal arguments
        '```\nwrite_file("a", "b", "c", "d")\n```',  # more arguments than the tool has
        '```\nrm_rf("/")\n```',  # an unknown tool
        '```\nread_file("sales.csv")\nprint("done")\n```',  # not only calls of tools
    ],
)
def test_what_is_not_plainly_a_python_style_call_is_not_one(content):
    parameters = {"read_file": ["path", "offset", "limit"], "write_file": ["path", "content"]}
    assert find_calls(content, parameters) == []


def test_a_file_written_again_unchanged_is_said_so(proj, server):
    total_goal(proj, max_attempts=3, stuck_after=5)
    again = (write("total.txt", "1234\n"), {"content": "done"})
    server.add(*again, *again, *again)
    out = proj.cli_json("goal", "total")
    first, second = (e["did"] for e in events(proj, out["run_id"], "feedback"))
    assert first == "Files your attempt changed: total.txt (new)."
    assert second == (
        "Your attempt changed no file. It wrote total.txt again with the same content as before."
        " It did not change total.txt, which the failing checks read."
    )
    assert second in server.requests[4]["messages"][-1]["content"]


def test_the_changes_between_two_listings(tmp_path):
    import os
    import time

    from runner.verify.changes import Changes, listing

    (tmp_path / "same.txt").write_text("a")
    (tmp_path / "edit.txt").write_text("a")
    (tmp_path / "gone.txt").write_text("a")
    before = listing(tmp_path)
    time.sleep(0.01)
    (tmp_path / "same.txt").write_text("a")  # written again, same content
    (tmp_path / "edit.txt").write_text("b")  # same size, new content
    os.utime(tmp_path / "edit.txt", ns=(before["edit.txt"][1], before["edit.txt"][1]))  # even with the old mtime
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "new.txt").write_text("n")
    changes = Changes.between(before, listing(tmp_path))
    assert (changes.created, changes.changed, changes.deleted) == (["new.txt"], ["edit.txt"], ["gone.txt"])
    assert changes.rewritten == ["same.txt"] and changes.touched == {"new.txt", "edit.txt", "gone.txt"}
