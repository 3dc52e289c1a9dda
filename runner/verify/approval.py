"""Approval, in one place: a person answers the `approve` checks.

- At a terminal, `TerminalApprover` asks there and then.
- Without one (the daemon, CI), `StoreApprover` leaves the run `awaiting_approval` and waits for the
  answer that `runner approve` / `runner reject` (`answer`) writes into the store.
- When the waiting process is gone, `answer` finishes the run itself, as the verify loop would have: the
  approval's result, then (approved) the checks after it, then the outcome (`achieved`, `satisfied`,
  `not_achieved` or `rejected`), each written to the store and appended to the run's transcript.

The checks see only the `Approver` interface (`checks.Approver`).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from datetime import datetime
from typing import Any

from ..config import Check, Goal, Project, load_goal
from ..errors import ConfigError
from ..store import Store, now, open_store
from ..vocabulary import Event, Outcome
from .checks import CheckResult, run_checks_alone

HANDOVER_WAIT = 10.0


async def answer(project: Project, run_id: str, decision: str, reason: str | None) -> str:
    """Answer the approve check run `run_id` waits on; `reason` says why, or who decided (the caller knows)."""
    store = open_store(project)
    try:
        said = await _answer(project, store, run_id, decision, reason)
        store.flush()  # what the person reads next (runner show) is in the store
        return said
    finally:
        store.close()


async def _answer(project: Project, store: Store, run_id: str, decision: str, reason: str | None) -> str:
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
    try:  # before the run changes hands: a refusal leaves it waiting as it was
        goal = _goal_here(project, run) if decision == "approve" else None
    except Exception:
        store.take_answer(run_id)
        raise
    if not store.take_over(run_id):  # its process, or another answer at the same moment, took it first
        return f"{verb} run {run_id}; it was taken up meanwhile (runner show {run_id})"
    store.take_answer(run_id)
    approval = CheckResult(run["pending"], "approve", decision == "approve", reason=reason or verb)  # as approve_check
    outcome = await _finish_alone(store, run, approval, goal)
    again = f" (runner continue {run_id} tries again)" if outcome == "not_achieved" else ""
    return f"{verb} run {run_id}: its outcome is {outcome}{again}"


def _goal_here(project: Project, run: dict[str, Any]) -> Goal:
    """The goal whose checks after the approval this process runs: only on the machine where the run's work was
    done (its files are there), and only with a goal file that loads."""
    host = run.get("host")
    if host and host != socket.gethostname():
        raise ConfigError(
            f"run {run['id']} was worked on {host} and its process is gone: approve it on {host}, where the checks"
            " after the approval can see its work (a rejection runs no check and works from anywhere)"
        )
    return load_goal(project, run["goal"])


async def _finish_alone(store: Store, run: dict[str, Any], approval: CheckResult, goal: Goal | None) -> Outcome:
    """Finish a run whose process is gone with the approval's result: its checks and its outcome go to the
    store and to its transcript, as the verify loop writes them. A rejection runs no more checks (`goal` None)."""
    attempt = run["attempts"]  # 0: the checks before any work (checks_first)
    ran = [c for c in run["checks"] if c["attempt"] == attempt]  # the checks before it, in order
    answered = [c["position"] for c in ran if c["name"] == approval.name and c["kind"] == "approve"]
    position = answered[0] if answered else len(ran)  # answered: a runner approve stopped half-way
    transcript = store.transcript(run["id"])

    def recorded(index: int, result: CheckResult) -> None:
        store.record_check(run["id"], attempt, position + index, **result.columns())
        transcript.append(Event.CHECK, {"attempt": attempt, **result.record()})

    try:
        recorded(0, approval)
        outcome: Outcome = "rejected"
        if goal is not None:
            later = goal.verify.checks[position + 1 :]
            results = await run_checks_alone(goal, later, run["id"], attempt, None, lambda i, r: recorded(i + 1, r))
            passed = all(r.passed for r in results)
            outcome = "not_achieved" if not passed else "satisfied" if attempt == 0 else "achieved"
        error = None if approval.passed else approval.reason
        store.finish_run(run["id"], outcome, error=error, pending=None)
        transcript.append(Event.OUTCOME, _outcome_event(run, outcome, error))
    finally:
        transcript.close()
    return outcome


def _outcome_event(run: dict[str, Any], outcome: Outcome, error: str | None) -> dict[str, Any]:
    """The transcript's closing event, with the usage the run's process recorded before it went."""
    waited = datetime.fromisoformat(now()) - datetime.fromisoformat(run["started"])
    return {
        "outcome": outcome,
        "error": error,
        "attempts": run["attempts"],
        "steps": run["steps"],
        "tokens": run["tokens"],
        "cost_usd": run.get("cost"),
        "duration_s": round(waited.total_seconds(), 3),
    }


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
