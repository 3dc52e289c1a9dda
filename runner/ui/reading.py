"""A run's transcript as a person reads it: attempts, steps with their tool calls, checks, feedback, usage.

A transcript (`store.transcript_events(run_id)`) is a flat list of events; `read_run` folds it into
`Attempt`s of `Step`s. (Secrets are masked where text is shown: see `security.Masker`.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..vocabulary import Event

FOLD_LINES = 12
"""Lines of an output shown at its head and at its tail; the middle is folded away."""
ARGUMENTS_CAP = 4_000


@dataclass
class Output:
    """A tool's or a check's output, folded to its head and tail (worked out once: a page shows hundreds)."""

    text: str
    first_line: str = ""
    line_count: int = 0
    head: str = ""
    tail: str = ""
    cut: int = 0
    """Lines folded away between head and tail (0: the head is the whole output)."""

    def __post_init__(self) -> None:
        lines = self.text.splitlines()
        self.line_count = len(lines)
        self.first_line = next((line for line in lines if line.strip()), "")[:160]
        if len(lines) > 2 * FOLD_LINES + 1:
            self.head, self.tail = "\n".join(lines[:FOLD_LINES]), "\n".join(lines[-FOLD_LINES:])
            self.cut = len(lines) - 2 * FOLD_LINES
        else:
            self.head = self.text


@dataclass
class ToolCall:
    id: str
    name: str
    summary: str = ""
    arguments: str = ""
    output: Output | None = None
    duration_s: float | None = None


@dataclass
class Step:
    attempt: int
    number: int
    at: str = ""
    text: str | None = None
    """What the model said at this step (its reasoning or its final answer)."""
    calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens: int | None = None
    cost: float | None = None
    finish_reason: str | None = None

    @property
    def anchor(self) -> str:
        return f"a{self.attempt}s{self.number}"


@dataclass
class Check:
    name: str
    kind: str
    passed: bool
    command: str | None = None
    exit_code: int | None = None
    output: Output | None = None
    reason: str | None = None
    duration_s: float | None = None
    skipped: bool = False


@dataclass
class Attempt:
    number: int
    """0 holds the checks run before any work (`checks_first`)."""
    of: int | None = None
    messages: list[str] = field(default_factory=list)
    """What the model was told at the start of this attempt beyond the goal's prompt."""
    steps: list[Step] = field(default_factory=list)
    stop_reason: str | None = None
    stop_error: str | None = None
    checks: list[Check] = field(default_factory=list)
    feedback: str | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)
    """Other events in this attempt, as (what, said)."""

    @property
    def tokens(self) -> int:
        return sum(s.tokens or 0 for s in self.steps)

    @property
    def cost(self) -> float | None:
        costs = [s.cost for s in self.steps if s.cost is not None]
        return sum(costs) if costs else None


@dataclass
class Reading:
    system: str | None = None
    prompt: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    outcome: dict[str, Any] | None = None
    notes: list[tuple[str, str]] = field(default_factory=list)
    """Events before the first attempt (sandbox, trigger, price), as (what, said)."""

    def attempt(self, number: int) -> Attempt:
        for attempt in self.attempts:
            if attempt.number == number:
                return attempt
        self.attempts.append(Attempt(number))
        self.attempts.sort(key=lambda a: a.number)
        return self.attempt(number)

    @property
    def current(self) -> Attempt:
        return self.attempts[-1] if self.attempts else self.attempt(1)

    @property
    def steps(self) -> int:
        return sum(len(a.steps) for a in self.attempts)

    @property
    def tokens(self) -> int:
        return sum(a.tokens for a in self.attempts)


def read_run(events: list[dict[str, Any]], check_rows: list[dict[str, Any]]) -> Reading:
    """Fold the events into attempts and steps; checks the transcript lacks are taken from the store's rows."""
    reading = Reading()
    for event in events:
        _fold(reading, event)
    _add_stored_checks(reading, check_rows)
    return reading


def _fold(reading: Reading, event: dict[str, Any]) -> None:
    kind = event.get("kind")
    if kind == Event.CHECK or ("passed" in event and "attempt" in event):  # older transcripts: kind run/judge/approve
        reading.attempt(event["attempt"]).checks.append(_check(event))
    elif kind == Event.MESSAGE:
        _message(reading, event.get("message") or {})
    elif kind == Event.ATTEMPT:
        reading.attempt(event["attempt"]).of = event.get("of")
    elif kind == Event.STEP:
        attempt = reading.current
        attempt.steps.append(Step(attempt.number, event.get("step", len(attempt.steps) + 1), event.get("at", "")))
    elif kind == Event.REPLY:
        _usage(_step(reading), event)
    elif kind in (Event.TOOL_CALL, Event.TOOL_RESULT):
        _tool(_step(reading), event)
    elif kind == Event.NUDGE:
        reading.current.messages.append(event.get("text") or "")
    elif kind == Event.STOPPED:
        reading.current.stop_reason, reading.current.stop_error = event.get("reason"), event.get("error")
    elif kind == Event.FEEDBACK:
        reading.attempt(event.get("attempt", reading.current.number)).feedback = event.get("text")
    elif kind == Event.OUTCOME:
        reading.outcome = event
    elif kind != Event.RUN or "run_id" not in event:
        (reading.current.notes if reading.attempts else reading.notes).append(_describe(event))


