"""The tamper lock: what decides a goal (the acceptance scripts, what the checks read, the protected paths)
is fingerprinted before an attempt, compared after its work and again after its checks, and put back if changed.
What was found in a changed file is kept first (`.runner/tampered/<run id>/`): runner cannot tell the agent's
edit from a person's, and a person's must not be lost.

Two runs in one project (the daemon, or two CLIs) share one filesystem. A run claims its protected paths
for as long as it runs (`Claim`): a run whose goal may write what another run protects, or the other way
round, waits until that run ends. So a change inside a run's protected paths while it runs was made by that
run's own attempt (or its checks), and the restore puts back only what changed in that time.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import re
import shutil
import stat
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import ALWAYS_PROTECTED, Goal
from ..work.tools.paths import check_inputs, check_scripts

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there are not claimed
    fcntl = None  # type: ignore[assignment]

STATE = ".runner"
"""runner's own state changes during a run: never fingerprinted, never restored."""
CACHES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"}
"""Folders the checks' tools write as they run (bytecode, test caches): not part of what decides."""
MAX_COPY = 16 * 1024 * 1024
"""A protected file larger than this is fingerprinted but no copy is kept: a change to it cannot be put back."""
MAX_COPIES = 256 * 1024 * 1024
"""Copies kept for one snapshot at most, and of one run's changed files; files past it are not copied."""

Stamp = tuple[int, int, int, int, int]
"""(inode, size, mtime_ns, ctime_ns, mode): any write changes ctime, which no unprivileged tool can set back."""

_contents: dict[str, tuple[Stamp, bytes]] = {}
"""Content of protected files by path, reused while their stamp holds (many runs share one project)."""


def protected_patterns(goal: Goal) -> list[str]:
    """Every path the tamper lock watches, relative to the root: the project's fixed ones, `protect:`, the
    checks' scripts and (unless `verify.protect_check_inputs` is false) what the checks name as arguments."""
    return list(dict.fromkeys([*_locked(goal), *_inputs(goal)]))


def _locked(goal: Goal) -> list[str]:
    return [*(p for p in ALWAYS_PROTECTED if p != STATE), *goal.protect, *check_scripts(goal)]


def _inputs(goal: Goal) -> list[str]:
    return [p for p in check_inputs(goal) if not _in_state(p)]


