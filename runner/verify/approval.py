"""Approval, in one place: a person answers the `approve` checks.

- At a terminal, `TerminalApprover` asks there and then.
- Without one (the daemon, CI), `StoreApprover` leaves the run `awaiting_approval` and waits for the
  answer that `runner approve` / `runner reject` (`answer`) writes into the store.
- When the waiting process is gone, `answer` finishes the run itself: the checks after the approved
  one are run, and the run ends `achieved`, `not_achieved` or `rejected`.

The checks see only the `Approver` interface (`checks.Approver`).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from ..config import Check, Project, load_goal
from ..errors import ConfigError
from ..store import Store, open_store
from .checks import run_checks_alone

HANDOVER_WAIT = 10.0


async def answer(project: Project, run_id: str, decision: str, reason: str | None) -> str:
    store = open_store(project)
    run = store.run(run_id)
    run_id = run["id"]
    if run["outcome"] != "awaiting_approval":
        raise ConfigError(f"run {run_id} is not waiting for approval (its outcome is {run['outcome']})")
    store.answer(run_id, decision, reason)
    verb = "approved" if decision == "approve" else "rejected"
    if store.run_alive(run):
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


class TerminalApprover:
    """Asks at the terminal: y approves, anything else rejects (with the reason typed after)."""

    async def __call__(self, run_id: str, check: Check) -> tuple[bool, str | None]:
        answer = await asyncio.to_thread(_ask, f"{check.approve} [y/N] ")
        if answer.strip().lower() in ("y", "yes"):
            return True, "approved at the terminal"
        reason = await asyncio.to_thread(_ask, "Reason (optional): ")
        return False, reason.strip() or "rejected at the terminal"


def _ask(question: str) -> str:
    sys.stderr.write(question)
    sys.stderr.flush()
    return sys.stdin.readline()


class StoreApprover:
    """Without a terminal: the run waits as `awaiting_approval` until `runner approve` or `runner reject`."""

    def __init__(self, store: Store, poll: float = 0.3) -> None:
        self.store = store
        self.poll = poll
        self.waiting: set[asyncio.Task[Any]] = set()
        """The tasks waiting on a person now; a shutting-down daemon need not give them its grace."""

    async def __call__(self, run_id: str, check: Check) -> tuple[bool, str | None]:
        # Cancelled or killed while waiting, the run stays `awaiting_approval`: `runner approve` finishes it.
        self.store.update_run(run_id, outcome="awaiting_approval", pending=check.name)
        task = asyncio.current_task()
        assert task is not None
        self.waiting.add(task)
        try:
            while (answer := self.store.take_answer(run_id)) is None:
                await asyncio.sleep(self.poll)
        finally:
            self.waiting.discard(task)
        self.store.update_run(run_id, outcome="running", pending=None)
        return answer[0] == "approve", answer[1]
