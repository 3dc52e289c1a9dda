"""Failed checks turned into the feedback the model reads before its next attempt.

The words live in `prompts`; this module picks what goes into them: each failed check's name,
command, status and the head and tail of its output, and from the second failure on what newly
fails and what was fixed.
"""

from __future__ import annotations

from typing import Any

from .. import prompts
from ..work.tools.process import cap
from .checks import CheckResult

FEEDBACK_OUTPUT_CAP = 2_000
"""Characters of one failed check's output in the feedback (head and tail)."""


class Feedback:
    """Writes the feedback of each failed attempt, remembering which checks failed the time before."""

    def __init__(self) -> None:
        self.failed_before: set[str] | None = None

    def after(self, attempt: int, results: list[CheckResult]) -> str:
        failed = [r for r in results if not r.passed and not r.skipped]
        names = {r.name for r in failed}
        changes = ""
        if self.failed_before is not None:
            new, fixed = sorted(names - self.failed_before), sorted(self.failed_before - names)
            changes = prompts.FEEDBACK_CHANGES.format(new=", ".join(new) or "none", fixed=", ".join(fixed) or "none")
        self.failed_before = names
        return prompts.FEEDBACK.format(
            attempt=attempt, failed=len(failed), total=len(results), changes=changes, checks=describe_failures(results)
        ).replace("\n\n\n", "\n\n")


def describe_failures(results: list[CheckResult]) -> str:
    """Each failed check as the model reads it: name, command, status, output."""
    parts = []
    for r in results:
        if r.passed or r.skipped:
            continue
        if r.kind == "judge":
            status = f"judge: {r.reason}"
        elif r.kind == "approve":
            status = f"a person said no: {r.reason}"
        else:
            status = r.reason or f"exit code {r.exit_code}"
        output = cap(r.output, FEEDBACK_OUTPUT_CAP) if r.kind == "run" else ""
        parts.append(
            prompts.FAILED_CHECK.format(name=r.name, command=r.command or r.kind, status=status, output=output).rstrip()
        )
    return "\n\n".join(parts)


def signature(results: list[CheckResult]) -> tuple[Any, ...]:
    """What the failures of an attempt look like; the same signature attempts in a row means `stuck`."""
    return tuple((r.name, r.exit_code, r.output, r.reason) for r in results if not r.passed)
