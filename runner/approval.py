"""`runner approve` / `runner reject`: answer a run waiting on an `approve` check.

A live waiting process (a `runner goal` without a terminal, or the daemon) takes the answer from the
store and goes on. When that process is gone, the run is finished here: the checks after the approved
one are run, and the run ends `achieved`, `not_achieved` or `rejected`.
"""

from __future__ import annotations

import asyncio

from .checks import run_checks_alone
from .config import Project, load_goal
from .errors import ConfigError
from .store import Store, pid_alive

HANDOVER_WAIT = 10.0


async def answer(project: Project, run_id: str, decision: str, reason: str | None) -> str:
    store = Store(project.state)
    run = store.run(run_id)
    run_id = run["id"]
    if run["outcome"] != "awaiting_approval":
        raise ConfigError(f"run {run_id} is not waiting for approval (its outcome is {run['outcome']})")
    store.answer(run_id, decision, reason)
    verb = "approved" if decision == "approve" else "rejected"
    if pid_alive(run["pid"]):
        for _ in range(int(HANDOVER_WAIT / 0.1)):
            if store.run(run_id)["outcome"] != "awaiting_approval":
                return f"{verb} run {run_id}; process {run['pid']} goes on with it"
            await asyncio.sleep(0.1)
    store.take_answer(run_id)
    if decision != "approve":
        store.finish_run(run_id, "rejected", error=reason or "rejected", pending=None)
        return f"rejected run {run_id}: its outcome is rejected"
    outcome = await _finish_checks(project, store, run)
    return f"approved run {run_id}: its outcome is {outcome}"


async def _finish_checks(project: Project, store: Store, run: dict) -> str:
    """Record the approval and run the checks after it, for a run whose process is gone."""
    goal = load_goal(project, run["goal"])
    names = [c.name for c in goal.verify.checks]
    attempt = max([c["attempt"] for c in run["checks"]], default=run["attempts"])
    position = names.index(run["pending"]) if run["pending"] in names else len(names) - 1
    store.record_check(
        run["id"],
        attempt,
        position,
        name=run["pending"],
        kind="approve",
        passed=1,
        reason="approved with runner approve",
    )
    later = goal.verify.checks[position + 1 :]
    results = await run_checks_alone(
        goal,
        later,
        run["id"],
        attempt,
        approver=None,
        on_result=lambda i, r: store.record_check(run["id"], attempt, position + 1 + i, **r.columns()),
    )
    outcome = "achieved" if all(r.passed for r in results) else "not_achieved"
    store.finish_run(run["id"], outcome, pending=None)
    return outcome
