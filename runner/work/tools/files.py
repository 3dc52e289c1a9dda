"""The built-in file tools: read_file, write_file, edit_file, list_files, search_files."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import Path

from .paths import HIDDEN, PathGuard, ToolError
from .process import cap

MAX_LIST = 500
MAX_MATCHES = 200
READ_LINES = 2000
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
        "Replace the one exact occurrence of old_text in a file with new_text.",
        {"path": {"type": "string"}, "old_text": {"type": "string"}, "new_text": {"type": "string"}},
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


def read_file(box: PathGuard, path: str, offset: int = 1, limit: int = READ_LINES) -> str:
    full = box.resolve(path)
    text = _read_text(full, path)
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
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_text(content, encoding="utf-8")
    return f"wrote {len(content.encode())} bytes to {box.show(full)}"


def edit_file(box: PathGuard, path: str, old_text: str, new_text: str) -> str:
    full = box.resolve(path, write=True)
    text = _read_text(full, path)
    if not old_text:
        raise ToolError("old_text is empty: give the exact text to replace")
    count = text.count(old_text)
    if count != 1:
        where = "not found" if count == 0 else f"found {count} times; include more context to make it unique"
        raise ToolError(f"old_text {where} in {path}")
    full.write_text(text.replace(old_text, new_text, 1), encoding="utf-8")
    return f"edited {box.show(full)}"


def list_files(box: PathGuard, path: str = ".", pattern: str | None = None) -> str:
    folder = box.resolve(path)
    if not folder.is_dir():
        raise ToolError(f"{path} is not a folder")
    names = sorted(box.show(f) for f in _walk(box, folder) if pattern is None or _matches(box.show(f), pattern))
    if not names:
        return "no files"
    extra = f"\n[{len(names) - MAX_LIST} more not shown]" if len(names) > MAX_LIST else ""
    return "\n".join(names[:MAX_LIST]) + extra


def search_files(box: PathGuard, pattern: str, path: str = ".", glob: str | None = None) -> str:
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"invalid regular expression {pattern!r}: {exc}") from None
    folder = box.resolve(path)
    files = [folder] if folder.is_file() else _walk(box, folder)
    matches: list[str] = []
    for file in files:
        shown = box.show(file)
        if glob and not _matches(shown, glob):
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if regex.search(line):
                matches.append(f"{shown}:{number}:{line[:300]}")
                if len(matches) > MAX_MATCHES:
                    return "\n".join(matches[:MAX_MATCHES]) + f"\n[more than {MAX_MATCHES} matches; narrow the search]"
    return "\n".join(matches) if matches else "no matches"


def _read_text(full: Path, path: str) -> str:
    if not full.exists():
        raise ToolError(f"{path} does not exist")
    if full.is_dir():
        raise ToolError(f"{path} is a folder; use list_files")
    try:
        return full.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{path} is not UTF-8 text") from None


def _walk(box: PathGuard, folder: Path) -> Iterator[Path]:
    for current, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for name in sorted(files):
            full = Path(current) / name
            if name in HIDDEN or not full.resolve().is_relative_to(box.workdir):
                continue
            yield full


def _matches(shown: str, pattern: str) -> bool:
    return fnmatch.fnmatch(shown, pattern) or fnmatch.fnmatch(Path(shown).name, pattern)
