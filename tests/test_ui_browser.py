"""The dashboard in a real browser: Playwright drives Debian's Chromium against `runner ui`.

It opens the goals page, follows a run while it goes on (a step appears live), approves a waiting run
and sees it finish; it saves a screenshot of each page into docs/screenshots/ (the README shows them).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from support import call

from runner.config import load_project
from runner.store import open_store

sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 60_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),  # a browser and five runner processes; slower than most on a busy machine
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium)"),
]


@pytest.fixture
def dashboard(proj) -> Iterator[str]:
    """`runner ui` on a free port, as a user starts it; its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = proj.popen("ui", "--port", str(port))
    try:
        line = proc.stderr.readline()
        assert f"http://127.0.0.1:{port}/" in line, line
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def page() -> Iterator[object]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 860})
            context.set_default_timeout(WAIT_MS)
            sync_api.expect.set_options(timeout=WAIT_MS)
            yield context.new_page()
        finally:
            browser.close()


def shot(page, name: str, full_page: bool = True) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full_page)


def write_goals(proj) -> None:
    proj.goal("tidy", prompt="create done.txt", verify={"checks": [{"name": "done exists", "run": "test -f done.txt"}]})
    proj.write("schedules/team.yaml", [{"goal": "tidy", "every": "15m"}, {"goal": "ship", "cron": "0 9 * * 1-5"}])
    proj.goal("slow", prompt="list the files, slowly")
    proj.goal(
        "ship",
        prompt="write notes.txt",
        verify={"checks": [{"name": "notes", "run": "test -f notes.txt"}, {"name": "ship it", "approve": "ship?"}]},
    )


def seed_history(proj, goal: str) -> None:
    """Earlier runs of a goal over the last weeks, as the store records them, for the strip and the charts."""
    store = open_store(load_project(proj.root))
    outcomes = ["achieved", "achieved", "not_achieved", "achieved", "error", "achieved", "stuck", "achieved"]
    for day in range(24, 0, -1):
        for n in range(day % 3 + 1):
            run_id = store.new_run(goal, "every")
            store.finish_run(run_id, outcomes[(day + n) % len(outcomes)], tokens=1500 + 700 * ((day * 7 + n) % 5))
            began = datetime.now(timezone.utc) - timedelta(days=day, hours=n)
            ended = began + timedelta(seconds=20 + 9 * n + day)
            store.update_run(
                run_id,
                started=began.isoformat(timespec="milliseconds"),
                ended=ended.isoformat(timespec="milliseconds"),
                attempts=1 + n % 2,
                steps=3 + day % 4,
            )


def latest_run(proj, goal: str, outcome: str | None = None) -> dict:
    """The goal's newest run (with that outcome), once the store has it."""
    store = open_store(load_project(proj.root))
    for _ in range(600):
        rows = store.find_runs(goal=goal, limit=1)
        if rows and (outcome is None or rows[0]["outcome"] == outcome):
            return rows[0]
        threading.Event().wait(0.1)
    raise AssertionError(f"no run with outcome {outcome}")


def test_a_person_watches_follows_and_approves_runs(proj, server, dashboard, page):
    write_goals(proj)
    server.add({"tool_calls": [call("write_file", path="done.txt", content="x")]}, {"content": "done"})
    assert proj.subprocess("goal", "tidy").returncode == 0  # a process: Playwright holds this thread's event loop

    seed_history(proj, "tidy")
    page.goto(dashboard + "/")
    sync_api.expect(page.locator("#goal-tidy")).to_contain_text("every 15m")
    sync_api.expect(page.locator("#goal-tidy .strip")).to_contain_text("✓")

    # a run that goes on: the model's second answer waits until the page is open
    page_open = threading.Event()

    def second_step(request: dict) -> dict:
        page_open.wait(WAIT_MS / 1000)
        return {"tool_calls": [call("shell", command="echo second step")], "delay": 0.5}

    server.add(
        {"tool_calls": [call("shell", command="ls")], "delay": 0.5},
        second_step,
        {"content": "All <b>listed</b>.", "delay": 0.5},
    )
    running = proj.popen("goal", "slow", stdin=subprocess.DEVNULL)
    try:
        run = latest_run(proj, "slow")
        page.goto(dashboard + "/runs")
        page.click(f"a[href='/runs/{run['run_id']}']")
        sync_api.expect(page.locator("#run .live")).to_be_visible()
        sync_api.expect(page.locator("#a1s1")).to_be_visible()
        assert page.locator("#a1s2").count() == 0
        shot(page, "run-live")
        page_open.set()
        sync_api.expect(page.locator("#a1s2")).to_contain_text("shell: echo second step")
        sync_api.expect(page.locator("#run h1")).to_contain_text("achieved")
        sync_api.expect(page.locator("#run")).to_contain_text("All <b>listed</b>.")  # shown as text, not markup
        assert running.wait(timeout=60) == 0
    finally:
        page_open.set()
        running.kill()
    page.locator("#a1s1 details.output summary").first.click()
    shot(page, "run")

    page.goto(dashboard + "/runs")
    sync_api.expect(page.locator("table.runs")).to_contain_text("slow")
    shot(page, "runs", full_page=False)

    # a run waiting for a person: approve it from the approvals page, then watch it finish
    server.add({"tool_calls": [call("write_file", path="notes.txt", content="v1")]}, {"content": "notes written"})
    waiting = proj.popen("goal", "ship", "--json", stdin=subprocess.DEVNULL)
    try:
        run = latest_run(proj, "ship", "awaiting_approval")
        page.goto(dashboard + "/approvals")
        card = page.locator(f"#approve-{run['run_id']}")
        sync_api.expect(card).to_contain_text("ship it")
        shot(page, "approvals")
        card.get_by_role("button", name="Approve").click()
        page.wait_for_url(f"**/runs/{run['run_id']}")
        sync_api.expect(page.locator("#run h1")).to_contain_text("achieved")
        sync_api.expect(page.locator("#run")).to_contain_text("✓ pass")
        assert waiting.wait(timeout=60) == 0
    finally:
        waiting.kill()
    shot(page, "approved")

    page.goto(dashboard + "/goals/tidy/charts")
    sync_api.expect(page.locator("svg").first).to_be_visible()
    shot(page, "charts")

    page.goto(dashboard + "/")
    sync_api.expect(page.locator("#goal-ship .strip")).to_contain_text("✓")
    page.locator("#goal-tidy").get_by_role("button", name="Pause").click()
    sync_api.expect(page.locator("#goal-tidy")).to_contain_text("paused")
    shot(page, "goals")