@dataclass
class Snapshot:
    root: Path
    stamps: dict[str, Stamp]
    files: dict[str, bytes | None]
    """The content of each regular file; None when it could not be kept (too large, unreadable)."""
    patterns: list[str]
    inputs: list[str]
    """The check inputs among the patterns (and not scripts or protected): the checks may write them."""
    links: dict[str, Link]
    """The symlinks on the way to the protected paths when the snapshot was taken (a `goals` folder shared
    between projects, say): the user's, which a restore and a kept copy go through instead of replacing."""

    @classmethod
    def take(cls, goal: Goal) -> Snapshot:
        patterns = protected_patterns(goal)
        locked = _locked(goal)
        inputs = [p for p in _inputs(goal) if not _covered(p, locked)]
        links: dict[str, Link] = {}
        stamps = _stamps(goal.root, patterns, links)
        base, kept = f"{goal.root}{os.sep}", 0
        files: dict[str, bytes | None] = {}
        for rel, s in stamps.items():
            if stat.S_ISREG(s[4]):
                kept += s[1]
                files[rel] = _content(base + rel, s) if kept <= MAX_COPIES else None
        return cls(goal.root, stamps, files, patterns, inputs, _user_links(goal.root, patterns, links))

    def changes(self, *, checks_ran: bool = False) -> list[str]:
        """Paths created, changed or deleted since the snapshot, relative to the root.

        After the checks (`checks_ran`), what they wrote among their own inputs (`tee log.txt`, `sort -o
        out.txt`) is no change: it becomes part of the snapshot. The attempt's processes are gone by then.
        """
        now = _stamps(self.root, self.patterns)
        if now == self.stamps:  # the usual case, compared in C
            return []
        changed = sorted(p for p in self.stamps.keys() | now.keys() if self.stamps.get(p) != now.get(p))
        if not checks_ran:
            return changed
        written = [p for p in changed if _covered(p, self.inputs)]
        self._accept(written, now)
        return [p for p in changed if p not in written]

    def _accept(self, paths: list[str], now: dict[str, Stamp]) -> None:
        base = f"{self.root}{os.sep}"
        for rel in paths:
            if rel in now:
                self.stamps[rel] = now[rel]
                self.files[rel] = _content(base + rel, now[rel]) if stat.S_ISREG(now[rel][4]) else None
            else:
                self.stamps.pop(rel, None)
                self.files.pop(rel, None)

    def keep(self, paths: list[str], run_id: str) -> Kept:
        """Copy what is at each of `paths` now to `.runner/tampered/<run id>/<path>` (a deleted path leaves
        nothing to keep). The state folder is never fingerprinted: writing there is no change."""
        folder = f"tampered/{_folder_name(run_id)}/"  # made below `.runner`, which may be a link the user made
        kept = Kept(f"{STATE}/{folder}", [], [])
        room = MAX_COPIES
        for rel in paths:
            if rel.endswith("/"):  # a folder made unreadable: its files are still there
                continue
            try:
                content = _read_now(self.root, rel, self.links)
                if content is None:
                    continue
                if len(content) > room:
                    raise _NoCopy(f"past the {MAX_COPIES // 2**20} MB kept for one run")
                room -= len(content)
                (self.root / STATE).mkdir(exist_ok=True)
                _write_new(self.root / STATE, folder + rel, content)
            except OSError as exc:
                kept.missed.append(f"{rel} ({exc.strerror or exc})")
            except _NoCopy as exc:
                kept.missed.append(f"{rel} ({exc})")
            else:
                kept.paths.append(rel)
        return kept

    def restore(self, paths: list[str]) -> list[str]:
        """Put `paths` back as they were; what could not be put back, each as `path (why)`."""
        failed: list[str] = []
        for rel in paths:
            try:
                self._put_back(rel)
            except OSError as exc:
                failed.append(f"{rel} ({exc.strerror or exc})")
            except _NoCopy as exc:
                failed.append(f"{rel} ({exc})")
        return failed

    def _put_back(self, rel: str) -> None:
        full = self.root / rel
        if rel.endswith("/"):  # a folder made unreadable
            os.chmod(full, stat.S_IMODE(os.lstat(full).st_mode) | stat.S_IRWXU)
            return
        if rel not in self.stamps:
            _remove(full)
            return
        content = self.files.get(rel)
        if content is None:
            raise _NoCopy(f"no copy was kept: larger than {MAX_COPY // 2**20} MB or unreadable")
        _write_new(self.root, rel, content, self.links)
        os.chmod(full, stat.S_IMODE(self.stamps[rel][4]))
        _contents.pop(str(full), None)


@dataclass
class Kept:
    """The changed versions of protected files, kept before they were put back."""

    folder: str
    """Relative to the root, ending in `/`: `.runner/tampered/<run id>/`."""
    paths: list[str]
    missed: list[str]
    """What was not kept, each as `path (why)`: too large, or not a regular file (a symlink is not followed)."""


class _NoCopy(Exception):
    """The content of a changed file is not known (its original), or not kept (what the change left)."""


