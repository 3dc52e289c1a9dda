"""How the dashboard shows an outcome: a word, a symbol (readable without colour) and a colour group."""

from __future__ import annotations

from ..vocabulary import OUTCOMES, RUNNING

SYMBOLS = {
    "achieved": "✓",
    "satisfied": "✓",
    "not_achieved": "✗",
    "stuck": "↻",
    "tampered": "⚠",
    "error": "!",
    "cancelled": "⊘",
    "interrupted": "↯",
    "awaiting_approval": "?",
    "rejected": "✗",
    "running": "…",
}
GROUPS = ("good", "bad", "broken", "waiting")
"""Colour groups, bottom to top in a stacked bar."""
_GROUP = {
    "achieved": "good",
    "satisfied": "good",
    "not_achieved": "bad",
    "stuck": "bad",
    "tampered": "bad",
    "rejected": "bad",
    "error": "broken",
    "cancelled": "broken",
    "interrupted": "broken",
}
LIVE = (RUNNING, "awaiting_approval")
"""Outcomes of a run that is not over: its page follows it."""
CHOICES = (*OUTCOMES, RUNNING)
"""What the runs page filters on."""


def group_of(outcome: str) -> str:
    return _GROUP.get(outcome, "waiting")


def symbol(outcome: str | None) -> str:
    return SYMBOLS.get(outcome or "", "·")


def label(outcome: str | None) -> str:
    return (outcome or "-").replace("_", " ")