def _describe(event: dict[str, Any]) -> tuple[str, str]:
    """Any other event as (what, said): the sandbox, the trigger, an unknown price, a wait, what comes next."""
    kind = event.get("kind", "")
    if kind == Event.SANDBOX:
        return "sandbox", str(event.get("status", "")).removeprefix("sandbox: ")
    if kind == Event.PRICE_UNKNOWN:
        return "cost", str(event.get("reason", ""))
    rest = {k: v for k, v in event.items() if k not in ("at", "kind")}
    if kind == Event.TRIGGER and isinstance(rest.get("context"), dict):
        rest = dict(rest["context"])
    if kind == Event.TRIGGER or "fired" in rest:  # older transcripts: the context's own `kind` took the event's
        head = rest.pop("kind", kind)
        return "trigger", f"{head} " + ", ".join(f"{k} {_short(v)}" for k, v in rest.items())
    return kind.replace("_", " "), json.dumps(rest, ensure_ascii=False, default=str)[:2_000]


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 200 else text[:200] + "…"


def _message(reading: Reading, message: dict[str, Any]) -> None:
    role, content = message.get("role"), message.get("content")
    if role == "system" and reading.system is None:
        reading.system = content
    elif role == "user" and reading.prompt is None:
        reading.prompt = content
    elif role == "user" and content not in (a.feedback for a in reading.attempts) and content != reading.prompt:
        reading.current.messages.append(content or "")
    elif role == "assistant":
        step = _step(reading)
        step.text = content or step.text
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            _call(step, call.get("id", "")).arguments = _pretty(function.get("arguments", ""))


def _step(reading: Reading) -> Step:
    attempt = reading.current
    if not attempt.steps:
        attempt.steps.append(Step(attempt.number, 1))
    return attempt.steps[-1]


def _usage(step: Step, event: dict[str, Any]) -> None:
    usage = event.get("usage") or {}
    step.prompt_tokens = usage.get("prompt_tokens")
    step.completion_tokens = usage.get("completion_tokens")
    step.tokens = usage.get("total_tokens") or (step.prompt_tokens or 0) + (step.completion_tokens or 0)
    cost = event.get("cost", usage.get("cost"))
    step.cost = float(cost) if isinstance(cost, (int, float)) else None
    step.finish_reason = event.get("finish_reason")


def _call(step: Step, call_id: str) -> ToolCall:
    for call in step.calls:
        if call.id == call_id:
            return call
    step.calls.append(ToolCall(call_id, ""))
    return step.calls[-1]


def _tool(step: Step, event: dict[str, Any]) -> None:
    call = _call(step, event.get("id", ""))
    call.name = event.get("name", call.name)
    call.summary = event.get("summary", call.summary)
    if event.get("kind") == Event.TOOL_RESULT:
        call.output = Output(str(event.get("output", "")))
        call.duration_s = event.get("duration_s")


def _check(event: dict[str, Any]) -> Check:
    return Check(
        name=event.get("name") or "",
        kind=event.get("kind") if event.get("kind") != "check" else event.get("check_kind", "run"),
        passed=bool(event.get("passed")),
        command=event.get("command"),
        exit_code=event.get("exit_code"),
        output=Output(event["output"]) if event.get("output") else None,
        reason=event.get("reason"),
        duration_s=event.get("duration_s"),
        skipped=bool(event.get("skipped")),
    )


def _add_stored_checks(reading: Reading, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        attempt = reading.attempt(row["attempt"])
        if any(c.name == row["name"] for c in attempt.checks):
            continue
        output = row.get("output") or ""
        attempt.checks.append(
            Check(
                name=row.get("name") or "",
                kind=row.get("kind") or "run",
                passed=bool(row.get("passed")),
                exit_code=row.get("exit_code"),
                output=Output(output) if output else None,
                reason=row.get("reason"),
                duration_s=row.get("duration_s"),
            )
        )


def _pretty(arguments: Any) -> str:
    """Tool arguments as JSON, indented when long (the model's own text when it is not JSON), capped."""
    try:
        value = json.loads(arguments)
        text = json.dumps(value, ensure_ascii=False)
        if len(text) > 100:
            text = json.dumps(value, ensure_ascii=False, indent=2)
    except (TypeError, ValueError):
        text = str(arguments)
    return text if len(text) <= ARGUMENTS_CAP else text[:ARGUMENTS_CAP] + f"\n[... {len(text) - ARGUMENTS_CAP} more]"
