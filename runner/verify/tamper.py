"""The tamper lock: what decides a goal (the acceptance scripts, what the checks read, the protected paths)
is fingerprinted before an attempt, compared after its work and again after its checks, and put back if changed.
What was found in a changed file is kept first (`.runner/tampered/<run id>/`): runner cannot tell the agent's
edit from a person's, and a person's must not be lost.

What is protected is in `protected`, how it is stamped in `fingerprint`; runs whose protected paths clash take
turns (`claims`), so a change inside a run's protected paths while it runs was made by that run's own attempt
(or its checks).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from ..config import Goal
from .fingerprint import Link, Stamp, fingerprint, link_of, stamp_of, user_links
from .protected import STATE, covered, input_patterns, locked_patterns, protected_patterns

MAX_COPY = 16 * 1024 * 1024
"""A protected file larger than this is fingerprinted but no copy is kept: a change to it cannot be put back."""
MAX_COPIES = 256 * 1024 * 1024
"""Copies kept for one snapshot at most, and of one run's changed files; files past it are not copied."""

_contents: dict[str, tuple[Stamp, bytes]] = {}
"""Content of protected files by path, reused while their stamp holds (many runs share one project)."""


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
    """The symlinks on the way to the protected paths and in them when the snapshot was taken (a `goals` folder
    shared between projects, say): the user's. The lock goes through one while it is unchanged and a restore puts
    it back when it changed; any other link it never follows."""
    state: Link | None = None
    """`.runner` when it was a link (the state kept on another disk, say): kept copies go through it only while
    it is unchanged."""

    @classmethod
    def take(cls, goal: Goal) -> Snapshot:
        patterns = protected_patterns(goal)
        locked = locked_patterns(goal)
        inputs = [p for p in input_patterns(goal) if not covered(p, locked)]
        links = user_links(goal.root, patterns)
        stamps = fingerprint(goal.root, patterns, links, record=True)
        base, kept = f"{goal.root}{os.sep}", 0
        files: dict[str, bytes | None] = {}
        for rel, s in stamps.items():
            if stat.S_ISREG(s[4]):
                kept += s[1]
                files[rel] = _content(base + rel, s) if kept <= MAX_COPIES else None
        return cls(goal.root, stamps, files, patterns, inputs, links, link_of(goal.root / STATE))

    def changes(self, *, checks_ran: bool = False) -> list[str]:
        """Paths created, changed or deleted since the snapshot, relative to the root. A link now in the place of
        a folder that held protected files is not named: those files, out of reach through it, are.

        After the checks (`checks_ran`), what they wrote among their own inputs (`tee log.txt`, `sort -o
        out.txt`) is no change: it becomes part of the snapshot. The attempt's processes are gone by then.
        """
        now = fingerprint(self.root, self.patterns, self.links)
        if now == self.stamps:  # the usual case, compared in C
            return []
        changed = sorted(p for p in self.stamps.keys() | now.keys() if self.stamps.get(p) != now.get(p))
        changed = [p for p in changed if not (p in now and stat.S_ISLNK(now[p][4]) and self._held(p))]
        if checks_ran:
            written = [p for p in changed if covered(p, self.inputs)]
            self._accept(written, now)
            changed = [p for p in changed if p not in written]
        return changed

    def _held(self, folder: str) -> bool:
        return any(p.startswith(f"{folder}/") for p in self.stamps)

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
        """Copy what is at each of `paths` now to `.runner/tampered/<run id>/<path>` (a
        deleted path leaves nothing to keep). The state folder is never fingerprinted: writing there is no change."""
        folder = f"tampered/{_folder_name(run_id)}/"
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
                holder = _holder(self._state_folder(), folder + rel, {}, make=True, relinked=[])
                assert holder is not None  # made on the way
                try:
                    _write(holder, rel.rsplit("/", 1)[-1], content, 0o600)
                finally:
                    os.close(holder)
            except OSError as exc:
                kept.missed.append(f"{shown(rel)} ({exc.strerror or exc})")
            except _NoCopy as exc:
                kept.missed.append(f"{shown(rel)} ({exc})")
            else:
                kept.paths.append(rel)
        return kept

    def _state_folder(self) -> int:
        """`.runner`, open (made when missing): through the user's link only while it is the one the snapshot
        found. A link that appeared or changed during the run is never followed: the copies would go where it points."""
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if self.state is not None:
                if link_of(STATE, root) != self.state:
                    raise _NoCopy(f"{STATE} changed during the run")
                return _open_dir(root, STATE, self.state)
            mode = _mode(STATE, root)
            if mode is None:
                os.mkdir(STATE, dir_fd=root)
            elif not stat.S_ISDIR(mode):
                raise _NoCopy(f"{STATE} changed during the run")
            return _open_dir(root, STATE, None)
        finally:
            os.close(root)

    def restore(self, paths: list[str]) -> list[str]:
        """Put `paths` back as they were; what could not be put back, each as `path (why)`.

        Nothing outside the root is removed, written or made readable but through a link of the user's that is
        unchanged (`_holder`). A link of the user's put back brings back what was below it; what the run wrote
        through it before changing it shows only then, and is put back too (no copy of it is kept)."""
        relinked: list[str] = []
        failed = self._restore(paths, relinked)
        if relinked:
            done = set(paths)
            again = [p for p in self.changes() if p not in done and any(p.startswith(f"{r}/") for r in relinked)]
            failed += self._restore(again, [])
        return failed

    def _restore(self, paths: list[str], relinked: list[str]) -> list[str]:
        failed: list[str] = []
        for rel in sorted(paths):  # a folder's place before what goes in it
            try:
                self._put_back(rel, relinked)
            except OSError as exc:
                failed.append(f"{shown(rel)} ({exc.strerror or exc})")
            except _NoCopy as exc:
                failed.append(f"{shown(rel)} ({exc})")
        return failed

    def _put_back(self, rel: str, relinked: list[str]) -> None:
        if rel.endswith("/"):  # a folder that could not be walked: made unreadable, or past the path limit
            self._unlock(rel[:-1], relinked)
            try:
                os.scandir(self.root / rel).close()
            except OSError:
                raise _NoCopy("still differs after the restore") from None  # the restore cannot see below it
            return
        link, stamp = self.links.get(rel), self.stamps.get(rel)
        holder = self._holder(rel, stamp is not None or link is not None, relinked)
        if holder is None:  # nothing there to remove
            return
        name = rel.rsplit("/", 1)[-1]
        try:
            if link is not None:
                _relink(holder, name, rel, link, relinked)
            if stamp is None or (link is not None and stat.S_ISLNK(stamp[4])):
                if link is None:
                    _remove(holder, name)
                return
            if _stat(name, holder, follow=link is not None) == stamp:
                return  # as it was: reached again through the user's link, put back
            content = self.files.get(rel)
            if content is None:
                raise _NoCopy(f"no copy was kept: larger than {MAX_COPY // 2**20} MB or unreadable")
            _write(holder, name, content, stat.S_IMODE(stamp[4]), link)
            _contents.pop(str(self.root / rel), None)
        finally:
            os.close(holder)

    def _holder(self, rel: str, make: bool, relinked: list[str]) -> int | None:
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        return _holder(root, rel, self.links, make=make, relinked=relinked)

    def _unlock(self, rel: str, relinked: list[str]) -> None:
        """The folder at `rel`, which the run made unreadable, readable again: a real folder, or the one the user's
        unchanged link points to; never what another link points to."""
        holder = self._holder(rel, False, relinked)
        if holder is None:
            return
        name, link = rel.rsplit("/", 1)[-1], self.links.get(rel)
        try:
            if link is not None and link_of(name, holder) != link:
                _relink(holder, name, rel, link, relinked)  # which undoes what the run did below it
            elif link is not None or stat.S_ISDIR(_mode(name, holder) or 0):
                _grant(holder, name)
        finally:
            os.close(holder)


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


