"""Faults of the model endpoint: malformed replies end the run `error` (exit 3), never a traceback or a row
left `running`; a password in base_url and the key never reach errors, the store, the transcript or output."""

from __future__ import annotations

import json
import socket

import pytest
from support import KEY, call

from runner.store import SqliteStore

MALFORMED = {
    "message null": {"choices": [{"message": None, "finish_reason": "stop"}]},
    "message a string": {"choices": [{"message": "hello", "finish_reason": "stop"}]},
    "tool_calls not a list": {"choices": [{"message": {"content": None, "tool_calls": "shell"}}]},
    "tool_calls holding null": {"choices": [{"message": {"content": None, "tool_calls": [None]}}]},
    "arguments an object": {
        "choices": [{"message": {"tool_calls": [{"id": "c", "function": {"name": "shell", "arguments": {}}}]}}]
    },
    "usage not integers": {"choices": [{"message": {"content": "hi"}}], "usage": {"total_tokens": "12"}},
    "usage huge": {"choices": [{"message": {"content": "hi"}}], "usage": {"total_tokens": 10**30}},
    "usage negative": {"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": -5}},
    "no choices": {"choices": []},
    "a list": [1, 2, 3],
    "not JSON": "<html>502 Bad Gateway</html>",
}


def everything_recorded(proj, run_id: str) -> str:
    """The run's row and its whole transcript, as text."""
    store = SqliteStore(proj.root / ".runner")
    return json.dumps(store.run(run_id)) + (proj.root / ".runner/runs" / run_id / "transcript.jsonl").read_text()


@pytest.mark.parametrize("reply", MALFORMED.values(), ids=list(MALFORMED))
def test_a_malformed_reply_ends_the_run_error_with_a_clear_line(proj, server, reply):
    proj.goal("g", prompt="p")
    server.add({"raw": reply})
    result = proj.cli("goal", "g")
    assert result.exit_code == 3
    assert "Traceback" not in result.output
    run = SqliteStore(proj.root / ".runner").runs()[0]
    assert run["outcome"] == "error"
    assert "model test-model:" in run["error"]
    assert "malformed reply" in run["error"] or "not a chat completion" in run["error"]


def test_lone_surrogates_in_a_reply_are_replaced_not_fatal(proj, server):
    proj.goal("g", prompt="p")
    body = '{"choices": [{"message": {"content": "half \\ud800 a pair"}, "finish_reason": "stop"}]}'
    server.add({"raw": body})
    out = proj.cli_json("goal", "g")
    assert (out["exit_code"], out["outcome"]) == (0, "achieved")
    assert out["final_message"] == "half \ufffd a pair"
    assert proj.cli("show", out["run_id"]).exit_code == 0


def test_surrogates_in_tool_call_arguments_reach_the_tool_as_replacement_characters(proj, server):
    proj.goal("g", prompt="p")
    arguments = '{"path": "note.txt", "content": "x \\udc80 y"}'
    server.add({"tool_calls": [call("write_file") | {"arguments": arguments}]}, {"content": "done"})
    out = proj.cli_json("goal", "g")
    assert out["outcome"] == "achieved"
    assert (proj.root / "note.txt").read_text() == "x \ufffd y"


def password_goal(proj, url: str) -> None:
    text = proj.root.joinpath("runner.yaml").read_text().replace(proj.server.base_url, url)
    proj.write("runner.yaml", text)
    proj.goal("g", prompt="p")


def test_a_password_in_base_url_never_shows(proj, server):
    password_goal(proj, f"http://runner:pw-s3cret-9@127.0.0.1:{server.port}/v1")
    server.add({"status": 404, "error": "The model `test-model` does not exist"})
    result = proj.cli("goal", "g", "--json")
    assert result.exit_code == 3
    run_id = json.loads(result.output.strip().splitlines()[-1])["run_id"]
    recorded = everything_recorded(proj, run_id)
    assert "not found at http://runner:***@127.0.0.1" in recorded
    assert "pw-s3cret-9" not in result.output + recorded + proj.cli("show", run_id).output


def test_a_password_in_an_unreachable_base_url_never_shows(proj, server):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    password_goal(proj, f"http://runner:pw%2Fs3cret@127.0.0.1:{port}/v1")
    result = proj.cli("goal", "g", "--json")
    assert result.exit_code == 3
    run_id = json.loads(result.output.strip().splitlines()[-1])["run_id"]
    recorded = everything_recorded(proj, run_id)
    assert "cannot connect to http://runner:***@127.0.0.1" in recorded
    assert "s3cret" not in result.output + recorded


def test_a_provider_error_echoing_the_key_is_scrubbed(proj, server):
    proj.goal("g", prompt="p")
    server.add({"status": 400, "error": f"invalid request for key {KEY} (org x)"})
    result = proj.cli("goal", "g", "--json")
    assert result.exit_code == 3
    run_id = json.loads(result.output.strip().splitlines()[-1])["run_id"]
    recorded = everything_recorded(proj, run_id)
    assert "invalid request for key *** (org x)" in recorded
    assert KEY not in result.output + recorded
