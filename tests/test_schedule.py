"""The schedule loop: real daemon processes, started, signalled, killed; the store read back."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import os
import signal
import time
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from daemon_helpers import monitor, post, schedule

from runner.config import Entry
from runner.schedule.triggers import missed_fire, time_trigger
from runner.store import SqliteStore


def spans(runs: list[dict]) -> list[tuple[datetime, datetime]]:
    return sorted((datetime.fromisoformat(r["started"]), datetime.fromisoformat(r["ended"])) for r in runs)


def test_interval_runs_and_a_clean_sigterm(proj, daemons, server):
    monitor(proj, "ping")
    schedule(proj, {"goal": "ping", "every": "1s", "checks_first": True})
    daemon = daemons(proj)
    runs = daemon.wait_runs(3, "satisfied")
    assert daemon.stop() == 0
    assert {r["trigger"] for r in runs} == {"every"}
    assert server.requests == []  # the monitor made no model request
    assert "outcome   ping [main/ping/every] satisfied" in daemon.log


def test_a_slow_goal_on_a_fast_interval_never_overlaps(proj, daemons):
    monitor(proj, "slow", check="sleep 1.2")
    schedule(proj, {"goal": "slow", "every": "0.3s", "checks_first": True})
    daemon = daemons(proj)
    daemon.wait_runs(3, "satisfied")
    daemon.stop()
    finished = [r for r in daemon.runs() if r["ended"]]
    assert not spans_overlap(finished)
    skips = daemon.events("skip")
    assert any("a follow-up is already queued" in e["detail"] for e in skips)
    assert len(daemon.events("trigger")) == len(daemon.events("start")) + len(skips)


def test_sigterm_drains_a_running_goal(proj, daemons):
    monitor(proj, "job", check="sleep 1.5")
    proj.write("runner.yaml", proj.root.joinpath("runner.yaml").read_text() + "  shutdown_grace: 20s\n")
    schedule(proj, {"goal": "job", "every": "0.5s", "checks_first": True})
    daemon = daemons(proj)
    daemon.wait_log("start     job")
    assert daemon.stop() == 0
    runs = daemon.runs()
    assert [r["outcome"] for r in runs] == ["satisfied"]


def test_sigterm_past_the_grace_cancels_and_kills(proj, daemons):
    monitor(proj, "hang", check="sleep 77.5")
    proj.write("runner.yaml", proj.root.joinpath("runner.yaml").read_text() + "  shutdown_grace: 0.5s\n")
    schedule(proj, {"goal": "hang", "every": "0.5s", "checks_first": True})
    daemon = daemons(proj)
    daemon.wait_log("start     hang")
    time.sleep(0.3)
    assert daemon.stop() == 0
    assert [r["outcome"] for r in daemon.runs()] == ["cancelled"]
    assert "sleep 77.5" not in os.popen("ps -eo args").read()


def test_sigkill_then_restart_marks_interrupted(proj, daemons):
    monitor(proj, "hang", check="sleep 30.3")
    schedule(proj, {"goal": "hang", "every": "0.5s", "checks_first": True})
    daemon = daemons(proj)
    daemon.wait_log("start     hang")
    assert wait_for(lambda: "sleep 30.3" in os.popen("ps -eo args").read().splitlines())  # the check runs
    daemon.stop(signal.SIGKILL)
    assert [r["outcome"] for r in daemon.runs()] == ["running"]
    assert "sleep 30.3" in os.popen("ps -eo args").read()  # SIGKILL leaves the check running
    schedule(proj, {"goal": "hang", "every": "1h"})
    second = daemons(proj)
    assert daemon.runs()[0]["outcome"] == "interrupted"
    assert wait_for(lambda: "sleep 30.3" not in os.popen("ps -eo args").read())  # the restart killed what was left
    assert "interrupted" in second.log
    assert second.stop() == 0
    assert not [r for r in second.runs() if r["outcome"] == "running"]


def wait_for(condition, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_catch_up_after_downtime_runs_once(proj, daemons):
    monitor(proj, "nightly")
    monitor(proj, "stale")
    schedule(
        proj,
        {"goal": "nightly", "every": "1h", "checks_first": True},
        {"goal": "stale", "every": "1h", "checks_first": True, "misfire_grace": "10m"},
    )
    store = SqliteStore(proj.root / ".runner")
    now = datetime.now(timezone.utc)
    store.update_entry("main/nightly/every", last_fire=(now - timedelta(hours=1, minutes=2)).isoformat())
    store.update_entry("main/stale/every", last_fire=(now - timedelta(hours=3)).isoformat())
    daemon = daemons(proj)
    daemon.wait_runs(1, "satisfied")
    daemon.stop()
    runs = daemon.runs()
    assert [(r["goal"], r["trigger"]) for r in runs] == [("nightly", "catch_up")]
    assert any("beyond misfire_grace" in e["detail"] for e in daemon.events("skip"))
    again = daemons(proj)  # the catch-up is not repeated at the next start
    time.sleep(1)
    again.stop()
    assert len(again.runs()) == 1


def test_after_chaining(proj, daemons):
    monitor(proj, "build")
    monitor(proj, "deploy")
    monitor(proj, "rollback")
    monitor(proj, "notify")
    schedule(
        proj,
        {"goal": "deploy", "after": "build", "on": "achieved", "checks_first": True},
        {"goal": "rollback", "after": "build", "on": "not_achieved", "checks_first": True},
        {"goal": "notify", "after": "deploy", "on": "any", "checks_first": True},
    )
    daemon = daemons(proj)
    assert proj.cli("trigger", "build").exit_code == 0
    daemon.wait_runs(3)
    time.sleep(0.5)
    daemon.stop()
    assert sorted((r["goal"], r["trigger"]) for r in daemon.runs()) == [
        ("build", "manual"),
        ("deploy", "after"),
        ("notify", "after"),
    ]


def test_file_change_triggers_once_per_debounce_window(proj, daemons):
    monitor(proj, "docs")
    (proj.root / "docs").mkdir()
    schedule(proj, {"goal": "docs", "watch": ["docs/**/*.md"], "debounce": "1s", "checks_first": True})
    daemon = daemons(proj)
    time.sleep(0.5)
    for i in range(5):
        (proj.root / "docs" / f"page{i}.md").write_text(f"edit {i}")
        (proj.root / "docs" / "ignored.txt").write_text(f"edit {i}")
        time.sleep(0.1)
    daemon.wait_runs(1, "satisfied")
    time.sleep(2)
    assert len(daemon.runs()) == 1
    (proj.root / "docs" / "later.md").write_text("a new window")
    daemon.wait_runs(2, "satisfied")
    daemon.stop()


def test_watch_and_webhook_entries_added_by_a_reload_start_their_listeners(proj, daemons):
    """Nothing watches the project or listens for webhooks until an entry needs it, and a reload that adds
    the first such entry starts it (a daemon is left alone for a month; its schedules change under it)."""
    monitor(proj, "docs")
    monitor(proj, "triage")
    (proj.root / "docs").mkdir()
    proj.write("runner.yaml", proj.root.joinpath("runner.yaml").read_text() + "  webhook: {port: 0}\n")
    schedule(proj, {"goal": "docs", "every": "1h"})
    daemon = daemons(proj)
    (proj.root / "docs" / "early.md").write_text("before any watch entry")
    time.sleep(1)
    assert daemon.runs() == [] and "webhooks listen" not in daemon.log
    schedule(
        proj,
        {"goal": "docs", "watch": ["docs/*.md"], "debounce": "0.2s", "checks_first": True},
        {"goal": "triage", "webhook": "triage", "secret": "s3cret", "checks_first": True},
    )
    daemon.wait_log("webhooks listen on http://127.0.0.1:")
    (proj.root / "docs" / "page.md").write_text("after the reload")
    daemon.wait_runs(1, "satisfied")
    port = int((proj.root / ".runner" / "webhook.port").read_text())
    assert post(port, b"{}", "sha256=" + hmac.new(b"s3cret", b"{}", hashlib.sha256).hexdigest()) == 202
    daemon.wait_runs(2, "satisfied")
    daemon.stop()
    assert sorted((r["goal"], r["trigger"]) for r in daemon.runs()) == [("docs", "watch"), ("triage", "webhook")]


def test_webhook_signatures_and_body_limit(proj, daemons):
    monitor(proj, "triage")
    proj.write("runner.yaml", proj.root.joinpath("runner.yaml").read_text() + "  webhook: {port: 0, max_body: 1000}\n")
    schedule(proj, {"goal": "triage", "webhook": "triage", "secret": "s3cret", "checks_first": True})
    daemon = daemons(proj)
    daemon.wait_log("webhooks listen on http://127.0.0.1:")
    port = int((proj.root / ".runner" / "webhook.port").read_text())
    body = json.dumps({"issue": 7}).encode()
    good = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert post(port, body, "sha256=" + "0" * 64) == 401
    assert post(port, body, None) == 401
    assert post(port, b"x" * 5000, good) == 413
    time.sleep(0.5)
    assert daemon.runs() == []
    assert post(port, body, good) == 202
    daemon.wait_runs(1, "satisfied")
    daemon.stop()
    assert [r["trigger"] for r in daemon.runs()] == ["webhook"]
    assert len(daemon.events("rejected")) == 3


def test_invalid_hot_reload_keeps_the_last_good_config(proj, daemons):
    monitor(proj, "a")
    schedule(proj, {"goal": "a", "every": "1h"})
    daemon = daemons(proj)
    proj.write("goals/a.yaml", "prompt: hi\nlimits: {max_steps: many}\n")
    daemon.wait_log("reload failed")
    assert "goals/a.yaml:2: limits.max_steps" in daemon.log
    assert proj.cli("trigger", "a").exit_code == 2  # the CLI sees the broken file
    monitor(proj, "a")
    monitor(proj, "b")
    schedule(proj, {"goal": "a", "every": "1h"}, {"goal": "b", "every": "1s", "checks_first": True})
    daemon.wait_log("reloaded")
    runs = daemon.wait_runs(1, "satisfied")
    daemon.stop()
    assert runs[0]["goal"] == "b"


def test_circuit_breaker_pauses_until_resume(proj, daemons):
    proj.write("script.yaml", "- content: I did nothing.\n")
    proj.goal("flaky", prompt="p", model="script:script.yaml", verify={"max_attempts": 1, "checks": [{"run": "false"}]})
    schedule(proj, {"goal": "flaky", "every": "0.3s", "pause_after": 2})
    daemon = daemons(proj)
    daemon.wait_log("paused    flaky")
    time.sleep(1)
    assert [r["outcome"] for r in daemon.runs()] == ["not_achieved", "not_achieved"]
    assert any("paused" in e["detail"] for e in daemon.events("skip"))
    listed = json.loads(proj.cli("list", "--json").output)
    assert listed[0]["paused"] is True and listed[0]["last_outcome"] == "not_achieved"
    assert proj.cli("resume", "flaky").exit_code == 0
    daemon.wait_runs(3)
    daemon.stop()


def test_trigger_pause_resume_from_the_cli(proj, daemons):
    monitor(proj, "a")
    schedule(proj, {"goal": "a", "every": "0.5s", "checks_first": True})
    assert "no daemon is running" in proj.cli("trigger", "a").output
    assert proj.cli("pause", "a").output.strip() == "paused main/a/every"
    daemon = daemons(proj)
    runs = daemon.wait_runs(1)
    assert runs[0]["trigger"] == "manual"  # the queued trigger ran; the paused entry did not
    time.sleep(1.2)
    assert len(daemon.runs()) == 1
    assert proj.cli("resume", "a").exit_code == 0
    daemon.wait_runs(3)
    daemon.stop()
    assert proj.cli("pause", "nope").exit_code == 2


def test_two_goals_twenty_triggers_one_slot_all_recorded(proj, daemons):
    monitor(proj, "x", check="sleep 0.2")
    monitor(proj, "y", check="sleep 0.2")
    proj.write("runner.yaml", proj.root.joinpath("runner.yaml").read_text() + "  max_concurrent_runs: 1\n")
    daemon = daemons(proj)
    store = SqliteStore(proj.root / ".runner")
    for _ in range(20):
        store.send_command("trigger", "x")
        store.send_command("trigger", "y")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        events = daemon.events()
        if len([e for e in events if e["kind"] == "trigger"]) == 40 and all(r["ended"] for r in daemon.runs()):
            break
        time.sleep(0.2)
    time.sleep(1)
    daemon.stop()
    kinds = [e["kind"] for e in daemon.events()]
    assert kinds.count("trigger") == 40
    assert kinds.count("start") + kinds.count("skip") == 40
    assert kinds.count("start") == len(daemon.runs()) >= 2
    for goal in ("x", "y"):
        assert any(r["goal"] == goal for r in daemon.runs())
    assert not spans_overlap(daemon.runs())


def spans_overlap(runs: list[dict]) -> bool:
    ordered = spans(runs)
    return any(start < end for (_, end), (start, _) in itertools.pairwise(ordered))


def test_a_second_daemon_is_refused(proj, daemons):
    monitor(proj, "a")
    daemons(proj)
    result = proj.subprocess("daemon", timeout=60)
    assert result.returncode == 3 and "another daemon is already running" in result.stderr


def test_validate_refuses_bad_schedules(proj):
    monitor(proj, "a")
    proj.write(
        "schedules/bad.yaml",
        "- goal: a\n  cron: '61 * * * *'\n- goal: ghost\n  every: 5m\n"
        "- goal: a\n  every: 5m\n  cron: '* * * * *'\n- goal: a\n  webhook: w\n"
        "- goal: a\n  cron: '0 9 * * *'\n  timezone: Mars/Olympus\n",
    )
    result = proj.cli("validate")
    assert result.exit_code == 2
    err = result.stderr
    assert "schedules/bad.yaml:2: [0].cron: Error validating expression '61'" in err
    assert "schedules/bad.yaml:3: [1].goal: unknown goal 'ghost'" in err
    assert "schedules/bad.yaml:5: [2]: an entry needs exactly one trigger" in err and "found cron, every" in err
    assert "schedules/bad.yaml:9: [3].webhook: a webhook needs `secret:`" in err
    assert "schedules/bad.yaml:12: [4].timezone: unknown time zone 'Mars/Olympus'" in err
    assert proj.subprocess("daemon", timeout=60).returncode == 2


BERLIN = ZoneInfo("Europe/Berlin")


def fires_on(expr: str, day: datetime) -> list[datetime]:
    """The fire times within one local day, from a controlled clock (no waiting)."""
    trigger = time_trigger(Entry(goal="g", cron=expr, timezone="Europe/Berlin"))
    start, end = day, day + timedelta(days=1)
    fires, previous, now = [], None, start
    while True:
        fire = trigger.get_next_fire_time(previous, now)
        if fire is None or fire >= end:
            return fires
        fires.append(fire)
        previous = now = fire


def utc(fires: list[datetime]) -> list[str]:
    return [f.astimezone(timezone.utc).strftime("%H:%M") for f in fires]


def test_dst_fall_back_does_not_double_fire():
    day = datetime(2026, 10, 25, tzinfo=BERLIN)  # 03:00 CEST -> 02:00 CET
    assert utc(fires_on("30 2 * * *", day)) == ["00:30"]  # once, at the first 02:30
    assert len(fires_on("30 * * * *", day)) == 25  # hourly jobs run in both 02:xx hours


def test_dst_spring_forward_does_not_skip():
    day = datetime(2026, 3, 29, tzinfo=BERLIN)  # 02:00 CET -> 03:00 CEST; 02:30 does not exist
    assert utc(fires_on("30 2 * * *", day)) == ["01:30"]  # runs at 03:30 CEST instead of never
    assert len(fires_on("30 * * * *", day)) == 23


def test_missed_fire_for_cron_in_its_timezone():
    entry = Entry(goal="g", cron="0 9 * * *", timezone="Asia/Shanghai")
    last = datetime(2026, 11, 1, 1, 0, tzinfo=timezone.utc)  # 09:00 in Shanghai
    assert missed_fire(entry, last, last + timedelta(hours=23)) is None
    missed = missed_fire(entry, last, last + timedelta(hours=25))
    assert missed == datetime(2026, 11, 2, 1, 0, tzinfo=timezone.utc)


def test_shutdown_does_not_wait_for_a_person(proj, daemons):
    proj.write("script.yaml", "- content: I wrote it.\n")
    proj.goal(
        "ship", prompt="p", model="script:script.yaml", verify={"max_attempts": 1, "checks": [{"approve": "Publish?"}]}
    )
    proj.write("runner.yaml", proj.root.joinpath("runner.yaml").read_text() + "  shutdown_grace: 120s\n")
    daemon = daemons(proj)
    assert proj.cli("trigger", "ship").exit_code == 0
    run = daemon.wait_runs(1, "awaiting_approval")[0]
    assert daemon.stop(timeout=60) == 0  # well before the 120 s grace
    assert daemon.runs()[0]["outcome"] == "awaiting_approval"
    result = proj.cli("approve", run["run_id"])
    assert "its outcome is achieved" in result.output
