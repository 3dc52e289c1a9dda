"""The dashboard over HTTP: every page and action, escaping, secrets, CSRF, the token, the bind rule."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import time
import urllib.request

import pytest
import yaml
from starlette.testclient import TestClient
from support import KEY, call

from runner.config import load_project
from runner.errors import ConfigError
from runner.store import open_store
from runner.ui import create_app, serve

LONG_OUTPUT = "; ".join(f"echo line{i}" for i in range(60))


def client_for(proj, token: str | None = None, base_url: str = "http://127.0.0.1") -> TestClient:
    return TestClient(create_app(load_project(proj.root), token), base_url=base_url, follow_redirects=False)


@pytest.fixture
def client(proj):
    with client_for(proj) as client:
        yield client


def csrf_of(client: TestClient, path: str = "/") -> str:
    page = client.get(path)
    assert page.status_code == 200
    return re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)


def scheduled_goal(proj, name: str = "tidy", check: str = "test -f done.txt") -> None:
    proj.goal(name, prompt="make done.txt", verify={"checks": [{"name": "done exists", "run": check}]})
    proj.write(f"schedules/{name}.yaml", [{"goal": name, "every": "15m"}])


def run_goal(proj, name: str, *replies) -> dict:
    proj.server.add(*replies)
    return proj.cli_json("goal", name)


def test_goals_page_shows_entries_next_fire_and_a_strip_of_outcomes(proj, client):
    scheduled_goal(proj)
    run_goal(proj, "tidy", {"tool_calls": [call("write_file", path="done.txt", content="x")]}, {"content": "ok"})
    (proj.root / "done.txt").unlink()
    proj.write(
        "goals/tidy.yaml",
        {
            "prompt": "p",
            "verify": {"checks": [{"name": "done exists", "run": "false"}], "max_attempts": 1},
            "budget": {"tokens_per_day": 50000},
        },
    )
    run_goal(proj, "tidy", {"content": "nothing to do"})
    page = client.get("/")
    assert page.status_code == 200, page.text
    row = page.text[page.text.index('id="goal-tidy"') :]
    assert "every 15m" in row and "UTC" in row and "active" in row
    strip = re.search(r'<ol class="strip".*?</ol>', row, re.S).group(0)
    assert re.findall(r'<span class="sr"> ([a-z ]+)</span>', strip) == ["achieved", "not achieved"]
    assert "✓" in strip and "✗" in strip  # readable without colour
    spent = sum(r["tokens"] for r in open_store(load_project(proj.root)).find_runs(goal="tidy"))
    assert f"{spent:,} tokens" in row and "budget 50,000 tokens a day" in row
    assert ">Trigger<" in row and ">Pause<" in row


def test_trigger_pause_and_resume_are_posts_with_a_csrf_token(proj, client):
    scheduled_goal(proj)
    store = open_store(load_project(proj.root))
    assert client.post("/goals/tidy/trigger").status_code == 403
    assert client.post("/goals/tidy/trigger", data={"csrf": "forged"}).status_code == 403
    assert store.take_commands() == []
    token = csrf_of(client)
    answer = client.post("/goals/tidy/trigger", data={"csrf": token})
    assert answer.status_code == 303 and [c[:2] for c in store.take_commands()] == [("trigger", "tidy")]
    assert "queued tidy: no daemon is running here now" in client.get("/").text
    assert client.post("/goals/nope/trigger", data={"csrf": token}).status_code == 404

    (entry,) = _entries(proj)
    assert "/" in entry  # an entry id names its file: team/tidy/every
    assert client.post(f"/entries/{entry}/pause", data={"csrf": token}).status_code == 303
    assert store.entry(entry)["paused"] == 1
    page = client.get("/").text
    assert "‖ paused" in page and ">Resume<" in page and f"paused {entry}" in page
    assert client.post("/entries/tidy/resume", data={"csrf": token}).status_code == 303  # a goal: all its entries
    assert store.entry(entry)["paused"] == 0 and "‖ paused" not in client.get("/").text
    assert [e["kind"] for e in store.events() if e["kind"] in ("paused", "resumed")] == ["paused", "resumed"]
    assert client.post("/entries/nope/pause", data={"csrf": token}).status_code == 404


def _entries(proj) -> list[str]:
    from runner.config import Catalog

    return [e.id for e in Catalog.load(proj.root).entries]


def test_a_post_from_another_origin_is_refused_even_with_the_token(proj, client):
    scheduled_goal(proj)
    token = csrf_of(client)
    refused = client.post("/goals/tidy/trigger", data={"csrf": token}, headers={"origin": "http://evil.example"})
    assert refused.status_code == 403 and "CSRF" in refused.text


def test_runs_page_filters_by_goal_outcome_and_date_and_pages(proj, client):
    store = open_store(load_project(proj.root))
    for i in range(120):
        run_id = store.new_run("alpha" if i % 3 else "beta", "manual")
        store.finish_run(run_id, "achieved" if i % 2 else "not_achieved", tokens=1000 + i)
        store.update_run(run_id, started=f"2026-10-{1 + i // 10:02d}T08:00:{i % 60:02d}.000+00:00")
    page = client.get("/runs")
    assert page.status_code == 200 and "120 runs, page 1 of 3" in page.text
    assert page.text.count('<tr>\n  <td><a href="/runs/') == 50
    assert "2026-10-12 08:00" in page.text  # newest first
    last = client.get("/runs?page=3").text
    assert last.count('<tr>\n  <td><a href="/runs/') == 20 and "newer" in last and "older ›" not in last
    assert "40 runs" in client.get("/runs?goal=beta").text
    assert "60 runs" in client.get("/runs?outcome=achieved").text
    assert "20 runs" in client.get("/runs?goal=beta&outcome=not_achieved").text
    assert "30 runs" in client.get("/runs?since=2026-10-03&until=2026-10-05").text
    assert "120 runs" in client.get("/runs?since=not-a-date&page=x").text  # malformed filters are dropped


def test_a_run_reads_as_attempts_steps_checks_and_feedback_and_escapes_the_model(proj, client):
    proj.goal("fix", prompt="create a.txt", verify={"checks": [{"name": "a exists", "run": "test -f a.txt"}]})
    out = run_goal(
        proj,
        "fix",
        {"tool_calls": [call("shell", command=LONG_OUTPUT)], "usage": {"prompt_tokens": 120, "completion_tokens": 30}},
        {"content": "Done <script>alert('owned')</script> with key " + KEY},
        {"tool_calls": [call("write_file", path="a.txt", content="ok")]},
        {"content": "fixed"},
    )
    assert out["outcome"] == "achieved"
    page = client.get(f"/runs/{out['run_id']}")
    assert page.status_code == 200
    html = page.text
    assert "<script>alert" not in html and "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in html
    assert KEY not in html and "[secret]" in html
    assert "Attempt 1 of 3" in html and "Attempt 2 of 3" in html
    assert "shell: echo line0" in html and "150 tokens (120 in, 30 out)" in html
    assert "line0" in html and "line59" in html and "lines folded" in html and "line30\n" not in html
    assert "✗ fail" in html and "✓ pass" in html and "test -f a.txt" in html
    assert "Feedback sent back to the model" in html and "a exists" in html
    assert "write_file: a.txt" in html and "raw transcript" in html
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    raw = client.get(f"/runs/{out['run_id']}/transcript.jsonl")
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/plain")
    events = [json.loads(line) for line in raw.text.splitlines()]
    assert events[0]["kind"] == "run" and events[-1]["kind"] == "outcome" and KEY not in raw.text


def test_a_finished_run_streams_its_page_once_then_ends(proj, client):
    proj.goal("hello", prompt="say hi")
    out = run_goal(proj, "hello", {"content": "hi <b>there</b>"})
    stream = client.get(f"/runs/{out['run_id']}/live")
    assert stream.headers["content-type"].startswith("text/event-stream")
    names = re.findall(r"^event: (\w+)$", stream.text, re.M)
    assert names == ["run", "end"]
    assert "hi &lt;b&gt;there&lt;/b&gt;" in stream.text and "<b>there" not in stream.text
    assert "data: achieved" in stream.text


def approve_goal(proj) -> None:
    proj.goal(
        "ship",
        prompt="write notes.txt",
        verify={"checks": [{"name": "notes", "run": "test -f notes.txt"}, {"name": "ship it", "approve": "ship?"}]},
    )


def wait_for(proj, outcome: str) -> dict:
    store = open_store(load_project(proj.root))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = store.find_runs(limit=1)
        if rows and rows[0]["outcome"] == outcome:
            return rows[0]
        time.sleep(0.1)
    raise AssertionError(f"no run reached {outcome}")


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_approvals_page_answers_a_waiting_run(proj, client, decision):
    approve_goal(proj)
    proj.server.add({"tool_calls": [call("write_file", path="notes.txt", content="v1")]}, {"content": "done"})
    proc = proj.popen("goal", "ship", "--json", stdin=subprocess.DEVNULL)
    try:
        run = wait_for(proj, "awaiting_approval")
        page = client.get("/approvals").text
        assert run["run_id"] in page and "ship it" in page and ">Approve<" in page
        token = csrf_of(client, "/approvals")
        assert client.post(f"/runs/{run['run_id']}/{decision}").status_code == 403
        if decision == "reject":
            assert client.post(f"/runs/{run['run_id']}/reject", data={"csrf": token}).status_code == 400
        answer = client.post(f"/runs/{run['run_id']}/{decision}", data={"csrf": token, "reason": "not <today>"})
        assert answer.status_code == 303 and answer.headers["location"] == f"/runs/{run['run_id']}"
        stdout, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    expected = "achieved" if decision == "approve" else "rejected"
    assert json.loads(stdout)["outcome"] == expected
    shown = client.get(f"/runs/{run['run_id']}").text
    assert expected in shown and "No run waits for a person" in client.get("/approvals").text
    if decision == "reject":
        assert "not &lt;today&gt;" in shown


def test_answering_a_run_that_does_not_wait_is_a_clear_refusal(proj, client):
    proj.goal("hello", prompt="say hi")
    out = run_goal(proj, "hello", {"content": "hi"})
    answer = client.post(f"/runs/{out['run_id']}/approve", data={"csrf": csrf_of(client)})
    assert answer.status_code == 409 and "not waiting for approval" in answer.text
    assert client.get("/runs/no-such-run").status_code == 404
    missing = client.get(f"/runs/{KEY}")  # even an error page never repeats a secret
    assert missing.status_code == 404 and KEY not in missing.text and "[secret]" in missing.text


def test_charts_draw_outcomes_tokens_and_cost_per_day_as_svg(proj, client):
    store = open_store(load_project(proj.root))
    today = time.strftime("%Y-%m-%d", time.gmtime())
    for outcome, tokens in (("achieved", 1200), ("not_achieved", 800), ("error", 0)):
        store.finish_run(store.new_run("tidy", "manual"), outcome, tokens=tokens)
    old = store.new_run("tidy", "manual")
    store.finish_run(old, "achieved", tokens=500)
    store.update_run(old, started="2020-01-01T00:00:00.000+00:00")  # beyond 30 days: not drawn
    page = client.get("/goals/tidy/charts")
    assert page.status_code == 200
    assert page.text.count("<svg") == 2 and "cdn" not in page.text.lower()
    assert f"{today}: 1 achieved, 1 error, 1 not achieved" in page.text
    assert f"{today}: 2.0k tokens" in page.text
    assert "Cost per day" in page.text


def test_the_token_guards_every_page_when_set(proj):
    with client_for(proj, token="t0ken-abcdef-123") as client:
        assert client.get("/").status_code == 401
        assert client.get("/runs?token=wrong").status_code == 401
        assert client.get("/static/style.css").status_code == 401
        login = client.get("/runs?goal=x&token=t0ken-abcdef-123")
        assert login.status_code == 303 and login.headers["location"] == "/runs?goal=x"
        assert "t0ken-abcdef-123" not in login.headers["set-cookie"]  # the browser keeps a digest
        assert client.get("/runs").status_code == 200  # the cookie now carries it
    with client_for(proj, token="t0ken-abcdef-123") as client:
        assert client.get("/", headers={"authorization": "Bearer t0ken-abcdef-123"}).status_code == 200


def test_a_loopback_dashboard_refuses_other_host_names(proj):
    with client_for(proj, base_url="http://attacker.example") as client:
        assert client.get("/").status_code == 403
    with client_for(proj, base_url="http://localhost:8788") as client:
        assert client.get("/").status_code == 200


def test_runner_ui_refuses_a_public_address_without_a_token(proj):
    result = proj.cli("ui", "--host", "0.0.0.0")
    assert result.exit_code == 2 and "daemon.ui.token" in result.output


def test_runner_ui_serves_until_interrupted(proj):
    import signal

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = proj.popen("ui", "--port", str(port))
    try:
        assert f"dashboard on http://127.0.0.1:{port}/" in proc.stderr.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/runs") as page:
            assert page.status == 200 and b"Runs" in page.read()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_serve_runs_inside_an_event_loop_and_stops_when_cancelled(proj):
    """What the daemon does with daemon.ui: true: serve() as a task beside its own work."""
    project = load_project(proj.root)

    async def scenario() -> int:
        urls: list[str] = []
        task = asyncio.create_task(serve(project, "127.0.0.1", 0, ready=urls.append))
        while not urls:
            await asyncio.sleep(0.01)
        status = await asyncio.to_thread(lambda: urllib.request.urlopen(urls[0] + "approvals").status)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return status

    assert asyncio.run(scenario()) == 200


def test_the_daemon_serves_the_dashboard_beside_its_work_when_asked(proj):
    """runner daemon wraps its run in alongside(): the dashboard lives exactly as long as the daemon."""
    from runner.ui import alongside

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proj.write("runner.yaml", {"model": {"name": "m"}, "daemon": {"ui": {"port": port}}})

    def get(path: str) -> int:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}").status

    async def daemon_work() -> int:
        for _ in range(500):
            try:
                return await asyncio.to_thread(get, "/approvals")
            except OSError:
                await asyncio.sleep(0.02)
        raise AssertionError("the dashboard never answered")

    assert asyncio.run(alongside(load_project(proj.root), daemon_work())) == 200
    with pytest.raises(OSError):
        get("/")  # gone with the daemon
    proj.write("runner.yaml", {"model": {"name": "m"}, "daemon": {"ui": {"host": "0.0.0.0"}}})
    with pytest.raises(ConfigError, match=r"daemon\.ui\.token"):
        asyncio.run(alongside(load_project(proj.root), daemon_work()))


def test_static_assets_ship_with_the_package_and_a_broken_file_is_named_not_fatal(proj, client):
    script = client.get("/static/live.js")
    assert script.status_code == 200 and "EventSource" in script.text
    assert client.get("/static/style.css").status_code == 200
    proj.goal("good", prompt="fine")
    proj.write("goals/bad.yaml", "prompt: [unclosed\n")
    page = client.get("/")
    assert page.status_code == 200 and "goals/bad.yaml:" in page.text and "runner validate" in page.text
    assert client.get("/runs").status_code == 200


def test_the_store_interface_defaults_agree_with_the_indexed_queries(proj):
    """A store without its own find_runs/count_runs/daily_totals (built on runs()) answers as SQLite's do."""
    from runner.store import Store

    store = open_store(load_project(proj.root))
    for i in range(30):
        run_id = store.new_run(("alpha", "beta")[i % 2], "manual")
        store.finish_run(run_id, ("achieved", "error", "stuck")[i % 3], tokens=100 + i)
        store.update_run(run_id, started=f"2026-10-{1 + i // 3:02d}T0{i % 3}:00:00.000+00:00")
    asks = [{}, {"goal": "beta"}, {"outcome": "error"}, {"since": "2026-10-03", "until": "2026-10-06"}]
    for ask in asks:
        assert Store.count_runs(store, **ask) == store.count_runs(**ask)
        for page in (0, 5):
            ids = [r["id"] for r in store.find_runs(**ask, limit=5, offset=page)]
            assert [r["id"] for r in Store.find_runs(store, **ask, limit=5, offset=page)] == ids
    key = lambda row: (row["goal"], row["day"], row["outcome"])  # noqa: E731
    for goal in (None, "alpha"):
        expected = sorted(store.daily_totals(goal, "2026-10-05"), key=key)
        assert sorted(Store.daily_totals(store, goal, "2026-10-05"), key=key) == expected


def test_runner_daemon_serves_the_dashboard_with_daemon_ui(proj, daemons):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = yaml.safe_load((proj.root / "runner.yaml").read_text())
    settings["daemon"]["ui"] = {"port": port}
    proj.write("runner.yaml", settings)
    proj.goal("tidy", prompt="p")
    daemon = daemons(proj)
    daemon.wait_log("dashboard on http://127.0.0.1")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as page:
        assert page.status == 200 and b'id="goal-tidy"' in page.read()
    assert daemon.stop() == 0
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/")
