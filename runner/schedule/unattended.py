"""What the daemon adds for unattended operation (DESIGN 10): each trigger's context, daily budgets, and
the notifications that no run carries (an entry paused by its circuit breaker, a budget spent).

A context is a JSON object: `kind`, `entry`, `goal`, `fired`, and what the kind adds:
    webhook   body (parsed JSON, else text) and the chosen headers (X-GitHub-Event, ...)
    watch     paths: the changed paths, relative to the project root
    after     upstream: {goal, run_id, outcome}
    manual    by (runner trigger), payload (its --payload)
    cron / every / at / catch_up   fired: the fire time
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .. import notify
from ..config import Entry, Goal

if TYPE_CHECKING:
    from .daemon import Daemon

log = logging.getLogger("runner.daemon")

WEBHOOK_HEADERS = (
    "content-type",
    "user-agent",
    "x-github-event",
    "x-github-delivery",
    "x-github-hook-id",
    "x-gitlab-event",
    "x-gitea-event",
    "x-event-key",
    "x-request-id",
)
"""Headers of a webhook request that reach the run (never the signature or authorization)."""


def context_of(goal: Goal, entry: Entry | None, trigger: str, due: datetime | None, extra: dict | None) -> dict:
    """The whole context of one fire."""
    fired = (due or datetime.now(timezone.utc)).isoformat()
    return {"kind": trigger, "entry": entry.id if entry else None, "goal": goal.name, "fired": fired, **(extra or {})}


def webhook_context(body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    text = body.decode("utf-8", errors="replace")
    try:
        parsed: Any = json.loads(text) if text.strip() else None
    except ValueError:
        parsed = text
    return {"headers": {k: v for k, v in headers.items() if k in WEBHOOK_HEADERS}, "body": parsed}


def manual_context(payload: str | None) -> dict[str, Any]:
    """`runner trigger NAME [--payload FILE|-]`: the payload as JSON when it parses, else as text."""
    context: dict[str, Any] = {"by": "runner trigger"}
    if payload is not None:
        try:
            context["payload"] = json.loads(payload)
        except ValueError:
            context["payload"] = payload
    return context


def upstream_context(goal: str, run_id: str, outcome: str) -> dict[str, Any]:
    return {"upstream": {"goal": goal, "run_id": run_id, "outcome": outcome}}


# budgets
def spent_today(daemon: Daemon, goal: str, entry_id: str | None) -> tuple[float | None, int]:
    """US dollars (None if no run had a price) and tokens of today's runs (UTC) of a goal, or of one entry."""
    midnight = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0).isoformat()
    rows = daemon.store.find_runs(goal=goal, since=midnight, limit=1_000_000)
    rows = [r for r in rows if entry_id is None or r.get("entry") == entry_id]
    costs = [r["cost"] for r in rows if r.get("cost") is not None]
    return (sum(costs) if costs else None), sum(r["tokens"] or 0 for r in rows)


def over_budget(daemon: Daemon, goal: Goal, entry: Entry | None) -> str | None:
    """Why this fire is skipped for a spent daily budget (the entry's, then the goal's), or None."""
    for budget, entry_id, whose in (
        (entry.budget if entry else None, entry.id if entry else None, f"entry {entry.id if entry else ''}"),
        (goal.budget, None, f"goal {goal.name}"),
    ):
        if budget is None:
            continue
        cost, tokens = spent_today(daemon, goal.name, entry_id)
        if budget.cost_per_day is not None and cost is not None and cost >= budget.cost_per_day:
            return f"budget: {whose} spent ${cost:.4f} of ${budget.cost_per_day:g} today (UTC)"
        if budget.tokens_per_day is not None and tokens >= budget.tokens_per_day:
            return f"budget: {whose} spent {tokens} of {budget.tokens_per_day} tokens today (UTC)"
    return None


def skip_for_budget(daemon: Daemon, goal: Goal, entry: Entry | None) -> bool:
    """Record a skip (reason `budget`) when a daily budget is spent, and notify once a day; True if skipped."""
    reason = over_budget(daemon, goal, entry)
    if reason is None:
        return False
    daemon.record("skip", entry, reason, goal=goal.name)
    today = datetime.now(timezone.utc).date().isoformat()
    entry_id = entry.id if entry else None
    told = [e for e in daemon.store.events(notify.BUDGET) if e["goal"] == goal.name and e["entry"] == entry_id]
    if not any(e["at"].startswith(today) for e in told):
        daemon.record(notify.BUDGET, entry, reason + "; later fires today are skipped", goal=goal.name)
        tell(daemon, goal, entry, notify.BUDGET, reason, f"runner runs --goal {goal.name}")
    return True


def tell(
    daemon: Daemon, goal: Goal, entry: Entry | None, what: str, detail: str, look: str, run_id: str | None = None
) -> None:
    """Notify the targets of a goal (or its entry) of what no run of this daemon says: `paused`, `budget`,
    a run found `interrupted` at start."""
    entry_id = entry.id if entry else None

    def record(kind: str, text: str) -> None:
        daemon.store.log_event(kind, goal.name, entry_id, text)

    message = notify.Message(goal.name, what, run_id=run_id, entry=entry_id, error=detail, look=look)
    notify.announce(message, notify.targets_of(goal.notify, entry.notify if entry else None), goal.root, record)


def tell_interrupted(daemon: Daemon, run_id: str) -> None:
    """A run left `running` by a process that died (found at start) is an outcome too: `interrupted`."""
    run = daemon.store.run(run_id)
    goal = daemon.catalog.goals.get(run["goal"])
    if goal is not None:
        entry = daemon.entry(run["entry"]) if run.get("entry") else None
        tell(daemon, goal, entry, "interrupted", run.get("error") or "", f"runner show {run_id}", run_id)