def shown(rel: str) -> str:
    """`rel` as the run's error shows it: as it is, or quoted and escaped like a Python string (`'a\\nb'`) when
    it holds a control character or could be taken for a quoted name, so a message keeps one line per path;
    a very long one is cut in the middle."""
    text = rel if rel.isprintable() and not rel.startswith(("'", '"')) else repr(rel)
    return text if len(text) <= 240 else f"{text[:100]}...{text[-100:]}"  # a path past the system's limit


def _read_now(root: Path, rel: str, links: dict[str, Link]) -> bytes | None:
    """The regular file at `rel` now; None when nothing is there. No step below the root follows a link but
    the user's unchanged one (`links`), and nothing but a regular file is opened (a FIFO would block the read,
    a device never end it)."""
    *folders, name = parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise _NoCopy("not a path inside the project")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for depth, part in enumerate(folders, 1):
            inner = _read_step(fd, part, "/".join(folders[:depth]), links)
            if inner is None:
                return None
            os.close(fd)
            fd = inner
        link = _unchanged(fd, name, links.get(rel))
        mode = _mode(name, fd, follow=link is not None)
        if link is None and rel in links and not stat.S_ISREG(mode or 0):
            raise _NoCopy(_relinked(links[rel]))
        if mode is None:
            return None
        if not stat.S_ISREG(mode):
            raise _NoCopy(_KINDS.get(stat.S_IFMT(mode), "not a regular file"))
        nofollow = 0 if link else os.O_NOFOLLOW
        with os.fdopen(os.open(name, os.O_RDONLY | nofollow | os.O_NONBLOCK, dir_fd=fd), "rb") as file:
            content = file.read(MAX_COPY + 1)
    finally:
        os.close(fd)
    if len(content) > MAX_COPY:
        raise _NoCopy(f"larger than {MAX_COPY // 2**20} MB")
    return content