def _folder_name(run_id: str) -> str:
    """`run_id` as one folder name: runner makes ids of digits, letters and dashes; anything else (a dot, a
    slash) becomes `_`, so the folder stays inside `.runner/tampered/`."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", run_id)[:100] or "_"


def _read_now(root: Path, rel: str, links: dict[str, Link]) -> bytes | None:
    """The regular file at `rel` now; None when nothing is there. No step below the root follows a link but
    the user's (`links`, as they were at the snapshot), and nothing but a regular file is opened (a FIFO would
    block the read, a device never end it)."""
    *folders, name = parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise _NoCopy("not a path inside the project")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for depth, part in enumerate(folders, 1):
            follow = _trusted(root, "/".join(folders[:depth]), links)
            mode = _mode(part, fd, follow)
            if mode is not None and stat.S_ISLNK(mode):
                raise _NoCopy(f"{'/'.join(folders[:depth])} is a symlink, not followed")
            if mode is None or not stat.S_ISDIR(mode):
                return None
            nofollow = 0 if follow else os.O_NOFOLLOW
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=fd)
            os.close(fd)
            fd = inner
        follow = _trusted(root, rel, links)
        mode = _mode(name, fd, follow)
        if mode is None:
            return None
        if not stat.S_ISREG(mode):
            raise _NoCopy(_KINDS.get(stat.S_IFMT(mode), "not a regular file"))
        nofollow = 0 if follow else os.O_NOFOLLOW
        with os.fdopen(os.open(name, os.O_RDONLY | nofollow | os.O_NONBLOCK, dir_fd=fd), "rb") as file:
            content = file.read(MAX_COPY + 1)
    finally:
        os.close(fd)
    if len(content) > MAX_COPY:
        raise _NoCopy(f"larger than {MAX_COPY // 2**20} MB")
    return content


_KINDS = {stat.S_IFLNK: "a symlink, not followed", stat.S_IFIFO: "a FIFO, not read"}


def _mode(name: str, folder: int, follow: bool = False) -> int | None:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=follow).st_mode
    except FileNotFoundError:
        return None


Link = tuple[str, int, int]
"""A symlink as (what it says, the device and inode of what it points to)."""


def _link(path: Path) -> Link | None:
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return None
        target = os.stat(path)
        return os.readlink(path), target.st_dev, target.st_ino
    except OSError:
        return None


def _user_links(root: Path, patterns: list[str], links: dict[str, Link]) -> dict[str, Link]:
    """`links` (those met in the protected folders) and the symlinks among the fixed parts of the protected
    patterns (`goals`, `tests/unit`, `runner.yaml`)."""
    for pattern in patterns:
        parts = _literal_prefix(pattern).split("/")
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            if rel and rel not in links and (link := _link(root / rel)) is not None:
                links[rel] = link
    return links


def _trusted(root: Path, rel: str, links: dict[str, Link]) -> bool:
    """Whether `rel` is a link of the user's, unchanged since the snapshot (the same text, the same target)."""
    return rel in links and _link(root / rel) == links[rel]


def _write_new(root: Path, rel: str, content: bytes, links: dict[str, Link] | None = None) -> None:
    """A new file at `rel`, readable by its owner only, in place of whatever is there; a link where a folder
    above it was is replaced by a folder, so nothing is written through a link, except the user's (`links`):
    a shared folder or file stays shared, and the content goes where it points."""
    links = links or {}
    full = root / rel
    _make_folders(root, rel, links)
    if _trusted(root, rel, links):
        with open(full, "r+b") as file:  # through the user's link, to the file it names
            file.write(content)
            file.truncate()
        return
    _remove(full)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(content)


def _remove(full: Path) -> None:
    """Whatever is at `full` now (a file, a symlink, a FIFO, a folder put where a file was) is removed."""
    try:
        mode = os.lstat(full).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(full)
    else:
        full.unlink()


def _make_folders(root: Path, rel: str, links: dict[str, Link]) -> None:
    """The folders above `rel` as real folders: a symlink or file put in their place is removed, so a restore
    never writes through a link the agent made (the user's `links` stay)."""
    folder, parts = root, rel.split("/")[:-1]
    for depth, part in enumerate(parts, 1):
        folder = folder / part
        if _trusted(root, "/".join(parts[:depth]), links) and folder.is_dir():
            continue
        try:
            mode = os.lstat(folder).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISDIR(mode):
            folder.unlink()
            mode = None
        if mode is None:
            folder.mkdir()
        elif not os.access(folder, os.W_OK | os.X_OK):
            os.chmod(folder, stat.S_IMODE(mode) | stat.S_IRWXU)


