"""MCP: tools from real MCP servers (stdio and streamable HTTP) called by the scripted model through runner,
and runner itself served over MCP, driven by the SDK's own client."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import call, child_env

DEMO = Path(__file__).parent / "mcp_servers" / "demo.py"


def demo(*extra: str, **fields: Any) -> dict[str, Any]:
    """The demo server over stdio; a loaded machine may take long to import the SDK, hence the start timeout."""
    return {"command": sys.executable, "args": [str(DEMO), *extra], "start_timeout": "5m", **fields}


def with_servers(proj, **servers: Any) -> None:
    """Declare MCP servers in the project's runner.yaml."""
    path = proj.root / "runner.yaml"
    settings = yaml.safe_load(path.read_text())
    proj.write("runner.yaml", {**settings, "mcp": servers})


def tool_results(request: dict[str, Any]) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def offered(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in request["tools"]}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def http_demo() -> Iterator[str]:
    """The demo server over streamable HTTP on 127.0.0.1; yields its URL."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(DEMO), "--http", str(port)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(2400):  # importing the SDK can take long on a loaded machine
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, "the demo HTTP server exited"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


def test_stdio_server_tools_are_called_through_runner(proj, server):
    with_servers(proj, demo=demo())
    proj.goal(
        "sum",
        prompt="write 2 + 3 to sum.txt",
        verify={"checks": [{"name": "five", "run": "grep -qx 5 sum.txt"}]},
    )
    server.add(
        {"tool_calls": [call("demo__add", a=2, b=3)]},
        {"tool_calls": [call("write_file", path="sum.txt", content="5\n")]},
        {"content": "done"},
    )
    out = proj.cli_json("goal", "sum")
    assert (out["exit_code"], out["outcome"]) == (0, "achieved")
    tools = offered(server.requests[0])
    assert {"read_file", "shell", "demo__add", "demo__echo"} <= set(tools)
    assert tools["demo__add"]["description"] == "Add two integers."
    schema = tools["demo__add"]["parameters"]
    assert schema["properties"]["a"]["type"] == "integer" and schema["required"] == ["a", "b"]
    assert all(len(name) <= 64 for name in tools)
    assert tool_results(server.requests[1]) == ["5"]


def test_stdio_server_gets_a_scrubbed_environment_and_the_workdir(proj, server, monkeypatch):
    monkeypatch.setenv("PASSED_TOKEN", "passed-value")
    monkeypatch.setenv("OTHER_SECRET", "must-not-leak")
    (proj.root / "work").mkdir()
    with_servers(proj, demo=demo(env=["PASSED_TOKEN"]))
    proj.goal("env", prompt="look around", workdir="work")
    server.add(
        {
            "tool_calls": [
                call("demo__env", variable="PASSED_TOKEN"),
                call("demo__env", variable="OTHER_SECRET"),
                call("demo__env", variable="TEST_API_KEY"),
                call("demo__where"),
            ]
        },
        {"content": "done"},
    )
    out = proj.cli_json("goal", "env")
    assert out["outcome"] == "achieved"
    assert tool_results(server.requests[1]) == ["passed-value", "(unset)", "(unset)", str(proj.root / "work")]


def test_streamable_http_server_with_headers_and_an_allow_list(proj, server, http_demo, monkeypatch):
    monkeypatch.setenv("DOCS_TOKEN", "s3cret")
    with_servers(
        proj,
        docs={"url": http_demo, "headers": {"Authorization": "Bearer ${DOCS_TOKEN}"}, "tools": ["add", "header"]},
    )
    proj.goal("web", prompt="ask the docs server")
    server.add(
        {"tool_calls": [call("docs__add", a=40, b=2), call("docs__header", key="Authorization")]},
        {"content": "done"},
    )
    out = proj.cli_json("goal", "web")
    assert out["outcome"] == "achieved"
    assert {n for n in offered(server.requests[0]) if "__" in n} == {"docs__add", "docs__header"}
    assert tool_results(server.requests[1]) == ["42", "Bearer s3cret"]


def test_goal_names_mcp_tools_one_by_one_or_per_server(proj, server):
    with_servers(proj, demo=demo())
    proj.goal("one", prompt="x", tools=["read_file", "demo__add"])
    proj.goal("all", prompt="x", tools=["demo__*"])
    server.add({"content": "done"}, {"content": "done"})
    assert proj.cli_json("goal", "one")["outcome"] == "achieved"
    assert proj.cli_json("goal", "all")["outcome"] == "achieved"
    assert set(offered(server.requests[0])) == {"read_file", "demo__add"}
    every = set(offered(server.requests[1]))
    assert {"demo__add", "demo__crash", "demo__picture"} <= every and "read_file" not in every
    assert not any(len(name) > 64 for name in every)  # the demo's overlong tool is left out


def test_failures_timeouts_and_other_content_are_the_tools_results(proj, server):
    with_servers(proj, demo=demo(timeout="1s"))
    proj.goal("odd", prompt="try everything")
    server.add(
        {
            "tool_calls": [
                call("demo__fail"),
                call("demo__slow", seconds=30),
                call("demo__picture"),
                call("demo__big", size=100_000),
                call("demo__add", a="two", b=3),
            ]
        },
        {"content": "done"},
    )
    out = proj.cli_json("goal", "odd")
    assert out["outcome"] == "achieved"
    failed, slow, picture, big, bad_args = tool_results(server.requests[1])
    assert failed.startswith("error:") and "this tool always fails" in failed
    assert slow == "error: demo__slow timed out after 1s"
    assert picture.startswith("[image image/png, ") and "not shown" in picture
    assert len(big) < 13_000 and "characters cut" in big
    assert bad_args.startswith("error: invalid arguments for demo__add")


def test_server_that_crashes_mid_run_becomes_the_tools_result(proj, server):
    with_servers(proj, demo=demo())
    proj.goal("crash", prompt="x", verify={"checks": [{"run": "true"}]})
    server.add(
        {"tool_calls": [call("demo__crash")]},
        {"tool_calls": [call("demo__add", a=1, b=1)]},
        {"content": "carried on without it"},
    )
    out = proj.cli_json("goal", "crash")
    assert (out["exit_code"], out["outcome"]) == (0, "achieved")
    crashed, after = tool_results(server.requests[1])[0], tool_results(server.requests[2])[1]
    for text in (crashed, after):
        assert "the MCP server demo exited with code 3" in text and "crashing on purpose" in text
    assert crashed.startswith("error: demo__crash failed") and after.startswith("error: demo__add was not called")


def test_server_that_cannot_start_ends_the_run_before_any_model_call(proj, server):
    with_servers(proj, gh={"command": "no-such-mcp-server-xyz", "args": ["--stdio"]})
    proj.goal("gh", prompt="x")
    result = proj.cli("goal", "gh", "--json")
    out = json.loads(result.output.strip().splitlines()[-1])
    assert (result.exit_code, out["outcome"]) == (3, "error")
    assert out["error"] == (
        "MCP server gh (no-such-mcp-server-xyz --stdio) could not start: no-such-mcp-server-xyz: command not found"
    )
    assert server.requests == []


def test_server_that_exits_at_start_is_reported_with_its_stderr(proj, server):
    with_servers(proj, broken=demo("--fail-start"))
    proj.goal("broken", prompt="x")
    result = proj.cli("goal", "broken")
    assert result.exit_code == 3
    assert "MCP server broken" in result.output and "exited with code 1" in result.output
    assert "missing configuration, giving up" in result.output
    assert server.requests == []


def test_unreachable_http_server_is_an_error_naming_it(proj, server):
    with_servers(proj, docs={"url": f"http://127.0.0.1:{free_port()}/mcp", "start_timeout": "10s"})
    proj.goal("docs", prompt="x")
    out = proj.cli_json("goal", "docs")
    assert (out["exit_code"], out["outcome"]) == (3, "error")
    assert out["error"].startswith("MCP server docs (http://127.0.0.1:") and "could not initialize" in out["error"]
    assert server.requests == []


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_stdio_server_and_what_it_started_are_killed_after_the_run(proj, server, sandbox):
    with_servers(proj, demo=demo())
    proj.goal("spawn", prompt="x", sandbox=sandbox)
    seconds = f"299.{os.getpid()}{time.monotonic_ns() % 10**6}"  # finds the grandchild, in a PID namespace too
    server.add({"tool_calls": [call("demo__spawn", seconds=seconds)]}, {"content": "done"})
    assert proj.cli_json("goal", "spawn")["outcome"] == "achieved"
    assert tool_results(server.requests[1]) == ["started"]
    assert not _running(["sleep", seconds]), "the server's child outlived the run"


def _running(argv: list[str]) -> bool:
    """Whether a live process runs `argv`, allowing a moment for the dead to be reaped (no timing is asserted)."""
    wanted = "\0".join(argv).encode() + b"\0"
    for _ in range(100):
        alive = False
        for proc in Path("/proc").iterdir():
            try:
                found = (proc / "cmdline").read_bytes() == wanted and " Z " not in (proc / "stat").read_text()
            except OSError:
                continue
            alive = alive or found
        if not alive:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize(
    ("goal", "servers", "expected"),
    [
        (
            {"tools": [{"name": "demo__add", "run": "echo 1"}]},
            {"demo": demo()},
            "command tool 'demo__add' clashes with the tools of MCP server 'demo'",
        ),
        ({"tools": ["nope__search"]}, {"demo": demo()}, "names MCP server 'nope', which no `mcp:` block declares"),
        ({"mcp": {"my__srv": demo()}}, {}, "server name 'my__srv': expected letters, digits and -"),
        ({"mcp": {"demo": demo(tools=["x" * 60])}}, {}, "is 66 characters; a tool name is at most 64"),
        ({"tools": ["demo__" + "y" * 60]}, {"demo": demo()}, "is 66 characters; a tool name is at most 64"),
        ({"tools": ["demo__echo"]}, {"demo": demo(tools=["add"])}, "'echo' is not in the `tools` allow-list"),
        ({"mcp": {"both": {"command": "x", "url": "http://h/mcp"}}}, {}, "exactly one of `command`"),
        ({"mcp": {"web": {"url": "http://h/mcp", "env": ["X"]}}}, {}, "env: only for a stdio server"),
    ],
)
def test_validate_reports_bad_mcp_blocks_and_names(proj, goal, servers, expected):
    if servers:
        with_servers(proj, **servers)
    proj.goal("bad", prompt="x", **goal)
    result = proj.cli("validate")
    assert result.exit_code == 2
    assert expected in result.output
    assert "goals/bad.yaml:" in result.output


def test_goal_servers_add_to_and_override_runner_yaml(proj, server):
    with_servers(proj, demo=demo(), other=demo("--fail-start"))
    proj.goal("mixed", prompt="x", mcp={"other": demo(tools=["echo"])})
    server.add({"tool_calls": [call("other__echo", text="hi")]}, {"content": "done"})
    assert proj.cli_json("goal", "mixed")["outcome"] == "achieved"
    assert {n for n in offered(server.requests[0]) if "__" in n} >= {"demo__add", "other__echo"}
    assert "other__add" not in offered(server.requests[0])
    assert tool_results(server.requests[1]) == ["hi"]


def test_mcp_list_prints_the_tools_of_a_goals_servers(proj):
    with_servers(proj, demo=demo())
    proj.goal("two", prompt="x", tools=["demo__add", "demo__echo"])
    result = proj.cli("mcp", "list", "two")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0].startswith("demo (") and lines[0].endswith("): 2 tools")
    assert lines[1].split() == ["demo__add", "Add", "two", "integers."]
    assert proj.cli("mcp", "list").output.count("demo__") >= 11
    with_servers(proj, gone={"command": "no-such-mcp-server-xyz"})
    failed = proj.cli("mcp", "list")
    assert failed.exit_code == 3 and "MCP server gone (no-such-mcp-server-xyz) could not start" in failed.output


def test_runner_mcp_served_to_the_sdk_client(proj, server):
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    server.add(
        {"tool_calls": [call("write_file", path="hello.txt", content="hello\n")]},
        {"content": "wrote it"},
    )
    proj.goal("named", prompt="say hello", verify={"checks": [{"run": "true"}]})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "runner", "mcp", "-C", str(proj.root)], env=child_env()
    )

    async def drive() -> tuple[set[str], Any, Any, Any, Any, Any]:
        with open(proj.root / "mcp-stderr.log", "w") as errlog:  # the SDK hands it to the server as stderr
            async with Client(stdio_client(params, errlog)) as client:
                names = {tool.name for tool in (await client.list_tools()).tools}
                goals = await client.call_tool("list_goals", {})
                inline = {"prompt": "write hello.txt", "checks": ["grep -q hello hello.txt"], "max_attempts": 1}
                ran = await client.call_tool("run_goal", inline)
                read = await client.call_tool("get_run", {"run_id": ran.structured_content["run_id"]})
                runs = await client.call_tool("list_runs", {})
                triggered = await client.call_tool("trigger", {"name": "named"})
                return names, goals, ran, read, runs, triggered

    names, goals, ran, read, runs, triggered = asyncio.run(drive())
    assert names == {"list_goals", "run_goal", "get_run", "list_runs", "approve", "reject", "trigger"}
    assert [g["name"] for g in goals.structured_content["goals"]] == ["named"]
    assert ran.structured_content["outcome"] == "achieved" and not ran.is_error
    assert read.structured_content["outcome"] == "achieved"
    assert read.structured_content["checks"] == [
        {"name": "grep -q hello hello.txt", "passed": True, "exit_code": 0, "output": "", "reason": None}
    ]
    assert [r["run_id"] for r in runs.structured_content["runs"]] == [ran.structured_content["run_id"]]
    assert (proj.root / "hello.txt").read_text() == "hello\n"
    assert triggered.structured_content == {
        "goal": "named",
        "daemon_running": False,
        "message": "no daemon is running now; it runs when `runner daemon` starts",
    }


def test_runner_mcp_runs_in_the_background_and_waits_for_approval(proj, server):
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    server.add({"content": "nothing to do"}, {"content": "ready to ship"}, {"content": "ready again"})
    proj.goal("ship", prompt="prepare the release", verify={"checks": [{"approve": "Ship it?"}]})
    params = StdioServerParameters(command=sys.executable, args=["-m", "runner", "mcp", "-C", str(proj.root)])
    params.env = child_env()

    async def settled(client: Any, run_id: str, outcomes: tuple[str, ...]) -> dict[str, Any]:
        for _ in range(600):
            run = (await client.call_tool("get_run", {"run_id": run_id})).structured_content
            if run["outcome"] in outcomes:
                return run
            await asyncio.sleep(0.05)
        raise AssertionError(f"run {run_id} stayed {run['outcome']}")

    async def drive() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        with open(proj.root / "mcp-stderr.log", "w") as errlog:
            async with Client(stdio_client(params, errlog)) as client:
                started = await client.call_tool("run_goal", {"prompt": "nothing", "wait": False})
                seen["started"] = started.structured_content
                seen["background"] = await settled(client, started.structured_content["run_id"], ("achieved",))
                waiting = (await client.call_tool("run_goal", {"name": "ship"})).structured_content
                seen["waiting"] = waiting
                seen["approved"] = (await client.call_tool("approve", {"run_id": waiting["run_id"]})).structured_content
                seen["after_approval"] = await settled(client, waiting["run_id"], ("achieved",))
                again = (await client.call_tool("run_goal", {"name": "ship"})).structured_content
                reason = {"run_id": again["run_id"], "reason": "not today"}
                seen["rejected"] = (await client.call_tool("reject", reason)).structured_content
                seen["after_rejection"] = await settled(client, again["run_id"], ("rejected",))
                seen["neither"] = await client.call_tool("run_goal", {})
                seen["unknown"] = await client.call_tool("get_run", {"run_id": "no-such-run"})
        return seen

    seen = asyncio.run(drive())
    assert seen["started"]["outcome"] == "running" and seen["background"]["outcome"] == "achieved"
    assert (seen["waiting"]["outcome"], seen["waiting"]["pending"]) == ("awaiting_approval", "Ship it?")
    assert seen["approved"]["run_id"] == seen["waiting"]["run_id"]
    assert seen["after_approval"]["checks"][0]["passed"] is True
    assert seen["after_rejection"]["error"] == "not today"
    assert seen["neither"].is_error and "give a goal `name` or an inline `prompt`" in seen["neither"].content[0].text
    assert seen["unknown"].is_error and "no run with id 'no-such-run'" in seen["unknown"].content[0].text


@pytest.mark.parametrize(
    ("servers", "expected"),
    [
        ({"my__srv": demo()}, "mcp: server name 'my__srv': expected letters, digits and -"),
        ({"web": {"url": "ftp://example.com/mcp"}}, "mcp.web: url: expected an http:// or https:// address"),
    ],
)
def test_validate_reports_a_bad_server_in_runner_yaml(proj, servers, expected):
    with_servers(proj, **servers)
    result = proj.cli("validate")
    where = (proj.root / "runner.yaml").read_text().splitlines().index("mcp:") + 1 + ("web" in servers)
    assert result.exit_code == 2
    assert result.output.startswith(f"runner.yaml:{where}: {expected}")


def test_server_that_never_answers_ends_the_run_at_its_start_timeout(proj, server):
    with_servers(proj, mute={"command": "sleep", "args": ["300"], "start_timeout": "1s"})
    proj.goal("mute", prompt="x")
    out = proj.cli_json("goal", "mute")
    assert (out["exit_code"], out["outcome"]) == (3, "error")
    assert out["error"] == "MCP server mute (sleep 300) did not start within 1s"
    assert server.requests == []
