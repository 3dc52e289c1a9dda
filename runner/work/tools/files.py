"""The built-in file tools: read_file, write_file, edit_file, list_files, search_files.

Only regular files are read or written (a FIFO or a device would block), sizes are checked before
reading, and the work runs off the event loop within a time limit (one small file is read or written on
it): the regular expressions of search_files run in a child process that is killed at its limit, since a
catastrophic pattern holds Python's GIL for as long as it backtracks.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import re
import shlex
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .paths import HIDDEN, PathGuard, ToolError
from .process import cap, run_process, scrub_env

MAX_LIST = 500
MAX_MATCHES = 200
READ_LINES = 2000
MAX_READ_BYTES = 8_000_000
"""read_file and edit_file refuse larger files (the shell's head, tail and grep read them in parts)."""
MAX_SEARCH_BYTES = 4_000_000
"""search_files skips larger files, and says how many it skipped."""
MAX_WALK = 50_000
"""Entries list_files and search_files visit, at most."""
FILE_TOOL_TIMEOUT = 60.0
"""Seconds one file tool may take before its result is a timeout error."""
SEARCH_TIMEOUT = 30.0
SKIPPED_DIRS = {".git", "__pycache__", "node_modules", ".venv", *HIDDEN}

SCHEMAS = {
    "read_file": (
        "Read a text file. Returns its lines; for big files use offset (1-based first line) and limit (lines).",
        {
            "path": {"type": "string", "description": "path relative to the working directory"},
            "offset": {"type": "integer", "minimum": 1, "description": "first line to read, 1-based"},
            "limit": {"type": "integer", "minimum": 1, "description": "how many lines to read"},
        },
        ["path"],
    ),
    "write_file": (
        "Create or replace a file with the given content, making folders as needed.",
        {"path": {"type": "string"}, "content": {"type": "string"}},
        ["path", "content"],
    ),
    "edit_file": (
        "Replace the one exact occurrence of old_text in a file with new_text (every occurrence with replace_all).",
        {
            "path": {"type": "string"},
            "old_text": {"type": "string"},
            "new_text": {"type": "string"},
            "replace_all": {"type": "boolean", "description": "replace every occurrence (default: false)"},
        },
        ["path", "old_text", "new_text"],
    ),
    "list_files": (
        "List files below a folder (default: the working directory), optionally filtered by a glob.",
        {"path": {"type": "string"}, "pattern": {"type": "string", "description": "glob such as *.py or src/**/*.ts"}},
        [],
    ),
    "search_files": (
        "Search files for a regular expression; returns matching lines as file:line:text.",
        {
            "pattern": {"type": "string", "description": "Python regular expression"},
            "path": {"type": "string"},
            "glob": {"type": "string", "description": "only files matching this glob"},
        },
        ["pattern"],
    ),
}


async def off_loop(tool: Callable[..., Any], box: PathGuard, **arguments: Any) -> str:
    """Run a file tool without blocking the event loop, within FILE_TOOL_TIMEOUT: in a thread, unless it only
    touches one small file (then the call is shorter than the thread's wait for the GIL among busy runs)."""
    if asyncio.iscoroutinefunction(tool):
        return await tool(box, **arguments)
    if _one_small_file(tool, box, arguments):
        return tool(box, **arguments)
    try:
        return await asyncio.wait_for(asyncio.to_thread(tool, box, **arguments), FILE_TOOL_TIMEOUT)
    except asyncio.TimeoutError:
        raise ToolError(f"the file tool took longer than {FILE_TOOL_TIMEOUT:g}s and was abandoned") from None


INLINE_BYTES = 256 * 1024
"""read_file, write_file and edit_file run on the event loop for a regular file of at most this size (a
hundred runs of a daemon reading a small file each: 0.2 ms a call there, 15-30 ms through a thread)."""


def _one_small_file(tool: Callable[..., Any], box: PathGuard, arguments: dict[str, Any]) -> bool:
    if tool not in (read_file, write_file, edit_file):
        return False
    content = arguments.get("content")
    if isinstance(content, str) and len(content) > INLINE_BYTES // 4:  # up to 4 bytes a character
        return False
    path = arguments.get("path")
    if not isinstance(path, str):
        return True  # refused at once
    try:
        st = os.stat(box.workdir / path)  # a FIFO or a device is not opened here, and not small
    except (OSError, ValueError):
        return True  # missing (or a name the tool refuses): answered at once
    return stat.S_ISREG(st.st_mode) and st.st_size <= INLINE_BYTES


def read_file(box: PathGuard, path: str, offset: int = 1, limit: int = READ_LINES) -> str:
    full = box.resolve(path)
    text = _read_text(full, path, box)
    lines = text.splitlines(keepends=True)
    if offset > max(len(lines), 1):
        raise ToolError(f"{path} has {len(lines)} lines; offset {offset} is past the end")
    chosen = "".join(lines[offset - 1 : offset - 1 + limit])
    more = len(lines) - (offset - 1 + limit)
    if more <= 0:
        return cap(chosen)
    return cap(chosen).rstrip("\n") + f"\n[{more} more lines: read on with offset={offset + limit}]"


def write_file(box: PathGuard, path: str, content: str) -> str:
    full = box.resolve(path, write=True)
    if full.is_dir():
        raise ToolError(f"{path} is a folder")
    if full.exists() and not full.is_file():
        raise ToolError(f"{path} is not a regular file (a FIFO, socket or device); only regular files are written")
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(content, encoding="utf-8")
    return f"wrote {len(content.encode())} bytes to {box.show(full)}"


def edit_file(box: PathGuard, path: str, old_text: str, new_text: str, replace_all: bool = False) -> str:
    """The one occurrence of old_text replaced (every one with replace_all). The errors say what to do next:
    a missing file names what is there; text not found shows the file (when short) as it really is."""
    full = box.resolve(path, write=True)
    text = _read_text(full, path, box)
    if not old_text:
        raise ToolError("old_text is empty: give the exact text to replace")
    count = text.count(old_text)
    if count == 0:
        raise ToolError(f"old_text not found in {path}{_as_it_is(text)}")
    if count > 1 and not replace_all:
        raise ToolError(
            f"old_text found {count} times in {path}; include more context to make it unique,"
            " or set replace_all to true to replace every occurrence"
        )
    full.write_text(text.replace(old_text, new_text, -1 if replace_all else 1), encoding="utf-8")
    return f"edited {box.show(full)}" + (f" ({count} replacements)" if count > 1 else "")


LISTED_ON_MISS = 20
"""Entries named when a path does not exist: what the nearest existing folder holds."""


def _what_is_there(full: Path, box: PathGuard | None) -> str:
    """`; FOLDER holds: a, b/, c` for the nearest existing folder above a missing path (inside the workdir)."""
    if box is None:
        return ""
    folder = full.parent
    while not folder.is_dir() and folder != box.workdir and folder.is_relative_to(box.workdir):
        folder = folder.parent
    if not folder.is_dir() or not folder.is_relative_to(box.workdir):
        return ""
    try:
        entries = sorted(e.name + ("/" if e.is_dir() else "") for e in folder.iterdir() if e.name not in SKIPPED_DIRS)
    except OSError:
        return ""
    shown = ", ".join(entries[:LISTED_ON_MISS]) + (
        f" and {len(entries) - LISTED_ON_MISS} more" if len(entries) > LISTED_ON_MISS else ""
    )
    where = "the working directory" if folder == box.workdir else box.show(folder) + "/"
    return f"; {where} holds: {shown or 'nothing'}"


SHOWN_ON_MISS = 1_500
"""A file of at most this many characters is shown whole when old_text is not found in it."""


def _as_it_is(text: str) -> str:
    if len(text) > SHOWN_ON_MISS:
        return "; read it with read_file to see its exact text"
    return f"; the file holds exactly:\n```\n{text.rstrip(chr(10))}\n```" if text.strip() else "; the file is empty"


def list_files(box: PathGuard, path: str = ".", pattern: str | None = None) -> str:
    folder = box.resolve(path)
    if not folder.is_dir():
        raise ToolError(f"{path} is not a folder")
    names = sorted(box.show(f) for f in _walk(box, folder) if pattern is None or _matches(box.show(f), pattern))
    if not names:
        return "no files"
    extra = f"\n[{len(names) - MAX_LIST} more not shown]" if len(names) > MAX_LIST else ""
    return "\n".join(names[:MAX_LIST]) + extra


async def search_files(box: PathGuard, pattern: str, path: str = ".", glob: str | None = None) -> str:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None
    files, skipped = await asyncio.wait_for(asyncio.to_thread(_search_files, box, path, glob), FILE_TOOL_TIMEOUT)
    note = f"\n[{skipped} files over {MAX_SEARCH_BYTES // 1_000_000} MB not searched]" if skipped else ""
    if not files:
        return "no matches" + note
    job = json.dumps({"pattern": pattern, "files": files, "max": MAX_MATCHES}).encode()
    command = f"{shlex.quote(sys.executable)} -I -S -c {shlex.quote(_SEARCH)}"
    result = await run_process(
        command, cwd=box.workdir, env=scrub_env(), timeout=SEARCH_TIMEOUT, stdin=job, cap_bytes=10_000_000
    )
    if result.timed_out:
        raise ToolError(f"the search took longer than {SEARCH_TIMEOUT:g}s and was stopped; use a simpler pattern")
    try:
        matches = json.loads(result.output)
    except ValueError:
        raise ToolError(f"the search failed: {result.output[-300:]}") from None
    if len(matches) > MAX_MATCHES:
        return "\n".join(matches[:MAX_MATCHES]) + f"\n[more than {MAX_MATCHES} matches; narrow the search]" + note
    return ("\n".join(matches) if matches else "no matches") + note


_SEARCH = """
import json, re, sys
job = json.load(sys.stdin)
regex, found = re.compile(job["pattern"]), []
for shown, full in job["files"]:
    try:
        with open(full, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (UnicodeDecodeError, OSError):
        continue
    found += [f"{shown}:{n}:{line[:300]}" for n, line in enumerate(lines, 1) if regex.search(line)]
    if len(found) > job["max"]:
        break
print(json.dumps(found))
"""
"""The matching half of search_files, run as `python -I -S -c` so that its time limit can kill it."""


def _search_files(box: PathGuard, path: str, glob: str | None) -> tuple[list[tuple[str, str]], int]:
    """The regular files to search (shown name, full path) and how many were too large."""
    folder = box.resolve(path)
    chosen: list[tuple[str, str]] = []
    skipped = 0
    for file in [folder] if folder.is_file() else _walk(box, folder):
        shown = box.show(file)
        if glob and not _matches(shown, glob):
            continue
        try:
            st = file.stat()
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        if st.st_size > MAX_SEARCH_BYTES:
            skipped += 1
            continue
        chosen.append((shown, str(file)))
    return chosen, skipped


def _read_text(full: Path, path: str, box: PathGuard | None = None) -> str:
    """A regular file's text, its size checked before reading; opened without blocking (a FIFO swapped in)."""
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise ToolError(f"{path} does not exist{_what_is_there(full, box)}") from None
    except IsADirectoryError:
        raise ToolError(f"{path} is a folder; use list_files") from None
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{path} is a folder; use list_files")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{path} is not a regular file (a FIFO, socket or device); only regular files are read")
        if st.st_size > MAX_READ_BYTES:
            raise ToolError(
                f"{path} is {st.st_size:,} bytes, over the {MAX_READ_BYTES:,} bytes the file tools read; "
                "use the shell (head, tail, sed -n, grep) to read parts of it"
            )
        data = file.read(MAX_READ_BYTES + 1)
    try:
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as open() in text mode reads
    except UnicodeDecodeError:
        raise ToolError(f"{path} is not UTF-8 text") from None


def _walk(box: PathGuard, folder: Path) -> Iterator[Path]:
    seen = 0
    for current, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        seen += len(dirs) + len(files)
        if seen > MAX_WALK:
            return
        for name in sorted(files):
            full = Path(current) / name
            if name in HIDDEN or not full.resolve().is_relative_to(box.workdir):
                continue
            yield full


def _matches(shown: str, pattern: str) -> bool:
    return fnmatch.fnmatch(shown, pattern) or fnmatch.fnmatch(Path(shown).name, pattern)