def _content(path: str, stamp: Stamp) -> bytes | None:
    if stamp[1] > MAX_COPY:
        return None
    cached = _contents.get(path)
    if cached is None or cached[0] != stamp:
        try:
            with open(path, "rb") as file:
                cached = (stamp, file.read())
        except OSError:
            return None
        _contents[path] = cached
    return cached[1]


def _stamps(root: Path, patterns: list[str], links: dict[str, Link] | None = None) -> dict[str, Stamp]:
    """The stamp of every file (and link, FIFO, ...) under the protected patterns, by path relative to the root;
    the symlinks met in the folders walked go into `links` when given."""
    stamps: dict[str, Stamp] = {}
    for pattern in patterns:
        rel = pattern.removesuffix("/**").strip("/")
        if any(c in rel for c in "*?["):
            for path in root.glob(pattern):
                _add(str(path), path.relative_to(root).as_posix(), stamps)
            continue
        top = f"{root}{os.sep}{rel}"
        try:
            is_dir = stat.S_ISDIR(os.stat(top).st_mode)
        except (OSError, ValueError):
            continue
        if is_dir:
            _walk(top, rel + "/", stamps, links)
        else:
            _add(top, rel, stamps)
    return stamps


def _walk(folder: str, prefix: str, stamps: dict[str, Stamp], links: dict[str, Link] | None) -> None:
    if _in_state(prefix.rstrip("/")):
        return
    try:
        entries = list(os.scandir(folder))
    except OSError:
        stamps[prefix] = (-1, -1, -1, -1, 0)  # an unreadable folder is a change in itself
        return
    for entry in entries:  # the folders above were looked at on the way down: only the name is new
        name = entry.name
        if name in CACHES or (not prefix and name == STATE):
            continue
        if entry.is_dir(follow_symlinks=False):
            _walk(entry.path, f"{prefix}{name}/", stamps, links)
            continue
        if links is not None and entry.is_symlink() and (link := _link(Path(entry.path))) is not None:
            links[prefix + name] = link
        try:  # _stamp, inlined: a walk of a big folder does little else
            st = os.stat(entry.path)
        except OSError:
            _stamp(entry.path, prefix + name, stamps)
            continue
        if not stat.S_ISDIR(st.st_mode):
            stamps[prefix + name] = _of(st)


def _add(path: str, rel: str, stamps: dict[str, Stamp]) -> None:
    if not (_in_state(rel) or CACHES.intersection(rel.split("/"))):
        _stamp(path, rel, stamps)


def _stamp(path: str, rel: str, stamps: dict[str, Stamp]) -> None:
    """One stat: of what a link points to, or of the link itself when that is missing or unreadable."""
    try:
        st = os.stat(path)
    except OSError:
        try:
            st = os.lstat(path)
        except OSError:
            return
    if not stat.S_ISDIR(st.st_mode):
        stamps[rel] = _of(st)


def _of(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def _in_state(rel: str) -> bool:
    return rel == STATE or rel.startswith(STATE + "/")


# Runs side by side: claims on protected paths ----------------------------------------------------------


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
        base = _literal_prefix(path)
        inside = claim.workdir == "" or base == claim.workdir or base.startswith(claim.workdir + "/")
        around = base == "" or claim.workdir.startswith(base + "/")
        if (inside or around) and not _covered(path, claim.patterns):
            return True
    return False


def _literal_prefix(pattern: str) -> str:
    """The folder part of a pattern before its first wildcard: `secrets/*.key` -> `secrets`."""
    parts = pattern.removesuffix("/**").strip("/").split("/")
    literal = []
    for part in parts:
        if any(c in part for c in "*?["):
            break
        literal.append(part)
    return "/".join(literal)


def _covered(path: str, patterns: list[str]) -> bool:
    """Whether `patterns` protect `path` (the same rule as the file tools' PathGuard)."""
    for pattern in patterns:
        base = pattern.rstrip("/").removesuffix("/**")
        if path == base or path.startswith(base + "/") or fnmatch.fnmatchcase(path, pattern):
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
