"""What an attempt changed in the workdir, for the feedback: which files it created, changed and deleted.

A weak model often acts on the wrong file (writes `total_number.txt` when the check reads `total.txt`) and
cannot tell from the checks' output alone; or it writes the same wrong content again. The verify loop lists
the workdir before each attempt and after it; the difference goes into the feedback beside what the failing
checks read. A listing is names, sizes and modification times, and a digest of each small file (so a file
written again with the same content is told apart from a changed one); it skips folders that are caches or
tooling, and gives up past MAX_FILES files, when the feedback says nothing about changes rather than spend
time on a huge tree.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..work.tools.files import SKIPPED_DIRS

SKIPPED = frozenset(
    {*SKIPPED_DIRS, ".hg", ".svn", "venv", ".tox", ".nox", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".cache"}
)
"""Folders never listed: those the file tools skip (runner's state, .git, caches, .venv), and more tooling."""
MAX_FILES = 20_000
"""A workdir with more files is not listed (the feedback then says nothing of changes)."""

DIGESTED_SIZE = 64 * 1024
"""Files up to this size get a digest of their content..."""
DIGESTED_TOTAL = 8 * 1024 * 1024
"""...until this many bytes were read for one listing."""

Listing = dict[str, tuple[int, int, bytes | None]]
"""Path relative to the workdir (POSIX) -> (size, mtime_ns, digest of the content or None)."""


def listing(workdir: Path) -> Listing | None:
    """Every file under `workdir` outside SKIPPED folders; None past MAX_FILES or when it cannot be read."""
    found: Listing = {}
    budget = DIGESTED_TOTAL
    base = str(workdir)
    folders = [base]
    while folders:
        folder = folders.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            if folder == base:
                return None
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in SKIPPED:
                        folders.append(entry.path)
                    continue
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            digest = None
            if entry.is_file(follow_symlinks=False) and stat.st_size <= min(DIGESTED_SIZE, budget):
                digest = _digest(entry.path)
                budget -= stat.st_size
            found[os.path.relpath(entry.path, base).replace(os.sep, "/")] = (stat.st_size, stat.st_mtime_ns, digest)
            if len(found) > MAX_FILES:
                return None
    return found


def _digest(path: str) -> bytes | None:
    try:
        with open(path, "rb") as file:
            return hashlib.blake2b(file.read(DIGESTED_SIZE + 1), digest_size=16).digest()
    except OSError:
        return None


@dataclass
class Changes:
    """Files an attempt created, changed and deleted, and files it wrote again with the same content."""

    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)

    @classmethod
    def between(cls, before: Listing, after: Listing) -> Changes:
        both = after.keys() & before.keys()
        same = {p for p in both if _same_content(before[p], after[p])}
        return cls(
            created=sorted(after.keys() - before.keys()),
            changed=sorted(both - same),
            deleted=sorted(before.keys() - after.keys()),
            rewritten=sorted(p for p in same if before[p][1] != after[p][1]),
        )

    @property
    def touched(self) -> set[str]:
        """The files whose content the attempt changed (created, changed or deleted)."""
        return {*self.created, *self.changed, *self.deleted}

    def __bool__(self) -> bool:
        return bool(self.created or self.changed or self.deleted)


def _same_content(before: tuple[int, int, bytes | None], after: tuple[int, int, bytes | None]) -> bool:
    if before[2] is not None and after[2] is not None:
        return before[2] == after[2]
    return before[:2] == after[:2]
