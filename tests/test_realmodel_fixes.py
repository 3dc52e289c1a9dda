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


def test_a_text_call_of_an_unknown_tool_is_neither_run_nor_answered(proj, server):
    total_goal(proj, max_attempts=1)
    server.add({"content": '{"name": "rm_rf", "arguments": {"path": "."}}'})
    out = proj.cli_json("goal", "total")
    assert (out["outcome"], out["steps"]) == ("not_achieved", 1)
    assert len(server.requests) == 1 and (proj.root / "sales.csv").exists()
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
