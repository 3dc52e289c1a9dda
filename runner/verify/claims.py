"""Runs side by side: two runs in one project (the daemon, or two CLIs) share one filesystem. A run claims its
protected paths for as long as it runs (`Claim`): a run whose goal may write what another run protects, or the
other way round, waits until that run ends. So a change inside a run's protected paths while it runs was made by
that run's own attempt (or its checks), and the tamper lock's restore puts back only what changed in that time.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ALWAYS_PROTECTED, Goal
from .protected import STATE, covered, literal_prefix, protected_patterns

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there are not claimed
    fcntl = None  # type: ignore[assignment]


@dataclass
class Claim:
    """What one run protects and where its goal may write, as other runs of the project see it."""

    run_id: str
    goal: str
    workdir: str
    """The goal's workdir relative to the root ('' for the root itself)."""
    protects: list[str]
    """Its own protected paths (beside the fixed ones every goal shares)."""
    patterns: list[str]
    """Everything its file tools refuse to write."""

    @classmethod
    def of(cls, goal: Goal, run_id: str) -> Claim:
        root = goal.rootpath
        workdir = goal.workpath.relative_to(root).as_posix() if goal.workpath.is_relative_to(root) else "/"
        patterns = protected_patterns(goal)
        own = [p for p in patterns if not _fixed(p)]
        return cls(run_id, goal.name, "" if workdir == "." else workdir, own, [*ALWAYS_PROTECTED, *patterns])

    def clashes(self, other: Claim) -> bool:
        """Whether either run's goal may write a path the other protects."""
        return _may_write(other, self.protects) or _may_write(self, other.protects)


def _fixed(pattern: str) -> bool:
    return any(pattern == p or pattern.startswith(p + "/") for p in ALWAYS_PROTECTED)


def _may_write(claim: Claim, paths: list[str]) -> bool:
    for path in paths:
        base = literal_prefix(path)
        inside = claim.workdir == "" or base == claim.workdir or base.startswith(claim.workdir + "/")
        around = base == "" or claim.workdir.startswith(base + "/")
        if (inside or around) and not covered(path, claim.patterns):
            return True
    return False


WAIT_POLL = 0.2
"""Seconds between two looks at the claims while waiting for a clashing run to end."""


@asynccontextmanager
async def claimed(goal: Goal, run_id: str, waiting: Callable[[list[str]], None]) -> AsyncIterator[None]:
    """Hold the run's claim on its protected paths; first wait (telling `waiting` once, with the other runs'
    ids) while a run whose goal clashes with this one holds its own. A claim whose process died is dropped.

    Claims live in `.runner/tamper/` as one file per run, each held under an exclusive flock by its run.
    Without a writable state folder there is nothing to share with other runs: the run goes on unclaimed.
    """
    folder = goal.root / STATE / "tamper"
    claim = Claim.of(goal, run_id)
    fd: int | None = None
    told = False
    try:
        while True:
            try:
                clashing, fd = _try_claim(folder, claim) if fcntl is not None else ([], None)
            except OSError:
                break
            if not clashing:
                break
            if not told:
                waiting(clashing)
                told = True
            await asyncio.sleep(WAIT_POLL)
        yield
    finally:
        if fd is not None:
            _release(folder, claim, fd)


def _try_claim(folder: Path, claim: Claim) -> tuple[list[str], int | None]:
    """Under the project's claim mutex: the runs that clash with `claim`, or none and the held claim file."""
    if not folder.is_dir():  # a mkdir of a folder that exists costs as much as making it on some disks
        folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".mutex", "a") as mutex:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        clashing = [other.run_id for other in _live_claims(folder, claim)]
        if clashing:
            return clashing, None
        fd = os.open(folder / f"{claim.run_id}.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps(vars(claim)).encode())
        return [], fd


_read: dict[str, Claim | None] = {}
"""Claim files already read by this process, by path: a claim file is written once, under a name no other
run has, so it is read once however many runs of a busy daemon look at it."""


def _live_claims(folder: Path, claim: Claim) -> list[Claim]:
    """The claims of live runs that clash with `claim`. Whether a run is alive is asked only of those that
    clash (a flock each): with hundreds of runs at once, most claims never need it."""
    found = []
    names = [name for name in os.listdir(folder) if name.endswith(".json") and name != f"{claim.run_id}.json"]
    for name in names:
        path = os.path.join(folder, name)
        if path not in _read:
            data = _held(Path(path))
            if data is None:
                continue
            try:
                _read[path] = Claim(**data)
            except TypeError:
                _read[path] = None
        other = _read[path]
        if other is not None and claim.clashes(other) and _held(Path(path)) is not None:
            found.append(other)
    if len(_read) > 4 * len(names) + 1000:  # forget claims whose files are gone
        listed = {os.path.join(folder, name) for name in names}
        for path in [p for p in _read if p.startswith(str(folder)) and p not in listed]:
            del _read[path]
    return found


def _held(path: Path) -> dict[str, Any] | None:
    """The claim in `path` while its run holds it; a claim left by a dead process is removed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            with os.fdopen(os.dup(fd), "rb") as file:
                try:
                    data = json.loads(file.read())
                except ValueError:
                    return None
            return data if isinstance(data, dict) else None
        path.unlink(missing_ok=True)
        return None
    finally:
        os.close(fd)


def _release(folder: Path, claim: Claim, fd: int) -> None:
    try:
        (folder / f"{claim.run_id}.json").unlink(missing_ok=True)
    except OSError:
        pass
    os.close(fd)
