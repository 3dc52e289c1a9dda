"""The tamper lock: the user's acceptance scripts and protected paths, fingerprinted and put back if changed."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..config import ALWAYS_PROTECTED, Goal
from ..work.tools.paths import check_scripts

NOT_LOCKED = {".runner"}
"""runner's own state changes during a run; the file tools already refuse it."""


Stamp = tuple[int, int, int, int]
"""(inode, size, mtime_ns, ctime_ns): any write changes ctime, which no unprivileged tool can set back."""

_contents: dict[str, tuple[Stamp, bytes]] = {}
"""Content of protected files by path, reused while their stamp holds (many runs share one project)."""


@dataclass
class Snapshot:
    root: Path
    stamps: dict[str, Stamp]
    files: dict[str, bytes]
    patterns: list[str]

    @classmethod
    def take(cls, goal: Goal) -> Snapshot:
        patterns = [p for p in ALWAYS_PROTECTED if p not in NOT_LOCKED] + goal.protect + check_scripts(goal)
        stamps = _stamps(goal.root, patterns)
        base = f"{goal.root}{os.sep}"
        return cls(goal.root, stamps, {rel: _content(base + rel, stamp) for rel, stamp in stamps.items()}, patterns)

    def changes(self) -> list[str]:
        """Paths created, changed or deleted since the snapshot, relative to the root."""
        now = _stamps(self.root, self.patterns)
        return sorted(p for p in self.stamps.keys() | now.keys() if self.stamps.get(p) != now.get(p))

    def restore(self, paths: list[str]) -> None:
        for rel in paths:
            full = self.root / rel
            if rel in self.files:
                full.parent.mkdir(parents=True, exist_ok=True)
                if full.is_symlink():
                    full.unlink()
                full.write_bytes(self.files[rel])
            elif full.is_file() or full.is_symlink():
                full.unlink()


def _content(path: str, stamp: Stamp) -> bytes:
    cached = _contents.get(path)
    if cached is None or cached[0] != stamp:
        with open(path, "rb") as file:
            cached = (stamp, file.read())
        _contents[path] = cached
    return cached[1]


def _stamps(root: Path, patterns: list[str]) -> dict[str, Stamp]:
    """The stamp of every file under the protected patterns, by path relative to the root."""
    stamps: dict[str, Stamp] = {}
    for pattern in patterns:
        rel = pattern.removesuffix("/**").strip("/")
        top = root / rel
        if top.is_dir():
            _walk(str(top), rel + "/", stamps)
        elif top.is_file():
            _add(str(top), rel, stamps)
        elif any(c in pattern for c in "*?["):
            for path in root.glob(pattern):
                _add(str(path), path.relative_to(root).as_posix(), stamps)
    return stamps


def _walk(folder: str, prefix: str, stamps: dict[str, Stamp]) -> None:
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                _walk(entry.path, f"{prefix}{entry.name}/", stamps)
            else:
                _add(entry.path, prefix + entry.name, stamps)


def _add(path: str, rel: str, stamps: dict[str, Stamp]) -> None:
    try:
        st = os.stat(path)
    except OSError:
        return
    if stat.S_ISREG(st.st_mode):
        stamps[rel] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
