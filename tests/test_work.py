"""The work loop: ReAct tool calling against the scripted server, every stop reason, every model fault."""

from __future__ import annotations

import json

from support import call

WEATHER = """
import json, sys, time, pathlib
args = json.load(sys.stdin)
log = pathlib.Path("calls.log")
with log.open("a") as f: f.write(f"start {args['city']} {time.time()}\\n")
time.sleep(float(__import__('os').environ.get('WEATHER_DELAY', '0.5')))
temps = {"Paris": 31, "Oslo": 12}
if args["city"] not in temps: sys.exit("unknown city " + args["city"])
with log.open("a") as f: f.write(f"end {args['city']} {time.time()}\\n")
print(json.dumps({"city": args["city"], "celsius": temps[args["city"]]}))
"""

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "run": "python3 tools/weather.py",
    "timeout": "10s",
}


def weather_goal(proj, **extra):
    proj.write("tools/weather.py", WEATHER)
    proj.goal("hotter", prompt="Which city is hotter, Paris or Oslo?", tools=[WEATHER_TOOL], **extra)


def test_which_city_is_hotter_end_to_end(proj, server):
    weather_goal(proj)
    server.add(
        {
            "tool_calls": [
                {"id": "call_paris", **call("get_weather", city="Paris")},
                {"id": "call_oslo", **call("get_weather", city="Oslo")},
            ]
        },
        {"content": "Paris is hotter (31°C against 12°C)."},
    )
    out = proj.cli_json("goal", "hotter")
    assert out["exit_code"] == 0
    assert out["outcome"] == "achieved" and out["stop_reason"] == "completed"
    assert out["steps"] == 2 and out["attempts"] == 1
    assert out["final_message"] == "Paris is hotter (31°C against 12°C)."
    second = server.requests[1]["messages"]
    tools = [m for m in second if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tools] == ["call_paris", "call_oslo"]
    assert json.loads(tools[0]["content"]) == {"city": "Paris", "celsius": 31}
    assert json.loads(tools[1]["content"]) == {"city": "Oslo", "celsius": 12}
    assert server.requests[0]["tools"][0]["function"]["name"] == "get_weather"
    assert out["tokens"] > 0


def test_tool_calls_of_one_round_run_concurrently(proj, server):
    weather_goal(proj)
    server.add(
        {"tool_calls": [call("get_weather", city="Paris"), call("get_weather", city="Oslo")]},
        {"content": "done"},
    )
    assert proj.cli_json("goal", "hotter")["outcome"] == "achieved"
    events = [line.split() for line in (proj.root / "calls.log").read_text().splitlines()]
    starts = {city: float(t) for kind, city, t in events if kind == "start"}
    ends = {city: float(t) for kind, city, t in events if kind == "end"}
    # Each call started before the other one ended: they overlapped.
    assert starts["Oslo"] < ends["Paris"] and starts["Paris"] < ends["Oslo"]


def test_max_steps_is_a_forced_stop_reported_unfinished(proj, server):
    proj.goal("busy", prompt="keep listing", limits={"max_steps": 3})
    server.add(*[{"tool_calls": [call("list_files")]} for _ in range(6)])
    result = proj.cli("goal", "busy")
    assert result.exit_code == 1
    assert "Goal not achieved" in result.output
    assert "max_steps limit: the work is unfinished" in result.stderr
    out = proj.cli_json("goal", "busy")
    assert out["outcome"] == "not_achieved" and out["stop_reason"] == "max_steps" and out["steps"] == 3
    assert len(server.requests) == 6


def test_max_tokens_and_length_stop(proj, server):
    proj.goal("wordy", prompt="talk", limits={"max_tokens": 100})
    server.add({"tool_calls": [call("list_files")], "usage": {"prompt_tokens": 90, "completion_tokens": 20}})
    out = proj.cli_json("goal", "wordy")
    assert (out["stop_reason"], out["outcome"], out["tokens"]) == ("max_tokens", "not_achieved", 110)
    server.add({"content": "It was the best of ti", "finish_reason": "length"})
    out = proj.cli_json("goal", "wordy")
    assert (out["stop_reason"], out["outcome"]) == ("length", "not_achieved")


def test_timeout_stops_a_slow_round(proj, server):
    proj.goal("slow", prompt="wait", limits={"timeout": "1s"})
    server.add({"tool_calls": [call("shell", command="sleep 30")]})
    out = proj.cli_json("goal", "slow")
    assert (out["stop_reason"], out["outcome"]) == ("timeout", "not_achieved")
    assert out["duration_s"] < 20


def test_model_faults_become_observations(proj, server):
    weather_goal(proj)
    server.add(
        {"tool_calls": [{"name": "get_weather", "arguments": "{not json"}]},
        {"tool_calls": [call("get_forecast", city="Paris")]},
        {"tool_calls": [call("get_weather", town="Paris")]},
        {"tool_calls": [call("get_weather", city="Atlantis")]},
        {"content": "I give up."},
    )
    out = proj.cli_json("goal", "hotter")
    assert out["outcome"] == "achieved" and out["steps"] == 5
    results = [m["content"] for m in server.requests[-1]["messages"] if m["role"] == "tool"]
    assert "not valid JSON" in results[0]
    assert "unknown tool 'get_forecast'" in results[1] and "get_weather" in results[1]
    assert "invalid arguments for get_weather" in results[2] and "'city' is a required property" in results[2]
    assert results[3].startswith("error: get_weather exit code 1") and "unknown city Atlantis" in results[3]


def test_tool_timeout_and_builtin_schema_violation(proj, server):
    slow = {**WEATHER_TOOL, "run": "sleep 20", "timeout": "0.5s"}
    proj.goal("t", prompt="x", tools=[slow, "read_file"])
    server.add(
        {"tool_calls": [call("get_weather", city="Paris")]},
        {"tool_calls": [call("read_file", path="a.txt", color="red")]},
        {"content": "ok"},
    )
    assert proj.cli_json("goal", "t")["outcome"] == "achieved"
    results = [m["content"] for m in server.requests[-1]["messages"] if m["role"] == "tool"]
    assert "timed out after 0.5s and was killed" in results[0]
    assert "Additional properties are not allowed ('color' was unexpected)" in results[1]


def test_reasoning_content_is_not_sent_back(proj, server):
    proj.goal("think", prompt="x")
    server.add(
        {"reasoning_content": "secret chain of thought", "tool_calls": [call("list_files")]}, {"content": "done"}
    )
    proj.cli_json("goal", "think")
    assistant = next(m for m in server.requests[1]["messages"] if m["role"] == "assistant")
    assert "reasoning_content" not in assistant
    assert set(assistant) == {"role", "content", "tool_calls"}


def test_transcript_records_every_message_and_event(proj, server):
    proj.goal("t", prompt="say hi")
    server.add({"tool_calls": [call("write_file", path="hi.txt", content="hi")]}, {"content": "hi"})
    out = proj.cli_json("goal", "t")
    path = proj.root / ".runner" / "runs" / out["run_id"] / "transcript.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run" and kinds[-1] == "outcome"
    assert {"message", "step", "tool_call", "tool_result", "stopped", "attempt"} <= set(kinds)
    roles = [e["message"]["role"] for e in events if e["kind"] == "message"]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
