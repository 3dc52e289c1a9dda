"""Where the agent's file tools may reach: inside the goal's workdir, never onto a protected path."""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Iterable
from pathlib import Path

from ...config import ALWAYS_PROTECTED, Goal
from ...config.project import script_words

HIDDEN = {".env", ".runner"}
"""Neither read nor written by the file tools."""


class ToolError(Exception):
    """A tool could not do what the model asked; the message goes back to the model."""


class PathGuard:
    """Resolves the model's paths against the workdir and refuses escapes and protected paths."""

    def __init__(self, workdir: Path, root: Path, protect: Iterable[str] = (), *, resolved: bool = False) -> None:
        self.workdir = workdir if resolved else workdir.resolve()
        self.root = root if resolved else root.resolve()
        self.patterns = [*ALWAYS_PROTECTED, *protect]

    @classmethod
    def for_goal(cls, goal: Goal) -> PathGuard:
        protect = [*goal.protect, *check_scripts(goal), *check_inputs(goal)]
        return cls(goal.workpath, goal.rootpath, protect, resolved=True)

    def resolve(self, path: str, *, write: bool = False) -> Path:
        if not isinstance(path, str) or not path.strip():
            raise ToolError("path is empty: give a path relative to the working directory")
        full = (self.workdir / path).resolve()
        if not full.is_relative_to(self.workdir):
            raise ToolError(f"refused: {path} is outside the working directory (paths are relative to it)")
        rel = self.relative(full)
        if rel is not None and (rel.split("/")[0] in HIDDEN or (write and self.protected(rel))):
            what = "written" if write else "read"
            raise ToolError(f"refused: {path} is protected and cannot be {what} by the agent")
        return full

    def relative(self, full: Path) -> str | None:
        """`full` relative to the project root, in POSIX form; None when outside the root."""
        try:
            return full.relative_to(self.root).as_posix()
        except ValueError:
            return None

    def protected(self, rel: str) -> bool:
        for pattern in self.patterns:
            pattern = pattern.rstrip("/")
            base = pattern.removesuffix("/**")
            if rel == base or rel.startswith(base + "/") or fnmatch.fnmatchcase(rel, pattern):
                return True
        return False

    def show(self, full: Path) -> str:
        """A path as the model should see it: relative to the workdir."""
        return full.relative_to(self.workdir).as_posix() if full != self.workdir else "."


def check_scripts(goal: Goal) -> list[str]:
    """Files that the `run` checks execute (`python verifiers/x.py`, `sh check.sh`, `./check`), relative to the root.

    These are the user's acceptance scripts: protected like verifiers/. Plain arguments (`haiku.txt`)
    are not scripts and stay writable.
    """
    found: list[str] = []
    for check in goal.verify.checks:
        if check.run is None:
            continue
        for path in script_words(check.run):
            for base in (goal.workpath, goal.root):
                full = _resolved(base, path)
                if full is not None and full.is_file() and full.is_relative_to(goal.rootpath):
                    found.append(full.relative_to(goal.rootpath).as_posix())
                    break
    return sorted(set(found))


def _resolved(base: Path, word: str) -> Path | None:
    """`word` as an existing path under `base`, resolved; None for a word no file can have (too long, a NUL)."""
    try:
        full = (base / word).resolve()
        return full if full.exists() else None
    except (OSError, ValueError):
        return None


def check_inputs(goal: Goal) -> list[str]:
    """Existing files and folders the `run` checks name as arguments (`pytest tests/test_calc.py`, `ruff check
    src/`), relative to the root: what a check reads is part of the check. Empty when
    `verify.protect_check_inputs` is false. The workdir, the root and folders above them are never inputs.
    """
    if not goal.verify.protect_check_inputs:
        return []
    root = goal.rootpath
    too_wide = {root, goal.workpath, *goal.workpath.parents}
    found: set[str] = set()
    for check in goal.verify.checks:
        if check.run is None:
            continue
        try:
            words = shlex.split(check.run)
        except ValueError:
            continue
        for word in words:
            word = word.split("::")[0].replace("$RUNNER_ROOT/", "").replace("${RUNNER_ROOT}/", "")
            if not word or word.startswith("-") or word in ("&&", "||", ";", "|"):
                continue
            for base in (goal.workpath, root):
                full = _resolved(base, word)
                if full is not None and full.is_relative_to(root) and full not in too_wide:
                    found.add(full.relative_to(root).as_posix())
                    break
    return sorted(found)
