"""The daemon under faults: slow webhook clients, hostile reloads, a locked or deleted store, a stopped daemon."""

from __future__ import annotations

import hashlib
import hmac
import json
import resource
import signal
import socket
import sqlite3
import threading
import time

from daemon_helpers import monitor, post, schedule


def low_descriptor_limit(limit: int = 256):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


def settings(proj, daemon: str) -> None:
    proj.write("runner.yaml", proj.root.joinpath("runner.yaml").read_text() + daemon)


def test_slow_webhook_clients_cannot_starve_the_runs(proj, daemons):
    monitor(proj, "tick")
    monitor(proj, "triage")
    settings(proj, "  webhook: {port: 0, max_connections: 16, request_timeout: 1s}\n")
    schedule(proj, {"goal": "tick", "every": "1s"}, {"goal": "triage", "webhook": "triage", "secret": "s3cret"})
    daemon = daemons(proj, preexec_fn=low_descriptor_limit(256))
    daemon.wait_log("webhooks listen on")
    port = int((proj.root / ".runner" / "webhook.port").read_text())
    flood = []
    for _ in range(400):  # far more half-open connections than the daemon has descriptors
        try:
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    for sock in flood[::2]:
        sock.sendall(b"POST /hooks/triage HTTP/1.1\r\nContent-Length: 100\r\n\r\n")  # and never the body
    before = len(daemon.runs())
    daemon.wait_runs(before + 3, "satisfied", timeout=30)
    for sock in flood:
        sock.close()
    body = json.dumps({"issue": 1}).encode()
    assert post(port, body, "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()) == 202
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.log
    assert all(r["outcome"] != "running" for r in daemon.runs())
    assert any(r["trigger"] == "webhook" for r in daemon.runs())


def test_a_reload_that_fails_in_any_way_keeps_the_last_good_config_and_later_reloads_work(proj, daemons):
    monitor(proj, "a")
    schedule(proj, {"goal": "a", "every": "1h"})
    daemon = daemons(proj)
    proj.write("schedules/main.yaml", "[" * 50_000)  # deeper than any parser's recursion
    daemon.wait_log("reload failed; keeping the last good configuration")
    proj.write("goals/a.yaml", {"prompt": "x", "verify": {"max_attempts": 1}, "nonsense": True})
    daemon.wait_log("reload failed", count=2)
    monitor(proj, "a")
    schedule(proj, {"goal": "a", "every": "1s"})
    daemon.wait_log("reloaded")
    daemon.wait_runs(2, "satisfied")
    assert proj.cli("trigger", "a").exit_code == 0
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.log


def hold_lock(path, seconds: float, locked: threading.Event) -> None:
    db = sqlite3.connect(path, timeout=10, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    locked.set()
    time.sleep(seconds)
    db.execute("COMMIT")
    db.close()


def test_a_store_locked_past_its_timeout_delays_fires_but_loses_none(proj, daemons):
    monitor(proj, "tick")
    settings(proj, "  store_timeout: 0.2s\n")
    schedule(proj, {"goal": "tick", "every": "1s"})
    daemon = daemons(proj)
    daemon.wait_runs(1, "satisfied")
    locked = threading.Event()
    holder = threading.Thread(target=hold_lock, args=(proj.root / ".runner" / "runs.db", 3.0, locked))
    holder.start()
    assert locked.wait(15)
    daemon.wait_log("is tried again at the next poll", timeout=20)
    holder.join()
    count = len(daemon.runs())
    daemon.wait_runs(count + 2, "satisfied", timeout=30)
    assert daemon.stop() == 0
    assert "Traceback" not in daemon.log
    assert all(r["outcome"] != "running" for r in daemon.runs())


def test_a_store_deleted_under_the_daemon_stops_it_with_the_reason(proj, daemons):
    monitor(proj, "a")
    schedule(proj, {"goal": "a", "every": "1h"})
    daemon = daemons(proj)
    for name in ("runs.db", "runs.db-wal", "runs.db-shm"):
        (proj.root / ".runner" / name).unlink(missing_ok=True)
    assert daemon.proc.wait(30) == 3
    daemon.wait_log("was deleted while in use")
    assert "Traceback" not in daemon.log


def test_trigger_does_not_claim_success_when_the_daemon_takes_nothing(proj, daemons):
    monitor(proj, "a")
    schedule(proj, {"goal": "a", "every": "1h"})
    daemon = daemons(proj)
    daemon.proc.send_signal(signal.SIGSTOP)
    try:
        result = proj.cli("trigger", "a")
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    assert result.exit_code == 3
    assert "did not take the trigger of a" in result.output
    daemon.wait_runs(1, "satisfied")  # it stays queued, and runs once the daemon goes on
