"""The model layer: real openai client over HTTP; transient errors retried, fatal ones one clear message."""

from __future__ import annotations

import socket

from support import count_threads

from runner.testing import ScriptedServer


def test_transient_500_and_429_are_retried_then_succeed(proj, server):
    proj.goal("g", prompt="hi")
    server.add({"status": 500, "error": "upstream hiccup"}, {"status": 429, "error": "slow down"}, {"content": "hello"})
    out = proj.cli_json("goal", "g")
    assert out["exit_code"] == 0 and out["outcome"] == "achieved" and out["final_message"] == "hello"
    assert len(server.requests) == 3


def test_retries_run_out_into_an_error_outcome(proj, server):
    proj.goal("g", prompt="hi")
    server.add(*[{"status": 503, "error": "overloaded"}] * 3)
    result = proj.cli("goal", "g")
    assert result.exit_code == 3
    assert "answered 503: overloaded" in result.output
    assert len(server.requests) == 3  # one try and max_retries=2


def test_missing_key_is_one_clear_message(proj, server, monkeypatch):
    monkeypatch.delenv("TEST_API_KEY")
    proj.goal("g", prompt="hi")
    result = proj.cli("goal", "g")
    assert result.exit_code == 3
    assert "no API key: the environment variable TEST_API_KEY is not set" in result.output
    assert "Traceback" not in result.output + result.stderr
    assert server.requests == []


def test_wrong_key(proj):
    with ScriptedServer([{"content": "x"}], api_key="right") as strict:
        proj.goal("g", prompt="hi", model={"base_url": strict.base_url})
        result = proj.cli("goal", "g")
        assert result.exit_code == 3 and "refused the API key: Incorrect API key provided" in result.output
        assert len(strict.requests) == 0


def test_unknown_model(proj, monkeypatch):
    monkeypatch.setenv("TEST_API_KEY", "right")
    with ScriptedServer([{"content": "x"}], models=["real-model"], api_key="right") as strict:
        proj.goal("g", prompt="hi", model={"name": "nope", "base_url": strict.base_url})
        result = proj.cli("goal", "g")
        assert result.exit_code == 3
        assert "model nope: not found" in result.output and "does not exist" in result.output
        proj.goal("g", prompt="hi", model={"name": "real-model", "base_url": strict.base_url})
        assert proj.cli("goal", "g").exit_code == 0


def test_refused_connection(proj):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proj.goal("g", prompt="hi", model={"base_url": f"http://127.0.0.1:{port}/v1", "max_retries": 1})
    result = proj.cli("goal", "g")
    assert result.exit_code == 3
    assert f"cannot connect to http://127.0.0.1:{port}/v1" in result.output


def test_dotenv_supplies_the_key_without_overriding(proj, server, monkeypatch):
    monkeypatch.delenv("TEST_API_KEY")
    proj.write(".env", "# comment\nexport TEST_API_KEY='from-dotenv'\n")
    proj.goal("g", prompt="hi")
    server.add({"content": "ok"})
    assert proj.cli("goal", "g").exit_code == 0


def test_extra_body_and_temperature_are_sent(proj, server):
    proj.goal("g", prompt="hi", model={"temperature": 0, "extra_body": {"thinking": {"type": "disabled"}}})
    server.add({"content": "ok"})
    proj.cli("goal", "g")
    request = server.requests[0]
    assert request["temperature"] == 0 and request["thinking"] == {"type": "disabled"}
    assert request["model"] == "test-model"


def test_script_model_runs_offline_and_says_when_it_runs_out(proj):
    proj.write("script.yaml", "- tool_calls: [{name: write_file, arguments: {path: a.txt, content: hi}}]\n")
    proj.goal("g", prompt="hi", model="script:script.yaml")
    out = proj.cli_json("goal", "g")
    assert out["outcome"] == "error" and out["exit_code"] == 3
    assert "has no reply left: all 1 replies were used" in out["error"]
    assert (proj.root / "a.txt").read_text() == "hi"


def test_bad_script_file_names_line_and_field(proj):
    proj.write("script.yaml", "- content: hi\n- tool_calls: [{arguments: {}}]\n")
    proj.goal("g", prompt="hi", model="script:script.yaml")
    result = proj.cli("goal", "g")
    assert result.exit_code in (2, 3)
    assert "script.yaml:2: [1].tool_calls[0]: expected {name: TOOL" in result.output


def test_a_timed_out_request_and_a_reset_connection_are_retried(proj, server):
    proj.goal("g", prompt="hi", model={"request_timeout": "0.5s"})
    server.add({"delay": 3, "content": "too late"}, {"drop": True}, {"content": "on time"})
    out = proj.cli_json("goal", "g")
    assert (out["outcome"], out["final_message"]) == ("achieved", "on time")
    assert len(server.requests) == 3


def test_usage_is_recorded_per_step_and_per_run(proj, server):
    proj.goal("g", prompt="hi")
    server.add(
        {
            "tool_calls": [{"name": "list_files", "arguments": {}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        },
        {"content": "done", "usage": {"prompt_tokens": 20, "completion_tokens": 7}},
    )
    out = proj.cli_json("goal", "g")
    assert out["tokens"] == 42
    shown = proj.cli_json("show", out["run_id"])
    steps = [e["usage"]["total_tokens"] for e in shown["transcript"] if e["kind"] == "reply"]
    assert steps == [15, 27] and shown["tokens"] == 42 and shown["attempt_rows"][0]["tokens"] == 42


def test_a_local_endpoint_found_listening_is_probed_once_for_a_burst_then_again(monkeypatch):
    """A loopback endpoint is probed (one connection) before a run, so that nothing listening is one clear
    line rather than retries; a burst of runs probes it once, and a later run sees it gone."""
    import threading
    import time

    from runner.work import model

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    assert [model.refused_on_this_machine(url) for _ in range(50)] == [None] * 50
    time.sleep(0.2)
    assert len(accepted) == 1
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accept; a bare close would leave it listening
    listener.close()
    for sock in accepted:
        sock.close()
    monkeypatch.setattr(model, "LISTENING_FOR", 0.0)  # the window has passed
    assert "nothing listens there" in (model.refused_on_this_machine(url) or "")


def test_a_warmed_up_daemons_clients_name_the_platform_without_a_thread_per_client(server, monkeypatch):
    """A daemon learns the platform the client names in its headers once (warm_up): before that, each run's
    new client learnt it at its first request in a thread, a hop per run behind a hundred others."""
    import asyncio

    import openai

    from runner.config import ModelConfig
    from runner.work import model as model_module

    threads = count_threads(monkeypatch)
    monkeypatch.setattr(model_module, "_platform", None)
    config = ModelConfig(name="test-model", api_key_env=None)
    server.add({"content": "cold"}, {"content": "warm"}, {"content": "plain"})

    async def one_chat() -> dict[str, str]:
        model = model_module.Model(config, server.base_url, "none", secret=False)
        try:
            assert (await model.chat([{"role": "user", "content": "hi"}])).message["content"]
            return model.client.platform_headers()
        finally:
            await model.aclose()

    cold = asyncio.run(one_chat())
    assert threads == ["get_platform"]
    model_module.warm_up()
    warm = asyncio.run(one_chat())
    assert threads == ["get_platform"]  # no hop for the warmed-up client
    plain = openai.AsyncOpenAI(base_url=server.base_url, api_key="none")
    assert warm == cold == plain.platform_headers() and warm["X-Stainless-OS"] not in ("", "Unknown")
