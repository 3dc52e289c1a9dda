"""`runner continue RUN_ID`: an unfinished run picked back up from its transcript, as a new linked run.

The conversation is rebuilt from the `message` events of the old run's transcript (the last conversation
of its last attempt), then told why it stopped, which checks failed last, and the person's extra
instruction. The new run's attempts are numbered after the old run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import prompts
from ..errors import ConfigError
from ..store import Store
from ..vocabulary import FORCED, GOOD, RUNNING, Event
from .checks import CheckResult
from .feedback import describe_failures

CONTINUABLE = ("not_achieved", "stuck", "error", "cancelled", "interrupted")
"""Outcomes a run can be continued from; a forced stop (max_steps, ...) ends a run `not_achieved`."""


@dataclass
class Resume:
    """Where a continued run starts: the old run, its conversation and the next attempt's number."""

    run_id: str
    goal: str
    messages: list[dict[str, Any]]
    first_attempt: int


def resume_from(store: Store, run_id: str, text: str | None = None) -> Resume:
    """The run to continue, its conversation rebuilt; ConfigError (exit 2) saying why a run cannot be."""
    run = store.run(run_id)
    run_id, outcome = run["id"], run["outcome"]
    if outcome == RUNNING:
        raise ConfigError(f"run {run_id} is still running; wait for it to end (or cancel it) before continuing it")
    if outcome in GOOD:
        raise ConfigError(f"run {run_id} ended {outcome}: there is nothing left to continue")
    if outcome not in CONTINUABLE:
        raise ConfigError(
            f"run {run_id} ended {outcome}; runner continue picks up runs that ended {', '.join(CONTINUABLE)}"
            + (" (answer it with runner approve or runner reject)" if outcome == "awaiting_approval" else "")
        )
    events = store.transcript_events(run_id)
    messages = last_conversation(events)
    if not messages:
        raise ConfigError(
            f"run {run_id} cannot be continued: its transcript ({store.transcript_location(run_id)}) is gone "
            "or holds no conversation"
        )
    messages.append({"role": "user", "content": _continue_text(run, events, text)})
    return Resume(run_id, run["goal"], messages, int(run["attempts"] or 0) + 1)


def last_conversation(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages of the last conversation a transcript holds (a fresh context starts a new one)."""
    messages: list[dict[str, Any]] = []
    for event in events:
        if event.get("kind") != Event.MESSAGE or not isinstance(event.get("message"), dict):
            continue
        message = event["message"]
        if message.get("role") == "system":
            messages = []
        messages.append(message)
    return _answer_open_calls(messages)


def _answer_open_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run killed inside a round left calls without results; answer them so the conversation stays valid."""
    answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    for call in (last or {}).get("tool_calls") or []:
        if call.get("id") not in answered:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "error: not run: the run ended"})
    return messages


def _continue_text(run: dict[str, Any], events: list[dict[str, Any]], text: str | None) -> str:
    why = f"the run ended {run['outcome']}"
    if run.get("stop_reason") in FORCED:
        why += f" at the {run['stop_reason']} limit"
    if run.get("error"):
        why += f": {run['error']}"
    failed = describe_failures(_last_checks(events))
    return prompts.CONTINUE.format(
        why=why,
        checks=prompts.CONTINUE_CHECKS.format(checks=failed) if failed else "",
        extra=prompts.CONTINUE_EXTRA.format(text=text) if text else "",
    )


def _last_checks(events: list[dict[str, Any]]) -> list[CheckResult]:
    """The check results of the last attempt that ran checks."""
    checks = [e for e in events if e.get("kind") == Event.CHECK]
    if not checks:
        return []
    last = checks[-1].get("attempt")
    fields = ("name", "passed", "command", "exit_code", "output", "reason", "duration_s", "skipped")
    return [
        CheckResult(kind=e.get("check_kind", "run"), **{k: e[k] for k in fields if k in e})
        for e in checks
        if e.get("attempt") == last
    ]
