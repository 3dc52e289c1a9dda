"""The tamper lock: the user's acceptance scripts and protected paths, fingerprinted and put back if changed."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import ALWAYS_PROTECTED, Goal
from .tools.sandbox import check_scripts

NOT_LOCKED = {".runner"}
"""runner's own state changes during a run; the file tools already refuse it."""


@dataclass
class Snapshot:
    root: Path
    files: dict[str, bytes]
    patterns: list[str]

    @classmethod
    def take(cls, goal: Goal) -> Snapshot:
        patterns = [p for p in ALWAYS_PROTECTED if p not in NOT_LOCKED] + goal.protect + check_scripts(goal)
        return cls(goal.root, _read(goal.root, patterns), patterns)

    def changes(self) -> list[str]:
        """Paths created, changed or deleted since the snapshot, relative to the root."""
        now = _read(self.root, self.patterns)
        return sorted(p for p in self.files.keys() | now.keys() if self.files.get(p) != now.get(p))

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


def _read(root: Path, patterns: list[str]) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for pattern in patterns:
        base = root / pattern.removesuffix("/**")
        if base.is_file():
            candidates = [base]
        elif base.is_dir():
            candidates = [p for p in base.rglob("*") if p.is_file()]
        else:
            candidates = [p for p in root.glob(pattern) if p.is_file()]
        for path in candidates:
            try:
                files[path.relative_to(root).as_posix()] = path.read_bytes()
            except OSError:
                continue
    return files
