"""Failed checks turned into the feedback the model reads before its next attempt.

The words live in `prompts`; this module picks what goes into them: each failed check's name,
command, status and the head and tail of its output, and from the second failure on what newly
fails and what was fixed. A `run` check that fails without printing anything (`grep -qx 41
total.txt`) would say nothing but its exit code, so its feedback shows what it read instead: the
size and first lines of each file its command names, or that the file does not exist.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from .. import prompts
from ..work.tools.process import cap
from .checks import CheckResult

FEEDBACK_OUTPUT_CAP = 2_000
"""Characters of one failed check's output in the feedback (head and tail); also the cap of its file previews."""
PREVIEW_LINES = 10
"""Lines shown of each file a silent check names."""
PREVIEW_FILE_CAP = 600
"""Characters shown of each file a silent check names."""
SEPARATORS = ("&&", "||", ";", "|", "!")


class Feedback:
    """Writes the feedback of each failed attempt, remembering which checks failed the time before."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.workdir = workdir
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
            attempt=attempt,
            failed=len(failed),
            total=len(results),
            changes=changes,
            checks=describe_failures(results, self.workdir),
        ).replace("\n\n\n", "\n\n")


def describe_failures(results: list[CheckResult], workdir: Path | None = None) -> str:
    """Each failed check as the model reads it: name, command, status, output (or what a silent check read)."""
    parts = []
    for r in results:
        if r.passed or r.skipped:
            continue
        if r.kind == "judge":
            status, output = f"judge: {r.reason}", ""
        elif r.kind == "approve":
            status, output = f"a person said no: {r.reason}", ""
        elif r.output.strip() or r.reason:
            status, output = r.reason or f"exit code {r.exit_code}", cap(r.output, FEEDBACK_OUTPUT_CAP)
        else:
            status = prompts.SILENT_CHECK.format(exit_code=r.exit_code)
            output = previews(r.command or "", workdir) if workdir is not None else ""
        parts.append(
            prompts.FAILED_CHECK.format(name=r.name, command=r.command or r.kind, status=status, output=output).rstrip()
        )
    return "\n\n".join(parts)


def previews(command: str, workdir: Path) -> str:
    """Size and first lines of each file the command names, under the byte cap; missing ones said missing."""
    parts, budget = [], FEEDBACK_OUTPUT_CAP
    for word in named_files(command, workdir):
        path = workdir / word
        if not path.exists():
            text = prompts.CHECK_FILE_MISSING.format(path=word)
        elif path.is_dir():
            entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
            text = prompts.CHECK_FOLDER.format(path=word, entries=", ".join(entries[:20]) or "(empty)")
        else:
            text = _file_preview(word, path)
        if len(text) > budget:
            break
        parts.append(text)
        budget -= len(text)
    return "\n".join(parts)


def _file_preview(word: str, path: Path) -> str:
    data = path.read_bytes()
    head = data[:PREVIEW_FILE_CAP].decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    lines = head.splitlines(keepends=True)[:PREVIEW_LINES]
    shown = "".join(lines)
    more = "" if len(shown.encode()) >= len(data) else "\n" + prompts.CHECK_FILE_MORE
    return prompts.CHECK_FILE.format(path=word, size=len(data), content=shown.rstrip("\n"), more=more)


def named_files(command: str, workdir: Path) -> list[str]:
    """The words of a shell command that name files or folders in the workdir, existing or not.

    Program names, options, quoted patterns and plain values (`41`, `Hello, runner!`) are left out;
    a word that does not exist counts only if it looks like a path (`total.txt`, `out/a.txt`).
    """
    try:
        words = shlex.split(command)
    except ValueError:
        return []
    found: list[str] = []
    program_next = True
    for word in words:
        if word in SEPARATORS:
            program_next = True
            continue
        is_program, program_next = program_next, False
        if word.startswith("-") or any(c.isspace() for c in word) or word in found:
            continue
        path = (workdir / word).resolve()
        if not path.is_relative_to(workdir.resolve()):
            continue
        exists = path.exists() and not (is_program and "/" not in word)
        if exists or (not is_program and _looks_like_path(word)):
            found.append(word)
    return found


def _looks_like_path(word: str) -> bool:
    stem = word.rsplit("/", 1)[-1]
    return any(c.isalpha() for c in stem) and ("/" in word or "." in stem.strip(".")) and "$" not in word


def signature(results: list[CheckResult]) -> tuple[Any, ...]:
    """What the failures of an attempt look like; the same signature attempts in a row means `stuck`."""
    return tuple((r.name, r.exit_code, r.output, r.reason) for r in results if not r.passed)
