"""The terminal observer: each step, check and feedback as it happens, and the closing outcome line."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

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


class Display:
    """Shows a run's events on stderr; rich drops the colours where stderr is not a terminal."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False)

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        show = getattr(self, f"_{kind}", None)
        if show is not None:
            show(data)

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
        reason = data["reason"]
        if reason in FORCED:
            self.console.print(f"  [yellow]stopped by the {reason} limit: the work is unfinished[/]")
        elif reason == "length":
            self.console.print("  [yellow]the model's output was cut off (length)[/]")
        elif reason == "error":
            self.console.print(f"  [red]model error: {escape(str(data.get('error')))}[/]")

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

    def _feedback(self, data: dict[str, Any]) -> None:
        lines = data["text"].splitlines()
        shown = "\n".join(f"    {line}" for line in lines[:12])
        more = f"\n    [... {len(lines) - 12} more lines]" if len(lines) > 12 else ""
        self.console.print(f"  [dim]feedback sent back to the model:\n{escape(shown)}{more}[/]")


def table_console() -> Console:
    """A console for tables on stdout: as wide as the terminal, or wide enough not to wrap in a pipe."""
    console = Console(highlight=False)
    if not console.is_terminal:
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
    return " · ".join(parts)


def tokens(count: int) -> str:
    return f"{count / 1000:.1f}k" if count >= 1000 else str(count)