def _read_step(fd: int, name: str, rel: str, links: dict[str, Link]) -> int | None:
    """The folder `name` in `fd` (at `rel`), open to read: a real folder, or the user's unchanged link's."""
    link = _unchanged(fd, name, links.get(rel))
    mode = _mode(name, fd)
    if link is not None or stat.S_ISDIR(mode or 0):
        return _open_dir(fd, name, link)
    if rel in links:
        raise _NoCopy(f"{shown(rel)}: {_relinked(links[rel])}")
    if mode is not None and stat.S_ISLNK(mode):
        raise _NoCopy(f"{shown(rel)} is a symlink, not followed")
    return None


def _relinked(link: Link) -> str:
    return f"the link is put back (it pointed to {shown(link[0])})"


_KINDS = {stat.S_IFLNK: "a symlink, not followed", stat.S_IFIFO: "a FIFO, not read"}


def _mode(name: str, folder: int, follow: bool = False) -> int | None:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=follow).st_mode
    except FileNotFoundError:
        return None


def _stat(name: str, folder: int, follow: bool) -> Stamp | None:
    try:
        return stamp_of(os.stat(name, dir_fd=folder, follow_symlinks=follow))
    except OSError:
        return None


def _unchanged(folder: int, name: str, link: Link | None) -> Link | None:
    """`link` (the user's) when `name` in `folder` is still that link: the same text, the same target."""
    return link if link is not None and link_of(name, folder) == link else None


# The restore's way down: one name at a time, never through a link but the user's unchanged one -----------


def _holder(fd: int, rel: str, links: dict[str, Link], *, make: bool, relinked: list[str]) -> int | None:
    """The folder holding `rel`, open, reached from `fd` (closed here) one name at a time, each made safe before
    it is gone through: the user's link (`links`) is gone through while unchanged and put back when it changed,
    which by itself undoes whatever the run did below it (and goes into `relinked`); any other link is removed,
    never followed, and so is a file in a folder's place when writing; a missing folder is made when `make` (to
    write), else there is nothing below to remove (None)."""
    parts = rel.split("/")[:-1]
    for depth, name in enumerate(parts, 1):
        try:
            inner = _step(fd, name, "/".join(parts[:depth]), links, make, relinked)
        finally:
            os.close(fd)
        if inner is None:
            return None
        fd = inner
    return fd


