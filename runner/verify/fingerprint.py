"""The tamper lock's fingerprint: one stamp per file under the protected patterns, read without opening any
file, and the symlinks met on the way. No link is gone through but the user's own, unchanged since the
snapshot (`links`): one planted during a run is stamped itself, never followed.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .protected import STATE, in_state, literal_prefix

CACHES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"}
"""Folders the checks' tools write as they run (bytecode, test caches): not part of what decides."""

Stamp = tuple[int, int, int, int, int]
"""(inode, size, mtime_ns, ctime_ns, mode): any write changes ctime, which no unprivileged tool can set back."""
Key = tuple[int, int]
"""A folder as the system knows it: (device, inode)."""

Link = tuple[str, int, int]
"""A symlink as (what it says, the device and inode of what it points to)."""


def link_of(path: str | Path, folder: int | None = None) -> Link | None:
    try:
        if not stat.S_ISLNK(os.lstat(path, dir_fd=folder).st_mode):
            return None
        target = os.stat(path, dir_fd=folder)
        return os.readlink(path, dir_fd=folder), target.st_dev, target.st_ino
    except (OSError, ValueError):
        return None


def user_links(root: Path, patterns: list[str]) -> dict[str, Link]:
    """The symlinks among the fixed parts of the protected patterns (`goals`, `tests/unit`, `runner.yaml`); the
    walk of the protected folders adds those it meets."""
    links: dict[str, Link] = {}
    for pattern in patterns:
        parts = literal_prefix(pattern).split("/")
        for depth in range(1, len(parts) + 1):
            rel = "/".join(parts[:depth])
            if rel and rel not in links and (link := link_of(root / rel)) is not None:
                links[rel] = link
    return links


# Stamps: what is under the protected patterns -------------------------------------------------------------


def fingerprint(root: Path, patterns: list[str], links: dict[str, Link], *, record: bool = False) -> dict[str, Stamp]:
    """The stamp of every file (and link, FIFO, ...) under the protected patterns, by path relative to the root.
    No link is gone through but the user's unchanged ones (`links`): another one on the way to a protected path
    is stamped itself. With `record` (the snapshot), each link met is the user's, and goes into `links`."""
    stamps: dict[str, Stamp] = {}
    base = f"{root}{os.sep}"
    walk = _Walk(stamps, links, record, _folder_key(base + STATE), os.path.realpath(root) + os.sep)
    for pattern in patterns:
        blocked = _blocked(base, literal_prefix(pattern), links)
        if blocked is not None:
            _add(base + blocked, blocked, stamps, links, record)
            continue
        rel = pattern.removesuffix("/**").strip("/")
        if any(c in rel for c in "*?["):
            for path in root.glob(pattern):
                _add(str(path), path.relative_to(root).as_posix(), stamps, links, record)
            continue
        top = base + rel
        try:
            is_dir = stat.S_ISDIR(os.stat(top).st_mode)
        except (OSError, ValueError):
            continue
        if is_dir:
            walk.folder(top, rel + "/")
        else:
            _add(top, rel, stamps, links, record)
    return stamps


def _blocked(base: str, rel: str, links: dict[str, Link]) -> str | None:
    """The first name on the way to `rel` (itself included) not to go through: a link other than the user's
    unchanged one, or a file where a folder should be."""
    parts = rel.split("/")
    for depth in range(1, len(parts) + 1):
        sub = "/".join(parts[:depth])
        try:
            mode = os.lstat(base + sub).st_mode
        except (OSError, ValueError):
            return None
        if stat.S_ISLNK(mode) and (sub not in links or link_of(base + sub) != links[sub]):
            return sub
        if depth < len(parts) and not stat.S_ISDIR(mode) and not stat.S_ISLNK(mode):
            return sub
    return None


@dataclass
class _Walk:
    """One fingerprint's walk of protected folders: what it found (`stamps`, and with `record` the user's
    `links`), the state folder it never enters and the project it stays in (`inside`: the root's real path)."""

    stamps: dict[str, Stamp]
    links: dict[str, Link]
    record: bool
    state: Key | None
    inside: str

    def folder(self, top: str, top_prefix: str) -> None:
        """Every file below `top`, folder by folder from a stack (a tree of any depth: no recursion). A folder
        inside the project that the user links to from a protected one (`verifiers/lib -> ../vlib`) is walked
        as part of it: a check reads what is there, and the agent's tools write inside the project. Each real
        folder once (a link to `.` loops no further), never the state folder, never a folder outside the
        project or the root itself (`verifiers/all -> /` is fingerprinted as a link)."""
        folders = [(top, top_prefix)]
        walked = {self.state}
        while folders:
            folder, prefix = folders.pop()
            key = _folder_key(folder)
            if (key is not None and key in walked) or in_state(prefix.rstrip("/")):
                continue
            walked.add(key)
            self._one(folder, prefix, folders)

    def _one(self, folder: str, prefix: str, folders: list[tuple[str, str]]) -> None:
        stamps = self.stamps
        try:
            entries = list(os.scandir(folder))
        except OSError:
            stamps[prefix] = (-1, -1, -1, -1, 0)  # an unreadable folder is a change in itself
            return
        for entry in entries:  # the folders above were looked at on the way down: only the name is new
            name = entry.name
            if name in CACHES or (not prefix and name == STATE):
                continue
            if entry.is_dir(follow_symlinks=False):  # the scan's own type: no system call
                folders.append((entry.path, f"{prefix}{name}/"))
            elif entry.is_symlink():
                through = _stamp(entry.path, prefix + name, stamps, self.links, self.record)
                if through and os.path.realpath(entry.path).startswith(self.inside):
                    folders.append((entry.path, f"{prefix}{name}/"))
            else:
                try:  # _stamp, inlined: a walk of a big folder does little else
                    stamps[prefix + name] = stamp_of(os.lstat(entry.path))
                except OSError:
                    pass


def _folder_key(path: str) -> Key | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino)


def _add(path: str, rel: str, stamps: dict[str, Stamp], links: dict[str, Link], record: bool) -> None:
    if not (in_state(rel) or CACHES.intersection(rel.split("/"))):
        _stamp(path, rel, stamps, links, record)


def _stamp(path: str, rel: str, stamps: dict[str, Stamp], links: dict[str, Link], record: bool) -> bool:
    """One stat of the file; for a link, of what it points to when it is the user's (unchanged) and no folder,
    else of the link itself: one planted, dangling or leading to a folder. True for the user's unchanged link
    to a folder, which the walk goes through."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return False
    through = False
    if stat.S_ISLNK(st.st_mode):
        link = link_of(path)
        if record and link is not None:
            links[rel] = link
        if link is not None and links.get(rel) == link:
            try:
                target = os.stat(path)
            except OSError:
                target = st
            through = stat.S_ISDIR(target.st_mode)
            st = st if through else target
    if not stat.S_ISDIR(st.st_mode):
        stamps[rel] = stamp_of(st)
    return through


def stamp_of(st: os.stat_result) -> Stamp:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
