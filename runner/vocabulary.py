"""The words the loops, the store, the display and the CLI share: outcomes, stop reasons, event kinds.

Each is defined here once; everything else imports it.
"""

from __future__ import annotations

from typing import Literal, get_args

Outcome = Literal[
    "achieved",
    "satisfied",
    "not_achieved",
    "stuck",
    "tampered",
    "error",
    "cancelled",
    "interrupted",
    "awaiting_approval",
    "rejected",
]
"""How a run ended (DESIGN section 4); `running` is what the store shows before that."""
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
GOOD: tuple[Outcome, ...] = ("achieved", "satisfied")
"""The outcomes that mean the goal is met."""
RUNNING = "running"

StopReason = Literal["completed", "max_steps", "max_tokens", "max_cost", "timeout", "length", "error", "cancelled"]
"""Why one attempt's work loop ended (DESIGN section 3)."""
STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)
FORCED: tuple[StopReason, ...] = ("max_steps", "max_tokens", "max_cost", "timeout")
"""Stops by a limit: the work is unfinished."""


class Event:
    """Every kind of event a run emits to its observers and its transcript, with the data it carries.

    The work loop emits STEP, REPLY, MESSAGE, TOOL_CALL, TOOL_RESULT, TEXT_TOOL_CALL, NUDGE and STOPPED; the
    verify loop emits RUN, SANDBOX, TRIGGER, PRICE_UNKNOWN, ATTEMPT, CHECK, FEEDBACK, BEFORE_RETRY and OUTCOME.
    """

    RUN = "run"
    """A run began: run_id, goal, trigger, continues (the run it picks back up, or None)."""
    SANDBOX = "sandbox"
    """Where the agent's processes run: status (the bubblewrap jail, or off and why)."""
    TRIGGER = "trigger"
    """What triggered the run (DESIGN 10): context (as written to trigger.json: kind, entry, fired, ...)."""
    PRICE_UNKNOWN = "price_unknown"
    """The model's price is unknown; the run's cost is counted in tokens only: model, reason."""
    ATTEMPT = "attempt"
    """An attempt began: attempt, of (max_attempts)."""
    STEP = "step"
    """A round of the work loop began: step."""
    REPLY = "reply"
    """The model answered: step, finish_reason, usage, cost (US dollars; None when the price is unknown)."""
    MESSAGE = "message"
    """A message was appended to the conversation: message."""
    TOOL_CALL = "tool_call"
    """A tool call starts: step, id, name, summary."""
    TOOL_RESULT = "tool_result"
    """A tool call ended: step, id, name, summary, output, duration_s."""
    NUDGE = "nudge"
    """The model stopped without acting after feedback and was told to use the tools: step, text."""
    TEXT_TOOL_CALL = "text_tool_call"
    """A reply wrote tool calls as text: step, names, content (what it wrote), executed (run as calls, or not),
    unknown (true when the names are of tools that do not exist: the model was told which there are)."""
    STOPPED = "stopped"
    """The work loop ended: reason (a StopReason), steps, tokens, error."""
    CHECK = "check"
    """A check ended: attempt, name, check_kind, passed, command, exit_code, output, reason, duration_s, skipped."""
    FEEDBACK = "feedback"
    """The failed checks' feedback to the model: attempt, text (all of it), checks (what the checks said),
    did (what the attempt changed, and the files the failing checks read that it left alone)."""
    BEFORE_RETRY = "before_retry"
    """verify.before_retry ran: command, exit_code, output."""
    CLAIM_WAIT = "claim_wait"
    """The run waits for other runs of the project whose goals may write what it protects, or protect what
    it may write (the tamper lock): runs (their ids)."""
    OUTCOME = "outcome"
    """The run ended: outcome, error, attempts, steps, tokens, cost_usd, duration_s."""


EVENTS: tuple[str, ...] = tuple(v for k, v in vars(Event).items() if k.isupper())