def _step(fd: int, name: str, rel: str, links: dict[str, Link], make: bool, relinked: list[str]) -> int | None:
    link = links.get(rel)
    if link is not None:
        _relink(fd, name, rel, link, relinked)
        try:
            return _open_dir(fd, name, link, unlock=True)
        except FileNotFoundError:  # the user's link leads nowhere now: nothing below it to remove
            if make:
                raise
            return None
    mode = _mode(name, fd)
    if stat.S_ISDIR(mode or 0):
        return _open_dir(fd, name, None, unlock=True)
    if mode is not None and (make or stat.S_ISLNK(mode)):
        os.unlink(name, dir_fd=fd)  # a link the run made, or a file (kept first) where a folder was
    if not make:
        return None
    os.mkdir(name, dir_fd=fd)
    return _open_dir(fd, name, None, unlock=True)


def _relink(fd: int, name: str, rel: str, link: Link, relinked: list[str]) -> None:
    """The user's link at `name`, as it was at the snapshot: whatever else is there (another link, a file, a folder
    made in its place during the run, whose files were kept) is removed first."""
    if link_of(name, fd) == link:
        return
    _remove(fd, name)
    os.symlink(link[0], name, dir_fd=fd)
    relinked.append(rel)


def _open_dir(folder: int, name: str, link: Link | None, *, unlock: bool = False) -> int:
    """The folder `name` in `folder`, open: through `link` (the user's, checked to lead where it led at the snapshot)
    or through no link at all. With `unlock` (a restore), the owner gets back the rights the run took from it."""
    flags = os.O_RDONLY | os.O_DIRECTORY | (0 if link else os.O_NOFOLLOW)
    try:
        fd = os.open(name, flags, dir_fd=folder)
    except PermissionError:
        if not unlock:
            raise
        _grant(folder, name)  # a real folder (lstat said so) or the user's link's
        fd = os.open(name, flags, dir_fd=folder)
    _check(fd, link)
    if unlock and not os.access(name, os.W_OK | os.X_OK, dir_fd=folder):
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | stat.S_IRWXU)
    return fd


def _check(fd: int, link: Link | None) -> None:
    """That `fd`, opened through the user's `link`, is what it pointed to (not a link switched meanwhile)."""
    if link is None:
        return
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != link[1:]:
        os.close(fd)
        raise OSError(errno.ESTALE, "changed while it was gone through")


def _grant(folder: int, name: str) -> None:
    os.chmod(name, stat.S_IMODE(os.stat(name, dir_fd=folder).st_mode) | stat.S_IRWXU, dir_fd=folder)


def _remove(folder: int, name: str) -> None:
    """Whatever is at `name` in `folder` now (a file, a symlink, a FIFO, a folder put where a file was); a link is
    removed, never followed."""
    mode = _mode(name, folder)
    if mode is None:
        return
    if stat.S_ISDIR(mode):
        try:
            shutil.rmtree(name, dir_fd=folder)
        except RecursionError:  # a tree deeper than Python's stack (Python 3.11's rmtree recurses)
            raise OSError(errno.ELOOP, "a folder too deep to remove") from None
    else:
        os.unlink(name, dir_fd=folder)


def _write(folder: int, name: str, content: bytes, mode: int, link: Link | None = None) -> None:
    """`content` at `name` in `folder`, with `mode`: a new file in place of whatever is there, or, through the user's
    `link`, into the file it names (a shared file stays shared)."""
    if link is None:
        _remove(folder, name)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
    else:  # never blocks on a FIFO put where the file was, and writes only into the file the link named
        target = os.stat(name, dir_fd=folder)
        if not stat.S_ISREG(target.st_mode) or (target.st_dev, target.st_ino) != link[1:]:
            raise OSError(errno.ESTALE, "the file the link points to was replaced")
        fd = os.open(name, os.O_WRONLY | os.O_NONBLOCK, dir_fd=folder)
        _check(fd, link)
    with os.fdopen(fd, "wb") as file:
        file.write(content)
        file.truncate()
        os.fchmod(file.fileno(), mode)


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
