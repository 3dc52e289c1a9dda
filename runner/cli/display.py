"""The terminal observer: each step, check and feedback as it happens, and the closing outcome line.

At a terminal, the step under way shows as a spinner with its elapsed time (the model thinking, or the
tool running) and resolves into the step line; piped, each line is printed once, whole, never wrapped.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner

from ..vocabulary import FORCED, Outcome

OUTCOME_WORDS: dict[Outcome, str] = {
    "achieved": "Goal achieved",
    "satisfied": "Goal satisfied (the checks already pass)",
    "not_achieved": "Goal not achieved",
    "stuck": "Goal stuck",
    "tampered": "Goal tampered with",
    "error": "Goal failed with an error",
    "cancelled": "Goal cancelled",
    "interrupted": "Goal interrupted",
    "awaiting_approval": "Goal awaiting approval",
    "rejected": "Goal rejected",
}


FEEDBACK_LINES = 6
"""Lines of the feedback shown at each end (pytest's summary is at the end)."""


class Working:
    """The spinner line of the step under way: `⠋ step 3  shell: pytest -q  2.1s`."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()
        self.spinner = Spinner("dots", style="cyan")

    def restart(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        self.spinner.update(text=f"{escape(self.label)}  [dim]{time.monotonic() - self.started:.1f}s[/]")
        yield self.spinner


class Display:
    """Shows a run's events on stderr; rich drops the colours (and the spinner) where stderr is not a terminal."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.working: Working | None = None
        self.live: Live | None = None

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        show = getattr(self, f"_{kind}", None)
        if show is not None:
            show(data)

    def _step(self, data: dict[str, Any]) -> None:
        self._busy(f"step {data['step']}  thinking")

    def _tool_call(self, data: dict[str, Any]) -> None:
        self._busy(f"step {data['step']}  {data['summary']}")

    def _busy(self, label: str) -> None:
        """Show `label` with a spinner and its elapsed time, at a terminal only."""
        if not self.console.is_terminal:
            return
        if self.working is None:
            self.working = Working(label)
            self.live = Live(self.working, console=self.console, refresh_per_second=8, transient=True)
            self.live.start()
        else:
            self.working.restart(label)

    def idle(self) -> None:
        """Take the spinner away (the work loop stopped, or the run ended)."""
        if self.live is not None:
            self.live.stop()
        self.live = self.working = None

    def _sandbox(self, data: dict[str, Any]) -> None:
        self.console.print(f"[dim]{escape(data['status'])}[/]")

    def _attempt(self, data: dict[str, Any]) -> None:
        if data["of"] > 1:
            self.console.print(f"[bold]attempt {data['attempt']}/{data['of']}[/]")

    def _tool_result(self, data: dict[str, Any]) -> None:
        output: str = data["output"]
        first = output.split("\n", 1)[0]
        if first.startswith("error:"):
            status = f"[red]{escape(first[:70])}[/]"
        elif first.startswith("exit code "):
            code = first.removeprefix("exit code ")
            status = f"exit {code}" if code == "0" else f"[red]exit {code}[/]"
        elif first.startswith("timed out"):
            status = "[red]timed out[/]"
        else:
            status = "ok"
        self.console.print(
            f"  step {data['step']}  {escape(data['summary'])}  -> {status}  [dim]{data['duration_s']:.1f}s[/]"
        )

    def _stopped(self, data: dict[str, Any]) -> None:
        """A forced or cut-off stop; a provider error is said once, by the closing lines under the outcome."""
        self.idle()
        reason = data["reason"]
        if reason in FORCED:
            self.console.print(f"  [yellow]stopped by the {reason} limit: the work is unfinished[/]")
        elif reason == "length":
            self.console.print("  [yellow]the model's output was cut off (length)[/]")

    def _check(self, data: dict[str, Any]) -> None:
        if data.get("skipped"):
            self.console.print(f"  [dim]- {escape(data['name'])}  not asked[/]")
            return
        mark = "[green]✓ pass[/]" if data["passed"] else "[red]✗ fail[/]"
        detail = ""
        if not data["passed"]:
            detail = f"exit {data['exit_code']}" if data["check_kind"] == "run" else str(data.get("reason") or "")
            detail = f"  {escape(detail[:100])}"
        self.console.print(f"  {mark}  {escape(data['name'])}{detail}  [dim]{data['duration_s']:.1f}s[/]")

    def check_with_output(self, data: dict[str, Any]) -> None:
        """A check's line and, when it failed, the head and tail of its output (`runner check`)."""
        self._check(data)
        output = str(data.get("output") or "").strip()
        if not data["passed"] and not data.get("skipped") and output:
            shown = "\n".join(f"      {line}" for line in head_and_tail(output, FEEDBACK_LINES).splitlines())
            self.console.print(f"[dim]{escape(shown)}[/]")

    def _nudge(self, data: dict[str, Any]) -> None:
        self.idle()
        self.console.print(f"  step {data['step']}  [yellow]no tool called after feedback: told to use the tools[/]")

    def _text_tool_call(self, data: dict[str, Any]) -> None:
        self.idle()
        if data.get("unknown"):
            what = "no such tool: told which tools there are"
        else:
            what = "run as calls" if data["executed"] else "not run (text_tool_calls: off)"
        names = escape(", ".join(data["names"]))
        self.console.print(f"  step {data['step']}  [yellow]tool call written as text ({names}): {what}[/]")

    def _feedback(self, data: dict[str, Any]) -> None:
        """What the checks said (head and tail) and what the attempt changed; the fixed words to the model
        (act, the task again) are left out."""
        said = head_and_tail(data.get("checks") or data["text"], FEEDBACK_LINES)
        if data.get("did"):
            said += "\n\n" + data["did"]
        shown = "\n".join(f"    {line}" if line.strip() else "" for line in said.splitlines())
        self.console.print(f"  [dim]feedback sent back to the model:\n{escape(shown)}[/]")

    def _outcome(self, data: dict[str, Any]) -> None:
        self.idle()


def head_and_tail(text: str, lines: int) -> str:
    """The first and last `lines` lines of `text`, with a marker of how many were left out between."""
    rows = text.rstrip().splitlines()
    if len(rows) <= 2 * lines + 1:
        return text.rstrip()
    return "\n".join([*rows[:lines], f"[... {len(rows) - 2 * lines} lines ...]", *rows[-lines:]])


def table_console() -> Console:
    """A console for tables on stdout: as wide as the terminal (or $COLUMNS), else wide enough not to wrap."""
    console = Console(highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = 200
    return console


def outcome_line(result: dict[str, Any]) -> str:
    """`Goal achieved · 2 attempts · 7 steps · 12.3k tokens · 41s`."""
    attempts = result["attempts"]
    parts = [
        OUTCOME_WORDS.get(result["outcome"], result["outcome"]),
        f"{attempts} attempt{'s' if attempts != 1 else ''}",
        f"{result['steps']} step{'s' if result['steps'] != 1 else ''}",
        f"{tokens(result['tokens'])} tokens",
        f"{result['duration_s']:.0f}s" if result["duration_s"] >= 10 else f"{result['duration_s']:.1f}s",
    ]
    if result.get("cost_usd") is not None:  # known only when the model's price is (DESIGN 10)
        parts.insert(4, f"${result['cost_usd']:.4f}" if result["cost_usd"] < 1 else f"${result['cost_usd']:.2f}")
    return " · ".join(parts)


def tokens(count: int) -> str:
    return f"{count / 1000:.1f}k" if count >= 1000 else str(count)
