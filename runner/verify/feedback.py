"""Failed checks turned into the feedback the model reads before its next attempt.

The words live in `prompts`; this module picks what goes into them: each failed check's name,
command, status and the head and tail of its output, and from the second failure on what newly
fails and what was fixed. A `run` check that fails without printing anything (`grep -qx 41
total.txt`) would say nothing but its exit code, so its feedback shows what it read instead: the
size and first lines of each file its command names, or that the file does not exist.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import prompts
from ..work.tools.process import cap
from .changes import Changes
from .checks import CheckResult

FEEDBACK_OUTPUT_CAP = 2_000
"""Characters of one failed check's output in the feedback (head and tail); also the cap of its file previews."""
PREVIEW_LINES = 10
"""Lines shown of each file a silent check names."""
PREVIEW_FILE_CAP = 600
"""Characters shown of each file a silent check names."""
SEPARATORS = ("&&", "||", ";", "|", "!")
TASK_CAP = 1_500
"""Characters of the task repeated in the feedback (head and tail)."""
LISTED = 10
"""Files named in one sentence of the feedback; more are counted."""


class Feedback:
    """Writes the feedback of each failed attempt, remembering which checks failed the time before.

    Given the task and what the attempt changed in the workdir, it also says which files the attempt
    changed, which files the failing checks read that it left alone (those the agent may write), and the
    task again: a small model that drifted to the wrong file reads where the checks look.
    """

    def __init__(
        self, workdir: Path | None = None, task: str | None = None, writable: Callable[[str], bool] | None = None
    ) -> None:
        self.workdir = workdir
        self.task = task
        self.writable = writable or (lambda path: True)
        """Whether the agent may write a path relative to the workdir (protected files are not pointed at)."""
        self.failed_before: set[str] | None = None
        self.sections: dict[str, str] = {}
        """The last feedback's parts a person reads at the terminal: what the checks said, what the attempt did."""
        self.need = ""
        """What the failing checks need, in a sentence or two, repeated in the nudge (empty when unknown)."""

    def after(self, attempt: int, results: list[CheckResult], changes: Changes | None = None) -> str:
        failed = [r for r in results if not r.passed and not r.skipped]
        names = {r.name for r in failed}
        fixed_new = ""
        if self.failed_before is not None:
            new, fixed = sorted(names - self.failed_before), sorted(self.failed_before - names)
            fixed_new = prompts.FEEDBACK_CHANGES.format(new=", ".join(new) or "none", fixed=", ".join(fixed) or "none")
        self.failed_before = names
        head = prompts.FEEDBACK.format(
            attempt=attempt,
            failed=len(failed),
            total=len(results),
            changes=fixed_new,
            checks=describe_failures(results, self.workdir),
        ).replace("\n\n\n", "\n\n")
        task = prompts.TASK_AGAIN.format(task=cap(self.task.strip(), TASK_CAP)) if self.task else ""
        left = self.left_alone(failed, changes)
        not_changed = prompts.NOT_CHANGED.format(files=", ".join(left[:LISTED])) if left else ""
        did = " ".join(part for part in (self.what_it_did(changes), not_changed) if part)
        self.sections = {"checks": head, "did": did}
        meanings = "".join(grep_meaning(r.command or "") for r in failed if r.kind == "run")  # each " It passes..."
        self.need = meanings + (" " + not_changed if not_changed else "")
        return "\n\n".join(part for part in (head, did, task, prompts.FEEDBACK_ACT) if part)

    def what_it_did(self, changes: Changes | None) -> str:
        """The files the attempt changed (or that it changed none, and what it wrote again unchanged)."""
        if changes is None or self.workdir is None:
            return ""
        if not changes:
            said = prompts.ATTEMPT_CHANGED_NOTHING
            if changes.rewritten:
                said += " " + prompts.ATTEMPT_REWROTE.format(files=", ".join(changes.rewritten[:LISTED]))
            return said
        files = [*changes.created, *changes.changed, *changes.deleted]
        shown = [f"{p} (new)" if p in changes.created else f"{p} (deleted)" if p in changes.deleted else p
                 for p in files[:LISTED]]  # fmt: skip
        more = f" and {len(files) - LISTED} more" if len(files) > LISTED else ""
        return prompts.ATTEMPT_CHANGED.format(files=", ".join(shown) + more)

    def left_alone(self, failed: list[CheckResult], changes: Changes | None) -> list[str]:
        """The files (not folders) the failing checks read that the agent may write and the attempt did not
        change; [] when what the attempt changed is not known."""
        if changes is None or self.workdir is None:
            return []
        read = dict.fromkeys(
            word for r in failed if r.kind == "run" for word in named_files(r.command or "", self.workdir)
        )
        return [w for w in read if w not in changes.touched and self.writable(w) and not (self.workdir / w).is_dir()]


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
            status = prompts.SILENT_CHECK.format(exit_code=r.exit_code, meaning=grep_meaning(r.command or ""))
            output = previews(r.command or "", workdir) if workdir is not None else ""
        parts.append(
            prompts.FAILED_CHECK.format(name=r.name, command=r.command or r.kind, status=status, output=output).rstrip()
        )
    return "\n\n".join(parts)


def grep_meaning(command: str) -> str:
    """What a plain `grep -q PATTERN FILE...` check asks for, in words; "" for any other command.

    Only the options that keep the meaning simple are understood (-q -s -x -w -F -E -G -i and -e);
    anything else (-v, -c, -r, a pipe, a second command) is left unexplained.
    """
    try:
        words = shlex.split(command)
    except ValueError:
        return ""
    if len(words) < 3 or words[0] != "grep" or any(w in SEPARATORS for w in words):
        return ""
    flags, pattern, files, rest = set(), None, [], iter(words[1:])
    for word in rest:
        if word == "-e" and pattern is None:
            pattern = next(rest, None)
        elif word.startswith("--") or (word.startswith("-") and len(word) > 1):
            if word.startswith("--") or set(word[1:]) - set("qsxwFEGi"):
                return ""
            flags |= set(word[1:])
        elif pattern is None:
            pattern = word
        else:
            files.append(word)
    if "q" not in flags or pattern is None or not files or "\n" in pattern:
        return ""
    how = "that is exactly" if "x" in flags else "with the word" if "w" in flags else "containing"
    special = set("[]*^$\\") | (set("+?(){}|") if "E" in flags else set())  # a dot is read as itself
    if "F" not in flags and special & set(pattern):
        how = "wholly matching the regular expression" if "x" in flags else "matching the regular expression"
    return prompts.GREP_MEANING.format(
        files=files[0] if len(files) == 1 else "one of " + ", ".join(files),
        how=how,
        pattern=pattern,
        case=" (ignoring case)" if "i" in flags else "",
    )


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
